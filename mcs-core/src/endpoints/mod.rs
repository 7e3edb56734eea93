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
//! # What a pick costs, and what a publication costs
//!
//! - A pick checks its thread's cached copy of the snapshot with one load (arc-swap's
//!   `Cache` idea, kept per thread), reads two candidates for p2c, and takes one
//!   reference on the chosen endpoint's counters: that reference *is* the in-flight
//!   count, so starting and ending a request are one atomic each.
//! - Tiers are stored as copy-on-write chunks of 64 endpoints with stable positions
//!   ([`Tier`]). An `Add` or `Remove` rebuilds only the addresses it touches and copies
//!   only the chunks they sit in, so the writer never walks the cache lines pickers read,
//!   and picks run as fast while snapshots are swapped every millisecond as without. A
//!   `Reset`, a change of eligible clusters, or a change that flips the pick-set rules
//!   (the serving-terminating fallback, `PreferSameZone` narrowing) takes a full pass.
//!
//! # How a pick works
//!
//! 1. **Pick set.** Ready, non-terminating endpoints of eligible clusters
//!    ([`BalancerConfig::eligible_clusters`]); if there is none, serving-but-terminating
//!    ones (KEP-1669). `trafficDistribution: PreferSameZone` narrows the set to the
//!    caller's zone when it has any endpoint there.
//! 2. **Tiers** ([`Tiering`]): by default the caller's zone in its cluster, the rest of
//!    its cluster, then other clusters; or an explicit cluster order, or one pinned
//!    cluster.
//! 3. **Tier choice**, Envoy's priority load: a tier's health is
//!    `min(1, overprovisioning × healthy / total)` (1.4 by default), tiers take load in
//!    order and the remainder spills to the next ones; below the panic threshold (50 %)
//!    health is ignored. The caller's random number chooses the tier.
//! 4. **Endpoint choice** inside the tier ([`Policy`]): round robin, power of two choices
//!    on in-flight requests, or on peak-EWMA latency × (in-flight + 1) (linkerd's
//!    30 ms default RTT and 10 s decay, decayed when a request completes rather than on
//!    every read, which is what makes tower's `PeakEwma` cost ~450 ns). A pick with an
//!    affinity key ([`PickContext::with_affinity`]) uses consistent hashing instead.
//! 5. **Outlier detection** ([`OutlierConfig`]): 5 consecutive failures eject an
//!    endpoint for 30 s × the number of its ejections, at most 300 s; at most 10 % of the
//!    set is ejected at once, enforced by a counter that an ejection must reserve from.
//!    An ejected endpoint is back in service when its deadline passes.
//!
//! Measured costs are in `benches/endpoint_selection.rs`; the design notes and anchors
//! are in `CLIENT-LB.md`.

mod balancer;
mod config;
mod hash;
mod layout;
mod plan;
mod snapshot;
mod state;

pub use balancer::{Balancer, Outcome, PREFETCH_FROM, PickContext, PickError, Picked};
pub use config::{BalancerConfig, Locality, OutlierConfig, Policy, Tiering, TrafficDistribution};
pub use layout::{Iter as TierIter, Tier};
pub use snapshot::Snapshot;
pub use state::{EndpointState, StateHandle};
