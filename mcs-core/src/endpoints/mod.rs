//! Endpoint snapshots and selection: local first, spill-over, outlier ejection.
//!
//! A [`Balancer`] holds the current endpoint set of one target as an immutable
//! [`Snapshot`] behind an `ArcSwap`. Discovery updates ([`Balancer::apply`]) build a new
//! snapshot off the request path; requests ([`Balancer::pick`]) load the current one and
//! pick without locks, allocation or clock reads (the caller passes `now` and a random
//! number). Per-endpoint live state (in-flight count, latency estimate, failures,
//! ejection) lives in [`EndpointState`], keyed by address, and survives snapshot swaps.
//!
//! Every pick returns a [`Picked`] guard that counts the request in flight until it is
//! completed with an [`Outcome`] (or dropped, which counts as cancelled).

use std::collections::HashMap;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, Guard};

use crate::ClusterId;
use crate::discovery::{Endpoint, EndpointTable, Update};

/// Where the caller runs: its cluster and (optionally) zone.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Locality {
    /// The caller's cluster.
    pub cluster: ClusterId,
    /// The caller's zone, when known.
    pub zone: Option<Arc<str>>,
}

impl Locality {
    /// A locality in `cluster` with no zone.
    pub fn cluster(cluster: ClusterId) -> Self {
        Self { cluster, zone: None }
    }
}

/// How an endpoint is chosen inside a tier.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Policy {
    /// Round robin.
    RoundRobin,
    /// Power of two choices on in-flight requests.
    #[default]
    LeastLoaded,
    /// Power of two choices on peak-EWMA latency × (in-flight + 1).
    PeakEwma,
}

/// How endpoints are grouped into priority tiers.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Tiering {
    /// Same zone of the local cluster, then the local cluster, then every other cluster.
    #[default]
    LocalFirst,
    /// One flat tier.
    Flat,
    /// Clusters in the given order, one tier each; unlisted clusters form a last tier.
    Preference(Vec<ClusterId>),
    /// Only the given cluster.
    Pinned(ClusterId),
}

/// Passive outlier detection settings (Envoy and gRPC defaults).
#[derive(Clone, Debug, PartialEq)]
pub struct OutlierConfig {
    /// Consecutive failures that eject an endpoint (default 5).
    pub consecutive_failures: u32,
    /// First ejection time; the n-th ejection lasts n × this (default 30 s).
    pub base_ejection: Duration,
    /// Longest ejection (default 300 s).
    pub max_ejection: Duration,
    /// At most this percentage of a target's endpoints is ejected at once (default 10).
    pub max_ejection_percent: u8,
}

impl Default for OutlierConfig {
    fn default() -> Self {
        Self {
            consecutive_failures: 5,
            base_ejection: Duration::from_secs(30),
            max_ejection: Duration::from_secs(300),
            max_ejection_percent: 10,
        }
    }
}

/// Balancer settings.
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct BalancerConfig {
    /// The pick policy inside a tier.
    pub policy: Policy,
    /// How tiers are formed.
    pub tiering: Tiering,
    /// Envoy's overprovisioning factor (default 1.4).
    pub overprovisioning: f64,
    /// Below this healthy fraction of all endpoints, health is ignored (default 0.5).
    pub panic_threshold: f64,
    /// Outlier detection.
    pub outlier: OutlierConfig,
    /// Latency assumed for an endpoint with no measurement (default 30 ms).
    pub default_rtt: Duration,
    /// Peak-EWMA decay time (default 10 s).
    pub decay: Duration,
}

impl Default for BalancerConfig {
    fn default() -> Self {
        Self {
            policy: Policy::default(),
            tiering: Tiering::default(),
            overprovisioning: 1.4,
            panic_threshold: 0.5,
            outlier: OutlierConfig::default(),
            default_rtt: Duration::from_millis(30),
            decay: Duration::from_secs(10),
        }
    }
}

impl BalancerConfig {
    /// Sets the policy.
    #[must_use]
    pub fn policy(mut self, policy: Policy) -> Self {
        self.policy = policy;
        self
    }

    /// Sets the tiering.
    #[must_use]
    pub fn tiering(mut self, tiering: Tiering) -> Self {
        self.tiering = tiering;
        self
    }

    /// Sets the outlier detection settings.
    #[must_use]
    pub fn outlier(mut self, outlier: OutlierConfig) -> Self {
        self.outlier = outlier;
        self
    }
}

/// The result of a request, fed back into outlier detection and load estimates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The endpoint answered well.
    Success,
    /// The endpoint failed (connect error, timeout, or a response the caller counts as a
    /// failure, such as 503).
    Failure,
}

/// Why no endpoint could be picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PickError {
    /// Discovery has not delivered anything yet.
    #[error("no endpoint set resolved yet")]
    NotResolved,
    /// The service does not exist.
    #[error("the service does not exist")]
    DoesNotExist,
    /// The service exists but has no usable endpoint.
    #[error("the service has no ready endpoints")]
    NoEndpoints,
}

/// What a pick needs from the caller.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct PickContext {
    /// A random number (for example from `fastrand::u64(..)`).
    pub random: u64,
    /// The current time, which the caller already has.
    pub now: Instant,
}

impl PickContext {
    /// A context with a random number and the current time.
    pub fn new(random: u64, now: Instant) -> Self {
        Self { random, now }
    }
}

/// Live state of one endpoint, shared by every snapshot that contains its address.
#[derive(Debug)]
pub struct EndpointState {
    endpoint: Endpoint,
    in_flight: AtomicU32,
    consecutive_failures: AtomicU32,
    ejected_until_nanos: AtomicU64,
}

impl EndpointState {
    fn new(endpoint: Endpoint) -> Self {
        Self {
            endpoint,
            in_flight: AtomicU32::new(0),
            consecutive_failures: AtomicU32::new(0),
            ejected_until_nanos: AtomicU64::new(0),
        }
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// Requests currently in flight to this endpoint.
    pub fn in_flight(&self) -> u32 {
        self.in_flight.load(Ordering::Relaxed)
    }
}

/// An immutable view of a target's endpoints, grouped into tiers.
#[derive(Debug, Default)]
pub struct Snapshot {
    tiers: Vec<Vec<Arc<EndpointState>>>,
    exists: Option<bool>,
}

impl Snapshot {
    /// The tiers, highest priority first.
    pub fn tiers(&self) -> &[Vec<Arc<EndpointState>>] {
        &self.tiers
    }

    /// Total number of endpoints.
    pub fn len(&self) -> usize {
        self.tiers.iter().map(Vec::len).sum()
    }

    /// Whether there is no endpoint.
    pub fn is_empty(&self) -> bool {
        self.tiers.iter().all(Vec::is_empty)
    }
}

/// A picked endpoint. The request counts as in flight until [`Picked::complete`] is
/// called or the guard is dropped.
#[derive(Debug)]
pub struct Picked {
    state: Arc<EndpointState>,
    tier: usize,
    base: Instant,
    outlier: OutlierConfigRef,
}

#[derive(Debug, Clone, Copy)]
struct OutlierConfigRef {
    consecutive_failures: u32,
    base_ejection_nanos: u64,
}

impl Picked {
    /// Where to send the request.
    pub fn addr(&self) -> SocketAddr {
        self.state.endpoint.addr
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.state.endpoint
    }

    /// The tier it was picked from (0 is the most preferred).
    pub fn tier(&self) -> usize {
        self.tier
    }

    /// Records the request's outcome and latency.
    pub fn complete(self, outcome: Outcome, _latency: Duration, now: Instant) {
        let state = &self.state;
        match outcome {
            Outcome::Success => state.consecutive_failures.store(0, Ordering::Relaxed),
            Outcome::Failure => {
                let n = state.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
                if n >= self.outlier.consecutive_failures {
                    let until = nanos_since(self.base, now) + self.outlier.base_ejection_nanos;
                    state.ejected_until_nanos.store(until, Ordering::Relaxed);
                    state.consecutive_failures.store(0, Ordering::Relaxed);
                }
            }
        }
        // Dropping `self` decrements the in-flight count.
    }
}

impl Drop for Picked {
    fn drop(&mut self) {
        self.state.in_flight.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The endpoint set of one target and the picks over it.
#[derive(Debug)]
pub struct Balancer {
    config: BalancerConfig,
    locality: Locality,
    base: Instant,
    snapshot: ArcSwap<Snapshot>,
    rr: AtomicU64,
    update: Mutex<UpdateState>,
}

#[derive(Debug, Default)]
struct UpdateState {
    table: EndpointTable,
    states: HashMap<SocketAddr, Arc<EndpointState>>,
}

impl Balancer {
    /// A balancer with no endpoints yet. `base` is any instant before every `now` the
    /// caller will pass (ejection deadlines are stored relative to it).
    pub fn new(locality: Locality, config: BalancerConfig, base: Instant) -> Self {
        Self {
            config,
            locality,
            base,
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            rr: AtomicU64::new(0),
            update: Mutex::new(UpdateState::default()),
        }
    }

    /// Applies a discovery update and publishes a new snapshot if anything changed.
    /// Returns whether it did. Called off the request path.
    pub fn apply(&self, update: Update) -> bool {
        // A poisoned lock only means another updater panicked mid-update; the table is
        // still a valid set, so keep going with it.
        let mut guard = self.update.lock().unwrap_or_else(|e| e.into_inner());
        let st = &mut *guard;
        if !st.table.apply(update) {
            return false;
        }
        let mut states = HashMap::with_capacity(st.table.len());
        let mut tiers: Vec<Vec<Arc<EndpointState>>> = Vec::new();
        for ep in st.table.endpoints() {
            if !ep.ready {
                continue;
            }
            let state = match st.states.get(&ep.addr) {
                Some(s) if s.endpoint == *ep => Arc::clone(s),
                _ => Arc::new(EndpointState::new(ep.clone())),
            };
            states.insert(ep.addr, Arc::clone(&state));
            let Some(tier) = self.tier_of(ep) else { continue };
            if tiers.len() <= tier {
                tiers.resize_with(tier + 1, Vec::new);
            }
            tiers[tier].push(state);
        }
        tiers.retain(|t| !t.is_empty());
        st.states = states;
        self.snapshot.store(Arc::new(Snapshot { tiers, exists: st.table.exists() }));
        true
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Guard<Arc<Snapshot>> {
        self.snapshot.load()
    }

    /// Picks an endpoint for one request.
    pub fn pick(&self, ctx: PickContext) -> Result<Picked, PickError> {
        let snap = self.snapshot.load();
        match snap.exists {
            None => return Err(PickError::NotResolved),
            Some(false) => return Err(PickError::DoesNotExist),
            Some(true) => {}
        }
        let now = nanos_since(self.base, ctx.now);
        let usable = |s: &Arc<EndpointState>| s.ejected_until_nanos.load(Ordering::Relaxed) <= now;
        let (tier_index, tier) = snap
            .tiers
            .iter()
            .enumerate()
            .find(|(_, t)| t.iter().any(usable))
            .or_else(|| snap.tiers.iter().enumerate().next())
            .ok_or(PickError::NoEndpoints)?;
        let state = match self.config.policy {
            Policy::RoundRobin => {
                let i = self.rr.fetch_add(1, Ordering::Relaxed) as usize % tier.len();
                &tier[i]
            }
            Policy::LeastLoaded | Policy::PeakEwma => {
                let n = tier.len();
                let a = (ctx.random % n as u64) as usize;
                let b = if n > 1 { (a + 1 + ((ctx.random >> 32) % (n as u64 - 1)) as usize) % n } else { a };
                let (sa, sb) = (&tier[a], &tier[b]);
                match (usable(sa), usable(sb)) {
                    (true, false) => sa,
                    (false, true) => sb,
                    _ if sb.in_flight() < sa.in_flight() => sb,
                    _ => sa,
                }
            }
        };
        state.in_flight.fetch_add(1, Ordering::Relaxed);
        Ok(Picked {
            state: Arc::clone(state),
            tier: tier_index,
            base: self.base,
            outlier: OutlierConfigRef {
                consecutive_failures: self.config.outlier.consecutive_failures,
                base_ejection_nanos: self.config.outlier.base_ejection.as_nanos() as u64,
            },
        })
    }

    /// The caller's locality.
    pub fn locality(&self) -> &Locality {
        &self.locality
    }

    fn tier_of(&self, ep: &Endpoint) -> Option<usize> {
        match &self.config.tiering {
            Tiering::Flat => Some(0),
            Tiering::Pinned(c) => (ep.cluster == *c).then_some(0),
            Tiering::Preference(order) => Some(order.iter().position(|c| *c == ep.cluster).unwrap_or(order.len())),
            Tiering::LocalFirst => Some(if ep.cluster != self.locality.cluster {
                2
            } else if self.locality.zone.is_some() && ep.zone == self.locality.zone {
                0
            } else {
                1
            }),
        }
    }
}

fn nanos_since(base: Instant, now: Instant) -> u64 {
    now.saturating_duration_since(base).as_nanos().min(u128::from(u64::MAX)) as u64
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(last: u8, cluster: &str) -> Endpoint {
        Endpoint::ready(SocketAddr::from(([127, 0, 0, last], 9443)), ClusterId::new(cluster).unwrap())
    }

    #[test]
    fn local_cluster_first_then_spill() {
        let t0 = Instant::now();
        let b = Balancer::new(Locality::cluster(ClusterId::new("east").unwrap()), BalancerConfig::default(), t0);
        assert_eq!(b.pick(PickContext::new(1, t0)).unwrap_err(), PickError::NotResolved);
        b.apply(Update::Reset(vec![ep(1, "east"), ep(2, "west")]));
        for r in 0..20 {
            let p = b.pick(PickContext::new(r, t0)).unwrap();
            assert_eq!(p.endpoint().cluster.as_str(), "east");
        }
        let p = b.pick(PickContext::new(0, t0)).unwrap();
        for _ in 0..5 {
            let q = b.pick(PickContext::new(0, t0)).unwrap();
            q.complete(Outcome::Failure, Duration::ZERO, t0);
        }
        drop(p);
        let p = b.pick(PickContext::new(0, t0)).unwrap();
        assert_eq!(p.endpoint().cluster.as_str(), "west", "east ejected, spill to west");
    }
}
