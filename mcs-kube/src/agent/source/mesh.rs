//! The mesh topology: the agent reads every member's API server directly (its
//! ServiceExports, Services and their EndpointSlices, and with cluster selection on its
//! ClusterProperties) and probes it.

use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher;
use mcs_core::api::v1beta1::{ClusterProperty, ServiceExport};
use mcs_core::api::{LABEL_SERVICE_NAME, MCS_GROUP, v1alpha1};

use super::{
    Fact, KIND_EXPORT, KIND_PROPERTY, KIND_SERVICE, KIND_SLICE, Origin, Tx, forward, map_event,
    spawn_watch,
};
use crate::agent::Member;
use crate::agent::desired::LABEL_K8S_SERVICE_NAME;

/// Watches and probes one member; with `properties`, also watches its ClusterProperties
/// (cluster selection, KEP-5939).
pub(crate) fn spawn(
    tasks: &mut tokio::task::JoinSet<()>,
    tx: &Tx,
    member: &Member,
    probe_interval: Duration,
    properties: bool,
) {
    let origin = Origin::Member(member.id.clone());
    spawn_export_watch(tasks, tx, member);
    spawn_probe(tasks, tx, member, probe_interval);
    if properties {
        let id = member.id.clone();
        spawn_watch(
            tasks,
            tx,
            origin.clone(),
            KIND_PROPERTY,
            Api::<ClusterProperty>::all(member.client.clone()),
            watcher::Config::default(),
            move |e| Fact::Property(id.clone(), e),
        );
    }
    let id = member.id.clone();
    spawn_watch(
        tasks,
        tx,
        origin.clone(),
        KIND_SERVICE,
        Api::<Service>::all(member.client.clone()),
        watcher::Config::default(),
        move |e| Fact::Service(id.clone(), e),
    );
    // The Services' own slices: those of a Kubernetes Service that no MCS controller wrote.
    let id = member.id.clone();
    spawn_watch(
        tasks,
        tx,
        origin,
        KIND_SLICE,
        Api::<EndpointSlice>::all(member.client.clone()),
        watcher::Config::default()
            .labels(&format!("{LABEL_K8S_SERVICE_NAME},!{LABEL_SERVICE_NAME}")),
        move |e| Fact::Slice(id.clone(), e),
    );
}

/// Watches ServiceExports at the version the member serves: `v1beta1`, or `v1alpha1` on a
/// member that has not upgraded its CRDs (identical schema, converted on the way in).
fn spawn_export_watch(tasks: &mut tokio::task::JoinSet<()>, tx: &Tx, member: &Member) {
    let (tx, id, client) = (tx.clone(), member.id.clone(), member.client.clone());
    tasks.spawn(async move {
        let alpha_only = match kube::discovery::group(&client, MCS_GROUP).await {
            // Versions are per resource: a member may serve ServiceImports at v1beta1 and
            // still serve ServiceExports at v1alpha1 only.
            Ok(group) => {
                let serves = |version: &str| {
                    group
                        .versioned_resources(version)
                        .iter()
                        .any(|(r, _)| r.plural == "serviceexports")
                };
                !serves("v1beta1") && serves("v1alpha1")
            }
            // Unreachable or no MCS CRDs yet: watch v1beta1 and let the watch report errors.
            Err(_) => false,
        };
        let origin = Origin::Member(id.clone());
        if alpha_only {
            tracing::info!(cluster = %id, "member serves only multicluster.x-k8s.io/v1alpha1; reading ServiceExports at v1alpha1");
            let stream = super::lean_watcher(
                Api::<v1alpha1::ServiceExport>::all(client),
                watcher::Config::default(),
            )
            .default_backoff();
            forward(stream, tx, origin, KIND_EXPORT, move |e| {
                Fact::Export(id.clone(), map_event(e, Into::into))
            })
            .await;
        } else {
            let stream =
                super::lean_watcher(Api::<ServiceExport>::all(client), watcher::Config::default())
                    .default_backoff();
            forward(stream, tx, origin, KIND_EXPORT, move |e| {
                Fact::Export(id.clone(), e)
            })
            .await;
        }
    });
}

/// Lists one ServiceExport every `interval` and reports whether that worked. Probes catch
/// what a live watch does not: revoked access, a server that stopped answering new requests.
fn spawn_probe(tasks: &mut tokio::task::JoinSet<()>, tx: &Tx, member: &Member, interval: Duration) {
    let (tx, id) = (tx.clone(), member.id.clone());
    let api = Api::<ServiceExport>::all(member.client.clone());
    tasks.spawn(async move {
        let mut tick = tokio::time::interval(interval);
        loop {
            tick.tick().await;
            let result = tokio::time::timeout(
                interval.max(Duration::from_secs(1)),
                api.list_metadata(&kube::api::ListParams::default().limit(1)),
            )
            .await
            .map_err(|_| "no answer in time".to_owned())
            .and_then(|r| r.map(|_| ()).map_err(|e| e.to_string()));
            if tx.send(Fact::Probe(id.clone(), result)).await.is_err() {
                return;
            }
        }
    });
}
