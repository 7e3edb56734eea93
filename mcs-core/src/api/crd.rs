//! CustomResourceDefinitions generated from the Rust types.
//!
//! The output is schema-equivalent to the upstream CRDs of mcs-api v0.5.0 and about-api
//! (KEP-1645 and KEP-2149): same names, short names, scope, versions, subresources, printer
//! columns, required fields, enums, list types and keys and maximum sizes. The only
//! addition is `ServiceImport.status.endpointSliceObjects` from KEP-1645 (2026), which
//! upstream has not released yet ([`UNRELEASED_ADDITIONS`]).

use std::collections::BTreeMap;

use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceColumnDefinition, CustomResourceDefinition, CustomResourceDefinitionNames,
    CustomResourceDefinitionSpec, CustomResourceDefinitionVersion, CustomResourceSubresources,
    CustomResourceValidation, JSONSchemaProps,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use schemars::JsonSchema;
use schemars::generate::SchemaSettings;
use serde_json::{Value, json};

use super::types::{
    ClusterPropertySpec, ClusterPropertyStatus, ServiceExportSpec, ServiceExportStatus,
    ServiceImportSpec, ServiceImportStatus,
};
use super::{
    ABOUT_GROUP, MCS_API_RELEASE, MCS_GROUP, RELEASE_VERSION_LABEL, SCHEMA_REVISION_LABEL,
};

/// Schema paths that this crate serves but upstream mcs-api v0.5.0 does not have yet, with
/// where they come from.
pub const UNRELEASED_ADDITIONS: &[(&str, &str)] = &[(
    "serviceimports.multicluster.x-k8s.io: status.endpointSliceObjects",
    "KEP-1645 (kubernetes/enhancements#6037, 2026-05-26)",
)];

/// The served versions, oldest first, and which one is stored.
const VERSIONS: &[(&str, bool)] = &[("v1alpha1", false), ("v1beta1", true)];

/// The `ServiceExport` CRD.
pub fn service_export() -> CustomResourceDefinition {
    let schema = root_schema(
        "ServiceExport declares that the Service with the same name and namespace as this export should be consumable from other clusters.",
        schema_of::<ServiceExportSpec>(),
        false,
        schema_of::<ServiceExportStatus>(),
    );
    crd(CrdParts {
        group: MCS_GROUP,
        kind: "ServiceExport",
        plural: "serviceexports",
        singular: "serviceexport",
        short_names: &["svcex", "svcexport"],
        categories: &[],
        namespaced: true,
        columns: vec![column("Age", "date", ".metadata.creationTimestamp", None)],
        schema,
        mcs_labels: true,
    })
}

/// The `ServiceImport` CRD.
pub fn service_import() -> CustomResourceDefinition {
    let schema = root_schema(
        "ServiceImport describes a service imported from clusters in a ClusterSet.",
        schema_of::<ServiceImportSpec>(),
        false,
        schema_of::<ServiceImportStatus>(),
    );
    crd(CrdParts {
        group: MCS_GROUP,
        kind: "ServiceImport",
        plural: "serviceimports",
        singular: "serviceimport",
        short_names: &["svcim", "svcimport"],
        categories: &[],
        namespaced: true,
        columns: vec![
            column(
                "Type",
                "string",
                ".spec.type",
                Some("The type of this ServiceImport"),
            ),
            column(
                "IP",
                "string",
                ".spec.ips",
                Some("The VIP for this ServiceImport"),
            ),
            column("Age", "date", ".metadata.creationTimestamp", None),
        ],
        schema,
        mcs_labels: true,
    })
}

/// The `ClusterProperty` CRD (`about.k8s.io`, cluster-scoped).
pub fn cluster_property() -> CustomResourceDefinition {
    let schema = root_schema(
        "ClusterProperty is a resource provides a way to store identification related, cluster scoped information for multi-cluster tools while creating flexibility for implementations.",
        schema_of::<ClusterPropertySpec>(),
        false,
        schema_of::<ClusterPropertyStatus>(),
    );
    crd(CrdParts {
        group: ABOUT_GROUP,
        kind: "ClusterProperty",
        plural: "clusterproperties",
        singular: "clusterproperty",
        short_names: &[],
        categories: &["multicluster"],
        namespaced: false,
        columns: vec![
            column("value", "string", ".spec.value", None),
            column("age", "date", ".metadata.creationTimestamp", None),
        ],
        schema,
        mcs_labels: false,
    })
}

/// All three CRDs: ServiceExport, ServiceImport, ClusterProperty.
pub fn all() -> Vec<CustomResourceDefinition> {
    vec![service_export(), service_import(), cluster_property()]
}

/// All three CRDs with KEP-5939's cluster selection added (unstable): `clusterSelectors` in
/// the spec of ServiceExport and ServiceImport (at most 16, atomic), and
/// `status.clusterSelectorResults` and `status.observedGeneration` on ServiceImport, in
/// every served version. Upstream mcs-api has not released these fields: install these
/// CRDs only where cluster selection is wanted; [`all`] stays equal to the release.
#[cfg(feature = "unstable-cluster-selection")]
pub fn all_with_cluster_selection() -> Vec<CustomResourceDefinition> {
    use super::{ClusterSelector, ClusterSelectorResult, MAX_CLUSTER_SELECTORS};

    let mut selectors = schema_of::<Vec<ClusterSelector>>();
    selectors["maxItems"] = json!(MAX_CLUSTER_SELECTORS);
    selectors["x-kubernetes-list-type"] = json!("atomic");
    selectors["items"]["required"] = json!(["propertySelector"]);
    let property_selector = &mut selectors["items"]["properties"]["propertySelector"];
    property_selector["x-kubernetes-map-type"] = json!("atomic");
    property_selector["properties"]["matchExpressions"]["x-kubernetes-list-type"] = json!("atomic");
    let mut results = schema_of::<Vec<ClusterSelectorResult>>();
    results["x-kubernetes-list-type"] = json!("atomic");
    results["items"]["properties"]["clusters"]["x-kubernetes-list-type"] = json!("atomic");
    let generation = json!({
        "description": "The import's metadata.generation this status was written for.",
        "type": "integer",
        "format": "int64",
    });

    let mut export = service_export();
    add_property(&mut export, "spec", "clusterSelectors", &selectors);
    let mut import = service_import();
    add_property(&mut import, "spec", "clusterSelectors", &selectors);
    add_property(&mut import, "status", "clusterSelectorResults", &results);
    add_property(&mut import, "status", "observedGeneration", &generation);
    vec![export, import, cluster_property()]
}

/// Adds `schema` as property `name` of the top-level object `field` (`spec`, `status`) in
/// every version of `crd`.
#[cfg(feature = "unstable-cluster-selection")]
fn add_property(crd: &mut CustomResourceDefinition, field: &str, name: &str, schema: &Value) {
    // Invariant: `schema` comes from our own types and is a valid JSONSchemaProps (the
    // tests decode and check every CRD).
    let props: JSONSchemaProps = serde_json::from_value(schema.clone())
        .expect("generated schema is a valid JSONSchemaProps");
    for version in &mut crd.spec.versions {
        let object = version
            .schema
            .as_mut()
            .and_then(|s| s.open_api_v3_schema.as_mut())
            .and_then(|root| root.properties.as_mut())
            .and_then(|p| p.get_mut(field))
            .expect("every version has a spec and a status object");
        object
            .properties
            .get_or_insert_with(BTreeMap::new)
            .insert(name.to_owned(), props.clone());
    }
}

/// Renders CRDs as one multi-document YAML stream.
pub fn to_yaml(crds: &[CustomResourceDefinition]) -> String {
    let mut out = String::new();
    for crd in crds {
        out.push_str("---\n");
        // A CRD is plain data (string-keyed maps, strings, numbers, booleans): the YAML
        // serializer fails only on non-string map keys or a failing `Serialize` impl, and a
        // CRD has neither.
        let doc = serde_saphyr::to_string(crd).expect("a CRD always serializes to YAML");
        out.push_str(&doc);
    }
    out
}

struct CrdParts {
    group: &'static str,
    kind: &'static str,
    plural: &'static str,
    singular: &'static str,
    short_names: &'static [&'static str],
    categories: &'static [&'static str],
    namespaced: bool,
    columns: Vec<CustomResourceColumnDefinition>,
    schema: JSONSchemaProps,
    mcs_labels: bool,
}

fn crd(parts: CrdParts) -> CustomResourceDefinition {
    let strings = |v: &[&str]| (!v.is_empty()).then(|| v.iter().map(|s| (*s).to_owned()).collect());
    let labels = parts.mcs_labels.then(|| {
        BTreeMap::from([
            (RELEASE_VERSION_LABEL.to_owned(), MCS_API_RELEASE.to_owned()),
            (SCHEMA_REVISION_LABEL.to_owned(), "0".to_owned()),
        ])
    });
    let versions = VERSIONS
        .iter()
        .map(|(name, storage)| CustomResourceDefinitionVersion {
            name: (*name).to_owned(),
            served: true,
            storage: *storage,
            additional_printer_columns: Some(parts.columns.clone()),
            schema: Some(CustomResourceValidation {
                open_api_v3_schema: Some(parts.schema.clone()),
            }),
            subresources: Some(CustomResourceSubresources {
                status: Some(k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceSubresourceStatus(
                    json!({}),
                )),
                scale: None,
            }),
            ..Default::default()
        })
        .collect();
    CustomResourceDefinition {
        metadata: ObjectMeta {
            name: Some(format!("{}.{}", parts.plural, parts.group)),
            labels,
            annotations: protected_group_annotation(parts.group),
            ..Default::default()
        },
        spec: CustomResourceDefinitionSpec {
            group: parts.group.to_owned(),
            names: CustomResourceDefinitionNames {
                kind: parts.kind.to_owned(),
                list_kind: Some(format!("{}List", parts.kind)),
                plural: parts.plural.to_owned(),
                singular: Some(parts.singular.to_owned()),
                short_names: strings(parts.short_names),
                categories: strings(parts.categories),
            },
            scope: if parts.namespaced {
                "Namespaced"
            } else {
                "Cluster"
            }
            .to_owned(),
            versions,
            conversion: None,
            preserve_unknown_fields: None,
        },
        status: None,
    }
}

/// The API server refuses CRDs in `*.k8s.io` groups without an `api-approved.kubernetes.io`
/// annotation. `about.k8s.io` is such a group; the value states that this copy is not the
/// reviewed upstream object (the server then installs it and reports the policy condition).
fn protected_group_annotation(group: &str) -> Option<BTreeMap<String, String>> {
    (group.ends_with(".k8s.io") || group.ends_with(".kubernetes.io")).then(|| {
        BTreeMap::from([(
            "api-approved.kubernetes.io".to_owned(),
            "unapproved, KEP-2149 ClusterProperty as published by kubernetes-sigs/about-api"
                .to_owned(),
        )])
    })
}

fn column(
    name: &str,
    type_: &str,
    json_path: &str,
    description: Option<&str>,
) -> CustomResourceColumnDefinition {
    CustomResourceColumnDefinition {
        name: name.to_owned(),
        type_: type_.to_owned(),
        json_path: json_path.to_owned(),
        description: description.map(str::to_owned),
        format: None,
        priority: None,
    }
}

fn root_schema(
    description: &str,
    spec: Value,
    spec_required: bool,
    status: Value,
) -> JSONSchemaProps {
    let mut root = json!({
        "description": description,
        "type": "object",
        "properties": {
            "apiVersion": { "type": "string" },
            "kind": { "type": "string" },
            "metadata": { "type": "object" },
            "spec": spec,
            "status": status,
        }
    });
    if spec_required {
        root["required"] = json!(["spec"]);
    }
    // Invariant: the schema is built from our own types and the shape above, which are
    // valid JSONSchemaProps; the unit tests below decode every CRD.
    serde_json::from_value(root).expect("generated schema is a valid JSONSchemaProps")
}

/// The structural OpenAPI v3 schema of `T`: inlined, no `$schema`, no nullability markers.
fn schema_of<T: JsonSchema>() -> Value {
    let generator = SchemaSettings::openapi3()
        .with(|s| {
            s.inline_subschemas = true;
            s.meta_schema = None;
        })
        .into_generator();
    let mut value = generator.into_root_schema_for::<T>().to_value();
    structural(&mut value);
    value
}

/// Drops what a structural Kubernetes schema must not carry: `nullable` (upstream CRDs do
/// not mark optional fields nullable), `title`, `$schema`, `null` in `type` or `enum`.
fn structural(value: &mut Value) {
    match value {
        Value::Object(map) => {
            map.remove("nullable");
            map.remove("title");
            map.remove("$schema");
            if let Some(Value::Array(types)) = map.get("type") {
                let non_null: Vec<Value> = types.iter().filter(|t| *t != "null").cloned().collect();
                if non_null.len() == 1 {
                    map.insert("type".to_owned(), non_null[0].clone());
                }
            }
            if let Some(Value::Array(values)) = map.get_mut("enum") {
                values.retain(|v| !v.is_null());
            }
            if map.get("default").is_some_and(Value::is_null) {
                map.remove("default");
            }
            for v in map.values_mut() {
                structural(v);
            }
        }
        Value::Array(items) => items.iter_mut().for_each(structural),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_crd_serialises_and_has_two_versions() {
        for crd in all() {
            let yaml = to_yaml(std::slice::from_ref(&crd));
            assert!(yaml.contains("openAPIV3Schema"));
            assert_eq!(crd.spec.versions.len(), 2);
            assert_eq!(crd.spec.versions.iter().filter(|v| v.storage).count(), 1);
            assert_eq!(crd.spec.versions[1].name, "v1beta1");
            assert!(crd.spec.versions[1].storage);
        }
    }

    /// The selection CRDs are the released ones plus exactly the KEP-5939 fields.
    #[cfg(feature = "unstable-cluster-selection")]
    #[test]
    fn cluster_selection_crds_add_the_kep_fields_and_nothing_else() {
        fn root(version: &CustomResourceDefinitionVersion) -> &JSONSchemaProps {
            let schema = version.schema.as_ref().unwrap();
            schema.open_api_v3_schema.as_ref().unwrap()
        }
        let props = |crd: &CustomResourceDefinition, field: &str| -> BTreeMap<String, Value> {
            let object = &root(&crd.spec.versions[1]).properties.as_ref().unwrap()[field];
            object
                .properties
                .clone()
                .unwrap_or_default()
                .into_iter()
                .map(|(k, v)| (k, serde_json::to_value(v).unwrap()))
                .collect()
        };
        let (plain, extended) = (all(), all_with_cluster_selection());
        let added = |i: usize, field: &str| -> Vec<String> {
            let (a, b) = (props(&plain[i], field), props(&extended[i], field));
            assert!(
                a.iter().all(|(k, v)| b.get(k) == Some(v)),
                "{field}: a released field changed"
            );
            b.keys().filter(|k| !a.contains_key(*k)).cloned().collect()
        };
        assert_eq!(added(0, "spec"), ["clusterSelectors"]);
        assert_eq!(added(0, "status"), Vec::<String>::new());
        assert_eq!(added(1, "spec"), ["clusterSelectors"]);
        assert_eq!(
            added(1, "status"),
            ["clusterSelectorResults", "observedGeneration"]
        );
        assert_eq!(plain[2], extended[2]);

        let selectors = &props(&extended[0], "spec")["clusterSelectors"];
        assert_eq!(selectors["maxItems"], 16);
        assert_eq!(selectors["x-kubernetes-list-type"], "atomic");
        assert_eq!(selectors["items"]["required"], json!(["propertySelector"]));
        let ps = &selectors["items"]["properties"]["propertySelector"];
        assert_eq!(ps["x-kubernetes-map-type"], "atomic");
        assert_eq!(ps["properties"]["matchProperties"]["type"], "object");
        let req = &ps["properties"]["matchExpressions"]["items"];
        assert_eq!(req["required"], json!(["key", "operator"]));
        for v in [&extended[0], &extended[1]] {
            assert_eq!(v.spec.versions.len(), 2);
            for version in &v.spec.versions {
                let spec = &root(version).properties.as_ref().unwrap()["spec"];
                assert!(
                    spec.properties
                        .as_ref()
                        .unwrap()
                        .contains_key("clusterSelectors")
                );
            }
        }
    }
}
