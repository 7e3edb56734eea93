//! Immutable endpoint snapshots: the pick set, grouped into tiers, built from the folded
//! discovery table and the live state of the previous snapshot.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::config::{BalancerConfig, Locality, TrafficDistribution};
use super::hash::Ring;
use super::plan::Plan;
use super::state::{EndpointState, RETIRED, Shared};
use crate::ClusterId;
use crate::discovery::{Endpoint, EndpointTable};

/// An immutable view of a target's endpoints, grouped into tiers.
///
/// Only endpoints a pick may use are in it: eligible clusters, in a tier of the
/// [`Tiering`](super::Tiering), and ready and not terminating. When no such endpoint
/// exists, endpoints that are still serving while terminating are used instead (as
/// kube-proxy does since KEP-1669), see [`Snapshot::serving_terminating`]. Under
/// [`TrafficDistribution::PreferSameZone`] and a known caller zone, the set is narrowed to
/// endpoints in that zone when there is any.
#[derive(Debug)]
pub struct Snapshot {
    tiers: Vec<Vec<Arc<EndpointState>>>,
    exists: Option<bool>,
    len: usize,
    serving_terminating: bool,
    rings: Vec<Ring>,
    plan: Plan,
}

impl Default for Snapshot {
    fn default() -> Self {
        Self {
            tiers: Vec::new(),
            exists: None,
            len: 0,
            serving_terminating: false,
            rings: Vec::new(),
            plan: Plan::new(std::iter::empty()),
        }
    }
}

impl Snapshot {
    /// The tiers, highest priority first. Indices are fixed by the
    /// [`Tiering`](super::Tiering) (for `LocalFirst`: 0 same zone, 1 same cluster,
    /// 2 other clusters), so a tier may be empty. Each tier is ordered by address.
    pub fn tiers(&self) -> &[Vec<Arc<EndpointState>>] {
        &self.tiers
    }

    /// Total number of endpoints.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether there is no endpoint.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// `None` before the first update, `Some(false)` after `DoesNotExist`.
    pub fn exists(&self) -> Option<bool> {
        self.exists
    }

    /// Whether no endpoint was ready, so the set holds serving-but-terminating endpoints.
    pub fn serving_terminating(&self) -> bool {
        self.serving_terminating
    }

    /// The share of picks (0 to 1) tier `tier` gets under the current plan. The plan
    /// follows ejections lazily: it is brought up to date by the next pick.
    pub fn tier_share(&self, tier: usize) -> f64 {
        self.plan.share(tier)
    }

    /// Whether tier `tier` is in panic mode (picks ignore health) under the current plan.
    pub fn tier_in_panic(&self, tier: usize) -> bool {
        self.plan.in_panic(tier)
    }

    /// The endpoint state for `addr`, if it is in the set. Cost: O(n).
    pub fn find(&self, addr: SocketAddr) -> Option<&Arc<EndpointState>> {
        self.tiers
            .iter()
            .flatten()
            .find(|s| s.endpoint().addr == addr)
    }

    #[inline]
    pub(crate) fn plan(&self) -> &Plan {
        &self.plan
    }

    #[inline]
    pub(crate) fn ring(&self, tier: usize) -> Option<&Ring> {
        self.rings.get(tier)
    }

    /// Brings the tier plan up to date at `now`: hands back the slots of expired
    /// ejections, counts healthy endpoints per tier and recomputes the shares. Runs on
    /// the pick path only after an ejection or when one expires, by one pick at a time
    /// (others use the previous plan meanwhile). Cost: O(n) when any endpoint holds an
    /// ejection slot, O(tiers) otherwise; no allocation, lock or clock read.
    #[cold]
    pub(crate) fn refresh(&self, now: u64, shared: &Shared, config: &BalancerConfig) {
        if !self.plan.try_lock() {
            return;
        }
        let stamp = shared.generation.load(Ordering::Acquire);
        let any_ejected = shared.ejected() > 0;
        let mut next = u64::MAX;
        for (i, tier) in self.tiers.iter().enumerate() {
            let healthy = if any_ejected {
                let mut healthy = 0u32;
                for state in tier {
                    let until = state.ejection_word();
                    if until == 0 {
                        healthy += 1;
                    } else if until <= now {
                        state.reclaim(until);
                        healthy += 1;
                    } else if until != RETIRED {
                        next = next.min(until);
                    }
                }
                healthy
            } else {
                u32::try_from(tier.len()).unwrap_or(u32::MAX)
            };
            self.plan.set_healthy(i, healthy);
        }
        self.plan
            .compute(config.overprovisioning, config.panic_threshold, stamp, next);
        self.plan.unlock();
    }

    /// Builds the snapshot for `table`, carrying live state over from `previous` (the
    /// snapshot it replaces). Both are walked in address order, so carrying state over is
    /// a merge, not a hash lookup, and costs one `Arc` count per endpoint. Cost: O(n),
    /// plus O(n log n) for rings; off the request path.
    pub(crate) fn build(
        table: &EndpointTable,
        config: &BalancerConfig,
        eligible: Option<&BTreeSet<ClusterId>>,
        locality: &Locality,
        shared: &Arc<Shared>,
        previous: &Snapshot,
    ) -> Self {
        let tiering = &config.tiering;
        let pick_set = |keep: fn(&Endpoint) -> bool| -> Vec<(&Endpoint, usize)> {
            table
                .endpoints()
                .filter(|e| keep(e) && eligible.is_none_or(|set| set.contains(&e.cluster)))
                .filter_map(|e| tiering.tier_of(locality, e).map(|t| (e, t)))
                .collect()
        };
        let mut set = pick_set(|e| e.ready && !e.terminating);
        let serving_terminating = set.is_empty();
        if serving_terminating {
            set = pick_set(|e| e.serving && e.terminating);
        }
        if config.traffic_distribution == Some(TrafficDistribution::PreferSameZone)
            && set.iter().any(|(e, _)| locality.same_zone(e))
        {
            set.retain(|(e, _)| locality.same_zone(e));
        }

        let mut sizes = vec![0usize; tiering.tier_count()];
        for &(_, tier) in &set {
            sizes[tier] += 1;
        }
        let mut tiers: Vec<Vec<Arc<EndpointState>>> =
            sizes.iter().map(|&n| Vec::with_capacity(n)).collect();
        let len = set.len();
        let mut old = InOrder::new(&previous.tiers);
        // `set` is in address order (the table's), like every tier of `previous`.
        for (endpoint, tier) in set {
            let state = match old.take(tier, endpoint.addr) {
                Some(old) if old.endpoint() == endpoint => Arc::clone(old),
                Some(old)
                    if old.endpoint().cluster == endpoint.cluster
                        && old.endpoint().zone == endpoint.zone =>
                {
                    Arc::new(old.successor(endpoint.clone()))
                }
                old => {
                    if let Some(old) = old {
                        old.retire();
                    }
                    Arc::new(EndpointState::new(endpoint.clone(), Arc::clone(shared)))
                }
            };
            tiers[tier].push(state);
        }
        old.retire_rest();

        // The cap follows the set; if it shrank below the ejected count, the ejections
        // that end first end now.
        let cap = config.outlier.ejection_cap(len);
        let mut ejected = shared.set_cap(cap);
        if ejected > cap {
            let mut holding: Vec<(u64, &Arc<EndpointState>)> = tiers
                .iter()
                .flatten()
                .map(|s| (s.ejection_word(), s))
                .filter(|&(until, _)| until != 0 && until != RETIRED)
                .collect();
            holding.sort_unstable_by_key(|&(until, _)| until);
            for (until, state) in holding {
                if ejected <= cap {
                    break;
                }
                if state.reclaim(until) {
                    ejected -= 1;
                }
            }
        }

        let snapshot = Self {
            exists: table.exists(),
            len,
            serving_terminating: serving_terminating && len > 0,
            rings: if config.session_affinity {
                tiers.iter().map(|t| Ring::build(t)).collect()
            } else {
                Vec::new()
            },
            plan: Plan::new(tiers.iter().map(Vec::len)),
            tiers,
        };
        snapshot.initial_plan(shared, config);
        snapshot
    }

    /// The plan as of the build, without a clock: every endpoint holding a slot counts
    /// as ejected, and the plan goes stale at the earliest deadline.
    fn initial_plan(&self, shared: &Shared, config: &BalancerConfig) {
        let stamp = shared.generation.load(Ordering::Acquire);
        let mut next = u64::MAX;
        for (i, tier) in self.tiers.iter().enumerate() {
            let mut healthy = 0u32;
            for state in tier {
                match state.ejection_word() {
                    0 => healthy += 1,
                    RETIRED => {}
                    until => next = next.min(until),
                }
            }
            self.plan.set_healthy(i, healthy);
        }
        self.plan
            .compute(config.overprovisioning, config.panic_threshold, stamp, next);
    }
}

/// Cursors over the tiers of the snapshot being replaced, each in address order. An
/// endpoint keeps its tier while its cluster and zone stay the same (the tiering is fixed
/// for a balancer), so its old state is found in the same tier. Cost: amortized O(1) per
/// step.
struct InOrder<'a> {
    heads: Vec<std::iter::Peekable<std::slice::Iter<'a, Arc<EndpointState>>>>,
}

impl<'a> InOrder<'a> {
    fn new(tiers: &'a [Vec<Arc<EndpointState>>]) -> Self {
        Self {
            heads: tiers.iter().map(|t| t.iter().peekable()).collect(),
        }
    }

    /// Retires every state of `tier` before `addr` and returns the one at `addr`, if
    /// any. A state that moved to another tier is retired when that tier's cursor passes
    /// it, or by [`InOrder::retire_rest`].
    fn take(&mut self, tier: usize, addr: SocketAddr) -> Option<&'a Arc<EndpointState>> {
        let head = self.heads.get_mut(tier)?;
        while let Some(state) = head.peek() {
            match state.endpoint().addr.cmp(&addr) {
                std::cmp::Ordering::Less => state.retire(),
                std::cmp::Ordering::Equal => return head.next(),
                std::cmp::Ordering::Greater => return None,
            }
            head.next();
        }
        None
    }

    /// Retires every state not taken.
    fn retire_rest(self) {
        for state in self.heads.into_iter().flatten() {
            state.retire();
        }
    }
}
