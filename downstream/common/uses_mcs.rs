// The checks both downstream crates run (included by their tests/uses_mcs.rs): typed
// objects decoded through mcs-core, the CRDs generated on this k8s-openapi version, and
// mcs-kube's resolver reading k8s-openapi EndpointSlices.

use mcs_core::api::{LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, decode_yaml, v1beta1::ServiceImport};
use mcs_core::discovery::{Target, Update};
use mcs_core::name::ServiceRef;

const IMPORT: &str = "
apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: { name: loyalty-accrual, namespace: loyalty }
spec: { type: ClusterSetIP, ips: [10.96.0.9], ports: [{ name: grpc, protocol: TCP, port: 9443 }] }
";

const SLICE: &str = r#"{
  "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
  "metadata": { "name": "imported-east", "namespace": "loyalty", "labels": {
    "multicluster.kubernetes.io/service-name": "loyalty-accrual",
    "multicluster.kubernetes.io/source-cluster": "east" } },
  "addressType": "IPv4",
  "ports": [{ "name": "grpc", "protocol": "TCP", "port": 9443 }],
  "endpoints": [{ "addresses": ["10.1.0.7"], "conditions": { "ready": true } }]
}"#;

#[test]
fn crds_are_generated() {
    let crds = mcs_core::api::crd::all();
    let names: Vec<_> = crds.iter().filter_map(|c| c.metadata.name.as_deref()).collect();
    assert_eq!(
        names,
        [
            "serviceexports.multicluster.x-k8s.io",
            "serviceimports.multicluster.x-k8s.io",
            "clusterproperties.about.k8s.io",
        ]
    );
    assert!(mcs_core::api::crd::to_yaml(&crds).contains("kind: CustomResourceDefinition"));
}

#[test]
fn resolver_reads_imported_slices() {
    let import: ServiceImport = decode_yaml(IMPORT).expect("a valid ServiceImport");
    let slice: k8s_openapi::api::discovery::v1::EndpointSlice =
        serde_json::from_str(SLICE).expect("a valid EndpointSlice");
    let labels = slice.metadata.labels.as_ref().expect("labels");
    assert_eq!(labels[LABEL_SERVICE_NAME], "loyalty-accrual");
    assert_eq!(labels[LABEL_SOURCE_CLUSTER], "east");

    let target = Target { service: ServiceRef::new("loyalty", "loyalty-accrual").unwrap(), port: 9443 };
    let Update::Reset(endpoints) = mcs_kube::resolver::endpoints(&target, Some(&import), [&slice])
    else {
        panic!("expected the complete endpoint set");
    };
    assert_eq!(endpoints.len(), 1);
    assert_eq!(endpoints[0].addr, "10.1.0.7:9443".parse().unwrap());
    assert_eq!(endpoints[0].cluster.as_str(), "east");
    assert!(endpoints[0].ready);
}
