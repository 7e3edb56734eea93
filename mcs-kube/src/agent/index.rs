//! State from watch events, after kubert's index: `apply`, `delete`, and a re-list applied
//! as one atomic `reset`. Every change reports which services (`<ns>/<name>`) it touched,
//! so the controller reconciles only those.

use std::collections::{BTreeMap, BTreeSet};

use kube::Resource;
use kube::runtime::watcher::Event;

/// `(namespace, name)`.
pub type Key = (String, String);

/// The key of an object.
pub fn key_of<K: Resource>(obj: &K) -> Key {
    let meta = obj.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// Objects of one kind from one cluster, with the service each belongs to.
#[derive(Debug)]
pub struct Store<K> {
    objects: BTreeMap<Key, K>,
    by_service: BTreeMap<Key, BTreeSet<Key>>,
    service_of: fn(&K) -> Option<Key>,
    listing: Vec<K>,
    listed: bool,
}

impl<K: Resource + Clone + PartialEq> Store<K> {
    /// An empty store; `service_of` says which service an object belongs to (`None`:
    /// ignore the object).
    pub fn new(service_of: fn(&K) -> Option<Key>) -> Self {
        Self {
            objects: BTreeMap::new(),
            by_service: BTreeMap::new(),
            service_of,
            listing: Vec::new(),
            listed: false,
        }
    }

    /// Applies one watch event; returns the services it touched.
    pub fn handle(&mut self, event: Event<K>) -> BTreeSet<Key> {
        match event {
            Event::Apply(obj) => self.apply(obj),
            Event::Delete(obj) => self.delete(&key_of(&obj)),
            Event::Init => {
                self.listing.clear();
                BTreeSet::new()
            }
            Event::InitApply(obj) => {
                self.listing.push(obj);
                BTreeSet::new()
            }
            Event::InitDone => {
                let list = std::mem::take(&mut self.listing);
                self.listed = true;
                self.reset(list)
            }
        }
    }

    /// Adds or replaces an object.
    pub fn apply(&mut self, obj: K) -> BTreeSet<Key> {
        let key = key_of(&obj);
        let mut touched = BTreeSet::new();
        if self.objects.get(&key) == Some(&obj) {
            return touched;
        }
        touched.extend(self.delete(&key));
        let Some(service) = (self.service_of)(&obj) else {
            return touched;
        };
        self.by_service
            .entry(service.clone())
            .or_default()
            .insert(key.clone());
        self.objects.insert(key, obj);
        touched.insert(service);
        touched
    }

    /// Removes an object.
    pub fn delete(&mut self, key: &Key) -> BTreeSet<Key> {
        let mut touched = BTreeSet::new();
        if let Some(old) = self.objects.remove(key)
            && let Some(service) = (self.service_of)(&old)
        {
            if let Some(set) = self.by_service.get_mut(&service) {
                set.remove(key);
                if set.is_empty() {
                    self.by_service.remove(&service);
                }
            }
            touched.insert(service);
        }
        touched
    }

    /// Replaces everything with `list` at once; returns the services whose objects changed.
    pub fn reset(&mut self, list: Vec<K>) -> BTreeSet<Key> {
        let fresh: BTreeSet<Key> = list.iter().map(key_of).collect();
        let gone: Vec<Key> = self
            .objects
            .keys()
            .filter(|k| !fresh.contains(*k))
            .cloned()
            .collect();
        let mut touched = BTreeSet::new();
        for key in gone {
            touched.extend(self.delete(&key));
        }
        for obj in list {
            touched.extend(self.apply(obj));
        }
        touched
    }

    /// Drops everything (a cluster left); returns the services that had objects.
    pub fn clear(&mut self) -> BTreeSet<Key> {
        let touched = self.by_service.keys().cloned().collect();
        self.objects.clear();
        self.by_service.clear();
        touched
    }

    /// The object with `key`.
    pub fn get(&self, key: &Key) -> Option<&K> {
        self.objects.get(key)
    }

    /// The objects belonging to `service`.
    pub fn of_service<'a>(&'a self, service: &Key) -> impl Iterator<Item = &'a K> + 'a {
        self.by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|k| self.objects.get(k))
    }

    /// Every service with at least one object.
    pub fn services(&self) -> impl Iterator<Item = &Key> {
        self.by_service.keys()
    }

    /// Whether the first list has completed.
    pub fn is_listed(&self) -> bool {
        self.listed
    }

    /// Number of objects.
    pub fn len(&self) -> usize {
        self.objects.len()
    }

    /// Whether the store is empty.
    pub fn is_empty(&self) -> bool {
        self.objects.is_empty()
    }
}

/// Objects that are services themselves (ServiceExport, Service, ServiceImport, Namespace
/// keyed by name).
pub fn own_key<K: Resource>(obj: &K) -> Option<Key> {
    Some(key_of(obj))
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use k8s_openapi::api::discovery::v1::EndpointSlice;
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

    use super::*;

    fn slice(name: &str, svc: &str, rv: &str) -> EndpointSlice {
        EndpointSlice {
            address_type: "IPv4".into(),
            metadata: ObjectMeta {
                name: Some(name.into()),
                namespace: Some("ns".into()),
                resource_version: Some(rv.into()),
                labels: Some(BTreeMap::from([(
                    "kubernetes.io/service-name".to_string(),
                    svc.to_string(),
                )])),
                ..Default::default()
            },
            endpoints: vec![],
            ports: None,
        }
    }

    fn service_of(s: &EndpointSlice) -> Option<Key> {
        let svc = s
            .metadata
            .labels
            .as_ref()?
            .get("kubernetes.io/service-name")?;
        Some((s.metadata.namespace.clone()?, svc.clone()))
    }

    fn k(s: &str) -> Key {
        ("ns".into(), s.into())
    }

    #[test]
    fn apply_delete_reset_report_touched_services() {
        let mut store = Store::new(service_of);
        assert_eq!(
            store.apply(slice("a-1", "a", "1")),
            BTreeSet::from([k("a")])
        );
        assert!(
            store.apply(slice("a-1", "a", "1")).is_empty(),
            "same object: no change"
        );
        // The slice moves to another service: both are touched.
        assert_eq!(
            store.apply(slice("a-1", "b", "2")),
            BTreeSet::from([k("a"), k("b")])
        );
        assert_eq!(store.of_service(&k("b")).count(), 1);
        assert_eq!(store.of_service(&k("a")).count(), 0);
        store.apply(slice("c-1", "c", "1"));
        // A re-list without c-1 and with a new d-1 is one atomic change.
        let touched = store.handle(Event::Init);
        assert!(touched.is_empty());
        store.handle(Event::InitApply(slice("a-1", "b", "2")));
        store.handle(Event::InitApply(slice("d-1", "d", "1")));
        assert_eq!(store.len(), 2, "nothing changes until the list is done");
        let touched = store.handle(Event::InitDone);
        assert_eq!(touched, BTreeSet::from([k("c"), k("d")]));
        assert!(store.is_listed());
        assert_eq!(store.delete(&k("d-1")), BTreeSet::from([k("d")]));
        assert_eq!(store.clear(), BTreeSet::from([k("b")]));
        assert!(store.is_empty());
    }
}
