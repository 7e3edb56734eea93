//! Pods on loopback: a tonic server per container port, and the network that routes a pod
//! address to it.
//!
//! A pod has an address in its cluster's pod CIDR (`10.10.0.1` in `east`), which is what the
//! EndpointSlices, the imports and the client's discovery carry. Its containers listen on
//! `127.<b>.<c>.<d>` (Linux routes all of `127.0.0.0/8` to the loopback interface) on a port
//! the kernel picks, so that runs never collide on a port. [`Network`] maps the pod address
//! and port to that listener, as a cluster network routes to a pod; the checkouts dial
//! through it ([`Routed`]).

use std::collections::HashMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::{Arc, RwLock};

use mcs_client::connect::{Dial, EndpointTarget, MakeConnector, Tcp};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinHandle;

use crate::grpc::Accrual;

/// Pod address and port → the listener standing in for that container port.
#[derive(Clone, Debug, Default)]
pub struct Network(Arc<RwLock<HashMap<SocketAddr, SocketAddr>>>);

impl Network {
    /// Where a connection to `pod` goes (itself when no pod has that address).
    pub fn route(&self, pod: SocketAddr) -> SocketAddr {
        let routes = self.0.read().unwrap_or_else(|e| e.into_inner());
        routes.get(&pod).copied().unwrap_or(pod)
    }

    fn add(&self, pod: SocketAddr, listener: SocketAddr) {
        let mut routes = self.0.write().unwrap_or_else(|e| e.into_inner());
        routes.insert(pod, listener);
    }
}

/// Plain TCP connectors (h2c) that dial a pod's address through the [`Network`].
#[derive(Clone, Debug)]
pub struct Routed {
    network: Network,
    tcp: Tcp,
}

impl Routed {
    /// Connectors over `network`.
    pub fn new(network: Network) -> Self {
        Self {
            network,
            tcp: Tcp::new(),
        }
    }
}

impl MakeConnector for Routed {
    type Connector = Dial;

    fn endpoint(&self, target: &EndpointTarget) -> Dial {
        self.tcp.dial(self.network.route(target.addr()))
    }

    fn passthrough(&self) -> Dial {
        self.tcp.resolve()
    }
}

/// A running pod: one `loyalty.Accrual` gRPC server per container port.
#[derive(Debug)]
pub struct Pod {
    /// Its name.
    pub name: String,
    /// Its cluster.
    pub cluster: String,
    /// Its address in the cluster.
    pub ip: Ipv4Addr,
    /// `(container port, listener)`.
    pub listeners: Vec<(u16, SocketAddr)>,
    stop: watch::Sender<bool>,
    servers: Vec<JoinHandle<()>>,
}

impl Pod {
    /// Starts a pod with address `ip` (`10.<b>.<c>.<d>`), listening on `127.<b>.<c>.<d>` for
    /// each of `ports`, and routes its addresses there.
    pub async fn start(
        network: &Network,
        cluster: &str,
        name: &str,
        ip: Ipv4Addr,
        ports: &[u16],
    ) -> Result<Self, String> {
        let [_, b, c, d] = ip.octets();
        let loopback = Ipv4Addr::new(127, b, c, d);
        let (stop, stopped) = watch::channel(false);
        let mut listeners = Vec::new();
        let mut servers = Vec::new();
        for port in ports {
            let listener = TcpListener::bind((loopback, 0)).await.map_err(|e| {
                format!("pod {name}: binding {loopback}: {e} (Linux routes all of 127/8 to lo)")
            })?;
            let local = listener.local_addr().map_err(|e| e.to_string())?;
            let pod = SocketAddr::new(IpAddr::V4(ip), *port);
            network.add(pod, local);
            listeners.push((*port, local));
            let service = Accrual {
                cluster: cluster.to_owned(),
                pod,
            };
            let mut stopped = stopped.clone();
            servers.push(tokio::spawn(async move {
                let _ = tonic::transport::Server::builder()
                    .add_service(service)
                    .serve_with_incoming_shutdown(
                        tonic::transport::server::TcpIncoming::from(listener),
                        async move {
                            let _ = stopped.wait_for(|s| *s).await;
                        },
                    )
                    .await;
            }));
        }
        Ok(Self {
            name: name.to_owned(),
            cluster: cluster.to_owned(),
            ip,
            listeners,
            stop,
            servers,
        })
    }

    /// Stops like a pod on SIGTERM: no new connections, calls in flight finish, connections
    /// close. Returns when every server has stopped.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        for server in self.servers {
            let _ = server.await;
        }
    }
}
