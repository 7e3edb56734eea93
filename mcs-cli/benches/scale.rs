//! How far the ClusterSet scales: the hub topology from 3 to 100 clusters, the mesh at 3
//! and 6, on real API servers with real `mcs-agent` processes.
//!
//! ```text
//! scripts/k8s-bins.sh && cargo bench -p mcs-cli --bench scale
//! ```
//!
//! **Hub.** A hub (kube-apiserver + etcd) and three real members, `east`, `west` and
//! `north`, each running `mcs-agent --hub` with its own least-privilege hub identity
//! (`deploy/rbac/hub-member.yaml`, applied as shipped). Every member exports
//! `MCS_SCALE_SERVICES` (100) services of `MCS_SCALE_ENDPOINTS` (10) endpoints. The set
//! then grows to each of `MCS_SCALE_SIZES` (3,10,30,100) clusters with simulated members:
//! each publishes its 100 records and renews its Lease through the agent's own publishing
//! code ([`mcs_kube::hub::publish::Publisher`]) with its own hub identity, and watches the
//! hub as an agent does, through the agent's own hub sources
//! ([`mcs_kube::agent::load::watch_hub`]: its watches and their split per member, without
//! the merge and the writes into a cluster; `MCS_SCALE_SIM_WATCH=0`: publishing only). Their
//! Lease grows with the set as the agents' does (`MCS_SCALE_LEASE_AT_SIZE=0`: always 40 s,
//! the three real agents' still grows; `MCS_SCALE_LEASE_COMPARE=1`: at the last size, the
//! steady state is measured again with the other choice). Renewals are spread over each
//! period, as independent members' are. At
//! every size, once east, west and north each import every service from every member and
//! every simulated member holds every other member's records:
//!
//! - **export→import**: `MCS_SCALE_PROBES` (20) times, a new service exported in `east`
//!   until `west`'s ServiceImport lists east and west holds east's imported EndpointSlice
//!   (seen by watches started before the export);
//! - **unready→gone**: as often, one endpoint of an exported service in `east` turns
//!   unready, until west's imported slice no longer has it ready;
//! - resident memory (RSS) of the hub's kube-apiserver and etcd and of the three agents,
//!   and the CPU the hub's processes used while the set grew to that size and over
//!   `MCS_SCALE_IDLE_SECONDS` (20) of steady state (Lease renewals only), with the events
//!   the simulated members' watches took in meanwhile;
//! - the watches open on the hub, from its own metrics (`apiserver_longrunning_requests`
//!   with `verb="WATCH"`): the three agents' and the simulated members'.
//!
//! **Mesh.** The same exports and probes with every agent reading every member directly,
//! at each of `MCS_SCALE_MESH` (3,6) real clusters.
//!
//! **Unexported endpoints.** In the hub at 3 clusters and in the mesh at 3, `east` gets
//! `MCS_SCALE_UNEXPORTED` (10,000) endpoints of services nobody exports (1,000 Services of
//! 10); the agents' RSS before and after (a probe export after them proves their watches
//! are past them).
//!
//! **Before and after.** `MCS_SCALE_AGENTS=before=/path/to/mcs-agent,after=/path/...` runs
//! all of the above once per agent binary, one after the other in the same run, each row
//! labelled (default: this build's `mcs-agent`, unlabelled). `MCS_SCALE_MESH=` (empty)
//! skips the mesh, `MCS_SCALE_UNEXPORTED=0` the unexported endpoints.
//!
//! Times are wall-clock on a shared machine: context, not pass/fail. The tables at the end
//! are what `docs/scale.md` quotes.

use mcs_testkit as support;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use futures::{StreamExt, TryStreamExt};
use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;
use kube::api::{Api, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::watcher;
use kube::{Client, CustomResourceExt};
use mcs_core::ClusterId;
use mcs_core::api::{
    LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, ServiceExportSpec,
    v1beta1::{ServiceExport, ServiceImport},
};
use mcs_core::name::ServiceRef;
use mcs_kube::agent::desired::LABEL_K8S_SERVICE_NAME;
use mcs_kube::agent::load::{HubWatcher, watch_hub};
use mcs_kube::hub::publish::Publisher;
use mcs_kube::hub::record::MemberExport;
use support::{ClusterOptions, TestCluster};
use tokio::process::{Child, Command};

const NS: &str = "scale";
/// Service CIDR of the bench's clusters: room for 4,094 ClusterIPs.
const SERVICE_CIDR: &str = "10.0.0.0/20";
const UNEXPORTED_NS: &str = "unexported";
/// Budget for any one wait (convergence at 100 clusters included).
const BUDGET: Duration = Duration::from_secs(900);
/// Lease of the simulated members, the agents' default (renewed every third of it; longer
/// in a large set, as the agents' is: `mcs_kube::hub::lease_duration_for`).
const LEASE: Duration = Duration::from_secs(40);

fn env_list(name: &str, default: &str) -> Vec<usize> {
    std::env::var(name)
        .unwrap_or_else(|_| default.to_owned())
        .split(',')
        .filter(|v| !v.trim().is_empty())
        .map(|v| {
            v.trim()
                .parse()
                .unwrap_or_else(|e| panic!("{name}: {v:?}: {e}"))
        })
        .collect()
}

fn env_num(name: &str, default: usize) -> usize {
    std::env::var(name)
        .ok()
        .map(|v| v.parse().unwrap_or_else(|e| panic!("{name}: {v:?}: {e}")))
        .unwrap_or(default)
}

struct Config {
    sizes: Vec<usize>,
    mesh: Vec<usize>,
    services: usize,
    endpoints: usize,
    probes: usize,
    unexported: usize,
    idle: Duration,
    /// Whether the simulated members watch the hub.
    sim_watch: bool,
    /// Whether the simulated members' Lease grows with the set, as the agents' does.
    lease_at_size: bool,
    /// Whether to measure the other Lease choice too, at the last size.
    lease_compare: bool,
    /// The agent binaries to run, each with its label ("" for this build's alone).
    agents: Vec<(String, PathBuf)>,
}

impl Config {
    fn from_env() -> Self {
        let c = Self {
            sizes: env_list("MCS_SCALE_SIZES", "3,10,30,100"),
            mesh: env_list("MCS_SCALE_MESH", "3,6"),
            services: env_num("MCS_SCALE_SERVICES", 100),
            endpoints: env_num("MCS_SCALE_ENDPOINTS", 10),
            probes: env_num("MCS_SCALE_PROBES", 20),
            unexported: env_num("MCS_SCALE_UNEXPORTED", 10_000),
            idle: Duration::from_secs(env_num("MCS_SCALE_IDLE_SECONDS", 20) as u64),
            sim_watch: env_num("MCS_SCALE_SIM_WATCH", 1) != 0,
            lease_at_size: env_num("MCS_SCALE_LEASE_AT_SIZE", 1) != 0,
            lease_compare: env_num("MCS_SCALE_LEASE_COMPARE", 0) != 0,
            agents: match std::env::var("MCS_SCALE_AGENTS") {
                Ok(list) if !list.trim().is_empty() => list
                    .split(',')
                    .map(|pair| {
                        let (label, path) = pair.split_once('=').unwrap_or_else(|| {
                            panic!("MCS_SCALE_AGENTS: {pair:?} is not LABEL=PATH")
                        });
                        let path = PathBuf::from(path);
                        assert!(path.is_file(), "MCS_SCALE_AGENTS: no file {path:?}");
                        (format!(" ({label})"), path)
                    })
                    .collect(),
                _ => vec![(
                    String::new(),
                    PathBuf::from(env!("CARGO_BIN_EXE_mcs-agent")),
                )],
            },
        };
        assert!(
            c.sizes.windows(2).all(|w| w[0] < w[1]) && c.sizes[0] >= 3,
            "MCS_SCALE_SIZES must grow from at least 3 (the real members)"
        );
        assert!(
            c.sizes.iter().chain(&c.mesh).all(|&n| n <= 1023)
                && c.services <= 250
                && c.endpoints <= 63,
            "addresses pack member, service and endpoint into 10.0.0.0/8 (see `address`): at most 1,023 members, 250 services and 63 endpoints"
        );
        c
    }
}

// ---------------------------------------------------------------------------------------
// Objects.

fn service(name: &str) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// The address of endpoint `e` (1 to 63) of service number `svc` (below 256) of member
/// number `member` (below 1,024): the three packed into the 24 bits of 10.0.0.0/8.
fn address(member: usize, svc: usize, e: usize) -> String {
    let bits = (member << 14) | (svc << 6) | e;
    format!("10.{}.{}.{}", bits >> 16, (bits >> 8) & 0xff, bits & 0xff)
}

/// The EndpointSlice of service number `svc` of member number `member`: `n` addresses
/// ([`address`]), all ready.
fn slice(ns: &str, name: &str, member: usize, svc: usize, n: usize) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some(format!("{name}-x")),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([(
                LABEL_K8S_SERVICE_NAME.to_owned(),
                name.to_owned(),
            )])),
            ..Default::default()
        },
        endpoints: (1..=n)
            .map(|e| Endpoint {
                addresses: vec![address(member, svc, e)],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                ..Default::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    }
}

fn export(name: &str) -> ServiceExport {
    let mut export = ServiceExport::new(name, ServiceExportSpec::default());
    export.metadata.namespace = Some(NS.into());
    export
}

/// Creates service `name` (number `svc`) with its slice in a real member, and exports it.
async fn offer(client: &Client, name: &str, member: usize, svc: usize, endpoints: usize) {
    let pp = PostParams::default();
    Api::<Service>::namespaced(client.clone(), NS)
        .create(&pp, &service(name))
        .await
        .unwrap_or_else(|e| panic!("create Service {name}: {e}"));
    Api::<EndpointSlice>::namespaced(client.clone(), NS)
        .create(&pp, &slice(NS, name, member, svc, endpoints))
        .await
        .unwrap_or_else(|e| panic!("create EndpointSlice of {name}: {e}"));
    Api::<ServiceExport>::namespaced(client.clone(), NS)
        .create(&pp, &export(name))
        .await
        .unwrap_or_else(|e| panic!("create ServiceExport {name}: {e}"));
}

/// `svc-000` .. : the services every member exports.
fn svc_name(i: usize) -> String {
    format!("svc-{i:03}")
}

async fn populate(client: &Client, member: usize, cfg: &Config) {
    support::create_namespace(client, NS).await;
    futures::stream::iter(0..cfg.services)
        .for_each_concurrent(16, |i| async move {
            offer(client, &svc_name(i), member, i, cfg.endpoints).await;
        })
        .await;
}

/// 1,000 Services of 10 endpoints (or what `total` says) that nobody exports.
async fn unexported(client: &Client, member: usize, total: usize) {
    support::create_namespace(client, UNEXPORTED_NS).await;
    let per = 10;
    futures::stream::iter(0..total.div_ceil(per))
        .for_each_concurrent(16, |i| async move {
            let name = format!("quiet-{i:04}");
            let mut svc = service(&name);
            svc.metadata.namespace = Some(UNEXPORTED_NS.into());
            let pp = PostParams::default();
            Api::<Service>::namespaced(client.clone(), UNEXPORTED_NS)
                .create(&pp, &svc)
                .await
                .unwrap_or_else(|e| panic!("create Service {name}: {e}"));
            let mut s = slice(UNEXPORTED_NS, &name, member, 0, per);
            for (e, ep) in s.endpoints.iter_mut().enumerate() {
                ep.addresses = vec![format!(
                    "10.{member}.{}.{}",
                    100 + i / 250,
                    1 + (i * per + e) % 250
                )];
            }
            Api::<EndpointSlice>::namespaced(client.clone(), UNEXPORTED_NS)
                .create(&pp, &s)
                .await
                .unwrap_or_else(|e| panic!("create EndpointSlice of {name}: {e}"));
        })
        .await;
}

// ---------------------------------------------------------------------------------------
// Processes: agents, and what /proc says about them.

/// Resident memory in MiB.
fn rss_mib(pid: u32) -> f64 {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<f64>().ok())
        .map_or(f64::NAN, |kb| kb / 1024.0)
}

/// CPU time (user + system) used so far, in seconds (`/proc` counts in USER_HZ = 100).
fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, rest)| rest.split_whitespace().collect())
        .unwrap_or_default();
    // After the command: state is field 3, utime 14 and stime 15 (1-based).
    let tick = |i: usize| fields.get(i - 3).and_then(|v| v.parse::<f64>().ok());
    match (tick(14), tick(15)) {
        (Some(u), Some(s)) => (u + s) / 100.0,
        _ => f64::NAN,
    }
}

struct Agent {
    id: String,
    child: Child,
}

impl Agent {
    fn pid(&self) -> u32 {
        self.child.id().expect("agent running")
    }

    fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("the agent of {} exited: {status}", self.id);
        }
    }
}

fn agent(bin: &Path, cluster: &TestCluster, id: &str, args: &[String]) -> Agent {
    let log = std::fs::File::create(cluster.dir().join("mcs-agent.log")).expect("agent log");
    let child = Command::new(bin)
        .arg(format!("--cluster-id={id}"))
        .args(args)
        .arg("--admin-listen=127.0.0.1:0")
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .env("RUST_LOG", "warn")
        .env_remove("MCS_CLUSTER_ID")
        .env_remove("MCS_HUB_KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("agent log"))
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("start mcs-agent");
    Agent {
        id: id.to_owned(),
        child,
    }
}

// ---------------------------------------------------------------------------------------
// Watching the importing cluster.

/// Waits until the cluster's imports of every `svc-*` list `n` clusters and it holds `n`
/// imported slices of each.
async fn converged(west: &Client, n: usize, cfg: &Config) {
    let imports: Api<ServiceImport> = Api::namespaced(west.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(west.clone(), NS);
    let deadline = Instant::now() + BUDGET;
    loop {
        let ok_imports = imports
            .list(&ListParams::default())
            .await
            .map(|l| {
                l.items
                    .iter()
                    .filter(|si| {
                        si.metadata
                            .name
                            .as_deref()
                            .is_some_and(|n| n.starts_with("svc-"))
                    })
                    .filter(|si| {
                        si.status
                            .as_ref()
                            .and_then(|s| s.clusters.as_ref())
                            .is_some_and(|c| c.len() == n)
                    })
                    .count()
            })
            .unwrap_or(0);
        let ok_slices = if ok_imports == cfg.services {
            count_imported_slices(&slices).await
        } else {
            0
        };
        if ok_imports == cfg.services && ok_slices == cfg.services * n {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "not converged at {n} clusters after {BUDGET:?}: {ok_imports} of {} imports, {ok_slices} slices",
            cfg.services
        );
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// Imported slices of the `svc-*` services, counted page by page.
async fn count_imported_slices(slices: &Api<EndpointSlice>) -> usize {
    let mut lp = ListParams::default()
        .labels(LABEL_SOURCE_CLUSTER)
        .limit(2000);
    let mut count = 0;
    loop {
        let Ok(page) = slices.list(&lp).await else {
            return 0;
        };
        count += page
            .items
            .iter()
            .filter(|s| {
                s.metadata
                    .labels
                    .as_ref()
                    .and_then(|l| l.get(LABEL_SERVICE_NAME))
                    .is_some_and(|n| n.starts_with("svc-"))
            })
            .count();
        match page.metadata.continue_ {
            Some(token) if !token.is_empty() => lp = lp.continue_token(&token),
            _ => return count,
        }
    }
}

/// Starts watching `api` (objects selected by `labels`); resolves, once the watch has
/// listed, to a future that yields the instant the first object meeting `done` is seen.
async fn watch_for<K>(
    api: Api<K>,
    config: watcher::Config,
    done: impl Fn(&K) -> bool + Send + 'static,
) -> tokio::task::JoinHandle<Instant>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    let (listed_tx, listed_rx) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut listed = Some(listed_tx);
        let mut events = std::pin::pin!(watcher(api, config));
        while let Some(event) = events.try_next().await.expect("watch") {
            match event {
                watcher::Event::InitDone => {
                    if let Some(tx) = listed.take() {
                        let _ = tx.send(());
                    }
                }
                watcher::Event::Apply(o) | watcher::Event::InitApply(o) if done(&o) => {
                    return Instant::now();
                }
                _ => {}
            }
        }
        panic!("watch ended");
    });
    listed_rx.await.expect("the watch listed");
    task
}

fn clusters_of(si: &ServiceImport) -> Vec<String> {
    si.status
        .as_ref()
        .and_then(|s| s.clusters.as_ref())
        .map(|c| c.iter().map(|c| c.cluster.clone()).collect())
        .unwrap_or_default()
}

/// Latencies of `cfg.probes` exports from `east` (member 0) into `west`.
async fn export_probes(east: &Client, west: &Client, tag: &str, cfg: &Config) -> Vec<Duration> {
    let mut out = Vec::new();
    for k in 0..cfg.probes {
        let name = format!("probe-{tag}-{k}");
        let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let imported = watch_for(
            Api::<ServiceImport>::namespaced(west.clone(), NS),
            by_name,
            |si: &ServiceImport| clusters_of(si) == ["east"],
        )
        .await;
        let sliced = watch_for(
            Api::<EndpointSlice>::namespaced(west.clone(), NS),
            watcher::Config::default().labels(&format!(
                "{LABEL_SERVICE_NAME}={name},{LABEL_SOURCE_CLUSTER}=east"
            )),
            |s: &EndpointSlice| !s.endpoints.is_empty(),
        )
        .await;
        let t0 = Instant::now();
        offer(east, &name, 0, 200 + k % 50, cfg.endpoints).await;
        let t1 = imported.await.expect("import watch");
        let t2 = sliced.await.expect("slice watch");
        out.push(t1.max(t2) - t0);
    }
    out
}

/// Latencies of `cfg.probes` endpoints in `east` turning unready until `west`'s import has
/// them unready (or no longer has them).
async fn unready_probes(east: &Client, west: &Client, cfg: &Config) -> Vec<Duration> {
    let mut out = Vec::new();
    for k in 0..cfg.probes.min(cfg.services) {
        let name = svc_name(k);
        let address = address(0, k, 1);
        let gone = {
            let address = address.clone();
            watch_for(
                Api::<EndpointSlice>::namespaced(west.clone(), NS),
                watcher::Config::default().labels(&format!(
                    "{LABEL_SERVICE_NAME}={name},{LABEL_SOURCE_CLUSTER}=east"
                )),
                move |s: &EndpointSlice| {
                    !s.endpoints.iter().any(|e| {
                        e.addresses.contains(&address)
                            && e.conditions.as_ref().and_then(|c| c.ready) != Some(false)
                    })
                },
            )
            .await
        };
        let mut s = slice(NS, &name, 0, k, cfg.endpoints);
        s.endpoints[0].conditions = Some(EndpointConditions {
            ready: Some(false),
            serving: Some(false),
            terminating: Some(true),
        });
        let patch = serde_json::json!({ "endpoints": s.endpoints });
        let t0 = Instant::now();
        Api::<EndpointSlice>::namespaced(east.clone(), NS)
            .patch(
                &format!("{name}-x"),
                &PatchParams::default(),
                &Patch::Merge(&patch),
            )
            .await
            .unwrap_or_else(|e| panic!("mark {address} unready: {e}"));
        out.push(gone.await.expect("slice watch") - t0);
    }
    out
}

// ---------------------------------------------------------------------------------------
// The hub.

async fn install_hub(hub: &TestCluster) -> Client {
    let admin = hub.client().await;
    let crd = MemberExport::crd();
    Api::<CustomResourceDefinition>::all(admin.clone())
        .patch(
            crd.metadata.name.as_deref().unwrap_or_default(),
            &PatchParams::apply("mcs-scale").force(),
            &Patch::Apply(&crd),
        )
        .await
        .expect("install the MemberExport CRD on the hub");
    support::wait_for("the MemberExport CRD", Duration::from_secs(60), || async {
        Api::<MemberExport>::all(admin.clone())
            .list(&ListParams::default().limit(1))
            .await
            .ok()
            .map(|_| ())
    })
    .await;
    support::apply_manifest(&admin, "deploy/rbac/hub.yaml", &[]).await;
    admin
}

async fn add_member(hub_admin: &Client, id: &str) {
    for obj in support::manifest_with("deploy/rbac/hub-member.yaml", &[("MEMBER_ID", id)]) {
        support::apply(hub_admin, &obj).await;
    }
}

/// A simulated member: publishes what a real one would, with its own hub identity, and
/// watches the hub as a real one's agent does (with `cfg.sim_watch`).
async fn simulated_member(
    hub: &TestCluster,
    hub_admin: &Client,
    member: usize,
    cfg: &Config,
) -> (Publisher, Option<HubWatcher>) {
    let id = ClusterId::new(format!("sim-{member:03}")).unwrap();
    add_member(hub_admin, id.as_str()).await;
    let client = hub
        .client_as_user(&format!("mcs:member:{id}"), &["mcs:members"])
        .await;
    let publisher = Publisher::new(client.clone(), &id, "mcs-agent");
    // The member's RoleBinding was just made: the hub's authorizer may not know it yet.
    support::wait_for(
        &format!("{id}'s first Lease renewal"),
        Duration::from_secs(60),
        || async { publisher.renew_lease(LEASE).await.ok() },
    )
    .await;
    let created = Time(k8s_openapi::jiff::Timestamp::now());
    futures::stream::iter(0..cfg.services)
        .for_each_concurrent(8, |i| {
            let (publisher, id, created) = (&publisher, &id, created.clone());
            async move {
                let name = svc_name(i);
                let mut e = export(&name);
                e.metadata.creation_timestamp = Some(created);
                let s = slice(NS, &name, member, i, cfg.endpoints);
                let record = MemberExport::from_member(id, &e, Some(&service(&name)), &[&s])
                    .expect("a complete record");
                let service = ServiceRef::new(NS, &name).unwrap();
                publisher
                    .publish(&service, Some(record), None)
                    .await
                    .unwrap_or_else(|e| panic!("{e}"));
            }
        })
        .await;
    let watcher = cfg.sim_watch.then(|| watch_hub(&client, &id));
    (publisher, watcher)
}

/// Waits until every simulated member's watches hold every other member's records: all
/// `total` records on the hub but its own `own`.
async fn watchers_converged(watchers: &[HubWatcher], total: usize, own: usize) {
    let want = (total - own) as u64;
    let deadline = Instant::now() + BUDGET;
    loop {
        let behind = watchers.iter().filter(|w| w.records() != want).count();
        if behind == 0 {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{behind} of {} simulated members do not hold the {want} records of the others after {BUDGET:?} (watch errors: {})",
            watchers.len(),
            watchers.iter().map(HubWatcher::errors).sum::<u64>()
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

#[derive(Default)]
struct Row {
    topology: String,
    clusters: usize,
    converge: Duration,
    /// The part of `converge` after the last record of the step was published (hub) or
    /// the agents started (mesh): the agents' own share.
    settle: Duration,
    export: Vec<Duration>,
    unready: Vec<Duration>,
    hub_apiserver_rss: Option<f64>,
    hub_etcd_rss: Option<f64>,
    hub_cpu_growth: Option<f64>,
    hub_cpu_idle: Option<f64>,
    agent_rss: Vec<f64>,
    records: Option<usize>,
    /// Watches open on the hub, from its own metrics.
    hub_watches: Option<u64>,
}

fn pct(v: &mut [Duration], p: f64) -> Duration {
    v.sort();
    let i = ((v.len() as f64 - 1.0) * p).round() as usize;
    v.get(i).copied().unwrap_or_default()
}

fn list_ms(v: &[Duration]) -> String {
    v.iter().map(|d| ms(*d)).collect::<Vec<_>>().join(" ")
}

fn ms(d: Duration) -> String {
    format!("{:.0}", d.as_secs_f64() * 1000.0)
}

/// The watches an API server has open, from its own metrics: the sum of
/// `apiserver_longrunning_requests` with `verb="WATCH"` (every watch a client opened,
/// whatever its resource and scope). `None` when the metrics cannot be read.
async fn open_watches(admin: &Client) -> Option<u64> {
    let request = http::Request::get("/metrics")
        .body(Vec::new())
        .expect("a valid request");
    let text = admin.request_text(request).await.ok()?;
    Some(watches_in_metrics(&text))
}

fn watches_in_metrics(text: &str) -> u64 {
    text.lines()
        .filter(|l| {
            l.starts_with("apiserver_longrunning_requests{") && l.contains("verb=\"WATCH\"")
        })
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum::<f64>() as u64
}

async fn hub_cpu(hub: &TestCluster) -> f64 {
    ["kube-apiserver", "etcd"]
        .iter()
        .filter_map(|c| hub.pid(c))
        .map(cpu_seconds)
        .sum()
}

/// The bench's clusters: CRDs, no controller manager (the bench writes EndpointSlices),
/// room for 1,000 unexported Services, the exported ones and their derived Services.
fn cluster_options() -> ClusterOptions {
    ClusterOptions {
        controller_manager: false,
        install_crds: true,
        service_cidr: SERVICE_CIDR.to_owned(),
        ..Default::default()
    }
}

/// The simulated members' Lease: the agents' default, grown with the set as the agents'
/// is (`at_size`), or not.
fn sim_lease(sims: usize, at_size: bool) -> Duration {
    if at_size {
        mcs_kube::hub::lease_duration_for(3 + sims, LEASE)
    } else {
        LEASE
    }
}

/// Hub CPU (cores) and the events the simulated members' watches took in (per second) over
/// `window` of steady state: Lease renewals, nothing else changes.
async fn idle_window(hub: &TestCluster, watchers: &[HubWatcher], window: Duration) -> (f64, f64) {
    let events = || watchers.iter().map(HubWatcher::events).sum::<u64>();
    let (cpu0, events0) = (hub_cpu(hub).await, events());
    tokio::time::sleep(window).await;
    let secs = window.as_secs_f64();
    let cores = (hub_cpu(hub).await - cpu0) / secs;
    (cores, (events() - events0) as f64 / secs)
}

/// A line of the Lease table.
fn lease_row(clusters: usize, sims: usize, at_size: bool, events: f64, cores: f64) -> String {
    let lease = sim_lease(sims, at_size).as_secs();
    format!(
        "| {clusters} | {} | {lease} | {:.1} | {events:.0} | {cores:.2} |",
        if at_size {
            "grows with the set"
        } else {
            "40 s"
        },
        sims as f64 / (lease as f64 / 3.0),
    )
}

async fn run_hub(
    cfg: &Config,
    (label, bin): &(String, PathBuf),
    rows: &mut Vec<Row>,
    memory: &mut Vec<String>,
    leases: &mut Vec<String>,
) {
    let names = ["hub", "east", "west", "north"];
    let opts = cluster_options();
    let clusters = support::start_clusters_with(&names, opts).await;
    let hub = &clusters[0];
    let members = &clusters[1..];
    let hub_admin = install_hub(hub).await;
    let mut clients = Vec::new();
    for (i, c) in members.iter().enumerate() {
        add_member(&hub_admin, names[i + 1]).await;
        clients.push(c.client().await);
    }
    let t_grow = Instant::now();
    let cpu0 = hub_cpu(hub).await;
    for (i, client) in clients.iter().enumerate() {
        populate(client, i, cfg).await;
    }
    let mut agents = Vec::new();
    for (i, c) in members.iter().enumerate() {
        let id = names[i + 1];
        let path = c.dir().join("hub.kubeconfig");
        support::write_kubeconfig(
            &path,
            &hub.kubeconfig_as_user(&format!("mcs:member:{id}"), &["mcs:members"]),
        );
        agents.push(agent(bin, c, id, &[format!("--hub={}", path.display())]));
    }
    let (east, west) = (&clients[0], &clients[1]);
    let mut sims: Vec<Publisher> = Vec::new();
    let mut watchers: Vec<HubWatcher> = Vec::new();
    // The simulated members and whether their Lease grows with the set.
    let renewals = tokio::sync::watch::channel((Vec::<Publisher>::new(), cfg.lease_at_size));
    let renewer = {
        let mut rx = renewals.1.clone();
        tokio::spawn(async move {
            loop {
                let (publishers, at_size) = rx.borrow_and_update().clone();
                if publishers.is_empty() {
                    if rx.changed().await.is_err() {
                        return;
                    }
                    continue;
                }
                // Each renews every third of its Lease, spread over that period as
                // independent members' renewals are.
                let lease = sim_lease(publishers.len(), at_size);
                let gap = lease / 3 / publishers.len() as u32;
                for p in &publishers {
                    if let Err(e) = p.renew_lease(lease).await {
                        eprintln!("[scale] {e}");
                    }
                    match tokio::time::timeout(gap, rx.changed()).await {
                        Err(_) => {}
                        Ok(Ok(())) => break,
                        Ok(Err(_)) => return,
                    }
                }
            }
        })
    };
    for &n in &cfg.sizes {
        let t_size = Instant::now();
        while 3 + sims.len() < n {
            let member = 3 + sims.len();
            let (publisher, watcher) = simulated_member(hub, &hub_admin, member, cfg).await;
            sims.push(publisher);
            watchers.extend(watcher);
        }
        renewals.0.send_replace((sims.clone(), cfg.lease_at_size));
        let published = Instant::now();
        // Converged: every real member imports everything (their agents are past the
        // burst, so the probes measure a settled set).
        for client in &clients {
            converged(client, n, cfg).await;
        }
        if !watchers.is_empty() {
            let total = Api::<MemberExport>::all(hub_admin.clone())
                .list_metadata(&ListParams::default())
                .await
                .expect("list the records on the hub")
                .items
                .len();
            watchers_converged(&watchers, total, cfg.services).await;
        }
        let settle = published.elapsed();
        let converge = if n == cfg.sizes[0] {
            t_grow.elapsed()
        } else {
            t_size.elapsed()
        };
        for a in &mut agents {
            a.assert_running();
        }
        let cpu_growth = hub_cpu(hub).await - cpu0;
        eprintln!(
            "[scale] hub{label}, {n} clusters: converged in {converge:.1?} ({settle:.1?} after the last record)"
        );
        let export = export_probes(east, west, &format!("h{n}"), cfg).await;
        eprintln!(
            "[scale] hub{label}, {n} clusters: export→import in probe order (ms): {}",
            list_ms(&export)
        );
        let unready = unready_probes(east, west, cfg).await;
        // Restore the endpoints the unready probes turned.
        for k in 0..cfg.probes.min(cfg.services) {
            let s = slice(NS, &svc_name(k), 0, k, cfg.endpoints);
            Api::<EndpointSlice>::namespaced(east.clone(), NS)
                .patch(
                    &format!("{}-x", svc_name(k)),
                    &PatchParams::default(),
                    &Patch::Merge(&serde_json::json!({ "endpoints": s.endpoints })),
                )
                .await
                .expect("restore endpoints");
        }
        let (idle, lease_events) = idle_window(hub, &watchers, cfg.idle).await;
        let records = Api::<MemberExport>::all(hub_admin.clone())
            .list_metadata(&ListParams::default())
            .await
            .map(|l| l.items.len())
            .ok();
        let hub_watches = open_watches(&hub_admin).await;
        rows.push(Row {
            topology: format!("hub{label}"),
            clusters: n,
            converge,
            settle,
            export,
            unready,
            hub_apiserver_rss: hub.pid("kube-apiserver").map(rss_mib),
            hub_etcd_rss: hub.pid("etcd").map(rss_mib),
            hub_cpu_growth: Some(cpu_growth),
            hub_cpu_idle: Some(idle),
            agent_rss: agents.iter().map(|a| rss_mib(a.pid())).collect(),
            records,
            hub_watches,
        });
        print_row(rows.last().unwrap());
        leases.push(lease_row(
            n,
            sims.len(),
            cfg.lease_at_size,
            lease_events,
            idle,
        ));
        if cfg.lease_compare && n == *cfg.sizes.last().unwrap() {
            // The other Lease choice, in the same set: one period to take hold, then the
            // same window.
            let other = !cfg.lease_at_size;
            renewals.0.send_replace((sims.clone(), other));
            tokio::time::sleep(sim_lease(sims.len(), other) / 3).await;
            let (idle, lease_events) = idle_window(hub, &watchers, cfg.idle).await;
            leases.push(lease_row(n, sims.len(), other, lease_events, idle));
            eprintln!("[scale] {}", leases.last().unwrap());
        }
        if n == cfg.sizes[0] && cfg.unexported > 0 {
            let topology = format!("hub{label}");
            memory.push(unexported_check(&topology, cfg, east, west, &mut agents).await);
        }
    }
    renewer.abort();
    drop(watchers);
    drop(agents);
}

async fn unexported_check(
    topology: &str,
    cfg: &Config,
    east: &Client,
    west: &Client,
    agents: &mut [Agent],
) -> String {
    let before: Vec<f64> = agents.iter().map(|a| rss_mib(a.pid())).collect();
    unexported(east, 0, cfg.unexported).await;
    // One more export after them: once it is imported, the agents' watches of east have
    // delivered everything before it.
    let one = Config {
        probes: 1,
        ..Config::from_env()
    };
    export_probes(east, west, &format!("{topology}-after-unexported"), &one).await;
    let after: Vec<f64> = agents.iter().map(|a| rss_mib(a.pid())).collect();
    let line = format!(
        "| {topology} | {} | {} | {} |",
        cfg.unexported,
        agents
            .iter()
            .zip(&before)
            .map(|(a, b)| format!("{} {b:.1}", a.id))
            .collect::<Vec<_>>()
            .join(", "),
        agents
            .iter()
            .zip(before.iter().zip(&after))
            .map(|(a, (b, x))| format!("{} {x:.1} ({:+.1})", a.id, x - b))
            .collect::<Vec<_>>()
            .join(", "),
    );
    eprintln!("[scale] unexported endpoints: {line}");
    line
}

async fn run_mesh(
    n: usize,
    cfg: &Config,
    (label, bin): &(String, PathBuf),
    rows: &mut Vec<Row>,
    memory: &mut Vec<String>,
) {
    let ids: Vec<String> = ["east", "west", "north"]
        .iter()
        .map(|s| (*s).to_owned())
        .chain((3..n).map(|i| format!("member-{i}")))
        .take(n)
        .collect();
    let names: Vec<&str> = ids.iter().map(String::as_str).collect();
    let opts = cluster_options();
    let clusters = support::start_clusters_with(&names, opts).await;
    let mut clients = Vec::new();
    for c in &clusters {
        clients.push(c.client().await);
    }
    let t0 = Instant::now();
    for (i, client) in clients.iter().enumerate() {
        populate(client, i, cfg).await;
    }
    let paths: Vec<PathBuf> = clusters.iter().map(TestCluster::kubeconfig_path).collect();
    let mut agents: Vec<Agent> = clusters
        .iter()
        .enumerate()
        .map(|(i, c)| agent(bin, c, &ids[i], &mesh_args(&ids, &paths, i)))
        .collect();
    let started = Instant::now();
    let (east, west) = (&clients[0], &clients[1]);
    for client in &clients {
        converged(client, n, cfg).await;
    }
    let (converge, settle) = (t0.elapsed(), started.elapsed());
    eprintln!("[scale] mesh{label}, {n} clusters: converged in {converge:.1?}");
    let export = export_probes(east, west, &format!("m{n}"), cfg).await;
    let unready = unready_probes(east, west, cfg).await;
    rows.push(Row {
        topology: format!("mesh{label}"),
        clusters: n,
        converge,
        settle,
        export,
        unready,
        agent_rss: agents.iter().map(|a| rss_mib(a.pid())).collect(),
        ..Default::default()
    });
    print_row(rows.last().unwrap());
    if n == cfg.mesh[0] && cfg.unexported > 0 {
        let topology = format!("mesh{label}");
        memory.push(unexported_check(&topology, cfg, east, west, &mut agents).await);
    }
    for a in &mut agents {
        a.assert_running();
    }
}

fn mesh_args(ids: &[String], paths: &[PathBuf], me: usize) -> Vec<String> {
    ids.iter()
        .zip(paths)
        .enumerate()
        .map(|(i, (id, path))| {
            if i == me {
                format!("--member={id}")
            } else {
                format!("--member={id}={}", path.display())
            }
        })
        .collect()
}

fn header() -> &'static str {
    "| topology | clusters | converge s (after the last record) | export→import p50 / p99 ms | unready→gone p50 / p99 ms | hub apiserver / etcd RSS MiB | hub CPU s (growth) / idle cores | agent RSS MiB (east, west, north) | records | hub watches |\n\
     |---|---|---|---|---|---|---|---|---|---|"
}

fn format_row(r: &Row) -> String {
    let (mut e, mut u) = (r.export.clone(), r.unready.clone());
    let opt = |v: Option<f64>, p: usize| v.map_or("-".to_owned(), |v| format!("{v:.p$}"));
    format!(
        "| {} | {} | {:.1} ({:.1}) | {} / {} | {} / {} | {} / {} | {} / {} | {} | {} | {} |",
        r.topology,
        r.clusters,
        r.converge.as_secs_f64(),
        r.settle.as_secs_f64(),
        ms(pct(&mut e, 0.5)),
        ms(pct(&mut e, 0.99)),
        ms(pct(&mut u, 0.5)),
        ms(pct(&mut u, 0.99)),
        opt(r.hub_apiserver_rss, 0),
        opt(r.hub_etcd_rss, 0),
        opt(r.hub_cpu_growth, 1),
        opt(r.hub_cpu_idle, 2),
        r.agent_rss
            .iter()
            .take(3)
            .map(|v| format!("{v:.0}"))
            .collect::<Vec<_>>()
            .join(", "),
        r.records.map_or("-".to_owned(), |v| v.to_string()),
        r.hub_watches.map_or("-".to_owned(), |v| v.to_string()),
    )
}

fn print_row(r: &Row) {
    eprintln!("[scale] {}", format_row(r));
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    // `cargo bench` passes `--bench`; `cargo test --benches` passes nothing we need. Do
    // nothing when only listed.
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let cfg = Config::from_env();
    let most = cfg.mesh.iter().copied().max().unwrap_or(0).max(4);
    support::allow_clusters(most);
    let t0 = Instant::now();
    let mut rows = Vec::new();
    let mut memory = Vec::new();
    let mut leases = Vec::new();
    for agent in &cfg.agents {
        run_hub(&cfg, agent, &mut rows, &mut memory, &mut leases).await;
    }
    for agent in &cfg.agents {
        for &n in &cfg.mesh {
            run_mesh(n, &cfg, agent, &mut rows, &mut memory).await;
        }
    }
    println!(
        "\nscale: {} services x {} endpoints per member, {} probes per size, simulated members {}, their Lease {} ({:.0?} in all)\n",
        cfg.services,
        cfg.endpoints,
        cfg.probes,
        if cfg.sim_watch {
            "publish and watch"
        } else {
            "publish only"
        },
        if cfg.lease_at_size {
            "growing with the set"
        } else {
            "40 s"
        },
        t0.elapsed()
    );
    println!("{}", header());
    for r in &rows {
        println!("{}", format_row(r));
    }
    if !leases.is_empty() {
        println!(
            "\n| clusters | simulated members' Lease | Lease s | their renewals/s | events/s to their watches (steady state) | hub idle cores |\n|---|---|---|---|---|---|"
        );
        for line in &leases {
            println!("{line}");
        }
    }
    if !memory.is_empty() {
        println!(
            "\n| topology | unexported endpoints in east | agent RSS MiB before | after (change) |\n|---|---|---|---|"
        );
        for line in &memory {
            println!("{line}");
        }
    }
}
