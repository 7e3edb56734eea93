//! Reading EndpointSlices: the parts MCS cares about, parsed once at the edge.
//!
//! An MCS EndpointSlice (KEP-1645, "EndpointSlice") carries `multicluster.kubernetes.io/service-name`
//! and `multicluster.kubernetes.io/source-cluster` labels and holds endpoints of exactly one
//! source cluster. [`McsSlice::parse`] turns one into typed data or a typed error that names
//! the slice and the problem; [`SliceEndpoints::parse`] reads any slice (for example a
//! Service's own slices in an exporting cluster) given the cluster it comes from.

use std::net::IpAddr;
use std::sync::Arc;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};

use crate::ClusterId;
use crate::api::{LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, Protocol};
use crate::name::{Hostname, ServiceName};

k8s_openapi::k8s_if_ge_1_36! {
    /// The type of `EndpointSlice.endpoints` in the enabled Kubernetes version: optional
    /// from 1.36 on, a list up to 1.35 (k8s-openapi follows the API). [`endpoints_of`] and
    /// [`endpoints_field`] read and write it the same way on every version.
    pub type EndpointsField = Option<Vec<Endpoint>>;
}
k8s_openapi::k8s_if_le_1_35! {
    /// The type of `EndpointSlice.endpoints` in the enabled Kubernetes version: a list up
    /// to 1.35, optional from 1.36 on (k8s-openapi follows the API). [`endpoints_of`] and
    /// [`endpoints_field`] read and write it the same way on every version.
    pub type EndpointsField = Vec<Endpoint>;
}

/// The endpoints of `slice`, on every Kubernetes version (see [`EndpointsField`]); none
/// when the field is absent.
pub fn endpoints_of(slice: &EndpointSlice) -> &[Endpoint] {
    k8s_openapi::k8s_if_ge_1_36! {
        slice.endpoints.as_deref().unwrap_or_default()
    }
    k8s_openapi::k8s_if_le_1_35! {
        &slice.endpoints
    }
}

/// The value of `EndpointSlice.endpoints` for these endpoints, on every Kubernetes version
/// (see [`EndpointsField`]).
pub fn endpoints_field(endpoints: Vec<Endpoint>) -> EndpointsField {
    k8s_openapi::k8s_if_ge_1_36! {
        Some(endpoints)
    }
    k8s_openapi::k8s_if_le_1_35! {
        endpoints
    }
}

/// Why an EndpointSlice cannot be used.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SliceError {
    /// A required label is missing.
    #[error("EndpointSlice {slice}: missing label {label}")]
    MissingLabel {
        /// `<namespace>/<name>` of the slice.
        slice: String,
        /// The label.
        label: &'static str,
    },
    /// A label's value is invalid.
    #[error("EndpointSlice {slice}: label {label}={value:?} is invalid: {problem}")]
    BadLabel {
        /// `<namespace>/<name>` of the slice.
        slice: String,
        /// The label.
        label: &'static str,
        /// Its value.
        value: String,
        /// What is wrong.
        problem: String,
    },
    /// The address type is not IPv4 or IPv6 (FQDN slices are not used by MCS).
    #[error("EndpointSlice {slice}: address type {address_type:?} is not IPv4 or IPv6")]
    AddressType {
        /// `<namespace>/<name>` of the slice.
        slice: String,
        /// The address type.
        address_type: String,
    },
}

/// One endpoint of a slice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceEndpoint {
    /// Its addresses (all of the slice's address type). Unparseable addresses are dropped.
    pub addresses: Vec<IpAddr>,
    /// Its hostname, when set and a valid DNS label.
    pub hostname: Option<Hostname>,
    /// `conditions.ready` (a missing value means ready, as Kubernetes defines it).
    pub ready: bool,
    /// `conditions.serving` (missing: same as ready).
    pub serving: bool,
    /// `conditions.terminating` (missing: false).
    pub terminating: bool,
    /// The zone, when set.
    pub zone: Option<Arc<str>>,
}

impl SliceEndpoint {
    /// The endpoint's DNS hostname: its hostname, or its first address dashed
    /// (`10-244-0-5`) when it has none.
    pub fn dns_hostname(&self) -> Option<Hostname> {
        self.hostname
            .clone()
            .or_else(|| self.addresses.first().map(|ip| Hostname::from_ip(*ip)))
    }
}

/// A port of a slice.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct SlicePort {
    /// The port's name (empty when unnamed).
    pub name: String,
    /// The port number on the endpoints.
    pub port: u16,
    /// The protocol (TCP when missing).
    pub protocol: Protocol,
}

/// The endpoints and ports of any EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SliceEndpoints {
    /// The endpoints.
    pub endpoints: Vec<SliceEndpoint>,
    /// The ports. Ports with no number, a number outside 1..=65535 or an unknown protocol
    /// are dropped.
    pub ports: Vec<SlicePort>,
}

impl SliceEndpoints {
    /// Reads a slice's endpoints and ports. Errors only on an FQDN address type.
    pub fn parse(slice: &EndpointSlice) -> Result<Self, SliceError> {
        if slice.address_type != "IPv4" && slice.address_type != "IPv6" {
            return Err(SliceError::AddressType {
                slice: slice_name(slice),
                address_type: slice.address_type.clone(),
            });
        }
        let endpoints = endpoints_of(slice)
            .iter()
            .map(|ep| {
                let conditions = ep.conditions.as_ref();
                let ready = conditions.and_then(|c| c.ready).unwrap_or(true);
                SliceEndpoint {
                    addresses: ep.addresses.iter().filter_map(|a| a.parse().ok()).collect(),
                    hostname: ep.hostname.as_deref().and_then(|h| Hostname::new(h).ok()),
                    ready,
                    serving: conditions.and_then(|c| c.serving).unwrap_or(ready),
                    terminating: conditions.and_then(|c| c.terminating).unwrap_or(false),
                    zone: ep.zone.as_deref().map(Arc::from),
                }
            })
            .collect();
        let ports = slice
            .ports
            .iter()
            .flatten()
            .filter_map(|p| {
                let port = u16::try_from(p.port?).ok().filter(|p| *p != 0)?;
                let protocol = match p.protocol.as_deref() {
                    None => Protocol::Tcp,
                    Some(s) => Protocol::parse(s)?,
                };
                Some(SlicePort {
                    name: p.name.clone().unwrap_or_default(),
                    port,
                    protocol,
                })
            })
            .collect();
        Ok(Self { endpoints, ports })
    }
}

/// A parsed MCS EndpointSlice.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct McsSlice {
    /// The multi-cluster service (`multicluster.kubernetes.io/service-name`).
    pub service: ServiceName,
    /// The source cluster (`multicluster.kubernetes.io/source-cluster`).
    pub cluster: ClusterId,
    /// Endpoints and ports.
    pub data: SliceEndpoints,
}

impl McsSlice {
    /// Parses an MCS EndpointSlice.
    pub fn parse(slice: &EndpointSlice) -> Result<Self, SliceError> {
        let labels = slice.metadata.labels.as_ref();
        let label = |key: &'static str| {
            labels
                .and_then(|l| l.get(key))
                .ok_or_else(|| SliceError::MissingLabel {
                    slice: slice_name(slice),
                    label: key,
                })
        };
        let service_value = label(LABEL_SERVICE_NAME)?;
        let service = ServiceName::new(service_value).map_err(|e| SliceError::BadLabel {
            slice: slice_name(slice),
            label: LABEL_SERVICE_NAME,
            value: service_value.clone(),
            problem: e.to_string(),
        })?;
        let cluster_value = label(LABEL_SOURCE_CLUSTER)?;
        let cluster = ClusterId::new(cluster_value.as_str()).map_err(|e| SliceError::BadLabel {
            slice: slice_name(slice),
            label: LABEL_SOURCE_CLUSTER,
            value: cluster_value.clone(),
            problem: e.source.to_string(),
        })?;
        Ok(Self {
            service,
            cluster,
            data: SliceEndpoints::parse(slice)?,
        })
    }
}

/// `<namespace>/<name>` of an object, for messages.
pub(crate) fn slice_name(slice: &EndpointSlice) -> String {
    format!(
        "{}/{}",
        slice.metadata.namespace.as_deref().unwrap_or(""),
        slice.metadata.name.as_deref().unwrap_or("")
    )
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn slice(labels: &[(&str, &str)]) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            metadata: ObjectMeta {
                name: Some("imported-hello-east".into()),
                namespace: Some("demo".into()),
                labels: Some(
                    labels
                        .iter()
                        .map(|(k, v)| (k.to_string(), v.to_string()))
                        .collect::<BTreeMap<_, _>>(),
                ),
                ..Default::default()
            },
            endpoints: vec![
                Endpoint {
                    addresses: vec!["10.0.0.1".into()],
                    ..Default::default()
                },
                Endpoint {
                    addresses: vec!["10.0.0.2".into(), "not-an-ip".into()],
                    hostname: Some("web-1".into()),
                    conditions: Some(EndpointConditions {
                        ready: Some(false),
                        terminating: Some(true),
                        ..Default::default()
                    }),
                    zone: Some("z1".into()),
                    ..Default::default()
                },
            ],
            ports: Some(vec![
                EndpointPort {
                    name: Some("tcp".into()),
                    port: Some(42),
                    protocol: Some("TCP".into()),
                    ..Default::default()
                },
                EndpointPort {
                    name: Some("bad".into()),
                    port: Some(70000),
                    ..Default::default()
                },
            ]),
        }
    }

    #[test]
    fn parses_mcs_slices() {
        let s = McsSlice::parse(&slice(&[
            (LABEL_SERVICE_NAME, "hello"),
            (LABEL_SOURCE_CLUSTER, "east"),
        ]))
        .unwrap();
        assert_eq!(s.cluster.as_str(), "east");
        assert_eq!(s.data.endpoints.len(), 2);
        assert!(s.data.endpoints[0].ready, "missing conditions mean ready");
        assert!(!s.data.endpoints[1].ready && s.data.endpoints[1].terminating);
        assert_eq!(s.data.endpoints[1].addresses.len(), 1);
        assert_eq!(
            s.data.endpoints[0].dns_hostname().unwrap().as_str(),
            "10-0-0-1"
        );
        assert_eq!(
            s.data.endpoints[1].dns_hostname().unwrap().as_str(),
            "web-1"
        );
        assert_eq!(
            s.data.ports,
            vec![SlicePort {
                name: "tcp".into(),
                port: 42,
                protocol: Protocol::Tcp
            }]
        );
    }

    #[test]
    fn typed_errors_name_the_slice() {
        let err = McsSlice::parse(&slice(&[(LABEL_SERVICE_NAME, "hello")])).unwrap_err();
        assert!(
            err.to_string().contains("demo/imported-hello-east")
                && err.to_string().contains("source-cluster"),
            "{err}"
        );
        let err = McsSlice::parse(&slice(&[
            (LABEL_SERVICE_NAME, "hello"),
            (LABEL_SOURCE_CLUSTER, "East"),
        ]))
        .unwrap_err();
        assert!(matches!(err, SliceError::BadLabel { .. }), "{err}");
        let mut fqdn = slice(&[
            (LABEL_SERVICE_NAME, "hello"),
            (LABEL_SOURCE_CLUSTER, "east"),
        ]);
        fqdn.address_type = "FQDN".into();
        assert!(matches!(
            McsSlice::parse(&fqdn),
            Err(SliceError::AddressType { .. })
        ));
    }
}
