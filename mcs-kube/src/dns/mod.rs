//! The `clusterset.local` DNS server.
//!
//! It answers from the local cluster's Namespaces, ServiceImports and MCS EndpointSlices
//! (those labelled `multicluster.kubernetes.io/service-name`), which it watches with
//! kube-rs, and builds every answer with [`mcs_core::dns::ZoneData`]. It serves UDP (a
//! receive loop per socket, several sockets on one port, answering without a task per
//! query; answers that do not fit carry the TC bit so resolvers retry over TCP) and TCP
//! (hickory-server), parsing and encoding with hickory in both, never recurses (names outside the zone are REFUSED), and answers the zone's names
//! with SERVFAIL until all three watches have synced. CoreDNS forwards the zone to it
//! (the server block of `deploy/dns/clusterset.server`).
//!
//! Protocol rules (checked before the data is looked at): opcodes other than QUERY get
//! NOTIMP, EDNS versions above 0 get BADVERS (with an OPT record, RFC 6891), classes other
//! than IN get REFUSED, and messages hickory cannot parse get FORMERR. The SOA's primary
//! server and the apex NS record name [`DnsConfig::nameserver`], a host outside the zone
//! (by default `ns.dns.cluster.local.`, the cluster's CoreDNS).
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
mod udp;
mod watch;

use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Duration;

use hickory_server::Server;
use mcs_core::dns::{DEFAULT_NAMESERVER, DEFAULT_TTL, DnsDataError, ZoneData};
use mcs_core::name::Zone;
use tokio::net::{TcpListener, UdpSocket};

pub use handler::DnsMetrics;
use handler::Handler;

/// The default largest UDP response (the DNS flag day 2020 value).
pub const DEFAULT_MAX_UDP_PAYLOAD: u16 = 1232;

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
    /// The largest UDP response, bytes (default 1232, the DNS flag day 2020 value; at
    /// least 512). A client's smaller EDNS buffer (or 512 without EDNS) lowers it per
    /// query; an answer that does not fit is truncated and carries the TC bit.
    pub max_udp_payload: u16,
    /// The zone's name server, named by the SOA record and the apex NS record: a host
    /// name outside the zone (default [`DEFAULT_NAMESERVER`], `ns.dns.cluster.local.`,
    /// which the cluster's CoreDNS answers with its own address).
    pub nameserver: String,
    /// How many UDP sockets share [`DnsConfig::listen`] (`SO_REUSEPORT`; default: one per
    /// available CPU, at most 8). The kernel spreads queries over them by source address
    /// and port, and each has its own receive loop, so UDP answers use more than one core.
    /// Platforms without `SO_REUSEPORT` use one.
    pub udp_sockets: usize,
}

impl Default for DnsConfig {
    fn default() -> Self {
        Self {
            zone: Zone::default(),
            ttl: DEFAULT_TTL,
            listen: SocketAddr::from(([127, 0, 0, 1], 5353)),
            tcp_timeout: Duration::from_secs(5),
            max_udp_payload: DEFAULT_MAX_UDP_PAYLOAD,
            nameserver: DEFAULT_NAMESERVER.to_owned(),
            udp_sockets: std::thread::available_parallelism().map_or(1, |n| n.get().min(8)),
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

    /// Sets the largest UDP response (values below 512 count as 512).
    #[must_use]
    pub fn max_udp_payload(mut self, bytes: u16) -> Self {
        self.max_udp_payload = bytes.max(512);
        self
    }

    /// Sets the zone's name server (a host name outside the zone; checked by
    /// [`DnsServer::bind`]).
    #[must_use]
    pub fn nameserver(mut self, name: impl Into<String>) -> Self {
        self.nameserver = name.into();
        self
    }

    /// Sets the listen address.
    #[must_use]
    pub fn listen(mut self, listen: SocketAddr) -> Self {
        self.listen = listen;
        self
    }

    /// Sets how many UDP sockets share the listen address (values below 1 count as 1).
    #[must_use]
    pub fn udp_sockets(mut self, sockets: usize) -> Self {
        self.udp_sockets = sockets.max(1);
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
    /// The settings do not make a valid zone (for example a name server inside it).
    #[error("cannot serve zone {zone}: {source}")]
    Zone {
        /// The zone.
        zone: String,
        /// The problem.
        #[source]
        source: DnsDataError,
    },
    /// The server stopped with an error.
    #[error("DNS server failed: {0}")]
    Serve(String),
}

/// A bound DNS server, not yet serving.
pub struct DnsServer {
    config: DnsConfig,
    udp: Vec<UdpSocket>,
    tcp: TcpListener,
    local_addr: SocketAddr,
    data: Arc<RwLock<ZoneData>>,
    synced: Arc<AtomicBool>,
    metrics: DnsMetrics,
}

impl DnsServer {
    /// Binds UDP ([`DnsConfig::udp_sockets`] sockets) and TCP on `config.listen` (the same
    /// port for all), after checking the settings.
    pub async fn bind(config: DnsConfig) -> Result<Self, DnsError> {
        let mut zone_data = ZoneData::new(config.zone.clone(), config.ttl);
        zone_data
            .set_nameserver(&config.nameserver)
            .map_err(|source| DnsError::Zone {
                zone: config.zone.to_string(),
                source,
            })?;
        let bind_err = |addr, source| DnsError::Bind { addr, source };
        // With port 0 the UDP socket picks a free port that TCP may already use: try again
        // with another port a few times.
        let attempts = if config.listen.port() == 0 { 20 } else { 1 };
        let mut attempt = 0;
        let (udp, tcp, local_addr) = loop {
            attempt += 1;
            let (udp, local_addr) = bind_udp(config.listen, config.udp_sockets)
                .map_err(|e| bind_err(config.listen, e))?;
            match TcpListener::bind(local_addr).await {
                Ok(tcp) => break (udp, tcp, local_addr),
                Err(e) if attempt < attempts && e.kind() == std::io::ErrorKind::AddrInUse => {
                    continue;
                }
                Err(e) => return Err(bind_err(local_addr, e)),
            }
        };
        let data = Arc::new(RwLock::new(zone_data));
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

    /// A handle on the data the server answers from. [`DnsServer::run`] fills it from the
    /// cluster's watches; a process that gets its ServiceImports and EndpointSlices some
    /// other way (a test, an example, a different control plane) fills it through the
    /// handle and calls [`DnsServer::serve`].
    pub fn zone(&self) -> ZoneHandle {
        ZoneHandle {
            data: Arc::clone(&self.data),
            synced: Arc::clone(&self.synced),
        }
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
        let result = self.serve(shutdown).await;
        watch.abort();
        result
    }

    /// Answers queries from the data behind [`DnsServer::zone`] until `shutdown` completes,
    /// without watching a cluster. Queries for the zone's names get SERVFAIL until the handle
    /// is marked synced.
    pub async fn serve(self, shutdown: impl Future<Output = ()>) -> Result<(), DnsError> {
        let handler = Handler::new(
            Arc::clone(&self.data),
            Arc::clone(&self.synced),
            self.metrics.clone(),
            self.config.max_udp_payload.max(512),
        );
        // UDP on loops of our own (udp.rs), TCP on hickory-server; both answer through the
        // same handler.
        let mut udp = tokio::task::JoinSet::new();
        for socket in self.udp {
            udp.spawn(udp::serve(socket, handler.clone()));
        }
        let mut server = Server::new(handler);
        server.register_listener(self.tcp, self.config.tcp_timeout, 64);
        tracing::info!(addr = %self.local_addr, zone = %self.config.zone, "DNS server listening");
        let result = tokio::select! {
            r = server.block_until_done() => r.map_err(|e| DnsError::Serve(e.to_string())),
            Some(r) = udp.join_next() => Err(DnsError::Serve(match r {
                Ok(e) => format!("UDP socket on {}: {e}", self.local_addr),
                Err(e) => format!("UDP loop on {}: {e}", self.local_addr),
            })),
            () = shutdown => {
                server.shutdown_gracefully().await.map_err(|e| DnsError::Serve(e.to_string()))
            }
        };
        // The UDP loops run until stopped; once they have, their sockets are closed.
        udp.shutdown().await;
        self.synced.store(false, Ordering::Relaxed);
        result
    }
}

/// Binds `count` UDP sockets to `listen` with `SO_REUSEPORT` (one without it where the
/// platform lacks it); with port 0 the first picks the port and the others join it.
fn bind_udp(listen: SocketAddr, count: usize) -> std::io::Result<(Vec<UdpSocket>, SocketAddr)> {
    let count = if cfg!(unix) { count.max(1) } else { 1 };
    let mut sockets = Vec::with_capacity(count);
    let mut addr = listen;
    for _ in 0..count {
        let socket = std::net::UdpSocket::from(reuse_port_socket(addr, count > 1)?);
        socket.set_nonblocking(true)?;
        let socket = UdpSocket::from_std(socket)?;
        addr = socket.local_addr()?;
        sockets.push(socket);
    }
    Ok((sockets, addr))
}

fn reuse_port_socket(addr: SocketAddr, reuse: bool) -> std::io::Result<socket2::Socket> {
    use socket2::{Domain, Protocol, Socket, Type};
    let socket = Socket::new(Domain::for_address(addr), Type::DGRAM, Some(Protocol::UDP))?;
    #[cfg(unix)]
    if reuse {
        socket.set_reuse_port(true)?;
    }
    #[cfg(not(unix))]
    let _ = reuse;
    socket.bind(&addr.into())?;
    Ok(socket)
}

/// Write access to a [`DnsServer`]'s answer data. Cheap to clone.
///
/// ```no_run
/// # async fn f(import: mcs_core::api::v1beta1::ServiceImport) -> Result<(), Box<dyn std::error::Error>> {
/// use mcs_kube::dns::{DnsConfig, DnsServer};
///
/// let server = DnsServer::bind(DnsConfig::default()).await?;
/// let zone = server.zone();
/// zone.update(|data| {
///     data.set_namespace("loyalty", true);
///     data.upsert_import(&import)
/// })?;
/// zone.mark_synced();
/// server.serve(std::future::pending()).await?;
/// # Ok(()) }
/// ```
#[derive(Clone, Debug)]
pub struct ZoneHandle {
    data: Arc<RwLock<ZoneData>>,
    synced: Arc<AtomicBool>,
}

impl ZoneHandle {
    /// Changes the data under the write lock; queries see all of `f`'s changes at once.
    pub fn update<R>(&self, f: impl FnOnce(&mut ZoneData) -> R) -> R {
        // After a panicking writer the lock stays poisoned and queries get SERVFAIL (see
        // the handler); updates still go through.
        let mut data = self.data.write().unwrap_or_else(|e| e.into_inner());
        f(&mut data)
    }

    /// Marks the data complete: queries are answered from now on instead of SERVFAIL.
    pub fn mark_synced(&self) {
        self.synced.store(true, Ordering::Release);
    }
}
