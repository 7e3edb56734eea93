//! The Kubernetes adapter of mcs: CRDs, the per-cluster agent, the `clusterset.local` DNS
//! server and the Kubernetes-backed resolver.
//!
//! - [`dns`]: the `clusterset.local` DNS server (`mcs-dns`), answering from the local
//!   cluster's ServiceImports and MCS EndpointSlices;
//! - [`resolver`]: the Kubernetes-backed resolver for `mcs-client`;
//! - the `mcs-crds` binary prints the CRDs generated from [`mcs_core::api`].

pub mod admin;
pub mod agent;
pub mod dns;
pub mod hub;
pub mod resolver;
