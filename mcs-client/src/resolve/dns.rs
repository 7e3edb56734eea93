//! [`DnsResolver`]: endpoint sets from `clusterset.local` DNS, on hickory-resolver.
//!
//! For a target `<svc>.<ns>.svc.<zone>:<port>`:
//!
//! 1. **SRV** at the bare service name (`<svc>.<ns>.svc.<zone>.`, which MCS DNS answers with
//!    one record per port and endpoint), or at `_<port-name>._tcp.<svc>.<ns>.svc.<zone>.`
//!    when a port name is configured for the port. Records for other ports are ignored.
//!    - A target `<hostname>.<clusterid>.<svc>.<ns>.svc.<zone>.` (headless service) gives
//!      endpoints **in that cluster**, with that hostname; its addresses come from the
//!      additional section or an A/AAAA query of the target.
//!    - A target that is the service name itself (ClusterSetIP service) gives the VIP.
//! 2. If no SRV record matches the port (unnamed ports have none), **A/AAAA** at the service
//!    name, on the requested port; unless the SRV records name endpoints (a headless
//!    service) for other ports only: then the service has no endpoint on this port.
//!
//! Addresses without a cluster (the ClusterSetIP VIP, answers to A/AAAA queries) belong to
//! a pseudo cluster, `clusterset` unless configured otherwise, so that local-first tiering
//! treats them as remote and failover stays predictable.
//!
//! Names are queried as absolute names (with the trailing dot), so the resolver never
//! walks the search list (`ndots:5` would otherwise cost three NXDOMAIN round trips per
//! query). A set is re-queried when its shortest TTL expires, clamped to bounds (default
//! 1 s to 30 s). Errors keep the last good set (the consumer receives the error and keeps
//! its endpoints) and are retried with backoff inside the same bounds. An empty answer
//! (NXDOMAIN or no records) after a non-empty one is re-queried at the lower bound and only
//! published when confirmed by the next answer: one empty answer never empties the set
//! (kuberesolver #66).

use std::collections::HashMap;
use std::fmt;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::{Duration, Instant};

use hickory_resolver::TokioResolver;
use hickory_resolver::config::{ConnectionConfig, NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::net::{DnsError, NetError};
use hickory_resolver::proto::rr::{Name, RData, Record, RecordType};
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tracing::{debug, trace};

use mcs_core::ClusterId;
use mcs_core::discovery::{Endpoint, Resolution, Resolve, ResolveError, Target, Update};
use mcs_core::name::{McsName, PortName, Zone};

use super::ReceiverStream;

/// Resolves ClusterSet services through DNS. Cheap to clone; clones share one hickory
/// resolver and its cache.
///
/// ```no_run
/// # async fn f() -> Result<(), Box<dyn std::error::Error>> {
/// use mcs_client::{DnsResolver, McsLayer};
/// use mcs_core::{ClusterId, endpoints::Locality};
///
/// // The system's resolv.conf (CoreDNS forwards clusterset.local to the MCS DNS server).
/// let dns = DnsResolver::builder().build()?;
/// let layer = McsLayer::new(dns, Locality::cluster(ClusterId::new("east")?));
/// # Ok(()) }
/// ```
#[derive(Clone)]
pub struct DnsResolver {
    inner: Arc<Inner>,
}

struct Inner {
    resolver: TokioResolver,
    zone: Zone,
    min_ttl: Duration,
    max_ttl: Duration,
    vip_cluster: ClusterId,
    port_names: HashMap<u16, PortName>,
    confirmations: u32,
}

impl fmt::Debug for DnsResolver {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("DnsResolver")
            .field("zone", &self.inner.zone)
            .field("ttl_bounds", &(self.inner.min_ttl, self.inner.max_ttl))
            .field("vip_cluster", &self.inner.vip_cluster)
            .finish_non_exhaustive()
    }
}

/// Why a [`DnsResolver`] could not be built.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DnsBuildError {
    /// The system resolver configuration could not be read.
    #[error("reading the system DNS configuration: {0}")]
    SystemConfig(String),
    /// The hickory resolver rejected the configuration.
    #[error("building the DNS resolver: {0}")]
    Resolver(String),
}

/// Builds a [`DnsResolver`].
#[derive(Debug, Clone)]
#[must_use]
pub struct DnsResolverBuilder {
    name_servers: Vec<SocketAddr>,
    zone: Zone,
    min_ttl: Duration,
    max_ttl: Duration,
    vip_cluster: ClusterId,
    port_names: HashMap<u16, PortName>,
    query_timeout: Duration,
    attempts: usize,
    confirmations: u32,
}

impl DnsResolver {
    /// A builder: the system's name servers, zone `clusterset.local`, TTL bounds 1 s to 30 s,
    /// pseudo cluster `clusterset` for VIPs, 2 s query timeout with 2 attempts.
    pub fn builder() -> DnsResolverBuilder {
        DnsResolverBuilder {
            name_servers: Vec::new(),
            zone: Zone::default(),
            min_ttl: Duration::from_secs(1),
            max_ttl: Duration::from_secs(30),
            vip_cluster: vip_cluster_default(),
            port_names: HashMap::new(),
            query_timeout: Duration::from_secs(2),
            attempts: 2,
            confirmations: 2,
        }
    }
}

fn vip_cluster_default() -> ClusterId {
    // A valid RFC-1123 label, so this cannot fail; fall back to a shorter one if the rules
    // ever change.
    ClusterId::new("clusterset")
        .or_else(|_| ClusterId::new("vip"))
        .unwrap_or_else(|_| unreachable!("valid label"))
}

impl DnsResolverBuilder {
    /// Queries this name server (UDP, then TCP on truncation) instead of the system's.
    /// Call again to add more.
    pub fn name_server(mut self, addr: SocketAddr) -> Self {
        self.name_servers.push(addr);
        self
    }

    /// The ClusterSet zone (default `clusterset.local`).
    pub fn zone(mut self, zone: Zone) -> Self {
        self.zone = zone;
        self
    }

    /// Bounds for the re-query interval (default 1 s and 30 s). Record TTLs are clamped
    /// into them; errors back off between them.
    pub fn ttl_bounds(mut self, min: Duration, max: Duration) -> Self {
        self.min_ttl = min.max(Duration::from_millis(10));
        self.max_ttl = max.max(self.min_ttl);
        self
    }

    /// The pseudo cluster for addresses DNS gives without a cluster: ClusterSetIP VIPs and
    /// A/AAAA answers (default `clusterset`).
    pub fn clusterset_ip_cluster(mut self, cluster: ClusterId) -> Self {
        self.vip_cluster = cluster;
        self
    }

    /// Names a service port, so that its SRV query is `_<name>._tcp.<svc>.<ns>.svc.<zone>.`
    /// instead of the bare service name.
    pub fn port_name(mut self, port: u16, name: PortName) -> Self {
        self.port_names.insert(port, name);
        self
    }

    /// Timeout of one DNS query (default 2 s) and attempts per lookup (default 2).
    pub fn query_timeout(mut self, timeout: Duration, attempts: usize) -> Self {
        self.query_timeout = timeout;
        self.attempts = attempts.max(1);
        self
    }

    /// How many empty answers in a row empty a set that was not empty (default 2; 1 trusts
    /// the first empty answer).
    pub fn empty_confirmations(mut self, n: u32) -> Self {
        self.confirmations = n.max(1);
        self
    }

    /// The resolver.
    pub fn build(self) -> Result<DnsResolver, DnsBuildError> {
        let provider = TokioRuntimeProvider::default();
        let mut builder = if self.name_servers.is_empty() {
            TokioResolver::builder_tokio()
                .map_err(|e| DnsBuildError::SystemConfig(e.to_string()))?
        } else {
            let servers = self
                .name_servers
                .iter()
                .map(|addr| {
                    let mut udp = ConnectionConfig::udp();
                    udp.port = addr.port();
                    let mut tcp = ConnectionConfig::tcp();
                    tcp.port = addr.port();
                    NameServerConfig::new(addr.ip(), true, vec![udp, tcp])
                })
                .collect();
            TokioResolver::builder_with_config(
                ResolverConfig::from_parts(None, Vec::new(), servers),
                provider,
            )
        };
        let opts = builder.options_mut();
        opts.timeout = self.query_timeout;
        opts.attempts = self.attempts;
        // The cache must never outlive a re-query: cap positive TTLs at the upper bound and
        // negative ones at the lower bound.
        opts.positive_max_ttl = Some(self.max_ttl);
        opts.negative_max_ttl = Some(self.min_ttl);
        let resolver = builder
            .build()
            .map_err(|e| DnsBuildError::Resolver(e.to_string()))?;
        Ok(DnsResolver {
            inner: Arc::new(Inner {
                resolver,
                zone: self.zone,
                min_ttl: self.min_ttl,
                max_ttl: self.max_ttl,
                vip_cluster: self.vip_cluster,
                port_names: self.port_names,
                confirmations: self.confirmations,
            }),
        })
    }
}

impl Resolve for DnsResolver {
    fn resolve(&self, target: &Target) -> Resolution {
        let (tx, rx) = mpsc::unbounded_channel();
        match tokio::runtime::Handle::try_current() {
            Ok(runtime) => {
                runtime.spawn(run(Arc::clone(&self.inner), target.clone(), tx));
            }
            Err(_) => {
                let _ = tx.send(Err(ResolveError::new(
                    target,
                    "the DNS resolver needs a Tokio runtime",
                )));
            }
        }
        Box::pin(ReceiverStream(rx))
    }
}

/// What one round of queries found.
#[derive(Debug)]
enum Answer {
    Endpoints(Vec<Endpoint>),
    NxDomain,
    Empty,
}

/// The resolution loop of one target; ends when the consumer drops the stream.
async fn run(
    inner: Arc<Inner>,
    target: Target,
    tx: mpsc::UnboundedSender<Result<Update, ResolveError>>,
) {
    let mut had_endpoints = false;
    let mut empties = 0;
    let mut backoff = inner.min_ttl;
    loop {
        let (item, wait) = match inner.query(&target).await {
            Ok((Answer::Endpoints(endpoints), valid_until)) if !endpoints.is_empty() => {
                trace!(service = %target, endpoints = endpoints.len(), "dns answer");
                had_endpoints = true;
                empties = 0;
                backoff = inner.min_ttl;
                (Some(Ok(Update::Reset(endpoints))), inner.clamp(valid_until))
            }
            Ok((answer, valid_until)) => {
                backoff = inner.min_ttl;
                empties += 1;
                // The next query asks the server, not the cache: an empty answer is the
                // one most likely to be stale (a port or endpoints just added).
                inner.forget(&target);
                if had_endpoints && empties < inner.confirmations {
                    debug!(service = %target, ?answer, "empty dns answer; keeping the last set until confirmed");
                    (None, inner.min_ttl)
                } else {
                    had_endpoints = false;
                    let update = if matches!(answer, Answer::NxDomain) {
                        Update::DoesNotExist
                    } else {
                        Update::Reset(Vec::new())
                    };
                    (Some(Ok(update)), inner.clamp(valid_until))
                }
            }
            Err(message) => {
                let wait = backoff;
                backoff = (backoff * 2).min(inner.max_ttl);
                (Some(Err(ResolveError::new(&target, message))), wait)
            }
        };
        if let Some(item) = item
            && tx.send(item).is_err()
        {
            return;
        }
        tokio::select! {
            _ = tokio::time::sleep(wait) => {}
            _ = tx.closed() => return,
        }
    }
}

impl Inner {
    fn clamp(&self, valid_until: Instant) -> Duration {
        valid_until
            .saturating_duration_since(Instant::now())
            .clamp(self.min_ttl, self.max_ttl)
    }

    fn service_fqdn(&self, target: &Target) -> String {
        target.service.to_fqdn(&self.zone)
    }

    fn srv_name(&self, target: &Target) -> String {
        match self.port_names.get(&target.port) {
            Some(name) => format!("_{name}._tcp.{}", self.service_fqdn(target)),
            None => self.service_fqdn(target),
        }
    }

    /// Drops cached answers for the target's names, so a confirmation query asks the server.
    fn forget(&self, target: &Target) {
        self.resolver
            .clear_lookup_cache(self.srv_name(target).as_str(), RecordType::SRV);
        let fqdn = self.service_fqdn(target);
        self.resolver
            .clear_lookup_cache(fqdn.as_str(), RecordType::A);
        self.resolver
            .clear_lookup_cache(fqdn.as_str(), RecordType::AAAA);
    }

    /// One round of queries: SRV, then the SRV targets' addresses, or A/AAAA.
    async fn query(self: &Arc<Self>, target: &Target) -> Result<(Answer, Instant), String> {
        let mut valid_until = Instant::now() + self.max_ttl;
        let srv_name = self.srv_name(target);
        let named = self.port_names.contains_key(&target.port);
        let lookup = match self.resolver.srv_lookup(srv_name.as_str()).await {
            Ok(lookup) => lookup,
            Err(e) if e.is_nx_domain() => {
                return Ok((Answer::NxDomain, negative_until(&e, valid_until)));
            }
            Err(e) if e.is_no_records_found() => {
                return self.query_addresses(target, valid_until).await;
            }
            Err(e) => return Err(format!("SRV {srv_name}: {e}")),
        };
        valid_until = valid_until.min(lookup.valid_until());
        let srvs: Vec<(Name, u16)> = lookup
            .answers()
            .iter()
            .filter_map(|r| match &r.data {
                RData::SRV(srv) if named || srv.port == target.port => {
                    Some((srv.target.clone(), srv.port))
                }
                _ => None,
            })
            .collect();
        if srvs.is_empty() {
            // SRV records for other ports only. If they name endpoints (a headless
            // service), the service has no endpoint on this port: its A/AAAA records would
            // list every endpoint, including clusters that do not serve the port.
            let headless = lookup.answers().iter().any(|r| match &r.data {
                RData::SRV(srv) => matches!(
                    McsName::parse(&srv.target.to_ascii(), &self.zone),
                    Ok(McsName::Endpoint { .. })
                ),
                _ => false,
            });
            if headless {
                return Ok((Answer::Empty, valid_until));
            }
            return self.query_addresses(target, valid_until).await;
        }
        let mut endpoints = Vec::new();
        let mut pending = JoinSet::new();
        for (name, port) in srvs {
            let (cluster, hostname) = match McsName::parse(&name.to_ascii(), &self.zone) {
                Ok(McsName::Endpoint {
                    hostname, cluster, ..
                }) => (cluster, Some(hostname)),
                _ => (self.vip_cluster.clone(), None),
            };
            let glue = addresses_in(lookup.additionals(), &name);
            if !glue.is_empty() {
                endpoints.extend(
                    glue.into_iter()
                        .map(|ip| endpoint(ip, port, &cluster, &hostname)),
                );
                continue;
            }
            let this = Arc::clone(self);
            pending.spawn(async move {
                let found = this.resolver.lookup_ip(name.clone()).await;
                (name, port, cluster, hostname, found)
            });
        }
        while let Some(joined) = pending.join_next().await {
            let Ok((name, port, cluster, hostname, found)) = joined else {
                continue;
            };
            match found {
                Ok(ips) => {
                    valid_until = valid_until.min(ips.valid_until());
                    endpoints.extend(ips.iter().map(|ip| endpoint(ip, port, &cluster, &hostname)));
                }
                // The SRV record names a target that has no address (yet): skip it.
                Err(e) if e.is_nx_domain() || e.is_no_records_found() => {
                    debug!(service = %target, target = %name, "SRV target has no address");
                }
                Err(e) => return Err(format!("A/AAAA {name}: {e}")),
            }
        }
        endpoints.sort_by_key(|e| e.addr);
        endpoints.dedup_by_key(|e| e.addr);
        Ok((Answer::Endpoints(endpoints), valid_until))
    }

    /// A/AAAA at the service name, on the requested port.
    async fn query_addresses(
        &self,
        target: &Target,
        valid_until: Instant,
    ) -> Result<(Answer, Instant), String> {
        let fqdn = self.service_fqdn(target);
        match self.resolver.lookup_ip(fqdn.as_str()).await {
            Ok(ips) => {
                let valid_until = valid_until.min(ips.valid_until());
                let mut endpoints: Vec<Endpoint> = ips
                    .iter()
                    .map(|ip| endpoint(ip, target.port, &self.vip_cluster, &None))
                    .collect();
                endpoints.sort_by_key(|e| e.addr);
                endpoints.dedup_by_key(|e| e.addr);
                Ok((Answer::Endpoints(endpoints), valid_until))
            }
            Err(e) if e.is_nx_domain() => Ok((Answer::NxDomain, negative_until(&e, valid_until))),
            Err(e) if e.is_no_records_found() => {
                Ok((Answer::Empty, negative_until(&e, valid_until)))
            }
            Err(e) => Err(format!("A/AAAA {fqdn}: {e}")),
        }
    }
}

fn endpoint(
    ip: IpAddr,
    port: u16,
    cluster: &ClusterId,
    hostname: &Option<mcs_core::name::Hostname>,
) -> Endpoint {
    let mut e = Endpoint::ready(SocketAddr::new(ip, port), cluster.clone());
    e.hostname.clone_from(hostname);
    e
}

/// Addresses for `name` in a section (the "glue" of an SRV answer).
fn addresses_in(records: &[Record], name: &Name) -> Vec<IpAddr> {
    records
        .iter()
        .filter(|r| r.name == *name)
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(IpAddr::V4(a.0)),
            RData::AAAA(a) => Some(IpAddr::V6(a.0)),
            _ => None,
        })
        .collect()
}

/// When a negative answer expires: its SOA minimum if known.
fn negative_until(err: &NetError, otherwise: Instant) -> Instant {
    match err {
        NetError::Dns(DnsError::NoRecordsFound(nr)) => match nr.negative_ttl {
            Some(ttl) => Instant::now() + Duration::from_secs(u64::from(ttl)),
            None => otherwise,
        },
        _ => otherwise,
    }
}
