//! State from watch events, after kubert's index: `apply`, `delete`, and a re-list applied
//! as one atomic `reset`. Every change reports which services it touched, so the
//! controller reconciles only those.

use std::collections::{BTreeMap, BTreeSet};

use kube::Resource;
use kube::runtime::watcher::Event;
use mcs_core::name::ServiceRef;

/// An object's `(namespace, name)`.
pub(crate) type Key = (String, String);

/// The services a change touched.
pub(crate) type Touched = BTreeSet<ServiceRef>;

/// The key of an object.
pub(crate) fn key_of<K: Resource>(obj: &K) -> Key {
    let meta = obj.meta();
    (
        meta.namespace.clone().unwrap_or_default(),
        meta.name.clone().unwrap_or_default(),
    )
}

/// The objects of a watch's (re-)list in progress. kube-runtime's watcher sends `Init`, one
/// `InitApply` per object, then `InitDone`; what was known before stays true until the list
/// is complete, and then the list replaces it at once (kube-runtime's reflector store does
/// the same; the agent keeps its own stores to index objects by service and to say which
/// services a change touched). `T` is what is kept of each listed object.
#[derive(Debug)]
pub(crate) struct Relist<T>(Vec<T>);

impl<T> Default for Relist<T> {
    fn default() -> Self {
        Self(Vec::new())
    }
}

/// What one watch event means once re-lists are buffered by a [`Relist`].
#[derive(Debug)]
pub(crate) enum Seen<K> {
    /// An object was created or changed.
    Apply(K),
    /// An object was deleted.
    Delete(K),
    /// A (re-)list is complete: every object, to replace what was known.
    Listed(Vec<K>),
    /// Part of a list in progress: nothing to do yet.
    Listing,
}

impl<T> Relist<T> {
    /// Notes `event` without taking it, keeping `keep(object)` of each listed object; returns
    /// the whole list when `event` completes one.
    pub(crate) fn note<K>(
        &mut self,
        event: &Event<K>,
        keep: impl FnOnce(&K) -> Option<T>,
    ) -> Option<Vec<T>> {
        match event {
            Event::Init => {
                self.0.clear();
                None
            }
            Event::InitApply(obj) => {
                self.0.extend(keep(obj));
                None
            }
            Event::InitDone => Some(std::mem::take(&mut self.0)),
            Event::Apply(_) | Event::Delete(_) => None,
        }
    }

    /// Takes `event`: a change, a complete list, or part of a list (kept here).
    pub(crate) fn take(&mut self, event: Event<T>) -> Seen<T> {
        match event {
            Event::Apply(obj) => Seen::Apply(obj),
            Event::Delete(obj) => Seen::Delete(obj),
            Event::Init => {
                self.0.clear();
                Seen::Listing
            }
            Event::InitApply(obj) => {
                self.0.push(obj);
                Seen::Listing
            }
            Event::InitDone => Seen::Listed(std::mem::take(&mut self.0)),
        }
    }

    /// Forgets a list in progress.
    pub(crate) fn clear(&mut self) {
        self.0.clear();
    }
}

/// Objects of one kind from one cluster, with the service each belongs to.
#[derive(Debug)]
pub(crate) struct Store<K> {
    objects: BTreeMap<Key, K>,
    by_service: BTreeMap<ServiceRef, BTreeSet<Key>>,
    service_of: fn(&K) -> Option<ServiceRef>,
    listing: Relist<K>,
    listed: bool,
}

impl<K: Resource + Clone + PartialEq> Store<K> {
    /// An empty store; `service_of` says which service an object belongs to (`None`:
    /// ignore the object).
    pub(crate) fn new(service_of: fn(&K) -> Option<ServiceRef>) -> Self {
        Self {
            objects: BTreeMap::new(),
            by_service: BTreeMap::new(),
            service_of,
            listing: Relist::default(),
            listed: false,
        }
    }

    /// Applies one watch event; returns the services it touched.
    pub(crate) fn handle(&mut self, event: Event<K>) -> Touched {
        match self.listing.take(event) {
            Seen::Apply(obj) => self.apply(obj),
            Seen::Delete(obj) => self.delete(&key_of(&obj)),
            Seen::Listed(list) => self.reset(list),
            Seen::Listing => Touched::new(),
        }
    }

    /// Adds or replaces an object.
    pub(crate) fn apply(&mut self, obj: K) -> Touched {
        let key = key_of(&obj);
        let mut touched = Touched::new();
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
    pub(crate) fn delete(&mut self, key: &Key) -> Touched {
        let mut touched = Touched::new();
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
    pub(crate) fn reset(&mut self, list: Vec<K>) -> Touched {
        self.listed = true;
        let fresh: BTreeSet<Key> = list.iter().map(key_of).collect();
        let gone: Vec<Key> = self
            .objects
            .keys()
            .filter(|k| !fresh.contains(*k))
            .cloned()
            .collect();
        let mut touched = Touched::new();
        for key in gone {
            touched.extend(self.delete(&key));
        }
        for obj in list {
            touched.extend(self.apply(obj));
        }
        touched
    }

    /// Replaces the objects of one service with `list` (a per-service re-list, or a hub
    /// record's new content); returns the services whose objects changed.
    pub(crate) fn replace_service(&mut self, service: &ServiceRef, list: Vec<K>) -> Touched {
        let fresh: BTreeSet<Key> = list.iter().map(key_of).collect();
        let gone: Vec<Key> = self
            .by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter(|k| !fresh.contains(*k))
            .cloned()
            .collect();
        let mut touched = Touched::new();
        for key in gone {
            touched.extend(self.delete(&key));
        }
        for obj in list {
            touched.extend(self.apply(obj));
        }
        touched
    }

    /// Drops everything (a member left); returns the services that had objects. The store
    /// counts as listed: there is nothing more to wait for.
    pub(crate) fn clear(&mut self) -> Touched {
        let touched = self.by_service.keys().cloned().collect();
        self.objects.clear();
        self.by_service.clear();
        self.listing.clear();
        self.listed = true;
        touched
    }

    /// Marks the store as listed without a list (its objects come per service).
    pub(crate) fn mark_listed(&mut self) {
        self.listed = true;
    }

    /// The object named like `service` (a ServiceExport, a Service, a ServiceImport).
    pub(crate) fn named(&self, service: &ServiceRef) -> Option<&K> {
        self.objects.get(&(
            service.namespace.as_str().to_owned(),
            service.name.as_str().to_owned(),
        ))
    }

    /// The objects belonging to `service`.
    pub(crate) fn of_service<'a>(
        &'a self,
        service: &ServiceRef,
    ) -> impl Iterator<Item = &'a K> + 'a {
        self.by_service
            .get(service)
            .into_iter()
            .flatten()
            .filter_map(|k| self.objects.get(k))
    }

    /// Every service with at least one object.
    pub(crate) fn services(&self) -> impl Iterator<Item = &ServiceRef> {
        self.by_service.keys()
    }

    /// Whether the first list has completed.
    pub(crate) fn is_listed(&self) -> bool {
        self.listed
    }

    /// Number of objects.
    #[cfg(test)]
    pub(crate) fn len(&self) -> usize {
        self.objects.len()
    }
}

/// Objects named like their service (ServiceExport, Service, ServiceImport).
pub(crate) fn own_service<K: Resource>(obj: &K) -> Option<ServiceRef> {
    let meta = obj.meta();
    ServiceRef::new(meta.namespace.as_deref()?, meta.name.as_deref()?).ok()
}

/// The service a label names, in the object's namespace.
pub(crate) fn labelled_service<K: Resource>(obj: &K, label: &str) -> Option<ServiceRef> {
    let meta = obj.meta();
    let name = meta.labels.as_ref()?.get(label)?;
    ServiceRef::new(meta.namespace.as_deref()?, name).ok()
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

    fn service_of(s: &EndpointSlice) -> Option<ServiceRef> {
        labelled_service(s, "kubernetes.io/service-name")
    }

    fn k(s: &str) -> ServiceRef {
        ServiceRef::new("ns", s).unwrap()
    }

    fn o(s: &str) -> Key {
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
        assert_eq!(store.delete(&o("d-1")), BTreeSet::from([k("d")]));
        assert_eq!(store.clear(), BTreeSet::from([k("b")]));
        assert_eq!(store.len(), 0);
    }

    #[test]
    fn a_relist_is_whole_only_at_its_end_and_a_new_one_starts_afresh() {
        let mut relist: Relist<String> = Relist::default();
        let name = |s: &EndpointSlice| s.metadata.name.clone();
        assert_eq!(relist.note(&Event::Init, name), None);
        assert_eq!(
            relist.note(&Event::InitApply(slice("a", "a", "1")), name),
            None
        );
        // A change between lists is not part of one.
        assert_eq!(relist.note(&Event::Apply(slice("x", "x", "1")), name), None);
        // The watch restarts its list: what came before is dropped.
        assert_eq!(relist.note(&Event::Init, name), None);
        assert_eq!(
            relist.note(&Event::InitApply(slice("b", "b", "1")), name),
            None
        );
        assert_eq!(
            relist.note(&Event::InitDone::<EndpointSlice>, name),
            Some(vec!["b".to_owned()])
        );
        assert_eq!(
            relist.note(&Event::InitDone::<EndpointSlice>, name),
            Some(vec![])
        );

        let mut relist: Relist<EndpointSlice> = Relist::default();
        assert!(matches!(relist.take(Event::Init), Seen::Listing));
        assert!(matches!(
            relist.take(Event::InitApply(slice("a", "a", "1"))),
            Seen::Listing
        ));
        assert!(matches!(
            relist.take(Event::Apply(slice("x", "x", "1"))),
            Seen::Apply(_)
        ));
        assert!(matches!(
            relist.take(Event::Delete(slice("x", "x", "1"))),
            Seen::Delete(_)
        ));
        relist.clear();
        match relist.take(Event::InitDone) {
            Seen::Listed(list) => assert!(list.is_empty(), "cleared: {list:?}"),
            other => panic!("{other:?}"),
        }
    }

    #[test]
    fn replacing_one_service_leaves_the_others() {
        let mut store = Store::new(service_of);
        store.apply(slice("a-1", "a", "1"));
        store.apply(slice("a-2", "a", "1"));
        store.apply(slice("b-1", "b", "1"));
        let touched = store.replace_service(
            &k("a"),
            vec![slice("a-2", "a", "1"), slice("a-3", "a", "1")],
        );
        assert_eq!(touched, BTreeSet::from([k("a")]));
        let names: Vec<_> = store
            .of_service(&k("a"))
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        assert_eq!(names, ["a-2", "a-3"]);
        assert_eq!(store.of_service(&k("b")).count(), 1);
        assert!(
            store
                .replace_service(
                    &k("a"),
                    vec![slice("a-2", "a", "1"), slice("a-3", "a", "1")]
                )
                .is_empty(),
            "same content: nothing touched"
        );
        assert_eq!(
            store.replace_service(&k("a"), vec![]),
            BTreeSet::from([k("a")])
        );
        assert_eq!(store.len(), 1);
    }
}
