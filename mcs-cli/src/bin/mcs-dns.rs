//! `mcs-dns`: the `clusterset.local` DNS server.
//!
//! Answers the ClusterSet zone from the local cluster's ServiceImports and MCS
//! EndpointSlices. CoreDNS forwards the zone to it (see `deploy/dns/`).

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::Parser;
use mcs_core::name::Zone;
use mcs_kube::admin;
use mcs_kube::dns::{DnsConfig, DnsServer};

/// The clusterset.local DNS server of mcs.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The ClusterSet zone.
    #[arg(long, env = "MCS_DNS_ZONE", default_value = "clusterset.local")]
    zone: String,
    /// TTL of every record, in seconds.
    #[arg(long, env = "MCS_DNS_TTL", default_value_t = 5)]
    ttl: u32,
    /// The largest UDP response in bytes (at least 512); larger answers are truncated with
    /// the TC bit so clients retry over TCP.
    #[arg(long, env = "MCS_DNS_MAX_UDP_PAYLOAD", default_value_t = mcs_kube::dns::DEFAULT_MAX_UDP_PAYLOAD)]
    max_udp_payload: u16,
    /// The zone's name server, named by its SOA and NS records: a host name outside the
    /// zone (the default is the cluster's CoreDNS, which forwards the zone here).
    #[arg(long, env = "MCS_DNS_NAMESERVER", default_value = mcs_core::dns::DEFAULT_NAMESERVER)]
    nameserver: String,
    /// Address for DNS over UDP and TCP.
    #[arg(long, env = "MCS_DNS_LISTEN", default_value = "0.0.0.0:5353")]
    listen: SocketAddr,
    /// UDP sockets sharing the listen address (SO_REUSEPORT), each with its own receive
    /// loop (default: one per CPU, at most 8).
    #[arg(long, env = "MCS_DNS_UDP_SOCKETS")]
    udp_sockets: Option<usize>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "MCS_ADMIN_LISTEN", default_value = "0.0.0.0:9090")]
    admin_listen: SocketAddr,
    /// Kubeconfig of the local cluster (default: in-cluster or the usual kubeconfig).
    #[arg(long, env = "KUBECONFIG")]
    kubeconfig: Option<PathBuf>,
    /// Kubeconfig context.
    #[arg(long)]
    context: Option<String>,
}

#[tokio::main]
async fn main() -> ExitCode {
    mcs_cli::main(run(Args::parse())).await
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let zone = Zone::new(&args.zone)?;
    // Before the server is bound: its counters register with the recorder then.
    let metrics = mcs_cli::install_metrics(mcs_cli::DEFAULT_GAUGE_IDLE)?;
    let client = admin::kube_client(args.kubeconfig.as_deref(), args.context.as_deref()).await?;
    let mut config = DnsConfig::default()
        .zone(zone)
        .ttl(args.ttl)
        .max_udp_payload(args.max_udp_payload)
        .nameserver(args.nameserver)
        .listen(args.listen);
    if let Some(sockets) = args.udp_sockets {
        config = config.udp_sockets(sockets);
    }
    let server = DnsServer::bind(config).await?;
    let admin_listener = admin::bind(args.admin_listen).await?;
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let stopped = |mut rx: tokio::sync::watch::Receiver<bool>| async move {
        let _ = rx.wait_for(|v| *v).await;
    };
    let admin = tokio::spawn(admin::serve(
        admin_listener,
        move || metrics.render(),
        server.synced(),
        stopped(stop_rx.clone()),
    ));
    let result = server
        .run(client, async {
            admin::shutdown_signal().await;
        })
        .await;
    let _ = stop_tx.send(true);
    let _ = admin.await;
    Ok(result?)
}
