//! Merge inputs: one cluster's export of one service ([`Constituent`]) and the facts of its
//! local Service ([`ServiceFacts`]), parsed from the core types at this edge.

use std::collections::BTreeSet;
use std::fmt;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::jiff::Timestamp;

use crate::ClusterId;
use crate::api::v1beta1::ServiceExport;
use crate::api::{
    ClientIpConfig, ClusterSelector, InternalTrafficPolicy, InvalidClusterSelector, IpFamily,
    Protocol, ServiceImportType, ServicePort, SessionAffinity, SessionAffinityConfig, StringMap,
    TrafficDistribution, validate_cluster_selectors,
};
use crate::conditions::ValidReason;

/// The highest port number a Service may expose.
pub const MAX_PORT: i32 = 65_535;

/// What a Service is, as far as exporting goes (KEP-1645, "Service Types").
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum ServiceKind {
    /// `ClusterIP`, `NodePort` or `LoadBalancer` with a cluster IP: imported as `ClusterSetIP`.
    ClusterSetIp,
    /// `clusterIP: None`: imported as `Headless`.
    Headless,
    /// `ExternalName`: never exported; the export gets `Valid=False/InvalidServiceType`.
    ExternalName,
}

impl ServiceKind {
    /// The ServiceImport type this kind becomes, or `None` for `ExternalName`.
    pub fn import_type(self) -> Option<ServiceImportType> {
        match self {
            Self::ClusterSetIp => Some(ServiceImportType::ClusterSetIp),
            Self::Headless => Some(ServiceImportType::Headless),
            Self::ExternalName => None,
        }
    }
}

/// A problem in a Service's spec that keeps it out of the merge.
///
/// Messages name the offending field and value; [`InputError::Service`] adds the Service.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SpecError {
    /// Two ports share a name (an unnamed port counts as the name `""`).
    #[error("port name {name:?} is used by more than one port")]
    DuplicatePortName {
        /// The shared name (`""` for unnamed ports).
        name: String,
    },
    /// Two ports share a (protocol, port) pair.
    #[error("{protocol}/{port} is exposed by more than one port")]
    DuplicatePort {
        /// The protocol (a missing protocol is TCP).
        protocol: Protocol,
        /// The port number.
        port: i32,
    },
    /// A port number outside `1..=65535`.
    #[error("ports[{index}] ({name:?}) has number {port}, outside 1..=65535")]
    PortOutOfRange {
        /// Position in `spec.ports`.
        index: usize,
        /// The port's name (`""` when unnamed).
        name: String,
        /// The number.
        port: i32,
    },
    /// A protocol other than `TCP`, `UDP` or `SCTP`.
    #[error("ports[{index}] ({name:?}) has unknown protocol {value:?}; expected TCP, UDP or SCTP")]
    UnknownProtocol {
        /// Position in `spec.ports`.
        index: usize,
        /// The port's name (`""` when unnamed).
        name: String,
        /// The protocol found.
        value: String,
    },
    /// A `spec.type` other than the four Service types.
    #[error("unknown type {value:?}; expected ClusterIP, NodePort, LoadBalancer or ExternalName")]
    UnknownType {
        /// The type found.
        value: String,
    },
    /// A `spec.sessionAffinity` other than `ClientIP` or `None`.
    #[error("unknown sessionAffinity {value:?}; expected ClientIP or None")]
    UnknownSessionAffinity {
        /// The value found.
        value: String,
    },
    /// A `spec.internalTrafficPolicy` other than `Cluster` or `Local`.
    #[error("unknown internalTrafficPolicy {value:?}; expected Cluster or Local")]
    UnknownInternalTrafficPolicy {
        /// The value found.
        value: String,
    },
    /// A `spec.trafficDistribution` this version does not know.
    #[error(
        "unknown trafficDistribution {value:?}; expected PreferClose, PreferSameZone or PreferSameNode"
    )]
    UnknownTrafficDistribution {
        /// The value found.
        value: String,
    },
    /// A `spec.ipFamilies` entry other than `IPv4` or `IPv6`.
    #[error("unknown ipFamilies entry {value:?}; expected IPv4 or IPv6")]
    UnknownIpFamily {
        /// The value found.
        value: String,
    },
    /// `spec.ipFamilies` repeats a family.
    #[error("ipFamilies lists {family} more than once")]
    DuplicateIpFamily {
        /// The repeated family.
        family: IpFamily,
    },
}

/// Why a Service or ServiceExport cannot become merge input.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InputError {
    /// The Service's spec has a problem.
    #[error("service {service} cannot be merged: {problem}")]
    Service {
        /// `<namespace>/<name>` of the Service.
        service: String,
        /// What is wrong with its spec.
        problem: SpecError,
    },
    /// The Service has no `spec` at all.
    #[error("service {service} cannot be merged: it has no spec")]
    MissingSpec {
        /// `<namespace>/<name>` of the Service.
        service: String,
    },
    /// The ServiceExport has no `metadata.creationTimestamp`, which orders the exports.
    #[error(
        "service export {export} has no creationTimestamp; the merge needs it to order exports"
    )]
    MissingCreationTimestamp {
        /// `<namespace>/<name>` of the ServiceExport.
        export: String,
    },
}

/// The facts of a local Service that the merge uses, validated.
///
/// Ports are normalised: a missing protocol is stored as `TCP` and an empty name as no
/// name. Port names and (protocol, port) pairs are unique and numbers are in `1..=65535`;
/// IP families are unique. Other values are kept exactly as the Service has them (the API
/// server defaults `sessionAffinity`, its config and `internalTrafficPolicy`), because
/// conformance requires the import to equal the exported Service.
///
/// Build one with [`ServiceFacts::builder`] or from a core Service with `TryFrom`:
///
/// ```
/// use mcs_core::api::{Protocol, ServicePort};
/// use mcs_core::merge::{ServiceFacts, ServiceKind};
///
/// let facts = ServiceFacts::builder(ServiceKind::ClusterSetIp)
///     .port(ServicePort { name: Some("grpc".into()), port: 9443, ..Default::default() })
///     .build()
///     .unwrap();
/// assert_eq!(facts.ports()[0].protocol, Some(Protocol::Tcp));
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ServiceFacts {
    kind: ServiceKind,
    ports: Vec<ServicePort>,
    session_affinity: Option<SessionAffinity>,
    session_affinity_config: Option<SessionAffinityConfig>,
    ip_families: Vec<IpFamily>,
    internal_traffic_policy: Option<InternalTrafficPolicy>,
    traffic_distribution: Option<TrafficDistribution>,
}

impl ServiceFacts {
    /// A builder for facts of the given kind, with no ports and nothing else set.
    pub fn builder(kind: ServiceKind) -> ServiceFactsBuilder {
        ServiceFactsBuilder {
            facts: Self {
                kind,
                ports: Vec::new(),
                session_affinity: None,
                session_affinity_config: None,
                ip_families: Vec::new(),
                internal_traffic_policy: None,
                traffic_distribution: None,
            },
        }
    }

    /// Whether the Service is `ClusterSetIP`-like, headless or `ExternalName`.
    pub fn kind(&self) -> ServiceKind {
        self.kind
    }

    /// The ports, normalised, in the Service's order.
    pub fn ports(&self) -> &[ServicePort] {
        &self.ports
    }

    /// `spec.sessionAffinity`.
    pub fn session_affinity(&self) -> Option<SessionAffinity> {
        self.session_affinity
    }

    /// `spec.sessionAffinityConfig`.
    pub fn session_affinity_config(&self) -> Option<&SessionAffinityConfig> {
        self.session_affinity_config.as_ref()
    }

    /// `spec.ipFamilies` (empty when the Service states none).
    pub fn ip_families(&self) -> &[IpFamily] {
        &self.ip_families
    }

    /// `spec.internalTrafficPolicy`.
    pub fn internal_traffic_policy(&self) -> Option<InternalTrafficPolicy> {
        self.internal_traffic_policy
    }

    /// `spec.trafficDistribution`.
    pub fn traffic_distribution(&self) -> Option<TrafficDistribution> {
        self.traffic_distribution
    }

    /// Whether this Service exposes `port`: it has a port with the same name, protocol and
    /// number (`appProtocol` is a hint and does not affect reachability).
    pub fn exposes(&self, port: &ServicePort) -> bool {
        let key = port_key(port);
        self.ports.iter().any(|p| port_key(p) == key)
    }
}

/// Builds [`ServiceFacts`]; [`build`](Self::build) validates and normalises.
#[derive(Clone, Debug)]
#[must_use]
pub struct ServiceFactsBuilder {
    facts: ServiceFacts,
}

impl ServiceFactsBuilder {
    /// Adds a port.
    pub fn port(mut self, port: ServicePort) -> Self {
        self.facts.ports.push(port);
        self
    }

    /// Adds ports.
    pub fn ports(mut self, ports: impl IntoIterator<Item = ServicePort>) -> Self {
        self.facts.ports.extend(ports);
        self
    }

    /// Sets `sessionAffinity`.
    pub fn session_affinity(mut self, value: SessionAffinity) -> Self {
        self.facts.session_affinity = Some(value);
        self
    }

    /// Sets `sessionAffinityConfig`.
    pub fn session_affinity_config(mut self, value: SessionAffinityConfig) -> Self {
        self.facts.session_affinity_config = Some(value);
        self
    }

    /// Sets `ipFamilies`, in order.
    pub fn ip_families(mut self, families: impl IntoIterator<Item = IpFamily>) -> Self {
        self.facts.ip_families = families.into_iter().collect();
        self
    }

    /// Sets `internalTrafficPolicy`.
    pub fn internal_traffic_policy(mut self, value: InternalTrafficPolicy) -> Self {
        self.facts.internal_traffic_policy = Some(value);
        self
    }

    /// Sets `trafficDistribution`.
    pub fn traffic_distribution(mut self, value: TrafficDistribution) -> Self {
        self.facts.traffic_distribution = Some(value);
        self
    }

    /// Validates and normalises the facts.
    ///
    /// Fails on a port number outside `1..=65535`, a repeated port name, a repeated
    /// (protocol, port) pair or a repeated IP family.
    pub fn build(self) -> Result<ServiceFacts, SpecError> {
        let mut facts = self.facts;
        for (index, port) in facts.ports.iter_mut().enumerate() {
            normalise(port);
            if !(1..=MAX_PORT).contains(&port.port) {
                return Err(SpecError::PortOutOfRange {
                    index,
                    name: port.name.clone().unwrap_or_default(),
                    port: port.port,
                });
            }
        }
        let mut names = BTreeSet::new();
        let mut pairs = BTreeSet::new();
        for port in &facts.ports {
            let name = port.name.as_deref().unwrap_or("");
            if !names.insert(name) {
                return Err(SpecError::DuplicatePortName {
                    name: name.to_owned(),
                });
            }
            let protocol = port.protocol_or_default();
            if !pairs.insert((protocol, port.port)) {
                return Err(SpecError::DuplicatePort {
                    protocol,
                    port: port.port,
                });
            }
        }
        let mut families = BTreeSet::new();
        for family in &facts.ip_families {
            if !families.insert(*family) {
                return Err(SpecError::DuplicateIpFamily { family: *family });
            }
        }
        Ok(facts)
    }
}

impl TryFrom<&Service> for ServiceFacts {
    type Error = InputError;

    /// Parses a core Service.
    ///
    /// `ExternalName` gives [`ServiceKind::ExternalName`] (its other fields are not read);
    /// `clusterIP: None` gives [`ServiceKind::Headless`]; `ClusterIP`, `NodePort`,
    /// `LoadBalancer` and a missing type give [`ServiceKind::ClusterSetIp`]. Unknown
    /// values, bad or repeated ports and repeated IP families are typed errors naming the
    /// Service.
    fn try_from(service: &Service) -> Result<Self, InputError> {
        let name = object_name(
            service.metadata.namespace.as_deref(),
            service.metadata.name.as_deref(),
        );
        let Some(spec) = service.spec.as_ref() else {
            return Err(InputError::MissingSpec { service: name });
        };
        let fail = |problem: SpecError| InputError::Service {
            service: name.clone(),
            problem,
        };
        let kind = match spec.type_.as_deref() {
            Some("ExternalName") => {
                return Ok(ServiceFacts::builder(ServiceKind::ExternalName).facts);
            }
            None | Some("ClusterIP" | "NodePort" | "LoadBalancer") => {
                if spec.cluster_ip.as_deref() == Some("None") {
                    ServiceKind::Headless
                } else {
                    ServiceKind::ClusterSetIp
                }
            }
            Some(other) => {
                return Err(fail(SpecError::UnknownType {
                    value: other.to_owned(),
                }));
            }
        };
        let mut builder = ServiceFacts::builder(kind);
        for (index, port) in spec.ports.iter().flatten().enumerate() {
            let protocol = match port.protocol.as_deref() {
                None => Protocol::Tcp,
                Some(value) => Protocol::parse(value).ok_or_else(|| {
                    fail(SpecError::UnknownProtocol {
                        index,
                        name: port.name.clone().unwrap_or_default(),
                        value: value.to_owned(),
                    })
                })?,
            };
            builder = builder.port(ServicePort {
                name: port.name.clone(),
                protocol: Some(protocol),
                app_protocol: port.app_protocol.clone(),
                port: port.port,
            });
        }
        if let Some(value) = spec.session_affinity.as_deref() {
            let parsed = SessionAffinity::parse(value).ok_or_else(|| {
                fail(SpecError::UnknownSessionAffinity {
                    value: value.to_owned(),
                })
            })?;
            builder = builder.session_affinity(parsed);
        }
        if let Some(config) = spec.session_affinity_config.as_ref() {
            builder = builder.session_affinity_config(SessionAffinityConfig {
                client_ip: config.client_ip.as_ref().map(|c| ClientIpConfig {
                    timeout_seconds: c.timeout_seconds,
                }),
            });
        }
        let mut families = Vec::new();
        for value in spec.ip_families.iter().flatten() {
            let family = IpFamily::parse(value).ok_or_else(|| {
                fail(SpecError::UnknownIpFamily {
                    value: value.clone(),
                })
            })?;
            families.push(family);
        }
        builder = builder.ip_families(families);
        if let Some(value) = spec.internal_traffic_policy.as_deref() {
            let parsed = InternalTrafficPolicy::parse(value).ok_or_else(|| {
                fail(SpecError::UnknownInternalTrafficPolicy {
                    value: value.to_owned(),
                })
            })?;
            builder = builder.internal_traffic_policy(parsed);
        }
        if let Some(value) = spec.traffic_distribution.as_deref() {
            let parsed = TrafficDistribution::parse(value).ok_or_else(|| {
                fail(SpecError::UnknownTrafficDistribution {
                    value: value.to_owned(),
                })
            })?;
            builder = builder.traffic_distribution(parsed);
        }
        builder.build().map_err(fail)
    }
}

/// One cluster's export of one service: a constituent of the merge (KEP-1645).
///
/// It carries the export's creation time (which orders the constituents), its exported
/// labels and annotations (never the `metadata` ones), and the facts of the local Service,
/// or `None` when no Service with the export's name exists.
///
/// ```
/// use k8s_openapi::jiff::Timestamp;
/// use mcs_core::conditions::ValidReason;
/// use mcs_core::merge::Constituent;
///
/// let created: Timestamp = "2026-01-01T00:00:00Z".parse().unwrap();
/// let export = Constituent::new("east".parse().unwrap(), created, None);
/// assert_eq!(export.validity(), ValidReason::NoService);
/// ```
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Constituent {
    cluster: ClusterId,
    created: Timestamp,
    exported_labels: StringMap,
    exported_annotations: StringMap,
    cluster_selectors: Vec<ClusterSelector>,
    /// Why `cluster_selectors` are invalid, if they are (boxed: rare, and a constituent
    /// stays small).
    selector_error: Option<Box<InvalidClusterSelector>>,
    service: Option<ServiceFacts>,
}

impl Constituent {
    /// An export from `cluster`, created at `created`, of a Service with these facts
    /// (`None`: the Service does not exist). Exported labels and annotations start empty.
    pub fn new(cluster: ClusterId, created: Timestamp, service: Option<ServiceFacts>) -> Self {
        Self {
            cluster,
            created,
            exported_labels: StringMap::new(),
            exported_annotations: StringMap::new(),
            cluster_selectors: Vec::new(),
            selector_error: None,
            service,
        }
    }

    /// Reads the creation time and `spec.exportedLabels` / `spec.exportedAnnotations` of a
    /// ServiceExport. Fails when the export has no `creationTimestamp`.
    pub fn from_export(
        cluster: ClusterId,
        export: &ServiceExport,
        service: Option<ServiceFacts>,
    ) -> Result<Self, InputError> {
        let Some(created) = export.metadata.creation_timestamp.as_ref() else {
            return Err(InputError::MissingCreationTimestamp {
                export: object_name(
                    export.metadata.namespace.as_deref(),
                    export.metadata.name.as_deref(),
                ),
            });
        };
        Ok(Self::new(cluster, created.0, service)
            .with_exported_labels(export.spec.exported_labels.clone().unwrap_or_default())
            .with_exported_annotations(export.spec.exported_annotations.clone().unwrap_or_default())
            .with_cluster_selectors(export.spec.cluster_selectors.clone().unwrap_or_default()))
    }

    /// Sets the exported labels (`ServiceExport.spec.exportedLabels`).
    #[must_use]
    pub fn with_exported_labels(mut self, labels: StringMap) -> Self {
        self.exported_labels = labels;
        self
    }

    /// Sets the exported annotations (`ServiceExport.spec.exportedAnnotations`).
    #[must_use]
    pub fn with_exported_annotations(mut self, annotations: StringMap) -> Self {
        self.exported_annotations = annotations;
        self
    }

    /// Sets the cluster selectors (`ServiceExport.spec.clusterSelectors`, KEP-5939) and
    /// validates them: invalid ones make the export invalid (`InvalidClusterSelector`).
    #[must_use]
    pub fn with_cluster_selectors(mut self, selectors: Vec<ClusterSelector>) -> Self {
        self.selector_error = validate_cluster_selectors(&selectors).err().map(Box::new);
        self.cluster_selectors = selectors;
        self
    }

    /// The cluster selectors (empty: none).
    pub fn cluster_selectors(&self) -> &[ClusterSelector] {
        &self.cluster_selectors
    }

    /// Why the cluster selectors are invalid, if they are.
    pub fn cluster_selector_error(&self) -> Option<&InvalidClusterSelector> {
        self.selector_error.as_deref()
    }

    /// The exporting cluster.
    pub fn cluster(&self) -> &ClusterId {
        &self.cluster
    }

    /// The export's `metadata.creationTimestamp`.
    pub fn created(&self) -> Timestamp {
        self.created
    }

    /// The exported labels.
    pub fn exported_labels(&self) -> &StringMap {
        &self.exported_labels
    }

    /// The exported annotations.
    pub fn exported_annotations(&self) -> &StringMap {
        &self.exported_annotations
    }

    /// The local Service's facts, or `None` when it does not exist.
    pub fn service(&self) -> Option<&ServiceFacts> {
        self.service.as_ref()
    }

    /// The reason of this export's `Valid` condition: `Valid`, `NoService`,
    /// `InvalidServiceType` (an `ExternalName` Service, or a headless one with cluster
    /// selectors: KEP-5939 selects clusters for ClusterSetIP services only) or
    /// `InvalidClusterSelector`. Only `Valid` exports take part in the merge.
    pub fn validity(&self) -> ValidReason {
        match &self.service {
            None => ValidReason::NoService,
            Some(facts) if facts.kind == ServiceKind::ExternalName => {
                ValidReason::InvalidServiceType
            }
            Some(facts)
                if facts.kind == ServiceKind::Headless && !self.cluster_selectors.is_empty() =>
            {
                ValidReason::InvalidServiceType
            }
            Some(_) if self.selector_error.is_some() => ValidReason::InvalidClusterSelector,
            Some(_) => ValidReason::Valid,
        }
    }

    /// The facts and import type when this export is valid.
    pub(crate) fn valid_facts(&self) -> Option<(&ServiceFacts, ServiceImportType)> {
        if self.validity() != ValidReason::Valid {
            return None;
        }
        let facts = self.service.as_ref()?;
        Some((facts, facts.kind.import_type()?))
    }
}

/// What makes two ports the same port for routing: name, protocol and number.
pub(crate) type PortKey<'a> = (&'a str, Protocol, i32);

/// The routing key of a port.
pub(crate) fn port_key(port: &ServicePort) -> PortKey<'_> {
    (
        port.name.as_deref().unwrap_or(""),
        port.protocol_or_default(),
        port.port,
    )
}

/// A missing protocol becomes TCP; an empty name becomes no name.
pub(crate) fn normalise(port: &mut ServicePort) {
    port.protocol = Some(port.protocol_or_default());
    if port.name.as_deref() == Some("") {
        port.name = None;
    }
}

fn object_name(namespace: Option<&str>, name: Option<&str>) -> String {
    ObjectName { namespace, name }.to_string()
}

struct ObjectName<'a> {
    namespace: Option<&'a str>,
    name: Option<&'a str>,
}

impl fmt::Display for ObjectName<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{}/{}",
            self.namespace.unwrap_or("<no namespace>"),
            self.name.unwrap_or("<no name>")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn builder_normalises_ports() {
        let facts = ServiceFacts::builder(ServiceKind::Headless)
            .port(ServicePort {
                name: Some(String::new()),
                port: 80,
                ..Default::default()
            })
            .build()
            .unwrap();
        assert_eq!(facts.ports()[0].name, None);
        assert_eq!(facts.ports()[0].protocol, Some(Protocol::Tcp));
    }

    #[test]
    fn unnamed_ports_share_the_empty_name() {
        let err = ServiceFacts::builder(ServiceKind::ClusterSetIp)
            .port(ServicePort {
                port: 80,
                ..Default::default()
            })
            .port(ServicePort {
                port: 81,
                ..Default::default()
            })
            .build()
            .unwrap_err();
        assert_eq!(
            err,
            SpecError::DuplicatePortName {
                name: String::new()
            }
        );
    }
}
