//! Cluster selection for multi-cluster services: KEP-5939, *Cluster Selection for
//! Multi-Cluster Services* (kubernetes/enhancements,
//! `keps/sig-multicluster/5939-mcs-cluster-selection`).
//!
//! A ServiceExport may carry an ordered list of [`ClusterSelector`]s, each a
//! [`PropertySelector`] over the members' `ClusterProperty` values (KEP-2149). The
//! implementation evaluates the list once per importing cluster and publishes the ordered
//! results in `ServiceImport.status.clusterSelectorResults`; a consumer (a datapath, a
//! client balancer, a Gateway) sends traffic to the first result that has a ready or
//! serving endpoint, and to every cluster when none has.
//!
//! - [`validate`]: the KEP's validation (`InvalidClusterSelector`): at most
//!   [`MAX_CLUSTER_SELECTORS`] entries, each with a non-empty `propertySelector` that follows
//!   `metav1.LabelSelector`'s rules, with keys that are `ClusterProperty` names.
//! - [`PreparedSelector`]: one selector bound to one importer, with [`SAME_AS_IMPORTER`]
//!   replaced by the importer's own value for the key (a selector naming a property the
//!   importer does not have matches no cluster).
//! - [`evaluate`]: every selector of a service for one importer, over the service's source
//!   clusters: the results in selector order. Endpoints play no part in them.
//! - [`choose`]: the consumer's algorithm over those results.
//!
//! Unstable (feature `unstable-cluster-selection`): the released upstream CRDs (mcs-api
//! v0.5.0) do not have these fields yet, and the KEP may still change them.
//!
//! ```
//! use std::collections::BTreeMap;
//! use mcs_core::ClusterId;
//! use mcs_core::selection::{ClusterSelector, Choice, choose, evaluate};
//!
//! // The KEP's first story: my cluster, then my region.
//! let selectors: Vec<ClusterSelector> = serde_json::from_str(r#"[
//!   {"propertySelector": {"matchExpressions": [
//!     {"key": "cluster.clusterset.k8s.io", "operator": "In", "values": ["@SameAsImporter@"]}]}},
//!   {"propertySelector": {"matchProperties": {"region.topology.k8s.io": "@SameAsImporter@"}}}
//! ]"#).unwrap();
//! let props = |id: &str, region: &str| {
//!     BTreeMap::from([
//!         ("cluster.clusterset.k8s.io".to_string(), id.to_string()),
//!         ("region.topology.k8s.io".to_string(), region.to_string()),
//!     ])
//! };
//! let id = |s: &str| ClusterId::new(s).unwrap();
//! let sources = BTreeMap::from([
//!     (id("east"), props("east", "eu")),
//!     (id("west"), props("west", "us")),
//! ]);
//! // An importer that exports nothing itself, in region eu.
//! let results = evaluate(&selectors, &props("north", "eu"), &sources).unwrap();
//! assert_eq!(results, vec![vec![], vec![id("east")]]);
//! // East has ready endpoints: traffic goes to east only.
//! assert_eq!(choose(&results, |c| *c == id("east")), Choice::Result(1));
//! // Nobody has: every cluster.
//! assert_eq!(choose(&results, |_| false), Choice::AllClusters);
//! ```

use std::collections::{BTreeMap, BTreeSet};

use crate::ClusterId;
use crate::api::selectors::requirements;
pub use crate::api::{
    ClusterSelector, ClusterSelectorResult, InvalidClusterSelector, MAX_CLUSTER_SELECTORS,
    MAX_PROPERTY_NAME_LEN, Operator, PropertySelector, PropertySelectorRequirement,
    SAME_AS_IMPORTER, SelectorProblem, check_property_name, validate_cluster_selectors as validate,
};

/// One cluster's `ClusterProperty` values, by property name.
pub type Properties = BTreeMap<String, String>;

/// A [`ClusterSelector`] bound to one importing cluster: [`SAME_AS_IMPORTER`] resolved
/// with the importer's properties. Prepare it again when they change.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct PreparedSelector {
    /// `None` when the selector names, through [`SAME_AS_IMPORTER`], a property the
    /// importer does not have: it matches no cluster.
    requirements: Option<Vec<Prepared>>,
}

#[derive(Clone, Debug, PartialEq, Eq)]
struct Prepared {
    key: String,
    operator: Operator,
    values: BTreeSet<String>,
}

impl PreparedSelector {
    /// Validates `selector` and binds it to the importer with properties `importer`.
    pub fn prepare(
        selector: &ClusterSelector,
        importer: &Properties,
    ) -> Result<Self, SelectorProblem> {
        let mut prepared = Vec::new();
        for r in requirements(selector)? {
            let mut values = BTreeSet::new();
            for v in r.values {
                if v == SAME_AS_IMPORTER {
                    match importer.get(r.key) {
                        Some(own) => values.insert(own.clone()),
                        None => return Ok(Self { requirements: None }),
                    };
                } else {
                    values.insert(v.to_owned());
                }
            }
            prepared.push(Prepared {
                key: r.key.to_owned(),
                operator: r.operator,
                values,
            });
        }
        Ok(Self {
            requirements: Some(prepared),
        })
    }

    /// Whether a cluster with these properties is selected.
    pub fn matches(&self, properties: &Properties) -> bool {
        let Some(requirements) = &self.requirements else {
            return false;
        };
        requirements.iter().all(|r| {
            let value = properties.get(&r.key);
            match r.operator {
                Operator::In => value.is_some_and(|v| r.values.contains(v)),
                Operator::NotIn => value.is_none_or(|v| !r.values.contains(v)),
                Operator::Exists => value.is_some(),
                Operator::DoesNotExist => value.is_none(),
            }
        })
    }
}

/// Evaluates a service's `clusterSelectors` for one importer over the service's source
/// clusters (each with its properties): one list of matched clusters per selector, in
/// selector order, each in cluster-id order. An invalid list gives its error and no
/// results, so a caller keeps the results it published before (the KEP asks for no partial
/// update).
pub fn evaluate(
    selectors: &[ClusterSelector],
    importer: &Properties,
    sources: &BTreeMap<ClusterId, Properties>,
) -> Result<Vec<Vec<ClusterId>>, InvalidClusterSelector> {
    if selectors.len() > MAX_CLUSTER_SELECTORS {
        return Err(InvalidClusterSelector::TooMany {
            count: selectors.len(),
        });
    }
    selectors
        .iter()
        .enumerate()
        .map(|(index, selector)| {
            let prepared = PreparedSelector::prepare(selector, importer)
                .map_err(|problem| InvalidClusterSelector::Entry { index, problem })?;
            Ok(sources
                .iter()
                .filter(|(_, properties)| prepared.matches(properties))
                .map(|(id, _)| id.clone())
                .collect())
        })
        .collect()
}

/// Which clusters a consumer sends the traffic to, after [`choose`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Choice {
    /// The clusters of the result at this position.
    Result(usize),
    /// Every source cluster: no result has an available endpoint (or there are none).
    AllClusters,
}

/// KEP-5939's consumer algorithm: the first result with a cluster that has at least one
/// endpoint eligible for the traffic at hand (its port, protocol, `internalTrafficPolicy`)
/// and ready or serving, as `available` says per cluster; else every cluster. It runs
/// before `trafficDistribution`, which never moves the choice to a later result.
pub fn choose<T, R: AsRef<[T]>>(results: &[R], mut available: impl FnMut(&T) -> bool) -> Choice {
    results
        .iter()
        .position(|result| result.as_ref().iter().any(&mut available))
        .map_or(Choice::AllClusters, Choice::Result)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn id(s: &str) -> ClusterId {
        ClusterId::new(s).unwrap()
    }

    fn props(pairs: &[(&str, &str)]) -> Properties {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    fn expr(key: &str, operator: &str, values: &[&str]) -> PropertySelectorRequirement {
        PropertySelectorRequirement {
            key: key.into(),
            operator: operator.into(),
            values: values.iter().map(|v| (*v).to_owned()).collect(),
        }
    }

    fn sel(
        match_properties: &[(&str, &str)],
        exprs: Vec<PropertySelectorRequirement>,
    ) -> ClusterSelector {
        ClusterSelector {
            property_selector: Some(PropertySelector {
                match_properties: props(match_properties),
                match_expressions: exprs,
            }),
        }
    }

    const CLUSTER: &str = "cluster.clusterset.k8s.io";
    const REGION: &str = "region.topology.k8s.io";
    const CONTINENT: &str = "continent.topology.k8s.io";

    /// KEP-5939's Story 1 on four clusters: each importer's results are its own cluster,
    /// then its region's, then its continent's.
    #[test]
    fn story_one_cluster_then_region_then_continent() {
        let selectors = vec![
            sel(&[], vec![expr(CLUSTER, "In", &[SAME_AS_IMPORTER])]),
            sel(&[(REGION, SAME_AS_IMPORTER)], vec![]),
            sel(&[(CONTINENT, SAME_AS_IMPORTER)], vec![]),
        ];
        let member =
            |c: &str, r: &str, k: &str| props(&[(CLUSTER, c), (REGION, r), (CONTINENT, k)]);
        let sources = BTreeMap::from([
            (id("cluster-a"), member("cluster-a", "eu-west", "eu")),
            (id("cluster-b"), member("cluster-b", "eu-west", "eu")),
            (id("cluster-c"), member("cluster-c", "eu-north", "eu")),
            (id("cluster-d"), member("cluster-d", "us-east", "na")),
        ]);
        let results = evaluate(&selectors, &sources[&id("cluster-a")], &sources).unwrap();
        assert_eq!(
            results,
            vec![
                vec![id("cluster-a")],
                vec![id("cluster-a"), id("cluster-b")],
                vec![id("cluster-a"), id("cluster-b"), id("cluster-c")],
            ]
        );
        // An importer that exports nothing, in us-east: no cluster of its own, d by region.
        let results = evaluate(&selectors, &member("north", "us-east", "na"), &sources).unwrap();
        assert_eq!(
            results,
            vec![vec![], vec![id("cluster-d")], vec![id("cluster-d")]]
        );
    }

    #[test]
    fn an_importer_without_the_property_matches_nothing_even_with_not_in() {
        let sources = BTreeMap::from([
            (id("east"), props(&[(REGION, "eu")])),
            (id("west"), props(&[])),
        ]);
        for selector in [
            sel(&[(REGION, SAME_AS_IMPORTER)], vec![]),
            sel(&[], vec![expr(REGION, "NotIn", &[SAME_AS_IMPORTER])]),
            sel(&[], vec![expr(REGION, "In", &["eu", SAME_AS_IMPORTER])]),
        ] {
            let results = evaluate(std::slice::from_ref(&selector), &props(&[]), &sources).unwrap();
            assert_eq!(results, vec![Vec::<ClusterId>::new()], "{selector:?}");
        }
        // With the property, NotIn keeps clusters that lack it (label selector semantics).
        let results = evaluate(
            &[sel(&[], vec![expr(REGION, "NotIn", &[SAME_AS_IMPORTER])])],
            &props(&[(REGION, "us")]),
            &sources,
        )
        .unwrap();
        assert_eq!(results, vec![vec![id("east"), id("west")]]);
    }

    #[test]
    fn requirements_are_anded_and_operators_mean_what_label_selectors_mean() {
        let gpu = "gpu-tier.example.com";
        let sources = BTreeMap::from([
            (id("a"), props(&[(CONTINENT, "eu"), (gpu, "high")])),
            (id("b"), props(&[(CONTINENT, "eu"), (gpu, "low")])),
            (id("c"), props(&[(CONTINENT, "eu")])),
            (id("d"), props(&[(CONTINENT, "na"), (gpu, "high")])),
        ]);
        let importer = props(&[(CONTINENT, "eu")]);
        let selectors = vec![
            sel(&[(CONTINENT, SAME_AS_IMPORTER), (gpu, "high")], vec![]),
            sel(
                &[(CONTINENT, SAME_AS_IMPORTER)],
                vec![expr(gpu, "Exists", &[])],
            ),
            sel(&[], vec![expr(gpu, "Exists", &[])]),
            sel(&[], vec![expr(gpu, "DoesNotExist", &[])]),
            sel(&[], vec![expr(gpu, "NotIn", &["high"])]),
        ];
        let results = evaluate(&selectors, &importer, &sources).unwrap();
        assert_eq!(
            results,
            vec![
                vec![id("a")],
                vec![id("a"), id("b")],
                vec![id("a"), id("b"), id("d")],
                vec![id("c")],
                vec![id("b"), id("c")],
            ]
        );
    }

    #[test]
    fn invalid_selectors_name_the_entry_and_the_problem() {
        let ok = sel(&[(REGION, "eu")], vec![]);
        let cases = [
            (ClusterSelector::default(), SelectorProblem::NoCriterion),
            (sel(&[], vec![]), SelectorProblem::Empty),
            (
                sel(&[("Region", "eu")], vec![]),
                SelectorProblem::InvalidKey {
                    key: "Region".into(),
                    reason: "may hold only a-z, 0-9, '-' and '.'",
                },
            ),
            (
                sel(&[], vec![expr(SAME_AS_IMPORTER, "Exists", &[])]),
                SelectorProblem::InvalidKey {
                    key: SAME_AS_IMPORTER.into(),
                    reason: "may hold only a-z, 0-9, '-' and '.'",
                },
            ),
            (
                sel(&[], vec![expr(REGION, "in", &["eu"])]),
                SelectorProblem::UnknownOperator {
                    key: REGION.into(),
                    operator: "in".into(),
                },
            ),
            (
                sel(&[], vec![expr(REGION, "NotIn", &[])]),
                SelectorProblem::ValuesRequired {
                    key: REGION.into(),
                    operator: Operator::NotIn,
                },
            ),
            (
                sel(&[], vec![expr(REGION, "Exists", &["eu"])]),
                SelectorProblem::ValuesForbidden {
                    key: REGION.into(),
                    operator: Operator::Exists,
                },
            ),
        ];
        for (bad, problem) in cases {
            let list = vec![ok.clone(), bad];
            let want = InvalidClusterSelector::Entry { index: 1, problem };
            assert_eq!(validate(&list), Err(want.clone()));
            assert_eq!(evaluate(&list, &props(&[]), &BTreeMap::new()), Err(want));
        }
        let too_many = vec![ok.clone(); MAX_CLUSTER_SELECTORS + 1];
        assert_eq!(
            validate(&too_many).unwrap_err().to_string(),
            "clusterSelectors has 17 entries; at most 16 are allowed"
        );
        assert_eq!(validate(&vec![ok; MAX_CLUSTER_SELECTORS]), Ok(()));
        assert_eq!(
            validate(&[sel(&[], vec![expr(REGION, "Exists", &["eu"])])])
                .unwrap_err()
                .to_string(),
            "clusterSelectors[0]: key \"region.topology.k8s.io\": operator Exists takes no values"
        );
    }

    #[test]
    fn property_names_are_dns_subdomains() {
        for good in [CLUSTER, "a", "gpu-tier.example.com", "x1.y-2"] {
            assert_eq!(check_property_name(good), Ok(()), "{good}");
        }
        let long = "a".repeat(254);
        for bad in ["", ".a", "a..b", "a.", "-a", "a-", "a_b", "A", &long] {
            assert!(check_property_name(bad).is_err(), "{bad}");
        }
        assert_eq!(check_property_name(&"a".repeat(253)), Ok(()));
    }

    #[test]
    fn the_consumer_takes_the_first_result_with_an_available_cluster() {
        let results = vec![vec!["a"], vec![], vec!["b", "c"], vec!["d"]];
        assert_eq!(choose(&results, |c| *c == "a"), Choice::Result(0));
        assert_eq!(choose(&results, |c| *c == "c"), Choice::Result(2));
        assert_eq!(choose(&results, |c| *c == "d"), Choice::Result(3));
        assert_eq!(choose(&results, |c| *c == "e"), Choice::AllClusters);
        assert_eq!(
            choose::<&str, Vec<&str>>(&[], |_| true),
            Choice::AllClusters
        );
    }

    #[test]
    fn the_wire_form_is_the_keps() {
        let yaml = r#"[{"propertySelector":{"matchProperties":{"continent.topology.k8s.io":"@SameAsImporter@"},"matchExpressions":[{"key":"gpu-tier.mycompany.com","operator":"Exists"}]}}]"#;
        let selectors: Vec<ClusterSelector> = serde_json::from_str(yaml).unwrap();
        assert_eq!(
            selectors,
            vec![sel(
                &[(CONTINENT, SAME_AS_IMPORTER)],
                vec![expr("gpu-tier.mycompany.com", "Exists", &[])]
            )]
        );
        assert_eq!(serde_json::to_string(&selectors).unwrap(), yaml);
        let result = ClusterSelectorResult::from(&[id("a"), id("b")][..]);
        assert_eq!(
            serde_json::to_string(&result).unwrap(),
            r#"{"clusters":["a","b"]}"#
        );
        assert_eq!(
            serde_json::to_string(&ClusterSelectorResult::default()).unwrap(),
            "{}"
        );
    }
}
