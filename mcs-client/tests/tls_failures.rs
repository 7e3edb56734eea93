//! Every refused or failed TLS handshake is a typed `TlsError`, on both connectors and both
//! TLS versions, every time: real rustls servers on east (127.10.5x.y) and west
//! (127.20.5x.y) loopback addresses, certificates from CAs made in the test.
//!
//! The matrix: TLS 1.2 and 1.3 × `connect::Http` and `connect::Http2` × {no client
//! certificate (the server requires one), a client certificate from another CA, a server
//! certificate from another CA, a server certificate for another name, an expired server
//! certificate}. Each cell makes `CONNECTIONS` fresh connections; each failure must be a
//! `Failure::Tls` holding the expected rustls error, and its one-line Display must name the
//! endpoint, its cluster and the cause. In TLS 1.3 the server sends its verdict on the
//! client certificate after the client's Finished, so the refusal arrives while hyper is
//! already writing the request or reading the answer: that is the case this file is about.
//! Then a POST to the failing endpoint, with another endpoint beside it and retries on, is
//! retried there: the failure is classified as "not processed" on every path.
//!
//! Every request must complete: the layers' request timeout only bounds a request that
//! would never complete, and such a request fails the test with its report. The cause of
//! the hangs seen here: hyper hands requests to a connection's dispatcher over a tokio
//! channel, and a request sent while the dispatcher is being dropped (the server's TLS 1.3
//! refusal ends the connection as the first request is handed over) stays in the channel,
//! unanswered, until the last handle to the connection is dropped. `Http2` no longer keeps
//! such a handle (see `Inner::connect` in `connect/http2.rs`); hyper-util's pooled client
//! behind `Http` holds its connection's handle while it waits for the response, so `Http`'s
//! endpoint service watches the connection and fails such a request with the connection's
//! TLS error when the connection ends (see `HttpEndpoint`).
#![cfg(feature = "tls")]

mod support;
mod tls_support;

use std::net::SocketAddr;
use std::time::Duration;

use bytes::Bytes;
use http_body_util::{BodyExt, Full};
use hyper::client::conn::http2;
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use mcs_client::connect::{Http, Http2, Tls};
use mcs_client::{CloneBody, Failure, McsLayer, Retry, Served, StaticResolver};
use mcs_core::endpoints::{BalancerConfig, Locality, OutlierConfig};
use rustls::{AlertDescription, CertificateError, SupportedProtocolVersion};
use tower::{Layer, Service, ServiceExt};

use support::{HOST, cluster, report, target};
use tls_support::*;

const PORT: u16 = 9443;

/// Fresh connections per cell: 5 cases × 4 cells × 100 handshakes (plus the retry
/// checks) run in a few seconds on two cores.
const CONNECTIONS: usize = 100;

/// What goes wrong in one column of the matrix.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Case {
    /// The server requires a client certificate; the client has none.
    NoClientCertificate,
    /// The server requires a client certificate from its CA; the client's is from another.
    ClientCertificateFromAnotherCa,
    /// The server's certificate is from a CA the client does not trust.
    ServerCertificateFromAnotherCa,
    /// The server's certificate is for another name.
    WrongServerName,
    /// The server's certificate has expired.
    Expired,
}

const CASES: [Case; 5] = [
    Case::NoClientCertificate,
    Case::ClientCertificateFromAnotherCa,
    Case::ServerCertificateFromAnotherCa,
    Case::WrongServerName,
    Case::Expired,
];

impl Case {
    /// The words the one-line Display must contain.
    fn named(self) -> String {
        match self {
            Self::NoClientCertificate => "TLS: certificate required by the server".to_owned(),
            Self::ClientCertificateFromAnotherCa => {
                "TLS: client certificate refused by the server".to_owned()
            }
            Self::ServerCertificateFromAnotherCa => {
                "TLS: certificate issued by an unknown CA".to_owned()
            }
            Self::WrongServerName => format!("TLS: certificate not valid for {HOST}"),
            Self::Expired => "TLS: certificate expired".to_owned(),
        }
    }

    /// Whether the rustls error is the one this case causes.
    fn expected(self, err: &rustls::Error) -> bool {
        use rustls::Error::{AlertReceived, InvalidCertificate};
        match self {
            Self::NoClientCertificate => {
                *err == AlertReceived(AlertDescription::CertificateRequired)
            }
            Self::ClientCertificateFromAnotherCa => matches!(
                err,
                AlertReceived(
                    AlertDescription::UnknownCA
                        | AlertDescription::BadCertificate
                        | AlertDescription::CertificateUnknown
                )
            ),
            Self::ServerCertificateFromAnotherCa => {
                matches!(err, InvalidCertificate(CertificateError::UnknownIssuer))
            }
            Self::WrongServerName => matches!(
                err,
                InvalidCertificate(
                    CertificateError::NotValidForName
                        | CertificateError::NotValidForNameContext { .. }
                )
            ),
            Self::Expired => matches!(
                err,
                InvalidCertificate(
                    CertificateError::Expired | CertificateError::ExpiredContext { .. }
                )
            ),
        }
    }
}

/// The servers and client identity for one case.
struct Setup {
    server: TlsServer,
    /// A server that accepts the same client, for the retry check.
    good: TlsServer,
    client: Option<Identity>,
    /// Trusted by the client.
    ca: Ca,
}

async fn setup(case: Case, second: u8, third: u8, last: u8, cluster_name: &str) -> Setup {
    let ca = Ca::new("loyalty-ca");
    let other = Ca::new("other-ca");
    let good_identity = ca.server(&[HOST]);
    let (identity, client_ca, client) = match case {
        Case::NoClientCertificate => (good_identity.clone(), Some(ca.roots()), None),
        Case::ClientCertificateFromAnotherCa => (
            good_identity.clone(),
            Some(ca.roots()),
            Some(other.client("checkout")),
        ),
        Case::ServerCertificateFromAnotherCa => (other.server(&[HOST]), None, None),
        Case::WrongServerName => (
            ca.server(&["billing.shop.svc.clusterset.local"]),
            None,
            None,
        ),
        Case::Expired => (ca.expired_server(&[HOST]), None, None),
    };
    let ip = |last| SocketAddr::from(([127, second, third, last], 0));
    let server = TlsServer::start(
        ip(last),
        cluster_name,
        ServerTls {
            identity,
            client_ca,
            close_each: false,
        },
    )
    .await;
    let good = TlsServer::start(
        ip(last + 100),
        cluster_name,
        ServerTls {
            identity: good_identity,
            client_ca: None,
            close_each: false,
        },
    )
    .await;
    Setup {
        server,
        good,
        client,
        ca,
    }
}

fn no_ejection() -> BalancerConfig {
    BalancerConfig::default().outlier(OutlierConfig::disabled())
}

#[derive(Clone, Copy, Debug)]
enum Connector {
    Http,
    Http2,
}

/// What one cell saw.
#[derive(Default)]
struct Tally {
    /// Connections the server accepted.
    connections: usize,
    /// Requests that did not complete within the request timeout (see the module docs), by
    /// their report.
    hung: Vec<String>,
    typed: usize,
    named: usize,
    /// Failures that were not the expected `Failure::Tls`, by their report.
    untyped: Vec<String>,
    /// Lines that did not name the endpoint, its cluster and the cause.
    unnamed: Vec<String>,
    /// POSTs that met the failing endpoint and were sent again to the good one.
    retried: usize,
    /// POSTs that failed: not retried.
    not_retried: Vec<String>,
}

/// Sends `CONNECTIONS` requests to the case's server alone, then POSTs with a good server
/// beside it.
async fn cell<S, R, B>(
    case: Case,
    setup: &Setup,
    svc: S,
    retrying: R,
    body: impl Fn() -> B,
    cluster_name: &str,
) -> Tally
where
    S: Service<
            http::Request<B>,
            Response = http::Response<hyper::body::Incoming>,
            Error = tower::BoxError,
        > + Clone,
    R: Service<
            http::Request<B>,
            Response = http::Response<hyper::body::Incoming>,
            Error = tower::BoxError,
        > + Clone,
{
    let mut tally = Tally::default();
    let accepted_before = setup.server.accepted();
    for _ in 0..CONNECTIONS {
        let request = http::Request::post(format!("https://{HOST}:{PORT}/accrue"))
            .body(body())
            .unwrap();
        let err = svc
            .clone()
            .oneshot(request)
            .await
            .expect_err("the handshake fails");
        match Failure::of(&*err) {
            Failure::Timeout => {
                tally.hung.push(report(&*err));
                continue;
            }
            Failure::Tls(tls)
                if tls.rustls().is_some_and(|e| case.expected(e))
                    && tls.endpoint() == Some(setup.server.addr)
                    && tls.cluster().map(|c| c.as_str()) == Some(cluster_name)
                    && tls.server_name() == HOST =>
            {
                tally.typed += 1;
            }
            other => tally.untyped.push(format!("{other:?}: {}", report(&*err))),
        }
        let line = err.to_string();
        let addr = setup.server.addr.to_string();
        let where_ = format!("at endpoint {addr} in cluster {cluster_name}");
        if line.contains(&where_) && line.contains(&case.named()) {
            tally.named += 1;
        } else {
            tally.unnamed.push(line);
        }
    }
    tally.connections = setup.server.accepted() - accepted_before;

    // With a good endpoint beside it and retries on, a POST that met the failure went to
    // the other endpoint: the failure is one the request was not processed in.
    for i in 0..20 {
        let request = http::Request::post(format!("https://{HOST}:{PORT}/accrue/{i}"))
            .body(body())
            .unwrap();
        match retrying.clone().oneshot(request).await {
            Ok(response) => {
                let served = response.extensions().get::<Served>().cloned().unwrap();
                let _ = response.into_body().collect().await;
                assert_eq!(served.addr(), setup.good.addr, "{case:?}");
                tally.retried += usize::from(served.attempts() > 1);
            }
            Err(e) if matches!(Failure::of(&*e), Failure::Timeout) => {
                tally.hung.push(format!("POST: {}", report(&*e)));
            }
            Err(e) => tally.not_retried.push(report(&*e)),
        }
    }
    tally
}

async fn matrix(version: &'static SupportedProtocolVersion, connector: Connector, third: u8) {
    let mut failures = Vec::new();
    let mut summary = Vec::new();
    for (i, case) in CASES.into_iter().enumerate() {
        // Alternate clusters, so that the cluster in each line is the endpoint's own.
        let (second, cluster_name) = if i % 2 == 0 {
            (10, "east")
        } else {
            (20, "west")
        };
        let last = u8::try_from(i + 1).unwrap();
        let setup = setup(case, second, third, last, cluster_name).await;
        let alone = StaticResolver::new();
        alone.set(&target(PORT), [setup.server.endpoint()]);
        let both = StaticResolver::new();
        both.set(
            &target(PORT),
            [setup.server.endpoint(), setup.good.endpoint()],
        );
        // The request timeout only bounds a request that would never complete (see the
        // module docs): such a request fails the test, instead of hanging it.
        let layer = McsLayer::builder(alone, Locality::cluster(cluster("north")))
            .balancer(no_ejection())
            .request_timeout(Duration::from_secs(10))
            .build();
        let retry_layer = McsLayer::builder(both, Locality::cluster(cluster("north")))
            .balancer(no_ejection())
            .request_timeout(Duration::from_secs(10))
            .retry(Retry::new(CloneBody).budget(1.0, 1_000, Duration::from_secs(10)))
            .build();
        let versions = [version];
        let tally = match connector {
            Connector::Http => {
                let tls = Tls::new(setup.ca.client_config_for(
                    setup.client.as_ref(),
                    &[b"http/1.1"],
                    &versions,
                ));
                let http: Http<_, Full<Bytes>> =
                    Http::with_connector(Client::builder(TokioExecutor::new()), tls);
                cell(
                    case,
                    &setup,
                    layer.layer(http.clone()),
                    retry_layer.layer(http),
                    || Full::new(Bytes::from_static(b"points=10")),
                    cluster_name,
                )
                .await
            }
            Connector::Http2 => {
                let tls = Tls::new(setup.ca.client_config_for(
                    setup.client.as_ref(),
                    &[b"h2"],
                    &versions,
                ));
                let h2: Http2<_, Full<Bytes>> =
                    Http2::new(http2::Builder::new(TokioExecutor::new()), tls);
                cell(
                    case,
                    &setup,
                    layer.layer(h2.clone()),
                    retry_layer.layer(h2),
                    || Full::new(Bytes::from_static(b"points=10")),
                    cluster_name,
                )
                .await
            }
        };
        summary.push(format!(
            "{case:?}: {} of {CONNECTIONS} typed, {} of {CONNECTIONS} named, {} hung, {} connections, {} of 20 POSTs retried, {} failed",
            tally.typed,
            tally.named,
            tally.hung.len(),
            tally.connections,
            tally.retried,
            tally.not_retried.len()
        ));
        if !tally.hung.is_empty() {
            failures.push(format!(
                "{case:?}: {} requests never completed, e.g. {:?}",
                tally.hung.len(),
                tally.hung.first()
            ));
        }
        if tally.retried == 0 {
            failures.push(format!(
                "{case:?}: no POST met the failing endpoint, the retry path was not exercised"
            ));
        }
        if !tally.not_retried.is_empty() {
            failures.push(format!(
                "{case:?}: {} of 20 POSTs not sent again after the failure, e.g. {:?}",
                tally.not_retried.len(),
                tally.not_retried.first()
            ));
        }
        if tally.connections != CONNECTIONS {
            failures.push(format!(
                "{case:?}: {} connections for {CONNECTIONS} requests, not one fresh connection each",
                tally.connections
            ));
        }
        let hung = tally.hung.iter().filter(|h| !h.starts_with("POST")).count();
        if tally.typed + hung != CONNECTIONS || tally.named + hung != CONNECTIONS {
            failures.push(format!(
                "{case:?}: not the expected TlsError ({}), e.g. {:?}; line without the cause ({}), e.g. {:?}",
                tally.untyped.len(),
                tally.untyped.first(),
                tally.unnamed.len(),
                tally.unnamed.first()
            ));
        }
        setup.server.stop().await;
        setup.good.stop().await;
    }
    assert!(
        failures.is_empty(),
        "{version:?} over {connector:?}:\n{}\n{}",
        summary.join("\n"),
        failures.join("\n")
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_over_http() {
    matrix(&rustls::version::TLS12, Connector::Http, 50).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls12_over_http2() {
    matrix(&rustls::version::TLS12, Connector::Http2, 51).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls13_over_http() {
    matrix(&rustls::version::TLS13, Connector::Http, 52).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls13_over_http2() {
    matrix(&rustls::version::TLS13, Connector::Http2, 53).await;
}
