//! The Kubernetes labels the agent reads and writes, named once for the agent and the hub
//! records (`hub::record`), which both depend on them and not on each other.

/// `endpointslice.kubernetes.io/managed-by` of the slices the agent writes.
pub const MANAGED_BY: &str = "mcs-agent";
/// The label Kubernetes uses to tie an EndpointSlice to its Service.
pub const LABEL_K8S_SERVICE_NAME: &str = "kubernetes.io/service-name";
/// The EndpointSlice managed-by label.
pub const LABEL_SLICE_MANAGED_BY: &str = "endpointslice.kubernetes.io/managed-by";
/// The label the agent puts on every object it creates (and on nothing else).
pub const LABEL_MANAGED_BY: &str = "app.kubernetes.io/managed-by";
