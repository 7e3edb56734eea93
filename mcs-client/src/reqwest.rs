//! ClusterSet names for [reqwest] clients (feature `reqwest`).
//!
//! reqwest has no hook to choose where each request goes: it keeps a pool of connections per
//! host and asks a DNS resolver for addresses only when it opens a new connection. So the
//! integration is a resolver, [`ClusterSetDns`], and what a reqwest user gets is balancing
//! **per connection**, not per request:
//!
//! - a `<service>.<namespace>.svc.clusterset.local` name resolves through the same
//!   [`Resolve`] implementations as the [`McsLayer`] (a [`StaticResolver`](crate::StaticResolver),
//!   the [`DnsResolver`](crate::DnsResolver), `mcs-kube`'s Kubernetes resolver), into the
//!   same balancer: each new connection goes to the endpoint the balancer picks (local
//!   cluster first, spill-over when the local cluster is unhealthy), and the answer lists
//!   a few more endpoints after it, the rest of that tier and then one of each other
//!   tier, so a connection that is refused or times out moves on to the next address
//!   (hyper-util's connector tries them in order) and reaches another cluster when the
//!   local one is down. Endpoints that are not ready, or ejected, are left out;
//! - with [`ClusterSetDns::connect_outcomes`] as a connector layer, connection outcomes
//!   feed the balancer's outlier detection: addresses that refused or timed out count as
//!   failures (five in a row eject an endpoint), a connection made counts as a success;
//! - other names resolve through the system resolver, as reqwest's default does.
//!
//! What reqwest users do **not** get: every request on a kept-alive connection goes to
//! that connection's endpoint, so an HTTP/2 client (one connection per host) sends
//! everything to one endpoint until the connection closes; request outcomes (5xx,
//! latency) and TLS handshake failures are not attributed to an endpoint (reqwest does
//! not say which address a failed request or handshake went to); and no retries on
//! another endpoint once a connection is made. For balancing every request, use the
//! [`McsLayer`] with a hyper client, or shorten connections' lives
//! (`pool_max_idle_per_host(0)` opens a connection, and so makes a pick, per request, at
//! the cost of a handshake each).
//!
//! # Ports
//!
//! reqwest gives a resolver the host name only, not the port, so the resolver is told which
//! service port a name stands for ([`ClusterSetDns::port`], or per service
//! [`ClusterSetDns::service_port`]); it answers each endpoint's address with the endpoint's
//! own port. When the URL names a port, reqwest's connector dials that port on every
//! address instead: fine when the pods listen on the service port, and otherwise write the
//! URL without a port so that the endpoints' ports are used.
//!
//! # TLS
//!
//! reqwest verifies the server's certificate against the URL's host, the ClusterSet name,
//! and sends it as SNI; certificates must carry that name.
//!
//! ```no_run
//! use std::sync::Arc;
//! use mcs_client::StaticResolver;
//! use mcs_client::reqwest::ClusterSetDns;
//! use mcs_core::{ClusterId, endpoints::Locality};
//!
//! # async fn run(resolver: StaticResolver) -> Result<(), Box<dyn std::error::Error>> {
//! let dns = ClusterSetDns::new(resolver, Locality::cluster(ClusterId::new("north")?)).port(9443);
//! let client = reqwest::Client::builder()
//!     .dns_resolver(Arc::new(dns.clone()))
//!     .connector_layer(dns.connect_outcomes())
//!     .build()?;
//! let body = client
//!     .get("http://loyalty-accrual.loyalty.svc.clusterset.local:9443/accrue")
//!     .send()
//!     .await?
//!     .text()
//!     .await?;
//! # let _ = body; Ok(()) }
//! ```
//!
//! [reqwest]: https://docs.rs/reqwest
//! [`Resolve`]: mcs_core::discovery::Resolve

use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use ::reqwest::dns::{Addrs, Name, Resolve as ReqwestResolve, Resolving};
use hyper_util::client::legacy::connect::{Connection, HttpInfo};
use tower::{BoxError, Layer, Service};

use mcs_core::discovery::Resolve;
use mcs_core::endpoints::{Locality, Outcome, Picked, Tier};
use mcs_core::name::{McsName, ServiceRef};

use crate::classify::no_connection;
use crate::error::Error;
use crate::layer::McsLayer;
use crate::service::wait_for_pick;
use crate::shared::Shared;
use crate::target::{Routing, TargetShared, form_of, now};

/// How many endpoints of the picked endpoint's tier an answer lists after the pick.
const SAME_TIER: usize = 3;

/// A reqwest DNS resolver for ClusterSet names; see the [module docs](self).
///
/// Clones share everything. Give reqwest a clone (`dns_resolver(Arc::new(dns.clone()))`)
/// and keep one for [`connect_outcomes`](Self::connect_outcomes).
#[derive(Clone)]
pub struct ClusterSetDns {
    shared: Arc<Shared>,
    ports: Arc<Ports>,
}

#[derive(Clone, Debug, Default)]
struct Ports {
    default: Option<u16>,
    by_service: HashMap<ServiceRef, u16>,
}

impl ClusterSetDns {
    /// A resolver with its own discovery and endpoint state, with the defaults of
    /// [`McsLayer::new`] (zone `clusterset.local`, local-first from `locality`, first
    /// resolution within 5 s, fail fast after 3 s without endpoints).
    pub fn new(resolver: impl Resolve, locality: Locality) -> Self {
        Self::from_layer(&McsLayer::new(resolver, locality))
    }

    /// A resolver sharing `layer`'s discovery and endpoint state: the requests the layer
    /// balances and the connections reqwest makes see the same endpoints, and ejections
    /// made by either apply to both.
    pub fn from_layer<R>(layer: &McsLayer<R>) -> Self {
        Self {
            shared: Arc::clone(layer.shared()),
            ports: Arc::default(),
        }
    }

    /// The service port every ClusterSet name stands for, unless
    /// [`service_port`](Self::service_port) names another for its service.
    pub fn port(mut self, port: u16) -> Self {
        Arc::make_mut(&mut self.ports).default = Some(port);
        self
    }

    /// The service port `service`'s name stands for.
    pub fn service_port(mut self, service: ServiceRef, port: u16) -> Self {
        Arc::make_mut(&mut self.ports)
            .by_service
            .insert(service, port);
        self
    }

    /// A connector layer for `reqwest::ClientBuilder::connector_layer` that feeds the
    /// outcome of every connection reqwest opens to a ClusterSet name back into the
    /// balancer: addresses that refused the connection or timed out are failures, the
    /// address connected to is a success. It reads what this resolver answered for the
    /// same connection, so give reqwest both.
    pub fn connect_outcomes(&self) -> ConnectOutcomes {
        ConnectOutcomes { _private: () }
    }

    async fn resolve_name(self, host: String) -> Result<Addrs, BoxError> {
        let zone = self.shared.registry.zone();
        if !zone.contains(&host) {
            let addrs: Vec<SocketAddr> =
                tokio::net::lookup_host((host.as_str(), 0)).await?.collect();
            return Ok(Box::new(addrs.into_iter()));
        }
        let service = match McsName::parse(&host, zone) {
            Ok(McsName::Service(service)) => service,
            Ok(other) => {
                return Err(Error::NotAService {
                    host,
                    form: form_of(&other),
                }
                .into());
            }
            Err(source) => return Err(Error::InvalidName { host, source }.into()),
        };
        let Some(port) = self
            .ports
            .by_service
            .get(&service)
            .copied()
            .or(self.ports.default)
        else {
            return Err(Error::NoServicePort { host }.into());
        };
        let route = match self.shared.registry.route(&host, port) {
            Routing::Target(route) => route,
            Routing::Invalid(err) => return Err(err.into()),
            // The zone contains the host: routing never passes it through.
            Routing::Passthrough => return Err(Error::NoServicePort { host }.into()),
        };
        let target = route.target;
        let started = now();
        target.touch(started);
        let picked = wait_for_pick(&self.shared, &target, started).await?;
        target.picked();
        let addrs = answer(&target, picked, now());
        let _ = ANSWERED.try_with(|slot| {
            *slot.lock().unwrap_or_else(|e| e.into_inner()) = Some(Answered {
                target: Arc::clone(&target),
                addrs: addrs.clone(),
            });
        });
        Ok(Box::new(addrs.into_iter()))
    }
}

impl ReqwestResolve for ClusterSetDns {
    fn resolve(&self, name: Name) -> Resolving {
        Box::pin(self.clone().resolve_name(name.as_str().to_owned()))
    }
}

impl fmt::Debug for ClusterSetDns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ClusterSetDns")
            .field("registry", &self.shared.registry)
            .field("ports", &self.ports)
            .finish()
    }
}

/// The addresses for one new connection: the pick first, then up to [`SAME_TIER`] more of
/// its tier, then one of each other tier in tier order; nothing ejected. Endpoints of a
/// tier are taken from a random position, so connections that fail over spread out.
fn answer(target: &TargetShared, picked: Picked, now: Instant) -> Vec<SocketAddr> {
    let first = picked.addr();
    let picked_tier = picked.tier();
    // Not a request: the pick only chooses the address.
    drop(picked);
    let snapshot = target.balancer.snapshot();
    let mut addrs = vec![first];
    let mut from_tier = |states: &Tier, want: usize| {
        let len = states.len();
        if len == 0 {
            return;
        }
        let start = fastrand::usize(..len);
        let mut taken = 0;
        for i in 0..len {
            if taken == want {
                break;
            }
            let Some(state) = states.get((start + i) % len) else {
                continue;
            };
            let addr = state.endpoint().addr;
            if addr != first && !state.is_ejected(now) && !addrs.contains(&addr) {
                addrs.push(addr);
                taken += 1;
            }
        }
    };
    if let Some(states) = snapshot.tiers().get(picked_tier) {
        from_tier(states, SAME_TIER);
    }
    for (tier, states) in snapshot.tiers().iter().enumerate() {
        if tier != picked_tier {
            from_tier(states, 1);
        }
    }
    addrs
}

/// What the resolver answered for the connection being made in this task.
struct Answered {
    target: Arc<TargetShared>,
    addrs: Vec<SocketAddr>,
}

tokio::task_local! {
    /// Set by [`ConnectOutcomesService`] around one connection attempt; filled by the
    /// resolver, which reqwest's connector awaits inside that attempt.
    static ANSWERED: Arc<Mutex<Option<Answered>>>;
}

/// A reqwest connector layer that reports connection outcomes to the balancer; made by
/// [`ClusterSetDns::connect_outcomes`].
#[derive(Clone, Debug)]
pub struct ConnectOutcomes {
    _private: (),
}

impl<S> Layer<S> for ConnectOutcomes {
    type Service = ConnectOutcomesService<S>;

    fn layer(&self, inner: S) -> Self::Service {
        ConnectOutcomesService { inner }
    }
}

/// The connector service of [`ConnectOutcomes`].
#[derive(Clone, Debug)]
pub struct ConnectOutcomesService<S> {
    inner: S,
}

impl<S, Req> Service<Req> for ConnectOutcomesService<S>
where
    S: Service<Req>,
    S::Response: Connection,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
{
    type Response = S::Response;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<S::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Req) -> Self::Future {
        let slot = Arc::new(Mutex::new(None));
        let connecting = ANSWERED.scope(Arc::clone(&slot), self.inner.call(req));
        Box::pin(async move {
            let started = now();
            let result = connecting.await.map_err(Into::into);
            let answered = slot.lock().unwrap_or_else(|e| e.into_inner()).take();
            if let Some(answered) = answered {
                record(&answered, &result, now().saturating_duration_since(started));
            }
            result
        })
    }
}

/// Feeds one connection attempt's outcome back: on success the address connected to
/// succeeded and the addresses of its family answered before it failed (the connector
/// tries them in order); on a refused or timed-out connection every address answered
/// failed (the connector tried them all). Other failures (a TLS handshake, a proxy) are
/// not attributed: which address they happened on is not known.
fn record<C: Connection>(answered: &Answered, result: &Result<C, BoxError>, latency: Duration) {
    let now = now();
    let target = &answered.target;
    match result {
        Ok(conn) => {
            let mut extensions = http::Extensions::new();
            conn.connected().get_extras(&mut extensions);
            let Some(remote) = extensions.get::<HttpInfo>().map(HttpInfo::remote_addr) else {
                return;
            };
            for addr in answered.addrs.iter().take_while(|a| **a != remote) {
                if addr.is_ipv4() == remote.is_ipv4() {
                    target.report(*addr, Outcome::Failure, latency, now);
                }
            }
            target.report(remote, Outcome::Success, latency, now);
        }
        Err(err) if is_connect_failure(&**err) => {
            for addr in &answered.addrs {
                target.report(*addr, Outcome::Failure, latency, now);
            }
        }
        Err(_) => {}
    }
}

/// Whether `err` is a TCP connection that failed: refused, unreachable or timed out.
fn is_connect_failure(err: &(dyn StdError + 'static)) -> bool {
    let mut next = Some(err);
    while let Some(err) = next {
        if let Some(io) = err.downcast_ref::<io::Error>() {
            // A timeout is hyper-util's connect timeout; TLS errors are other kinds.
            return no_connection(io.kind()) || io.kind() == io::ErrorKind::TimedOut;
        }
        next = err.source();
    }
    false
}
