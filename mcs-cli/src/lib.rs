//! The mcs binaries, kept out of the libraries so that `mcs-kube` depends on neither `clap`
//! nor `tracing-subscriber` and never installs a global subscriber:
//!
//! - `mcs-agent`: the MCS agent of one member cluster ([`mcs_kube::agent`]);
//! - `mcs-dns`: the `clusterset.local` DNS server ([`mcs_kube::dns`]);
//! - `mcs-crds`: prints the CRDs generated from [`mcs_core::api`];
//! - `kubectl-mcs`: the operator's view, a kubectl plugin (`kubectl mcs status`,
//!   `kubectl mcs check`), built from [`gather`] (reads), [`status`] and [`check`] (pure
//!   judgements, serialisable reports) and [`table`] (plain-text output).
//!
//! This library holds what the binaries share: [`main`], their `main` body, and
//! [`install_metrics`], the Prometheus recorder behind their `/metrics`.

pub mod check;
pub mod gather;
pub mod status;
pub mod table;

use std::future::Future;
use std::process::ExitCode;
use std::time::Duration;

use metrics_exporter_prometheus::{PrometheusBuilder, PrometheusHandle};
use metrics_util::MetricKindMask;

/// How long a gauge that is not set again stays on `/metrics` by default.
pub const DEFAULT_GAUGE_IDLE: Duration = Duration::from_secs(60);

/// Installs the process's global `metrics` recorder, a `metrics-exporter-prometheus`
/// recorder, and returns the handle that renders it (give it to
/// [`mcs_kube::admin::serve`]). Gauges not set for `gauge_idle` are dropped from the
/// output: the libraries set live gauges again more often than that and stop setting those
/// of a member that left (see [`mcs_kube::metrics`]). Counters stay. Registers the help
/// texts of [`mcs_kube::metrics::ALL`] and runs the recorder's upkeep in the background
/// (call from inside the Tokio runtime).
pub fn install_metrics(gauge_idle: Duration) -> Result<PrometheusHandle, String> {
    let recorder = PrometheusBuilder::new()
        .idle_timeout(MetricKindMask::GAUGE, Some(gauge_idle))
        .build_recorder();
    let handle = recorder.handle();
    metrics::set_global_recorder(recorder)
        .map_err(|e| format!("cannot install the metrics recorder: {e}"))?;
    mcs_kube::metrics::describe();
    let upkeep = handle.clone();
    tokio::spawn(async move {
        let mut tick = tokio::time::interval(Duration::from_secs(5));
        loop {
            tick.tick().await;
            upkeep.run_upkeep();
        }
    });
    Ok(handle)
}

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
