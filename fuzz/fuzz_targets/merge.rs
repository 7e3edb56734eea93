//! The merge engine and `ClusterSetState`, over arbitrary constituents.
//!
//! Input: a few constituents (six clusters, four port numbers, both types, three creation
//! times, small label maps, sometimes a long arbitrary label value) and a history of
//! updates. Nothing panics, and the invariants of `mcs-core/tests/merge_props.rs` hold:
//!
//! - the pure merge does not depend on the order of the constituents, and a state fed by
//!   upserts in any order or built at once equals it, under both stabilities;
//! - an import exists iff at least one export is valid; it repeats no port name or
//!   (protocol, port) pair; every merged port routes to exactly the valid clusters that
//!   expose it and share an IP family with the import; every condition reason matches the
//!   CRD pattern and every message fits;
//! - a sticky merge is a fixed point;
//! - along any history, a `Change` reports exactly what differs, repeating an update
//!   changes nothing, and under `Fresh` the state equals the pure merge of its exports.
//!
//! `ServiceFactsBuilder::build` is checked on the way: it fails exactly on a port outside
//! `1..=65535`, a repeated port name or (protocol, port) pair, or a repeated IP family.
#![no_main]

use std::collections::BTreeSet;

use arbitrary::Arbitrary;
use k8s_openapi::jiff::Timestamp;
use libfuzzer_sys::fuzz_target;
use mcs_core::ClusterId;
use mcs_core::api::{
    ClientIpConfig, InternalTrafficPolicy, IpFamily, Protocol, ServicePort, SessionAffinity,
    SessionAffinityConfig, StringMap, TrafficDistribution,
};
use mcs_core::merge::{
    Change, ClusterSetState, Constituent, MAX_PORT, MergeError, MergeOutcome, ServiceFacts,
    ServiceKind, Stability, merge,
};
use mcs_core::name::ServiceRef;

#[path = "../../mcs-core/tests/oracles/merge.rs"]
mod oracle;
use oracle::{check_change, check_outcome, dedupe_ports};

const CLUSTERS: [&str; 6] = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"];

fn services() -> [ServiceRef; 3] {
    [
        ServiceRef::new("mcs-conformance", "hello").unwrap(),
        ServiceRef::new("shop", "cart").unwrap(),
        ServiceRef::new("shop", "pay").unwrap(),
    ]
}

fn id(i: u8) -> ClusterId {
    ClusterId::new(CLUSTERS[usize::from(i) % CLUSTERS.len()]).unwrap()
}

#[derive(Arbitrary, Debug)]
struct Input {
    first: Vec<ExportIn>,
    second: Vec<ExportIn>,
    /// Picks the order the constituents are fed in.
    order: u64,
    history: Vec<OpIn>,
}

#[derive(Arbitrary, Debug, Clone)]
struct ExportIn {
    cluster: u8,
    created: u8,
    facts: FactsIn,
    labels: MapIn,
    annotations: MapIn,
}

#[derive(Arbitrary, Debug, Clone)]
enum FactsIn {
    NoService,
    ExternalName,
    Valid {
        headless: bool,
        ports: Vec<PortIn>,
        affinity: Option<bool>,
        timeout: Option<u8>,
        families: Vec<bool>,
        itp: Option<bool>,
        td: Option<u8>,
    },
}

#[derive(Arbitrary, Debug, Clone)]
struct PortIn {
    name: u8,
    protocol: u8,
    port: u8,
    app: bool,
}

#[derive(Arbitrary, Debug, Clone)]
enum MapIn {
    Empty,
    Team(bool),
    TeamTier,
    Long(String),
}

#[derive(Arbitrary, Debug, Clone)]
enum OpIn {
    Upsert(u8, ExportIn),
    Remove(u8, u8),
    RemoveCluster(u8),
    Refresh(u8),
}

impl PortIn {
    fn build(&self) -> ServicePort {
        const NAMES: [&str; 4] = ["", "tcp", "udp", "web"];
        // Mostly the few small numbers that make collisions likely, and the edges.
        const NUMBERS: [i32; 8] = [1, 2, 3, 4, 1, 2, 0, MAX_PORT + 1];
        let name = NAMES[usize::from(self.name) % NAMES.len()];
        let port = match self.port {
            255 => MAX_PORT,
            p => NUMBERS[usize::from(p) % NUMBERS.len()],
        };
        ServicePort {
            name: (!name.is_empty()).then(|| name.to_owned()),
            protocol: [
                None,
                Some(Protocol::Tcp),
                Some(Protocol::Udp),
                Some(Protocol::Sctp),
            ][usize::from(self.protocol) % 4],
            app_protocol: self.app.then(|| "h2c".to_owned()),
            port,
        }
    }
}

impl MapIn {
    fn build(&self) -> StringMap {
        let pairs: Vec<(&str, &str)> = match self {
            MapIn::Empty => vec![],
            MapIn::Team(a) => vec![("team", if *a { "a" } else { "b" })],
            MapIn::TeamTier => vec![("team", "a"), ("tier", "1")],
            MapIn::Long(value) => vec![("team", value.as_str())],
        };
        pairs
            .into_iter()
            .map(|(k, v)| (k.to_owned(), v.to_owned()))
            .collect()
    }
}

impl FactsIn {
    fn build(&self) -> Option<ServiceFacts> {
        let FactsIn::Valid {
            headless,
            ports,
            affinity,
            timeout,
            families,
            itp,
            td,
        } = self
        else {
            return match self {
                FactsIn::NoService => None,
                _ => Some(
                    ServiceFacts::builder(ServiceKind::ExternalName)
                        .build()
                        .unwrap(),
                ),
            };
        };
        let kind = if *headless {
            ServiceKind::Headless
        } else {
            ServiceKind::ClusterSetIp
        };
        let ports: Vec<ServicePort> = ports.iter().take(6).map(PortIn::build).collect();
        let families: Vec<IpFamily> = families
            .iter()
            .take(3)
            .map(|v6| if *v6 { IpFamily::IPv6 } else { IpFamily::IPv4 })
            .collect();
        let builder = |ports: Vec<ServicePort>, families: Vec<IpFamily>| {
            let mut b = ServiceFacts::builder(kind)
                .ports(ports)
                .ip_families(families);
            if let Some(a) = affinity {
                b = b.session_affinity(if *a {
                    SessionAffinity::ClientIp
                } else {
                    SessionAffinity::None
                });
            }
            if let Some(t) = timeout {
                b = b.session_affinity_config(SessionAffinityConfig {
                    client_ip: Some(ClientIpConfig {
                        timeout_seconds: Some(i32::from(*t % 3) * 10),
                    }),
                });
            }
            if let Some(local) = itp {
                b = b.internal_traffic_policy(if *local {
                    InternalTrafficPolicy::Local
                } else {
                    InternalTrafficPolicy::Cluster
                });
            }
            if let Some(t) = td {
                b = b.traffic_distribution(
                    TrafficDistribution::ALL[usize::from(*t) % TrafficDistribution::ALL.len()],
                );
            }
            b.build()
        };
        let clean_ports = dedupe_ports(ports.clone());
        let mut clean_families = families.clone();
        let unique_families: BTreeSet<_> = families.iter().collect();
        let should_fail =
            clean_ports.len() != ports.len() || unique_families.len() != families.len();
        let raw = builder(ports, families);
        assert_eq!(raw.is_err(), should_fail, "{raw:?}");
        if let Ok(facts) = &raw {
            for p in facts.ports() {
                assert!(p.protocol.is_some(), "protocol normalised");
            }
        }
        let unique: Vec<IpFamily> = {
            let mut seen = BTreeSet::new();
            clean_families.retain(|f| seen.insert(*f));
            clean_families
        };
        Some(builder(clean_ports, unique).expect("deduplicated facts are valid"))
    }
}

impl ExportIn {
    fn build(&self) -> Constituent {
        Constituent::new(
            id(self.cluster),
            Timestamp::from_second(1_780_000_000 + i64::from(self.created % 3)).unwrap(),
            self.facts.build(),
        )
        .with_exported_labels(self.labels.build())
        .with_exported_annotations(self.annotations.build())
    }
}

/// At most one constituent per cluster (the first), as a cluster exports a service once.
fn distinct(exports: &[ExportIn]) -> Vec<Constituent> {
    let mut seen = BTreeSet::new();
    exports
        .iter()
        .take(8)
        .map(ExportIn::build)
        .filter(|c| seen.insert(c.cluster().clone()))
        .collect()
}

/// A permutation of `v` chosen by `seed`.
fn shuffled<T: Clone>(v: &[T], mut seed: u64) -> Vec<T> {
    let mut out = v.to_vec();
    for i in (1..out.len()).rev() {
        seed = seed
            .wrapping_mul(6_364_136_223_846_793_005)
            .wrapping_add(1_442_695_040_888_963_407);
        let j = (seed >> 33) as usize % (i + 1);
        out.swap(i, j);
    }
    out
}

fuzz_target!(|input: Input| {
    let s = &services()[0];
    let exports = distinct(&input.first);
    let order = shuffled(&exports, input.order);

    // A repeated cluster is a typed error, never a panic.
    if let Some(first) = exports.first() {
        let mut twice = exports.clone();
        twice.push(first.clone());
        assert!(matches!(
            merge(s, &twice, Stability::Fresh, None),
            Err(MergeError::DuplicateCluster { .. })
        ));
    }

    let a = merge(s, &exports, Stability::Fresh, None).unwrap();
    let b = merge(s, &order, Stability::Fresh, None).unwrap();
    assert_eq!(a, b, "merge depends on the order of its input");
    check_outcome(s, &exports, &a);
    for stability in [Stability::Fresh, Stability::Sticky] {
        let mut state = ClusterSetState::new(stability);
        for c in &order {
            state.upsert(s, c.clone());
        }
        assert_eq!(state.outcome(s), (!exports.is_empty()).then(|| a.clone()));
        let built = ClusterSetState::build(stability, order.iter().map(|c| (s.clone(), c.clone())));
        assert_eq!(built.outcome(s), (!exports.is_empty()).then(|| a.clone()));
    }

    // Sticky: whatever the previous import, the outcome keeps the invariants and is a
    // fixed point.
    let second = distinct(&input.second);
    let sticky = merge(s, &second, Stability::Sticky, a.import.as_ref()).unwrap();
    check_outcome(s, &second, &sticky);
    let again = merge(s, &second, Stability::Sticky, sticky.import.as_ref()).unwrap();
    assert_eq!(again, sticky, "a sticky merge is a fixed point");

    history(&input.history);
});

fn history(ops: &[OpIn]) {
    let services = services();
    let apply = |state: &mut ClusterSetState, op: &OpIn| -> Vec<Change> {
        let svc = |i: &u8| &services[usize::from(*i) % services.len()];
        match op {
            OpIn::Upsert(i, c) => vec![state.upsert(svc(i), c.build())],
            OpIn::Remove(i, c) => vec![state.remove(svc(i), &id(*c))],
            OpIn::RemoveCluster(c) => state.remove_cluster(&id(*c)),
            OpIn::Refresh(i) => vec![state.refresh(svc(i))],
        }
    };
    for stability in [Stability::Fresh, Stability::Sticky] {
        let mut state = ClusterSetState::new(stability);
        for op in ops.iter().take(24) {
            let before: Vec<_> = services.iter().map(|s| state.outcome(s)).collect();
            let changes = apply(&mut state, op);
            for change in &changes {
                let i = services
                    .iter()
                    .position(|s| *s == change.service)
                    .expect("a change names a known service");
                check_change(
                    change,
                    before[i].as_ref(),
                    state.outcome(&change.service).as_ref(),
                );
            }
            for (i, s) in services.iter().enumerate() {
                if changes.iter().any(|c| c.service == *s) {
                    continue;
                }
                // Nothing reported: same import, and every remaining export keeps its
                // conditions.
                let after = state.outcome(s);
                let import = |o: &Option<MergeOutcome>| o.as_ref().and_then(|o| o.import.clone());
                assert_eq!(
                    import(&after),
                    import(&before[i]),
                    "unreported import change"
                );
                for (c, cond) in after.iter().flat_map(|o| &o.exports) {
                    let old = before[i].as_ref().and_then(|o| o.exports.get(c));
                    assert_eq!(old, Some(cond), "unreported condition change");
                }
            }
            let twice = apply(&mut state, op);
            assert!(
                twice.iter().all(Change::is_empty),
                "{op:?} twice: {twice:?}"
            );
            for s in &services {
                let exports: Vec<Constituent> = state.exports(s).cloned().collect();
                match state.outcome(s) {
                    None => assert!(exports.is_empty()),
                    Some(outcome) => {
                        assert!(!exports.is_empty(), "no empty entries are kept");
                        check_outcome(s, &exports, &outcome);
                        if stability == Stability::Fresh {
                            let pure = merge(s, &exports, Stability::Fresh, None).unwrap();
                            assert_eq!(outcome, pure, "history leaked into a fresh state");
                        }
                    }
                }
            }
        }
    }
}
