//! Tier formation and tier choice: local first, Envoy spill-over arithmetic, panic mode,
//! pinning, explicit preference, eligibility, trafficDistribution, terminating fallback.

use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mcs_core::ClusterId;
use mcs_core::discovery::{Endpoint, Update};
use mcs_core::endpoints::{
    Balancer, BalancerConfig, Locality, Outcome, OutlierConfig, PickContext, PickError, Policy,
    Tiering, TrafficDistribution,
};
use proptest::prelude::*;

fn cluster(name: &str) -> ClusterId {
    ClusterId::new(name).unwrap()
}

fn ep(c: u8, i: u16) -> Endpoint {
    Endpoint::ready(
        SocketAddr::from(([10, c, (i >> 8) as u8, i as u8], 8080)),
        cluster(&format!("c{c}")),
    )
}

/// A deterministic stream of random numbers.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }
}

/// Ejects on the first failure, with no cap below 100 %.
fn eager_outlier() -> OutlierConfig {
    OutlierConfig {
        consecutive_failures: 1,
        max_ejection_percent: 100,
        ..OutlierConfig::default()
    }
}

/// Envoy's priority load, restated from `load_balancer_impl.cc` with exact fractions:
/// `(share, panic)` per tier, `None` when nothing can be picked.
fn envoy(tiers: &[(u32, u32)], op: f64, panic: f64) -> Option<Vec<(f64, bool)>> {
    let pct: Vec<f64> = tiers
        .iter()
        .map(|&(t, h)| {
            if t == 0 {
                0.0
            } else {
                f64::from(h) / f64::from(t)
            }
        })
        .collect();
    let health: Vec<f64> = pct.iter().map(|p| (op * p).min(1.0)).collect();
    let total: f64 = health.iter().sum();
    if total >= 1.0 {
        let mut left = 1.0;
        return Some(
            health
                .iter()
                .map(|h| {
                    let s = h.min(left);
                    left -= s;
                    (s, false)
                })
                .collect(),
        );
    }
    let panics: Vec<bool> = pct.iter().map(|p| *p < panic).collect();
    if panics.iter().all(|p| *p) {
        let all: u32 = tiers.iter().map(|t| t.0).sum();
        if all == 0 {
            return None;
        }
        return Some(
            tiers
                .iter()
                .map(|t| (f64::from(t.0) / f64::from(all), true))
                .collect(),
        );
    }
    if total == 0.0 {
        return None;
    }
    Some(
        health
            .iter()
            .zip(panics)
            .map(|(h, p)| (h / total, p))
            .collect(),
    )
}

/// Builds clusters c0..c(k-1) as preference tiers 0..k-1 of `total` endpoints, ejects
/// the first `ejected` of each, and returns the balancer and the time to pick at.
fn tiered(spec: &[(u16, u16)], config: BalancerConfig) -> (Balancer, Instant) {
    let t0 = Instant::now();
    let order = (0..spec.len()).map(|c| cluster(&format!("c{c}"))).collect();
    let b = Balancer::new(
        Locality::cluster(cluster("c0")),
        config.tiering(Tiering::Preference(order)),
        t0,
    );
    let all = spec
        .iter()
        .enumerate()
        .flat_map(|(c, &(total, _))| (0..total).map(move |i| ep(c as u8, i)))
        .collect();
    b.apply(Update::Reset(all));
    let snap = b.snapshot();
    for (c, &(_, ejected)) in spec.iter().enumerate() {
        for i in 0..ejected {
            let addr = ep(c as u8, i).addr;
            snap.find(addr)
                .unwrap()
                .report(Outcome::Failure, Duration::from_millis(1), t0);
        }
    }
    (b, t0 + Duration::from_secs(1))
}

/// Picks `n` times; returns the share per tier and whether an ejected endpoint was picked
/// from each tier.
fn distribution(b: &Balancer, now: Instant, n: u32, tiers: usize) -> (Vec<f64>, Vec<bool>) {
    let mut rng = Rng(7);
    let mut counts = vec![0u32; tiers];
    let mut ejected = vec![false; tiers];
    let snap = b.snapshot();
    for _ in 0..n {
        let p = b.pick(PickContext::new(rng.next(), now)).unwrap();
        counts[p.tier()] += 1;
        let state = snap.tiers()[p.tier()].iter().find(|s| p.is_on(s));
        ejected[p.tier()] |= state.expect("picked from this set").is_ejected(now);
    }
    (
        counts
            .iter()
            .map(|&c| f64::from(c) / f64::from(n))
            .collect(),
        ejected,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    /// Over many random numbers, each tier's share of picks matches the overprovisioning
    /// arithmetic, and non-panic tiers never yield an ejected endpoint.
    #[test]
    fn tiers_spill_as_envoy_says(
        spec in prop::collection::vec((1u16..12, 0u16..12), 1..4)
            .prop_map(|v| v.into_iter().map(|(t, e)| (t, e.min(t))).collect::<Vec<_>>()),
        op in prop_oneof![Just(1.4), 1.0f64..2.0],
        panic in prop_oneof![Just(0.5), Just(0.0), 0.0f64..1.0],
        policy in prop_oneof![Just(Policy::LeastLoaded), Just(Policy::PeakEwma), Just(Policy::RoundRobin)],
    ) {
        let config = BalancerConfig::default()
            .policy(policy)
            .outlier(eager_outlier())
            .overprovisioning(op)
            .panic_threshold(panic);
        let (b, now) = tiered(&spec, config);
        // The preference list has one more tier for unlisted clusters, always empty here.
        let mut model_in: Vec<(u32, u32)> =
            spec.iter().map(|&(t, e)| (u32::from(t), u32::from(t - e))).collect();
        model_in.push((0, 0));
        let Some(expected) = envoy(&model_in, op, panic) else {
            prop_assert_eq!(b.pick(PickContext::new(1, now)).unwrap_err(), PickError::NoEndpoints);
            return Ok(());
        };
        let (shares, ejected_picked) = distribution(&b, now, 20_000, model_in.len());
        for (i, ((share, panic_mode), got)) in expected.iter().zip(&shares).enumerate() {
            prop_assert!((share - got).abs() < 0.02, "tier {}: expected {}, got {}", i, share, got);
            if !panic_mode {
                prop_assert!(!ejected_picked[i], "tier {} is not in panic but gave an ejected endpoint", i);
            }
            prop_assert!((b.snapshot().tier_share(i) - share).abs() < 1e-6);
        }
    }
}

#[test]
fn worked_examples() {
    // 5 of 10 healthy locally: 1.4 × 0.5 = 0.7 stays, 0.3 spills.
    let (b, now) = tiered(
        &[(10, 5), (10, 0)],
        BalancerConfig::default().outlier(eager_outlier()),
    );
    let (shares, _) = distribution(&b, now, 40_000, 3);
    assert!((shares[0] - 0.7).abs() < 0.01, "{shares:?}");
    assert!((shares[1] - 0.3).abs() < 0.01, "{shares:?}");
    // 8 of 10 healthy: 1.12 → everything stays.
    let (b, now) = tiered(
        &[(10, 2), (10, 0)],
        BalancerConfig::default().outlier(eager_outlier()),
    );
    let (shares, _) = distribution(&b, now, 10_000, 3);
    assert_eq!(shares[0], 1.0);
    // 7 of 10 healthy: 0.98 → 2 % spills.
    let (b, now) = tiered(
        &[(10, 3), (10, 0)],
        BalancerConfig::default().outlier(eager_outlier()),
    );
    let (shares, _) = distribution(&b, now, 40_000, 3);
    assert!((shares[1] - 0.02).abs() < 0.005, "{shares:?}");
}

#[test]
fn panic_mode() {
    // 4 of 10 and 2 of 10 healthy: availability 0.56 + 0.28 < 1 and both below 50 %:
    // total panic, load by endpoint count, ejected endpoints used.
    let (b, now) = tiered(
        &[(10, 6), (10, 8)],
        BalancerConfig::default().outlier(eager_outlier()),
    );
    let (shares, ejected) = distribution(&b, now, 20_000, 3);
    assert!((shares[0] - 0.5).abs() < 0.02 && (shares[1] - 0.5).abs() < 0.02);
    assert!(ejected[0] && ejected[1]);
    assert!(b.snapshot().tier_in_panic(0));

    // One tier, 6 of 10 ejected: panic ignores health.
    let (b, now) = tiered(
        &[(10, 6)],
        BalancerConfig::default().outlier(eager_outlier()),
    );
    let (_, ejected) = distribution(&b, now, 2_000, 2);
    assert!(ejected[0]);
    // Same with panic mode off: only the 4 healthy ones.
    let (b, now) = tiered(
        &[(10, 6)],
        BalancerConfig::default()
            .outlier(eager_outlier())
            .panic_threshold(0.0),
    );
    let (shares, ejected) = distribution(&b, now, 2_000, 2);
    assert_eq!(shares[0], 1.0);
    assert!(!ejected[0]);
    // Everything ejected and panic off: nothing to pick.
    let (b, now) = tiered(
        &[(3, 3)],
        BalancerConfig::default()
            .outlier(eager_outlier())
            .panic_threshold(0.0),
    );
    assert_eq!(
        b.pick(PickContext::new(1, now)).unwrap_err(),
        PickError::NoEndpoints
    );
    // ...and after the ejection ends, everything is back.
    let later = now + Duration::from_secs(30);
    assert!(b.pick(PickContext::new(1, later)).is_ok());
    assert_eq!(b.ejected(), 0);
}

#[test]
fn local_first_zone_then_cluster_then_others() {
    let t0 = Instant::now();
    let here = Locality::cluster(cluster("c0")).in_zone("z1");
    let b = Balancer::new(here, BalancerConfig::default(), t0);
    let zone = ep(0, 1).in_zone("z1");
    let other_zone = ep(0, 2).in_zone("z2");
    let remote_same_zone = ep(1, 1).in_zone("z1");
    b.apply(Update::Reset(vec![
        zone.clone(),
        other_zone.clone(),
        remote_same_zone.clone(),
    ]));
    let snap = b.snapshot();
    assert_eq!(snap.tiers().len(), 3);
    assert_eq!(snap.tiers()[0][0].endpoint(), &zone);
    assert_eq!(snap.tiers()[1][0].endpoint(), &other_zone);
    assert_eq!(snap.tiers()[2][0].endpoint(), &remote_same_zone);
    for r in 0..100 {
        let p = b.pick(PickContext::new(r, t0)).unwrap();
        assert_eq!((p.tier(), p.addr()), (0, zone.addr));
    }
    b.apply(Update::Remove(vec![zone.addr]));
    for r in 0..100 {
        assert_eq!(
            b.pick(PickContext::new(r, t0)).unwrap().addr(),
            other_zone.addr
        );
    }
    b.apply(Update::Remove(vec![other_zone.addr]));
    let p = b.pick(PickContext::new(3, t0)).unwrap();
    assert_eq!((p.tier(), p.addr()), (2, remote_same_zone.addr));
}

#[test]
fn explicit_preference_and_pinning() {
    let t0 = Instant::now();
    let all = vec![ep(0, 1), ep(1, 1), ep(2, 1)];
    let b = Balancer::new(
        Locality::cluster(cluster("c0")),
        BalancerConfig::default().tiering(Tiering::Preference(vec![cluster("c2"), cluster("c1")])),
        t0,
    );
    b.apply(Update::Reset(all.clone()));
    assert_eq!(
        b.pick(PickContext::new(1, t0)).unwrap().addr(),
        ep(2, 1).addr
    );
    b.apply(Update::Remove(vec![ep(2, 1).addr]));
    let p = b.pick(PickContext::new(1, t0)).unwrap();
    assert_eq!((p.tier(), p.addr()), (1, ep(1, 1).addr));
    b.apply(Update::Remove(vec![ep(1, 1).addr]));
    let p = b.pick(PickContext::new(1, t0)).unwrap();
    assert_eq!(
        (p.tier(), p.addr()),
        (2, ep(0, 1).addr),
        "unlisted clusters last"
    );

    let pinned = Balancer::new(
        Locality::cluster(cluster("c0")),
        BalancerConfig::default().tiering(Tiering::Pinned(cluster("c1"))),
        t0,
    );
    pinned.apply(Update::Reset(all));
    for r in 0..50 {
        assert_eq!(
            pinned.pick(PickContext::new(r, t0)).unwrap().addr(),
            ep(1, 1).addr
        );
    }
    pinned.apply(Update::Remove(vec![ep(1, 1).addr]));
    assert_eq!(
        pinned.pick(PickContext::new(1, t0)).unwrap_err(),
        PickError::NoEndpoints,
        "a pinned cluster never spills"
    );
}

#[test]
fn per_port_eligibility() {
    let t0 = Instant::now();
    let b = Balancer::new(
        Locality::cluster(cluster("c0")),
        BalancerConfig::default().eligible_clusters([cluster("c1")]),
        t0,
    );
    b.apply(Update::Reset(vec![ep(0, 1), ep(1, 1)]));
    assert_eq!(b.snapshot().len(), 1);
    for r in 0..50 {
        assert_eq!(
            b.pick(PickContext::new(r, t0)).unwrap().addr(),
            ep(1, 1).addr
        );
    }
    assert!(b.set_eligible_clusters(Some(BTreeSet::from([cluster("c0"), cluster("c1")]))));
    assert!(!b.set_eligible_clusters(Some(BTreeSet::from([cluster("c0"), cluster("c1")]))));
    assert_eq!(b.snapshot().len(), 2);
    assert_eq!(
        b.pick(PickContext::new(1, t0)).unwrap().addr(),
        ep(0, 1).addr,
        "local first again"
    );
    b.set_eligible_clusters(Some(BTreeSet::new()));
    assert_eq!(
        b.pick(PickContext::new(1, t0)).unwrap_err(),
        PickError::NoEndpoints
    );
    b.set_eligible_clusters(None);
    assert_eq!(b.snapshot().len(), 2);
}

#[test]
fn prefer_same_zone_uses_zone_if_any_else_all() {
    let t0 = Instant::now();
    let here = Locality::cluster(cluster("c0")).in_zone("z1");
    let config = BalancerConfig::default()
        .tiering(Tiering::Flat)
        .traffic_distribution(TrafficDistribution::PreferSameZone);
    let b = Balancer::new(here, config, t0);
    let near_remote = ep(1, 1).in_zone("z1");
    let far = ep(0, 2).in_zone("z2");
    b.apply(Update::Reset(vec![near_remote.clone(), far.clone()]));
    assert_eq!(
        b.snapshot().len(),
        1,
        "only the caller's zone, whatever the cluster"
    );
    for r in 0..50 {
        assert_eq!(
            b.pick(PickContext::new(r, t0)).unwrap().addr(),
            near_remote.addr
        );
    }
    b.apply(Update::Remove(vec![near_remote.addr]));
    assert_eq!(
        b.pick(PickContext::new(1, t0)).unwrap().addr(),
        far.addr,
        "no zone endpoint: all"
    );
    assert_eq!(
        TrafficDistribution::from_spec("PreferClose"),
        Some(TrafficDistribution::PreferSameZone)
    );
    assert_eq!(TrafficDistribution::from_spec("PreferSameNode"), None);
}

#[test]
fn not_ready_and_terminating_are_left_out() {
    let t0 = Instant::now();
    let b = Balancer::new(
        Locality::cluster(cluster("c0")),
        BalancerConfig::default(),
        t0,
    );
    let ready = ep(0, 1);
    let mut not_ready = ep(0, 2);
    not_ready.ready = false;
    not_ready.serving = false;
    let mut draining = ep(0, 3);
    draining.ready = false;
    draining.terminating = true;
    let mut ready_but_terminating = ep(0, 4);
    ready_but_terminating.terminating = true;
    b.apply(Update::Reset(vec![
        ready.clone(),
        not_ready.clone(),
        draining.clone(),
        ready_but_terminating,
    ]));
    assert_eq!(b.snapshot().len(), 1);
    assert!(!b.snapshot().serving_terminating());
    for r in 0..50 {
        assert_eq!(b.pick(PickContext::new(r, t0)).unwrap().addr(), ready.addr);
    }
    // No ready endpoint left: serving-but-terminating ones are used (KEP-1669).
    b.apply(Update::Remove(vec![ready.addr]));
    assert!(b.snapshot().serving_terminating());
    let mut rng = Rng(1);
    let picked: BTreeSet<_> = (0..50)
        .map(|_| b.pick(PickContext::new(rng.next(), t0)).unwrap().addr())
        .collect();
    assert!(picked.contains(&draining.addr) && !picked.contains(&not_ready.addr));
    // Nothing serving at all.
    b.apply(Update::Reset(vec![not_ready]));
    assert_eq!(
        b.pick(PickContext::new(1, t0)).unwrap_err(),
        PickError::NoEndpoints
    );
    b.apply(Update::DoesNotExist);
    assert_eq!(
        b.pick(PickContext::new(1, t0)).unwrap_err(),
        PickError::DoesNotExist
    );
}
