//! A downstream library on mcs-core and mcs-kube, built with k8s-openapi's `latest`.

/// The Kubernetes version k8s-openapi was built for, as this build selected it.
pub const K8S_VERSION: &str = k8s_openapi::k8s_if_ge_1_37! { "1.37 or later" };
