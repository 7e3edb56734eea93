//! Whether the agent has the whole picture, and if not, what it waits for.

use std::collections::BTreeMap;
use std::time::Instant;

use mcs_core::name::ServiceRef;

use super::super::health::{self, NotReady};
use super::super::source::{
    KIND_DERIVED, KIND_EXPORT, KIND_IMPORT, KIND_IMPORTED, KIND_LEASE, KIND_MEMBERS,
    KIND_NAMESPACE, KIND_OWN_RECORD, KIND_RECORD, KIND_SERVICE, KIND_SLICE,
};
use super::{MemberState, Mode, State};

impl State {
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
                    Mode::Hub => m.exports.is_listed() && m.lease_listed,
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
}
