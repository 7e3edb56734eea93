//! [`Http`]: a hyper-util client per endpoint.

use std::fmt;
use std::future::Future;
use std::marker::PhantomData;
use std::pin::Pin;
use std::task::{Context, Poll};

use hyper_util::client::legacy::connect::Connect;
#[cfg(feature = "tls")]
use hyper_util::client::legacy::connect::capture_connection;
use hyper_util::client::legacy::{Builder, Client, ResponseFuture};
use pin_project_lite::pin_project;
use tower::{BoxError, Service};

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

    /// Whether the connections carry mcs's record of how they ended ([`Tls`](super::Tls)'s
    /// do), so that [`HttpEndpoint`] can fail a request that a dead connection never took.
    #[doc(hidden)]
    fn watches_connections(&self) -> bool {
        false
    }
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
    type Service = HttpEndpoint<C::Connector, B>;

    fn make_endpoint(&self, target: &EndpointTarget) -> Self::Service {
        HttpEndpoint {
            client: self.builder.build(self.connect.endpoint(target)),
            watch: self.connect.watches_connections(),
        }
    }

    fn make_passthrough(&self) -> Option<Self::Service> {
        Some(HttpEndpoint {
            client: self.builder.build(self.connect.passthrough()),
            watch: self.connect.watches_connections(),
        })
    }
}

/// The service [`Http`] makes for an endpoint: its hyper-util client.
///
/// Over [`Tls`](super::Tls) connectors it also watches the connection each request goes
/// to. hyper-util hands a request to a connection's task through a channel; if the task
/// ends just as the request is put in (a TLS 1.3 server refusing the client certificate
/// ends it right after the handshake), the request is never taken, and hyper-util's
/// request future, which holds the connection's handle, would wait for it forever. Such a
/// request fails instead: with the connection's [`TlsError`](super::TlsError), or as closed
/// before it was sent. Cost with TLS: one capture of the connection per request (hyper-util's
/// `capture_connection`) and a boxed future; none over other connectors.
pub struct HttpEndpoint<C, B> {
    client: Client<C, B>,
    watch: bool,
}

impl<C, B> HttpEndpoint<C, B> {
    /// The hyper-util client.
    pub fn client(&self) -> &Client<C, B> {
        &self.client
    }
}

impl<C: Clone, B> Clone for HttpEndpoint<C, B> {
    fn clone(&self) -> Self {
        Self {
            client: self.client.clone(),
            watch: self.watch,
        }
    }
}

impl<C, B> fmt::Debug for HttpEndpoint<C, B> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpEndpoint")
            .field("watch", &self.watch)
            .finish_non_exhaustive()
    }
}

type Response = http::Response<hyper::body::Incoming>;

impl<C, B> Service<http::Request<B>> for HttpEndpoint<C, B>
where
    C: Connect + Clone + Send + Sync + 'static,
    B: http_body::Body + Send + 'static + Unpin,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    type Response = Response;
    type Error = BoxError;
    type Future = HttpFuture;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, request: http::Request<B>) -> HttpFuture {
        #[cfg(feature = "tls")]
        if self.watch {
            let mut request = request;
            let mut capture = capture_connection(&mut request);
            let response = self.client.request(request);
            let connection = async move {
                let connected = capture.wait_for_connection_metadata().await;
                connected.as_ref().and_then(super::TlsFate::of)
            };
            return HttpFuture {
                inner: Inner::Watched {
                    future: Box::pin(watched(response, connection)),
                },
            };
        }
        HttpFuture {
            inner: Inner::Plain {
                future: self.client.request(request),
            },
        }
    }
}

pin_project! {
    /// The response future of [`HttpEndpoint`].
    pub struct HttpFuture {
        #[pin]
        inner: Inner,
    }
}

pin_project! {
    #[project = InnerProj]
    enum Inner {
        // hyper-util's future.
        Plain { #[pin] future: ResponseFuture },
        // hyper-util's future, and the watch on its connection.
        Watched { future: Pin<Box<dyn Future<Output = Result<Response, BoxError>> + Send>> },
    }
}

impl fmt::Debug for HttpFuture {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("HttpFuture").finish_non_exhaustive()
    }
}

impl Future for HttpFuture {
    type Output = Result<Response, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        match self.project().inner.project() {
            InnerProj::Plain { future } => future.poll(cx).map_err(Into::into),
            InnerProj::Watched { future } => future.as_mut().poll(cx),
        }
    }
}

/// `response`, failed with the connection's error if the connection's task ends without
/// taking the request; `connection` is the connection's fate once hyper-util has chosen
/// it (it never completes if no connection is made).
///
/// When a connection's I/O is dropped, hyper's task for it has ended and has answered or
/// failed every request it took, so a request still waiting was never taken. That holds
/// only while hyper-util cannot be retrying the request on another connection, which it
/// does only for connections from its pool, reused after a response: a connection on which
/// the server never sent data was not reused. On a connection that did answer, the request
/// is left to hyper-util.
#[cfg(feature = "tls")]
async fn watched<T, E>(
    response: impl Future<Output = Result<T, E>>,
    connection: impl Future<Output = Option<super::TlsFate>>,
) -> Result<T, BoxError>
where
    E: Into<BoxError>,
{
    let mut response = std::pin::pin!(response);
    let fate = tokio::select! {
        biased;
        result = &mut response => return result.map_err(Into::into),
        fate = connection => fate,
    };
    let Some(fate) = fate else {
        return response.await.map_err(Into::into);
    };
    tokio::select! {
        biased;
        result = &mut response => return result.map_err(Into::into),
        () = fate.closed() => {}
    }
    // `select!` polled `response` once more after the close woke this task.
    if fate.answered() {
        return response.await.map_err(Into::into);
    }
    tracing::debug!("the connection ended without taking the request");
    Err(fate.not_taken())
}

#[cfg(all(test, feature = "tls"))]
mod tests {
    use std::future::{pending, ready};

    use super::super::TlsError;
    use super::super::tls::test_fate;
    use super::*;
    use crate::Failure;
    use crate::classify::FailureKind;

    type Answer = Result<&'static str, std::io::Error>;

    #[tokio::test]
    async fn a_request_the_refused_connection_never_took_fails_with_its_tls_error() {
        let fate = test_fate::fresh();
        test_fate::refuse(&fate);
        test_fate::close(&fate);
        let err = watched(pending::<Answer>(), ready(Some(fate)))
            .await
            .unwrap_err();
        let tls = Failure::of(&*err).tls().expect("a TlsError");
        assert!(err.is::<TlsError>());
        assert_eq!(tls.endpoint(), Some("127.10.0.1:9443".parse().unwrap()));
        assert_eq!(
            FailureKind::of(&*err),
            FailureKind::Connect,
            "not processed"
        );
    }

    #[tokio::test]
    async fn a_request_a_silent_connection_never_took_was_not_sent() {
        let fate = test_fate::fresh();
        let closing = fate.clone();
        let waiting = tokio::spawn(watched(pending::<Answer>(), ready(Some(fate))));
        // The connection's task ends later, without an error the client could read.
        tokio::task::yield_now().await;
        test_fate::close(&closing);
        let err = waiting.await.unwrap().unwrap_err();
        assert!(
            matches!(Failure::of(&*err), Failure::ConnectionClosed),
            "{err}"
        );
        assert_eq!(FailureKind::of(&*err), FailureKind::NotSent);
        assert_eq!(
            err.to_string(),
            "connection closed before the request was sent"
        );
    }

    #[tokio::test]
    async fn an_answer_is_never_replaced() {
        let fate = test_fate::fresh();
        test_fate::refuse(&fate);
        test_fate::close(&fate);
        let answer: Answer = Ok("200");
        let result = watched(ready(answer), ready(Some(fate))).await;
        assert_eq!(result.unwrap(), "200");
    }

    #[tokio::test]
    async fn a_connection_that_answered_before_is_left_to_hyper_util() {
        // hyper-util may be retrying the request on a new connection: wait for it.
        let fate = test_fate::fresh();
        test_fate::answer(&fate);
        test_fate::close(&fate);
        let (tx, rx) = tokio::sync::oneshot::channel::<Answer>();
        let waiting = tokio::spawn(watched(async move { rx.await.unwrap() }, ready(Some(fate))));
        tokio::task::yield_now().await;
        assert!(!waiting.is_finished());
        tx.send(Ok("200 from the retry")).unwrap();
        assert_eq!(waiting.await.unwrap().unwrap(), "200 from the retry");
    }

    #[tokio::test]
    async fn without_a_fate_the_request_is_left_to_hyper_util() {
        let answer: Answer = Ok("200");
        let (tx, rx) = tokio::sync::oneshot::channel::<Answer>();
        let waiting = tokio::spawn(watched(async move { rx.await.unwrap() }, ready(None)));
        tx.send(answer).unwrap();
        assert_eq!(waiting.await.unwrap().unwrap(), "200");
    }
}
