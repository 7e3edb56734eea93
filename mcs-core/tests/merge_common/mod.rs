//! Helpers shared by the `merge_*` tests (included with `#[path]`; as its own test target
//! it has no tests).
#![allow(dead_code, unreachable_pub)]

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort as CoreServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::jiff::Timestamp;
use mcs_core::ClusterId;
use mcs_core::api::{
    ClientIpConfig, InternalTrafficPolicy, IpFamily, Protocol, ServicePort, SessionAffinity,
    SessionAffinityConfig, StringMap,
};
use mcs_core::conditions::{ConditionStatus, ConflictReason, ConflictReasons};
use mcs_core::merge::{
    ClusterSetState, Constituent, MergeOutcome, ServiceFacts, ServiceFactsBuilder, ServiceKind,
    Stability, merge,
};
use mcs_core::name::ServiceRef;

/// The conformance namespace and service.
pub fn svc() -> ServiceRef {
    ServiceRef::new("mcs-conformance", "hello").unwrap()
}

/// A cluster id; panics on a bad literal.
pub fn id(s: &str) -> ClusterId {
    s.parse().unwrap()
}

/// A creation time `secs` seconds after an arbitrary epoch.
pub fn at(secs: i64) -> Timestamp {
    Timestamp::from_second(1_780_000_000 + secs).unwrap()
}

/// A named port with an explicit protocol.
pub fn port(name: &str, protocol: Protocol, number: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        protocol: Some(protocol),
        app_protocol: None,
        port: number,
    }
}

/// A label or annotation map from pairs.
pub fn labels(pairs: &[(&str, &str)]) -> StringMap {
    pairs
        .iter()
        .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
        .collect()
}

/// The conformance `hello` Service as the API server stores it: ports tcp/TCP/42 and
/// udp/UDP/42, `sessionAffinity: ClientIP` with timeout 10, single-stack IPv4,
/// `internalTrafficPolicy: Cluster`.
pub fn hello(kind: ServiceKind) -> ServiceFactsBuilder {
    ServiceFacts::builder(kind)
        .port(port("tcp", Protocol::Tcp, 42))
        .port(port("udp", Protocol::Udp, 42))
        .session_affinity(SessionAffinity::ClientIp)
        .session_affinity_config(client_ip_timeout(10))
        .ip_families([IpFamily::IPv4])
        .internal_traffic_policy(InternalTrafficPolicy::Cluster)
}

/// `sessionAffinityConfig.clientIP.timeoutSeconds`.
pub fn client_ip_timeout(seconds: i32) -> SessionAffinityConfig {
    SessionAffinityConfig {
        client_ip: Some(ClientIpConfig {
            timeout_seconds: Some(seconds),
        }),
    }
}

/// A valid constituent of `cluster`, created `secs` seconds after the epoch of [`at`].
pub fn export(cluster: &str, secs: i64, facts: ServiceFactsBuilder) -> Constituent {
    Constituent::new(id(cluster), at(secs), Some(facts.build().unwrap()))
}

/// A core Service named like [`svc`], with the given type, clusterIP and ports.
pub fn core_service(
    type_: Option<&str>,
    cluster_ip: Option<&str>,
    ports: Vec<CoreServicePort>,
) -> Service {
    Service {
        metadata: ObjectMeta {
            name: Some("hello".into()),
            namespace: Some("mcs-conformance".into()),
            ..ObjectMeta::default()
        },
        spec: Some(ServiceSpec {
            type_: type_.map(str::to_owned),
            cluster_ip: cluster_ip.map(str::to_owned),
            ports: Some(ports),
            ..ServiceSpec::default()
        }),
        status: None,
    }
}

/// A core Service port.
pub fn core_port(name: &str, protocol: Option<&str>, number: i32) -> CoreServicePort {
    CoreServicePort {
        name: Some(name.to_owned()),
        protocol: protocol.map(str::to_owned),
        port: number,
        ..CoreServicePort::default()
    }
}

/// Merges with the pure function in the given order and reversed, and through a state fed
/// in both orders under both policies; asserts all agree and returns the outcome.
pub fn merged(exports: &[Constituent]) -> MergeOutcome {
    let s = svc();
    let forward = merge(&s, exports, Stability::Fresh, None).unwrap();
    let mut reversed: Vec<Constituent> = exports.to_vec();
    reversed.reverse();
    assert_eq!(
        merge(&s, &reversed, Stability::Fresh, None).unwrap(),
        forward,
        "pure merge depends on order"
    );
    for stability in [Stability::Fresh, Stability::Sticky] {
        for order in [exports.to_vec(), reversed.clone()] {
            let state = upsert_all(stability, &order);
            if exports.is_empty() {
                assert!(state.outcome(&s).is_none());
            } else {
                assert_eq!(
                    state.outcome(&s).as_ref(),
                    Some(&forward),
                    "state ({stability:?}) disagrees with the pure merge"
                );
            }
        }
        let built =
            ClusterSetState::build(stability, exports.iter().map(|c| (s.clone(), c.clone())));
        if !exports.is_empty() {
            assert_eq!(
                built.outcome(&s).as_ref(),
                Some(&forward),
                "build ({stability:?}) disagrees"
            );
        }
    }
    forward
}

/// A state fed the exports of [`svc`] in the given order.
pub fn upsert_all(stability: Stability, exports: &[Constituent]) -> ClusterSetState {
    let mut state = ClusterSetState::new(stability);
    for c in exports {
        state.upsert(&svc(), c.clone());
    }
    state
}

/// A reason set from a list.
pub fn reasons(list: &[ConflictReason]) -> ConflictReasons {
    list.iter().copied().collect()
}

/// Asserts every export is valid and carries `Conflict` with exactly these reasons.
pub fn assert_conflict_everywhere(outcome: &MergeOutcome, expected: &[ConflictReason]) {
    let expected = reasons(expected);
    assert_eq!(outcome.conflicts, expected);
    for (cluster, conditions) in &outcome.exports {
        assert_eq!(
            conditions.valid.status,
            ConditionStatus::True,
            "{cluster} valid"
        );
        assert_eq!(
            conditions.conflict.status,
            expected.status(),
            "{cluster} conflict status"
        );
        assert_eq!(
            conditions.conflict.reason,
            expected.to_string(),
            "{cluster} conflict reason"
        );
    }
}

/// Port lists sorted by lower-case name, as conformance compares them.
pub fn sorted_ports(ports: &[ServicePort]) -> Vec<ServicePort> {
    let mut ports = ports.to_vec();
    ports.sort_by_key(|p| p.name.clone().unwrap_or_default().to_lowercase());
    ports
}

/// `name/port` to the clusters that port routes to, for assertions.
pub fn route_map(outcome: &MergeOutcome) -> BTreeMap<String, Vec<String>> {
    outcome
        .import
        .iter()
        .flat_map(|i| &i.routes)
        .map(|r| {
            (
                format!(
                    "{}/{}",
                    r.port.name.clone().unwrap_or_default(),
                    r.port.port
                ),
                r.clusters.iter().map(|c| c.to_string()).collect(),
            )
        })
        .collect()
}
