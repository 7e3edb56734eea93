//! The MCS agent: one per member cluster.
//!
//! The agent reads every member's ServiceExports, the Services they name and those
//! Services' EndpointSlices; runs the deterministic `mcs-core` merge (every agent computes
//! the same answer, so no broker and no leader are needed); and writes only into its own
//! cluster:
//!
//! - a ServiceImport per exported service (spec, labels and annotations, `status.clusters`,
//!   the `Ready` condition, `status.endpointSliceObjects`);
//! - for a `ClusterSetIP` import, a derived selector-less ClusterIP Service
//!   (`derived-<hash>`) whose allocated IPs become `spec.ips`, so an unmodified kube-proxy
//!   programs the VIP;
//! - imported EndpointSlices per source cluster and address type, labelled
//!   `multicluster.kubernetes.io/service-name` and `…/source-cluster`, managed by
//!   `mcs-agent`, and tied to the derived Service;
//! - the `Valid`, `Ready` and `Conflict` conditions of its own ServiceExports.
//!
//! Writes are server-side applies with one field manager and are skipped when nothing
//! changed, so the agent never loops on its own writes. Nothing is written into a namespace
//! that is being terminated; the API server's refusal to create there (HTTP 403, cause
//! `NamespaceTerminating`) is that expected state, not a missing permission. It deletes only
//! objects it labelled as its own. A member whose watches fail keeps its endpoints for a grace period (default
//! 60 s); then they are removed and the import's `Ready` condition says so; when the member
//! answers again, state converges without a restart.
//!
//! Modules: [`desired`] and `reconcile` decide (no I/O); `index` holds watch state; the
//! controller and writer only wire watches, decisions and writes together. `plan` (behind
//! the unstable `unstable-plan` feature, for the project's seed and examples) runs the same
//! decisions over in-memory clusters. `load` (behind `unstable-load`, for load tests of a
//! hub) runs a member's hub watches alone.

pub mod cidr;
mod controller;
pub mod desired;
mod health;
pub(crate) mod index;
#[cfg(feature = "unstable-load")]
pub mod load;
#[cfg(feature = "unstable-plan")]
pub mod plan;
mod publish;
pub(crate) mod reconcile;
mod source;
mod state;
mod writer;

use std::collections::BTreeMap;
use std::future::Future;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Duration;

use mcs_core::ClusterId;
use mcs_core::api::{CLUSTER_ID_PROPERTY, v1beta1::ClusterProperty};
use tokio::sync::watch;

pub use writer::WriteError;

/// One member of the ClusterSet, as the agent reaches it.
#[derive(Clone)]
pub struct Member {
    /// The member's cluster id.
    pub id: ClusterId,
    /// A client for the member's API server (read access suffices for peers).
    pub client: kube::Client,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("id", &self.id)
            .finish_non_exhaustive()
    }
}

/// How an agent learns what the other members export.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub enum Topology {
    /// Every agent reads every member's API server directly (small sets).
    Mesh {
        /// Every member, this cluster included.
        members: Vec<Member>,
    },
    /// Every agent publishes what its cluster exports to a hub API server and reads the
    /// other members' records there (see [`crate::hub`]).
    Hub(HubConfig),
}

/// The hub topology's settings.
#[derive(Clone)]
#[non_exhaustive]
pub struct HubConfig {
    /// A client for the agent's own cluster.
    pub local: kube::Client,
    /// A client for the hub, with this member's hub identity.
    pub hub: kube::Client,
    /// The member's Lease duration on the hub (default 40 s; renewed every third of it),
    /// or longer in a set so large that its members would renew more than
    /// [`crate::hub::SET_RENEWALS_PER_SECOND`] times a second together
    /// ([`crate::hub::lease_duration_for`]).
    pub lease_duration: Duration,
}

impl HubConfig {
    /// The hub topology with these clients and the default Lease duration.
    pub fn new(local: kube::Client, hub: kube::Client) -> Self {
        Self {
            local,
            hub,
            lease_duration: Duration::from_secs(40),
        }
    }

    /// Sets the Lease duration.
    #[must_use]
    pub fn lease_duration(mut self, duration: Duration) -> Self {
        self.lease_duration = duration.max(Duration::from_secs(1));
        self
    }
}

impl std::fmt::Debug for HubConfig {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("HubConfig")
            .field("lease_duration", &self.lease_duration)
            .finish_non_exhaustive()
    }
}

/// How many services' writes an agent has in flight at once by default
/// ([`AgentConfig::max_concurrent_writes`]).
pub const DEFAULT_MAX_CONCURRENT_WRITES: usize = 16;

/// Agent settings.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct AgentConfig {
    /// This cluster's id.
    pub local: ClusterId,
    /// How the agent reaches the other members.
    pub topology: Topology,
    /// How long an unreachable member's endpoints are kept (default 60 s): a mesh member
    /// whose API server fails, a hub member whose Lease has expired.
    pub unreachable_grace: Duration,
    /// The server-side apply field manager (default `mcs-agent`).
    pub field_manager: String,
    /// How often every service is reconciled even without changes (default 5 min).
    pub resync: Duration,
    /// Namespaces that may be exported; `None` allows every namespace.
    pub allowed_namespaces: Option<Vec<String>>,
    /// How often each member is probed with a small list request (default 10 s).
    pub probe_interval: Duration,
    /// How often the agent sets its gauges again even when nothing changed (default
    /// [`crate::metrics::GAUGE_REFRESH`]); a recorder's gauge idle timeout must be longer.
    pub metrics_refresh: Duration,
    /// How often the CIDR checks run ([`cidr`]; default 60 s).
    pub cidr_interval: Duration,
    /// How many services' writes may be in flight at once (default
    /// [`DEFAULT_MAX_CONCURRENT_WRITES`]); a service's writes are never in flight twice.
    pub max_concurrent_writes: usize,
    /// Whether cluster selection (KEP-5939) is on: see `AgentConfig::cluster_selection`
    /// (feature `unstable-cluster-selection`).
    cluster_selection: bool,
}

impl AgentConfig {
    /// Settings for `local` in the mesh topology with these members (`local` included) and
    /// the defaults.
    pub fn new(local: ClusterId, members: Vec<Member>) -> Self {
        Self::with_topology(local, Topology::Mesh { members })
    }

    /// Settings for `local` in the hub topology.
    pub fn hub(local: ClusterId, hub: HubConfig) -> Self {
        Self::with_topology(local, Topology::Hub(hub))
    }

    fn with_topology(local: ClusterId, topology: Topology) -> Self {
        Self {
            local,
            topology,
            unreachable_grace: Duration::from_secs(60),
            field_manager: "mcs-agent".to_owned(),
            resync: Duration::from_secs(300),
            allowed_namespaces: None,
            probe_interval: Duration::from_secs(10),
            metrics_refresh: crate::metrics::GAUGE_REFRESH,
            cidr_interval: Duration::from_secs(60),
            max_concurrent_writes: DEFAULT_MAX_CONCURRENT_WRITES,
            cluster_selection: false,
        }
    }

    /// Sets the unreachable grace period.
    #[must_use]
    pub fn unreachable_grace(mut self, grace: Duration) -> Self {
        self.unreachable_grace = grace;
        self
    }

    /// Sets the resync period.
    #[must_use]
    pub fn resync(mut self, resync: Duration) -> Self {
        self.resync = resync;
        self
    }

    /// Sets the member health probe interval.
    #[must_use]
    pub fn probe_interval(mut self, interval: Duration) -> Self {
        self.probe_interval = interval;
        self
    }

    /// Sets how often the gauges are set again (at least 10 ms).
    #[must_use]
    pub fn metrics_refresh(mut self, every: Duration) -> Self {
        self.metrics_refresh = every.max(Duration::from_millis(10));
        self
    }

    /// Sets how often the CIDR checks run (at least 100 ms).
    #[must_use]
    pub fn cidr_interval(mut self, every: Duration) -> Self {
        self.cidr_interval = every.max(Duration::from_millis(100));
        self
    }

    /// Turns cluster selection (KEP-5939, alpha) on or off (default off). On, the agent
    /// watches every member's `ClusterProperty` objects (RBAC:
    /// `deploy/rbac/agent-cluster-selection.yaml`) and writes each import's
    /// `status.clusterSelectorResults` for this cluster: the import's `clusterSelectors`
    /// evaluated with this cluster as the importer. The members' ServiceImport CRD must
    /// have the fields (`deploy/crds-cluster-selection/`). Mesh topology only for now: a
    /// hub-topology agent with it on stops with [`AgentError::Config`].
    #[cfg(feature = "unstable-cluster-selection")]
    #[must_use]
    pub fn cluster_selection(mut self, on: bool) -> Self {
        self.cluster_selection = on;
        self
    }

    /// Sets how many services' writes may be in flight at once (at least 1).
    #[must_use]
    pub fn max_concurrent_writes(mut self, n: usize) -> Self {
        self.max_concurrent_writes = n.max(1);
        self
    }

    /// Restricts exports to these namespaces.
    #[must_use]
    pub fn allowed_namespaces(mut self, namespaces: Vec<String>) -> Self {
        self.allowed_namespaces = Some(namespaces);
        self
    }

    /// Whether exports in `namespace` are allowed.
    pub fn namespace_allowed(&self, namespace: &str) -> bool {
        self.allowed_namespaces
            .as_ref()
            .is_none_or(|list| list.iter().any(|n| n == namespace))
    }
}

/// Why the agent stopped, or why a request to it failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// The configuration is inconsistent.
    #[error("invalid agent configuration: {0}")]
    Config(String),
    /// A resync was requested from an agent that has stopped running.
    #[error("cannot resync: the agent is not running")]
    NotRunning,
    /// The local cluster has no ClusterProperty `cluster.clusterset.k8s.io` to take the
    /// cluster id from.
    #[error(
        "the local cluster has no ClusterProperty {CLUSTER_ID_PROPERTY}: create it with this cluster's id as spec.value, or pass the id explicitly"
    )]
    ClusterIdMissing,
    /// The ClusterProperty `cluster.clusterset.k8s.io` could not be read.
    #[error("cannot read ClusterProperty {CLUSTER_ID_PROPERTY} of the local cluster: {source}")]
    ClusterIdUnreadable {
        /// The API server's answer or the transport failure.
        #[source]
        source: kube::Error,
    },
    /// The ClusterProperty `cluster.clusterset.k8s.io` holds a value that is not a cluster id.
    #[error(
        "ClusterProperty {CLUSTER_ID_PROPERTY} of the local cluster is not a usable cluster id: {source}"
    )]
    ClusterIdInvalid {
        /// Why the value is not a cluster id (it names the value).
        #[source]
        source: mcs_core::cluster::ClusterIdError,
    },
}

/// This cluster's id, from its ClusterProperty `cluster.clusterset.k8s.io` (KEP-2149):
/// `client` reaches the cluster the agent runs in. A missing property, one that cannot be
/// read, and a value that is not a cluster id (one RFC-1123 label) are errors that say so.
pub async fn local_cluster_id(client: &kube::Client) -> Result<ClusterId, AgentError> {
    let properties: kube::Api<ClusterProperty> = kube::Api::all(client.clone());
    let property = properties
        .get_opt(CLUSTER_ID_PROPERTY)
        .await
        .map_err(|source| AgentError::ClusterIdUnreadable { source })?
        .ok_or(AgentError::ClusterIdMissing)?;
    ClusterId::new(property.spec.value).map_err(|source| AgentError::ClusterIdInvalid { source })
}

/// Forces full resyncs of a running agent and says when each has completed
/// ([`Agent::resync_handle`]). Cheap to clone.
///
/// A full resync is what the periodic resync ([`AgentConfig::resync`]) does: every service
/// the agent knows of is reconciled once, with writes skipped where nothing changed. Tests
/// use it to check, without waiting for the period, that a converged agent writes nothing.
#[derive(Clone, Debug)]
pub struct ResyncHandle {
    /// The number of the latest requested resync.
    requested: Arc<watch::Sender<u64>>,
    /// The number of the latest requested resync whose pass has completed.
    completed: watch::Receiver<u64>,
}

impl ResyncHandle {
    /// Requests a full resync and waits until its pass has completed: every known service
    /// was reconciled once after the request (its writes, if any, were answered). Fails
    /// with [`AgentError::NotRunning`] if the agent stops first.
    pub async fn resync(&self) -> Result<(), AgentError> {
        let mut id = 0;
        self.requested.send_modify(|n| {
            *n += 1;
            id = *n;
        });
        let mut completed = self.completed.clone();
        completed
            .wait_for(|done| *done >= id)
            .await
            .map(|_| ())
            .map_err(|_| AgentError::NotRunning)
    }
}

/// The agent's side of [`ResyncHandle`]: requests in, completed passes out.
#[derive(Debug)]
struct ResyncRequests {
    /// Kept so that `requests` never reports a closed channel while the agent runs.
    _sender: Arc<watch::Sender<u64>>,
    requests: watch::Receiver<u64>,
    completed: watch::Sender<u64>,
}

/// The agent's metrics, recorded through the `metrics` facade ([`crate::metrics`] lists
/// them), and the counts a test can read without a recorder. Cheap to clone.
///
/// The handles without labels are registered with the recorder installed when the agent is
/// built ([`Agent::new`]); per-member gauges are registered as members appear.
#[derive(Clone, Debug)]
pub struct AgentMetrics(Arc<MetricsInner>);

#[derive(Debug)]
struct MetricsInner {
    reconciles: AtomicU64,
    errors: AtomicU64,
    reconciles_counter: metrics::Counter,
    errors_counter: metrics::Counter,
    services: metrics::Gauge,
    reachable: metrics::Gauge,
    hub_reachable: metrics::Gauge,
    ready: metrics::Gauge,
    /// One gauge per member present now; a member that leaves is dropped from here and
    /// never set again, so an idle-timeout recorder drops its series.
    member_up: Mutex<BTreeMap<ClusterId, metrics::Gauge>>,
}

impl Default for AgentMetrics {
    fn default() -> Self {
        use crate::metrics as m;
        Self(Arc::new(MetricsInner {
            reconciles: AtomicU64::new(0),
            errors: AtomicU64::new(0),
            reconciles_counter: metrics::counter!(m::AGENT_RECONCILES),
            errors_counter: metrics::counter!(m::AGENT_RECONCILE_ERRORS),
            services: metrics::gauge!(m::AGENT_SERVICES),
            reachable: metrics::gauge!(m::AGENT_REACHABLE_MEMBERS),
            hub_reachable: metrics::gauge!(m::AGENT_HUB_REACHABLE),
            ready: metrics::gauge!(m::AGENT_READY),
            member_up: Mutex::new(BTreeMap::new()),
        }))
    }
}

impl AgentMetrics {
    /// Reconciles so far.
    pub fn reconciles(&self) -> u64 {
        self.0.reconciles.load(Ordering::Relaxed)
    }

    /// Reconciles that failed so far (each is retried).
    pub fn reconcile_errors(&self) -> u64 {
        self.0.errors.load(Ordering::Relaxed)
    }

    fn reconciled(&self) {
        self.0.reconciles.fetch_add(1, Ordering::Relaxed);
        self.0.reconciles_counter.increment(1);
    }

    fn failed(&self) {
        self.0.errors.fetch_add(1, Ordering::Relaxed);
        self.0.errors_counter.increment(1);
    }

    /// Sets every gauge (also when unchanged: see [`crate::metrics`] on refreshing).
    fn publish(&self, values: &GaugeValues) {
        let i = &self.0;
        i.services.set(values.services as f64);
        i.reachable.set(values.reachable as f64);
        i.hub_reachable
            .set(f64::from(u8::from(values.hub_reachable)));
        i.ready.set(f64::from(u8::from(values.ready)));
        let mut members = i.member_up.lock().unwrap_or_else(|e| e.into_inner());
        members.retain(|id, _| values.members.contains_key(id));
        for (id, up) in &values.members {
            members
                .entry(id.clone())
                .or_insert_with(|| {
                    metrics::gauge!(crate::metrics::AGENT_MEMBER_UP, "cluster" => id.to_string())
                })
                .set(f64::from(u8::from(*up)));
        }
    }
}

/// What the agent's gauges say at one moment.
#[derive(Debug, Default)]
struct GaugeValues {
    services: usize,
    reachable: usize,
    hub_reachable: bool,
    ready: bool,
    /// Every member present, and whether it is reachable.
    members: BTreeMap<ClusterId, bool>,
}

/// Why the agent is not ready, for readiness endpoints, logs and tests.
///
/// The agent is not ready until every watch has listed, and while its own cluster refuses
/// it something (HTTP 403): a write it must make or a watch it needs. A namespace being
/// terminated refuses new objects to everyone; that does not count. The reason then
/// quotes the API server, which names the user, the verb and the resource, e.g.
/// `cannot patch resource "serviceexports/status"`.
#[derive(Clone, Debug, Default)]
pub struct AgentHealth(Arc<Mutex<Option<String>>>);

impl AgentHealth {
    /// `None` when the agent is ready; otherwise why it is not.
    pub fn not_ready_reason(&self) -> Option<String> {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).clone()
    }

    /// Sets the reason; returns whether it changed.
    fn set(&self, reason: Option<String>) -> bool {
        let mut current = self.0.lock().unwrap_or_else(|e| e.into_inner());
        let changed = *current != reason;
        *current = reason;
        changed
    }
}

/// The agent's readiness as its `/readyz` reports it ([`crate::admin::Readiness`]): ready,
/// or the [`AgentHealth`] reason, such as the RBAC rule its cluster refuses it.
#[derive(Clone, Debug)]
pub struct AgentReadiness {
    ready: Arc<AtomicBool>,
    health: AgentHealth,
}

impl crate::admin::Readiness for AgentReadiness {
    fn check(&self) -> Result<(), String> {
        if self.ready.load(Ordering::Acquire) {
            return Ok(());
        }
        Err(self
            .health
            .not_ready_reason()
            .unwrap_or_else(|| "starting: the first reconcile has not run yet".to_owned()))
    }
}

/// The agent of one member cluster.
#[derive(Debug)]
pub struct Agent {
    config: AgentConfig,
    ready: Arc<AtomicBool>,
    health: AgentHealth,
    metrics: AgentMetrics,
    resync: ResyncRequests,
    resync_handle: ResyncHandle,
}

impl Agent {
    /// An agent with these settings.
    pub fn new(config: AgentConfig) -> Self {
        let (requested, requests) = watch::channel(0);
        let requested = Arc::new(requested);
        let (completed, completed_rx) = watch::channel(0);
        Self {
            config,
            ready: Arc::new(AtomicBool::new(false)),
            health: AgentHealth::default(),
            metrics: AgentMetrics::default(),
            resync: ResyncRequests {
                _sender: Arc::clone(&requested),
                requests,
                completed,
            },
            resync_handle: ResyncHandle {
                requested,
                completed: completed_rx,
            },
        }
    }

    /// A handle that forces full resyncs and waits for them (see [`ResyncHandle`]).
    pub fn resync_handle(&self) -> ResyncHandle {
        self.resync_handle.clone()
    }

    /// True once every watch has listed and the first reconcile ran, and while the agent's
    /// own cluster grants it what it needs ([`Agent::health`] says why not).
    pub fn ready(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.ready)
    }

    /// Readiness with its reason, for an admin endpoint's `/readyz`.
    pub fn readiness(&self) -> AgentReadiness {
        AgentReadiness {
            ready: Arc::clone(&self.ready),
            health: self.health.clone(),
        }
    }

    /// Why the agent is not ready, if it is not.
    pub fn health(&self) -> AgentHealth {
        self.health.clone()
    }

    /// The agent's metrics.
    pub fn metrics(&self) -> AgentMetrics {
        self.metrics.clone()
    }

    /// Runs until `shutdown` completes.
    pub async fn run(self, shutdown: impl Future<Output = ()>) -> Result<(), AgentError> {
        let cidr = self.cidr_task().map(|task| tokio::spawn(task.run()));
        let result = controller::run(
            self.config,
            self.ready,
            self.health,
            self.metrics,
            self.resync,
            shutdown,
        )
        .await;
        if let Some(cidr) = cidr {
            cidr.abort();
        }
        result
    }

    /// The CIDR checks of this configuration: the local cluster's client, and in the mesh
    /// topology the other members'. `None` when no member is the local cluster (the
    /// controller refuses that configuration).
    fn cidr_task(&self) -> Option<cidr::CidrTask> {
        let config = &self.config;
        let (local_client, peers) = match &config.topology {
            Topology::Mesh { members } => {
                let local = members.iter().find(|m| m.id == config.local)?;
                let peers = members
                    .iter()
                    .filter(|m| m.id != config.local)
                    .map(|m| (m.id.clone(), m.client.clone()))
                    .collect();
                (local.client.clone(), peers)
            }
            Topology::Hub(hub) => (hub.local.clone(), Vec::new()),
        };
        Some(cidr::CidrTask {
            local: config.local.clone(),
            local_client,
            peers,
            interval: config.cidr_interval,
            refresh: config.metrics_refresh,
            controller: config.field_manager.clone(),
        })
    }
}
