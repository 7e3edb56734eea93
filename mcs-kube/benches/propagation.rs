//! Propagation latency of the agent against three real API servers (not a criterion bench:
//! each sample takes hundreds of milliseconds of real cluster work).
//!
//! ```text
//! scripts/k8s-bins.sh && MCS_PROPAGATION_RUNS=30 cargo bench -p mcs-kube --bench propagation
//! ```
//!
//! Per run, in a fresh namespace:
//! - **export → import**: a ServiceExport created in `east` (whose Service has a ready Pod,
//!   published in an EndpointSlice by kube-controller-manager) until `north` has the
//!   ServiceImport and an imported EndpointSlice holding that Pod's address;
//! - **unready → gone**: the Pod turned unready in `east` until `north`'s imported slices no
//!   longer list it as ready.
//!
//! Both are polled every 5 ms through the API, so figures are accurate to about that.

use mcs_testkit as support;
use mcs_testkit::clusterset;

use std::time::{Duration, Instant};

use clusterset::*;

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

fn report(what: &str, mut samples: Vec<Duration>) {
    samples.sort();
    println!(
        "{what:<18} n={:<3} p50={:>7.1} ms  p90={:>7.1} ms  p99={:>7.1} ms  max={:>7.1} ms",
        samples.len(),
        percentile(&samples, 0.5).as_secs_f64() * 1e3,
        percentile(&samples, 0.9).as_secs_f64() * 1e3,
        percentile(&samples, 0.99).as_secs_f64() * 1e3,
        samples.last().unwrap().as_secs_f64() * 1e3,
    );
}

async fn poll<F, Fut>(mut f: F) -> Duration
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    let start = Instant::now();
    loop {
        if f().await {
            return start.elapsed();
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no propagation within 60 s"
        );
        tokio::time::sleep(Duration::from_millis(5)).await;
    }
}

fn ready_addresses(slices: &[k8s_openapi::api::discovery::v1::EndpointSlice]) -> Vec<String> {
    slices
        .iter()
        .flat_map(|s| s.endpoints.iter())
        .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
        .flat_map(|e| e.addresses.clone())
        .collect()
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return; // `cargo bench -- --list` and friends: nothing to list.
    }
    let runs: usize = std::env::var("MCS_PROPAGATION_RUNS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20);
    let set = ClusterSet::start(&["east", "west", "north"], true).await;
    let (east, north) = (set.client(0).clone(), set.client(2).clone());
    support::ensure_fake_node(&east).await;
    let mut to_import = Vec::new();
    let mut to_unready = Vec::new();
    for run in 0..runs {
        let ns = format!("prop-{run}");
        set.namespace(&ns).await;
        let ip = format!("192.0.2.{}", 10 + run % 200);
        support::create_ready_pod(
            &east,
            &ns,
            "accrual-0",
            &[("app", "accrual")],
            &ip,
            &[("tcp", 42), ("udp", 42)],
        )
        .await;
        create_service(&east, &ns, &hello_service("accrual")).await;
        // Wait until east's own slice lists the pod, so only the agent's work is timed.
        support::wait_for("source slice", Duration::from_secs(30), || async {
            let api: kube::Api<k8s_openapi::api::discovery::v1::EndpointSlice> =
                kube::Api::namespaced(east.clone(), &ns);
            let list = api
                .list(
                    &kube::api::ListParams::default().labels("kubernetes.io/service-name=accrual"),
                )
                .await
                .ok()?;
            ready_addresses(&list.items).contains(&ip).then_some(())
        })
        .await;

        let started = Instant::now();
        export(&east, &ns, "accrual", None).await;
        poll(|| async {
            let has_import =
                kube::Api::<mcs_core::api::v1beta1::ServiceImport>::namespaced(north.clone(), &ns)
                    .get_opt("accrual")
                    .await
                    .ok()
                    .flatten()
                    .is_some();
            has_import && ready_addresses(&mcs_slices(&north, &ns, "accrual").await).contains(&ip)
        })
        .await;
        to_import.push(started.elapsed());

        let started = Instant::now();
        support::set_pod_status(&east, &ns, "accrual-0", Some(&ip), false).await;
        poll(|| async {
            !ready_addresses(&mcs_slices(&north, &ns, "accrual").await).contains(&ip)
        })
        .await;
        to_unready.push(started.elapsed());
        eprintln!(
            "run {run}: export->import {:?}, unready->gone {:?}",
            to_import[run], to_unready[run]
        );
    }
    println!(
        "propagation east -> north, {runs} runs, 3 real API servers with kube-controller-manager, {} cores",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    report("export -> import", to_import);
    report("unready -> gone", to_unready);
}
