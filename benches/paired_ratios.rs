//! The endpoint-selection ratios, measured paired.
//!
//! `endpoint_selection` (criterion) measures each entry for seconds, one after another, so
//! the ratio of two entries also carries whatever the machine did in between; on a shared
//! VM that is tens of percent. Here the two sides of each ratio alternate in short bursts
//! in one process, each round gives one ratio, and the median and spread over the rounds
//! are reported:
//!
//! - p2c on in-flight load: our pick (plus dropping its guard), the hand-rolled floor and
//!   tower's `p2c::Balance` over `PendingRequests` no-op services, in turn, at each size;
//! - our p2c pick on 10,000 endpoints, quiet bursts alternated with bursts during which
//!   another thread publishes a new 10,000-endpoint snapshot every millisecond.
//!
//! It complements criterion's figures, which remain the reference for absolute costs.
//!
//! Run: `cargo bench --bench paired_ratios`.

mod support;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::{Duration, Instant};

use mcs_core::endpoints::Policy;
use tower::balance::p2c::Balance;
use tower::discover::ServiceList;

use support::{SIZES, balancer, drive, floor_pick, floor_set, one_pick, publish_every_ms};

/// Rounds per comparison; each gives one ratio.
const ROUNDS: usize = 100;
/// Requests per burst in the size comparison. Each side starts its burst with caches the
/// other sides filled; bursts this long (our picks: 1–5 ms; tower's: about 20 ms) make
/// that re-warming a small share of a burst. With 20,000-request bursts our ratio to
/// tower at 1,024 endpoints read 8.6× instead of 10.5×.
const BURST: u64 = 100_000;
/// Picks per burst in the swap comparison: about 8 ms, so a swapping burst spans several
/// publications.
const SWAP_BURST: u64 = 200_000;
/// Rounds in the swap comparison; each gives one ratio.
const SWAP_ROUNDS: usize = 100;

fn main() {
    let base = Instant::now();
    println!(
        "p2c least loaded: ours, the hand-rolled floor and tower `PendingRequests` in turn, \
         {ROUNDS} rounds of {BURST}-request bursts"
    );
    println!(
        "{:>7}  {:>8}  {:>8}  {:>8}  {:>10}  {:>13}",
        "n", "ours", "floor", "tower", "tower/ours", "p10–p90"
    );
    for n in SIZES {
        let b = balancer(Policy::LeastLoaded, n, base);
        let floor = floor_set(n);
        let mut tower = Balance::new(ServiceList::new(support::pending_requests(n)));
        drive(&mut tower, 16); // discover every service
        let now = Instant::now();
        let mut rng = fastrand::Rng::with_seed(n as u64);
        let mut ours = || {
            timed(BURST, || {
                for _ in 0..BURST {
                    one_pick(&b, Policy::LeastLoaded, rng.u64(..), now);
                }
            })
        };
        let mut floor_rng = fastrand::Rng::with_seed(n as u64);
        let mut floor = || {
            timed(BURST, || {
                for _ in 0..BURST {
                    floor_pick(&floor, floor_rng.u64(..));
                }
            })
        };
        let mut tower = || drive(&mut tower, BURST).as_nanos() as f64 / BURST as f64;
        // Warm-up: one round, not counted.
        ours();
        floor();
        tower();
        let mut rows = Vec::with_capacity(ROUNDS);
        for _ in 0..ROUNDS {
            let (o, f, t) = (ours(), floor(), tower());
            rows.push((o, f, t, t / o));
        }
        let ratio = Quantiles::of(rows.iter().map(|r| r.3));
        println!(
            "{n:>7}  {:>5.1} ns  {:>5.1} ns  {:>5.1} ns  {:>9.1}×  {:>5.1}–{:<5.1}×",
            Quantiles::of(rows.iter().map(|r| r.0)).median,
            Quantiles::of(rows.iter().map(|r| r.1)).median,
            Quantiles::of(rows.iter().map(|r| r.2)).median,
            ratio.median,
            ratio.p10,
            ratio.p90,
        );
    }
    swaps(base);
}

/// Quiet bursts alternated with bursts under a publication every millisecond.
fn swaps(base: Instant) {
    let n = 10_000;
    let b = Arc::new(balancer(Policy::LeastLoaded, n, base));
    let active = Arc::new(AtomicBool::new(false));
    let stop = Arc::new(AtomicBool::new(false));
    let swaps = Arc::new(AtomicU64::new(0));
    let writer = {
        let (b, active, stop, swaps) = (
            Arc::clone(&b),
            Arc::clone(&active),
            Arc::clone(&stop),
            Arc::clone(&swaps),
        );
        std::thread::spawn(move || publish_every_ms(&b, n, &active, &stop, &swaps))
    };
    let now = Instant::now();
    let mut rng = fastrand::Rng::with_seed(3);
    let mut burst = |swapping: bool| {
        active.store(swapping, Ordering::Relaxed);
        // Let the writer notice before measuring.
        std::thread::sleep(Duration::from_millis(3));
        timed(SWAP_BURST, || {
            for _ in 0..SWAP_BURST {
                one_pick(&b, Policy::LeastLoaded, rng.u64(..), now);
            }
        })
    };
    // Warm-up: one round, not counted.
    burst(false);
    burst(true);
    let published = swaps.load(Ordering::Relaxed);
    let mut rows = Vec::with_capacity(SWAP_ROUNDS);
    for _ in 0..SWAP_ROUNDS {
        let (quiet, swapping) = (burst(false), burst(true));
        rows.push((quiet, swapping, swapping / quiet));
    }
    stop.store(true, Ordering::Relaxed);
    writer.join().expect("writer thread");
    let published = swaps.load(Ordering::Relaxed) - published;
    let ratio = Quantiles::of(rows.iter().map(|r| r.2));
    println!(
        "\np2c least loaded on {n} endpoints, {SWAP_ROUNDS} rounds of {SWAP_BURST}-pick \
         bursts, quiet then swapping ({published} snapshots published while measuring)"
    );
    println!(
        "quiet {:.1} ns, swapping every ms {:.1} ns: swapping/quiet {:.3} (p10–p90 {:.3}–{:.3})",
        Quantiles::of(rows.iter().map(|r| r.0)).median,
        Quantiles::of(rows.iter().map(|r| r.1)).median,
        ratio.median,
        ratio.p10,
        ratio.p90,
    );
}

/// Nanoseconds per operation of `f`, which runs `ops` operations.
fn timed(ops: u64, f: impl FnOnce()) -> f64 {
    let start = Instant::now();
    f();
    start.elapsed().as_nanos() as f64 / ops as f64
}

/// The median and the 10th and 90th percentiles of a sample.
struct Quantiles {
    p10: f64,
    median: f64,
    p90: f64,
}

impl Quantiles {
    fn of(values: impl Iterator<Item = f64>) -> Self {
        let mut v: Vec<f64> = values.collect();
        v.sort_by(f64::total_cmp);
        let at = |q: f64| v[((v.len() - 1) as f64 * q).round() as usize];
        Self {
            p10: at(0.1),
            median: at(0.5),
            p90: at(0.9),
        }
    }
}
