//! Consistent hashing for `sessionAffinity: ClientIP`: stable while healthy, minimal
//! movement when the set changes, both with rings and with rendezvous hashing.

use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mcs_core::ClusterId;
use mcs_core::discovery::{Endpoint, Update};
use mcs_core::endpoints::{
    Balancer, BalancerConfig, Locality, Outcome, OutlierConfig, PickContext, Tiering,
};
use proptest::prelude::*;

fn ep(i: u16) -> Endpoint {
    Endpoint::ready(
        SocketAddr::from(([10, 9, (i >> 8) as u8, i as u8], 8080)),
        ClusterId::new("east").unwrap(),
    )
}

fn balancer(ring: bool, n: u16, t0: Instant) -> Balancer {
    let b = Balancer::new(
        Locality::cluster(ClusterId::new("east").unwrap()),
        BalancerConfig::default()
            .tiering(Tiering::Flat)
            .session_affinity(ring)
            .outlier(OutlierConfig {
                max_ejection_percent: 100,
                ..OutlierConfig::default()
            }),
        t0,
    );
    b.apply(Update::Reset((0..n).map(ep).collect()));
    b
}

fn owner(b: &Balancer, key: u64, random: u64, now: Instant) -> SocketAddr {
    b.pick(PickContext::new(random, now).with_affinity(key))
        .unwrap()
        .addr()
}

const KEYS: u64 = 4_000;

fn key(k: u64) -> u64 {
    k.wrapping_mul(0xd6e8_feb8_6659_fd93) ^ 0x1234
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(24))]

    /// When one of n endpoints leaves, only the keys it owned move, and they are about
    /// 1/n of all keys.
    #[test]
    fn one_leaving_moves_only_its_keys(ring: bool, n in 2u16..80, gone in any::<prop::sample::Index>()) {
        let t0 = Instant::now();
        let b = balancer(ring, n, t0);
        let before: Vec<SocketAddr> = (0..KEYS).map(|k| owner(&b, key(k), k, t0)).collect();
        let gone = ep(gone.index(usize::from(n)) as u16).addr;
        b.apply(Update::Remove(vec![gone]));
        let mut moved = 0u64;
        for k in 0..KEYS {
            let after = owner(&b, key(k), k ^ 0xfff, t0);
            if after != before[k as usize] {
                prop_assert_eq!(before[k as usize], gone, "a key of a remaining endpoint moved");
                moved += 1;
            }
        }
        let owned = before.iter().filter(|a| **a == gone).count() as u64;
        prop_assert_eq!(moved, owned);
        let fraction = moved as f64 / KEYS as f64;
        // About 1/n: within a generous bound for the ring's uneven arcs.
        prop_assert!(fraction <= 2.5 / f64::from(n) + 0.02, "{} of keys moved with n = {}", fraction, n);
    }

    /// When one endpoint joins, only keys that now map to it move.
    #[test]
    fn one_joining_moves_keys_only_to_it(ring: bool, n in 1u16..60) {
        let t0 = Instant::now();
        let b = balancer(ring, n, t0);
        let before: Vec<SocketAddr> = (0..KEYS).map(|k| owner(&b, key(k), k, t0)).collect();
        b.apply(Update::Add(vec![ep(n)]));
        for k in 0..KEYS {
            let after = owner(&b, key(k), k, t0);
            prop_assert!(after == before[k as usize] || after == ep(n).addr);
        }
    }
}

#[test]
fn same_key_same_endpoint_while_healthy() {
    let t0 = Instant::now();
    for ring in [false, true] {
        let b = balancer(ring, 50, t0);
        let mine = owner(&b, 42, 0, t0);
        for random in 1..200 {
            assert_eq!(
                owner(&b, 42, random, t0),
                mine,
                "the random number plays no part"
            );
        }
        // Unrelated changes keep it.
        b.apply(Update::Add(vec![ep(500)]));
        b.apply(Update::Remove(vec![
            ep(if mine == ep(7).addr { 8 } else { 7 }).addr,
        ]));
        assert_eq!(owner(&b, 42, 5, t0), mine);
        // Keys spread over the endpoints.
        let distinct: std::collections::BTreeSet<_> =
            (0..2_000).map(|k| owner(&b, key(k), 0, t0)).collect();
        assert!(
            distinct.len() > 40,
            "ring {ring}: {} endpoints used",
            distinct.len()
        );
    }
}

#[test]
fn ejected_owner_moves_temporarily() {
    let t0 = Instant::now();
    for ring in [false, true] {
        let b = balancer(ring, 20, t0);
        let before: Vec<SocketAddr> = (0..KEYS).map(|k| owner(&b, key(k), 0, t0)).collect();
        let victim = before[0];
        let snap = b.snapshot();
        let state = snap.find(victim).unwrap();
        for _ in 0..5 {
            state.report(Outcome::Failure, Duration::from_millis(1), t0);
        }
        assert!(state.is_ejected(t0));
        for k in 0..KEYS {
            let now = owner(&b, key(k), 0, t0);
            if before[k as usize] == victim {
                assert_ne!(now, victim);
            } else {
                assert_eq!(
                    now, before[k as usize],
                    "only the ejected endpoint's keys move"
                );
            }
        }
        let back = t0 + Duration::from_secs(30);
        assert_eq!(
            owner(&b, key(0), 0, back),
            victim,
            "and come back after the ejection"
        );
    }
}
