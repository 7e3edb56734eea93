//! Endpoint selection: our picks against tower's p2c balancer, in one run.
//!
//! Each comparison is measured back to back at each size, so that the entries it compares
//! are taken seconds apart rather than minutes (this VM's speed drifts by tens of percent
//! over minutes):
//!
//! - `p2c_least_loaded/{ours,floor,tower}/<n>`: p2c on in-flight load, for n = 2, 16,
//!   128, 1,024 and 10,000 endpoints.
//!   - `ours`: one pick plus dropping its guard, on one thread.
//!   - `floor`: a hand-rolled minimum, for reference: an `ArcSwap` of `Vec<Arc<Ep>>` with
//!     an `AtomicU32` in-flight count per endpoint, p2c on it, `fetch_add` and
//!     `fetch_sub`. No tiers, health, guard or live state across swaps: the cost of the
//!     memory traffic a least-loaded pick cannot avoid.
//!   - `tower`: tower 0.5 `balance::p2c::Balance` over a `ServiceList` of no-op services
//!     wrapped in `load::PendingRequests`: `poll_ready` + `call` + await, driven by
//!     `futures::executor::block_on` (one `block_on` per batch of iterations, so the
//!     executor is not what is measured).
//! - `p2c_peak_ewma/{ours,tower}/<n>`: p2c on peak-EWMA cost. Ours is a pick plus
//!   `complete` with a latency (where the decay happens); tower's wraps the services in
//!   `load::PeakEwma` (30 ms, 10 s).
//! - `round_robin/ours/<n>`: one pick plus dropping its guard.
//! - `two_threads/<policy>/<n>`: two threads picking from one balancer at once; wall time
//!   per pick per thread.
//! - `swap/...`: a pick on 10,000 endpoints while another thread publishes a new
//!   10,000-endpoint snapshot every millisecond, between the same pick without swaps
//!   measured right before and right after (so drift shows as a gap between those two).
//! - `build/...`: building a 10,000-endpoint snapshot: from a full reset into an empty
//!   balancer, and the rebuild after a one-endpoint change (state carried over).
//!
//! Run (as for the figures in `docs/results.md`; about 10 minutes):
//! `cargo bench --bench endpoint_selection -- --warm-up-time 1 --measurement-time 4`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Instant;

use criterion::measurement::WallTime;
use criterion::{
    BatchSize, BenchmarkGroup, BenchmarkId, Criterion, criterion_group, criterion_main,
};
use mcs_core::ClusterId;
use mcs_core::discovery::Update;
use mcs_core::endpoints::{Balancer, BalancerConfig, Locality, Policy, Tiering};
use tower::Service;
use tower::balance::p2c::Balance;
use tower::discover::ServiceList;

use support::{
    SIZES, balancer, drive, endpoint, endpoints, floor_pick, floor_set, one_change, one_pick,
    publish_every_ms,
};

/// Our pick under `policy` over `n` endpoints, as `ours/<n>` in `group`.
fn bench_ours(group: &mut BenchmarkGroup<'_, WallTime>, policy: Policy, n: usize, base: Instant) {
    let b = balancer(policy, n, base);
    let now = Instant::now();
    let mut rng = fastrand::Rng::with_seed(n as u64);
    group.bench_function(BenchmarkId::new("ours", n), |bench| {
        bench.iter(|| one_pick(&b, policy, rng.u64(..), now));
    });
}

fn least_loaded(c: &mut Criterion) {
    let mut group = c.benchmark_group("p2c_least_loaded");
    let base = Instant::now();
    for n in SIZES {
        bench_ours(&mut group, Policy::LeastLoaded, n, base);
        bench_floor(&mut group, n);
        bench_tower(&mut group, support::pending_requests(n));
    }
    group.finish();
}

fn peak_ewma(c: &mut Criterion) {
    let mut group = c.benchmark_group("p2c_peak_ewma");
    let base = Instant::now();
    for n in SIZES {
        bench_ours(&mut group, Policy::PeakEwma, n, base);
        bench_tower(&mut group, support::peak_ewma(n));
    }
    group.finish();
}

fn round_robin(c: &mut Criterion) {
    let mut group = c.benchmark_group("round_robin");
    let base = Instant::now();
    for n in SIZES {
        bench_ours(&mut group, Policy::RoundRobin, n, base);
    }
    group.finish();
}

/// tower's p2c balancer over `services` (no-op services wrapped in a load measure), as
/// `tower/<n>` in `group`.
fn bench_tower<L>(group: &mut BenchmarkGroup<'_, WallTime>, services: Vec<L>)
where
    L: Service<u32, Response = u32, Error = std::convert::Infallible> + tower::load::Load,
    L::Metric: std::fmt::Debug,
{
    let n = services.len();
    let mut balance = Balance::new(ServiceList::new(services));
    drive(&mut balance, 16); // discover every service
    group.bench_function(BenchmarkId::new("tower", n), |bench| {
        bench.iter_custom(|iters| drive(&mut balance, iters));
    });
}

/// The hand-rolled floor over `n` endpoints, as `floor/<n>` in `group`.
fn bench_floor(group: &mut BenchmarkGroup<'_, WallTime>, n: usize) {
    let set = floor_set(n);
    let mut rng = fastrand::Rng::with_seed(n as u64);
    group.bench_function(BenchmarkId::new("floor", n), |bench| {
        bench.iter(|| floor_pick(&set, rng.u64(..)));
    });
}

fn two_threads(c: &mut Criterion) {
    let mut group = c.benchmark_group("two_threads");
    let base = Instant::now();
    let cases = [
        ("round_robin", Policy::RoundRobin, 16),
        ("p2c_least_loaded", Policy::LeastLoaded, 16),
        ("p2c_least_loaded", Policy::LeastLoaded, 1_024),
        ("p2c_peak_ewma", Policy::PeakEwma, 16),
        ("p2c_peak_ewma", Policy::PeakEwma, 1_024),
    ];
    for (name, policy, n) in cases {
        let b = balancer(policy, n, base);
        let now = Instant::now();
        group.bench_function(BenchmarkId::new(name, n), |bench| {
            bench.iter_custom(|iters| {
                let start = Instant::now();
                std::thread::scope(|s| {
                    for t in 0..2u64 {
                        let b = &b;
                        s.spawn(move || {
                            let mut rng = fastrand::Rng::with_seed(t + 1);
                            for _ in 0..iters {
                                one_pick(b, policy, rng.u64(..), now);
                            }
                        });
                    }
                });
                start.elapsed()
            });
        });
    }
    group.finish();
}

fn swapping(c: &mut Criterion) {
    let mut group = c.benchmark_group("swap");
    let base = Instant::now();
    let n = 10_000;
    let b = Arc::new(balancer(Policy::LeastLoaded, n, base));
    // The writer's handle, taken before `picks` borrows `b` for the rest of the function.
    let writer_b = Arc::clone(&b);
    let now = Instant::now();
    let mut rng = fastrand::Rng::with_seed(3);
    let mut picks = |group: &mut BenchmarkGroup<'_, WallTime>, name: &str| {
        group.bench_function(format!("p2c_least_loaded_10000/{name}"), |bench| {
            bench.iter(|| one_pick(&b, Policy::LeastLoaded, rng.u64(..), now));
        });
    };
    picks(&mut group, "quiet_before");

    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let writer = {
        let (b, stop, swaps) = (writer_b, Arc::clone(&stop), Arc::clone(&swaps));
        let active = AtomicBool::new(true);
        std::thread::spawn(move || publish_every_ms(&b, n, &active, &stop, &swaps))
    };
    let started = Instant::now();
    picks(&mut group, "swapping_every_ms");
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer thread");
    let elapsed = started.elapsed().as_secs_f64();
    picks(&mut group, "quiet_after");
    let swaps = swaps.load(Ordering::Relaxed);
    println!(
        "swap: {swaps} snapshots of {n} endpoints published in {elapsed:.1} s ({:.0}/s)",
        swaps as f64 / elapsed
    );
    group.finish();
}

fn building(c: &mut Criterion) {
    let mut group = c.benchmark_group("build");
    let base = Instant::now();
    let n = 10_000;
    let all = endpoints(n);
    let east = ClusterId::new("east").expect("valid cluster id");
    group.bench_function("reset_10000_into_empty", |bench| {
        bench.iter_batched(
            || {
                let b = Balancer::new(
                    Locality::cluster(east.clone()),
                    BalancerConfig::default(),
                    base,
                );
                (b, all.clone())
            },
            |(b, list)| {
                b.apply(Update::Reset(list));
                b
            },
            BatchSize::LargeInput,
        );
    });
    group.bench_function("reset_10000_into_empty_with_rings", |bench| {
        bench.iter_batched(
            || {
                let config = BalancerConfig::default()
                    .tiering(Tiering::Flat)
                    .session_affinity(true);
                (
                    Balancer::new(Locality::cluster(east.clone()), config, base),
                    all.clone(),
                )
            },
            |(b, list)| {
                b.apply(Update::Reset(list));
                b
            },
            BatchSize::LargeInput,
        );
    });
    let b = balancer(Policy::LeastLoaded, n, base);
    let extra = endpoint(n, &east);
    let mut add = true;
    group.bench_function("rebuild_10000_after_one_change", |bench| {
        bench.iter_batched(
            || one_change(&extra, &mut add),
            |update| b.apply(update),
            BatchSize::SmallInput,
        );
    });
    group.finish();
}

criterion_group!(
    benches,
    least_loaded,
    peak_ewma,
    round_robin,
    two_threads,
    swapping,
    building
);
criterion_main!(benches);
