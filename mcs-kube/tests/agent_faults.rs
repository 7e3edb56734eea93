//! Fault injection against real API servers (issue #8): an API server killed and restarted
//! under a running agent, a peer dropped mid-watch, watch history expired (410 Gone) and
//! re-listed, conflicting exports written concurrently from two clusters, and an agent
//! aborted while it applies a burst.
//!
//! After each fault the test waits until the state meets an independently stated
//! expectation, then checks three things in every cluster:
//!
//! - **fresh start**: the normalized state (managed ServiceImports, derived Services,
//!   imported EndpointSlices, the conditions of the local ServiceExports) is captured, the
//!   agents are stopped, everything they created is wiped, fresh agents are started, and
//!   they must reproduce exactly the captured state;
//! - **nothing foreign touched**: objects the agent did not create (a look-alike imported
//!   EndpointSlice, a hand-written ServiceImport, a look-alike derived Service) keep their
//!   resourceVersion;
//! - **no orphan, no duplicate**: every object carrying the agent's `managed-by` label
//!   belongs to a current import (derived Services owned by the import's current uid,
//!   slices of an exporting cluster, one per source cluster and address family).
//!
//! The agents run with a 10-minute resync, so recovery never relies on the periodic resync.
//! They merge with `Stability::Sticky`, which by design may keep an import whose winning
//! export left (a fresh agent would re-elect): so the final states here are ones where
//! sticky and fresh agree (every conflicting export still present, or identical specs).

use mcs_testkit as support;
use mcs_testkit::clusterset;

use std::collections::{BTreeMap, BTreeSet};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use clusterset::*;
use futures::StreamExt;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use kube::Client;
use kube::api::{
    Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams, WatchEvent,
    WatchParams,
};
use mcs_core::ClusterId;
use mcs_core::api::v1beta1::{ServiceExport, ServiceImport};
use mcs_core::api::{
    ANNOTATION_DERIVED_SERVICE, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, ServiceImportType,
};
use mcs_core::merge::{Constituent, ServiceFacts, Stability};
use mcs_core::name::ServiceRef;
use mcs_kube::agent::desired::{
    LABEL_K8S_SERVICE_NAME, LABEL_MANAGED_BY, LABEL_SLICE_MANAGED_BY, MANAGED_BY,
    derived_service_name,
};
use mcs_kube::agent::{Agent, AgentConfig, HubConfig, Member, ResyncHandle};
use serde_json::{Value, json};
use tokio::sync::oneshot;
use tokio::task::JoinHandle;

const NS: &str = "faults";
/// Budget for the state to converge after a fault (or for fresh agents to rebuild it).
const CONVERGE: Duration = Duration::from_secs(40);

// ---------------------------------------------------------------------------------------
// Agents the test controls: routed through proxies, stopped, aborted, restarted.

type Running = (
    oneshot::Sender<()>,
    JoinHandle<()>,
    Arc<AtomicBool>,
    ResyncHandle,
);

/// One in-process agent per cluster; agent `i` reaches member `j` through `members[i][j]`.
/// In the hub topology, agent `i` reaches its own cluster with `members[i][i]` and the hub
/// with `hub[i]` (its member identity).
struct Agents {
    ids: Vec<ClusterId>,
    members: Vec<Vec<Member>>,
    hub: Option<Vec<Client>>,
    running: Vec<Option<Running>>,
}

impl Agents {
    fn new(set: &ClusterSet) -> Self {
        let direct = set.members();
        Self {
            ids: set.ids.clone(),
            members: vec![direct; set.ids.len()],
            hub: set
                .hub
                .as_ref()
                .map(|_| (0..set.ids.len()).map(|i| set.hub_client_of(i)).collect()),
            running: set.ids.iter().map(|_| None).collect(),
        }
    }

    /// Agent `agent` reaches member `member` with `client` from its next start on.
    fn route(&mut self, agent: usize, member: usize, client: Client) {
        self.members[agent][member].client = client;
    }

    fn start(&mut self, i: usize) {
        assert!(self.running[i].is_none(), "agent {i} already running");
        let config = match &self.hub {
            None => AgentConfig::new(self.ids[i].clone(), self.members[i].clone()),
            Some(hub) => AgentConfig::hub(
                self.ids[i].clone(),
                HubConfig::new(self.members[i][i].client.clone(), hub[i].clone())
                    .lease_duration(HUB_LEASE),
            ),
        }
        .unreachable_grace(Duration::from_secs(60))
        .resync(Duration::from_secs(600))
        .probe_interval(Duration::from_secs(1));
        let agent = Agent::new(config);
        let ready = agent.ready();
        let resync = agent.resync_handle();
        let (stop, stopped) = oneshot::channel::<()>();
        let handle = tokio::spawn(async move {
            agent
                .run(async move {
                    let _ = stopped.await;
                })
                .await
                .expect("agent failed");
        });
        self.running[i] = Some((stop, handle, ready, resync));
    }

    fn start_all(&mut self) {
        for i in 0..self.ids.len() {
            self.start(i);
        }
    }

    /// Graceful stop.
    async fn stop(&mut self, i: usize) {
        if let Some((stop, handle, ..)) = self.running[i].take() {
            let _ = stop.send(());
            handle.await.expect("agent task panicked");
        }
    }

    async fn stop_all(&mut self) {
        for i in 0..self.ids.len() {
            self.stop(i).await;
        }
    }

    /// Kills the agent task wherever it is, e.g. between two writes of one reconcile.
    async fn abort(&mut self, i: usize) {
        if let Some((_stop, handle, ..)) = self.running[i].take() {
            handle.abort();
            let _ = handle.await;
        }
    }

    /// Forces a full resync of every running agent and waits until each pass has completed
    /// (every service reconciled, its writes answered): what the agents know is then
    /// written, including the steps after the last one a test waited on (a derived Service
    /// deleted, slices re-applied without their tie).
    async fn resync_all(&self) {
        for (i, running) in self.running.iter().enumerate() {
            let Some((.., resync)) = running else {
                continue;
            };
            complete_resync(resync, &self.ids[i], CONVERGE).await;
        }
    }

    /// Waits until every running agent has listed everything and reconciled once.
    async fn wait_ready(&self) {
        support::wait_for("agents synced", CONVERGE, || async {
            self.running
                .iter()
                .flatten()
                .all(|(_, _, ready, _)| ready.load(Ordering::Acquire))
                .then_some(())
        })
        .await;
    }
}

impl Drop for Agents {
    fn drop(&mut self) {
        for (_, handle, ..) in self.running.iter_mut().filter_map(Option::take) {
            handle.abort();
        }
    }
}

// ---------------------------------------------------------------------------------------
// A TCP proxy between an agent and a peer's API server, to cut or blackhole it.

#[derive(Default)]
struct ProxyState {
    blackhole: bool,
    /// Live connections (forwarded or held).
    conns: Vec<tokio::task::AbortHandle>,
    accepted: usize,
    held: usize,
}

struct Proxy {
    port: u16,
    state: Arc<Mutex<ProxyState>>,
    accept: JoinHandle<()>,
}

impl Proxy {
    /// Listens on a free loopback port and forwards every connection to `upstream`
    /// (`https://127.0.0.1:<port>`). TLS passes through untouched: the API server's
    /// certificate is valid for 127.0.0.1 whatever the port.
    async fn start(upstream: &str) -> Proxy {
        let upstream_port: u16 = upstream
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .unwrap_or_else(|| panic!("no port in {upstream}"));
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let port = listener.local_addr().unwrap().port();
        let state = Arc::new(Mutex::new(ProxyState::default()));
        let shared = Arc::clone(&state);
        let accept = tokio::spawn(async move {
            loop {
                let Ok((mut downstream, _)) = listener.accept().await else {
                    continue;
                };
                let mut st = shared.lock().unwrap();
                st.accepted += 1;
                let task = if st.blackhole {
                    // Accept and never answer: the TLS handshake hangs.
                    st.held += 1;
                    tokio::spawn(async move {
                        let _held = downstream;
                        std::future::pending::<()>().await;
                    })
                } else {
                    tokio::spawn(async move {
                        if let Ok(mut up) =
                            tokio::net::TcpStream::connect(("127.0.0.1", upstream_port)).await
                        {
                            let _ = tokio::io::copy_bidirectional(&mut downstream, &mut up).await;
                        }
                    })
                };
                st.conns.retain(|h| !h.is_finished());
                st.conns.push(task.abort_handle());
            }
        });
        Proxy {
            port,
            state,
            accept,
        }
    }

    fn url(&self) -> String {
        format!("https://127.0.0.1:{}", self.port)
    }

    /// Closes every live connection (both sides), as a network failure would mid-watch.
    /// Returns how many were live.
    fn cut(&self) -> usize {
        let mut st = self.state.lock().unwrap();
        let live: Vec<_> = st.conns.drain(..).filter(|h| !h.is_finished()).collect();
        for h in &live {
            h.abort();
        }
        live.len()
    }

    /// Blackholes the peer (cuts what is live; new connections hang) or restores it
    /// (the hanging connections are closed, so clients retry at once).
    fn blackhole(&self, on: bool) {
        self.state.lock().unwrap().blackhole = on;
        self.cut();
    }

    fn live(&self) -> usize {
        let st = self.state.lock().unwrap();
        st.conns.iter().filter(|h| !h.is_finished()).count()
    }

    fn accepted(&self) -> usize {
        self.state.lock().unwrap().accepted
    }

    fn held(&self) -> usize {
        self.state.lock().unwrap().held
    }
}

impl Drop for Proxy {
    fn drop(&mut self) {
        self.accept.abort();
        self.cut();
    }
}

/// A client for `cluster` that connects through `url` (a [`Proxy`]).
async fn client_via(cluster: &support::TestCluster, url: &str) -> Client {
    let mut config = kube::Config::from_custom_kubeconfig(
        cluster.kubeconfig().clone(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    config.cluster_url = url.parse().unwrap();
    Client::try_from(config).unwrap()
}

// ---------------------------------------------------------------------------------------
// Fixtures: exported services with hand-written source EndpointSlices (no
// controller-manager runs), and foreign objects the agent must leave alone.

/// Creates or replaces the Service's own EndpointSlice `src-<svc>` with ready endpoints on
/// `tcp/TCP/42` and `udp/UDP/42`, as the EndpointSlice controller would.
async fn set_source(client: &Client, svc: &str, ips: &[&str]) {
    let slice = EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some(format!("src-{svc}")),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([
                (LABEL_K8S_SERVICE_NAME.to_owned(), svc.to_owned()),
                (LABEL_SLICE_MANAGED_BY.to_owned(), "test-source".to_owned()),
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
    Api::<EndpointSlice>::namespaced(client.clone(), NS)
        .patch(
            &format!("src-{svc}"),
            &PatchParams::apply("fault-test").force(),
            &Patch::Apply(&slice),
        )
        .await
        .expect("apply source EndpointSlice");
}

/// Service `svc` (the conformance `hello` Service), its endpoints and its ServiceExport.
async fn offer(client: &Client, svc: &str, ips: &[&str]) {
    create_service(client, NS, &hello_service(svc)).await;
    set_source(client, svc, ips).await;
    export(client, NS, svc, None).await;
}

/// Objects in the namespace that the agent did not create, with their resourceVersions.
struct Foreign(Vec<(String, String)>);

/// Plants look-alikes of what the agent writes, for the exported service `svc`: an
/// EndpointSlice with the MCS labels but another manager, a hand-written ServiceImport for
/// a name nobody exports, a selector-less Service labelled like a derived Service.
async fn plant_foreign(client: &Client, svc: &str) -> Foreign {
    let slice = EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some("foreign-lookalike".into()),
            labels: Some(BTreeMap::from([
                (LABEL_SERVICE_NAME.to_owned(), svc.to_owned()),
                (LABEL_SOURCE_CLUSTER.to_owned(), "west".to_owned()),
                (LABEL_SLICE_MANAGED_BY.to_owned(), "someone-else".to_owned()),
            ])),
            ..Default::default()
        },
        endpoints: vec![Endpoint {
            addresses: vec!["192.0.2.250".into()],
            ..Default::default()
        }],
        ports: None,
    };
    let slice = Api::<EndpointSlice>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &slice)
        .await
        .unwrap();
    let import: ServiceImport = serde_json::from_value(json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1",
        "kind": "ServiceImport",
        "metadata": { "name": "foreign-import" },
        "spec": { "type": "Headless", "ports": [] }
    }))
    .unwrap();
    let import = Api::<ServiceImport>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &import)
        .await
        .unwrap();
    let service: Service = serde_json::from_value(json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": {
            "name": "foreign-derived",
            "labels": { LABEL_SERVICE_NAME: svc }
        },
        "spec": { "ports": [{ "name": "tcp", "port": 42, "protocol": "TCP" }] }
    }))
    .unwrap();
    let service = Api::<Service>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &service)
        .await
        .unwrap();
    let rv = |m: &ObjectMeta| m.resource_version.clone().unwrap();
    Foreign(vec![
        (
            "EndpointSlice/foreign-lookalike".into(),
            rv(&slice.metadata),
        ),
        ("ServiceImport/foreign-import".into(), rv(&import.metadata)),
        ("Service/foreign-derived".into(), rv(&service.metadata)),
    ])
}

async fn plant_foreign_everywhere(set: &ClusterSet, svc: &str) -> Vec<Foreign> {
    let mut out = Vec::new();
    for c in &set.clients {
        out.push(plant_foreign(c, svc).await);
    }
    out
}

async fn assert_foreign_untouched(set: &ClusterSet, planted: &[Foreign]) {
    for (i, Foreign(objects)) in planted.iter().enumerate() {
        let client = set.client(i);
        for (what, rv) in objects {
            let (kind, name) = what.split_once('/').unwrap();
            let got = match kind {
                "EndpointSlice" => Api::<EndpointSlice>::namespaced(client.clone(), NS)
                    .get_opt(name)
                    .await
                    .unwrap()
                    .map(|o| o.metadata),
                "ServiceImport" => Api::<ServiceImport>::namespaced(client.clone(), NS)
                    .get_opt(name)
                    .await
                    .unwrap()
                    .map(|o| o.metadata),
                _ => Api::<Service>::namespaced(client.clone(), NS)
                    .get_opt(name)
                    .await
                    .unwrap()
                    .map(|o| o.metadata),
            };
            let got = got.unwrap_or_else(|| panic!("{}: foreign {what} was deleted", set.ids[i]));
            assert_eq!(
                got.resource_version.as_ref(),
                Some(rv),
                "{}: foreign {what} was modified",
                set.ids[i]
            );
        }
    }
}

// ---------------------------------------------------------------------------------------
// Normalized state, expectations, orphans, fresh start.

/// The state the agents produce in one cluster, normalized (no uids, resourceVersions,
/// timestamps or allocated IPs), keyed by `Kind/name`.
type Snapshot = BTreeMap<String, Value>;

fn is_managed(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels.is_some_and(|l| {
        l.get(LABEL_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY)
            || l.get(LABEL_SLICE_MANAGED_BY).map(String::as_str) == Some(MANAGED_BY)
    })
}

fn conditions(list: Option<&Vec<Condition>>) -> Value {
    let mut list: Vec<Value> = list
        .into_iter()
        .flatten()
        .map(|c| json!([c.type_, c.status, c.reason, c.message]))
        .collect();
    list.sort_by_key(|v| v[0].as_str().unwrap_or_default().to_owned());
    Value::Array(list)
}

async fn snapshot(client: &Client) -> Result<Snapshot, kube::Error> {
    let mut out = Snapshot::new();
    let lp = ListParams::default();
    for si in Api::<ServiceImport>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
        .items
    {
        if !is_managed(si.metadata.labels.as_ref()) {
            continue;
        }
        let mut spec = serde_json::to_value(&si.spec).unwrap();
        // IPs are allocated per cluster (and anew after a wipe): compare how many.
        spec["ips"] = json!(si.spec.ips.as_ref().map_or(0, Vec::len));
        let status = si.status.clone().unwrap_or_default();
        out.insert(
            format!("ServiceImport/{}", si.metadata.name.unwrap()),
            json!({
                "labels": si.metadata.labels,
                "annotations": si.metadata.annotations,
                "spec": spec,
                "clusters": status.clusters,
                "endpointSliceObjects": status.endpoint_slice_objects,
                "conditions": conditions(status.conditions.as_ref()),
            }),
        );
    }
    for svc in Api::<Service>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
        .items
    {
        if !is_managed(svc.metadata.labels.as_ref()) {
            continue;
        }
        let spec = svc.spec.unwrap_or_default();
        let ports: Vec<Value> = spec
            .ports
            .iter()
            .flatten()
            .map(|p| json!([p.name, p.protocol, p.port, p.app_protocol]))
            .collect();
        out.insert(
            format!("Service/{}", svc.metadata.name.unwrap()),
            json!({
                "labels": svc.metadata.labels,
                "type": spec.type_,
                "ports": ports,
                "ips": spec.cluster_ips.map_or(0, |v| v.len()),
                "owners": svc.metadata.owner_references.iter().flatten()
                    .map(|o| format!("{}/{}", o.kind, o.name)).collect::<Vec<_>>(),
            }),
        );
    }
    for slice in Api::<EndpointSlice>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
        .items
    {
        if !is_managed(slice.metadata.labels.as_ref()) {
            continue;
        }
        let endpoints: Vec<Value> = slice
            .endpoints
            .iter()
            .map(|e| json!([e.addresses, e.conditions, e.hostname, e.zone]))
            .collect();
        out.insert(
            format!("EndpointSlice/{}", slice.metadata.name.unwrap()),
            json!({
                "labels": slice.metadata.labels,
                "addressType": slice.address_type,
                "ports": slice.ports,
                "endpoints": endpoints,
            }),
        );
    }
    for se in Api::<ServiceExport>::namespaced(client.clone(), NS)
        .list(&lp)
        .await?
        .items
    {
        let status = se.status.clone().unwrap_or_default();
        out.insert(
            format!("ServiceExport/{}", se.metadata.name.unwrap()),
            conditions(status.conditions.as_ref()),
        );
    }
    Ok(out)
}

async fn snapshots(set: &ClusterSet) -> Result<Vec<Snapshot>, kube::Error> {
    let mut out = Vec::new();
    for c in &set.clients {
        out.push(snapshot(c).await?);
    }
    Ok(out)
}

/// What every cluster must show: per imported service, per exporting cluster, the
/// endpoint addresses.
type Want = BTreeMap<&'static str, BTreeMap<&'static str, Vec<&'static str>>>;

/// Why `snap` does not (yet) show `want`: the managed imports are exactly `want`'s, each
/// lists exactly its exporting clusters, is Ready with no note (e.g. no stale "cluster X
/// is unreachable"), and its imported slices hold exactly each cluster's addresses.
fn unmet(snap: &Snapshot, want: &Want) -> Option<String> {
    let imports: BTreeSet<&str> = snap
        .keys()
        .filter_map(|k| k.strip_prefix("ServiceImport/"))
        .collect();
    let wanted: BTreeSet<&str> = want.keys().copied().collect();
    if imports != wanted {
        return Some(format!("imports {imports:?}, want {wanted:?}"));
    }
    for (svc, by_cluster) in want {
        let si = &snap[&format!("ServiceImport/{svc}")];
        let clusters: Vec<&str> = si["clusters"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|c| c["cluster"].as_str())
            .collect();
        let want_clusters: Vec<&str> = by_cluster.keys().copied().collect();
        if clusters != want_clusters {
            return Some(format!(
                "{svc}: clusters {clusters:?}, want {want_clusters:?}"
            ));
        }
        let ready = si["conditions"]
            .as_array()
            .into_iter()
            .flatten()
            .find(|c| c[0] == "Ready");
        if ready.is_none_or(|c| c[1] != "True" || c[3] != "") {
            return Some(format!("{svc}: Ready is {ready:?}"));
        }
        // A ClusterSetIP import is complete once it carries its derived Service's VIP.
        if si["spec"]["type"] == "ClusterSetIP" && si["spec"]["ips"] == 0 {
            return Some(format!("{svc}: ClusterSetIP import without an IP"));
        }
        let mut got: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
        for (key, slice) in snap {
            if key.starts_with("EndpointSlice/")
                && slice["labels"][LABEL_SERVICE_NAME] == *svc
                && let Some(source) = slice["labels"][LABEL_SOURCE_CLUSTER].as_str()
            {
                let entry = got.entry(source.to_owned()).or_default();
                for e in slice["endpoints"].as_array().into_iter().flatten() {
                    for a in e[0].as_array().into_iter().flatten() {
                        entry.insert(a.as_str().unwrap_or_default().to_owned());
                    }
                }
            }
        }
        let want_eps: BTreeMap<String, BTreeSet<String>> = by_cluster
            .iter()
            .map(|(c, ips)| {
                (
                    (*c).to_owned(),
                    ips.iter().map(|s| (*s).to_owned()).collect(),
                )
            })
            .collect();
        if got != want_eps {
            return Some(format!("{svc}: endpoints {got:?}, want {want_eps:?}"));
        }
    }
    None
}

/// Waits until every cluster meets `want`; returns how long it took.
async fn converge(set: &ClusterSet, want: &Want, what: &str) -> Duration {
    let t0 = Instant::now();
    let mut last = String::new();
    while t0.elapsed() < CONVERGE {
        match snapshots(set).await {
            Ok(snaps) => {
                let problems: Vec<String> = snaps
                    .iter()
                    .zip(&set.ids)
                    .filter_map(|(s, id)| unmet(s, want).map(|p| format!("{id}: {p}")))
                    .collect();
                if problems.is_empty() {
                    eprintln!("[faults] {what}: converged in {:.1?}", t0.elapsed());
                    return t0.elapsed();
                }
                last = problems.join("\n");
            }
            Err(e) => last = e.to_string(),
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    panic!("{what}: not converged after {CONVERGE:?}:\n{last}");
}

/// Every object with the agent's `managed-by` label belongs to a current import: one
/// derived Service per ClusterSetIP import (owned by the import's current uid, IPs copied
/// into the import), none for a Headless one; imported slices only for the import's
/// exporting clusters, tied to the derived Service, one per cluster and family.
async fn assert_no_orphans(set: &ClusterSet) {
    for (i, client) in set.clients.iter().enumerate() {
        let id = &set.ids[i];
        let lp = ListParams::default();
        let imports: BTreeMap<String, ServiceImport> =
            Api::<ServiceImport>::namespaced(client.clone(), NS)
                .list(&lp)
                .await
                .unwrap()
                .items
                .into_iter()
                .filter(|si| is_managed(si.metadata.labels.as_ref()))
                .map(|si| (si.metadata.name.clone().unwrap(), si))
                .collect();
        let derived: Vec<Service> = Api::<Service>::namespaced(client.clone(), NS)
            .list(&lp)
            .await
            .unwrap()
            .items
            .into_iter()
            .filter(|s| is_managed(s.metadata.labels.as_ref()))
            .collect();
        for svc in &derived {
            let name = svc.metadata.name.as_deref().unwrap();
            let of = svc
                .metadata
                .labels
                .as_ref()
                .unwrap()
                .get(LABEL_SERVICE_NAME);
            let import = of.and_then(|o| imports.get(o));
            let Some(import) = import else {
                panic!("{id}: orphaned derived Service {name} (for {of:?})");
            };
            assert_eq!(
                import.spec.type_,
                ServiceImportType::ClusterSetIp,
                "{id}: derived Service {name} for a Headless import"
            );
            assert_eq!(
                name,
                derived_service_name(NS, of.unwrap()),
                "{id}: stray derived Service"
            );
            let owners: Vec<&str> = svc
                .metadata
                .owner_references
                .iter()
                .flatten()
                .map(|o| o.uid.as_str())
                .collect();
            assert_eq!(
                owners,
                [import.metadata.uid.as_deref().unwrap()],
                "{id}: derived Service {name} not owned by the current import"
            );
            assert_eq!(
                import.spec.ips,
                svc.spec.as_ref().unwrap().cluster_ips,
                "{id}: import {of:?} does not carry its derived Service's IPs"
            );
        }
        for (name, import) in &imports {
            if import.spec.type_ == ServiceImportType::ClusterSetIp {
                let want = derived_service_name(NS, name);
                assert!(
                    derived
                        .iter()
                        .any(|s| s.metadata.name.as_deref() == Some(want.as_str())),
                    "{id}: ClusterSetIP import {name} without its derived Service"
                );
            }
        }
        let mut per_source: BTreeMap<(String, String, String), usize> = BTreeMap::new();
        for slice in Api::<EndpointSlice>::namespaced(client.clone(), NS)
            .list(&lp)
            .await
            .unwrap()
            .items
        {
            let labels = slice.metadata.labels.clone().unwrap_or_default();
            if !is_managed(Some(&labels)) {
                continue;
            }
            let name = slice.metadata.name.as_deref().unwrap();
            let svc = labels.get(LABEL_SERVICE_NAME).cloned().unwrap_or_default();
            let source = labels
                .get(LABEL_SOURCE_CLUSTER)
                .cloned()
                .unwrap_or_default();
            let Some(import) = imports.get(&svc) else {
                panic!("{id}: orphaned EndpointSlice {name} (service {svc:?})");
            };
            let clusters: Vec<&str> = import
                .status
                .as_ref()
                .and_then(|s| s.clusters.as_ref())
                .into_iter()
                .flatten()
                .map(|c| c.cluster.as_str())
                .collect();
            assert!(
                clusters.contains(&source.as_str()),
                "{id}: EndpointSlice {name} from {source:?}, which does not export {svc} ({clusters:?})"
            );
            let tied = labels.get(LABEL_K8S_SERVICE_NAME).cloned();
            let want_tied = (import.spec.type_ == ServiceImportType::ClusterSetIp)
                .then(|| derived_service_name(NS, &svc));
            assert_eq!(tied, want_tied, "{id}: EndpointSlice {name} tied wrongly");
            *per_source
                .entry((svc, source, slice.address_type.clone()))
                .or_default() += 1;
        }
        for (key, n) in per_source {
            assert_eq!(n, 1, "{id}: {n} imported slices for {key:?} (duplicates)");
        }
    }
}

/// Deletes the objects of `api` that carry the agent's managed-by label.
async fn delete_managed<K>(api: Api<K>)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    for o in api.list(&ListParams::default()).await.unwrap().items {
        if is_managed(o.meta().labels.as_ref()) {
            let name = o.meta().name.clone().unwrap_or_default();
            let _ = api.delete(&name, &DeleteParams::default()).await;
        }
    }
}

/// Deletes everything the agents created and clears the export conditions they wrote.
async fn wipe(client: &Client) {
    delete_managed(Api::<EndpointSlice>::namespaced(client.clone(), NS)).await;
    delete_managed(Api::<Service>::namespaced(client.clone(), NS)).await;
    delete_managed(Api::<ServiceImport>::namespaced(client.clone(), NS)).await;
    let lp = ListParams::default();
    let exports = Api::<ServiceExport>::namespaced(client.clone(), NS);
    for s in exports.list(&lp).await.unwrap().items {
        exports
            .patch_status(
                s.metadata.name.as_deref().unwrap(),
                &PatchParams::default(),
                &Patch::Merge(json!({ "status": null })),
            )
            .await
            .unwrap();
    }
}

fn diff(faulted: &Snapshot, fresh: &Snapshot) -> String {
    let keys: BTreeSet<&String> = faulted.keys().chain(fresh.keys()).collect();
    keys.into_iter()
        .filter(|k| faulted.get(*k) != fresh.get(*k))
        .map(|k| {
            format!(
                "  {k}\n    after the fault: {}\n    fresh start:     {}",
                faulted.get(k).map_or("-".into(), Value::to_string),
                fresh.get(k).map_or("-".into(), Value::to_string)
            )
        })
        .collect::<Vec<_>>()
        .join("\n")
}

/// The state after the fault equals what fresh agents build from the same objects: stop
/// the agents, wipe what they created, start fresh ones and compare (every cluster).
async fn assert_fresh_start_agrees(set: &ClusterSet, agents: &mut Agents) {
    let faulted = snapshots(set).await.expect("snapshot after the fault");
    agents.stop_all().await;
    for c in &set.clients {
        wipe(c).await;
    }
    let wiped = snapshots(set).await.unwrap();
    assert!(
        wiped
            .iter()
            .all(|s| s.keys().all(|k| k.starts_with("ServiceExport/"))),
        "wipe left managed objects: {wiped:?}"
    );
    let t0 = Instant::now();
    agents.start_all();
    let mut last = Vec::new();
    while t0.elapsed() < CONVERGE {
        if let Ok(fresh) = snapshots(set).await {
            if fresh == faulted {
                eprintln!(
                    "[faults] fresh agents rebuilt the same state in {:.1?}",
                    t0.elapsed()
                );
                return;
            }
            last = fresh;
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let report: Vec<String> = faulted
        .iter()
        .zip(&last)
        .zip(&set.ids)
        .map(|((a, b), id)| format!("{id}:\n{}", diff(a, b)))
        .collect();
    panic!(
        "fresh agents do not reproduce the state reached after the fault:\n{}",
        report.join("\n")
    );
}

/// The three end checks every fault test makes.
async fn assert_sound(set: &ClusterSet, agents: &mut Agents, foreign: &[Foreign]) {
    agents.resync_all().await;
    assert_no_orphans(set).await;
    assert_foreign_untouched(set, foreign).await;
    assert_fresh_start_agrees(set, agents).await;
    assert_no_orphans(set).await;
    assert_foreign_untouched(set, foreign).await;
}

/// `(exporting cluster, its endpoint addresses)`.
type Source = (&'static str, &'static [&'static str]);

fn want(entries: &[(&'static str, &[Source])]) -> Want {
    entries
        .iter()
        .map(|(svc, by)| (*svc, by.iter().map(|(c, ips)| (*c, ips.to_vec())).collect()))
        .collect()
}

const E1: &[&str] = &["192.0.2.1", "192.0.2.2"];
const W1: &[&str] = &["198.51.100.1", "198.51.100.2"];
const W2: &[&str] = &["198.51.100.21", "198.51.100.22", "198.51.100.23"];
const W3: &[&str] = &["198.51.100.31"];

// ---------------------------------------------------------------------------------------
// 1. The local API server dies under a running agent.

async fn local_api_server_killed_and_restarted_under_a_running_agent(topo: Topo) {
    let t0 = Instant::now();
    let mut set = ClusterSet::start_topo(
        topo,
        &["east", "west"],
        false,
        Duration::from_secs(60),
        false,
        |c| c,
    )
    .await;
    set.namespace(NS).await;
    let foreign = plant_foreign_everywhere(&set, "alpha").await;
    for svc in ["alpha", "bravo", "charlie"] {
        offer(set.client(0), svc, E1).await;
    }
    for svc in ["alpha", "bravo"] {
        offer(set.client(1), svc, W1).await;
    }
    let mut agents = Agents::new(&set);
    agents.start_all();
    converge(
        &set,
        &want(&[
            ("alpha", &[("east", E1), ("west", W1)]),
            ("bravo", &[("east", E1), ("west", W1)]),
            ("charlie", &[("east", E1)]),
        ]),
        "initial exports",
    )
    .await;

    // East's API server crashes (SIGKILL; etcd keeps the data). East's agent loses every
    // local watch and every write fails; west keeps changing.
    set.clusters[0].stop();
    let west = set.client(1).clone();
    unexport(&west, NS, "alpha").await;
    set_source(&west, "bravo", W2).await;
    offer(&west, "delta", W1).await;
    // West's agent has seen the changes (so east's agent has tried, and failed, to write
    // them into east) before east comes back.
    wait_import(&west, NS, "delta", "delta imported in west", |_| true).await;
    wait_import(&west, NS, "alpha", "alpha in west from east only", |si| {
        clusters_of(si) == ["east"]
    })
    .await;
    set.clusters[0].start().await;
    // Changes in east right after the restart, while the agent's watches are still
    // reconnecting (they resume from resourceVersions the new watch cache does not have).
    let east = set.client(0).clone();
    unexport(&east, NS, "charlie").await;
    offer(&east, "echo", E1).await;

    let took = converge(
        &set,
        &want(&[
            ("alpha", &[("east", E1)]),
            ("bravo", &[("east", E1), ("west", W2)]),
            ("delta", &[("west", W1)]),
            ("echo", &[("east", E1)]),
        ]),
        "after east's API server restarted",
    )
    .await;
    assert_sound(&set, &mut agents, &foreign).await;
    eprintln!(
        "[faults] local API server restart: converged {took:.1?} after restart, test {:.1?}",
        t0.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// 2. A peer dropped mid-watch: connections cut, then blackholed, then restored.

/// The addresses east's imported slices of `svc` hold from `source`.
fn imported_addresses(snap: &Snapshot, svc: &str, source: &str) -> BTreeSet<String> {
    snap.iter()
        .filter(|(k, s)| {
            k.starts_with("EndpointSlice/")
                && s["labels"][LABEL_SERVICE_NAME] == svc
                && s["labels"][LABEL_SOURCE_CLUSTER] == source
        })
        .flat_map(|(_, s)| s["endpoints"].as_array().cloned().unwrap_or_default())
        .flat_map(|e| e[0].as_array().cloned().unwrap_or_default())
        .filter_map(|a| a.as_str().map(str::to_owned))
        .collect()
}

fn addresses(ips: &[&str]) -> BTreeSet<String> {
    ips.iter().map(|s| (*s).to_owned()).collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_dropped_mid_watch_is_resumed_without_losing_changes() {
    let t0 = Instant::now();
    let set = ClusterSet::start_bare(&["east", "west"]).await;
    set.namespace(NS).await;
    let foreign = plant_foreign_everywhere(&set, "alpha").await;
    // East's agent reaches west through the proxy; west's agent reaches both directly.
    let proxy = Proxy::start(set.clusters[1].server_url()).await;
    let mut agents = Agents::new(&set);
    agents.route(0, 1, client_via(&set.clusters[1], &proxy.url()).await);
    for svc in ["alpha", "bravo"] {
        offer(set.client(0), svc, E1).await;
    }
    for svc in ["alpha", "bravo", "charlie"] {
        offer(set.client(1), svc, W1).await;
    }
    agents.start_all();
    converge(
        &set,
        &want(&[
            ("alpha", &[("east", E1), ("west", W1)]),
            ("bravo", &[("east", E1), ("west", W1)]),
            ("charlie", &[("west", W1)]),
        ]),
        "initial exports",
    )
    .await;
    let west = set.client(1).clone();

    // Phase 1: every connection of east's agent to west is cut mid-watch, and a change
    // lands in west before the agent reconnects (it resumes each watch from its
    // resourceVersion and must receive what it missed).
    for round in 0..3 {
        let accepted = proxy.accepted();
        let cut = proxy.cut();
        assert!(cut > 0, "round {round}: no live connection to cut");
        match round {
            0 => set_source(&west, "alpha", W2).await,
            1 => unexport(&west, NS, "charlie").await,
            _ => offer(&west, "delta", W1).await,
        }
        support::wait_for("east's agent to reconnect to west", CONVERGE, || async {
            (proxy.accepted() > accepted && proxy.live() > 0).then_some(())
        })
        .await;
    }
    converge(
        &set,
        &want(&[
            ("alpha", &[("east", E1), ("west", W2)]),
            ("bravo", &[("east", E1), ("west", W1)]),
            ("delta", &[("west", W1)]),
        ]),
        "after watches were cut mid-flight",
    )
    .await;

    // Phase 2: west is blackholed (live connections cut, new ones hang) while it changes.
    proxy.blackhole(true);
    unexport(&west, NS, "bravo").await;
    set_source(&west, "alpha", W3).await;
    offer(&west, "echo", W1).await;
    delete_service(&west, NS, "delta").await;
    wait_import(&west, NS, "echo", "echo imported in west", |_| true).await;
    support::wait_for("east's agent to hang on west", CONVERGE, || async {
        (proxy.held() > 0).then_some(())
    })
    .await;
    // East has seen none of it: within the grace period it keeps west's last endpoints.
    let east = snapshot(set.client(0)).await.unwrap();
    assert_eq!(
        imported_addresses(&east, "alpha", "west"),
        addresses(W2),
        "east must keep west's last known endpoints while west is unreachable"
    );
    assert!(east.contains_key("ServiceImport/delta"));
    proxy.blackhole(false);
    let took = converge(
        &set,
        &want(&[
            ("alpha", &[("east", E1), ("west", W3)]),
            ("bravo", &[("east", E1)]),
            ("echo", &[("west", W1)]),
        ]),
        "after west came back",
    )
    .await;
    wait_export_condition(&west, NS, "delta", "Valid", "False", Some("NoService")).await;
    assert_sound(&set, &mut agents, &foreign).await;
    eprintln!(
        "[faults] peer dropped mid-watch: converged {took:.1?} after restore, test {:.1?}",
        t0.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// 3. Watch history expired (etcd compacted): 410 Gone, re-list.

/// `POST` to etcd's v3 JSON gateway; returns the JSON answer.
async fn etcd_post(etcd_url: &str, path: &str, body: &Value) -> Value {
    let (status, body) = support::http_post_json(&format!("{etcd_url}{path}"), body)
        .await
        .unwrap_or_else(|e| panic!("etcd: {e}"));
    assert!(status.is_success(), "etcd {path}: {status}\n{body}");
    serde_json::from_str(&body).unwrap_or_else(|e| panic!("etcd {path}: {e}: {body}"))
}

/// Compacts etcd (physically) at its current revision; returns that revision.
async fn compact(cluster: &support::TestCluster) -> u64 {
    let url = cluster.etcd_url();
    let range = etcd_post(&url, "/v3/kv/range", &json!({ "key": "AA==" })).await;
    let revision: u64 = range["header"]["revision"]
        .as_str()
        .and_then(|r| r.parse().ok())
        .unwrap_or_else(|| panic!("no revision in {range}"));
    etcd_post(
        &url,
        "/v3/kv/compaction",
        &json!({ "revision": revision.to_string(), "physical": true }),
    )
    .await;
    revision
}

/// A watch resumed at `rv` fails with 410 Gone (as a status or as an ERROR event).
async fn assert_watch_expired<K>(client: &Client, rv: &str)
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
    K::DynamicType: Default,
{
    let api: Api<K> = Api::all(client.clone());
    let code = match api.watch(&WatchParams::default().timeout(10), rv).await {
        Err(kube::Error::Api(status)) => status.code,
        Err(e) => panic!("watch {} from {rv}: {e}", K::kind(&Default::default())),
        Ok(stream) => {
            let mut stream = std::pin::pin!(stream);
            match tokio::time::timeout(Duration::from_secs(10), stream.next()).await {
                Ok(Some(Ok(WatchEvent::Error(status)))) => status.code,
                other => panic!(
                    "watch {} from {rv}: expected 410 Gone, got {other:?}",
                    K::kind(&Default::default())
                ),
            }
        }
    };
    assert_eq!(
        code,
        410,
        "watch {} from {rv}",
        K::kind(&Default::default())
    );
}

/// How often the API server logged a watch that started below etcd's compaction.
fn compacted_watches(cluster: &support::TestCluster) -> usize {
    std::fs::read_to_string(cluster.dir().join("kube-apiserver.log"))
        .unwrap_or_default()
        .matches("required revision has been compacted")
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn expired_watch_history_forces_a_relist_that_sees_deletions() {
    let t0 = Instant::now();
    let mut set = ClusterSet::start_bare(&["east", "west"]).await;
    // West serves watches from etcd itself (no watch cache), so a compaction expires their
    // history exactly as an old watch cache window does in a busy cluster.
    set.clusters[1]
        .restart_apiserver_with_args(&["--watch-cache=false"])
        .await;
    set.namespace(NS).await;
    let foreign = plant_foreign_everywhere(&set, "alpha").await;
    let proxy = Proxy::start(set.clusters[1].server_url()).await;
    let mut agents = Agents::new(&set);
    agents.route(0, 1, client_via(&set.clusters[1], &proxy.url()).await);
    offer(set.client(0), "alpha", E1).await;
    for svc in ["alpha", "bravo", "charlie", "delta"] {
        offer(set.client(1), svc, W1).await;
    }
    agents.start_all();
    converge(
        &set,
        &want(&[
            ("alpha", &[("east", E1), ("west", W1)]),
            ("bravo", &[("west", W1)]),
            ("charlie", &[("west", W1)]),
            ("delta", &[("west", W1)]),
        ]),
        "initial exports",
    )
    .await;

    // East's agent loses west: its watches stop at resourceVersions <= gap_start.
    proxy.blackhole(true);
    let west = set.client(1).clone();
    let gap_start = Api::<ServiceExport>::all(west.clone())
        .list_metadata(&ListParams::default().limit(1))
        .await
        .unwrap()
        .metadata
        .resource_version
        .unwrap();
    // Meanwhile: a deletion (seen only through a DELETED event or a re-list), an export
    // turned invalid, moved endpoints, a new export, and unrelated churn.
    unexport(&west, NS, "alpha").await;
    delete_service(&west, NS, "bravo").await;
    set_source(&west, "charlie", W2).await;
    offer(&west, "echo", W1).await;
    let maps: Api<ConfigMap> = Api::namespaced(west.clone(), NS);
    for i in 0..20 {
        let cm: ConfigMap = serde_json::from_value(json!({
            "metadata": { "name": format!("churn-{i}") }, "data": { "i": i.to_string() }
        }))
        .unwrap();
        maps.create(&PostParams::default(), &cm).await.unwrap();
    }
    let revision = compact(&set.clusters[1]).await;
    assert!(
        revision > gap_start.parse::<u64>().unwrap(),
        "{revision} > {gap_start}"
    );
    // Independent proof that resuming from before the gap is no longer possible.
    assert_watch_expired::<ServiceExport>(&west, &gap_start).await;
    assert_watch_expired::<Service>(&west, &gap_start).await;
    assert_watch_expired::<EndpointSlice>(&west, &gap_start).await;
    let expired_before = compacted_watches(&set.clusters[1]);

    proxy.blackhole(false);
    let took = converge(
        &set,
        &want(&[
            ("alpha", &[("east", E1)]),
            ("charlie", &[("west", W2)]),
            ("delta", &[("west", W1)]),
            ("echo", &[("west", W1)]),
        ]),
        "after west came back with expired watch history",
    )
    .await;
    // East's agent resumed its three watches of west (ServiceExport, Service, EndpointSlice)
    // from before the compaction: each got 410 and re-listed (the API server logs every
    // watch it could not start below the compacted revision).
    let expired = compacted_watches(&set.clusters[1]) - expired_before;
    assert!(
        expired >= 3,
        "expected east's agent to hit the compaction with its 3 watches of west, saw {expired}"
    );
    wait_export_condition(&west, NS, "bravo", "Valid", "False", Some("NoService")).await;
    assert_sound(&set, &mut agents, &foreign).await;
    eprintln!(
        "[faults] expired watch history: converged {took:.1?} after restore, {expired} expired \
         watch(es), test {:.1?}",
        t0.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// 4. Conflicting exports written concurrently from two clusters.

/// The conformance `hello` Service with its `tcp` port on 43 instead of 42.
fn hello_on_43(name: &str) -> Service {
    let mut svc = hello_service(name);
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 43;
    svc
}

async fn recreate_export(client: &Client, name: &str, exported: Option<(&str, &str)>) {
    let api: Api<ServiceExport> = Api::namespaced(client.clone(), NS);
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) | Err(kube::Error::Api(_)) => {}
        Err(e) => panic!("delete ServiceExport {name}: {e}"),
    }
    export(client, NS, name, exported).await;
}

async fn recreate_service(client: &Client, svc: &Service) {
    let api: Api<Service> = Api::namespaced(client.clone(), NS);
    let name = svc.metadata.name.as_deref().unwrap();
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) | Err(kube::Error::Api(_)) => {}
        Err(e) => panic!("delete Service {name}: {e}"),
    }
    support::wait_for("Service deleted", CONVERGE, || async {
        matches!(api.get_opt(name).await, Ok(None)).then_some(())
    })
    .await;
    create_service(client, NS, svc).await;
}

fn condition_tuple(c: &Condition) -> (String, String, String, String) {
    (
        c.type_.clone(),
        c.status.clone(),
        c.reason.clone(),
        c.message.clone(),
    )
}

/// Waits until the import of `name` in every cluster and the Valid and Conflict
/// conditions of every export equal what the merge computes from the current objects
/// alone (export creation timestamps and Services), whatever history led there. Returns
/// how long it took and the merge's winner and type.
///
/// The expected values come from `mcs_core::merge::merge`, the code the agents run: this
/// proves the agents, after writes racing each other, agree with the merge of the final
/// objects (consistency), not that the merge is right; its results are pinned by
/// hand-written expectations in mcs-core's `merge_table.rs` and `merge_conformance.rs`.
/// The expected merge is `Stability::Fresh` (no history) while the agents run `Sticky`,
/// which keeps a published import only while the cluster it came from has no valid export:
/// at the end every cluster's export is valid (asserted), so the two give the same outcome,
/// and an agent left on a stale winner fails the test.
async fn converge_to_merge(
    set: &ClusterSet,
    name: &str,
) -> (Duration, ClusterId, ServiceImportType) {
    // The expected result, computed from the final objects alone.
    let mut constituents = Vec::new();
    for (i, id) in set.ids.iter().enumerate() {
        let se = Api::<ServiceExport>::namespaced(set.client(i).clone(), NS)
            .get(name)
            .await
            .unwrap();
        let svc = Api::<Service>::namespaced(set.client(i).clone(), NS)
            .get(name)
            .await
            .unwrap();
        let facts = ServiceFacts::try_from(&svc).unwrap();
        constituents.push(Constituent::from_export(id.clone(), &se, Some(facts)).unwrap());
    }
    let outcome = mcs_core::merge::merge(
        &ServiceRef::new(NS, name).unwrap(),
        &constituents,
        Stability::Fresh,
        None,
    )
    .unwrap();
    assert!(
        !outcome.conflicts.is_empty(),
        "the final objects are meant to conflict"
    );
    assert!(
        outcome
            .exports
            .values()
            .all(|c| c.valid.status.as_str() == "True"),
        "every final export is meant to be valid (so Sticky merges as Fresh does)"
    );
    let merged = outcome.import.clone().unwrap();
    let want_conditions: BTreeMap<ClusterId, Vec<(String, String, String, String)>> = outcome
        .exports
        .iter()
        .map(|(id, c)| {
            let tuple = |d: &mcs_core::conditions::DesiredCondition| {
                (
                    d.type_.to_owned(),
                    d.status.as_str().to_owned(),
                    d.reason.clone(),
                    d.message.clone(),
                )
            };
            (id.clone(), vec![tuple(&c.valid), tuple(&c.conflict)])
        })
        .collect();
    eprintln!(
        "[faults] conflict: {} wins ({:?}), {} {}",
        merged.source.cluster(),
        merged.spec.type_,
        outcome.conflicts,
        outcome.exports[&set.ids[0]].conflict.message
    );

    let t_flip = Instant::now();
    loop {
        let mut problems = Vec::new();
        for (i, id) in set.ids.iter().enumerate() {
            let client = set.client(i);
            match Api::<ServiceImport>::namespaced(client.clone(), NS)
                .get_opt(name)
                .await
            {
                Ok(Some(si)) => {
                    let mut spec = si.spec.clone();
                    spec.ips = None;
                    if merged.spec.type_ == ServiceImportType::ClusterSetIp {
                        // Allocated in each cluster (the derived Service's families).
                        spec.ip_families = merged.spec.ip_families.clone();
                    }
                    if spec != merged.spec {
                        problems.push(format!("{id}: spec {spec:?}, want {:?}", merged.spec));
                    }
                    let mut labels = si.metadata.labels.clone().unwrap_or_default();
                    labels.remove(LABEL_MANAGED_BY);
                    if labels != merged.labels {
                        problems.push(format!("{id}: labels {labels:?}, want {:?}", merged.labels));
                    }
                    let mut want_annotations = merged.annotations.clone();
                    if merged.spec.type_ == ServiceImportType::ClusterSetIp {
                        want_annotations.insert(
                            ANNOTATION_DERIVED_SERVICE.to_owned(),
                            derived_service_name(NS, name),
                        );
                    }
                    let annotations = si.metadata.annotations.clone().unwrap_or_default();
                    if annotations != want_annotations {
                        problems.push(format!(
                            "{id}: annotations {annotations:?}, want {want_annotations:?}"
                        ));
                    }
                    let clusters: Vec<String> = clusters_of(&si);
                    let want: Vec<String> = merged.clusters.iter().map(|c| c.to_string()).collect();
                    if clusters != want {
                        problems.push(format!("{id}: clusters {clusters:?}"));
                    }
                }
                other => problems.push(format!("{id}: import {other:?}")),
            }
            let mut got = Vec::new();
            for t in ["Valid", "Conflict"] {
                if let Some(c) = export_condition(client, NS, name, t).await {
                    got.push(condition_tuple(&c));
                }
            }
            if got != want_conditions[id] {
                problems.push(format!(
                    "{id}: export conditions {got:?}, want {:?}",
                    want_conditions[id]
                ));
            }
        }
        if problems.is_empty() {
            break;
        }
        assert!(
            t_flip.elapsed() < CONVERGE,
            "not converged to the merge of the current objects:\n{}",
            problems.join("\n")
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    (
        t_flip.elapsed(),
        merged.source.cluster().clone(),
        merged.spec.type_,
    )
}

async fn conflicting_exports_written_concurrently_converge_to_the_deterministic_merge(topo: Topo) {
    let t0 = Instant::now();
    let set = ClusterSet::start_topo(
        topo,
        &["east", "west"],
        false,
        Duration::from_secs(60),
        false,
        |c| c,
    )
    .await;
    set.namespace(NS).await;
    let foreign = plant_foreign_everywhere(&set, "xray").await;
    offer(set.client(0), "xray", E1).await;
    offer(set.client(1), "xray", W1).await;
    let mut agents = Agents::new(&set);
    agents.start_all();
    converge(
        &set,
        &want(&[("xray", &[("east", E1), ("west", W1)])]),
        "initial exports",
    )
    .await;

    // Round after round, both clusters rewrite their side at the same instant: east
    // re-creates its export with or without exported labels; west replaces its Service
    // (same as east's, headless, another port) and re-creates its export. The agents see
    // the winner, the type and the conflicts flip under them.
    const PAUSES_MS: [u64; 8] = [0, 300, 40, 700, 120, 0, 450, 0];
    let barrier = Arc::new(tokio::sync::Barrier::new(2));
    let east_task = {
        let client = set.client(0).clone();
        let barrier = Arc::clone(&barrier);
        tokio::spawn(async move {
            for (round, pause) in PAUSES_MS.iter().enumerate() {
                barrier.wait().await;
                let labels = (round % 2 == 0).then_some(("tier", "gold"));
                recreate_export(&client, "xray", labels).await;
                tokio::time::sleep(Duration::from_millis(*pause)).await;
            }
        })
    };
    let west_task = {
        let client = set.client(1).clone();
        let barrier = Arc::clone(&barrier);
        tokio::spawn(async move {
            for (round, pause) in PAUSES_MS.iter().enumerate() {
                barrier.wait().await;
                let svc = match round % 3 {
                    0 => hello_service("xray"),
                    1 => headless(hello_service("xray")),
                    _ => hello_on_43("xray"),
                };
                recreate_service(&client, &svc).await;
                recreate_export(&client, "xray", None).await;
                tokio::time::sleep(Duration::from_millis(*pause)).await;
            }
        })
    };
    east_task.await.unwrap();
    west_task.await.unwrap();

    let (took, winner, type_) = converge_to_merge(&set, "xray").await;
    eprintln!("[faults] after the flips: {winner} wins, {type_:?}");
    converge(
        &set,
        &want(&[("xray", &[("east", E1), ("west", W1)])]),
        "endpoints after the flips",
    )
    .await;

    // East re-creates its export a second later: west's (headless) is now the oldest, so
    // the winner and the import's type flip. Nothing of the ClusterSetIP import may stay
    // (derived Service, its annotation, the slices' tie to it).
    conformance_pause().await;
    recreate_export(set.client(0), "xray", Some(("tier", "gold"))).await;
    let (_, winner, type_) = converge_to_merge(&set, "xray").await;
    assert_eq!(
        (winner.as_str(), type_),
        ("west", ServiceImportType::Headless)
    );
    converge(
        &set,
        &want(&[("xray", &[("east", E1), ("west", W1)])]),
        "endpoints after the winner changed",
    )
    .await;
    assert_sound(&set, &mut agents, &foreign).await;
    eprintln!(
        "[faults] concurrent conflicting exports: converged {took:.1?} after the last flip, \
         test {:.1?}",
        t0.elapsed()
    );
}

// ---------------------------------------------------------------------------------------
// 5. Agents aborted while they apply a burst.

async fn managed_imports(client: &Client) -> Option<usize> {
    Api::<ServiceImport>::namespaced(client.clone(), NS)
        .list_metadata(&ListParams::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}")))
        .await
        .ok()
        .map(|l| l.items.len())
}

/// Aborts each running agent as soon as its cluster's managed imports differ from
/// `baseline` (it has started writing), polling every 10 ms. Returns the count at abort.
async fn abort_once_writing(
    set: &ClusterSet,
    agents: &mut Agents,
    baseline: &[usize],
) -> Vec<usize> {
    let mut at_abort: Vec<Option<usize>> = vec![None; baseline.len()];
    let t0 = Instant::now();
    while at_abort.iter().any(Option::is_none) {
        for (i, slot) in at_abort.iter_mut().enumerate() {
            if slot.is_some() {
                continue;
            }
            if managed_imports(set.client(i))
                .await
                .is_some_and(|n| n != baseline[i])
            {
                agents.abort(i).await;
                *slot = managed_imports(set.client(i)).await;
            }
        }
        assert!(t0.elapsed() < CONVERGE, "the agents never started writing");
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
    at_abort.into_iter().flatten().collect()
}

async fn agents_aborted_mid_burst_converge_without_duplicates_or_orphans(topo: Topo) {
    const N: usize = 30;
    let t0 = Instant::now();
    let set = ClusterSet::start_topo(
        topo,
        &["east", "west"],
        false,
        Duration::from_secs(60),
        false,
        |c| c,
    )
    .await;
    set.namespace(NS).await;
    let names: Vec<&'static str> = (0..N)
        .map(|i| &*Box::leak(format!("svc-{i:02}").into_boxed_str()))
        .collect();
    let foreign = plant_foreign_everywhere(&set, names[0]).await;
    let (east, west) = (set.client(0).clone(), set.client(1).clone());
    for name in &names {
        create_service(&west, NS, &hello_service(name)).await;
        set_source(&west, name, W1).await;
    }
    for name in &names[..3] {
        offer(&east, name, E1).await;
    }
    let mut agents = Agents::new(&set);
    agents.start_all();
    agents.wait_ready().await;
    converge(
        &set,
        &names[..3]
            .iter()
            .map(|n| (*n, BTreeMap::from([("east", E1.to_vec())])))
            .collect(),
        "east's exports",
    )
    .await;

    // The burst: N exports at once in west. Each agent is aborted as soon as it starts
    // writing imports for it, in the middle of the batch (and possibly between two writes
    // of one service: import, derived Service, IPs, slices, status).
    futures::future::join_all(names.iter().map(|n| export(&west, NS, n, None))).await;
    let baseline = [3, 3];
    let at_abort = abort_once_writing(&set, &mut agents, &baseline).await;
    eprintln!("[faults] burst: aborted with {at_abort:?} of {N} imports written");
    assert!(
        at_abort.iter().all(|n| *n < N),
        "the burst was fully applied before the abort ({at_abort:?}); raise N"
    );

    // While the agents are down: exports already (partly) applied go away, and one
    // export loses its Service.
    for name in &names[3..8] {
        unexport(&west, NS, name).await;
    }
    delete_service(&west, NS, names[8]).await;

    // Restart; abort again as soon as they write; restart for good.
    let before = vec![
        managed_imports(&east).await.unwrap(),
        managed_imports(&west).await.unwrap(),
    ];
    agents.start_all();
    let second = abort_once_writing(&set, &mut agents, &before).await;
    eprintln!("[faults] burst: aborted again at {second:?} imports");
    agents.start_all();

    let mut expected = Want::new();
    for name in &names[..3] {
        expected.insert(
            name,
            BTreeMap::from([("east", E1.to_vec()), ("west", W1.to_vec())]),
        );
    }
    for name in &names[9..] {
        expected.insert(name, BTreeMap::from([("west", W1.to_vec())]));
    }
    let took = converge(&set, &expected, "after the aborted burst").await;
    wait_export_condition(&west, NS, names[8], "Valid", "False", Some("NoService")).await;
    assert_sound(&set, &mut agents, &foreign).await;
    eprintln!(
        "[faults] aborted burst: converged {took:.1?} after the last restart, test {:.1?}",
        t0.elapsed()
    );
}

// The hub counterparts of faults 2 and 3 (a peer connection dropped, a peer's watch
// history expired) are the hub outage tests of `agent_hub.rs`: in the hub an agent
// watches no peer API server.
in_both_topologies!(
    local_api_server_killed_and_restarted_under_a_running_agent,
    conflicting_exports_written_concurrently_converge_to_the_deterministic_merge,
    agents_aborted_mid_burst_converge_without_duplicates_or_orphans,
);
