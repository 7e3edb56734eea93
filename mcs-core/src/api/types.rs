//! Spec and status types shared by every served version.

use k8s_openapi::apimachinery::pkg::apis::meta::v1::Condition;
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{
    ClusterSelector, ClusterSelectorResult, ClusterStatus, EndpointSliceObjects,
    InternalTrafficPolicy, IpFamily, ServiceImportType, ServicePort, SessionAffinity,
    SessionAffinityConfig, StringMap, TrafficDistribution,
};

/// `ServiceExport.spec`: which labels and annotations to carry to the ServiceImport.
///
/// The export refers to the Service with the same name in the same namespace; there is no
/// object reference field.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceExportSpec {
    /// Labels to put on the ServiceImport (optional feature).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exported_labels: Option<StringMap>,
    /// Annotations to put on the ServiceImport (optional feature).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exported_annotations: Option<StringMap>,
    /// The ordered cluster selectors of KEP-5939 (cluster selection), at most 16. Not in
    /// the released CRDs: an API server with them drops the field; the CRDs of
    /// `crd::with_cluster_selection` keep it. Unstable, like the KEP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub cluster_selectors: Option<Vec<ClusterSelector>>,
}

/// `ServiceExport.status`: the `Valid`, `Ready` and `Conflict` conditions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceExportStatus {
    /// Conditions, keyed by `type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::conditions_schema")]
    pub conditions: Option<Vec<Condition>>,
}

/// `ServiceImport.spec`: the merged description of a multi-cluster service.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceImportSpec {
    /// The merged ports. Always serialised, `[]` when empty.
    #[schemars(schema_with = "super::ports_schema")]
    pub ports: Vec<ServicePort>,
    /// The VIPs when the type is `ClusterSetIP`: at most one per IP family, in the order of
    /// `ipFamilies`. Empty for `Headless`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::two_strings_schema")]
    pub ips: Option<Vec<String>>,
    /// `ClusterSetIP` or `Headless`.
    #[serde(rename = "type")]
    pub type_: ServiceImportType,
    /// `ClientIP` or `None`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity: Option<SessionAffinity>,
    /// Session affinity settings.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_affinity_config: Option<SessionAffinityConfig>,
    /// The IP families of `ips`, without duplicates.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::ip_families_schema")]
    pub ip_families: Option<Vec<IpFamily>>,
    /// `Cluster` or `Local`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub internal_traffic_policy: Option<InternalTrafficPolicy>,
    /// Traffic distribution preference, e.g. `PreferClose`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_distribution: Option<TrafficDistribution>,
    /// The cluster selectors the exports agreed on (KEP-5939; see
    /// [`ServiceExportSpec::cluster_selectors`]). Unstable, like the KEP.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub cluster_selectors: Option<Vec<ClusterSelector>>,
}

impl ServiceImportSpec {
    /// An import of the given type with no ports and nothing else set.
    pub fn new(type_: ServiceImportType) -> Self {
        Self {
            ports: Vec::new(),
            ips: None,
            type_,
            session_affinity: None,
            session_affinity_config: None,
            ip_families: None,
            internal_traffic_policy: None,
            traffic_distribution: None,
            cluster_selectors: None,
        }
    }
}

/// `ServiceImport.status`: the exporting clusters and the import's conditions.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ServiceImportStatus {
    /// The exporting clusters this import was derived from, keyed by `cluster`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::clusters_schema")]
    pub clusters: Option<Vec<ClusterStatus>>,
    /// Conditions (`Ready`), keyed by `type`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(schema_with = "super::conditions_schema")]
    pub conditions: Option<Vec<Condition>>,
    /// Whether MCS EndpointSlices exist for this import (KEP-1645, 2026; not yet in the
    /// mcs-api v0.5.0 CRD).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub endpoint_slice_objects: Option<EndpointSliceObjects>,
    /// The import's `metadata.generation` this status was written for (KEP-5939). Unstable,
    /// like the KEP; only in the CRDs of `crd::with_cluster_selection`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub observed_generation: Option<i64>,
    /// For this importing cluster, the clusters each of `spec.clusterSelectors` matched, in
    /// order (KEP-5939). Consumers use these, never the selectors. Unstable, like the KEP;
    /// only in the CRDs of `crd::with_cluster_selection`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    #[schemars(skip)]
    pub cluster_selector_results: Option<Vec<ClusterSelectorResult>>,
}

/// `ClusterProperty.spec`: the property's value.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterPropertySpec {
    /// The value: at least one and at most 128,000 Unicode code points.
    #[schemars(schema_with = "super::property_value_schema")]
    pub value: String,
}

impl ClusterPropertySpec {
    /// Checks the value's length: at least one and at most
    /// [`CLUSTER_PROPERTY_VALUE_MAX_CHARS`](super::CLUSTER_PROPERTY_VALUE_MAX_CHARS) code
    /// points. The CRD enforces only the minimum (upstream misspells the maximum marker).
    pub fn validate(&self) -> Result<(), PropertyValueError> {
        let chars = self.value.chars().count();
        if chars == 0 {
            return Err(PropertyValueError::Empty);
        }
        if chars > super::CLUSTER_PROPERTY_VALUE_MAX_CHARS {
            return Err(PropertyValueError::TooLong { chars });
        }
        Ok(())
    }
}

/// A ClusterProperty value out of bounds.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PropertyValueError {
    /// The value is empty.
    #[error("ClusterProperty value must not be empty")]
    Empty,
    /// The value is longer than 128,000 code points.
    #[error("ClusterProperty value has {chars} code points; at most 128000 are allowed")]
    TooLong {
        /// Its length in code points.
        chars: usize,
    },
}

/// `ClusterProperty.status`: empty.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
pub struct ClusterPropertyStatus {}
