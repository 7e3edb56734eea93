//! A real reqwest client resolving `*.svc.clusterset.local` through `ClusterSetDns`, against
//! HTTP and HTTPS servers on east and west loopback addresses: local cluster first, failover
//! to west when east's servers stop, a refusing endpoint ejected by connect outcomes, TLS
//! verified against the ClusterSet name, other names through the system resolver, and the
//! typed errors.

mod support;
mod tls_support;

use std::collections::BTreeSet;
use std::error::Error as StdError;
use std::net::{IpAddr, SocketAddr};
use std::str::FromStr;
use std::sync::Arc;

use mcs_client::reqwest::ClusterSetDns;
use mcs_client::{McsLayer, StaticResolver};
use mcs_core::endpoints::Locality;
use mcs_core::name::ServiceRef;
use reqwest::dns::{Name, Resolve};

use support::*;
use tls_support::{Ca, ServerTls, TlsServer, parse_answer};

/// A client that opens a connection per request (so every request is a pick; see the
/// module docs of `mcs_client::reqwest`), with the resolver and its connect outcomes.
fn http_client(dns: &ClusterSetDns) -> reqwest::Client {
    // reqwest's `rustls-no-provider` needs a process-wide provider for its own TLS setup.
    let _ = rustls::crypto::ring::default_provider().install_default();
    reqwest::Client::builder()
        .dns_resolver(Arc::new(dns.clone()))
        .connector_layer(dns.connect_outcomes())
        .pool_max_idle_per_host(0)
        .no_proxy()
        .build()
        .expect("a reqwest client")
}

/// GETs `url` and reads the test server's answer `(cluster, addr, host header)`.
async fn get_answer(client: &reqwest::Client, url: &str) -> (String, SocketAddr, String) {
    let response = client
        .get(url)
        .send()
        .await
        .unwrap_or_else(|e| panic!("GET {url}: {}", report(&e)));
    assert!(
        response.status().is_success(),
        "GET {url}: {}",
        response.status()
    );
    let text = response.text().await.expect("a body");
    let mut parts = text.split(' ');
    let cluster = parts.next().unwrap().to_owned();
    let addr = parts.next().unwrap().parse().unwrap();
    let host = parts.next().unwrap_or_default().to_owned();
    (cluster, addr, host)
}

/// The `mcs_client::Error` somewhere in `err`'s sources.
fn mcs_error<'a>(err: &'a (dyn StdError + 'static)) -> Option<&'a mcs_client::Error> {
    let mut next = Some(err);
    while let Some(e) = next {
        if let Some(found) = e.downcast_ref::<mcs_client::Error>() {
            return Some(found);
        }
        next = e.source();
    }
    None
}

/// What the resolver answers for a new connection to the service now.
async fn answered(dns: &ClusterSetDns) -> Vec<SocketAddr> {
    dns.resolve(Name::from_str(HOST).unwrap())
        .await
        .expect("the service resolves")
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_cluster_first_then_west_when_east_stops() {
    const PORT: u16 = 19471;
    let east = servers(47, 1, 3, PORT, "east").await;
    let west = servers(47, 2, 3, PORT, "west").await;
    let resolver = StaticResolver::new();
    resolver.set(
        &target(PORT),
        east.iter().chain(&west).map(TestServer::endpoint),
    );
    // Through a layer, to wait for discovery with `wait_for_endpoints`.
    let layer = McsLayer::new(resolver.clone(), Locality::cluster(cluster("east")));
    let dns = ClusterSetDns::from_layer(&layer).port(PORT);
    let client = http_client(&dns);
    let url = format!("http://{HOST}:{PORT}/accrue");

    // Local first: every request is served in east, over more than one of its endpoints,
    // with the ClusterSet name as Host.
    let mut seen = BTreeSet::new();
    for _ in 0..30 {
        let (cluster, addr, host) = get_answer(&client, &url).await;
        assert_eq!(cluster, "east", "served by {addr}");
        assert_eq!(host, format!("{HOST}:{PORT}"));
        seen.insert(addr);
    }
    assert!(seen.len() > 1, "30 connections all went to {seen:?}");
    // The answer for a connection: an east endpoint first, and a west one to fail over to.
    let answer = answered(&dns).await;
    assert!(east.iter().any(|s| s.addr == answer[0]), "{answer:?}");
    assert!(
        west.iter().any(|s| answer.contains(&s.addr)),
        "no west endpoint in {answer:?}"
    );

    // East's servers stop; discovery still lists them (as it would until their slices
    // change). Every request is answered, by west: the connector moves on from refused
    // east addresses to the west one in the same answer.
    for server in east {
        server.stop().await;
    }
    for i in 0..30 {
        let (cluster, addr, _) = get_answer(&client, &url).await;
        assert_eq!(
            cluster, "west",
            "request {i} after east stopped, served by {addr}"
        );
    }

    // Discovery drops east: answers are west only.
    resolver.set(&target(PORT), west.iter().map(TestServer::endpoint));
    assert!(
        layer
            .wait_for_endpoints(&target(PORT), |eps| eps
                .iter()
                .all(|e| e.cluster.as_str() == "west"))
            .await
    );
    let west_addrs: BTreeSet<SocketAddr> = west.iter().map(|s| s.addr).collect();
    for _ in 0..10 {
        let answer = answered(&dns).await;
        assert!(answer.iter().all(|a| west_addrs.contains(a)), "{answer:?}");
    }
    for server in west {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn refusing_endpoint_is_ejected_by_connect_outcomes() {
    const PORT: u16 = 19472;
    let east = servers(47, 3, 2, PORT, "east").await;
    let west = servers(47, 4, 3, PORT, "west").await;
    // Listed by discovery, nothing listening: connections to it are refused.
    let dead = SocketAddr::new(IpAddr::from([127, 47, 3, 9]), PORT);
    let resolver = StaticResolver::new();
    resolver.set(
        &target(PORT),
        east.iter()
            .chain(&west)
            .map(TestServer::endpoint)
            .chain([mcs_core::discovery::Endpoint::ready(dead, cluster("east"))]),
    );
    // Shared with a layer, as an application using both would.
    let layer = McsLayer::new(resolver, Locality::cluster(cluster("east")));
    let dns = ClusterSetDns::from_layer(&layer)
        .service_port(ServiceRef::new("loyalty", "loyalty-accrual").unwrap(), PORT);
    let client = http_client(&dns);
    let url = format!("http://{HOST}:{PORT}/");

    // Every request succeeds (a connection refused by the dead endpoint moves on to the
    // next address); five refusals in a row eject it, and then answers leave it out. A
    // connection picks it first a third of the time, so 300 requests are plenty.
    let mut requests = 0;
    while answered(&dns).await.contains(&dead) {
        requests += 1;
        assert!(requests <= 300, "the refusing endpoint was never ejected");
        let (cluster, addr, _) = get_answer(&client, &url).await;
        assert_eq!(cluster, "east", "served by {addr}");
    }
    // Ejected, it stays out of every answer while the others keep serving. (East's tier is
    // now 2/3 healthy, under 1/1.4 with the default overprovisioning, so about 7 % of new
    // connections spill to west.)
    for _ in 0..20 {
        assert!(!answered(&dns).await.contains(&dead));
        get_answer(&client, &url).await;
    }
    // The layer sees the same endpoint set.
    assert_eq!(layer.endpoints(&target(PORT)).map(|e| e.len()), Some(6));
    for server in east.into_iter().chain(west) {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn url_without_port_uses_the_endpoints_ports() {
    // Pods listening on other ports than the service port (targetPort): the URL names no
    // port, so the connector keeps each endpoint's own.
    const SERVICE_PORT: u16 = 80;
    let east = servers(47, 5, 2, 0, "east").await;
    let resolver = StaticResolver::new();
    resolver.set(&target(SERVICE_PORT), east.iter().map(TestServer::endpoint));
    let dns = ClusterSetDns::new(resolver, Locality::cluster(cluster("east"))).port(SERVICE_PORT);
    let client = http_client(&dns);
    let ports: BTreeSet<u16> = east.iter().map(|s| s.addr.port()).collect();
    for _ in 0..10 {
        let (cluster, addr, host) = get_answer(&client, &format!("http://{HOST}/")).await;
        assert_eq!(cluster, "east");
        assert!(
            ports.contains(&addr.port()),
            "{addr} is not an endpoint's address"
        );
        assert_eq!(host, HOST);
    }
    for server in east {
        server.stop().await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn tls_verifies_the_clusterset_name() {
    const PORT: u16 = 19473;
    let ca = Ca::new("reqwest-test-ca");
    let good = ca.server(&[HOST]);
    let wrong = ca.server(&["loyalty-accrual.loyalty.svc.cluster.local"]);
    let tls = |identity: &tls_support::Identity| ServerTls {
        identity: identity.clone(),
        client_ca: None,
        close_each: false,
    };
    let east = TlsServer::start(
        SocketAddr::new(IpAddr::from([127, 47, 6, 1]), PORT),
        "east",
        tls(&good),
    )
    .await;
    let west = TlsServer::start(
        SocketAddr::new(IpAddr::from([127, 47, 7, 1]), PORT),
        "west",
        tls(&good),
    )
    .await;
    let resolver = StaticResolver::new();
    resolver.set(&target(PORT), [east.endpoint(), west.endpoint()]);
    let layer = McsLayer::new(resolver.clone(), Locality::cluster(cluster("east")));
    let dns = ClusterSetDns::from_layer(&layer).port(PORT);
    let https = |dns: &ClusterSetDns| {
        reqwest::Client::builder()
            .dns_resolver(Arc::new(dns.clone()))
            .connector_layer(dns.connect_outcomes())
            .use_preconfigured_tls(ca.client_config(None, &[b"http/1.1"]))
            .no_proxy()
            .build()
            .expect("a reqwest client")
    };
    let client = https(&dns);
    let url = format!("https://{HOST}:{PORT}/");

    // Verified against, and sent as SNI, the ClusterSet name; served locally.
    let text = client
        .get(&url)
        .send()
        .await
        .expect("HTTPS to east")
        .text()
        .await
        .unwrap();
    let (cluster, addr, authority, sni) = parse_answer(&text);
    assert_eq!((cluster.as_str(), addr), ("east", east.addr));
    assert_eq!(authority, format!("{HOST}:{PORT}"));
    assert_eq!(sni, HOST);

    // East stops: the next connection goes to west, verified the same way.
    east.stop().await;
    let client = https(&dns); // a new pool, so a new connection
    let text = client
        .get(&url)
        .send()
        .await
        .expect("HTTPS to west")
        .text()
        .await
        .unwrap();
    let (cluster, _, _, sni) = parse_answer(&text);
    assert_eq!((cluster.as_str(), sni.as_str()), ("west", HOST));

    // A server whose certificate lacks the ClusterSet name is refused by the handshake.
    let imposter = TlsServer::start(
        SocketAddr::new(IpAddr::from([127, 47, 8, 1]), PORT),
        "west",
        tls(&wrong),
    )
    .await;
    resolver.set(&target(PORT), [imposter.endpoint()]);
    assert!(
        layer
            .wait_for_endpoints(&target(PORT), |eps| eps
                .iter()
                .all(|e| e.addr == imposter.addr))
            .await
    );
    let err = https(&dns)
        .get(&url)
        .send()
        .await
        .expect_err("the imposter's certificate is refused");
    let text = report(&err);
    assert!(
        text.contains("not valid for name") || text.contains("NotValidForName"),
        "{text}"
    );
    assert!(
        imposter.handshakes().is_empty(),
        "no handshake may complete with the imposter"
    );
    west.stop().await;
    imposter.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_names_use_the_system_resolver_and_errors_are_typed() {
    let local = TestServer::start(IpAddr::from([127, 0, 0, 1]), 0, "plain").await;
    let resolver = StaticResolver::new();
    let dns = ClusterSetDns::new(resolver.clone(), Locality::cluster(cluster("east")));
    let client = http_client(&dns);

    // Outside the zone: the system resolver, as reqwest's default.
    let (name, addr, _) =
        get_answer(&client, &format!("http://localhost:{}/", local.addr.port())).await;
    assert_eq!((name.as_str(), addr), ("plain", local.addr));

    // No service port configured: reqwest cannot say which port the name stands for.
    let err = client
        .get(format!("http://{HOST}:9443/"))
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(mcs_error(&err), Some(mcs_client::Error::NoServicePort { host }) if host == HOST),
        "{}",
        report(&err)
    );

    // A service discovery says does not exist.
    let dns = dns.port(9443);
    resolver.does_not_exist(&target(9443));
    let err = http_client(&dns)
        .get(format!("http://{HOST}:9443/"))
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(mcs_error(&err), Some(mcs_client::Error::DoesNotExist { service }) if service == "loyalty/loyalty-accrual:9443"),
        "{}",
        report(&err)
    );

    // Not a service name.
    let err = http_client(&dns)
        .get("http://loyalty.svc.clusterset.local/")
        .send()
        .await
        .unwrap_err();
    assert!(
        matches!(mcs_error(&err), Some(mcs_client::Error::NotAService { .. })),
        "{}",
        report(&err)
    );
    local.stop().await;
}
