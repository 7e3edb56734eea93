//! The seed scenario's checkout as a container: `CALLS` calls of `loyalty.Accrual/Accrue` on
//! `loyalty-accrual.loyalty.svc.clusterset.local:9443`, one output line per call.
//!
//! ```text
//! CLUSTER=north checkout mcs 100     # through mcs-client, endpoints from the Kubernetes API
//! checkout plain 100                 # a plain gRPC client: DNS, then the ClusterSetIP
//! ```
//!
//! - `mcs`: the `mcs-client` layer with `mcs_kube::resolver::KubeResolver` over the in-cluster
//!   configuration (the Pod's ServiceAccount needs list and watch on ServiceImports and
//!   EndpointSlices in `loyalty`): it balances each call over the Pods of every cluster
//!   itself, local cluster (`CLUSTER`) first, and dials them directly.
//! - `plain`: what an application without mcs does: the name resolved once by the system's
//!   resolver (the cluster's DNS; it prints `resolved <address>`), and a tonic channel to
//!   the address it gives, the ClusterSetIP, which kube-proxy forwards to a Pod per
//!   connection. Each call opens its own connection, or every call would go to the one Pod
//!   its connection reached.
//!
//! Each answered call prints `answer <cluster> <pod address> <attempts>`, each failed one
//! `failed <error>`; the last line is `calls <answered> answered <failed> failed`. The exit
//! status is 0 only when every call was answered.

use std::process::ExitCode;

use http::uri::PathAndQuery;
use mcs_core::ClusterId;
use mcs_kube::resolver::KubeResolver;
use mcs_seed::checkout::{Checkout, HOST};
use mcs_seed::grpc::{ACCRUE, AccrueReply, AccrueRequest, JsonCodec};
use mcs_seed::pods::Network;

/// The service port.
const PORT: u16 = 9443;

const USAGE: &str = "usage: checkout <mcs|plain> <calls>  (mcs needs CLUSTER, this cluster's name)";

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, calls) = match args.as_slice() {
        [mode, calls] if mode == "mcs" || mode == "plain" => match calls.parse::<usize>() {
            Ok(calls) => (mode.as_str(), calls),
            Err(e) => {
                eprintln!("checkout: calls {calls:?}: {e}\n{USAGE}");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!("{USAGE}");
            return ExitCode::from(2);
        }
    };
    let mut failed = 0;
    if mode == "mcs" {
        let cluster = match std::env::var("CLUSTER").map(ClusterId::new) {
            Ok(Ok(cluster)) => cluster,
            Ok(Err(e)) => {
                eprintln!("checkout: CLUSTER: {e}");
                return ExitCode::from(2);
            }
            Err(_) => {
                eprintln!("checkout: set CLUSTER to this cluster's name\n{USAGE}");
                return ExitCode::from(2);
            }
        };
        let client = match kube::Client::try_default().await {
            Ok(client) => client,
            Err(e) => {
                eprintln!("checkout: the in-cluster Kubernetes configuration: {e}");
                return ExitCode::FAILURE;
            }
        };
        // No route of the seed's loopback network: every Pod address is dialled as it is.
        let checkout = Checkout::new(&cluster, KubeResolver::new(client), &Network::default());
        for order in 0..calls {
            match checkout.accrue(PORT, order).await {
                Ok(call) => println!("answer {} {} {}", call.cluster, call.pod, call.attempts),
                Err(e) => {
                    failed += 1;
                    println!("failed {e}");
                }
            }
        }
    } else {
        let addr = match tokio::net::lookup_host((HOST, PORT)).await {
            Ok(mut addrs) => match addrs.next() {
                Some(addr) => addr,
                None => {
                    eprintln!("checkout: {HOST} has no address");
                    return ExitCode::FAILURE;
                }
            },
            Err(e) => {
                eprintln!("checkout: resolving {HOST}: {e}");
                return ExitCode::FAILURE;
            }
        };
        println!("resolved {addr}");
        for order in 0..calls {
            match plain_call(addr, order).await {
                Ok(reply) => println!("answer {} {} 1", reply.cluster, reply.pod),
                Err(e) => {
                    failed += 1;
                    println!("failed {e}");
                }
            }
        }
    }
    println!("calls {} answered {failed} failed", calls - failed);
    if failed == 0 {
        ExitCode::SUCCESS
    } else {
        ExitCode::FAILURE
    }
}

/// One call on a connection of its own to `addr`.
async fn plain_call(addr: std::net::SocketAddr, order: usize) -> Result<AccrueReply, String> {
    let channel = tonic::transport::Endpoint::from_shared(format!("http://{addr}"))
        .map_err(|e| e.to_string())?
        .connect()
        .await
        .map_err(|e| format!("connect: {}", chain(&e)))?;
    let mut grpc = tonic::client::Grpc::new(channel);
    grpc.ready().await.map_err(|e| chain(&e))?;
    let request = AccrueRequest {
        order: format!("o-{order}"),
        points: 1,
    };
    let reply = grpc
        .unary(
            tonic::Request::new(request),
            PathAndQuery::from_static(ACCRUE),
            JsonCodec::<AccrueRequest, AccrueReply>::default(),
        )
        .await
        .map_err(|status| format!("{}: {}", status.code(), status.message()))?;
    Ok(reply.into_inner())
}

/// An error and its sources, `: `-separated.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}
