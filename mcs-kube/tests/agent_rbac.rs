//! Least privilege (issue #8): the agents and the DNS server work with exactly the shipped
//! RBAC (`deploy/rbac/*.yaml`, applied verbatim at test time), fail clearly without it, and
//! the shipped roles allow nothing beyond what they need.
//!
//! Identities are those the manifests name: the agent's ServiceAccount (from
//! `deploy/agent/deployment.yaml`, bound by `agent-local.yaml`) with a TokenRequest token,
//! the peers' user `mcs-peer` (bound by `agent-peer-reader.yaml`) with a client certificate
//! from the cluster's CA, and the DNS server's ServiceAccount (from
//! `deploy/dns/deployment.yaml`, bound by `dns.yaml`).

use mcs_testkit as support;
use mcs_testkit::clusterset;

use support::{apply_manifest, typed};

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, OnceLock};
use std::time::{Duration, Instant};

use clusterset::*;
use hickory_resolver::proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_resolver::proto::rr::{Name, RecordType};
use k8s_openapi::api::authentication::v1::SelfSubjectReview;
use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SelfSubjectAccessReview, SelfSubjectAccessReviewSpec,
};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::api::events::v1::Event;
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use mcs_core::ClusterId;
use mcs_core::api::{
    CLUSTER_ID_PROPERTY, ClusterPropertySpec, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER,
    ServiceImportSpec, ServiceImportType, ServicePort,
    v1beta1::{ClusterProperty, ServiceImport},
};
use mcs_kube::agent::desired::{LABEL_MANAGED_BY, MANAGED_BY};
use mcs_kube::agent::{Agent, AgentConfig, AgentError, AgentHealth, AgentMetrics, Member};
use mcs_kube::dns::{DnsConfig, DnsServer};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const NS: &str = "rbac";
const AGENT_LOCAL: &str = "deploy/rbac/agent-local.yaml";
const PEER_READER: &str = "deploy/rbac/agent-peer-reader.yaml";
const CLUSTER_SELECTION: &str = "deploy/rbac/agent-cluster-selection.yaml";
const DNS_RBAC: &str = "deploy/rbac/dns.yaml";
const AGENT_DEPLOYMENT: &str = "deploy/agent/deployment.yaml";
const DNS_DEPLOYMENT: &str = "deploy/dns/deployment.yaml";
/// How long a failure may take to show in readiness, or a fix to heal it.
const SETTLE: Duration = Duration::from_secs(30);

// ---------------------------------------------------------------------------------------
// Manifests, applied as they are shipped (support::manifests).

/// The ServiceAccount a Deployment manifest runs as: `(namespace, name)`. Also checks that
/// the RBAC manifest binds exactly that ServiceAccount.
fn deployment_identity(deployment: &str, rbac: &str) -> (String, String) {
    let d: k8s_openapi::api::apps::v1::Deployment = typed(deployment, "Deployment");
    let ns = d.metadata.namespace.clone().expect("namespaced Deployment");
    let sa = d
        .spec
        .and_then(|s| s.template.spec)
        .and_then(|s| s.service_account_name)
        .unwrap_or_else(|| panic!("{deployment}: no serviceAccountName"));
    let binding: ClusterRoleBinding = typed(rbac, "ClusterRoleBinding");
    let subjects = binding.subjects.unwrap_or_default();
    assert!(
        subjects.iter().any(|s| s.kind == "ServiceAccount"
            && s.name == sa
            && s.namespace.as_deref() == Some(ns.as_str())),
        "{rbac} does not bind the ServiceAccount {ns}/{sa} that {deployment} runs as: {subjects:?}"
    );
    (ns, sa)
}

/// The user `agent-peer-reader.yaml` binds (the identity whose credentials peers hold).
fn peer_user() -> String {
    let binding: ClusterRoleBinding = typed(PEER_READER, "ClusterRoleBinding");
    let users: Vec<String> = binding
        .subjects
        .unwrap_or_default()
        .into_iter()
        .filter(|s| s.kind == "User")
        .map(|s| s.name)
        .collect();
    assert_eq!(users.len(), 1, "{PEER_READER}: expected one User subject");
    users[0].clone()
}

/// The shipped agent role with `edit` applied to a copy of its rules (to remove one).
fn agent_role_without(
    edit: impl Fn(&mut Vec<k8s_openapi::api::rbac::v1::PolicyRule>),
) -> ClusterRole {
    let mut role: ClusterRole = typed(AGENT_LOCAL, "ClusterRole");
    let rules = role.rules.as_mut().expect("rules");
    let before = rules.clone();
    edit(rules);
    assert_ne!(&before, rules, "the edit removed nothing");
    role
}

async fn apply_role(client: &Client, role: &ClusterRole) {
    Api::<ClusterRole>::all(client.clone())
        .patch(
            role.metadata.name.as_deref().unwrap(),
            &PatchParams::apply("mcs-rbac-test").force(),
            &Patch::Apply(role),
        )
        .await
        .expect("apply ClusterRole");
}

// ---------------------------------------------------------------------------------------
// Identities and access reviews.

/// `system:serviceaccount:<ns>:<name>` for a ServiceAccount, with a token of its own.
async fn service_account_client(
    cluster: &support::TestCluster,
    admin: &Client,
    (ns, name): &(String, String),
) -> Client {
    // The ServiceAccount exists (applied from the Deployment manifest) before the token.
    let sas: Api<k8s_openapi::api::core::v1::ServiceAccount> = Api::namespaced(admin.clone(), ns);
    assert!(
        sas.get_opt(name).await.unwrap().is_some(),
        "ServiceAccount {ns}/{name} was not applied"
    );
    let token = support::service_account_token(admin, ns, name).await;
    cluster.client_with_token(&token).await
}

/// Who the API server says `client` is.
async fn whoami(client: &Client) -> String {
    let review: SelfSubjectReview = Api::<SelfSubjectReview>::all(client.clone())
        .create(&PostParams::default(), &SelfSubjectReview::default())
        .await
        .expect("SelfSubjectReview");
    review
        .status
        .and_then(|s| s.user_info)
        .and_then(|u| u.username)
        .unwrap_or_default()
}

/// One access question: `verb group/resource[/subresource]` (optionally in a namespace or
/// for one name).
#[derive(Clone, Copy, Debug)]
struct Access {
    verb: &'static str,
    group: &'static str,
    resource: &'static str,
    subresource: Option<&'static str>,
    namespace: Option<&'static str>,
    name: Option<&'static str>,
}

const fn can(verb: &'static str, group: &'static str, resource: &'static str) -> Access {
    Access {
        verb,
        group,
        resource,
        subresource: None,
        namespace: None,
        name: None,
    }
}

impl Access {
    const fn sub(mut self, subresource: &'static str) -> Self {
        self.subresource = Some(subresource);
        self
    }
    const fn named(mut self, name: &'static str) -> Self {
        self.name = Some(name);
        self
    }
    const fn in_ns(mut self, ns: &'static str) -> Self {
        self.namespace = Some(ns);
        self
    }
}

async fn allowed(client: &Client, a: Access) -> bool {
    let review = SelfSubjectAccessReview {
        spec: SelfSubjectAccessReviewSpec {
            resource_attributes: Some(ResourceAttributes {
                verb: Some(a.verb.into()),
                group: Some(a.group.into()),
                resource: Some(a.resource.into()),
                subresource: a.subresource.map(Into::into),
                namespace: a.namespace.map(Into::into),
                name: a.name.map(Into::into),
                ..Default::default()
            }),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<SelfSubjectAccessReview>::all(client.clone())
        .create(&PostParams::default(), &review)
        .await
        .expect("SelfSubjectAccessReview")
        .status
        .expect("review status")
        .allowed
}

/// Asserts every `allow` is allowed and every `deny` denied, reporting all mismatches.
async fn assert_access(who: &str, client: &Client, allow: &[Access], deny: &[Access]) {
    let mut wrong = Vec::new();
    for a in allow {
        if !allowed(client, *a).await {
            wrong.push(format!("denied but needed: {a:?}"));
        }
    }
    for a in deny {
        if allowed(client, *a).await {
            wrong.push(format!("allowed but must not be: {a:?}"));
        }
    }
    assert!(wrong.is_empty(), "{who}:\n{}", wrong.join("\n"));
}

/// Waits until RBAC grants `a` to `client` (the API server's RBAC cache follows quickly).
async fn wait_allowed(client: &Client, a: Access) {
    support::wait_for(&format!("RBAC to allow {a:?}"), SETTLE, || async {
        allowed(client, a).await.then_some(())
    })
    .await;
}

const MCS: &str = "multicluster.x-k8s.io";
const DISCOVERY: &str = "discovery.k8s.io";

// ---------------------------------------------------------------------------------------
// Logs: the tests assert what an operator reads.

static LOGS: Mutex<Vec<u8>> = Mutex::new(Vec::new());

struct LogWriter;

impl std::io::Write for LogWriter {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        LOGS.lock().unwrap_or_else(|e| e.into_inner()).write(buf)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        Ok(())
    }
}

fn capture_logs() {
    static INIT: OnceLock<()> = OnceLock::new();
    INIT.get_or_init(|| {
        let _ = tracing_subscriber::fmt()
            .with_writer(|| LogWriter)
            .with_ansi(false)
            .with_env_filter(tracing_subscriber::EnvFilter::new("warn,mcs_kube=info"))
            .try_init();
    });
}

/// Captured log lines containing every one of `needles`.
fn log_lines(needles: &[&str]) -> Vec<String> {
    let logs = LOGS.lock().unwrap_or_else(|e| e.into_inner());
    String::from_utf8_lossy(&logs)
        .lines()
        .filter(|l| needles.iter().all(|n| l.contains(n)))
        .map(str::to_owned)
        .collect()
}

// ---------------------------------------------------------------------------------------
// Agents run in the test process with the restricted clients.

struct RunningAgent {
    stop: Option<oneshot::Sender<()>>,
    task: JoinHandle<Result<(), AgentError>>,
    /// The agent's admin endpoint (`mcs_kube::admin::serve`, as `mcs-agent` runs it).
    admin: SocketAddr,
    admin_task: JoinHandle<()>,
    ready: Arc<AtomicBool>,
    health: AgentHealth,
    metrics: AgentMetrics,
}

impl RunningAgent {
    fn start(local: &str, members: Vec<(&str, Client)>) -> Self {
        let members = members
            .into_iter()
            .map(|(id, client)| Member {
                id: ClusterId::new(id).unwrap(),
                client,
            })
            .collect();
        let config = AgentConfig::new(ClusterId::new(local).unwrap(), members)
            .resync(Duration::from_secs(30))
            .probe_interval(Duration::from_secs(1));
        let agent = Agent::new(config);
        let (ready, health, metrics) = (agent.ready(), agent.health(), agent.metrics());
        let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind admin");
        listener
            .set_nonblocking(true)
            .expect("nonblocking admin listener");
        let admin = listener.local_addr().expect("admin address");
        let listener = tokio::net::TcpListener::from_std(listener).expect("admin listener");
        let admin_task = tokio::spawn(mcs_kube::admin::serve(
            listener,
            String::new,
            agent.readiness(),
            std::future::pending(),
        ));
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(agent.run(async move {
            let _ = stopped.await;
        }));
        Self {
            stop: Some(stop),
            task,
            admin,
            admin_task,
            ready,
            health,
            metrics,
        }
    }

    fn is_ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// Waits until the agent is not ready for a reason containing every one of `needles`.
    async fn wait_not_ready(&self, what: &str, needles: &[&str]) -> String {
        let found = support::wait_for(what, SETTLE, || async {
            let reason = self.health.not_ready_reason()?;
            (!self.is_ready() && needles.iter().all(|n| reason.contains(n))).then_some(reason)
        })
        .await;
        assert!(!self.task.is_finished(), "the agent must keep running");
        // The admin endpoint says the same: 503 with the reason as the body.
        let (status, body) = self.readyz().await;
        assert_eq!(status, 503, "/readyz while not ready: {body}");
        for needle in needles {
            assert!(
                body.contains(needle),
                "/readyz body lacks {needle:?}: {body}"
            );
        }
        found
    }

    /// `GET /readyz` on the agent's admin endpoint: status code and body.
    async fn readyz(&self) -> (u16, String) {
        let (status, body) = support::http_get(&format!("http://{}/readyz", self.admin))
            .await
            .unwrap_or_else(|e| panic!("the admin endpoint: {e}"));
        (status.as_u16(), body)
    }

    async fn wait_ready(&self, what: &str) {
        let deadline = Instant::now() + SETTLE;
        while !(self.is_ready() && self.health.not_ready_reason().is_none()) {
            assert!(
                Instant::now() < deadline,
                "timed out waiting for {what}: not ready: {:?}",
                self.health.not_ready_reason()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        let (status, body) = self.readyz().await;
        assert_eq!(
            (status, body.as_str()),
            (200, "ready\n"),
            "/readyz once ready"
        );
    }

    async fn stop(mut self) {
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
        }
        (&mut self.task)
            .await
            .expect("agent task panicked")
            .expect("agent failed");
    }
}

impl Drop for RunningAgent {
    fn drop(&mut self) {
        self.admin_task.abort();
        if let Some(stop) = self.stop.take() {
            let _ = stop.send(());
            self.task.abort();
        }
    }
}

// ---------------------------------------------------------------------------------------
// Fixtures.

/// An EndpointSlice of Service `svc` as kube-controller-manager would write it.
fn source_slice(svc: &str, ip: &str) -> EndpointSlice {
    EndpointSlice {
        metadata: ObjectMeta {
            name: Some(format!("{svc}-src")),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/service-name".to_string(), svc.to_string()),
                (
                    "endpointslice.kubernetes.io/managed-by".to_string(),
                    "mcs-test".to_string(),
                ),
            ])),
            ..Default::default()
        },
        address_type: "IPv4".into(),
        endpoints: vec![Endpoint {
            addresses: vec![ip.into()],
            conditions: Some(EndpointConditions {
                ready: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ports: Some(
            [("tcp", "TCP"), ("udp", "UDP")]
                .into_iter()
                .map(|(name, protocol)| EndpointPort {
                    name: Some(name.into()),
                    port: Some(42),
                    protocol: Some(protocol.into()),
                    ..Default::default()
                })
                .collect(),
        ),
    }
}

async fn create_slice(client: &Client, slice: &EndpointSlice) {
    Api::<EndpointSlice>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), slice)
        .await
        .expect("create EndpointSlice");
}

fn import_ready_message(si: &ServiceImport) -> Option<String> {
    si.status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == "Ready" && c.status == "True")
        .map(|c| c.message.clone())
}

/// `(source cluster, addresses)` of the MCS EndpointSlices of `svc`, sorted.
async fn imported_endpoints(client: &Client, svc: &str) -> Vec<(String, Vec<String>)> {
    let mut v: Vec<(String, Vec<String>)> = mcs_slices(client, NS, svc)
        .await
        .into_iter()
        .map(|s| {
            let cluster = s
                .metadata
                .labels
                .as_ref()
                .and_then(|l| l.get(LABEL_SOURCE_CLUSTER))
                .cloned()
                .unwrap_or_default();
            let addrs = s.endpoints.into_iter().flat_map(|e| e.addresses).collect();
            (cluster, addrs)
        })
        .collect();
    v.sort();
    v
}

/// The derived Services the agent wrote for `svc`.
async fn derived_services(client: &Client, svc: &str) -> Vec<String> {
    Api::<Service>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!(
            "{LABEL_MANAGED_BY}={MANAGED_BY},{LABEL_SERVICE_NAME}={svc}"
        )))
        .await
        .expect("list Services")
        .items
        .into_iter()
        .map(|s| s.name_any())
        .collect()
}

// ---------------------------------------------------------------------------------------
// 1. The full flow under exactly the shipped roles.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agents_with_exactly_the_shipped_roles_export_import_and_clean_up() {
    capture_logs();
    let t0 = Instant::now();
    let names = ["east", "west", "north"];
    let set = ClusterSet::start_bare(&names).await;
    let agent_sa = deployment_identity(AGENT_DEPLOYMENT, AGENT_LOCAL);
    let peer = peer_user();

    // In every member: the agent's Namespace and ServiceAccount from its Deployment
    // manifest, both shipped roles, and a client per identity.
    let mut local_clients = Vec::new();
    let mut peer_clients = Vec::new();
    for (i, cluster) in set.clusters.iter().enumerate() {
        let admin = set.client(i);
        apply_manifest(admin, AGENT_DEPLOYMENT, &["Namespace", "ServiceAccount"]).await;
        apply_manifest(admin, AGENT_LOCAL, &[]).await;
        apply_manifest(admin, PEER_READER, &[]).await;
        let local = service_account_client(cluster, admin, &agent_sa).await;
        let reader = cluster.client_as_user(&peer, &[]).await;
        assert_eq!(
            whoami(&local).await,
            format!("system:serviceaccount:{}:{}", agent_sa.0, agent_sa.1)
        );
        assert_eq!(whoami(&reader).await, peer);
        wait_allowed(&local, can("watch", MCS, "serviceexports")).await;
        wait_allowed(&reader, can("watch", MCS, "serviceexports")).await;
        local_clients.push(local);
        peer_clients.push(reader);
    }

    // Each agent reads and writes its own cluster as its ServiceAccount and reads the
    // others as the peer reader, never as admin.
    let agents: Vec<RunningAgent> = (0..names.len())
        .map(|i| {
            let members = (0..names.len())
                .map(|j| {
                    let client = if i == j {
                        local_clients[j].clone()
                    } else {
                        peer_clients[j].clone()
                    };
                    (names[j], client)
                })
                .collect();
            RunningAgent::start(names[i], members)
        })
        .collect();

    set.namespace(NS).await;
    for (i, ip) in [(0, "192.0.2.10"), (1, "192.0.2.20")] {
        create_service(set.client(i), NS, &hello_service("hello")).await;
        create_slice(set.client(i), &source_slice("hello", ip)).await;
        export(set.client(i), NS, "hello", None).await;
    }
    // A hand-written import in north with the name of an export: north's agent leaves it
    // alone and says so with a Warning event (events.k8s.io create).
    let mut manual = ServiceImport::new(
        "manual",
        ServiceImportSpec::new(ServiceImportType::Headless),
    );
    manual.metadata.namespace = Some(NS.into());
    Api::<ServiceImport>::namespaced(set.client(2).clone(), NS)
        .create(&PostParams::default(), &manual)
        .await
        .unwrap();
    create_service(set.client(0), NS, &hello_service("manual")).await;
    export(set.client(0), NS, "manual", None).await;

    // Every member imports both clusters: ServiceImport with a ClusterSetIP (the derived
    // Service), Ready without notes (no peer was unreadable), MCS slices from both.
    let want = vec![
        ("east".to_string(), vec!["192.0.2.10".to_string()]),
        ("west".to_string(), vec!["192.0.2.20".to_string()]),
    ];
    for (i, name) in names.iter().enumerate() {
        let client = set.client(i);
        let si = wait_import(client, NS, "hello", "import of both clusters", |si| {
            clusters_of(si) == ["east", "west"]
                && si.spec.ips.is_some()
                && import_ready_message(si).is_some()
        })
        .await;
        assert_eq!(
            import_ready_message(&si).as_deref(),
            Some(""),
            "{}: a peer was unreadable",
            name
        );
        support::wait_for(
            &format!("MCS EndpointSlices from both clusters in {}", name),
            SLICE_TIMEOUT,
            || async { (imported_endpoints(client, "hello").await == want).then_some(()) },
        )
        .await;
        assert!(
            derived_services(client, "hello").await.len() == 1,
            "one derived Service in {}",
            name
        );
    }
    // The exporters' conditions, written through serviceexports/status.
    for i in [0, 1] {
        for (type_, status) in [("Valid", "True"), ("Ready", "True"), ("Conflict", "False")] {
            wait_export_condition(set.client(i), NS, "hello", type_, status, None).await;
        }
    }
    let events: Api<Event> = Api::namespaced(set.client(2).clone(), NS);
    let event = support::wait_for(
        "ForeignServiceImport event in north",
        IMPORT_TIMEOUT,
        || async {
            events
                .list(&Default::default())
                .await
                .ok()?
                .items
                .into_iter()
                .find(|e| {
                    e.reason.as_deref() == Some("ForeignServiceImport")
                        && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("manual")
                })
        },
    )
    .await;
    assert_eq!(event.type_.as_deref(), Some("Warning"));

    // Unexport everything: the imports, derived Services and MCS slices go everywhere;
    // the hand-written import stays.
    for (i, name) in [(0, "hello"), (1, "hello"), (0, "manual")] {
        unexport(set.client(i), NS, name).await;
    }
    for i in 0..names.len() {
        let client = set.client(i);
        wait_no_import(client, NS, "hello", "import gone after unexport").await;
        support::wait_for(
            "MCS slices and derived Services gone",
            SLICE_TIMEOUT,
            || async {
                (imported_endpoints(client, "hello").await.is_empty()
                    && derived_services(client, "hello").await.is_empty())
                .then_some(())
            },
        )
        .await;
    }
    wait_no_import(set.client(0), NS, "manual", "east's manual import gone").await;
    assert!(
        Api::<ServiceImport>::namespaced(set.client(2).clone(), NS)
            .get_opt("manual")
            .await
            .unwrap()
            .is_some(),
        "the hand-written import is left alone"
    );

    // Nothing was ever refused: every agent is ready, and no reconcile failed.
    for (i, agent) in agents.iter().enumerate() {
        assert!(
            agent.is_ready() && agent.health.not_ready_reason().is_none(),
            "agent {} not ready: {:?}",
            names[i],
            agent.health.not_ready_reason()
        );
        assert_eq!(
            agent.metrics.reconcile_errors(),
            0,
            "agent {} had failed reconciles: {:?}",
            names[i],
            log_lines(&["reconcile failed"])
        );
        assert!(agent.metrics.reconciles() > 0);
    }
    for agent in agents {
        agent.stop().await;
    }
    eprintln!(
        "[agent_rbac] full flow under the shipped roles: {:.1?}",
        t0.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// 2. Without the binding, or with one rule missing, the agent says what is forbidden; and
//    the shipped roles allow nothing they should not.

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn without_its_binding_or_one_rule_the_agent_is_not_ready_and_names_the_forbidden_request() {
    capture_logs();
    let t0 = Instant::now();
    let set = ClusterSet::start_bare(&["solo"]).await;
    let admin = set.client(0);
    let agent_sa = deployment_identity(AGENT_DEPLOYMENT, AGENT_LOCAL);
    let user = format!("system:serviceaccount:{}:{}", agent_sa.0, agent_sa.1);
    apply_manifest(admin, AGENT_DEPLOYMENT, &["Namespace", "ServiceAccount"]).await;
    let local = service_account_client(&set.clusters[0], admin, &agent_sa).await;
    set.namespace(NS).await;
    create_service(admin, NS, &hello_service("hello")).await;
    export(admin, NS, "hello", None).await;

    // No binding: every watch is refused. The agent keeps running, is not ready, and says
    // which request its own cluster refused to whom.
    let agent = RunningAgent::start("solo", vec![("solo", local.clone())]);
    let reason = agent
        .wait_not_ready(
            "not ready: serviceexports list forbidden",
            &[
                "refuses",
                "ServiceExport",
                &user,
                "cannot list resource \"serviceexports\"",
                "403",
            ],
        )
        .await;
    eprintln!("[agent_rbac] without a binding: {reason}");
    assert!(
        !log_lines(&["ERROR", "watch forbidden", &user]).is_empty(),
        "no error log for the forbidden watch"
    );

    // The shipped role minus `patch serviceexports/status`: the agent syncs, then its
    // first write is refused; it is not ready and names the verb and subresource.
    let role = agent_role_without(|rules| {
        for r in rules.iter_mut() {
            if let Some(res) = r.resources.as_mut() {
                res.retain(|x| x != "serviceexports/status");
            }
        }
    });
    apply_role(admin, &role).await;
    apply_manifest(admin, AGENT_LOCAL, &["ClusterRoleBinding"]).await;
    let reason = agent
        .wait_not_ready(
            "not ready: serviceexports/status patch forbidden",
            &[
                "refuses a write for rbac/hello",
                "update status of ServiceExport rbac/hello",
                "cannot patch resource \"serviceexports/status\"",
                &user,
            ],
        )
        .await;
    eprintln!("[agent_rbac] without patch serviceexports/status: {reason}");
    assert!(
        !log_lines(&["ERROR", "refused a write", "serviceexports/status"]).is_empty(),
        "no error log for the refused write"
    );
    assert!(
        export_condition(admin, NS, "hello", "Valid")
            .await
            .is_none(),
        "no condition can have been written"
    );

    // The role as shipped: the agent heals without a restart.
    apply_manifest(admin, AGENT_LOCAL, &[]).await;
    agent.wait_ready("ready with the shipped role").await;
    wait_export_condition(admin, NS, "hello", "Valid", "True", None).await;
    wait_import(admin, NS, "hello", "import with the shipped role", |si| {
        clusters_of(si) == ["solo"]
    })
    .await;

    // Server-side apply creates objects, so `create` is needed although every write is a
    // patch: without `create endpointslices` the first imported slice is refused.
    let role = agent_role_without(|rules| {
        for r in rules.iter_mut() {
            let slices = r
                .api_groups
                .as_ref()
                .is_some_and(|g| g.iter().any(|g| g == DISCOVERY));
            if slices && r.verbs.iter().any(|v| v == "patch") {
                r.verbs.retain(|v| v != "create");
            }
        }
    });
    apply_role(admin, &role).await;
    wait_allowed_not(&local, can("create", DISCOVERY, "endpointslices").in_ns(NS)).await;
    create_slice(admin, &source_slice("hello", "192.0.2.30")).await;
    let reason = agent
        .wait_not_ready(
            "not ready: endpointslices create forbidden",
            &[
                "apply EndpointSlice rbac/",
                "cannot create resource \"endpointslices\"",
                &user,
            ],
        )
        .await;
    eprintln!("[agent_rbac] without create endpointslices: {reason}");
    apply_manifest(admin, AGENT_LOCAL, &[]).await;
    agent.wait_ready("ready again with the shipped role").await;
    support::wait_for("the imported slice", SLICE_TIMEOUT, || async {
        (imported_endpoints(admin, "hello").await
            == [("solo".to_string(), vec!["192.0.2.30".to_string()])])
        .then_some(())
    })
    .await;

    // The ClusterProperty the agent binary reads its id from: that one object, nothing else.
    let property = ClusterProperty::new(
        CLUSTER_ID_PROPERTY,
        ClusterPropertySpec {
            value: "solo".into(),
        },
    );
    Api::<ClusterProperty>::all(admin.clone())
        .create(&PostParams::default(), &property)
        .await
        .unwrap();
    let got = Api::<ClusterProperty>::all(local.clone())
        .get(CLUSTER_ID_PROPERTY)
        .await
        .expect("the agent reads its cluster id");
    assert_eq!(got.spec.value, "solo");

    // Not over-broad. The agent: what it uses, and nothing of another kind.
    assert_access(
        &user,
        &local,
        &[
            can("list", MCS, "serviceexports"),
            can("watch", "", "services"),
            can("watch", DISCOVERY, "endpointslices"),
            can("watch", "", "namespaces"),
            can("create", MCS, "serviceimports").in_ns(NS),
            can("delete", MCS, "serviceimports").in_ns(NS),
            can("patch", MCS, "serviceimports").sub("status").in_ns(NS),
            can("patch", MCS, "serviceexports").sub("status").in_ns(NS),
            can("create", "", "services").in_ns(NS),
            can("delete", DISCOVERY, "endpointslices").in_ns(NS),
            can("create", "events.k8s.io", "events").in_ns(NS),
            can("get", "about.k8s.io", "clusterproperties").named(CLUSTER_ID_PROPERTY),
            // The CIDR checks: pod ranges of the Nodes, service ranges.
            can("list", "", "nodes"),
            can("list", "networking.k8s.io", "servicecidrs"),
        ],
        &[
            can("get", "", "secrets").in_ns(NS),
            can("list", "", "secrets"),
            can("get", "", "configmaps").in_ns(NS),
            can("list", "", "pods"),
            can("create", "", "pods").in_ns(NS),
            can("create", "", "serviceaccounts").sub("token").in_ns(NS),
            can("get", "", "nodes").named("any"),
            can("patch", "", "nodes").named("any"),
            can("create", "", "namespaces"),
            can("delete", "", "namespaces").named(NS),
            // Exports belong to their owners: the agent only writes their status.
            can("create", MCS, "serviceexports").in_ns(NS),
            can("patch", MCS, "serviceexports").in_ns(NS),
            can("delete", MCS, "serviceexports").in_ns(NS),
            // Unused verbs are not granted.
            can("update", MCS, "serviceimports").in_ns(NS),
            can("update", "", "services").in_ns(NS),
            can("get", MCS, "serviceexports").sub("status").in_ns(NS),
            can("list", "about.k8s.io", "clusterproperties"),
            can("get", "about.k8s.io", "clusterproperties").named("other"),
            can("create", "", "events").in_ns(NS),
            can("create", "rbac.authorization.k8s.io", "clusterrolebindings"),
            can("escalate", "rbac.authorization.k8s.io", "clusterroles"),
            can("impersonate", "", "users"),
        ],
    )
    .await;

    // The peer reader: read the three inputs and the ranges, nothing else.
    apply_manifest(admin, PEER_READER, &[]).await;
    let peer = peer_user();
    let reader = set.clusters[0].client_as_user(&peer, &[]).await;
    wait_allowed(&reader, can("list", MCS, "serviceexports")).await;
    assert_access(
        &peer,
        &reader,
        &[
            can("list", MCS, "serviceexports"),
            can("watch", "", "services"),
            can("watch", DISCOVERY, "endpointslices"),
            can("list", "", "nodes"),
            can("list", "networking.k8s.io", "servicecidrs"),
        ],
        &[
            can("get", MCS, "serviceimports").in_ns(NS),
            can("delete", MCS, "serviceimports").in_ns(NS),
            can("patch", MCS, "serviceexports").sub("status").in_ns(NS),
            can("create", MCS, "serviceexports").in_ns(NS),
            can("create", "", "services").in_ns(NS),
            can("delete", DISCOVERY, "endpointslices").in_ns(NS),
            can("list", "", "namespaces"),
            can("get", "", "secrets").in_ns(NS),
            can("list", "", "pods"),
            can("create", "events.k8s.io", "events").in_ns(NS),
        ],
    )
    .await;

    // Cluster selection: both identities read every ClusterProperty, and write none.
    apply_manifest(admin, CLUSTER_SELECTION, &[]).await;
    wait_allowed(&local, can("list", "about.k8s.io", "clusterproperties")).await;
    wait_allowed(&reader, can("list", "about.k8s.io", "clusterproperties")).await;
    for (who, client) in [(&user, &local), (&peer, &reader)] {
        assert_access(
            who,
            client,
            &[
                can("list", "about.k8s.io", "clusterproperties"),
                can("watch", "about.k8s.io", "clusterproperties"),
            ],
            &[
                can("create", "about.k8s.io", "clusterproperties"),
                can("patch", "about.k8s.io", "clusterproperties").named("region"),
                can("delete", "about.k8s.io", "clusterproperties").named("region"),
                can("update", "about.k8s.io", "clusterproperties").named("region"),
            ],
        )
        .await;
    }
    agent.stop().await;
    eprintln!(
        "[agent_rbac] forbidden paths and access reviews: {:.1?}",
        t0.elapsed()
    );
}

async fn wait_allowed_not(client: &Client, a: Access) {
    support::wait_for(&format!("RBAC to deny {a:?}"), SETTLE, || async {
        (!allowed(client, a).await).then_some(())
    })
    .await;
}

// ---------------------------------------------------------------------------------------
// 3. The DNS server under its shipped role.

/// The response code of one A query over UDP.
async fn rcode(server: SocketAddr, name: &str) -> ResponseCode {
    let mut query = Message::new(4242, MessageType::Query, OpCode::Query);
    query.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    let socket = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    socket
        .send_to(&query.to_vec().unwrap(), server)
        .await
        .unwrap();
    let mut buf = vec![0u8; 4096];
    let n = tokio::time::timeout(Duration::from_secs(2), socket.recv(&mut buf))
        .await
        .expect("DNS answer in time")
        .unwrap();
    Message::from_vec(&buf[..n])
        .expect("DNS answer")
        .metadata
        .response_code
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_dns_server_serves_with_exactly_its_shipped_role_and_servfails_without() {
    capture_logs();
    let t0 = Instant::now();
    let cluster = support::start_cluster("dnsrbac", support::ClusterOptions::api_only()).await;
    let admin = cluster.client().await;
    let dns_sa = deployment_identity(DNS_DEPLOYMENT, DNS_RBAC);
    let user = format!("system:serviceaccount:{}:{}", dns_sa.0, dns_sa.1);
    // The namespace comes with the agent's manifest; the ServiceAccount with the DNS one.
    support::create_namespace(&admin, &dns_sa.0).await;
    apply_manifest(&admin, DNS_DEPLOYMENT, &["ServiceAccount"]).await;
    let client = service_account_client(&cluster, &admin, &dns_sa).await;
    assert_eq!(whoami(&client).await, user);

    // An import written by an agent (here by the admin), with its ClusterSetIP.
    support::create_namespace(&admin, NS).await;
    let mut spec = ServiceImportSpec::new(ServiceImportType::ClusterSetIp);
    spec.ips = Some(vec!["10.0.0.42".into()]);
    spec.ports = vec![ServicePort {
        name: Some("tcp".into()),
        protocol: Some(mcs_core::api::Protocol::Tcp),
        app_protocol: None,
        port: 42,
    }];
    let mut si = ServiceImport::new("hello", spec);
    si.metadata.namespace = Some(NS.into());
    Api::<ServiceImport>::namespaced(admin.clone(), NS)
        .create(&PostParams::default(), &si)
        .await
        .unwrap();
    let name = format!("hello.{NS}.svc.clusterset.local.");

    // No binding: the watches are refused, the server stays unsynced and answers SERVFAIL
    // (never a wrong NXDOMAIN), and its log says who may not list what. Its requests are
    // recorded on its own client, so what it asked is known without any shared log.
    let server = DnsServer::bind(DnsConfig::default().listen("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr = server.local_addr();
    let synced = server.synced();
    let requests = support::RequestLog::new();
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(
        server.run(support::recorded(&client, &requests), async move {
            let _ = stopped.await;
        }),
    );
    let refused = [
        "watch error",
        user.as_str(),
        "cannot list resource",
        "serviceimports",
    ];
    support::wait_for("a logged 403 for the DNS server", SETTLE, || async {
        (!log_lines(&refused).is_empty()).then_some(())
    })
    .await;
    // After every refusal, until each watch was refused REFUSALS times: still SERVFAIL, still
    // not synced, still running.
    const REFUSALS: usize = 4;
    const WATCHED: [&str; 3] = ["namespaces", "serviceimports", "endpointslices"];
    let refusals = |log: &[support::Recorded], resource: &str| -> Vec<support::Recorded> {
        log.iter()
            .filter(|r| r.is_list_of(resource))
            .inspect(|r| {
                assert_eq!(
                    r.status,
                    Some(http::StatusCode::FORBIDDEN),
                    "a list without a binding: {r:?}"
                )
            })
            .cloned()
            .collect()
    };
    let mut answered = 0;
    let log = loop {
        let log = requests
            .wait_until("another answer to the DNS server", SETTLE, |log| {
                (log.len() > answered).then(|| log.to_vec())
            })
            .await;
        answered = log.len();
        assert_eq!(rcode(addr, &name).await, ResponseCode::ServFail);
        assert!(!synced.load(Ordering::Acquire), "synced without access");
        assert!(!task.is_finished(), "the DNS server must keep running");
        if WATCHED
            .iter()
            .all(|resource| refusals(&log, resource).len() >= REFUSALS)
        {
            break log;
        }
    };
    // The refused watches back off instead of hammering the API server: between a refusal
    // and the next attempt of the same watch the server waits, longer in total than the API
    // server took to answer those attempts. (Without a backoff the next attempt follows at
    // once, and the waits are a tiny fraction of the answers' round trips.) Durations are
    // compared with each other, so a slow machine does not change the outcome.
    let (mut waiting, mut answering) = (Duration::ZERO, Duration::ZERO);
    for resource in WATCHED {
        let attempts = refusals(&log, resource);
        for pair in attempts.windows(2) {
            assert!(
                pair[1].sent >= pair[0].answered,
                "two lists of {resource} at once"
            );
            waiting += pair[1].sent.duration_since(pair[0].answered);
            answering += pair[0].answered.duration_since(pair[0].sent);
        }
    }
    eprintln!(
        "[agent_rbac] DNS server without a binding: {waiting:?} waiting between refused lists, \
         {answering:?} waiting for the refusals"
    );
    assert!(
        waiting > answering,
        "the DNS server retries refused lists without backing off: {waiting:?} between \
         attempts, {answering:?} in the attempts"
    );

    // The shipped role: it syncs by itself and answers.
    apply_manifest(&admin, DNS_RBAC, &[]).await;
    support::wait_for("DNS synced with the shipped role", SETTLE, || async {
        synced.load(Ordering::Acquire).then_some(())
    })
    .await;
    let ips: Vec<IpAddr> = support::dns_resolver(addr)
        .lookup_ip(name.as_str())
        .await
        .expect("A record")
        .iter()
        .collect();
    assert_eq!(ips, ["10.0.0.42".parse::<IpAddr>().unwrap()]);
    assert_eq!(rcode(addr, &name).await, ResponseCode::NoError);

    // Read-only, and only what it serves from.
    assert_access(
        &user,
        &client,
        &[
            can("watch", MCS, "serviceimports"),
            can("watch", DISCOVERY, "endpointslices"),
            can("watch", "", "namespaces"),
        ],
        &[
            can("create", MCS, "serviceimports").in_ns(NS),
            can("patch", MCS, "serviceimports").sub("status").in_ns(NS),
            can("create", DISCOVERY, "endpointslices").in_ns(NS),
            can("list", MCS, "serviceexports"),
            can("list", "", "services"),
            can("get", "", "secrets").in_ns(NS),
            can("list", "", "pods"),
        ],
    )
    .await;
    let _ = stop.send(());
    task.await.unwrap().unwrap();
    eprintln!(
        "[agent_rbac] DNS under its shipped role: {:.1?}",
        t0.elapsed()
    );
}

/// A cluster `name` with the shipped agent manifests applied (its namespace, ServiceAccount
/// and roles): an admin client, a client as the agent's ServiceAccount, and the agent's
/// heartbeat there with a duration of 3 h (renewed every hour: only what a test causes
/// renews it within the test).
async fn heartbeat_cluster(
    name: &str,
) -> (
    support::TestCluster,
    Client,
    Client,
    mcs_kube::admin::Heartbeat,
) {
    use mcs_kube::admin::{AGENT_HEARTBEAT, Heartbeat};
    let cluster = support::start_cluster(name, support::ClusterOptions::api_only()).await;
    let admin = cluster.client().await;
    apply_manifest(&admin, AGENT_DEPLOYMENT, &["Namespace", "ServiceAccount"]).await;
    apply_manifest(&admin, AGENT_LOCAL, &[]).await;
    let agent_sa = deployment_identity(AGENT_DEPLOYMENT, AGENT_LOCAL);
    let client = service_account_client(&cluster, &admin, &agent_sa).await;
    let beat = Heartbeat::new(&agent_sa.0, AGENT_HEARTBEAT, "east")
        .duration(Duration::from_secs(3 * 3600));
    (cluster, admin, client, beat)
}

/// Two agent processes of one cluster (the old and the new Pod of a rollout) renew one
/// heartbeat Lease as the agent's ServiceAccount, with the shipped roles: when one stops
/// and writes `stopped`, the other, watching the Lease, renews it at once (its periodic
/// renewal is an hour away here), so the Lease says ready again; once both stopped, it
/// says stopped.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stopping_agent_process_does_not_mark_the_running_one_down() {
    use k8s_openapi::api::coordination::v1::Lease;
    use mcs_kube::admin::{AGENT_HEARTBEAT, HEARTBEAT_READY, HEARTBEAT_REASON, HEARTBEAT_STOPPED};

    let (_cluster, admin, client, beat) = heartbeat_cluster("heartbeat").await;
    let ns = beat.namespace.clone();
    // `ready`: whether the process reports itself ready (the old one does not, so that the
    // Lease tells which wrote last).
    let start = |client: &Client, ready: bool| {
        let (stop, stopped) = oneshot::channel::<()>();
        let task = tokio::spawn(mcs_kube::admin::heartbeat(
            client.clone(),
            beat.clone(),
            Arc::new(AtomicBool::new(ready)),
            async move {
                let _ = stopped.await;
            },
        ));
        (stop, task)
    };
    let annotation = |lease: &Lease, key: &str| {
        lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(key))
            .cloned()
            .unwrap_or_default()
    };
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns);
    let wait_lease = |what: &'static str, want: fn(&str, &str) -> bool| {
        let leases = leases.clone();
        async move {
            let cond = kube::runtime::wait::await_condition(
                leases,
                AGENT_HEARTBEAT,
                move |l: Option<&Lease>| {
                    l.is_some_and(|l| {
                        want(
                            &annotation(l, HEARTBEAT_READY),
                            &annotation(l, HEARTBEAT_REASON),
                        )
                    })
                },
            );
            match tokio::time::timeout(Duration::from_secs(60), cond).await {
                Ok(Ok(Some(lease))) => lease,
                other => panic!("the heartbeat Lease never became {what}: {other:?}"),
            }
        }
    };

    // Each writes the Lease once when it starts, the new one last.
    let (stop_old, old) = start(&client, false);
    wait_lease("written by the old process", |ready, reason| {
        ready == "false" && reason == "not synced"
    })
    .await;
    let (stop_new, new) = start(&client, true);
    wait_lease("written by the new process", |ready, _| ready == "true").await;
    // The old process stops: its last write says stopped; the new one renews it.
    stop_old.send(()).unwrap();
    old.await.unwrap();
    let lease = wait_lease("ready again", |ready, _| ready == "true").await;
    assert_eq!(annotation(&lease, HEARTBEAT_REASON), "", "{lease:?}");
    // The new one stops too: nothing renews it any more.
    stop_new.send(()).unwrap();
    new.await.unwrap();
    let lease = leases.get(AGENT_HEARTBEAT).await.unwrap();
    assert_eq!(
        (
            annotation(&lease, HEARTBEAT_READY),
            annotation(&lease, HEARTBEAT_REASON)
        ),
        ("false".to_owned(), HEARTBEAT_STOPPED.to_owned()),
        "{lease:?}"
    );
}

/// A process's heartbeat says at once when the process becomes ready and when it stops
/// being ready (its periodic renewal is an hour away here), so that `kubectl mcs check`
/// right after an agent's (re)start does not report it starting for up to a third of the
/// Lease's duration.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_heartbeat_follows_readiness_at_once() {
    use k8s_openapi::api::coordination::v1::Lease;
    use mcs_kube::admin::{AGENT_HEARTBEAT, HEARTBEAT_READY};

    let (_cluster, admin, client, beat) = heartbeat_cluster("readiness").await;
    let ns = beat.namespace.clone();
    let ready = Arc::new(AtomicBool::new(false));
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(mcs_kube::admin::heartbeat(
        client,
        beat,
        Arc::clone(&ready),
        async move {
            let _ = stopped.await;
        },
    ));
    let leases: Api<Lease> = Api::namespaced(admin.clone(), &ns);
    let wait_ready = |want: &'static str| {
        let leases = leases.clone();
        async move {
            let cond = kube::runtime::wait::await_condition(
                leases,
                AGENT_HEARTBEAT,
                move |l: Option<&Lease>| {
                    l.and_then(|l| l.metadata.annotations.as_ref())
                        .and_then(|a| a.get(HEARTBEAT_READY))
                        .is_some_and(|r| r == want)
                },
            );
            match tokio::time::timeout(Duration::from_secs(60), cond).await {
                Ok(Ok(Some(_))) => {}
                other => panic!("the heartbeat Lease never said ready={want}: {other:?}"),
            }
        }
    };
    wait_ready("false").await;
    ready.store(true, Ordering::SeqCst);
    wait_ready("true").await;
    ready.store(false, Ordering::SeqCst);
    wait_ready("false").await;
    stop.send(()).unwrap();
    task.await.unwrap();
}
