//! The upstream conformance cases 1-16 (sigs.k8s.io/mcs-api `conformance/`) against three real API servers,
//! each running an in-process `mcs-agent`. Where the result must not depend on which
//! cluster exports first, both orders run. Cases 1-15 share one ClusterSet per topology
//! ([`SharedSet`]), each case in a namespace of its own, as upstream's suite runs each
//! case in a generated namespace of one ClusterSet; case 16 runs Pods (kwok and the
//! controller-manager) and has clusters of its own.

use mcs_testkit as support;
use mcs_testkit::clusterset;

use std::collections::BTreeMap;
use std::net::IpAddr;

use clusterset::*;
use k8s_openapi::api::core::v1::Service;
use kube::api::Api;
use mcs_core::api::{IpFamily, ServiceImportType, SessionAffinity, v1beta1::ServiceImport};

const NS: &str = "mcs-conformance";

fn port_tuples(si: &ServiceImport) -> Vec<(String, String, i32, Option<String>)> {
    let mut v: Vec<_> = si
        .spec
        .ports
        .iter()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default().to_lowercase(),
                p.protocol_or_default().as_str().to_owned(),
                p.port,
                p.app_protocol.clone(),
            )
        })
        .collect();
    v.sort();
    v
}

fn service_port_tuples(svc: &Service) -> Vec<(String, String, i32, Option<String>)> {
    let mut v: Vec<_> = svc
        .spec
        .as_ref()
        .unwrap()
        .ports
        .iter()
        .flatten()
        .map(|p| {
            (
                p.name.clone().unwrap_or_default().to_lowercase(),
                p.protocol.clone().unwrap_or_else(|| "TCP".into()),
                p.port,
                p.app_protocol.clone(),
            )
        })
        .collect();
    v.sort();
    v
}

/// Exports `first_svc` from cluster `first`, waits for the import, pauses 1.1 s, then
/// exports `second_svc` from cluster `second` (the conformance two-cluster driver).
async fn two_cluster_export(
    set: &Case,
    first: usize,
    first_svc: &Service,
    second: usize,
    second_svc: &Service,
    labels: [Option<(&str, &str)>; 2],
) {
    let name = first_svc.metadata.name.clone().unwrap();
    create_service(set.client(first), &set.ns, first_svc).await;
    export(set.client(first), &set.ns, &name, labels[0]).await;
    wait_import(
        set.client(first),
        &set.ns,
        &name,
        "import after the first export",
        |_| true,
    )
    .await;
    conformance_pause().await;
    create_service(set.client(second), &set.ns, second_svc).await;
    export(set.client(second), &set.ns, &name, labels[1]).await;
}

async fn single_export(set: &Case, svc: &Service) -> ServiceImport {
    let name = svc.metadata.name.clone().unwrap();
    create_service(set.client(0), &set.ns, svc).await;
    export(set.client(0), &set.ns, &name, None).await;
    wait_export_condition(
        set.client(0),
        &set.ns,
        &name,
        "Valid",
        "True",
        Some("Valid"),
    )
    .await;
    wait_import(
        set.client(1),
        &set.ns,
        &name,
        "import in another cluster",
        |_| true,
    )
    .await
}

/// East, west and north with an agent each in `topo` (shared with the other cases), and a
/// fresh namespace in every one of them.
async fn set3(topo: Topo) -> Case {
    Case::start(topo, NS).await
}

/// Cluster `last`, the last to export `hello`, stops: the import goes from every cluster.
async fn unexport_last(set: &Case, last: usize) {
    unexport(set.client(last), &set.ns, "hello").await;
    for i in 0..3 {
        wait_no_import(
            set.client(i),
            &set.ns,
            "hello",
            "import deleted after the last unexport",
        )
        .await;
    }
}

async fn conformance_01_import_exists_while_at_least_one_cluster_exports(topo: Topo) {
    let set = set3(topo).await;
    two_cluster_export(
        &set,
        0,
        &hello_service("hello"),
        1,
        &hello_service("hello"),
        [None, None],
    )
    .await;
    for i in 0..3 {
        wait_import(
            set.client(i),
            &set.ns,
            "hello",
            "both clusters listed",
            |si| {
                si.status
                    .as_ref()
                    .and_then(|s| s.clusters.as_ref())
                    .is_some_and(|c| c.len() == 2)
            },
        )
        .await;
    }
    unexport(set.client(0), &set.ns, "hello").await;
    for i in 0..3 {
        wait_import(set.client(i), &set.ns, "hello", "only west listed", |si| {
            si.status
                .as_ref()
                .and_then(|s| s.clusters.as_ref())
                .is_some_and(|c| c.len() == 1 && c[0].cluster == "west")
        })
        .await;
    }
    // West still exports: the import stays, in every cluster.
    let imports = set.settled_imports(0, &set.ns, "hello").await;
    assert!(
        imports
            .iter()
            .all(|si| si.as_ref().is_some_and(|si| clusters_of(si) == ["west"])),
        "the import of west's export, after east unexported: {imports:#?}"
    );
    unexport_last(&set, 1).await;
}

async fn conformance_02_only_exported_labels_and_annotations_propagate(topo: Topo) {
    let set = set3(topo).await;
    create_service(set.client(0), &set.ns, &hello_service("hello")).await;
    export(
        set.client(0),
        &set.ns,
        "hello",
        Some(("dummy-label", "dummy-value")),
    )
    .await;
    for i in 0..3 {
        let si = wait_import(
            set.client(i),
            &set.ns,
            "hello",
            "import with exported labels",
            |si| {
                si.metadata
                    .labels
                    .as_ref()
                    .is_some_and(|l| l.contains_key("dummy-label"))
            },
        )
        .await;
        let labels = si.metadata.labels.unwrap();
        let annotations = si.metadata.annotations.unwrap_or_default();
        assert_eq!(labels["dummy-label"], "dummy-value");
        assert_eq!(annotations["dummy-label-annotation"], "dummy-value");
        for map in [&labels, &annotations] {
            assert!(
                !map.contains_key("dummy-svc"),
                "the Service's metadata must not propagate: {map:?}"
            );
            assert!(
                !map.contains_key("dummy-svcexport"),
                "the ServiceExport's metadata must not propagate: {map:?}"
            );
        }
    }
}

async fn labels_conflict(topo: Topo, first: usize, second: usize) {
    let set = set3(topo).await;
    two_cluster_export(
        &set,
        first,
        &hello_service("hello"),
        second,
        &hello_service("hello"),
        [Some(("label-a", "a")), Some(("label-b", "b"))],
    )
    .await;
    for i in [first, second] {
        let c =
            wait_export_condition(set.client(i), &set.ns, "hello", "Conflict", "True", None).await;
        assert!(
            c.reason.contains("LabelsConflict") && c.reason.contains("AnnotationsConflict"),
            "{}",
            c.reason
        );
    }
    for i in 0..3 {
        let si = wait_import(set.client(i), &set.ns, "hello", "winner's labels", |si| {
            si.metadata
                .labels
                .as_ref()
                .is_some_and(|l| l.contains_key("label-a"))
        })
        .await;
        assert!(!si.metadata.labels.unwrap().contains_key("label-b"));
        assert!(
            !si.metadata
                .annotations
                .unwrap_or_default()
                .contains_key("label-b-annotation")
        );
    }
}

async fn conformance_03_conflicting_labels_and_annotations_east_first(topo: Topo) {
    labels_conflict(topo, 0, 1).await;
}

async fn conformance_03_conflicting_labels_and_annotations_west_first(topo: Topo) {
    labels_conflict(topo, 1, 0).await;
}

async fn conformance_04_clusterip_export_creates_clustersetip_import_everywhere_and_unexport_deletes_it(
    topo: Topo,
) {
    let set = set3(topo).await;
    single_export(&set, &hello_service("hello")).await;
    for i in 0..3 {
        wait_import(
            set.client(i),
            &set.ns,
            "hello",
            "ClusterSetIP import",
            |si| si.spec.type_ == ServiceImportType::ClusterSetIp,
        )
        .await;
    }
    let ready = wait_export_condition(set.client(0), &set.ns, "hello", "Ready", "True", None).await;
    // SPEC: Ready=True is `Ready` in the pull model (every agent reads the exports
    // itself), `Exported` in the push model (the export was pushed to the hub).
    let reason = match topo {
        Topo::Mesh => "Ready",
        Topo::Hub => "Exported",
    };
    assert_eq!(ready.reason, reason);
    wait_export_condition(
        set.client(0),
        &set.ns,
        "hello",
        "Conflict",
        "False",
        Some("NoConflicts"),
    )
    .await;
    unexport_last(&set, 0).await;
}

async fn conformance_05_session_affinity_matches_the_exported_service(topo: Topo) {
    let set = set3(topo).await;
    single_export(&set, &hello_service("hello")).await;
    for i in 0..3 {
        let si = wait_import(set.client(i), &set.ns, "hello", "import", |_| true).await;
        assert_eq!(si.spec.session_affinity, Some(SessionAffinity::ClientIp));
        assert_eq!(
            si.spec
                .session_affinity_config
                .unwrap()
                .client_ip
                .unwrap()
                .timeout_seconds,
            Some(10)
        );
    }
}

async fn conformance_06_and_07_traffic_policy_and_distribution_match_the_exported_service(
    topo: Topo,
) {
    let set = set3(topo).await;
    let mut svc = hello_service("hello");
    let spec = svc.spec.as_mut().unwrap();
    spec.internal_traffic_policy = Some("Cluster".into());
    spec.traffic_distribution = Some("PreferClose".into());
    single_export(&set, &svc).await;
    for i in 0..3 {
        let si = wait_import(set.client(i), &set.ns, "hello", "import", |_| true).await;
        assert_eq!(
            si.spec.internal_traffic_policy.map(|p| p.as_str()),
            Some("Cluster")
        );
        assert_eq!(
            si.spec.traffic_distribution.map(|p| p.as_str()),
            Some("PreferClose")
        );
    }
}

async fn conformance_08_an_ip_per_family_for_clustersetip_imports(topo: Topo) {
    let set = set3(topo).await;
    single_export(&set, &hello_service("hello")).await;
    for i in 0..3 {
        // Ready is published True once the IPs are in (False/Pending before).
        let si = wait_import(
            set.client(i),
            &set.ns,
            "hello",
            "import with ips, Ready=True",
            |si| si.spec.ips.as_ref().is_some_and(|v| !v.is_empty()) && ready_is_true(si),
        )
        .await;
        let ips = si.spec.ips.clone().unwrap();
        let families = si.spec.ip_families.clone().unwrap();
        assert_eq!(ips.len(), families.len());
        for (ip, family) in ips.iter().zip(&families) {
            let ip: IpAddr = ip.parse().expect("a valid IP");
            assert_eq!(ip.is_ipv4(), *family == IpFamily::IPv4, "{ip} vs {family}");
        }
        // The IP is the derived Service's, in this cluster.
        let derived =
            si.metadata.annotations.as_ref().unwrap()["multicluster.kubernetes.io/derived-service"]
                .clone();
        let svc = Api::<Service>::namespaced(set.client(i).clone(), &set.ns)
            .get(&derived)
            .await
            .unwrap();
        assert_eq!(svc.spec.unwrap().cluster_ips.unwrap(), ips);
    }
}

/// Whether the import's `Ready` condition is `True`.
fn ready_is_true(si: &ServiceImport) -> bool {
    si.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn conformance_09_ports_match_the_exported_service(topo: Topo) {
    let set = set3(topo).await;
    let mut svc = hello_service("hello");
    svc.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].app_protocol =
        Some("kubernetes.io/h2c".into());
    single_export(&set, &svc).await;
    let created = Api::<Service>::namespaced(set.client(0).clone(), &set.ns)
        .get("hello")
        .await
        .unwrap();
    for i in 0..3 {
        let si = wait_import(set.client(i), &set.ns, "hello", "import", |_| true).await;
        assert_eq!(port_tuples(&si), service_port_tuples(&created));
    }
}

async fn port_union(topo: Topo, first: usize, second: usize) {
    let set = set3(topo).await;
    let mut extra = hello_service("hello");
    extra.spec.as_mut().unwrap().ports.as_mut().unwrap().push(
        k8s_openapi::api::core::v1::ServicePort {
            name: Some("stcp".into()),
            protocol: Some("SCTP".into()),
            port: 142,
            ..Default::default()
        },
    );
    let (a, b) = if first == 0 {
        (hello_service("hello"), extra)
    } else {
        (extra, hello_service("hello"))
    };
    two_cluster_export(&set, first, &a, second, &b, [None, None]).await;
    for i in [first, second] {
        let c =
            wait_export_condition(set.client(i), &set.ns, "hello", "Conflict", "True", None).await;
        assert!(c.reason.contains("PortConflict"), "{}", c.reason);
    }
    for i in 0..3 {
        let si = wait_import(set.client(i), &set.ns, "hello", "union of ports", |si| {
            si.spec.ports.len() == 3
        })
        .await;
        let names: Vec<String> = port_tuples(&si).into_iter().map(|p| p.0).collect();
        assert_eq!(names, ["stcp", "tcp", "udp"]);
    }
}

async fn conformance_10_port_union_raises_a_conflict_east_first(topo: Topo) {
    port_union(topo, 0, 1).await;
}

async fn conformance_10_port_union_raises_a_conflict_west_first(topo: Topo) {
    port_union(topo, 1, 0).await;
}

async fn conformance_11_conflicting_ports_oldest_export_wins(topo: Topo) {
    let set = set3(topo).await;
    let mut other = hello_service("hello");
    other.spec.as_mut().unwrap().ports.as_mut().unwrap()[0].port = 43;
    two_cluster_export(&set, 0, &hello_service("hello"), 1, &other, [None, None]).await;
    for i in [0, 1] {
        let c =
            wait_export_condition(set.client(i), &set.ns, "hello", "Conflict", "True", None).await;
        assert!(c.reason.contains("PortConflict"), "{}", c.reason);
        assert!(
            c.message.contains("east"),
            "the message names the winner: {}",
            c.message
        );
    }
    let winner = Api::<Service>::namespaced(set.client(0).clone(), &set.ns)
        .get("hello")
        .await
        .unwrap();
    // Import status is written last, so once it lists both exporters the merged spec of
    // both is in place (before that it can hold only the first export seen).
    for i in 0..3 {
        let si = wait_import(set.client(i), &set.ns, "hello", "import of both", |si| {
            clusters_of(si).len() == 2
        })
        .await;
        assert_eq!(
            port_tuples(&si),
            service_port_tuples(&winner),
            "the oldest export's ports"
        );
    }
}

async fn conformance_12_and_13_headless_export_creates_headless_import_without_ips(topo: Topo) {
    let set = set3(topo).await;
    single_export(&set, &headless(hello_service("hello"))).await;
    for i in 0..3 {
        let si = wait_import(set.client(i), &set.ns, "hello", "Headless import", |si| {
            si.spec.type_ == ServiceImportType::Headless
        })
        .await;
        assert!(si.spec.ips.as_ref().is_none_or(Vec::is_empty));
    }
    // And none gets one later: once every agent has caught up and resynced, still none.
    for si in set.settled_imports(0, &set.ns, "hello").await {
        let si = si.expect("the headless import");
        assert_eq!(si.spec.type_, ServiceImportType::Headless);
        assert!(
            si.spec.ips.as_ref().is_none_or(Vec::is_empty),
            "headless imports have no ips: {si:?}"
        );
    }
    unexport_last(&set, 0).await;
}

async fn conformance_14_externalname_export_is_invalid_and_imports_nothing(topo: Topo) {
    let set = set3(topo).await;
    let svc = Service {
        metadata: kube::api::ObjectMeta {
            name: Some("hello".into()),
            ..Default::default()
        },
        spec: Some(k8s_openapi::api::core::v1::ServiceSpec {
            type_: Some("ExternalName".into()),
            external_name: Some("example.com".into()),
            ..Default::default()
        }),
        status: None,
    };
    create_service(set.client(0), &set.ns, &svc).await;
    export(set.client(0), &set.ns, "hello", None).await;
    let valid =
        wait_export_condition(set.client(0), &set.ns, "hello", "Valid", "False", None).await;
    assert_eq!(valid.reason, "InvalidServiceType");
    let imports = set.settled_imports(0, &set.ns, "hello").await;
    assert!(
        imports.iter().all(Option::is_none),
        "an invalid export imports nothing: {imports:#?}"
    );
}

async fn headlessness_conflict(topo: Topo, first: usize, second: usize) {
    let set = set3(topo).await;
    let (a, b) = (hello_service("hello"), headless(hello_service("hello")));
    let (first_svc, second_svc) = if first == 0 { (a, b) } else { (b, a) };
    let expected = if first == 0 {
        ServiceImportType::ClusterSetIp
    } else {
        ServiceImportType::Headless
    };
    two_cluster_export(&set, first, &first_svc, second, &second_svc, [None, None]).await;
    for i in [first, second] {
        let c =
            wait_export_condition(set.client(i), &set.ns, "hello", "Conflict", "True", None).await;
        assert!(c.reason.contains("TypeConflict"), "{}", c.reason);
    }
    for i in 0..3 {
        let si = wait_import(set.client(i), &set.ns, "hello", "import of both", |si| {
            clusters_of(si).len() == 2
        })
        .await;
        assert_eq!(si.spec.type_, expected, "the first exporter's type wins");
    }
}

async fn conformance_15_conflicting_headlessness_clusterip_first(topo: Topo) {
    headlessness_conflict(topo, 0, 1).await;
}

async fn conformance_15_conflicting_headlessness_headless_first(topo: Topo) {
    headlessness_conflict(topo, 1, 0).await;
}

async fn conformance_16_endpointslices_with_mcs_labels_everywhere_and_deleted_on_unexport(
    topo: Topo,
) {
    let set = ClusterSet::start_with_pods_in(topo, &["east", "west", "north"]).await;
    set.namespace(NS).await;
    // Real slices: a Deployment's Pods run by kwok, published by KCM's endpointslice
    // controller.
    let mut pod_ips = Vec::new();
    for i in [0, 1] {
        let ports = [("tcp", 42, "TCP"), ("udp", 42, "UDP")];
        support::create(set.client(i), NS, &support::deployment("hello", 1, &ports)).await;
        create_service(set.client(i), NS, &hello_service("hello")).await;
        let pods = support::wait_ready_pods(set.client(i), NS, "app=hello", 1).await;
        pod_ips.extend(
            support::pod_ips(&pods[0])
                .into_iter()
                .map(|ip| ip.to_string()),
        );
    }
    export(set.client(0), NS, "hello", None).await;
    wait_import(set.client(0), NS, "hello", "import", |_| true).await;
    conformance_pause().await;
    export(set.client(1), NS, "hello", None).await;
    for i in 0..3 {
        let slices = support::wait_for("MCS slices from both clusters", SLICE_TIMEOUT, || async {
            let slices = mcs_slices(set.client(i), NS, "hello").await;
            let clusters: std::collections::BTreeSet<String> = slices
                .iter()
                .filter(|s| !s.endpoints.is_empty())
                .filter_map(|s| source_cluster(s).map(str::to_owned))
                .collect();
            (clusters.len() == 2).then_some(slices)
        })
        .await;
        // Listed by `multicluster.kubernetes.io/service-name=hello`; each is the agent's, with
        // endpoints (the wait only required one such slice per cluster).
        for s in &slices {
            let labels: &BTreeMap<String, String> = s.metadata.labels.as_ref().unwrap();
            assert_eq!(
                labels["endpointslice.kubernetes.io/managed-by"], "mcs-agent",
                "{:?}",
                s.metadata.name
            );
            assert!(!s.endpoints.is_empty(), "{:?}", s.metadata.name);
        }
        let addrs: Vec<String> = slices
            .iter()
            .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
            .collect();
        assert!(
            pod_ips.iter().all(|ip| addrs.contains(ip)),
            "{addrs:?}, want {pod_ips:?}"
        );
        wait_import(
            set.client(i),
            NS,
            "hello",
            "endpointSliceObjects Present",
            |si| {
                si.status.as_ref().and_then(|s| s.endpoint_slice_objects)
                    == Some(mcs_core::api::EndpointSliceObjects::Present)
            },
        )
        .await;
    }
    unexport(set.client(0), NS, "hello").await;
    unexport(set.client(1), NS, "hello").await;
    for i in 0..3 {
        support::wait_for("MCS slices deleted", IMPORT_TIMEOUT, || async {
            mcs_slices(set.client(i), NS, "hello")
                .await
                .is_empty()
                .then_some(())
        })
        .await;
    }
}

in_both_topologies!(
    conformance_01_import_exists_while_at_least_one_cluster_exports,
    conformance_02_only_exported_labels_and_annotations_propagate,
    conformance_03_conflicting_labels_and_annotations_east_first,
    conformance_03_conflicting_labels_and_annotations_west_first,
    conformance_04_clusterip_export_creates_clustersetip_import_everywhere_and_unexport_deletes_it,
    conformance_05_session_affinity_matches_the_exported_service,
    conformance_06_and_07_traffic_policy_and_distribution_match_the_exported_service,
    conformance_08_an_ip_per_family_for_clustersetip_imports,
    conformance_09_ports_match_the_exported_service,
    conformance_10_port_union_raises_a_conflict_east_first,
    conformance_10_port_union_raises_a_conflict_west_first,
    conformance_11_conflicting_ports_oldest_export_wins,
    conformance_12_and_13_headless_export_creates_headless_import_without_ips,
    conformance_14_externalname_export_is_invalid_and_imports_nothing,
    conformance_15_conflicting_headlessness_clusterip_first,
    conformance_15_conflicting_headlessness_headless_first,
    conformance_16_endpointslices_with_mcs_labels_everywhere_and_deleted_on_unexport,
);
