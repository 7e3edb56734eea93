//! Cluster selection (KEP-5939) end to end: four real API servers with the extended CRDs
//! (`deploy/crds-cluster-selection/`), each running an in-process agent with cluster
//! selection on, each cluster with `cluster.clusterset.k8s.io`, `region` and `continent`
//! ClusterProperties. The KEP's Story 1 ("my cluster, then my region, then my continent"):
//! every importer's `status.clusterSelectorResults` is the selectors evaluated with that
//! cluster as the importer; a property change (of an importer, of a source) is
//! re-evaluated; exports whose lists differ conflict (`ClusterSelectorsConflict`, the
//! oldest list wins); a headless Service's export with selectors is `InvalidServiceType`.

use mcs_testkit as support;
use mcs_testkit::clusterset;

use std::time::Duration;

use clusterset::*;
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use mcs_core::api::v1beta1::{ClusterProperty, ServiceExport, ServiceImport};
use mcs_core::api::{ClusterPropertySpec, ClusterSelector, ServiceExportSpec};

const NS: &str = "selection";
const CLUSTER: &str = "cluster.clusterset.k8s.io";

fn selectors(json: &str) -> Vec<ClusterSelector> {
    serde_json::from_str(json).expect("selectors")
}

/// The KEP's Story 1: this cluster, then this region, then this continent.
fn story_one() -> Vec<ClusterSelector> {
    selectors(
        r#"[
        {"propertySelector": {"matchProperties": {"cluster.clusterset.k8s.io": "@SameAsImporter@"}}},
        {"propertySelector": {"matchProperties": {"region": "@SameAsImporter@"}}},
        {"propertySelector": {"matchExpressions": [{"key": "continent", "operator": "In", "values": ["@SameAsImporter@"]}]}}
    ]"#,
    )
}

fn export_with(name: &str, cluster_selectors: Option<Vec<ClusterSelector>>) -> ServiceExport {
    ServiceExport::new(
        name,
        ServiceExportSpec {
            cluster_selectors,
            ..Default::default()
        },
    )
}

async fn export_selecting(client: &Client, name: &str, list: Vec<ClusterSelector>) {
    let exports: Api<ServiceExport> = Api::namespaced(client.clone(), NS);
    exports
        .create(&PostParams::default(), &export_with(name, Some(list)))
        .await
        .unwrap_or_else(|e| panic!("create ServiceExport {name}: {e}"));
}

async fn set_property(client: &Client, name: &str, value: &str) {
    let properties: Api<ClusterProperty> = Api::all(client.clone());
    let property = ClusterProperty::new(
        name,
        ClusterPropertySpec {
            value: value.to_owned(),
        },
    );
    properties
        .patch(
            name,
            &PatchParams::apply("agent-selection-test").force(),
            &Patch::Apply(&property),
        )
        .await
        .unwrap_or_else(|e| panic!("apply ClusterProperty {name}={value}: {e}"));
}

/// The import's `status.clusterSelectorResults` as lists of cluster names.
fn results(si: &ServiceImport) -> Option<Vec<Vec<String>>> {
    let results = si.status.as_ref()?.cluster_selector_results.as_ref()?;
    Some(results.iter().map(|r| r.clusters.clone()).collect())
}

/// Waits until cluster `i`'s import of `name` has these results.
async fn wait_results(set: &ClusterSet, i: usize, name: &str, want: &[&[&str]]) {
    let want: Vec<Vec<String>> = want
        .iter()
        .map(|r| r.iter().map(|c| (*c).to_owned()).collect())
        .collect();
    let what = format!(
        "{}'s import of {name} with clusterSelectorResults {want:?}",
        set.ids[i]
    );
    // The status says which spec it is for (KEP-5939's observedGeneration).
    let si = wait_import(set.client(i), NS, name, &what, |si| {
        results(si).as_ref() == Some(&want)
            && si.status.as_ref().and_then(|s| s.observed_generation) == si.metadata.generation
    })
    .await;
    assert_eq!(
        si.spec.cluster_selectors.as_ref().map(Vec::len),
        Some(3),
        "the import carries the exports' list"
    );
}

/// Story 1 on four clusters, then changes of properties, selectors removed, a conflict and
/// a headless export.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn story_one_results_per_importer_follow_property_changes_conflicts_and_headless() {
    let names = ["east", "west", "north", "south"];
    // The agents start once the extended CRDs are in: a watch opened before a CRD gains
    // fields keeps serving objects without them.
    let mut set = ClusterSet::start_topo(
        Topo::Mesh,
        &names,
        false,
        Duration::from_secs(60),
        false,
        |c| c.cluster_selection(true),
    )
    .await;
    let (east, west, north, south) = (0, 1, 2, 3);
    let places = [
        ("eu-west", "eu"),
        ("eu-west", "eu"),
        ("eu-north", "eu"),
        ("us-east", "na"),
    ];
    for (i, (region, continent)) in places.iter().enumerate() {
        let client = set.client(i);
        support::install_cluster_selection_crds(client).await;
        set_property(client, CLUSTER, set.ids[i].as_str()).await;
        set_property(client, "region", region).await;
        set_property(client, "continent", continent).await;
    }
    for i in 0..names.len() {
        set.start_agent(i);
    }
    set.namespace(NS).await;

    // East, west and south export; north only imports.
    for i in [east, west, south] {
        create_service(set.client(i), NS, &hello_service("checkout")).await;
        export_selecting(set.client(i), "checkout", story_one()).await;
    }
    wait_results(&set, north, "checkout", &[&[], &[], &["east", "west"]]).await;
    wait_results(
        &set,
        east,
        "checkout",
        &[&["east"], &["east", "west"], &["east", "west"]],
    )
    .await;
    wait_results(
        &set,
        south,
        "checkout",
        &[&["south"], &["south"], &["south"]],
    )
    .await;
    wait_results(
        &set,
        west,
        "checkout",
        &[&["west"], &["east", "west"], &["east", "west"]],
    )
    .await;
    for i in [east, west, south] {
        wait_export_condition(set.client(i), NS, "checkout", "Conflict", "False", None).await;
    }

    // The importer moves: north into eu-west.
    set_property(set.client(north), "region", "eu-west").await;
    wait_results(
        &set,
        north,
        "checkout",
        &[&[], &["east", "west"], &["east", "west"]],
    )
    .await;
    // A source moves: south into eu-north, continent eu.
    set_property(set.client(south), "region", "eu-north").await;
    set_property(set.client(south), "continent", "eu").await;
    wait_results(
        &set,
        north,
        "checkout",
        &[&[], &["east", "west"], &["east", "south", "west"]],
    )
    .await;
    wait_results(
        &set,
        south,
        "checkout",
        &[&["south"], &["south"], &["east", "south", "west"]],
    )
    .await;

    // The exports drop their selectors: the import's go, and so do its results (a
    // consumer reads the results as they are, so stale ones would keep steering it).
    for i in [east, west, south] {
        let exports: Api<ServiceExport> = Api::namespaced(set.client(i).clone(), NS);
        exports
            .patch(
                "checkout",
                &PatchParams::default(),
                &Patch::Merge(serde_json::json!({ "spec": { "clusterSelectors": null } })),
            )
            .await
            .expect("remove the export's selectors");
    }
    for i in [north, east] {
        wait_import(
            set.client(i),
            NS,
            "checkout",
            &format!(
                "{}'s import of checkout without selectors or results",
                set.ids[i]
            ),
            |si| {
                si.spec.cluster_selectors.is_none()
                    && results(si).is_none()
                    && si
                        .status
                        .as_ref()
                        .and_then(|s| s.observed_generation)
                        .is_none()
            },
        )
        .await;
    }

    // Conflicting lists: east's (the oldest) wins, every export says so.
    create_service(set.client(east), NS, &hello_service("ledger")).await;
    export_selecting(set.client(east), "ledger", story_one()).await;
    wait_results(&set, north, "ledger", &[&[], &["east"], &["east"]]).await;
    create_service(set.client(west), NS, &hello_service("ledger")).await;
    export_selecting(set.client(west), "ledger", story_one()[..1].to_vec()).await;
    for i in [east, west] {
        wait_export_condition(
            set.client(i),
            NS,
            "ledger",
            "Conflict",
            "True",
            Some("ClusterSelectorsConflict"),
        )
        .await;
    }
    wait_results(
        &set,
        north,
        "ledger",
        &[&[], &["east", "west"], &["east", "west"]],
    )
    .await;

    // A headless Service's export with selectors is invalid and imports nothing.
    create_service(set.client(east), NS, &headless(hello_service("stateful"))).await;
    export_selecting(set.client(east), "stateful", story_one()).await;
    wait_export_condition(
        set.client(east),
        NS,
        "stateful",
        "Valid",
        "False",
        Some("InvalidServiceType"),
    )
    .await;
    // An export east makes after it reaches north: by then, north has seen the invalid one.
    create_service(set.client(east), NS, &hello_service("marker")).await;
    export(set.client(east), NS, "marker", None).await;
    wait_import(
        set.client(north),
        NS,
        "marker",
        "north's import of marker",
        |_| true,
    )
    .await;
    let imports: Api<ServiceImport> = Api::namespaced(set.client(north).clone(), NS);
    assert!(
        imports.get_opt("stateful").await.expect("get").is_none(),
        "an invalid export is not imported"
    );
}
