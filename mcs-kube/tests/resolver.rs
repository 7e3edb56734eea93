//! The Kubernetes resolver against a real API server: slices merged across clusters and
//! pieces, per-port eligibility, readiness changes, and the service going away.

mod support;

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
    let cluster = start_cluster(
        "resolver",
        ClusterOptions {
            controller_manager: false,
            install_crds: true,
            ..Default::default()
        },
    )
    .await;
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
