//! What the agent knows: every member's exports, Services and slices, its own cluster's
//! objects, member and hub health. Facts go in ([`State::handle`]) and come out as the
//! services they touched; the planner's inputs come out of [`State::inputs_for`]. No I/O.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use mcs_core::ClusterId;
use mcs_core::api::{LABEL_SERVICE_NAME, v1beta1::ServiceExport, v1beta1::ServiceImport};
use mcs_core::merge::{ClusterSetState, Constituent, ServiceFacts, Stability};
use mcs_core::name::ServiceRef;

use super::desired::{LABEL_K8S_SERVICE_NAME, LABEL_MANAGED_BY, MANAGED_BY};
use super::health::{self, HubHealth, LeaseSeen, MemberHealth, NotReady, Verdict};
use super::index::{Store, Touched, key_of, labelled_service, own_service};
use super::reconcile::{Observed, Publication, ServiceInputs};
use super::source::{
    Fact, KIND_DERIVED, KIND_EXPORT, KIND_IMPORT, KIND_IMPORTED, KIND_LEASE, KIND_MEMBERS,
    KIND_NAMESPACE, KIND_OWN_RECORD, KIND_RECORD, KIND_SERVICE, KIND_SLICE, Origin,
};
use crate::hub::record::MemberExport;

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
    /// Hub: records being listed (a re-list is applied at once when done).
    records_listing: Vec<MemberExport>,
    /// Hub: whether its Lease watch has listed.
    lease_listed: bool,
}

impl MemberState {
    fn new() -> Self {
        Self {
            exports: Store::new(own_service),
            services: Store::new(service_of_service),
            slices: Store::new(service_of_slice),
            health: MemberHealth::default(),
            records_listing: Vec::new(),
            lease_listed: false,
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
    namespaces_listing: Vec<Namespace>,
    namespaces_listed: bool,
    pub(crate) imports: Store<ServiceImport>,
    pub(crate) imported: Store<EndpointSlice>,
    pub(crate) derived: Store<Service>,
    pub(crate) own_records: Store<MemberExport>,
    /// Per-service watches (hub) whose first list has arrived: (service, kind).
    listed: BTreeSet<(ServiceRef, &'static str)>,
    /// Per-service lists in progress (hub).
    service_listing: BTreeMap<ServiceRef, Vec<Service>>,
    slice_listing: BTreeMap<ServiceRef, Vec<EndpointSlice>>,
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
                namespaces_listing: Vec::new(),
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
            Some((Origin::Hub, kind)) => {
                if let Some(whole) = self.hub.recover(kind) {
                    changes.hub_answering = true;
                    if whole {
                        tracing::info!("hub reachable again");
                        changes.reconcile.extend(self.all_services());
                        changes.members = true;
                    }
                }
            }
            Some((Origin::Member(id), kind)) => self.member_watch_ok(&id, kind, &mut changes),
            None => {}
        }
        // A member's watches on the hub: a refusal (403) of them was the member's (see
        // `source::hub`), so an event also clears that.
        match &fact {
            Fact::Record(id, _) => self.member_watch_ok(id, KIND_RECORD, &mut changes),
            Fact::Lease(id, _) => self.member_watch_ok(id, KIND_LEASE, &mut changes),
            _ => {}
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
                Ok(()) => {
                    if let Some(whole) = self.hub.recover(what) {
                        changes.hub_answering = true;
                        if whole {
                            tracing::info!("hub reachable again");
                            changes.reconcile.extend(self.all_services());
                            changes.members = true;
                        }
                    }
                }
            },
        }
        changes
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

    /// Whether every watch has listed, so plans see the whole picture.
    pub(crate) fn synced(&self) -> bool {
        let l = &self.local;
        let own = l.namespaces_listed
            && l.imports.is_listed()
            && l.imported.is_listed()
            && l.derived.is_listed();
        let members = self.members.iter().all(|(id, m)| {
            m.health.removed
                || match self.settings.mode {
                    Mode::Mesh => {
                        m.exports.is_listed() && m.services.is_listed() && m.slices.is_listed()
                    }
                    Mode::Hub if *id == self.settings.local => {
                        m.exports.is_listed() && self.awaited().is_empty()
                    }
                    // A member whose namespace the hub refuses to show (its reader
                    // RoleBinding is missing) holds nobody back: it has no records here,
                    // and it is removed after the grace period like any failing member.
                    Mode::Hub => {
                        (m.exports.is_listed() && m.lease_listed)
                            || m.health
                                .watch_errors
                                .values()
                                .any(|(_, forbidden)| *forbidden)
                    }
                }
        });
        let hub = match self.settings.mode {
            Mode::Mesh => true,
            Mode::Hub => self.members_listed && l.own_records.is_listed(),
        };
        own && members && hub
    }

    /// Why the agent is not ready, given the writes its cluster refused.
    pub(crate) fn not_ready_reason(
        &self,
        forbidden: &BTreeMap<ServiceRef, String>,
        now: Instant,
        started: Instant,
    ) -> Option<String> {
        let local = &self.settings.local;
        let own = self.members.get(local);
        let forbidden_watches = own
            .map(|m| {
                m.health
                    .watch_errors
                    .iter()
                    .filter(|(_, (_, f))| *f)
                    .map(|(kind, (error, _))| (*kind, error.as_str()))
                    .collect()
            })
            .unwrap_or_default();
        let waiting = if self.synced() {
            Vec::new()
        } else {
            self.waiting(now)
        };
        health::not_ready_reason(&NotReady {
            forbidden_writes: (!forbidden.is_empty()).then_some(forbidden),
            forbidden_watches,
            cluster: local.as_str(),
            waiting,
            unsynced_for: now.saturating_duration_since(started),
            hub_errors: self.hub.down().then_some(&self.hub.errors),
        })
    }

    /// The first lists still awaited, described: which member, which kind, the last error
    /// and since when its watches fail.
    fn waiting(&self, now: Instant) -> Vec<String> {
        let local = &self.settings.local;
        let l = &self.local;
        let mut waiting = Vec::new();
        let add = |waiting: &mut Vec<String>,
                   kind: &'static str,
                   listed: bool,
                   m: Option<&MemberState>,
                   where_: &str| {
            if listed {
                return;
            }
            let since = m
                .and_then(|m| m.health.watch_failing_since)
                .map(|t| health::for_human(now.saturating_duration_since(t)));
            match (m.and_then(|m| m.health.watch_errors.get(kind)), since) {
                // Refused: said elsewhere.
                (Some((_, true)) | None, _) => waiting.push(format!("{kind} in {where_}")),
                (Some((error, _)), Some(since)) => {
                    waiting.push(format!("{kind} in {where_} ({error}, failing for {since})"))
                }
                (Some((error, _)), None) => waiting.push(format!("{kind} in {where_} ({error})")),
            }
        };
        let own = self.members.get(local);
        add(
            &mut waiting,
            KIND_NAMESPACE,
            l.namespaces_listed,
            own,
            local.as_str(),
        );
        add(
            &mut waiting,
            KIND_IMPORT,
            l.imports.is_listed(),
            own,
            local.as_str(),
        );
        add(
            &mut waiting,
            KIND_IMPORTED,
            l.imported.is_listed(),
            own,
            local.as_str(),
        );
        add(
            &mut waiting,
            KIND_DERIVED,
            l.derived.is_listed(),
            own,
            local.as_str(),
        );
        for (id, m) in self.members.iter().filter(|(_, m)| !m.health.removed) {
            match self.settings.mode {
                Mode::Mesh => {
                    add(
                        &mut waiting,
                        KIND_EXPORT,
                        m.exports.is_listed(),
                        Some(m),
                        id.as_str(),
                    );
                    add(
                        &mut waiting,
                        KIND_SERVICE,
                        m.services.is_listed(),
                        Some(m),
                        id.as_str(),
                    );
                    add(
                        &mut waiting,
                        KIND_SLICE,
                        m.slices.is_listed(),
                        Some(m),
                        id.as_str(),
                    );
                }
                Mode::Hub if id == local => {
                    add(
                        &mut waiting,
                        KIND_EXPORT,
                        m.exports.is_listed(),
                        Some(m),
                        id.as_str(),
                    );
                    for (service, kind) in self.awaited() {
                        waiting.push(format!("{kind} of {service} in {id}"));
                    }
                }
                Mode::Hub => {
                    let hub_error = |kind| {
                        self.hub
                            .errors
                            .get(kind)
                            .map_or(String::new(), |e| format!(" ({e})"))
                    };
                    if !m.exports.is_listed() {
                        waiting.push(format!("{KIND_RECORD} of {id}{}", hub_error(KIND_RECORD)));
                    }
                    if !m.lease_listed {
                        waiting.push(format!("{KIND_LEASE} of {id}{}", hub_error(KIND_LEASE)));
                    }
                }
            }
        }
        if self.settings.mode == Mode::Hub {
            if !self.members_listed {
                waiting.push(KIND_MEMBERS.to_owned());
            }
            if !l.own_records.is_listed() {
                waiting.push(KIND_OWN_RECORD.to_owned());
            }
        }
        waiting
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

    /// Whether the agent's own cluster is fully listed (exports and every per-service
    /// watch), so that a record missing from it is really unexported.
    pub(crate) fn own_exports_synced(&self) -> bool {
        self.members
            .get(&self.settings.local)
            .is_some_and(|m| m.exports.is_listed())
            && self.awaited().is_empty()
            && self.local.own_records.is_listed()
    }

    /// The per-service lists (hub) of exported services that have not arrived yet.
    fn awaited(&self) -> Vec<(ServiceRef, &'static str)> {
        if self.settings.mode != Mode::Hub {
            return Vec::new();
        }
        let Some(m) = self.members.get(&self.settings.local) else {
            return Vec::new();
        };
        m.exports
            .services()
            .flat_map(|s| [(s.clone(), KIND_SERVICE), (s.clone(), KIND_SLICE)])
            .filter(|k| !self.local.listed.contains(k))
            .collect()
    }

    fn service_event(&mut self, service: &ServiceRef, e: Event<Service>) -> Touched {
        let local = self.settings.local.clone();
        let l = &mut self.local;
        let Some(m) = self.members.get_mut(&local) else {
            return Touched::new();
        };
        match e {
            Event::Apply(s) => m.services.apply(s),
            Event::Delete(s) => m.services.delete(&key_of(&s)),
            Event::Init => {
                l.service_listing.insert(service.clone(), Vec::new());
                Touched::new()
            }
            Event::InitApply(s) => {
                l.service_listing
                    .entry(service.clone())
                    .or_default()
                    .push(s);
                Touched::new()
            }
            Event::InitDone => {
                let list = l.service_listing.remove(service).unwrap_or_default();
                l.listed.insert((service.clone(), KIND_SERVICE));
                m.services.replace_service(service, list)
            }
        }
    }

    fn slices_event(&mut self, service: &ServiceRef, e: Event<EndpointSlice>) -> Touched {
        let local = self.settings.local.clone();
        let l = &mut self.local;
        let Some(m) = self.members.get_mut(&local) else {
            return Touched::new();
        };
        match e {
            Event::Apply(s) => m.slices.apply(s),
            Event::Delete(s) => m.slices.delete(&key_of(&s)),
            Event::Init => {
                l.slice_listing.insert(service.clone(), Vec::new());
                Touched::new()
            }
            Event::InitApply(s) => {
                l.slice_listing.entry(service.clone()).or_default().push(s);
                Touched::new()
            }
            Event::InitDone => {
                let list = l.slice_listing.remove(service).unwrap_or_default();
                l.listed.insert((service.clone(), KIND_SLICE));
                m.slices.replace_service(service, list)
            }
        }
    }

    fn namespace_event(&mut self, e: Event<Namespace>) -> Touched {
        let l = &mut self.local;
        let before: BTreeMap<String, bool> = l
            .namespaces
            .iter()
            .map(|(n, ns)| (n.clone(), is_terminating(ns)))
            .collect();
        match e {
            Event::Apply(ns) => {
                if let Some(name) = ns.metadata.name.clone() {
                    l.namespaces.insert(name, ns);
                }
            }
            Event::Delete(ns) => {
                if let Some(name) = &ns.metadata.name {
                    l.namespaces.remove(name);
                }
            }
            Event::Init => l.namespaces_listing.clear(),
            Event::InitApply(ns) => l.namespaces_listing.push(ns),
            Event::InitDone => {
                l.namespaces = std::mem::take(&mut l.namespaces_listing)
                    .into_iter()
                    .filter_map(|ns| Some((ns.metadata.name.clone()?, ns)))
                    .collect();
                l.namespaces_listed = true;
            }
        }
        let after: BTreeMap<String, bool> = l
            .namespaces
            .iter()
            .map(|(n, ns)| (n.clone(), is_terminating(ns)))
            .collect();
        // A namespace appearing, going or starting to terminate touches every service in it.
        let changed: BTreeSet<&String> = before
            .keys()
            .chain(after.keys())
            .filter(|n| before.get(*n) != after.get(*n))
            .collect();
        if changed.is_empty() {
            return Touched::new();
        }
        self.all_services()
            .into_iter()
            .filter(|s| changed.contains(&s.namespace.as_str().to_owned()))
            .collect()
    }

    fn members_event(&mut self, e: Event<Namespace>) -> Touched {
        let local = self.settings.local.clone();
        let member = |ns: &Namespace| super::source::hub::member_of(ns);
        let mut touched = Touched::new();
        match e {
            Event::Apply(ns) | Event::InitApply(ns) => {
                if let Some(id) = member(&ns).filter(|id| *id != local) {
                    self.members.entry(id).or_insert_with(MemberState::new);
                }
            }
            Event::Delete(ns) => {
                if let Some(id) = member(&ns).filter(|id| *id != local)
                    && let Some(mut m) = self.members.remove(&id)
                {
                    tracing::info!(cluster = %id, "member left the hub");
                    touched.extend(m.clear());
                }
            }
            Event::Init => {}
            Event::InitDone => {
                self.members_listed = true;
            }
        }
        touched
    }

    fn record_event(&mut self, id: &ClusterId, e: Event<MemberExport>) -> Touched {
        let m = self
            .members
            .entry(id.clone())
            .or_insert_with(MemberState::new);
        let mut touched = Touched::new();
        match e {
            Event::Apply(record) => {
                if let Some(service) = record.service_ref() {
                    touched.extend(apply_record(m, &service, Some(&record)));
                }
            }
            Event::Delete(record) => {
                if let Some(service) = record.service_ref() {
                    touched.extend(apply_record(m, &service, None));
                }
            }
            Event::Init => m.records_listing.clear(),
            Event::InitApply(record) => m.records_listing.push(record),
            Event::InitDone => {
                // One atomic reset of all three stores.
                let (mut exports, mut services, mut slices) = (Vec::new(), Vec::new(), Vec::new());
                for record in std::mem::take(&mut m.records_listing) {
                    let (e, s, sl) = record.to_objects();
                    exports.push(e);
                    services.extend(s);
                    slices.extend(sl);
                }
                touched.extend(m.exports.reset(exports));
                touched.extend(m.services.reset(services));
                touched.extend(m.slices.reset(slices));
            }
        }
        touched
    }

    fn lease_event(
        &mut self,
        id: &ClusterId,
        e: Event<k8s_openapi::api::coordination::v1::Lease>,
        now: Instant,
    ) {
        let m = self
            .members
            .entry(id.clone())
            .or_insert_with(MemberState::new);
        let seen = |lease: &k8s_openapi::api::coordination::v1::Lease,
                    previous: Option<&LeaseSeen>| {
            let spec = lease.spec.as_ref();
            let renew = spec
                .and_then(|s| s.renew_time.as_ref())
                .map(|t| t.0.to_string());
            let duration = spec
                .and_then(|s| s.lease_duration_seconds)
                .map_or(Duration::from_secs(40), |s| {
                    Duration::from_secs(s.max(1) as u64)
                });
            LeaseSeen::update(previous, renew, duration, now)
        };
        match e {
            Event::Apply(lease) | Event::InitApply(lease) => {
                m.health.lease = Some(seen(&lease, m.health.lease.as_ref()));
            }
            // A deleted Lease is an expired one.
            Event::Delete(_) => {
                m.health.lease = Some(LeaseSeen {
                    renew_time: None,
                    seen_at: now,
                    duration: Duration::ZERO,
                });
            }
            Event::Init => {}
            Event::InitDone => {
                m.lease_listed = true;
                // A member that never wrote a Lease counts from now.
                m.health.lease.get_or_insert(LeaseSeen {
                    renew_time: None,
                    seen_at: now,
                    duration: Duration::from_secs(40),
                });
            }
        }
    }

    /// Records a watch error; returns whether member health may have changed.
    fn watch_error(
        &mut self,
        origin: Origin,
        kind: &'static str,
        error: String,
        forbidden: bool,
        now: Instant,
    ) -> bool {
        match origin {
            Origin::Hub => {
                if !self.hub.errors.contains_key(kind) {
                    if forbidden {
                        tracing::error!(
                            kind,
                            error,
                            "the hub refuses a watch (403): the agent's hub identity lacks a permission of deploy/rbac/hub-member.yaml"
                        );
                    } else {
                        tracing::warn!(kind, error, "hub watch failing");
                    }
                }
                let was_down = self.hub.down();
                self.hub.fail(kind, error, now);
                !was_down
            }
            Origin::Member(id) => {
                let hub_mode = self.settings.mode == Mode::Hub;
                let m = match self.members.get_mut(&id) {
                    Some(m) => m,
                    // Hub: a member's namespace the hub refuses to show, before any record.
                    None if hub_mode => self
                        .members
                        .entry(id.clone())
                        .or_insert_with(MemberState::new),
                    None => return false,
                };
                let known = m.health.watch_errors.contains_key(kind);
                if forbidden && !known {
                    if hub_mode {
                        tracing::warn!(cluster = %id, kind, error, "the hub refuses to show this member's namespace (403): its reader RoleBinding (deploy/rbac/hub-member.yaml) is missing, or not applied yet; the member counts as failing until it is");
                    } else {
                        tracing::error!(cluster = %id, kind, error, "watch forbidden (403): the identity used for this cluster lacks a permission (deploy/rbac/agent-local.yaml in the agent's own cluster, agent-peer-reader.yaml in a peer)");
                    }
                }
                m.health
                    .watch_errors
                    .insert(kind, (error.clone(), forbidden));
                if m.health.watch_failing_since.is_none() {
                    if !forbidden {
                        tracing::warn!(cluster = %id, kind, error, "watch failing");
                    }
                    m.health.watch_failing_since = Some(now);
                    return true;
                }
                false
            }
        }
    }
}

/// Replaces what a member's record says of one service (`None`: the record is gone).
fn apply_record(
    m: &mut MemberState,
    service: &ServiceRef,
    record: Option<&MemberExport>,
) -> Touched {
    let key = (
        service.namespace.as_str().to_owned(),
        service.name.as_str().to_owned(),
    );
    let mut touched = Touched::new();
    match record.map(MemberExport::to_objects) {
        Some((export, svc, slices)) => {
            touched.extend(m.exports.apply(export));
            touched.extend(match svc {
                Some(svc) => m.services.apply(svc),
                None => m.services.delete(&key),
            });
            touched.extend(m.slices.replace_service(service, slices));
        }
        None => {
            touched.extend(m.exports.delete(&key));
            touched.extend(m.services.delete(&key));
            touched.extend(m.slices.replace_service(service, Vec::new()));
        }
    }
    touched
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
