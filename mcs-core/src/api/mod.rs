//! Wire types for the MCS API (`multicluster.x-k8s.io`) and the About API (`about.k8s.io`).
//!
//! The types mirror mcs-api v0.5.0 field for field (KEP-1645, "API"). Both served
//! versions exist as Rust types with identical schemas: [`v1alpha1`] and [`v1beta1`]
//! (the storage version). Use [`v1beta1`] unless you talk to a cluster that only serves
//! `v1alpha1`; `From` conversions go both ways and lose nothing.
//!
//! Field types shared by both versions ([`ServicePort`], [`ClusterStatus`], the enums) live
//! in this module. [`decode_yaml`] and [`decode_json`] turn text into any of these types and
//! report the exact field path of a problem as a typed [`DecodeError`].
//!
//! ```
//! use mcs_core::api::{decode_yaml, v1beta1::ServiceImport, ServiceImportType};
//!
//! let import: ServiceImport = decode_yaml(r#"
//! apiVersion: multicluster.x-k8s.io/v1beta1
//! kind: ServiceImport
//! metadata: { name: loyalty-accrual, namespace: loyalty }
//! spec:
//!   type: ClusterSetIP
//!   ports: [{ name: grpc, protocol: TCP, port: 9443 }]
//! "#).unwrap();
//! assert_eq!(import.spec.type_, ServiceImportType::ClusterSetIp);
//! ```

use std::borrow::Cow;
use std::collections::BTreeMap;
use std::fmt;

use schemars::{JsonSchema, Schema, SchemaGenerator, json_schema};
use serde::{Deserialize, Serialize};

pub mod crd;
pub(crate) mod selectors;
mod types;
mod versions;

pub use selectors::{
    ClusterSelector, ClusterSelectorResult, InvalidClusterSelector, MAX_CLUSTER_SELECTORS,
    MAX_PROPERTY_NAME_LEN, Operator, PropertySelector, PropertySelectorRequirement,
    SAME_AS_IMPORTER, SelectorProblem, check_property_name, validate_cluster_selectors,
};
pub use types::{
    ClusterPropertySpec, ClusterPropertyStatus, PropertyValueError, ServiceExportSpec,
    ServiceExportStatus, ServiceImportSpec, ServiceImportStatus,
};
pub use versions::{v1alpha1, v1beta1};

/// A transport protocol of a service port (defined with the names, which need it too).
pub use crate::name::Protocol;

/// The API group of ServiceExport and ServiceImport.
pub const MCS_GROUP: &str = "multicluster.x-k8s.io";
/// The API group of ClusterProperty.
pub const ABOUT_GROUP: &str = "about.k8s.io";
/// The mcs-api release whose schema these types implement.
pub const MCS_API_RELEASE: &str = "v0.5.0";
/// CRD label carrying the mcs-api release (used to refuse CRD downgrades).
pub const RELEASE_VERSION_LABEL: &str = "multicluster.x-k8s.io/release-version";
/// CRD label carrying the schema revision within a release.
pub const SCHEMA_REVISION_LABEL: &str = "multicluster.x-k8s.io/crd-schema-revision";
/// Well-known ClusterProperty holding this cluster's id.
pub const CLUSTER_ID_PROPERTY: &str = "cluster.clusterset.k8s.io";
/// Well-known ClusterProperty holding the ClusterSet membership.
pub const CLUSTERSET_PROPERTY: &str = "clusterset.k8s.io";
/// EndpointSlice label naming the multi-cluster service.
pub const LABEL_SERVICE_NAME: &str = "multicluster.kubernetes.io/service-name";
/// EndpointSlice label naming the cluster the endpoints come from.
pub const LABEL_SOURCE_CLUSTER: &str = "multicluster.kubernetes.io/source-cluster";
/// ServiceImport annotation naming the derived ClusterIP Service.
pub const ANNOTATION_DERIVED_SERVICE: &str = "multicluster.kubernetes.io/derived-service";
/// Maximum length of a ClusterProperty value, in Unicode code points (KEP-2149).
pub const CLUSTER_PROPERTY_VALUE_MAX_CHARS: usize = 128_000;

/// The type of a ServiceImport (`spec.type`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
pub enum ServiceImportType {
    /// A single VIP for the whole ClusterSet (from ClusterIP, NodePort and LoadBalancer Services).
    #[serde(rename = "ClusterSetIP")]
    ClusterSetIp,
    /// No VIP: DNS answers with the endpoint addresses (from `clusterIP: None` Services).
    Headless,
}

impl ServiceImportType {
    /// The exact Kubernetes spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::ClusterSetIp => "ClusterSetIP",
            Self::Headless => "Headless",
        }
    }
}

impl fmt::Display for ServiceImportType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Implements `JsonSchema` as a string with an `enum` of the given values (schemars would
/// otherwise emit a `oneOf` for documented variants).
macro_rules! enum_schema {
    ($name:ident, [$($s:literal),+]) => {
        impl JsonSchema for $name {
            fn schema_name() -> Cow<'static, str> {
                Cow::Borrowed(stringify!($name))
            }

            fn inline_schema() -> bool {
                true
            }

            fn json_schema(_: &mut SchemaGenerator) -> Schema {
                json_schema!({ "type": "string", "enum": [$($s),+] })
            }
        }
    };
}

enum_schema!(ServiceImportType, ["ClusterSetIP", "Headless"]);
enum_schema!(EndpointSliceObjects, ["Present", "Absent"]);

string_enum! {
    /// Session affinity of a service (`ClientIP` or `None`).
    SessionAffinity {
        /// Requests from one client IP go to the same endpoint.
        ClientIp = "ClientIP",
        /// No affinity.
        None = "None",
    }
}

string_enum! {
    /// Internal traffic policy of a service.
    InternalTrafficPolicy {
        /// Route to all endpoints.
        Cluster = "Cluster",
        /// Route only to endpoints on the same node.
        Local = "Local",
    }
}

string_enum! {
    /// Traffic distribution preference of a service (`Service.spec.trafficDistribution`).
    TrafficDistribution {
        /// Prefer topologically close endpoints (now an alias of `PreferSameZone`).
        PreferClose = "PreferClose",
        /// Prefer endpoints in the same zone.
        PreferSameZone = "PreferSameZone",
        /// Prefer endpoints on the same node.
        PreferSameNode = "PreferSameNode",
    }
}

string_enum! {
    /// An IP family.
    IpFamily {
        /// IPv4.
        IPv4 = "IPv4",
        /// IPv6.
        IPv6 = "IPv6",
    }
}

/// `KEP-1645` `status.endpointSliceObjects`: whether the implementation publishes
/// EndpointSlices for this import.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum EndpointSliceObjects {
    /// EndpointSlices with the MCS labels exist for this import.
    Present,
    /// The implementation does not publish EndpointSlices for this import.
    Absent,
}

/// A port of a ServiceImport. Unlike a core `ServicePort` it has no `targetPort` and no
/// `nodePort`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServicePort {
    /// The name of this port within the service (a DNS label); optional when there is a
    /// single port.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// `TCP`, `UDP` or `SCTP`. A missing protocol means TCP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub protocol: Option<Protocol>,
    /// The application protocol of this port, a hint such as `kubernetes.io/h2c`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub app_protocol: Option<String>,
    /// The port that is exposed.
    pub port: i32,
}

impl ServicePort {
    /// The protocol, with a missing one read as TCP.
    pub fn protocol_or_default(&self) -> Protocol {
        self.protocol.unwrap_or_default()
    }
}

/// Client-IP session affinity settings.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClientIpConfig {
    /// How long a client stays with its endpoint, in seconds (1..=86400).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub timeout_seconds: Option<i32>,
}

/// Session affinity configuration.
#[derive(Clone, Debug, Default, PartialEq, Eq, Hash, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct SessionAffinityConfig {
    /// Client-IP based affinity settings.
    #[serde(default, rename = "clientIP", skip_serializing_if = "Option::is_none")]
    pub client_ip: Option<ClientIpConfig>,
}

/// An exporting cluster a ServiceImport was derived from.
#[derive(
    Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize, JsonSchema,
)]
pub struct ClusterStatus {
    /// The cluster id (an RFC-1123 DNS label).
    pub cluster: String,
}

/// Exported labels or annotations: a map from name to value.
pub type StringMap = BTreeMap<String, String>;

/// A decoding failure: which field of which input was wrong and why.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DecodeError {
    /// The text is not valid YAML or does not fit the type.
    #[error("invalid {kind} YAML at `{path}`: {message}")]
    Yaml {
        /// The Rust type that was being decoded.
        kind: &'static str,
        /// Field path of the problem (`.` is the document root).
        path: String,
        /// What was wrong.
        message: String,
    },
    /// The text is not valid JSON or does not fit the type.
    #[error("invalid {kind} JSON at `{path}`: {message}")]
    Json {
        /// The Rust type that was being decoded.
        kind: &'static str,
        /// Field path of the problem (`.` is the document root).
        path: String,
        /// What was wrong.
        message: String,
    },
}

impl DecodeError {
    /// Field path of the problem, such as `spec.ports[0].protocol`.
    pub fn path(&self) -> &str {
        match self {
            Self::Yaml { path, .. } | Self::Json { path, .. } => path,
        }
    }
}

/// Decodes YAML into `T`, reporting the field path of the first problem.
///
/// The text must hold exactly one YAML document.
pub fn decode_yaml<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, DecodeError> {
    // The deserializer lives only inside the closure, so the field path of a failure is
    // carried out beside the error.
    let mut path = None;
    serde_saphyr::with_deserializer_from_str(text, |de| {
        serde_path_to_error::deserialize(de).map_err(|e| {
            path = Some(e.path().to_string());
            e.into_inner()
        })
    })
    .map_err(|e| DecodeError::Yaml {
        kind: short_type_name::<T>(),
        path: path.unwrap_or_else(|| ".".to_owned()),
        message: yaml_message(&e),
    })
}

/// One line for a YAML error: the parser's own message without the source snippet it
/// attaches, so the message stays a single line in logs.
fn yaml_message(error: &serde_saphyr::Error) -> String {
    let text = error.to_string();
    text.lines().next().unwrap_or_default().trim().to_owned()
}

/// Decodes JSON into `T`, reporting the field path of the first problem.
pub fn decode_json<T: serde::de::DeserializeOwned>(text: &str) -> Result<T, DecodeError> {
    let mut de = serde_json::Deserializer::from_str(text);
    serde_path_to_error::deserialize(&mut de).map_err(|e| DecodeError::Json {
        kind: short_type_name::<T>(),
        path: e.path().to_string(),
        message: e.into_inner().to_string(),
    })
}

fn short_type_name<T>() -> &'static str {
    let full = std::any::type_name::<T>();
    // `a::b::C<d::E>` -> `C<d::E>`: the last path segment before any generics.
    let head = full.split('<').next().unwrap_or(full);
    match head.rfind("::") {
        Some(i) => &full[i + 2..],
        None => full,
    }
}

/// The exact schema of a `[]metav1.Condition` list as controller-gen writes it, with the
/// list-map key `type`.
pub(crate) fn conditions_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["type"],
        "items": {
            "description": "Condition contains details for one aspect of the current state of this API Resource.",
            "type": "object",
            "required": ["lastTransitionTime", "message", "reason", "status", "type"],
            "properties": {
                "lastTransitionTime": {
                    "description": "lastTransitionTime is the last time the condition transitioned from one status to another.",
                    "type": "string",
                    "format": "date-time"
                },
                "message": {
                    "description": "message is a human readable message indicating details about the transition. This may be an empty string.",
                    "type": "string",
                    "maxLength": 32768
                },
                "observedGeneration": {
                    "description": "observedGeneration represents the .metadata.generation that the condition was set based upon.",
                    "type": "integer",
                    "format": "int64",
                    "minimum": 0
                },
                "reason": {
                    "description": "reason contains a programmatic identifier indicating the reason for the condition's last transition.",
                    "type": "string",
                    "maxLength": 1024,
                    "minLength": 1,
                    "pattern": "^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$"
                },
                "status": {
                    "description": "status of the condition, one of True, False, Unknown.",
                    "type": "string",
                    "enum": ["True", "False", "Unknown"]
                },
                "type": {
                    "description": "type of condition in CamelCase or in foo.example.com/CamelCase.",
                    "type": "string",
                    "maxLength": 316,
                    "pattern": "^([a-z0-9]([-a-z0-9]*[a-z0-9])?(\\.[a-z0-9]([-a-z0-9]*[a-z0-9])?)*/)?(([A-Za-z0-9][-A-Za-z0-9_.]*)?[A-Za-z0-9])$"
                }
            }
        }
    })
}

/// Schema of `status.clusters`: a list-map keyed on `cluster`.
pub(crate) fn clusters_schema(generator: &mut SchemaGenerator) -> Schema {
    let item = generator.subschema_for::<ClusterStatus>();
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "map",
        "x-kubernetes-list-map-keys": ["cluster"],
        "items": item
    })
}

/// Schema of `spec.ports`: an atomic list.
pub(crate) fn ports_schema(generator: &mut SchemaGenerator) -> Schema {
    let item = generator.subschema_for::<ServicePort>();
    json_schema!({
        "type": "array",
        "x-kubernetes-list-type": "atomic",
        "items": item
    })
}

/// Schema of a list of at most two strings (`ips`).
pub(crate) fn two_strings_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 2,
        "items": { "type": "string" }
    })
}

/// Schema of `ipFamilies`: at most two families, plain strings as upstream has them.
pub(crate) fn ip_families_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "array",
        "maxItems": 2,
        "items": { "type": "string" }
    })
}

/// Schema of a ClusterProperty value: a non-empty string.
pub(crate) fn property_value_schema(_: &mut SchemaGenerator) -> Schema {
    json_schema!({
        "type": "string",
        "minLength": 1
    })
}
