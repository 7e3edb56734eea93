//! TLS and mTLS on rustls: [`Tls`] makes connectors, [`TlsConnect`] connects.

use std::collections::HashMap;
use std::error::Error as StdError;
use std::fmt;
use std::future::Future;
use std::io;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, OnceLock};
use std::task::{Context, Poll};

use arc_swap::ArcSwap;
use http::Uri;
use http::uri::Scheme;
use hyper::rt::{Read, ReadBufCursor, Write};
use hyper_util::client::legacy::connect::{Connected, Connection};
use hyper_util::rt::TokioIo;
use rustls::ClientConfig;
use rustls::pki_types::ServerName;
use tokio::io::{AsyncRead, AsyncWrite};
use tokio::net::TcpStream;
use tokio::sync::watch;
use tower::{BoxError, Service};
use tracing::debug;

use mcs_core::ClusterId;
use mcs_core::name::ServiceRef;

use super::EndpointTarget;
use super::dial::{Dial, Tcp};
use super::http::MakeConnector;
use crate::classify::FailureKind;
use crate::error::NotTaken;

type NameFn = dyn Fn(&EndpointTarget) -> String + Send + Sync;

/// TLS (and mTLS) for `https` requests, on rustls with your `ClientConfig`; `http` requests
/// on the same connectors stay plaintext.
///
/// For an endpoint of a ClusterSet service the connector dials the endpoint's address and
/// sends, as SNI, and verifies the certificate against, the service's server name:
///
/// 1. the name set for that service with [`Tls::server_name_for`], else
/// 2. the name the function given to [`Tls::server_name`] returns, else
/// 3. the ClusterSet name, `<service>.<namespace>.svc.clusterset.local`.
///
/// Hosts outside the ClusterSet are resolved and verified by the URI's host.
///
/// Client certificates (mTLS) come from the `ClientConfig`. [`Tls::store`] replaces the
/// configuration at run time (a renewed certificate, a new CA bundle): new connections use
/// it, established ones keep theirs. `Tls` is cheap to clone and clones share the
/// configuration, so keep one to renew with. ALPN comes from the configuration too: with
/// `alpn_protocols = [b"h2"]` a connection that negotiates `h2` is used as HTTP/2.
///
/// Handshake failures are [`TlsError`]s naming the endpoint, its cluster and the name
/// verified; the layer counts them as connect failures (retried on another endpoint when
/// retries are on, and counted towards outlier ejection).
#[derive(Clone)]
pub struct Tls {
    config: Arc<ArcSwap<ClientConfig>>,
    by_service: Arc<HashMap<ServiceRef, String>>,
    name_fn: Option<Arc<NameFn>>,
    tcp: Tcp,
}

impl Tls {
    /// TLS with this client configuration.
    pub fn new(config: impl Into<Arc<ClientConfig>>) -> Self {
        Self {
            config: Arc::new(ArcSwap::new(config.into())),
            by_service: Arc::default(),
            name_fn: None,
            tcp: Tcp::new(),
        }
    }

    /// The server name for `service`'s endpoints (for example its `cluster.local` name, or
    /// the DNS name in its certificate).
    #[must_use]
    pub fn server_name_for(mut self, service: ServiceRef, name: impl Into<String>) -> Self {
        Arc::make_mut(&mut self.by_service).insert(service, name.into());
        self
    }

    /// The server name of services without a [`Tls::server_name_for`] entry, as a function
    /// of the endpoint (for example `<service>.<namespace>.svc.cluster.local`).
    #[must_use]
    pub fn server_name(
        mut self,
        name: impl Fn(&EndpointTarget) -> String + Send + Sync + 'static,
    ) -> Self {
        self.name_fn = Some(Arc::new(name));
        self
    }

    /// The TCP settings under TLS.
    #[must_use]
    pub fn tcp(mut self, tcp: Tcp) -> Self {
        self.tcp = tcp;
        self
    }

    /// Replaces the configuration for new connections (and every clone's).
    pub fn store(&self, config: impl Into<Arc<ClientConfig>>) {
        self.config.store(config.into());
    }

    /// The configuration new connections use.
    pub fn config(&self) -> Arc<ClientConfig> {
        self.config.load_full()
    }

    /// The name an endpoint's certificate is verified against.
    pub fn name_for(&self, target: &EndpointTarget) -> String {
        if let Some(name) = self.by_service.get(target.service()) {
            return name.clone();
        }
        match &self.name_fn {
            Some(f) => f(target),
            None => target.host().to_owned(),
        }
    }
}

impl fmt::Debug for Tls {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Tls")
            .field("server_names", &self.by_service)
            .field("name_fn", &self.name_fn.is_some())
            .finish_non_exhaustive()
    }
}

impl MakeConnector for Tls {
    type Connector = TlsConnect;

    fn watches_connections(&self) -> bool {
        true
    }

    fn endpoint(&self, target: &EndpointTarget) -> TlsConnect {
        let name = self.name_for(target);
        TlsConnect {
            dial: self.tcp.dial(target.addr()),
            config: Arc::clone(&self.config),
            name: Some(Arc::from(name)),
            peer: Some((target.addr(), target.cluster().clone())),
        }
    }

    fn passthrough(&self) -> TlsConnect {
        TlsConnect {
            dial: self.tcp.resolve(),
            config: Arc::clone(&self.config),
            name: None,
            peer: None,
        }
    }
}

/// A connector (a `tower::Service<Uri>`, hyper-util's `Connect`) made by [`Tls`]: TCP to
/// the endpoint, then a TLS handshake for `https` URIs.
#[derive(Clone)]
pub struct TlsConnect {
    dial: Dial,
    config: Arc<ArcSwap<ClientConfig>>,
    /// The server name; `None` for pass-through (the URI's host).
    name: Option<Arc<str>>,
    /// The endpoint and its cluster, for errors.
    peer: Option<(SocketAddr, ClusterId)>,
}

impl fmt::Debug for TlsConnect {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("TlsConnect")
            .field("dial", &self.dial)
            .field("server_name", &self.name)
            .finish_non_exhaustive()
    }
}

impl Service<Uri> for TlsConnect {
    type Response = MaybeTls;
    type Error = BoxError;
    type Future = Pin<Box<dyn Future<Output = Result<MaybeTls, BoxError>> + Send>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), BoxError>> {
        self.dial.poll_ready(cx)
    }

    fn call(&mut self, uri: Uri) -> Self::Future {
        let https = uri.scheme() == Some(&Scheme::HTTPS);
        let name: Arc<str> = match &self.name {
            Some(name) => Arc::clone(name),
            None => Arc::from(
                uri.host()
                    .map(|h| h.trim_start_matches('[').trim_end_matches(']'))
                    .unwrap_or_default(),
            ),
        };
        let peer = self.peer.clone();
        let config = self.config.load_full();
        let tcp = self.dial.call(uri);
        Box::pin(async move {
            let tcp = tcp.await?;
            if !https {
                return Ok(MaybeTls::Plain(tcp));
            }
            let fail = |source: Box<dyn StdError + Send + Sync>| TlsError {
                peer: peer.clone(),
                server_name: name.to_string(),
                source,
            };
            let server_name =
                ServerName::try_from(name.to_string()).map_err(|e| fail(Box::new(e)))?;
            let tls = tokio_rustls::TlsConnector::from(config)
                .connect(server_name, tcp.into_inner())
                .await
                .map_err(|e| fail(unwrap_rustls(e)))?;
            Ok(MaybeTls::Tls(Box::new(TlsStream {
                io: TokioIo::new(Watched {
                    tls,
                    fate: TlsFate::new(peer, name),
                }),
            })))
        })
    }
}

/// The rustls error inside an I/O error, if there is one (tokio-rustls wraps them, and
/// `io::Error::source` skips the wrapped error itself).
fn unwrap_rustls(e: io::Error) -> Box<dyn StdError + Send + Sync> {
    match rustls_in(&e) {
        Some(rustls) => Box::new(rustls.clone()),
        None => Box::new(e),
    }
}

/// The rustls error an I/O error wraps, if any.
fn rustls_in(e: &io::Error) -> Option<&rustls::Error> {
    e.get_ref()
        .and_then(|inner| inner.downcast_ref::<rustls::Error>())
}

/// What a TLS connection met at its end: the first rustls error its reads or writes
/// returned. It rides in hyper-util's `Connected` extras, so that [`explain`] (and
/// [`Http2`](super::Http2)'s connections) can name it.
///
/// One `Arc`, so that the clone hyper-util copies into every response is cheap.
#[derive(Clone, Debug)]
pub(crate) struct TlsFate(Arc<Fate>);

#[derive(Debug)]
struct Fate {
    peer: Option<(SocketAddr, ClusterId)>,
    server_name: Arc<str>,
    error: OnceLock<rustls::Error>,
    /// Whether the server sent any application data. A TLS error before that means the
    /// server refused the connection in its handshake: it processed no request.
    answered: AtomicBool,
    /// Set when the connection's I/O is dropped: hyper's task for it has ended.
    closed: watch::Sender<bool>,
}

impl TlsFate {
    fn new(peer: Option<(SocketAddr, ClusterId)>, server_name: Arc<str>) -> Self {
        Self(Arc::new(Fate {
            peer,
            server_name,
            error: OnceLock::new(),
            answered: AtomicBool::new(false),
            closed: watch::Sender::new(false),
        }))
    }

    /// The fate of the connection described by `connected`, if it is one of ours.
    pub(crate) fn of(connected: &Connected) -> Option<Self> {
        let mut extras = http::Extensions::new();
        connected.get_extras(&mut extras);
        extras.remove::<TlsFate>()
    }

    /// Whether the connection met a TLS error.
    pub(crate) fn failed(&self) -> bool {
        self.0.error.get().is_some()
    }

    /// Whether the server has sent application data on the connection.
    pub(crate) fn answered(&self) -> bool {
        self.0.answered.load(Ordering::Relaxed)
    }

    /// Notes that the server sent application data. Cost: one relaxed load per read, one
    /// store per connection.
    fn answer(&self) {
        if !self.0.answered.load(Ordering::Relaxed) {
            self.0.answered.store(true, Ordering::Relaxed);
        }
    }

    /// Notes that the connection's I/O is gone.
    fn close(&self) {
        self.0.closed.send_replace(true);
    }

    /// Completes when the connection's I/O has been dropped: hyper's task for it has ended,
    /// and every request it took has its answer or its error.
    pub(crate) async fn closed(&self) {
        let mut closed = self.0.closed.subscribe();
        // The sender lives in `self`: `wait_for` ends when the value turns true.
        let _ = closed.wait_for(|closed| *closed).await;
    }

    /// The error of a request that the connection's task ended without taking: the
    /// connection's TLS error (the server refused it), or else that the connection closed
    /// before the request was sent.
    pub(crate) fn not_taken(&self) -> BoxError {
        match self.0.error.get() {
            Some(rustls) => Box::new(self.error(rustls.clone())),
            None => Box::new(NotTaken),
        }
    }

    fn error(&self, rustls: rustls::Error) -> TlsError {
        TlsError {
            peer: self.0.peer.clone(),
            server_name: self.0.server_name.to_string(),
            source: Box::new(rustls),
        }
    }

    /// Records the first rustls error, and returns every one as a [`TlsError`] inside the
    /// `io::Error` (same kind), so that whatever hyper makes of it names the endpoint and
    /// the cause.
    fn map<T>(&self, result: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        match result {
            Poll::Ready(Err(e)) => Poll::Ready(Err(self.map_err(e))),
            other => other,
        }
    }

    fn map_err(&self, e: io::Error) -> io::Error {
        match rustls_in(&e) {
            Some(rustls) => {
                // The first error is the cause; later ones follow from it.
                let _ = self.0.error.set(rustls.clone());
                io::Error::new(e.kind(), self.error(rustls.clone()))
            }
            None => e,
        }
    }

    /// Names the TLS error behind a request that a dead connection did not send.
    ///
    /// In TLS 1.3 the client's side of the handshake ends before the server has checked
    /// the client's certificate, so a refused (or missing) client certificate arrives as an
    /// alert on the first read after the handshake. If the connection's task reads it
    /// before the request is handed over, hyper fails the request with a bare "connection
    /// was not ready", "operation was canceled" or "channel closed" and drops the alert.
    /// (h2 also keeps only the text of the I/O error that ends a connection.) When this
    /// connection recorded a rustls error, such a request's error becomes a [`TlsError`]
    /// with that error as its source. Only errors that do not carry a TLS error already are
    /// changed, and only of requests that were not sent, or on a connection on which the
    /// server never sent data (it refused the connection: it processed nothing).
    pub(crate) fn explain(&self, err: BoxError) -> BoxError {
        let Some(rustls) = self.0.error.get() else {
            return err;
        };
        let refused = !self.0.answered.load(Ordering::Relaxed);
        if !(refused || FailureKind::of(&*err) == FailureKind::NotSent)
            || crate::error::chain(&*err).any(|e| e.is::<TlsError>())
        {
            return err;
        }
        debug!(error = %err, tls = %rustls, "the request was not sent: its TLS connection had failed");
        Box::new(self.error(rustls.clone()))
    }
}

/// [`TlsFate::explain`] for an error of hyper-util's client, which carries the connection's
/// `Connected`.
pub(crate) fn explain(err: BoxError) -> BoxError {
    let fate = err
        .downcast_ref::<hyper_util::client::legacy::Error>()
        .and_then(|e| e.connect_info())
        .and_then(TlsFate::of);
    match fate {
        Some(fate) => fate.explain(err),
        None => err,
    }
}

/// A TLS handshake that failed: the endpoint, its cluster, the server name verified and why.
///
/// In TLS 1.3 this includes a client certificate the server refused after the client's
/// side of the handshake had ended (see [`TlsConnect`]'s connections).
#[derive(Debug)]
pub struct TlsError {
    peer: Option<(SocketAddr, ClusterId)>,
    server_name: String,
    source: Box<dyn StdError + Send + Sync>,
}

impl TlsError {
    /// The endpoint's address (`None` for a host outside the ClusterSet).
    pub fn endpoint(&self) -> Option<SocketAddr> {
        self.peer.as_ref().map(|p| p.0)
    }

    /// The endpoint's cluster (`None` for a host outside the ClusterSet).
    pub fn cluster(&self) -> Option<&ClusterId> {
        self.peer.as_ref().map(|p| &p.1)
    }

    /// The name sent as SNI and verified against the certificate.
    pub fn server_name(&self) -> &str {
        &self.server_name
    }

    /// The rustls error, when rustls refused the handshake (a certificate for another name,
    /// an unknown CA, an expired certificate, a refused client certificate, ...).
    pub fn rustls(&self) -> Option<&rustls::Error> {
        self.source.downcast_ref()
    }
}

impl TlsError {
    /// Why the handshake failed, in a few words, starting with `TLS: `.
    pub(crate) fn reason(&self) -> String {
        use rustls::{AlertDescription as Alert, CertificateError as Cert, Error as E};
        let Some(rustls) = self.rustls() else {
            return format!("TLS: {}", self.source);
        };
        let name = &self.server_name;
        match rustls {
            E::AlertReceived(Alert::CertificateRequired) => {
                "TLS: certificate required by the server (the client sent none)".to_owned()
            }
            E::AlertReceived(
                alert @ (Alert::BadCertificate
                | Alert::UnsupportedCertificate
                | Alert::CertificateRevoked
                | Alert::CertificateExpired
                | Alert::CertificateUnknown
                | Alert::UnknownCA
                | Alert::AccessDenied),
            ) => format!("TLS: client certificate refused by the server ({alert:?})"),
            E::AlertReceived(alert) => format!("TLS: the server refused the handshake ({alert:?})"),
            E::InvalidCertificate(Cert::NotValidForName | Cert::NotValidForNameContext { .. }) => {
                format!("TLS: certificate not valid for {name}")
            }
            E::InvalidCertificate(Cert::Expired | Cert::ExpiredContext { .. }) => {
                "TLS: certificate expired".to_owned()
            }
            E::InvalidCertificate(Cert::NotValidYet | Cert::NotValidYetContext { .. }) => {
                "TLS: certificate not valid yet".to_owned()
            }
            E::InvalidCertificate(Cert::UnknownIssuer) => {
                "TLS: certificate issued by an unknown CA".to_owned()
            }
            E::InvalidCertificate(Cert::Revoked) => "TLS: certificate revoked".to_owned(),
            other => format!("TLS: {other}"),
        }
    }
}

impl fmt::Display for TlsError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.reason())?;
        match &self.peer {
            Some((addr, cluster)) => write!(
                f,
                " (endpoint {addr} in cluster {cluster}, server name {:?})",
                self.server_name
            ),
            None => write!(f, " (server name {:?})", self.server_name),
        }
    }
}

impl StdError for TlsError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// A connection made by [`TlsConnect`]: TLS for `https`, plain TCP for `http`.
#[derive(Debug)]
pub enum MaybeTls {
    /// Plain TCP.
    Plain(TokioIo<TcpStream>),
    /// TLS over TCP.
    Tls(Box<TlsStream>),
}

/// A TLS connection made by [`TlsConnect`]. It remembers the first rustls error it met
/// (such as the server's alert refusing the client certificate), so that a request the
/// dead connection could not send still fails with that error, and returns every rustls
/// error as a [`TlsError`] inside the `io::Error`.
#[derive(Debug)]
pub struct TlsStream {
    io: TokioIo<Watched>,
}

impl TlsStream {
    /// The tokio-rustls stream: the TCP stream and the rustls client connection.
    pub fn get_ref(&self) -> &tokio_rustls::client::TlsStream<TcpStream> {
        &self.io.inner().tls
    }
}

/// The tokio-rustls stream and what it met.
#[derive(Debug)]
struct Watched {
    tls: tokio_rustls::client::TlsStream<TcpStream>,
    fate: TlsFate,
}

impl Watched {
    /// The result of a write-side operation, its rustls error mapped (see
    /// [`TlsFate::map`]).
    ///
    /// A write that fails because the server reset or closed the connection may hide the
    /// reason the server sent before closing: a TLS 1.3 server that refuses the client's
    /// certificate sends its alert and closes, and a request written meanwhile meets the
    /// reset. Then what the server sent is read, and if it holds a TLS alert, the write
    /// fails with it. Cost: nothing unless a write fails.
    fn written<T>(
        &mut self,
        cx: &mut Context<'_>,
        result: Poll<io::Result<T>>,
    ) -> Poll<io::Result<T>> {
        if let Poll::Ready(Err(e)) = &result
            && !self.fate.failed()
            && rustls_in(e).is_none()
            && matches!(
                e.kind(),
                io::ErrorKind::BrokenPipe
                    | io::ErrorKind::ConnectionReset
                    | io::ErrorKind::ConnectionAborted
            )
            && let Some(alert) = self.read_alert(cx)
        {
            return Poll::Ready(Err(self.fate.map_err(alert)));
        }
        self.fate.map(result)
    }

    /// Reads what the server sent, up to the first error carrying a rustls error (the
    /// connection is dead: the data is of no use to anyone).
    fn read_alert(&mut self, cx: &mut Context<'_>) -> Option<io::Error> {
        let mut scratch = [0u8; 1024];
        // Bounded: a few records' worth of whatever came before the alert.
        for _ in 0..16 {
            let mut buf = tokio::io::ReadBuf::new(&mut scratch);
            match Pin::new(&mut self.tls).poll_read(cx, &mut buf) {
                Poll::Ready(Ok(())) if !buf.filled().is_empty() => {}
                Poll::Ready(Err(e)) if rustls_in(&e).is_some() => return Some(e),
                _ => return None,
            }
        }
        None
    }
}

impl Drop for Watched {
    fn drop(&mut self) {
        self.fate.close();
    }
}

impl AsyncRead for Watched {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &mut tokio::io::ReadBuf<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let before = buf.filled().len();
        let result = this.fate.map(Pin::new(&mut this.tls).poll_read(cx, buf));
        if buf.filled().len() > before {
            this.fate.answer();
        }
        result
    }
}

impl AsyncWrite for Watched {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.tls).poll_write(cx, buf);
        this.written(cx, result)
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.tls).poll_write_vectored(cx, bufs);
        this.written(cx, result)
    }

    fn is_write_vectored(&self) -> bool {
        self.tls.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.tls).poll_flush(cx);
        this.written(cx, result)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        this.fate.map(Pin::new(&mut this.tls).poll_shutdown(cx))
    }
}

impl Connection for MaybeTls {
    fn connected(&self) -> Connected {
        match self {
            Self::Plain(tcp) => tcp.connected(),
            Self::Tls(tls) => {
                let (tcp, session) = tls.get_ref().get_ref();
                // hyper-util copies the extras into every response: one Arc clone.
                let connected = tcp.connected().extra(tls.io.inner().fate.clone());
                if session.alpn_protocol() == Some(b"h2") {
                    connected.negotiated_h2()
                } else {
                    connected
                }
            }
        }
    }
}

impl Read for MaybeTls {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_read(cx, buf),
            Self::Tls(s) => Pin::new(&mut s.io).poll_read(cx, buf),
        }
    }
}

impl Write for MaybeTls {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write(cx, buf),
            Self::Tls(s) => Pin::new(&mut s.io).poll_write(cx, buf),
        }
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_flush(cx),
            Self::Tls(s) => Pin::new(&mut s.io).poll_flush(cx),
        }
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_shutdown(cx),
            Self::Tls(s) => Pin::new(&mut s.io).poll_shutdown(cx),
        }
    }

    fn is_write_vectored(&self) -> bool {
        match self {
            Self::Plain(s) => s.is_write_vectored(),
            Self::Tls(s) => s.io.is_write_vectored(),
        }
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        match self.get_mut() {
            Self::Plain(s) => Pin::new(s).poll_write_vectored(cx, bufs),
            Self::Tls(s) => Pin::new(&mut s.io).poll_write_vectored(cx, bufs),
        }
    }
}

#[cfg(test)]
pub(crate) mod test_fate {
    //! Connection fates without connections, for the tests of what is decided from them.
    use super::*;

    /// A fresh connection's fate: no error, nothing answered, open.
    pub(crate) fn fresh() -> TlsFate {
        TlsFate::new(
            Some((
                "127.10.0.1:9443".parse().unwrap(),
                ClusterId::new("east").unwrap(),
            )),
            Arc::from("loyalty-accrual.loyalty.svc.clusterset.local"),
        )
    }

    /// The server refused the client certificate (TLS 1.3: an alert after the handshake).
    pub(crate) fn refuse(fate: &TlsFate) {
        let alert = rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired);
        let _ = fate.map_err(io::Error::new(io::ErrorKind::InvalidData, alert));
    }

    /// The server sent data.
    pub(crate) fn answer(fate: &TlsFate) {
        fate.answer();
    }

    /// The connection's I/O is dropped.
    pub(crate) fn close(fate: &TlsFate) {
        fate.close();
    }
}
