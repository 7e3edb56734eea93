//! Retrying a request on another endpoint after a connect failure, bounded by a budget.
//!
//! Retries are off unless [`Builder::retry`](crate::Builder::retry) is given a [`Retry`]
//! policy. A request is retried only when it certainly did not reach the endpoint (the
//! connection could not be made, or hyper reports it was not sent) or, for idempotent
//! methods (RFC 9110 section 9.2.2), when the connection closed before the response head.
//! Each retry goes to a different endpoint when the set has one: the first to the balancer's
//! choice (keeping locality), later ones to a tier or a cluster the request has not failed
//! in, so that a cluster whose endpoints all refuse, not ejected yet, cannot take every
//! attempt. Each costs one withdrawal from a [retry budget](Retry::budget): by default
//! retries may add 20 % to the request rate, plus 10 retries per second, over a 10 s window
//! (tower's `TpsBudget` and linkerd's defaults).
//!
//! A body is consumed by the first attempt, so a retry needs a copy made before sending:
//! that is what [`ReplayBody`] does. [`CloneBody`] works for bodies that are `Clone`
//! (`http_body_util::Full<Bytes>`, `Empty<Bytes>`, `String`); [`BufferBody`] for bodies
//! complete in memory when sent, such as unary gRPC requests; streaming bodies are not
//! retried. Copying the request's head (method, URI, headers, extensions) costs one
//! header-map clone per request while retries are on.

use std::collections::VecDeque;
use std::pin::Pin;
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};
use std::task::{Context, Poll, Waker};
use std::time::{Duration, Instant};

use bytes::{Buf, Bytes, BytesMut};
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tower::BoxError;

/// How a retried request gets its body again.
///
/// A body is consumed by the first attempt, so a retry needs a copy made before sending.
/// [`prepare`](ReplayBody::prepare) runs once per request before the first attempt (without
/// waiting: it may read only what the body has ready) and keeps what copies are made from;
/// [`copy`](ReplayBody::copy) makes one per retry.
pub trait ReplayBody<B>: Clone + Send + Sync + 'static {
    /// What a request keeps to make copies of its body.
    type Copies: Send + 'static;

    /// The body for the first attempt, and what copies are made from if the body can be
    /// replayed (`None`: the request is not retried).
    fn prepare(&self, body: B) -> (B, Option<Self::Copies>);

    /// A copy of the body for a retry.
    fn copy(&self, copies: &Self::Copies) -> B;

    /// Whether this policy ever replays (lets the layer skip preparing when it does not).
    fn enabled(&self) -> bool {
        true
    }
}

/// Never retries. The default.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoRetry;

impl<B> ReplayBody<B> for NoRetry {
    type Copies = ();

    fn prepare(&self, body: B) -> (B, Option<()>) {
        (body, None)
    }

    fn copy(&self, _: &()) -> B {
        // Unreachable: `prepare` never keeps copies, so no retry asks for one.
        unreachable!("NoRetry never replays a body")
    }

    fn enabled(&self) -> bool {
        false
    }
}

/// Replays bodies that are `Clone` (`http_body_util::Full<Bytes>`, `Empty<Bytes>`,
/// `String`): one clone per request, one per retry.
#[derive(Clone, Copy, Debug, Default)]
pub struct CloneBody;

impl<B: Clone + Send + 'static> ReplayBody<B> for CloneBody {
    type Copies = B;

    fn prepare(&self, body: B) -> (B, Option<B>) {
        (body.clone(), Some(body))
    }

    fn copy(&self, copies: &B) -> B {
        copies.clone()
    }
}

/// Replays bodies that are complete in memory when the request is sent, up to a size:
/// unary gRPC requests (tonic's body holds the one encoded message), or any body whose
/// frames are all ready at once. The frames are read without waiting; a body that is
/// larger than the limit or not complete yet (a streaming call) is sent as it is, with
/// what was read put back in front, and not retried.
///
/// `rebuild` turns a [`Replay`] back into the body type, e.g. `tonic::body::Body::new` for
/// tonic clients:
///
/// ```no_run
/// # fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use mcs_client::{BufferBody, McsLayer, Replay, Retry, StaticResolver};
/// use mcs_core::{ClusterId, endpoints::Locality};
///
/// let replay = BufferBody::new(64 * 1024, |body: Replay<tonic::body::Body>| {
///     tonic::body::Body::new(body)
/// });
/// let layer = McsLayer::builder(StaticResolver::new(), Locality::cluster(ClusterId::new("north")?))
///     .retry(Retry::new(replay))
///     .build();
/// # Ok(()) }
/// ```
#[derive(Clone, Copy, Debug)]
pub struct BufferBody<F> {
    limit: usize,
    rebuild: F,
}

impl<F> BufferBody<F> {
    /// Buffers bodies of up to `limit` bytes, rebuilt with `rebuild`.
    pub fn new(limit: usize, rebuild: F) -> Self {
        Self { limit, rebuild }
    }
}

impl<B, F> ReplayBody<B> for BufferBody<F>
where
    B: Body + Unpin + Send + 'static,
    B::Error: Into<BoxError>,
    F: Fn(Replay<B>) -> B + Clone + Send + Sync + 'static,
{
    type Copies = (Bytes, Option<HeaderMap>);

    fn prepare(&self, mut body: B) -> (B, Option<Self::Copies>) {
        if body.is_end_stream() {
            return (
                (self.rebuild)(Replay::full(Bytes::new(), None)),
                Some((Bytes::new(), None)),
            );
        }
        if body.size_hint().lower() > self.limit as u64 {
            return (body, None);
        }
        // Read what is ready now; never wait (a streaming body may wait on its caller).
        let mut cx = Context::from_waker(Waker::noop());
        let mut data = BytesMut::new();
        let mut trailers = None;
        let mut frames = VecDeque::new();
        loop {
            match Pin::new(&mut body).poll_frame(&mut cx) {
                Poll::Ready(None) => {
                    let data = data.freeze();
                    let replay = Replay::full(data.clone(), trailers.clone());
                    return ((self.rebuild)(replay), Some((data, trailers)));
                }
                Poll::Ready(Some(Ok(frame))) => match frame.into_data() {
                    Ok(mut chunk) => {
                        let chunk = chunk.copy_to_bytes(chunk.remaining());
                        data.extend_from_slice(&chunk);
                        frames.push_back(Frame::data(chunk));
                        if data.len() > self.limit {
                            break;
                        }
                    }
                    Err(frame) => {
                        if let Ok(t) = frame.into_trailers() {
                            trailers = Some(t.clone());
                            frames.push_back(Frame::trailers(t));
                        }
                    }
                },
                Poll::Ready(Some(Err(e))) => {
                    // The error is the body's to report: send what was read, then it.
                    return ((self.rebuild)(Replay::failed(frames, e.into())), None);
                }
                Poll::Pending => break,
            }
        }
        ((self.rebuild)(Replay::partial(frames, body)), None)
    }

    fn copy(&self, copies: &Self::Copies) -> B {
        (self.rebuild)(Replay::full(copies.0.clone(), copies.1.clone()))
    }
}

/// The body [`BufferBody`] sends: frames read into memory, then (when the body was not
/// complete) the rest of the original body.
#[derive(Debug)]
pub struct Replay<B> {
    frames: VecDeque<Frame<Bytes>>,
    rest: Rest<B>,
}

#[derive(Debug)]
enum Rest<B> {
    None,
    Body(B),
    Failed(Option<BoxError>),
}

impl<B> Replay<B> {
    fn full(data: Bytes, trailers: Option<HeaderMap>) -> Self {
        let mut frames = VecDeque::with_capacity(2);
        if !data.is_empty() {
            frames.push_back(Frame::data(data));
        }
        if let Some(t) = trailers {
            frames.push_back(Frame::trailers(t));
        }
        Self {
            frames,
            rest: Rest::None,
        }
    }

    fn partial(frames: VecDeque<Frame<Bytes>>, rest: B) -> Self {
        Self {
            frames,
            rest: Rest::Body(rest),
        }
    }

    fn failed(frames: VecDeque<Frame<Bytes>>, error: BoxError) -> Self {
        Self {
            frames,
            rest: Rest::Failed(Some(error)),
        }
    }
}

impl<B> Body for Replay<B>
where
    B: Body + Unpin,
    B::Error: Into<BoxError>,
{
    type Data = Bytes;
    type Error = BoxError;

    fn poll_frame(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, BoxError>>> {
        let this = self.get_mut();
        if let Some(frame) = this.frames.pop_front() {
            return Poll::Ready(Some(Ok(frame)));
        }
        match &mut this.rest {
            Rest::None => Poll::Ready(None),
            Rest::Failed(e) => Poll::Ready(e.take().map(Err)),
            Rest::Body(body) => match Pin::new(body).poll_frame(cx) {
                Poll::Ready(Some(Ok(frame))) => Poll::Ready(Some(Ok(
                    frame.map_data(|mut d| d.copy_to_bytes(d.remaining()))
                ))),
                Poll::Ready(Some(Err(e))) => Poll::Ready(Some(Err(e.into()))),
                Poll::Ready(None) => Poll::Ready(None),
                Poll::Pending => Poll::Pending,
            },
        }
    }

    fn is_end_stream(&self) -> bool {
        self.frames.is_empty()
            && match &self.rest {
                Rest::None => true,
                Rest::Failed(e) => e.is_none(),
                Rest::Body(b) => b.is_end_stream(),
            }
    }

    fn size_hint(&self) -> SizeHint {
        let buffered: u64 = self
            .frames
            .iter()
            .filter_map(|f| f.data_ref().map(|d| d.len() as u64))
            .sum();
        match &self.rest {
            Rest::Body(b) => {
                let rest = b.size_hint();
                let mut hint = SizeHint::new();
                hint.set_lower(buffered + rest.lower());
                if let Some(upper) = rest.upper() {
                    hint.set_upper(buffered + upper);
                }
                hint
            }
            _ => SizeHint::with_exact(buffered),
        }
    }
}

/// A retry policy: how bodies are replayed, how many retries a request may make, and the
/// budget that bounds retries across all requests.
///
/// A request no server processed goes again to an untried endpoint whatever its method: the
/// connection could not be made, the connection had ended before taking the request, or an
/// HTTP/2 server refused its stream (REFUSED_STREAM) or left it above its GOAWAY's last
/// stream id. When the connection closed after the request was sent and before the
/// response head, only idempotent methods go again (see [`Retry::idempotent_on_close`]).
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
///
/// Why not `tower::retry::budget::TpsBudget`: it has the same semantics (percent of
/// requests plus a per-second reserve over a TTL of ten slots, and its defaults are ours),
/// but every deposit reads the clock and takes a `Mutex` to roll its generation over, and
/// while retries are on a deposit happens on every request, on every caller's thread. Here
/// the deposit reuses the instant the layer already read for the request and touches one
/// atomic; slots roll over by epoch, without a lock.
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
