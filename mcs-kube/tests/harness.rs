//! Tests of the real-Kubernetes harness itself (`mcs-testkit`): parallel start,
//! isolation between clusters, API server restart, and kube-controller-manager
//! producing EndpointSlices. Needs the binaries from `scripts/k8s-bins.sh`.

use mcs_testkit as support;

use std::collections::HashSet;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, ObjectMeta, PostParams};
use support::{ClusterOptions, start_cluster, start_clusters, wait_for};

fn config_map(name: &str, data: &[(&str, &str)]) -> ConfigMap {
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        data: Some(
            data.iter()
                .map(|(k, v)| (k.to_string(), v.to_string()))
                .collect(),
        ),
        ..Default::default()
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_clusters_start_in_parallel_and_are_independent() {
    let t0 = Instant::now();
    let clusters = start_clusters(&["east", "west", "north"]).await;
    let elapsed = t0.elapsed();
    for c in &clusters {
        println!(
            "cluster {} at {}: ready in {:.1?}",
            c.name(),
            c.server_url(),
            c.startup_time()
        );
    }
    println!("3-cluster parallel startup: {elapsed:.1?}");
    assert_eq!(clusters.len(), 3);

    // Distinct API servers, each with its own CA.
    let urls: HashSet<_> = clusters.iter().map(|c| c.server_url()).collect();
    assert_eq!(urls.len(), 3);
    let cas: Vec<_> = clusters
        .iter()
        .map(|c| {
            c.kubeconfig().clusters[0]
                .cluster
                .as_ref()
                .unwrap()
                .certificate_authority_data
                .clone()
                .unwrap()
        })
        .collect();
    assert_ne!(cas[0], cas[1]);
    assert_ne!(cas[1], cas[2]);

    let east = clusters[0].client().await;
    let west = clusters[1].client().await;
    let north = clusters[2].client().await;

    // A ConfigMap round-trips through the real API server.
    let cms: Api<ConfigMap> = Api::namespaced(east.clone(), "default");
    cms.create(
        &PostParams::default(),
        &config_map("only-in-east", &[("k", "v"), ("multi", "line\nvalue")]),
    )
    .await
    .unwrap();
    let got = cms.get("only-in-east").await.unwrap();
    let data = got.data.unwrap();
    assert_eq!(data["k"], "v");
    assert_eq!(data["multi"], "line\nvalue");
    assert!(got.metadata.uid.is_some());
    assert!(got.metadata.resource_version.is_some());

    // ... and exists in that cluster only.
    for other in [&west, &north] {
        let api: Api<ConfigMap> = Api::namespaced(other.clone(), "default");
        assert!(api.get_opt("only-in-east").await.unwrap().is_none());
    }
    // The same name can be created independently elsewhere.
    Api::<ConfigMap>::namespaced(west.clone(), "default")
        .create(
            &PostParams::default(),
            &config_map("only-in-east", &[("k", "west")]),
        )
        .await
        .unwrap();
    assert_eq!(
        cms.get("only-in-east").await.unwrap().data.unwrap()["k"],
        "v"
    );

    // The CRDs from deploy/crds are installed in every cluster.
    let expected = support::load_crds().len();
    for c in &clusters {
        let crds: Api<
            k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition,
        > = Api::all(c.client().await);
        let n = crds.list(&ListParams::default()).await.unwrap().items.len();
        assert_eq!(n, expected, "CRDs in cluster {}", c.name());
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn api_server_restart_keeps_data() {
    let opts = ClusterOptions {
        controller_manager: false,
        install_crds: false,
        ..Default::default()
    };
    let mut cluster = start_cluster("restart", opts).await;
    let client = cluster.client().await;
    let cms: Api<ConfigMap> = Api::namespaced(client.clone(), "default");
    cms.create(
        &PostParams::default(),
        &config_map("survivor", &[("k", "v")]),
    )
    .await
    .unwrap();

    cluster.stop();
    assert!(!cluster.is_running());
    let err = tokio::time::timeout(Duration::from_secs(10), cms.get("survivor")).await;
    assert!(
        matches!(err, Ok(Err(_)) | Err(_)),
        "API server still answers after stop()"
    );

    let url = cluster.server_url().to_string();
    cluster.start().await;
    assert_eq!(cluster.server_url(), url, "restart must reuse the port");
    // The old client (same URL and credentials) works again, and the data is there.
    let got = cms.get("survivor").await.unwrap();
    assert_eq!(got.data.unwrap()["k"], "v");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn controller_manager_publishes_endpointslices_and_finalizes_namespaces() {
    let opts = ClusterOptions {
        controller_manager: true,
        install_crds: false,
        ..Default::default()
    };
    let mut cluster = start_cluster("kcm", opts).await;
    let client = cluster.client().await;
    let ns = "app";
    support::create_namespace(&client, ns).await;

    support::create_ready_pod(
        &client,
        ns,
        "web-0",
        &[("app", "web")],
        "192.0.2.10",
        &[("http", 8080)],
    )
    .await;
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "web", "namespace": ns },
        "spec": {
            "selector": { "app": "web" },
            "ports": [{ "name": "http", "port": 80, "targetPort": "http" }],
        },
    }))
    .unwrap();
    let svc = Api::<Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let cluster_ip = svc.spec.unwrap().cluster_ip.unwrap();
    assert!(cluster_ip.starts_with("10.0.0."), "ClusterIP {cluster_ip}");

    let t0 = Instant::now();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    let lp = ListParams::default().labels("kubernetes.io/service-name=web");
    let slice = wait_for(
        "EndpointSlice of web with 192.0.2.10",
        Duration::from_secs(60),
        || {
            let slices = slices.clone();
            let lp = lp.clone();
            async move {
                slices.list(&lp).await.ok()?.items.into_iter().find(|s| {
                    s.endpoints
                        .iter()
                        .any(|e| e.addresses.iter().any(|a| a == "192.0.2.10"))
                })
            }
        },
    )
    .await;
    println!(
        "EndpointSlice published {:.1?} after the Service",
        t0.elapsed()
    );
    cluster.assert_controller_manager_running();
    assert_eq!(slice.address_type, "IPv4");
    let ep = &slice.endpoints[0];
    assert_eq!(ep.conditions.as_ref().unwrap().ready, Some(true));
    assert_eq!(ep.node_name.as_deref(), Some(support::FAKE_NODE));
    assert_eq!(ep.zone.as_deref(), Some(support::FAKE_NODE_ZONE));
    assert_eq!(
        ep.target_ref.as_ref().unwrap().name.as_deref(),
        Some("web-0")
    );
    let port = &slice.ports.as_ref().unwrap()[0];
    assert_eq!(port.name.as_deref(), Some("http"));
    assert_eq!(port.port, Some(8080));

    // Not ready -> the endpoint stays, marked not ready.
    support::set_pod_status(&client, ns, "web-0", None, false).await;
    wait_for("endpoint marked not ready", Duration::from_secs(60), || {
        let slices = slices.clone();
        let lp = lp.clone();
        async move {
            let items = slices.list(&lp).await.ok()?.items;
            items
                .iter()
                .flat_map(|s| &s.endpoints)
                .any(|e| e.conditions.as_ref().and_then(|c| c.ready) == Some(false))
                .then_some(())
        }
    })
    .await;

    // Deleting the Pod (as the kubelet would) removes its endpoint.
    support::delete_pod_now(&client, ns, "web-0").await;
    wait_for("endpoint of web-0 removed", Duration::from_secs(60), || {
        let slices = slices.clone();
        let lp = lp.clone();
        async move {
            let items = slices.list(&lp).await.ok()?.items;
            items.iter().all(|s| s.endpoints.is_empty()).then_some(())
        }
    })
    .await;

    // The namespace controller finalizes a deleted namespace and everything in it.
    let t0 = Instant::now();
    support::delete_namespace(&client, ns, Duration::from_secs(90)).await;
    println!("namespace finalized in {:.1?}", t0.elapsed());
    assert!(
        Api::<Service>::namespaced(client.clone(), ns)
            .get_opt("web")
            .await
            .unwrap()
            .is_none()
    );

    // Loopback addresses are rejected by EndpointSlice validation (documented limit).
    let loopback: EndpointSlice = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "loopback", "namespace": "default" },
        "addressType": "IPv4",
        "endpoints": [{ "addresses": ["127.0.0.2"] }],
    }))
    .unwrap();
    let err = Api::<EndpointSlice>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &loopback)
        .await
        .unwrap_err();
    assert!(err.to_string().contains("loopback"), "{err}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_cluster_gets_the_service_and_pod_cidrs_it_is_started_with() {
    use k8s_openapi::api::core::v1::Node;
    use k8s_openapi::api::networking::v1::ServiceCIDR;

    let opts = ClusterOptions {
        controller_manager: true,
        install_crds: false,
        service_cidr: "10.120.0.0/16".into(),
        pod_cidr: Some("10.20.0.0/16".into()),
        ..Default::default()
    };
    let cluster = start_cluster("cidrs", opts).await;
    let client = cluster.client().await;

    // The API server publishes its range as the ServiceCIDR `kubernetes` and allocates
    // ClusterIPs from it.
    let cidrs: Api<ServiceCIDR> = Api::all(client.clone());
    let published = wait_for("ServiceCIDR kubernetes", Duration::from_secs(60), || {
        let cidrs = cidrs.clone();
        async move {
            cidrs
                .get_opt("kubernetes")
                .await
                .ok()
                .flatten()
                .and_then(|c| c.spec)
                .and_then(|s| s.cidrs)
        }
    })
    .await;
    assert_eq!(published, vec!["10.120.0.0/16".to_string()]);
    let svc: Service = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "web", "namespace": "default" },
        "spec": { "ports": [{ "port": 80 }] }
    }))
    .unwrap();
    let svc = Api::<Service>::namespaced(client.clone(), "default")
        .create(&PostParams::default(), &svc)
        .await
        .unwrap();
    let ip = svc.spec.unwrap().cluster_ip.unwrap();
    assert!(
        ip.starts_with("10.120."),
        "ClusterIP {ip} outside 10.120.0.0/16"
    );

    // The controller manager's node IPAM gives a Node a podCIDR from the pod range.
    let nodes: Api<Node> = Api::all(client);
    let node: Node = serde_json::from_value(serde_json::json!({
        "metadata": { "name": "node-0" }
    }))
    .unwrap();
    nodes.create(&PostParams::default(), &node).await.unwrap();
    let pod_cidr = wait_for("node-0's podCIDR", Duration::from_secs(60), || {
        let nodes = nodes.clone();
        async move {
            nodes
                .get("node-0")
                .await
                .ok()
                .and_then(|n| n.spec)
                .and_then(|s| s.pod_cidr)
        }
    })
    .await;
    assert!(
        pod_cidr.starts_with("10.20.") && pod_cidr.ends_with("/24"),
        "podCIDR {pod_cidr} is not a /24 of 10.20.0.0/16"
    );
}

/// Whether `ip` lies in `cidr` (`a.b.c.d/n` or an IPv6 prefix).
fn in_cidr(ip: std::net::IpAddr, cidr: &str) -> bool {
    let (net, len) = cidr.split_once('/').expect("a CIDR");
    let len: u32 = len.parse().expect("a prefix length");
    match (
        ip,
        net.parse::<std::net::IpAddr>().expect("a network address"),
    ) {
        (std::net::IpAddr::V4(ip), std::net::IpAddr::V4(net)) => {
            let mask = u32::MAX.checked_shl(32 - len).unwrap_or(0);
            u32::from(ip) & mask == u32::from(net) & mask
        }
        (std::net::IpAddr::V6(ip), std::net::IpAddr::V6(net)) => {
            let mask = u128::MAX.checked_shl(128 - len).unwrap_or(0);
            u128::from(ip) & mask == u128::from(net) & mask
        }
        _ => false,
    }
}

fn target_names(slices: &[EndpointSlice]) -> Vec<String> {
    let mut names: Vec<String> = slices
        .iter()
        .flat_map(|s| &s.endpoints)
        .filter_map(|e| e.target_ref.as_ref()?.name.clone())
        .collect();
    names.sort();
    names
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kwok_runs_deployments_and_statefulsets_as_ready_pods_with_endpoint_slices() {
    use k8s_openapi::api::core::v1::Node;
    use support::{KWOK_NODE, KWOK_NODE_ZONE};

    let opts = ClusterOptions {
        install_crds: false,
        pod_cidr: Some("10.30.0.0/16".into()),
        ..Default::default()
    }
    .with_pods();
    let mut cluster = start_cluster("kwok", opts).await;
    println!(
        "cluster with pods ready in {:.1?}, of which scheduler + kwok + Node Ready: {:.1?}",
        cluster.startup_time(),
        cluster.pods_startup_time()
    );
    let client = cluster.client().await;
    let ns = "app";
    support::create_namespace(&client, ns).await;
    let node = Api::<Node>::all(client.clone())
        .get(KWOK_NODE)
        .await
        .unwrap();
    let node_cidr = node.spec.unwrap().pod_cidr.unwrap();
    assert!(
        in_cidr(
            node_cidr.split('/').next().unwrap().parse().unwrap(),
            "10.30.0.0/16"
        ),
        "node podCIDR {node_cidr}"
    );

    // A Deployment of 3 becomes 3 Running, Ready Pods with distinct IPs from the Node's
    // podCIDR, and the Service's EndpointSlice lists exactly them, ready.
    let t0 = Instant::now();
    let ports = [("http", 8080, "TCP")];
    support::create(&client, ns, &support::deployment("web", 3, &ports)).await;
    support::create(&client, ns, &support::service("web", "web", &ports, false)).await;
    let pods = support::wait_ready_pods(&client, ns, "app=web", 3).await;
    println!(
        "Deployment of 3: Running and Ready after {:.1?}",
        t0.elapsed()
    );
    let mut ips: Vec<String> = Vec::new();
    for pod in &pods {
        assert_eq!(
            pod.spec.as_ref().unwrap().node_name.as_deref(),
            Some(KWOK_NODE)
        );
        let pod_ips = support::pod_ips(pod);
        assert_eq!(pod_ips.len(), 1, "{:?}", pod.status);
        assert!(
            in_cidr(pod_ips[0], &node_cidr),
            "{} not in {node_cidr}",
            pod_ips[0]
        );
        ips.push(pod_ips[0].to_string());
    }
    ips.sort();
    ips.dedup();
    assert_eq!(ips.len(), 3, "pod IPs are distinct: {ips:?}");
    let slices = support::wait_service_slices(&client, ns, "web", "3 ready endpoints", |s| {
        let eps = support::slice_endpoints(s);
        (eps.len() == 3 && eps.iter().all(|e| e.1)).then(|| s.to_vec())
    })
    .await;
    println!("... and in the EndpointSlice after {:.1?}", t0.elapsed());
    let mut addrs: Vec<String> = support::slice_endpoints(&slices)
        .into_iter()
        .map(|e| e.0)
        .collect();
    addrs.sort();
    assert_eq!(addrs, ips);
    for ep in slices.iter().flat_map(|s| &s.endpoints) {
        assert_eq!(ep.node_name.as_deref(), Some(KWOK_NODE));
        assert_eq!(ep.zone.as_deref(), Some(KWOK_NODE_ZONE));
    }
    assert_eq!(slices[0].ports.as_ref().unwrap()[0].port, Some(8080));

    // Readiness: a Pod reported unready stays in the slice, not ready; then ready again.
    let first = pods[0].metadata.name.clone().unwrap();
    let first_ip = support::pod_ips(&pods[0])[0].to_string();
    support::set_pod_ready(&client, ns, &first, false).await;
    support::wait_service_slices(&client, ns, "web", "the first Pod not ready", |s| {
        let eps = support::slice_endpoints(s);
        (eps.len() == 3 && eps.iter().all(|e| e.1 == (e.0 != first_ip))).then_some(())
    })
    .await;
    support::set_pod_ready(&client, ns, &first, true).await;
    support::wait_service_slices(&client, ns, "web", "every Pod ready again", |s| {
        let eps = support::slice_endpoints(s);
        (eps.len() == 3 && eps.iter().all(|e| e.1)).then_some(())
    })
    .await;

    // A deleted Pod is removed by kwok and replaced by the ReplicaSet.
    let second = pods[1].metadata.name.clone().unwrap();
    support::delete_pod(&client, ns, &second).await;
    let slices =
        support::wait_service_slices(&client, ns, "web", "the deleted Pod replaced", |s| {
            let names = target_names(s);
            let eps = support::slice_endpoints(s);
            (names.len() == 3 && !names.contains(&second) && eps.iter().all(|e| e.1))
                .then_some(names)
        })
        .await;
    assert!(slices.contains(&first));

    // Scale down, then up.
    support::scale_deployment(&client, ns, "web", 1).await;
    support::wait_ready_pods(&client, ns, "app=web", 1).await;
    support::wait_service_slices(&client, ns, "web", "1 endpoint", |s| {
        (support::slice_endpoints(s).len() == 1).then_some(())
    })
    .await;
    support::scale_deployment(&client, ns, "web", 4).await;
    support::wait_ready_pods(&client, ns, "app=web", 4).await;
    support::wait_service_slices(&client, ns, "web", "4 ready endpoints", |s| {
        let eps = support::slice_endpoints(s);
        (eps.len() == 4 && eps.iter().all(|e| e.1)).then_some(())
    })
    .await;

    // A StatefulSet behind a headless Service: each endpoint carries its Pod's hostname.
    let ports = [("tcp", 42, "TCP")];
    support::create(&client, ns, &support::service("db", "db", &ports, true)).await;
    support::create(&client, ns, &support::statefulset("db", "db", 2, &ports)).await;
    let pods = support::wait_ready_pods(&client, ns, "app=db", 2).await;
    let names: Vec<_> = pods
        .iter()
        .filter_map(|p| p.metadata.name.clone())
        .collect();
    assert_eq!(names, ["db-0", "db-1"]);
    let eps =
        support::wait_service_slices(&client, ns, "db", "db-0 and db-1 with hostnames", |s| {
            let eps = support::slice_endpoints(s);
            (eps.len() == 2 && eps.iter().all(|e| e.1 && e.2.is_some())).then_some(eps)
        })
        .await;
    let mut hosts: Vec<_> = eps.iter().filter_map(|e| e.2.clone()).collect();
    hosts.sort();
    assert_eq!(hosts, ["db-0", "db-1"]);

    cluster.assert_controller_manager_running();
    cluster.assert_pods_running();
    for (component, kib) in cluster.component_rss_kib() {
        println!("RSS {component}: {} MiB", kib / 1024);
    }
}
