//! Where the agent's facts come from: watches, turned into [`Fact`]s on one channel.
//!
//! The topology is which sources run, nothing else: [`mesh`] watches every member's API
//! server; in the hub topology [`local`] watches the agent's own cluster (only what is
//! exported) and [`hub`] the other members' records and Leases on the hub. Both feed the
//! same state, merge and planner.

pub(crate) mod hub;
pub(crate) mod local;
pub(crate) mod mesh;

use futures::{Stream, StreamExt};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use mcs_core::ClusterId;
use mcs_core::api::v1beta1::{ClusterProperty, ServiceExport, ServiceImport};
use mcs_core::name::ServiceRef;
use tokio::sync::mpsc;

use crate::hub::record::MemberExport;

/// Where a fact comes from: a member's cluster (the agent's own included), or the hub.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) enum Origin {
    /// A member's API server.
    Member(ClusterId),
    /// The hub's API server.
    Hub,
}

/// One thing a source observed.
// Each fact is moved through the channel once; boxing would only add an allocation per
// watch event.
#[allow(clippy::large_enum_variant)]
pub(crate) enum Fact {
    /// A member's ServiceExports (mesh: every member; hub: the agent's own cluster).
    Export(ClusterId, Event<ServiceExport>),
    /// A member's Services.
    Service(ClusterId, Event<Service>),
    /// A member's own EndpointSlices (those of its Kubernetes Services).
    Slice(ClusterId, Event<EndpointSlice>),
    /// A member's ClusterProperties (mesh, with cluster selection on).
    Property(ClusterId, Event<ClusterProperty>),
    /// The agent's own Service of one exported service (hub: one watch per service).
    ServiceOf(ServiceRef, Event<Service>),
    /// The agent's own EndpointSlices of one exported service (hub).
    SlicesOf(ServiceRef, Event<EndpointSlice>),
    /// A service is no longer exported here: its per-service watches stopped (hub).
    Unwatched(ServiceRef),
    /// The agent's own Namespaces.
    Namespace(Event<Namespace>),
    /// The agent's own ServiceImports.
    Import(Event<ServiceImport>),
    /// The EndpointSlices the agent wrote.
    Imported(Event<EndpointSlice>),
    /// The derived Services the agent wrote.
    Derived(Event<Service>),
    /// Member namespaces on the hub.
    Members(Event<Namespace>),
    /// Another member's records on the hub.
    Record(ClusterId, Event<MemberExport>),
    /// The agent's own records on the hub.
    OwnRecord(Event<MemberExport>),
    /// A member's Lease on the hub.
    Lease(ClusterId, Event<Lease>),
    /// A watch failed: where, which kind, the error and whether it was refused (403).
    WatchError(Origin, &'static str, String, bool),
    /// A member's health probe (mesh).
    Probe(ClusterId, Result<(), String>),
    /// A write to the hub (publishing, Lease renewal) worked or failed.
    HubWrite(&'static str, Result<(), String>),
}

impl Fact {
    /// The watch an event came from: its origin and kind (errors and probes: none).
    pub(crate) fn watch(&self, local: &ClusterId) -> Option<(Origin, &'static str)> {
        let member = |id: &ClusterId| Origin::Member(id.clone());
        Some(match self {
            Fact::Export(id, _) => (member(id), KIND_EXPORT),
            Fact::Service(id, _) => (member(id), KIND_SERVICE),
            Fact::Slice(id, _) => (member(id), KIND_SLICE),
            Fact::Property(id, _) => (member(id), KIND_PROPERTY),
            Fact::ServiceOf(..) | Fact::Unwatched(_) => (member(local), KIND_SERVICE),
            Fact::SlicesOf(..) => (member(local), KIND_SLICE),
            Fact::Namespace(_) => (member(local), KIND_NAMESPACE),
            Fact::Import(_) => (member(local), KIND_IMPORT),
            Fact::Imported(_) => (member(local), KIND_IMPORTED),
            Fact::Derived(_) => (member(local), KIND_DERIVED),
            Fact::Members(_) => (Origin::Hub, KIND_MEMBERS),
            Fact::Record(..) => (Origin::Hub, KIND_RECORD),
            Fact::OwnRecord(_) => (Origin::Hub, KIND_OWN_RECORD),
            Fact::Lease(..) => (Origin::Hub, KIND_LEASE),
            Fact::WatchError(..) | Fact::Probe(..) | Fact::HubWrite(..) => return None,
        })
    }
}

pub(crate) const KIND_EXPORT: &str = "ServiceExport";
pub(crate) const KIND_SERVICE: &str = "Service";
pub(crate) const KIND_SLICE: &str = "EndpointSlice";
pub(crate) const KIND_PROPERTY: &str = "ClusterProperty";
pub(crate) const KIND_NAMESPACE: &str = "Namespace";
pub(crate) const KIND_IMPORT: &str = "ServiceImport";
pub(crate) const KIND_IMPORTED: &str = "imported EndpointSlice";
pub(crate) const KIND_DERIVED: &str = "derived Service";
pub(crate) const KIND_MEMBERS: &str = "member Namespace on the hub";
pub(crate) const KIND_RECORD: &str = "MemberExport on the hub";
pub(crate) const KIND_OWN_RECORD: &str = "own MemberExport on the hub";
pub(crate) const KIND_LEASE: &str = "Lease on the hub";

/// The facts channel.
pub(crate) type Tx = mpsc::Sender<Fact>;

/// kube-runtime's watcher of `api`, with each object's `metadata.managedFields` dropped as
/// it arrives. The agent reads no field of it, and it is a large part of many objects it
/// keeps: server-side apply records, per manager, every field it set (each endpoint of an
/// imported EndpointSlice, each port of a Service). Every watch of the agent goes through
/// here.
pub(crate) fn lean_watcher<K>(
    api: Api<K>,
    config: watcher::Config,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> + Send + 'static
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
{
    lean(watcher::watcher(api, config))
}

/// `stream` with each object's `metadata.managedFields` dropped.
fn lean<K: kube::Resource>(
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
) -> impl Stream<Item = Result<Event<K>, watcher::Error>> {
    stream.modify(|obj: &mut K| obj.meta_mut().managed_fields = None)
}

/// Spawns a watch of `api` that sends each event, wrapped by `wrap`, and each error.
pub(crate) fn spawn_watch<K, F>(
    tasks: &mut tokio::task::JoinSet<()>,
    tx: &Tx,
    origin: Origin,
    kind: &'static str,
    api: Api<K>,
    config: watcher::Config,
    wrap: F,
) where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned + Send + 'static,
    F: Fn(Event<K>) -> Fact + Send + 'static,
{
    let tx = tx.clone();
    tasks.spawn(async move {
        let stream = lean_watcher(api, config).default_backoff();
        forward(stream, tx, origin, kind, wrap).await;
    });
}

/// Sends every event of `stream`, wrapped, and every error, until the channel closes.
pub(crate) async fn forward<K, F>(
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    tx: Tx,
    origin: Origin,
    kind: &'static str,
    wrap: F,
) where
    F: Fn(Event<K>) -> Fact,
{
    let mut stream = std::pin::pin!(stream);
    while let Some(event) = stream.next().await {
        let fact = match event {
            Ok(event) => wrap(event),
            Err(e) => {
                let (error, forbidden) = describe_watch_error(&e);
                Fact::WatchError(origin.clone(), kind, error, forbidden)
            }
        };
        if tx.send(fact).await.is_err() {
            return;
        }
    }
}

/// A watch error in one line, and whether the API server refused the request (403).
pub(crate) fn describe_watch_error(e: &watcher::Error) -> (String, bool) {
    let (what, source) = match e {
        watcher::Error::InitialListFailed(e) => ("list", e),
        watcher::Error::WatchStartFailed(e) => ("watch", e),
        watcher::Error::WatchFailed(e) => ("watch", e),
        watcher::Error::WatchError(status) => {
            return (
                format!("watch: {} (HTTP {})", status.message, status.code),
                status.is_forbidden(),
            );
        }
        other => return (other.to_string(), false),
    };
    match source {
        kube::Error::Api(status) => (
            format!("{what}: {} (HTTP {})", status.message, status.code),
            status.is_forbidden(),
        ),
        other => (format!("{what}: {other}"), false),
    }
}

/// An event with its object converted.
pub(crate) fn map_event<A, B>(event: Event<A>, f: impl Fn(A) -> B) -> Event<B> {
    match event {
        Event::Apply(a) => Event::Apply(f(a)),
        Event::Delete(a) => Event::Delete(f(a)),
        Event::Init => Event::Init,
        Event::InitApply(a) => Event::InitApply(f(a)),
        Event::InitDone => Event::InitDone,
    }
}

#[cfg(test)]
mod tests {
    use futures::StreamExt;
    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ManagedFieldsEntry;
    use kube::api::ObjectMeta;
    use kube::runtime::watcher::{self, Event};

    use super::lean;

    fn slice(name: &str) -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some(name.to_owned()),
                namespace: Some("loyalty".to_owned()),
                resource_version: Some("7".to_owned()),
                managed_fields: Some(vec![ManagedFieldsEntry {
                    manager: Some("mcs-agent".to_owned()),
                    operation: Some("Apply".to_owned()),
                    ..Default::default()
                }]),
                ..Default::default()
            },
            address_type: "IPv4".to_owned(),
            ..Default::default()
        }
    }

    #[tokio::test]
    async fn watched_objects_arrive_without_managed_fields_and_otherwise_whole() {
        let events: Vec<Result<Event<EndpointSlice>, watcher::Error>> = vec![
            Ok(Event::Init),
            Ok(Event::InitApply(slice("a"))),
            Ok(Event::InitDone),
            Ok(Event::Apply(slice("b"))),
            Ok(Event::Delete(slice("c"))),
        ];
        let out: Vec<_> = lean(futures::stream::iter(events)).collect().await;
        let mut objects = 0;
        for event in out {
            match event.expect("no error") {
                Event::InitApply(obj) | Event::Apply(obj) | Event::Delete(obj) => {
                    objects += 1;
                    let mut want = slice(obj.metadata.name.as_deref().unwrap());
                    want.metadata.managed_fields = None;
                    assert_eq!(obj, want);
                }
                Event::Init | Event::InitDone => {}
            }
        }
        assert_eq!(objects, 3);
    }
}
