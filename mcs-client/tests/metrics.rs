//! The metrics the layer publishes, through a recorder installed for the test's thread.

mod support;

use std::collections::BTreeMap;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use http::{Request, Response};
use mcs_client::{McsLayer, StaticResolver};
use mcs_core::discovery::Endpoint;
use mcs_core::endpoints::Locality;
use metrics::{Counter, Gauge, Histogram, Key, KeyName, Metadata, Recorder, SharedString, Unit};
use tower::{ServiceBuilder, ServiceExt};

use support::{HOST, cluster, target};

/// Keeps every counter and gauge by its name and sorted labels.
#[derive(Default)]
struct TestRecorder {
    values: Mutex<BTreeMap<String, Arc<AtomicU64>>>,
}

impl TestRecorder {
    fn handle(&self, key: &Key) -> Arc<AtomicU64> {
        let mut labels: Vec<String> = key
            .labels()
            .map(|l| format!("{}={}", l.key(), l.value()))
            .collect();
        labels.sort();
        let name = format!("{}{{{}}}", key.name(), labels.join(","));
        Arc::clone(self.values.lock().unwrap().entry(name).or_default())
    }

    fn counter(&self, name: &str) -> u64 {
        self.values
            .lock()
            .unwrap()
            .get(name)
            .map_or(0, |v| v.load(Ordering::Relaxed))
    }

    fn registered(&self, name: &str) -> bool {
        self.values.lock().unwrap().contains_key(name)
    }

    fn gauge(&self, name: &str) -> f64 {
        self.values
            .lock()
            .unwrap()
            .get(name)
            .map_or(0.0, |v| f64::from_bits(v.load(Ordering::Relaxed)))
    }
}

impl Recorder for TestRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        Counter::from_arc(self.handle(key))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        Gauge::from_arc(self.handle(key))
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// One endpoint in east (the caller's cluster), one in west.
const EAST: &str = "127.10.0.1:9443";
const WEST: &str = "127.20.0.1:9443";

/// On a current-thread runtime with `recorder` installed (the discovery task runs on this
/// thread, where the recorder is): sends a GET for each path through the layer to endpoint
/// services answering `status(endpoint, request)`, then runs `after` on the resolver and
/// lets the discovery task see it. Returns the statuses.
fn drive(
    recorder: &TestRecorder,
    paths: &[&str],
    status: fn(&str, &Request<String>) -> u16,
    after: impl FnOnce(&StaticResolver),
) -> Vec<u16> {
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    metrics::with_local_recorder(recorder, || {
        runtime.block_on(async {
            mcs_client::metrics::describe();
            let resolver = StaticResolver::new();
            resolver.set(
                &target(9443),
                [
                    Endpoint::ready(EAST.parse().unwrap(), cluster("east")),
                    Endpoint::ready(WEST.parse().unwrap(), cluster("west")),
                ],
            );
            let make = move |target: &mcs_client::connect::EndpointTarget| {
                let endpoint = target.addr().to_string();
                tower::service_fn(move |req: Request<String>| {
                    let code = status(&endpoint, &req);
                    async move {
                        Ok::<_, std::convert::Infallible>(
                            Response::builder()
                                .status(code)
                                .body(String::new())
                                .unwrap(),
                        )
                    }
                })
            };
            let svc = ServiceBuilder::new()
                .layer(McsLayer::new(
                    resolver.clone(),
                    Locality::cluster(cluster("east")),
                ))
                .service(make);
            let mut statuses = Vec::new();
            for path in paths {
                let req = Request::get(format!("http://{HOST}:9443{path}"))
                    .body(String::new())
                    .unwrap();
                statuses.push(svc.clone().oneshot(req).await.unwrap().status().as_u16());
            }
            after(&resolver);
            tokio::task::yield_now().await;
            statuses
        })
    })
}

#[test]
fn picks_outcomes_endpoints_and_errors_are_counted() {
    let recorder = TestRecorder::default();
    let paths: Vec<&str> = ["/ok"; 9].into_iter().chain(["/fail"]).collect();
    drive(
        &recorder,
        &paths,
        |_, req| {
            if req.uri().path() == "/fail" {
                503
            } else {
                200
            }
        },
        |resolver| resolver.fail(&target(9443), "watch broken"),
    );
    let labels = "port=9443,service=loyalty/loyalty-accrual";
    assert_eq!(
        recorder.counter(&format!("mcs_client_picks_total{{{labels},tier=1}}")),
        10
    );
    assert_eq!(
        recorder.counter(&format!(
            "mcs_client_responses_total{{cluster=east,outcome=success,{labels}}}"
        )),
        9
    );
    assert_eq!(
        recorder.counter(&format!(
            "mcs_client_responses_total{{cluster=east,outcome=failure,{labels}}}"
        )),
        1
    );
    assert_eq!(
        recorder.gauge(&format!(
            "mcs_client_endpoints{{cluster=east,{labels},state=ready}}"
        )),
        1.0
    );
    assert_eq!(
        recorder.gauge(&format!(
            "mcs_client_endpoints{{cluster=west,{labels},state=ready}}"
        )),
        1.0
    );
    assert_eq!(
        recorder.gauge(&format!("mcs_client_tier_endpoints{{{labels},tier=1}}")),
        1.0
    );
    assert_eq!(
        recorder.gauge(&format!("mcs_client_tier_endpoints{{{labels},tier=2}}")),
        1.0
    );
    assert_eq!(
        recorder.counter(&format!("mcs_client_resolve_errors_total{{{labels}}}")),
        1
    );
    let age = recorder.gauge(&format!("mcs_client_snapshot_age_seconds{{{labels}}}"));
    assert!(
        (0.0..1.0).contains(&age),
        "the set was confirmed just now: {age}"
    );
}

#[test]
fn a_departed_cluster_reads_zero() {
    let recorder = TestRecorder::default();
    drive(
        &recorder,
        &["/ok"],
        |_, _| 200,
        |resolver| {
            resolver.set(
                &target(9443),
                [Endpoint::ready(EAST.parse().unwrap(), cluster("east"))],
            )
        },
    );
    let labels = "port=9443,service=loyalty/loyalty-accrual";
    let endpoints = |cluster: &str| {
        recorder.gauge(&format!(
            "mcs_client_endpoints{{cluster={cluster},{labels},state=ready}}"
        ))
    };
    assert_eq!(endpoints("east"), 1.0);
    assert!(
        recorder.registered(&format!(
            "mcs_client_endpoints{{cluster=west,{labels},state=ready}}"
        )),
        "west was published while it had an endpoint"
    );
    assert_eq!(endpoints("west"), 0.0, "west left the set");
    assert_eq!(
        recorder.gauge(&format!("mcs_client_tier_endpoints{{{labels},tier=2}}")),
        0.0
    );
}

#[test]
fn ejections_are_counted_as_they_happen() {
    let recorder = TestRecorder::default();
    // East (the local cluster) answers 503, west 200.
    let statuses = drive(
        &recorder,
        &["/accrue"; 10],
        |endpoint, _| {
            if endpoint == EAST { 503 } else { 200 }
        },
        |_| {},
    );
    // Five consecutive failures eject the local endpoint; the rest spill to west.
    assert_eq!(statuses, [503, 503, 503, 503, 503, 200, 200, 200, 200, 200]);
    let labels = "port=9443,service=loyalty/loyalty-accrual";
    assert_eq!(
        recorder.counter(&format!(
            "mcs_client_ejections_total{{cluster=east,{labels}}}"
        )),
        1
    );
    assert_eq!(
        recorder.counter(&format!(
            "mcs_client_ejections_total{{cluster=west,{labels}}}"
        )),
        0
    );
    assert_eq!(
        recorder.gauge(&format!("mcs_client_ejected_endpoints{{{labels}}}")),
        1.0
    );
}
