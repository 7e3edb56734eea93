//! The seed scenario end to end: `loyalty-accrual` exported from `east` and `west`, imported
//! as one `ClusterSetIP` service, called over gRPC by a checkout in `north`.
//!
//! ```text
//! cargo run --release --example loyalty_accrual             # in memory, a few seconds
//! cargo run --release --example loyalty_accrual -- --real   # three real API servers, ~10 s
//! ```
//!
//! By default everything runs in this process: the agents' own planner
//! (`mcs_kube::agent::plan`) over in-memory clusters writes the ServiceImports, export
//! conditions and MCS EndpointSlices; north's `clusterset.local` DNS server (`mcs-dns`'s)
//! answers from them on loopback; pods are tonic servers on loopback addresses; checkouts
//! call `loyalty.Accrual/Accrue` through the `mcs-client` layer, resolving through the
//! Kubernetes resolver's code path. With `--real` the same steps run on three real API
//! servers with `mcs-agent` and `mcs-dns` processes (`scripts/k8s-bins.sh` builds the
//! Kubernetes binaries, `cargo build -p mcs-cli --release` the others).
//!
//! The steps, their checks and the machinery are in the `mcs-seed` crate (`seed/`), which
//! `tests/loyalty_accrual.rs` runs too. It prints every check and exits non-zero if any
//! fails. `--inject-fault=port-routed-to-every-cluster` breaks the port routes on purpose
//! (in memory), to see the checks catch it.

use std::process::ExitCode;

use mcs_seed::Report;
use mcs_seed::loyalty::{self, Fault, Options};

/// Runs what the command line asks for.
pub(crate) async fn run(args: &[String]) -> Result<Report, String> {
    let mut real = false;
    let mut options = Options::default();
    for arg in args {
        match arg.as_str() {
            "--real" => real = true,
            "--inject-fault=port-routed-to-every-cluster" => {
                options = options.fault(Fault::PortRoutedToEveryCluster);
            }
            other => {
                return Err(format!(
                    "unknown argument {other:?}; usage: loyalty_accrual [--real]"
                ));
            }
        }
    }
    Ok(if real {
        loyalty::run_real().await
    } else {
        loyalty::run_in_memory(&options).await
    })
}

#[allow(dead_code)]
#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    match run(&args).await {
        Ok(report) => {
            report.print_summary();
            report.exit_code()
        }
        Err(usage) => {
            eprintln!("{usage}");
            ExitCode::from(2)
        }
    }
}
