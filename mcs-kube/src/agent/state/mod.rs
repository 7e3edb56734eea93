//! What the agent knows: every member's exports, Services and slices, its own cluster's
//! objects, member and hub health. Facts go in ([`State::handle`]) and come out as the
//! services they touched; the planner's inputs come out of [`State::inputs_for`]. No I/O.
//!
//! What each watch's events do is in `events`; whether the agent has listed everything it
//! needs, and what it still waits for, in `readiness`.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use mcs_core::ClusterId;
use mcs_core::api::{LABEL_SERVICE_NAME, v1beta1::ServiceExport, v1beta1::ServiceImport};
use mcs_core::merge::{ClusterSetState, Constituent, ServiceFacts, Stability};
use mcs_core::name::ServiceRef;

use super::desired::{LABEL_K8S_SERVICE_NAME, LABEL_MANAGED_BY, MANAGED_BY};
use super::health::{self, HubHealth, MemberHealth, Verdict};
use super::index::{Relist, Store, Touched, labelled_service, own_service};
use super::reconcile::{ClusterProperties, Observed, Publication, ServiceInputs};
use super::source::{Fact, KIND_PROPERTY, Origin};
use crate::hub::record::MemberExport;

mod events;
mod properties;
mod readiness;
#[cfg(test)]
mod tests;

/// How the agent learns of the other members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    /// It reads every member's API server.
    Mesh,
    /// It reads the hub, and its own cluster's exported services only.
    Hub,
}

/// Settings the state needs.
#[derive(Clone, Debug)]
pub(crate) struct Settings {
    pub(crate) local: ClusterId,
    pub(crate) mode: Mode,
    pub(crate) grace: Duration,
    pub(crate) allowed_namespaces: Option<Vec<String>>,
    /// Whether the members' ClusterProperties are watched and the imports' cluster
    /// selectors evaluated (KEP-5939).
    pub(crate) cluster_selection: bool,
}

impl Settings {
    pub(crate) fn namespace_allowed(&self, namespace: &str) -> bool {
        self.allowed_namespaces
            .as_ref()
            .is_none_or(|list| list.iter().any(|n| n == namespace))
    }
}

/// One member's exported state.
pub(crate) struct MemberState {
    pub(crate) exports: Store<ServiceExport>,
    pub(crate) services: Store<Service>,
    pub(crate) slices: Store<EndpointSlice>,
    pub(crate) health: MemberHealth,
    /// Its ClusterProperties (with cluster selection on).
    pub(crate) properties: properties::MemberProperties,
    /// Hub: records being listed (a re-list is applied at once when done).
    records_listing: Relist<MemberExport>,
    /// Hub: whether its Lease watch has listed.
    lease_listed: bool,
    /// Hub: whether the Lease watch's list in progress (or last one) showed its Lease.
    lease_in_list: bool,
}

impl MemberState {
    fn new() -> Self {
        Self {
            exports: Store::new(own_service),
            services: Store::new(service_of_service),
            slices: Store::new(service_of_slice),
            health: MemberHealth::default(),
            properties: properties::MemberProperties::default(),
            records_listing: Relist::default(),
            lease_listed: false,
            lease_in_list: false,
        }
    }

    fn all_services(&self) -> Touched {
        self.exports
            .services()
            .chain(self.services.services())
            .chain(self.slices.services())
            .cloned()
            .collect()
    }

    fn clear(&mut self) -> Touched {
        let mut touched = self.exports.clear();
        touched.extend(self.services.clear());
        touched.extend(self.slices.clear());
        touched
    }
}

/// The agent's own cluster: its Namespaces and what it writes there; in the hub topology
/// also its own records on the hub and the per-service lists still awaited.
pub(crate) struct LocalState {
    namespaces: BTreeMap<String, Namespace>,
    namespaces_listing: Relist<Namespace>,
    namespaces_listed: bool,
    pub(crate) imports: Store<ServiceImport>,
    pub(crate) imported: Store<EndpointSlice>,
    pub(crate) derived: Store<Service>,
    pub(crate) own_records: Store<MemberExport>,
    /// Per-service watches (hub) whose first list has arrived: (service, kind).
    listed: BTreeSet<(ServiceRef, &'static str)>,
    /// Per-service lists in progress (hub).
    service_listing: BTreeMap<ServiceRef, Relist<Service>>,
    slice_listing: BTreeMap<ServiceRef, Relist<EndpointSlice>>,
}

/// What a fact changed.
#[derive(Debug, Default)]
pub(crate) struct Changes {
    /// Services to reconcile.
    pub(crate) reconcile: Touched,
    /// Services whose hub record may need publishing (hub).
    pub(crate) publish: Touched,
    /// Member health may have changed: judge the members again.
    pub(crate) members: bool,
    /// Something on the hub that failed works again: retry what waits on it now.
    pub(crate) hub_answering: bool,
}

/// Everything the agent knows.
pub(crate) struct State {
    pub(crate) settings: Settings,
    pub(crate) members: BTreeMap<ClusterId, MemberState>,
    pub(crate) local: LocalState,
    pub(crate) merge: ClusterSetState,
    pub(crate) hub: HubHealth,
    /// Hub: whether the member namespaces have listed.
    members_listed: bool,
}

impl State {
    /// The state before any fact, for members `peers` known up front (mesh) and the local
    /// cluster.
    pub(crate) fn new(settings: Settings, peers: impl IntoIterator<Item = ClusterId>) -> Self {
        let mut members: BTreeMap<ClusterId, MemberState> = peers
            .into_iter()
            .map(|id| (id, MemberState::new()))
            .collect();
        let mut own = MemberState::new();
        if settings.mode == Mode::Hub {
            // Per-service watches fill these; their lists are awaited one by one.
            own.services.mark_listed();
            own.slices.mark_listed();
        }
        members.insert(settings.local.clone(), own);
        Self {
            members,
            local: LocalState {
                namespaces: BTreeMap::new(),
                namespaces_listing: Relist::default(),
                namespaces_listed: false,
                imports: Store::new(own_service),
                imported: Store::new(service_of_mcs_slice),
                derived: Store::new(service_of_mcs_slice_service),
                own_records: Store::new(MemberExport::service_ref),
                listed: BTreeSet::new(),
                service_listing: BTreeMap::new(),
                slice_listing: BTreeMap::new(),
            },
            merge: ClusterSetState::new(Stability::Sticky),
            hub: HubHealth::default(),
            members_listed: settings.mode == Mode::Mesh,
            settings,
        }
    }

    /// Applies one fact at `now`.
    pub(crate) fn handle(&mut self, fact: Fact, now: Instant) -> Changes {
        let mut changes = Changes::default();
        let local = self.settings.local.clone();
        let hub_mode = self.settings.mode == Mode::Hub;
        // Any event of a watch clears that watch's error.
        match fact.watch(&local) {
            Some((Origin::Hub, kind)) => self.hub_ok(kind, now, &mut changes),
            Some((Origin::Member(id), kind)) => self.member_watch_ok(&id, kind, &mut changes),
            None => {}
        }
        match fact {
            Fact::Export(id, e) => {
                let m = self
                    .members
                    .entry(id.clone())
                    .or_insert_with(MemberState::new);
                let touched = m.exports.handle(e);
                if hub_mode && id == local {
                    changes.publish.extend(touched.iter().cloned());
                }
                changes.reconcile.extend(touched);
            }
            Fact::Service(id, e) => {
                let m = self.members.entry(id).or_insert_with(MemberState::new);
                changes.reconcile.extend(m.services.handle(e));
            }
            Fact::Slice(id, e) => {
                let m = self.members.entry(id).or_insert_with(MemberState::new);
                changes.reconcile.extend(m.slices.handle(e));
            }
            Fact::Property(id, e) => {
                let m = self.members.entry(id).or_insert_with(MemberState::new);
                if m.properties.handle(e) {
                    changes.reconcile.extend(self.selecting_services());
                }
            }
            // A failing property watch leaves the member's health alone: the imports keep
            // their selector results until its properties are known again.
            Fact::WatchError(Origin::Member(id), KIND_PROPERTY, error, forbidden) => {
                let m = self
                    .members
                    .entry(id.clone())
                    .or_insert_with(MemberState::new);
                if m.properties.error().is_none() {
                    if forbidden {
                        tracing::error!(cluster = %id, error, "ClusterProperty watch forbidden (403): cluster selection needs list and watch on clusterproperties (deploy/rbac/agent-cluster-selection.yaml); selector results stay as they are");
                    } else {
                        tracing::warn!(cluster = %id, error, "ClusterProperty watch failing; selector results stay as they are");
                    }
                }
                m.properties.failed(error);
            }
            Fact::ServiceOf(service, e) => {
                let touched = self.service_event(&service, e);
                changes.publish.extend(touched.iter().cloned());
                changes.reconcile.extend(touched);
            }
            Fact::SlicesOf(service, e) => {
                let touched = self.slices_event(&service, e);
                changes.publish.extend(touched.iter().cloned());
                changes.reconcile.extend(touched);
            }
            Fact::Unwatched(service) => {
                let l = &mut self.local;
                l.listed.retain(|(s, _)| *s != service);
                l.service_listing.remove(&service);
                l.slice_listing.remove(&service);
                if let Some(m) = self.members.get_mut(&local) {
                    let mut touched = m.services.replace_service(&service, Vec::new());
                    touched.extend(m.slices.replace_service(&service, Vec::new()));
                    changes.publish.extend(touched.iter().cloned());
                    changes.reconcile.extend(touched);
                }
            }
            Fact::Namespace(e) => changes.reconcile.extend(self.namespace_event(e)),
            Fact::Import(e) => changes.reconcile.extend(self.local.imports.handle(e)),
            Fact::Imported(e) => changes.reconcile.extend(self.local.imported.handle(e)),
            Fact::Derived(e) => changes.reconcile.extend(self.local.derived.handle(e)),
            Fact::Members(e) => {
                changes.reconcile.extend(self.members_event(e));
                changes.members = true;
            }
            Fact::Record(id, e) => {
                if id != local {
                    changes.reconcile.extend(self.record_event(&id, e));
                }
            }
            Fact::OwnRecord(e) => {
                let touched = self.local.own_records.handle(e);
                changes.publish.extend(touched.iter().cloned());
                changes.reconcile.extend(touched);
            }
            Fact::Lease(id, e) => {
                if id != local {
                    self.lease_event(&id, e, now);
                    changes.members = true;
                }
            }
            Fact::WatchError(origin, kind, error, forbidden) => {
                let hub_was_down = self.hub.down();
                changes.members |= self.watch_error(origin, kind, error, forbidden, now);
                if !hub_was_down && self.hub.down() {
                    // Imports say so in their Ready condition.
                    changes.reconcile.extend(self.all_services());
                }
            }
            Fact::Probe(id, result) => {
                if let Some(m) = self.members.get_mut(&id) {
                    match result {
                        Err(error) => {
                            if m.health.probe_failing_since.is_none() {
                                tracing::warn!(cluster = %id, error, "health probe failing");
                                m.health.probe_failing_since = Some(now);
                                changes.members = true;
                            }
                        }
                        Ok(()) => {
                            if m.health.probe_failing_since.take().is_some() {
                                changes.members = true;
                                changes.reconcile.extend(m.exports.services().cloned());
                            }
                        }
                    }
                }
            }
            Fact::HubWrite(what, result) => match result {
                Err(error) => {
                    if !self.hub.down() {
                        tracing::warn!(what, error, "a write to the hub failed");
                        changes.reconcile.extend(self.all_services());
                        changes.members = true;
                    }
                    self.hub.fail(what, error, now);
                }
                Ok(()) => self.hub_ok(what, now, &mut changes),
            },
        }
        changes
    }

    /// A watch or write on the hub of this `kind` works (again) at `now`.
    fn hub_ok(&mut self, kind: &'static str, now: Instant, changes: &mut Changes) {
        let Some(whole) = self.hub.recover(kind) else {
            return;
        };
        changes.hub_answering = true;
        if !whole {
            return;
        }
        tracing::info!("hub reachable again");
        // No renewal could be seen while the hub was down, and the Lease watch may not have
        // listed again yet: each member's Lease counts from now, as if just renewed, so that
        // none is removed for a renewal the watch has not shown yet (the node lifecycle
        // controller does the same with node Leases after a disruption).
        for m in self.members.values_mut() {
            if let Some(lease) = &mut m.health.lease {
                lease.seen_at = now;
            }
        }
        changes.reconcile.extend(self.all_services());
        changes.members = true;
    }

    /// A watch of member `id`'s of this `kind` works (again).
    fn member_watch_ok(&mut self, id: &ClusterId, kind: &'static str, changes: &mut Changes) {
        let local = &self.settings.local;
        let Some(m) = self.members.get_mut(id) else {
            return;
        };
        if m.health.watch_errors.remove(kind).is_none() {
            return;
        }
        if m.health.watch_errors.is_empty() && m.health.watch_failing_since.is_some() {
            m.health.watch_failing_since = None;
            changes.members = true;
            if id != local {
                tracing::info!(cluster = %id, "member reachable again");
                // Imports reconciled during the outage say the member is unreachable:
                // reconcile its services again.
                changes.reconcile.extend(m.exports.services().cloned());
            }
        }
    }

    /// Judges every member at `now`: removes the endpoints of those failing for longer than
    /// the grace period, restores those that recovered. Returns the services to reconcile
    /// and when to judge again.
    pub(crate) fn judge_members(&mut self, now: Instant) -> (Touched, Option<Instant>) {
        let grace = self.settings.grace;
        let hub_down = self.hub.down();
        let mut touched = Touched::new();
        let mut next: Option<Instant> = None;
        for (id, m) in self.members.iter_mut() {
            if *id == self.settings.local {
                continue;
            }
            match health::judge(&m.health, now, grace, hub_down) {
                Verdict::Remove => {
                    tracing::warn!(cluster = %id, "member failing for longer than the grace period; removing its endpoints");
                    m.health.removed = true;
                    touched.extend(m.all_services());
                }
                Verdict::Restore => {
                    tracing::info!(cluster = %id, "member healthy again; its endpoints are back");
                    m.health.removed = false;
                    touched.extend(m.all_services());
                }
                Verdict::Keep => {}
            }
            if let Some(at) = health::next_check(&m.health, now, grace, hub_down) {
                next = Some(next.map_or(at, |n| n.min(at)));
            }
        }
        (touched, next)
    }

    /// Members whose watches or probe are healthy (and, in the hub topology, whose Lease is
    /// current).
    pub(crate) fn reachable_members(&self, now: Instant) -> usize {
        let hub_down = self.hub.down();
        self.members
            .values()
            .filter(|m| m.health.failing_since(now, hub_down).is_none())
            .count()
    }

    /// Every member present now and whether it is reachable at `now` (the local cluster
    /// included).
    pub(crate) fn member_reachability(&self, now: Instant) -> BTreeMap<ClusterId, bool> {
        let hub_down = self.hub.down();
        self.members
            .iter()
            .map(|(id, m)| (id.clone(), m.health.failing_since(now, hub_down).is_none()))
            .collect()
    }

    /// Every service the agent knows of.
    pub(crate) fn all_services(&self) -> Touched {
        let mut all: Touched = self
            .members
            .values()
            .flat_map(MemberState::all_services)
            .collect();
        let l = &self.local;
        all.extend(l.imports.services().cloned());
        all.extend(l.imported.services().cloned());
        all.extend(l.derived.services().cloned());
        all.extend(l.own_records.services().cloned());
        all
    }

    /// Services the agent's own cluster exports or has a record of on the hub.
    pub(crate) fn own_exported(&self) -> Touched {
        let mut all: Touched = self
            .members
            .get(&self.settings.local)
            .map(|m| m.exports.services().cloned().collect())
            .unwrap_or_default();
        all.extend(self.local.own_records.services().cloned());
        all
    }

    /// Services whose import has cluster selectors (KEP-5939): those to reconcile when a
    /// member's properties change.
    fn selecting_services(&self) -> Touched {
        self.merge
            .services()
            .filter(|s| {
                self.merge
                    .import(s)
                    .and_then(|i| i.spec.cluster_selectors.as_ref())
                    .is_some_and(|list| !list.is_empty())
            })
            .cloned()
            .collect()
    }

    /// The properties the planner evaluates `service`'s cluster selectors with: this
    /// cluster's and every member's whose properties are known. `None` when cluster
    /// selection is off, the import has no selectors or this cluster's are not known.
    fn properties_for(&self, service: &ServiceRef) -> Option<ClusterProperties<'_>> {
        if !self.settings.cluster_selection {
            return None;
        }
        let selectors = self
            .merge
            .import(service)?
            .spec
            .cluster_selectors
            .as_ref()?;
        if selectors.is_empty() {
            return None;
        }
        let local = self.members.get(&self.settings.local)?.properties.known()?;
        let members = self
            .members
            .iter()
            .filter_map(|(id, m)| Some((id.clone(), m.properties.known()?)))
            .collect();
        Some(ClusterProperties { local, members })
    }

    /// Feeds the current constituents of one service into the merge.
    pub(crate) fn update_merge(&mut self, service: &ServiceRef) {
        let allowed = self.settings.namespace_allowed(service.namespace.as_str());
        for (id, m) in &self.members {
            let export = m
                .exports
                .named(service)
                .filter(|_| !m.health.removed && allowed);
            let constituent = export.and_then(|export| {
                let facts = match m.services.named(service).map(ServiceFacts::try_from) {
                    None => None,
                    Some(Ok(facts)) => Some(facts),
                    Some(Err(e)) => {
                        tracing::warn!(cluster = %id, service = %service, error = %e, "exported Service cannot be merged");
                        return None;
                    }
                };
                match Constituent::from_export(id.clone(), export, facts) {
                    Ok(c) => Some(c),
                    Err(e) => {
                        tracing::warn!(cluster = %id, service = %service, error = %e, "ServiceExport cannot be merged");
                        None
                    }
                }
            });
            match constituent {
                Some(c) => {
                    self.merge.upsert(service, c);
                }
                None => {
                    self.merge.remove(service, id);
                }
            }
        }
    }

    /// Everything the planner needs about one service.
    pub(crate) fn inputs_for(&self, service: &ServiceRef, now: Instant) -> ServiceInputs<'_> {
        let local = &self.settings.local;
        let local_member = self.members.get(local);
        let hub_down = self.hub.down();
        let mut sources: HashMap<ClusterId, Vec<&EndpointSlice>> = HashMap::new();
        let mut unreachable = Vec::new();
        for (id, m) in &self.members {
            let exports = m.exports.named(service).is_some();
            if m.health.removed {
                if exports {
                    unreachable.push((id.clone(), true));
                }
                continue;
            }
            if id != local && exports && m.health.failing_since(now, hub_down).is_some() {
                unreachable.push((id.clone(), false));
            }
            sources.insert(id.clone(), m.slices.of_service(service).collect());
        }
        let local_export = local_member.and_then(|m| m.exports.named(service));
        let local_service_error = local_member.and_then(|m| {
            local_export?;
            match m.services.named(service).map(ServiceFacts::try_from) {
                Some(Err(e)) => Some(e.to_string()),
                _ => None,
            }
        });
        let namespace = self.local.namespaces.get(service.namespace.as_str());
        let publication = match self.settings.mode {
            Mode::Mesh => Publication::Direct,
            Mode::Hub => match (self.desired_record(service), self.published(service)) {
                (Some(want), Some(have)) if have.says_the_same_as(&want) => Publication::Published,
                _ if hub_down => Publication::HubUnreachable,
                _ => Publication::Pending,
            },
        };
        ServiceInputs {
            service: service.clone(),
            local: local.clone(),
            namespace_exists: namespace.is_some(),
            namespace_terminating: namespace.is_some_and(is_terminating),
            namespace_allowed: self.settings.namespace_allowed(service.namespace.as_str()),
            outcome: self.merge.outcome(service),
            sources,
            unreachable,
            hub_unreachable: self.settings.mode == Mode::Hub && hub_down,
            grace: self.settings.grace,
            observed: Observed {
                import: self.local.imports.named(service),
                derived: self.local.derived.of_service(service).collect(),
                imported: self.local.imported.of_service(service).collect(),
                export: local_export,
            },
            local_service_error,
            publication,
            properties: self.properties_for(service),
        }
    }

    /// The record the agent should have on the hub for `service` (hub): what its cluster
    /// exports of it, or `None` when it does not export it.
    pub(crate) fn desired_record(&self, service: &ServiceRef) -> Option<MemberExport> {
        if !self.settings.namespace_allowed(service.namespace.as_str()) {
            return None;
        }
        let m = self.members.get(&self.settings.local)?;
        let export = m.exports.named(service)?;
        let slices: Vec<&EndpointSlice> = m.slices.of_service(service).collect();
        MemberExport::from_member(
            &self.settings.local,
            export,
            m.services.named(service),
            &slices,
        )
    }

    /// The agent's record of `service` on the hub, as last seen.
    pub(crate) fn published(&self, service: &ServiceRef) -> Option<&MemberExport> {
        self.local.own_records.of_service(service).next()
    }
}

/// Whether a namespace is being deleted (its content is being removed; the API server
/// refuses new objects in it).
pub(crate) fn is_terminating(namespace: &Namespace) -> bool {
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

/// A member's Service belongs to its own key; the derived Services the agent writes are
/// watched on their own.
fn service_of_service(s: &Service) -> Option<ServiceRef> {
    if is_ours(&s.metadata.labels) {
        return None;
    }
    own_service(s)
}

fn service_of_slice(s: &EndpointSlice) -> Option<ServiceRef> {
    labelled_service(s, LABEL_K8S_SERVICE_NAME)
}

fn service_of_mcs_slice(s: &EndpointSlice) -> Option<ServiceRef> {
    labelled_service(s, LABEL_SERVICE_NAME)
}

fn service_of_mcs_slice_service(s: &Service) -> Option<ServiceRef> {
    labelled_service(s, LABEL_SERVICE_NAME)
}
