//! A ClusterSet for agent tests: real API servers (the `support` harness) with one
//! in-process `mcs-agent` per member, plus the conformance fixtures (sigs.k8s.io/mcs-api `conformance/`).

use std::collections::BTreeMap;
use std::time::Duration;

use k8s_openapi::api::core::v1::{
    ClientIPConfig, Service, ServicePort, ServiceSpec, SessionAffinityConfig,
};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, PostParams};
use mcs_core::ClusterId;
use mcs_core::api::{ServiceExportSpec, v1beta1::ServiceExport, v1beta1::ServiceImport};
use mcs_kube::admin::Readiness;
use mcs_kube::agent::{
    Agent, AgentConfig, AgentMetrics, AgentReadiness, HubConfig, Member, ResyncHandle,
};
use tokio::sync::{mpsc, oneshot};
use tokio::task::JoinHandle;

use crate as support;
use crate::{ClusterOptions, RequestLog, TestCluster};

/// How long a wait for an import or a condition may take before the test fails: a bound
/// for a hang, not a speed claim (it takes 0.1-0.3 s here). 20 s ran out once for a hub
/// test starting 4 API servers while two suites and a build shared the 2 cores (load
/// average 12); it is the slices' bound now.
pub const IMPORT_TIMEOUT: Duration = Duration::from_secs(60);
/// The conformance budget for EndpointSlices to appear.
pub const SLICE_TIMEOUT: Duration = Duration::from_secs(60);

/// One in-process agent: how to stop it, how to force its resync, and what it asked its
/// own cluster.
struct RunningAgent {
    stop: oneshot::Sender<()>,
    task: JoinHandle<()>,
    resync: ResyncHandle,
    requests: RequestLog,
    readiness: AgentReadiness,
    metrics: AgentMetrics,
}

/// How the agents learn of each other.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Topo {
    /// Every agent reads every member's API server.
    Mesh,
    /// A fourth API server is the hub; agents publish there with least-privilege hub
    /// identities (`deploy/rbac/hub*.yaml`, applied as shipped).
    Hub,
}

/// The hub of a [`Topo::Hub`] set.
pub struct Hub {
    /// The hub's API server.
    pub cluster: TestCluster,
    /// Admin client.
    pub admin: Client,
    /// Each member's hub client, with its least-privilege identity.
    pub members: Vec<Client>,
}

/// Lease duration of hub-topology test agents (renewed every third of it).
pub const HUB_LEASE: Duration = Duration::from_secs(3);

/// Member clusters (real API servers), each with its in-process agent unless started bare.
pub struct ClusterSet {
    /// The members' API servers, in the order of their names.
    pub clusters: Vec<TestCluster>,
    /// An admin client per member.
    pub clients: Vec<Client>,
    /// Each member's cluster id (its name).
    pub ids: Vec<ClusterId>,
    /// Mesh or hub.
    pub topo: Topo,
    /// The hub, in the hub topology.
    pub hub: Option<Hub>,
    agents: Vec<Option<RunningAgent>>,
    grace: Duration,
    configure: fn(AgentConfig) -> AgentConfig,
}

/// Declares each `async fn name(topo: Topo)` of a test file as two tests, `mesh::name`
/// and `hub::name`, so a case proves itself in both topologies.
#[macro_export]
macro_rules! in_both_topologies {
    ($($name:ident),+ $(,)?) => {
        mod mesh {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::clusterset::Topo::Mesh).await
                }
            )+
        }
        mod hub {
            $(
                #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
                async fn $name() {
                    super::$name($crate::clusterset::Topo::Hub).await
                }
            )+
        }
    };
}
pub use crate::in_both_topologies;

impl ClusterSet {
    /// Starts `names.len()` clusters and one agent per cluster.
    pub async fn start(names: &[&str], controller_manager: bool) -> Self {
        Self::start_with(names, controller_manager, Duration::from_secs(60)).await
    }

    /// Starts `names.len()` clusters (and a hub, for [`Topo::Hub`]) and one agent per
    /// cluster.
    pub async fn start_in(topo: Topo, names: &[&str], controller_manager: bool) -> Self {
        Self::start_topo(
            topo,
            names,
            controller_manager,
            Duration::from_secs(60),
            true,
            |c| c,
        )
        .await
    }

    /// [`ClusterSet::start_in`] with the grace period and agent settings given.
    pub async fn start_topo(
        topo: Topo,
        names: &[&str],
        controller_manager: bool,
        grace: Duration,
        agents: bool,
        configure: fn(AgentConfig) -> AgentConfig,
    ) -> Self {
        let opts = ClusterOptions {
            controller_manager,
            install_crds: true,
            ..Default::default()
        };
        Self::start_options(topo, names, opts, grace, agents, configure).await
    }

    /// Starts `names.len()` clusters with real Pods ([`ClusterOptions::pods`]: kwok and
    /// kube-scheduler; cluster `i` has pod CIDR `10.<10+i>.0.0/16`) and one agent per
    /// cluster.
    pub async fn start_with_pods(names: &[&str]) -> Self {
        Self::start_with_pods_in(Topo::Mesh, names).await
    }

    /// [`ClusterSet::start_with_pods`] in topology `topo` (a hub is started the same way).
    pub async fn start_with_pods_in(topo: Topo, names: &[&str]) -> Self {
        let opts = ClusterOptions {
            install_crds: true,
            ..Default::default()
        }
        .with_pods();
        Self::start_options(topo, names, opts, Duration::from_secs(60), true, |c| c).await
    }

    /// [`ClusterSet::start_topo`] with every cluster (the hub too) started with `opts`.
    pub async fn start_options(
        topo: Topo,
        names: &[&str],
        opts: ClusterOptions,
        grace: Duration,
        agents: bool,
        configure: fn(AgentConfig) -> AgentConfig,
    ) -> Self {
        let mut all: Vec<&str> = names.to_vec();
        if topo == Topo::Hub {
            all.push("hub");
        }
        let mut clusters = support::start_clusters_with(&all, opts).await;
        let hub = match topo {
            Topo::Mesh => None,
            Topo::Hub => {
                let cluster = clusters.pop().expect("the hub");
                let admin = cluster.client().await;
                setup_hub(&admin, names).await;
                let mut members = Vec::new();
                for name in names {
                    members.push(hub_identity(&cluster, &ClusterId::new(*name).unwrap()).await);
                }
                Some(Hub {
                    cluster,
                    admin,
                    members,
                })
            }
        };
        let mut clients = Vec::new();
        for c in &clusters {
            clients.push(c.client().await);
        }
        let ids = names.iter().map(|n| ClusterId::new(*n).unwrap()).collect();
        let mut set = Self {
            clusters,
            clients,
            ids,
            topo,
            hub,
            agents: Vec::new(),
            grace,
            configure,
        };
        for i in 0..names.len() {
            let agent = agents.then(|| set.spawn_agent(i));
            set.agents.push(agent);
        }
        set
    }

    /// The hub, for a [`Topo::Hub`] set.
    pub fn hub(&self) -> &Hub {
        self.hub.as_ref().expect("a hub-topology ClusterSet")
    }

    /// The hub, to stop and start it.
    pub fn hub_mut(&mut self) -> &mut Hub {
        self.hub.as_mut().expect("a hub-topology ClusterSet")
    }

    /// A hub client with member `i`'s hub identity (`mcs:member:<id>`, group `mcs:members`).
    pub fn hub_client_of(&self, i: usize) -> Client {
        self.hub().members[i].clone()
    }

    /// Starts the clusters with no agent.
    pub async fn start_bare(names: &[&str]) -> Self {
        Self::start_inner(names, false, Duration::from_secs(60), false).await
    }

    /// Starts the clusters (with kube-controller-manager if asked) and one agent per member
    /// whose unreachable-member grace period is `grace`.
    pub async fn start_with(names: &[&str], controller_manager: bool, grace: Duration) -> Self {
        Self::start_inner(names, controller_manager, grace, true).await
    }

    /// [`ClusterSet::start_configured`] in topology `topo`.
    pub async fn start_topo_configured(
        topo: Topo,
        names: &[&str],
        configure: fn(AgentConfig) -> AgentConfig,
    ) -> Self {
        Self::start_topo(topo, names, false, Duration::from_secs(60), true, configure).await
    }

    /// Starts the clusters and agents whose settings `configure` adjusts.
    pub async fn start_configured(
        names: &[&str],
        configure: fn(AgentConfig) -> AgentConfig,
    ) -> Self {
        Self::start_inner_with(names, false, Duration::from_secs(60), true, configure).await
    }

    async fn start_inner(
        names: &[&str],
        controller_manager: bool,
        grace: Duration,
        agents: bool,
    ) -> Self {
        Self::start_inner_with(names, controller_manager, grace, agents, |c| c).await
    }

    async fn start_inner_with(
        names: &[&str],
        controller_manager: bool,
        grace: Duration,
        agents: bool,
        configure: fn(AgentConfig) -> AgentConfig,
    ) -> Self {
        Self::start_topo(
            Topo::Mesh,
            names,
            controller_manager,
            grace,
            agents,
            configure,
        )
        .await
    }

    /// Every cluster as an agent member, reached directly with the admin client.
    pub fn members(&self) -> Vec<Member> {
        self.ids
            .iter()
            .zip(&self.clients)
            .map(|(id, client)| Member {
                id: id.clone(),
                client: client.clone(),
            })
            .collect()
    }

    fn spawn_agent(&self, i: usize) -> RunningAgent {
        // Its own cluster through a recording client, so tests can check what it wrote.
        let requests = RequestLog::new();
        let own = support::recorded(&self.clients[i], &requests);
        let config = match &self.hub {
            None => {
                let mut members = self.members();
                members[i].client = own;
                AgentConfig::new(self.ids[i].clone(), members)
            }
            Some(hub) => AgentConfig::hub(
                self.ids[i].clone(),
                HubConfig::new(own, hub.members[i].clone()).lease_duration(HUB_LEASE),
            ),
        };
        let config = config
            .unreachable_grace(self.grace)
            .resync(Duration::from_secs(30))
            .probe_interval(Duration::from_secs(1));
        let agent = Agent::new((self.configure)(config));
        let resync = agent.resync_handle();
        let (readiness, metrics) = (agent.readiness(), agent.metrics());
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(async move {
            agent
                .run(async move {
                    let _ = stopped.await;
                })
                .await
                .expect("agent failed");
        });
        RunningAgent {
            stop,
            task,
            resync,
            requests,
            readiness,
            metrics,
        }
    }

    fn running(&self, i: usize) -> &RunningAgent {
        self.agents[i]
            .as_ref()
            .unwrap_or_else(|| panic!("no agent running in cluster {}", self.ids[i]))
    }

    /// The readiness of cluster `i`'s running agent as its `/readyz` reports it: `Ok`, or
    /// why it is not ready.
    pub fn agent_readiness(&self, i: usize) -> Result<(), String> {
        self.running(i).readiness.check()
    }

    /// The metrics of cluster `i`'s running agent.
    pub fn agent_metrics(&self, i: usize) -> AgentMetrics {
        self.running(i).metrics.clone()
    }

    /// The requests the running agent of cluster `i` sent to its own cluster (reads and
    /// writes; not those to its peers). Panics if the agent is not running.
    pub fn agent_requests(&self, i: usize) -> RequestLog {
        self.running(i).requests.clone()
    }

    /// Stops the agent of cluster `i` (its objects stay).
    pub async fn stop_agent(&mut self, i: usize) {
        if let Some(agent) = self.agents[i].take() {
            let _ = agent.stop.send(());
            agent.task.await.expect("agent task panicked");
        }
    }

    /// Forces a full resync of cluster `i`'s agent (as its periodic resync would) and waits
    /// until the pass has completed: every service it knows of was reconciled once, and the
    /// writes it decided on were answered. Panics if the agent is not running.
    pub async fn resync(&self, i: usize) {
        complete_resync(&self.running(i).resync, &self.ids[i], IMPORT_TIMEOUT).await;
    }

    /// In the hub topology, waits until member `i`'s record of its export `ns/name` is on
    /// the hub, as the other members' agents will read it. A no-op in the mesh, where they
    /// read the export itself.
    pub async fn wait_published(&self, i: usize, ns: &str, name: &str) {
        let Some(hub) = &self.hub else { return };
        wait_record(&hub.admin, &self.ids[i], ns, name).await;
    }

    /// Starts the agent of cluster `i` again.
    pub fn start_agent(&mut self, i: usize) {
        if self.agents[i].is_none() {
            self.agents[i] = Some(self.spawn_agent(i));
        }
    }

    /// Creates `ns` in every cluster.
    pub async fn namespace(&self, ns: &str) {
        for c in &self.clients {
            support::create_namespace(c, ns).await;
        }
    }

    /// Member `i`'s admin client (the one its agent uses).
    pub fn client(&self, i: usize) -> &Client {
        &self.clients[i]
    }

    /// [`settled_imports`] with the set's clients.
    pub async fn settled_imports(
        &self,
        from: usize,
        marker_ns: &str,
        ns: &str,
        name: &str,
    ) -> Vec<Option<ServiceImport>> {
        settled_imports(self, &self.clients, from, marker_ns, ns, name).await
    }
}

/// The ServiceImport `ns/name` of each cluster of `set` (read with `clients`; `None` where
/// there is none, or no such namespace), once every agent has caught up with what cluster
/// `from` exported until now: how a test states that an import is, and stays, absent (or
/// present, or without IPs) without watching it for a while.
///
/// Cluster `from` exports a marker Service in `marker_ns` (a namespace every cluster has)
/// after the change under test. Once a cluster imports the marker, its agent has read
/// `from`'s exports past every earlier change: in the mesh through one watch of them (all
/// namespaces), whose events come in order; in the hub through `from`'s records, which its
/// agent writes one at a time in the order it saw the exports, and the hub's watch delivers
/// in order. A full resync of that agent, waited for, then reconciles every service with
/// all it has read and writes what it decides before the import is read. The marker is
/// unexported at the end.
pub async fn settled_imports(
    set: &ClusterSet,
    clients: &[Client],
    from: usize,
    marker_ns: &str,
    ns: &str,
    name: &str,
) -> Vec<Option<ServiceImport>> {
    let marker = format!("{name}-settled");
    create_service(&clients[from], marker_ns, &hello_service(&marker)).await;
    export(&clients[from], marker_ns, &marker, None).await;
    let mut imports = Vec::new();
    for (i, client) in clients.iter().enumerate() {
        wait_import(
            client,
            marker_ns,
            &marker,
            "the marker export imported",
            |_| true,
        )
        .await;
        set.resync(i).await;
        let api: Api<ServiceImport> = Api::namespaced(client.clone(), ns);
        imports.push(api.get_opt(name).await.expect("get ServiceImport"));
    }
    unexport(&clients[from], marker_ns, &marker).await;
    imports
}

/// A [`ClusterSet`] of east, west and north with an agent each, shared by the tests of
/// one binary that ask for the same topology: the first caller starts it, the others
/// get the same set, and the last one to drop it stops it (a later caller starts a new
/// one). Tests sharing it keep apart by namespace.
///
/// The set, its agents and its clients' connections run on a runtime of their own, not
/// on the test's (which ends with the test): its worker threads start the clusters'
/// processes and live until the set stops, so the processes' parent-death signal
/// (`support`) still fires only when the set or the whole binary goes.
pub struct SharedSet {
    set: Option<ClusterSet>,
    runtime: Option<tokio::runtime::Runtime>,
}

/// The live shared set of each topology, if any: mesh, hub.
static SHARED: [tokio::sync::Mutex<std::sync::Weak<SharedSet>>; 2] = [
    tokio::sync::Mutex::const_new(std::sync::Weak::new()),
    tokio::sync::Mutex::const_new(std::sync::Weak::new()),
];

impl SharedSet {
    /// The shared set of `topo`, started if no test holds one now.
    pub async fn get(topo: Topo) -> std::sync::Arc<SharedSet> {
        let slot = match topo {
            Topo::Mesh => &SHARED[0],
            Topo::Hub => &SHARED[1],
        };
        let mut live = slot.lock().await;
        if let Some(set) = live.upgrade() {
            return set;
        }
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .thread_name("shared-clusterset")
            .enable_all()
            .build()
            .expect("a runtime for the shared ClusterSet");
        let started = runtime
            .spawn(ClusterSet::start_in(
                topo,
                &["east", "west", "north"],
                false,
            ))
            .await;
        let set = match started {
            Ok(set) => set,
            Err(e) => {
                // Dropping a runtime inside the test's would panic on top of this one.
                runtime.shutdown_background();
                std::panic::resume_unwind(e.into_panic());
            }
        };
        let shared = std::sync::Arc::new(SharedSet {
            set: Some(set),
            runtime: Some(runtime),
        });
        *live = std::sync::Arc::downgrade(&shared);
        shared
    }
}

impl std::ops::Deref for SharedSet {
    type Target = ClusterSet;

    fn deref(&self) -> &ClusterSet {
        self.set
            .as_ref()
            .expect("the shared set runs until dropped")
    }
}

impl Drop for SharedSet {
    fn drop(&mut self) {
        // Agents and processes first (ClusterSet's and TestCluster's drops), then the
        // runtime, without blocking: the last holder drops it inside its own runtime.
        drop(self.set.take());
        if let Some(runtime) = self.runtime.take() {
            runtime.shutdown_background();
        }
    }
}

/// One test's part of its topology's [`SharedSet`]: the set and a namespace of the test's
/// own (what a test names, a Service and its export, its conflicts, is per namespace, so
/// tests sharing the clusters and their agents keep apart).
///
/// A case has clients of its own, made on the test's runtime: a kube `Client`'s pooled
/// connections run as tasks of the runtime that opened them, so a client shared between
/// tests would keep connections that die with the test that opened them. [`Case::client`],
/// [`Case::namespace`] and [`Case::wait_published`] use them; the set's own clients serve
/// its agents only.
pub struct Case {
    /// The shared set.
    pub set: std::sync::Arc<SharedSet>,
    /// The case's namespace, in every member.
    pub ns: String,
    clients: Vec<Client>,
    hub_admin: Option<Client>,
}

impl Case {
    /// The shared set of `topo` and a fresh namespace `<prefix>-<n>`, created in every
    /// member.
    pub async fn start(topo: Topo, prefix: &str) -> Case {
        let case = Case::without_namespace(topo, prefix).await;
        case.namespace(&case.ns).await;
        case
    }

    /// [`Case::start`] with the namespace created nowhere yet.
    pub async fn without_namespace(topo: Topo, prefix: &str) -> Case {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(1);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let set = SharedSet::get(topo).await;
        let mut clients = Vec::new();
        for cluster in &set.clusters {
            clients.push(cluster.client().await);
        }
        let hub_admin = match &set.hub {
            Some(hub) => Some(hub.cluster.client().await),
            None => None,
        };
        Case {
            set,
            ns: format!("{prefix}-{n}"),
            clients,
            hub_admin,
        }
    }

    /// The admin client of cluster `i`, this case's own.
    pub fn client(&self, i: usize) -> &Client {
        &self.clients[i]
    }

    /// Creates `ns` in every cluster.
    pub async fn namespace(&self, ns: &str) {
        for c in &self.clients {
            support::create_namespace(c, ns).await;
        }
    }

    /// [`settled_imports`] of `name` in this case's namespace, the marker in `marker_ns`.
    pub async fn settled_imports(
        &self,
        from: usize,
        marker_ns: &str,
        name: &str,
    ) -> Vec<Option<ServiceImport>> {
        settled_imports(&self.set, &self.clients, from, marker_ns, &self.ns, name).await
    }

    /// [`ClusterSet::wait_published`] with this case's hub client.
    pub async fn wait_published(&self, i: usize, ns: &str, name: &str) {
        if let Some(admin) = &self.hub_admin {
            wait_record(admin, &self.set.ids[i], ns, name).await;
        }
    }
}

impl std::ops::Deref for Case {
    type Target = ClusterSet;

    fn deref(&self) -> &ClusterSet {
        &self.set
    }
}

/// Waits until `id`'s record of Service `ns/name` is on the hub (read with `admin`).
async fn wait_record(admin: &Client, id: &ClusterId, ns: &str, name: &str) {
    let records: Api<mcs_kube::hub::record::MemberExport> =
        Api::namespaced(admin.clone(), &mcs_kube::hub::member_namespace(id));
    let record = mcs_kube::hub::record::record_name(
        &mcs_core::name::ServiceRef::new(ns, name).expect("a valid service name"),
    );
    support::wait_for(
        &format!("{id}'s record {record} on the hub"),
        IMPORT_TIMEOUT,
        || async { records.get_opt(&record).await.ok().flatten() },
    )
    .await;
}

/// Installs the hub's CRD and roles (`deploy/rbac/hub.yaml`) and each member's namespace
/// and bindings (`deploy/rbac/hub-member.yaml`), as shipped.
async fn setup_hub(admin: &Client, names: &[&str]) {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    use kube::CustomResourceExt;
    use kube::api::{Patch, PatchParams};
    let crds: Api<CustomResourceDefinition> = Api::all(admin.clone());
    let crd = mcs_kube::hub::record::MemberExport::crd();
    crds.patch(
        crd.metadata.name.as_deref().unwrap_or_default(),
        &PatchParams::apply("mcs-test-harness").force(),
        &Patch::Apply(&crd),
    )
    .await
    .expect("install the MemberExport CRD on the hub");
    support::wait_for(
        "the MemberExport CRD established",
        Duration::from_secs(60),
        || async {
            let api: Api<mcs_kube::hub::record::MemberExport> = Api::all(admin.clone());
            api.list(&ListParams::default().limit(1))
                .await
                .ok()
                .map(|_| ())
        },
    )
    .await;
    support::apply_manifest(admin, "deploy/rbac/hub.yaml", &[]).await;
    for name in names {
        for obj in support::manifest_with("deploy/rbac/hub-member.yaml", &[("MEMBER_ID", name)]) {
            support::apply(admin, &obj).await;
        }
    }
}

/// A hub client with `id`'s member identity.
pub async fn hub_identity(hub: &TestCluster, id: &ClusterId) -> Client {
    hub.client_as_user(&format!("mcs:member:{id}"), &["mcs:members"])
        .await
}

impl Drop for ClusterSet {
    fn drop(&mut self) {
        for agent in self.agents.iter_mut().filter_map(Option::take) {
            let _ = agent.stop.send(());
            agent.task.abort();
        }
    }
}

/// The conformance `hello` Service: `tcp/TCP/42`, `udp/UDP/42`, ClientIP affinity (10 s),
/// PreferDualStack, labels and annotations `dummy-svc`.
pub fn hello_service(name: &str) -> Service {
    let dummy = BTreeMap::from([("dummy-svc".to_string(), "dummy-svc".to_string())]);
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(dummy.clone()),
            annotations: Some(dummy),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            selector: Some(BTreeMap::from([("app".to_string(), name.to_string())])),
            ports: Some(vec![
                ServicePort {
                    name: Some("tcp".into()),
                    protocol: Some("TCP".into()),
                    port: 42,
                    target_port: Some(IntOrString::Int(42)),
                    ..Default::default()
                },
                ServicePort {
                    name: Some("udp".into()),
                    protocol: Some("UDP".into()),
                    port: 42,
                    target_port: Some(IntOrString::Int(42)),
                    ..Default::default()
                },
            ]),
            session_affinity: Some("ClientIP".into()),
            session_affinity_config: Some(SessionAffinityConfig {
                client_ip: Some(ClientIPConfig {
                    timeout_seconds: Some(10),
                }),
            }),
            ip_family_policy: Some("PreferDualStack".into()),
            ..Default::default()
        }),
        status: None,
    }
}

/// `svc` made headless (`clusterIP: None`).
pub fn headless(mut svc: Service) -> Service {
    let spec = svc.spec.as_mut().unwrap();
    spec.cluster_ip = Some("None".into());
    spec.session_affinity = None;
    spec.session_affinity_config = None;
    svc
}

/// Creates `svc` in `ns`; the created object.
pub async fn create_service(client: &Client, ns: &str, svc: &Service) -> Service {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), svc)
        .await
        .expect("create Service")
}

/// Replaces the Service of `svc`'s name in `ns` with `svc` (keeping its resource version and
/// allocated cluster IPs); the result.
pub async fn replace_service(client: &Client, ns: &str, mut svc: Service) -> Service {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    let name = svc.metadata.name.clone().unwrap();
    let current = api.get(&name).await.expect("get Service");
    svc.metadata.resource_version = current.metadata.resource_version;
    let spec = svc.spec.as_mut().unwrap();
    let cur = current.spec.unwrap();
    spec.cluster_ip = cur.cluster_ip;
    spec.cluster_ips = cur.cluster_ips;
    api.replace(&name, &PostParams::default(), &svc)
        .await
        .expect("replace Service")
}

/// Deletes the Service `ns/name`.
pub async fn delete_service(client: &Client, ns: &str, name: &str) {
    let api: Api<Service> = Api::namespaced(client.clone(), ns);
    api.delete(name, &DeleteParams::default())
        .await
        .expect("delete Service");
}

/// Creates the ServiceExport `name` (metadata `dummy-svcexport` like the conformance
/// fixture; exported labels and annotations as given).
pub async fn export(
    client: &Client,
    ns: &str,
    name: &str,
    exported: Option<(&str, &str)>,
) -> ServiceExport {
    let dummy = BTreeMap::from([("dummy-svcexport".to_string(), "dummy-svcexport".to_string())]);
    let spec = match exported {
        Some((k, v)) => ServiceExportSpec {
            exported_labels: Some(BTreeMap::from([(k.to_string(), v.to_string())])),
            exported_annotations: Some(BTreeMap::from([(
                format!("{k}-annotation"),
                v.to_string(),
            )])),
            ..ServiceExportSpec::default()
        },
        None => ServiceExportSpec::default(),
    };
    let mut se = ServiceExport::new(name, spec);
    se.metadata.namespace = Some(ns.into());
    se.metadata.labels = Some(dummy.clone());
    se.metadata.annotations = Some(dummy);
    let api: Api<ServiceExport> = Api::namespaced(client.clone(), ns);
    api.create(&PostParams::default(), &se)
        .await
        .expect("create ServiceExport")
}

/// Deletes the ServiceExport `ns/name`.
pub async fn unexport(client: &Client, ns: &str, name: &str) {
    let api: Api<ServiceExport> = Api::namespaced(client.clone(), ns);
    api.delete(name, &DeleteParams::default())
        .await
        .expect("delete ServiceExport");
}

/// The cluster names in an import's status.
pub fn clusters_of(si: &ServiceImport) -> Vec<String> {
    si.status
        .as_ref()
        .and_then(|s| s.clusters.as_ref())
        .map(|c| c.iter().map(|c| c.cluster.clone()).collect())
        .unwrap_or_default()
}

/// Waits until the ServiceImport exists and `pred` holds.
pub async fn wait_import(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    pred: impl Fn(&ServiceImport) -> bool,
) -> ServiceImport {
    let api: Api<ServiceImport> = Api::namespaced(client.clone(), ns);
    support::wait_for(what, IMPORT_TIMEOUT, || {
        let api = api.clone();
        let pred = &pred;
        async move { api.get_opt(name).await.ok().flatten().filter(|si| pred(si)) }
    })
    .await
}

/// Waits until `ns/name` has no ServiceImport (`what` names the wait in its failure).
pub async fn wait_no_import(client: &Client, ns: &str, name: &str, what: &str) {
    let api: Api<ServiceImport> = Api::namespaced(client.clone(), ns);
    support::wait_for(what, IMPORT_TIMEOUT, || {
        let api = api.clone();
        async move { matches!(api.get_opt(name).await, Ok(None)).then_some(()) }
    })
    .await
}

/// The export's condition `type_`, if the export and the condition exist.
pub async fn export_condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
) -> Option<Condition> {
    let api: Api<ServiceExport> = Api::namespaced(client.clone(), ns);
    let se = api.get_opt(name).await.ok().flatten()?;
    se.status?
        .conditions?
        .into_iter()
        .find(|c| c.type_ == type_)
}

/// Waits until the export's condition `type_` has `status` (and `reason` when given).
pub async fn wait_export_condition(
    client: &Client,
    ns: &str,
    name: &str,
    type_: &str,
    status: &str,
    reason: Option<&str>,
) -> Condition {
    support::wait_for(
        &format!("ServiceExport {ns}/{name} {type_}={status}"),
        IMPORT_TIMEOUT,
        || async {
            export_condition(client, ns, name, type_)
                .await
                .filter(|c| c.status == status && reason.is_none_or(|r| c.reason == r))
        },
    )
    .await
}

/// The EndpointSlices in `ns` labelled with the MCS service name `name`.
pub async fn mcs_slices(client: &Client, ns: &str, name: &str) -> Vec<EndpointSlice> {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    api.list(
        &ListParams::default().labels(&format!("multicluster.kubernetes.io/service-name={name}")),
    )
    .await
    .expect("list EndpointSlices")
    .items
}

/// Creates or replaces the Service's own EndpointSlice `src-<svc>` with ready endpoints on
/// `tcp/TCP/42` and `udp/UDP/42`, as the EndpointSlice controller would.
pub async fn set_source(client: &Client, ns: &str, svc: &str, ips: &[&str]) {
    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
    use kube::api::{Patch, PatchParams};
    let slice = EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some(format!("src-{svc}")),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/service-name".to_owned(), svc.to_owned()),
                (
                    "endpointslice.kubernetes.io/managed-by".to_owned(),
                    "test-source".to_owned(),
                ),
            ])),
            ..Default::default()
        },
        endpoints: ips
            .iter()
            .map(|ip| Endpoint {
                addresses: vec![(*ip).to_owned()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        ports: Some(
            [("tcp", "TCP"), ("udp", "UDP")]
                .iter()
                .map(|(name, protocol)| EndpointPort {
                    name: Some((*name).into()),
                    port: Some(42),
                    protocol: Some((*protocol).into()),
                    app_protocol: None,
                })
                .collect(),
        ),
    };
    Api::<EndpointSlice>::namespaced(client.clone(), ns)
        .patch(
            &format!("src-{svc}"),
            &PatchParams::apply("test-source").force(),
            &Patch::Apply(&slice),
        )
        .await
        .expect("apply source EndpointSlice");
}

/// Forces a full resync through `handle` (the agent of cluster `id`) and waits until the
/// pass has completed; panics if the agent stops first or the pass takes over `timeout`.
pub async fn complete_resync(handle: &ResyncHandle, id: &ClusterId, timeout: Duration) {
    match tokio::time::timeout(timeout, handle.resync()).await {
        Ok(Ok(())) => {}
        Ok(Err(e)) => panic!("resync of the agent of {id}: {e}"),
        Err(_) => panic!("the agent of {id} did not complete a resync in {timeout:?}"),
    }
}

/// The cluster an imported EndpointSlice came from: its
/// `multicluster.kubernetes.io/source-cluster` label.
pub fn source_cluster(slice: &EndpointSlice) -> Option<&str> {
    slice
        .metadata
        .labels
        .as_ref()?
        .get(mcs_core::api::LABEL_SOURCE_CLUSTER)
        .map(String::as_str)
}

/// The addresses the imported slices of `name` in this cluster carry for `source`.
pub async fn imported_from(client: &Client, ns: &str, name: &str, source: &str) -> Vec<String> {
    let mut addrs: Vec<String> = mcs_slices(client, ns, name)
        .await
        .into_iter()
        .filter(|s| source_cluster(s) == Some(source))
        .flat_map(|s| s.endpoints.into_iter().flat_map(|e| e.addresses))
        .collect();
    addrs.sort();
    addrs
}

/// The conformance two-cluster driver's pause between the two exports, so their
/// creation timestamps (1 s resolution) differ.
pub async fn conformance_pause() {
    tokio::time::sleep(Duration::from_millis(1100)).await;
}

/// A watch on one object, opened at its current version: every later change to it (an
/// update, even one that restores the same content, or a deletion) arrives as an event.
pub struct ObjectWatch<K> {
    api: Api<K>,
    name: String,
    opened_at: String,
    events: mpsc::UnboundedReceiver<String>,
    task: JoinHandle<()>,
}

impl<K> ObjectWatch<K>
where
    K: kube::Resource
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned
        + Send
        + 'static,
{
    /// Opens the watch on the object `name` (which must exist) at its current version.
    pub async fn open(api: &Api<K>, name: &str) -> Self {
        let current = api
            .get(name)
            .await
            .unwrap_or_else(|e| panic!("get {name} to watch it: {e}"));
        Self::since(api, &current).await
    }

    /// Opens the watch at the version of `object` as the API server returned it (from a
    /// create, say), so that no change after that write is missed.
    pub async fn since(api: &Api<K>, object: &K) -> Self {
        let name = object.meta().name.clone().expect("a named object");
        let name = name.as_str();
        let opened_at = object
            .meta()
            .resource_version
            .clone()
            .expect("an object returned by the API server has a resourceVersion");
        let params = kube::api::WatchParams::default().fields(&format!("metadata.name={name}"));
        let stream = api
            .watch(&params, &opened_at)
            .await
            .unwrap_or_else(|e| panic!("watch {name}: {e}"));
        let (tx, events) = mpsc::unbounded_channel();
        let task = tokio::spawn(async move {
            use futures::StreamExt;
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                let seen = match event {
                    Ok(kube::api::WatchEvent::Bookmark(_)) => continue,
                    Ok(kube::api::WatchEvent::Added(o)) => format!("added: {}", brief(&o)),
                    Ok(kube::api::WatchEvent::Modified(o)) => format!("modified: {}", brief(&o)),
                    Ok(kube::api::WatchEvent::Deleted(o)) => format!("deleted: {}", brief(&o)),
                    Ok(kube::api::WatchEvent::Error(e)) => format!("watch error: {e:?}"),
                    Err(e) => format!("watch failed: {e}"),
                };
                if tx.send(seen).is_err() {
                    return;
                }
            }
        });
        Self {
            api: api.clone(),
            name: name.to_owned(),
            opened_at,
            events,
            task,
        }
    }

    /// The events seen so far.
    pub fn seen(&mut self) -> Vec<String> {
        let mut seen = Vec::new();
        while let Ok(event) = self.events.try_recv() {
            seen.push(event);
        }
        seen
    }

    /// Asserts the object was not changed since the watch opened. Call it after the event
    /// the check is about (a completed resync): its writes were answered by then, so a read
    /// now sees them, and the watch delivers each of them, which the failure lists.
    pub async fn assert_unmodified(mut self, what: &str) {
        let now = self
            .api
            .get_opt(&self.name)
            .await
            .unwrap_or_else(|e| panic!("get {}: {e}", self.name))
            .and_then(|o| o.meta().resource_version.clone());
        let mut seen = Vec::new();
        if now.as_deref() != Some(self.opened_at.as_str()) {
            // Changed: collect what the watch saw (at least one event is on its way).
            seen.push(
                tokio::time::timeout(IMPORT_TIMEOUT, self.events.recv())
                    .await
                    .ok()
                    .flatten()
                    .unwrap_or_else(|| "(the watch delivered no event)".to_owned()),
            );
        }
        while let Ok(event) = self.events.try_recv() {
            seen.push(event);
        }
        self.task.abort();
        assert!(
            seen.is_empty(),
            "{what}: {} changed from resourceVersion {} to {now:?}; the watch saw:\n{}",
            self.name,
            self.opened_at,
            seen.join("\n")
        );
    }
}

/// An object as JSON without its managedFields, for failure messages.
fn brief(object: &impl serde::Serialize) -> String {
    let mut value = serde_json::to_value(object).unwrap_or_default();
    if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        meta.remove("managedFields");
    }
    value.to_string()
}
