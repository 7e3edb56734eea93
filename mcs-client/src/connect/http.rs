//! [`Http`]: a hyper-util client per endpoint.

use std::fmt;
use std::marker::PhantomData;

use hyper_util::client::legacy::connect::Connect;
use hyper_util::client::legacy::{Builder, Client};

use super::{EndpointTarget, MakeEndpoint, Tcp};

/// Makes hyper-util connectors: one per endpoint, and one for hosts outside the ClusterSet.
///
/// Implemented by [`Tcp`], [`Tls`](super::Tls) and closures
/// `Fn(Option<&EndpointTarget>) -> C` (`None` asks for the pass-through connector), which is
/// how a hyper-rustls `HttpsConnector` plugs in:
///
/// ```no_run
/// # fn f(config: rustls::ClientConfig) {
/// use http_body_util::Empty;
/// use hyper::body::Bytes;
/// use hyper_rustls::HttpsConnectorBuilder;
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::TokioExecutor;
/// use mcs_client::connect::{Dial, EndpointTarget, Http};
///
/// let connect = move |target: Option<&EndpointTarget>| {
///     HttpsConnectorBuilder::new()
///         .with_tls_config(config.clone())
///         .https_or_http()
///         .enable_http1()
///         // SNI and verification use the URI's host: the service's ClusterSet name.
///         .wrap_connector(target.map_or_else(Dial::resolve, EndpointTarget::dial))
/// };
/// let http: Http<_, Empty<Bytes>> =
///     Http::with_connector(Client::builder(TokioExecutor::new()), connect);
/// # }
/// ```
pub trait MakeConnector: Send + Sync + 'static {
    /// The connector.
    type Connector: Connect + Clone + Send + Sync + 'static;

    /// A connector that dials `target`'s address.
    fn endpoint(&self, target: &EndpointTarget) -> Self::Connector;

    /// A connector for hosts outside the ClusterSet zone: resolves the URI's host.
    fn passthrough(&self) -> Self::Connector;
}

impl<F, C> MakeConnector for F
where
    F: Fn(Option<&EndpointTarget>) -> C + Send + Sync + 'static,
    C: Connect + Clone + Send + Sync + 'static,
{
    type Connector = C;

    fn endpoint(&self, target: &EndpointTarget) -> C {
        self(Some(target))
    }

    fn passthrough(&self) -> C {
        self(None)
    }
}

/// A [`MakeEndpoint`] that gives every endpoint its own hyper-util client (so its own
/// connection pool), all built from one `Builder`, over connectors from a
/// [`MakeConnector`]; hosts outside the ClusterSet go through one more client built the
/// same way.
///
/// `B` is the request body type, usually inferred from the requests sent.
///
/// ```no_run
/// use http_body_util::Empty;
/// use hyper::body::Bytes;
/// use hyper_util::client::legacy::Client;
/// use hyper_util::rt::{TokioExecutor, TokioTimer};
/// use mcs_client::connect::Http;
///
/// let http: Http<_, Empty<Bytes>> = Http::new(
///     Client::builder(TokioExecutor::new())
///         .pool_timer(TokioTimer::new())
///         .pool_idle_timeout(std::time::Duration::from_secs(30))
///         .clone(),
/// );
/// ```
pub struct Http<C, B> {
    builder: Builder,
    connect: C,
    _body: PhantomData<fn(B)>,
}

impl<B> Http<Tcp, B> {
    /// Plaintext clients built by `builder` ([`Tcp`] connectors).
    pub fn new(builder: Builder) -> Self {
        Self::with_connector(builder, Tcp::new())
    }
}

impl<C, B> Http<C, B> {
    /// Clients built by `builder` over connectors made by `connect`.
    pub fn with_connector(builder: Builder, connect: C) -> Self {
        Self {
            builder,
            connect,
            _body: PhantomData,
        }
    }

    /// The client builder.
    pub fn builder(&self) -> &Builder {
        &self.builder
    }

    /// The connector maker.
    pub fn connector(&self) -> &C {
        &self.connect
    }
}

impl<C: Clone, B> Clone for Http<C, B> {
    fn clone(&self) -> Self {
        Self {
            builder: self.builder.clone(),
            connect: self.connect.clone(),
            _body: PhantomData,
        }
    }
}

impl<C, B> fmt::Debug for Http<C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Http")
            .field("builder", &self.builder)
            .finish_non_exhaustive()
    }
}

impl<C, B> MakeEndpoint for Http<C, B>
where
    C: MakeConnector,
    B: http_body::Body + Send + 'static,
    B::Data: Send,
{
    type Service = Client<C::Connector, B>;

    fn make_endpoint(&self, target: &EndpointTarget) -> Self::Service {
        self.builder.build(self.connect.endpoint(target))
    }

    fn make_passthrough(&self) -> Option<Self::Service> {
        Some(self.builder.build(self.connect.passthrough()))
    }
}
