//! Every kind of failure, logged the way a caller logs it (`{err}`), says what went wrong
//! and where: the endpoint and its cluster for failures at an endpoint, the service for the
//! layer's own. Each is also its kind through the one accessor, `Failure::of`. Real servers
//! on loopback addresses: none listening (refused), one that resets the connection after
//! reading the request, one that never answers (timeout), HTTP/2 servers that refuse the
//! stream or send a GOAWAY, and a test server answering 503. (TLS failures have their own
//! matrix in `tls_failures.rs`.)

mod support;

use std::net::{IpAddr, SocketAddr};
use std::time::Duration;

use bytes::Bytes;
use http_body_util::Full;
use hyper_util::rt::TokioExecutor;
use mcs_client::connect::{Http2, Tcp};
use mcs_client::{DnsResolver, Failure, McsLayer, Served, StaticResolver};
use mcs_core::discovery::Endpoint;
use mcs_core::endpoints::Locality;
use tokio::io::AsyncReadExt;
use tokio::net::TcpListener;
use tower::{BoxError, Service, ServiceBuilder, ServiceExt};

use support::h2_servers::{go_away_server, refusing_server};
use support::*;

const SERVICE: &str = "loyalty/loyalty-accrual:9443";

/// What `{err}` must read for a failure at `addr` in cluster east: the endpoint, its cluster
/// and `cause`.
fn at_east(addr: SocketAddr, cause: &str) -> String {
    format!("request to {SERVICE} failed at endpoint {addr} in cluster east: {cause}")
}

/// `err` is of the kind `is` accepts (through `Failure::of`), and `{err}` reads `line`.
fn assert_failure(err: &BoxError, is: fn(&Failure<'_>) -> bool, line: &str) {
    assert!(is(&Failure::of(&**err)), "{}", report(&**err));
    assert_eq!(err.to_string(), line);
}

/// One GET through the layer (no retries) to the single endpoint `addr` in east, over
/// `endpoints` (a hyper-util client per endpoint, or `Http2`).
async fn call<M>(addr: SocketAddr, endpoints: M, timeout: Option<Duration>) -> BoxError
where
    M: mcs_client::connect::MakeEndpoint,
    M::Service: Service<
            http::Request<Full<Bytes>>,
            Response = http::Response<hyper::body::Incoming>,
            Error: Into<BoxError>,
            Future: Send,
        > + Clone
        + Send
        + 'static,
{
    let resolver = StaticResolver::new();
    resolver.set(&target(9443), [Endpoint::ready(addr, cluster("east"))]);
    let mut builder = McsLayer::builder(resolver, Locality::cluster(cluster("east")));
    if let Some(timeout) = timeout {
        builder = builder.request_timeout(timeout);
    }
    let svc = ServiceBuilder::new()
        .layer(builder.build())
        .service(endpoints);
    match svc.oneshot(get(9443, "/")).await {
        Ok(response) => panic!("answered {}", response.status()),
        Err(err) => err,
    }
}

fn http2() -> Http2<Tcp, Full<Bytes>> {
    Http2::new(
        hyper::client::conn::http2::Builder::new(TokioExecutor::new()),
        Tcp::new(),
    )
}

/// A port on `ip` that nobody listens on.
async fn closed_port(ip: IpAddr) -> SocketAddr {
    let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await.unwrap();
    listener.local_addr().unwrap()
}

/// A server on `ip` that reads each connection's request head, then resets the connection
/// (`SO_LINGER` 0) without answering, or with `answer == false` holds it open and silent.
async fn unanswering_server(ip: IpAddr, reset: bool) -> SocketAddr {
    let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        while let Ok((mut socket, _)) = listener.accept().await {
            tokio::spawn(async move {
                let mut head = Vec::new();
                let mut buf = [0u8; 1024];
                while !head.windows(4).any(|w| w == b"\r\n\r\n") {
                    match socket.read(&mut buf).await {
                        Ok(n) if n > 0 => head.extend_from_slice(&buf[..n]),
                        _ => return,
                    }
                }
                if reset {
                    socket.set_zero_linger().unwrap();
                    drop(socket);
                } else {
                    while matches!(socket.read(&mut buf).await, Ok(n) if n > 0) {}
                }
            });
        }
    });
    addr
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_connection_names_the_endpoint_and_says_refused() {
    let addr = closed_port(IpAddr::from([127, 10, 60, 1])).await;
    let err = call(addr, http1(), None).await;
    assert_failure(
        &err,
        |f| matches!(f, Failure::ConnectionRefused),
        &at_east(addr, "connection refused"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_reset_connection_says_reset() {
    let addr = unanswering_server(IpAddr::from([127, 10, 60, 2]), true).await;
    let err = call(addr, http1(), None).await;
    assert_failure(
        &err,
        |f| matches!(f, Failure::ConnectionClosed),
        &at_east(addr, "connection reset"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_silent_endpoint_times_out_with_the_endpoint_and_the_timeout() {
    let addr = unanswering_server(IpAddr::from([127, 10, 60, 3]), false).await;
    let err = call(addr, http1(), Some(Duration::from_millis(300))).await;
    assert_failure(
        &err,
        |f| matches!(f, Failure::Timeout),
        &at_east(addr, "timed out after 300ms"),
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_refused_http2_stream_says_refused_stream() {
    let (addr, seen) = refusing_server(IpAddr::from([127, 10, 60, 4])).await;
    let err = call(addr, http2(), None).await;
    assert_failure(
        &err,
        |f| matches!(f, Failure::NotProcessed),
        &at_east(addr, "HTTP/2 stream refused by the server (REFUSED_STREAM)"),
    );
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stream_above_a_go_away_says_go_away() {
    let (addr, seen, _written) = go_away_server(IpAddr::from([127, 10, 60, 5]), false, false).await;
    let err = call(addr, http2(), None).await;
    assert_failure(
        &err,
        |f| matches!(f, Failure::NotProcessed),
        &at_east(
            addr,
            "HTTP/2 GOAWAY: the server did not process the request",
        ),
    );
    assert_eq!(seen.load(std::sync::atomic::Ordering::SeqCst), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_layers_own_failures_name_the_service_and_why() {
    let resolver = StaticResolver::new();
    let (gone, empty) = (target(9001), target(9002));
    resolver.does_not_exist(&gone);
    resolver.set(&empty, []);
    let layer = McsLayer::builder(resolver, Locality::cluster(cluster("east")))
        .fail_fast(Duration::from_millis(200))
        .build();
    let svc = ServiceBuilder::new().layer(layer).service(http1());
    let mut errors = Vec::new();
    for port in [9001, 9002] {
        match svc.clone().oneshot(get(port, "/")).await {
            Ok(response) => panic!("port {port} answered {}", response.status()),
            Err(err) => errors.push(err),
        }
    }
    let lines: Vec<_> = errors
        .iter()
        .map(|err| (Failure::of(&**err), err.to_string()))
        .collect();
    assert!(
        matches!(lines[0].0, Failure::DoesNotExist),
        "{}",
        lines[0].1
    );
    assert_eq!(
        lines[0].1,
        "service loyalty/loyalty-accrual:9001 does not exist in the ClusterSet"
    );
    assert!(matches!(lines[1].0, Failure::NoEndpoints), "{}", lines[1].1);
    assert!(
        lines[1]
            .1
            .starts_with("no endpoints for loyalty/loyalty-accrual:9002: none ready for "),
        "{}",
        lines[1].1
    );
}

/// Discovery failing (here: no DNS server where the resolver sends its queries) is a
/// `Resolve` failure that names the service and the resolver's reason.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_failing_resolver_names_the_service_and_its_reason() {
    let dns = DnsResolver::builder()
        .name_server(closed_port(IpAddr::from([127, 10, 60, 7])).await)
        .query_timeout(Duration::from_millis(200), 1)
        .build()
        .unwrap();
    let layer = McsLayer::builder(dns, Locality::cluster(cluster("east")))
        .resolution_timeout(Duration::from_secs(1))
        .build();
    let svc = ServiceBuilder::new().layer(layer).service(http1());
    let err = match svc.oneshot(get(9443, "/")).await {
        Ok(response) => panic!("answered {}", response.status()),
        Err(err) => err,
    };
    assert!(
        matches!(Failure::of(&*err), Failure::Resolve),
        "{}",
        report(&*err)
    );
    let line = err.to_string();
    // The resolver's reason: which query failed, and how (hickory's words).
    let prefix = format!("resolve failed for {SERVICE}: SRV {HOST}.: ");
    assert!(line.starts_with(&prefix), "{line}");
    assert!(
        !line.contains("has not answered"),
        "the resolver's reason is lost: {line}"
    );
}

/// A 5xx is a response, not an error: it reaches the caller, marked as counted against its
/// endpoint, and `{served}` says where it came from.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_server_error_is_marked_on_the_response_with_its_endpoint() {
    let server = TestServer::start(IpAddr::from([127, 10, 60, 6]), 0, "east").await;
    let resolver = StaticResolver::new();
    resolver.set(&target(9443), [server.endpoint()]);
    let svc = ServiceBuilder::new()
        .layer(McsLayer::new(resolver, Locality::cluster(cluster("east"))))
        .service(http1());
    let served = |response: &http::Response<_>| {
        response
            .extensions()
            .get::<Served>()
            .expect("a balanced response carries Served")
            .clone()
    };

    let ok = svc.clone().oneshot(get(9443, "/")).await.unwrap();
    assert!(!served(&ok).counted_as_failure());
    assert_eq!(
        served(&ok).to_string(),
        format!("endpoint {} in cluster east", server.addr)
    );

    server.set_status(503);
    let unavailable = svc.clone().oneshot(get(9443, "/")).await.unwrap();
    assert!(served(&unavailable).counted_as_failure());
    assert_eq!(
        format!("{} from {}", unavailable.status(), served(&unavailable)),
        format!(
            "503 Service Unavailable from endpoint {} in cluster east (counted as an endpoint failure)",
            server.addr
        )
    );
}
