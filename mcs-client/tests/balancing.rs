//! Balancing through the layer to real HTTP servers on loopback addresses:
//! 127.10.x.y stand for pods in `east`, 127.20.x.y for pods in `west`.

mod support;

use std::collections::HashMap;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::time::Duration;

use http_body_util::BodyExt;
use mcs_client::{McsLayer, Served, StaticResolver};
use mcs_core::endpoints::{BalancerConfig, Locality, OutlierConfig};
use tokio::sync::watch;
use tower::{Service, ServiceBuilder, ServiceExt};

use support::*;

/// Outlier detection that reacts within a test: eject after 3 failures for `base`, and
/// allow half the set to be ejected.
#[expect(
    clippy::field_reassign_with_default,
    reason = "OutlierConfig may become #[non_exhaustive]; field assignment stays valid then"
)]
fn fast_outliers(base: Duration) -> BalancerConfig {
    let mut outlier = OutlierConfig::default();
    outlier.consecutive_failures = 3;
    outlier.base_ejection = base;
    outlier.max_ejection = base;
    outlier.max_ejection_percent = 50;
    BalancerConfig::default().outlier(outlier)
}

/// Sends `n` requests, `concurrency` at a time; returns the count per serving address and
/// per cluster. Panics on any failed request.
async fn load<S>(
    svc: &S,
    port: u16,
    n: usize,
    concurrency: usize,
) -> (HashMap<SocketAddr, usize>, HashMap<String, usize>)
where
    S: Service<
            http::Request<http_body_util::Full<bytes::Bytes>>,
            Response = http::Response<hyper::body::Incoming>,
            Error = tower::BoxError,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    load_reporting(svc, port, n, concurrency, None).await
}

/// [`load`], counting completed requests into `progress`.
async fn load_reporting<S>(
    svc: &S,
    port: u16,
    n: usize,
    concurrency: usize,
    progress: Option<Arc<watch::Sender<usize>>>,
) -> (HashMap<SocketAddr, usize>, HashMap<String, usize>)
where
    S: Service<
            http::Request<http_body_util::Full<bytes::Bytes>>,
            Response = http::Response<hyper::body::Incoming>,
            Error = tower::BoxError,
        > + Clone
        + Send
        + 'static,
    S::Future: Send,
{
    let mut tasks = tokio::task::JoinSet::new();
    for w in 0..concurrency {
        let svc = svc.clone();
        let progress = progress.clone();
        let share = n / concurrency + usize::from(w < n % concurrency);
        tasks.spawn(async move {
            let mut seen = Vec::with_capacity(share);
            for _ in 0..share {
                let response = svc
                    .clone()
                    .oneshot(get(port, "/accrue"))
                    .await
                    .expect("request failed");
                assert!(
                    response.status().is_success(),
                    "status {}",
                    response.status()
                );
                let served = response
                    .extensions()
                    .get::<Served>()
                    .cloned()
                    .expect("Served extension");
                let (cluster, addr, host) = answer(response).await;
                assert_eq!(
                    served.addr(),
                    addr,
                    "Served names the endpoint that answered"
                );
                assert_eq!(served.cluster().as_str(), cluster);
                assert_eq!(
                    host,
                    format!("{HOST}:{port}"),
                    "the server sees the original Host"
                );
                seen.push((addr, cluster));
                if let Some(progress) = &progress {
                    progress.send_modify(|n| *n += 1);
                }
            }
            seen
        });
    }
    let mut by_addr = HashMap::new();
    let mut by_cluster = HashMap::new();
    while let Some(done) = tasks.join_next().await {
        for (addr, cluster) in done.unwrap() {
            *by_addr.entry(addr).or_default() += 1;
            *by_cluster.entry(cluster).or_default() += 1;
        }
    }
    (by_addr, by_cluster)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn balances_across_clusters_from_a_third_cluster() {
    let east = servers(10, 1, 3, 0, "east").await;
    let west = servers(20, 1, 3, 0, "west").await;
    let resolver = StaticResolver::new();
    resolver.set(
        &target(9443),
        east.iter().chain(&west).map(TestServer::endpoint),
    );
    let layer = McsLayer::new(resolver, Locality::cluster(cluster("north")));
    let svc = ServiceBuilder::new().layer(layer).service(http1());

    let (by_addr, by_cluster) = load(&svc, 9443, 600, 8).await;
    assert_eq!(by_cluster.values().sum::<usize>(), 600);
    for c in ["east", "west"] {
        let n = by_cluster.get(c).copied().unwrap_or(0);
        assert!(n >= 180, "{c} got {n} of 600: {by_cluster:?}");
    }
    for s in east.iter().chain(&west) {
        assert!(
            by_addr.get(&s.addr).copied().unwrap_or(0) >= 40,
            "{} starved: {by_addr:?}",
            s.addr
        );
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn local_first_then_spill_over_then_back() {
    let east = servers(10, 2, 2, 0, "east").await;
    let west = servers(20, 2, 4, 0, "west").await;
    let resolver = StaticResolver::new();
    resolver.set(
        &target(9443),
        east.iter().chain(&west).map(TestServer::endpoint),
    );
    let layer = McsLayer::builder(resolver, Locality::cluster(cluster("east")))
        .balancer(fast_outliers(Duration::from_secs(2)))
        .build();
    let svc = ServiceBuilder::new().layer(layer).service(http1());

    // Healthy local cluster: everything stays in east, in the most preferred tier used.
    let (_, by_cluster) = load(&svc, 9443, 300, 4).await;
    assert_eq!(by_cluster.get("east"), Some(&300), "{by_cluster:?}");

    // East degrades (503): its endpoints are ejected and traffic spills to west.
    for s in &east {
        s.set_status(503);
    }
    let mut failures = 0;
    let mut last_west_streak = 0;
    for _ in 0..200 {
        let response = svc.clone().oneshot(get(9443, "/accrue")).await.unwrap();
        if response.status().is_success() {
            let served = response.extensions().get::<Served>().cloned().unwrap();
            if served.cluster().as_str() == "west" {
                last_west_streak += 1;
            } else {
                last_west_streak = 0;
            }
        } else {
            failures += 1;
            last_west_streak = 0;
        }
        let _ = response.into_body().collect().await;
    }
    assert!(
        failures <= 2 * 3 + 2,
        "each east endpoint fails about 3 times before ejection, got {failures}"
    );
    assert!(
        last_west_streak >= 150,
        "traffic spilled to west and stayed there: streak {last_west_streak}"
    );

    // East recovers: once the ejections expire, traffic returns to the local cluster. The
    // endpoints were ejected one after the other, so their ejections expire one after the
    // other too; while one is still out, part of the traffic spills to west (one healthy
    // of two is below the overprovisioned share). Wait until both serve again.
    for s in &east {
        s.set_status(200);
    }
    let before: Vec<u64> = east.iter().map(TestServer::served).collect();
    let (east, before) = (&east, &before);
    eventually(
        Duration::from_secs(10),
        "both east endpoints serving again",
        || {
            let svc = svc.clone();
            async move {
                let response = svc.oneshot(get(9443, "/accrue")).await.unwrap();
                let _ = response.into_body().collect().await;
                east.iter().zip(before).all(|(s, b)| s.served() > *b)
            }
        },
    )
    .await;
    let (_, by_cluster) = load(&svc, 9443, 100, 2).await;
    assert_eq!(by_cluster.get("east"), Some(&100), "{by_cluster:?}");
}

/// Drives traffic until `bad` has failed three times in a row (outlier detection ejects it
/// on the third).
async fn fail_three_times<S>(svc: &S, bad: &TestServer)
where
    S: Service<
            http::Request<http_body_util::Full<bytes::Bytes>>,
            Response = http::Response<hyper::body::Incoming>,
            Error = tower::BoxError,
        > + Clone,
{
    let before = bad.served();
    eventually(
        Duration::from_secs(5),
        "bad endpoint failed 3 times",
        || {
            let svc = svc.clone();
            async move {
                let _ = svc.oneshot(get(9443, "/accrue")).await.unwrap();
                bad.served() >= before + 3
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn failing_endpoint_is_ejected() {
    let east = servers(10, 3, 4, 0, "east").await;
    let resolver = StaticResolver::new();
    resolver.set(&target(9443), east.iter().map(TestServer::endpoint));
    // Ejections outlast the test, so what follows does not depend on how fast it runs.
    let layer = McsLayer::builder(resolver, Locality::cluster(cluster("east")))
        .balancer(fast_outliers(Duration::from_secs(300)))
        .build();
    let svc = ServiceBuilder::new().layer(layer).service(http1());

    let bad = &east[0];
    bad.set_status(500);
    fail_three_times(&svc, bad).await;
    // Ejected: it gets none of the next requests.
    let before = bad.served();
    let (by_addr, _) = load(&svc, 9443, 150, 3).await;
    assert_eq!(
        bad.served(),
        before,
        "the ejected endpoint got traffic: {by_addr:?}"
    );
    assert!(!by_addr.contains_key(&bad.addr));
    assert_eq!(by_addr.values().sum::<usize>(), 150);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ejected_endpoint_returns_after_its_ejection() {
    let east = servers(10, 7, 4, 0, "east").await;
    let resolver = StaticResolver::new();
    resolver.set(&target(9443), east.iter().map(TestServer::endpoint));
    let layer = McsLayer::builder(resolver, Locality::cluster(cluster("east")))
        .balancer(fast_outliers(Duration::from_secs(1)))
        .build();
    let svc = ServiceBuilder::new().layer(layer).service(http1());

    let bad = &east[0];
    bad.set_status(500);
    fail_three_times(&svc, bad).await;
    // It recovers; after the ejection expires it is picked again.
    let before = bad.served();
    bad.set_status(200);
    eventually(
        Duration::from_secs(10),
        "ejected endpoint back in rotation",
        || {
            let svc = svc.clone();
            async move {
                let response = svc.oneshot(get(9443, "/accrue")).await.unwrap();
                response.status().is_success() && bad.served() > before
            }
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn port_served_by_only_one_cluster() {
    let east = servers(10, 4, 2, 0, "east").await;
    let west = servers(20, 4, 2, 0, "west").await;
    let west_admin = servers(20, 5, 2, 0, "west").await;
    let resolver = StaticResolver::new();
    // Both clusters export port 9443; only west exports the admin port 9444.
    resolver.set(
        &target(9443),
        east.iter().chain(&west).map(TestServer::endpoint),
    );
    resolver.set(&target(9444), west_admin.iter().map(TestServer::endpoint));
    let layer = McsLayer::new(resolver.clone(), Locality::cluster(cluster("east")));
    let svc = ServiceBuilder::new().layer(layer.clone()).service(http1());

    let (_, main) = load(&svc, 9443, 100, 2).await;
    assert_eq!(main.get("east"), Some(&100), "9443 stays local: {main:?}");
    let (admin_addrs, admin) = load(&svc, 9444, 100, 2).await;
    assert_eq!(
        admin.get("west"),
        Some(&100),
        "9444 only exists in west: {admin:?}"
    );
    assert!(
        admin_addrs
            .keys()
            .all(|a| west_admin.iter().any(|s| s.addr == *a))
    );
    assert_eq!(layer.active_services(), 2, "one discovery per service port");
    assert_eq!(resolver.subscribers(&target(9444)), 1);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn other_hosts_pass_through_untouched() {
    let plain = TestServer::start(IpAddr::from([127, 30, 5, 1]), 0, "plain").await;
    let resolver = StaticResolver::new();
    let layer = McsLayer::new(resolver.clone(), Locality::cluster(cluster("east")));
    let svc = ServiceBuilder::new().layer(layer.clone()).service(http1());

    let response = svc
        .clone()
        .oneshot(
            http::Request::get(format!("http://{}/x", plain.addr))
                .body(http_body_util::Full::default())
                .unwrap(),
        )
        .await
        .unwrap();
    assert!(response.extensions().get::<Served>().is_none());
    let (cluster, addr, host) = answer(response).await;
    assert_eq!((cluster.as_str(), addr), ("plain", plain.addr));
    assert_eq!(host, plain.addr.to_string());

    // cluster.local names are never rewritten: the pass-through service sees the URI as given.
    let seen = std::sync::Arc::new(std::sync::Mutex::new(Vec::new()));
    let record = {
        let seen = std::sync::Arc::clone(&seen);
        tower::service_fn(move |req: http::Request<String>| {
            seen.lock()
                .unwrap()
                .push((req.uri().to_string(), req.headers().get("host").cloned()));
            async { Ok::<_, std::convert::Infallible>(http::Response::new(String::new())) }
        })
    };
    let svc =
        ServiceBuilder::new()
            .layer(layer.clone())
            .service(mcs_client::connect::with_passthrough(
                {
                    let record = record.clone();
                    move |_: &mcs_client::connect::EndpointTarget| record.clone()
                },
                record,
            ));
    for uri in [
        "http://loyalty-accrual.loyalty.svc.cluster.local:9443/accrue",
        "http://example.com/",
        "http://clusterset.local.example.com/",
    ] {
        let response = svc
            .clone()
            .oneshot(http::Request::get(uri).body(String::new()).unwrap())
            .await
            .unwrap();
        assert!(response.extensions().get::<Served>().is_none());
    }
    let seen = seen.lock().unwrap().clone();
    assert_eq!(
        seen[0].0,
        "http://loyalty-accrual.loyalty.svc.cluster.local:9443/accrue"
    );
    assert_eq!(seen[0].1, None, "no Host header added on pass-through");
    assert_eq!(seen[1].0, "http://example.com/");
    assert_eq!(
        layer.active_services(),
        0,
        "no discovery for pass-through hosts"
    );
    plain.stop().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
#[expect(
    clippy::field_reassign_with_default,
    reason = "OutlierConfig may become #[non_exhaustive]; field assignment stays valid then"
)]
async fn whole_local_cluster_stops_and_no_request_fails() {
    let east = servers(10, 11, 3, 0, "east").await;
    let west = servers(20, 11, 3, 0, "west").await;
    let resolver = StaticResolver::new();
    resolver.set(
        &target(9443),
        east.iter().chain(&west).map(TestServer::endpoint),
    );
    let mut outlier = OutlierConfig::default();
    outlier.max_ejection_percent = 50;
    let layer = McsLayer::builder(resolver, Locality::cluster(cluster("east")))
        .balancer(BalancerConfig::default().outlier(outlier))
        .retry(mcs_client::Retry::new(mcs_client::CloneBody))
        .build();
    let svc = ServiceBuilder::new().layer(layer).service(http1());
    let (_, by_cluster) = load(&svc, 9443, 200, 8).await;
    assert_eq!(by_cluster.get("east"), Some(&200));

    // Load keeps running while every east server stops; discovery is not told.
    let progress = Arc::new(watch::Sender::new(0usize));
    let mut started = progress.subscribe();
    let loader = {
        let svc = svc.clone();
        tokio::spawn(async move { load_reporting(&svc, 9443, 3000, 16, Some(progress)).await })
    };
    // The load is under way before the first server stops.
    started.wait_for(|n| *n >= 100).await.unwrap();
    for s in east {
        s.stop().await;
    }
    let (_, during) = loader.await.expect("no request failed during the failover");
    assert!(during.get("west").copied().unwrap_or(0) > 0, "{during:?}");
    // Afterwards east is ejected and west takes everything at the first attempt.
    let mut first_attempt = 0;
    for _ in 0..200 {
        let response = svc
            .clone()
            .oneshot(get(9443, "/accrue"))
            .await
            .expect("no request fails");
        let served = response.extensions().get::<Served>().cloned().unwrap();
        assert_eq!(served.cluster().as_str(), "west");
        first_attempt += usize::from(served.attempts() == 1);
    }
    assert!(
        first_attempt >= 190,
        "east is ejected, so retries are rare: {first_attempt}"
    );
}

/// KEP-5939's consumer algorithm, per request: with the preference "west, then east" (the
/// import's `clusterSelectorResults` for this caller), every request goes to west while it
/// has a ready endpoint, to east once it has none, back to west when it has one again, and
/// to every cluster once the preference is lifted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_preference_sends_requests_to_the_first_set_with_an_endpoint() {
    let east = servers(10, 30, 2, 0, "east").await;
    let west = servers(20, 30, 2, 0, "west").await;
    let resolver = StaticResolver::new();
    let west_first =
        mcs_core::endpoints::ClusterPreference::new([vec![cluster("west")], vec![cluster("east")]])
            .unwrap();
    resolver.prefer(&target(9443), Some(west_first));
    resolver.set(
        &target(9443),
        east.iter().chain(&west).map(TestServer::endpoint),
    );
    // The caller is in north: without the preference both clusters would share the load.
    let layer = McsLayer::new(resolver.clone(), Locality::cluster(cluster("north")));
    let svc = ServiceBuilder::new().layer(layer).service(http1());
    let (_, by_cluster) = load(&svc, 9443, 100, 4).await;
    assert_eq!(by_cluster.get("west"), Some(&100), "{by_cluster:?}");

    // West has no endpoint left: east takes over.
    resolver.remove(&target(9443), west.iter().map(|s| s.addr));
    eventually(Duration::from_secs(10), "requests go to east", || async {
        load(&svc, 9443, 20, 2).await.1.get("east") == Some(&20)
    })
    .await;
    // West is back: the traffic moves back.
    resolver.add(&target(9443), west.iter().map(TestServer::endpoint));
    eventually(
        Duration::from_secs(10),
        "requests go back to west",
        || async { load(&svc, 9443, 20, 2).await.1.get("west") == Some(&20) },
    )
    .await;
    // No preference: both clusters.
    resolver.prefer(&target(9443), None);
    eventually(Duration::from_secs(10), "requests go to both", || async {
        load(&svc, 9443, 100, 4).await.1.len() == 2
    })
    .await;
}
