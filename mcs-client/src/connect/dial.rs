//! Plain TCP: [`Tcp`] makes connectors, [`Dial`] connects.

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::task::{Context, Poll};

use http::Uri;
use http::uri::{Authority, Scheme};
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::client::legacy::connect::dns::GaiResolver;
use hyper_util::rt::TokioIo;
use tokio::net::TcpStream;
use tower::{BoxError, Service};

use super::EndpointTarget;
use super::http::MakeConnector;

/// Plaintext connections (HTTP/1, or HTTP/2 prior knowledge with the client builder's
/// `http2_only`), on hyper-util's `HttpConnector` with `TCP_NODELAY` on.
///
/// As a [`MakeConnector`], it makes a [`Dial`] per endpoint that connects to the endpoint's
/// address, and a resolving one for hosts outside the ClusterSet.
#[derive(Clone)]
pub struct Tcp {
    http: HttpConnector<GaiResolver>,
}

impl Tcp {
    /// Default settings, `TCP_NODELAY` on.
    pub fn new() -> Self {
        let mut http = HttpConnector::new();
        http.set_nodelay(true);
        Self::from_connector(http)
    }

    /// These socket settings (timeouts, keepalive, local address, ...). The connector may
    /// accept `https` URIs (`enforce_http(false)` is set): a TLS connector wraps it.
    pub fn from_connector(mut http: HttpConnector<GaiResolver>) -> Self {
        http.enforce_http(false);
        Self { http }
    }

    /// A connector that dials `addr` whatever host the URI names.
    pub fn dial(&self, addr: SocketAddr) -> Dial {
        Dial {
            http: self.http.clone(),
            addr: Some(addr),
        }
    }

    /// A connector that resolves and dials the URI's host, as hyper-util's does.
    pub fn resolve(&self) -> Dial {
        Dial {
            http: self.http.clone(),
            addr: None,
        }
    }
}

impl Default for Tcp {
    fn default() -> Self {
        Self::new()
    }
}

impl fmt::Debug for Tcp {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tcp").finish_non_exhaustive()
    }
}

impl MakeConnector for Tcp {
    type Connector = Dial;

    fn endpoint(&self, target: &EndpointTarget) -> Dial {
        self.dial(target.addr())
    }

    fn passthrough(&self) -> Dial {
        self.resolve()
    }
}

/// A TCP connector (a `tower::Service<Uri>`, hyper-util's `Connect`) that dials one
/// endpoint's address, or resolves the URI's host when made by [`Tcp::resolve`].
///
/// The URI's host is left to the layers above: a TLS connector around a `Dial` still sends
/// it as SNI and verifies the certificate against it.
#[derive(Clone)]
pub struct Dial {
    http: HttpConnector<GaiResolver>,
    addr: Option<SocketAddr>,
}

impl Dial {
    /// A connector that resolves and dials the URI's host, with [`Tcp::new`]'s settings.
    pub fn resolve() -> Self {
        Tcp::new().resolve()
    }

    /// The address it dials, if it is bound to one endpoint.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }
}

impl fmt::Debug for Dial {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Dial").field("addr", &self.addr).finish()
    }
}

impl Service<Uri> for Dial {
    type Response = TokioIo<TcpStream>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.http.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let dst = match self.addr {
            // Cost: one small allocation per new connection, never per request.
            Some(addr) => {
                let mut parts = http::uri::Parts::default();
                parts.scheme = Some(Scheme::HTTP);
                parts.authority = Authority::try_from(addr.to_string()).ok();
                parts.path_and_query = Some(http::uri::PathAndQuery::from_static("/"));
                match Uri::from_parts(parts) {
                    Ok(dst) => dst,
                    Err(e) => return Box::pin(std::future::ready(Err(e.into()))),
                }
            }
            None => uri,
        };
        let fut = self.http.call(dst);
        Box::pin(async move { fut.await.map_err(Into::into) })
    }
}
