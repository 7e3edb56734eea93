//! Where each endpoint sits in a snapshot: tiers stored as copy-on-write chunks, and
//! the writer-side layout that edits them in place between snapshots.
//!
//! A tier is a list of fixed-size chunks behind `Arc`s. Publishing a snapshot after a
//! change copies only the chunks the change touched and shares every other chunk with
//! the previous snapshot, so the writer does not touch the reference counts and cache
//! lines of the endpoints pickers read.
//!
//! Positions are stable: an endpoint keeps its position while it stays in its tier; one
//! that leaves is replaced by the tier's last endpoint (`swap_remove`), and new ones are
//! appended. A tier built from scratch is in address order.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::{Arc, Weak};

use super::state::{EndpointState, Live, Shared, StateHandle};
use crate::discovery::Endpoint;

/// Endpoints per chunk (a power of two: a position splits into chunk and slot with a
/// shift and a mask).
const CHUNK: usize = 64;
const SHIFT: u32 = CHUNK.trailing_zeros();
const MASK: usize = CHUNK - 1;

/// One chunk of a tier. Aligned to a cache line so that its `Arc` counts, which the
/// writer touches when it shares the chunk with a new snapshot, sit on their own line
/// and never on one a pick reads.
///
/// Each occupied position holds a state and, in `holders`, the weak reference that counts
/// it as a holder rather than a request in flight (see [`EndpointState`]). Picks read
/// only `slots`, so kept apart the pointers they follow are 8 bytes each, eight to a
/// cache line.
#[derive(Debug)]
#[repr(align(64))]
struct Chunk {
    // Declared first, so they are dropped first: in-flight reads high, never low, in
    // between (as with a `StateHandle`).
    holders: [Option<Weak<Live>>; CHUNK],
    slots: [Option<EndpointState>; CHUNK],
}

impl Chunk {
    fn empty() -> Self {
        Self {
            holders: [const { None }; CHUNK],
            slots: [const { None }; CHUNK],
        }
    }

    /// Puts `state` (or nothing) at `slot`.
    fn set(&mut self, slot: usize, state: Option<StateHandle>) {
        let (weak, state) = state.map(StateHandle::into_parts).unzip();
        // The state goes in before its old holder count goes out, as above.
        let old = std::mem::replace(&mut self.slots[slot], state);
        self.holders[slot] = weak;
        drop(old);
    }
}

impl Clone for Chunk {
    fn clone(&self) -> Self {
        // The references first, then the holder counts, as in `StateHandle::clone`.
        let slots = std::array::from_fn(|i| self.slots[i].as_ref().map(EndpointState::dup));
        Self {
            holders: self.holders.clone(),
            slots,
        }
    }
}

/// One tier of a [`Snapshot`](super::Snapshot): its endpoints' live states, at stable
/// positions (see [`Snapshot::tiers`](super::Snapshot::tiers)).
#[derive(Clone, Debug, Default)]
pub struct Tier {
    /// Shared, so a picking thread can keep its own handle on the tier it picks from
    /// (one pointer less to follow per pick) for the cost of a reference count.
    chunks: Arc<[Arc<Chunk>]>,
    len: usize,
}

impl Tier {
    /// Number of endpoints in the tier.
    #[inline]
    pub fn len(&self) -> usize {
        self.len
    }

    /// Whether the tier has no endpoint.
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The endpoint state at `index`, if `index < len()`.
    #[inline]
    pub fn get(&self, index: usize) -> Option<&EndpointState> {
        if index >= self.len {
            return None;
        }
        self.chunks.get(index >> SHIFT)?.slots[index & MASK].as_ref()
    }

    /// The state at `index < len()`, for picks: one bounds check on the chunk list, none
    /// on the slot.
    #[inline(always)]
    pub(crate) fn at(&self, index: usize) -> &EndpointState {
        match &self.chunks[index >> SHIFT].slots[index & MASK] {
            Some(state) => state,
            None => empty_slot(index),
        }
    }

    /// The endpoint states in position order.
    pub fn iter(&self) -> Iter<'_> {
        Iter {
            tier: self,
            next: 0,
        }
    }
}

#[cold]
#[inline(never)]
fn empty_slot(index: usize) -> ! {
    panic!("tier position {index} is past the end")
}

/// The endpoint states of a [`Tier`] in position order.
#[derive(Clone, Debug)]
pub struct Iter<'a> {
    tier: &'a Tier,
    next: usize,
}

impl<'a> Iterator for Iter<'a> {
    type Item = &'a EndpointState;

    fn next(&mut self) -> Option<Self::Item> {
        let state = self.tier.get(self.next)?;
        self.next += 1;
        Some(state)
    }

    fn size_hint(&self) -> (usize, Option<usize>) {
        let left = self.tier.len - self.next;
        (left, Some(left))
    }
}

impl ExactSizeIterator for Iter<'_> {}

impl std::ops::Index<usize> for Tier {
    type Output = EndpointState;

    /// The endpoint state at `index`. Panics if `index >= len()`.
    #[inline]
    fn index(&self, index: usize) -> &EndpointState {
        match self.get(index) {
            Some(state) => state,
            None => panic!("tier position {index} out of range (len {})", self.len),
        }
    }
}

impl<'a> IntoIterator for &'a Tier {
    type Item = &'a EndpointState;
    type IntoIter = Iter<'a>;

    fn into_iter(self) -> Iter<'a> {
        self.iter()
    }
}

/// The writer's copy of the published tiers, edited in place under the update lock.
#[derive(Debug, Default)]
pub(crate) struct Layout {
    tiers: Vec<TierBuilder>,
    /// Where each endpoint is: (tier, position).
    index: BTreeMap<SocketAddr, (usize, usize)>,
    /// Bumped by every [`Layout::update`]; entries not stamped with it are removed.
    stamp: u64,
}

#[derive(Debug, Default)]
struct TierBuilder {
    chunks: Vec<Arc<Chunk>>,
    /// The endpoint at each position, as of the last update, and its stamp. Kept here so
    /// an update compares against writer-private memory, not the states pickers read.
    entries: Vec<(Arc<Endpoint>, u64)>,
}

impl TierBuilder {
    fn slot(&self, pos: usize) -> &EndpointState {
        match &self.chunks[pos >> SHIFT].slots[pos & MASK] {
            Some(state) => state,
            None => unreachable!("every position below len holds a state"),
        }
    }

    /// Writes `pos`, copying its chunk if a published snapshot shares it.
    fn set(&mut self, pos: usize, state: Option<StateHandle>) {
        Arc::make_mut(&mut self.chunks[pos >> SHIFT]).set(pos & MASK, state);
    }

    /// Updates the endpoint at `pos` to `endpoint` (same address and tier): nothing if it
    /// is unchanged, a successor state if only its conditions or hostname changed, a
    /// fresh one if its cluster or zone did.
    fn replace(&mut self, pos: usize, endpoint: &Arc<Endpoint>, shared: &Arc<Shared>) {
        let current = &mut self.entries[pos].0;
        // `Arc`'s equality compares pointers before values.
        if current == endpoint {
            return;
        }
        let same_place = current.cluster == endpoint.cluster && current.zone == endpoint.zone;
        *current = Arc::clone(endpoint);
        let old = self.slot(pos);
        let next = if same_place {
            old.successor(Arc::clone(endpoint))
        } else {
            old.retire();
            StateHandle::new(Arc::clone(endpoint), Arc::clone(shared))
        };
        self.set(pos, Some(next));
    }

    /// Appends `endpoint` with its fresh `state`; returns its position.
    fn push(&mut self, endpoint: &Arc<Endpoint>, stamp: u64, state: StateHandle) -> usize {
        let pos = self.entries.len();
        if pos >> SHIFT == self.chunks.len() {
            self.chunks.push(Arc::new(Chunk::empty()));
        }
        self.set(pos, Some(state));
        self.entries.push((Arc::clone(endpoint), stamp));
        pos
    }

    fn tier(&self) -> Tier {
        Tier {
            chunks: self.chunks.iter().map(Arc::clone).collect(),
            len: self.entries.len(),
        }
    }
}

impl Layout {
    /// Brings the layout to `set` (each endpoint with its tier, in address order, each
    /// address once, as the discovery table yields them), keeping the live state of every
    /// endpoint that stays in its tier with the same cluster and zone, and retiring the
    /// rest. Cost: one merge walk of `set` against the address index and a compare per
    /// endpoint, all in writer-private memory, plus a chunk copy per chunk touched;
    /// states that did not change are not touched.
    pub(crate) fn update(
        &mut self,
        tier_count: usize,
        set: &[(&Arc<Endpoint>, usize)],
        shared: &Arc<Shared>,
    ) {
        debug_assert!(set.windows(2).all(|w| w[0].0.addr < w[1].0.addr));
        self.ensure_tiers(tier_count);
        self.stamp += 1;
        let stamp = self.stamp;
        let mut added = Vec::new();
        let mut old = self.index.iter().peekable();
        for &(endpoint, tier) in set {
            // Entries before this address are leaving; the sweep below removes them.
            while old.next_if(|&(addr, _)| *addr < endpoint.addr).is_some() {}
            match old.next_if(|&(addr, _)| *addr == endpoint.addr) {
                Some((_, &(at, pos))) if at == tier => {
                    let builder = &mut self.tiers[tier];
                    builder.entries[pos].1 = stamp;
                    builder.replace(pos, endpoint, shared);
                }
                // New, or moved to another tier (its old place is not stamped, so the
                // sweep below retires it).
                _ => added.push((endpoint, tier)),
            }
        }
        // Every new state's cold part first, so that none is allocated between the parts
        // picks read.
        let prepared: Vec<_> = added
            .iter()
            .map(|&(endpoint, _)| StateHandle::prepare(Arc::clone(endpoint), Arc::clone(shared)))
            .collect();
        let placed = added
            .into_iter()
            .zip(prepared)
            .map(|((endpoint, tier), cold)| {
                let pos = self.tiers[tier].push(endpoint, stamp, StateHandle::start(cold));
                (endpoint.addr, (tier, pos))
            });
        if self.index.is_empty() {
            // In address order: a bulk build instead of one insert at a time.
            self.index = placed.collect();
        } else {
            for (addr, place) in placed {
                self.index.insert(addr, place);
            }
        }
        for tier in 0..self.tiers.len() {
            // From the end, so whatever `swap_remove` moves into a hole was already kept.
            for pos in (0..self.tiers[tier].entries.len()).rev() {
                if self.tiers[tier].entries[pos].1 != stamp {
                    self.remove(tier, pos);
                }
            }
        }
    }

    /// Brings one address to `desired` (its endpoint and tier, or `None` when it is not
    /// in the pick set). Cost: O(log n) plus at most two chunk copies.
    pub(crate) fn apply(
        &mut self,
        tier_count: usize,
        addr: SocketAddr,
        desired: Option<(&Arc<Endpoint>, usize)>,
        shared: &Arc<Shared>,
    ) {
        self.ensure_tiers(tier_count);
        let current = self.index.get(&addr).copied();
        match (desired, current) {
            (Some((endpoint, tier)), Some((at, pos))) if at == tier => {
                self.tiers[tier].replace(pos, endpoint, shared);
            }
            (desired, current) => {
                if let Some((at, pos)) = current {
                    self.remove(at, pos);
                }
                if let Some((endpoint, tier)) = desired {
                    let state = StateHandle::new(Arc::clone(endpoint), Arc::clone(shared));
                    let pos = self.tiers[tier].push(endpoint, self.stamp, state);
                    self.index.insert(addr, (tier, pos));
                }
            }
        }
    }

    fn ensure_tiers(&mut self, tier_count: usize) {
        if self.tiers.len() < tier_count {
            self.tiers.resize_with(tier_count, TierBuilder::default);
        }
    }

    /// Removes position `pos` of `tier`, moving the tier's last endpoint into it.
    fn remove(&mut self, tier: usize, pos: usize) {
        let builder = &mut self.tiers[tier];
        builder.slot(pos).retire();
        let addr = builder.entries[pos].0.addr;
        if self.index.get(&addr) == Some(&(tier, pos)) {
            self.index.remove(&addr);
        }
        let last = builder.entries.len() - 1;
        if pos != last {
            let moved = builder.slot(last).handle();
            builder.set(pos, Some(moved));
            builder.entries.swap(pos, last);
            let moved = builder.entries[pos].0.addr;
            if let Some(place) = self.index.get_mut(&moved) {
                *place = (tier, pos);
            }
        }
        builder.set(last, None);
        builder.entries.pop();
        if last & MASK == 0 {
            builder.chunks.pop();
        }
    }

    /// The tiers as they are now, sharing every chunk with the layout.
    pub(crate) fn tiers(&self, tier_count: usize) -> Vec<Tier> {
        (0..tier_count)
            .map(|t| self.tiers.get(t).map(TierBuilder::tier).unwrap_or_default())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ClusterId;
    use crate::endpoints::BalancerConfig;

    fn ep(i: u16, cluster: &str) -> Arc<Endpoint> {
        Arc::new(Endpoint::ready(
            SocketAddr::from(([10, 0, (i >> 8) as u8, i as u8], 80)),
            ClusterId::new(cluster).unwrap(),
        ))
    }

    fn shared() -> Arc<Shared> {
        Arc::new(Shared::new(
            &BalancerConfig::default(),
            std::time::Instant::now(),
        ))
    }

    /// Brings a one-tier `layout` to `all` but the endpoint at `leaving`, and returns the
    /// tier.
    fn update_all_but(
        layout: &mut Layout,
        all: &[Arc<Endpoint>],
        leaving: Option<usize>,
        shared: &Arc<Shared>,
    ) -> Tier {
        let gone = leaving.map(|i| all[i].addr);
        let set: Vec<_> = all
            .iter()
            .filter(|e| Some(e.addr) != gone)
            .map(|e| (e, 0))
            .collect();
        layout.update(1, &set, shared);
        layout.tiers(1).remove(0)
    }

    fn addrs(tier: &Tier) -> Vec<SocketAddr> {
        tier.iter().map(|s| s.endpoint().addr).collect()
    }

    #[test]
    fn built_in_address_order_then_stable_positions() {
        let shared = shared();
        let all: Vec<Arc<Endpoint>> = (0..200).map(|i| ep(i, "a")).collect();
        let mut layout = Layout::default();
        let before = update_all_but(&mut layout, &all, None, &shared);
        assert_eq!(before.len(), 200);
        assert!(addrs(&before).is_sorted());

        // Drop endpoint 10: the last one takes its place, everything else stays.
        let after = update_all_but(&mut layout, &all, Some(10), &shared);
        assert_eq!(after.len(), 199);
        assert_eq!(after[10].endpoint().addr, all[199].addr);
        for i in (0..199).filter(|&i| i != 10) {
            assert!(
                before[i].same_state(&after[i]),
                "position {i} kept its state"
            );
        }
        // Only the chunks of positions 10 and 199 were copied.
        let shared_chunks = (0..after.chunks.len())
            .filter(|&c| Arc::ptr_eq(&before.chunks[c], &after.chunks[c]))
            .count();
        assert_eq!(shared_chunks, after.chunks.len() - 2);
        assert!(after.get(199).is_none());
    }

    #[test]
    fn positions_are_one_pointer_and_copied_chunks_count_no_requests() {
        // What a pick reads per position: one pointer, eight to a cache line.
        assert_eq!(std::mem::size_of::<Option<EndpointState>>(), 8);

        let shared = shared();
        let all: Vec<Arc<Endpoint>> = (0..70).map(|i| ep(i, "a")).collect();
        let mut layout = Layout::default();
        let before = update_all_but(&mut layout, &all, None, &shared);
        let guards: Vec<_> = (0..3).map(|_| before[5].begin()).collect();
        let kept = before[6].handle();
        assert_eq!((before[5].in_flight(), before[6].in_flight()), (3, 0));

        // Removing endpoint 7 copies the first chunk while `before` still shares it: the
        // copy holds every state of the chunk once more, and no count moves.
        let after = update_all_but(&mut layout, &all, Some(7), &shared);
        assert!(!Arc::ptr_eq(&before.chunks[0], &after.chunks[0]));
        assert!(after[5].same_state(&before[5]));
        for tier in [&before, &after] {
            assert_eq!((tier[5].in_flight(), tier[6].in_flight()), (3, 0));
        }
        // The state moved into position 7 (from the end of the tier) counts nothing either.
        assert_eq!(after[7].endpoint().addr, all[69].addr);
        assert_eq!(after[7].in_flight(), 0);

        // Dropping the older snapshot, the handle and the guards leaves nothing in flight.
        drop(before);
        assert_eq!((after[5].in_flight(), kept.in_flight()), (3, 0));
        drop((guards, kept));
        assert!(after.iter().all(|s| s.in_flight() == 0));
    }

    #[test]
    fn tier_moves_and_empties() {
        let shared = shared();
        let a = ep(1, "a");
        let mut layout = Layout::default();
        layout.update(2, &[(&a, 0)], &shared);
        let first = layout.tiers(2)[0][0].handle();
        let b = ep(1, "b");
        layout.update(2, &[(&b, 1)], &shared);
        let tiers = layout.tiers(2);
        assert!(tiers[0].is_empty());
        assert_eq!(tiers[1][0].endpoint(), &*b);
        assert_eq!(first.ejection_word(), super::super::state::RETIRED);
        layout.update(2, &[], &shared);
        assert!(layout.tiers(2).iter().all(Tier::is_empty));
        assert!(layout.index.is_empty());
        assert!(layout.tiers.iter().all(|t| t.chunks.is_empty()));
    }
}
