//! The seed scenario's checkout as a container: calls of `loyalty.Accrual/Accrue` on
//! `loyalty-accrual.loyalty.svc.clusterset.local:9443`, one output line per call.
//!
//! ```text
//! CLUSTER=north checkout mcs 100     # through mcs-client, endpoints from the Kubernetes API
//! checkout plain 100                 # a plain gRPC client: DNS, then the ClusterSetIP
//! CLUSTER=north checkout mcs --until /signal/stop   # a call every 20 ms until the file exists
//! ```
//!
//! The second argument is how many calls to make one after the other, or `--until FILE`:
//! call every 20 ms until FILE exists (a folder shared with whoever drives the run, say a
//! `hostPath` volume), for runs during which the service changes.
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

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use http::uri::PathAndQuery;
use mcs_core::ClusterId;
use mcs_kube::resolver::KubeResolver;
use mcs_seed::checkout::{Checkout, HOST, chain};
use mcs_seed::grpc::{ACCRUE, AccrueReply, AccrueRequest, JsonCodec};
use mcs_seed::pods::Network;

/// The service port.
const PORT: u16 = 9443;

const USAGE: &str =
    "usage: checkout <mcs|plain> <calls | --until FILE>  (mcs needs CLUSTER, this cluster's name)";

/// Between two calls of an `--until` run.
const INTERVAL: Duration = Duration::from_millis(20);

/// How many calls a run makes.
enum Calls {
    /// This many.
    Count(usize),
    /// Until this file exists.
    Until(PathBuf),
}

impl Calls {
    /// Whether call number `order` (from 0) is to be made; paces an `--until` run.
    async fn go_on(&self, order: usize) -> bool {
        match self {
            Calls::Count(n) => order < *n,
            Calls::Until(file) => {
                if order > 0 {
                    tokio::time::sleep(INTERVAL).await;
                }
                !file.exists()
            }
        }
    }
}

#[tokio::main]
async fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let (mode, calls) = match args.as_slice() {
        [mode, flag, file] if (mode == "mcs" || mode == "plain") && flag == "--until" => {
            (mode.as_str(), Calls::Until(PathBuf::from(file)))
        }
        [mode, calls] if mode == "mcs" || mode == "plain" => match calls.parse::<usize>() {
            Ok(calls) => (mode.as_str(), Calls::Count(calls)),
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
    let (mut made, mut failed) = (0, 0);
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
        while calls.go_on(made).await {
            made += 1;
            match checkout.accrue(PORT, made).await {
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
        while calls.go_on(made).await {
            made += 1;
            match plain_call(addr, made).await {
                Ok(reply) => println!("answer {} {} 1", reply.cluster, reply.pod),
                Err(e) => {
                    failed += 1;
                    println!("failed {e}");
                }
            }
        }
    }
    println!("calls {} answered {failed} failed", made - failed);
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
