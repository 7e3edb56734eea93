//! The invariants of a merge outcome and of the `Change` between two outcomes, shared by
//! the property tests (`merge_props.rs`) and the `merge` fuzz target
//! (`fuzz/fuzz_targets/merge.rs`, through `#[path]`). They panic on a violation: proptest
//! shrinks a panicking case like a failed assertion, and libFuzzer reports it as a crash.
//!
//! What they prove, and what they do not: the shape of an outcome is checked against rules
//! written here, apart from the engine (an import exactly when some export is valid, listing
//! exactly the valid clusters; no repeated port name or protocol-port pair; each port routed
//! to exactly the clusters that expose it and share an IP family with the import; the same
//! Conflict condition on every valid export; a `Change` that is exactly the difference of
//! two outcomes). Some answers are taken from the crate under test: whether an export is
//! valid (`Constituent::validity`), whether a Service exposes a port
//! (`ServiceFacts::exposes`), its families, and the Conflict reason's text. Where they are,
//! these checks prove that the engine agrees with itself, not that it is right; which export
//! is valid, which port a Service exposes, who wins and what the import holds are pinned by
//! expectations written by hand from the KEP in `merge_table.rs` and `merge_conformance.rs`
//! (the upstream conformance cases).

use std::collections::{BTreeMap, BTreeSet};

use mcs_core::api::{IpFamily, ServicePort};
use mcs_core::conditions::{ConditionStatus, ConflictReason, ValidReason, is_valid_reason};
use mcs_core::merge::{
    Change, Constituent, ImportChange, MAX_MESSAGE_LEN, MAX_PORT, MergeOutcome, ServiceFacts,
};
use mcs_core::name::ServiceRef;

/// A Service's ports as the API server would accept them: the first port of every name
/// and of every (protocol, port) pair, numbers in range.
pub(crate) fn dedupe_ports(ports: Vec<ServicePort>) -> Vec<ServicePort> {
    let mut names = BTreeSet::new();
    let mut pairs = BTreeSet::new();
    ports
        .into_iter()
        .filter(|p| {
            let name = p.name.clone().unwrap_or_default();
            let pair = (p.protocol_or_default(), p.port);
            (1..=MAX_PORT).contains(&p.port)
                && !names.contains(&name)
                && !pairs.contains(&pair)
                && names.insert(name)
                && pairs.insert(pair)
        })
        .collect()
}

/// Every invariant of one service's outcome, given its constituents.
pub(crate) fn check_outcome(service: &ServiceRef, exports: &[Constituent], outcome: &MergeOutcome) {
    let valid: BTreeMap<_, _> = exports
        .iter()
        .filter(|c| c.validity() == ValidReason::Valid)
        .map(|c| (c.cluster().clone(), c))
        .collect();
    assert_eq!(
        outcome.import.is_some(),
        !valid.is_empty(),
        "import iff a valid export"
    );
    assert_eq!(outcome.exports.len(), exports.len());
    let shared = valid
        .keys()
        .next()
        .map(|c| outcome.exports[c].conflict.clone());
    for (cluster, conditions) in &outcome.exports {
        assert!(
            is_valid_reason(&conditions.conflict.reason),
            "{}",
            conditions.conflict.reason
        );
        assert!(is_valid_reason(&conditions.valid.reason));
        assert!(conditions.conflict.message.len() <= MAX_MESSAGE_LEN);
        assert!(conditions.valid.message.len() <= MAX_MESSAGE_LEN);
        if valid.contains_key(cluster) {
            assert_eq!(conditions.valid.status, ConditionStatus::True);
            assert_eq!(
                Some(&conditions.conflict),
                shared.as_ref(),
                "same Conflict everywhere"
            );
            assert_eq!(conditions.conflict.status, outcome.conflicts.status());
            assert_eq!(conditions.conflict.reason, outcome.conflicts.to_string());
        } else {
            assert_eq!(conditions.valid.status, ConditionStatus::False);
            assert_eq!(conditions.conflict.reason, "NoConflicts");
        }
    }
    let Some(import) = &outcome.import else {
        return;
    };
    assert_eq!(import.spec.ips, None);
    assert_eq!(
        import.clusters.iter().collect::<Vec<_>>(),
        valid.keys().collect::<Vec<_>>()
    );
    let mut names = BTreeSet::new();
    let mut pairs = BTreeSet::new();
    for p in &import.spec.ports {
        assert!(
            names.insert(p.name.clone().unwrap_or_default()),
            "repeated name in {:?}",
            import.spec.ports
        );
        assert!(
            pairs.insert((p.protocol_or_default(), p.port)),
            "repeated pair in {:?}",
            import.spec.ports
        );
        assert!(p.protocol.is_some(), "protocol normalised");
    }
    if let Some(families) = &import.spec.ip_families {
        assert_eq!(
            families.iter().collect::<BTreeSet<_>>().len(),
            families.len()
        );
    }
    // Routing: a cluster gets a port's traffic iff its Service exposes the port and it can
    // be reached over a family the import publishes (either side stating none counts).
    let published: Vec<IpFamily> = import.spec.ip_families.clone().unwrap_or_default();
    let reachable = |f: &ServiceFacts| {
        let own = f.ip_families();
        own.is_empty() || published.is_empty() || own.iter().any(|x| published.contains(x))
    };
    for family in [IpFamily::IPv4, IpFamily::IPv6] {
        assert_eq!(
            import.admits_family(family),
            published.is_empty() || published.contains(&family),
            "{family:?} admitted under {published:?}"
        );
    }
    assert_eq!(import.routes.len(), import.spec.ports.len());
    for (route, p) in import.routes.iter().zip(&import.spec.ports) {
        assert_eq!(&route.port, p);
        assert_eq!(import.clusters_for(p), &route.clusters[..]);
        let exposers: Vec<(&Constituent, &ServiceFacts)> = valid
            .values()
            .filter_map(|c| c.service().map(|f| (*c, f)))
            .filter(|(_, f)| f.exposes(p))
            .collect();
        assert!(!exposers.is_empty(), "port {p:?} is exposed by no cluster");
        let routed: Vec<_> = exposers
            .iter()
            .filter(|(_, f)| reachable(f))
            .map(|(c, _)| c.cluster().clone())
            .collect();
        assert_eq!(
            route.clusters, routed,
            "exactly the exposing clusters that share a family with {published:?}"
        );
        if routed.len() < exposers.len() {
            assert!(
                outcome.conflicts.contains(ConflictReason::IpFamilyConflict),
                "a cluster left out of port {p:?}'s route for its families is in conflict"
            );
        }
    }
    // The import as a ServiceImport object carries the same spec and clusters.
    let object = import.to_service_import(service);
    assert_eq!(object.spec, import.spec);
    let status = import.status();
    let listed: Vec<String> = status
        .clusters
        .iter()
        .flatten()
        .map(|c| c.cluster.clone())
        .collect();
    let expected: Vec<String> = import.clusters.iter().map(|c| c.to_string()).collect();
    assert_eq!(listed, expected);
}

/// The `Change` reports exactly the difference between two outcomes.
pub(crate) fn check_change(
    change: &Change,
    before: Option<&MergeOutcome>,
    after: Option<&MergeOutcome>,
) {
    let old = before.and_then(|o| o.import.as_ref());
    let new = after.and_then(|o| o.import.as_ref());
    match (&change.import, old, new) {
        (ImportChange::Unchanged, a, b) => assert_eq!(a, b),
        (ImportChange::Created(i), None, Some(b)) => assert_eq!(&**i, b),
        (ImportChange::Updated(i), Some(a), Some(b)) => {
            assert_ne!(a, b);
            assert_eq!(&**i, b);
        }
        (ImportChange::Deleted, Some(_), None) => {}
        (c, a, b) => panic!("{c:?} from {a:?} to {b:?}"),
    }
    let expected: Vec<_> = after
        .into_iter()
        .flat_map(|o| &o.exports)
        .filter(|(c, cond)| before.and_then(|o| o.exports.get(*c)) != Some(*cond))
        .map(|(c, cond)| (c.clone(), cond.clone()))
        .collect();
    assert_eq!(change.conditions, expected);
}
