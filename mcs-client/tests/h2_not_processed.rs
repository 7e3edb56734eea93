//! HTTP/2 requests the server says it did not process go again to another endpoint, even a
//! POST (RFC 9113 section 8.7): here a stream refused with REFUSED_STREAM, and a stream above
//! the last stream id of a GOAWAY that the client reads only after a write of its own failed
//! on the connection the server had reset. Real servers on loopback: the refusing one speaks
//! HTTP/2 through the `h2` crate, the resetting one writes its frames by hand, the others are
//! the hyper test servers. (The seed scenario's failover, `tests/loyalty_accrual.rs`, meets
//! both when pods shut down under load.)

mod support;

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::task::{Context, Poll, Waker};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcs_client::connect::{Dial, EndpointTarget, Http2};
use mcs_client::{CloneBody, Http, McsLayer, Retry, StaticResolver};
use mcs_core::discovery::Endpoint;
use mcs_core::endpoints::Locality;
use tokio::net::TcpStream;
use tower::{ServiceBuilder, ServiceExt};

use support::h2_servers::{go_away_server, refusing_server};
use support::*;

fn http2() -> Http<mcs_client::connect::Tcp, Full<Bytes>> {
    let mut builder = Client::builder(TokioExecutor::new());
    builder.http2_only(true);
    Http::new(builder)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_stream_is_sent_again_to_another_endpoint() {
    let (refusing, seen) = refusing_server(IpAddr::from([127, 10, 9, 1])).await;
    let good = servers(20, 9, 2, 0, "west").await;
    let resolver = StaticResolver::new();
    let t = target(9443);
    let mut endpoints: Vec<Endpoint> = good.iter().map(TestServer::endpoint).collect();
    endpoints.push(Endpoint::ready(refusing, cluster("east")));
    resolver.set(&t, endpoints);
    let layer = McsLayer::builder(resolver, Locality::cluster(cluster("north")))
        .retry(Retry::new(CloneBody))
        .build();
    let svc = ServiceBuilder::new().layer(layer).service(http2());
    for i in 0..40 {
        let request = Request::post(format!("http://{HOST}:9443/accrue/{i}"))
            .body(Full::new(Bytes::from_static(b"points=10")))
            .unwrap();
        let response = svc
            .clone()
            .oneshot(request)
            .await
            .unwrap_or_else(|e| panic!("POST {i} failed: {e}: {e:?}"));
        let (cluster, _, _) = answer(response).await;
        assert_eq!(
            cluster, "west",
            "POST {i} answered by a server that processes it"
        );
    }
    assert!(
        seen.load(Ordering::SeqCst) > 0,
        "the balancer never tried the refusing endpoint: the retry path was not exercised"
    );
}

/// A TCP connection that hands the HTTP/2 client nothing it reads until one of its writes
/// has failed: the order in which, under load, a client can meet a server's reset (its
/// next write fails) before it has read the frames the server sent ahead of the reset.
struct ReadsAfterAFailedWrite {
    io: hyper_util::rt::TokioIo<TcpStream>,
    write_failed: bool,
    reader: Option<Waker>,
}

impl ReadsAfterAFailedWrite {
    fn note<T>(&mut self, result: Poll<io::Result<T>>) -> Poll<io::Result<T>> {
        if let Poll::Ready(Err(_)) = &result {
            self.write_failed = true;
            if let Some(reader) = self.reader.take() {
                reader.wake();
            }
        }
        result
    }
}

impl hyper::rt::Read for ReadsAfterAFailedWrite {
    fn poll_read(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: hyper::rt::ReadBufCursor<'_>,
    ) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        if !this.write_failed {
            this.reader = Some(cx.waker().clone());
            return Poll::Pending;
        }
        Pin::new(&mut this.io).poll_read(cx, buf)
    }
}

impl hyper::rt::Write for ReadsAfterAFailedWrite {
    fn poll_write(
        self: Pin<&mut Self>,
        cx: &mut Context<'_>,
        buf: &[u8],
    ) -> Poll<io::Result<usize>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_write(cx, buf);
        this.note(result)
    }

    fn poll_flush(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_flush(cx);
        this.note(result)
    }

    fn poll_shutdown(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<io::Result<()>> {
        let this = self.get_mut();
        let result = Pin::new(&mut this.io).poll_shutdown(cx);
        this.note(result)
    }
}

impl hyper_util::client::legacy::connect::Connection for ReadsAfterAFailedWrite {
    fn connected(&self) -> hyper_util::client::legacy::connect::Connected {
        self.io.connected()
    }
}

/// Dials like `Dial`, holding back reads on the first connection to `held`.
fn holding_reads_from(
    held: SocketAddr,
) -> impl Fn(
    Option<&EndpointTarget>,
) -> tower::util::BoxCloneSyncService<http::Uri, ReadsAfterAFailedWrite, tower::BoxError>
+ Send
+ Sync
+ 'static {
    let first = Arc::new(std::sync::atomic::AtomicBool::new(true));
    move |target: Option<&EndpointTarget>| {
        let dial = target.map_or_else(Dial::resolve, EndpointTarget::dial);
        let to_held = target.is_some_and(|t| t.addr() == held);
        let first = Arc::clone(&first);
        tower::util::BoxCloneSyncService::new(dial.map_response(move |io| {
            let hold = to_held && first.swap(false, Ordering::SeqCst);
            ReadsAfterAFailedWrite {
                io,
                write_failed: !hold,
                reader: None,
            }
        }))
    }
}

fn post(i: usize) -> Request<Full<Bytes>> {
    Request::post(format!("http://{HOST}:9443/accrue/{i}"))
        .body(Full::new(Bytes::from_static(b"points=10")))
        .unwrap()
}

/// Two POSTs through the layer, local cluster (east) first: east has the resetting server
/// on `ip` (see [`go_away_server`]), west one test server for retries. The first POST
/// reaches the server, which resets the connection; the client has not read what the server
/// sent before the reset when the second POST goes out on the same connection, and that
/// write fails on the reset.
struct AcrossAReset {
    resetting: SocketAddr,
    /// Requests the resetting server saw.
    seen: Arc<AtomicUsize>,
    west: TestServer,
    first: Result<http::Response<hyper::body::Incoming>, tower::BoxError>,
    second: Result<http::Response<hyper::body::Incoming>, tower::BoxError>,
}

async fn two_posts_across_a_reset(ip: [u8; 4], answer_first: bool) -> AcrossAReset {
    let (resetting, seen, reset) = go_away_server(IpAddr::from(ip), answer_first, true).await;
    let west = TestServer::start(IpAddr::from([127, 20, ip[2], ip[3]]), 0, "west").await;
    let resolver = StaticResolver::new();
    let t = target(9443);
    resolver.set(
        &t,
        [Endpoint::ready(resetting, cluster("east")), west.endpoint()],
    );
    let h2 = Http2::<_, Full<Bytes>>::new(
        hyper::client::conn::http2::Builder::new(TokioExecutor::new()),
        holding_reads_from(resetting),
    );
    let layer = McsLayer::builder(resolver, Locality::cluster(cluster("east")))
        .retry(Retry::new(CloneBody))
        .build();
    let svc = ServiceBuilder::new().layer(layer).service(h2);
    let first = tokio::spawn(svc.clone().oneshot(post(1)));
    reset
        .await
        .expect("the server saw the first POST and reset the connection");
    let second = tokio::spawn(svc.clone().oneshot(post(2)));
    AcrossAReset {
        resetting,
        seen,
        west,
        first: first.await.unwrap(),
        second: second.await.unwrap(),
    }
}

/// The server sent a GOAWAY saying it processed nothing before the reset: both POSTs are
/// answered in west, each processed once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn streams_above_a_go_away_read_after_a_failed_write_are_sent_again() {
    let run = two_posts_across_a_reset([127, 10, 8, 1], false).await;
    for (i, call) in [(1, run.first), (2, run.second)] {
        let response = call.unwrap_or_else(|e| {
            panic!("POST {i} failed although no server processed it: {e}: {e:?}")
        });
        let (cluster, _, _) = answer(response).await;
        assert_eq!(
            cluster, "west",
            "POST {i} answered by a server that processed it"
        );
    }
    assert_eq!(
        run.seen.load(Ordering::SeqCst),
        1,
        "no retry went back to the resetting server"
    );
    assert_eq!(run.west.served(), 2, "each POST processed once");
}

/// The server answered the first POST before its GOAWAY (last stream id 1): that answer is
/// not lost to the failed write, and the second POST (above the GOAWAY) is answered in west.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_response_read_after_a_failed_write_is_not_lost() {
    let run = two_posts_across_a_reset([127, 10, 8, 2], true).await;
    let response = run
        .first
        .unwrap_or_else(|e| panic!("POST 1 was answered, yet failed: {e}: {e:?}"));
    let (cluster, addr, _) = answer(response).await;
    assert_eq!((cluster.as_str(), addr), ("east", run.resetting));
    let response = run
        .second
        .unwrap_or_else(|e| panic!("POST 2 failed although no server processed it: {e}: {e:?}"));
    let (cluster, _, _) = answer(response).await;
    assert_eq!(cluster, "west");
    assert_eq!(run.seen.load(Ordering::SeqCst), 1);
    assert_eq!(run.west.served(), 1);
}
