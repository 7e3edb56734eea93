//! A Kubernetes-backed resolver for `mcs-client`: endpoints straight from the local
//! cluster's ServiceImport and MCS EndpointSlices, with source cluster, zone and readiness.
//!
//! For a [`Target`] (`<svc>.<ns>` and a service port), it watches the ServiceImport (to map
//! the service port to its name and protocol) and every EndpointSlice labelled
//! `multicluster.kubernetes.io/service-name=<svc>` in the namespace. It keeps all slices
//! (a service may have many, one or more per source cluster), merges and de-duplicates them
//! and publishes the complete set as an [`Update::Reset`] on every change, so no single
//! partial update can empty the set (the kuberesolver #66 lesson). Only clusters whose
//! slices carry the requested port are included: traffic for a port goes only to clusters
//! that expose it.
//!
//! When the import has `status.clusterSelectorResults` (KEP-5939, cluster selection; the
//! agent evaluates them for this cluster), the resolver also sends them as an
//! [`Update::ClusterPreference`] before the set, and again whenever they change: `mcs-client`'s balancer then sends each request to the first result's
//! clusters that have a ready or serving endpoint, else to every cluster. See
//! [`cluster_preference`].
//!
//! [`SnapshotResolver`] answers the same way (through the same [`endpoints`]) from imports
//! and slices held in memory and replaced through a channel.
//!
//! ```no_run
//! # async fn run(client: kube::Client) {
//! use mcs_core::discovery::{Resolve, Target};
//! use mcs_core::name::ServiceRef;
//! use mcs_kube::resolver::KubeResolver;
//!
//! let resolver = KubeResolver::new(client);
//! let target = Target { service: ServiceRef::new("loyalty", "loyalty-accrual").unwrap(), port: 9443 };
//! let updates = resolver.resolve(&target);
//! # }
//! ```

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;

use futures::{StreamExt, stream};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::watcher::{self, Event};
use mcs_core::ClusterId;
use mcs_core::api::{LABEL_SERVICE_NAME, v1beta1::ServiceImport};
use mcs_core::discovery::{Endpoint, Resolution, Resolve, ResolveError, Target, Update};
use mcs_core::endpoints::ClusterPreference;
use mcs_core::slices::McsSlice;
use tokio::sync::{mpsc, watch};

/// Resolves targets from the ServiceImports and MCS EndpointSlices of one cluster.
#[derive(Clone)]
pub struct KubeResolver {
    client: kube::Client,
}

impl KubeResolver {
    /// A resolver over the cluster behind `client` (normally the caller's own cluster).
    pub fn new(client: kube::Client) -> Self {
        Self { client }
    }
}

impl std::fmt::Debug for KubeResolver {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeResolver").finish_non_exhaustive()
    }
}

impl Resolve for KubeResolver {
    fn resolve(&self, target: &Target) -> Resolution {
        let (tx, rx) = mpsc::channel(16);
        tokio::spawn(watch_target(self.client.clone(), target.clone(), tx));
        Box::pin(stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        }))
    }
}

enum Change {
    Import(Option<Box<ServiceImport>>),
    ImportListing(Box<ServiceImport>),
    ImportsListed,
    Slice(Box<EndpointSlice>),
    SliceGone(String),
    SliceListing(Box<EndpointSlice>),
    SlicesListed,
    ImportListStart,
    SliceListStart,
    Error(String),
}

async fn watch_target(
    client: kube::Client,
    target: Target,
    tx: mpsc::Sender<Result<Update, ResolveError>>,
) {
    let ns = target.service.namespace.as_str();
    let name = target.service.name.as_str();
    let imports = watcher::watcher(
        Api::<ServiceImport>::namespaced(client.clone(), ns),
        watcher::Config::default().fields(&format!("metadata.name={name}")),
    )
    .map(import_change);
    let slices = watcher::watcher(
        Api::<EndpointSlice>::namespaced(client, ns),
        watcher::Config::default().labels(&format!("{LABEL_SERVICE_NAME}={name}")),
    )
    .map(slice_change);
    let mut changes = std::pin::pin!(stream::select(imports, slices));

    let mut state = TargetState::default();
    let mut listing_import: Option<ServiceImport> = None;
    let mut listing_slices: BTreeMap<String, EndpointSlice> = BTreeMap::new();
    let mut last_sent = Sent::default();
    while let Some(batch) = changes.next().await {
        for change in batch {
            match change {
                Change::Import(i) => state.import = Some(i.map(|i| *i)),
                Change::ImportListing(i) => listing_import = Some(*i),
                Change::ImportsListed => state.import = Some(listing_import.take()),
                Change::Slice(s) => {
                    let key = s.metadata.name.clone().unwrap_or_default();
                    state.slices.insert(key, *s);
                }
                Change::SliceGone(key) => {
                    state.slices.remove(&key);
                }
                Change::SliceListing(s) => {
                    listing_slices.insert(s.metadata.name.clone().unwrap_or_default(), *s);
                }
                Change::SlicesListed => {
                    // A (re-)list replaces the whole set at once.
                    state.slices = std::mem::take(&mut listing_slices);
                    state.slices_listed = true;
                }
                // A (re-)list starts: forget what an interrupted earlier list buffered.
                Change::ImportListStart => listing_import = None,
                Change::SliceListStart => listing_slices.clear(),
                Change::Error(message) => {
                    if tx
                        .send(Err(ResolveError::new(&target, message)))
                        .await
                        .is_err()
                    {
                        return;
                    }
                }
            }
        }
        let Some(update) = state.update(&target) else {
            continue;
        };
        let preference = cluster_preference(state.import.as_ref().and_then(Option::as_ref));
        if send_changes(&tx, &mut last_sent, preference, update)
            .await
            .is_err()
        {
            return; // The resolution was dropped.
        }
    }
}

/// What a resolution last sent: the preference (none at first: a resolution of a service
/// without selectors never sends one), and the set.
#[derive(Default)]
struct Sent {
    preference: Option<ClusterPreference>,
    set: Option<Update>,
}

/// Sends the preference, then the set, each only when it differs from the last one sent.
async fn send_changes(
    tx: &mpsc::Sender<Result<Update, ResolveError>>,
    sent: &mut Sent,
    preference: Option<ClusterPreference>,
    update: Update,
) -> Result<(), ()> {
    if sent.preference != preference {
        tx.send(Ok(Update::ClusterPreference(preference.clone())))
            .await
            .map_err(drop)?;
        sent.preference = preference;
    }
    if sent.set.as_ref() != Some(&update) {
        tx.send(Ok(update.clone())).await.map_err(drop)?;
        sent.set = Some(update);
    }
    Ok(())
}

fn import_change(event: Result<Event<ServiceImport>, watcher::Error>) -> Vec<Change> {
    match event {
        Ok(Event::Apply(i)) => vec![Change::Import(Some(Box::new(i)))],
        Ok(Event::Delete(_)) => vec![Change::Import(None)],
        Ok(Event::Init) => vec![Change::ImportListStart],
        Ok(Event::InitApply(i)) => vec![Change::ImportListing(Box::new(i))],
        Ok(Event::InitDone) => vec![Change::ImportsListed],
        Err(e) => vec![Change::Error(format!("ServiceImport watch: {e}"))],
    }
}

fn slice_change(event: Result<Event<EndpointSlice>, watcher::Error>) -> Vec<Change> {
    match event {
        Ok(Event::Apply(s)) => vec![Change::Slice(Box::new(s))],
        Ok(Event::Delete(s)) => vec![Change::SliceGone(s.metadata.name.unwrap_or_default())],
        Ok(Event::Init) => vec![Change::SliceListStart],
        Ok(Event::InitApply(s)) => vec![Change::SliceListing(Box::new(s))],
        Ok(Event::InitDone) => vec![Change::SlicesListed],
        Err(e) => vec![Change::Error(format!("EndpointSlice watch: {e}"))],
    }
}

#[derive(Default)]
struct TargetState {
    /// `None` until the import watch has listed; then whether the import exists.
    import: Option<Option<ServiceImport>>,
    slices: BTreeMap<String, EndpointSlice>,
    slices_listed: bool,
}

impl TargetState {
    /// The complete endpoint set, or `None` while the watches have not both listed.
    fn update(&self, target: &Target) -> Option<Update> {
        let import = self.import.as_ref()?;
        if !self.slices_listed {
            return None;
        }
        Some(endpoints(target, import.as_ref(), self.slices.values()))
    }
}

/// The endpoint set of `target` from its ServiceImport and its MCS EndpointSlices: what
/// [`KubeResolver`] and [`SnapshotResolver`] publish.
///
/// `slices` are the EndpointSlices labelled `multicluster.kubernetes.io/service-name=<svc>`
/// in the service's namespace (others are skipped). No import gives
/// [`Update::DoesNotExist`]; an import without the target's port gives an empty set. The
/// import's port gives the port name and protocol to look for in the slices, so only
/// clusters whose slices carry that port contribute: traffic for a port goes only to the
/// clusters that expose it. Addresses are de-duplicated across slices (a ready copy wins)
/// and sorted.
pub fn endpoints<'a>(
    target: &Target,
    import: Option<&ServiceImport>,
    slices: impl IntoIterator<Item = &'a EndpointSlice>,
) -> Update {
    let Some(import) = import else {
        return Update::DoesNotExist;
    };
    // The import's port for the requested service port gives the port name to look
    // for in the slices; an import without that port has no endpoints for it.
    let Some(port) = import
        .spec
        .ports
        .iter()
        .find(|p| i64::from(p.port) == i64::from(target.port))
    else {
        return Update::Reset(Vec::new());
    };
    let wanted_name = port.name.clone().unwrap_or_default();
    let wanted_protocol = port.protocol_or_default();
    let mut endpoints: HashMap<SocketAddr, Endpoint> = HashMap::new();
    for slice in slices {
        let Ok(parsed) = McsSlice::parse(slice) else {
            continue;
        };
        if parsed.service.as_str() != target.service.name.as_str()
            || slice.metadata.namespace.as_deref() != Some(target.service.namespace.as_str())
        {
            continue;
        }
        let Some(slice_port) = parsed
            .data
            .ports
            .iter()
            .find(|p| p.name == wanted_name && p.protocol == wanted_protocol)
        else {
            continue; // This cluster does not expose the port.
        };
        for ep in &parsed.data.endpoints {
            for ip in &ep.addresses {
                let addr = SocketAddr::new(*ip, slice_port.port);
                let candidate = Endpoint {
                    addr,
                    cluster: parsed.cluster.clone(),
                    zone: ep.zone.clone(),
                    hostname: ep.hostname.clone(),
                    ready: ep.ready,
                    serving: ep.serving,
                    terminating: ep.terminating,
                };
                // The same address in two slices (a slice being replaced): keep the
                // ready copy.
                match endpoints.get(&addr) {
                    Some(existing) if existing.ready || !candidate.ready => {}
                    _ => {
                        endpoints.insert(addr, candidate);
                    }
                }
            }
        }
    }
    let mut list: Vec<Endpoint> = endpoints.into_values().collect();
    list.sort_by_key(|e| e.addr);
    Update::Reset(list)
}

/// This cluster's preference among the source clusters of a service (KEP-5939), from its
/// ServiceImport: the import's `status.clusterSelectorResults` in order, which the agent
/// evaluates for the cluster it runs in (and removes when the import has no selectors).
/// As the KEP asks, the results are used as they are, never matched against
/// `spec.clusterSelectors` (the two may be out of step for a moment).
///
/// `None` (every cluster, as without selectors) when there is no import, no results or an
/// empty list (the agent has not evaluated them, or runs without cluster selection), or
/// when the results cannot be a preference (more than [`ClusterPreference::MAX_SETS`]). A
/// cluster id that is not a valid one is skipped, and a result that names no cluster is
/// kept (it is never chosen).
pub fn cluster_preference(import: Option<&ServiceImport>) -> Option<ClusterPreference> {
    let import = import?;
    let results = import.status.as_ref()?.cluster_selector_results.as_ref()?;
    if results.is_empty() {
        return None;
    }
    let sets = results.iter().map(|result| {
        result
            .clusters
            .iter()
            .filter_map(|c| ClusterId::new(c.as_str()).ok())
            .collect::<Vec<_>>()
    });
    match ClusterPreference::new(sets) {
        Ok(preference) => Some(preference),
        Err(e) => {
            tracing::debug!(import = ?import.metadata.name, error = %e, "clusterSelectorResults ignored");
            None
        }
    }
}

/// One cluster's ServiceImports and MCS EndpointSlices, held in memory: what a
/// [`SnapshotResolver`] resolves from.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct ImportedObjects {
    /// The ServiceImports.
    pub imports: Vec<ServiceImport>,
    /// The EndpointSlices (those without the `multicluster.kubernetes.io/service-name`
    /// label are ignored).
    pub slices: Vec<EndpointSlice>,
}

/// A resolver over ServiceImports and MCS EndpointSlices held in memory and replaced
/// through a `tokio::sync::watch` channel, for a process that gets them some other way than
/// from an API server (a test, an example, a different control plane).
///
/// It answers exactly as [`KubeResolver`] does from the same objects (both use
/// [`endpoints`]): for every target, the complete set on every change of the objects,
/// sent only when it differs from the last one.
///
/// ```
/// # async fn run() {
/// use mcs_core::discovery::{Resolve, Target};
/// use mcs_core::name::ServiceRef;
/// use mcs_kube::resolver::{ImportedObjects, SnapshotResolver};
///
/// let (objects, rx) = tokio::sync::watch::channel(ImportedObjects::default());
/// let resolver = SnapshotResolver::new(rx);
/// let target = Target { service: ServiceRef::new("loyalty", "loyalty-accrual").unwrap(), port: 9443 };
/// let updates = resolver.resolve(&target); // DoesNotExist until an import is sent
/// objects.send_replace(ImportedObjects::default());
/// # drop(updates); }
/// ```
#[derive(Clone, Debug)]
pub struct SnapshotResolver {
    objects: watch::Receiver<ImportedObjects>,
}

impl SnapshotResolver {
    /// A resolver answering from the objects last sent on the channel.
    pub fn new(objects: watch::Receiver<ImportedObjects>) -> Self {
        Self { objects }
    }
}

impl Resolve for SnapshotResolver {
    fn resolve(&self, target: &Target) -> Resolution {
        let (tx, rx) = mpsc::channel(16);
        let mut objects = self.objects.clone();
        let target = target.clone();
        tokio::spawn(async move {
            let mut last_sent = Sent::default();
            loop {
                let (preference, update) = {
                    let objects = objects.borrow_and_update();
                    let import = objects.imports.iter().find(|i| {
                        i.metadata.name.as_deref() == Some(target.service.name.as_str())
                            && i.metadata.namespace.as_deref()
                                == Some(target.service.namespace.as_str())
                    });
                    (
                        cluster_preference(import),
                        endpoints(&target, import, &objects.slices),
                    )
                };
                if send_changes(&tx, &mut last_sent, preference, update)
                    .await
                    .is_err()
                {
                    return; // The resolution was dropped.
                }
                if objects.changed().await.is_err() {
                    return; // The sender is gone: keep the last set.
                }
            }
        });
        Box::pin(stream::unfold(rx, |mut rx| async move {
            rx.recv().await.map(|item| (item, rx))
        }))
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use futures::StreamExt;
    use k8s_openapi::api::discovery::v1::{
        Endpoint as SliceEndpoint, EndpointConditions, EndpointPort,
    };
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
    use mcs_core::api::{
        LABEL_SOURCE_CLUSTER, Protocol, ServiceImportSpec, ServiceImportType, ServicePort,
    };
    use mcs_core::name::ServiceRef;

    use super::*;

    fn target(port: u16) -> Target {
        Target {
            service: ServiceRef::new("loyalty", "loyalty-accrual").unwrap(),
            port,
        }
    }

    fn import(ports: &[(&str, i32)]) -> ServiceImport {
        let mut spec = ServiceImportSpec::new(ServiceImportType::ClusterSetIp);
        spec.ports = ports
            .iter()
            .map(|(name, port)| ServicePort {
                name: Some((*name).into()),
                protocol: Some(Protocol::Tcp),
                app_protocol: None,
                port: *port,
            })
            .collect();
        let mut import = ServiceImport::new("loyalty-accrual", spec);
        import.metadata.namespace = Some("loyalty".into());
        import
    }

    fn slice(
        name: &str,
        cluster: &str,
        ips: &[(&str, bool)],
        ports: &[(&str, i32)],
    ) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("loyalty".into()),
                labels: Some(BTreeMap::from([
                    (LABEL_SERVICE_NAME.to_owned(), "loyalty-accrual".to_owned()),
                    (LABEL_SOURCE_CLUSTER.to_owned(), cluster.to_owned()),
                ])),
                ..Default::default()
            },
            endpoints: ips
                .iter()
                .map(|(ip, ready)| SliceEndpoint {
                    addresses: vec![(*ip).into()],
                    conditions: Some(EndpointConditions {
                        ready: Some(*ready),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect(),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p)| EndpointPort {
                        name: Some((*n).into()),
                        port: Some(*p),
                        protocol: Some("TCP".into()),
                        app_protocol: None,
                    })
                    .collect(),
            ),
        }
    }

    fn addrs(update: &Update) -> Vec<(String, String, bool)> {
        match update {
            Update::Reset(list) => list
                .iter()
                .map(|e| (e.cluster.to_string(), e.addr.to_string(), e.ready))
                .collect(),
            other => panic!("expected a reset, got {other:?}"),
        }
    }

    #[test]
    fn endpoints_follow_the_import_port_and_the_slices_that_carry_it() {
        let import = import(&[("grpc", 9443), ("admin", 9444)]);
        let slices = [
            slice(
                "e",
                "east",
                &[("10.10.0.1", true), ("10.10.0.2", false)],
                &[("grpc", 8443)],
            ),
            slice(
                "w",
                "west",
                &[("10.20.0.1", true)],
                &[("grpc", 8443), ("admin", 8444)],
            ),
            // Another service's slice in the same namespace, and one in another namespace.
            {
                let mut s = slice("x", "east", &[("10.10.9.9", true)], &[("grpc", 8443)]);
                s.metadata
                    .labels
                    .as_mut()
                    .unwrap()
                    .insert(LABEL_SERVICE_NAME.into(), "other".into());
                s
            },
            {
                let mut s = slice("y", "east", &[("10.10.9.8", true)], &[("grpc", 8443)]);
                s.metadata.namespace = Some("elsewhere".into());
                s
            },
        ];
        assert_eq!(
            addrs(&endpoints(&target(9443), Some(&import), &slices)),
            [
                ("east".to_owned(), "10.10.0.1:8443".to_owned(), true),
                ("east".to_owned(), "10.10.0.2:8443".to_owned(), false),
                ("west".to_owned(), "10.20.0.1:8443".to_owned(), true),
            ]
        );
        assert_eq!(
            addrs(&endpoints(&target(9444), Some(&import), &slices)),
            [("west".to_owned(), "10.20.0.1:8444".to_owned(), true)],
            "only the cluster exposing admin"
        );
        assert!(addrs(&endpoints(&target(1), Some(&import), &slices)).is_empty());
        assert_eq!(
            endpoints(&target(9443), None, &slices),
            Update::DoesNotExist
        );
    }

    #[tokio::test]
    async fn the_snapshot_resolver_sends_each_new_set_once() {
        let (tx, rx) = watch::channel(ImportedObjects::default());
        let mut updates = SnapshotResolver::new(rx).resolve(&target(9443));
        assert_eq!(updates.next().await.unwrap().unwrap(), Update::DoesNotExist);
        let mut objects = ImportedObjects {
            imports: vec![import(&[("grpc", 9443)])],
            slices: vec![slice(
                "e",
                "east",
                &[("10.10.0.1", true)],
                &[("grpc", 9443)],
            )],
        };
        tx.send_replace(objects.clone());
        let first = updates.next().await.unwrap().unwrap();
        assert_eq!(
            addrs(&first),
            [("east".to_owned(), "10.10.0.1:9443".to_owned(), true)]
        );
        // The same set again is not sent; the next change is.
        tx.send_replace(objects.clone());
        objects.slices.push(slice(
            "w",
            "west",
            &[("10.20.0.1", true)],
            &[("grpc", 9443)],
        ));
        tx.send_replace(objects);
        let second = updates.next().await.unwrap().unwrap();
        assert_eq!(addrs(&second).len(), 2, "{second:?}");
        drop(tx);
        assert!(
            updates.next().await.is_none(),
            "ends when the objects' sender is gone"
        );
    }

    /// An import whose spec has one selector and whose status has `results`.
    fn selected(results: Option<&[&[&str]]>) -> ServiceImport {
        use mcs_core::api::{ClusterSelector, ClusterSelectorResult, ServiceImportStatus};
        let mut i = import(&[("grpc", 9443)]);
        i.spec.cluster_selectors = Some(vec![ClusterSelector::default()]);
        i.status = Some(ServiceImportStatus {
            cluster_selector_results: results.map(|sets| {
                sets.iter()
                    .map(|set| ClusterSelectorResult {
                        clusters: set.iter().map(|c| (*c).to_owned()).collect(),
                    })
                    .collect()
            }),
            ..ServiceImportStatus::default()
        });
        i
    }

    fn preference(sets: &[&[&str]]) -> ClusterPreference {
        ClusterPreference::new(
            sets.iter()
                .map(|set| set.iter().map(|c| ClusterId::new(*c).unwrap())),
        )
        .unwrap()
    }

    #[test]
    fn the_preference_is_the_imports_results() {
        assert_eq!(cluster_preference(None), None);
        assert_eq!(cluster_preference(Some(&import(&[("grpc", 9443)]))), None);
        assert_eq!(
            cluster_preference(Some(&selected(None))),
            None,
            "not evaluated yet"
        );
        assert_eq!(cluster_preference(Some(&selected(Some(&[])))), None);
        assert_eq!(
            cluster_preference(Some(&selected(Some(&[
                &["west"],
                &[],
                &["east", "Not_A_Cluster"]
            ])))),
            Some(preference(&[&["west"], &[], &["east"]])),
            "in order; an empty result kept, an invalid id skipped"
        );
        // The results count, whatever the spec says at the moment (the KEP: consumers use
        // the results directly).
        let mut lagging = selected(Some(&[&["west"]]));
        lagging.spec.cluster_selectors = None;
        assert_eq!(
            cluster_preference(Some(&lagging)),
            Some(preference(&[&["west"]]))
        );
        let too_many: Vec<&[&str]> = vec![&["west"]; ClusterPreference::MAX_SETS + 1];
        assert_eq!(cluster_preference(Some(&selected(Some(&too_many)))), None);
    }

    #[tokio::test]
    async fn the_snapshot_resolver_sends_the_preference_before_the_set_and_on_change() {
        let east = slice("e", "east", &[("10.10.0.1", true)], &[("grpc", 9443)]);
        let mut objects = ImportedObjects {
            imports: vec![selected(Some(&[&["west"], &["east"]]))],
            slices: vec![east],
        };
        let (tx, rx) = watch::channel(objects.clone());
        let mut updates = SnapshotResolver::new(rx).resolve(&target(9443));
        assert_eq!(
            updates.next().await.unwrap().unwrap(),
            Update::ClusterPreference(Some(preference(&[&["west"], &["east"]])))
        );
        assert_eq!(addrs(&updates.next().await.unwrap().unwrap()).len(), 1);
        // New results: the preference alone (the set did not change).
        objects.imports = vec![selected(Some(&[&["east"]]))];
        tx.send_replace(objects.clone());
        assert_eq!(
            updates.next().await.unwrap().unwrap(),
            Update::ClusterPreference(Some(preference(&[&["east"]])))
        );
        // The results go (the agent removes them with the selectors): the preference is
        // lifted.
        objects.imports = vec![import(&[("grpc", 9443)])];
        tx.send_replace(objects);
        assert_eq!(
            updates.next().await.unwrap().unwrap(),
            Update::ClusterPreference(None)
        );
        drop(tx);
        assert!(updates.next().await.is_none());
    }
}
