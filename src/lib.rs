//! One dependency for Kubernetes Multi-Cluster Services in Rust.
//!
//! `mcs` re-exports the three crates of the project:
//!
//! - [`core`] (`mcs-core`): the pure types, merge and conflict rules, endpoint selection and
//!   `clusterset.local` names;
//! - `client` (`mcs-client`, feature `client`): the tower layer that resolves
//!   `clusterset.local` names and balances every request in-process;
//! - `kube` (`mcs-kube`, feature `kube`): the Kubernetes adapter (agent, DNS server,
//!   resolver).

pub use mcs_core as core;

#[cfg(feature = "client")]
pub use mcs_client as client;

#[cfg(feature = "kube")]
pub use mcs_kube as kube;

/// The README's examples, compiled as doctests.
#[cfg(all(doctest, feature = "api"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
