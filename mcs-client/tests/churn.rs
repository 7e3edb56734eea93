//! Endpoint churn under load: a rolling replacement of every server (removed from
//! discovery, drained, stopped, replaced by a new one on a new address) while concurrent
//! clients keep calling; no request may fail.

mod support;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use mcs_client::{McsLayer, Served, StaticResolver};
use mcs_core::endpoints::Locality;
use tower::{ServiceBuilder, ServiceExt};

use support::*;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_replacement_under_load_fails_no_request() {
    let mut live = servers(10, 6, 3, 0, "east").await;
    live.extend(servers(20, 6, 3, 0, "west").await);
    let resolver = StaticResolver::new();
    let t = target(9443);
    resolver.set(&t, live.iter().map(TestServer::endpoint));
    let layer = McsLayer::new(resolver.clone(), Locality::cluster(cluster("north")));
    let svc = ServiceBuilder::new().layer(layer).service(http1_client());

    let done = Arc::new(AtomicBool::new(false));
    let mut workers = tokio::task::JoinSet::new();
    for _ in 0..16 {
        let (svc, done) = (svc.clone(), Arc::clone(&done));
        workers.spawn(async move {
            let mut by_addr: HashMap<_, usize> = HashMap::new();
            let mut n = 0;
            // Bounded: stop when churn is over, and never after 20 000 requests.
            while !done.load(Ordering::Relaxed) && n < 20_000 {
                let response = svc
                    .clone()
                    .oneshot(get(9443, "/accrue"))
                    .await
                    .expect("no request may fail");
                assert!(response.status().is_success());
                let addr = response.extensions().get::<Served>().unwrap().addr();
                let (_, answered_by, _) = answer(response).await;
                assert_eq!(addr, answered_by);
                *by_addr.entry(addr).or_default() += 1;
                n += 1;
            }
            by_addr
        });
    }

    // Replace every server, one at a time, as a rolling update would.
    let mut replacements = Vec::new();
    for round in 0..6u8 {
        tokio::time::sleep(Duration::from_millis(60)).await;
        let old = live.remove(0);
        let (second, cluster_name) = if old.cluster.as_str() == "east" {
            (10, "east")
        } else {
            (20, "west")
        };
        // 1. Out of discovery (the EndpointSlice drops it) and a drain period.
        resolver.remove(&t, [old.addr]);
        tokio::time::sleep(Duration::from_millis(60)).await;
        // 2. Stopped: in-flight requests finish, connections close.
        old.stop().await;
        // 3. Its replacement starts and is announced; every other round as a full reset.
        let new =
            TestServer::start(IpAddr::from([127, second, 6, 10 + round]), 0, cluster_name).await;
        replacements.push(new.addr);
        live.push(new);
        if round % 2 == 0 {
            resolver.add(&t, [live.last().unwrap().endpoint()]);
        } else {
            resolver.set(&t, live.iter().map(TestServer::endpoint));
        }
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    done.store(true, Ordering::Relaxed);

    let mut total: HashMap<_, usize> = HashMap::new();
    while let Some(result) = workers.join_next().await {
        for (addr, n) in result.expect("worker saw a failed request") {
            *total.entry(addr).or_default() += n;
        }
    }
    let requests: usize = total.values().sum();
    assert!(requests >= 1000, "load ran: {requests} requests");
    for addr in &replacements {
        assert!(
            total.get(addr).copied().unwrap_or(0) > 0,
            "replacement {addr} got traffic: {total:?}"
        );
    }
    for s in live {
        s.stop().await;
    }
}
