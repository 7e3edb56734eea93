//! Endpoint churn under load: a rolling replacement of every server (removed from
//! discovery, stopped once the balancer no longer picks it, replaced by a new one on a new
//! address) while concurrent clients keep calling; no request may fail. Every step waits on
//! an event (the balancer's endpoint set, a server's request count), never on time.

mod support;

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use mcs_client::{CloneBody, McsLayer, Retry, Served, StaticResolver};
use mcs_core::endpoints::Locality;
use tower::{ServiceBuilder, ServiceExt};

use support::*;

/// Requests every server (original or replacement) serves before the next one is replaced.
const PER_ROUND: u64 = 50;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn rolling_replacement_under_load_fails_no_request() {
    let mut live = servers(10, 6, 3, 0, "east").await;
    live.extend(servers(20, 6, 3, 0, "west").await);
    let resolver = StaticResolver::new();
    let t = target(9443);
    resolver.set(&t, live.iter().map(TestServer::endpoint));
    // Retries on connect failures, as a production client would have: a request that
    // picked an endpoint just before its removal reached the balancer may still try it
    // after the server stopped listening.
    let layer = McsLayer::builder(resolver.clone(), Locality::cluster(cluster("north")))
        .retry(Retry::new(CloneBody))
        .build();
    let svc = ServiceBuilder::new().layer(layer.clone()).service(http1());

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
    for server in &live {
        server.wait_served(PER_ROUND).await;
    }
    let mut replacements = Vec::new();
    for round in 0..6u8 {
        let old = live.remove(0);
        let (second, cluster_name) = if old.cluster.as_str() == "east" {
            (10, "east")
        } else {
            (20, "west")
        };
        // 1. Out of discovery (the EndpointSlice drops it); wait until the balancer has it.
        resolver.remove(&t, [old.addr]);
        assert!(
            layer
                .wait_for_endpoints(&t, |eps| eps.iter().all(|e| e.addr != old.addr))
                .await
        );
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
        // The replacement takes its share of the load before the next server goes.
        live.last().unwrap().wait_served(PER_ROUND).await;
    }
    done.store(true, Ordering::Relaxed);

    let mut total: HashMap<_, usize> = HashMap::new();
    while let Some(result) = workers.join_next().await {
        for (addr, n) in result.expect("worker saw a failed request") {
            *total.entry(addr).or_default() += n;
        }
    }
    let requests: usize = total.values().sum();
    assert!(
        requests >= 12 * PER_ROUND as usize,
        "load ran: {requests} requests"
    );
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
