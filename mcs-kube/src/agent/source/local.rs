//! The agent's own cluster: what it writes (imports, imported slices, derived Services), its
//! Namespaces, and, in the hub topology, what it exports, watched per exported service.

use std::collections::BTreeMap;
use std::collections::btree_map::Entry;

use futures::StreamExt;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use mcs_core::ClusterId;
use mcs_core::api::{LABEL_SERVICE_NAME, v1beta1::ServiceExport, v1beta1::ServiceImport};
use mcs_core::name::ServiceRef;
use tokio::task::AbortHandle;

use super::{
    Fact, KIND_DERIVED, KIND_EXPORT, KIND_IMPORT, KIND_IMPORTED, KIND_NAMESPACE, KIND_SERVICE,
    KIND_SLICE, Origin, Tx, forward, map_event, spawn_watch,
};
use crate::agent::desired::{
    LABEL_K8S_SERVICE_NAME, LABEL_MANAGED_BY, LABEL_SLICE_MANAGED_BY, MANAGED_BY,
};
use crate::agent::index::{Relist, own_service};

/// Watches what the agent writes and the Namespaces it writes into.
pub(crate) fn spawn_own(
    tasks: &mut tokio::task::JoinSet<()>,
    tx: &Tx,
    local: &ClusterId,
    client: &kube::Client,
) {
    let origin = Origin::Member(local.clone());
    spawn_watch(
        tasks,
        tx,
        origin.clone(),
        KIND_NAMESPACE,
        Api::<Namespace>::all(client.clone()),
        watcher::Config::default(),
        Fact::Namespace,
    );
    // Read as untyped objects: a hand-written import with a value the typed API rejects must
    // not stop the watch; it becomes a foreign import left alone.
    let resource = kube::api::ApiResource::erase::<ServiceImport>(&());
    spawn_watch(
        tasks,
        tx,
        origin.clone(),
        KIND_IMPORT,
        Api::<kube::api::DynamicObject>::all_with(client.clone(), &resource),
        watcher::Config::default(),
        |e| Fact::Import(map_event(e, typed_import)),
    );
    spawn_watch(
        tasks,
        tx,
        origin.clone(),
        KIND_IMPORTED,
        Api::<EndpointSlice>::all(client.clone()),
        watcher::Config::default().labels(&format!("{LABEL_SLICE_MANAGED_BY}={MANAGED_BY}")),
        Fact::Imported,
    );
    spawn_watch(
        tasks,
        tx,
        origin,
        KIND_DERIVED,
        Api::<Service>::all(client.clone()),
        watcher::Config::default().labels(&format!("{LABEL_MANAGED_BY}={MANAGED_BY}")),
        Fact::Derived,
    );
}

/// Watches what the agent's own cluster exports, and only that (hub topology): its
/// ServiceExports, and for each exported service its Service (by name) and its
/// EndpointSlices (by label), started and stopped as exports come and go. Memory and
/// watches follow what is exported, not the size of the cluster.
pub(crate) fn spawn_exported(
    tasks: &mut tokio::task::JoinSet<()>,
    tx: &Tx,
    local: &ClusterId,
    client: &kube::Client,
) {
    let (tx, local, client) = (tx.clone(), local.clone(), client.clone());
    tasks.spawn(async move {
        let origin = Origin::Member(local.clone());
        let exports = super::lean_watcher(
            Api::<ServiceExport>::all(client.clone()),
            watcher::Config::default(),
        )
        .default_backoff();
        let mut exports = std::pin::pin!(exports);
        let mut watched: BTreeMap<ServiceRef, [AbortHandle; 2]> = BTreeMap::new();
        let mut listing: Relist<ServiceRef> = Relist::default();
        let mut children = tokio::task::JoinSet::new();
        while let Some(event) = exports.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    let (error, forbidden) = super::describe_watch_error(&e);
                    let fact = Fact::WatchError(origin.clone(), KIND_EXPORT, error, forbidden);
                    if tx.send(fact).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            // Which services are exported once this event is applied.
            let wanted: Option<Vec<ServiceRef>> = match &event {
                Event::Apply(e) => {
                    if let Some(service) = own_service(e)
                        && !watched.contains_key(&service)
                    {
                        let handles = watch_service(&mut children, &tx, &client, &local, &service);
                        watched.insert(service, handles);
                    }
                    None
                }
                Event::Delete(e) => {
                    if let Some(service) = own_service(e) {
                        unwatch(&mut watched, &tx, &service).await;
                    }
                    None
                }
                Event::Init | Event::InitApply(_) | Event::InitDone => {
                    listing.note(&event, own_service)
                }
            };
            if tx.send(Fact::Export(local.clone(), event)).await.is_err() {
                return;
            }
            if let Some(wanted) = wanted {
                let gone: Vec<ServiceRef> = watched
                    .keys()
                    .filter(|s| !wanted.contains(s))
                    .cloned()
                    .collect();
                for service in gone {
                    unwatch(&mut watched, &tx, &service).await;
                }
                for service in wanted {
                    if let Entry::Vacant(slot) = watched.entry(service) {
                        let handles =
                            watch_service(&mut children, &tx, &client, &local, slot.key());
                        slot.insert(handles);
                    }
                }
            }
        }
    });
}

/// Starts the watches of one exported service.
fn watch_service(
    children: &mut tokio::task::JoinSet<()>,
    tx: &Tx,
    client: &kube::Client,
    local: &ClusterId,
    service: &ServiceRef,
) -> [AbortHandle; 2] {
    let ns = service.namespace.as_str();
    let name = service.name.as_str();
    let services = Api::<Service>::namespaced(client.clone(), ns);
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), ns);
    let by_name = watcher::Config::default().fields(&format!("metadata.name={name}"));
    // The Service's own slices, not those an MCS controller wrote for an import.
    let by_label = watcher::Config::default().labels(&format!(
        "{LABEL_K8S_SERVICE_NAME}={name},!{LABEL_SERVICE_NAME}"
    ));
    let (tx1, tx2) = (tx.clone(), tx.clone());
    let (s1, s2) = (service.clone(), service.clone());
    let (o1, o2) = (Origin::Member(local.clone()), Origin::Member(local.clone()));
    let a = children.spawn(async move {
        let stream = super::lean_watcher(services, by_name).default_backoff();
        forward(stream, tx1, o1, KIND_SERVICE, move |e| {
            Fact::ServiceOf(s1.clone(), e)
        })
        .await;
    });
    let b = children.spawn(async move {
        let stream = super::lean_watcher(slices, by_label).default_backoff();
        forward(stream, tx2, o2, KIND_SLICE, move |e| {
            Fact::SlicesOf(s2.clone(), e)
        })
        .await;
    });
    [a, b]
}

/// Stops the watches of a service no longer exported and says so.
async fn unwatch(
    watched: &mut BTreeMap<ServiceRef, [AbortHandle; 2]>,
    tx: &Tx,
    service: &ServiceRef,
) {
    if let Some(handles) = watched.remove(service) {
        for h in handles {
            h.abort();
        }
        let _ = tx.send(Fact::Unwatched(service.clone())).await;
    }
}

/// The typed import, or, for an object the typed API rejects, an import with only its
/// name and namespace: it carries no `managed-by` label, so the agent treats it as foreign
/// and never writes to it.
fn typed_import(obj: kube::api::DynamicObject) -> ServiceImport {
    let metadata = obj.metadata.clone();
    match serde_json::to_value(&obj)
        .map_err(|e| e.to_string())
        .and_then(|v| serde_json::from_value::<ServiceImport>(v).map_err(|e| e.to_string()))
    {
        Ok(typed) => typed,
        Err(error) => {
            tracing::warn!(
                namespace = metadata.namespace.as_deref().unwrap_or(""),
                name = metadata.name.as_deref().unwrap_or(""),
                error,
                "malformed ServiceImport; leaving it alone"
            );
            let mut placeholder = ServiceImport::new(
                metadata.name.as_deref().unwrap_or(""),
                mcs_core::api::ServiceImportSpec::new(
                    mcs_core::api::ServiceImportType::ClusterSetIp,
                ),
            );
            placeholder.metadata.namespace = metadata.namespace;
            placeholder.metadata.resource_version = metadata.resource_version;
            placeholder
        }
    }
}
