//! Merge engine benchmarks on a ClusterSet of 100 clusters x 10,000 services (1,000,000
//! exports):
//!
//! - `merge/one_export_change`: one cluster changes its export of one service (adding a
//!   port, then removing it again on the next visit), so every iteration re-merges a
//!   100-export service, flips its `PortConflict` and reports new conditions for all 100
//!   exports. The state is built once, outside the measured loop.
//! - `merge/one_export_noop`: the same update applied again (nothing changes).
//! - `merge/full_rebuild`: [`ClusterSetState::build`] over all 1,000,000 exports.
//!
//! Run: `cargo bench --bench merge -- --warm-up-time 1 --measurement-time 3`.

use std::hint::black_box;

use criterion::{BatchSize, Criterion, criterion_group, criterion_main};
use k8s_openapi::jiff::Timestamp;
use mcs_core::ClusterId;
use mcs_core::api::{
    InternalTrafficPolicy, IpFamily, Protocol, ServicePort, SessionAffinity, StringMap,
};
use mcs_core::merge::{ClusterSetState, Constituent, ServiceFacts, ServiceKind, Stability};
use mcs_core::name::ServiceRef;

const CLUSTERS: usize = 100;
const SERVICES: usize = 10_000;
/// The cluster whose export the change benchmark edits (not the winner).
const EDITED: usize = 50;

struct ClusterSet {
    clusters: Vec<ClusterId>,
    services: Vec<ServiceRef>,
}

impl ClusterSet {
    fn new() -> Self {
        Self {
            clusters: (0..CLUSTERS)
                .map(|c| cluster(&format!("cluster-{c:03}")))
                .collect(),
            services: (0..SERVICES)
                .map(|s| service(&format!("team-{:03}", s / 100), &format!("svc-{s:05}")))
                .collect(),
        }
    }

    /// One cluster's export of one service; `extra_port` makes it disagree with the others.
    fn export(&self, c: usize, s: usize, extra_port: bool) -> Constituent {
        let mut ports = vec![
            port("http", Protocol::Tcp, 80),
            port("grpc", Protocol::Tcp, 9443),
        ];
        if extra_port {
            ports.push(port("metrics", Protocol::Tcp, 9090));
        }
        let Ok(facts) = ServiceFacts::builder(ServiceKind::ClusterSetIp)
            .ports(ports)
            .session_affinity(SessionAffinity::None)
            .ip_families([IpFamily::IPv4])
            .internal_traffic_policy(InternalTrafficPolicy::Cluster)
            .build()
        else {
            unreachable!("the bench's ports are distinct and in range");
        };
        let mut labels = StringMap::new();
        labels.insert("app".to_owned(), self.services[s].name.to_string());
        // Cluster c exported c seconds after cluster 0: cluster-000 wins every service.
        Constituent::new(self.clusters[c].clone(), at(c), Some(facts)).with_exported_labels(labels)
    }

    fn all(&self) -> Vec<(ServiceRef, Constituent)> {
        let mut all = Vec::with_capacity(CLUSTERS * SERVICES);
        for s in 0..SERVICES {
            for c in 0..CLUSTERS {
                all.push((self.services[s].clone(), self.export(c, s, false)));
            }
        }
        all
    }
}

fn bench(c: &mut Criterion) {
    let set = ClusterSet::new();
    let all = set.all();
    let mut group = c.benchmark_group("merge");

    let mut state = ClusterSetState::build(Stability::Sticky, all.iter().cloned());
    // Prepared updates, so the loop measures the engine, not building inputs.
    let changed: Vec<Constituent> = (0..SERVICES).map(|s| set.export(EDITED, s, true)).collect();
    let restored: Vec<Constituent> = (0..SERVICES)
        .map(|s| set.export(EDITED, s, false))
        .collect();
    let mut i = 0;
    group.bench_function("one_export_change", |b| {
        b.iter(|| {
            let s = i % SERVICES;
            let add = (i / SERVICES).is_multiple_of(2);
            i += 1;
            let export = if add { &changed[s] } else { &restored[s] };
            let change = state.upsert(&set.services[s], export.clone());
            debug_assert_eq!(change.conditions.len(), CLUSTERS);
            black_box(change)
        });
    });
    group.bench_function("one_export_noop", |b| {
        let s = SERVICES / 2;
        let current = state.exports(&set.services[s]).nth(EDITED).cloned();
        let Some(current) = current else {
            unreachable!("every service has 100 exports")
        };
        b.iter(|| black_box(state.upsert(&set.services[s], current.clone())));
    });
    drop(state);

    group.sample_size(10);
    group.bench_function("full_rebuild", |b| {
        b.iter_batched(
            || all.clone(),
            |all| ClusterSetState::build(Stability::Sticky, all),
            BatchSize::PerIteration,
        );
    });
    group.finish();
}

fn cluster(name: &str) -> ClusterId {
    let Ok(id) = name.parse() else {
        unreachable!("{name} is a valid cluster id")
    };
    id
}

fn service(namespace: &str, name: &str) -> ServiceRef {
    let Ok(service) = ServiceRef::new(namespace, name) else {
        unreachable!("{namespace}/{name} is a valid service")
    };
    service
}

fn port(name: &str, protocol: Protocol, number: i32) -> ServicePort {
    ServicePort {
        name: Some(name.to_owned()),
        protocol: Some(protocol),
        app_protocol: None,
        port: number,
    }
}

fn at(seconds: usize) -> Timestamp {
    let Ok(t) = Timestamp::from_second(1_780_000_000 + seconds as i64) else {
        unreachable!("a 2026 timestamp is in range")
    };
    t
}

criterion_group!(benches, bench);
criterion_main!(benches);
