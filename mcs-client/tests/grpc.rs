//! A tonic client over the layer, HTTP/2 to tonic servers on loopback addresses, balanced
//! per request (not per connection). The service is proto-free: a codec that passes bytes.

mod support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use bytes::{Buf, BufMut};
use http::uri::PathAndQuery;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcs_client::{Http, McsLayer, Served, StaticResolver};
use mcs_core::endpoints::Locality;
use tokio::sync::oneshot;
use tonic::Status;
use tonic::body::Body;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::NamedService;
use tower::ServiceBuilder;

use support::*;

const PORT: u16 = 19443;

/// Messages are raw bytes.
#[derive(Clone, Copy, Default)]
struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        dst.put_slice(&item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// `loyalty.Accrual/Accrue`: answers `<cluster> <addr> <:authority>`.
#[derive(Clone)]
struct Accrual {
    cluster: &'static str,
    addr: SocketAddr,
}

impl NamedService for Accrual {
    const NAME: &'static str = "loyalty.Accrual";
}

impl tower::Service<http::Request<Body>> for Accrual {
    type Response = http::Response<Body>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: http::Request<Body>) -> Self::Future {
        let answer = format!(
            "{} {} {}",
            self.cluster,
            self.addr,
            req.uri().authority().map(|a| a.as_str()).unwrap_or("")
        );
        Box::pin(async move {
            if req.uri().path() != "/loyalty.Accrual/Accrue" {
                return Ok(Status::unimplemented("no such method").into_http());
            }
            let handler = tower::service_fn(move |_: tonic::Request<Vec<u8>>| {
                let answer = answer.clone();
                async move { Ok::<_, Status>(tonic::Response::new(answer.into_bytes())) }
            });
            Ok(tonic::server::Grpc::new(RawCodec).unary(handler, req).await)
        })
    }
}

async fn grpc_server(ip: [u8; 4], cluster: &'static str) -> oneshot::Sender<()> {
    let addr = SocketAddr::new(IpAddr::from(ip), PORT);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("bind loopback address");
    let (stop, stopped) = oneshot::channel::<()>();
    tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(Accrual { cluster, addr })
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    stop
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tonic_client_is_balanced_per_request_over_http2() {
    let mut stops = Vec::new();
    let resolver = StaticResolver::new();
    let mut endpoints = Vec::new();
    for (second, cluster_name) in [(10, "east"), (20, "west")] {
        for i in 1..=3 {
            stops.push(grpc_server([127, second, 7, i], cluster_name).await);
            endpoints.push(mcs_core::discovery::Endpoint::ready(
                SocketAddr::from(([127, second, 7, i], PORT)),
                cluster(cluster_name),
            ));
        }
    }
    resolver.set(&target(PORT), endpoints);

    // HTTP/2 clients per endpoint; the layer picks an endpoint for every call.
    let http2 = Http::<_, Body>::new(
        Client::builder(TokioExecutor::new())
            .http2_only(true)
            .clone(),
    );
    let svc = ServiceBuilder::new()
        .layer(McsLayer::new(resolver, Locality::cluster(cluster("north"))))
        .service(http2);
    let origin: http::Uri = format!("http://{HOST}:{PORT}").parse().unwrap();
    let grpc = tonic::client::Grpc::with_origin(svc, origin);

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let mut grpc = grpc.clone();
        tasks.spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..50 {
                grpc.ready().await.expect("ready");
                let response = grpc
                    .unary(
                        tonic::Request::new(b"order-1".to_vec()),
                        PathAndQuery::from_static("/loyalty.Accrual/Accrue"),
                        RawCodec,
                    )
                    .await
                    .expect("grpc call");
                let served = response
                    .extensions()
                    .get::<Served>()
                    .map(Served::addr)
                    .expect("Served reaches tonic");
                let text = String::from_utf8(response.into_inner()).unwrap();
                let mut parts = text.split(' ');
                let (c, addr, authority) = (
                    parts.next().unwrap().to_owned(),
                    parts.next().unwrap().to_owned(),
                    parts.next().unwrap().to_owned(),
                );
                assert_eq!(served.to_string(), addr);
                // :authority is the service's name, as the caller wrote it.
                assert_eq!(authority, format!("{HOST}:{PORT}"));
                seen.push((c, addr));
            }
            seen
        });
    }
    let mut by_cluster: HashMap<String, usize> = HashMap::new();
    let mut by_addr: HashMap<String, usize> = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        for (c, addr) in done.unwrap() {
            *by_cluster.entry(c).or_default() += 1;
            *by_addr.entry(addr).or_default() += 1;
        }
    }
    assert_eq!(by_cluster.values().sum::<usize>(), 300);
    assert!(
        by_cluster.get("east").copied().unwrap_or(0) >= 90,
        "{by_cluster:?}"
    );
    assert!(
        by_cluster.get("west").copied().unwrap_or(0) >= 90,
        "{by_cluster:?}"
    );
    assert_eq!(by_addr.len(), 6, "every endpoint served calls: {by_addr:?}");
    for stop in stops {
        let _ = stop.send(());
    }
}
