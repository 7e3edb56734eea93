//! The `clusterset.local` DNS server.
//!
//! It answers from the local cluster's Namespaces, ServiceImports and MCS EndpointSlices
//! (those labelled `multicluster.kubernetes.io/service-name`), which it watches with
//! kube-rs, and builds every answer with [`mcs_core::dns::ZoneData`]. It serves UDP and TCP
//! (hickory-server; UDP answers that do not fit carry the TC bit so resolvers retry over
//! TCP), never recurses (names outside the zone are REFUSED), and answers SERVFAIL until
//! all three watches have synced. CoreDNS forwards the zone to it
//! (`deploy/dns/coredns-forward.yaml`).
//!
//! ```no_run
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! use mcs_kube::dns::{DnsServer, DnsConfig};
//!
//! let client = kube::Client::try_default().await?;
//! let server = DnsServer::bind(DnsConfig::default()).await?;
//! println!("serving {} on {}", server.config().zone, server.local_addr());
//! server.run(client, std::future::pending()).await?;
//! # Ok(()) }
//! ```

mod handler;
mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_server::Server;
use mcs_core::dns::{DEFAULT_TTL, ZoneData};
use mcs_core::name::Zone;
use tokio::net::{TcpListener, UdpSocket};

pub use handler::DnsMetrics;
use handler::Handler;

/// DNS server settings.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct DnsConfig {
    /// The zone (default `clusterset.local`).
    pub zone: Zone,
    /// TTL of every record, seconds (default 5).
    pub ttl: u32,
    /// Where to listen, UDP and TCP (default `127.0.0.1:5353`; port 0 picks a free port).
    pub listen: SocketAddr,
    /// How long a TCP connection may stay idle (default 5 s).
    pub tcp_timeout: Duration,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            zone: Zone::default(),
            ttl: DEFAULT_TTL,
            listen: SocketAddr::from(([127, 0, 0, 1], 5353)),
            tcp_timeout: Duration::from_secs(5),
        }
    }
}

impl DnsConfig {
    /// Sets the zone.
    #[must_use]
    pub fn zone(mut self, zone: Zone) -> Self {
        self.zone = zone;
        self
    }

    /// Sets the TTL.
    #[must_use]
    pub fn ttl(mut self, ttl: u32) -> Self {
        self.ttl = ttl;
        self
    }

    /// Sets the listen address.
    #[must_use]
    pub fn listen(mut self, listen: SocketAddr) -> Self {
        self.listen = listen;
        self
    }
}

/// Errors of the DNS server.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DnsError {
    /// The UDP or TCP socket could not be bound.
    #[error("cannot bind the DNS server to {addr}: {source}")]
    Bind {
        /// The address.
        addr: SocketAddr,
        /// The cause.
        #[source]
        source: std::io::Error,
    },
    /// The server stopped with an error.
    #[error("DNS server failed: {0}")]
    Serve(String),
}

/// A bound DNS server, not yet serving.
pub struct DnsServer {
    config: DnsConfig,
    udp: UdpSocket,
    tcp: TcpListener,
    local_addr: SocketAddr,
    data: Arc<RwLock<ZoneData>>,
    synced: Arc<AtomicBool>,
    metrics: DnsMetrics,
}

impl DnsServer {
    /// Binds UDP and TCP on `config.listen` (the same port for both).
    pub async fn bind(config: DnsConfig) -> Result<Self, DnsError> {
        let bind_err = |addr, source| DnsError::Bind { addr, source };
        // With port 0 the UDP socket picks a free port that TCP may already use: try again
        // with another port a few times.
        let attempts = if config.listen.port() == 0 { 20 } else { 1 };
        let mut attempt = 0;
        let (udp, tcp, local_addr) = loop {
            attempt += 1;
            let udp = UdpSocket::bind(config.listen)
                .await
                .map_err(|e| bind_err(config.listen, e))?;
            let local_addr = udp.local_addr().map_err(|e| bind_err(config.listen, e))?;
            match TcpListener::bind(local_addr).await {
                Ok(tcp) => break (udp, tcp, local_addr),
                Err(e) if attempt < attempts && e.kind() == std::io::ErrorKind::AddrInUse => {
                    continue;
                }
                Err(e) => return Err(bind_err(local_addr, e)),
            }
        };
        let data = Arc::new(RwLock::new(ZoneData::new(config.zone.clone(), config.ttl)));
        Ok(Self {
            config,
            udp,
            tcp,
            local_addr,
            data,
            synced: Arc::new(AtomicBool::new(false)),
            metrics: DnsMetrics::default(),
        })
    }

    /// The bound address (UDP and TCP).
    pub fn local_addr(&self) -> SocketAddr {
        self.local_addr
    }

    /// The settings.
    pub fn config(&self) -> &DnsConfig {
        &self.config
    }

    /// Counters of answered queries, for a metrics registry.
    pub fn metrics(&self) -> DnsMetrics {
        self.metrics.clone()
    }

    /// A flag that turns true once the watches have synced (for readiness probes).
    pub fn synced(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.synced)
    }

    /// Watches the cluster behind `client` and answers queries until `shutdown` completes.
    pub async fn run(
        self,
        client: kube::Client,
        shutdown: impl Future<Output = ()>,
    ) -> Result<(), DnsError> {
        let watch = tokio::spawn(watch::run(
            client,
            Arc::clone(&self.data),
            Arc::clone(&self.synced),
        ));
        let handler = Handler::new(
            Arc::clone(&self.data),
            Arc::clone(&self.synced),
            self.metrics.clone(),
        );
        let mut server = Server::new(handler);
        server.register_socket(self.udp);
        server.register_listener(self.tcp, self.config.tcp_timeout, 64);
        tracing::info!(addr = %self.local_addr, zone = %self.config.zone, "DNS server listening");
        let result = tokio::select! {
            r = server.block_until_done() => r.map_err(|e| DnsError::Serve(e.to_string())),
            () = shutdown => {
                server.shutdown_gracefully().await.map_err(|e| DnsError::Serve(e.to_string()))
            }
        };
        watch.abort();
        self.synced.store(false, Ordering::Relaxed);
        result
    }
}
