//! Retrying a request on another endpoint after a connect failure, bounded by a budget.
//!
//! Retries are off unless [`Builder::retry`](crate::Builder::retry) is given a [`Retry`]
//! policy. A request is retried only when it certainly did not reach the endpoint (the
//! connection could not be made, or hyper reports it was not sent) or, for idempotent
//! methods (RFC 9110 section 9.2.2), when the connection closed before the response head.
//! Each retry goes to a different endpoint when the set has one, and costs one withdrawal
//! from a [retry budget](Retry::budget): by default retries may add 20 % to the request rate,
//! plus 10 retries per second, over a 10 s window (tower's `TpsBudget` and linkerd's
//! defaults).
//!
//! A body is consumed by the first attempt, so a retry needs a copy made before sending:
//! that is what [`ReplayBody`] does. [`CloneBody`] works for bodies that are `Clone`
//! (`http_body_util::Full<Bytes>`, `Empty<Bytes>`, `String`); streaming bodies (such as
//! tonic's) cannot be replayed and are not retried. Copying the request's head (method, URI,
//! headers, extensions) costs one header-map clone per request while retries are on.

use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::time::{Duration, Instant};

/// Makes the body of a retried request.
pub trait ReplayBody<B>: Clone + Send + Sync + 'static {
    /// A copy of `body` to send again, or `None` if it cannot be replayed.
    fn replay(&self, body: &B) -> Option<B>;

    /// Whether this policy ever replays (lets the layer skip copying when it does not).
    fn enabled(&self) -> bool {
        true
    }
}

/// Never retries. The default.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoRetry;

impl<B> ReplayBody<B> for NoRetry {
    fn replay(&self, _body: &B) -> Option<B> {
        None
    }

    fn enabled(&self) -> bool {
        false
    }
}

/// Replays bodies that are `Clone`.
#[derive(Clone, Copy, Debug, Default)]
pub struct CloneBody;

impl<B: Clone> ReplayBody<B> for CloneBody {
    fn replay(&self, body: &B) -> Option<B> {
        Some(body.clone())
    }
}

/// A retry policy: how bodies are replayed, how many retries a request may make, and the
/// budget that bounds retries across all requests.
#[derive(Clone, Debug)]
#[must_use]
pub struct Retry<R> {
    pub(crate) replay: R,
    pub(crate) max_retries: u32,
    pub(crate) idempotent_on_close: bool,
    pub(crate) percent: f64,
    pub(crate) min_per_sec: u32,
    pub(crate) ttl: Duration,
}

impl<R> Retry<R> {
    /// A policy replaying bodies with `replay`: at most 2 retries per request, idempotent
    /// requests retried when the connection closed before the response, and a budget of
    /// 20 % + 10/s over 10 s.
    pub fn new(replay: R) -> Self {
        Self {
            replay,
            max_retries: 2,
            idempotent_on_close: true,
            percent: 0.2,
            min_per_sec: 10,
            ttl: Duration::from_secs(10),
        }
    }

    /// The most retries one request may make (default 2).
    pub fn max_retries(mut self, n: u32) -> Self {
        self.max_retries = n;
        self
    }

    /// Whether idempotent requests (GET, HEAD, OPTIONS, TRACE, PUT, DELETE) are retried when
    /// the connection closed before the response head arrived (default: yes).
    pub fn idempotent_on_close(mut self, yes: bool) -> Self {
        self.idempotent_on_close = yes;
        self
    }

    /// The retry budget: retries may add `percent` (0.0 to 1.0, of requests) plus
    /// `min_per_sec` per second, counted over `ttl` (default 0.2, 10, 10 s).
    pub fn budget(mut self, percent: f64, min_per_sec: u32, ttl: Duration) -> Self {
        self.percent = percent.clamp(0.0, 1.0);
        self.min_per_sec = min_per_sec;
        self.ttl = ttl.max(Duration::from_millis(10));
        self
    }
}

const SLOTS: usize = 10;
const UNIT: i64 = 1000;

/// A shared, lock-free retry budget: a ring of ten time slots over `ttl`.
///
/// Cost: one atomic add on a shared line per request (the deposit); withdrawals read the
/// ten slots. Concurrent updates may be off by a request or two, which a budget tolerates.
#[derive(Debug)]
pub(crate) struct Budget {
    base: Instant,
    slot_nanos: u64,
    deposit: i64,
    reserve: i64,
    slots: [Slot; SLOTS],
}

#[derive(Debug, Default)]
struct Slot {
    epoch: AtomicU64,
    value: AtomicI64,
}

impl Budget {
    pub(crate) fn new(percent: f64, min_per_sec: u32, ttl: Duration, base: Instant) -> Self {
        let slot_nanos = (ttl.as_nanos() / SLOTS as u128).clamp(1, u128::from(u64::MAX)) as u64;
        Self {
            base,
            slot_nanos,
            deposit: (percent * UNIT as f64).round() as i64,
            reserve: i64::from(min_per_sec)
                .saturating_mul(ttl.as_secs().max(1) as i64)
                .saturating_mul(UNIT),
            slots: Default::default(),
        }
    }

    /// Records one request.
    pub(crate) fn deposit(&self, now: Instant) {
        if self.deposit > 0 {
            self.slot(now)
                .value
                .fetch_add(self.deposit, Ordering::Relaxed);
        }
    }

    /// Takes one retry from the budget; `false` if it is exhausted.
    pub(crate) fn withdraw(&self, now: Instant) -> bool {
        let epoch = self.epoch(now);
        let sum: i64 = self
            .slots
            .iter()
            .filter(|s| {
                let e = s.epoch.load(Ordering::Acquire);
                e <= epoch && epoch - e < SLOTS as u64
            })
            .map(|s| s.value.load(Ordering::Relaxed))
            .sum();
        if sum + self.reserve < UNIT {
            return false;
        }
        self.slot(now).value.fetch_sub(UNIT, Ordering::Relaxed);
        true
    }

    fn epoch(&self, now: Instant) -> u64 {
        // +1 so that epoch 0 means "never used".
        (now.saturating_duration_since(self.base).as_nanos() / u128::from(self.slot_nanos)) as u64
            + 1
    }

    fn slot(&self, now: Instant) -> &Slot {
        let epoch = self.epoch(now);
        let slot = &self.slots[(epoch % SLOTS as u64) as usize];
        let seen = slot.epoch.load(Ordering::Acquire);
        if seen != epoch
            && slot
                .epoch
                .compare_exchange(seen, epoch, Ordering::AcqRel, Ordering::Acquire)
                .is_ok()
        {
            slot.value.store(0, Ordering::Relaxed);
        }
        slot
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn budget_allows_reserve_plus_percent() {
        let t0 = Instant::now();
        let b = Budget::new(0.2, 1, Duration::from_secs(10), t0);
        // Reserve: 1/s over 10 s = 10 retries with no traffic.
        let granted = (0..20).filter(|_| b.withdraw(t0)).count();
        assert_eq!(granted, 10);
        // 50 requests earn 10 more.
        for _ in 0..50 {
            b.deposit(t0);
        }
        let granted = (0..20).filter(|_| b.withdraw(t0)).count();
        assert_eq!(granted, 10);
        // After the window passes, the withdrawals expire and the reserve is back.
        let later = t0 + Duration::from_secs(11);
        let granted = (0..20).filter(|_| b.withdraw(later)).count();
        assert_eq!(granted, 10);
    }

    #[test]
    fn zero_budget_refuses() {
        let t0 = Instant::now();
        let b = Budget::new(0.0, 0, Duration::from_secs(10), t0);
        for _ in 0..100 {
            b.deposit(t0);
        }
        assert!(!b.withdraw(t0));
    }
}
