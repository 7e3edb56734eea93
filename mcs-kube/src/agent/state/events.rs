//! What each watch's events do to the state.

use std::collections::{BTreeMap, BTreeSet};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::runtime::watcher::Event;
use mcs_core::ClusterId;
use mcs_core::name::ServiceRef;

use super::super::health::LeaseSeen;
use super::super::index::{Seen, Touched, key_of};
use super::super::source::{KIND_SERVICE, KIND_SLICE, Origin};
use super::{MemberState, State, is_terminating};
use crate::hub::record::MemberExport;

impl State {
    pub(super) fn service_event(&mut self, service: &ServiceRef, e: Event<Service>) -> Touched {
        let local = self.settings.local.clone();
        let l = &mut self.local;
        let Some(m) = self.members.get_mut(&local) else {
            return Touched::new();
        };
        match l
            .service_listing
            .entry(service.clone())
            .or_default()
            .take(e)
        {
            Seen::Apply(s) => m.services.apply(s),
            Seen::Delete(s) => m.services.delete(&key_of(&s)),
            Seen::Listing => Touched::new(),
            Seen::Listed(list) => {
                l.service_listing.remove(service);
                l.listed.insert((service.clone(), KIND_SERVICE));
                m.services.replace_service(service, list)
            }
        }
    }

    pub(super) fn slices_event(
        &mut self,
        service: &ServiceRef,
        e: Event<EndpointSlice>,
    ) -> Touched {
        let local = self.settings.local.clone();
        let l = &mut self.local;
        let Some(m) = self.members.get_mut(&local) else {
            return Touched::new();
        };
        match l.slice_listing.entry(service.clone()).or_default().take(e) {
            Seen::Apply(s) => m.slices.apply(s),
            Seen::Delete(s) => m.slices.delete(&key_of(&s)),
            Seen::Listing => Touched::new(),
            Seen::Listed(list) => {
                l.slice_listing.remove(service);
                l.listed.insert((service.clone(), KIND_SLICE));
                m.slices.replace_service(service, list)
            }
        }
    }

    pub(super) fn namespace_event(&mut self, e: Event<Namespace>) -> Touched {
        let l = &mut self.local;
        let before: BTreeMap<String, bool> = l
            .namespaces
            .iter()
            .map(|(n, ns)| (n.clone(), is_terminating(ns)))
            .collect();
        match l.namespaces_listing.take(e) {
            Seen::Apply(ns) => {
                if let Some(name) = ns.metadata.name.clone() {
                    l.namespaces.insert(name, ns);
                }
            }
            Seen::Delete(ns) => {
                if let Some(name) = &ns.metadata.name {
                    l.namespaces.remove(name);
                }
            }
            Seen::Listing => {}
            Seen::Listed(list) => {
                l.namespaces = list
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

    pub(super) fn members_event(&mut self, e: Event<Namespace>) -> Touched {
        let local = self.settings.local.clone();
        let member = |ns: &Namespace| super::super::source::hub::member_of(ns);
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

    pub(super) fn record_event(&mut self, id: &ClusterId, e: Event<MemberExport>) -> Touched {
        let m = self
            .members
            .entry(id.clone())
            .or_insert_with(MemberState::new);
        let mut touched = Touched::new();
        match m.records_listing.take(e) {
            Seen::Apply(record) => {
                if let Some(service) = record.service_ref() {
                    touched.extend(apply_record(m, &service, Some(&record)));
                }
            }
            Seen::Delete(record) => {
                if let Some(service) = record.service_ref() {
                    touched.extend(apply_record(m, &service, None));
                }
            }
            Seen::Listing => {}
            Seen::Listed(records) => {
                // One atomic reset of all three stores.
                let (mut exports, mut services, mut slices) = (Vec::new(), Vec::new(), Vec::new());
                for record in records {
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

    /// One event of member `id`'s Lease. A member is judged by its Lease from its first
    /// renewal on: a member without one (not renewed yet, or of an earlier version, which
    /// renews only the Lease in its own namespace) is not judged by it.
    pub(super) fn lease_event(
        &mut self,
        id: &ClusterId,
        e: Event<k8s_openapi::api::coordination::v1::Lease>,
        now: Instant,
    ) {
        let m = self
            .members
            .entry(id.clone())
            .or_insert_with(MemberState::new);
        let expired = LeaseSeen {
            renew_time: None,
            seen_at: now,
            duration: Duration::ZERO,
        };
        match e {
            Event::Apply(lease) | Event::InitApply(lease) => {
                m.lease_in_list = true;
                let spec = lease.spec.as_ref();
                // Created with the member's roles, never renewed: nothing to judge yet.
                let Some(renew) = spec.and_then(|s| s.renew_time.as_ref()) else {
                    return;
                };
                let duration = spec
                    .and_then(|s| s.lease_duration_seconds)
                    .map_or(Duration::from_secs(40), |s| {
                        Duration::from_secs(s.max(1) as u64)
                    });
                m.health.lease = Some(LeaseSeen::update(
                    m.health.lease.as_ref(),
                    Some(renew.0.to_string()),
                    duration,
                    now,
                ));
            }
            // A deleted Lease is an expired one.
            Event::Delete(_) => m.health.lease = Some(expired),
            Event::Init => m.lease_in_list = false,
            Event::InitDone => {
                m.lease_listed = true;
                // A re-list without the Lease seen before: deleted meanwhile.
                if !m.lease_in_list && m.health.lease.is_some() {
                    m.health.lease = Some(expired);
                }
            }
        }
    }

    /// Records a watch error; returns whether member health may have changed.
    pub(super) fn watch_error(
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
                            "the hub refuses a watch (403): the agent's hub identity lacks a permission of deploy/rbac/hub.yaml or hub-member.yaml"
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
                let Some(m) = self.members.get_mut(&id) else {
                    return false;
                };
                let known = m.health.watch_errors.contains_key(kind);
                if forbidden && !known {
                    tracing::error!(cluster = %id, kind, error, "watch forbidden (403): the identity used for this cluster lacks a permission (deploy/rbac/agent-local.yaml in the agent's own cluster, agent-peer-reader.yaml in a peer)");
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
