//! A tonic client over the layer, HTTP/2 to tonic servers on loopback addresses, balanced
//! per request (not per connection), composed by hand and through the `mcs_client::grpc`
//! helper (h2c and TLS, with failover). The service is proto-free: a codec that passes
//! bytes.

mod support;
mod tls_support;

use std::collections::HashMap;
use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::pin::Pin;
use std::task::{Context, Poll};

use http::uri::PathAndQuery;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcs_client::{Http, McsLayer, Served, StaticResolver};
use mcs_core::endpoints::Locality;
use tokio::sync::oneshot;
use tonic::Status;
use tonic::body::Body;
use tonic::server::NamedService;
use tower::ServiceBuilder;

use support::*;
use tls_support::RawCodec;

const PORT: u16 = 19443;

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

/// A tonic server; `stop` returns once it has closed its listener and connections.
struct GrpcServer {
    stop: oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Result<(), tonic::transport::Error>>,
}

impl GrpcServer {
    async fn stop(self) {
        let _ = self.stop.send(());
        self.task
            .await
            .expect("the server task")
            .expect("the server ran");
    }
}

async fn grpc_server(ip: [u8; 4], cluster: &'static str) -> GrpcServer {
    let addr = SocketAddr::new(IpAddr::from(ip), PORT);
    let listener = tokio::net::TcpListener::bind(addr)
        .await
        .expect("bind loopback address");
    let (stop, stopped) = oneshot::channel::<()>();
    let task = tokio::spawn(
        tonic::transport::Server::builder()
            .add_service(Accrual { cluster, addr })
            .serve_with_incoming_shutdown(
                tonic::transport::server::TcpIncoming::from(listener),
                async {
                    let _ = stopped.await;
                },
            ),
    );
    GrpcServer { stop, task }
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
                let response = call(&mut grpc).await.expect("grpc call");
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
    for server in stops {
        server.stop().await;
    }
}

/// One `Accrue` call, as tonic answers it.
async fn call<T>(grpc: &mut tonic::client::Grpc<T>) -> Result<tonic::Response<Vec<u8>>, Status>
where
    T: tonic::client::GrpcService<Body>,
    T::Error: Into<tower::BoxError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tower::BoxError>,
{
    grpc.ready()
        .await
        .map_err(|e| Status::unknown(e.into().to_string()))?;
    grpc.unary(
        tonic::Request::new(b"order-1".to_vec()),
        PathAndQuery::from_static("/loyalty.Accrual/Accrue"),
        RawCodec,
    )
    .await
}

/// One `Accrue` call; the answer's `(cluster, addr, authority, rest)`.
async fn accrue<T>(
    grpc: &mut tonic::client::Grpc<T>,
) -> Result<(String, String, String, String), Status>
where
    T: tonic::client::GrpcService<Body>,
    T::Error: Into<tower::BoxError>,
    T::ResponseBody: http_body::Body<Data = bytes::Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tower::BoxError>,
{
    let response = call(grpc).await?;
    let text = String::from_utf8(response.into_inner()).unwrap();
    let mut parts = text.splitn(4, ' ');
    let mut next = || parts.next().unwrap_or_default().to_owned();
    Ok((next(), next(), next(), next()))
}

/// A layer for a client in `cluster` that ejects up to half the endpoints, so a whole
/// cluster that stops is taken out (the default, 10 %, would leave most of it picked and
/// every call retried).
fn ejecting_half(resolver: StaticResolver, cluster_name: &str) -> mcs_client::Builder {
    let outlier = mcs_core::endpoints::OutlierConfig {
        max_ejection_percent: 50,
        ..Default::default()
    };
    McsLayer::builder(resolver, Locality::cluster(cluster(cluster_name)))
        .balancer(mcs_core::endpoints::BalancerConfig::default().outlier(outlier))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_channel_helper_over_h2c_is_local_first_and_fails_over() {
    let resolver = StaticResolver::new();
    let mut east = Vec::new();
    let mut west = Vec::new();
    let mut endpoints = Vec::new();
    for (second, cluster_name) in [(10, "east"), (20, "west")] {
        for i in 1..=3 {
            let server = grpc_server([127, second, 8, i], cluster_name).await;
            if cluster_name == "east" {
                east.push(server);
            } else {
                west.push(server);
            }
            endpoints.push(mcs_core::discovery::Endpoint::ready(
                SocketAddr::from(([127, second, 8, i], PORT)),
                cluster(cluster_name),
            ));
        }
    }
    resolver.set(&target(PORT), endpoints);
    let channel = mcs_client::grpc::channel(
        ejecting_half(resolver, "east"),
        mcs_client::connect::Tcp::new(),
    );
    let origin = mcs_client::grpc::origin(&target(PORT), false);
    assert_eq!(
        origin,
        format!("http://{HOST}:{PORT}")
            .parse::<http::Uri>()
            .unwrap()
    );
    let mut grpc = tonic::client::Grpc::with_origin(channel, origin);

    // Local first, over all of east's endpoints, with the service's name as :authority.
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..60 {
        let (c, addr, authority, _) = accrue(&mut grpc).await.expect("a call to east");
        assert_eq!(c, "east");
        assert_eq!(authority, format!("{HOST}:{PORT}"));
        seen.insert(addr);
    }
    assert_eq!(seen.len(), 3, "{seen:?}");

    // East stops (its servers close their connections and refuse new ones) while
    // discovery still lists it: no call fails; each is retried on another endpoint until
    // east's endpoints are ejected, and then goes to west.
    for server in east {
        server.stop().await;
    }
    for i in 0..60 {
        let (c, _, _, _) = accrue(&mut grpc)
            .await
            .unwrap_or_else(|e| panic!("call {i} after east stopped failed: {e}"));
        assert_eq!(c, "west", "call {i}");
    }
    for server in west {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_channel_helper_over_tls_verifies_the_clusterset_name() {
    use tls_support::{Ca, ServerTls, TlsServer};
    let ca = Ca::new("grpc-helper-ca");
    let identity = ca.server(&[HOST]);
    let tls = || ServerTls {
        identity: identity.clone(),
        client_ca: None,
        close_each: false,
    };
    let west = [
        TlsServer::start(SocketAddr::from(([127, 20, 9, 1], PORT)), "west", tls()).await,
        TlsServer::start(SocketAddr::from(([127, 20, 9, 2], PORT)), "west", tls()).await,
    ];
    let resolver = StaticResolver::new();
    resolver.set(&target(PORT), west.iter().map(TlsServer::endpoint));
    // ALPN h2 is set by the helper: the test's configuration offers none.
    let channel = mcs_client::grpc::channel(
        McsLayer::builder(resolver, Locality::cluster(cluster("north"))),
        mcs_client::grpc::tls(ca.client_config(None, &[])),
    );
    let mut grpc =
        tonic::client::Grpc::with_origin(channel, mcs_client::grpc::origin(&target(PORT), true));
    let mut seen = std::collections::BTreeSet::new();
    for _ in 0..30 {
        let (c, addr, authority, sni) = accrue(&mut grpc).await.expect("a call over TLS");
        assert_eq!((c.as_str(), sni.as_str()), ("west", HOST));
        assert_eq!(authority, format!("{HOST}:{PORT}"));
        seen.insert(addr);
    }
    assert_eq!(
        seen.len(),
        2,
        "calls balanced over both endpoints: {seen:?}"
    );
    for server in &west {
        assert!(
            server
                .handshakes()
                .iter()
                .all(|h| h.alpn.as_deref() == Some(b"h2".as_slice()))
        );
    }
    for server in west {
        server.stop().await;
    }
}

/// A caller in a cluster with no endpoints of its own (north) has every other cluster in one
/// tier. When one of them (east, 3 endpoints) refuses connections while discovery still
/// lists it, a call's retries leave it for another cluster (west, 1 endpoint): the first
/// retry takes the balancer's choice, the second one a cluster the call has not failed in.
/// (Before, when retries only looked for another tier, a call failed whenever its three
/// attempts all went to east: one call in four here.) Each call gets a new channel, so that
/// no call learns from an earlier one's ejections.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_retry_leaves_a_remote_cluster_that_refuses_for_another() {
    let resolver = StaticResolver::new();
    // Nobody listens on east's addresses: every connection is refused.
    let mut endpoints: Vec<_> = (1..=3)
        .map(|i| {
            mcs_core::discovery::Endpoint::ready(
                SocketAddr::from(([127, 10, 66, i], PORT)),
                cluster("east"),
            )
        })
        .collect();
    let west = grpc_server([127, 20, 66, 1], "west").await;
    endpoints.push(mcs_core::discovery::Endpoint::ready(
        SocketAddr::from(([127, 20, 66, 1], PORT)),
        cluster("west"),
    ));
    resolver.set(&target(PORT), endpoints);
    let origin = mcs_client::grpc::origin(&target(PORT), false);
    let mut attempts = std::collections::BTreeMap::<u32, usize>::new();
    for n in 0..40 {
        let channel = mcs_client::grpc::channel(
            ejecting_half(resolver.clone(), "north"),
            mcs_client::connect::Tcp::new(),
        );
        let mut grpc = tonic::client::Grpc::with_origin(channel, origin.clone());
        let response = call(&mut grpc)
            .await
            .unwrap_or_else(|e| panic!("call {n} failed: {e}"));
        let served = response.extensions().get::<Served>().cloned().unwrap();
        assert_eq!(served.cluster().as_str(), "west", "call {n}");
        *attempts.entry(served.attempts()).or_default() += 1;
    }
    // The calls that went to east first were retried (3 in 4 of them, by chance).
    assert!(attempts.keys().any(|&a| a > 1), "{attempts:?}");
    west.stop().await;
}
