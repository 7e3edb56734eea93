//! The endpoint-update fold as the spec states it, the pick set of a flat balancer and
//! what a balancer's snapshot holds:
//! the models `endpoints_fold.rs` and the `fold` fuzz target (`fuzz/fuzz_targets/fold.rs`,
//! through `#[path]`) compare the real fold and balancer with.

use std::collections::BTreeMap;
use std::net::SocketAddr;

use mcs_core::discovery::{Endpoint, Update};
use mcs_core::endpoints::Balancer;

/// The set the spec describes: start from the last `Reset` (or `DoesNotExist`, or
/// nothing), then apply the later `Add`s and `Remove`s in order.
pub(crate) fn model(updates: &[Update]) -> (BTreeMap<SocketAddr, Endpoint>, Option<bool>) {
    let start = updates
        .iter()
        .rposition(|u| matches!(u, Update::Reset(_) | Update::DoesNotExist));
    let mut set = BTreeMap::new();
    let mut exists = None;
    let rest = match start {
        Some(i) => {
            if let Update::Reset(list) = &updates[i] {
                set.extend(list.iter().map(|e| (e.addr, e.clone())));
                exists = Some(true);
            } else {
                exists = Some(false);
            }
            &updates[i + 1..]
        }
        None => updates,
    };
    for u in rest {
        match u {
            Update::Add(list) => set.extend(list.iter().map(|e| (e.addr, e.clone()))),
            Update::Remove(addrs) => {
                for a in addrs {
                    set.remove(a);
                }
            }
            Update::Reset(_) | Update::DoesNotExist => unreachable!(),
            // Not part of the set.
            Update::ClusterPreference(_) => continue,
        }
        exists = Some(true);
    }
    (set, exists)
}

/// The pick set of a flat balancer: ready and not terminating, else serving and
/// terminating.
pub(crate) fn pick_set(table: &BTreeMap<SocketAddr, Endpoint>) -> BTreeMap<SocketAddr, Endpoint> {
    let ready: BTreeMap<_, _> = table
        .iter()
        .filter(|(_, e)| e.ready && !e.terminating)
        .map(|(a, e)| (*a, e.clone()))
        .collect();
    if !ready.is_empty() {
        return ready;
    }
    table
        .iter()
        .filter(|(_, e)| e.serving && e.terminating)
        .map(|(a, e)| (*a, e.clone()))
        .collect()
}

/// What the balancer's current snapshot holds, by address.
pub(crate) fn snapshot_set(b: &Balancer) -> BTreeMap<SocketAddr, Endpoint> {
    b.snapshot()
        .tiers()
        .iter()
        .flatten()
        .map(|s| (s.endpoint().addr, s.endpoint().clone()))
        .collect()
}
