//! Bad input gives a typed error naming the object and the problem, or a clear result;
//! never a panic.

#[path = "merge_common/mod.rs"]
mod common;

use common::*;
use k8s_openapi::api::core::v1::{ClientIPConfig, Service, SessionAffinityConfig as CoreAffinity};
use mcs_core::api::v1beta1::ServiceExport;
use mcs_core::api::{IpFamily, Protocol, ServiceExportSpec, ServicePort};
use mcs_core::conditions::{ConditionStatus, ConflictReason, is_valid_reason};
use mcs_core::merge::{
    ClusterSetState, Constituent, InputError, MAX_MESSAGE_LEN, MergeError, ServiceFacts,
    ServiceKind, SpecError, Stability, merge,
};

fn problem(service: &Service) -> SpecError {
    match ServiceFacts::try_from(service) {
        Err(InputError::Service { service, problem }) => {
            assert_eq!(service, "mcs-conformance/hello");
            problem
        }
        other => panic!("expected a spec error, got {other:?}"),
    }
}

fn with_spec(f: impl FnOnce(&mut k8s_openapi::api::core::v1::ServiceSpec)) -> Service {
    let mut service = core_service(
        None,
        Some("10.0.0.1"),
        vec![core_port("tcp", Some("TCP"), 42)],
    );
    if let Some(spec) = service.spec.as_mut() {
        f(spec);
    }
    service
}

#[test]
fn duplicate_port_names() {
    let service = core_service(
        None,
        None,
        vec![
            core_port("tcp", Some("TCP"), 42),
            core_port("tcp", Some("TCP"), 43),
        ],
    );
    assert_eq!(
        problem(&service),
        SpecError::DuplicatePortName { name: "tcp".into() }
    );
    let message = ServiceFacts::try_from(&service).unwrap_err().to_string();
    assert_eq!(
        message,
        r#"service mcs-conformance/hello cannot be merged: port name "tcp" is used by more than one port"#
    );
}

#[test]
fn duplicate_protocol_and_port_with_missing_protocol_read_as_tcp() {
    let service = core_service(
        None,
        None,
        vec![core_port("a", None, 42), core_port("b", Some("TCP"), 42)],
    );
    assert_eq!(
        problem(&service),
        SpecError::DuplicatePort {
            protocol: Protocol::Tcp,
            port: 42
        }
    );
    // Same number, other protocol: fine.
    let service = core_service(
        None,
        None,
        vec![core_port("a", None, 42), core_port("b", Some("UDP"), 42)],
    );
    assert!(ServiceFacts::try_from(&service).is_ok());
}

#[test]
fn ports_outside_the_valid_range() {
    for number in [0, -1, 65_536, i32::MAX, i32::MIN] {
        let service = core_service(
            None,
            None,
            vec![
                core_port("tcp", Some("TCP"), 42),
                core_port("web", None, number),
            ],
        );
        assert_eq!(
            problem(&service),
            SpecError::PortOutOfRange {
                index: 1,
                name: "web".into(),
                port: number
            }
        );
    }
    for number in [1, 65_535] {
        let service = core_service(None, None, vec![core_port("tcp", Some("TCP"), number)]);
        assert!(ServiceFacts::try_from(&service).is_ok(), "{number}");
    }
    let err = ServiceFacts::builder(ServiceKind::ClusterSetIp)
        .port(ServicePort {
            port: 70_000,
            ..ServicePort::default()
        })
        .build()
        .unwrap_err();
    assert_eq!(
        err.to_string(),
        r#"ports[0] ("") has number 70000, outside 1..=65535"#
    );
}

#[test]
fn unknown_protocol() {
    let service = core_service(None, None, vec![core_port("web", Some("HTTP"), 80)]);
    assert_eq!(
        problem(&service),
        SpecError::UnknownProtocol {
            index: 0,
            name: "web".into(),
            value: "HTTP".into()
        }
    );
    let service = core_service(None, None, vec![core_port("web", Some("tcp"), 80)]);
    assert!(
        matches!(problem(&service), SpecError::UnknownProtocol { .. }),
        "case-sensitive like the API"
    );
}

#[test]
fn unknown_enumerated_values() {
    let cases: Vec<(Service, SpecError)> = vec![
        (
            with_spec(|s| s.type_ = Some("Cluster".into())),
            SpecError::UnknownType {
                value: "Cluster".into(),
            },
        ),
        (
            with_spec(|s| s.session_affinity = Some("Cookie".into())),
            SpecError::UnknownSessionAffinity {
                value: "Cookie".into(),
            },
        ),
        (
            with_spec(|s| s.internal_traffic_policy = Some("Node".into())),
            SpecError::UnknownInternalTrafficPolicy {
                value: "Node".into(),
            },
        ),
        (
            with_spec(|s| s.traffic_distribution = Some("PreferRegion".into())),
            SpecError::UnknownTrafficDistribution {
                value: "PreferRegion".into(),
            },
        ),
        (
            with_spec(|s| s.ip_families = Some(vec!["IPv4".into(), "IPv5".into()])),
            SpecError::UnknownIpFamily {
                value: "IPv5".into(),
            },
        ),
        (
            with_spec(|s| s.ip_families = Some(vec!["IPv6".into(), "IPv6".into()])),
            SpecError::DuplicateIpFamily {
                family: IpFamily::IPv6,
            },
        ),
    ];
    for (service, expected) in cases {
        let err = ServiceFacts::try_from(&service).unwrap_err();
        let message = err.to_string();
        assert!(
            message.starts_with("service mcs-conformance/hello cannot be merged: "),
            "{message}"
        );
        assert_eq!(problem(&service), expected, "{message}");
    }
}

#[test]
fn every_field_parses_when_valid() {
    let service = with_spec(|s| {
        s.type_ = Some("LoadBalancer".into());
        s.session_affinity = Some("ClientIP".into());
        s.session_affinity_config = Some(CoreAffinity {
            client_ip: Some(ClientIPConfig {
                timeout_seconds: Some(10),
            }),
        });
        s.internal_traffic_policy = Some("Local".into());
        s.traffic_distribution = Some("PreferSameZone".into());
        s.ip_families = Some(vec!["IPv6".into(), "IPv4".into()]);
    });
    let facts = ServiceFacts::try_from(&service).unwrap();
    assert_eq!(facts.kind(), ServiceKind::ClusterSetIp);
    assert_eq!(
        facts.session_affinity_config(),
        Some(&client_ip_timeout(10))
    );
    assert_eq!(facts.ip_families(), [IpFamily::IPv6, IpFamily::IPv4]);
}

#[test]
fn external_name_is_a_fact_not_an_error() {
    // Even with ports that would be rejected otherwise: nothing of it is merged.
    let service = core_service(
        Some("ExternalName"),
        None,
        vec![
            core_port("a", Some("HTTP"), 0),
            core_port("a", Some("HTTP"), 0),
        ],
    );
    let facts = ServiceFacts::try_from(&service).unwrap();
    assert_eq!(facts.kind(), ServiceKind::ExternalName);
    assert!(facts.ports().is_empty());
}

#[test]
fn missing_spec_and_missing_names() {
    let service = Service::default();
    let err = ServiceFacts::try_from(&service).unwrap_err();
    assert_eq!(
        err,
        InputError::MissingSpec {
            service: "<no namespace>/<no name>".into()
        }
    );
    assert_eq!(
        err.to_string(),
        "service <no namespace>/<no name> cannot be merged: it has no spec"
    );
}

#[test]
fn export_without_creation_timestamp() {
    let mut export = ServiceExport::new("hello", ServiceExportSpec::default());
    export.metadata.namespace = Some("mcs-conformance".into());
    let err = Constituent::from_export(id("east"), &export, None).unwrap_err();
    assert_eq!(
        err,
        InputError::MissingCreationTimestamp {
            export: "mcs-conformance/hello".into()
        }
    );
    assert!(err.to_string().contains("mcs-conformance/hello"));
}

#[test]
fn the_same_cluster_twice_in_a_pure_merge() {
    let facts = || hello(ServiceKind::ClusterSetIp);
    let err = merge(
        &svc(),
        &[export("east", 0, facts()), export("east", 1, facts())],
        Stability::Fresh,
        None,
    )
    .unwrap_err();
    assert_eq!(
        err,
        MergeError::DuplicateCluster {
            service: "mcs-conformance/hello".into(),
            cluster: id("east")
        }
    );
    assert!(err.to_string().contains(r#"cluster "east""#), "{err}");
}

#[test]
fn fifty_clusters_that_all_disagree() {
    let exports: Vec<Constituent> = (0..50)
        .map(|i| {
            let kind = if i % 2 == 0 {
                ServiceKind::ClusterSetIp
            } else {
                ServiceKind::Headless
            };
            let families = match i % 3 {
                0 => vec![IpFamily::IPv4],
                1 => vec![IpFamily::IPv6],
                _ => vec![IpFamily::IPv6, IpFamily::IPv4],
            };
            let facts = ServiceFacts::builder(kind)
                .port(port("tcp", Protocol::Tcp, 1000 + i))
                .port(port(&format!("p{i}"), Protocol::Udp, 42))
                .session_affinity_config(client_ip_timeout(i + 1))
                .ip_families(families);
            // Every export created in the same second: the tie-break decides.
            Constituent::new(
                id(&format!("cluster-{i:02}")),
                at(0),
                Some(facts.build().unwrap()),
            )
            .with_exported_labels(labels(&[("cluster", &i.to_string())]))
        })
        .collect();
    let outcome = merged(&exports);
    let import = outcome.import.as_ref().unwrap();
    assert_eq!(import.source.cluster(), &id("cluster-00"));
    assert_eq!(
        import.spec.ports,
        [
            port("tcp", Protocol::Tcp, 1000),
            port("p0", Protocol::Udp, 42)
        ]
    );
    assert_eq!(import.clusters.len(), 50);
    assert_eq!(import.routes[0].clusters, [id("cluster-00")]);
    assert_eq!(import.routes[1].clusters, [id("cluster-00")]);
    assert_conflict_everywhere(
        &outcome,
        &[
            ConflictReason::PortConflict,
            ConflictReason::TypeConflict,
            ConflictReason::SessionAffinityConfigConflict,
            ConflictReason::LabelsConflict,
            ConflictReason::IpFamilyConflict,
        ],
    );
    let conflict = &outcome.exports[&id("cluster-31")].conflict;
    assert!(is_valid_reason(&conflict.reason));
    assert!(
        conflict.message.contains("49/50 clusters disagree."),
        "{}",
        conflict.message
    );
    assert!(
        conflict.message.contains("25/50 clusters disagree."),
        "{}",
        conflict.message
    );
    assert!(
        conflict
            .message
            .contains("50 exports share the oldest creationTimestamp")
    );
}

#[test]
fn huge_port_lists_keep_messages_within_the_crd_limit() {
    let exports: Vec<Constituent> = (0..50)
        .map(|c| {
            let facts = ServiceFacts::builder(ServiceKind::ClusterSetIp)
                .ports(
                    (0..1000)
                        .map(|p| port(&format!("port-{c}-{p}"), Protocol::Tcp, 1 + c * 1000 + p)),
                )
                .build()
                .unwrap();
            Constituent::new(id(&format!("c{c}")), at(c.into()), Some(facts))
        })
        .collect();
    let outcome = merge(&svc(), &exports, Stability::Fresh, None).unwrap();
    let import = outcome.import.unwrap();
    assert_eq!(import.spec.ports.len(), 50_000);
    let message = &outcome.exports[&id("c7")].conflict.message;
    assert!(message.len() <= MAX_MESSAGE_LEN);
    assert!(message.contains("and 49984 more"), "{message}");
}

#[test]
fn a_state_with_only_invalid_exports_publishes_nothing() {
    let mut state = ClusterSetState::new(Stability::Sticky);
    let external = ServiceFacts::builder(ServiceKind::ExternalName)
        .build()
        .unwrap();
    state.upsert(&svc(), Constituent::new(id("a"), at(0), None));
    state.upsert(&svc(), Constituent::new(id("b"), at(0), Some(external)));
    assert!(state.import(&svc()).is_none());
    assert_eq!(state.len(), 1);
    for cluster in ["a", "b"] {
        let conditions = state.conditions(&svc(), &id(cluster)).unwrap();
        assert_eq!(conditions.valid.status, ConditionStatus::False);
    }
    // Removing an unknown export or refreshing an unknown service is a no-op.
    let unknown = mcs_core::name::ServiceRef::new("x", "y").unwrap();
    assert!(state.remove(&unknown, &id("a")).is_empty());
    assert!(state.remove(&svc(), &id("zzz")).is_empty());
    assert!(state.refresh(&unknown).is_empty());
    assert!(state.remove_cluster(&id("zzz")).is_empty());
}
