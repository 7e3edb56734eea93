//! The pure core of Kubernetes Multi-Cluster Services: types, rules and algorithms, no I/O.
//!
//! `mcs-core` holds everything about MCS (KEP-1645, `multicluster.x-k8s.io`) that can be
//! decided without a network, a clock or a runtime:
//!
//! - [`api`]: the `ServiceExport`, `ServiceImport` and `ClusterProperty` wire types for
//!   both served versions, usable as kube resources, and the CRDs generated from them;
//! - [`conditions`]: condition types and reasons with their exact Kubernetes spellings;
//! - [`cluster`]: the validated [`ClusterId`];
//! - [`name`]: the `clusterset.local` name grammar;
//! - [`merge`]: turning every cluster's export of a service into one ServiceImport;
//! - [`discovery`] and [`endpoints`]: endpoint update streams and in-process selection;
//! - [`slices`] and [`dns`]: reading MCS EndpointSlices and building `clusterset.local` DNS answers;
//! - [`cidr`]: pod and service ranges, and the overlaps that break routing between members;
//! - [`metrics`]: how the other crates describe the metrics they record.
//!
//! Time and randomness are always passed in, so every algorithm is deterministic.
//!
//! # Start here
//!
//! ```
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
//! ```

pub mod api;
pub mod cidr;
pub mod cluster;
pub mod conditions;
pub mod discovery;
pub mod dns;
pub mod endpoints;
pub mod merge;
pub mod metrics;
pub mod name;
pub mod slices;

pub use cluster::ClusterId;
