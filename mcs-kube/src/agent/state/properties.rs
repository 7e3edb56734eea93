//! What the agent knows of one member's `ClusterProperty` values (KEP-2149), for cluster
//! selection (KEP-5939): known once its watch has listed, unknown again while the watch
//! fails. A property watch that fails does not make the member unreachable: cluster
//! selection only ranks clusters, so the import keeps its previous results instead.

use kube::runtime::watcher::Event;
use mcs_core::api::v1beta1::ClusterProperty;
use mcs_core::selection::Properties;

/// One member's properties, as its watch shows them.
#[derive(Debug, Default)]
pub(crate) struct MemberProperties {
    /// Name to value, as of the last list and the events since.
    values: Properties,
    /// A list in progress (replaces `values` when done).
    listing: Option<Properties>,
    /// Whether the watch has listed once.
    listed: bool,
    /// The watch's error since its last event, if any.
    failing: Option<String>,
}

impl MemberProperties {
    /// Applies one watch event; returns whether what is known changed (values, or
    /// whether they are known).
    pub(crate) fn handle(&mut self, event: Event<ClusterProperty>) -> bool {
        let was = self.known().cloned();
        // A failed watch is back once it has listed again or shows a change.
        if matches!(event, Event::InitDone | Event::Apply(_) | Event::Delete(_)) {
            self.failing = None;
        }
        match event {
            Event::Init => self.listing = Some(Properties::new()),
            Event::InitApply(p) => {
                if let (Some(listing), Some(name)) = (&mut self.listing, p.metadata.name) {
                    listing.insert(name, p.spec.value);
                }
            }
            Event::InitDone => {
                if let Some(listed) = self.listing.take() {
                    self.values = listed;
                }
                self.listed = true;
            }
            Event::Apply(p) => {
                if let Some(name) = p.metadata.name {
                    self.values.insert(name, p.spec.value);
                }
            }
            Event::Delete(p) => {
                if let Some(name) = p.metadata.name {
                    self.values.remove(&name);
                }
            }
        }
        was.as_ref() != self.known()
    }

    /// The watch failed with `error`; returns whether the values were known until now.
    pub(crate) fn failed(&mut self, error: String) -> bool {
        let was_known = self.known().is_some();
        self.failing = Some(error);
        was_known
    }

    /// The values, when the watch has listed and is not failing.
    pub(crate) fn known(&self) -> Option<&Properties> {
        (self.listed && self.failing.is_none()).then_some(&self.values)
    }

    /// The watch's current error, if it is failing.
    pub(crate) fn error(&self) -> Option<&str> {
        self.failing.as_deref()
    }
}

/// A ClusterProperty `name` with `value`, for tests.
#[cfg(test)]
pub(super) fn property(name: &str, value: &str) -> ClusterProperty {
    ClusterProperty::new(
        name,
        mcs_core::api::ClusterPropertySpec {
            value: value.to_owned(),
        },
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn pairs(known: Option<&Properties>) -> Option<Vec<(&str, &str)>> {
        known.map(|p| p.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect())
    }

    /// Values are known from the end of the first list; events change them; a failing
    /// watch makes them unknown until its next event; a re-list replaces them whole.
    #[test]
    fn known_after_a_list_unknown_while_failing_replaced_by_a_relist() {
        let mut p = MemberProperties::default();
        assert_eq!(p.known(), None);
        assert!(!p.handle(Event::Init));
        assert!(!p.handle(Event::InitApply(property("region", "eu"))));
        assert_eq!(p.known(), None, "not known before the list is done");
        assert!(p.handle(Event::InitDone));
        assert_eq!(pairs(p.known()), Some(vec![("region", "eu")]));

        assert!(p.handle(Event::Apply(property("zone", "a"))));
        assert!(!p.handle(Event::Apply(property("zone", "a"))), "no change");
        assert!(p.handle(Event::Delete(property("region", "eu"))));
        assert_eq!(pairs(p.known()), Some(vec![("zone", "a")]));

        assert!(p.failed("watch: connection refused".into()));
        assert_eq!(p.known(), None);
        assert_eq!(p.error(), Some("watch: connection refused"));
        assert!(!p.failed("again".into()), "already unknown");

        // The watch lists again: what it lists replaces what was there.
        assert!(!p.handle(Event::Init), "still unknown while listing");
        assert!(!p.handle(Event::InitApply(property("region", "us"))));
        assert!(p.handle(Event::InitDone));
        assert_eq!(pairs(p.known()), Some(vec![("region", "us")]));
        assert_eq!(p.error(), None);
    }
}
