//! mcs-core's types and merge, and mcs-kube's resolver, on the Kubernetes version this
//! crate picked.

include!("../../common/uses_mcs.rs");

#[test]
fn picked_version_is_in_effect() {
    assert_eq!(mcs_downstream_k8s_1_33::K8S_VERSION, "1.33");
}
