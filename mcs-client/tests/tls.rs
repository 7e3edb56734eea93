//! TLS through the layer against real TLS servers (hyper over tokio-rustls, certificates
//! from a CA made in the test) on east (127.10.4x.y) and west (127.20.4x.y) loopback
//! addresses: the service's name is verified and sent as SNI and `Host` / `:authority`,
//! never an endpoint's IP.
#![cfg(feature = "tls")]

mod support;
mod tls_support;

use std::collections::HashMap;
use std::error::Error as StdError;
use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http::uri::PathAndQuery;
use http_body_util::{BodyExt, Empty, Full};
use hyper_rustls::HttpsConnectorBuilder;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcs_client::connect::{Dial, EndpointTarget, Http, Http2, Tls, TlsError};
use mcs_client::{
    BufferBody, CloneBody, EndpointError, McsLayer, Replay, Retry, Served, StaticResolver,
};
use mcs_core::endpoints::{BalancerConfig, Locality, OutlierConfig};
use mcs_core::name::ServiceRef;
use tower::{Layer, Service, ServiceExt};

use support::{HOST, cluster, report, target};
use tls_support::*;

const PORT: u16 = 9443;
const CLUSTER_LOCAL: &str = "loyalty-accrual.loyalty.svc.cluster.local";

fn url(path: &str) -> String {
    format!("https://{HOST}:{PORT}{path}")
}

fn get(path: &str) -> http::Request<Empty<Bytes>> {
    http::Request::get(url(path)).body(Empty::new()).unwrap()
}

fn ip(second: u8, third: u8, last: u8) -> SocketAddr {
    SocketAddr::from(([127, second, third, last], 0))
}

fn plain_tls(identity: &Identity) -> ServerTls {
    ServerTls {
        identity: identity.clone(),
        client_ca: None,
        close_each: false,
    }
}

/// Servers `1..=n` of `cluster` on `127.<second>.<third>.x`.
async fn servers(
    second: u8,
    third: u8,
    n: u8,
    cluster: &str,
    tls: impl Fn() -> ServerTls,
) -> Vec<TlsServer> {
    let mut out = Vec::new();
    for i in 1..=n {
        out.push(TlsServer::start(ip(second, third, i), cluster, tls()).await);
    }
    out
}

#[expect(
    clippy::field_reassign_with_default,
    reason = "OutlierConfig may become #[non_exhaustive]; field assignment stays valid then"
)]
fn ejecting_half() -> BalancerConfig {
    let mut outlier = OutlierConfig::default();
    outlier.max_ejection_percent = 50;
    BalancerConfig::default().outlier(outlier)
}

/// Sends a request and reads the answer line.
async fn call<S, B>(svc: &S, request: http::Request<B>) -> Result<(Served, String), tower::BoxError>
where
    S: Service<
            http::Request<B>,
            Response = http::Response<hyper::body::Incoming>,
            Error = tower::BoxError,
        > + Clone,
{
    let response = svc.clone().oneshot(request).await?;
    let served = response
        .extensions()
        .get::<Served>()
        .cloned()
        .expect("Served");
    let body = response.into_body().collect().await?.to_bytes();
    Ok((served, String::from_utf8(body.to_vec()).unwrap()))
}

/// The first error of type `T` in `err`'s source chain.
fn find<'a, T: StdError + 'static>(err: &'a (dyn StdError + 'static)) -> Option<&'a T> {
    let mut cur = Some(err);
    while let Some(e) = cur {
        if let Some(found) = e.downcast_ref::<T>() {
            return Some(found);
        }
        // tokio-rustls wraps rustls errors in io::Error, whose `source` skips them.
        if let Some(io) = e.downcast_ref::<std::io::Error>()
            && let Some(found) = io.get_ref().and_then(|i| i.downcast_ref::<T>())
        {
            return Some(found);
        }
        cur = e.source();
    }
    None
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn https_through_hyper_rustls_verifies_the_service_name() {
    let ca = Ca::new("loyalty-ca");
    let identity = ca.server(&[HOST]);
    let mut all = servers(10, 40, 2, "east", || plain_tls(&identity)).await;
    all.extend(servers(20, 40, 2, "west", || plain_tls(&identity)).await);
    let resolver = StaticResolver::new();
    resolver.set(&target(PORT), all.iter().map(TlsServer::endpoint));

    // hyper-rustls, as a user would set it up, around the endpoint's dialler (it sets ALPN
    // itself).
    let config = ca.client_config(None, &[]);
    let connect = move |target: Option<&EndpointTarget>| {
        HttpsConnectorBuilder::new()
            .with_tls_config(config.clone())
            .https_only()
            .enable_http1()
            .wrap_connector(target.map_or_else(Dial::resolve, EndpointTarget::dial))
    };
    let http: Http<_, Empty<Bytes>> =
        Http::with_connector(Client::builder(TokioExecutor::new()), connect);
    let svc = McsLayer::new(resolver, Locality::cluster(cluster("north"))).layer(http);

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..4 {
        let svc = svc.clone();
        tasks.spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..50 {
                let (served, answer) = call(&svc, get("/accrue")).await.expect("https request");
                let (c, addr, authority, sni) = parse_answer(&answer);
                assert_eq!(
                    served.addr(),
                    addr,
                    "Served names the endpoint that answered"
                );
                assert_eq!(
                    authority,
                    format!("{HOST}:{PORT}"),
                    "Host is the service's name"
                );
                assert_eq!(sni, HOST, "SNI is the service's name");
                seen.push(c);
            }
            seen
        });
    }
    let mut by_cluster: HashMap<String, usize> = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        for c in done.unwrap() {
            *by_cluster.entry(c).or_default() += 1;
        }
    }
    assert_eq!(by_cluster.values().sum::<usize>(), 200);
    for c in ["east", "west"] {
        assert!(
            by_cluster.get(c).copied().unwrap_or(0) >= 50,
            "{by_cluster:?}"
        );
    }
    for server in &all {
        let handshakes = server.handshakes();
        assert!(!handshakes.is_empty(), "{} got no connection", server.addr);
        assert!(
            handshakes.iter().all(|h| h.sni.as_deref() == Some(HOST)),
            "{handshakes:?}"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_certificate_for_another_name_is_retried_ejected_and_named() {
    let ca = Ca::new("loyalty-ca");
    let good = ca.server(&[HOST]);
    let wrong = ca.server(&["billing.shop.svc.clusterset.local"]);
    let mut all = servers(10, 41, 2, "east", || plain_tls(&good)).await;
    all.extend(servers(20, 41, 1, "west", || plain_tls(&good)).await);
    let bad = TlsServer::start(ip(20, 41, 9), "west", plain_tls(&wrong)).await;
    let resolver = StaticResolver::new();
    resolver.set(
        &target(PORT),
        all.iter().chain([&bad]).map(TlsServer::endpoint),
    );
    let tls = Tls::new(ca.client_config(None, &[b"http/1.1"]));
    let http: Http<_, Full<Bytes>> =
        Http::with_connector(Client::builder(TokioExecutor::new()), tls.clone());
    let svc = McsLayer::builder(resolver, Locality::cluster(cluster("north")))
        .balancer(ejecting_half())
        .retry(Retry::new(CloneBody))
        .build()
        .layer(http.clone());

    // One request at a time, so the count below is exact.
    let mut retried = 0;
    for i in 0..100 {
        let request = http::Request::post(url("/accrue"))
            .body(Full::new(Bytes::from(format!("order-{i}"))))
            .unwrap();
        let (served, _) = call(&svc, request).await.expect("no request fails");
        assert_ne!(served.addr(), bad.addr);
        retried += usize::from(served.attempts() > 1);
    }
    // Each failed handshake was retried elsewhere; five in a row ejected the endpoint, and
    // no request was sent there after that.
    assert_eq!(
        bad.accepted(),
        5,
        "connections tried to the misnamed endpoint"
    );
    assert_eq!(retried, 5);
    assert!(
        bad.handshakes().is_empty(),
        "no handshake with it completed"
    );

    // Alone, its failure is a typed error naming the endpoint, its cluster and the name.
    let only_bad = StaticResolver::new();
    only_bad.set(&target(PORT), [bad.endpoint()]);
    let svc = McsLayer::new(only_bad, Locality::cluster(cluster("north"))).layer(http);
    let err = call(
        &svc,
        http::Request::get(url("/")).body(Full::default()).unwrap(),
    )
    .await
    .unwrap_err();
    let endpoint = err
        .downcast_ref::<EndpointError>()
        .expect("an EndpointError");
    assert_eq!(
        (endpoint.endpoint(), endpoint.cluster().as_str()),
        (bad.addr, "west")
    );
    let tls_error =
        find::<TlsError>(&*err).unwrap_or_else(|| panic!("no TlsError in {}", report(&*err)));
    assert_eq!(tls_error.endpoint(), Some(bad.addr));
    assert_eq!(tls_error.cluster().map(|c| c.as_str()), Some("west"));
    assert_eq!(tls_error.server_name(), HOST);
    assert!(
        matches!(
            tls_error.rustls(),
            Some(rustls::Error::InvalidCertificate(
                rustls::CertificateError::NotValidForName
                    | rustls::CertificateError::NotValidForNameContext { .. }
            ))
        ),
        "{:?}",
        tls_error.rustls()
    );
    let text = report(&*err);
    for part in [bad.addr.to_string().as_str(), "west", HOST] {
        assert!(text.contains(part), "{part} missing from: {text}");
    }
    bad.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mtls_requires_a_client_certificate_and_picks_up_renewal() {
    let ca = Ca::new("loyalty-ca");
    let identity = ca.server(&[HOST]);
    let mtls = || ServerTls {
        identity: identity.clone(),
        client_ca: Some(ca.roots()),
        // Every request makes a new connection, so a renewal shows at once.
        close_each: true,
    };
    let east = servers(10, 42, 2, "east", mtls).await;
    let resolver = StaticResolver::new();
    resolver.set(&target(PORT), east.iter().map(TlsServer::endpoint));
    let layer = McsLayer::new(resolver.clone(), Locality::cluster(cluster("east")));

    // Without a client certificate the server refuses the connection: a clear TLS error.
    // In TLS 1.3 the refusal is an alert after the client's side of the handshake, so
    // hyper's connection task may read it before the request is handed over; either way
    // the error names the alert. Many connections, so that both orders happen (each on a
    // fresh layer, so that outlier ejection stays out of it).
    let anonymous: Http<_, Empty<Bytes>> = Http::with_connector(
        Client::builder(TokioExecutor::new()),
        Tls::new(ca.client_config(None, &[b"http/1.1"])),
    );
    for _ in 0..40 {
        let fresh = McsLayer::new(resolver.clone(), Locality::cluster(cluster("east")));
        let err = call(&fresh.layer(anonymous.clone()), get("/"))
            .await
            .unwrap_err();
        let alert = find::<rustls::Error>(&*err)
            .unwrap_or_else(|| panic!("no rustls error in {}", report(&*err)));
        assert_eq!(
            *alert,
            rustls::Error::AlertReceived(rustls::AlertDescription::CertificateRequired),
            "{}",
            report(&*err)
        );
        assert!(
            err.downcast_ref::<EndpointError>().is_some(),
            "{}",
            report(&*err)
        );
    }

    // With one, requests pass; a renewed certificate is used by new connections, no restart.
    let first = ca.client("checkout-1");
    let renewed = ca.client("checkout-2");
    let tls = Tls::new(ca.client_config(Some(&first), &[b"http/1.1"]));
    let http: Http<_, Empty<Bytes>> =
        Http::with_connector(Client::builder(TokioExecutor::new()), tls.clone());
    let svc = layer.layer(http);
    for i in 0..20 {
        if i == 10 {
            tls.store(ca.client_config(Some(&renewed), &[b"http/1.1"]));
        }
        call(&svc, get("/accrue")).await.expect("mTLS request");
    }
    let mut presented = HashMap::new();
    for server in &east {
        let certs: Vec<_> = server
            .handshakes()
            .into_iter()
            .map(|h| h.client_cert)
            .collect();
        // On each server, every connection before the renewal shows the first certificate
        // and every one after it the renewed one.
        let switch = certs
            .iter()
            .position(|c| c.as_ref() == Some(renewed.leaf()))
            .unwrap_or(certs.len());
        assert!(
            certs[..switch]
                .iter()
                .all(|c| c.as_ref() == Some(first.leaf()))
        );
        assert!(
            certs[switch..]
                .iter()
                .all(|c| c.as_ref() == Some(renewed.leaf()))
        );
        for c in certs.into_iter().flatten() {
            *presented.entry(c == *first.leaf()).or_insert(0usize) += 1;
        }
    }
    assert_eq!(
        (presented.get(&true), presented.get(&false)),
        (Some(&10), Some(&10)),
        "10 connections with each certificate"
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_server_name_can_be_set_per_service_or_by_a_function() {
    let ca = Ca::new("loyalty-ca");
    // The certificate carries the cluster.local names only.
    let identity = ca.server(&["*.loyalty.svc.cluster.local"]);
    let east = servers(10, 43, 2, "east", || plain_tls(&identity)).await;
    let resolver = StaticResolver::new();
    resolver.set(&target(PORT), east.iter().map(TlsServer::endpoint));
    let layer = McsLayer::new(resolver, Locality::cluster(cluster("east")));
    let config = ca.client_config(None, &[b"http/1.1"]);
    let http = |tls: Tls| -> Http<Tls, Empty<Bytes>> {
        Http::with_connector(Client::builder(TokioExecutor::new()), tls)
    };

    // By default the ClusterSet name is verified, which this certificate does not carry.
    let err = call(&layer.layer(http(Tls::new(config.clone()))), get("/"))
        .await
        .unwrap_err();
    let tls_error = find::<TlsError>(&*err).expect("a TlsError");
    assert_eq!(tls_error.server_name(), HOST);

    let service = ServiceRef::new("loyalty", "loyalty-accrual").unwrap();
    let per_service = Tls::new(config.clone()).server_name_for(service, CLUSTER_LOCAL);
    let by_function = Tls::new(config).server_name(|t: &EndpointTarget| {
        format!(
            "{}.{}.svc.cluster.local",
            t.service().name,
            t.service().namespace
        )
    });
    for tls in [per_service, by_function] {
        let svc = layer.layer(http(tls));
        let (_, answer) = call(&svc, get("/accrue"))
            .await
            .expect("verified by the set name");
        let (_, _, authority, sni) = parse_answer(&answer);
        assert_eq!(sni, CLUSTER_LOCAL, "SNI is the configured name");
        assert_eq!(
            authority,
            format!("{HOST}:{PORT}"),
            "Host stays the ClusterSet name"
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn grpc_over_tls_is_balanced_per_call_with_the_service_authority() {
    let ca = Ca::new("loyalty-ca");
    let good = ca.server(&[HOST]);
    let wrong = ca.server(&["billing.shop.svc.clusterset.local"]);
    let mut all = servers(10, 44, 2, "east", || plain_tls(&good)).await;
    all.extend(servers(20, 44, 2, "west", || plain_tls(&good)).await);
    let bad = TlsServer::start(ip(20, 44, 9), "west", plain_tls(&wrong)).await;
    let resolver = StaticResolver::new();
    resolver.set(
        &target(PORT),
        all.iter().chain([&bad]).map(TlsServer::endpoint),
    );

    // HTTP/2 over TLS (ALPN h2), one connection per endpoint; unary calls retried on
    // connect failures.
    let h2 = Http2::<_, tonic::body::Body>::new(
        hyper::client::conn::http2::Builder::new(TokioExecutor::new()),
        Tls::new(ca.client_config(None, &[b"h2"])),
    );
    let replay = BufferBody::new(64 * 1024, |body: Replay<tonic::body::Body>| {
        tonic::body::Body::new(body)
    });
    let layer = McsLayer::builder(resolver, Locality::cluster(cluster("north")))
        .balancer(ejecting_half())
        .retry(Retry::new(replay))
        .build();
    let origin: http::Uri = format!("https://{HOST}:{PORT}").parse().unwrap();
    let grpc = tonic::client::Grpc::with_origin(layer.layer(h2), origin.clone());

    let mut tasks = tokio::task::JoinSet::new();
    for _ in 0..6 {
        let mut grpc = grpc.clone();
        tasks.spawn(async move {
            let mut seen = Vec::new();
            for _ in 0..30 {
                grpc.ready().await.expect("ready");
                let response = grpc
                    .unary(
                        tonic::Request::new(b"order-1".to_vec()),
                        PathAndQuery::from_static("/loyalty.Accrual/Accrue"),
                        RawCodec,
                    )
                    .await
                    .expect("no gRPC call fails");
                let served = response
                    .extensions()
                    .get::<Served>()
                    .cloned()
                    .expect("Served");
                let answer = String::from_utf8(response.into_inner()).unwrap();
                let (c, addr, authority, sni) = parse_answer(&answer);
                assert_eq!(served.addr(), addr);
                assert_eq!(
                    authority,
                    format!("{HOST}:{PORT}"),
                    ":authority is the service's name"
                );
                assert_eq!(sni, HOST);
                seen.push((c, addr));
            }
            seen
        });
    }
    let mut by_cluster: HashMap<String, usize> = HashMap::new();
    let mut by_addr: HashMap<SocketAddr, usize> = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        for (c, addr) in done.unwrap() {
            *by_cluster.entry(c).or_default() += 1;
            *by_addr.entry(addr).or_default() += 1;
        }
    }
    assert_eq!(by_cluster.values().sum::<usize>(), 180);
    assert_eq!(
        by_addr.len(),
        4,
        "every good endpoint served calls: {by_addr:?}"
    );
    for c in ["east", "west"] {
        assert!(
            by_cluster.get(c).copied().unwrap_or(0) >= 45,
            "{by_cluster:?}"
        );
    }
    for server in &all {
        assert!(
            server
                .handshakes()
                .iter()
                .all(|h| h.alpn.as_deref() == Some(&b"h2"[..])),
            "HTTP/2 negotiated by ALPN"
        );
    }
    assert!(bad.accepted() >= 1, "the misnamed endpoint was tried");
    let handshakes: usize = all.iter().map(|s| s.handshakes().len()).sum();
    assert_eq!(handshakes, 4, "one multiplexed connection per endpoint");

    // hyper-util's pooled client over HTTP/2 works the same way.
    let pooled = Http::<_, tonic::body::Body>::with_connector(
        Client::builder(TokioExecutor::new())
            .http2_only(true)
            .clone(),
        Tls::new(ca.client_config(None, &[b"h2"])),
    );
    let mut grpc = tonic::client::Grpc::with_origin(layer.layer(pooled), origin);
    for _ in 0..20 {
        grpc.ready().await.expect("ready");
        let response = grpc
            .unary(
                tonic::Request::new(b"order-2".to_vec()),
                PathAndQuery::from_static("/loyalty.Accrual/Accrue"),
                RawCodec,
            )
            .await
            .expect("no gRPC call fails");
        let (_, _, authority, _) = parse_answer(&String::from_utf8(response.into_inner()).unwrap());
        assert_eq!(authority, format!("{HOST}:{PORT}"));
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_endpoint_that_leaves_discovery_has_its_connections_closed() {
    let ca = Ca::new("loyalty-ca");
    let identity = ca.server(&[HOST]);
    let east = servers(10, 45, 2, "east", || plain_tls(&identity)).await;
    let resolver = StaticResolver::new();
    let t = target(PORT);
    resolver.set(&t, east.iter().map(TlsServer::endpoint));
    let layer = McsLayer::new(resolver.clone(), Locality::cluster(cluster("east")));
    let http: Http<_, Empty<Bytes>> = Http::with_connector(
        Client::builder(TokioExecutor::new()),
        Tls::new(ca.client_config(None, &[b"http/1.1"])),
    );
    let svc = layer.layer(http);
    for _ in 0..20 {
        call(&svc, get("/accrue")).await.expect("request");
    }
    for server in &east {
        server.wait_connections(|n| *n >= 1).await;
    }
    let (gone, stays) = (&east[0], &east[1]);
    resolver.remove(&t, [gone.addr]);
    assert!(
        layer
            .wait_for_endpoints(&t, |eps| eps.iter().all(|e| e.addr != gone.addr))
            .await
    );
    // Its pool is dropped with it: the server sees its connections close.
    tokio::time::timeout(Duration::from_secs(30), gone.wait_connections(|n| *n == 0))
        .await
        .expect("the removed endpoint's connections were not closed");
    assert!(stays.open_connections() >= 1, "other endpoints keep theirs");
    call(&svc, get("/accrue")).await.expect("still served");
}
