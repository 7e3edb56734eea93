//! TLS through the layer, against the client a user would otherwise use, side by side in
//! one process on loopback TLS servers (hyper over tokio-rustls, a CA made here):
//!
//! 1. `https_one_endpoint` (criterion): sequential https requests on a kept-alive
//!    connection to one endpoint, through hyper-rustls's connector; `hyper_rustls` is the
//!    hyper-util client alone, `mcs_layer` the same connector under the layer by the
//!    ClusterSet name. Then the same two alternated in bursts, request latencies
//!    recorded, p50 and p99 of each and their ratio.
//! 2. Handshakes: a run of `CONCURRENCY` concurrent callers over four endpoints through
//!    the layer; TLS handshakes each endpoint's server accepted, against the concurrency.
//! 3. gRPC over TLS (ALPN h2), unary calls by `CONCURRENCY` callers to one endpoint: the
//!    layer over `connect::Http2` (one HTTP/2 connection per endpoint) and over
//!    `connect::Http` (hyper-util's pooled client, `http2_only`), hyper-util's client
//!    alone, and tonic's `Channel`; p50 and p99 of each.
//! 4. The same over four endpoints: the layer over `Http2` against tonic's own
//!    `Channel::balance_list` over the same endpoints (same CA, same server name), rounds
//!    alternated; p50 and p99 of each, and how evenly each spread the calls.
//!
//! Run: `cargo bench -p mcs-client --bench client_tls`. Without `--bench` (as
//! `cargo test --benches` runs it) every part runs briefly.

#[path = "../tests/tls_support/mod.rs"]
mod tls_support;

use std::collections::HashMap;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use criterion::Criterion;
use http::uri::PathAndQuery;
use http_body_util::{BodyExt, Empty};
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcs_client::connect::{Dial, EndpointTarget, Http, Http2, Tls};
use mcs_client::{McsLayer, StaticResolver};
use mcs_core::ClusterId;
use mcs_core::discovery::Target;
use mcs_core::endpoints::Locality;
use mcs_core::name::ServiceRef;
use tower::{Layer, Service, ServiceExt};

use tls_support::{Ca, RawCodec, ServerTls, TlsServer, parse_answer};

const HOST: &str = "loyalty-accrual.loyalty.svc.clusterset.local";
const PORT: u16 = 9443;
const CONCURRENCY: usize = 16;

fn main() {
    let full = std::env::args().any(|a| a == "--bench");
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("runtime");
    let ca = Ca::new("bench-ca");
    let identity = ca.server(&[HOST]);
    let servers: Vec<TlsServer> = rt.block_on(async {
        let mut out = Vec::new();
        for (second, cluster) in [(10, "east"), (10, "east"), (20, "west"), (20, "west")] {
            let addr = SocketAddr::from(([127, second, 90, out.len() as u8 + 1], 0));
            let tls = ServerTls {
                identity: identity.clone(),
                client_ca: None,
                close_each: false,
            };
            out.push(TlsServer::start(addr, cluster, tls).await);
        }
        out
    });

    https_one_endpoint(&rt, &ca, &servers[0], full);
    handshakes(&rt, &ca, &servers, full);
    grpc_one_endpoint(&rt, &ca, &servers[0], full);
    grpc_against_tonic(&rt, &ca, &servers, full);
}

fn target() -> Target {
    Target {
        service: ServiceRef::new("loyalty", "loyalty-accrual").expect("service"),
        port: PORT,
    }
}

fn url() -> String {
    format!("https://{HOST}:{PORT}/accrue")
}

/// A layer over `servers`, from the point of view of a caller in `north`.
fn layer(servers: &[&TlsServer]) -> McsLayer {
    let resolver = StaticResolver::new();
    resolver.set(&target(), servers.iter().map(|s| s.endpoint()));
    McsLayer::new(
        resolver,
        Locality::cluster(ClusterId::new("north").expect("id")),
    )
}

async fn one_request<S>(svc: &S) -> Duration
where
    S: Service<http::Request<Empty<Bytes>>, Response = http::Response<hyper::body::Incoming>>
        + Clone,
    S::Error: std::fmt::Debug,
{
    let start = Instant::now();
    let request = http::Request::get(url())
        .body(Empty::new())
        .expect("request");
    let response = svc.clone().oneshot(request).await.expect("response");
    response.into_body().collect().await.expect("body");
    start.elapsed()
}

fn https_one_endpoint(rt: &tokio::runtime::Runtime, ca: &Ca, server: &TlsServer, full: bool) {
    let config = ca.client_config(None, &[]);
    let connector = move |dial: Dial| {
        HttpsConnectorBuilder::new()
            .with_tls_config(config.clone())
            .https_only()
            .enable_http1()
            .wrap_connector(dial)
    };
    // The client alone: it dials the endpoint and verifies the service's name.
    let plain = Client::builder(TokioExecutor::new())
        .build::<_, Empty<Bytes>>(connector(mcs_client::connect::Tcp::new().dial(server.addr)));
    // The same connector under the layer.
    let http: Http<_, Empty<Bytes>> = Http::with_connector(
        Client::builder(TokioExecutor::new()),
        move |t: Option<&EndpointTarget>| {
            connector(t.map_or_else(Dial::resolve, EndpointTarget::dial))
        },
    );
    let layered = layer(&[server]).layer(http);
    rt.block_on(async {
        for _ in 0..100 {
            one_request(&plain).await;
            one_request(&layered).await;
        }
    });

    let mut c = Criterion::default().configure_from_args();
    let mut group = c.benchmark_group("https_one_endpoint");
    group.bench_function("hyper_rustls", |b| {
        b.iter_custom(|n| rt.block_on(async { sum(&plain, n).await }))
    });
    group.bench_function("mcs_layer", |b| {
        b.iter_custom(|n| rt.block_on(async { sum(&layered, n).await }))
    });
    group.finish();

    // Paired: bursts alternated, every request's latency kept.
    let (rounds, burst) = if full { (100, 200) } else { (4, 20) };
    let (mut ours, mut theirs) = (Vec::new(), Vec::new());
    rt.block_on(async {
        for _ in 0..rounds {
            for _ in 0..burst {
                theirs.push(one_request(&plain).await);
            }
            for _ in 0..burst {
                ours.push(one_request(&layered).await);
            }
        }
    });
    let (o, t) = (percentiles(&mut ours), percentiles(&mut theirs));
    println!(
        "\nhttps, one endpoint, {} requests each, alternated in bursts of {burst}:",
        ours.len()
    );
    println!("  {:<14} {:>10} {:>10}", "", "p50", "p99");
    println!("  {:<14} {:>10.1?} {:>10.1?}", "hyper-rustls", t.0, t.1);
    println!("  {:<14} {:>10.1?} {:>10.1?}", "mcs layer", o.0, o.1);
    println!(
        "  layer / hyper-rustls: p50 {:.3}, p99 {:.3}",
        o.0.as_secs_f64() / t.0.as_secs_f64(),
        o.1.as_secs_f64() / t.1.as_secs_f64()
    );
}

async fn sum<S>(svc: &S, n: u64) -> Duration
where
    S: Service<http::Request<Empty<Bytes>>, Response = http::Response<hyper::body::Incoming>>
        + Clone,
    S::Error: std::fmt::Debug,
{
    let mut total = Duration::ZERO;
    for _ in 0..n {
        total += one_request(svc).await;
    }
    total
}

fn handshakes(rt: &tokio::runtime::Runtime, ca: &Ca, servers: &[TlsServer], full: bool) {
    let before: Vec<usize> = servers.iter().map(|s| s.handshakes().len()).collect();
    let http: Http<_, Empty<Bytes>> = Http::with_connector(
        Client::builder(TokioExecutor::new()),
        Tls::new(ca.client_config(None, &[b"http/1.1"])),
    );
    let svc = layer(&servers.iter().collect::<Vec<_>>()).layer(http);
    let per_caller = if full { 500 } else { 20 };
    rt.block_on(async {
        let mut tasks = tokio::task::JoinSet::new();
        for _ in 0..CONCURRENCY {
            let svc = svc.clone();
            tasks.spawn(async move {
                for _ in 0..per_caller {
                    one_request(&svc).await;
                }
            });
        }
        while tasks.join_next().await.is_some() {}
    });
    let counts: Vec<usize> = servers
        .iter()
        .zip(before)
        .map(|(s, b)| s.handshakes().len() - b)
        .collect();
    println!(
        "\nhandshakes: {} https requests by {CONCURRENCY} concurrent callers over {} endpoints \
         (HTTP/1.1, kept alive): handshakes per endpoint {counts:?}; at most {CONCURRENCY} \
         (the concurrency) needed per endpoint",
        CONCURRENCY * per_caller,
        servers.len()
    );
}

fn grpc_against_tonic(rt: &tokio::runtime::Runtime, ca: &Ca, servers: &[TlsServer], full: bool) {
    // Ours: one HTTP/2 connection over TLS per endpoint (what the crate docs give tonic
    // users, and what tonic's Channel keeps per endpoint), balanced per call.
    let h2 = Http2::<_, tonic::body::Body>::new(
        hyper::client::conn::http2::Builder::new(TokioExecutor::new()),
        Tls::new(ca.client_config(None, &[b"h2"])),
    );
    let channel = layer(&servers.iter().collect::<Vec<_>>()).layer(h2);
    let origin: http::Uri = format!("https://{HOST}:{PORT}").parse().expect("origin");
    let ours = tonic::client::Grpc::with_origin(channel, origin.clone());

    // tonic's: one Endpoint per server (dialled by address), verified as the service's name,
    // with the service's name as :authority.
    let ca_pem = ca.pem();
    let endpoints: Vec<tonic::transport::Endpoint> = servers
        .iter()
        .map(|s| {
            tonic::transport::Endpoint::from_shared(format!("https://{}", s.addr))
                .expect("endpoint")
                .origin(origin.clone())
                .tls_config(
                    tonic::transport::ClientTlsConfig::new()
                        .domain_name(HOST)
                        .ca_certificate(tonic::transport::Certificate::from_pem(&ca_pem)),
                )
                .expect("tls config")
        })
        .collect();
    let tonic_channel =
        rt.block_on(async { tonic::transport::Channel::balance_list(endpoints.into_iter()) });
    let theirs = tonic::client::Grpc::new(tonic_channel);

    // Short rounds, alternated, so a burst of load from elsewhere on the machine falls on
    // both sides alike rather than on whichever ran then (it moves the p99 most).
    let (rounds, per_caller) = if full { (50, 20) } else { (2, 10) };
    let mut lat = [Vec::new(), Vec::new()];
    let mut spread = [HashMap::new(), HashMap::new()];
    rt.block_on(async {
        // Warm both: connections made, discovery done.
        calls(&ours, 2, 10).await;
        calls(&theirs, 2, 10).await;
        for round in 0..rounds {
            // Each side goes first every other round.
            for side in [round % 2, 1 - round % 2] {
                let (l, by_addr) = match side {
                    0 => calls(&ours, CONCURRENCY, per_caller).await,
                    _ => calls(&theirs, CONCURRENCY, per_caller).await,
                };
                lat[side].extend(l);
                for (addr, n) in by_addr {
                    *spread[side].entry(addr).or_insert(0usize) += n;
                }
            }
        }
    });
    let total = lat[0].len();
    let (o, t) = (percentiles(&mut lat[0]), percentiles(&mut lat[1]));
    println!(
        "\ngRPC over TLS (h2), unary, {CONCURRENCY} concurrent callers, {total} calls each side \
         in {rounds} alternated rounds:"
    );
    println!(
        "  {:<22} {:>10} {:>10} {:>24}",
        "", "p50", "p99", "calls per endpoint"
    );
    for (name, p, s) in [
        ("tonic balance_list", t, &spread[1]),
        ("mcs layer", o, &spread[0]),
    ] {
        let mut shares: Vec<usize> = s.values().copied().collect();
        shares.sort_unstable();
        println!(
            "  {name:<22} {:>10.1?} {:>10.1?} {:>24}",
            p.0,
            p.1,
            format!("{shares:?}")
        );
    }
    println!(
        "  layer / tonic: p50 {:.3}, p99 {:.3}",
        o.0.as_secs_f64() / t.0.as_secs_f64(),
        o.1.as_secs_f64() / t.1.as_secs_f64()
    );
}

/// gRPC over TLS to one endpoint: the layer over [`Http2`] and over hyper-util's pooled
/// client, hyper-util's client alone and tonic's `Channel`, in turn.
fn grpc_one_endpoint(rt: &tokio::runtime::Runtime, ca: &Ca, server: &TlsServer, full: bool) {
    let origin: http::Uri = format!("https://{HOST}:{PORT}").parse().expect("origin");
    let tls = Tls::new(ca.client_config(None, &[b"h2"]));
    let http = Http::<_, tonic::body::Body>::with_connector(
        Client::builder(TokioExecutor::new())
            .http2_only(true)
            .clone(),
        tls.clone(),
    );
    let channel = layer(&[server]).layer(http);
    let ours_pooled = tonic::client::Grpc::with_origin(channel, origin.clone());
    let h2 = Http2::<_, tonic::body::Body>::new(
        hyper::client::conn::http2::Builder::new(TokioExecutor::new()),
        tls.clone(),
    );
    let ours = tonic::client::Grpc::with_origin(layer(&[server]).layer(h2), origin.clone());
    let hyper_only = Client::builder(TokioExecutor::new())
        .http2_only(true)
        .build::<_, tonic::body::Body>(
            HttpsConnectorBuilder::new()
                .with_tls_config(ca.client_config(None, &[]))
                .https_only()
                .enable_http2()
                .wrap_connector(mcs_client::connect::Tcp::new().dial(server.addr)),
        );
    let hyper_only = tonic::client::Grpc::with_origin(hyper_only, origin.clone());
    let ca_pem = ca.pem();
    let tonic_one = tonic::transport::Endpoint::from_shared(format!("https://{}", server.addr))
        .expect("endpoint")
        .origin(origin.clone())
        .tls_config(
            tonic::transport::ClientTlsConfig::new()
                .domain_name(HOST)
                .ca_certificate(tonic::transport::Certificate::from_pem(&ca_pem)),
        )
        .expect("tls");
    let tonic_one = rt.block_on(async { tonic_one.connect().await.expect("connect") });
    let tonic_one = tonic::client::Grpc::new(tonic_one);
    let (rounds, per_caller) = if full { (10, 100) } else { (2, 10) };
    let mut lat = [Vec::new(), Vec::new(), Vec::new(), Vec::new()];
    rt.block_on(async {
        calls(&ours, 2, 10).await;
        calls(&ours_pooled, 2, 10).await;
        calls(&hyper_only, 2, 10).await;
        calls(&tonic_one, 2, 10).await;
        for _ in 0..rounds {
            lat[0].extend(calls(&ours, CONCURRENCY, per_caller).await.0);
            lat[1].extend(calls(&ours_pooled, CONCURRENCY, per_caller).await.0);
            lat[2].extend(calls(&hyper_only, CONCURRENCY, per_caller).await.0);
            lat[3].extend(calls(&tonic_one, CONCURRENCY, per_caller).await.0);
        }
    });
    println!(
        "\ngRPC over TLS (h2), unary, one endpoint, {CONCURRENCY} concurrent callers, {} calls \
         each in {rounds} rounds:",
        lat[0].len()
    );
    println!("  {:<24} {:>10} {:>10}", "", "p50", "p99");
    for (name, l) in [
        "mcs layer over Http2",
        "mcs layer over Http (h2)",
        "hyper-util h2 alone",
        "tonic Channel",
    ]
    .iter()
    .zip(lat.iter_mut())
    {
        let p = percentiles(l);
        println!("  {name:<24} {:>10.1?} {:>10.1?}", p.0, p.1);
    }
}

/// `per_caller` unary calls from each of `concurrency` callers; every call's latency and
/// the calls each endpoint answered.
async fn calls<T>(
    grpc: &tonic::client::Grpc<T>,
    concurrency: usize,
    per_caller: usize,
) -> (Vec<Duration>, HashMap<SocketAddr, usize>)
where
    T: tonic::client::GrpcService<tonic::body::Body> + Clone + Send + 'static,
    T::Future: Send,
    T::Error: Into<tonic::codegen::StdError>,
    T::ResponseBody: http_body::Body<Data = Bytes> + Send + 'static,
    <T::ResponseBody as http_body::Body>::Error: Into<tonic::codegen::StdError> + Send,
{
    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..concurrency {
        let mut grpc = grpc.clone();
        tasks.spawn(async move {
            let mut seen = Vec::with_capacity(per_caller);
            for _ in 0..per_caller {
                let start = Instant::now();
                grpc.ready().await.map_err(Into::into).expect("ready");
                let response = grpc
                    .unary(
                        tonic::Request::new(b"order-1".to_vec()),
                        PathAndQuery::from_static("/loyalty.Accrual/Accrue"),
                        RawCodec,
                    )
                    .await
                    .expect("gRPC call");
                let answer = String::from_utf8(response.into_inner()).expect("utf-8");
                seen.push((start.elapsed(), parse_answer(&answer).1));
            }
            seen
        });
    }
    let mut latencies = Vec::new();
    let mut by_addr = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        for (latency, addr) in done.expect("caller") {
            latencies.push(latency);
            *by_addr.entry(addr).or_insert(0) += 1;
        }
    }
    (latencies, by_addr)
}

/// p50 and p99.
fn percentiles(samples: &mut [Duration]) -> (Duration, Duration) {
    samples.sort_unstable();
    let at = |q: f64| samples[((samples.len() - 1) as f64 * q).round() as usize];
    (at(0.50), at(0.99))
}
