//! [`Http2`]: one multiplexed HTTP/2 connection per endpoint, for gRPC.

use std::fmt;
use std::future::Future;
use std::io;
use std::marker::PhantomData;
use std::pin::Pin;
use std::sync::{Arc, Weak};
use std::task::{Context, Poll};

use arc_swap::ArcSwapOption;
use http::{Request, Response, Uri};
use hyper::body::Incoming;
use hyper::client::conn::http2::{self, SendRequest};
use hyper::rt::ReadBufCursor;
use hyper_util::client::legacy::connect::Connection;
use hyper_util::rt::TokioExecutor;
use tower::{BoxError, Service, ServiceExt};
use tracing::debug;

use super::{EndpointTarget, MakeConnector, MakeEndpoint};

/// A [`MakeEndpoint`] for HTTP/2 only (gRPC): each endpoint gets one multiplexed connection,
/// made on its first request over a connector from a [`MakeConnector`] ([`Tcp`](super::Tcp)
/// for h2c, [`Tls`](super::Tls) with ALPN `h2`), shared by all its requests with no pool
/// lookup, and made again when it closes.
///
/// When a write fails because the server reset the connection, the connection still reads
/// what the server sent before the reset: the responses it finished and its GOAWAY, so that
/// the streams it did not process can go to another endpoint (h2 alone would fail them all).
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
    T: hyper::rt::Read + hyper::rt::Write + Connection + Unpin + Send + 'static,
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
                current: Arc::new(ArcSwapOption::empty()),
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
    /// The open connection; its task clears it when the connection ends.
    current: Arc<ArcSwapOption<Conn<B>>>,
    /// Held while connecting, so concurrent first requests share one connection.
    connecting: tokio::sync::Mutex<()>,
}

/// An open connection: its request handle and what its TLS layer met.
struct Conn<B> {
    sender: SendRequest<B>,
    #[cfg(feature = "tls")]
    fate: Option<super::TlsFate>,
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
    T: hyper::rt::Read + hyper::rt::Write + Connection + Unpin + Send + 'static,
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
            let conn = match inner.current.load_full() {
                Some(conn) if !conn.sender.is_closed() => conn,
                _ => inner.connect(req.uri()).await?,
            };
            let conn_ref = ConnRef::of(&conn);
            let mut sender = SendRequest::clone(&conn.sender);
            // Only the cache and requests being handed over hold the connection's handle
            // (see `Inner::connect`).
            drop(conn);
            let sent = async {
                sender.ready().await?;
                let response = sender.send_request(req);
                // Once handed over, the request waits on its own channel, not the handle.
                drop(sender);
                response.await
            };
            sent.await.map_err(|e| inner.failed(&conn_ref, e.into()))
        })
    }
}

impl<C, B, T> Inner<C, B>
where
    C: Service<Uri, Response = T> + Clone + Send + Sync + 'static,
    C::Error: Into<BoxError>,
    C::Future: Send,
    T: hyper::rt::Read + hyper::rt::Write + Connection + Unpin + Send + 'static,
    B: http_body::Body + Unpin + Send + 'static,
    B::Data: Send,
    B::Error: Into<BoxError>,
{
    /// The open connection, or a new one.
    ///
    /// When the connection ends, its task drops the cached handle. hyper queues requests
    /// to the connection's dispatcher on a tokio channel, and a request queued while the
    /// dispatcher is dropped (in TLS 1.3, the server's refusal of the client certificate
    /// ends the connection as the first request is handed over) can stay in the channel,
    /// never answered, until the last handle is dropped. So only the cache holds a handle
    /// for long: a request holds one only while handing itself over, and the dispatcher's
    /// end drops the cached one, which fails such a request as not sent ("connection
    /// closed") instead of leaving it waiting forever.
    async fn connect(&self, uri: &Uri) -> Result<Arc<Conn<B>>, BoxError> {
        let _connecting = self.connecting.lock().await;
        if let Some(conn) = self.current.load_full()
            && !conn.sender.is_closed()
        {
            return Ok(conn);
        }
        let io = self
            .connector
            .clone()
            .oneshot(uri.clone())
            .await
            .map_err(Into::into)?;
        #[cfg(feature = "tls")]
        let fate = super::TlsFate::of(&io.connected());
        let (sender, connection) = self.builder.handshake(ReadAfterReset::new(io)).await?;
        let conn = Arc::new(Conn {
            sender,
            #[cfg(feature = "tls")]
            fate,
        });
        self.current.store(Some(Arc::clone(&conn)));
        let (current, weak) = (Arc::clone(&self.current), Arc::downgrade(&conn));
        tokio::spawn(async move {
            if let Err(e) = connection.await {
                debug!(error = %e, "HTTP/2 connection ended");
            }
            // The dispatcher is gone: drop the cached handle (see above).
            if let Some(conn) = weak.upgrade() {
                current.compare_and_swap(&conn, None::<Arc<Conn<B>>>);
            }
        });
        Ok(conn)
    }

    /// The error of a request that failed on `conn`. When the connection's TLS layer
    /// failed (in TLS 1.3, the server's refusal of the client certificate arrives after
    /// the handshake), the connection is dropped, so that the next request makes a new one
    /// rather than meeting the dead one before its task has closed it, and an error that
    /// does not say why (the request was canceled, the channel closed) becomes the
    /// [`TlsError`](super::TlsError).
    fn failed(&self, conn_ref: &ConnRef<B>, err: BoxError) -> BoxError {
        #[cfg(feature = "tls")]
        if let Some(fate) = &conn_ref.fate
            && fate.failed()
        {
            if let Some(conn) = conn_ref.conn.upgrade() {
                self.current.compare_and_swap(&conn, None::<Arc<Conn<B>>>);
            }
            return fate.explain(err);
        }
        #[cfg(not(feature = "tls"))]
        let _ = &conn_ref.conn;
        err
    }
}

/// What a request keeps of its connection to explain a failure, without holding the
/// connection's handle (see [`Inner::connect`]).
struct ConnRef<B> {
    conn: Weak<Conn<B>>,
    #[cfg(feature = "tls")]
    fate: Option<super::TlsFate>,
}

impl<B> ConnRef<B> {
    fn of(conn: &Arc<Conn<B>>) -> Self {
        Self {
            conn: Arc::downgrade(conn),
            #[cfg(feature = "tls")]
            fate: conn.fate.clone(),
        }
    }
}

/// The connection as the HTTP/2 client sees it: once a write fails because the server reset
/// or closed the connection, later writes are dropped as if sent, and reading goes on.
///
/// h2's client ends the connection on a write error without reading what had already
/// arrived, failing every open stream with "stream closed because of a broken pipe". A
/// server that shuts down gracefully sends a GOAWAY naming the last stream it processed and
/// the responses of the streams up to it, then closes; frames the client wrote meanwhile
/// make the server's kernel answer with a reset. If the client writes after that reset and
/// before it has read those frames, the GOAWAY (which makes the streams above it safe to
/// send again, even a POST) and the finished responses are lost, and the calls fail as "may
/// have been processed". Dropping the writes lets the client read them first; the read side
/// then ends with the reset, which fails whatever is still open. Nothing written after the
/// failure could have reached the server anyway.
struct ReadAfterReset<T> {
    io: T,
    write_failed: bool,
}

impl<T> ReadAfterReset<T> {
    fn new(io: T) -> Self {
        Self {
            io,
            write_failed: false,
        }
    }
}

impl<T: hyper::rt::Write + Unpin> ReadAfterReset<T> {
    /// Runs a write-side operation, unless a write already failed. A failure because the
    /// peer is gone (broken pipe, reset, abort) is remembered and reported as `done`, what
    /// the operation returns on success.
    fn write_side<R>(
        &mut self,
        done: R,
        op: impl FnOnce(Pin<&mut T>) -> Poll<io::Result<R>>,
    ) -> Poll<io::Result<R>> {
        if self.write_failed {
            return Poll::Ready(Ok(done));
        }
        Poll::Ready(match std::task::ready!(op(Pin::new(&mut self.io))) {
            Err(e)
                if matches!(
                    e.kind(),
                    io::ErrorKind::BrokenPipe
                        | io::ErrorKind::ConnectionReset
                        | io::ErrorKind::ConnectionAborted
                ) =>
            {
                debug!(error = %e, "HTTP/2 connection: writing failed (the server is gone); reading what it sent");
                self.write_failed = true;
                Ok(done)
            }
            result => result,
        })
    }
}

impl<T: hyper::rt::Read + Unpin> hyper::rt::Read for ReadAfterReset<T> {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        Pin::new(&mut self.get_mut().io).poll_read(cx, buf)
    }
}

impl<T: hyper::rt::Write + Unpin> hyper::rt::Write for ReadAfterReset<T> {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        self.get_mut()
            .write_side(buf.len(), |io| io.poll_write(cx, buf))
    }

    fn poll_write_vectored(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        bufs: &[io::IoSlice<'_>],
    ) -> Poll<io::Result<usize>> {
        let len = bufs.iter().map(|b| b.len()).sum();
        self.get_mut()
            .write_side(len, |io| io.poll_write_vectored(cx, bufs))
    }

    fn is_write_vectored(&self) -> bool {
        self.io.is_write_vectored()
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().write_side((), |io| io.poll_flush(cx))
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        self.get_mut().write_side((), |io| io.poll_shutdown(cx))
    }
}
