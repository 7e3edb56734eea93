//! The layer's contract against an in-memory inner service: routing, typed errors, waiting
//! limits, readiness, retries and idle targets. No sockets, so Tokio's clock is paused where
//! timing matters.

mod support;

use std::collections::HashSet;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};
use std::time::Duration;

use http::{Request, Response, Version};
use mcs_client::connect::{EndpointTarget, MakeEndpoint};
use mcs_client::{CloneBody, EndpointError, Error, McsLayer, Retry, Served, StaticResolver};
use mcs_core::discovery::Endpoint;
use mcs_core::endpoints::{BalancerConfig, Locality, OutlierConfig, Tiering};
use tower::{BoxError, Layer, Service, ServiceBuilder, ServiceExt};

use support::{HOST, cluster, target};

/// What an endpoint service saw.
#[derive(Clone, Debug)]
struct Seen {
    /// The endpoint whose service got the request (`None`: the pass-through service).
    endpoint: Option<SocketAddr>,
    uri: String,
    host: Option<String>,
    version: Version,
}

/// An endpoint factory whose services record requests and refuse connections to `down`
/// endpoints; it counts the services it makes.
#[derive(Clone, Default)]
struct Recorder {
    seen: Arc<Mutex<Vec<Seen>>>,
    down: Arc<Mutex<HashSet<SocketAddr>>>,
    made: Arc<Mutex<Vec<SocketAddr>>>,
}

impl MakeEndpoint for Recorder {
    type Service = Recording;

    fn make_endpoint(&self, target: &EndpointTarget) -> Recording {
        assert_eq!(target.host(), HOST, "the target names the service");
        self.made.lock().unwrap().push(target.addr());
        Recording {
            endpoint: Some(target.addr()),
            recorder: self.clone(),
        }
    }

    fn make_passthrough(&self) -> Option<Recording> {
        Some(Recording {
            endpoint: None,
            recorder: self.clone(),
        })
    }
}

/// One endpoint's recording service.
#[derive(Clone)]
struct Recording {
    endpoint: Option<SocketAddr>,
    recorder: Recorder,
}

impl Service<Request<String>> for Recording {
    type Response = Response<String>;
    type Error = std::io::Error;
    type Future = std::future::Ready<Result<Response<String>, std::io::Error>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<String>) -> Self::Future {
        self.recorder.seen.lock().unwrap().push(Seen {
            endpoint: self.endpoint,
            uri: req.uri().to_string(),
            host: req
                .headers()
                .get("host")
                .map(|h| h.to_str().unwrap().to_owned()),
            version: req.version(),
        });
        let down = self
            .endpoint
            .is_some_and(|a| self.recorder.down.lock().unwrap().contains(&a));
        std::future::ready(if down {
            Err(std::io::Error::from(std::io::ErrorKind::ConnectionRefused))
        } else {
            Ok(Response::new(req.into_body()))
        })
    }
}

fn ep(last: u8, cluster_name: &str) -> Endpoint {
    Endpoint::ready(
        SocketAddr::from(([127, 10, 0, last], 9443)),
        cluster(cluster_name),
    )
}

fn req(uri: &str) -> Request<String> {
    Request::get(uri).body(String::from("points")).unwrap()
}

fn mcs_error(err: &BoxError) -> &Error {
    err.downcast_ref::<Error>()
        .unwrap_or_else(|| panic!("not an mcs error: {err}"))
}

fn east() -> Locality {
    Locality::cluster(cluster("east"))
}

#[tokio::test]
async fn sends_the_request_as_written_to_the_picked_endpoint() {
    let resolver = StaticResolver::new();
    resolver.set(&target(9443), [ep(1, "east")]);
    let inner = Recorder::default();
    let svc = McsLayer::new(resolver, east());
    let svc = ServiceBuilder::new().layer(svc).service(inner.clone());

    let response = svc
        .clone()
        .oneshot(req(&format!("http://{HOST}:9443/accrue?order=7")))
        .await
        .unwrap();
    let served = response.extensions().get::<Served>().unwrap();
    assert_eq!(served.addr(), ep(1, "east").addr);
    assert_eq!(served.attempts(), 1);
    assert_eq!(served.cluster().as_str(), "east");
    assert_eq!(
        response.into_body(),
        "points",
        "the body reaches the endpoint"
    );

    // Upper case and a trailing dot name the same service.
    svc.clone()
        .oneshot(req(
            "http://Loyalty-Accrual.loyalty.svc.ClusterSet.Local.:9443/",
        ))
        .await
        .unwrap();
    // HTTP/2 requests keep their version (and so their :authority).
    let mut h2 = req(&format!("http://{HOST}:9443/h2"));
    *h2.version_mut() = Version::HTTP_2;
    svc.clone().oneshot(h2).await.unwrap();
    // A caller-set Host is kept.
    let mut custom = req(&format!("http://{HOST}:9443/custom"));
    custom
        .headers_mut()
        .insert("host", "accrual.example".parse().unwrap());
    svc.clone().oneshot(custom).await.unwrap();
    // Origin-form requests are routed by their Host header and made absolute from it.
    let mut origin = Request::get("/origin").body(String::new()).unwrap();
    origin
        .headers_mut()
        .insert("host", format!("{HOST}:9443").parse().unwrap());
    svc.clone().oneshot(origin).await.unwrap();

    let seen = inner.seen.lock().unwrap().clone();
    assert!(
        seen.iter().all(|s| s.endpoint == Some(ep(1, "east").addr)),
        "{seen:?}"
    );
    assert_eq!(seen[0].uri, format!("http://{HOST}:9443/accrue?order=7"));
    assert_eq!(seen[0].host, None, "no Host is added: hyper derives it");
    assert_eq!(
        seen[1].uri,
        "http://Loyalty-Accrual.loyalty.svc.ClusterSet.Local.:9443/"
    );
    assert_eq!(
        (seen[2].uri.as_str(), seen[2].version),
        (format!("http://{HOST}:9443/h2").as_str(), Version::HTTP_2)
    );
    assert_eq!(seen[3].host.as_deref(), Some("accrual.example"));
    assert_eq!(seen[4].uri, format!("http://{HOST}:9443/origin"));
    assert_eq!(
        seen[4].host.as_deref(),
        Some(format!("{HOST}:9443").as_str())
    );
    assert_eq!(
        *inner.made.lock().unwrap(),
        [ep(1, "east").addr],
        "one service for the endpoint, made once"
    );
}

#[tokio::test]
async fn other_hosts_go_to_the_passthrough_service() {
    let resolver = StaticResolver::new();
    let inner = Recorder::default();
    let svc = McsLayer::new(resolver.clone(), east()).layer(inner.clone());
    for uri in [
        "http://loyalty-accrual.loyalty.svc.cluster.local:9443/",
        "http://example.com/",
    ] {
        svc.clone().oneshot(req(uri)).await.unwrap();
    }
    let seen = inner.seen.lock().unwrap().clone();
    assert_eq!(seen.len(), 2);
    assert!(seen.iter().all(|s| s.endpoint.is_none()), "{seen:?}");
    assert_eq!(
        seen[0].uri,
        "http://loyalty-accrual.loyalty.svc.cluster.local:9443/"
    );
    assert_eq!(
        resolver.subscribers(&target(9443)),
        0,
        "cluster.local is never resolved"
    );

    // A factory without a pass-through service refuses them with a typed error.
    let closure = |t: &EndpointTarget| Recording {
        endpoint: Some(t.addr()),
        recorder: Recorder::default(),
    };
    let svc = McsLayer::new(resolver, east()).layer(closure);
    let err = svc.oneshot(req("http://example.com/")).await.unwrap_err();
    assert!(
        matches!(mcs_error(&err), Error::NoPassthrough { host } if host == "example.com"),
        "{err}"
    );
}

#[tokio::test]
async fn default_ports_follow_the_scheme() {
    let resolver = StaticResolver::new();
    resolver.set(&target(80), [ep(1, "east")]);
    resolver.set(&target(443), [ep(2, "east")]);
    let inner = Recorder::default();
    let svc = ServiceBuilder::new()
        .layer(McsLayer::new(resolver, east()))
        .service(inner.clone());
    let r = svc
        .clone()
        .oneshot(req(&format!("http://{HOST}/")))
        .await
        .unwrap();
    assert_eq!(
        r.extensions().get::<Served>().unwrap().addr(),
        ep(1, "east").addr
    );
    let r = svc
        .clone()
        .oneshot(req(&format!("https://{HOST}/")))
        .await
        .unwrap();
    assert_eq!(
        r.extensions().get::<Served>().unwrap().addr(),
        ep(2, "east").addr
    );
    let seen = inner.seen.lock().unwrap().clone();
    assert_eq!(seen[0].uri, format!("http://{HOST}/"), "sent as written");
    assert_eq!(seen[1].uri, format!("https://{HOST}/"));
}

#[tokio::test]
async fn names_that_are_not_services_are_typed_errors() {
    let svc = ServiceBuilder::new()
        .layer(McsLayer::new(StaticResolver::new(), east()))
        .service(Recorder::default());
    for (uri, check) in [
        (
            "http://_http._tcp.loyalty-accrual.loyalty.svc.clusterset.local/",
            "an SRV name",
        ),
        (
            "http://web-0.east.loyalty-accrual.loyalty.svc.clusterset.local/",
            "a per-endpoint name",
        ),
        ("http://loyalty.svc.clusterset.local/", "a namespace name"),
    ] {
        let err = svc.clone().oneshot(req(uri)).await.unwrap_err();
        assert!(
            matches!(mcs_error(&err), Error::NotAService { .. }),
            "{uri}: {err}"
        );
        assert!(err.to_string().contains(check), "{err}");
    }
    let err = svc
        .clone()
        .oneshot(req(
            "http://east.loyalty-accrual.loyalty.svc.clusterset.local/",
        ))
        .await
        .unwrap_err();
    let Error::InvalidName { host, source } = mcs_error(&err) else {
        panic!("{err}")
    };
    assert_eq!(host, "east.loyalty-accrual.loyalty.svc.clusterset.local");
    assert!(source.to_string().contains("per-cluster"), "{source}");
    let err = svc
        .clone()
        .oneshot(req("http://Bad_Name.loyalty.svc.clusterset.local/"))
        .await
        .unwrap_err();
    assert!(
        matches!(mcs_error(&err), Error::InvalidName { .. }),
        "{err}"
    );
}

#[tokio::test(start_paused = true)]
async fn first_resolution_waits_then_fails_with_the_cause() {
    let resolver = StaticResolver::new();
    let layer = McsLayer::builder(resolver.clone(), east())
        .resolution_timeout(Duration::from_secs(2))
        .build();
    let svc = ServiceBuilder::new()
        .layer(layer)
        .service(Recorder::default());

    // Nobody answers: the request waits 2 s (paused clock), then fails with Resolve.
    let started = tokio::time::Instant::now();
    let err = svc
        .clone()
        .oneshot(req(&format!("http://{HOST}:9443/")))
        .await
        .unwrap_err();
    let Error::Resolve {
        service,
        waited,
        cause,
    } = mcs_error(&err)
    else {
        panic!("{err}")
    };
    assert_eq!(service, "loyalty/loyalty-accrual:9443");
    assert!(
        *waited >= Duration::from_secs(2) && started.elapsed() < Duration::from_secs(3),
        "{waited:?}"
    );
    assert_eq!(cause, "the resolver has not answered");

    // With an error from discovery, the error says why.
    resolver.fail(&target(9443), "connection refused by the DNS server");
    let err = svc
        .clone()
        .oneshot(req(&format!("http://{HOST}:9443/")))
        .await
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("connection refused by the DNS server"),
        "{err}"
    );

    // A request waiting when the first resolution lands is served.
    let waiting = tokio::spawn(svc.clone().oneshot(req(&format!("http://{HOST}:9443/"))));
    tokio::time::sleep(Duration::from_millis(500)).await;
    resolver.set(&target(9443), [ep(1, "east")]);
    let response = waiting.await.unwrap().unwrap();
    assert!(response.extensions().get::<Served>().is_some());
}

#[tokio::test(start_paused = true)]
async fn does_not_exist_fails_at_once() {
    let resolver = StaticResolver::new();
    resolver.does_not_exist(&target(9443));
    let svc = ServiceBuilder::new()
        .layer(McsLayer::new(resolver, east()))
        .service(Recorder::default());
    let started = tokio::time::Instant::now();
    let err = svc
        .oneshot(req(&format!("http://{HOST}:9443/")))
        .await
        .unwrap_err();
    assert!(
        matches!(mcs_error(&err), Error::DoesNotExist { service } if service == "loyalty/loyalty-accrual:9443")
    );
    assert_eq!(started.elapsed(), Duration::ZERO);
    assert_eq!(
        err.to_string(),
        "service loyalty/loyalty-accrual:9443 does not exist in the ClusterSet"
    );
}

#[tokio::test(start_paused = true)]
async fn empty_set_fails_fast_after_the_delay() {
    let resolver = StaticResolver::new();
    resolver.set(&target(9443), []);
    let svc = ServiceBuilder::new()
        .layer(McsLayer::new(resolver.clone(), east()))
        .service(Recorder::default());

    // The first request sees the set empty: it waits the fail-fast delay (3 s by default).
    let started = tokio::time::Instant::now();
    let err = svc
        .clone()
        .oneshot(req(&format!("http://{HOST}:9443/")))
        .await
        .unwrap_err();
    let Error::NoEndpoints { service, empty_for } = mcs_error(&err) else {
        panic!("{err}")
    };
    assert_eq!(service, "loyalty/loyalty-accrual:9443");
    assert!(*empty_for >= Duration::from_secs(3), "{empty_for:?}");
    assert!(
        started.elapsed() >= Duration::from_secs(3) && started.elapsed() < Duration::from_secs(4)
    );

    // From then on, requests fail at once.
    let started = tokio::time::Instant::now();
    let err = svc
        .clone()
        .oneshot(req(&format!("http://{HOST}:9443/")))
        .await
        .unwrap_err();
    assert!(matches!(mcs_error(&err), Error::NoEndpoints { .. }));
    assert_eq!(started.elapsed(), Duration::ZERO);

    // Endpoints come back: served again, and a later empty period waits again.
    resolver.set(&target(9443), [ep(1, "east")]);
    tokio::task::yield_now().await;
    svc.clone()
        .oneshot(req(&format!("http://{HOST}:9443/")))
        .await
        .unwrap();
    resolver.set(&target(9443), []);
    let waiting = tokio::spawn(svc.clone().oneshot(req(&format!("http://{HOST}:9443/"))));
    tokio::time::sleep(Duration::from_secs(1)).await;
    resolver.add(&target(9443), [ep(2, "east")]);
    let response = waiting
        .await
        .unwrap()
        .expect("endpoint arrived within the fail-fast delay");
    assert_eq!(
        response.extensions().get::<Served>().unwrap().addr(),
        ep(2, "east").addr
    );
}

#[tokio::test(start_paused = true)]
async fn discovery_errors_keep_the_last_good_set() {
    let resolver = StaticResolver::new();
    resolver.set(&target(9443), [ep(1, "east"), ep(2, "west")]);
    let svc = ServiceBuilder::new()
        .layer(McsLayer::new(resolver.clone(), east()))
        .service(Recorder::default());
    svc.clone()
        .oneshot(req(&format!("http://{HOST}:9443/")))
        .await
        .unwrap();
    for i in 0..5 {
        resolver.fail(&target(9443), &format!("watch broken {i}"));
        tokio::task::yield_now().await;
        let r = svc
            .clone()
            .oneshot(req(&format!("http://{HOST}:9443/")))
            .await
            .unwrap();
        assert_eq!(
            r.extensions().get::<Served>().unwrap().cluster().as_str(),
            "east"
        );
    }
}

/// An endpoint service that is not ready until the gate opens.
#[derive(Clone)]
struct Gate {
    open: Arc<std::sync::atomic::AtomicBool>,
    waker: Arc<futures::task::AtomicWaker>,
    polled: Arc<tokio::sync::Notify>,
}

impl Service<Request<String>> for Gate {
    type Response = Response<String>;
    type Error = Infallible;
    type Future = std::future::Ready<Result<Response<String>, Infallible>>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        self.waker.register(cx.waker());
        self.polled.notify_one();
        if self.open.load(std::sync::atomic::Ordering::SeqCst) {
            Poll::Ready(Ok(()))
        } else {
            Poll::Pending
        }
    }

    fn call(&mut self, _: Request<String>) -> Self::Future {
        std::future::ready(Ok(Response::new(String::new())))
    }
}

#[tokio::test]
async fn an_endpoint_services_readiness_is_awaited() {
    let resolver = StaticResolver::new();
    resolver.set(&target(9443), [ep(1, "east")]);
    let gate = Gate {
        open: Arc::default(),
        waker: Arc::default(),
        polled: Arc::default(),
    };
    let (open, waker, polled) = (
        Arc::clone(&gate.open),
        Arc::clone(&gate.waker),
        Arc::clone(&gate.polled),
    );
    let mut svc = McsLayer::new(resolver, east()).layer(move |_: &EndpointTarget| gate.clone());
    let noop = futures::task::noop_waker();
    let mut cx = Context::from_waker(&noop);
    assert!(
        matches!(
            Service::<Request<String>>::poll_ready(&mut svc, &mut cx),
            Poll::Ready(Ok(()))
        ),
        "the balancing service itself is always ready"
    );
    let request = tokio::spawn(svc.oneshot(req(&format!("http://{HOST}:9443/"))));
    // The endpoint's service was asked and is not ready: the request waits for it.
    polled.notified().await;
    assert!(!request.is_finished());
    open.store(true, std::sync::atomic::Ordering::SeqCst);
    waker.wake();
    let response = request.await.unwrap().unwrap();
    assert!(response.extensions().get::<Served>().is_some());
}

#[tokio::test]
#[expect(
    clippy::field_reassign_with_default,
    reason = "OutlierConfig may become #[non_exhaustive]; field assignment stays valid then"
)]
async fn retries_connect_failures_on_another_endpoint() {
    let resolver = StaticResolver::new();
    resolver.set(&target(9443), (1..=4).map(|i| ep(i, "east")));
    let inner = Recorder::default();
    inner
        .down
        .lock()
        .unwrap()
        .extend([ep(1, "east").addr, ep(2, "east").addr]);
    // Outlier detection off, so only retries save the requests.
    let mut outlier = OutlierConfig::default();
    outlier.consecutive_failures = 0;
    let layer = McsLayer::builder(resolver, east())
        .balancer(BalancerConfig::default().outlier(outlier))
        // Half the set is down, so retries add far more than the default 20 %.
        .retry(
            Retry::new(CloneBody)
                .max_retries(3)
                .budget(1.0, 1000, Duration::from_secs(10)),
        )
        .build();
    let svc = ServiceBuilder::new().layer(layer).service(inner.clone());
    let mut retried = 0;
    for _ in 0..200 {
        let response = svc
            .clone()
            .oneshot(req(&format!("http://{HOST}:9443/accrue")))
            .await
            .expect("retried");
        let served = response.extensions().get::<Served>().cloned().unwrap();
        assert!([ep(3, "east").addr, ep(4, "east").addr].contains(&served.addr()));
        assert_eq!(response.into_body(), "points", "the replayed body arrives");
        retried += usize::from(served.attempts() > 1);
    }
    assert!(
        retried > 50,
        "about half the first picks hit a down endpoint: {retried}"
    );
}

#[tokio::test]
#[expect(
    clippy::field_reassign_with_default,
    reason = "OutlierConfig may become #[non_exhaustive]; field assignment stays valid then"
)]
async fn retries_stop_when_the_budget_is_spent() {
    let resolver = StaticResolver::new();
    resolver.set(&target(9443), [ep(1, "east"), ep(2, "east")]);
    let inner = Recorder::default();
    inner
        .down
        .lock()
        .unwrap()
        .extend([ep(1, "east").addr, ep(2, "east").addr]);
    let mut outlier = OutlierConfig::default();
    outlier.consecutive_failures = 0;
    // No percentage, 1 retry per second over 10 s: 10 retries in all.
    let layer = McsLayer::builder(resolver, east())
        .balancer(BalancerConfig::default().outlier(outlier))
        .retry(Retry::new(CloneBody).budget(0.0, 1, Duration::from_secs(10)))
        .build();
    let svc = ServiceBuilder::new().layer(layer).service(inner.clone());
    for _ in 0..30 {
        let err = svc
            .clone()
            .oneshot(req(&format!("http://{HOST}:9443/")))
            .await
            .unwrap_err();
        let failed = err
            .downcast_ref::<EndpointError>()
            .expect("the endpoint's error comes back, naming the endpoint");
        assert!([ep(1, "east").addr, ep(2, "east").addr].contains(&failed.endpoint()));
        assert_eq!(failed.cluster().as_str(), "east");
        let io = failed
            .inner()
            .downcast_ref::<std::io::Error>()
            .expect("the endpoint service's error, unchanged, as its source");
        assert_eq!(io.kind(), std::io::ErrorKind::ConnectionRefused);
    }
    let sent = inner.seen.lock().unwrap().len();
    assert_eq!(
        sent,
        30 + 10,
        "30 first attempts and the 10 retries the budget allows"
    );
}

#[tokio::test]
async fn pinned_tiering_and_no_retry_by_default() {
    let resolver = StaticResolver::new();
    resolver.set(&target(9443), [ep(1, "east"), ep(2, "west")]);
    let inner = Recorder::default();
    inner.down.lock().unwrap().insert(ep(2, "west").addr);
    let layer = McsLayer::builder(resolver, east())
        .balancer(BalancerConfig::default().tiering(Tiering::Pinned(cluster("west"))))
        .build();
    let svc = ServiceBuilder::new().layer(layer).service(inner.clone());
    let err = svc
        .oneshot(req(&format!("http://{HOST}:9443/")))
        .await
        .unwrap_err();
    let failed = err
        .downcast_ref::<EndpointError>()
        .expect("an endpoint error");
    assert_eq!(
        (failed.endpoint(), failed.cluster().as_str()),
        (ep(2, "west").addr, "west")
    );
    assert!(
        err.to_string().contains("127.10.0.2:9443") && err.to_string().contains("west"),
        "{err}"
    );
    assert_eq!(
        inner.seen.lock().unwrap().len(),
        1,
        "retries are off unless enabled"
    );
}

#[tokio::test(start_paused = true)]
async fn idle_services_are_dropped_and_come_back() {
    let resolver = StaticResolver::new();
    resolver.set(&target(9443), [ep(1, "east")]);
    let layer = McsLayer::builder(resolver.clone(), east())
        .idle_timeout(Some(Duration::from_secs(60)))
        .build();
    let svc = ServiceBuilder::new()
        .layer(layer.clone())
        .service(Recorder::default());
    svc.clone()
        .oneshot(req(&format!("http://{HOST}:9443/")))
        .await
        .unwrap();
    assert_eq!(
        (layer.active_services(), resolver.subscribers(&target(9443))),
        (1, 1)
    );
    tokio::time::sleep(Duration::from_secs(70)).await;
    assert_eq!(layer.active_services(), 0);
    tokio::task::yield_now().await;
    assert_eq!(
        resolver.subscribers(&target(9443)),
        0,
        "the resolution was dropped"
    );
    svc.clone()
        .oneshot(req(&format!("http://{HOST}:9443/")))
        .await
        .unwrap();
    assert_eq!(layer.active_services(), 1);
}

#[tokio::test(start_paused = true)]
async fn request_timeout_counts_against_the_endpoint() {
    #[derive(Clone)]
    struct Slow;
    impl Service<Request<String>> for Slow {
        type Response = Response<String>;
        type Error = Infallible;
        type Future = std::pin::Pin<
            Box<dyn std::future::Future<Output = Result<Response<String>, Infallible>> + Send>,
        >;
        fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
            Poll::Ready(Ok(()))
        }
        fn call(&mut self, _: Request<String>) -> Self::Future {
            Box::pin(async {
                tokio::time::sleep(Duration::from_secs(60)).await;
                Ok(Response::new(String::new()))
            })
        }
    }
    let resolver = StaticResolver::new();
    resolver.set(&target(9443), [ep(1, "east")]);
    let layer = McsLayer::builder(resolver, east())
        .request_timeout(Duration::from_millis(250))
        .build();
    let svc = layer.layer(|_: &EndpointTarget| Slow);
    let err = svc
        .oneshot(req(&format!("http://{HOST}:9443/")))
        .await
        .unwrap_err();
    let Error::Timeout {
        service,
        endpoint,
        cluster,
        after,
        ..
    } = mcs_error(&err)
    else {
        panic!("{err}")
    };
    assert_eq!(
        (service.as_str(), *endpoint, cluster.as_str(), *after),
        (
            "loyalty/loyalty-accrual:9443",
            ep(1, "east").addr,
            "east",
            Duration::from_millis(250)
        )
    );
}

#[test]
fn public_types_are_send_and_sync() {
    fn send_sync<T: Send + Sync>() {}
    fn send<T: Send>() {}
    send_sync::<McsLayer>();
    send_sync::<mcs_client::Mcs<Recorder>>();
    send_sync::<StaticResolver>();
    send_sync::<Error>();
    send_sync::<EndpointError>();
    send_sync::<Served>();
    send::<
        mcs_client::ResponseFuture<
            std::future::Ready<Result<Response<String>, std::io::Error>>,
            String,
        >,
    >();
    #[cfg(feature = "dns")]
    send_sync::<mcs_client::DnsResolver>();
}
