//! [`ClusterSetState`]: every service of the ClusterSet, merged incrementally.

use std::collections::{BTreeMap, BTreeSet};
use std::sync::Arc;

use crate::ClusterId;
use crate::conditions::{ConflictReasons, ValidReason};
use crate::name::ServiceRef;

use super::engine::{
    ConditionWriter, ExportConditions, MergeOutcome, MergedImport, Resolution, Stability,
    export_conditions, resolve,
};
use super::input::Constituent;

/// What an upserted export's own conditions depended on before the upsert.
struct Before {
    validity: ValidReason,
    /// Its conditions, when it was invalid.
    invalid: Option<ExportConditions>,
}

/// The merged state of every exported service in a ClusterSet.
///
/// An index keyed by service (`<namespace>/<name>`) and, within a service, by cluster. Each
/// update touches one constituent (one cluster's export of one service), re-merges that one
/// service and reports what changed as a [`Change`]. The cost of an update is proportional
/// to the size of the service it touches (its exports and ports) plus a logarithmic lookup,
/// never to the number of services. [`remove_cluster`](Self::remove_cluster) costs that
/// much per service the cluster exports.
///
/// Determinism: under [`Stability::Fresh`] the state depends only on the current set of
/// constituents, whatever the order of the updates that built it. Under
/// [`Stability::Sticky`] (the default) that holds for any order of upserts in which no
/// winning export goes away; once a winner goes away the kept import is, by design, the
/// result of history, until [`refresh`](Self::refresh). Applying the same update twice
/// changes nothing the second time. Nothing here reads a clock or a random source: maps are
/// ordered, not hashed.
///
/// ```
/// use k8s_openapi::jiff::Timestamp;
/// use mcs_core::api::ServicePort;
/// use mcs_core::merge::{ClusterSetState, Constituent, ImportChange, ServiceFacts, ServiceKind, Stability};
/// use mcs_core::name::ServiceRef;
///
/// let svc = ServiceRef::new("demo", "hello").unwrap();
/// let facts = ServiceFacts::builder(ServiceKind::ClusterSetIp)
///     .port(ServicePort { name: Some("tcp".into()), port: 42, ..Default::default() })
///     .build()
///     .unwrap();
/// let at = Timestamp::from_second(1_700_000_000).unwrap();
/// let mut state = ClusterSetState::new(Stability::Sticky);
///
/// let change = state.upsert(&svc, Constituent::new("east".parse().unwrap(), at, Some(facts.clone())));
/// assert!(matches!(change.import, ImportChange::Created(_)));
/// assert_eq!(change.conditions.len(), 1);
///
/// let again = state.upsert(&svc, Constituent::new("east".parse().unwrap(), at, Some(facts)));
/// assert!(again.is_empty());
///
/// let gone = state.remove(&svc, &"east".parse().unwrap());
/// assert_eq!(gone.import, ImportChange::Deleted);
/// assert!(state.is_empty());
/// ```
#[derive(Clone, Debug, Default)]
pub struct ClusterSetState {
    stability: Stability,
    services: BTreeMap<Arc<ServiceRef>, Entry>,
    by_cluster: BTreeMap<ClusterId, BTreeSet<Arc<ServiceRef>>>,
}

/// What one update changed for one service.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct Change {
    /// The service.
    pub service: ServiceRef,
    /// What happened to its ServiceImport.
    pub import: ImportChange,
    /// The exports whose desired conditions are new or changed, sorted by cluster, with
    /// those conditions. A removed export is not listed: it has no conditions to write.
    pub conditions: Vec<(ClusterId, ExportConditions)>,
}

impl Change {
    /// Whether nothing changed.
    pub fn is_empty(&self) -> bool {
        self.import == ImportChange::Unchanged && self.conditions.is_empty()
    }

    /// No change to `service`.
    fn none(service: &ServiceRef) -> Self {
        Self {
            service: service.clone(),
            import: ImportChange::Unchanged,
            conditions: Vec::new(),
        }
    }
}

/// What happened to a ServiceImport.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum ImportChange {
    /// Nothing.
    Unchanged,
    /// The first valid export appeared: publish this import.
    Created(Box<MergedImport>),
    /// The import changed (spec, labels, annotations, clusters, routes or source).
    Updated(Box<MergedImport>),
    /// The last valid export went away: delete the import.
    Deleted,
}

#[derive(Clone, Debug, Default)]
struct Entry {
    exports: BTreeMap<ClusterId, Constituent>,
    resolution: Resolution,
}

impl ClusterSetState {
    /// An empty state with the given stability policy.
    pub fn new(stability: Stability) -> Self {
        Self {
            stability,
            services: BTreeMap::new(),
            by_cluster: BTreeMap::new(),
        }
    }

    /// Builds the whole state at once from every constituent of every service (a full
    /// rebuild, e.g. after a re-list). When a (service, cluster) pair repeats, the later
    /// constituent replaces the earlier one. Nothing is published yet, so every service is
    /// merged fresh whatever the policy.
    pub fn build(
        stability: Stability,
        constituents: impl IntoIterator<Item = (ServiceRef, Constituent)>,
    ) -> Self {
        let mut state = Self::new(stability);
        for (service, export) in constituents {
            let cluster = export.cluster().clone();
            match state.services.get_mut(&service) {
                Some(entry) => {
                    entry.exports.insert(cluster, export);
                }
                None => {
                    let mut entry = Entry::default();
                    entry.exports.insert(cluster, export);
                    state.services.insert(Arc::new(service), entry);
                }
            }
        }
        // Services are visited in order, so every cluster's list is sorted and the sets are
        // bulk-built instead of inserted into one by one.
        let mut by_cluster: BTreeMap<ClusterId, Vec<Arc<ServiceRef>>> = BTreeMap::new();
        for (key, entry) in &state.services {
            for cluster in entry.exports.keys() {
                match by_cluster.get_mut(cluster) {
                    Some(list) => list.push(Arc::clone(key)),
                    None => {
                        by_cluster.insert(cluster.clone(), vec![Arc::clone(key)]);
                    }
                }
            }
        }
        state.by_cluster = by_cluster
            .into_iter()
            .map(|(cluster, list)| (cluster, list.into_iter().collect()))
            .collect();
        for entry in state.services.values_mut() {
            entry.resolution = resolve(entry.exports.values(), Stability::Fresh, None);
        }
        state
    }

    /// The stability policy updates use.
    pub fn stability(&self) -> Stability {
        self.stability
    }

    /// Adds or replaces one cluster's export of `service`.
    pub fn upsert(&mut self, service: &ServiceRef, export: Constituent) -> Change {
        let old = self
            .services
            .get(service)
            .and_then(|entry| entry.exports.get(export.cluster()));
        if old == Some(&export) {
            return Change::none(service);
        }
        // What the export's own conditions depended on before: its validity, and for an
        // invalid export the conditions themselves (their message names why: a Service
        // that is ExternalName, or headless with cluster selectors, or which selector is
        // invalid), which no merge result changes.
        let before = old.map(|o| Before {
            validity: o.validity(),
            invalid: (o.validity() != ValidReason::Valid)
                .then(|| export_conditions(service, o, &Resolution::default())),
        });
        let key = self.key(service);
        let cluster = export.cluster().clone();
        self.services
            .entry(Arc::clone(&key))
            .or_default()
            .exports
            .insert(cluster.clone(), export);
        self.by_cluster
            .entry(cluster.clone())
            .or_default()
            .insert(key);
        self.recompute(service, Some((&cluster, before)), self.stability)
    }

    /// Removes one cluster's export of `service` (the export was deleted).
    pub fn remove(&mut self, service: &ServiceRef, cluster: &ClusterId) -> Change {
        let Some(entry) = self.services.get_mut(service) else {
            return Change::none(service);
        };
        if entry.exports.remove(cluster).is_none() {
            return Change::none(service);
        }
        if let Some(set) = self.by_cluster.get_mut(cluster) {
            set.remove(service);
            if set.is_empty() {
                self.by_cluster.remove(cluster);
            }
        }
        self.recompute(service, None, self.stability)
    }

    /// Removes every export of `cluster` (the cluster left the ClusterSet). Returns the
    /// non-empty changes, sorted by service.
    pub fn remove_cluster(&mut self, cluster: &ClusterId) -> Vec<Change> {
        let Some(services) = self.by_cluster.remove(cluster) else {
            return Vec::new();
        };
        let mut changes = Vec::new();
        for service in services {
            if let Some(entry) = self.services.get_mut(&*service) {
                entry.exports.remove(cluster);
                let change = self.recompute(&service, None, self.stability);
                if !change.is_empty() {
                    changes.push(change);
                }
            }
        }
        changes
    }

    /// Re-merges `service` with [`Stability::Fresh`]: the oldest valid export wins again,
    /// whatever was kept for stability.
    pub fn refresh(&mut self, service: &ServiceRef) -> Change {
        if !self.services.contains_key(service) {
            return Change::none(service);
        }
        self.recompute(service, None, Stability::Fresh)
    }

    /// The import `service` should have, if any.
    pub fn import(&self, service: &ServiceRef) -> Option<&MergedImport> {
        self.services.get(service)?.resolution.import.as_ref()
    }

    /// The conflict reasons of `service` (empty when it has none or is unknown).
    pub fn conflicts(&self, service: &ServiceRef) -> ConflictReasons {
        self.services
            .get(service)
            .map_or(ConflictReasons::NONE, |e| e.resolution.conflicts)
    }

    /// The conditions the export of `service` from `cluster` should carry.
    pub fn conditions(
        &self,
        service: &ServiceRef,
        cluster: &ClusterId,
    ) -> Option<ExportConditions> {
        let entry = self.services.get(service)?;
        let export = entry.exports.get(cluster)?;
        Some(export_conditions(service, export, &entry.resolution))
    }

    /// The whole merge result of `service`, as [`merge`](super::merge) returns it.
    pub fn outcome(&self, service: &ServiceRef) -> Option<MergeOutcome> {
        let entry = self.services.get(service)?;
        let mut writer = ConditionWriter::new(service, &entry.resolution);
        Some(MergeOutcome {
            import: entry.resolution.import.clone(),
            conflicts: entry.resolution.conflicts,
            exports: entry
                .exports
                .iter()
                .map(|(id, c)| (id.clone(), writer.conditions(c)))
                .collect(),
        })
    }

    /// The exports of `service`, sorted by cluster.
    pub fn exports(&self, service: &ServiceRef) -> impl Iterator<Item = &Constituent> {
        self.services
            .get(service)
            .into_iter()
            .flat_map(|e| e.exports.values())
    }

    /// Every service with at least one export, sorted.
    pub fn services(&self) -> impl Iterator<Item = &ServiceRef> {
        self.services.keys().map(|k| &**k)
    }

    /// Every cluster with at least one export, sorted.
    pub fn clusters(&self) -> impl Iterator<Item = &ClusterId> {
        self.by_cluster.keys()
    }

    /// The number of services with at least one export.
    pub fn len(&self) -> usize {
        self.services.len()
    }

    /// Whether no service has an export.
    pub fn is_empty(&self) -> bool {
        self.services.is_empty()
    }

    /// The shared key of `service`, allocated only when the service is new.
    fn key(&self, service: &ServiceRef) -> Arc<ServiceRef> {
        match self.services.get_key_value(service) {
            Some((key, _)) => Arc::clone(key),
            None => Arc::new(service.clone()),
        }
    }

    /// Re-merges one service and diffs the result. `touched` is the upserted export and
    /// what its conditions depended on before the update (`None` when it is new).
    fn recompute(
        &mut self,
        service: &ServiceRef,
        touched: Option<(&ClusterId, Option<Before>)>,
        stability: Stability,
    ) -> Change {
        let Some(entry) = self.services.get_mut(service) else {
            return Change::none(service);
        };
        let new = resolve(
            entry.exports.values(),
            stability,
            entry.resolution.import.as_ref(),
        );
        let old = std::mem::replace(&mut entry.resolution, new);
        let new = &entry.resolution;
        let import = match (&old.import, &new.import) {
            (None, None) => ImportChange::Unchanged,
            (None, Some(i)) => ImportChange::Created(Box::new(i.clone())),
            (Some(_), None) => ImportChange::Deleted,
            (Some(a), Some(b)) if a == b => ImportChange::Unchanged,
            (Some(_), Some(b)) => ImportChange::Updated(Box::new(b.clone())),
        };
        let conflict_changed = old.conflicts != new.conflicts || old.message != new.message;
        let mut writer = ConditionWriter::new(service, new);
        let mut conditions = Vec::new();
        for (id, export) in &entry.exports {
            let validity = export.validity();
            let shared = validity == ValidReason::Valid && conflict_changed;
            let now = match &touched {
                Some((t, before)) if *t == id => Some((before, writer.conditions(export))),
                _ => None,
            };
            let own = now
                .as_ref()
                .is_some_and(|(before, conditions)| match before {
                    None => true,
                    Some(b) if b.validity != validity => true,
                    Some(b) => b.invalid.as_ref().is_some_and(|old| old != conditions),
                });
            if shared || own {
                let export_conditions = match now {
                    Some((_, c)) => c,
                    None => writer.conditions(export),
                };
                conditions.push((id.clone(), export_conditions));
            }
        }
        if entry.exports.is_empty() {
            self.services.remove(service);
        }
        Change {
            service: service.clone(),
            import,
            conditions,
        }
    }
}
