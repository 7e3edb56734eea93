//! The Kubernetes resolver against a real API server: slices merged across clusters and
//! pieces, per-port eligibility, readiness changes, and the service going away (hand-written
//! imported slices, to control their exact shape); and on real Pods, a Deployment scaled
//! up and down while a balancer picks from what the resolver delivers.

use mcs_testkit as support;
use mcs_testkit::clusterset;

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use futures::StreamExt;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::api::{Api, DeleteParams, ObjectMeta, Patch, PatchParams, PostParams};
use mcs_core::ClusterId;
use mcs_core::api::{
    LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, Protocol, ServiceImportSpec, ServiceImportType,
    ServicePort, v1beta1::ServiceImport,
};
use mcs_core::discovery::{Resolve, Target, Update};
use mcs_core::endpoints::{Balancer, BalancerConfig, Locality, PickContext};
use mcs_core::name::ServiceRef;
use mcs_kube::resolver::KubeResolver;
use support::{ClusterOptions, start_cluster};

const NS: &str = "loyalty";

fn slice(
    name: &str,
    cluster: &str,
    port_name: &str,
    port: i32,
    endpoints: &[(&str, bool)],
) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([
                (
                    LABEL_SERVICE_NAME.to_string(),
                    "loyalty-accrual".to_string(),
                ),
                (LABEL_SOURCE_CLUSTER.to_string(), cluster.to_string()),
            ])),
            ..Default::default()
        },
        endpoints: endpoints
            .iter()
            .map(|(addr, ready)| Endpoint {
                addresses: vec![addr.to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(*ready),
                    ..Default::default()
                }),
                zone: Some(format!("{cluster}-a")),
                ..Default::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: Some(port_name.into()),
            port: Some(port),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    }
}

async fn next_reset(
    stream: &mut mcs_core::discovery::Resolution,
) -> Vec<mcs_core::discovery::Endpoint> {
    loop {
        match tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .expect("an update within 20 s")
        {
            Some(Ok(Update::Reset(list))) => return list,
            Some(Ok(other)) => panic!("expected a reset, got {other:?}"),
            Some(Err(e)) => eprintln!("transient: {e}"),
            None => panic!("resolution ended"),
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn resolves_merges_and_follows_readiness() {
    let cluster = start_cluster("resolver", ClusterOptions::api_only()).await;
    let client = cluster.client().await;
    support::create_namespace(&client, NS).await;
    let resolver = KubeResolver::new(client.clone());
    let target = Target {
        service: ServiceRef::new(NS, "loyalty-accrual").unwrap(),
        port: 9443,
    };
    let mut stream = resolver.resolve(&target);

    // No import yet: the service does not exist.
    let first = tokio::time::timeout(Duration::from_secs(20), stream.next())
        .await
        .unwrap()
        .unwrap()
        .unwrap();
    assert_eq!(first, Update::DoesNotExist);

    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let mut spec = ServiceImportSpec::new(ServiceImportType::ClusterSetIp);
    spec.ports = vec![
        ServicePort {
            name: Some("grpc".into()),
            protocol: Some(Protocol::Tcp),
            app_protocol: None,
            port: 9443,
        },
        ServicePort {
            name: Some("admin".into()),
            protocol: Some(Protocol::Tcp),
            app_protocol: None,
            port: 9090,
        },
    ];
    let mut import = ServiceImport::new("loyalty-accrual", spec);
    import.metadata.namespace = Some(NS.into());
    let pp = PostParams::default();
    slices
        .create(
            &pp,
            &slice(
                "east-1",
                "east",
                "grpc",
                8443,
                &[("10.10.0.1", true), ("10.10.0.2", true)],
            ),
        )
        .await
        .unwrap();
    slices
        .create(
            &pp,
            &slice("east-2", "east", "grpc", 8443, &[("10.10.0.3", true)]),
        )
        .await
        .unwrap();
    slices
        .create(
            &pp,
            &slice("west-1", "west", "grpc", 8443, &[("10.20.0.1", true)]),
        )
        .await
        .unwrap();
    // West also has a slice for a port the import's 9443 does not map to.
    slices
        .create(
            &pp,
            &slice(
                "north-admin",
                "north",
                "admin",
                9090,
                &[("10.30.0.1", true)],
            ),
        )
        .await
        .unwrap();
    imports.create(&pp, &import).await.unwrap();

    let mut list = next_reset(&mut stream).await;
    while list.len() < 4 {
        list = next_reset(&mut stream).await;
    }
    let addrs: Vec<String> = list.iter().map(|e| e.addr.to_string()).collect();
    assert_eq!(
        addrs,
        [
            "10.10.0.1:8443",
            "10.10.0.2:8443",
            "10.10.0.3:8443",
            "10.20.0.1:8443"
        ],
        "all slices merged, north (admin only) excluded"
    );
    assert_eq!(list[3].cluster, ClusterId::new("west").unwrap());
    assert_eq!(list[0].zone.as_deref(), Some("east-a"));

    // A balancer fed by the resolver stops picking an endpoint as soon as it turns unready.
    let balancer = Balancer::new(
        Locality::cluster(ClusterId::new("north").unwrap()),
        BalancerConfig::default(),
        Instant::now(),
    );
    balancer.apply(Update::Reset(list));
    let unready = slice("east-2", "east", "grpc", 8443, &[("10.10.0.3", false)]);
    let started = Instant::now();
    slices
        .patch(
            "east-2",
            &PatchParams::apply("test").force(),
            &Patch::Apply(&unready),
        )
        .await
        .unwrap();
    let list = loop {
        let list = next_reset(&mut stream).await;
        if list
            .iter()
            .any(|e| e.addr.to_string() == "10.10.0.3:8443" && !e.ready)
        {
            break list;
        }
    };
    let elapsed = started.elapsed();
    eprintln!("endpoint unready in the API server -> update delivered: {elapsed:?}");
    balancer.apply(Update::Reset(list));
    for r in 0..2_000u64 {
        let picked = balancer
            .pick(PickContext::new(
                r.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                Instant::now(),
            ))
            .unwrap();
        assert_ne!(picked.addr().to_string(), "10.10.0.3:8443");
    }

    // A slice deleted: its endpoints go; the others stay (no drop to empty).
    slices
        .delete("east-1", &DeleteParams::default())
        .await
        .unwrap();
    let list = loop {
        let list = next_reset(&mut stream).await;
        if list.len() == 2 {
            break list;
        }
        assert!(!list.is_empty(), "never an empty set while slices remain");
    };
    assert!(list.iter().all(|e| e.addr.to_string() != "10.10.0.1:8443"));

    // The import goes: the service does not exist.
    imports
        .delete("loyalty-accrual", &DeleteParams::default())
        .await
        .unwrap();
    loop {
        match tokio::time::timeout(Duration::from_secs(20), stream.next())
            .await
            .unwrap()
            .unwrap()
        {
            Ok(Update::DoesNotExist) => break,
            Ok(_) | Err(_) => continue,
        }
    }
}

/// Feeds `balancer` every update of `stream` until `done` holds for it; panics if the
/// stream goes quiet for 20 s first.
async fn feed_until(
    stream: &mut mcs_core::discovery::Resolution,
    balancer: &Balancer,
    what: &str,
    mut done: impl FnMut(&Balancer) -> bool,
) {
    while !done(balancer) {
        match tokio::time::timeout(Duration::from_secs(20), stream.next()).await {
            Err(_) => panic!("no update within 20 s while waiting for {what}"),
            Ok(Some(Ok(update))) => {
                balancer.apply(update);
            }
            Ok(Some(Err(e))) => eprintln!("transient: {e}"),
            Ok(None) => panic!("resolution ended while waiting for {what}"),
        }
    }
}

/// The clusters of 200 picks.
fn picked_clusters(balancer: &Balancer) -> std::collections::BTreeSet<String> {
    (0..200u64)
        .map(|r| {
            let picked = balancer
                .pick(PickContext::new(
                    r.wrapping_mul(0x9e37_79b9_7f4a_7c15),
                    Instant::now(),
                ))
                .unwrap();
            picked.endpoint().cluster.as_str().to_owned()
        })
        .collect()
}

/// KEP-5939's results reach the caller: with the CRDs that carry cluster selection, the
/// import's `status.clusterSelectorResults` (which the agent writes for this cluster; here
/// the test does) arrive as the balancer's cluster preference, before the set and on every
/// change, and the preference is lifted when the results go.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_the_imports_cluster_selector_results() {
    use mcs_core::endpoints::ClusterPreference;

    let cluster = start_cluster("resolver-selection", ClusterOptions::api_only()).await;
    let client = cluster.client().await;
    support::install_cluster_selection_crds(&client).await;
    support::create_namespace(&client, NS).await;
    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let pp = PostParams::default();
    for (name, cluster, addrs) in [
        (
            "east-1",
            "east",
            &[("10.10.0.1", true), ("10.10.0.2", true)][..],
        ),
        ("west-1", "west", &[("10.20.0.1", true)][..]),
    ] {
        slices
            .create(&pp, &slice(name, cluster, "grpc", 8443, addrs))
            .await
            .unwrap();
    }
    let mut spec = ServiceImportSpec::new(ServiceImportType::ClusterSetIp);
    spec.ports = vec![ServicePort {
        name: Some("grpc".into()),
        protocol: Some(Protocol::Tcp),
        app_protocol: None,
        port: 9443,
    }];
    spec.cluster_selectors = Some(
        serde_json::from_str(
            r#"[{"propertySelector": {"matchProperties": {"region": "@SameAsImporter@"}}},
                {"propertySelector": {"matchExpressions": [{"key": "region", "operator": "Exists"}]}}]"#,
        )
        .unwrap(),
    );
    let mut import = ServiceImport::new("loyalty-accrual", spec);
    import.metadata.namespace = Some(NS.into());
    imports.create(&pp, &import).await.unwrap();
    let set_results = |results: serde_json::Value| {
        let imports = imports.clone();
        async move {
            imports
                .patch_status(
                    "loyalty-accrual",
                    &PatchParams::default(),
                    &Patch::Merge(serde_json::json!({
                        "status": { "clusterSelectorResults": results }
                    })),
                )
                .await
                .unwrap()
        }
    };
    let patched = set_results(serde_json::json!([
        { "clusters": ["west"] },
        { "clusters": ["east", "west"] },
    ]))
    .await;
    assert!(
        patched
            .status
            .and_then(|s| s.cluster_selector_results)
            .is_some(),
        "the status keeps clusterSelectorResults"
    );
    let preference = |sets: &[&[&str]]| {
        ClusterPreference::new(
            sets.iter()
                .map(|set| set.iter().map(|c| ClusterId::new(*c).unwrap())),
        )
        .unwrap()
    };

    let resolver = KubeResolver::new(client.clone());
    let target = Target {
        service: ServiceRef::new(NS, "loyalty-accrual").unwrap(),
        port: 9443,
    };
    let mut stream = resolver.resolve(&target);
    let balancer = Balancer::new(
        Locality::cluster(ClusterId::new("north").unwrap()),
        BalancerConfig::default(),
        Instant::now(),
    );
    let west_first = preference(&[&["west"], &["east", "west"]]);
    // The resolver sends the preference before the first set, which has all three
    // endpoints (the slices were there before the resolution started).
    feed_until(&mut stream, &balancer, "west first, and the set", |b| {
        b.cluster_preference().as_ref() == Some(&west_first) && !b.snapshot().is_empty()
    })
    .await;
    assert_eq!(picked_clusters(&balancer), ["west".to_owned()].into());

    // New results: the preference follows.
    set_results(serde_json::json!([{ "clusters": ["east"] }, { "clusters": ["west"] }])).await;
    let east_first = preference(&[&["east"], &["west"]]);
    feed_until(&mut stream, &balancer, "east first", |b| {
        b.cluster_preference().as_ref() == Some(&east_first)
    })
    .await;
    assert_eq!(picked_clusters(&balancer), ["east".to_owned()].into());

    // The results go (the agent removes them when the import's selectors go): the
    // preference is lifted, both clusters take traffic.
    set_results(serde_json::Value::Null).await;
    feed_until(&mut stream, &balancer, "no preference", |b| {
        b.cluster_preference().is_none()
    })
    .await;
    assert_eq!(
        picked_clusters(&balancer),
        ["east".to_owned(), "west".to_owned()].into()
    );
}

/// The addresses of `pods` on `port`, sorted.
fn pod_addrs(pods: &[k8s_openapi::api::core::v1::Pod], port: u16) -> Vec<String> {
    let mut addrs: Vec<String> = pods
        .iter()
        .flat_map(support::pod_ips)
        .map(|ip| std::net::SocketAddr::new(ip, port).to_string())
        .collect();
    addrs.sort();
    addrs
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn follows_a_deployment_scaled_up_and_down_while_a_balancer_picks() {
    use clusterset::{ClusterSet, export};
    use mcs_core::discovery::EndpointTable;

    let set = ClusterSet::start_with_pods(&["east", "west", "north"]).await;
    set.namespace(NS).await;
    let ports = [("grpc", 9443, "TCP")];
    for (i, replicas) in [(0, 2), (1, 1)] {
        let client = set.client(i);
        support::create(
            client,
            NS,
            &support::deployment("accrual", replicas, &ports),
        )
        .await;
        support::create(
            client,
            NS,
            &support::service("accrual", "accrual", &ports, false),
        )
        .await;
        export(client, NS, "accrual", None).await;
    }
    let west = support::wait_ready_pods(set.client(1), NS, "app=accrual", 1).await;

    // North's resolver feeds a table (what the caller sees) and a balancer that picks after
    // every update; a pick with no endpoint while Pods were ready would be an outage.
    let resolver = KubeResolver::new(set.client(2).clone());
    let target = Target {
        service: ServiceRef::new(NS, "accrual").unwrap(),
        port: 9443,
    };
    let mut stream = resolver.resolve(&target);
    let (seen_tx, mut seen) = tokio::sync::watch::channel(Vec::<String>::new());
    let (stop, mut stopped) = tokio::sync::oneshot::channel::<()>();
    let consumer = tokio::spawn(async move {
        let balancer = Balancer::new(
            Locality::cluster(ClusterId::new("north").unwrap()),
            BalancerConfig::default(),
            Instant::now(),
        );
        let mut table = EndpointTable::new();
        let (mut updates, mut picks, mut failures) = (0u64, 0u64, Vec::new());
        loop {
            let update = tokio::select! {
                _ = &mut stopped => break,
                u = stream.next() => u,
            };
            let update = match update {
                Some(Ok(u)) => u,
                Some(Err(e)) => {
                    eprintln!("transient: {e}");
                    continue;
                }
                None => panic!("resolution ended"),
            };
            updates += 1;
            table.apply(update.clone());
            balancer.apply(update);
            let ready: Vec<String> = table
                .endpoints()
                .filter(|e| e.ready)
                .map(|e| e.addr.to_string())
                .collect();
            if !ready.is_empty() || !seen_tx.borrow().is_empty() {
                // Once the service had endpoints, every set has some (west keeps its Pod).
                for r in 0..100u64 {
                    picks += 1;
                    match balancer.pick(PickContext::new(r, Instant::now())) {
                        Ok(p) if ready.contains(&p.addr().to_string()) => {}
                        Ok(p) => failures.push(format!("picked {} outside {ready:?}", p.addr())),
                        Err(e) => failures.push(format!("no pick from {ready:?}: {e}")),
                    }
                }
            }
            seen_tx.send_replace(ready);
        }
        (updates, picks, failures)
    });

    let expect = |east: &[k8s_openapi::api::core::v1::Pod]| {
        let mut all = [pod_addrs(east, 9443), pod_addrs(&west, 9443)].concat();
        all.sort();
        all
    };
    let mut wait_set = async |want: Vec<String>, what: &str| {
        let ok = matches!(
            tokio::time::timeout(SCALE_TIMEOUT, seen.wait_for(|s| *s == want)).await,
            Ok(Ok(_))
        );
        assert!(
            ok,
            "{what}: the resolver delivered {:?}, want {want:?}",
            *seen.borrow()
        );
    };
    let east = support::wait_ready_pods(set.client(0), NS, "app=accrual", 2).await;
    wait_set(expect(&east), "2 + 1 Pods").await;
    support::scale_deployment(set.client(0), NS, "accrual", 5).await;
    let east = support::wait_ready_pods(set.client(0), NS, "app=accrual", 5).await;
    wait_set(expect(&east), "scaled up to 5 + 1").await;
    support::scale_deployment(set.client(0), NS, "accrual", 1).await;
    let east = support::wait_ready_pods(set.client(0), NS, "app=accrual", 1).await;
    wait_set(expect(&east), "scaled down to 1 + 1").await;
    support::scale_deployment(set.client(0), NS, "accrual", 0).await;
    support::wait_ready_pods(set.client(0), NS, "app=accrual", 0).await;
    wait_set(expect(&[]), "east scaled to 0").await;

    let _ = stop.send(());
    let (updates, picks, failures) = consumer.await.unwrap();
    println!("{updates} updates, {picks} picks while scaling");
    assert!(picks > 0);
    assert!(failures.is_empty(), "{failures:?}");
}

/// How long the resolver may take to deliver a scaled Deployment's endpoints (agent
/// export, import and slices, then the resolver's watch).
const SCALE_TIMEOUT: Duration = Duration::from_secs(60);
