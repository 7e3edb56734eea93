//! Discovery: how endpoint sets reach a balancer.
//!
//! A resolution is an infinite stream of [`Update`]s, after linkerd2-proxy's `Resolve`
//! (`linkerd/proxy/core/src/resolve.rs`): `Reset` replaces the whole set, `Add` and
//! `Remove` change parts of it, `DoesNotExist` says the service is not there. Errors on the
//! stream are transient: the consumer keeps its last good set.
//!
//! [`Resolve`] is implemented by the DNS and static resolvers in `mcs-client` and by the
//! Kubernetes resolver in `mcs-kube`; this crate defines it so neither depends on the other.
//! [`EndpointTable`] folds updates into the current set.

use std::collections::BTreeMap;
use std::fmt;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;

use futures_core::Stream;

use crate::ClusterId;
use crate::endpoints::ClusterPreference;
use crate::name::{Hostname, ServiceRef};

/// One endpoint as discovery reports it.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Endpoint {
    /// Where to connect.
    pub addr: SocketAddr,
    /// The cluster the endpoint runs in.
    pub cluster: ClusterId,
    /// The zone, when known (`topology.kubernetes.io/zone`).
    pub zone: Option<Arc<str>>,
    /// The endpoint's hostname, when it has one.
    pub hostname: Option<Hostname>,
    /// EndpointSlice `conditions.ready`.
    pub ready: bool,
    /// EndpointSlice `conditions.serving`.
    pub serving: bool,
    /// EndpointSlice `conditions.terminating`.
    pub terminating: bool,
}

impl Endpoint {
    /// A ready, serving endpoint with no zone and no hostname.
    pub fn ready(addr: SocketAddr, cluster: ClusterId) -> Self {
        Self {
            addr,
            cluster,
            zone: None,
            hostname: None,
            ready: true,
            serving: true,
            terminating: false,
        }
    }

    /// The same endpoint in `zone`.
    #[must_use]
    pub fn in_zone(mut self, zone: &str) -> Self {
        self.zone = Some(zone.into());
        self
    }
}

/// A change to the endpoint set of one target.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Update {
    /// The complete set; everything not listed is gone.
    Reset(Vec<Endpoint>),
    /// Endpoints added or changed (keyed by address).
    Add(Vec<Endpoint>),
    /// Endpoints removed, by address.
    Remove(Vec<SocketAddr>),
    /// The service does not exist (no ServiceImport, NXDOMAIN).
    DoesNotExist,
    /// The caller's cluster preference for the service (`None`: none), such as the
    /// import's `status.clusterSelectorResults` (KEP-5939): traffic goes to the first set
    /// with a ready or serving endpoint, else to every cluster. It is not part of the
    /// endpoint set: [`EndpointTable`] ignores it, a balancer applies it. A resolution
    /// sends it before its first set, and only when there is one (or to lift it); a
    /// consumer that subscribes again lifts the preference of the earlier resolution when
    /// the new one's first set comes without one.
    ClusterPreference(Option<ClusterPreference>),
}

/// What to resolve: a service and the service port a caller asked for.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct Target {
    /// The multi-cluster service.
    pub service: ServiceRef,
    /// The service port (as in `http://svc.ns.svc.clusterset.local:9443`).
    pub port: u16,
}

impl fmt::Display for Target {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}:{}", self.service, self.port)
    }
}

/// A transient discovery failure. The consumer keeps its last good endpoint set.
#[derive(Debug, Clone, thiserror::Error)]
#[error("resolving {target}: {message}")]
pub struct ResolveError {
    /// What was being resolved.
    pub target: String,
    /// What went wrong.
    pub message: String,
}

impl ResolveError {
    /// A resolve error for `target`.
    pub fn new(target: &Target, message: impl Into<String>) -> Self {
        Self {
            target: target.to_string(),
            message: message.into(),
        }
    }
}

/// A stream of updates for one target. It ends only when the resolver shuts down.
pub type Resolution = Pin<Box<dyn Stream<Item = Result<Update, ResolveError>> + Send + 'static>>;

/// A source of endpoint updates.
pub trait Resolve: Send + Sync + 'static {
    /// Starts resolving `target`. The first item should arrive as soon as the resolver
    /// knows anything (a `Reset` or `DoesNotExist`).
    fn resolve(&self, target: &Target) -> Resolution;
}

impl<R: Resolve + ?Sized> Resolve for Arc<R> {
    fn resolve(&self, target: &Target) -> Resolution {
        (**self).resolve(target)
    }
}

/// The current endpoint set of one target, folded from [`Update`]s.
///
/// Folding any sequence of updates equals the last `Reset` followed by the later `Add`s and
/// `Remove`s.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct EndpointTable {
    /// Shared with the balancer's endpoint states, which hold the same `Arc`s instead of
    /// copies.
    endpoints: BTreeMap<SocketAddr, Arc<Endpoint>>,
    exists: Option<bool>,
}

impl EndpointTable {
    /// An empty table that has seen no update.
    pub fn new() -> Self {
        Self::default()
    }

    /// Applies one update. Returns whether the set (or its existence) changed.
    pub fn apply(&mut self, update: Update) -> bool {
        let before_exists = self.exists;
        let changed = match update {
            Update::Reset(list) => {
                let new: BTreeMap<_, _> = list
                    .into_iter()
                    .map(|e| match self.endpoints.get(&e.addr) {
                        // Unchanged endpoints keep their `Arc`.
                        Some(old) if **old == e => (e.addr, Arc::clone(old)),
                        _ => (e.addr, Arc::new(e)),
                    })
                    .collect();
                let changed = new != self.endpoints;
                self.endpoints = new;
                changed
            }
            Update::Add(list) => {
                let mut changed = false;
                for e in list {
                    if self.get(&e.addr) != Some(&e) {
                        self.endpoints.insert(e.addr, Arc::new(e));
                        changed = true;
                    }
                }
                changed
            }
            Update::Remove(addrs) => {
                let mut changed = false;
                for a in addrs {
                    changed |= self.endpoints.remove(&a).is_some();
                }
                changed
            }
            Update::DoesNotExist => {
                let changed = !self.endpoints.is_empty();
                self.endpoints.clear();
                self.exists = Some(false);
                return changed || before_exists != Some(false);
            }
            // Not part of the set.
            Update::ClusterPreference(_) => return false,
        };
        self.exists = Some(true);
        changed || before_exists != Some(true)
    }

    /// The endpoints, ordered by address.
    pub fn endpoints(&self) -> impl ExactSizeIterator<Item = &Endpoint> {
        self.endpoints.values().map(|e| &**e)
    }

    /// The endpoint at `addr`, if any.
    pub fn get(&self, addr: &SocketAddr) -> Option<&Endpoint> {
        self.endpoints.get(addr).map(|e| &**e)
    }

    /// The endpoints as the table holds them, ordered by address.
    pub(crate) fn shared(&self) -> impl ExactSizeIterator<Item = &Arc<Endpoint>> {
        self.endpoints.values()
    }

    /// The endpoint at `addr` as the table holds it.
    pub(crate) fn get_shared(&self, addr: &SocketAddr) -> Option<&Arc<Endpoint>> {
        self.endpoints.get(addr)
    }

    /// Number of endpoints.
    pub fn len(&self) -> usize {
        self.endpoints.len()
    }

    /// Whether the set is empty.
    pub fn is_empty(&self) -> bool {
        self.endpoints.is_empty()
    }

    /// `Some(false)` after `DoesNotExist`, `Some(true)` after any other update, `None`
    /// before the first update.
    pub fn exists(&self) -> Option<bool> {
        self.exists
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ep(port: u16, cluster: &str) -> Endpoint {
        Endpoint::ready(
            SocketAddr::from(([127, 0, 0, 1], port)),
            ClusterId::new(cluster).unwrap(),
        )
    }

    #[test]
    fn fold_reset_add_remove() {
        let mut t = EndpointTable::new();
        assert_eq!(t.exists(), None);
        assert!(t.apply(Update::Reset(vec![ep(1, "a"), ep(2, "a")])));
        assert!(!t.apply(Update::Reset(vec![ep(2, "a"), ep(1, "a")])));
        assert!(t.apply(Update::Add(vec![ep(3, "b")])));
        assert!(!t.apply(Update::Add(vec![ep(3, "b")])));
        assert!(t.apply(Update::Remove(vec![ep(1, "a").addr])));
        assert_eq!(t.len(), 2);
        assert!(t.apply(Update::DoesNotExist));
        assert_eq!(t.exists(), Some(false));
        assert!(t.is_empty());
        assert!(t.apply(Update::Reset(vec![])), "existence changed");
    }
}
