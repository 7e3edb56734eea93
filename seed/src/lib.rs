//! The seed scenarios of mcs, as a library the `loyalty_accrual` example and the tests share.
//!
//! [`loyalty`] is the scenario the project exists for: `loyalty-accrual` exported from `east`
//! and `west`, imported as one `ClusterSetIP` service, called over gRPC by a checkout in
//! `north` through the `mcs-client` layer. Nothing in it is computed by hand: the imports,
//! the export conditions and the MCS EndpointSlices come from the agent's own planner (in
//! memory, [`loyalty::run_in_memory`]) or from `mcs-agent` processes (on real API servers,
//! `loyalty::run_real` with the feature `real`); the DNS answers from the
//! `clusterset.local` server fed the way `mcs-dns` is, or from `mcs-dns` itself; the
//! checkouts' endpoints through the Kubernetes resolver's code path. A run returns a
//! [`Report`] of checks, each an outcome that fails when the code is wrong.
//!
//! ```no_run
//! # async fn run() {
//! let report = mcs_seed::loyalty::run_in_memory(&mcs_seed::loyalty::Options::default()).await;
//! report.print_summary();
//! assert!(report.passed());
//! # }
//! ```

pub mod checkout;
pub mod dns;
pub mod grpc;
pub mod loyalty;
mod memory;
pub mod pods;
#[cfg(feature = "real")]
mod real;
mod report;

pub use report::{Check, Report};
