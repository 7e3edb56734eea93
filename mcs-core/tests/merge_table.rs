//! Table tests of the merge rules: every conflict reason alone and in every pair, equal
//! timestamps, three and more clusters, a cluster leaving, and the oldest export leaving
//! under both stability policies.

#[path = "merge_common/mod.rs"]
mod common;

use common::*;
use mcs_core::api::{
    ClusterSelector, InternalTrafficPolicy, IpFamily, PropertySelector, Protocol,
    ServiceImportType, ServicePort, SessionAffinity, TrafficDistribution,
};
use mcs_core::conditions::{ConditionStatus, ConflictReason, ValidReason, is_valid_reason};
use mcs_core::merge::{
    ClusterSetState, Constituent, ImportChange, MergedImport, ServiceFacts, ServiceKind, Source,
    Stability, WinReason, merge,
};

/// Every knob a constituent has, as plain data, so a test can flip one.
#[derive(Clone)]
struct Knobs {
    kind: ServiceKind,
    ports: Vec<ServicePort>,
    affinity: SessionAffinity,
    timeout: i32,
    families: Vec<IpFamily>,
    itp: InternalTrafficPolicy,
    td: TrafficDistribution,
    labels: Vec<(&'static str, &'static str)>,
    annotations: Vec<(&'static str, &'static str)>,
    selectors: Vec<ClusterSelector>,
}

/// A KEP-5939 selector: clusters whose `property` equals `value`.
fn selector(property: &str, value: &str) -> ClusterSelector {
    ClusterSelector {
        property_selector: Some(PropertySelector {
            match_properties: [(property.to_string(), value.to_string())].into(),
            ..PropertySelector::default()
        }),
    }
}

impl Knobs {
    fn base() -> Self {
        Self {
            kind: ServiceKind::ClusterSetIp,
            ports: vec![
                port("tcp", Protocol::Tcp, 42),
                port("udp", Protocol::Udp, 42),
            ],
            affinity: SessionAffinity::ClientIp,
            timeout: 10,
            families: vec![IpFamily::IPv4],
            itp: InternalTrafficPolicy::Cluster,
            td: TrafficDistribution::PreferClose,
            labels: vec![("team", "loyalty")],
            annotations: vec![("owner", "ops")],
            selectors: vec![],
        }
    }

    fn export(&self, cluster: &str, secs: i64) -> Constituent {
        let facts = ServiceFacts::builder(self.kind)
            .ports(self.ports.clone())
            .session_affinity(self.affinity)
            .session_affinity_config(client_ip_timeout(self.timeout))
            .ip_families(self.families.clone())
            .internal_traffic_policy(self.itp)
            .traffic_distribution(self.td)
            .build()
            .unwrap();
        Constituent::new(id(cluster), at(secs), Some(facts))
            .with_exported_labels(labels(&self.labels))
            .with_exported_annotations(labels(&self.annotations))
            .with_cluster_selectors(self.selectors.clone())
    }
}

/// One way to make a constituent disagree on exactly one field.
struct Flip {
    reason: ConflictReason,
    field: &'static str,
    apply: fn(&mut Knobs),
    /// Whether the merged import keeps the winner's value for that field.
    winner_kept: fn(&MergedImport) -> bool,
}

fn flips() -> Vec<Flip> {
    vec![
        Flip {
            reason: ConflictReason::PortConflict,
            field: "ports",
            apply: |k| k.ports[0].port = 43,
            winner_kept: |i| i.spec.ports == Knobs::base().ports,
        },
        Flip {
            reason: ConflictReason::TypeConflict,
            field: "type",
            apply: |k| k.kind = ServiceKind::Headless,
            winner_kept: |i| i.spec.type_ == ServiceImportType::ClusterSetIp,
        },
        Flip {
            reason: ConflictReason::SessionAffinityConflict,
            field: "sessionAffinity",
            apply: |k| k.affinity = SessionAffinity::None,
            winner_kept: |i| i.spec.session_affinity == Some(SessionAffinity::ClientIp),
        },
        Flip {
            reason: ConflictReason::SessionAffinityConfigConflict,
            field: "sessionAffinityConfig",
            apply: |k| k.timeout = 20,
            winner_kept: |i| i.spec.session_affinity_config == Some(client_ip_timeout(10)),
        },
        Flip {
            reason: ConflictReason::AnnotationsConflict,
            field: "exportedAnnotations",
            apply: |k| k.annotations = vec![("owner", "dev")],
            winner_kept: |i| i.annotations == labels(&[("owner", "ops")]),
        },
        Flip {
            reason: ConflictReason::LabelsConflict,
            field: "exportedLabels",
            apply: |k| k.labels = vec![],
            winner_kept: |i| i.labels == labels(&[("team", "loyalty")]),
        },
        Flip {
            reason: ConflictReason::InternalTrafficPolicyConflict,
            field: "internalTrafficPolicy",
            apply: |k| k.itp = InternalTrafficPolicy::Local,
            winner_kept: |i| i.spec.internal_traffic_policy == Some(InternalTrafficPolicy::Cluster),
        },
        Flip {
            reason: ConflictReason::TrafficDistributionConflict,
            field: "trafficDistribution",
            apply: |k| k.td = TrafficDistribution::PreferSameNode,
            winner_kept: |i| i.spec.traffic_distribution == Some(TrafficDistribution::PreferClose),
        },
        Flip {
            reason: ConflictReason::IpFamilyConflict,
            field: "ipFamilies",
            apply: |k| k.families = vec![IpFamily::IPv6],
            winner_kept: |i| i.spec.ip_families == Some(vec![IpFamily::IPv4]),
        },
        Flip {
            reason: ConflictReason::ClusterSelectorsConflict,
            field: "clusterSelectors",
            apply: |k| k.selectors = vec![selector("region.topology.k8s.io", "@SameAsImporter@")],
            winner_kept: |i| i.spec.cluster_selectors.is_none(),
        },
    ]
}

#[test]
fn the_flip_table_covers_every_reason() {
    let covered: Vec<ConflictReason> = flips().iter().map(|f| f.reason).collect();
    assert_eq!(covered, ConflictReason::ALL);
}

#[test]
fn every_reason_alone() {
    for flip in flips() {
        let mut newer = Knobs::base();
        (flip.apply)(&mut newer);
        let outcome = merged(&[Knobs::base().export("west", 0), newer.export("east", 5)]);
        assert_conflict_everywhere(&outcome, &[flip.reason]);
        let import = outcome.import.as_ref().unwrap();
        assert!(
            (flip.winner_kept)(import),
            "{:?}: the oldest export's value wins",
            flip.reason
        );
        let message = &outcome.exports[&id("east")].conflict.message;
        assert!(
            message.starts_with(&format!("Conflicting {}. Using ", flip.field)),
            "{message}"
        );
        assert!(
            message.contains(r#"from oldest service export in "west""#),
            "{message}"
        );
        assert!(message.ends_with(" 1/2 clusters disagree."), "{message}");
        assert_eq!(
            outcome.exports[&id("east")].conflict.reason,
            flip.reason.as_str()
        );
    }
}

#[test]
fn every_pair_of_reasons() {
    let table = flips();
    let mut pairs = 0;
    for (i, a) in table.iter().enumerate() {
        for b in &table[i + 1..] {
            // A headless Service with cluster selectors is not a conflict but an invalid
            // export (KEP-5939): `a_headless_export_with_selectors_is_invalid`.
            if [a.reason, b.reason]
                == [
                    ConflictReason::TypeConflict,
                    ConflictReason::ClusterSelectorsConflict,
                ]
            {
                continue;
            }
            let mut newer = Knobs::base();
            (a.apply)(&mut newer);
            (b.apply)(&mut newer);
            let outcome = merged(&[Knobs::base().export("west", 0), newer.export("east", 5)]);
            assert_conflict_everywhere(&outcome, &[a.reason, b.reason]);
            let conflict = &outcome.exports[&id("west")].conflict;
            assert_eq!(conflict.reason, format!("{},{}", a.reason, b.reason));
            assert!(is_valid_reason(&conflict.reason));
            for field in [a.field, b.field] {
                assert!(
                    conflict.message.contains(&format!("Conflicting {field}.")),
                    "{}",
                    conflict.message
                );
            }
            assert_eq!(
                conflict.message.matches("1/2 clusters disagree.").count(),
                2
            );
            let import = outcome.import.as_ref().unwrap();
            assert!((a.winner_kept)(import) && (b.winner_kept)(import));
            pairs += 1;
        }
    }
    assert_eq!(pairs, 44);
}

/// KEP-5939: the oldest export's ordered selectors are the import's; any other list (a
/// different order too) is `ClusterSelectorsConflict` on every export.
#[test]
fn the_oldest_exports_cluster_selectors_win() {
    let mut older = Knobs::base();
    older.selectors = vec![
        selector("cluster.clusterset.k8s.io", "@SameAsImporter@"),
        selector("region.topology.k8s.io", "@SameAsImporter@"),
    ];
    let outcome = merged(&[older.export("west", 0), older.export("east", 5)]);
    assert_conflict_everywhere(&outcome, &[]);
    let import = outcome.import.as_ref().unwrap();
    assert_eq!(
        import.spec.cluster_selectors.as_deref(),
        Some(&older.selectors[..])
    );

    let mut reversed = older.clone();
    reversed.selectors.reverse();
    let outcome = merged(&[reversed.export("east", 5), older.export("west", 0)]);
    assert_conflict_everywhere(&outcome, &[ConflictReason::ClusterSelectorsConflict]);
    let import = outcome.import.as_ref().unwrap();
    assert_eq!(
        import.spec.cluster_selectors.as_deref(),
        Some(&older.selectors[..])
    );
    assert_eq!(
        outcome.exports[&id("east")].conflict.message,
        r#"Conflicting clusterSelectors. Using 2 cluster selectors from oldest service export in "west". 1/2 clusters disagree."#
    );
}

/// KEP-5939: selectors on a headless Service make the export invalid
/// (`InvalidServiceType`); invalid selectors make it invalid (`InvalidClusterSelector`,
/// naming the entry and the problem). Neither takes part in the merge.
#[test]
fn a_headless_export_with_selectors_or_with_invalid_selectors_is_invalid() {
    let mut headless = Knobs::base();
    headless.kind = ServiceKind::Headless;
    headless.selectors = vec![selector("region.topology.k8s.io", "eu")];
    let mut bad = Knobs::base();
    bad.selectors = vec![ClusterSelector::default()];
    let outcome = merged(&[
        Knobs::base().export("west", 0),
        headless.export("east", 5),
        bad.export("north", 6),
    ]);
    let east = &outcome.exports[&id("east")].valid;
    assert_eq!(
        (east.status, east.reason.as_str()),
        (
            ConditionStatus::False,
            ValidReason::InvalidServiceType.as_str()
        )
    );
    assert!(
        east.message
            .contains("is headless; cluster selectors apply to ClusterSetIP services only"),
        "{}",
        east.message
    );
    let north = &outcome.exports[&id("north")].valid;
    assert_eq!(
        (north.status, north.reason.as_str()),
        (
            ConditionStatus::False,
            ValidReason::InvalidClusterSelector.as_str()
        )
    );
    assert!(
        north
            .message
            .ends_with("has invalid cluster selectors: clusterSelectors[0]: no propertySelector."),
        "{}",
        north.message
    );
    let import = outcome.import.as_ref().unwrap();
    assert_eq!(import.clusters, vec![id("west")]);
    assert!(outcome.conflicts.is_empty());
    // A headless Service without selectors stays a valid export.
    headless.selectors.clear();
    let outcome = merged(&[headless.export("east", 5)]);
    assert_eq!(
        outcome.exports[&id("east")].valid.reason,
        ValidReason::Valid.as_str()
    );
}

#[test]
fn equal_timestamps_break_ties_by_lowest_cluster_id() {
    let mut headless = Knobs::base();
    headless.kind = ServiceKind::Headless;
    for (alpha, bravo) in [
        (Knobs::base(), headless.clone()),
        (headless.clone(), Knobs::base()),
    ] {
        let expected = alpha.kind;
        let outcome = merged(&[bravo.export("bravo", 7), alpha.export("alpha", 7)]);
        let import = outcome.import.as_ref().unwrap();
        assert_eq!(Some(import.spec.type_), expected.import_type());
        assert_eq!(
            import.source,
            Source::Winner {
                cluster: id("alpha"),
                reason: WinReason::TieBreak { tied: 2 }
            }
        );
        let message = &outcome.exports[&id("bravo")].conflict.message;
        assert!(
            message.contains(r#"from oldest service export in "alpha" (2 exports share the oldest creationTimestamp; the lowest cluster id wins)"#),
            "{message}"
        );
    }
}

#[test]
fn an_older_export_beats_a_lower_cluster_id_and_ties_only_count_the_oldest() {
    let mut headless = Knobs::base();
    headless.kind = ServiceKind::Headless;
    let outcome = merged(&[
        Knobs::base().export("zulu", 1),
        headless.export("alpha", 2),
        headless.export("bravo", 2),
    ]);
    let import = outcome.import.as_ref().unwrap();
    assert_eq!(import.spec.type_, ServiceImportType::ClusterSetIp);
    assert_eq!(
        import.source,
        Source::Winner {
            cluster: id("zulu"),
            reason: WinReason::Oldest
        }
    );
    assert!(
        outcome.exports[&id("alpha")]
            .conflict
            .message
            .ends_with("2/3 clusters disagree.")
    );
}

#[test]
fn kep_example_message_with_five_clusters() {
    let mut headless = Knobs::base();
    headless.kind = ServiceKind::Headless;
    let outcome = merged(&[
        Knobs::base().export("cluster-1", 0),
        Knobs::base().export("cluster-2", 1),
        headless.export("cluster-3", 2),
        Knobs::base().export("cluster-4", 3),
        headless.export("cluster-5", 4),
    ]);
    assert_conflict_everywhere(&outcome, &[ConflictReason::TypeConflict]);
    for conditions in outcome.exports.values() {
        assert_eq!(
            conditions.conflict.message,
            r#"Conflicting type. Using "ClusterSetIP" from oldest service export in "cluster-1". 2/5 clusters disagree."#
        );
    }
}

#[test]
fn three_clusters_union_ports_and_route_each_to_its_exposers() {
    let mut b = Knobs::base();
    b.ports = vec![
        port("tcp", Protocol::Tcp, 42),
        port("grpc", Protocol::Tcp, 9443),
    ];
    let mut c = Knobs::base();
    c.ports = vec![
        port("grpc", Protocol::Tcp, 9444),
        port("metrics", Protocol::Tcp, 42), // collides with tcp on (TCP, 42): dropped
        port("dns", Protocol::Udp, 53),
    ];
    let outcome = merged(&[
        c.export("c", 3),
        Knobs::base().export("a", 1),
        b.export("b", 2),
    ]);
    assert_conflict_everywhere(&outcome, &[ConflictReason::PortConflict]);
    let import = outcome.import.as_ref().unwrap();
    assert_eq!(
        import.spec.ports,
        [
            port("tcp", Protocol::Tcp, 42),
            port("udp", Protocol::Udp, 42),
            port("grpc", Protocol::Tcp, 9443),
            port("dns", Protocol::Udp, 53),
        ]
    );
    let routes = route_map(&outcome);
    assert_eq!(routes["tcp/42"], ["a", "b"]);
    assert_eq!(routes["udp/42"], ["a"]);
    assert_eq!(routes["grpc/9443"], ["b"]);
    assert_eq!(routes["dns/53"], ["c"]);
    // "Disagree" counts exports whose value differs from the published one: no cluster
    // exposes the whole union here, so all three do.
    assert!(
        outcome.exports[&id("a")]
            .conflict
            .message
            .ends_with("3/3 clusters disagree.")
    );
}

#[test]
fn app_protocol_difference_is_a_port_conflict_but_still_routes() {
    let mut b = Knobs::base();
    b.ports[0].app_protocol = Some("kubernetes.io/h2c".into());
    let outcome = merged(&[Knobs::base().export("a", 1), b.export("b", 2)]);
    assert_conflict_everywhere(&outcome, &[ConflictReason::PortConflict]);
    let import = outcome.import.as_ref().unwrap();
    assert_eq!(import.spec.ports[0].app_protocol, None);
    assert_eq!(
        import.clusters_for(&port("tcp", Protocol::Tcp, 42)),
        [id("a"), id("b")]
    );
}

#[test]
fn missing_protocol_is_tcp() {
    let mut b = Knobs::base();
    b.ports[0].protocol = None;
    let outcome = merged(&[Knobs::base().export("a", 1), b.export("b", 2)]);
    assert_conflict_everywhere(&outcome, &[]);
}

#[test]
fn ip_family_policy() {
    use IpFamily::{IPv4, IPv6};
    // (winner, other, conflict?)
    let table: [(&[IpFamily], &[IpFamily], bool); 7] = [
        (&[IPv4], &[IPv4], false),
        (&[IPv4], &[IPv4, IPv6], false), // extra family: every backend reachable over IPv4
        (&[IPv4, IPv6], &[IPv6, IPv4], false), // order does not matter
        (&[IPv4, IPv6], &[IPv4], true),  // other unreachable over IPv6
        (&[IPv4], &[IPv6], true),
        (&[IPv4], &[], false), // the other states none: no evidence of a mismatch
        (&[], &[IPv6], false), // nothing published
    ];
    for (winner, other, conflict) in table {
        let mut a = Knobs::base();
        a.families = winner.to_vec();
        let mut b = Knobs::base();
        b.families = other.to_vec();
        let outcome = merged(&[a.export("a", 1), b.export("b", 2)]);
        let expected: &[ConflictReason] = if conflict {
            &[ConflictReason::IpFamilyConflict]
        } else {
            &[]
        };
        assert_conflict_everywhere(&outcome, expected);
        let published = outcome.import.unwrap().spec.ip_families;
        assert_eq!(
            published,
            (!winner.is_empty()).then(|| winner.to_vec()),
            "winner's families"
        );
    }
}

#[test]
fn ip_families_decide_which_clusters_are_routed() {
    use IpFamily::{IPv4, IPv6};
    // (winner, other, other routed?): a cluster is routed iff it shares a family with the
    // import, or either side states none.
    let table: [(&[IpFamily], &[IpFamily], bool); 10] = [
        (&[IPv4], &[IPv4], true),
        (&[IPv4], &[IPv4, IPv6], true), // its IPv6 endpoints are not admitted, see below
        (&[IPv4, IPv6], &[IPv4], true), // in conflict, but reachable over IPv4
        (&[IPv4, IPv6], &[IPv6], true), // in conflict, but reachable over IPv6
        (&[IPv4], &[IPv6], false),      // IPv6-only under an IPv4 import
        (&[IPv6], &[IPv4], false),      // IPv4-only under an IPv6 import
        (&[IPv6, IPv4], &[IPv4], true), // order does not matter
        (&[IPv4], &[], true),           // the other states none
        (&[], &[IPv6], true),           // nothing published
        (&[], &[], true),
    ];
    for (winner, other, routed) in table {
        let mut a = Knobs::base();
        a.families = winner.to_vec();
        let mut b = Knobs::base();
        b.families = other.to_vec();
        let outcome = merged(&[a.export("a", 1), b.export("b", 2)]);
        let expected: &[&str] = if routed { &["a", "b"] } else { &["a"] };
        let case = format!("winner {winner:?}, other {other:?}");
        for (port, clusters) in route_map(&outcome) {
            assert_eq!(clusters, expected, "{case}: port {port}");
        }
        if !routed {
            assert!(
                outcome.conflicts.contains(ConflictReason::IpFamilyConflict),
                "{case}: left out only when in conflict"
            );
        }
        let import = outcome.import.unwrap();
        for family in [IPv4, IPv6] {
            assert_eq!(
                import.admits_family(family),
                winner.is_empty() || winner.contains(&family),
                "{case}: endpoints of {family:?}"
            );
        }
    }
}

#[test]
fn a_port_only_a_cluster_of_another_family_exposes_routes_nowhere() {
    // b (IPv6 only) adds a port; the import is IPv4 (a is older), so the union keeps the
    // port but no backend can be reached over IPv4 on it.
    let mut b = Knobs::base();
    b.families = vec![IpFamily::IPv6];
    b.ports.push(port("grpc", Protocol::Tcp, 9443));
    let outcome = merged(&[Knobs::base().export("a", 1), b.export("b", 2)]);
    assert_conflict_everywhere(
        &outcome,
        &[
            ConflictReason::PortConflict,
            ConflictReason::IpFamilyConflict,
        ],
    );
    let routes = route_map(&outcome);
    assert_eq!(routes["tcp/42"], ["a"]);
    assert_eq!(routes["udp/42"], ["a"]);
    assert!(routes["grpc/9443"].is_empty(), "{routes:?}");
}

#[test]
fn sticky_import_of_a_family_no_remaining_cluster_has_routes_nowhere_until_refresh() {
    let mut b = Knobs::base();
    b.families = vec![IpFamily::IPv6];
    let mut state = ClusterSetState::new(Stability::Sticky);
    state.upsert(&svc(), Knobs::base().export("a", 1));
    state.upsert(&svc(), b.export("b", 2));
    let import = state.import(&svc()).unwrap();
    assert!(import.routes.iter().all(|r| r.clusters == [id("a")]));

    // The IPv4 import is kept after a leaves; b's IPv6 backends stay unrouted.
    state.remove(&svc(), &id("a"));
    let import = state.import(&svc()).unwrap();
    assert_eq!(import.spec.ip_families, Some(vec![IpFamily::IPv4]), "kept");
    assert!(import.routes.iter().all(|r| r.clusters.is_empty()));
    assert_eq!(
        state.conflicts(&svc()),
        reasons(&[ConflictReason::IpFamilyConflict])
    );

    // A fresh merge makes b the winner: IPv6, routed to b.
    state.refresh(&svc());
    let import = state.import(&svc()).unwrap();
    assert_eq!(import.spec.ip_families, Some(vec![IpFamily::IPv6]));
    assert!(import.routes.iter().all(|r| r.clusters == [id("b")]));
    assert!(import.admits_family(IpFamily::IPv6) && !import.admits_family(IpFamily::IPv4));
}

#[test]
fn invalid_exports_are_not_constituents() {
    let mut headless = Knobs::base();
    headless.kind = ServiceKind::Headless;
    let external = Constituent::new(
        id("ext"),
        at(0),
        Some(
            ServiceFacts::builder(ServiceKind::ExternalName)
                .build()
                .unwrap(),
        ),
    );
    let missing = Constituent::new(id("gone"), at(0), None);
    let outcome = merged(&[
        external,
        missing,
        headless.export("b", 2),
        Knobs::base().export("c", 3),
    ]);
    let import = outcome.import.as_ref().unwrap();
    assert_eq!(
        import.spec.type_,
        ServiceImportType::Headless,
        "the oldest *valid* export wins"
    );
    assert_eq!(import.clusters, [id("b"), id("c")]);
    assert_eq!(
        outcome.exports[&id("ext")].valid.reason,
        "InvalidServiceType"
    );
    assert_eq!(outcome.exports[&id("gone")].valid.reason, "NoService");
    assert_eq!(outcome.exports[&id("gone")].conflict.reason, "NoConflicts");
    assert_eq!(outcome.exports[&id("b")].conflict.reason, "TypeConflict");
    assert!(
        outcome.exports[&id("b")]
            .conflict
            .message
            .ends_with("1/2 clusters disagree.")
    );
}

// ---- updates ------------------------------------------------------------------------

fn headless() -> Knobs {
    let mut k = Knobs::base();
    k.kind = ServiceKind::Headless;
    k
}

#[test]
fn a_joining_export_reports_only_what_changed() {
    let mut state = ClusterSetState::new(Stability::Sticky);
    let created = state.upsert(&svc(), Knobs::base().export("a", 1));
    assert!(matches!(created.import, ImportChange::Created(_)));
    assert_eq!(created.conditions.len(), 1);

    // An agreeing export: the import's clusters change, and only the newcomer's conditions.
    let joined = state.upsert(&svc(), Knobs::base().export("b", 2));
    assert!(matches!(&joined.import, ImportChange::Updated(i) if i.clusters == [id("a"), id("b")]));
    assert_eq!(
        joined
            .conditions
            .iter()
            .map(|(c, _)| c.as_str())
            .collect::<Vec<_>>(),
        ["b"]
    );

    // A disagreeing export: the import's spec stays (the oldest wins) and every export's
    // Conflict changes.
    let conflicting = state.upsert(&svc(), headless().export("c", 3));
    let ImportChange::Updated(import) = &conflicting.import else {
        panic!("{conflicting:?}")
    };
    assert_eq!(import.spec.type_, ServiceImportType::ClusterSetIp);
    assert_eq!(conflicting.conditions.len(), 3);
    for (_, conditions) in &conflicting.conditions {
        assert_eq!(conditions.conflict.status, ConditionStatus::True);
    }

    // The same update again changes nothing.
    assert!(state.upsert(&svc(), headless().export("c", 3)).is_empty());
}

#[test]
fn a_cluster_leaving_updates_every_service_it_exported() {
    let other = mcs_core::name::ServiceRef::new("shop", "cart").unwrap();
    let mut state = ClusterSetState::new(Stability::Sticky);
    state.upsert(&svc(), Knobs::base().export("a", 1));
    state.upsert(&svc(), headless().export("b", 2));
    state.upsert(&other, Knobs::base().export("b", 1));
    assert_eq!(state.clusters().count(), 2);

    let changes = state.remove_cluster(&id("b"));
    assert_eq!(changes.len(), 2);
    assert_eq!(changes[0].service, svc(), "sorted by service");
    assert!(matches!(&changes[0].import, ImportChange::Updated(i) if i.clusters == [id("a")]));
    assert_eq!(changes[0].conditions.len(), 1, "a's conflict cleared");
    assert_eq!(changes[0].conditions[0].1.conflict.reason, "NoConflicts");
    assert_eq!(changes[1].service, other);
    assert_eq!(changes[1].import, ImportChange::Deleted);

    assert!(state.import(&other).is_none());
    assert_eq!(state.len(), 1);
    assert_eq!(state.clusters().collect::<Vec<_>>(), [&id("a")]);
    assert!(
        state.remove_cluster(&id("b")).is_empty(),
        "leaving twice changes nothing"
    );
}

#[test]
fn oldest_export_leaving_sticky_keeps_the_import_until_refresh() {
    let mut state = ClusterSetState::new(Stability::Sticky);
    state.upsert(&svc(), Knobs::base().export("a", 1));
    state.upsert(&svc(), headless().export("b", 2));
    let before = state.import(&svc()).unwrap().spec.clone();

    let change = state.remove(&svc(), &id("a"));
    let ImportChange::Updated(import) = &change.import else {
        panic!("{change:?}")
    };
    assert_eq!(import.spec, before, "traffic is not moved");
    assert_eq!(import.source, Source::Retained { cluster: id("a") });
    assert_eq!(import.clusters, [id("b")]);
    let b = state.conditions(&svc(), &id("b")).unwrap();
    assert_eq!(
        b.conflict.reason, "TypeConflict",
        "b still disagrees with the kept import"
    );
    assert!(
        b.conflict
            .message
            .contains(r#"kept for traffic stability after the export in "a" went away"#),
        "{}",
        b.conflict.message
    );
    assert!(b.conflict.message.ends_with("1/1 clusters disagree."));

    // Unrelated updates keep the kept import.
    assert!(state.upsert(&svc(), headless().export("b", 2)).is_empty());
    state.upsert(&svc(), headless().export("c", 3));
    assert_eq!(
        state.import(&svc()).unwrap().spec.type_,
        ServiceImportType::ClusterSetIp
    );

    // A fresh merge re-elects the oldest: b.
    let refreshed = state.refresh(&svc());
    let ImportChange::Updated(import) = &refreshed.import else {
        panic!("{refreshed:?}")
    };
    assert_eq!(import.spec.type_, ServiceImportType::Headless);
    assert_eq!(
        import.source,
        Source::Winner {
            cluster: id("b"),
            reason: WinReason::Oldest
        }
    );
    assert_eq!(refreshed.conditions.len(), 2);
    assert_eq!(state.conflicts(&svc()), reasons(&[]));
    assert!(
        state.refresh(&svc()).is_empty(),
        "refreshing twice changes nothing"
    );
}

#[test]
fn oldest_export_leaving_fresh_moves_the_import_at_once() {
    let mut state = ClusterSetState::new(Stability::Fresh);
    state.upsert(&svc(), Knobs::base().export("a", 1));
    state.upsert(&svc(), headless().export("b", 2));
    let change = state.remove(&svc(), &id("a"));
    let ImportChange::Updated(import) = &change.import else {
        panic!("{change:?}")
    };
    assert_eq!(import.spec.type_, ServiceImportType::Headless);
    assert_eq!(
        import.source,
        Source::Winner {
            cluster: id("b"),
            reason: WinReason::Oldest
        }
    );
    assert_eq!(change.conditions[0].1.conflict.reason, "NoConflicts");
}

#[test]
fn sticky_adopts_the_fresh_winner_when_nothing_would_change() {
    let mut state = ClusterSetState::new(Stability::Sticky);
    state.upsert(&svc(), Knobs::base().export("a", 1));
    state.upsert(&svc(), Knobs::base().export("b", 2));
    state.remove(&svc(), &id("a"));
    let import = state.import(&svc()).unwrap();
    assert_eq!(
        import.source,
        Source::Winner {
            cluster: id("b"),
            reason: WinReason::Oldest
        }
    );
    assert_eq!(state.conflicts(&svc()), reasons(&[]));
}

#[test]
fn sticky_drops_kept_ports_that_no_cluster_exposes() {
    let mut b = headless();
    b.ports = vec![
        port("udp", Protocol::Udp, 42),
        port("tcp2", Protocol::Tcp, 4242),
    ];
    let mut state = ClusterSetState::new(Stability::Sticky);
    state.upsert(&svc(), Knobs::base().export("a", 1));
    state.upsert(&svc(), b.export("b", 2));
    state.remove(&svc(), &id("a"));
    let import = state.import(&svc()).unwrap();
    assert_eq!(import.spec.type_, ServiceImportType::ClusterSetIp, "kept");
    assert_eq!(
        import.spec.ports,
        [
            port("udp", Protocol::Udp, 42),
            port("tcp2", Protocol::Tcp, 4242)
        ]
    );
    assert!(import.routes.iter().all(|r| r.clusters == [id("b")]));
    assert_eq!(
        state.conflicts(&svc()),
        reasons(&[ConflictReason::TypeConflict])
    );
}

#[test]
fn winner_losing_its_service_is_the_winner_leaving() {
    for stability in [Stability::Sticky, Stability::Fresh] {
        let mut state = ClusterSetState::new(stability);
        state.upsert(&svc(), Knobs::base().export("a", 1));
        state.upsert(&svc(), headless().export("b", 2));
        let change = state.upsert(&svc(), Constituent::new(id("a"), at(1), None));
        let a = change
            .conditions
            .iter()
            .find(|(c, _)| c.as_str() == "a")
            .unwrap();
        assert_eq!(a.1.valid.reason, "NoService");
        let kept = state.import(&svc()).unwrap().spec.type_;
        let expected = match stability {
            Stability::Sticky => ServiceImportType::ClusterSetIp,
            _ => ServiceImportType::Headless,
        };
        assert_eq!(kept, expected, "{stability:?}");
        assert_eq!(state.import(&svc()).unwrap().clusters, [id("b")]);
    }
}

#[test]
fn sticky_import_goes_when_the_last_valid_export_goes() {
    let mut state = ClusterSetState::new(Stability::Sticky);
    state.upsert(&svc(), Knobs::base().export("a", 1));
    state.upsert(&svc(), headless().export("b", 2));
    state.remove(&svc(), &id("a"));
    let change = state.upsert(&svc(), Constituent::new(id("b"), at(2), None));
    assert_eq!(change.import, ImportChange::Deleted);
    assert_eq!(state.len(), 1, "the invalid export is still tracked");
    // A new export after that starts fresh.
    let change = state.upsert(&svc(), headless().export("c", 3));
    assert!(
        matches!(&change.import, ImportChange::Created(i) if i.spec.type_ == ServiceImportType::Headless)
    );
}

#[test]
fn pure_merge_sticky_matches_the_state() {
    let a = Knobs::base().export("a", 1);
    let b = headless().export("b", 2);
    let first = merge(&svc(), &[a, b.clone()], Stability::Sticky, None).unwrap();
    let kept = merge(
        &svc(),
        std::slice::from_ref(&b),
        Stability::Sticky,
        first.import.as_ref(),
    )
    .unwrap();
    assert_eq!(
        kept.import.as_ref().unwrap().spec.type_,
        ServiceImportType::ClusterSetIp
    );
    let fresh = merge(&svc(), &[b], Stability::Fresh, first.import.as_ref()).unwrap();
    assert_eq!(
        fresh.import.as_ref().unwrap().spec.type_,
        ServiceImportType::Headless
    );
}

#[test]
fn sticky_adopts_the_fresh_merge_when_nothing_kept_differs_from_it() {
    // Found by the `merge` fuzz target. The kept import loses the port no remaining
    // cluster exposes, which leaves exactly the fresh merge: it is adopted at once (its
    // winner is the source), or the next merge would adopt it and report a change that
    // changes nothing.
    let s = svc();
    let headless = |p| ServiceFacts::builder(ServiceKind::Headless).port(p);
    let echo = export("echo", 0, headless(port("tcp", Protocol::Tcp, 42)));
    let delta = [export("delta", 1, headless(port("udp", Protocol::Udp, 42)))];
    let first = merge(&s, &[echo], Stability::Sticky, None).unwrap();
    let sticky = merge(&s, &delta, Stability::Sticky, first.import.as_ref()).unwrap();
    assert_eq!(sticky, merge(&s, &delta, Stability::Fresh, None).unwrap());
    assert_eq!(
        sticky.import.as_ref().unwrap().source,
        Source::Winner {
            cluster: id("delta"),
            reason: WinReason::Oldest
        }
    );
    let again = merge(&s, &delta, Stability::Sticky, sticky.import.as_ref()).unwrap();
    assert_eq!(again, sticky, "a sticky merge is a fixed point");
}

#[test]
fn public_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync + 'static>() {}
    fn error<T: std::error::Error + Send + Sync + 'static>() {}
    send_sync::<ClusterSetState>();
    send_sync::<mcs_core::merge::Change>();
    send_sync::<mcs_core::merge::MergeOutcome>();
    send_sync::<Constituent>();
    error::<mcs_core::merge::InputError>();
    error::<mcs_core::merge::SpecError>();
    error::<mcs_core::merge::MergeError>();
}
