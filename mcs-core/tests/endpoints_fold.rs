//! Building snapshots from the update stream: folding equals the last reset plus later
//! deltas, slices arriving in pieces lose nothing, and in-flight counts return to zero.

#[path = "oracles/fold.rs"]
mod oracle;

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use mcs_core::ClusterId;
use mcs_core::discovery::{Endpoint, EndpointTable, Update};
use mcs_core::endpoints::{
    Balancer, BalancerConfig, ClusterPreference, EndpointState, Locality, Outcome, PickContext,
    Picked, StateHandle, Tiering, TrafficDistribution,
};
use oracle::{model, pick_set, snapshot_set};
use proptest::prelude::*;

fn addr(i: u8) -> SocketAddr {
    SocketAddr::from(([10, 3, 0, i], 8080))
}

fn endpoint() -> impl Strategy<Value = Endpoint> {
    (
        0u8..10,
        0u8..3,
        any::<bool>(),
        any::<bool>(),
        any::<bool>(),
        prop::option::of(0u8..2),
    )
        .prop_map(|(i, c, ready, serving, terminating, zone)| Endpoint {
            addr: addr(i),
            cluster: ClusterId::new(format!("c{c}")).unwrap(),
            zone: zone.map(|z| format!("z{z}").into()),
            hostname: None,
            ready,
            serving,
            terminating,
        })
}

fn update() -> impl Strategy<Value = Update> {
    prop_oneof![
        2 => prop::collection::vec(endpoint(), 0..8).prop_map(Update::Reset),
        4 => prop::collection::vec(endpoint(), 0..4).prop_map(Update::Add),
        3 => prop::collection::vec((0u8..10).prop_map(addr), 0..4).prop_map(Update::Remove),
        1 => Just(Update::DoesNotExist),
    ]
}

/// A cluster preference over c0..c2: up to four sets, each any subset (empty ones too).
fn preference() -> impl Strategy<Value = ClusterPreference> {
    prop::collection::vec(
        prop::sample::subsequence(vec!["c0", "c1", "c2"], 0..=3),
        0..4,
    )
    .prop_map(|sets| {
        ClusterPreference::new(
            sets.into_iter()
                .map(|set| set.into_iter().map(|c| ClusterId::new(c).unwrap())),
        )
        .unwrap()
    })
}

fn flat(t0: Instant) -> Balancer {
    Balancer::new(
        Locality::cluster(ClusterId::new("c0").unwrap()),
        BalancerConfig::default().tiering(Tiering::Flat),
        t0,
    )
}

proptest! {
    /// Folding any update sequence equals the last reset plus later deltas, in the table
    /// and in the balancer's snapshot; batching changes nothing.
    #[test]
    fn fold_equals_last_reset_plus_deltas(updates in prop::collection::vec(update(), 0..24)) {
        let (expected, exists) = model(&updates);
        let mut table = EndpointTable::new();
        for u in &updates {
            table.apply(u.clone());
        }
        prop_assert_eq!(table.exists(), exists);
        let folded: BTreeMap<_, _> = table.endpoints().map(|e| (e.addr, e.clone())).collect();
        prop_assert_eq!(&folded, &expected);

        let t0 = Instant::now();
        let one_by_one = flat(t0);
        for u in &updates {
            one_by_one.apply(u.clone());
        }
        prop_assert_eq!(one_by_one.snapshot().exists(), exists);
        prop_assert_eq!(snapshot_set(&one_by_one), pick_set(&expected));

        let batched = flat(t0);
        batched.apply_all(updates.iter().cloned());
        prop_assert_eq!(snapshot_set(&batched), pick_set(&expected));
        prop_assert_eq!(batched.snapshot().exists(), exists);
    }

    /// Adds and removes rebuild only the addresses they touch; that gives the same tiers
    /// as building the final table from scratch, under every tiering rule that moves
    /// endpoints between tiers or in and out of the pick set (local zone and cluster
    /// first, `PreferSameZone`, an eligible-cluster list, a cluster preference, the
    /// serving-terminating fallback), and when the eligible clusters and the preference
    /// change midway.
    #[test]
    fn incremental_builds_equal_full_builds(
        updates in prop::collection::vec(update(), 0..24),
        zone in prop::option::of(0u8..2),
        prefer_same_zone: bool,
        eligible in prop::option::of(prop::sample::subsequence(vec!["c0", "c1", "c2"], 0..=3)),
        change_eligible_at in 0usize..24,
        preference in prop::option::of(preference()),
        change_preference_at in 0usize..24,
    ) {
        let mut locality = Locality::cluster(ClusterId::new("c0").unwrap());
        if let Some(z) = zone {
            locality = locality.in_zone(&format!("z{z}"));
        }
        let mut config = BalancerConfig::default();
        if prefer_same_zone {
            config = config.traffic_distribution(TrafficDistribution::PreferSameZone);
        }
        let t0 = Instant::now();
        let incremental = Balancer::new(locality.clone(), config.clone(), t0);
        let clusters = |names: &Vec<&str>| -> BTreeSet<ClusterId> {
            names.iter().map(|n| ClusterId::new(*n).unwrap()).collect()
        };
        for (i, u) in updates.iter().enumerate() {
            if i == change_eligible_at {
                incremental.set_eligible_clusters(eligible.as_ref().map(clusters));
            }
            if i == change_preference_at {
                incremental.set_cluster_preference(preference.clone());
            }
            incremental.apply(u.clone());
        }
        let eligible = if change_eligible_at < updates.len() {
            eligible.as_ref().map(clusters)
        } else {
            None
        };
        let preference = preference.filter(|_| change_preference_at < updates.len());
        let full = Balancer::new(locality, config, t0);
        full.set_eligible_clusters(eligible);
        full.set_cluster_preference(preference);
        let (expected, exists) = model(&updates);
        if exists.is_some() {
            full.apply(Update::Reset(expected.into_values().collect()));
        }
        let tiers = |b: &Balancer| -> Vec<BTreeMap<SocketAddr, Endpoint>> {
            b.snapshot()
                .tiers()
                .iter()
                .map(|t| t.iter().map(|s| (s.endpoint().addr, s.endpoint().clone())).collect())
                .collect()
        };
        let (a, b) = (incremental.snapshot(), full.snapshot());
        prop_assert_eq!(tiers(&incremental), tiers(&full));
        prop_assert_eq!(a.len(), b.len());
        prop_assert_eq!(a.serving_terminating(), b.serving_terminating());
    }

    /// With a cluster preference, the pick set is the flat pick set of the first set's
    /// endpoints when that set has one that is ready (or serving while terminating), else
    /// of every endpoint: whatever the updates, and after the preference is set, changed or
    /// cleared at any point.
    #[test]
    fn a_preference_uses_the_first_set_with_a_usable_endpoint(
        updates in prop::collection::vec(update(), 0..24),
        preferences in prop::collection::vec((0usize..24, prop::option::of(preference())), 0..3),
    ) {
        let b = flat(Instant::now());
        let mut current = None;
        for (i, u) in updates.iter().enumerate() {
            for (at, p) in &preferences {
                if *at == i {
                    b.set_cluster_preference(p.clone());
                    current = p.clone();
                }
            }
            b.apply(u.clone());
            // Checked after every update, so that the incremental path is checked too.
            let (table, _) = model(&updates[..=i]);
            let usable = |e: &Endpoint| e.ready && !e.terminating || e.serving && e.terminating;
            let chosen = current.as_ref().and_then(|p| {
                p.sets().iter().find_map(|set| {
                    let of_set: BTreeMap<_, _> = table
                        .iter()
                        .filter(|(_, e)| set.contains(&e.cluster))
                        .map(|(a, e)| (*a, e.clone()))
                        .collect();
                    of_set.values().any(usable).then_some(of_set)
                })
            });
            let expected = pick_set(chosen.as_ref().unwrap_or(&table));
            prop_assert_eq!(snapshot_set(&b), expected, "after update {}", i);
        }
    }

    /// EndpointSlices delivered as a reset of the first slice and adds of the others
    /// give the same set as one reset of everything (the kuberesolver #66 lesson).
    #[test]
    fn slices_in_pieces_lose_nothing(n in 1u16..400, cut in prop::collection::vec(1usize..100, 1..8)) {
        let all: Vec<Endpoint> = (0..n)
            .map(|i| Endpoint::ready(
                SocketAddr::from(([10, 4, (i >> 8) as u8, i as u8], 80)),
                ClusterId::new("c0").unwrap(),
            ))
            .collect();
        let t0 = Instant::now();
        let whole = flat(t0);
        whole.apply(Update::Reset(all.clone()));
        let pieces = flat(t0);
        let mut rest = &all[..];
        let mut first = true;
        let mut sizes = cut.iter().cycle();
        while !rest.is_empty() || first {
            let k = (*sizes.next().unwrap()).min(rest.len());
            let (slice, tail) = rest.split_at(k);
            pieces.apply(if first { Update::Reset(slice.to_vec()) } else { Update::Add(slice.to_vec()) });
            first = false;
            rest = tail;
        }
        prop_assert_eq!(snapshot_set(&pieces), snapshot_set(&whole));
        prop_assert_eq!(pieces.snapshot().len(), usize::from(n));
    }
}

#[derive(Clone, Debug)]
enum Op {
    Pick(u64),
    Drop(usize),
    Complete(usize, bool),
    Apply(Update),
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        5 => any::<u64>().prop_map(Op::Pick),
        2 => any::<usize>().prop_map(Op::Drop),
        2 => (any::<usize>(), any::<bool>()).prop_map(|(i, ok)| Op::Complete(i, ok)),
        2 => update().prop_map(Op::Apply),
    ]
}

proptest! {
    /// However picks, completions, cancellations and snapshot swaps interleave, every
    /// endpoint state's in-flight count is back to 0 once every guard is gone, and is
    /// exactly the number of live guards before that.
    #[test]
    fn in_flight_returns_to_zero(ops in prop::collection::vec(op(), 1..80)) {
        let t0 = Instant::now();
        let b = flat(t0);
        b.apply(Update::Reset((0..6).map(|i| Endpoint::ready(addr(i), ClusterId::new("c0").unwrap())).collect()));
        let mut held: Vec<Picked> = Vec::new();
        // Handles kept after their endpoint left: holding them must not count as in flight.
        let mut seen: Vec<StateHandle> = Vec::new();
        let mut now = t0;
        for op in ops {
            now += Duration::from_millis(10);
            match op {
                Op::Pick(r) => {
                    if let Ok(p) = b.pick(PickContext::new(r, now)) {
                        held.push(p);
                    }
                }
                Op::Drop(i) if !held.is_empty() => drop(held.swap_remove(i % held.len())),
                Op::Complete(i, ok) if !held.is_empty() => {
                    let outcome = if ok { Outcome::Success } else { Outcome::Failure };
                    held.swap_remove(i % held.len()).complete(outcome, Duration::from_millis(3), now);
                }
                Op::Apply(u) => {
                    b.apply(u);
                }
                _ => {}
            }
            seen.extend(b.snapshot().tiers().iter().flatten().map(EndpointState::handle));
            let snap = b.snapshot();
            for state in snap.tiers().iter().flatten() {
                let guards = held.iter().filter(|p| p.is_on(state)).count();
                prop_assert_eq!(state.in_flight() as usize, guards);
            }
        }
        drop(held);
        prop_assert!(seen.iter().all(|s| s.in_flight() == 0));
    }
}

#[test]
fn live_state_is_kept_while_in_the_pick_set() {
    let t0 = Instant::now();
    let b = flat(t0);
    let a = Endpoint::ready(addr(1), ClusterId::new("c0").unwrap());
    let other = Endpoint::ready(addr(2), ClusterId::new("c0").unwrap());
    b.apply(Update::Reset(vec![a.clone(), other.clone()]));
    let before = b.snapshot().find(a.addr).unwrap().handle();
    before.report(Outcome::Success, Duration::from_millis(7), t0);
    // Unrelated changes keep the very same state.
    b.apply(Update::Remove(vec![other.addr]));
    b.apply(Update::Add(vec![other]));
    assert!(b.snapshot().find(a.addr).unwrap().same_state(&before));
    // A change of conditions that keeps it in the set carries the measurements over.
    let mut renamed = a.clone();
    renamed.hostname = Some(mcs_core::name::Hostname::new("a").unwrap());
    b.apply(Update::Add(vec![renamed]));
    let carried = b.snapshot().find(a.addr).unwrap().handle();
    assert!(!carried.same_state(&before));
    assert_eq!(carried.rtt_estimate(), Duration::from_millis(7));
    // Leaving the pick set (not ready) and coming back starts afresh.
    let mut not_ready = a.clone();
    not_ready.ready = false;
    b.apply(Update::Add(vec![not_ready]));
    assert!(b.snapshot().find(a.addr).is_none());
    b.apply(Update::Add(vec![a.clone()]));
    assert_eq!(
        b.snapshot().find(a.addr).unwrap().rtt_estimate(),
        Duration::from_millis(30)
    );
}
