//! `selection::evaluate` against a deliberately naive evaluator written from KEP-5939's
//! text alone: no shared code, no prepared form, every requirement read off the wire type
//! for every candidate, `@SameAsImporter@` looked up each time it is met.
//!
//! Generated selectors use a few keys and values (so that matches are common), every
//! operator and some that are not operators, keys that are not property names, empty
//! selectors and missing criteria; properties are random subsets. Checked: the same
//! verdict (valid or not, and for which entry) and, when valid, the same clusters for every
//! selector, in order; and that endpoint availability, which results never depend on, only
//! moves the consumer's choice as the KEP's algorithm says.

use std::collections::BTreeMap;

use mcs_core::ClusterId;
use mcs_core::selection::{
    Choice, ClusterSelector, InvalidClusterSelector, PropertySelector, PropertySelectorRequirement,
    choose, evaluate, validate,
};
use proptest::collection::{btree_map, vec};
use proptest::prelude::*;

const SAME: &str = "@SameAsImporter@";

/// The KEP's rules, spelled out one by one: `Some(index)` of the first invalid entry.
fn naive_first_invalid(selectors: &[ClusterSelector]) -> Option<usize> {
    for (i, s) in selectors.iter().enumerate() {
        let Some(ps) = &s.property_selector else {
            return Some(i);
        };
        if ps.match_properties.is_empty() && ps.match_expressions.is_empty() {
            return Some(i);
        }
        let keys = ps
            .match_properties
            .keys()
            .chain(ps.match_expressions.iter().map(|e| &e.key));
        for key in keys {
            // A DNS subdomain: the generated keys are either plain lowercase names with
            // dots and dashes inside, or contain one of these.
            let bad = key.is_empty()
                || key.len() > 253
                || key.contains(|c: char| {
                    !(c.is_ascii_lowercase() || c.is_ascii_digit() || c == '.' || c == '-')
                })
                || key
                    .split('.')
                    .any(|p| p.is_empty() || p.starts_with('-') || p.ends_with('-'));
            if bad {
                return Some(i);
            }
        }
        for e in &ps.match_expressions {
            let ok = match e.operator.as_str() {
                "In" | "NotIn" => !e.values.is_empty(),
                "Exists" | "DoesNotExist" => e.values.is_empty(),
                _ => false,
            };
            if !ok {
                return Some(i);
            }
        }
    }
    None
}

/// Whether one cluster is selected, straight from the text: every pair of
/// `matchProperties` and every expression must hold; `@SameAsImporter@` is the importer's
/// value, and when the importer has none the whole selector selects nothing.
fn naive_selects(
    s: &ClusterSelector,
    importer: &BTreeMap<String, String>,
    cluster: &BTreeMap<String, String>,
) -> bool {
    let ps = s.property_selector.as_ref().unwrap();
    let resolve = |key: &str, v: &str| -> Option<String> {
        if v == SAME {
            importer.get(key).cloned()
        } else {
            Some(v.to_string())
        }
    };
    for (k, v) in &ps.match_properties {
        let Some(want) = resolve(k, v) else {
            return false;
        };
        if cluster.get(k) != Some(&want) {
            return false;
        }
    }
    for e in &ps.match_expressions {
        let mut wanted = Vec::new();
        for v in &e.values {
            match resolve(&e.key, v) {
                Some(w) => wanted.push(w),
                None => return false,
            }
        }
        let have = cluster.get(&e.key);
        let holds = match e.operator.as_str() {
            "In" => have.is_some_and(|h| wanted.contains(h)),
            "NotIn" => match have {
                None => true,
                Some(h) => !wanted.contains(h),
            },
            "Exists" => have.is_some(),
            "DoesNotExist" => have.is_none(),
            _ => unreachable!("validated"),
        };
        if !holds {
            return false;
        }
    }
    true
}

fn key() -> impl Strategy<Value = String> {
    prop_oneof![
        8 => prop::sample::select(vec!["region.topology.k8s.io", "zone", "gpu-tier.example.com", "cluster.clusterset.k8s.io"]).prop_map(String::from),
        1 => prop::sample::select(vec!["Region", "a..b", "-x", "x_y", SAME, ""]).prop_map(String::from),
    ]
}

fn value() -> impl Strategy<Value = String> {
    prop::sample::select(vec!["eu", "us", "high", "", SAME]).prop_map(String::from)
}

fn requirement() -> impl Strategy<Value = PropertySelectorRequirement> {
    (
        key(),
        prop_oneof![
            8 => prop::sample::select(vec!["In", "NotIn", "Exists", "DoesNotExist"]),
            1 => prop::sample::select(vec!["in", "Gt", ""]),
        ],
        vec(value(), 0..3),
    )
        .prop_map(|(key, operator, values)| PropertySelectorRequirement {
            key,
            operator: operator.to_string(),
            values,
        })
}

fn selector() -> impl Strategy<Value = ClusterSelector> {
    prop_oneof![
        20 => (btree_map(key(), value(), 0..3), vec(requirement(), 0..3)).prop_map(|(match_properties, match_expressions)| ClusterSelector {
            property_selector: Some(PropertySelector { match_properties, match_expressions }),
        }),
        1 => Just(ClusterSelector::default()),
    ]
}

fn properties() -> impl Strategy<Value = BTreeMap<String, String>> {
    btree_map(
        prop::sample::select(vec![
            "region.topology.k8s.io",
            "zone",
            "gpu-tier.example.com",
            "cluster.clusterset.k8s.io",
        ])
        .prop_map(String::from),
        prop::sample::select(vec!["eu", "us", "high", "low"]).prop_map(String::from),
        0..4,
    )
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn evaluate_agrees_with_the_naive_reading(
        selectors in vec(selector(), 0..5),
        importer in properties(),
        clusters in vec(properties(), 0..6),
        available in vec(any::<bool>(), 6),
    ) {
        let sources: BTreeMap<ClusterId, _> = clusters
            .into_iter()
            .enumerate()
            .map(|(i, p)| (ClusterId::new(format!("c{i}")).unwrap(), p))
            .collect();
        let got = evaluate(&selectors, &importer, &sources);
        match naive_first_invalid(&selectors) {
            Some(index) => {
                let same = matches!(got, Err(InvalidClusterSelector::Entry { index: i, .. }) if i == index);
                prop_assert!(same, "naive: entry {} invalid; evaluate: {:?}", index, got);
                let valid = validate(&selectors);
                let same = matches!(valid, Err(InvalidClusterSelector::Entry { index: i, .. }) if i == index);
                prop_assert!(same, "naive: entry {} invalid; validate: {:?}", index, valid);
            }
            None => {
                prop_assert_eq!(validate(&selectors), Ok(()));
                let got = got.unwrap();
                let want: Vec<Vec<ClusterId>> = selectors
                    .iter()
                    .map(|s| {
                        sources
                            .iter()
                            .filter(|(_, p)| naive_selects(s, &importer, p))
                            .map(|(id, _)| id.clone())
                            .collect()
                    })
                    .collect();
                prop_assert_eq!(&got, &want);

                // The consumer: the first result holding an available cluster, else all.
                let is_available = |c: &ClusterId| {
                    let i: usize = c.as_str()[1..].parse().unwrap();
                    available[i]
                };
                let first = want.iter().position(|r| r.iter().any(is_available));
                let choice = choose(&got, is_available);
                prop_assert_eq!(choice, first.map_or(Choice::AllClusters, Choice::Result));
            }
        }
    }
}
