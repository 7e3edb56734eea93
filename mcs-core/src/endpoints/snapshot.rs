//! Immutable endpoint snapshots: the pick set, grouped into tiers, built from the folded
//! discovery table and the writer's layout of the previous snapshot.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use super::config::{BalancerConfig, ClusterPreference, Locality, TrafficDistribution};
use super::hash::Ring;
use super::layout::{Layout, Tier};
use super::plan::Plan;
use super::state::{EndpointState, RETIRED, Shared};
use crate::ClusterId;
use crate::discovery::{Endpoint, EndpointTable};

/// An address a change touched, with its discovery-table entry before the change.
pub(crate) type Touched = (SocketAddr, Option<Arc<Endpoint>>);

/// An immutable view of a target's endpoints, grouped into tiers.
///
/// Only endpoints a pick may use are in it: eligible clusters (with a
/// [`ClusterPreference`], only those of its first set that has a ready or serving
/// endpoint), in a tier of the [`Tiering`](super::Tiering), and ready and not
/// terminating. When no such endpoint exists, endpoints that are still serving while
/// terminating are used instead (as kube-proxy does since KEP-1669), see
/// [`Snapshot::serving_terminating`]. Under
/// [`TrafficDistribution::PreferSameZone`] and a known caller zone, the set is narrowed to
/// endpoints in that zone when there is any.
#[derive(Debug)]
pub struct Snapshot {
    tiers: Vec<Tier>,
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
    /// 2 other clusters), so a tier may be empty.
    ///
    /// Positions in a tier are stable: an endpoint keeps its position while it stays in
    /// the tier, one that leaves is replaced by the tier's last endpoint, and new ones are
    /// appended. A tier built from scratch is in address order.
    pub fn tiers(&self) -> &[Tier] {
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
    pub fn find(&self, addr: SocketAddr) -> Option<&EndpointState> {
        self.tiers
            .iter()
            .flat_map(Tier::iter)
            .find(|s| s.endpoint().addr == addr)
    }

    /// Whether the service exists and has an endpoint (one check on the pick path).
    #[inline]
    pub(crate) fn pickable(&self) -> bool {
        self.exists == Some(true) && self.len > 0
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

    /// Builds the snapshot for `table` with the writer's `builder`, which carries live
    /// state over for every endpoint that stays and copies only the chunks a change
    /// touches (see the `layout` module). `changed` lists the addresses whose table entry
    /// changed since the last build, with the entry they had then; `None` asks for a full
    /// pass. Cost: O(k log n) for k changed addresses while the pick-set rules give the
    /// same mode (ready or serving-terminating, zone-narrowed or not), O(n) otherwise;
    /// plus O(n log n) for rings. Off the request path.
    pub(crate) fn build(
        table: &EndpointTable,
        changed: Option<&[Touched]>,
        rules: &Rules<'_>,
        shared: &Arc<Shared>,
        builder: &mut Builder,
    ) -> Self {
        let tier_count = rules.config.tiering.tier_count();
        let incremental = changed
            .filter(|_| builder.mode.is_some())
            .and_then(|changed| {
                let mut counts = builder.counts;
                for (addr, old) in changed {
                    counts.count(old.as_ref().and_then(|e| rules.class(e)), -1);
                    counts.count(table.get(addr).and_then(|e| rules.class(e)), 1);
                }
                let mode = rules.mode(&counts);
                (Some(mode) == builder.mode).then_some((changed, counts))
            });
        match incremental {
            Some((changed, counts)) => {
                let mode = builder.mode.unwrap_or_default();
                for (addr, _) in changed {
                    let desired = table.get_shared(addr).and_then(|e| {
                        let class = rules.class(e)?;
                        mode.admits(class).then_some((e, class.tier))
                    });
                    builder.layout.apply(tier_count, *addr, desired, shared);
                }
                builder.counts = counts;
            }
            None => {
                let mut counts = Counts::default();
                let classes: Vec<(&Arc<Endpoint>, Class)> = table
                    .shared()
                    .filter_map(|e| rules.class(e).map(|c| (e, c)))
                    .inspect(|&(_, c)| counts.count(Some(c), 1))
                    .collect();
                let mode = rules.mode(&counts);
                let set: Vec<(&Arc<Endpoint>, usize)> = classes
                    .into_iter()
                    .filter(|&(_, c)| mode.admits(c))
                    .map(|(e, c)| (e, c.tier))
                    .collect();
                builder.layout.update(tier_count, &set, shared);
                builder.counts = counts;
                builder.mode = Some(mode);
            }
        }
        let config = rules.config;
        let tiers = builder.layout.tiers(tier_count);
        let len = tiers.iter().map(Tier::len).sum();
        let serving_terminating = builder.mode.is_some_and(|m| m.serving_terminating);

        // The cap follows the set; if it shrank below the ejected count, the ejections
        // that end first end now.
        let cap = config.outlier.ejection_cap(len);
        let mut ejected = shared.set_cap(cap);
        if ejected > cap {
            let mut holding: Vec<(u64, &EndpointState)> = tiers
                .iter()
                .flat_map(Tier::iter)
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
                tiers
                    .iter()
                    .map(|tier| Ring::build(tier.iter().map(EndpointState::key)))
                    .collect()
            } else {
                Vec::new()
            },
            plan: Plan::new(tiers.iter().map(Tier::len)),
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
        let any_ejected = shared.ejected() > 0;
        for (i, tier) in self.tiers.iter().enumerate() {
            if !any_ejected {
                // No endpoint holds an ejection slot: all healthy, no scan (which would
                // pull every state's cache line away from the pickers).
                self.plan
                    .set_healthy(i, u32::try_from(tier.len()).unwrap_or(u32::MAX));
                continue;
            }
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

/// What decides whether an endpoint is in the pick set: the balancer's configuration,
/// the eligible clusters, the cluster preference and the caller's locality.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Rules<'a> {
    pub(crate) config: &'a BalancerConfig,
    pub(crate) eligible: Option<&'a BTreeSet<ClusterId>>,
    pub(crate) preference: Option<&'a ClusterPreference>,
    pub(crate) locality: &'a Locality,
}

impl Rules<'_> {
    /// The endpoint's standing, or `None` if it can never be picked (ineligible cluster,
    /// no tier, or neither ready nor serving while terminating).
    fn class(&self, e: &Endpoint) -> Option<Class> {
        if self.eligible.is_some_and(|set| !set.contains(&e.cluster)) {
            return None;
        }
        let ready = e.ready && !e.terminating;
        if !(ready || e.serving && e.terminating) {
            return None;
        }
        let tier = self.config.tiering.tier_of(self.locality, e)?;
        Some(Class {
            tier,
            ready,
            same_zone: self.locality.same_zone(e),
            sets: self.preference.map_or(0, |p| p.mask_of(&e.cluster)),
        })
    }

    fn prefer_same_zone(&self) -> bool {
        self.config.traffic_distribution == Some(TrafficDistribution::PreferSameZone)
    }

    /// How many sets the cluster preference has (0: none).
    fn preference_sets(&self) -> usize {
        self.preference.map_or(0, |p| p.sets().len())
    }

    /// The pick-set mode for `counts`.
    fn mode(&self, counts: &Counts) -> Mode {
        counts.mode(self.prefer_same_zone(), self.preference_sets())
    }
}

/// An endpoint that may be picked: its tier, whether it is ready (or only serving while
/// terminating), whether it is in the caller's zone, and which sets of the cluster
/// preference hold its cluster (bit `i`: set `i`).
#[derive(Clone, Copy, Debug)]
struct Class {
    tier: usize,
    ready: bool,
    same_zone: bool,
    sets: u16,
}

/// How many endpoints of some group are in each class.
#[derive(Clone, Copy, Debug, Default)]
struct Tally {
    ready: usize,
    ready_same_zone: usize,
    serving_terminating: usize,
    serving_terminating_same_zone: usize,
}

impl Tally {
    fn count(&mut self, class: Class, by: isize) {
        let (all, zone) = if class.ready {
            (&mut self.ready, &mut self.ready_same_zone)
        } else {
            (
                &mut self.serving_terminating,
                &mut self.serving_terminating_same_zone,
            )
        };
        *all = all.saturating_add_signed(by);
        if class.same_zone {
            *zone = zone.saturating_add_signed(by);
        }
    }

    /// Whether the group has an endpoint that is ready or serving.
    fn any(&self) -> bool {
        self.ready + self.serving_terminating > 0
    }
}

/// How many endpoints of the table are in each class, in all and in each set of the
/// cluster preference; they decide the [`Mode`].
#[derive(Clone, Copy, Debug, Default)]
struct Counts {
    all: Tally,
    sets: [Tally; ClusterPreference::MAX_SETS],
}

impl Counts {
    fn count(&mut self, class: Option<Class>, by: isize) {
        let Some(class) = class else { return };
        self.all.count(class, by);
        let mut sets = class.sets;
        while sets != 0 {
            let i = sets.trailing_zeros() as usize;
            self.sets[i].count(class, by);
            sets &= sets - 1;
        }
    }

    /// The mode: the first of the `preference_sets` sets with a ready or serving endpoint
    /// (else every cluster), then within it the ready endpoints or the serving-terminating
    /// ones, zone-narrowed or not.
    fn mode(&self, prefer_same_zone: bool, preference_sets: usize) -> Mode {
        let set = self.sets[..preference_sets].iter().position(Tally::any);
        let tally = set.map_or(&self.all, |i| &self.sets[i]);
        let serving_terminating = tally.ready == 0;
        let same_zone = if serving_terminating {
            tally.serving_terminating_same_zone
        } else {
            tally.ready_same_zone
        };
        Mode {
            // At most 16 sets, so the index fits.
            set: set.map(|i| i as u8),
            serving_terminating,
            same_zone_only: prefer_same_zone && same_zone > 0,
        }
    }
}

/// Which classes make up the pick set: endpoints of the chosen set of the cluster
/// preference (or of every cluster); of these, ready endpoints, or serving-but-terminating
/// ones when none is ready (KEP-1669); under `PreferSameZone`, only the caller's zone when
/// it has any.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
struct Mode {
    set: Option<u8>,
    serving_terminating: bool,
    same_zone_only: bool,
}

impl Mode {
    fn admits(self, class: Class) -> bool {
        self.set.is_none_or(|i| class.sets & 1 << i != 0)
            && class.ready != self.serving_terminating
            && (!self.same_zone_only || class.same_zone)
    }
}

/// The writer's state between builds (behind the balancer's update lock).
#[derive(Debug, Default)]
pub(crate) struct Builder {
    layout: Layout,
    counts: Counts,
    /// The mode of the last build; `None` before the first (or after a reset), which
    /// makes the next build a full pass.
    mode: Option<Mode>,
}

impl Builder {
    /// Makes the next build a full pass (for example when the eligible clusters or the
    /// cluster preference change).
    pub(crate) fn invalidate(&mut self) {
        self.mode = None;
    }
}
