//! Property tests of the merge and of [`ClusterSetState`].
//!
//! - the result does not depend on the order of the constituents (pure merge, state fed by
//!   upserts, full rebuild);
//! - applying the same update twice changes nothing the second time;
//! - an import exists iff at least one export is valid;
//! - no import repeats a port name or a (protocol, port) pair;
//! - every merged port routes to exactly the clusters that expose it and share an IP family
//!   with the import; a cluster with none of the import's families gets no route at all
//!   and is in `IPFamilyConflict`;
//! - every `Conflict` reason matches the CRD's reason pattern;
//! - a [`Change`] reports exactly what differs between the states before and after;
//! - under `Fresh`, the state after any history equals the pure merge of its constituents.

#[path = "merge_common/mod.rs"]
mod common;
#[path = "oracles/merge.rs"]
mod oracle;

use common::{at, id, svc};
use mcs_core::api::{
    ClusterSelector, InternalTrafficPolicy, IpFamily, PropertySelector, Protocol, ServicePort,
    SessionAffinity, StringMap, TrafficDistribution,
};
use mcs_core::conditions::{ConflictReason, ValidReason};
use mcs_core::merge::{
    Change, ClusterSetState, Constituent, MergeOutcome, ServiceFacts, ServiceKind, Stability, merge,
};
use mcs_core::name::ServiceRef;
use oracle::{check_change, check_outcome, dedupe_ports};
use proptest::prelude::*;

const CLUSTERS: [&str; 6] = ["alpha", "bravo", "charlie", "delta", "echo", "foxtrot"];

fn services() -> [ServiceRef; 3] {
    [
        svc(),
        ServiceRef::new("shop", "cart").unwrap(),
        ServiceRef::new("shop", "pay").unwrap(),
    ]
}

fn port_strategy() -> impl Strategy<Value = ServicePort> {
    (
        prop::sample::select(vec!["", "tcp", "udp", "web"]),
        prop::sample::select(vec![None, Some(Protocol::Tcp), Some(Protocol::Udp)]),
        1..=4_i32,
        prop::sample::select(vec![None, Some("h2c")]),
    )
        .prop_map(|(name, protocol, port, app)| ServicePort {
            name: (!name.is_empty()).then(|| name.to_owned()),
            protocol,
            app_protocol: app.map(str::to_owned),
            port,
        })
}

fn facts_strategy() -> impl Strategy<Value = Option<ServiceFacts>> {
    use IpFamily::{IPv4, IPv6};
    let valid = (
        prop::sample::select(vec![ServiceKind::ClusterSetIp, ServiceKind::Headless]),
        prop::collection::vec(port_strategy(), 0..4),
        prop::sample::select(vec![
            None,
            Some(SessionAffinity::ClientIp),
            Some(SessionAffinity::None),
        ]),
        prop::sample::select(vec![None, Some(10), Some(20)]),
        prop::sample::select(vec![
            vec![],
            vec![IPv4],
            vec![IPv6],
            vec![IPv4, IPv6],
            vec![IPv6, IPv4],
        ]),
        prop::sample::select(vec![
            None,
            Some(InternalTrafficPolicy::Cluster),
            Some(InternalTrafficPolicy::Local),
        ]),
        prop::sample::select(vec![
            None,
            Some(TrafficDistribution::PreferClose),
            Some(TrafficDistribution::PreferSameNode),
        ]),
    )
        .prop_map(|(kind, ports, affinity, timeout, families, itp, td)| {
            let mut b = ServiceFacts::builder(kind)
                .ports(dedupe_ports(ports))
                .ip_families(families);
            if let Some(a) = affinity {
                b = b.session_affinity(a);
            }
            if let Some(t) = timeout {
                b = b.session_affinity_config(common::client_ip_timeout(t));
            }
            if let Some(v) = itp {
                b = b.internal_traffic_policy(v);
            }
            if let Some(v) = td {
                b = b.traffic_distribution(v);
            }
            Some(b.build().expect("deduplicated facts are valid"))
        });
    prop_oneof![
        1 => Just(None),
        1 => Just(Some(ServiceFacts::builder(ServiceKind::ExternalName).build().unwrap())),
        8 => valid,
    ]
}

fn map_strategy() -> impl Strategy<Value = StringMap> {
    prop::sample::select(vec![
        vec![],
        vec![("team", "a")],
        vec![("team", "b")],
        vec![("team", "a"), ("tier", "1")],
    ])
    .prop_map(|pairs| common::labels(&pairs))
}

/// KEP-5939 cluster selectors: none (most often), one, two in either order, or an invalid
/// list (an entry without a criterion).
fn selectors_strategy() -> impl Strategy<Value = Vec<ClusterSelector>> {
    let by = |property: &str| ClusterSelector {
        property_selector: Some(PropertySelector {
            match_properties: [(property.to_string(), "@SameAsImporter@".to_string())].into(),
            ..PropertySelector::default()
        }),
    };
    prop_oneof![
        6 => Just(vec![]),
        1 => Just(vec![by("zone")]),
        1 => Just(vec![by("zone"), by("region")]),
        1 => Just(vec![by("region"), by("zone")]),
        1 => Just(vec![by("zone"), ClusterSelector::default()]),
    ]
}

fn constituent_strategy(cluster: usize) -> impl Strategy<Value = Constituent> {
    (
        0..3_i64,
        facts_strategy(),
        map_strategy(),
        map_strategy(),
        selectors_strategy(),
    )
        .prop_map(move |(created, facts, labels, annotations, selectors)| {
            Constituent::new(id(CLUSTERS[cluster]), at(created), facts)
                .with_exported_labels(labels)
                .with_exported_annotations(annotations)
                .with_cluster_selectors(selectors)
        })
}

fn any_constituent() -> impl Strategy<Value = Constituent> {
    (0..CLUSTERS.len()).prop_flat_map(constituent_strategy)
}

/// Up to six constituents from distinct clusters, and the same set shuffled.
fn exports_and_shuffled() -> impl Strategy<Value = (Vec<Constituent>, Vec<Constituent>)> {
    prop::collection::btree_set(0..CLUSTERS.len(), 0..=CLUSTERS.len())
        .prop_flat_map(|clusters| {
            clusters
                .into_iter()
                .map(constituent_strategy)
                .collect::<Vec<_>>()
        })
        .prop_flat_map(|v| (Just(v.clone()), Just(v).prop_shuffle()))
}

#[derive(Clone, Debug)]
enum Op {
    Upsert(usize, Constituent),
    Remove(usize, usize),
    RemoveCluster(usize),
    Refresh(usize),
}

fn op_strategy() -> impl Strategy<Value = Op> {
    prop_oneof![
        6 => (0..3_usize, any_constituent()).prop_map(|(s, c)| Op::Upsert(s, c)),
        2 => (0..3_usize, 0..CLUSTERS.len()).prop_map(|(s, c)| Op::Remove(s, c)),
        1 => (0..CLUSTERS.len()).prop_map(Op::RemoveCluster),
        1 => (0..3_usize).prop_map(Op::Refresh),
    ]
}

fn apply(state: &mut ClusterSetState, op: &Op) -> Vec<Change> {
    let services = services();
    match op {
        Op::Upsert(s, c) => vec![state.upsert(&services[*s], c.clone())],
        Op::Remove(s, c) => vec![state.remove(&services[*s], &id(CLUSTERS[*c]))],
        Op::RemoveCluster(c) => state.remove_cluster(&id(CLUSTERS[*c])),
        Op::Refresh(s) => vec![state.refresh(&services[*s])],
    }
}

proptest! {
    // 256 cases by default; set PROPTEST_CASES for a longer run.

    #[test]
    fn merge_is_independent_of_input_order((exports, shuffled) in exports_and_shuffled()) {
        let s = svc();
        let a = merge(&s, &exports, Stability::Fresh, None).unwrap();
        let b = merge(&s, &shuffled, Stability::Fresh, None).unwrap();
        prop_assert_eq!(&a, &b);
        check_outcome(&s, &exports, &a);
        for stability in [Stability::Fresh, Stability::Sticky] {
            let mut state = ClusterSetState::new(stability);
            for c in &shuffled {
                state.upsert(&s, c.clone());
            }
            prop_assert_eq!(state.outcome(&s), (!exports.is_empty()).then(|| a.clone()));
            let built = ClusterSetState::build(stability, shuffled.iter().map(|c| (s.clone(), c.clone())));
            prop_assert_eq!(built.outcome(&s), (!exports.is_empty()).then(|| a.clone()));
        }
    }

    #[test]
    fn sticky_previous_never_breaks_invariants(
        (first, _) in exports_and_shuffled(),
        (second, _) in exports_and_shuffled(),
    ) {
        let s = svc();
        let previous = merge(&s, &first, Stability::Fresh, None).unwrap();
        let sticky = merge(&s, &second, Stability::Sticky, previous.import.as_ref()).unwrap();
        check_outcome(&s, &second, &sticky);
        let again = merge(&s, &second, Stability::Sticky, sticky.import.as_ref()).unwrap();
        prop_assert_eq!(&again, &sticky, "a sticky merge is a fixed point");
    }

    #[test]
    fn no_cluster_is_routed_across_ip_families(
        (first, _) in exports_and_shuffled(),
        (second, _) in exports_and_shuffled(),
    ) {
        // Fresh, and sticky after another set: a kept import may publish families that no
        // remaining cluster has.
        let s = svc();
        let previous = merge(&s, &first, Stability::Fresh, None).unwrap();
        for outcome in [
            merge(&s, &second, Stability::Fresh, None).unwrap(),
            merge(&s, &second, Stability::Sticky, previous.import.as_ref()).unwrap(),
        ] {
            let Some(import) = &outcome.import else { continue };
            let published = import.spec.ip_families.clone().unwrap_or_default();
            for c in &second {
                let Some(facts) = c.service().filter(|_| c.validity() == ValidReason::Valid) else {
                    continue;
                };
                let own = facts.ip_families();
                let shares = own.is_empty()
                    || published.is_empty()
                    || own.iter().any(|f| published.contains(f));
                let routed: Vec<&ServicePort> = import
                    .routes
                    .iter()
                    .filter(|r| r.clusters.contains(c.cluster()))
                    .map(|r| &r.port)
                    .collect();
                let exposed: Vec<&ServicePort> =
                    import.spec.ports.iter().filter(|p| facts.exposes(p)).collect();
                if shares {
                    prop_assert_eq!(routed, exposed, "{} {:?} under {:?}", c.cluster(), own, published);
                } else {
                    prop_assert!(routed.is_empty(), "{} {:?} routed under {:?}", c.cluster(), own, published);
                    prop_assert!(outcome.conflicts.contains(ConflictReason::IpFamilyConflict));
                }
            }
        }
    }

    #[test]
    fn updates_are_idempotent_report_exact_changes_and_keep_invariants(
        ops in prop::collection::vec(op_strategy(), 1..25),
    ) {
        for stability in [Stability::Fresh, Stability::Sticky] {
            let mut state = ClusterSetState::new(stability);
            for op in &ops {
                let before: Vec<_> = services().iter().map(|s| state.outcome(s)).collect();
                let changes = apply(&mut state, op);
                for change in &changes {
                    let i = services().iter().position(|s| *s == change.service).unwrap();
                    check_change(change, before[i].as_ref(), state.outcome(&change.service).as_ref());
                }
                for (i, s) in services().iter().enumerate() {
                    if !changes.iter().any(|c| c.service == *s) {
                        // Nothing reported: same import, and every remaining export keeps its
                        // conditions (a removed export needs no write).
                        let after = state.outcome(s);
                        let import = |o: &Option<MergeOutcome>| o.as_ref().and_then(|o| o.import.clone());
                        prop_assert_eq!(import(&after), import(&before[i]), "unreported import change");
                        for (c, cond) in after.iter().flat_map(|o| &o.exports) {
                            let old = before[i].as_ref().and_then(|o| o.exports.get(c));
                            prop_assert_eq!(old, Some(cond), "unreported condition change");
                        }
                    }
                }
                let twice = apply(&mut state, op);
                prop_assert!(twice.iter().all(Change::is_empty), "{:?} twice: {:?}", op, twice);

                for s in services() {
                    let exports: Vec<Constituent> = state.exports(&s).cloned().collect();
                    match state.outcome(&s) {
                        None => prop_assert!(exports.is_empty()),
                        Some(outcome) => {
                            prop_assert!(!exports.is_empty(), "no empty entries are kept");
                            check_outcome(&s, &exports, &outcome);
                            if stability == Stability::Fresh {
                                let pure = merge(&s, &exports, Stability::Fresh, None).unwrap();
                                prop_assert_eq!(&outcome, &pure, "history leaked into a fresh state");
                            }
                        }
                    }
                }
            }
        }
    }
}
