//! One watch of a kind on the hub, split into the events each member's own watch would
//! have had: records across every member namespace, or every member's Lease in one
//! namespace.
//!
//! The hub serves each agent one watch of all members' records and one of their Leases
//! instead of one per member, so the watches the hub holds grow as N (agents) rather than
//! N² (agents times members). The agent's state still keeps each member's objects apart and
//! waits for each member's list; [`PerMember`] gives it exactly that, from the one stream.

use std::collections::BTreeMap;

use kube::Resource;
use kube::runtime::watcher::Event;
use mcs_core::ClusterId;

use crate::agent::index::{Relist, Seen, key_of};
use crate::hub::{lease_name, member_namespace};

/// Splits one watch's events by member: each object belongs to the member whose group holds
/// it, and only that member may write in its group, so the group, not anything the object
/// says of itself, names the member.
pub(crate) struct PerMember<K> {
    /// What an object's group is.
    by: By,
    /// The groups of the members known (from the member namespaces' own watch).
    members: BTreeMap<String, ClusterId>,
    /// Objects in groups of no known member, by group and name. There is no order between
    /// two watches: a member's records may arrive before its namespace does.
    orphans: BTreeMap<String, BTreeMap<String, K>>,
    /// The list in progress.
    listing: Relist<K>,
    /// Whether a list has completed: a member known after it gets its list at once.
    listed: bool,
    /// The agent's own group, watched apart or not at all: its objects are dropped here.
    own: String,
}

/// Which group of objects is a member's.
#[derive(Clone, Copy)]
enum By {
    /// Its namespace, `mcs-member-<id>` (see [`member_namespace`]): its records.
    Namespace,
    /// The object's name, [`lease_name`] (all in one namespace): its Lease.
    Name,
}

/// One member's event.
pub(crate) type MemberEvent<K> = (ClusterId, Event<K>);

impl<K: Resource> PerMember<K> {
    /// For the agent of cluster `local`: objects grouped by namespace, each member's in its
    /// own (records).
    pub(crate) fn by_namespace(local: &ClusterId) -> Self {
        Self::new(By::Namespace, local)
    }

    /// For the agent of cluster `local`: objects of one namespace, each member's named
    /// after it (Leases).
    pub(crate) fn by_name(local: &ClusterId) -> Self {
        Self::new(By::Name, local)
    }

    fn new(by: By, local: &ClusterId) -> Self {
        let mut split = Self {
            by,
            members: BTreeMap::new(),
            orphans: BTreeMap::new(),
            listing: Relist::default(),
            listed: false,
            own: String::new(),
        };
        split.own = split.group_of(local);
        split
    }

    /// Member `id`'s group.
    fn group_of(&self, id: &ClusterId) -> String {
        match self.by {
            By::Namespace => member_namespace(id),
            By::Name => lease_name(id),
        }
    }

    /// An object's group and name.
    fn key(&self, obj: &K) -> (String, String) {
        let (ns, name) = key_of(obj);
        match self.by {
            By::Namespace => (ns, name),
            By::Name => (name.clone(), name),
        }
    }

    /// Member `id` is known from now on. Once the watch has listed, it gets its list at
    /// once: what has arrived for its group so far (possibly nothing).
    pub(crate) fn add(&mut self, id: &ClusterId) -> Vec<MemberEvent<K>> {
        let ns = self.group_of(id);
        if ns == self.own || self.members.contains_key(&ns) {
            return Vec::new();
        }
        self.members.insert(ns.clone(), id.clone());
        if !self.listed {
            // The list's end gives it its list.
            return Vec::new();
        }
        let objects = self.orphans.remove(&ns).unwrap_or_default();
        list_of(id, objects.into_values())
    }

    /// Member `id` is gone: what arrives for its group is kept aside again (the state
    /// forgets the member when its namespace goes).
    pub(crate) fn remove(&mut self, id: &ClusterId) {
        self.members.remove(&self.group_of(id));
    }

    /// One event of the watch, as per-member events.
    pub(crate) fn event(&mut self, event: Event<K>) -> Vec<MemberEvent<K>> {
        match self.listing.take(event) {
            Seen::Listing => Vec::new(),
            Seen::Apply(obj) => {
                let (ns, name) = self.key(&obj);
                match self.members.get(&ns) {
                    Some(id) => vec![(id.clone(), Event::Apply(obj))],
                    None if ns == self.own => Vec::new(),
                    None => {
                        self.orphans.entry(ns).or_default().insert(name, obj);
                        Vec::new()
                    }
                }
            }
            Seen::Delete(obj) => {
                let (ns, name) = self.key(&obj);
                match self.members.get(&ns) {
                    Some(id) => vec![(id.clone(), Event::Delete(obj))],
                    None => {
                        if let Some(objects) = self.orphans.get_mut(&ns) {
                            objects.remove(&name);
                            if objects.is_empty() {
                                self.orphans.remove(&ns);
                            }
                        }
                        Vec::new()
                    }
                }
            }
            Seen::Listed(list) => {
                self.listed = true;
                // Every known member gets a list, empty ones included: the state waits for
                // each member's.
                let mut groups: BTreeMap<String, BTreeMap<String, K>> = self
                    .members
                    .keys()
                    .map(|ns| (ns.clone(), BTreeMap::new()))
                    .collect();
                for obj in list {
                    let (ns, name) = self.key(&obj);
                    if ns != self.own {
                        groups.entry(ns).or_default().insert(name, obj);
                    }
                }
                self.orphans.clear();
                let mut events = Vec::new();
                for (ns, objects) in groups {
                    match self.members.get(&ns) {
                        Some(id) => events.extend(list_of(id, objects.into_values())),
                        None => {
                            self.orphans.insert(ns, objects);
                        }
                    }
                }
                events
            }
        }
    }
}

/// A member's whole list as the events of a watch that (re-)listed.
fn list_of<K>(id: &ClusterId, objects: impl Iterator<Item = K>) -> Vec<MemberEvent<K>> {
    let mut events = vec![(id.clone(), Event::Init)];
    events.extend(objects.map(|obj| (id.clone(), Event::InitApply(obj))));
    events.push((id.clone(), Event::InitDone));
    events
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::coordination::v1::Lease;
    use kube::api::ObjectMeta;
    use kube::runtime::watcher::Event;
    use mcs_core::ClusterId;

    use super::PerMember;

    fn id(s: &str) -> ClusterId {
        ClusterId::new(s).unwrap()
    }

    fn obj(ns: &str, name: &str) -> Lease {
        Lease {
            metadata: ObjectMeta {
                namespace: Some(ns.to_owned()),
                name: Some(name.to_owned()),
                ..Default::default()
            },
            spec: None,
        }
    }

    /// Events as `member kind object` lines, for comparing.
    fn show(events: Vec<(ClusterId, Event<Lease>)>) -> Vec<String> {
        let name = |o: &Lease| {
            format!(
                "{}/{}",
                o.metadata.namespace.as_deref().unwrap(),
                o.metadata.name.as_deref().unwrap()
            )
        };
        events
            .into_iter()
            .map(|(id, e)| match e {
                Event::Init => format!("{id} Init"),
                Event::InitApply(o) => format!("{id} InitApply {}", name(&o)),
                Event::InitDone => format!("{id} InitDone"),
                Event::Apply(o) => format!("{id} Apply {}", name(&o)),
                Event::Delete(o) => format!("{id} Delete {}", name(&o)),
            })
            .collect()
    }

    fn list(split: &mut PerMember<Lease>, objects: Vec<Lease>) -> Vec<String> {
        let mut events = split.event(Event::Init);
        for o in objects {
            events.extend(split.event(Event::InitApply(o)));
        }
        events.extend(split.event(Event::InitDone));
        show(events)
    }

    #[test]
    fn a_list_is_split_into_one_list_per_known_member_empty_ones_included() {
        let mut split = PerMember::by_namespace(&id("east"));
        assert!(split.add(&id("west")).is_empty(), "nothing before the list");
        assert!(split.add(&id("north")).is_empty());
        let events = list(
            &mut split,
            vec![
                obj("mcs-member-west", "a"),
                obj("mcs-member-east", "own"),
                obj("mcs-member-west", "b"),
                obj("elsewhere", "x"),
            ],
        );
        assert_eq!(
            events,
            [
                "north Init",
                "north InitDone",
                "west Init",
                "west InitApply mcs-member-west/a",
                "west InitApply mcs-member-west/b",
                "west InitDone",
            ]
        );
        // Changes go to their member; the agent's own and unknown namespaces' go nowhere.
        assert_eq!(
            show(split.event(Event::Apply(obj("mcs-member-west", "c")))),
            ["west Apply mcs-member-west/c"]
        );
        assert_eq!(
            show(split.event(Event::Delete(obj("mcs-member-north", "d")))),
            ["north Delete mcs-member-north/d"]
        );
        assert!(
            split
                .event(Event::Apply(obj("mcs-member-east", "own")))
                .is_empty()
        );
        assert!(split.event(Event::Apply(obj("elsewhere", "y"))).is_empty());
    }

    #[test]
    fn a_member_known_after_its_objects_gets_them_as_its_list() {
        let mut split = PerMember::by_namespace(&id("east"));
        // South's objects arrive before its namespace: in the list, then as changes.
        list(&mut split, vec![obj("mcs-member-south", "a")]);
        assert!(
            split
                .event(Event::Apply(obj("mcs-member-south", "b")))
                .is_empty()
        );
        assert!(
            split
                .event(Event::Apply(obj("mcs-member-south", "c")))
                .is_empty()
        );
        assert!(
            split
                .event(Event::Delete(obj("mcs-member-south", "c")))
                .is_empty()
        );
        assert_eq!(
            show(split.add(&id("south"))),
            [
                "south Init",
                "south InitApply mcs-member-south/a",
                "south InitApply mcs-member-south/b",
                "south InitDone",
            ]
        );
        assert!(split.add(&id("south")).is_empty(), "known already");
        // A member with nothing yet gets an empty list, so the state does not wait for it.
        assert_eq!(show(split.add(&id("west"))), ["west Init", "west InitDone"]);
        // The agent's own cluster is never a member here.
        assert!(split.add(&id("east")).is_empty());
    }

    #[test]
    fn a_removed_member_is_forgotten_and_a_relist_replaces_what_was_kept_aside() {
        let mut split = PerMember::by_namespace(&id("east"));
        split.add(&id("west"));
        list(&mut split, vec![obj("mcs-member-west", "a")]);
        split.remove(&id("west"));
        // Its namespace's deletion deletes its objects: nothing for the state.
        assert!(
            split
                .event(Event::Delete(obj("mcs-member-west", "a")))
                .is_empty()
        );
        assert!(
            split
                .event(Event::Apply(obj("mcs-member-west", "late")))
                .is_empty()
        );
        // A re-list after a gap: what it lists is the truth, for orphans too.
        list(&mut split, vec![obj("mcs-member-south", "s")]);
        assert_eq!(
            show(split.add(&id("south"))),
            [
                "south Init",
                "south InitApply mcs-member-south/s",
                "south InitDone"
            ]
        );
        assert_eq!(show(split.add(&id("west"))), ["west Init", "west InitDone"]);
    }

    #[test]
    fn a_member_whose_id_is_long_is_found_by_its_hashed_namespace() {
        let long = id(&"a".repeat(63));
        let ns = crate::hub::member_namespace(&long);
        let mut split = PerMember::by_namespace(&id("east"));
        split.add(&long);
        let events = split.event(Event::Init);
        assert!(events.is_empty());
        split.event(Event::InitApply(obj(&ns, "r")));
        let events = show(split.event(Event::InitDone));
        assert_eq!(events[1], format!("{long} InitApply {ns}/r"));
    }

    #[test]
    fn leases_in_one_namespace_go_to_the_member_they_are_named_after() {
        let mut split = PerMember::by_name(&id("east"));
        split.add(&id("west"));
        let events = list(
            &mut split,
            vec![
                obj("mcs-hub-leases", "west"),
                obj("mcs-hub-leases", "east"),
                obj("mcs-hub-leases", "south"),
            ],
        );
        assert_eq!(
            events,
            [
                "west Init",
                "west InitApply mcs-hub-leases/west",
                "west InitDone"
            ]
        );
        assert_eq!(
            show(split.event(Event::Apply(obj("mcs-hub-leases", "west")))),
            ["west Apply mcs-hub-leases/west"]
        );
        assert!(
            split
                .event(Event::Apply(obj("mcs-hub-leases", "east")))
                .is_empty(),
            "the agent's own Lease is nobody's here"
        );
        assert_eq!(
            show(split.add(&id("south"))),
            [
                "south Init",
                "south InitApply mcs-hub-leases/south",
                "south InitDone"
            ]
        );
        assert!(split.add(&id("east")).is_empty());
    }
}
