//! The wire types of KEP-5939's cluster selection (`clusterSelectors` on ServiceExport and
//! ServiceImport, `clusterSelectorResults` in the import's status). Their evaluation is in
//! `mcs_core::selection` (feature `unstable-cluster-selection`).

use std::collections::BTreeMap;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ClusterId;

/// The value that stands for the importing cluster's own value of the key.
pub const SAME_AS_IMPORTER: &str = "@SameAsImporter@";

/// At most this many entries in `clusterSelectors`.
pub const MAX_CLUSTER_SELECTORS: usize = 16;

/// One entry of `clusterSelectors`: a set of preferred clusters.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSelector {
    /// Selects clusters by their `ClusterProperty` values. Required: an entry without it
    /// is invalid.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub property_selector: Option<PropertySelector>,
}

/// A query over the clusters' `ClusterProperty` values, like `metav1.LabelSelector` with
/// `matchProperties` for `matchLabels`. Its requirements are ANDed; an empty one is invalid.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PropertySelector {
    /// Property name to value: each pair is an `In` requirement with that one value. The
    /// value may be `@SameAsImporter@`.
    #[serde(default, skip_serializing_if = "BTreeMap::is_empty")]
    pub match_properties: BTreeMap<String, String>,
    /// Requirements on property values.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub match_expressions: Vec<PropertySelectorRequirement>,
}

/// A requirement on one property, as `metav1.LabelSelectorRequirement`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct PropertySelectorRequirement {
    /// The `ClusterProperty` name.
    pub key: String,
    /// `In`, `NotIn`, `Exists` or `DoesNotExist`, meaning what they mean in
    /// `metav1.LabelSelectorRequirement`.
    pub operator: String,
    /// For `In` and `NotIn`, at least one value (each may be `@SameAsImporter@`); for
    /// `Exists` and `DoesNotExist`, none.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub values: Vec<String>,
}

/// One entry of `ServiceImport.status.clusterSelectorResults`: the source clusters the
/// selector at the same position matched, for this importer.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct ClusterSelectorResult {
    /// Cluster ids, as in `status.clusters` and the `source-cluster` label.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub clusters: Vec<String>,
}

impl From<&[ClusterId]> for ClusterSelectorResult {
    fn from(clusters: &[ClusterId]) -> Self {
        Self {
            clusters: clusters.iter().map(|c| c.as_str().to_owned()).collect(),
        }
    }
}
