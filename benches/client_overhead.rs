//! What the `mcs-client` layer adds to a request.
//!
//! - `loopback/*`: sequential HTTP/1 requests to a hyper server on 127.0.0.1 with
//!   hyper-util's legacy client, plain (`plain_hyper`) and through `McsLayer` by the
//!   ClusterSet name (`mcs_layer`, and `mcs_layer_retry` with retries on, which copies the
//!   request head and deposits into the budget). The difference is the layer's overhead
//!   per request; the round trip itself is tens of microseconds.
//! - `layer_only/*`: the same requests against an inner service that answers at once, so
//!   only the layer is timed: `passthrough` (the `cluster.local` name), `balanced` (route,
//!   pick, endpoint service, outcome) and `balanced_retry`.
//! - Then `plain_hyper` and `mcs_layer` again, alternated in bursts in one process, every
//!   request's latency kept: p50 and p99 of each and their ratio (criterion's entries run
//!   one after the other, so their ratio also carries whatever the machine did between).
//!
//! Run with `cargo bench --bench client_overhead`.

use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::{Criterion, criterion_group};
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::client::legacy::connect::HttpConnector;
use hyper_util::rt::{TokioExecutor, TokioIo};
use mcs::client::connect::{EndpointTarget, with_passthrough};
use mcs::client::{CloneBody, Http, McsLayer, Retry, StaticResolver};
use mcs::core::ClusterId;
use mcs::core::discovery::{Endpoint, Target};
use mcs::core::endpoints::Locality;
use mcs::core::name::ServiceRef;
use tower::{Layer, Service, ServiceExt};

const NAME: &str = "http://loyalty-accrual.loyalty.svc.clusterset.local:9443/accrue";
const LOCAL_NAME: &str = "http://loyalty-accrual.loyalty.svc.cluster.local:9443/accrue";

fn runtime() -> tokio::runtime::Runtime {
    tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime")
}

async fn server() -> SocketAddr {
    let listener = tokio::net::TcpListener::bind("127.0.0.1:0")
        .await
        .expect("bind");
    let addr = listener.local_addr().expect("addr");
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let svc = hyper::service::service_fn(|_req: Request<Incoming>| async {
                    Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    addr
}

fn layer(addr: SocketAddr) -> McsLayer {
    let (resolver, cluster) = setup(addr);
    McsLayer::new(resolver, Locality::cluster(cluster))
}

fn retry_layer(addr: SocketAddr) -> McsLayer<CloneBody> {
    let (resolver, cluster) = setup(addr);
    McsLayer::builder(resolver, Locality::cluster(cluster))
        .retry(Retry::new(CloneBody))
        .build()
}

fn setup(addr: SocketAddr) -> (StaticResolver, ClusterId) {
    let cluster = ClusterId::new("east").expect("cluster id");
    let resolver = StaticResolver::new();
    let service = ServiceRef::new("loyalty", "loyalty-accrual").expect("service");
    resolver.set(
        &Target {
            service,
            port: 9443,
        },
        [Endpoint::ready(addr, cluster.clone())],
    );
    (resolver, cluster)
}

/// Times `iters` sequential requests made by `send`.
fn timed<S>(rt: &tokio::runtime::Runtime, svc: &S, uri: &str, iters: u64) -> Duration
where
    S: Service<Request<Full<Bytes>>, Response = Response<Incoming>> + Clone,
    S::Error: std::fmt::Debug,
{
    rt.block_on(async {
        let start = Instant::now();
        for _ in 0..iters {
            let request = Request::get(uri)
                .body(Full::new(Bytes::new()))
                .expect("request");
            let response = svc.clone().oneshot(request).await.expect("response");
            let _ = response.into_body().collect().await.expect("body");
        }
        start.elapsed()
    })
}

fn loopback(c: &mut Criterion) {
    let rt = runtime();
    let addr = rt.block_on(server());
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let plain_uri = format!("http://{addr}/accrue");
    // The layer's per-endpoint clients are built like `client`.
    let http = || Http::new(Client::builder(TokioExecutor::new()));
    let with_layer = layer(addr).layer(http());
    let with_retry = retry_layer(addr).layer(http());
    // Warm the pools and start discovery.
    timed(&rt, &client, &plain_uri, 100);
    timed(&rt, &with_layer, NAME, 100);
    timed(&rt, &with_retry, NAME, 100);

    let mut group = c.benchmark_group("loopback");
    group.measurement_time(Duration::from_secs(5));
    group.bench_function("plain_hyper", |b| {
        b.iter_custom(|iters| timed(&rt, &client, &plain_uri, iters))
    });
    group.bench_function("mcs_layer", |b| {
        b.iter_custom(|iters| timed(&rt, &with_layer, NAME, iters))
    });
    group.bench_function("mcs_layer_retry", |b| {
        b.iter_custom(|iters| timed(&rt, &with_retry, NAME, iters))
    });
    group.finish();
}

fn layer_only(c: &mut Criterion) {
    let rt = runtime();
    let addr: SocketAddr = "127.10.0.1:9443".parse().expect("addr");
    let inner = tower::service_fn(|_req: Request<Full<Bytes>>| async {
        Ok::<_, Infallible>(Response::new(Full::new(Bytes::from_static(b"ok"))))
    });
    let make = move |_: &EndpointTarget| inner;
    let balanced = layer(addr).layer(with_passthrough(make, inner));
    let with_retry = retry_layer(addr).layer(with_passthrough(make, inner));
    let run = |svc: &_, uri: &'static str, iters: u64| {
        let svc: &mcs::client::Mcs<_, _> = svc;
        rt.block_on(async {
            let start = Instant::now();
            for _ in 0..iters {
                let request = Request::get(uri)
                    .body(Full::new(Bytes::new()))
                    .expect("request");
                let response = svc.clone().oneshot(request).await.expect("response");
                std::hint::black_box(response);
            }
            start.elapsed()
        })
    };
    // Start discovery.
    run(&balanced, NAME, 10);
    let mut group = c.benchmark_group("layer_only");
    // The same name in cluster.local: same parsing work, passed through untouched.
    group.bench_function("passthrough", |b| {
        b.iter_custom(|iters| run(&balanced, LOCAL_NAME, iters))
    });
    group.bench_function("balanced", |b| {
        b.iter_custom(|iters| run(&balanced, NAME, iters))
    });
    group.bench_function("balanced_retry", |b| {
        b.iter_custom(|iters| {
            let svc = with_retry.clone();
            rt.block_on(async {
                let start = Instant::now();
                for _ in 0..iters {
                    let request = Request::get(NAME)
                        .body(Full::new(Bytes::new()))
                        .expect("request");
                    std::hint::black_box(svc.clone().oneshot(request).await.expect("response"));
                }
                start.elapsed()
            })
        })
    });
    group.finish();
}

/// `plain_hyper` and `mcs_layer`, alternated in bursts; p50 and p99 of each.
fn paired(full: bool) {
    let rt = runtime();
    let addr = rt.block_on(server());
    let client: Client<HttpConnector, Full<Bytes>> =
        Client::builder(TokioExecutor::new()).build_http();
    let plain_uri = format!("http://{addr}/accrue");
    let with_layer = layer(addr).layer(Http::new(Client::builder(TokioExecutor::new())));
    let (rounds, burst) = if full { (100, 200) } else { (4, 20) };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    // Warm the pools and start discovery.
    timed(&rt, &client, &plain_uri, 100);
    timed(&rt, &with_layer, NAME, 100);
    for round in 0..rounds {
        // Each side goes first every other round.
        for side in [round % 2, 1 - round % 2] {
            for _ in 0..burst {
                let latency = match side {
                    0 => timed(&rt, &with_layer, NAME, 1),
                    _ => timed(&rt, &client, &plain_uri, 1),
                };
                if side == 0 {
                    ours.push(latency);
                } else {
                    theirs.push(latency);
                }
            }
        }
    }
    let (o, t) = (percentiles(&mut ours), percentiles(&mut theirs));
    println!(
        "\nplaintext HTTP/1, one endpoint, {} requests each, alternated in bursts of {burst}:",
        ours.len()
    );
    println!("  {:<14} {:>10} {:>10}", "", "p50", "p99");
    println!("  {:<14} {:>10.1?} {:>10.1?}", "plain hyper", t.0, t.1);
    println!("  {:<14} {:>10.1?} {:>10.1?}", "mcs layer", o.0, o.1);
    println!(
        "  layer / plain: p50 {:.3}, p99 {:.3}",
        o.0.as_secs_f64() / t.0.as_secs_f64(),
        o.1.as_secs_f64() / t.1.as_secs_f64()
    );
}

/// p50 and p99.
fn percentiles(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.50), at(0.99))
}

criterion_group!(benches, loopback, layer_only);

fn main() {
    benches();
    Criterion::default().configure_from_args().final_summary();
    paired(std::env::args().any(|a| a == "--bench"));
}
