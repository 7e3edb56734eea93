//! Tier selection: Envoy's priority load with overprovisioning and panic mode.
//!
//! This follows `recalculatePerPriorityState`, `recalculatePerPriorityPanic` and
//! `recalculateLoadInTotalPanic` in Envoy's
//! `source/extensions/load_balancing_policies/common/load_balancer_impl.cc`, with exact
//! fractions instead of whole percents:
//!
//! 1. each tier's health is `min(1, overprovisioning × healthy / total)` (0 when empty);
//! 2. the normalized total availability is `min(1, Σ health)`;
//! 3. if it is 1, tiers take load in order: each takes `min(remaining, health)`, so a
//!    tier at ≥ 1/1.4 ≈ 71.4 % healthy takes everything and the rest spills down;
//! 4. otherwise each tier takes `health / total availability`, and a tier whose healthy
//!    fraction is below the panic threshold is in panic (its picks ignore health); if
//!    every tier is in panic, load follows raw endpoint counts instead.
//!
//! A [`Plan`] stores the result for one snapshot as cumulative thresholds on a 32-bit
//! random number. Ejections and their expiry change it without a new snapshot, so it is
//! recomputed lazily by the first pick that finds it stale (see `Snapshot::refresh`).

use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};

/// Computes each tier's share of the load and panic flag, calling `out(tier, share,
/// panic)` for every tier in order. Returns `false` when nothing can be picked (no
/// endpoint, or nothing healthy with panic mode disabled).
pub(crate) fn tier_loads(
    tiers: usize,
    total: impl Fn(usize) -> u32,
    healthy: impl Fn(usize) -> u32,
    overprovisioning: f64,
    panic_threshold: f64,
    mut out: impl FnMut(usize, f64, bool),
) -> bool {
    let fraction = |i: usize| match total(i) {
        0 => 0.0,
        t => f64::from(healthy(i).min(t)) / f64::from(t),
    };
    let health = |i: usize| (overprovisioning * fraction(i)).min(1.0);
    let sum: f64 = (0..tiers).map(health).sum();
    if sum >= 1.0 {
        let mut remaining = 1.0_f64;
        for i in 0..tiers {
            let share = health(i).min(remaining);
            remaining -= share;
            out(i, share, false);
        }
        return true;
    }
    let in_panic = |i: usize| fraction(i) < panic_threshold;
    if (0..tiers).all(in_panic) {
        let all: u64 = (0..tiers).map(|i| u64::from(total(i))).sum();
        if all == 0 {
            return false;
        }
        for i in 0..tiers {
            out(i, f64::from(total(i)) / all as f64, true);
        }
        return true;
    }
    if sum <= 0.0 {
        return false; // panic disabled and nothing healthy
    }
    for i in 0..tiers {
        out(i, health(i) / sum, in_panic(i));
    }
    true
}

/// One snapshot's tier shares, as atomics so a pick can recompute them in place.
#[derive(Debug)]
pub(crate) struct Plan {
    /// The ejection generation the plan was computed at.
    stamp: AtomicU64,
    /// Recompute when `now` reaches this (the earliest ejection deadline seen).
    valid_until: AtomicU64,
    /// Held by the one pick that recomputes.
    busy: AtomicBool,
    /// `tier | PANIC` when one tier takes everything, `MULTI` otherwise, `NOTHING` when
    /// nothing can be picked.
    single: AtomicU64,
    /// The stamp while one tier takes every pick, out of panic, and nothing the plan
    /// covers is ejected (the common case), so one compare tells a pick all of that;
    /// `u64::MAX` otherwise.
    settled: AtomicU64,
    tiers: Box<[TierPlan]>,
}

#[derive(Debug)]
struct TierPlan {
    total: u32,
    healthy: AtomicU32,
    /// Cumulative threshold (≤ 2^32) in the low bits, `PANIC` flag.
    cut: AtomicU64,
}

impl Plan {
    /// A plan for tiers of the given sizes; call [`Plan::compute`] before use.
    pub(crate) fn new(totals: impl Iterator<Item = usize>) -> Self {
        Self {
            stamp: AtomicU64::new(0),
            valid_until: AtomicU64::new(0),
            busy: AtomicBool::new(false),
            single: AtomicU64::new(NOTHING),
            settled: AtomicU64::new(u64::MAX),
            tiers: totals
                .map(|t| TierPlan {
                    total: u32::try_from(t).unwrap_or(u32::MAX),
                    healthy: AtomicU32::new(0),
                    cut: AtomicU64::new(0),
                })
                .collect(),
        }
    }

    /// Whether the plan must be recomputed before a pick at `now`. Cost: two relaxed
    /// loads and compares.
    #[inline]
    pub(crate) fn is_stale(&self, generation: u64, now: u64) -> bool {
        self.stamp.load(Ordering::Relaxed) != generation
            || now >= self.valid_until.load(Ordering::Relaxed)
    }

    /// Whether the plan is current and no endpoint it covers is ejected (so picks need
    /// not look at time at all). Cost: two relaxed loads.
    #[inline]
    pub(crate) fn is_quiet(&self, generation: u64) -> bool {
        self.stamp.load(Ordering::Relaxed) == generation
            && self.valid_until.load(Ordering::Relaxed) == u64::MAX
    }

    /// The one tier every pick goes to, if the plan is current at `generation`, nothing
    /// is ejected and that tier is not in panic. Cost: one relaxed load and a compare,
    /// and one more load when it holds.
    #[inline]
    pub(crate) fn settled(&self, generation: u64) -> Option<usize> {
        if self.settled.load(Ordering::Relaxed) != generation {
            return None;
        }
        // A pick that read an older generation can get here while another one rewrites
        // the plan; any tier `single` names then still has endpoints, and anything else
        // takes the long way.
        let single = self.single.load(Ordering::Relaxed);
        is_plain_tier(single).then_some(single as usize)
    }

    /// Takes the right to recompute; `false` if another pick is at it.
    pub(crate) fn try_lock(&self) -> bool {
        self.busy
            .compare_exchange(false, true, Ordering::Acquire, Ordering::Relaxed)
            .is_ok()
    }

    pub(crate) fn unlock(&self) {
        self.busy.store(false, Ordering::Release);
    }

    /// Records the healthy count of `tier` before [`Plan::compute`].
    pub(crate) fn set_healthy(&self, tier: usize, healthy: u32) {
        self.tiers[tier].healthy.store(healthy, Ordering::Relaxed);
    }

    /// Recomputes the shares from the recorded healthy counts. Cost: O(tiers), no
    /// allocation.
    pub(crate) fn compute(
        &self,
        overprovisioning: f64,
        panic_threshold: f64,
        stamp: u64,
        valid_until: u64,
    ) {
        self.settled.store(u64::MAX, Ordering::Relaxed);
        let tiers = &self.tiers;
        let mut cumulative = 0.0_f64;
        let mut last_loaded = None;
        let mut loaded = 0usize;
        let possible = tier_loads(
            tiers.len(),
            |i| tiers[i].total,
            |i| tiers[i].healthy.load(Ordering::Relaxed),
            overprovisioning,
            panic_threshold,
            |i, share, panic| {
                cumulative += share;
                let cut = ((cumulative * SCALE).round() as u64).min(FULL);
                tiers[i].cut.store(cut | flag(panic), Ordering::Relaxed);
                if share > 0.0 && tiers[i].total > 0 {
                    last_loaded = Some(i);
                    loaded += 1;
                }
            },
        );
        let single = match last_loaded {
            Some(last) if possible => {
                // Close rounding gaps: the last loaded tier ends at exactly 2^32.
                let panic = tiers[last].cut.load(Ordering::Relaxed) & PANIC;
                tiers[last].cut.store(FULL | panic, Ordering::Relaxed);
                for later in &tiers[last + 1..] {
                    later.cut.store(FULL, Ordering::Relaxed);
                }
                if loaded == 1 {
                    last as u64 | panic
                } else {
                    MULTI
                }
            }
            _ => NOTHING,
        };
        self.single.store(single, Ordering::Relaxed);
        self.valid_until.store(valid_until, Ordering::Relaxed);
        self.stamp.store(stamp, Ordering::Release);
        if valid_until == u64::MAX && is_plain_tier(single) && stamp != u64::MAX {
            self.settled.store(stamp, Ordering::Relaxed);
        }
    }

    /// The tier for a pick and whether it is in panic; `None` when nothing can be
    /// picked. `random` is only called when more than one tier takes load. Cost: one
    /// relaxed load in the common one-tier case, one per tier otherwise.
    #[inline]
    pub(crate) fn choose(&self, random: impl FnOnce() -> u64) -> Option<(usize, bool)> {
        let single = self.single.load(Ordering::Relaxed);
        if single == NOTHING {
            return None;
        }
        if single != MULTI {
            return Some(((single & !PANIC) as usize, single & PANIC != 0));
        }
        let r = random() >> 32;
        let mut fallback = None;
        for (i, tier) in self.tiers.iter().enumerate() {
            let cut = tier.cut.load(Ordering::Relaxed);
            if tier.total > 0 {
                if r < cut & !PANIC {
                    return Some((i, cut & PANIC != 0));
                }
                fallback = Some((i, true));
            }
        }
        // Only reachable while another pick rewrites the thresholds.
        fallback
    }

    /// The share of picks tier `tier` takes under this plan.
    pub(crate) fn share(&self, tier: usize) -> f64 {
        let cut = |i: usize| self.tiers[i].cut.load(Ordering::Relaxed) & !PANIC;
        if tier >= self.tiers.len() || self.single.load(Ordering::Relaxed) == NOTHING {
            return 0.0;
        }
        let low = if tier == 0 { 0 } else { cut(tier - 1) };
        cut(tier).saturating_sub(low) as f64 / SCALE
    }

    /// Whether tier `tier` is in panic under this plan.
    pub(crate) fn in_panic(&self, tier: usize) -> bool {
        self.tiers
            .get(tier)
            .is_some_and(|t| t.cut.load(Ordering::Relaxed) & PANIC != 0)
    }
}

fn flag(panic: bool) -> u64 {
    if panic { PANIC } else { 0 }
}

const SCALE: f64 = 4_294_967_296.0;
const FULL: u64 = 1 << 32;
const PANIC: u64 = 1 << 40;
const MULTI: u64 = u64::MAX - 1;
const NOTHING: u64 = u64::MAX;

/// Whether a `single` word names a tier without a flag (not in panic, not `MULTI` or
/// `NOTHING`, which are both above `PANIC`).
fn is_plain_tier(single: u64) -> bool {
    single < PANIC
}

#[cfg(test)]
mod tests {
    use super::*;

    fn loads(tiers: &[(u32, u32)], op: f64, panic: f64) -> Option<Vec<(f64, bool)>> {
        let mut v = vec![(0.0, false); tiers.len()];
        tier_loads(
            tiers.len(),
            |i| tiers[i].0,
            |i| tiers[i].1,
            op,
            panic,
            |i, s, p| v[i] = (s, p),
        )
        .then_some(v)
    }

    fn close(a: f64, b: f64) -> bool {
        (a - b).abs() < 1e-9
    }

    #[test]
    fn healthy_first_tier_takes_everything() {
        let v = loads(&[(10, 10), (10, 10)], 1.4, 0.5).unwrap();
        assert!(close(v[0].0, 1.0) && close(v[1].0, 0.0));
        // 8 of 10 healthy: 1.4 × 0.8 = 1.12, still everything.
        let v = loads(&[(10, 8), (10, 10)], 1.4, 0.5).unwrap();
        assert!(close(v[0].0, 1.0));
    }

    #[test]
    fn spill_over_is_proportional() {
        // 5 of 10 healthy: health 0.7, the next tier takes 0.3.
        let v = loads(&[(10, 5), (10, 10), (10, 10)], 1.4, 0.5).unwrap();
        assert!(close(v[0].0, 0.7) && close(v[1].0, 0.3) && close(v[2].0, 0.0));
        assert!(!v[0].1, "no panic while total availability is full");
    }

    #[test]
    fn scaled_when_not_fully_available() {
        // 2/10 (0.28) and 3/10 (0.42): sum 0.7; both below 0.5 → total panic by counts.
        let v = loads(&[(10, 2), (30, 9)], 1.4, 0.5).unwrap();
        assert!(close(v[0].0, 0.25) && close(v[1].0, 0.75) && v[0].1 && v[1].1);
        // 1/10 (0.14, panic) and 5/10 (0.7, not): shares 0.14/0.84 and 0.7/0.84.
        let v = loads(&[(10, 1), (10, 5)], 1.4, 0.5).unwrap();
        assert!(close(v[0].0, 0.14 / 0.84) && v[0].1);
        assert!(close(v[1].0, 0.7 / 0.84) && !v[1].1);
    }

    #[test]
    fn nothing_healthy() {
        let v = loads(&[(0, 0), (4, 0)], 1.4, 0.5).unwrap();
        assert!(close(v[0].0, 0.0) && close(v[1].0, 1.0) && v[1].1);
        assert!(
            loads(&[(0, 0), (4, 0)], 1.4, 0.0).is_none(),
            "panic disabled"
        );
        assert!(loads(&[(0, 0)], 1.4, 0.5).is_none(), "no endpoint");
    }

    #[test]
    fn plan_thresholds() {
        let plan = Plan::new([10usize, 10, 10].into_iter());
        for (i, h) in [5u32, 10, 10].into_iter().enumerate() {
            plan.set_healthy(i, h);
        }
        plan.compute(1.4, 0.5, 7, u64::MAX);
        assert!(!plan.is_stale(7, 1));
        assert!(plan.is_stale(8, 1));
        assert!(close((plan.share(0) * 1e6).round(), 700_000.0));
        assert_eq!(plan.choose(|| 0), Some((0, false)));
        assert_eq!(plan.choose(|| u64::MAX), Some((1, false)));
        for (i, h) in [10u32, 10, 10].into_iter().enumerate() {
            plan.set_healthy(i, h);
        }
        plan.compute(1.4, 0.5, 8, u64::MAX);
        assert_eq!(plan.choose(|| unreachable!()), Some((0, false)));
    }

    #[test]
    fn settled_only_for_one_tier_out_of_panic_with_nothing_ejected() {
        let plan = Plan::new([0usize, 10, 10].into_iter());
        let compute = |healthy: [u32; 3], stamp, valid_until| {
            for (i, h) in healthy.into_iter().enumerate() {
                plan.set_healthy(i, h);
            }
            plan.compute(1.4, 0.5, stamp, valid_until);
        };
        assert_eq!(plan.settled(0), None, "never computed");
        compute([0, 10, 10], 3, u64::MAX);
        assert_eq!(plan.settled(3), Some(1));
        assert_eq!(plan.settled(4), None, "another generation");
        compute([0, 10, 10], 4, 99);
        assert_eq!(plan.settled(4), None, "an ejection ends at 99");
        compute([0, 5, 10], 5, u64::MAX);
        assert_eq!(plan.choose(|| u64::MAX), Some((2, false)));
        assert_eq!(plan.settled(5), None, "two tiers take load");
        compute([0, 0, 0], 7, u64::MAX);
        assert_eq!(plan.settled(7), None);

        let one = Plan::new([10usize].into_iter());
        one.set_healthy(0, 4);
        one.compute(1.4, 0.5, 1, u64::MAX);
        assert_eq!(one.choose(|| unreachable!()), Some((0, true)));
        assert_eq!(one.settled(1), None, "in panic");
        one.set_healthy(0, 10);
        one.compute(1.4, 0.5, 2, u64::MAX);
        assert_eq!(one.settled(2), Some(0));
    }
}
