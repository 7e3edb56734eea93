//! The generated CRDs are schema-equivalent to the upstream CRDs vendored in
//! `tests/fixtures/upstream/`,
//! the checked-in `deploy/crds/` matches the generator, and upstream demo objects and full
//! objects of every kind round-trip through the Rust types unchanged.

use std::path::PathBuf;

use mcs_core::api::crd::{self, UNRELEASED_ADDITIONS};
use serde_json::{Map, Value};

/// The upstream CRDs and demo objects vendored into the repository (their source and
/// version: `tests/fixtures/upstream/README.md`).
fn upstream_dir() -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/fixtures/upstream")
}

fn load_yaml(path: PathBuf) -> Value {
    let text =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    serde_saphyr::from_str(&text).unwrap_or_else(|e| panic!("parse {}: {e}", path.display()))
}

/// Keeps what the schema promises (types, formats, required, enums, list types and keys,
/// sizes, patterns) and drops prose.
fn normalize_schema(v: &Value) -> Value {
    match v {
        Value::Object(map) => {
            let mut out = Map::new();
            for (k, val) in map {
                match k.as_str() {
                    "description" => {}
                    "required" => {
                        let mut items: Vec<String> = val
                            .as_array()
                            .unwrap()
                            .iter()
                            .map(|s| s.as_str().unwrap().to_owned())
                            .collect();
                        items.sort();
                        out.insert(k.clone(), items.into());
                    }
                    "properties" if val.as_object().is_some_and(Map::is_empty) => {}
                    _ => {
                        out.insert(k.clone(), normalize_schema(val));
                    }
                }
            }
            Value::Object(out)
        }
        Value::Array(items) => Value::Array(items.iter().map(normalize_schema).collect()),
        // JSONSchemaProps stores numbers as f64 (`0.0`), YAML has integers (`0`).
        Value::Number(n) => n.as_f64().map_or(Value::Number(n.clone()), Value::from),
        other => other.clone(),
    }
}

/// Removes the KEP additions upstream has not released, by their `status.x.y` path.
fn remove_unreleased(crd_name: &str, schema: &mut Value) {
    for (addition, _) in UNRELEASED_ADDITIONS {
        let (name, path) = addition.split_once(": ").unwrap();
        if name != crd_name {
            continue;
        }
        let parts: Vec<&str> = path.split('.').collect();
        let mut node = &mut *schema;
        for part in &parts[..parts.len() - 1] {
            node = node.get_mut("properties").unwrap().get_mut(*part).unwrap();
        }
        let removed = node
            .get_mut("properties")
            .unwrap()
            .as_object_mut()
            .unwrap()
            .remove(*parts.last().unwrap());
        assert!(
            removed.is_some(),
            "listed addition {addition} is not in the generated CRD"
        );
    }
}

fn first_difference(path: &str, a: &Value, b: &Value) -> Option<String> {
    match (a, b) {
        (Value::Object(x), Value::Object(y)) => {
            for k in x.keys().chain(y.keys()) {
                let p = format!("{path}.{k}");
                match (x.get(k), y.get(k)) {
                    (Some(va), Some(vb)) => {
                        if let Some(d) = first_difference(&p, va, vb) {
                            return Some(d);
                        }
                    }
                    (va, vb) => return Some(format!("{p}: generated {va:?} vs upstream {vb:?}")),
                }
            }
            None
        }
        _ if a == b => None,
        _ => Some(format!("{path}: generated {a} vs upstream {b}")),
    }
}

fn assert_equivalent(
    generated: &k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
    upstream: Value,
) {
    let ours = serde_json::to_value(generated).unwrap();
    let name = ours["metadata"]["name"].as_str().unwrap().to_owned();
    assert_eq!(ours["metadata"]["name"], upstream["metadata"]["name"]);
    assert_eq!(
        ours["metadata"]["labels"], upstream["metadata"]["labels"],
        "{name}: labels"
    );
    let (os, us) = (&ours["spec"], &upstream["spec"]);
    assert_eq!(os["group"], us["group"], "{name}: group");
    assert_eq!(os["scope"], us["scope"], "{name}: scope");
    for key in ["kind", "plural", "singular", "shortNames", "categories"] {
        assert_eq!(os["names"][key], us["names"][key], "{name}: names.{key}");
    }
    // listKind defaults to `<kind>List` on the server; upstream sets it only for ClusterProperty.
    let kind = us["names"]["kind"].as_str().unwrap();
    let upstream_list = us["names"]["listKind"]
        .as_str()
        .map(str::to_owned)
        .unwrap_or(format!("{kind}List"));
    assert_eq!(
        os["names"]["listKind"],
        Value::from(upstream_list),
        "{name}: listKind"
    );

    let ov = os["versions"].as_array().unwrap();
    let uv = us["versions"].as_array().unwrap();
    assert_eq!(ov.len(), uv.len(), "{name}: number of versions");
    for (o, u) in ov.iter().zip(uv) {
        let version = u["name"].as_str().unwrap();
        assert_eq!(o["name"], u["name"], "{name}: version order");
        for key in ["served", "storage", "subresources"] {
            assert_eq!(o[key], u[key], "{name} {version}: {key}");
        }
        let columns = |v: &Value| -> Vec<(Value, Value, Value)> {
            v["additionalPrinterColumns"]
                .as_array()
                .unwrap()
                .iter()
                .map(|c| (c["name"].clone(), c["type"].clone(), c["jsonPath"].clone()))
                .collect()
        };
        assert_eq!(columns(o), columns(u), "{name} {version}: printer columns");
        let mut generated = normalize_schema(&o["schema"]["openAPIV3Schema"]);
        remove_unreleased(&name, &mut generated);
        let upstream = normalize_schema(&u["schema"]["openAPIV3Schema"]);
        if let Some(diff) = first_difference("openAPIV3Schema", &generated, &upstream) {
            panic!(
                "{name} {version}: schemas differ at {diff}\n--- generated ---\n{}\n--- upstream ---\n{}",
                serde_saphyr::to_string(&generated).unwrap(),
                serde_saphyr::to_string(&upstream).unwrap()
            );
        }
    }
}

#[test]
fn service_export_crd_matches_upstream() {
    assert_equivalent(
        &crd::service_export(),
        load_yaml(upstream_dir().join("mcs-api/multicluster.x-k8s.io_serviceexports.yaml")),
    );
}

#[test]
fn service_import_crd_matches_upstream() {
    assert_equivalent(
        &crd::service_import(),
        load_yaml(upstream_dir().join("mcs-api/multicluster.x-k8s.io_serviceimports.yaml")),
    );
}

#[test]
fn cluster_property_crd_matches_upstream() {
    assert_equivalent(
        &crd::cluster_property(),
        load_yaml(upstream_dir().join("about-api/about.k8s.io_clusterproperties.yaml")),
    );
}

#[test]
fn unreleased_additions_are_really_added() {
    let ours = serde_json::to_value(crd::service_import()).unwrap();
    let status = &ours["spec"]["versions"][1]["schema"]["openAPIV3Schema"]["properties"]["status"];
    assert_eq!(
        status["properties"]["endpointSliceObjects"]["enum"],
        serde_json::json!(["Present", "Absent"])
    );
}

#[test]
fn checked_in_crds_match_the_generator() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("../deploy/crds/mcs-crds.yaml");
    let checked_in =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let generated = crd::to_yaml(&crd::all());
    assert!(
        checked_in == generated,
        "deploy/crds/mcs-crds.yaml is stale: run `cargo run -p mcs-cli --bin mcs-crds > deploy/crds/mcs-crds.yaml`"
    );
}

#[cfg(feature = "unstable-cluster-selection")]
#[test]
fn checked_in_cluster_selection_crds_match_the_generator() {
    let path = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("../deploy/crds-cluster-selection/mcs-crds.yaml");
    let checked_in =
        std::fs::read_to_string(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    let generated = crd::to_yaml(&crd::all_with_cluster_selection());
    assert!(
        checked_in == generated,
        "deploy/crds-cluster-selection/mcs-crds.yaml is stale: run `cargo run -p mcs-cli --bin mcs-crds -- --cluster-selection > deploy/crds-cluster-selection/mcs-crds.yaml`"
    );
}
