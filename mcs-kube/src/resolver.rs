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
use mcs_core::api::{LABEL_SERVICE_NAME, v1beta1::ServiceImport};
use mcs_core::discovery::{Endpoint, Resolution, Resolve, ResolveError, Target, Update};
use mcs_core::slices::McsSlice;
use tokio::sync::mpsc;

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
    let mut last_sent: Option<Update> = None;
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
        if last_sent.as_ref() == Some(&update) {
            continue;
        }
        if tx.send(Ok(update.clone())).await.is_err() {
            return; // The resolution was dropped.
        }
        last_sent = Some(update);
    }
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
        let Some(import) = import else {
            return Some(Update::DoesNotExist);
        };
        // The import's port for the requested service port gives the port name to look
        // for in the slices; an import without that port has no endpoints for it.
        let Some(port) = import
            .spec
            .ports
            .iter()
            .find(|p| i64::from(p.port) == i64::from(target.port))
        else {
            return Some(Update::Reset(Vec::new()));
        };
        let wanted_name = port.name.clone().unwrap_or_default();
        let wanted_protocol = port.protocol_or_default();
        let mut endpoints: HashMap<SocketAddr, Endpoint> = HashMap::new();
        for slice in self.slices.values() {
            let Ok(parsed) = McsSlice::parse(slice) else {
                continue;
            };
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
        Some(Update::Reset(list))
    }
}
