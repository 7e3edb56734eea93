//! The objects the agent wants in its own cluster, computed without I/O: names, the derived
//! Service of a ClusterSetIP import, and the imported EndpointSlices of one source cluster.

use std::collections::{BTreeMap, BTreeSet};

use data_encoding::BASE32HEX_NOPAD;
use k8s_openapi::api::core::v1::{Service, ServicePort as CoreServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcs_core::ClusterId;
use mcs_core::api::{LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, ServicePort};
use mcs_core::slices::{endpoints_field, endpoints_of};
use sha2::{Digest, Sha256};

pub use crate::labels::{
    LABEL_K8S_SERVICE_NAME, LABEL_MANAGED_BY, LABEL_SLICE_MANAGED_BY, MANAGED_BY,
};
/// Endpoints per imported slice (the Kubernetes default `maxEndpointsPerSlice`).
pub const MAX_ENDPOINTS_PER_SLICE: usize = 100;

/// The derived ClusterIP Service of `<ns>/<name>`: `derived-` and the first 10 characters
/// of the lower-cased, unpadded base32hex SHA-256 of `<ns>/<name>` (the reference
/// controller's scheme, so implementations agree on the name).
pub fn derived_service_name(namespace: &str, name: &str) -> String {
    let digest = Sha256::digest(format!("{namespace}/{name}").as_bytes());
    let encoded = BASE32HEX_NOPAD.encode(&digest).to_ascii_lowercase();
    format!("derived-{}", &encoded[..10])
}

/// The name of an imported slice: `imported-<svc>-<cluster>-<family>[-<n>]`, hashed when
/// it would exceed 253 characters.
pub fn imported_slice_name(
    service: &str,
    cluster: &ClusterId,
    family: &str,
    index: usize,
    ports_key: &str,
) -> String {
    let family = family.to_ascii_lowercase();
    let suffix = if ports_key.is_empty() {
        String::new()
    } else {
        format!("-{}", short_hash(ports_key))
    };
    let index = if index == 0 {
        String::new()
    } else {
        format!("-{index}")
    };
    let name = format!("imported-{service}-{cluster}-{family}{suffix}{index}");
    if name.len() <= 253 {
        name
    } else {
        format!("imported-{}{index}", short_hash(&name))
    }
}

fn short_hash(s: &str) -> String {
    let digest = Sha256::digest(s.as_bytes());
    BASE32HEX_NOPAD.encode(&digest[..10]).to_ascii_lowercase()
}

/// The derived Service of a ClusterSetIP import: selector-less ClusterIP, same ports, owned
/// by the ServiceImport (so it goes when the import goes).
pub fn derived_service(
    namespace: &str,
    import_name: &str,
    import_uid: Option<&str>,
    ports: &[ServicePort],
) -> Service {
    let name = derived_service_name(namespace, import_name);
    let owner = import_uid.map(|uid| OwnerReference {
        api_version: "multicluster.x-k8s.io/v1beta1".into(),
        kind: "ServiceImport".into(),
        name: import_name.into(),
        uid: uid.into(),
        controller: Some(false),
        block_owner_deletion: None,
    });
    Service {
        metadata: ObjectMeta {
            name: Some(name),
            namespace: Some(namespace.into()),
            labels: Some(BTreeMap::from([
                (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
                (LABEL_SERVICE_NAME.to_owned(), import_name.to_owned()),
            ])),
            owner_references: owner.map(|o| vec![o]),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            ip_family_policy: Some("PreferDualStack".into()),
            ports: Some(
                ports
                    .iter()
                    .map(|p| CoreServicePort {
                        name: p.name.clone(),
                        protocol: Some(p.protocol_or_default().as_str().to_owned()),
                        app_protocol: p.app_protocol.clone(),
                        port: p.port,
                        target_port: Some(IntOrString::Int(p.port)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

/// The imported slices for one source cluster of `<ns>/<service>`.
///
/// `source` are the source Service's own slices in the source cluster; `ports` are the
/// merged import ports that may route to this cluster (a slice port is kept only when its
/// name is one of them). Endpoints are grouped by address type and port set (so each
/// endpoint keeps the ports it really has), de-duplicated by address, and split into slices
/// of at most [`MAX_ENDPOINTS_PER_SLICE`]. Names are deterministic.
pub fn imported_slices(
    namespace: &str,
    service: &str,
    derived: Option<&str>,
    cluster: &ClusterId,
    source: &[EndpointSlice],
    ports: &[ServicePort],
) -> Vec<EndpointSlice> {
    let wanted: BTreeSet<(String, String)> = ports
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.protocol_or_default().as_str().to_owned(),
            )
        })
        .collect();
    // (family, ports) -> address -> endpoint
    let mut groups: BTreeMap<(String, Vec<EndpointPortKey>), BTreeMap<String, Endpoint>> =
        BTreeMap::new();
    for slice in source {
        if slice.address_type != "IPv4" && slice.address_type != "IPv6" {
            continue;
        }
        let mut slice_ports: Vec<EndpointPortKey> = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                let key = EndpointPortKey {
                    name: p.name.clone().unwrap_or_default(),
                    protocol: p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                    port: p.port?,
                    app_protocol: p.app_protocol.clone(),
                };
                wanted
                    .contains(&(key.name.clone(), key.protocol.clone()))
                    .then_some(key)
            })
            .collect();
        slice_ports.sort();
        slice_ports.dedup();
        if slice_ports.is_empty() {
            continue;
        }
        let group = groups
            .entry((slice.address_type.clone(), slice_ports))
            .or_default();
        for ep in endpoints_of(slice) {
            let Some(first) = ep.addresses.first() else {
                continue;
            };
            let imported = Endpoint {
                addresses: ep.addresses.clone(),
                conditions: ep.conditions.clone(),
                hostname: ep.hostname.clone(),
                zone: ep.zone.clone(),
                hints: None,
                deprecated_topology: None,
                node_name: None,
                target_ref: None,
            };
            group.insert(first.clone(), imported);
        }
    }
    let mut out = Vec::new();
    for ((family, ports), endpoints) in groups {
        let ports_key = ports
            .iter()
            .map(|p| format!("{}/{}/{}", p.name, p.protocol, p.port))
            .collect::<Vec<_>>()
            .join(",");
        let endpoints: Vec<Endpoint> = endpoints.into_values().collect();
        for (index, chunk) in endpoints.chunks(MAX_ENDPOINTS_PER_SLICE).enumerate() {
            let mut labels = BTreeMap::from([
                (LABEL_SERVICE_NAME.to_owned(), service.to_owned()),
                (LABEL_SOURCE_CLUSTER.to_owned(), cluster.to_string()),
                (LABEL_SLICE_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
                (LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned()),
            ]);
            if let Some(derived) = derived {
                labels.insert(LABEL_K8S_SERVICE_NAME.to_owned(), derived.to_owned());
            }
            out.push(EndpointSlice {
                address_type: family.clone(),
                metadata: ObjectMeta {
                    name: Some(imported_slice_name(
                        service, cluster, &family, index, &ports_key,
                    )),
                    namespace: Some(namespace.to_owned()),
                    labels: Some(labels),
                    ..Default::default()
                },
                endpoints: endpoints_field(chunk.to_vec()),
                ports: Some(
                    ports
                        .iter()
                        .map(|p| EndpointPort {
                            name: Some(p.name.clone()),
                            port: Some(p.port),
                            protocol: Some(p.protocol.clone()),
                            app_protocol: p.app_protocol.clone(),
                        })
                        .collect(),
                ),
            });
        }
    }
    out
}

#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct EndpointPortKey {
    name: String,
    protocol: String,
    port: i32,
    app_protocol: Option<String>,
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::discovery::v1::EndpointConditions;
    use mcs_core::api::Protocol;

    use super::*;

    #[test]
    fn derived_names_follow_the_reference_scheme() {
        let name = derived_service_name("demo", "serve");
        assert!(name.starts_with("derived-") && name.len() == 18, "{name}");
        assert_eq!(name, derived_service_name("demo", "serve"), "deterministic");
        assert_ne!(name, derived_service_name("demo", "other"));
        assert!(
            name[8..]
                .chars()
                .all(|c| c.is_ascii_digit() || ('a'..='v').contains(&c))
        );
    }

    fn source(family: &str, addrs: &[&str], ports: &[(&str, i32)]) -> EndpointSlice {
        EndpointSlice {
            address_type: family.into(),
            metadata: ObjectMeta::default(),
            endpoints: addrs
                .iter()
                .map(|a| Endpoint {
                    addresses: vec![a.to_string()],
                    conditions: Some(EndpointConditions {
                        ready: Some(true),
                        ..Default::default()
                    }),
                    node_name: Some("node-1".into()),
                    ..Default::default()
                })
                .collect(),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p)| EndpointPort {
                        name: Some(n.to_string()),
                        port: Some(*p),
                        protocol: Some("TCP".into()),
                        ..Default::default()
                    })
                    .collect(),
            ),
        }
    }

    fn port(name: &str, port: i32) -> ServicePort {
        ServicePort {
            name: Some(name.into()),
            protocol: Some(Protocol::Tcp),
            app_protocol: None,
            port,
        }
    }

    #[test]
    fn slices_are_grouped_deduplicated_chunked_and_labelled() {
        let east = ClusterId::new("east").unwrap();
        let addrs: Vec<String> = (0..150)
            .map(|i| format!("10.0.{}.{}", i / 100, i % 100 + 1))
            .collect();
        let refs: Vec<&str> = addrs.iter().map(String::as_str).collect();
        let s1 = source("IPv4", &refs[..120], &[("grpc", 8443)]);
        let s2 = source("IPv4", &refs[100..], &[("grpc", 8443)]);
        let s3 = source("IPv6", &["fd00::1"], &[("grpc", 8443), ("metrics", 9090)]);
        let out = imported_slices(
            "loyalty",
            "loyalty-accrual",
            Some("derived-abc"),
            &east,
            &[s1, s2, s3],
            &[port("grpc", 9443)],
        );
        assert_eq!(
            out.len(),
            3,
            "150 IPv4 endpoints in two chunks plus one IPv6 slice"
        );
        let total: usize = out
            .iter()
            .filter(|s| s.address_type == "IPv4")
            .map(|s| s.endpoints.len())
            .sum();
        assert_eq!(total, 150, "duplicates across source slices removed");
        for s in &out {
            let labels = s.metadata.labels.as_ref().unwrap();
            assert_eq!(labels[LABEL_SERVICE_NAME], "loyalty-accrual");
            assert_eq!(labels[LABEL_SOURCE_CLUSTER], "east");
            assert_eq!(labels[LABEL_SLICE_MANAGED_BY], MANAGED_BY);
            assert_eq!(labels[LABEL_K8S_SERVICE_NAME], "derived-abc");
            assert_eq!(
                s.ports.as_ref().unwrap().len(),
                1,
                "metrics is not an import port"
            );
            assert!(s.endpoints.len() <= MAX_ENDPOINTS_PER_SLICE);
            assert!(s.endpoints.iter().all(|e| e.node_name.is_none()));
        }
        let names: BTreeSet<_> = out
            .iter()
            .map(|s| s.metadata.name.clone().unwrap())
            .collect();
        assert_eq!(names.len(), 3, "unique names");
        let again = imported_slices(
            "loyalty",
            "loyalty-accrual",
            Some("derived-abc"),
            &east,
            &[
                source("IPv4", &refs[..120], &[("grpc", 8443)]),
                source("IPv4", &refs[100..], &[("grpc", 8443)]),
                source("IPv6", &["fd00::1"], &[("grpc", 8443), ("metrics", 9090)]),
            ],
            &[port("grpc", 9443)],
        );
        assert_eq!(again, out, "deterministic");
        assert!(
            imported_slices(
                "loyalty",
                "x",
                None,
                &east,
                &[source("IPv4", &["10.0.0.1"], &[("other", 1)])],
                &[port("grpc", 1)]
            )
            .is_empty(),
            "no eligible port, no slice"
        );
    }

    #[test]
    fn derived_service_copies_ports_and_owner() {
        let svc = derived_service("demo", "hello", Some("uid-1"), &[port("tcp", 42)]);
        let spec = svc.spec.unwrap();
        assert_eq!(spec.type_.as_deref(), Some("ClusterIP"));
        assert!(spec.selector.is_none());
        assert_eq!(spec.ports.unwrap()[0].port, 42);
        assert_eq!(svc.metadata.owner_references.unwrap()[0].uid, "uid-1");
    }
}
