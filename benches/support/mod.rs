//! What the endpoint-selection benches share: endpoint sets, our balancer, tower's
//! balancer over no-op services and the hand-rolled floor.

// Each bench target uses its own subset of these.
#![allow(dead_code)]

use std::convert::Infallible;
use std::future::{Ready, poll_fn, ready};
use std::hint::black_box;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use mcs_core::ClusterId;
use mcs_core::discovery::{Endpoint, Update};
use mcs_core::endpoints::{Balancer, BalancerConfig, Locality, Outcome, PickContext, Policy};
use tower::Service;
use tower::load::{CompleteOnResponse, PeakEwma, PendingRequests};

pub(crate) const SIZES: [usize; 5] = [2, 16, 128, 1_024, 10_000];

pub(crate) fn endpoint(i: usize, cluster: &ClusterId) -> Endpoint {
    let i = u32::try_from(i).expect("bench sizes fit in u32");
    let [_, b, c, d] = i.to_be_bytes();
    Endpoint::ready(SocketAddr::from(([10, b, c, d], 8080)), cluster.clone())
}

pub(crate) fn endpoints(n: usize) -> Vec<Endpoint> {
    let east = ClusterId::new("east").expect("valid cluster id");
    (0..n).map(|i| endpoint(i, &east)).collect()
}

pub(crate) fn balancer(policy: Policy, n: usize, base: Instant) -> Balancer {
    let east = ClusterId::new("east").expect("valid cluster id");
    let b = Balancer::new(
        Locality::cluster(east),
        BalancerConfig::default().policy(policy),
        base,
    );
    b.apply(Update::Reset(endpoints(n)));
    b
}

/// The next of alternating one-endpoint changes: adds `extra` when `add` is set, removes
/// it otherwise, and flips `add`. Applied to a balancer, each publishes a new snapshot.
pub(crate) fn one_change(extra: &Endpoint, add: &mut bool) -> Update {
    let update = if *add {
        Update::Add(vec![extra.clone()])
    } else {
        Update::Remove(vec![extra.addr])
    };
    *add = !*add;
    update
}

/// Until `stop`, while `active`, publishes a new snapshot of `b`'s `n` (or `n + 1`)
/// endpoints every millisecond by adding or removing one, counting them in `swaps`.
pub(crate) fn publish_every_ms(
    b: &Balancer,
    n: usize,
    active: &AtomicBool,
    stop: &AtomicBool,
    swaps: &AtomicU64,
) {
    let extra = endpoint(n, &ClusterId::new("east").expect("valid cluster id"));
    let mut add = true;
    let mut next = Instant::now();
    while !stop.load(Ordering::Relaxed) {
        if active.load(Ordering::Relaxed) {
            b.apply(one_change(&extra, &mut add));
            swaps.fetch_add(1, Ordering::Relaxed);
            next += Duration::from_millis(1);
        } else {
            next = Instant::now() + Duration::from_millis(1);
        }
        if let Some(wait) = next.checked_duration_since(Instant::now()) {
            std::thread::sleep(wait);
        }
    }
}

/// One request through our balancer: pick, then complete (peak-EWMA) or drop.
#[inline]
pub(crate) fn one_pick(b: &Balancer, policy: Policy, random: u64, now: Instant) {
    let picked = b
        .pick(PickContext::new(random, now))
        .expect("endpoints are resolved");
    black_box(picked.addr());
    if policy == Policy::PeakEwma {
        picked.complete(Outcome::Success, Duration::from_micros(800), now);
    }
}

/// `n` no-op services counted by `PendingRequests`, for tower's balancer.
pub(crate) fn pending_requests(n: usize) -> Vec<PendingRequests<Noop>> {
    (0..n)
        .map(|_| PendingRequests::new(Noop, CompleteOnResponse::default()))
        .collect()
}

/// `n` no-op services measured by `PeakEwma` (30 ms default RTT, 10 s decay), for tower's
/// balancer.
pub(crate) fn peak_ewma(n: usize) -> Vec<PeakEwma<Noop>> {
    (0..n)
        .map(|_| {
            PeakEwma::new(
                Noop,
                Duration::from_millis(30),
                Duration::from_secs(10).as_nanos() as f64,
                CompleteOnResponse::default(),
            )
        })
        .collect()
}

/// A service that does nothing, as cheaply as possible.
#[derive(Clone, Copy)]
pub(crate) struct Noop;

impl Service<u32> for Noop {
    type Response = u32;
    type Error = Infallible;
    type Future = Ready<Result<u32, Infallible>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: u32) -> Self::Future {
        ready(Ok(req))
    }
}

/// `iters` requests through a tower balancer inside one `block_on`.
pub(crate) fn drive<S>(svc: &mut S, iters: u64) -> Duration
where
    S: Service<u32, Response = u32>,
    S::Error: std::fmt::Debug,
{
    futures::executor::block_on(async {
        let start = Instant::now();
        for i in 0..iters {
            poll_fn(|cx| svc.poll_ready(cx))
                .await
                .expect("no-op services are always ready");
            let out = svc.call(i as u32).await.expect("no-op never fails");
            black_box(out);
        }
        start.elapsed()
    })
}

/// One endpoint of the hand-rolled floor.
pub(crate) struct FloorEndpoint {
    in_flight: AtomicU32,
    addr: SocketAddr,
}

/// One request through the hand-rolled floor: load the snapshot, p2c on the in-flight
/// counts, count the request in flight, read the address, count it out.
#[inline]
pub(crate) fn floor_pick(set: &ArcSwap<Vec<Arc<FloorEndpoint>>>, random: u64) {
    let set = set.load();
    let n = set.len() as u64;
    let a = (((random & 0xffff_ffff) * n) >> 32) as usize;
    let mut b = (((random >> 32) * (n - 1)) >> 32) as usize;
    if b >= a {
        b += 1;
    }
    let (ea, eb) = (&set[a], &set[b]);
    let load = |e: &FloorEndpoint| e.in_flight.load(Ordering::Relaxed);
    let e = if load(eb) < load(ea) { eb } else { ea };
    e.in_flight.fetch_add(1, Ordering::Relaxed);
    black_box(e.addr);
    e.in_flight.fetch_sub(1, Ordering::Relaxed);
}

/// The hand-rolled floor's endpoint set of `n` endpoints.
pub(crate) fn floor_set(n: usize) -> ArcSwap<Vec<Arc<FloorEndpoint>>> {
    ArcSwap::from_pointee(
        endpoints(n)
            .into_iter()
            .map(|e| {
                Arc::new(FloorEndpoint {
                    in_flight: AtomicU32::new(0),
                    addr: e.addr,
                })
            })
            .collect(),
    )
}
