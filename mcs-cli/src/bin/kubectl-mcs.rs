//! `kubectl-mcs`: the operator's view of a ClusterSet, as a kubectl plugin (`kubectl mcs
//! ...` once the binary is on `PATH`) or alone.
//!
//! ```text
//! kubectl mcs status [NAMESPACE/NAME] [--context east --context west] [-o table|json|yaml]
//! kubectl mcs check [--dns east=10.0.0.10] [-o table|json|yaml]
//! ```
//!
//! Members are the `--context`s given, or the current context and every other context of
//! the kubeconfig whose ClusterProperty `clusterset.k8s.io` names the same ClusterSet.
//! The kubeconfig is `--kubeconfig`, else `KUBECONFIG` (several files merged) or
//! `~/.kube/config`, as kubectl reads it.
//!
//! Exit status: 0 when nothing is wrong, 1 when `check` finds a problem (or `status` a
//! member it cannot read), 2 when it cannot run (a bad flag, kubeconfig or context).

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Parser, Subcommand, ValueEnum};
use k8s_openapi::jiff::Timestamp;
use mcs_cli::gather::{self, CheckOptions};
use mcs_cli::{check, status};
use mcs_core::cidr;
use serde::Serialize;

/// Multi-cluster services: where each service went, and whether the ClusterSet is sound.
#[derive(Debug, Parser)]
#[command(name = "kubectl mcs", bin_name = "kubectl mcs", version)]
struct Args {
    /// The kubeconfig (default: KUBECONFIG, several files merged, or ~/.kube/config).
    #[arg(long, global = true)]
    kubeconfig: Option<PathBuf>,
    /// A member's context; repeat for every member (default: discovered through the
    /// ClusterProperty clusterset.k8s.io of the current context).
    #[arg(long = "context", global = true)]
    contexts: Vec<String>,
    /// Output format.
    #[arg(short, long, value_enum, default_value_t = Output::Table, global = true)]
    output: Output,
    #[command(subcommand)]
    command: Command,
}

#[derive(Clone, Copy, Debug, ValueEnum)]
enum Output {
    Table,
    Json,
    Yaml,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Per service: who exports it, the exports' conditions, each member's import and the
    /// endpoints each member has of each source cluster.
    Status {
        /// Only this service.
        #[arg(value_name = "NAMESPACE/NAME")]
        service: Option<String>,
    },
    /// Pre-flight: agents, CRDs, cluster ids, RBAC, CIDRs and DNS of every member. Exits
    /// with 1 when a problem is found.
    Check {
        /// Ask this DNS server for clusterset.local in a member, as CONTEXT=ADDRESS or
        /// CONTEXT=ADDRESS:PORT (port 53 by default; repeat for several members; default:
        /// look for the zone in the member's CoreDNS configuration).
        #[arg(long = "dns", value_parser = gather::parse_dns)]
        dns: Vec<(String, std::net::SocketAddr)>,
        /// The agent's namespace (its heartbeat Lease and ServiceAccount).
        #[arg(long, default_value = "mcs-system")]
        agent_namespace: String,
        /// The agent's ServiceAccount, whose permissions are checked.
        #[arg(long, default_value = "mcs-agent")]
        agent_service_account: String,
    },
}

fn main() -> ExitCode {
    let args = Args::parse();
    let runtime = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("error: cannot start: {e}");
            return ExitCode::from(2);
        }
    };
    match runtime.block_on(run(args)) {
        Ok(code) => code,
        Err(e) => {
            eprintln!("error: {e}");
            ExitCode::from(2)
        }
    }
}

async fn run(args: Args) -> Result<ExitCode, String> {
    let members = gather::members(args.kubeconfig.as_deref(), &args.contexts)
        .await
        .map_err(|e| e.to_string())?;
    let width = std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.parse().ok())
        .filter(|w: &usize| *w >= 40)
        .unwrap_or(100);
    let now = Timestamp::now();
    match args.command {
        Command::Status { service } => {
            let only = match &service {
                Some(s) => Some(
                    s.split_once('/')
                        .ok_or_else(|| format!("{s}: expected NAMESPACE/NAME"))?,
                ),
                None => None,
            };
            let snapshots =
                futures::future::join_all(members.iter().map(|m| gather::snapshot(m, only))).await;
            let ranges: Vec<(String, &cidr::ClusterRanges)> = snapshots
                .iter()
                .filter(|s| s.error.is_none())
                .map(|s| (s.context.clone(), &s.ranges))
                .collect();
            let overlaps = cidr::overlaps(ranges.iter().map(|(c, r)| (c, *r)));
            let report = status::build(&snapshots, only, &overlaps, now);
            print(&report, args.output, || report.render_table(width))?;
            let unreadable = report.clusters.iter().any(|c| c.error.is_some());
            Ok(if unreadable {
                ExitCode::from(1)
            } else {
                ExitCode::SUCCESS
            })
        }
        Command::Check {
            dns,
            agent_namespace,
            agent_service_account,
        } => {
            let options = CheckOptions {
                agent_namespace,
                agent_service_account,
                dns: dns.into_iter().collect::<BTreeMap<_, _>>(),
            };
            let facts =
                futures::future::join_all(members.iter().map(|m| gather::facts(m, &options))).await;
            let report = check::judge(&facts, now);
            print(&report, args.output, || report.render_table(width))?;
            Ok(if report.passed {
                ExitCode::SUCCESS
            } else {
                ExitCode::from(1)
            })
        }
    }
}

fn print<T: Serialize>(
    report: &T,
    output: Output,
    table: impl FnOnce() -> String,
) -> Result<(), String> {
    let text = match output {
        Output::Table => table(),
        Output::Json => {
            let mut json = serde_json::to_string_pretty(report).map_err(|e| e.to_string())?;
            json.push('\n');
            json
        }
        Output::Yaml => serde_saphyr::to_string(report).map_err(|e| e.to_string())?,
    };
    print!("{text}");
    Ok(())
}
