//! [`StaticResolver`]: endpoint sets set in code.

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::sync::{Arc, Mutex};

use tokio::sync::mpsc;

use mcs_core::discovery::{Endpoint, Resolution, Resolve, ResolveError, Target, Update};
use mcs_core::endpoints::ClusterPreference;

use super::ReceiverStream;

/// Endpoint sets set in code and changed at runtime; every change is pushed to the live
/// resolutions of its target at once.
///
/// Clones share the same sets. A target that was never set stays unresolved (requests to it
/// wait for the first resolution, then fail with [`Error::Resolve`](crate::Error::Resolve)).
///
/// ```
/// use mcs_client::StaticResolver;
/// use mcs_core::ClusterId;
/// use mcs_core::discovery::{Endpoint, Target};
/// use mcs_core::name::ServiceRef;
///
/// let resolver = StaticResolver::new();
/// let target = Target { service: ServiceRef::new("loyalty", "loyalty-accrual").unwrap(), port: 9443 };
/// let east = ClusterId::new("east").unwrap();
/// resolver.set(&target, [Endpoint::ready("127.10.0.1:9443".parse().unwrap(), east)]);
/// assert_eq!(resolver.endpoints(&target).len(), 1);
/// ```
#[derive(Clone, Debug, Default)]
pub struct StaticResolver {
    targets: Arc<Mutex<HashMap<Target, TargetState>>>,
}

#[derive(Debug, Default)]
struct TargetState {
    /// `None`: never set; `Some(None)`: does not exist; `Some(Some(set))`: the set.
    current: Option<Option<BTreeMap<SocketAddr, Endpoint>>>,
    /// The cluster preference, if one was set.
    preference: Option<ClusterPreference>,
    subscribers: Vec<mpsc::UnboundedSender<Result<Update, ResolveError>>>,
}

impl TargetState {
    fn push(&mut self, item: Result<Update, ResolveError>) {
        self.subscribers.retain(|tx| tx.send(item.clone()).is_ok());
    }
}

impl StaticResolver {
    /// A resolver with no targets.
    pub fn new() -> Self {
        Self::default()
    }

    /// Replaces the endpoint set of `target`.
    pub fn set(&self, target: &Target, endpoints: impl IntoIterator<Item = Endpoint>) {
        let set: BTreeMap<_, _> = endpoints.into_iter().map(|e| (e.addr, e)).collect();
        self.with(target, |st| {
            st.push(Ok(Update::Reset(set.values().cloned().collect())));
            st.current = Some(Some(set));
        });
    }

    /// Adds (or changes) endpoints of `target`.
    pub fn add(&self, target: &Target, endpoints: impl IntoIterator<Item = Endpoint>) {
        let list: Vec<Endpoint> = endpoints.into_iter().collect();
        self.with(target, |st| {
            let set = st
                .current
                .get_or_insert_with(|| Some(BTreeMap::new()))
                .get_or_insert_with(BTreeMap::new);
            for e in &list {
                set.insert(e.addr, e.clone());
            }
            st.push(Ok(Update::Add(list)));
        });
    }

    /// Removes endpoints of `target` by address.
    pub fn remove(&self, target: &Target, addrs: impl IntoIterator<Item = SocketAddr>) {
        let addrs: Vec<SocketAddr> = addrs.into_iter().collect();
        self.with(target, |st| {
            if let Some(Some(set)) = &mut st.current {
                for a in &addrs {
                    set.remove(a);
                }
            }
            st.push(Ok(Update::Remove(addrs)));
        });
    }

    /// Says that `target` does not exist.
    pub fn does_not_exist(&self, target: &Target) {
        self.with(target, |st| {
            st.current = Some(None);
            st.push(Ok(Update::DoesNotExist));
        });
    }

    /// Sets the cluster preference of `target` (`None`: none), as a Kubernetes resolver
    /// reports the import's `clusterSelectorResults` (KEP-5939).
    pub fn prefer(&self, target: &Target, preference: Option<ClusterPreference>) {
        self.with(target, |st| {
            st.push(Ok(Update::ClusterPreference(preference.clone())));
            st.preference = preference;
        });
    }

    /// Reports a transient error to the live resolutions of `target` (their consumers keep
    /// the last good set).
    pub fn fail(&self, target: &Target, message: &str) {
        self.with(target, |st| {
            st.push(Err(ResolveError::new(target, message)))
        });
    }

    /// The current endpoints of `target`, ordered by address.
    pub fn endpoints(&self, target: &Target) -> Vec<Endpoint> {
        let targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        match targets.get(target).and_then(|st| st.current.as_ref()) {
            Some(Some(set)) => set.values().cloned().collect(),
            _ => Vec::new(),
        }
    }

    /// How many resolutions of `target` are live.
    pub fn subscribers(&self, target: &Target) -> usize {
        let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        targets.get_mut(target).map_or(0, |st| {
            st.subscribers.retain(|tx| !tx.is_closed());
            st.subscribers.len()
        })
    }

    fn with(&self, target: &Target, f: impl FnOnce(&mut TargetState)) {
        // A poisoned lock means a panic elsewhere mid-update; the map is still usable.
        let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        f(targets.entry(target.clone()).or_default());
    }
}

impl Resolve for StaticResolver {
    fn resolve(&self, target: &Target) -> Resolution {
        let (tx, rx) = mpsc::unbounded_channel();
        self.with(target, |st| {
            if let Some(preference) = &st.preference {
                // The receiver is alive: it is right here.
                let _ = tx.send(Ok(Update::ClusterPreference(Some(preference.clone()))));
            }
            let first = match &st.current {
                None => None,
                Some(None) => Some(Update::DoesNotExist),
                Some(Some(set)) => Some(Update::Reset(set.values().cloned().collect())),
            };
            if let Some(first) = first {
                // The receiver is alive: it is right here.
                let _ = tx.send(Ok(first));
            }
            st.subscribers.push(tx);
        });
        Box::pin(ReceiverStream(rx))
    }
}
