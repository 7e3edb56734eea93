//! A member's hub watches alone, for load tests of a hub: the scale bench's simulated
//! members watch the hub exactly as an agent does without running a whole agent each.
//!
//! [`watch_hub`] runs the agent's own hub sources (the member namespaces, every other
//! member's records in one watch, every member's Lease in one watch, the member's own
//! records) and their split into per-member events, and counts what arrives instead of
//! merging it: the hub serves it what it serves an agent, at a fraction of an agent's
//! memory.

use std::collections::{BTreeMap, HashSet};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};

use kube::runtime::watcher::Event;
use mcs_core::ClusterId;
use tokio::sync::mpsc;

use super::index::key_of;
use super::source::{self, Fact};

/// What a [`HubWatcher`] has taken in so far.
#[derive(Debug, Default)]
struct Counts {
    events: AtomicU64,
    errors: AtomicU64,
    records: AtomicU64,
}

/// One member's hub watches, running until dropped.
#[derive(Debug)]
pub struct HubWatcher {
    /// Its tasks: dropping the set aborts them.
    _tasks: tokio::task::JoinSet<()>,
    counts: Arc<Counts>,
}

impl HubWatcher {
    /// Events taken in: every watch event an agent's state would have handled.
    pub fn events(&self) -> u64 {
        self.counts.events.load(Ordering::Relaxed)
    }

    /// Watch errors seen (each one a retry of the watch).
    pub fn errors(&self) -> u64 {
        self.counts.errors.load(Ordering::Relaxed)
    }

    /// The other members' records known now (those of members whose namespace exists).
    pub fn records(&self) -> u64 {
        self.counts.records.load(Ordering::Relaxed)
    }
}

/// Watches `hub` as member `local`'s agent does, with `hub` carrying that member's hub
/// identity. Needs a Tokio runtime; stops when the [`HubWatcher`] is dropped.
pub fn watch_hub(hub: &kube::Client, local: &ClusterId) -> HubWatcher {
    let mut tasks = tokio::task::JoinSet::new();
    let (tx, mut rx) = mpsc::channel(256);
    let _members = source::hub::spawn(&mut tasks, &tx, local, hub);
    drop(tx);
    let counts = Arc::new(Counts::default());
    let seen = counts.clone();
    tasks.spawn(async move {
        // The records known per member, as keys (a list replaces a member's).
        let mut known: BTreeMap<ClusterId, HashSet<(String, String)>> = BTreeMap::new();
        let mut listing: BTreeMap<ClusterId, HashSet<(String, String)>> = BTreeMap::new();
        let mut total: usize = 0;
        while let Some(fact) = rx.recv().await {
            seen.events.fetch_add(1, Ordering::Relaxed);
            match fact {
                Fact::Record(id, event) => match event {
                    Event::Init => {
                        listing.insert(id, HashSet::new());
                    }
                    Event::InitApply(r) => {
                        listing.entry(id).or_default().insert(key_of(&r));
                    }
                    Event::InitDone => {
                        let list = listing.remove(&id).unwrap_or_default();
                        total += list.len();
                        if let Some(old) = known.insert(id, list) {
                            total -= old.len();
                        }
                    }
                    Event::Apply(r) => {
                        total += usize::from(known.entry(id).or_default().insert(key_of(&r)));
                    }
                    Event::Delete(r) => {
                        if let Some(records) = known.get_mut(&id) {
                            total -= usize::from(records.remove(&key_of(&r)));
                        }
                    }
                },
                Fact::Members(Event::Delete(ns)) => {
                    if let Some(old) = source::hub::member_of(&ns).and_then(|id| known.remove(&id))
                    {
                        total -= old.len();
                    }
                }
                Fact::WatchError(..) => {
                    seen.errors.fetch_add(1, Ordering::Relaxed);
                }
                _ => {}
            }
            seen.records.store(total as u64, Ordering::Relaxed);
        }
    });
    HubWatcher {
        _tasks: tasks,
        counts,
    }
}
