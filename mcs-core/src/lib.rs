//! The pure core of Kubernetes Multi-Cluster Services: types, rules and algorithms, no I/O.
//!
//! `mcs-core` holds everything about MCS (KEP-1645, `multicluster.x-k8s.io`) that can be
//! decided without a network, a clock or a runtime. With the default `api` feature:
//!
//! - [`api`]: the `ServiceExport`, `ServiceImport` and `ClusterProperty` wire types for
//!   both served versions, usable as kube resources, and the CRDs generated from them;
//! - [`conditions`]: condition types and reasons with their exact Kubernetes spellings;
//! - [`merge`]: turning every cluster's export of a service into one ServiceImport;
//! - [`slices`] and [`dns`]: reading MCS EndpointSlices and building `clusterset.local` DNS answers.
//!
//! Always (these need no Kubernetes API types, so `mcs-client` uses the crate with
//! `default-features = false` and compiles neither k8s-openapi nor kube-core):
//!
//! - [`cluster`]: the validated [`ClusterId`];
//! - [`name`]: the `clusterset.local` name grammar;
//! - [`discovery`] and [`endpoints`]: endpoint update streams and in-process selection;
//! - [`cidr`]: pod and service ranges, and the overlaps that break routing between members;
//! - [`metrics`]: how the other crates describe the metrics they record.
//!
//! With the unstable `unstable-cluster-selection` feature, `selection`: cluster selection
//! (KEP-5939), the ordered `clusterSelectors` of an export evaluated per importing cluster.
//!
//! Time and randomness are always passed in, so every algorithm is deterministic.
//!
//! # Kubernetes versions
//!
//! The API types come from [k8s-openapi], which needs exactly one Kubernetes version
//! feature in a whole build. Like every library built on it, `mcs-core` enables none: the
//! application does, in its own `Cargo.toml`
//! (`k8s-openapi = { version = "0.29", features = ["v1_35"] }`, or `latest`). The
//! downstream checks build it with `v1_33` and with `latest`.
//!
//! [k8s-openapi]: https://docs.rs/k8s-openapi
//!
//! # Start here
//!
//! ```
//! # #[cfg(feature = "api")] {
//! use mcs_core::api::{decode_yaml, v1beta1::ServiceExport};
//! use mcs_core::name::{McsName, Zone};
//!
//! let export: ServiceExport = decode_yaml(
//!     "apiVersion: multicluster.x-k8s.io/v1beta1\nkind: ServiceExport\nmetadata: {name: loyalty-accrual, namespace: loyalty}\n",
//! ).unwrap();
//! assert!(export.spec.exported_labels.is_none());
//!
//! let name = McsName::parse("loyalty-accrual.loyalty.svc.clusterset.local", &Zone::default()).unwrap();
//! assert!(matches!(name, McsName::Service(_)));
//! # }
//! ```

#[macro_use]
mod macros;

#[cfg(feature = "api")]
pub mod api;
pub mod cidr;
pub mod cluster;
#[cfg(feature = "api")]
pub mod conditions;
pub mod discovery;
#[cfg(feature = "api")]
pub mod dns;
pub mod endpoints;
#[cfg(feature = "api")]
pub mod merge;
pub mod metrics;
pub mod name;
#[cfg(feature = "unstable-cluster-selection")]
pub mod selection;
#[cfg(feature = "api")]
pub mod slices;

pub use cluster::ClusterId;

/// The README's examples, compiled as doctests.
#[cfg(all(doctest, feature = "api"))]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
