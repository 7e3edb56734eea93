//! Wiring: watches in every member feed the index; dirty services are merged and the
//! resulting writes are applied to the agent's own cluster.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::future::Future;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use mcs_core::ClusterId;
use mcs_core::api::{
    LABEL_SERVICE_NAME, MCS_GROUP, v1alpha1, v1beta1::ServiceExport, v1beta1::ServiceImport,
};
use mcs_core::merge::{ClusterSetState, Constituent, ServiceFacts, Stability};
use mcs_core::name::ServiceRef;
use tokio::sync::mpsc;

use super::desired::{
    LABEL_K8S_SERVICE_NAME, LABEL_MANAGED_BY, LABEL_SLICE_MANAGED_BY, MANAGED_BY,
};
use super::index::{Key, Store, key_of, own_key};
use super::reconcile::{self, Observed, ServiceInputs};
use super::writer::Writer;
use super::{AgentConfig, AgentError, AgentHealth, AgentMetrics, ResyncRequests};

/// One member's watched state.
struct MemberState {
    id: ClusterId,
    exports: Store<ServiceExport>,
    services: Store<Service>,
    slices: Store<EndpointSlice>,
    /// When the member's watches started failing (None: healthy).
    watch_failing_since: Option<Instant>,
    /// When the member's health probe started failing (None: healthy). Probes catch what a
    /// live watch does not: revoked access, a server that stopped answering new requests.
    probe_failing_since: Option<Instant>,
    /// The member has been unreachable for longer than the grace period: its exports are
    /// left out of the merge until it answers again.
    removed: bool,
    /// The last error of each failing watch (by kind), and whether it was a 403; cleared
    /// by the next event of that kind.
    watch_errors: BTreeMap<&'static str, (String, bool)>,
}

impl MemberState {
    /// Since when the member is failing, if it is.
    fn failing_since(&self) -> Option<Instant> {
        match (self.watch_failing_since, self.probe_failing_since) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The agent's own cluster: what it has written and the namespaces that exist.
struct LocalState {
    namespaces: Store<Namespace>,
    imports: Store<ServiceImport>,
    imported: Store<EndpointSlice>,
}

// Each fact is moved through the channel once; boxing would only add an allocation per
// watch event.
#[allow(clippy::large_enum_variant)]
enum Fact {
    Export(Event<ServiceExport>),
    Service(Event<Service>),
    Slice(Event<EndpointSlice>),
    Namespace(Event<Namespace>),
    Import(Event<ServiceImport>),
    Imported(Event<EndpointSlice>),
    /// A watch failed: its kind, the error and whether the API server refused it (403).
    Error(&'static str, String, bool),
    Probe(Result<(), String>),
}

impl Fact {
    /// The kind of the watch an event came from (as passed to `spawn_watch`).
    fn kind(&self) -> Option<&'static str> {
        Some(match self {
            Fact::Export(_) => KIND_EXPORT,
            Fact::Service(_) => KIND_SERVICE,
            Fact::Slice(_) => KIND_SLICE,
            Fact::Namespace(_) => KIND_NAMESPACE,
            Fact::Import(_) => KIND_IMPORT,
            Fact::Imported(_) => KIND_IMPORTED,
            Fact::Error(..) | Fact::Probe(_) => return None,
        })
    }
}

const KIND_EXPORT: &str = "ServiceExport";
const KIND_SERVICE: &str = "Service";
const KIND_SLICE: &str = "EndpointSlice";
const KIND_NAMESPACE: &str = "Namespace";
const KIND_IMPORT: &str = "ServiceImport";
const KIND_IMPORTED: &str = "imported EndpointSlice";

struct Msg {
    member: usize,
    fact: Fact,
}

/// Runs the agent until `shutdown` completes.
pub(super) async fn run(
    config: AgentConfig,
    ready: Arc<AtomicBool>,
    health: AgentHealth,
    metrics: AgentMetrics,
    mut resync: ResyncRequests,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let local_index = config
        .members
        .iter()
        .position(|m| m.id == config.local)
        .ok_or_else(|| {
            AgentError::Config(format!(
                "the members do not include the local cluster {}",
                config.local
            ))
        })?;
    let (tx, mut rx) = mpsc::channel::<Msg>(4096);
    let mut tasks = tokio::task::JoinSet::new();
    for (i, member) in config.members.iter().enumerate() {
        let client = member.client.clone();
        spawn_export_watch(&mut tasks, &tx, i, client.clone());
        spawn_probe(&mut tasks, &tx, i, client.clone(), config.probe_interval);
        spawn_watch(
            &mut tasks,
            &tx,
            i,
            KIND_SERVICE,
            Api::<Service>::all(client.clone()),
            watcher::Config::default(),
            Fact::Service,
        );
        // The Services' own slices: those of a Kubernetes Service that no MCS controller wrote.
        let source = watcher::Config::default()
            .labels(&format!("{LABEL_K8S_SERVICE_NAME},!{LABEL_SERVICE_NAME}"));
        spawn_watch(
            &mut tasks,
            &tx,
            i,
            KIND_SLICE,
            Api::<EndpointSlice>::all(client.clone()),
            source,
            Fact::Slice,
        );
        if i == local_index {
            spawn_watch(
                &mut tasks,
                &tx,
                i,
                KIND_NAMESPACE,
                Api::<Namespace>::all(client.clone()),
                watcher::Config::default(),
                Fact::Namespace,
            );
            // Read as untyped objects: a hand-written import with a value the typed API
            // rejects must not stop the watch; it becomes a foreign import left alone.
            let resource = kube::api::ApiResource::erase::<ServiceImport>(&());
            spawn_watch(
                &mut tasks,
                &tx,
                i,
                KIND_IMPORT,
                Api::<kube::api::DynamicObject>::all_with(client.clone(), &resource),
                watcher::Config::default(),
                |e| Fact::Import(map_event(e, typed_import)),
            );
            let ours = watcher::Config::default()
                .labels(&format!("{LABEL_SLICE_MANAGED_BY}={MANAGED_BY}"));
            spawn_watch(
                &mut tasks,
                &tx,
                i,
                KIND_IMPORTED,
                Api::<EndpointSlice>::all(client),
                ours,
                Fact::Imported,
            );
        }
    }
    drop(tx);

    let mut members: Vec<MemberState> = config
        .members
        .iter()
        .map(|m| MemberState {
            id: m.id.clone(),
            exports: Store::new(own_key),
            services: Store::new(service_of_service),
            slices: Store::new(service_of_slice),
            watch_failing_since: None,
            probe_failing_since: None,
            removed: false,
            watch_errors: BTreeMap::new(),
        })
        .collect();
    let mut local = LocalState {
        namespaces: Store::new(namespace_key),
        imports: Store::new(own_key),
        imported: Store::new(service_of_mcs_slice),
    };
    let mut merge = ClusterSetState::new(Stability::Sticky);
    let writer = Writer::new(
        config.members[local_index].client.clone(),
        config.field_manager.clone(),
    );
    let mut dirty: BTreeSet<Key> = BTreeSet::new();
    let mut retry: BTreeMap<Key, (Instant, u32)> = BTreeMap::new();
    // Writes the own cluster refused (403), by service: they make the agent not ready.
    let mut forbidden: BTreeMap<Key, String> = BTreeMap::new();
    let mut tick = tokio::time::interval(Duration::from_millis(500));
    let mut last_resync = Instant::now();
    // A requested resync (`ResyncHandle`) whose pass has not completed yet.
    let mut resync_pending: Option<u64> = None;
    let mut shutdown = std::pin::pin!(shutdown);

    loop {
        tokio::select! {
            () = &mut shutdown => break,
            msg = rx.recv() => {
                let Some(msg) = msg else { break };
                handle(&mut members, &mut local, msg, &mut dirty);
                // Take everything already queued before reconciling (coalesces bursts).
                while let Ok(msg) = rx.try_recv() {
                    handle(&mut members, &mut local, msg, &mut dirty);
                }
            }
            Ok(()) = resync.requests.changed() => {
                resync_pending = Some(*resync.requests.borrow_and_update());
                mark_all_dirty(&members, &local, &mut dirty);
            }
            _ = tick.tick() => {
                let now = Instant::now();
                for m in members.iter_mut() {
                    if let Some(since) = m.failing_since()
                        && !m.removed
                        && m.id != config.local
                        && now.duration_since(since) >= config.unreachable_grace
                    {
                        tracing::warn!(cluster = %m.id, "member unreachable for longer than the grace period; removing its endpoints");
                        m.removed = true;
                        dirty.extend(all_services(m));
                    }
                }
                let due: Vec<Key> = retry.iter().filter(|(_, (at, _))| *at <= now).map(|(k, _)| k.clone()).collect();
                dirty.extend(due);
                if now.duration_since(last_resync) >= config.resync {
                    last_resync = now;
                    mark_all_dirty(&members, &local, &mut dirty);
                }
            }
        }
        let synced = members.iter().all(|m| {
            m.removed || (m.exports.is_listed() && m.services.is_listed() && m.slices.is_listed())
        }) && local.namespaces.is_listed()
            && local.imports.is_listed()
            && local.imported.is_listed();
        if !synced || dirty.is_empty() {
            let reason = not_ready_reason(&members, local_index, &local, &forbidden, synced);
            report_health(&config.local, &ready, &health, reason);
            if synced && let Some(id) = resync_pending.take() {
                // Nothing to reconcile: the requested pass is trivially complete.
                resync.completed.send_replace(id);
            }
            continue;
        }
        let keys = std::mem::take(&mut dirty);
        let now = Instant::now();
        for key in keys {
            let Ok(service) = ServiceRef::new(&key.0, &key.1) else {
                continue;
            };
            update_merge(&mut merge, &members, &service, &key, &config);
            let inputs = inputs_for(&members, &local, &merge, &service, &key, &config, now);
            let plan = reconcile::plan(&inputs);
            metrics.reconciles.inc();
            match writer.execute(&service, plan).await {
                Ok(()) => {
                    retry.remove(&key);
                    forbidden.remove(&key);
                }
                Err(e) if e.is_namespace_terminating() => {
                    // The namespace started terminating before its watch said so: nothing
                    // is to be written there any more (the next plan for it is empty).
                    tracing::debug!(service = %service, error = %e, "namespace is being terminated; not writing into it");
                    retry.remove(&key);
                    forbidden.remove(&key);
                }
                Err(e) => {
                    metrics.errors.inc();
                    let attempts = retry.get(&key).map_or(0, |(_, n)| *n) + 1;
                    let delay = Duration::from_millis(250 * 2u64.pow(attempts.min(7)));
                    if e.is_forbidden() {
                        if !forbidden.contains_key(&key) {
                            tracing::error!(service = %service, error = %e, "the agent's own cluster refused a write (403): its identity lacks a permission of deploy/rbac/agent-local.yaml; not ready, retrying in {delay:?}");
                        }
                        forbidden.insert(key.clone(), e.to_string());
                    } else {
                        forbidden.remove(&key);
                        tracing::warn!(service = %service, error = %e, attempt = attempts, "reconcile failed; retrying in {delay:?}");
                    }
                    retry.insert(key, (Instant::now() + delay, attempts));
                }
            }
        }
        metrics
            .services
            .set(i64::try_from(merge.len()).unwrap_or(i64::MAX));
        metrics.reachable.set(
            i64::try_from(
                members
                    .iter()
                    .filter(|m| m.failing_since().is_none())
                    .count(),
            )
            .unwrap_or(0),
        );
        let reason = not_ready_reason(&members, local_index, &local, &forbidden, synced);
        report_health(&config.local, &ready, &health, reason);
        if let Some(id) = resync_pending.take() {
            // Every service dirty when the resync was requested was reconciled just now.
            resync.completed.send_replace(id);
        }
    }
    tasks.abort_all();
    Ok(())
}

fn spawn_watch<K, F>(
    tasks: &mut tokio::task::JoinSet<()>,
    tx: &mpsc::Sender<Msg>,
    member: usize,
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
        let stream = watcher::watcher(api, config).default_backoff();
        forward(stream, tx, member, kind, wrap).await;
    });
}

/// Watches ServiceExports at the version the member serves: `v1beta1`, or `v1alpha1` on a
/// member that has not upgraded its CRDs (identical schema, converted on the way in).
fn spawn_export_watch(
    tasks: &mut tokio::task::JoinSet<()>,
    tx: &mpsc::Sender<Msg>,
    member: usize,
    client: kube::Client,
) {
    let tx = tx.clone();
    tasks.spawn(async move {
        let alpha_only = match kube::discovery::group(&client, MCS_GROUP).await {
            // Versions are per resource: a member may serve ServiceImports at v1beta1 and
            // still serve ServiceExports at v1alpha1 only.
            Ok(group) => {
                let serves = |version: &str| {
                    group.versioned_resources(version).iter().any(|(r, _)| r.plural == "serviceexports")
                };
                !serves("v1beta1") && serves("v1alpha1")
            }
            // Unreachable or no MCS CRDs yet: watch v1beta1 and let the watch report errors.
            Err(_) => false,
        };
        if alpha_only {
            tracing::info!(member, "member serves only multicluster.x-k8s.io/v1alpha1; reading ServiceExports at v1alpha1");
            let stream = watcher::watcher(Api::<v1alpha1::ServiceExport>::all(client), watcher::Config::default()).default_backoff();
            forward(stream, tx, member, KIND_EXPORT, |e| Fact::Export(map_event(e, Into::into))).await;
        } else {
            let stream = watcher::watcher(Api::<ServiceExport>::all(client), watcher::Config::default()).default_backoff();
            forward(stream, tx, member, KIND_EXPORT, Fact::Export).await;
        }
    });
}

/// Lists one ServiceExport every `interval` and reports whether that worked.
fn spawn_probe(
    tasks: &mut tokio::task::JoinSet<()>,
    tx: &mpsc::Sender<Msg>,
    member: usize,
    client: kube::Client,
    interval: Duration,
) {
    let tx = tx.clone();
    tasks.spawn(async move {
        let api = Api::<ServiceExport>::all(client);
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
            if tx
                .send(Msg {
                    member,
                    fact: Fact::Probe(result),
                })
                .await
                .is_err()
            {
                return;
            }
        }
    });
}

fn map_event<A, B>(event: Event<A>, f: impl Fn(A) -> B) -> Event<B> {
    match event {
        Event::Apply(a) => Event::Apply(f(a)),
        Event::Delete(a) => Event::Delete(f(a)),
        Event::Init => Event::Init,
        Event::InitApply(a) => Event::InitApply(f(a)),
        Event::InitDone => Event::InitDone,
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

async fn forward<K, F>(
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    tx: mpsc::Sender<Msg>,
    member: usize,
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
                Fact::Error(kind, error, forbidden)
            }
        };
        if tx.send(Msg { member, fact }).await.is_err() {
            return;
        }
    }
}

fn handle(
    members: &mut [MemberState],
    local: &mut LocalState,
    msg: Msg,
    dirty: &mut BTreeSet<Key>,
) {
    let Some(m) = members.get_mut(msg.member) else {
        return;
    };
    let was_failing = m.failing_since().is_some();
    if let Some(kind) = msg.fact.kind() {
        m.watch_errors.remove(kind);
    }
    match &msg.fact {
        Fact::Error(kind, error, forbidden) => {
            let known = m.watch_errors.contains_key(kind);
            if *forbidden && !known {
                tracing::error!(cluster = %m.id, kind, error, "watch forbidden (403): the identity used for this cluster lacks a permission (deploy/rbac/agent-local.yaml in the agent's own cluster, agent-peer-reader.yaml in a peer)");
            }
            m.watch_errors.insert(kind, (error.clone(), *forbidden));
            if m.watch_failing_since.is_none() {
                if !forbidden {
                    tracing::warn!(cluster = %m.id, kind, error, "watch failing");
                }
                m.watch_failing_since = Some(Instant::now());
            }
            return;
        }
        Fact::Probe(Err(error)) => {
            if m.probe_failing_since.is_none() {
                tracing::warn!(cluster = %m.id, error, "health probe failing");
                m.probe_failing_since = Some(Instant::now());
            }
            return;
        }
        Fact::Probe(Ok(())) => m.probe_failing_since = None,
        _ => m.watch_failing_since = None,
    }
    if was_failing && m.failing_since().is_none() {
        tracing::info!(cluster = %m.id, "member reachable again");
        // Imports reconciled during the outage say the member is unreachable (Ready
        // message): reconcile its services again, or the note stays until the resync.
        dirty.extend(m.exports.services().cloned());
    }
    if m.removed && m.failing_since().is_none() {
        m.removed = false;
        dirty.extend(all_services(m));
    }
    let touched = match msg.fact {
        Fact::Export(e) => m.exports.handle(e),
        Fact::Service(e) => m.services.handle(e),
        Fact::Slice(e) => m.slices.handle(e),
        Fact::Namespace(e) => {
            let before: BTreeSet<Key> = local.namespaces.services().cloned().collect();
            local.namespaces.handle(e);
            let after: BTreeSet<Key> = local.namespaces.services().cloned().collect();
            // A namespace appearing or going touches every service in it.
            let changed: BTreeSet<String> = before
                .symmetric_difference(&after)
                .map(|k| k.1.clone())
                .collect();
            members
                .iter()
                .flat_map(all_services)
                .chain(local.imports.services().cloned())
                .filter(|k| changed.contains(&k.0))
                .collect()
        }
        Fact::Import(e) => local.imports.handle(e),
        Fact::Imported(e) => local.imported.handle(e),
        Fact::Error(..) | Fact::Probe(_) => BTreeSet::new(),
    };
    dirty.extend(touched);
}

/// A watch error in one line, and whether the API server refused the request (403).
fn describe_watch_error(e: &watcher::Error) -> (String, bool) {
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

/// Why the agent is not ready: its own cluster refused a write or a watch (403), or a
/// watch has not listed yet. A peer's failures do not count once synced: its endpoints
/// are kept for the grace period, then removed (and said so on the imports).
fn not_ready_reason(
    members: &[MemberState],
    local_index: usize,
    local: &LocalState,
    forbidden: &BTreeMap<Key, String>,
    synced: bool,
) -> Option<String> {
    let mut reasons = Vec::new();
    if let Some(((ns, name), error)) = forbidden.iter().next() {
        let more = match forbidden.len() - 1 {
            0 => String::new(),
            n => format!(" (and {n} more service(s))"),
        };
        reasons.push(format!(
            "its own cluster refuses a write for {ns}/{name}{more}: {error}"
        ));
    }
    let own = &members[local_index];
    for (kind, (error, _)) in own.watch_errors.iter().filter(|(_, (_, f))| *f) {
        reasons.push(format!(
            "its own cluster {} refuses to let it read {kind}: {error}",
            own.id
        ));
    }
    if !synced {
        let mut waiting = Vec::new();
        for (i, m) in members.iter().enumerate().filter(|(_, m)| !m.removed) {
            let mut kinds = vec![
                (KIND_EXPORT, m.exports.is_listed()),
                (KIND_SERVICE, m.services.is_listed()),
                (KIND_SLICE, m.slices.is_listed()),
            ];
            if i == local_index {
                kinds.extend([
                    (KIND_NAMESPACE, local.namespaces.is_listed()),
                    (KIND_IMPORT, local.imports.is_listed()),
                    (KIND_IMPORTED, local.imported.is_listed()),
                ]);
            }
            for (kind, _) in kinds.into_iter().filter(|(_, listed)| !listed) {
                match m.watch_errors.get(kind) {
                    // Already said above.
                    Some((_, true)) if i == local_index => {
                        waiting.push(format!("{kind} in {}", m.id))
                    }
                    Some((error, _)) => waiting.push(format!("{kind} in {} ({error})", m.id)),
                    None => waiting.push(format!("{kind} in {}", m.id)),
                }
            }
        }
        reasons.push(format!(
            "not synced: waiting for the first list of {}",
            waiting.join(", ")
        ));
    }
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

/// Publishes readiness and its reason; logs when either changes.
fn report_health(
    cluster: &ClusterId,
    ready: &AtomicBool,
    health: &AgentHealth,
    reason: Option<String>,
) {
    let now_ready = reason.is_none();
    let was_ready = ready.swap(now_ready, Ordering::AcqRel);
    let changed = health.set(reason.clone());
    match reason {
        None if !was_ready => {
            tracing::info!(cluster = %cluster, "agent synced and reconciled: ready")
        }
        Some(reason) if was_ready => tracing::error!(cluster = %cluster, reason, "agent not ready"),
        Some(reason) if changed => tracing::debug!(cluster = %cluster, reason, "agent not ready"),
        _ => {}
    }
}

/// Marks every service the agent knows of for reconciliation (a full resync).
fn mark_all_dirty(members: &[MemberState], local: &LocalState, dirty: &mut BTreeSet<Key>) {
    for m in members {
        dirty.extend(all_services(m));
    }
    dirty.extend(local.imports.services().cloned());
    dirty.extend(local.imported.services().cloned());
}

fn all_services(m: &MemberState) -> BTreeSet<Key> {
    m.exports
        .services()
        .chain(m.services.services())
        .chain(m.slices.services())
        .cloned()
        .collect()
}

/// Feeds the current constituents of one service into the merge state.
fn update_merge(
    merge: &mut ClusterSetState,
    members: &[MemberState],
    service: &ServiceRef,
    key: &Key,
    config: &AgentConfig,
) {
    for m in members {
        let export = m
            .exports
            .get(key)
            .filter(|_| !m.removed && config.namespace_allowed(&key.0));
        let constituent = export.and_then(|export| {
            let facts = match m.services.get(key).map(ServiceFacts::try_from) {
                None => None,
                Some(Ok(facts)) => Some(facts),
                Some(Err(e)) => {
                    tracing::warn!(cluster = %m.id, service = %service, error = %e, "exported Service cannot be merged");
                    return None;
                }
            };
            match Constituent::from_export(m.id.clone(), export, facts) {
                Ok(c) => Some(c),
                Err(e) => {
                    tracing::warn!(cluster = %m.id, service = %service, error = %e, "ServiceExport cannot be merged");
                    None
                }
            }
        });
        match constituent {
            Some(c) => {
                merge.upsert(service, c);
            }
            None => {
                merge.remove(service, &m.id);
            }
        }
    }
}

/// Everything the pure planner needs about one service.
fn inputs_for<'a>(
    members: &'a [MemberState],
    local: &'a LocalState,
    merge: &'a ClusterSetState,
    service: &ServiceRef,
    key: &Key,
    config: &'a AgentConfig,
    now: Instant,
) -> ServiceInputs<'a> {
    let local_member = members.iter().find(|m| m.id == config.local);
    let mut sources: HashMap<ClusterId, Vec<&'a EndpointSlice>> = HashMap::new();
    let mut unreachable = Vec::new();
    for m in members {
        if m.removed {
            if m.exports.get(key).is_some() {
                unreachable.push((m.id.clone(), true));
            }
            continue;
        }
        if m.failing_since().is_some() && m.exports.get(key).is_some() {
            unreachable.push((m.id.clone(), false));
        }
        sources.insert(m.id.clone(), m.slices.of_service(key).collect());
    }
    let local_export = local_member.and_then(|m| m.exports.get(key));
    let local_service_error = local_member.and_then(|m| {
        local_export?;
        match m.services.get(key).map(ServiceFacts::try_from) {
            Some(Err(e)) => Some(e.to_string()),
            _ => None,
        }
    });
    let derived = local_member
        .map(|m| {
            m.services
                .of_service(key)
                .filter(|s| is_ours(&s.metadata.labels))
                .collect::<Vec<_>>()
        })
        .unwrap_or_default();
    let namespace = local.namespaces.get(&(String::new(), key.0.clone()));
    ServiceInputs {
        service: service.clone(),
        local: config.local.clone(),
        namespace_exists: namespace.is_some(),
        namespace_terminating: namespace.is_some_and(is_terminating),
        namespace_allowed: config.namespace_allowed(&key.0),
        outcome: merge.outcome(service),
        sources,
        unreachable,
        grace: config.unreachable_grace,
        observed: Observed {
            import: local.imports.get(key),
            derived,
            imported: local.imported.of_service(key).collect(),
            export: local_export,
        },
        local_service_error,
        now_hint: now,
    }
}

/// Whether a namespace is being deleted (its content is being removed; the API server
/// refuses new objects in it).
fn is_terminating(namespace: &Namespace) -> bool {
    namespace.metadata.deletion_timestamp.is_some()
        || namespace
            .status
            .as_ref()
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Terminating")
}

fn is_ours(labels: &Option<BTreeMap<String, String>>) -> bool {
    labels
        .as_ref()
        .and_then(|l| l.get(LABEL_MANAGED_BY))
        .is_some_and(|v| v == MANAGED_BY)
}

/// A Service belongs to its own key, except the derived Services the agent writes, which
/// belong to the multi-cluster service they serve.
fn service_of_service(s: &Service) -> Option<Key> {
    let labels = &s.metadata.labels;
    if is_ours(labels)
        && let Some(name) = labels.as_ref().and_then(|l| l.get(LABEL_SERVICE_NAME))
    {
        return Some((
            s.metadata.namespace.clone().unwrap_or_default(),
            name.clone(),
        ));
    }
    Some(key_of(s))
}

fn service_of_slice(s: &EndpointSlice) -> Option<Key> {
    let name = s.metadata.labels.as_ref()?.get(LABEL_K8S_SERVICE_NAME)?;
    Some((
        s.metadata.namespace.clone().unwrap_or_default(),
        name.clone(),
    ))
}

fn service_of_mcs_slice(s: &EndpointSlice) -> Option<Key> {
    let name = s.metadata.labels.as_ref()?.get(LABEL_SERVICE_NAME)?;
    Some((
        s.metadata.namespace.clone().unwrap_or_default(),
        name.clone(),
    ))
}

fn namespace_key(n: &Namespace) -> Option<Key> {
    Some((String::new(), n.metadata.name.clone().unwrap_or_default()))
}
