//! [`Http2`]: one multiplexed HTTP/2 connection per endpoint, for gRPC.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};

use arc_swap::ArcSwapOption;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2::{self, SendRequest};
use hyper_util::rt::TokioExecutor;
use tower::{BoxError, Service, ServiceExt};
use tracing::debug;

use super::{EndpointTarget, MakeConnector, MakeEndpoint};

/// A [`MakeEndpoint`] for HTTP/2 only (gRPC): each endpoint gets one multiplexed connection,
/// made on its first request over a connector from a [`MakeConnector`] ([`Tcp`](super::Tcp)
/// for h2c, [`Tls`](super::Tls) with ALPN `h2`), shared by all its requests with no pool
/// lookup, and made again when it closes.
///
/// This is what tonic's `Channel` keeps per endpoint; hyper-util's pooled client
/// ([`Http`](super::Http) with `http2_only`) works too, with a pool checkout (a lock) per
/// request. There is no pass-through service: gRPC clients call one origin.
///
/// ```no_run
/// # #[cfg(feature = "tls")]
/// # fn f(mut config: rustls::ClientConfig) {
/// use hyper::client::conn::http2;
/// use hyper_util::rt::{TokioExecutor, TokioTimer};
/// use mcs_client::connect::{Http2, Tls};
///
/// config.alpn_protocols = vec![b"h2".to_vec()];
/// let mut builder = http2::Builder::new(TokioExecutor::new());
/// builder.timer(TokioTimer::new()).keep_alive_interval(std::time::Duration::from_secs(30));
/// let h2: Http2<Tls, tonic::body::Body> = Http2::new(builder, Tls::new(config));
/// # }
/// ```
pub struct Http2<C, B> {
    builder: http2::Builder<TokioExecutor>,
    connect: C,
    _body: PhantomData<fn(B)>,
}

impl<C, B> Http2<C, B> {
    /// Connections handshaken by `builder`, over connectors made by `connect`.
    pub fn new(builder: http2::Builder<TokioExecutor>, connect: C) -> Self {
        Self {
            builder,
            connect,
            _body: PhantomData,
        }
    }
}

impl<C: Clone, B> Clone for Http2<C, B> {
    fn clone(&self) -> Self {
        Self {
            builder: self.builder.clone(),
            connect: self.connect.clone(),
            _body: PhantomData,
        }
    }
}

impl<C, B> fmt::Debug for Http2<C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Http2").finish_non_exhaustive()
    }
}

impl<C, B, T> MakeEndpoint for Http2<C, B>
where
    C: MakeConnector,
    C::Connector: Service<Uri, Response = T>,
    <C::Connector as Service<Uri>>::Error: Into<BoxError>,
    <C::Connector as Service<Uri>>::Future: Send,
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Service = H2Endpoint<C::Connector, B>;

    fn make_endpoint(&self, target: &EndpointTarget) -> Self::Service {
        H2Endpoint {
            inner: Arc::new(Inner {
                connector: self.connect.endpoint(target),
                builder: self.builder.clone(),
                current: ArcSwapOption::empty(),
                connecting: tokio::sync::Mutex::new(()),
            }),
        }
    }
}

/// One endpoint's HTTP/2 connection, made by [`Http2`].
pub struct H2Endpoint<C, B> {
    inner: Arc<Inner<C, B>>,
}

struct Inner<C, B> {
    connector: C,
    builder: http2::Builder<TokioExecutor>,
    /// The open connection's request handle.
    current: ArcSwapOption<SendRequest<B>>,
    /// Held while connecting, so concurrent first requests share one connection.
    connecting: tokio::sync::Mutex<()>,
}

impl<C, B> Clone for H2Endpoint<C, B> {
    fn clone(&self) -> Self {
        Self {
            inner: Arc::clone(&self.inner),
        }
    }
}

impl<C, B> fmt::Debug for H2Endpoint<C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("H2Endpoint")
            .field("connected", &self.inner.current.load().is_some())
            .finish()
    }
}

impl<C, B, T> Service<Request<B>> for H2Endpoint<C, B>
where
    C: Service<Uri, Response = T> + Clone + Send + Sync + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send,
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response<Incoming>;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<Response<Incoming>, BoxError>> + Send>>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let inner = Arc::clone(&self.inner);
        Box::pin(async move {
            // Cost once connected: one lock-free load and a handle clone.
            let mut sender = match inner.current.load_full() {
                Some(sender) if !sender.is_closed() => SendRequest::clone(&sender),
                _ => inner.connect(req.uri()).await?,
            };
            sender.ready().await?;
            Ok(sender.send_request(req).await?)
        })
    }
}

impl<C, B, T> Inner<C, B>
where
    C: Service<Uri, Response = T> + Clone + Send + Sync + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send,
    T: hyper::rt::Read + hyper::rt::Write + Unpin + Send + 'static,
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// The open connection, or a new one.
    async fn connect(&self, uri: &Uri) -> Result<SendRequest<B>, BoxError> {
        let _connecting = self.connecting.lock().await;
        if let Some(sender) = self.current.load_full()
            && !sender.is_closed()
        {
            return Ok(SendRequest::clone(&sender));
        }
        let io = self
            .connector
            .clone()
            .oneshot(uri.clone())
            .await
            .map_err(Into::into)?;
        let (sender, connection) = self.builder.handshake(io).await?;
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                debug!(error = %e, "HTTP/2 connection ended");
            }
        });
        self.current.store(Some(Arc::new(sender.clone())));
        Ok(sender)
    }
}
