//! Balancer settings: where the caller runs, how tiers form, which policy picks inside a
//! tier, outlier detection and the Envoy priority-load knobs.

use std::collections::BTreeSet;
use std::sync::Arc;
use std::time::Duration;

use crate::ClusterId;
use crate::discovery::Endpoint;

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
        Self {
            cluster,
            zone: None,
        }
    }

    /// The same locality in `zone` (`topology.kubernetes.io/zone` of the caller's node).
    #[must_use]
    pub fn in_zone(mut self, zone: &str) -> Self {
        self.zone = Some(zone.into());
        self
    }

    /// Whether `endpoint` is in the caller's zone (both zones known and equal). Zones are
    /// compared by name across clusters: they name cloud topology, not clusters.
    pub fn same_zone(&self, endpoint: &Endpoint) -> bool {
        matches!((&self.zone, &endpoint.zone), (Some(a), Some(b)) if a == b)
    }
}

/// How an endpoint is chosen inside a tier.
///
/// Independently of the policy, a pick whose [`PickContext`](super::PickContext) carries an
/// affinity key uses consistent hashing (`sessionAffinity: ClientIP`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Policy {
    /// Round robin over the tier, skipping ejected endpoints. Each thread keeps its own
    /// position (as each Envoy worker does), so one thread's picks cycle exactly and no
    /// pick writes a counter shared between threads.
    RoundRobin,
    /// Power of two choices on in-flight requests (Finagle's default, tower's
    /// `PendingRequests`).
    #[default]
    LeastLoaded,
    /// Power of two choices on peak-EWMA latency × (in-flight + 1) (linkerd's default,
    /// tower's `PeakEwma`), with the decay applied when a request completes.
    PeakEwma,
}

/// How endpoints are grouped into priority tiers.
///
/// Tier indices are fixed by the variant, so [`Picked::tier`](super::Picked::tier) means
/// the same thing in every snapshot; a tier may be empty.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub enum Tiering {
    /// Tier 0: the caller's zone in the caller's cluster; tier 1: the rest of the caller's
    /// cluster; tier 2: every other cluster.
    #[default]
    LocalFirst,
    /// One flat tier.
    Flat,
    /// Clusters in the given order, one tier each; unlisted clusters form a last tier.
    Preference(Vec<ClusterId>),
    /// Only the given cluster (one tier); endpoints of other clusters are never picked.
    Pinned(ClusterId),
}

impl Tiering {
    /// How many tiers this tiering has.
    pub fn tier_count(&self) -> usize {
        match self {
            Tiering::LocalFirst => 3,
            Tiering::Flat | Tiering::Pinned(_) => 1,
            Tiering::Preference(order) => order.len() + 1,
        }
    }

    /// The tier of `endpoint` for a caller at `locality`, or `None` when it is never
    /// picked (another cluster under [`Tiering::Pinned`]).
    pub fn tier_of(&self, locality: &Locality, endpoint: &Endpoint) -> Option<usize> {
        match self {
            Tiering::Flat => Some(0),
            Tiering::Pinned(cluster) => (endpoint.cluster == *cluster).then_some(0),
            Tiering::Preference(order) => Some(
                order
                    .iter()
                    .position(|c| *c == endpoint.cluster)
                    .unwrap_or(order.len()),
            ),
            Tiering::LocalFirst => Some(if endpoint.cluster != locality.cluster {
                2
            } else if locality.same_zone(endpoint) {
                0
            } else {
                1
            }),
        }
    }
}

/// Service `spec.trafficDistribution` semantics (KEP-4444, KEP-3015).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum TrafficDistribution {
    /// `PreferSameZone` (and its older name `PreferClose`): if any usable endpoint is in
    /// the caller's zone, only those are used (tiering then applies among them);
    /// otherwise all are. Without a caller zone it has no effect.
    PreferSameZone,
}

impl TrafficDistribution {
    /// Parses the Service field value. `PreferClose` and `PreferSameZone` map to
    /// [`TrafficDistribution::PreferSameZone`]; anything else (including `PreferSameNode`,
    /// which needs node names that endpoints here do not carry) is `None`.
    pub fn from_spec(value: &str) -> Option<Self> {
        match value {
            "PreferClose" | "PreferSameZone" => Some(Self::PreferSameZone),
            _ => None,
        }
    }
}

/// Passive outlier detection settings (Envoy and gRPC defaults).
///
/// An endpoint with `consecutive_failures` failures in a row is ejected for
/// `base_ejection × k`, capped at `max(base_ejection, max_ejection)`, where `k` counts its
/// ejections; `k` drops by one for every `base_ejection` the endpoint spends back in
/// service (Envoy and gRPC decrement it once per detection interval). At most
/// `max_ejection_percent` of the pick set is ejected at once, but at least one endpoint may
/// be (Envoy: "will eject at least one host regardless of the value"); `0` disables
/// ejection, as does `consecutive_failures == 0`.
#[derive(Clone, Debug, PartialEq)]
pub struct OutlierConfig {
    /// Consecutive failures that eject an endpoint (default 5).
    pub consecutive_failures: u32,
    /// First ejection time; the k-th ejection lasts k × this (default 30 s).
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

impl OutlierConfig {
    /// Outlier detection switched off: nothing is ever ejected.
    pub fn disabled() -> Self {
        Self {
            consecutive_failures: 0,
            max_ejection_percent: 0,
            ..Self::default()
        }
    }

    /// The most endpoints that may be ejected at once out of `endpoints`:
    /// `max(1, ⌊endpoints × max_ejection_percent / 100⌋)`, or 0 when ejection is off or
    /// the set is empty.
    pub fn ejection_cap(&self, endpoints: usize) -> usize {
        if self.consecutive_failures == 0 || self.max_ejection_percent == 0 || endpoints == 0 {
            return 0;
        }
        let percent = usize::from(self.max_ejection_percent.min(100));
        (endpoints * percent / 100).max(1)
    }

    /// How long the `k`-th ejection (k ≥ 1) lasts.
    pub fn ejection_time(&self, k: u32) -> Duration {
        let max = self.max_ejection.max(self.base_ejection);
        self.base_ejection.saturating_mul(k.max(1)).min(max)
    }
}

/// Balancer settings. Build with [`BalancerConfig::default`] and the builder methods.
///
/// ```
/// use std::time::Duration;
/// use mcs_core::endpoints::{BalancerConfig, Policy, TrafficDistribution};
///
/// let config = BalancerConfig::default()
///     .policy(Policy::PeakEwma)
///     .overprovisioning(1.4)
///     .panic_threshold(0.5)
///     .default_rtt(Duration::from_millis(30))
///     .traffic_distribution(TrafficDistribution::PreferSameZone);
/// assert_eq!(config.policy, Policy::PeakEwma);
/// ```
#[derive(Clone, Debug, PartialEq)]
#[non_exhaustive]
pub struct BalancerConfig {
    /// The pick policy inside a tier.
    pub policy: Policy,
    /// How tiers are formed.
    pub tiering: Tiering,
    /// Envoy's overprovisioning factor (default 1.4): a tier's health is
    /// `min(1, overprovisioning × healthy / total)`.
    pub overprovisioning: f64,
    /// Envoy's healthy panic threshold (default 0.5): when the tiers together are not fully
    /// available, a tier whose healthy fraction is below this ignores health; when every
    /// tier is below it, load follows raw endpoint counts. `0` disables panic mode.
    pub panic_threshold: f64,
    /// Outlier detection.
    pub outlier: OutlierConfig,
    /// Latency assumed for an endpoint with no measurement (default 30 ms, floored at
    /// 1 ms as in linkerd).
    pub default_rtt: Duration,
    /// Peak-EWMA decay time (default 10 s).
    pub decay: Duration,
    /// Only endpoints of these clusters are used (`None`: all). This is the per-port
    /// eligibility from the merge: a port only routes to clusters that expose it.
    pub eligible_clusters: Option<BTreeSet<ClusterId>>,
    /// `spec.trafficDistribution` of the service.
    pub traffic_distribution: Option<TrafficDistribution>,
    /// Build consistent-hash rings with every snapshot, so that picks with an affinity key
    /// cost O(log n) (default off: such picks use rendezvous hashing, O(n)).
    pub session_affinity: bool,
}

impl Default for BalancerConfig {
    fn default() -> Self {
        Self {
            policy: Policy::default(),
            tiering: Tiering::default(),
            overprovisioning: DEFAULT_OVERPROVISIONING,
            panic_threshold: DEFAULT_PANIC_THRESHOLD,
            outlier: OutlierConfig::default(),
            default_rtt: Duration::from_millis(30),
            decay: Duration::from_secs(10),
            eligible_clusters: None,
            traffic_distribution: None,
            session_affinity: false,
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

    /// Sets the overprovisioning factor. Non-finite or non-positive values keep 1.4.
    #[must_use]
    pub fn overprovisioning(mut self, factor: f64) -> Self {
        self.overprovisioning = if factor.is_finite() && factor > 0.0 {
            factor
        } else {
            DEFAULT_OVERPROVISIONING
        };
        self
    }

    /// Sets the panic threshold as a fraction in `[0, 1]` (clamped; NaN keeps 0.5).
    #[must_use]
    pub fn panic_threshold(mut self, fraction: f64) -> Self {
        self.panic_threshold = if fraction.is_nan() {
            DEFAULT_PANIC_THRESHOLD
        } else {
            fraction.clamp(0.0, 1.0)
        };
        self
    }

    /// Sets the latency assumed before the first measurement (floored at 1 ms).
    #[must_use]
    pub fn default_rtt(mut self, rtt: Duration) -> Self {
        self.default_rtt = rtt;
        self
    }

    /// Sets the peak-EWMA decay time (floored at 1 ms).
    #[must_use]
    pub fn decay(mut self, decay: Duration) -> Self {
        self.decay = decay;
        self
    }

    /// Restricts picks to endpoints of `clusters` (the clusters that expose the port).
    #[must_use]
    pub fn eligible_clusters(mut self, clusters: impl IntoIterator<Item = ClusterId>) -> Self {
        self.eligible_clusters = Some(clusters.into_iter().collect());
        self
    }

    /// Sets `spec.trafficDistribution` semantics.
    #[must_use]
    pub fn traffic_distribution(mut self, distribution: TrafficDistribution) -> Self {
        self.traffic_distribution = Some(distribution);
        self
    }

    /// Builds consistent-hash rings with every snapshot (for `sessionAffinity: ClientIP`).
    #[must_use]
    pub fn session_affinity(mut self, enabled: bool) -> Self {
        self.session_affinity = enabled;
        self
    }

    /// Whether `endpoint`'s cluster is eligible.
    pub fn is_eligible(&self, endpoint: &Endpoint) -> bool {
        self.eligible_clusters
            .as_ref()
            .is_none_or(|set| set.contains(&endpoint.cluster))
    }

    pub(crate) fn default_rtt_nanos(&self) -> f64 {
        self.default_rtt.max(MIN_RTT).as_nanos() as f64
    }

    pub(crate) fn decay_nanos(&self) -> f64 {
        self.decay.max(MIN_RTT).as_nanos() as f64
    }
}

/// An ordered list of cluster sets, most preferred first: the results of KEP-5939's
/// cluster selectors for the caller's cluster (`ServiceImport.status.clusterSelectorResults`).
///
/// With a preference, the pick set holds only endpoints of the first set that has an
/// endpoint that is eligible ([`BalancerConfig::eligible_clusters`], a tier of the
/// [`Tiering`]) and ready, or serving while terminating (the KEP's "ready or serving");
/// when no set has one, endpoints of every cluster, as without a preference. The choice is made before everything else that narrows the pick
/// set (the serving-terminating fallback, `PreferSameZone`), and follows every change of
/// the endpoints: when the chosen set loses its last such endpoint the next set takes over,
/// and when an earlier set gains one the traffic moves back.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct ClusterPreference {
    sets: Vec<BTreeSet<ClusterId>>,
}

/// Why a list of cluster sets is not a [`ClusterPreference`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ClusterPreferenceError {
    /// More sets than [`ClusterPreference::MAX_SETS`].
    #[error("{count} cluster sets; at most 16 are allowed (KEP-5939 allows 16 cluster selectors)")]
    TooMany {
        /// How many were given.
        count: usize,
    },
}

impl ClusterPreference {
    /// At most this many sets (KEP-5939's limit on `clusterSelectors`).
    pub const MAX_SETS: usize = 16;

    /// The preference of `sets`, most preferred first. A set may be empty (a selector that
    /// matched no cluster): it is never chosen.
    pub fn new<S, C>(sets: S) -> Result<Self, ClusterPreferenceError>
    where
        S: IntoIterator<Item = C>,
        C: IntoIterator<Item = ClusterId>,
    {
        let sets: Vec<BTreeSet<ClusterId>> = sets
            .into_iter()
            .map(|set| set.into_iter().collect())
            .collect();
        if sets.len() > Self::MAX_SETS {
            return Err(ClusterPreferenceError::TooMany { count: sets.len() });
        }
        Ok(Self { sets })
    }

    /// The sets, most preferred first.
    pub fn sets(&self) -> &[BTreeSet<ClusterId>] {
        &self.sets
    }

    /// Bit `i` is set when set `i` holds `cluster`.
    pub(crate) fn mask_of(&self, cluster: &ClusterId) -> u16 {
        self.sets
            .iter()
            .enumerate()
            .filter(|(_, set)| set.contains(cluster))
            .fold(0, |mask, (i, _)| mask | 1 << i)
    }
}

const DEFAULT_OVERPROVISIONING: f64 = 1.4;
const DEFAULT_PANIC_THRESHOLD: f64 = 0.5;
const MIN_RTT: Duration = Duration::from_millis(1);
