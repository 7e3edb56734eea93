//! The mcs binaries, kept out of the libraries so that `mcs-kube` depends on neither `clap`
//! nor `tracing-subscriber` and never installs a global subscriber:
//!
//! - `mcs-agent`: the MCS agent of one member cluster ([`mcs_kube::agent`]);
//! - `mcs-dns`: the `clusterset.local` DNS server ([`mcs_kube::dns`]);
//! - `mcs-crds`: prints the CRDs generated from [`mcs_core::api`].
//!
//! This library holds what the binaries share: [`main`], their `main` body.

use std::future::Future;
use std::process::ExitCode;

/// The body of the binaries' `main`: sets up logging (`RUST_LOG`, default `info`) as the
/// process's global subscriber, runs `run`, logs its error and turns the outcome into an
/// exit code.
pub async fn main<E: std::fmt::Display>(run: impl Future<Output = Result<(), E>>) -> ExitCode {
    tracing_subscriber::fmt()
        .with_env_filter(
            tracing_subscriber::EnvFilter::try_from_default_env()
                .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info")),
        )
        .init();
    match run.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}
