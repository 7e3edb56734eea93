//! `loyalty-accrual` as a container: the `loyalty.Accrual/Accrue` gRPC server of the seed
//! scenario on port 9443 (h2c), answering with its cluster and Pod address, the way a Pod of
//! the real service would.
//!
//! ```text
//! CLUSTER=east POD_IP=10.1.0.5 loyalty-accrual
//! ```
//!
//! `CLUSTER` names the cluster it runs in and `POD_IP` its address there (the Downward
//! API's `status.podIP`); both go into every answer, so that a caller can tell which Pod of
//! which cluster served it. On SIGTERM it stops like a Pod should: no new connections, the
//! calls in flight finish.

use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;

use mcs_seed::grpc::Accrual;

/// The container port.
const PORT: u16 = 9443;

#[tokio::main]
async fn main() -> ExitCode {
    let (cluster, ip) = match (std::env::var("CLUSTER"), std::env::var("POD_IP")) {
        (Ok(cluster), Ok(ip)) => match ip.parse::<IpAddr>() {
            Ok(ip) => (cluster, ip),
            Err(e) => {
                eprintln!("loyalty-accrual: POD_IP {ip:?} is not an IP address: {e}");
                return ExitCode::from(2);
            }
        },
        _ => {
            eprintln!(
                "loyalty-accrual: set CLUSTER (this cluster's name) and POD_IP (this Pod's IP)"
            );
            return ExitCode::from(2);
        }
    };
    let service = Accrual {
        cluster: cluster.clone(),
        pod: SocketAddr::new(ip, PORT),
    };
    let listen = SocketAddr::new(IpAddr::V4(Ipv4Addr::UNSPECIFIED), PORT);
    println!("loyalty-accrual: {cluster} {ip}, serving loyalty.Accrual on {listen}");
    let stopped = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut term) => {
                term.recv().await;
            }
            Err(e) => {
                eprintln!("loyalty-accrual: no SIGTERM handler ({e}); stopping on Ctrl-C only");
                let _ = tokio::signal::ctrl_c().await;
            }
        }
        println!("loyalty-accrual: SIGTERM, stopping");
    };
    match tonic::transport::Server::builder()
        .add_service(service)
        .serve_with_shutdown(listen, stopped)
        .await
    {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("loyalty-accrual: serving on {listen}: {e}");
            ExitCode::FAILURE
        }
    }
}
