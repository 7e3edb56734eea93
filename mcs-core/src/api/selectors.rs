//! The wire types of KEP-5939's cluster selection (`clusterSelectors` on ServiceExport and
//! ServiceImport, `clusterSelectorResults` in the import's status) and their validation,
//! which the merge applies to every export. Their evaluation is in `mcs_core::selection`
//! (feature `unstable-cluster-selection`).

use std::collections::BTreeMap;
use std::fmt;

use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use crate::ClusterId;

/// The value that stands for the importing cluster's own value of the key.
pub const SAME_AS_IMPORTER: &str = "@SameAsImporter@";

/// At most this many entries in `clusterSelectors`.
pub const MAX_CLUSTER_SELECTORS: usize = 16;

/// The longest `ClusterProperty` name (a DNS subdomain).
pub const MAX_PROPERTY_NAME_LEN: usize = 253;

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

/// The operators of a [`PropertySelectorRequirement`], with `metav1.LabelSelector`'s
/// meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum Operator {
    /// The cluster has the property, with one of the values.
    In,
    /// The cluster does not have the property, or has it with none of the values.
    NotIn,
    /// The cluster has the property.
    Exists,
    /// The cluster does not have the property.
    DoesNotExist,
}

impl Operator {
    /// The operator of its wire spelling (case-sensitive, as the API server's).
    pub fn parse(s: &str) -> Option<Self> {
        match s {
            "In" => Some(Self::In),
            "NotIn" => Some(Self::NotIn),
            "Exists" => Some(Self::Exists),
            "DoesNotExist" => Some(Self::DoesNotExist),
            _ => None,
        }
    }

    /// The wire spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::In => "In",
            Self::NotIn => "NotIn",
            Self::Exists => "Exists",
            Self::DoesNotExist => "DoesNotExist",
        }
    }
}

impl fmt::Display for Operator {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// Why a ServiceExport's `clusterSelectors` are invalid (its `Valid` condition is `False`
/// with reason `InvalidClusterSelector`).
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum InvalidClusterSelector {
    /// More entries than [`MAX_CLUSTER_SELECTORS`].
    #[error("clusterSelectors has {count} entries; at most {MAX_CLUSTER_SELECTORS} are allowed")]
    TooMany {
        /// How many there are.
        count: usize,
    },
    /// One entry is invalid.
    #[error("clusterSelectors[{index}]: {problem}")]
    Entry {
        /// Its position.
        index: usize,
        /// What is wrong with it.
        problem: SelectorProblem,
    },
}

/// What is wrong with one [`ClusterSelector`].
#[derive(Clone, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum SelectorProblem {
    /// The entry names no criterion (`propertySelector` is missing).
    #[error("no propertySelector")]
    NoCriterion,
    /// `propertySelector` has neither `matchProperties` nor `matchExpressions`.
    #[error("propertySelector is empty")]
    Empty,
    /// A key is not a `ClusterProperty` name.
    #[error("key {key:?} is not a ClusterProperty name: {reason}")]
    InvalidKey {
        /// The key.
        key: String,
        /// Why not.
        reason: &'static str,
    },
    /// An operator other than `In`, `NotIn`, `Exists` and `DoesNotExist`.
    #[error("key {key:?}: unknown operator {operator:?} (In, NotIn, Exists or DoesNotExist)")]
    UnknownOperator {
        /// The requirement's key.
        key: String,
        /// The operator given.
        operator: String,
    },
    /// `In` or `NotIn` without values.
    #[error("key {key:?}: operator {operator} needs at least one value")]
    ValuesRequired {
        /// The requirement's key.
        key: String,
        /// `In` or `NotIn`.
        operator: Operator,
    },
    /// `Exists` or `DoesNotExist` with values.
    #[error("key {key:?}: operator {operator} takes no values")]
    ValuesForbidden {
        /// The requirement's key.
        key: String,
        /// `Exists` or `DoesNotExist`.
        operator: Operator,
    },
}

/// Checks `clusterSelectors` as KEP-5939 asks; the first problem found.
pub fn validate_cluster_selectors(
    selectors: &[ClusterSelector],
) -> Result<(), InvalidClusterSelector> {
    if selectors.len() > MAX_CLUSTER_SELECTORS {
        return Err(InvalidClusterSelector::TooMany {
            count: selectors.len(),
        });
    }
    for (index, selector) in selectors.iter().enumerate() {
        requirements(selector)
            .map_err(|problem| InvalidClusterSelector::Entry { index, problem })?;
    }
    Ok(())
}

/// Checks the `ClusterProperty` name rule (a DNS subdomain, as for every Kubernetes object
/// name): at most 253 characters; dot-separated parts, each non-empty, of `a-z`, `0-9` and
/// `-`, starting and ending with a letter or digit.
pub fn check_property_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() {
        return Err("must not be empty");
    }
    if name.len() > MAX_PROPERTY_NAME_LEN {
        return Err("longer than 253 characters");
    }
    for part in name.split('.') {
        if part.is_empty() {
            return Err("has an empty part between dots");
        }
        if !part
            .bytes()
            .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
        {
            return Err("may hold only a-z, 0-9, '-' and '.'");
        }
        if part.starts_with('-') || part.ends_with('-') {
            return Err("each part must start and end with a letter or digit");
        }
    }
    Ok(())
}

/// One requirement after validation; values still as written.
pub(crate) struct Requirement<'a> {
    pub(crate) key: &'a str,
    pub(crate) operator: Operator,
    pub(crate) values: Vec<&'a str>,
}

/// The selector's requirements (`matchProperties` as `In` requirements first), or what is
/// wrong with it.
pub(crate) fn requirements(
    selector: &ClusterSelector,
) -> Result<Vec<Requirement<'_>>, SelectorProblem> {
    let ps = selector
        .property_selector
        .as_ref()
        .ok_or(SelectorProblem::NoCriterion)?;
    if ps.match_properties.is_empty() && ps.match_expressions.is_empty() {
        return Err(SelectorProblem::Empty);
    }
    let key_ok = |key: &str| {
        check_property_name(key).map_err(|reason| SelectorProblem::InvalidKey {
            key: key.to_owned(),
            reason,
        })
    };
    let mut out = Vec::with_capacity(ps.match_properties.len() + ps.match_expressions.len());
    for (key, value) in &ps.match_properties {
        key_ok(key)?;
        out.push(Requirement {
            key,
            operator: Operator::In,
            values: vec![value],
        });
    }
    for r in &ps.match_expressions {
        key_ok(&r.key)?;
        let operator =
            Operator::parse(&r.operator).ok_or_else(|| SelectorProblem::UnknownOperator {
                key: r.key.clone(),
                operator: r.operator.clone(),
            })?;
        match operator {
            Operator::In | Operator::NotIn if r.values.is_empty() => {
                return Err(SelectorProblem::ValuesRequired {
                    key: r.key.clone(),
                    operator,
                });
            }
            Operator::Exists | Operator::DoesNotExist if !r.values.is_empty() => {
                return Err(SelectorProblem::ValuesForbidden {
                    key: r.key.clone(),
                    operator,
                });
            }
            _ => {}
        }
        out.push(Requirement {
            key: &r.key,
            operator,
            values: r.values.iter().map(String::as_str).collect(),
        });
    }
    Ok(out)
}
