//! Pick policies inside a tier: p2c on in-flight load, p2c on peak-EWMA, round robin.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mcs_core::ClusterId;
use mcs_core::discovery::{Endpoint, Update};
use mcs_core::endpoints::{
    Balancer, BalancerConfig, Locality, Outcome, PREFETCH_FROM, PickContext, Picked, Policy,
    Tiering,
};
use proptest::prelude::*;

fn ep(i: u16) -> Endpoint {
    Endpoint::ready(
        SocketAddr::from(([10, 7, (i >> 8) as u8, i as u8], 8080)),
        ClusterId::new("east").unwrap(),
    )
}

fn balancer(policy: Policy, n: u16, t0: Instant) -> Balancer {
    let b = Balancer::new(
        Locality::cluster(ClusterId::new("east").unwrap()),
        BalancerConfig::default()
            .tiering(Tiering::Flat)
            .policy(policy),
        t0,
    );
    b.apply(Update::Reset((0..n).map(ep).collect()));
    b
}

fn mix(mut z: u64) -> u64 {
    z = z.wrapping_add(0x9e37_79b9_7f4a_7c15);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Holds `load` in-flight requests on every endpoint but `idle`.
fn load_all_but(b: &Balancer, idle: SocketAddr, load: u32, t0: Instant) -> Vec<Picked> {
    let mut held = Vec::new();
    let mut r = 0u64;
    let snap = b.snapshot();
    while snap
        .tiers()
        .iter()
        .flatten()
        .any(|s| s.endpoint().addr != idle && s.in_flight() < load)
    {
        r += 1;
        let p = b.pick(PickContext::new(mix(r), t0)).unwrap();
        let in_flight = snap
            .find(p.addr())
            .expect("picked from this set")
            .in_flight();
        if p.addr() == idle || in_flight > load {
            drop(p);
        } else {
            held.push(p);
        }
    }
    held
}

proptest! {
    /// With two endpoints, p2c always compares both, so it always picks the idle one.
    #[test]
    fn p2c_of_two_always_compares_both(random: u64, policy in prop_oneof![Just(Policy::LeastLoaded), Just(Policy::PeakEwma)]) {
        let t0 = Instant::now();
        let b = balancer(policy, 2, t0);
        let _busy = b.pick(PickContext::new(random, t0)).unwrap();
        let busy_addr = _busy.addr();
        for r in 0..16u64 {
            let p = b.pick(PickContext::new(random ^ mix(r), t0)).unwrap();
            prop_assert_ne!(p.addr(), busy_addr);
        }
    }
}

#[test]
fn p2c_picks_two_distinct_candidates() {
    // One idle endpoint among n loaded ones is picked exactly when it is one of the two
    // distinct candidates: probability 2/n.
    let t0 = Instant::now();
    for n in [3u16, 5, 10] {
        let b = balancer(Policy::LeastLoaded, n, t0);
        let idle = ep(0).addr;
        let _held = load_all_but(&b, idle, 1, t0);
        let picks = 30_000u64;
        let hits = (0..picks)
            .filter(|&r| {
                b.pick(PickContext::new(mix(r + 1_000_000), t0))
                    .unwrap()
                    .addr()
                    == idle
            })
            .count() as f64;
        let expected = 2.0 / f64::from(n);
        assert!(
            (hits / picks as f64 - expected).abs() < 0.015,
            "n = {n}: idle picked {} of the time, expected {expected}",
            hits / picks as f64
        );
    }
}

/// Two picks in a row on this thread, with `first` and then `second`; returns the second
/// guard (the first is dropped before it is made).
fn second_of_two(b: &Balancer, first: u64, second: u64, t0: Instant) -> Picked {
    drop(b.pick(PickContext::new(first, t0)).unwrap());
    b.pick(PickContext::new(second, t0)).unwrap()
}

#[test]
fn large_tiers_pick_the_candidates_of_the_threads_previous_random() {
    let t0 = Instant::now();
    let large = u16::try_from(PREFETCH_FROM).unwrap();
    for policy in [Policy::LeastLoaded, Policy::PeakEwma] {
        for n in [large - 1, large, 3 * large] {
            let b = balancer(policy, n, t0);
            // With every endpoint idle a pick takes the first of its two candidates. On a
            // large tier the second of two picks takes the first pick's candidates, so its
            // own random does not matter; below that it does.
            let mut depends_on_second = 0;
            for first in (0..20).map(mix) {
                let picked: Vec<SocketAddr> = (100..104)
                    .map(|second| second_of_two(&b, first, mix(second), t0).addr())
                    .collect();
                let same = picked.iter().all(|&a| a == picked[0]);
                if usize::from(n) >= PREFETCH_FROM {
                    assert!(same, "{policy:?}, n = {n}: {picked:?}");
                } else if !same {
                    depends_on_second += 1;
                }
            }
            if usize::from(n) < PREFETCH_FROM {
                assert_eq!(depends_on_second, 20, "{policy:?}, n = {n}");
            }
        }

        // The candidates come from the previous random, but their loads are read when
        // the pick is made: with the first candidate of `first` busy, every pick drawing
        // from `first` takes the other one.
        let b = balancer(policy, large, t0);
        let first = mix(7);
        let busy = second_of_two(&b, first, mix(8), t0);
        for second in 9..13 {
            let picked = second_of_two(&b, first, mix(second), t0).addr();
            assert_ne!(picked, busy.addr(), "{policy:?}");
            let again = second_of_two(&b, first, mix(second + 100), t0).addr();
            assert_eq!(again, picked, "{policy:?}");
        }
        drop(busy);
        let snap = b.snapshot();
        assert!(snap.tiers()[0].iter().all(|s| s.in_flight() == 0));
    }
}

#[test]
fn least_loaded_evens_out_in_flight() {
    let t0 = Instant::now();
    let b = balancer(Policy::LeastLoaded, 8, t0);
    let held: Vec<Picked> = (0..800)
        .map(|r| b.pick(PickContext::new(mix(r), t0)).unwrap())
        .collect();
    let snap = b.snapshot();
    let loads: Vec<u32> = snap.tiers()[0].iter().map(|s| s.in_flight()).collect();
    let (min, max) = (*loads.iter().min().unwrap(), *loads.iter().max().unwrap());
    assert!(max - min <= 4, "in-flight spread {loads:?}");
    drop(held);
    assert!(snap.tiers()[0].iter().all(|s| s.in_flight() == 0));
}

/// How many of `picks` picks went to each address.
fn pick_counts(b: &Balancer, picks: u64, t0: Instant) -> BTreeMap<SocketAddr, u32> {
    let mut counts = BTreeMap::new();
    for r in 0..picks {
        *counts
            .entry(b.pick(PickContext::new(r, t0)).unwrap().addr())
            .or_insert(0) += 1;
    }
    counts
}

#[test]
fn round_robin_cycles() {
    let t0 = Instant::now();
    let b = balancer(Policy::RoundRobin, 5, t0);
    let counts = pick_counts(&b, 500, t0);
    assert_eq!(counts.len(), 5);
    assert!(counts.values().all(|&c| c == 100), "{counts:?}");
    // Each thread cycles on its own: exact per thread, whatever the other one does.
    std::thread::scope(|s| {
        let picks = [0u64, 1].map(|_| s.spawn(|| pick_counts(&b, 500, t0)));
        for thread in picks {
            let counts = thread.join().unwrap();
            assert_eq!(counts.len(), 5);
            assert!(counts.values().all(|&c| c == 100), "{counts:?}");
        }
    });
    // The tier shrinks under this thread's position: it goes round the smaller one.
    for picks in 0..5 {
        b.apply(Update::Reset((0..5).map(ep).collect()));
        for r in 0..picks {
            b.pick(PickContext::new(r, t0)).unwrap();
        }
        b.apply(Update::Remove(vec![ep(3).addr, ep(4).addr]));
        let counts = pick_counts(&b, 300, t0);
        assert_eq!(counts.len(), 3);
        assert!(counts.values().all(|&c| c == 100), "{counts:?}");
    }
}

#[test]
fn peak_ewma_prefers_the_fast_endpoint() {
    let t0 = Instant::now();
    let b = balancer(Policy::PeakEwma, 2, t0);
    let (fast, slow) = (ep(0).addr, ep(1).addr);
    let snap = b.snapshot();
    let now = t0 + Duration::from_millis(10);
    snap.find(fast)
        .unwrap()
        .report(Outcome::Success, Duration::from_millis(2), now);
    snap.find(slow)
        .unwrap()
        .report(Outcome::Success, Duration::from_millis(200), now);
    assert_eq!(
        snap.find(fast).unwrap().rtt_estimate(),
        Duration::from_millis(2)
    );
    // Cost = rtt × (in-flight + 1): the fast one takes every request until it has 100 in
    // flight (2 ms × 101 > 200 ms × 1), then the slow one takes one, which doubles its
    // cost, so the fast one takes the rest up to 200 in flight.
    let held: Vec<Picked> = (0..150)
        .map(|r| b.pick(PickContext::new(mix(r), now)).unwrap())
        .collect();
    let first_slow = held.iter().position(|p| p.addr() == slow);
    assert_eq!(first_slow, Some(100));
    assert_eq!(held.iter().filter(|p| p.addr() == fast).count(), 149);
}

#[test]
fn peak_ewma_decays_on_completion() {
    let t0 = Instant::now();
    let b = balancer(Policy::PeakEwma, 1, t0);
    let snap = b.snapshot();
    let state = snap.find(ep(0).addr).unwrap();
    assert_eq!(
        state.rtt_estimate(),
        Duration::from_millis(30),
        "linkerd's default"
    );
    let t1 = t0 + Duration::from_secs(1);
    state.report(Outcome::Success, Duration::from_millis(10), t1);
    assert_eq!(
        state.rtt_estimate(),
        Duration::from_millis(10),
        "first sample replaces the seed"
    );
    // A peak replaces the estimate at once.
    state.report(Outcome::Success, Duration::from_millis(100), t1);
    assert_eq!(state.rtt_estimate(), Duration::from_millis(100));
    // A lower sample 10 s (one decay time) later: est·e^-1 + s·(1 - e^-1).
    let t2 = t1 + Duration::from_secs(10);
    let p = b.pick(PickContext::new(1, t2)).unwrap();
    p.complete(Outcome::Success, Duration::from_millis(10), t2);
    let w = (-1.0f64).exp();
    let expected = 100.0 * w + 10.0 * (1.0 - w);
    let got = state.rtt_estimate().as_secs_f64() * 1e3;
    assert!((got - expected).abs() < 0.01, "{got} vs {expected}");
}

#[test]
fn stale_peak_does_not_starve_an_idle_endpoint() {
    let t0 = Instant::now();
    let b = balancer(Policy::PeakEwma, 2, t0);
    let snap = b.snapshot();
    let (a, z) = (ep(0).addr, ep(1).addr);
    snap.find(a)
        .unwrap()
        .report(Outcome::Success, Duration::from_secs(2), t0);
    snap.find(z)
        .unwrap()
        .report(Outcome::Success, Duration::from_millis(40), t0);
    let p = b.pick(PickContext::new(1, t0)).unwrap();
    assert_eq!(p.addr(), z);
    drop(p);
    // Ten seconds without a completion on `a`: its estimate counts as the 30 ms default
    // again, so it gets probed.
    let later = t0 + Duration::from_secs(10);
    let mut t = later;
    for _ in 0..3 {
        t += Duration::from_millis(1);
        snap.find(z)
            .unwrap()
            .report(Outcome::Success, Duration::from_millis(40), t);
    }
    assert_eq!(b.pick(PickContext::new(1, t)).unwrap().addr(), a);
}

#[test]
fn dropping_a_guard_cancels() {
    let t0 = Instant::now();
    let b = balancer(Policy::LeastLoaded, 3, t0);
    let p = b.pick(PickContext::new(5, t0)).unwrap();
    let addr = p.addr();
    assert_eq!(b.snapshot().find(addr).unwrap().in_flight(), 1);
    drop(p);
    let snap = b.snapshot();
    let state = snap.find(addr).unwrap();
    assert_eq!(state.in_flight(), 0);
    assert_eq!(state.consecutive_failures(), 0);
    assert_eq!(
        state.rtt_estimate(),
        Duration::from_millis(30),
        "nothing recorded"
    );
}
