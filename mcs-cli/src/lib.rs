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
/// process's global subscriber (colours only when stderr is a terminal), runs `run`, logs
/// its error and turns the outcome into an exit code.
///
/// hickory-server logs two INFO lines for every DNS query it answers (in `mcs-dns`, tens of
/// thousands a second under load): its level is WARN unless `RUST_LOG` names a `hickory`
/// target itself (for example `RUST_LOG=info,hickory_server=info` to see every query).
pub async fn main<E: std::fmt::Display>(run: impl Future<Output = Result<(), E>>) -> ExitCode {
    let spec = std::env::var("RUST_LOG").unwrap_or_default();
    tracing_subscriber::fmt()
        .with_env_filter(log_filter(&spec))
        // Colours only on a terminal: a Pod's log (a pipe or a file) gets plain text.
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stderr()))
        .init();
    match run.await {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e}");
            ExitCode::FAILURE
        }
    }
}

/// The log filter for `RUST_LOG=spec` (empty: `info`), with hickory at WARN unless `spec`
/// says otherwise. A malformed `spec` falls back to the default, as `EnvFilter` does.
fn log_filter(spec: &str) -> tracing_subscriber::EnvFilter {
    let spec = if spec.trim().is_empty() { "info" } else { spec };
    let filter = tracing_subscriber::EnvFilter::try_new(spec)
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("info"));
    if spec.contains("hickory") {
        filter
    } else {
        filter.add_directive("hickory_server=warn".parse().expect("a valid directive"))
    }
}

#[cfg(test)]
mod log_filter_tests {
    use super::log_filter;

    #[test]
    fn hickory_is_quiet_unless_rust_log_names_it() {
        for spec in ["", "info", "debug", "mcs_kube=debug,warn", "not a filter ["] {
            let filter = log_filter(spec).to_string();
            assert!(filter.contains("hickory_server=warn"), "{spec:?}: {filter}");
        }
        let filter = log_filter("info,hickory_server=info").to_string();
        assert!(!filter.contains("hickory_server=warn"), "{filter}");
        assert!(filter.contains("hickory_server=info"), "{filter}");
    }
}
