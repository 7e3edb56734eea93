//! The `import_inventory` example, an operator on mcs-core's types, against a real API
//! server (etcd, kube-apiserver and kube-controller-manager from `scripts/k8s-bins.sh`):
//! it writes a ConfigMap per ServiceImport, follows `status.clusters`, puts back a
//! ConfigMap deleted by hand, and the ConfigMap goes with its import.

#[path = "../examples/import_inventory.rs"]
mod example;
use mcs_testkit as support;

use std::time::Duration;

use k8s_openapi::api::core::v1::ConfigMap;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use kube::runtime::wait::{Condition, await_condition, conditions};
use kube::{Client, ResourceExt};
use mcs_core::api::{ServiceImportType, ServicePort, decode_yaml, v1beta1::ServiceImport};

const NS: &str = "loyalty";
/// How long any one change may take to show before the test fails (a bound, not a claim).
const PATIENCE: Duration = Duration::from_secs(60);

/// The ConfigMap has `clusters` equal to `want`.
fn lists(want: &'static str) -> impl Condition<ConfigMap> {
    move |cm: Option<&ConfigMap>| {
        cm.and_then(|cm| cm.data.as_ref())
            .and_then(|d| d.get("clusters"))
            .map(String::as_str)
            == Some(want)
    }
}

async fn wait_for(api: &Api<ConfigMap>, what: &str, cond: impl Condition<ConfigMap>) -> ConfigMap {
    tokio::time::timeout(
        PATIENCE,
        await_condition(api.clone(), "loyalty-accrual-clusters", cond),
    )
    .await
    .unwrap_or_else(|_| panic!("no ConfigMap {what} within {PATIENCE:?}"))
    .expect("watch the ConfigMap")
    .unwrap_or_else(|| panic!("ConfigMap gone while waiting for it {what}"))
}

async fn set_clusters(imports: &Api<ServiceImport>, clusters: &[&str]) {
    let status = serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1",
        "kind": "ServiceImport",
        "status": { "clusters": clusters.iter().map(|c| serde_json::json!({ "cluster": c })).collect::<Vec<_>>() },
    });
    imports
        .patch_status(
            "loyalty-accrual",
            &PatchParams::apply("test-agent").force(),
            &Patch::Apply(&status),
        )
        .await
        .expect("set the import's clusters");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn operator_on_mcs_core_types_follows_imports() {
    let cluster = support::start_cluster("inventory", support::ClusterOptions::default()).await;
    let client: Client = cluster.client().await;
    support::create_namespace(&client, NS).await;

    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let operator = tokio::spawn(example::run(client.clone(), async {
        stopped.await.ok();
    }));

    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), NS);
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), NS);
    let import: ServiceImport = decode_yaml(
        "apiVersion: multicluster.x-k8s.io/v1beta1
kind: ServiceImport
metadata: { name: loyalty-accrual, namespace: loyalty }
spec: { type: ClusterSetIP, ips: [10.96.7.9], ports: [{ name: grpc, protocol: TCP, port: 9443 }] }",
    )
    .expect("a valid ServiceImport");
    assert_eq!(import.spec.type_, ServiceImportType::ClusterSetIp);
    assert_eq!(
        import.spec.ports,
        [ServicePort {
            name: Some("grpc".into()),
            protocol: Some(mcs_core::api::Protocol::Tcp),
            app_protocol: None,
            port: 9443
        }]
    );
    let import = imports
        .create(&PostParams::default(), &import)
        .await
        .expect("create the import");

    // No clusters yet: the ConfigMap exists with an empty list, owned by the import.
    let cm = wait_for(&maps, "for the new import", lists("")).await;
    let data = cm.data.as_ref().expect("data");
    assert_eq!(data["type"], "ClusterSetIP");
    assert_eq!(data["ips"], "10.96.7.9");
    let owner = &cm.owner_references()[0];
    assert_eq!(
        (owner.kind.as_str(), owner.uid.as_str()),
        ("ServiceImport", import.uid().unwrap().as_str())
    );

    // The clusters an agent reports in status.clusters, sorted.
    set_clusters(&imports, &["west", "east"]).await;
    wait_for(&maps, "listing east and west", lists("east,west")).await;
    set_clusters(&imports, &["west"]).await;
    wait_for(&maps, "listing west only", lists("west")).await;

    // Deleted by hand: the operator (which owns and watches it) writes it again.
    let before = maps
        .get("loyalty-accrual-clusters")
        .await
        .expect("the ConfigMap");
    maps.delete("loyalty-accrual-clusters", &DeleteParams::default())
        .await
        .expect("delete the ConfigMap");
    let again = wait_for(
        &maps,
        "rewritten after deletion",
        move |cm: Option<&ConfigMap>| {
            cm.is_some_and(|cm| cm.uid() != before.uid()) && lists("west").matches_object(cm)
        },
    )
    .await;
    assert_eq!(
        again.labels()["app.kubernetes.io/managed-by"],
        example::MANAGER
    );

    // The import goes: the garbage collector removes its ConfigMap.
    imports
        .delete("loyalty-accrual", &DeleteParams::foreground())
        .await
        .expect("delete the import");
    let uid = again.uid().expect("uid");
    tokio::time::timeout(
        PATIENCE,
        await_condition(
            maps.clone(),
            "loyalty-accrual-clusters",
            conditions::is_deleted(&uid),
        ),
    )
    .await
    .expect("the ConfigMap is garbage-collected with its import")
    .expect("watch the ConfigMap");

    stop.send(()).expect("the operator is running");
    operator.await.expect("the operator stops cleanly");
}
