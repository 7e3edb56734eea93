//! The Kubernetes adapter of mcs: CRDs, the per-cluster agent, the `clusterset.local` DNS
//! server and the Kubernetes-backed resolver.
//!
//! This crate is being built. Today it ships the `mcs-crds` binary, which prints the CRDs
//! generated from [`mcs_core::api`].
