//! The client balancing through the Kubernetes resolver, against real API servers.
//!
//! ```text
//! scripts/k8s-bins.sh && cargo run --release --example kube_resolver
//! ```
//!
//! Three clusters (real kube-apiserver, etcd and kube-controller-manager from
//! `scripts/k8s-bins.sh`) each run an `mcs-agent`. `loyalty-accrual` runs in `east` and
//! `west` as one Pod each; kube-controller-manager publishes their EndpointSlices, the
//! agents import them into `north`, and a checkout client in `north` calls
//! `http://loyalty-accrual.loyalty.svc.clusterset.local:9443/accrue` through `McsLayer`
//! with `mcs_kube::resolver::KubeResolver`, which watches `north`'s ServiceImport and MCS
//! EndpointSlices directly (no DNS).
//!
//! The API server refuses loopback addresses in EndpointSlices, so the Pods get
//! documentation addresses (`192.0.2.10`, `192.0.2.20`); the client's transport maps each to
//! the loopback HTTP server standing in for that Pod, as a network would route to it.
//!
//! It prints the split of the first requests, then turns `east`'s Pod unready and reports
//! how long it took until no request reached `east` any more. It exits non-zero if a
//! request fails or the change is not seen within 30 s.

#![allow(missing_docs)]

use mcs_testkit as support;
use mcs_testkit::clusterset;

use std::collections::HashMap;
use std::convert::Infallible;
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use bytes::Bytes;
use clusterset::*;
use http_body_util::{BodyExt, Empty, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use k8s_openapi::api::core::v1::{Service, ServicePort as CoreServicePort, ServiceSpec};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcs_client::McsLayer;
use mcs_client::connect::{EndpointTarget, Tcp};
use mcs_core::endpoints::Locality;
use mcs_kube::resolver::KubeResolver;
use tower::{Service as _, ServiceBuilder, ServiceExt};

const NS: &str = "loyalty";
const URL: &str = "http://loyalty-accrual.loyalty.svc.clusterset.local:9443/accrue";

/// What the run measured.
#[derive(Debug)]
pub(crate) struct Report {
    pub(crate) split: HashMap<String, usize>,
    pub(crate) unready_to_last_east: Duration,
    pub(crate) failed: usize,
}

async fn pod_server(ip: &str, answer: &'static str) -> SocketAddr {
    let listener = tokio::net::TcpListener::bind((ip, 0))
        .await
        .expect("bind a loopback address");
    let addr = listener.local_addr().unwrap();
    tokio::spawn(async move {
        loop {
            let Ok((stream, _)) = listener.accept().await else {
                continue;
            };
            tokio::spawn(async move {
                let service =
                    hyper::service::service_fn(move |_req: http::Request<Incoming>| async move {
                        Ok::<_, Infallible>(http::Response::new(Full::new(Bytes::from_static(
                            answer.as_bytes(),
                        ))))
                    });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), service)
                    .await;
            });
        }
    });
    addr
}

fn accrual_service() -> Service {
    Service {
        metadata: kube::api::ObjectMeta {
            name: Some("loyalty-accrual".into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some([("app".to_string(), "accrual".to_string())].into()),
            ports: Some(vec![CoreServicePort {
                name: Some("http".into()),
                port: 9443,
                target_port: Some(IntOrString::Int(8080)),
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

pub(crate) async fn run() -> Report {
    let set = ClusterSet::start(&["east", "west", "north"], true).await;
    set.namespace(NS).await;
    // Loopback servers standing in for the two Pods.
    let east_server = pod_server("127.10.0.1", "east").await;
    let west_server = pod_server("127.20.0.1", "west").await;
    let routes: HashMap<SocketAddr, SocketAddr> = [
        ("192.0.2.10:8080".parse().unwrap(), east_server),
        ("192.0.2.20:8080".parse().unwrap(), west_server),
    ]
    .into();
    for (i, ip) in [(0, "192.0.2.10"), (1, "192.0.2.20")] {
        support::create_ready_pod(
            set.client(i),
            NS,
            "accrual-0",
            &[("app", "accrual")],
            ip,
            &[("http", 8080)],
        )
        .await;
        create_service(set.client(i), NS, &accrual_service()).await;
        export(set.client(i), NS, "loyalty-accrual", None).await;
    }
    println!("waiting for north to import both clusters' endpoints");
    support::wait_for("north's imported slices", SLICE_TIMEOUT, || async {
        let slices = mcs_slices(set.client(2), NS, "loyalty-accrual").await;
        let addrs: Vec<String> = slices
            .iter()
            .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
            .collect();
        (addrs.contains(&"192.0.2.10".to_string()) && addrs.contains(&"192.0.2.20".to_string()))
            .then_some(())
    })
    .await;

    // One plain hyper client per endpoint, dialling the loopback server that stands in for
    // the Pod address discovery reports.
    let make = move |target: &EndpointTarget| {
        let to = routes.get(&target.addr()).copied().unwrap_or(target.addr());
        Client::builder(TokioExecutor::new()).build::<_, Empty<Bytes>>(Tcp::new().dial(to))
    };
    let resolver = KubeResolver::new(set.client(2).clone());
    let mut client = ServiceBuilder::new()
        .layer(McsLayer::new(
            resolver,
            Locality::cluster("north".parse().unwrap()),
        ))
        .service(make);

    let mut split: HashMap<String, usize> = HashMap::new();
    let mut failed = 0;
    let mut call = async || -> Option<String> {
        let request = http::Request::get(URL).body(Empty::<Bytes>::new()).unwrap();
        let svc = client.ready().await.ok()?;
        match svc.call(request).await {
            Ok(response) => Some(
                String::from_utf8_lossy(&response.into_body().collect().await.ok()?.to_bytes())
                    .into_owned(),
            ),
            Err(e) => {
                eprintln!("request failed: {e}");
                None
            }
        }
    };
    for _ in 0..200 {
        match call().await {
            Some(body) => *split.entry(body).or_default() += 1,
            None => failed += 1,
        }
    }
    println!("first 200 requests from north: {split:?}");

    // East's Pod turns unready: how long until the client stops sending to it?
    let unready_at = Instant::now();
    support::set_pod_status(set.client(0), NS, "accrual-0", Some("192.0.2.10"), false).await;
    let mut last_east = unready_at;
    let mut west_streak = 0;
    while west_streak < 200 {
        assert!(
            unready_at.elapsed() < Duration::from_secs(30),
            "east still served 30 s after its Pod went unready"
        );
        match call().await.as_deref() {
            Some("east") => {
                last_east = Instant::now();
                west_streak = 0;
            }
            Some(_) => west_streak += 1,
            None => failed += 1,
        }
        tokio::time::sleep(Duration::from_millis(2)).await;
    }
    let took = last_east.duration_since(unready_at);
    println!("east's Pod unready -> last request to east: {took:?}; {failed} failed requests");
    Report {
        split,
        unready_to_last_east: took,
        failed,
    }
}

#[allow(dead_code)]
#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    let report = run().await;
    let ok = report.failed == 0
        && report.split.get("east").is_some_and(|n| *n > 0)
        && report.split.get("west").is_some_and(|n| *n > 0);
    if !ok || report.unready_to_last_east > Duration::from_secs(30) {
        eprintln!("FAILED: {report:?}");
        std::process::exit(1);
    }
    println!(
        "ok: both clusters served; east drained {:?} after its Pod turned unready",
        report.unready_to_last_east
    );
}
