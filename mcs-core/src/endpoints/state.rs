//! Per-endpoint live state (in-flight, peak-EWMA latency, failures, ejection) and the
//! balancer-wide ejection accounting it reports to.
//!
//! Ejection is a small state machine on one atomic word per endpoint, `ejected_until`:
//!
//! - `0`: in service, not counted against the ejection cap;
//! - a deadline `d` (nanoseconds since the balancer's base instant, never 0): ejected
//!   until `d` and holding one slot of the cap; once `d` has passed the endpoint is in
//!   service again and the slot is handed back by whoever notices first (a pick's tier
//!   refresh), or reused by a new ejection of the same endpoint;
//! - `RETIRED`: the endpoint left the pick set; it can never be ejected again.
//!
//! Every transition is a compare-and-swap on that word, and a slot is reserved from the
//! shared counter *before* a `0 → d` transition and released exactly once on `d → 0` or
//! `d → RETIRED`, so the number of ejected endpoints never exceeds the cap.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use super::balancer::Outcome;
use super::config::{BalancerConfig, OutlierConfig};
use super::hash;
use crate::discovery::Endpoint;

/// Live state of one endpoint, shared by every snapshot that contains its address.
///
/// State is kept while the address stays in the pick set with the same cluster and zone;
/// when other fields change (hostname, conditions) the latency estimate, failure count
/// and ejection carry over to the successor. An endpoint that leaves the pick set (removed,
/// not ready, ineligible) starts afresh if it comes back.
///
/// An `EndpointState` is a handle on the endpoint's live counters; snapshots hold the
/// handles (a clone is another handle on the same counters). The in-flight count is the
/// number of [`Picked`](super::Picked) guards holding the counters: the counters' `Arc`
/// strong count less the handles, which each count themselves in `holders`. A pick takes
/// one reference and completing or dropping the guard gives it back, so a request's
/// start and end are one atomic each and no separate in-flight counter is kept.
#[derive(Debug)]
pub struct EndpointState {
    live: Arc<Live>,
}

impl Clone for EndpointState {
    fn clone(&self) -> Self {
        // Reference first, then the handle count: while the two differ, in-flight reads
        // one too high, never too low.
        let live = Arc::clone(&self.live);
        live.holders.fetch_add(1, Ordering::Relaxed);
        Self { live }
    }
}

impl Drop for EndpointState {
    fn drop(&mut self) {
        // The handle count first; the reference goes when `live` is dropped right after.
        self.live.holders.fetch_sub(1, Ordering::Relaxed);
    }
}

/// The counters a pick reads and a completion writes. Its `Arc` strong count is
/// `holders` (the [`EndpointState`] handles) plus the requests in flight.
///
/// What a pick reads is in the first 64 bytes of the allocation: the `Arc` counts,
/// `holders`, `ejected_until` and the address. The endpoint itself is the discovery
/// table's `Arc`, so building a state allocates only this (128 bytes), and the states of
/// a set built at once sit close together.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Live {
    holders: AtomicU32,
    consecutive_failures: AtomicU32,
    ejected_until: AtomicU64,
    addr: SocketAddr,
    rtt_bits: AtomicU64,
    rtt_at: AtomicU64,
    last_ejection_end: AtomicU64,
    key: u64,
    ejections: AtomicU32,
    shared: Arc<Shared>,
    endpoint: Arc<Endpoint>,
}

impl EndpointState {
    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.live.endpoint
    }

    /// Requests currently in flight to this endpoint.
    pub fn in_flight(&self) -> u32 {
        self.load()
    }

    /// Failures in a row since the last success or ejection.
    pub fn consecutive_failures(&self) -> u32 {
        self.live.consecutive_failures.load(Ordering::Relaxed)
    }

    /// The ejection multiplier: how many times the endpoint was ejected, less one for
    /// every base ejection time it has spent back in service (as of its last ejection).
    pub fn ejections(&self) -> u32 {
        self.live.ejections.load(Ordering::Relaxed)
    }

    /// The peak-EWMA latency estimate (the configured default before any measurement).
    pub fn rtt_estimate(&self) -> Duration {
        Duration::from_nanos(f64::from_bits(self.live.rtt_bits.load(Ordering::Relaxed)) as u64)
    }

    /// Whether the endpoint is ejected at `now`.
    pub fn is_ejected(&self, now: Instant) -> bool {
        self.live.is_ejected(now)
    }

    /// When the current ejection ends, if the endpoint holds an ejection slot (possibly
    /// expired but not yet handed back).
    pub fn ejected_until(&self) -> Option<Instant> {
        match self.live.ejected_until.load(Ordering::Acquire) {
            0 | RETIRED => None,
            until => Some(self.live.shared.base + Duration::from_nanos(until)),
        }
    }

    /// Feeds back an outcome observed outside a pick, for example a failed connection
    /// attempt of a pool or an active health check. Same effect as
    /// [`Picked::complete`](super::Picked::complete) without the in-flight accounting.
    /// Returns whether this outcome ejected the endpoint.
    pub fn report(&self, outcome: Outcome, latency: Duration, now: Instant) -> bool {
        let live = &*self.live;
        live.record(outcome == Outcome::Success, latency, live.shared.nanos(now))
    }

    pub(crate) fn new(endpoint: Arc<Endpoint>, shared: Arc<Shared>) -> Self {
        Self {
            live: Arc::new(Live {
                holders: AtomicU32::new(1),
                consecutive_failures: AtomicU32::new(0),
                ejections: AtomicU32::new(0),
                ejected_until: AtomicU64::new(0),
                rtt_bits: AtomicU64::new(shared.default_rtt.to_bits()),
                rtt_at: AtomicU64::new(0),
                last_ejection_end: AtomicU64::new(0),
                key: hash::addr_key(&endpoint.addr),
                addr: endpoint.addr,
                shared,
                endpoint,
            }),
        }
    }

    /// The state for a changed `endpoint` at the same address: measurements, failures
    /// and the ejection (with its slot) move over; in-flight requests keep counting on
    /// `self`, which is retired.
    pub(crate) fn successor(&self, endpoint: Arc<Endpoint>) -> Self {
        let old = &*self.live;
        let next = Self::new(endpoint, Arc::clone(&old.shared));
        let new = &*next.live;
        let relaxed = Ordering::Relaxed;
        new.rtt_bits.store(old.rtt_bits.load(relaxed), relaxed);
        new.rtt_at.store(old.rtt_at.load(relaxed), relaxed);
        new.consecutive_failures
            .store(old.consecutive_failures.load(relaxed), relaxed);
        new.ejections.store(old.ejections.load(relaxed), relaxed);
        new.last_ejection_end
            .store(old.last_ejection_end.load(relaxed), relaxed);
        let until = old.ejected_until.swap(RETIRED, Ordering::AcqRel);
        if until != RETIRED {
            new.ejected_until.store(until, Ordering::Release);
        }
        next
    }

    /// Takes the endpoint out of service for good, handing back its ejection slot.
    pub(crate) fn retire(&self) {
        let live = &*self.live;
        let until = live.ejected_until.swap(RETIRED, Ordering::AcqRel);
        if until != 0 && until != RETIRED {
            live.shared.release();
        }
    }

    /// The raw ejection word (see the module docs).
    #[inline]
    pub(crate) fn ejection_word(&self) -> u64 {
        self.live.ejected_until.load(Ordering::Acquire)
    }

    /// Whether a pick may use the endpoint at `now`. Cost: one relaxed load.
    #[inline]
    pub(crate) fn usable(&self, now: u64) -> bool {
        self.live.ejected_until.load(Ordering::Relaxed) <= now
    }

    /// Hands back the slot of an ejection that ended at `until` (≤ now). Returns whether
    /// this call did it.
    pub(crate) fn reclaim(&self, until: u64) -> bool {
        let live = &*self.live;
        let done = live
            .ejected_until
            .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if done {
            live.shared.release();
        }
        done
    }

    /// A stable hash of the address (for consistent hashing).
    #[inline]
    pub(crate) fn key(&self) -> u64 {
        self.live.key
    }

    /// p2c least-loaded cost, the in-flight count. Cost: two relaxed loads from one cache
    /// line and a subtraction.
    #[inline(always)]
    pub(crate) fn pick_load(&self) -> usize {
        let holders = self.live.holders.load(Ordering::Relaxed) as usize;
        // Saturating: a handle dropped between the two loads can make the strong count
        // read below the holders read before it.
        Arc::strong_count(&self.live).saturating_sub(holders)
    }

    /// The in-flight count, saturated to `u32`.
    pub(crate) fn load(&self) -> u32 {
        u32::try_from(self.pick_load()).unwrap_or(u32::MAX)
    }

    /// p2c peak-EWMA cost: estimate × (in-flight + 1). Cost: two relaxed loads and a
    /// multiply; no `exp` (decay happens on completion).
    ///
    /// Because the decay only runs when a request completes, an endpoint that stopped
    /// receiving traffic after a latency peak would keep that peak forever; an estimate
    /// above the default RTT that is older than the decay time is therefore capped at the
    /// default RTT, so the endpoint gets probed again. Only that case asks `now` for the
    /// time (computed once per pick).
    #[inline]
    pub(crate) fn ewma_cost(&self, now: impl Fn() -> u64, params: EwmaParams) -> f64 {
        let live = &*self.live;
        let mut estimate = f64::from_bits(live.rtt_bits.load(Ordering::Relaxed));
        if estimate > params.default_rtt {
            let at = live.rtt_at.load(Ordering::Relaxed);
            if now().saturating_sub(at) >= params.decay_nanos {
                estimate = params.default_rtt;
            }
        }
        let pending = f64::from(self.load()) + 1.0;
        estimate.max(1.0) * pending
    }

    /// Counts a request in flight: the returned handle is the count (one RMW).
    #[inline]
    pub(crate) fn begin(&self) -> Arc<Live> {
        Arc::clone(&self.live)
    }

    /// Whether both handles are on the same live state: the same endpoint, in the same
    /// stretch of time in the pick set (a successor after a change of conditions, or an
    /// endpoint that left and came back, has a new one).
    pub fn same_state(&self, other: &EndpointState) -> bool {
        Arc::ptr_eq(&self.live, &other.live)
    }

    /// Whether `live` is this endpoint's counters.
    pub(crate) fn holds(&self, live: &Arc<Live>) -> bool {
        Arc::ptr_eq(&self.live, live)
    }
}

impl Live {
    /// The endpoint's address.
    #[inline]
    pub(crate) fn addr(&self) -> SocketAddr {
        self.addr
    }

    /// The endpoint.
    #[inline]
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.shared
    }

    fn is_ejected(&self, now: Instant) -> bool {
        let until = self.ejected_until.load(Ordering::Acquire);
        until != 0 && until != RETIRED && until > self.shared.nanos(now)
    }

    /// Feeds one completed request back: latency into the estimate, the outcome into
    /// outlier detection. Cost: a few atomics and one `exp`; an ejection adds a CAS on the
    /// shared counter. Returns whether this outcome ejected the endpoint.
    pub(crate) fn record(&self, success: bool, latency: Duration, now: u64) -> bool {
        self.observe_rtt(latency, now);
        if success {
            if self.consecutive_failures.load(Ordering::Relaxed) != 0 {
                self.consecutive_failures.store(0, Ordering::Relaxed);
            }
            return false;
        }
        let threshold = self.shared.failure_threshold;
        let until = self.ejected_until.load(Ordering::Acquire);
        if threshold == 0 || until > now {
            // Disabled, ejected or retired: failures of requests sent before the ejection
            // do not count against the endpoint's next time in service.
            return false;
        }
        let failures = self.consecutive_failures.fetch_add(1, Ordering::Relaxed) + 1;
        if failures >= threshold && self.eject(until, now) {
            self.consecutive_failures.store(0, Ordering::Relaxed);
            return true;
        }
        false
    }

    /// Peak-EWMA update: a slower sample replaces the estimate at once; otherwise it
    /// decays towards the sample with weight `e^(-Δt/decay)`. Plain loads and stores:
    /// when two requests to one endpoint complete at the same instant, one sample may be
    /// lost, which a load estimate can afford (tower takes a mutex here).
    fn observe_rtt(&self, latency: Duration, now: u64) {
        // Via u64: a u128 to f64 conversion is a software routine.
        let sample = u64::try_from(latency.as_nanos()).unwrap_or(u64::MAX) as f64;
        let previous = self.rtt_at.load(Ordering::Relaxed);
        self.rtt_at.store(now.max(1), Ordering::Relaxed);
        let estimate = f64::from_bits(self.rtt_bits.load(Ordering::Relaxed));
        let next = if previous == 0 || sample > estimate {
            sample // the first measurement replaces the seed; a peak replaces the estimate
        } else {
            let elapsed = now.saturating_sub(previous) as f64;
            let weight = (elapsed * self.shared.neg_inv_decay).exp();
            estimate * weight + sample * (1.0 - weight)
        };
        self.rtt_bits.store(next.to_bits(), Ordering::Relaxed);
    }

    /// Ejects the endpoint whose ejection word was `current` (0, or an expired deadline
    /// that still holds a slot). Returns whether it did.
    fn eject(&self, current: u64, now: u64) -> bool {
        let shared = &*self.shared;
        let reserved = current == 0;
        if reserved && !shared.reserve() {
            return false; // the cap is reached
        }
        let previous = self.ejections.load(Ordering::Relaxed);
        let last_end = self.last_ejection_end.load(Ordering::Relaxed);
        let served = now.saturating_sub(last_end) / shared.base_ejection_nanos.max(1);
        let k = previous
            .saturating_sub(u32::try_from(served).unwrap_or(u32::MAX))
            .saturating_add(1);
        let time = shared.outlier.ejection_time(k);
        let deadline = now
            .saturating_add(u64::try_from(time.as_nanos()).unwrap_or(u64::MAX))
            .clamp(1, RETIRED - 1);
        match self.ejected_until.compare_exchange(
            current,
            deadline,
            Ordering::AcqRel,
            Ordering::Relaxed,
        ) {
            Ok(_) => {
                self.ejections.store(k, Ordering::Relaxed);
                self.last_ejection_end.store(deadline, Ordering::Relaxed);
                // Published after the deadline, so a tier refresh that sees this
                // generation also sees the deadline.
                shared.generation.fetch_add(1, Ordering::Release);
                true
            }
            Err(_) => {
                if reserved {
                    shared.release();
                }
                false
            }
        }
    }
}

/// Marks a state that left the pick set.
pub(crate) const RETIRED: u64 = u64::MAX;

/// What every endpoint state of one balancer shares: time base, parameters, and the
/// ejection counter with its cap.
#[derive(Debug)]
pub(crate) struct Shared {
    pub(crate) base: Instant,
    failure_threshold: u32,
    outlier: OutlierConfig,
    base_ejection_nanos: u64,
    default_rtt: f64,
    /// `-1 / decay`, so the decay weight takes a multiply rather than a division.
    neg_inv_decay: f64,
    decay_nanos: u64,
    /// `cap << 32 | ejected`: one word, so that a reservation checks the cap it counts
    /// against.
    ejections: AtomicU64,
    /// Bumped after every ejection; tier plans computed before it are stale.
    pub(crate) generation: AtomicU64,
}

impl Shared {
    pub(crate) fn new(config: &BalancerConfig, base: Instant) -> Self {
        let outlier = &config.outlier;
        Self {
            base,
            failure_threshold: if outlier.max_ejection_percent == 0 {
                0
            } else {
                outlier.consecutive_failures
            },
            outlier: outlier.clone(),
            base_ejection_nanos: u64::try_from(outlier.base_ejection.as_nanos())
                .unwrap_or(u64::MAX),
            default_rtt: config.default_rtt_nanos(),
            neg_inv_decay: -1.0 / config.decay_nanos(),
            decay_nanos: config.decay_nanos() as u64,
            ejections: AtomicU64::new(0),
            generation: AtomicU64::new(0),
        }
    }

    /// What a peak-EWMA pick needs, copied out so candidates are costed without
    /// following their `shared` pointers.
    #[inline]
    pub(crate) fn ewma_params(&self) -> EwmaParams {
        EwmaParams {
            default_rtt: self.default_rtt,
            decay_nanos: self.decay_nanos,
        }
    }

    /// Nanoseconds from the base instant to `now` (0 before it).
    #[inline]
    pub(crate) fn nanos(&self, now: Instant) -> u64 {
        u64::try_from(now.saturating_duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// Endpoints currently holding an ejection slot.
    pub(crate) fn ejected(&self) -> usize {
        (self.ejections.load(Ordering::Acquire) & COUNT_MASK) as usize
    }

    /// The current cap.
    pub(crate) fn cap(&self) -> usize {
        (self.ejections.load(Ordering::Acquire) >> 32) as usize
    }

    /// Sets the cap; returns the number of endpoints holding a slot.
    pub(crate) fn set_cap(&self, cap: usize) -> usize {
        let cap = u64::try_from(cap.min(u32::MAX as usize)).unwrap_or(u64::from(u32::MAX));
        let previous = self
            .ejections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                Some(cap << 32 | (word & COUNT_MASK))
            })
            .unwrap_or_else(|word| word);
        (previous & COUNT_MASK) as usize
    }

    fn reserve(&self) -> bool {
        self.ejections
            .fetch_update(Ordering::AcqRel, Ordering::Acquire, |word| {
                let (cap, count) = (word >> 32, word & COUNT_MASK);
                (count < cap).then_some(word + 1)
            })
            .is_ok()
    }

    fn release(&self) {
        // Only called for a state that holds a slot, so the count is positive.
        self.ejections.fetch_sub(1, Ordering::AcqRel);
    }
}

/// Peak-EWMA parameters in the units picks use.
#[derive(Clone, Copy, Debug)]
pub(crate) struct EwmaParams {
    default_rtt: f64,
    decay_nanos: u64,
}

const COUNT_MASK: u64 = 0xffff_ffff;

#[cfg(test)]
mod tests {
    use std::mem::{offset_of, size_of};

    use super::*;

    #[test]
    fn what_a_pick_reads_is_in_the_first_64_bytes() {
        // The `Arc` counts take the first 16 bytes of the allocation, so `Live` offsets
        // below 48 are in its first 64 bytes.
        assert!(offset_of!(Live, holders) < 48);
        assert!(offset_of!(Live, ejected_until) + 8 <= 48);
        assert!(offset_of!(Live, addr) + size_of::<SocketAddr>() <= 48);
        // With the `Arc` counts, a state is at most two cache lines.
        assert!(size_of::<Live>() + 16 <= 128, "{}", size_of::<Live>());
    }
}
