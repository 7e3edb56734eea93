//! Upstream demo objects and full objects of every kind round-trip through the Rust types
//! unchanged; malformed input yields typed errors that name the field.

use std::path::PathBuf;

use mcs_core::api::{self, DecodeError, decode_json, decode_yaml, v1alpha1, v1beta1};
use serde_json::Value;

/// A fixture vendored from upstream (`tests/fixtures/upstream/README.md` names the source).
fn upstream(path: &str) -> String {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures/upstream")
        .join(path);
    std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()))
}

/// Decodes `text` as `T`, re-encodes it, and checks the JSON value is unchanged.
fn assert_round_trip<T>(text: &str) -> T
where
    T: serde::de::DeserializeOwned + serde::Serialize,
{
    let original: Value = serde_saphyr::from_str(text).unwrap();
    let typed: T = decode_yaml(text).unwrap_or_else(|e| panic!("{e}"));
    let again = serde_json::to_value(&typed).unwrap();
    assert_eq!(again, original, "round trip changed the object");
    typed
}

#[test]
fn upstream_demo_imports_round_trip() {
    let plain: v1beta1::ServiceImport = assert_round_trip(&upstream("mcs-api/serviceimport.yaml"));
    assert_eq!(plain.spec.type_, api::ServiceImportType::ClusterSetIp);
    assert_eq!(plain.spec.ports[0].protocol, Some(api::Protocol::Tcp));
    let vip: v1beta1::ServiceImport =
        assert_round_trip(&upstream("mcs-api/serviceimport-with-vip.yaml"));
    assert_eq!(vip.spec.ips.as_deref(), Some(&["1.2.3.4".to_owned()][..]));
}

const FULL_EXPORT: &str = r#"
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceExport
metadata:
  name: loyalty-accrual
  namespace: loyalty
  creationTimestamp: "2026-11-30T10:00:00Z"
  labels: { dummy-svcexport: "x" }
spec:
  exportedLabels: { tier: gold }
  exportedAnnotations: { owner: loyalty-team }
status:
  conditions:
  - type: Valid
    status: "True"
    reason: Valid
    message: ""
    lastTransitionTime: "2026-11-30T10:00:01Z"
    observedGeneration: 1
  - type: Conflict
    status: "True"
    reason: PortConflict,TypeConflict
    message: "Conflicting ports and type."
    lastTransitionTime: "2026-11-30T10:00:02Z"
"#;

const FULL_IMPORT: &str = r#"
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata:
  name: loyalty-accrual
  namespace: loyalty
  annotations: { owner: loyalty-team }
spec:
  type: ClusterSetIP
  ips: ["10.0.0.10", "fd00::10"]
  ipFamilies: [IPv4, IPv6]
  ports:
  - { name: grpc, protocol: TCP, appProtocol: kubernetes.io/h2c, port: 9443 }
  - { name: metrics, protocol: UDP, port: 9090 }
  - { name: sctp, protocol: SCTP, port: 142 }
  sessionAffinity: ClientIP
  sessionAffinityConfig: { clientIP: { timeoutSeconds: 10 } }
  internalTrafficPolicy: Cluster
  trafficDistribution: PreferClose
status:
  clusters: [{ cluster: east }, { cluster: west }]
  conditions:
  - { type: Ready, status: "True", reason: Ready, message: "", lastTransitionTime: "2026-11-30T10:00:03Z" }
  endpointSliceObjects: Present
"#;

const FULL_PROPERTY: &str = r#"
apiVersion: about.k8s.io/v1beta1
kind: ClusterProperty
metadata: { name: cluster.clusterset.k8s.io }
spec: { value: east }
status: {}
"#;

#[test]
fn full_objects_round_trip_in_both_versions() {
    let export: v1beta1::ServiceExport = assert_round_trip(FULL_EXPORT);
    assert_eq!(
        export.spec.exported_labels.as_ref().unwrap()["tier"],
        "gold"
    );
    let import: v1beta1::ServiceImport = assert_round_trip(FULL_IMPORT);
    assert_eq!(import.spec.ports.len(), 3);
    assert_eq!(
        import.status.as_ref().unwrap().endpoint_slice_objects,
        Some(api::EndpointSliceObjects::Present)
    );
    let property: v1beta1::ClusterProperty = assert_round_trip(FULL_PROPERTY);
    assert_eq!(property.spec.value, "east");

    let alpha = |s: &str| s.replace("/v1beta1", "/v1alpha1");
    let export_a: v1alpha1::ServiceExport = assert_round_trip(&alpha(FULL_EXPORT));
    let import_a: v1alpha1::ServiceImport = assert_round_trip(&alpha(FULL_IMPORT));
    let property_a: v1alpha1::ClusterProperty = assert_round_trip(&alpha(FULL_PROPERTY));
    assert_eq!(v1beta1::ServiceExport::from(export_a.clone()), export);
    assert_eq!(v1beta1::ServiceImport::from(import_a), import);
    assert_eq!(v1beta1::ClusterProperty::from(property_a), property);
    assert_eq!(v1alpha1::ServiceExport::from(export), export_a);
}

#[test]
fn export_without_spec_is_valid_and_ports_always_serialise() {
    let export: v1beta1::ServiceExport = decode_yaml(
        "apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceExport\nmetadata: {name: hello}\n",
    )
    .unwrap();
    assert_eq!(export.spec, api::ServiceExportSpec::default());
    let import = v1beta1::ServiceImport::new(
        "hello",
        api::ServiceImportSpec::new(api::ServiceImportType::Headless),
    );
    let json = serde_json::to_value(&import).unwrap();
    assert_eq!(json["spec"]["ports"], serde_json::json!([]));
    assert_eq!(json["apiVersion"], "multicluster.x-k8s.io/v1beta1");
    assert!(json.get("status").is_none());
}

#[test]
fn resource_metadata_is_right_for_kube() {
    use k8s_openapi::Resource;
    assert_eq!(
        v1beta1::ServiceImport::API_VERSION,
        "multicluster.x-k8s.io/v1beta1"
    );
    assert_eq!(
        v1alpha1::ServiceExport::API_VERSION,
        "multicluster.x-k8s.io/v1alpha1"
    );
    assert_eq!(v1beta1::ServiceExport::URL_PATH_SEGMENT, "serviceexports");
    assert_eq!(
        v1beta1::ClusterProperty::URL_PATH_SEGMENT,
        "clusterproperties"
    );
    assert_eq!(
        <v1beta1::ClusterProperty as kube_core::Resource>::plural(&()),
        "clusterproperties"
    );
    assert_eq!(
        <v1beta1::ServiceImport as kube_core::Resource>::kind(&()),
        "ServiceImport"
    );
}

fn decode_err<T: serde::de::DeserializeOwned + std::fmt::Debug>(text: &str) -> DecodeError {
    decode_yaml::<T>(text).unwrap_err()
}

#[test]
fn unknown_enum_values_name_the_field() {
    let bad = FULL_IMPORT.replace("protocol: SCTP", "protocol: QUIC");
    let err = decode_err::<v1beta1::ServiceImport>(&bad);
    assert_eq!(err.path(), "spec.ports[2].protocol");
    assert!(err.to_string().contains("QUIC"), "{err}");

    let bad = FULL_IMPORT.replace("type: ClusterSetIP", "type: ClusterIP");
    assert_eq!(
        decode_err::<v1beta1::ServiceImport>(&bad).path(),
        "spec.type"
    );

    let bad = FULL_IMPORT.replace("sessionAffinity: ClientIP", "sessionAffinity: Sticky");
    assert_eq!(
        decode_err::<v1beta1::ServiceImport>(&bad).path(),
        "spec.sessionAffinity"
    );

    let bad = FULL_IMPORT.replace("ipFamilies: [IPv4, IPv6]", "ipFamilies: [IPv4, IPv7]");
    assert_eq!(
        decode_err::<v1beta1::ServiceImport>(&bad).path(),
        "spec.ipFamilies[1]"
    );

    let bad = FULL_IMPORT.replace(
        "endpointSliceObjects: Present",
        "endpointSliceObjects: Maybe",
    );
    assert_eq!(
        decode_err::<v1beta1::ServiceImport>(&bad).path(),
        "status.endpointSliceObjects"
    );
}

#[test]
fn malformed_documents_are_typed_errors() {
    let err = decode_err::<v1beta1::ServiceImport>("spec: [unclosed");
    assert!(matches!(err, DecodeError::Yaml { .. }), "{err:?}");
    let err =
        decode_err::<v1beta1::ServiceImport>(&FULL_IMPORT.replace("port: 9443", "port: nine"));
    assert_eq!(err.path(), "spec.ports[0].port");
    let err = decode_err::<v1beta1::ServiceImport>(
        "apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceImport\nmetadata: {name: x}\n",
    );
    assert!(err.to_string().contains("spec"), "{err}");
    let err = decode_err::<v1beta1::ServiceImport>(
        &FULL_IMPORT.replace("kind: ServiceImport", "kind: ServiceExport"),
    );
    assert!(
        err.to_string().contains("kind is \"ServiceExport\""),
        "{err}"
    );
    let err =
        decode_err::<v1beta1::ServiceImport>(FULL_IMPORT.replace("/v1beta1", "/v1alpha1").as_str());
    assert!(err.to_string().contains("apiVersion"), "{err}");
    let err = decode_json::<v1beta1::ClusterProperty>(r#"{"spec": {"value": 7}}"#).unwrap_err();
    assert_eq!(err.path(), "spec.value");
    assert!(matches!(err, DecodeError::Json { .. }));
}

#[test]
fn cluster_property_value_limits() {
    let p = v1beta1::ClusterProperty::new(
        "cluster.clusterset.k8s.io",
        api::ClusterPropertySpec {
            value: String::new(),
        },
    );
    assert!(p.spec.validate().is_err());
    let ok = api::ClusterPropertySpec {
        value: "é".repeat(api::CLUSTER_PROPERTY_VALUE_MAX_CHARS),
    };
    ok.validate().unwrap();
    let long = api::ClusterPropertySpec {
        value: "é".repeat(api::CLUSTER_PROPERTY_VALUE_MAX_CHARS + 1),
    };
    let err = long.validate().unwrap_err();
    assert!(err.to_string().contains("128000"), "{err}");
}
