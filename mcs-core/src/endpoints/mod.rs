//! Endpoint snapshots and selection: local first, spill-over, outlier ejection.
//!
//! A [`Balancer`] holds the current endpoint set of one target as an immutable
//! [`Snapshot`] behind an `ArcSwap`. Discovery updates ([`Balancer::apply`]) fold into an
//! [`EndpointTable`](crate::discovery::EndpointTable) and build a new snapshot off the
//! request path; requests ([`Balancer::pick`]) load the current one and pick without
//! locks, allocation or clock reads (the caller passes `now` and a random number).
//! Per-endpoint live state (in-flight count, peak-EWMA latency, consecutive failures,
//! ejection deadline and count) lives in [`EndpointState`], keyed by address, and
//! survives snapshot swaps.
//!
//! Every pick returns a [`Picked`] guard that counts the request in flight until it is
//! completed with an [`Outcome`] (or dropped, which counts as cancelled).
//!
//! # How a pick works
//!
//! 1. **Pick set.** Endpoints of eligible clusters ([`BalancerConfig::eligible_clusters`]);
//!    with a [`ClusterPreference`] (KEP-5939's cluster selection), only those of its first
//!    set that has a ready or serving one. Of these, the ready, non-terminating ones; if
//!    there is none, serving-but-terminating ones (KEP-1669). `trafficDistribution:
//!    PreferSameZone` narrows the set to the caller's zone when it has any endpoint there.
//! 2. **Tiers** ([`Tiering`]): by default the caller's zone in its cluster, the rest of
//!    its cluster, then other clusters; or an explicit cluster order, or one pinned
//!    cluster.
//! 3. **Tier choice**, Envoy's priority load: a tier's health is
//!    `min(1, overprovisioning × healthy / total)` (1.4 by default), tiers take load in
//!    order and the remainder spills to the next ones; below the panic threshold (50 %)
//!    health is ignored. The caller's random number chooses the tier.
//! 4. **Endpoint choice** inside the tier ([`Policy`]): round robin, power of two choices
//!    on in-flight requests, or on peak-EWMA latency × (in-flight + 1) (linkerd's
//!    30 ms default RTT and 10 s decay; the decay runs when a request completes, so a
//!    pick never computes an `exp`). A pick with an affinity key
//!    ([`PickContext::with_affinity`]) uses consistent hashing instead.
//! 5. **Outlier detection** ([`OutlierConfig`]): 5 consecutive failures eject an
//!    endpoint for 30 s × the number of its ejections, at most 300 s; at most 10 % of the
//!    set is ejected at once, enforced by a counter that an ejection must reserve from.
//!    An ejected endpoint is back in service when its deadline passes.
//!
//! A pick checks its thread's cached snapshot with one load and takes one reference on
//! the chosen endpoint's counters; that reference *is* the in-flight count, so starting
//! and ending a request are one atomic each.
//!
//! Publication edits the previous snapshot's tiers rather than rebuilding them: tiers are
//! copy-on-write chunks at stable positions ([`Tier`]), and an `Add` or `Remove` copies
//! only the chunks of the addresses it touches, so the writer stays off the memory
//! pickers read. A `Reset`, a change of eligible clusters, or a change that flips the
//! pick-set rules (the serving-terminating fallback, `PreferSameZone` narrowing) takes a
//! full pass.
//!
//! # Modules
//!
//! Each module uses only the ones listed before it:
//!
//! - `config` (settings), `hash` (affinity hashing over endpoint keys) and `plan` (tier
//!   shares) use none;
//! - `state`: per-endpoint live state, ejection accounting, [`Outcome`];
//! - `layout`: tiers as chunks, and the writer's edits to them;
//! - `snapshot`: the pick set grouped into tiers, built from the discovery table;
//! - `balancer`: publication and picks.
//!
//! Pick and publication costs are measured by `benches/endpoint_selection.rs`.

mod balancer;
mod config;
mod hash;
mod layout;
mod plan;
mod snapshot;
mod state;

pub use balancer::{Balancer, PREFETCH_FROM, PickContext, PickError, Picked};
pub use config::{
    BalancerConfig, ClusterPreference, ClusterPreferenceError, Locality, OutlierConfig, Policy,
    Tiering, TrafficDistribution,
};
pub use layout::{Iter as TierIter, Tier};
pub use snapshot::Snapshot;
pub use state::{EndpointState, Outcome, StateHandle};
