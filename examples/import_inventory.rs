//! An operator of your own on mcs-core's types: for every ServiceImport, a ConfigMap that
//! lists the clusters serving it.
//!
//! ```text
//! cargo run --example import_inventory     # against the current kubeconfig context
//! ```
//!
//! It depends on `mcs-core` for the `ServiceImport` type (and nothing else of mcs) and on
//! kube-runtime's `Controller`: every ServiceImport in the cluster gets a ConfigMap
//! `<import>-clusters` beside it with `clusters` (comma-separated, sorted), `type` and `ips`,
//! written by server-side apply and owned by the import, so deleting the import removes it.
//! A change of the import's `status.clusters` (an export appearing or leaving in another
//! cluster) rewrites it; a ConfigMap edited or deleted by hand is put back.
//! `tests/import_inventory.rs` runs it against a real API server.

use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::api::{Api, Patch, PatchParams};
use kube::runtime::controller::{Action, Controller};
use kube::runtime::watcher;
use kube::{Client, Resource, ResourceExt};
use mcs_core::api::v1beta1::ServiceImport;

/// The field manager of the ConfigMaps, also their `app.kubernetes.io/managed-by` label.
pub(crate) const MANAGER: &str = "import-inventory";

/// The ConfigMap for `import`: `<import>-clusters` in the import's namespace, owned by it.
pub(crate) fn inventory(import: &ServiceImport) -> ConfigMap {
    let mut clusters: Vec<&str> = import
        .status
        .iter()
        .flat_map(|s| s.clusters.iter().flatten())
        .map(|c| c.cluster.as_str())
        .collect();
    clusters.sort_unstable();
    let ips = import.spec.ips.as_deref().unwrap_or_default().join(",");
    ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("{}-clusters", import.name_any())),
            namespace: import.namespace(),
            labels: Some(
                [(
                    "app.kubernetes.io/managed-by".to_owned(),
                    MANAGER.to_owned(),
                )]
                .into(),
            ),
            owner_references: import.controller_owner_ref(&()).map(|owner| vec![owner]),
            ..ObjectMeta::default()
        },
        data: Some(
            [
                ("clusters".to_owned(), clusters.join(",")),
                ("type".to_owned(), import.spec.type_.to_string()),
                ("ips".to_owned(), ips),
            ]
            .into(),
        ),
        ..ConfigMap::default()
    }
}

/// Runs the operator with `client` until `shutdown` completes.
pub(crate) async fn run(
    client: Client,
    shutdown: impl Future<Output = ()> + Send + Sync + 'static,
) {
    let owned =
        watcher::Config::default().labels(&format!("app.kubernetes.io/managed-by={MANAGER}"));
    Controller::new(
        Api::<ServiceImport>::all(client.clone()),
        watcher::Config::default(),
    )
    .owns(Api::<ConfigMap>::all(client.clone()), owned)
    .graceful_shutdown_on(shutdown)
    .run(reconcile, retry_later, Arc::new(client))
    .for_each(|result| async move {
        match result {
            Ok((import, _)) => println!(
                "inventoried {}/{}",
                import.namespace.unwrap_or_default(),
                import.name
            ),
            Err(e) => eprintln!("import-inventory: {e}"),
        }
    })
    .await;
}

async fn reconcile(import: Arc<ServiceImport>, client: Arc<Client>) -> Result<Action, kube::Error> {
    let map = inventory(&import);
    let (Some(ns), Some(name)) = (
        map.metadata.namespace.as_deref(),
        map.metadata.name.as_deref(),
    ) else {
        // ServiceImports are namespaced: the API server never sends one without a namespace.
        return Ok(Action::await_change());
    };
    Api::<ConfigMap>::namespaced(Client::clone(&client), ns)
        .patch(
            name,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&map),
        )
        .await?;
    Ok(Action::await_change())
}

fn retry_later(_: Arc<ServiceImport>, _: &kube::Error, _: Arc<Client>) -> Action {
    Action::requeue(Duration::from_secs(5))
}

#[allow(dead_code)] // `tests/import_inventory.rs` includes this file and calls `run`.
#[tokio::main]
async fn main() -> Result<(), kube::Error> {
    let client = Client::try_default().await?;
    run(client, async {
        tokio::signal::ctrl_c().await.ok();
    })
    .await;
    Ok(())
}
