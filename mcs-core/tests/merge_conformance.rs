//! The merge-level cases of the upstream conformance suite (sigs.k8s.io/mcs-api `conformance/`, cases
//! 1-15). Where two clusters export, cluster[0] (`remote`) exports first and cluster[1]
//! (`local`) 2 s later, as the suite's driver does (it sleeps 1.1 s); `remote` sorts after
//! `local`, so a pass proves the timestamp decides and not the tie-break. Every two-cluster
//! case is merged in both input orders, through the pure merge and through
//! [`ClusterSetState`] under both stability policies (see `merged`).

#[path = "merge_common/mod.rs"]
mod common;

use common::*;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mcs_core::api::v1beta1::ServiceExport;
use mcs_core::api::{
    InternalTrafficPolicy, IpFamily, Protocol, ServiceExportSpec, ServiceImportType, ServicePort,
    SessionAffinity, TrafficDistribution, decode_yaml,
};
use mcs_core::conditions::{ConditionStatus, ConflictReason, ValidReason};
use mcs_core::merge::{
    ClusterSetState, Constituent, ImportChange, ServiceFacts, ServiceKind, Source, Stability,
    WinReason,
};

/// cluster[0]: exports first.
const C0: &str = "remote";
/// cluster[1]: exports 2 s later.
const C1: &str = "local";

fn both_orders(a: &Constituent, b: &Constituent) -> [Vec<Constituent>; 2] {
    [vec![a.clone(), b.clone()], vec![b.clone(), a.clone()]]
}

#[test]
fn conformance_01_import_exists_only_while_a_cluster_exports() {
    let c0 = export(C0, 0, hello(ServiceKind::ClusterSetIp));
    let c1 = export(C1, 2, hello(ServiceKind::ClusterSetIp));
    for stability in [Stability::Sticky, Stability::Fresh] {
        for order in both_orders(&c0, &c1) {
            let mut state = upsert_all(stability, &order);
            let before = state.import(&svc()).cloned().expect("exported on both");
            assert_eq!(before.clusters, [id(C1), id(C0)]);

            let change = state.remove(&svc(), &id(C0));
            assert!(
                matches!(change.import, ImportChange::Updated(_)),
                "{change:?}"
            );
            let after = state
                .import(&svc())
                .expect("the import stays while cluster[1] exports");
            assert_eq!(after.spec, before.spec);
            assert_eq!(after.clusters, [id(C1)]);

            let change = state.remove(&svc(), &id(C1));
            assert_eq!(change.import, ImportChange::Deleted);
            assert!(state.import(&svc()).is_none());
            assert!(state.is_empty());
        }
    }
}

#[test]
fn conformance_02_only_exported_labels_and_annotations_propagate() {
    let mut service = core_service(
        None,
        Some("10.0.0.10"),
        vec![core_port("tcp", Some("TCP"), 42)],
    );
    service.metadata.labels = Some(labels(&[("dummy-svc", "true")]));
    service.metadata.annotations = Some(labels(&[("dummy-svc", "true")]));
    let export: ServiceExport = decode_yaml(
        r#"
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceExport
metadata:
  name: hello
  namespace: mcs-conformance
  creationTimestamp: "2026-05-01T10:00:00Z"
  labels: { dummy-svcexport: "true" }
  annotations: { dummy-svcexport: "true" }
spec:
  exportedLabels: { dummy-label: "true" }
  exportedAnnotations: { dummy-annotation: "true" }
"#,
    )
    .unwrap();
    let facts = ServiceFacts::try_from(&service).unwrap();
    let constituent = Constituent::from_export(id(C0), &export, Some(facts)).unwrap();
    let outcome = merged(&[constituent]);
    let import = outcome.import.as_ref().unwrap();
    assert_eq!(import.labels, labels(&[("dummy-label", "true")]));
    assert_eq!(import.annotations, labels(&[("dummy-annotation", "true")]));
    let object = import.to_service_import(&svc());
    let meta_labels = object.metadata.labels.unwrap();
    let meta_annotations = object.metadata.annotations.unwrap();
    assert!(meta_labels.contains_key("dummy-label"));
    assert!(meta_annotations.contains_key("dummy-annotation"));
    for key in ["dummy-svc", "dummy-svcexport"] {
        assert!(!meta_labels.contains_key(key), "{key} must not propagate");
        assert!(
            !meta_annotations.contains_key(key),
            "{key} must not propagate"
        );
    }
    assert_conflict_everywhere(&outcome, &[]);
}

#[test]
fn conformance_03_conflicting_labels_and_annotations_use_oldest_and_flag_every_export() {
    let c0 = export(C0, 0, hello(ServiceKind::ClusterSetIp))
        .with_exported_labels(labels(&[("dummy-label", "cluster-0")]))
        .with_exported_annotations(labels(&[("dummy-annotation", "cluster-0")]));
    let c1 = export(C1, 2, hello(ServiceKind::ClusterSetIp))
        .with_exported_labels(labels(&[("other-label", "cluster-1")]))
        .with_exported_annotations(labels(&[("other-annotation", "cluster-1")]));
    for order in both_orders(&c0, &c1) {
        let outcome = merged(&order);
        assert_conflict_everywhere(
            &outcome,
            &[
                ConflictReason::AnnotationsConflict,
                ConflictReason::LabelsConflict,
            ],
        );
        let import = outcome.import.as_ref().unwrap();
        assert_eq!(import.labels, labels(&[("dummy-label", "cluster-0")]));
        assert_eq!(
            import.annotations,
            labels(&[("dummy-annotation", "cluster-0")])
        );
        let message = &outcome.exports[&id(C1)].conflict.message;
        assert!(message.contains("Conflicting exportedLabels."), "{message}");
        assert!(
            message.contains("Conflicting exportedAnnotations."),
            "{message}"
        );
        assert!(
            message.contains(r#"oldest service export in "remote""#),
            "{message}"
        );
        assert_eq!(
            outcome.exports[&id(C1)].conflict.reason,
            "AnnotationsConflict,LabelsConflict"
        );
    }
}

#[test]
fn conformance_04_clusterip_export_creates_clustersetip_import() {
    for type_ in [
        None,
        Some("ClusterIP"),
        Some("NodePort"),
        Some("LoadBalancer"),
    ] {
        let service = core_service(
            type_,
            Some("10.0.0.10"),
            vec![core_port("tcp", Some("TCP"), 42)],
        );
        let facts = ServiceFacts::try_from(&service).unwrap();
        assert_eq!(facts.kind(), ServiceKind::ClusterSetIp, "{type_:?}");
        let c0 = Constituent::new(id(C0), at(0), Some(facts.clone()));
        let c1 = Constituent::new(id(C1), at(2), Some(facts));
        for order in both_orders(&c0, &c1) {
            let outcome = merged(&order);
            for conditions in outcome.exports.values() {
                assert_eq!(conditions.valid.status, ConditionStatus::True);
                assert_eq!(conditions.valid.reason, ValidReason::Valid.as_str());
            }
            assert_eq!(
                outcome.import.unwrap().spec.type_,
                ServiceImportType::ClusterSetIp
            );

            let mut state = upsert_all(Stability::Sticky, &order);
            state.remove(&svc(), &id(C0));
            assert_eq!(state.remove(&svc(), &id(C1)).import, ImportChange::Deleted);
        }
    }
}

#[test]
fn conformance_05_session_affinity_matches_exported_service() {
    let c0 = export(C0, 0, hello(ServiceKind::ClusterSetIp));
    let c1 = export(C1, 2, hello(ServiceKind::ClusterSetIp));
    for order in both_orders(&c0, &c1) {
        let outcome = merged(&order);
        let spec = outcome.import.unwrap().spec;
        assert_eq!(spec.session_affinity, Some(SessionAffinity::ClientIp));
        assert_eq!(spec.session_affinity_config, Some(client_ip_timeout(10)));
    }
}

#[test]
fn conformance_06_internal_traffic_policy_matches_exported_service() {
    let c0 = export(C0, 0, hello(ServiceKind::ClusterSetIp));
    let c1 = export(C1, 2, hello(ServiceKind::ClusterSetIp));
    for order in both_orders(&c0, &c1) {
        let spec = merged(&order).import.unwrap().spec;
        assert_eq!(
            spec.internal_traffic_policy,
            Some(InternalTrafficPolicy::Cluster)
        );
    }
}

#[test]
fn conformance_07_traffic_distribution_matches_exported_service() {
    let facts =
        || hello(ServiceKind::ClusterSetIp).traffic_distribution(TrafficDistribution::PreferClose);
    let c0 = export(C0, 0, facts());
    let c1 = export(C1, 2, facts());
    for order in both_orders(&c0, &c1) {
        let spec = merged(&order).import.unwrap().spec;
        assert_eq!(
            spec.traffic_distribution,
            Some(TrafficDistribution::PreferClose)
        );
    }
}

#[test]
fn conformance_08_one_ip_family_per_published_family_and_no_ips_from_the_merge() {
    for families in [vec![IpFamily::IPv4], vec![IpFamily::IPv6, IpFamily::IPv4]] {
        let facts = || hello(ServiceKind::ClusterSetIp).ip_families(families.clone());
        let c0 = export(C0, 0, facts());
        let c1 = export(C1, 2, facts());
        for order in both_orders(&c0, &c1) {
            let outcome = merged(&order);
            assert_conflict_everywhere(&outcome, &[]);
            let spec = outcome.import.unwrap().spec;
            assert_eq!(
                spec.ip_families.as_ref(),
                Some(&families),
                "order of families kept"
            );
            assert_eq!(spec.ips, None, "each agent allocates one IP per family");
        }
    }
}

#[test]
fn conformance_09_ports_match_exported_service() {
    let service = core_service(
        None,
        Some("10.0.0.10"),
        vec![
            core_port("udp", Some("UDP"), 42),
            core_port("tcp", Some("TCP"), 42),
            {
                let mut p = core_port("Web", None, 8080);
                p.app_protocol = Some("kubernetes.io/h2c".into());
                p
            },
        ],
    );
    let facts = ServiceFacts::try_from(&service).unwrap();
    let c0 = Constituent::new(id(C0), at(0), Some(facts.clone()));
    let c1 = Constituent::new(id(C1), at(2), Some(facts));
    let expected = sorted_ports(&[
        port("tcp", Protocol::Tcp, 42),
        port("udp", Protocol::Udp, 42),
        ServicePort {
            name: Some("Web".into()),
            protocol: Some(Protocol::Tcp),
            app_protocol: Some("kubernetes.io/h2c".into()),
            port: 8080,
        },
    ]);
    for order in both_orders(&c0, &c1) {
        let outcome = merged(&order);
        assert_conflict_everywhere(&outcome, &[]);
        assert_eq!(sorted_ports(&outcome.import.unwrap().spec.ports), expected);
    }
}

#[test]
fn conformance_10_union_of_ports_raises_port_conflict() {
    let c0 = export(C0, 0, hello(ServiceKind::ClusterSetIp));
    let c1 = export(
        C1,
        2,
        hello(ServiceKind::ClusterSetIp).port(port("stcp", Protocol::Sctp, 142)),
    );
    for order in both_orders(&c0, &c1) {
        let outcome = merged(&order);
        assert_conflict_everywhere(&outcome, &[ConflictReason::PortConflict]);
        let import = outcome.import.as_ref().unwrap();
        assert_eq!(
            import.spec.ports,
            [
                port("tcp", Protocol::Tcp, 42),
                port("udp", Protocol::Udp, 42),
                port("stcp", Protocol::Sctp, 142)
            ]
        );
        assert_eq!(
            import.clusters_for(&port("stcp", Protocol::Sctp, 142)),
            [id(C1)]
        );
        assert_eq!(
            import.clusters_for(&port("tcp", Protocol::Tcp, 42)),
            [id(C1), id(C0)]
        );
        let message = &outcome.exports[&id(C0)].conflict.message;
        assert!(message.starts_with("Conflicting ports. Using the union of ports [tcp(TCP/42), udp(UDP/42), stcp(SCTP/142)]"), "{message}");
        assert!(message.ends_with("1/2 clusters disagree."), "{message}");
    }
}

#[test]
fn conformance_11_conflicting_port_uses_oldest_and_flags_every_export() {
    let c0 = export(C0, 0, hello(ServiceKind::ClusterSetIp));
    let c1 = export(
        C1,
        2,
        ServiceFacts::builder(ServiceKind::ClusterSetIp)
            .port(port("tcp", Protocol::Tcp, 43))
            .port(port("udp", Protocol::Udp, 42))
            .session_affinity(SessionAffinity::ClientIp)
            .session_affinity_config(client_ip_timeout(10))
            .ip_families([IpFamily::IPv4])
            .internal_traffic_policy(InternalTrafficPolicy::Cluster),
    );
    for order in both_orders(&c0, &c1) {
        let outcome = merged(&order);
        assert_conflict_everywhere(&outcome, &[ConflictReason::PortConflict]);
        let import = outcome.import.as_ref().unwrap();
        assert_eq!(import.spec.ports, c0.service().unwrap().ports());
        // Traffic to tcp/42 goes only to the cluster that exposes it (StrictPortConflict).
        assert_eq!(
            import.clusters_for(&port("tcp", Protocol::Tcp, 42)),
            [id(C0)]
        );
        assert!(
            import
                .clusters_for(&port("tcp", Protocol::Tcp, 43))
                .is_empty()
        );
        assert_eq!(
            import.clusters_for(&port("udp", Protocol::Udp, 42)),
            [id(C1), id(C0)]
        );
    }
}

#[test]
fn conformance_12_headless_export_creates_headless_import() {
    let service = core_service(None, Some("None"), vec![core_port("tcp", Some("TCP"), 42)]);
    let facts = ServiceFacts::try_from(&service).unwrap();
    assert_eq!(facts.kind(), ServiceKind::Headless);
    let c0 = Constituent::new(id(C0), at(0), Some(facts.clone()));
    let c1 = Constituent::new(id(C1), at(2), Some(facts));
    for order in both_orders(&c0, &c1) {
        let outcome = merged(&order);
        assert_conflict_everywhere(&outcome, &[]);
        assert_eq!(
            outcome.import.unwrap().spec.type_,
            ServiceImportType::Headless
        );
        let mut state = upsert_all(Stability::Sticky, &order);
        state.remove(&svc(), &id(C1));
        assert_eq!(state.remove(&svc(), &id(C0)).import, ImportChange::Deleted);
    }
}

#[test]
fn conformance_13_headless_import_has_no_ips() {
    let c0 = export(C0, 0, hello(ServiceKind::Headless));
    let c1 = export(C1, 2, hello(ServiceKind::Headless));
    for order in both_orders(&c0, &c1) {
        let import = merged(&order).import.unwrap();
        assert_eq!(import.spec.ips, None);
        let json = serde_json::to_value(import.to_service_import(&svc())).unwrap();
        assert!(json["spec"].get("ips").is_none(), "{json}");
        assert_eq!(json["spec"]["type"], "Headless");
    }
}

#[test]
fn conformance_14_external_name_is_invalid_and_creates_no_import() {
    let mut service = core_service(Some("ExternalName"), None, vec![]);
    if let Some(spec) = service.spec.as_mut() {
        spec.external_name = Some("example.com".into());
    }
    let facts = ServiceFacts::try_from(&service).unwrap();
    assert_eq!(facts.kind(), ServiceKind::ExternalName);
    let c0 = Constituent::new(id(C0), at(0), Some(facts.clone()));
    let c1 = Constituent::new(id(C1), at(2), Some(facts));
    for order in both_orders(&c0, &c1) {
        let outcome = merged(&order);
        assert!(outcome.import.is_none());
        for conditions in outcome.exports.values() {
            assert_eq!(conditions.valid.status, ConditionStatus::False);
            assert_eq!(conditions.valid.reason, "InvalidServiceType");
            assert!(conditions.valid.message.contains("ExternalName"));
            assert_eq!(conditions.conflict.status, ConditionStatus::False);
            assert_eq!(conditions.conflict.reason, "NoConflicts");
        }
        let mut state = ClusterSetState::new(Stability::Sticky);
        for c in &order {
            let change = state.upsert(&svc(), c.clone());
            assert_eq!(change.import, ImportChange::Unchanged);
            assert_eq!(
                change.conditions.len(),
                1,
                "only the new export's conditions"
            );
        }
        assert!(state.import(&svc()).is_none());
    }
}

#[test]
fn conformance_15_conflicting_headlessness_uses_oldest_type() {
    let c0 = export(C0, 0, hello(ServiceKind::ClusterSetIp));
    let c1 = export(C1, 2, hello(ServiceKind::Headless));
    for order in both_orders(&c0, &c1) {
        let outcome = merged(&order);
        assert_conflict_everywhere(&outcome, &[ConflictReason::TypeConflict]);
        let import = outcome.import.as_ref().unwrap();
        assert_eq!(import.spec.type_, ServiceImportType::ClusterSetIp);
        assert_eq!(
            import.source,
            Source::Winner {
                cluster: id(C0),
                reason: WinReason::Oldest
            }
        );
        assert_eq!(
            outcome.exports[&id(C1)].conflict.message,
            r#"Conflicting type. Using "ClusterSetIP" from oldest service export in "remote". 1/2 clusters disagree."#
        );
        assert_eq!(
            outcome.exports[&id(C0)].conflict,
            outcome.exports[&id(C1)].conflict
        );
    }
}

#[test]
fn conformance_fixture_export_parses_with_defaults() {
    // The suite's ServiceExport has no spec at all: no exported labels or annotations.
    let export = ServiceExport {
        metadata: ObjectMeta {
            name: Some("hello".into()),
            namespace: Some("mcs-conformance".into()),
            creation_timestamp: Some(at(0).into()),
            ..ObjectMeta::default()
        },
        spec: ServiceExportSpec::default(),
        status: None,
    };
    let c = Constituent::from_export(id(C0), &export, None).unwrap();
    assert!(c.exported_labels().is_empty() && c.exported_annotations().is_empty());
    assert_eq!(c.created(), at(0));
    assert_eq!(c.validity(), ValidReason::NoService);
}
