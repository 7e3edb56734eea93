//! HTTP/2 requests the server says it did not process go again to another endpoint, even a
//! POST (RFC 9113 section 8.7): here a stream refused with REFUSED_STREAM. Real servers on
//! loopback: the refusing one speaks HTTP/2 through the `h2` crate, the others are the
//! hyper test servers. (Streams above a graceful GOAWAY's last stream id take the same
//! path; the seed scenario's failover, `tests/loyalty_accrual.rs`, meets them when pods
//! shut down under load. A server cannot be made to send one deterministically through
//! `h2`'s API.)

mod support;

use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;
use http::Request;
use http_body_util::Full;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcs_client::{CloneBody, Http, McsLayer, Retry, StaticResolver};
use mcs_core::discovery::Endpoint;
use mcs_core::endpoints::Locality;
use tokio::net::TcpListener;
use tower::{ServiceBuilder, ServiceExt};

use support::*;

/// An HTTP/2 server on `ip` that refuses every stream; counts the streams it refused.
async fn refusing_server(ip: IpAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((_request, mut respond))) = conn.accept().await {
                    counter.fetch_add(1, Ordering::SeqCst);
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                }
            });
        }
    });
    (addr, seen)
}

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
