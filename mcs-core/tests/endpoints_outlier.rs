//! Passive outlier detection: consecutive failures, growing ejection times, return after
//! the deadline, and the cap on ejected endpoints.

use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use mcs_core::ClusterId;
use mcs_core::discovery::{Endpoint, Update};
use mcs_core::endpoints::{
    Balancer, BalancerConfig, Locality, Outcome, OutlierConfig, PickContext, Tiering,
};
use proptest::prelude::*;

fn ep(i: u16) -> Endpoint {
    Endpoint::ready(
        SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 8080)),
        ClusterId::new("east").unwrap(),
    )
}

fn balancer(n: u16, outlier: OutlierConfig, t0: Instant) -> Balancer {
    let b = Balancer::new(
        Locality::cluster(ClusterId::new("east").unwrap()),
        BalancerConfig::default()
            .tiering(Tiering::Flat)
            .outlier(outlier),
        t0,
    );
    b.apply(Update::Reset((0..n).map(ep).collect()));
    b
}

fn fail(b: &Balancer, i: u16, times: u32, now: Instant) {
    let snap = b.snapshot();
    let state = snap.find(ep(i).addr).unwrap();
    for _ in 0..times {
        state.report(Outcome::Failure, Duration::from_millis(1), now);
    }
}

fn ejected_at(b: &Balancer, now: Instant) -> usize {
    let counted = b
        .snapshot()
        .tiers()
        .iter()
        .flatten()
        .filter(|s| s.is_ejected(now))
        .count();
    assert_eq!(b.ejected_at(now), counted);
    counted
}

#[test]
fn defaults_are_envoy_and_grpc() {
    let o = OutlierConfig::default();
    assert_eq!(o.consecutive_failures, 5);
    assert_eq!(o.base_ejection, Duration::from_secs(30));
    assert_eq!(o.max_ejection, Duration::from_secs(300));
    assert_eq!(o.max_ejection_percent, 10);
    assert_eq!(o.ejection_cap(100), 10);
    assert_eq!(o.ejection_cap(25), 2);
    assert_eq!(o.ejection_cap(3), 1, "at least one, as Envoy");
    assert_eq!(o.ejection_cap(0), 0);
    assert_eq!(OutlierConfig::disabled().ejection_cap(100), 0);
    assert_eq!(o.ejection_time(1), Duration::from_secs(30));
    assert_eq!(o.ejection_time(3), Duration::from_secs(90));
    assert_eq!(o.ejection_time(50), Duration::from_secs(300));
}

#[test]
fn five_consecutive_failures_eject_and_success_resets() {
    let t0 = Instant::now();
    let b = balancer(20, OutlierConfig::default(), t0);
    fail(&b, 1, 4, t0);
    let snap = b.snapshot();
    let state = snap.find(ep(1).addr).unwrap();
    assert_eq!(state.consecutive_failures(), 4);
    state.report(Outcome::Success, Duration::from_millis(1), t0);
    assert_eq!(state.consecutive_failures(), 0);
    fail(&b, 1, 4, t0);
    assert!(!state.is_ejected(t0));
    assert!(
        state.report(Outcome::Failure, Duration::from_millis(1), t0),
        "the fifth failure reports the ejection"
    );
    assert!(state.is_ejected(t0));
    assert!(
        !state.report(Outcome::Failure, Duration::from_millis(1), t0),
        "failures while ejected eject nothing"
    );
    assert_eq!(state.ejected_until(), Some(t0 + Duration::from_secs(30)));
    assert_eq!(state.ejections(), 1);
    assert_eq!(b.ejected(), 1);
    // Picks avoid it while it is out...
    for r in 0..500 {
        assert_ne!(b.pick(PickContext::new(r, t0)).unwrap().addr(), ep(1).addr);
    }
    // ...and it is back after the deadline; its slot is handed back by the next pick.
    let back = t0 + Duration::from_secs(30);
    assert!(!state.is_ejected(back));
    let _ = b.pick(PickContext::new(0, back)).unwrap();
    assert_eq!(b.ejected(), 0);
    let seen = (0..500u64)
        .map(|r| {
            b.pick(PickContext::new(
                r.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                back,
            ))
            .unwrap()
            .addr()
        })
        .any(|a| a == ep(1).addr);
    assert!(seen, "returned endpoint gets traffic again");
}

#[test]
fn ejection_time_grows_and_is_capped() {
    let t0 = Instant::now();
    let b = balancer(20, OutlierConfig::default(), t0);
    let snap = b.snapshot();
    let state = snap.find(ep(3).addr).unwrap();
    let mut now = t0;
    let mut times = Vec::new();
    for _ in 0..12 {
        fail(&b, 3, 5, now);
        let until = state.ejected_until().unwrap();
        times.push((until - now).as_secs());
        now = until; // fails again right when it returns
    }
    assert_eq!(
        times,
        [30, 60, 90, 120, 150, 180, 210, 240, 270, 300, 300, 300]
    );
    // Failures of requests sent before the ejection do not count while it is out.
    fail(&b, 3, 5, now);
    let until = state.ejected_until().unwrap();
    fail(&b, 3, 50, now + Duration::from_secs(1));
    assert_eq!(state.ejected_until(), Some(until));
}

#[test]
fn multiplier_decays_while_in_service() {
    let t0 = Instant::now();
    let b = balancer(20, OutlierConfig::default(), t0);
    let snap = b.snapshot();
    let state = snap.find(ep(4).addr).unwrap();
    fail(&b, 4, 5, t0);
    let back = state.ejected_until().unwrap();
    fail(&b, 4, 5, back);
    assert_eq!(state.ejections(), 2);
    let back = state.ejected_until().unwrap();
    // 2 × 30 s in service: the multiplier drops by 2, so the next ejection is the first.
    fail(&b, 4, 5, back + Duration::from_secs(60));
    assert_eq!(state.ejections(), 1);
    assert_eq!(state.ejected_until(), Some(back + Duration::from_secs(90)));
}

#[test]
fn cap_is_a_hard_limit() {
    let t0 = Instant::now();
    let b = balancer(30, OutlierConfig::default(), t0);
    assert_eq!(b.ejection_cap(), 3);
    for i in 0..30 {
        fail(&b, i, 5, t0);
    }
    assert_eq!(b.ejected(), 3);
    assert_eq!(ejected_at(&b, t0), 3);
    // A slot frees up when an ejection ends; the next failing endpoint takes it.
    let later = t0 + Duration::from_secs(31);
    let _ = b.pick(PickContext::new(1, later));
    assert_eq!(b.ejected(), 0);
    fail(&b, 29, 5, later);
    assert_eq!(ejected_at(&b, later), 1);
}

#[test]
fn shrinking_the_set_shrinks_the_cap() {
    let t0 = Instant::now();
    let b = balancer(40, OutlierConfig::default(), t0);
    for i in 0..4 {
        fail(&b, i, 5, t0);
    }
    assert_eq!((b.ejected(), b.ejection_cap()), (4, 4));
    // Remove 20 healthy endpoints: cap 2, so two ejections end now.
    b.apply(Update::Remove((20..40).map(|i| ep(i).addr).collect()));
    assert_eq!((b.ejected(), b.ejection_cap()), (2, 2));
    assert_eq!(ejected_at(&b, t0), 2);
    // Removing an ejected endpoint hands its slot back.
    let still: Vec<u16> = (0..4)
        .filter(|&i| b.snapshot().find(ep(i).addr).unwrap().is_ejected(t0))
        .collect();
    b.apply(Update::Remove(vec![ep(still[0]).addr]));
    assert_eq!(b.ejected(), 1);
}

#[test]
fn live_state_survives_snapshot_swaps() {
    let t0 = Instant::now();
    let b = balancer(20, OutlierConfig::default(), t0);
    fail(&b, 5, 5, t0);
    let held = b.pick(PickContext::new(9, t0)).unwrap();
    let held_addr = held.addr();
    b.apply(Update::Add(vec![ep(100)]));
    // A changed endpoint (hostname) at the same address keeps its ejection.
    let mut renamed = ep(5);
    renamed.hostname = Some(mcs_core::name::Hostname::new("web-5").unwrap());
    b.apply(Update::Add(vec![renamed]));
    let snap = b.snapshot();
    let state = snap.find(ep(5).addr).unwrap();
    assert!(state.is_ejected(t0));
    assert_eq!(state.ejections(), 1);
    assert_eq!(b.ejected(), 1);
    assert_eq!(snap.find(held_addr).unwrap().in_flight(), 1);
    drop(held);
    assert_eq!(snap.find(held_addr).unwrap().in_flight(), 0);
}

#[test]
fn disabled_never_ejects() {
    let t0 = Instant::now();
    let b = balancer(20, OutlierConfig::disabled(), t0);
    fail(&b, 1, 100, t0);
    assert_eq!(b.ejected(), 0);
    assert_eq!(ejected_at(&b, t0), 0);
}

#[derive(Clone, Debug)]
enum Op {
    Fail(u16, u32),
    Succeed(u16),
    Pick(u64),
    Advance(u64),
    Shrink(u16),
    Grow(u16),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        4 => (0u16..64, 1u32..8).prop_map(|(i, n)| Op::Fail(i, n)),
        1 => (0u16..64).prop_map(Op::Succeed),
        2 => any::<u64>().prop_map(Op::Pick),
        2 => (0u64..200).prop_map(Op::Advance),
        1 => (1u16..64).prop_map(Op::Shrink),
        1 => (1u16..64).prop_map(Op::Grow),
    ]
}

proptest! {
    /// Whatever fails, when, and however the set changes, the number of ejected
    /// endpoints never exceeds the cap, and the counter agrees with the endpoints.
    #[test]
    fn ejection_never_exceeds_the_cap(
        n in 1u16..64,
        percent in prop_oneof![Just(10u8), 1u8..60],
        ops in prop::collection::vec(op(), 1..120),
    ) {
        let t0 = Instant::now();
        let outlier = OutlierConfig { max_ejection_percent: percent, ..OutlierConfig::default() };
        let b = balancer(n, outlier.clone(), t0);
        let mut now = t0;
        let mut size = n;
        for op in ops {
            match op {
                Op::Fail(i, k) => {
                    if let Some(s) = b.snapshot().find(ep(i % size).addr) {
                        for _ in 0..k {
                            s.report(Outcome::Failure, Duration::from_millis(1), now);
                        }
                    }
                }
                Op::Succeed(i) => {
                    if let Some(s) = b.snapshot().find(ep(i % size).addr) {
                        s.report(Outcome::Success, Duration::from_millis(1), now);
                    }
                }
                Op::Pick(r) => {
                    if let Ok(p) = b.pick(PickContext::new(r, now)) {
                        p.complete(Outcome::Failure, Duration::from_millis(2), now);
                    }
                }
                Op::Advance(s) => now += Duration::from_secs(s),
                Op::Shrink(k) => {
                    let k = k.min(size - 1);
                    b.apply(Update::Remove((size - k..size).map(|i| ep(i).addr).collect()));
                    size -= k;
                }
                Op::Grow(k) => {
                    b.apply(Update::Add((size..size + k).map(ep).collect()));
                    size += k;
                }
            }
            let cap = outlier.ejection_cap(usize::from(size));
            prop_assert_eq!(b.ejection_cap(), cap);
            prop_assert!(b.ejected() <= cap, "{} ejected, cap {}", b.ejected(), cap);
            prop_assert!(ejected_at(&b, now) <= b.ejected());
        }
    }
}

#[test]
fn concurrent_failures_respect_the_cap() {
    let t0 = Instant::now();
    let b = Arc::new(balancer(200, OutlierConfig::default(), t0));
    let stop = Arc::new(AtomicBool::new(false));
    let watcher = {
        let (b, stop) = (Arc::clone(&b), Arc::clone(&stop));
        std::thread::spawn(move || {
            let mut max = 0;
            while !stop.load(Ordering::Relaxed) {
                max = max.max(b.ejected());
            }
            max
        })
    };
    let workers: Vec<_> = (0..2u64)
        .map(|w| {
            let b = Arc::clone(&b);
            std::thread::spawn(move || {
                let mut now = t0;
                for r in 0..200_000u64 {
                    if r % 5_000 == 0 {
                        now += Duration::from_secs(7);
                    }
                    let random = (r * 2 + w).wrapping_mul(0x9e37_79b9_7f4a_7c15);
                    if let Ok(p) = b.pick(PickContext::new(random, now)) {
                        p.complete(Outcome::Failure, Duration::from_millis(1), now);
                    }
                }
            })
        })
        .collect();
    for w in workers {
        w.join().unwrap();
    }
    stop.store(true, Ordering::Relaxed);
    let max = watcher.join().unwrap();
    assert!(max <= 20, "saw {max} ejected with a cap of 20");
    assert!(max > 0, "the test ejected something");
    assert!(b.ejected() <= 20);
}

#[test]
fn moving_tier_starts_afresh_and_frees_the_slot() {
    let t0 = Instant::now();
    let east = ClusterId::new("east").unwrap();
    let b = Balancer::new(
        Locality::cluster(east).in_zone("z1"),
        BalancerConfig::default(),
        t0,
    );
    let here = |i: u16| ep(i).in_zone("z1");
    b.apply(Update::Reset((0..20).map(here).collect()));
    fail(&b, 3, 5, t0);
    assert_eq!(b.ejected(), 1);
    assert_eq!(b.snapshot().find(ep(3).addr).unwrap().ejections(), 1);
    // The same address reported in another zone: another tier, fresh state.
    b.apply(Update::Add(vec![ep(3).in_zone("z2")]));
    let snap = b.snapshot();
    assert_eq!(snap.tiers()[1].len(), 1);
    let moved = snap.find(ep(3).addr).unwrap();
    assert!(!moved.is_ejected(t0));
    assert_eq!(moved.ejections(), 0);
    assert_eq!(b.ejected(), 0);
}
