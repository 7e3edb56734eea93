//! The endpoint-update fold (`EndpointTable`) and the `Balancer` built on it.
//!
//! Input: a balancer configuration (policy, tiering, Envoy knobs including non-finite
//! ones, outlier detection, eligible clusters, zones) and an interleaving of discovery
//! updates (`Reset`, `Add`, `Remove`, `DoesNotExist`), picks, completions, cancellations,
//! eligibility changes and clock steps. As `mcs-core/tests/endpoints_fold.rs` states:
//!
//! - folding any update sequence equals the last reset plus later deltas, in the table and
//!   in a flat balancer's snapshot, one by one or batched;
//! - a snapshot holds only eligible endpoints of the table, in the tier its tiering assigns,
//!   each once, ready ones or else serving-and-terminating ones;
//! - a pick fails exactly as the snapshot says (not resolved, does not exist, empty) and
//!   otherwise returns an endpoint of the tier it names; a pick with an affinity key,
//!   repeated with nothing changed in between, returns the same endpoint;
//! - every in-flight count equals the live guards on that endpoint, and is 0 once they
//!   are gone.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::{Duration, Instant};

use arbitrary::Arbitrary;
use libfuzzer_sys::fuzz_target;
use mcs_core::ClusterId;
use mcs_core::discovery::{Endpoint, EndpointTable, Update};
use mcs_core::endpoints::{
    Balancer, BalancerConfig, EndpointState, Locality, Outcome, OutlierConfig, PickContext,
    PickError, Picked, Policy, StateHandle, Tiering, TrafficDistribution,
};
use mcs_core::name::Hostname;

#[path = "../../mcs-core/tests/oracles/fold.rs"]
mod oracle;
use oracle::{model, pick_set, snapshot_set};

const CLUSTERS: [&str; 3] = ["c0", "c1", "c2"];
const ZONES: [&str; 2] = ["z0", "z1"];

fn cluster(i: u8) -> ClusterId {
    ClusterId::new(CLUSTERS[usize::from(i) % CLUSTERS.len()]).unwrap()
}

fn addr(i: u8) -> SocketAddr {
    let i = i % 12;
    if i < 8 {
        SocketAddr::from(([10, 3, 0, i], 8080))
    } else {
        SocketAddr::from(([0xfd00, 0, 0, 0, 0, 0, 0, u16::from(i)], 8080))
    }
}

#[derive(Arbitrary, Debug)]
struct Input {
    config: ConfigIn,
    ops: Vec<OpIn>,
}

#[derive(Arbitrary, Debug)]
struct ConfigIn {
    policy: u8,
    tiering: TieringIn,
    overprovisioning: f64,
    panic_threshold: f64,
    outlier: Option<(u8, u16, u16, u8)>,
    eligible: Option<Vec<u8>>,
    prefer_same_zone: bool,
    rings: bool,
    cluster: u8,
    zone: Option<u8>,
    default_rtt_ms: u16,
    decay_ms: u16,
}

#[derive(Arbitrary, Debug)]
enum TieringIn {
    LocalFirst,
    Flat,
    Preference(Vec<u8>),
    Pinned(u8),
}

#[derive(Arbitrary, Debug, Clone)]
struct EndpointIn {
    addr: u8,
    cluster: u8,
    zone: Option<u8>,
    hostname: bool,
    ready: bool,
    serving: bool,
    terminating: bool,
}

#[derive(Arbitrary, Debug, Clone)]
enum UpdateIn {
    Reset(Vec<EndpointIn>),
    Add(Vec<EndpointIn>),
    Remove(Vec<u8>),
    DoesNotExist,
}

#[derive(Arbitrary, Debug)]
enum OpIn {
    Apply(UpdateIn),
    Pick {
        random: u64,
        affinity: Option<u64>,
    },
    Complete {
        guard: u8,
        ok: bool,
        latency_ms: u16,
    },
    Cancel(u8),
    Advance(u16),
    SetEligible(Option<Vec<u8>>),
}

impl EndpointIn {
    fn build(&self) -> Endpoint {
        Endpoint {
            addr: addr(self.addr),
            cluster: cluster(self.cluster),
            zone: self
                .zone
                .map(|z| Arc::from(ZONES[usize::from(z) % ZONES.len()])),
            hostname: self
                .hostname
                .then(|| Hostname::new(&format!("h{}", self.addr % 12)).unwrap()),
            ready: self.ready,
            serving: self.serving,
            terminating: self.terminating,
        }
    }
}

impl UpdateIn {
    fn build(&self) -> Update {
        let list = |v: &[EndpointIn]| v.iter().take(16).map(EndpointIn::build).collect();
        match self {
            UpdateIn::Reset(v) => Update::Reset(list(v)),
            UpdateIn::Add(v) => Update::Add(list(v)),
            UpdateIn::Remove(v) => Update::Remove(v.iter().take(16).map(|i| addr(*i)).collect()),
            UpdateIn::DoesNotExist => Update::DoesNotExist,
        }
    }
}

fn clusters(list: &[u8]) -> BTreeSet<ClusterId> {
    list.iter().take(4).map(|c| cluster(*c)).collect()
}

impl ConfigIn {
    fn build(&self) -> (Locality, BalancerConfig) {
        let mut locality = Locality::cluster(cluster(self.cluster));
        if let Some(z) = self.zone {
            locality = locality.in_zone(ZONES[usize::from(z) % ZONES.len()]);
        }
        let policy = [Policy::RoundRobin, Policy::LeastLoaded, Policy::PeakEwma]
            [usize::from(self.policy) % 3];
        let tiering = match &self.tiering {
            TieringIn::LocalFirst => Tiering::LocalFirst,
            TieringIn::Flat => Tiering::Flat,
            TieringIn::Preference(order) => {
                Tiering::Preference(order.iter().take(4).map(|c| cluster(*c)).collect())
            }
            TieringIn::Pinned(c) => Tiering::Pinned(cluster(*c)),
        };
        let mut config = BalancerConfig::default()
            .policy(policy)
            .tiering(tiering)
            .overprovisioning(self.overprovisioning)
            .panic_threshold(self.panic_threshold)
            .default_rtt(Duration::from_millis(u64::from(self.default_rtt_ms)))
            .decay(Duration::from_millis(u64::from(self.decay_ms)))
            .session_affinity(self.rings);
        if let Some((failures, base, max, percent)) = self.outlier {
            config = config.outlier(OutlierConfig {
                consecutive_failures: u32::from(failures % 8),
                base_ejection: Duration::from_millis(u64::from(base)),
                max_ejection: Duration::from_millis(u64::from(max)),
                max_ejection_percent: percent,
            });
        }
        if let Some(list) = &self.eligible {
            config = config.eligible_clusters(clusters(list));
        }
        if self.prefer_same_zone {
            config = config.traffic_distribution(TrafficDistribution::PreferSameZone);
        }
        (locality, config)
    }
}

fn flat(t0: Instant) -> Balancer {
    Balancer::new(
        Locality::cluster(cluster(0)),
        BalancerConfig::default().tiering(Tiering::Flat),
        t0,
    )
}

/// The snapshot agrees with the table, the configuration and the live guards.
fn check_snapshot(
    b: &Balancer,
    table: &BTreeMap<SocketAddr, Endpoint>,
    exists: Option<bool>,
    eligible: Option<&BTreeSet<ClusterId>>,
    held: &[Picked],
) {
    let snap = b.snapshot();
    assert_eq!(snap.exists(), exists);
    let tiering = &b.config().tiering;
    // Before the first update the snapshot is a placeholder without tiers; from then on
    // tier indices are fixed by the tiering.
    let tiers = if exists.is_some() {
        tiering.tier_count()
    } else {
        0
    };
    assert_eq!(snap.tiers().len(), tiers);
    let mut seen = BTreeSet::new();
    let terminating = snap.serving_terminating();
    for (i, tier) in snap.tiers().iter().enumerate() {
        for state in tier {
            let ep = state.endpoint();
            assert!(seen.insert(ep.addr), "{} twice in the snapshot", ep.addr);
            assert_eq!(table.get(&ep.addr), Some(ep), "not in the table");
            assert!(eligible.is_none_or(|set| set.contains(&ep.cluster)));
            assert_eq!(tiering.tier_of(b.locality(), ep), Some(i), "wrong tier");
            if terminating {
                assert!(ep.serving && ep.terminating);
            } else {
                assert!(ep.ready && !ep.terminating);
            }
            let guards = held.iter().filter(|p| p.is_on(state)).count();
            assert_eq!(state.in_flight() as usize, guards, "in-flight count");
        }
    }
    assert_eq!(snap.len(), seen.len());
    assert_eq!(snap.is_empty(), seen.is_empty());
    // Something usable and eligible in the table is never left out entirely.
    let candidates = table
        .values()
        .filter(|e| eligible.is_none_or(|set| set.contains(&e.cluster)))
        .filter(|e| tiering.tier_of(b.locality(), e).is_some())
        .any(|e| (e.ready && !e.terminating) || (e.serving && e.terminating));
    assert_eq!(!snap.is_empty(), candidates, "pick set");
}

fuzz_target!(|input: Input| {
    let t0 = Instant::now();
    let (locality, config) = input.config.build();
    let mut eligible = config.eligible_clusters.clone();
    let balancer = Balancer::new(locality, config, t0);
    let reference = flat(t0);
    let mut table = EndpointTable::new();
    let mut updates: Vec<Update> = Vec::new();
    let mut held: Vec<Picked> = Vec::new();
    let mut seen: Vec<StateHandle> = Vec::new();
    let mut now = t0;

    for op in input.ops.iter().take(64) {
        match op {
            OpIn::Apply(u) => {
                let update = u.build();
                updates.push(update.clone());
                let changed = table.apply(update.clone());
                let b_changed = balancer.apply(update.clone());
                assert_eq!(changed, b_changed, "table and balancer see the same change");
                reference.apply(update);
                let (expected, exists) = model(&updates);
                let folded: BTreeMap<_, _> =
                    table.endpoints().map(|e| (e.addr, e.clone())).collect();
                assert_eq!(folded, expected, "fold != last reset + deltas");
                assert_eq!(table.exists(), exists);
                assert_eq!(table.len(), expected.len());
                assert_eq!(snapshot_set(&reference), pick_set(&expected));
                assert_eq!(reference.snapshot().exists(), exists);
            }
            OpIn::Pick { random, affinity } => {
                let mut ctx = PickContext::new(*random, now);
                if let Some(key) = affinity {
                    ctx = ctx.with_affinity(*key);
                }
                let snap = balancer.snapshot();
                match balancer.pick(ctx) {
                    Ok(p) => {
                        assert_eq!(snap.exists(), Some(true));
                        let tier = &snap.tiers()[p.tier()];
                        assert!(
                            tier.iter().any(|s| p.is_on(s)),
                            "picked endpoint is not in the tier it names"
                        );
                        if affinity.is_some() {
                            let again = balancer.pick(ctx).expect("second affinity pick");
                            assert_eq!(again.addr(), p.addr(), "affinity is not sticky");
                            held.push(again);
                        }
                        held.push(p);
                    }
                    Err(e) => match snap.exists() {
                        None => assert_eq!(e, PickError::NotResolved),
                        Some(false) => assert_eq!(e, PickError::DoesNotExist),
                        Some(true) => assert_eq!(e, PickError::NoEndpoints),
                    },
                }
                seen.extend(snap.tiers().iter().flatten().map(EndpointState::handle));
            }
            OpIn::Complete {
                guard,
                ok,
                latency_ms,
            } if !held.is_empty() => {
                let p = held.swap_remove(usize::from(*guard) % held.len());
                let outcome = if *ok {
                    Outcome::Success
                } else {
                    Outcome::Failure
                };
                p.complete(outcome, Duration::from_millis(u64::from(*latency_ms)), now);
            }
            OpIn::Cancel(guard) if !held.is_empty() => {
                drop(held.swap_remove(usize::from(*guard) % held.len()));
            }
            OpIn::Advance(ms) => now += Duration::from_millis(u64::from(*ms) * 10),
            OpIn::SetEligible(list) => {
                let set = list.as_deref().map(clusters);
                let changed = balancer.set_eligible_clusters(set.clone());
                assert_eq!(changed, set != eligible);
                eligible = set;
                assert_eq!(balancer.eligible_clusters(), eligible);
            }
            OpIn::Complete { .. } | OpIn::Cancel(_) => {}
        }
        let (expected, exists) = model(&updates);
        check_snapshot(&balancer, &expected, exists, eligible.as_ref(), &held);
        let _ = (
            balancer.ejected(),
            balancer.ejected_at(now),
            balancer.ejection_cap(),
        );
        seen.extend(
            balancer
                .snapshot()
                .tiers()
                .iter()
                .flatten()
                .map(EndpointState::handle),
        );
    }

    let batched = flat(t0);
    batched.apply_all(updates.iter().cloned());
    let (expected, exists) = model(&updates);
    assert_eq!(snapshot_set(&batched), pick_set(&expected));
    assert_eq!(batched.snapshot().exists(), exists);

    drop(held);
    assert!(seen.iter().all(|s| s.in_flight() == 0), "in-flight leak");
});
