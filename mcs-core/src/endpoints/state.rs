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
use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Weak};
use std::time::{Duration, Instant};

use super::config::{BalancerConfig, OutlierConfig};
use super::hash;
use crate::discovery::Endpoint;

/// The result of a request, fed back into outlier detection and load estimates.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// The endpoint answered well.
    Success,
    /// The endpoint failed (connect error, timeout, or a response the caller counts as a
    /// failure, such as 503).
    Failure,
}

/// Live state of one endpoint, shared by every snapshot that contains its address.
///
/// State is kept while the address stays in the pick set with the same cluster and zone;
/// when other fields change (hostname, conditions) the latency estimate, failure count
/// and ejection carry over to the successor. An endpoint that leaves the pick set (removed,
/// not ready, ineligible) starts afresh if it comes back.
///
/// An `EndpointState` is what a snapshot holds at each position: one pointer to the
/// endpoint's live counters. To keep a state beyond the snapshot it was read from, take a
/// [`StateHandle`] with [`handle`](Self::handle).
///
/// The in-flight count is the number of [`Picked`](super::Picked) guards holding the
/// counters: the `Arc` strong count less the holders (snapshot positions and
/// [`StateHandle`]s), each of which also holds one weak reference, so the weak count is
/// the number of holders. A request's start and end are then one atomic each, with no
/// separate in-flight counter.
#[derive(Debug)]
pub struct EndpointState {
    live: Arc<Live>,
}

/// An owned handle on an endpoint's [`EndpointState`], kept independently of any
/// snapshot: holding it keeps the state readable (and comparable with
/// [`EndpointState::same_state`]) after the endpoint leaves the pick set. Handles are not
/// counted in flight.
#[derive(Debug)]
pub struct StateHandle {
    // Declared first, so it is dropped first: while the two counts differ, in-flight
    // reads one too high, never too low.
    weak: Weak<Live>,
    state: EndpointState,
}

impl Clone for StateHandle {
    fn clone(&self) -> Self {
        self.state.handle()
    }
}

impl std::ops::Deref for StateHandle {
    type Target = EndpointState;

    #[inline]
    fn deref(&self) -> &EndpointState {
        &self.state
    }
}

impl StateHandle {
    /// A fresh state for `endpoint`.
    pub(crate) fn new(endpoint: Arc<Endpoint>, shared: Arc<Shared>) -> Self {
        Self::start(Self::prepare(endpoint, shared))
    }

    /// The part of a fresh state that picks do not read. A batch of states is built by
    /// preparing all of them first, then [starting](Self::start) each, so that no cold part
    /// is allocated between the parts picks read.
    pub(crate) fn prepare(endpoint: Arc<Endpoint>, shared: Arc<Shared>) -> Box<Cold> {
        Box::new(Cold {
            ejected_until: AtomicU64::new(0),
            rtt_bits: AtomicU64::new(shared.default_rtt.to_bits()),
            rtt_at: AtomicU64::new(0),
            last_ejection_end: AtomicU64::new(0),
            key: hash::addr_key(&endpoint.addr),
            consecutive_failures: AtomicU32::new(0),
            ejections: AtomicU32::new(0),
            shared,
            endpoint,
        })
    }

    /// A fresh state around a [prepared](Self::prepare) part.
    pub(crate) fn start(cold: Box<Cold>) -> Self {
        let live = Arc::new(Live {
            addr: cold.endpoint.addr,
            cold,
        });
        Self {
            weak: Arc::downgrade(&live),
            state: EndpointState { live },
        }
    }

    /// The weak reference that counts this holder, and the state: how a snapshot stores
    /// them (apart).
    pub(crate) fn into_parts(self) -> (Weak<Live>, EndpointState) {
        (self.weak, self.state)
    }
}

/// What a pick reads (the `Arc` counts and the address), and a pointer to the rest. Its
/// `Arc` strong count is the holders (also counted by the weak count) plus the requests
/// in flight.
///
/// Kept small enough that, with the `Arc` counts, it fits a 64-byte allocation, so a pick
/// reads one cache line per candidate. Everything else is in [`Cold`], allocated ahead of
/// a batch of states (see [`StateHandle::prepare`]) so that it does not sit between them.
#[derive(Debug)]
#[repr(C)]
pub(crate) struct Live {
    addr: SocketAddr,
    cold: Box<Cold>,
}

/// The part of an endpoint's live state that a least-loaded or round-robin pick does not
/// read (except `ejected_until`, while something in the balancer is ejected).
#[derive(Debug)]
pub(crate) struct Cold {
    ejected_until: AtomicU64,
    rtt_bits: AtomicU64,
    rtt_at: AtomicU64,
    last_ejection_end: AtomicU64,
    key: u64,
    consecutive_failures: AtomicU32,
    ejections: AtomicU32,
    shared: Arc<Shared>,
    endpoint: Arc<Endpoint>,
}

impl EndpointState {
    /// What picks do not read.
    #[inline]
    fn cold(&self) -> &Cold {
        &self.live.cold
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        &self.cold().endpoint
    }

    /// Requests currently in flight to this endpoint.
    pub fn in_flight(&self) -> u32 {
        self.load()
    }

    /// Failures in a row since the last success or ejection.
    pub fn consecutive_failures(&self) -> u32 {
        self.cold().consecutive_failures.load(Ordering::Relaxed)
    }

    /// The ejection multiplier: how many times the endpoint was ejected, less one for
    /// every base ejection time it has spent back in service (as of its last ejection).
    pub fn ejections(&self) -> u32 {
        self.cold().ejections.load(Ordering::Relaxed)
    }

    /// The peak-EWMA latency estimate (the configured default before any measurement).
    pub fn rtt_estimate(&self) -> Duration {
        Duration::from_nanos(f64::from_bits(self.cold().rtt_bits.load(Ordering::Relaxed)) as u64)
    }

    /// Whether the endpoint is ejected at `now`.
    pub fn is_ejected(&self, now: Instant) -> bool {
        self.cold().is_ejected(now)
    }

    /// When the current ejection ends, if the endpoint holds an ejection slot (possibly
    /// expired but not yet handed back).
    pub fn ejected_until(&self) -> Option<Instant> {
        match self.cold().ejected_until.load(Ordering::Acquire) {
            0 | RETIRED => None,
            until => Some(self.cold().shared.base + Duration::from_nanos(until)),
        }
    }

    /// Feeds back an outcome observed outside a pick, for example a failed connection
    /// attempt of a pool or an active health check. Same effect as
    /// [`Picked::complete`](super::Picked::complete) without the in-flight accounting.
    /// Returns whether this outcome ejected the endpoint.
    pub fn report(&self, outcome: Outcome, latency: Duration, now: Instant) -> bool {
        let now = self.cold().shared.nanos(now);
        self.live.record(outcome == Outcome::Success, latency, now)
    }

    /// An owned handle on this state (see [`StateHandle`]).
    pub fn handle(&self) -> StateHandle {
        // The reference first, then the holder count (see `StateHandle`'s fields).
        let state = self.dup();
        StateHandle {
            weak: Arc::downgrade(&state.live),
            state,
        }
    }

    /// Another pointer to the same counters, for a holder that also takes a weak
    /// reference (a [`StateHandle`], or a copied snapshot chunk): on its own it would
    /// count as a request in flight.
    #[inline]
    pub(crate) fn dup(&self) -> Self {
        Self {
            live: Arc::clone(&self.live),
        }
    }

    /// The state for a changed `endpoint` at the same address: measurements, failures
    /// and the ejection (with its slot) move over; in-flight requests keep counting on
    /// `self`, which is retired.
    pub(crate) fn successor(&self, endpoint: Arc<Endpoint>) -> StateHandle {
        let old = self.cold();
        let next = StateHandle::new(endpoint, Arc::clone(&old.shared));
        let new = next.cold();
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
        let cold = self.cold();
        let until = cold.ejected_until.swap(RETIRED, Ordering::AcqRel);
        if until != 0 && until != RETIRED {
            cold.shared.release();
        }
    }

    /// The raw ejection word (see the module docs).
    #[inline]
    pub(crate) fn ejection_word(&self) -> u64 {
        self.cold().ejected_until.load(Ordering::Acquire)
    }

    /// Whether a pick may use the endpoint at `now`. Cost: one relaxed load.
    #[inline]
    pub(crate) fn usable(&self, now: u64) -> bool {
        self.cold().ejected_until.load(Ordering::Relaxed) <= now
    }

    /// Hands back the slot of an ejection that ended at `until` (≤ now). Returns whether
    /// this call did it.
    pub(crate) fn reclaim(&self, until: u64) -> bool {
        let cold = self.cold();
        let done = cold
            .ejected_until
            .compare_exchange(until, 0, Ordering::AcqRel, Ordering::Relaxed)
            .is_ok();
        if done {
            cold.shared.release();
        }
        done
    }

    /// A stable hash of the address (for consistent hashing).
    #[inline]
    pub(crate) fn key(&self) -> u64 {
        self.cold().key
    }

    /// p2c least-loaded cost, the in-flight count. Cost: two relaxed loads and a
    /// subtraction.
    #[inline(always)]
    pub(crate) fn pick_load(&self) -> usize {
        let holders = Arc::weak_count(&self.live);
        // Saturating: a holder dropped between the two loads can make the strong count
        // read below the holder count read before it.
        Arc::strong_count(&self.live).saturating_sub(holders)
    }

    /// The in-flight count, saturated to `u32`.
    pub(crate) fn load(&self) -> u32 {
        u32::try_from(self.pick_load()).unwrap_or(u32::MAX)
    }

    /// p2c peak-EWMA cost: estimate × (in-flight + 1). Cost: three relaxed loads (the
    /// estimate is in the cold part) and a multiply; no `exp` (decay happens on completion).
    ///
    /// Because the decay only runs when a request completes, an endpoint that stopped
    /// receiving traffic after a latency peak would keep that peak forever; an estimate
    /// above the default RTT that is older than the decay time is therefore capped at the
    /// default RTT, so the endpoint gets probed again. Only that case asks `now` for the
    /// time (computed once per pick).
    #[inline]
    pub(crate) fn ewma_cost(&self, now: impl Fn() -> u64, params: EwmaParams) -> f64 {
        let cold = self.cold();
        let mut estimate = f64::from_bits(cold.rtt_bits.load(Ordering::Relaxed));
        if estimate > params.default_rtt {
            let at = cold.rtt_at.load(Ordering::Relaxed);
            if now().saturating_sub(at) >= params.decay_nanos {
                estimate = params.default_rtt;
            }
        }
        let pending = f64::from(self.load()) + 1.0;
        estimate.max(1.0) * pending
    }

    /// Asks the CPU to start loading what a pick reads of this state (the cache line of
    /// its counters). A hint only; on targets other than x86 with SSE it does nothing.
    #[inline(always)]
    pub(crate) fn prefetch(&self) {
        #[cfg(all(
            any(target_arch = "x86", target_arch = "x86_64"),
            target_feature = "sse"
        ))]
        safe_arch::prefetch_t0::<Live>(&self.live);
    }

    /// Counts a request in flight: the returned handle is the count (one RMW).
    #[inline]
    pub(crate) fn begin(&self) -> Arc<Live> {
        Arc::clone(&self.live)
    }

    /// Whether both are the same live state: the same endpoint, in the same
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
        &self.cold.endpoint
    }

    pub(crate) fn shared(&self) -> &Shared {
        &self.cold.shared
    }

    /// Feeds one completed request back (see [`Cold::record`]).
    #[inline]
    pub(crate) fn record(&self, success: bool, latency: Duration, now: u64) -> bool {
        self.cold.record(success, latency, now)
    }
}

impl Cold {
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
    fn a_state_fits_the_64_byte_allocation_class() {
        // With the 16 bytes of `Arc` counts, at most 56 bytes: glibc's allocator adds 8
        // bytes of header and rounds to 16, so anything larger lands 80 or more apart.
        assert!(size_of::<Live>() + 16 <= 56, "{}", size_of::<Live>());
        // The address right after the counts, in the first 48 bytes.
        assert_eq!(offset_of!(Live, addr), 0);
    }

    /// A fresh state for 10.0.0.`last`:8080 in its own balancer's shared part.
    fn fresh_state(last: u8) -> StateHandle {
        let shared = Arc::new(Shared::new(&BalancerConfig::default(), Instant::now()));
        let endpoint = Endpoint::ready(
            SocketAddr::from(([10, 0, 0, last], 8080)),
            crate::ClusterId::new("east").unwrap(),
        );
        StateHandle::new(Arc::new(endpoint), shared)
    }

    #[test]
    fn in_flight_counts_guards_not_handles() {
        let state = fresh_state(1);
        assert_eq!(state.in_flight(), 0);
        // More handles (snapshots sharing the state) do not count.
        let handles: Vec<_> = (0..5).map(|_| state.handle()).collect();
        assert_eq!(state.in_flight(), 0);
        let guards: Vec<_> = (0..3).map(|_| handles[2].begin()).collect();
        // Nor do handles taken from handles.
        let more = (handles[0].clone(), handles[1].handle());
        assert_eq!(state.in_flight(), 3);
        drop(more);
        assert_eq!(state.in_flight(), 3);
        assert!(handles.iter().all(|h| h.in_flight() == 3));
        // Handles going away leave the count to the guards.
        drop(handles);
        assert_eq!(state.in_flight(), 3);
        drop(guards);
        assert_eq!(state.in_flight(), 0);
        // A successor counts on its own; requests on the old state end on the old state.
        let guard = state.begin();
        let next = state.successor(Arc::clone(&state.cold().endpoint));
        assert_eq!((state.in_flight(), next.in_flight()), (1, 0));
        drop(guard);
        assert_eq!(state.in_flight(), 0);
    }

    #[test]
    fn in_flight_is_off_by_at_most_one_while_handles_come_and_go() {
        // One thread clones and drops a handle while this one holds four guards. A read
        // is two loads, and the other thread holds at most one extra handle at a time,
        // so a read is off by at most one; once the other thread is done it is exact.
        let state = fresh_state(2);
        let guards: Vec<_> = (0..4).map(|_| state.begin()).collect();
        std::thread::scope(|s| {
            let churn = state.clone();
            s.spawn(move || {
                for _ in 0..100_000 {
                    drop(churn.clone());
                }
            });
            for _ in 0..100_000 {
                let read = state.in_flight();
                assert!((3..=5).contains(&read), "{read}");
            }
        });
        assert_eq!(state.in_flight(), 4);
        drop(guards);
        assert_eq!(state.in_flight(), 0);
    }
}
