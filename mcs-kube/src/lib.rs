//! The Kubernetes adapter of mcs: CRDs, the per-cluster agent, the `clusterset.local` DNS
//! server and the Kubernetes-backed resolver.
//!
//! - [`agent`]: the MCS agent of one member cluster (`mcs-agent`);
//! - [`dns`]: the `clusterset.local` DNS server (`mcs-dns`), answering from the local
//!   cluster's ServiceImports and MCS EndpointSlices;
//! - [`resolver`]: the Kubernetes-backed resolver for `mcs-client`;
//! - [`admin`]: the admin HTTP endpoint (`/metrics`, `/healthz`, `/readyz`) of the binaries;
//! - [`metrics`]: every metric the agent and the DNS server record.
//!
//! The binaries (`mcs-agent`, `mcs-dns`, `mcs-crds`) are in the `mcs-cli` crate; this
//! library neither parses command lines nor installs a global `tracing` subscriber.
//!
//! Like every library on k8s-openapi, `mcs-kube` enables no Kubernetes version feature:
//! the application names one (`k8s-openapi = { version = "0.29", features = ["v1_35"] }`,
//! or `latest`; 1.33 to 1.37 work).

pub mod admin;
pub mod agent;
pub mod dns;
pub mod hub;
pub mod labels;
pub mod metrics;
pub mod resolver;

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
