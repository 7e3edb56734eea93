//! Where balanced requests are sent: one service per endpoint, made by a factory you supply.
//!
//! The layer picks an endpoint for every request and sends the request, URI and headers
//! unchanged, on that endpoint's own service. The service is made once per endpoint by a
//! [`MakeEndpoint`], told in an [`EndpointTarget`] which address to dial and which name the
//! server should prove (the ClusterSet name by default). This is the tower idiom of a
//! service per endpoint (`tower::balance` over `Discover`, tonic's `Endpoint`): each
//! endpoint has its own connection pool, so TLS verifies the service name, never the
//! endpoint's IP, and `Host` / `:authority` stay what the caller wrote.
//!
//! An endpoint's service lives as long as discovery lists the endpoint: when it leaves, the
//! service is dropped once its in-flight requests finish, which closes its connections.
//!
//! [`Http`] is the factory most users want: a hyper-util client per endpoint, built from one
//! `hyper_util::client::legacy::Builder`, over a [`MakeConnector`]:
//! - [`Tcp`]: plaintext HTTP/1 and HTTP/2 (h2c with `http2_only`);
//! - [`Tls`] (feature `tls`): https and mTLS on rustls, with the
//!   server name per service or by a function, a configuration that can be replaced at run
//!   time, and typed [`TlsError`]s;
//! - any closure `Fn(Option<&EndpointTarget>) -> C` returning a hyper-util connector, for
//!   example hyper-rustls's `HttpsConnector` wrapped around [`EndpointTarget::dial`].
//!
//! [`Http2`] is the leaner choice for gRPC: one multiplexed HTTP/2 connection per endpoint,
//! shared by every request with no pool lookup (what tonic's `Channel` keeps).
//!
//! Any other per-endpoint service (a tonic `Channel` from an `Endpoint`, a tower stack)
//! plugs in through a closure `Fn(&EndpointTarget) -> S`.

mod dial;
mod http;
mod http2;
#[cfg(feature = "tls")]
mod tls;

pub use dial::{Dial, Tcp};
pub use http::{Http, HttpEndpoint, HttpFuture, MakeConnector};
pub use http2::{H2Endpoint, Http2};
#[cfg(feature = "tls")]
pub use tls::{MaybeTls, Tls, TlsConnect, TlsError, TlsStream};
#[cfg(feature = "tls")]
pub(crate) use tls::{TlsFate, explain as explain_tls};

use std::any::Any;
use std::fmt;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex, OnceLock};

use mcs_core::ClusterId;
use mcs_core::discovery::{Endpoint, Target};
use mcs_core::name::ServiceRef;

/// One endpoint of a ClusterSet service, as a [`MakeEndpoint`] sees it: where to connect and
/// which name the server should prove.
#[derive(Clone)]
pub struct EndpointTarget {
    endpoint: Endpoint,
    target: Target,
    host: Arc<str>,
}

impl EndpointTarget {
    pub(crate) fn new(endpoint: Endpoint, target: Target, host: Arc<str>) -> Self {
        Self {
            endpoint,
            target,
            host,
        }
    }

    /// The address to dial.
    pub fn addr(&self) -> SocketAddr {
        self.endpoint.addr
    }

    /// The cluster the endpoint runs in.
    pub fn cluster(&self) -> &ClusterId {
        &self.endpoint.cluster
    }

    /// The endpoint as discovery reported it when its service was made.
    pub fn endpoint(&self) -> &Endpoint {
        &self.endpoint
    }

    /// The service and port.
    pub fn target(&self) -> &Target {
        &self.target
    }

    /// The multi-cluster service.
    pub fn service(&self) -> &ServiceRef {
        &self.target.service
    }

    /// The service's ClusterSet name, `<service>.<namespace>.svc.<zone>` (lower case, no
    /// trailing dot): the name TLS verifies unless told otherwise.
    pub fn host(&self) -> &str {
        &self.host
    }

    /// A connector that dials this endpoint's address whatever host the URI names, with
    /// [`Tcp::new`]'s settings (`Tcp::from_connector(..).dial(target.addr())` for others).
    /// Wrap it in a TLS connector to keep the URI's host for SNI and verification.
    pub fn dial(&self) -> Dial {
        Tcp::new().dial(self.endpoint.addr)
    }
}

impl fmt::Debug for EndpointTarget {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("EndpointTarget")
            .field("service", &self.target.to_string())
            .field("addr", &self.endpoint.addr)
            .field("cluster", &self.endpoint.cluster.as_str())
            .field("host", &self.host)
            .finish()
    }
}

/// Makes the service that carries requests to one endpoint, and optionally the one for
/// hosts outside the ClusterSet zone.
///
/// Called once per endpoint, the first time a request goes there (not on the request path
/// after that). The service should own its connections (a client with its own pool), dial
/// [`EndpointTarget::addr`] and, for TLS, verify [`EndpointTarget::host`] or a name derived
/// from the target. It is cloned for every request, as hyper-util's client clones itself.
///
/// Closures `Fn(&EndpointTarget) -> S` are factories without a pass-through service.
pub trait MakeEndpoint: Send + Sync + 'static {
    /// The per-endpoint service (and the pass-through one).
    type Service: Clone + Send + Sync + 'static;

    /// The service for one endpoint.
    fn make_endpoint(&self, target: &EndpointTarget) -> Self::Service;

    /// The service for requests to hosts outside the ClusterSet zone (`cluster.local`
    /// included), made once per layered service. `None` (the default) fails such requests
    /// with [`Error::NoPassthrough`](crate::Error::NoPassthrough).
    fn make_passthrough(&self) -> Option<Self::Service> {
        None
    }
}

impl<F, S> MakeEndpoint for F
where
    F: Fn(&EndpointTarget) -> S + Send + Sync + 'static,
    S: Clone + Send + Sync + 'static,
{
    type Service = S;

    fn make_endpoint(&self, target: &EndpointTarget) -> S {
        self(target)
    }
}

/// A [`MakeEndpoint`] with a pass-through service for hosts outside the ClusterSet zone:
/// see [`with_passthrough`].
#[derive(Clone, Debug)]
pub struct WithPassthrough<M: MakeEndpoint> {
    make: M,
    passthrough: M::Service,
}

/// Adds a pass-through service to a factory (typically a closure), for requests to hosts
/// outside the ClusterSet zone.
pub fn with_passthrough<M: MakeEndpoint>(make: M, passthrough: M::Service) -> WithPassthrough<M> {
    WithPassthrough { make, passthrough }
}

impl<M: MakeEndpoint> MakeEndpoint for WithPassthrough<M> {
    type Service = M::Service;

    fn make_endpoint(&self, target: &EndpointTarget) -> M::Service {
        self.make.make_endpoint(target)
    }

    fn make_passthrough(&self) -> Option<M::Service> {
        Some(self.passthrough.clone())
    }
}

/// The services made for one endpoint: one per layered service ([`Mcs`](crate::Mcs))
/// that sent it a request. Kept in the target's endpoint table by address, so they are
/// dropped (and their connections closed) when discovery drops the endpoint and its last
/// in-flight request finishes.
#[derive(Default)]
pub(crate) struct Conns {
    /// The first owner's service: one atomic load and a type check on the request path.
    first: OnceLock<Slot>,
    /// Services of further owners (several `Mcs` made from one layer).
    more: Mutex<Vec<Slot>>,
}

struct Slot {
    owner: u64,
    service: Box<dyn Any + Send + Sync>,
}

impl Conns {
    /// The service of `owner` for this endpoint, made with `make` the first time.
    pub(crate) fn get_or_make<S: Clone + Send + Sync + 'static>(
        &self,
        owner: u64,
        make: impl FnOnce() -> S,
    ) -> S {
        if let Some(slot) = self.first.get()
            && slot.owner == owner
            && let Some(service) = slot.service.downcast_ref::<S>()
        {
            return service.clone();
        }
        self.slow(owner, make)
    }

    #[cold]
    fn slow<S: Clone + Send + Sync + 'static>(&self, owner: u64, make: impl FnOnce() -> S) -> S {
        let mut make = Some(make);
        let first = self.first.get_or_init(|| Slot {
            owner,
            // `make` is taken only here or below, once.
            service: Box::new((make.take().expect("unused"))()),
        });
        if first.owner == owner
            && let Some(service) = first.service.downcast_ref::<S>()
        {
            return service.clone();
        }
        let mut more = self.more.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(service) = more
            .iter()
            .filter(|s| s.owner == owner)
            .find_map(|s| s.service.downcast_ref::<S>())
        {
            return service.clone();
        }
        let Some(make) = make.take() else {
            // Unreachable: `make` was used only if `first` was initialised for `owner`,
            // which returned above (same owner means same service type).
            unreachable!("endpoint service made but not found");
        };
        let service = make();
        more.push(Slot {
            owner,
            service: Box::new(service.clone()),
        });
        service
    }
}

impl fmt::Debug for Conns {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let more = self.more.lock().map_or(0, |m| m.len());
        f.debug_struct("Conns")
            .field(
                "services",
                &(usize::from(self.first.get().is_some()) + more),
            )
            .finish()
    }
}
