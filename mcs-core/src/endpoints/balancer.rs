//! The balancer: snapshot publication off the request path, picks on it.

use std::cell::RefCell;
use std::collections::BTreeSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::{Duration, Instant};

use arc_swap::{ArcSwap, Guard};
use crossbeam_utils::CachePadded;
use thread_local::ThreadLocal;

use super::config::{BalancerConfig, ClusterPreference, Locality, Policy};
use super::hash::{self, mix64};
use super::layout::Tier;
use super::snapshot::{Builder, Rules, Snapshot, Touched};
use super::state::{EndpointState, Live, Outcome, Shared};
use crate::ClusterId;
use crate::discovery::{Endpoint, EndpointTable, Update};

/// Why no endpoint could be picked.
#[derive(Clone, Copy, Debug, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum PickError {
    /// Discovery has not delivered anything yet.
    #[error("no endpoint set resolved yet")]
    NotResolved,
    /// The service does not exist.
    #[error("the service does not exist")]
    DoesNotExist,
    /// The service exists but has no usable endpoint (none ready, none eligible, or all
    /// ejected with panic mode disabled).
    #[error("the service has no ready endpoints")]
    NoEndpoints,
}

/// What a pick needs from the caller.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub struct PickContext {
    /// A random number (for example from `fastrand::u64(..)`); all 64 bits are used.
    ///
    /// On a tier of [`PREFETCH_FROM`] endpoints or more, a settled p2c pick draws its
    /// candidates from this thread's previous random and prefetches the candidates of
    /// this one for the thread's next pick. A thread's first such pick uses its own (a
    /// thread that reuses an exited thread's cache entry continues from that thread's
    /// last).
    pub random: u64,
    /// The current time, which the caller already has.
    pub now: Instant,
    /// A session-affinity key (for example a hash of the client IP): picks with the same
    /// key go to the same endpoint while it stays in service. Tier and endpoint are then
    /// chosen by consistent hashing instead of the policy.
    pub affinity: Option<u64>,
}

impl PickContext {
    /// A context with a random number and the current time.
    pub fn new(random: u64, now: Instant) -> Self {
        Self {
            random,
            now,
            affinity: None,
        }
    }

    /// The same context with a session-affinity key.
    #[must_use]
    pub fn with_affinity(mut self, key: u64) -> Self {
        self.affinity = Some(key);
        self
    }
}

/// A picked endpoint. The request counts as in flight until [`Picked::complete`] is
/// called or the guard is dropped (a cancelled request: in-flight goes down, nothing is
/// recorded).
#[derive(Debug)]
pub struct Picked {
    /// Holding it is what counts the request in flight (see [`EndpointState`]).
    live: Arc<Live>,
    tier: usize,
}

impl Picked {
    /// Where to send the request.
    pub fn addr(&self) -> SocketAddr {
        self.live.addr()
    }

    /// The endpoint.
    pub fn endpoint(&self) -> &Endpoint {
        self.live.endpoint()
    }

    /// The tier it was picked from (0 is the most preferred; see
    /// [`Snapshot::tiers`]).
    pub fn tier(&self) -> usize {
        self.tier
    }

    /// Whether this pick is counted in flight on `state` (the state the endpoint had
    /// when it was picked; see [`Snapshot::find`]).
    pub fn is_on(&self, state: &EndpointState) -> bool {
        state.holds(&self.live)
    }

    /// Records the request's outcome and latency, and returns whether this outcome
    /// ejected the endpoint (so a caller can count ejections as they happen). Cost: a
    /// handful of atomics and one `exp` (the peak-EWMA decay); no lock, allocation or
    /// clock read.
    pub fn complete(self, outcome: Outcome, latency: Duration, now: Instant) -> bool {
        let now = self.live.shared().nanos(now);
        self.live.record(outcome == Outcome::Success, latency, now)
        // Dropping `self` ends the request's in-flight count.
    }
}

/// The endpoint set of one target and the picks over it.
///
/// ```
/// use std::net::SocketAddr;
/// use std::time::{Duration, Instant};
/// use mcs_core::ClusterId;
/// use mcs_core::discovery::{Endpoint, Update};
/// use mcs_core::endpoints::{Balancer, BalancerConfig, Locality, Outcome, PickContext};
///
/// let east: ClusterId = "east".parse().unwrap();
/// let t0 = Instant::now();
/// let balancer = Balancer::new(Locality::cluster(east.clone()), BalancerConfig::default(), t0);
/// let addr: SocketAddr = "10.1.0.7:9443".parse().unwrap();
/// balancer.apply(Update::Reset(vec![Endpoint::ready(addr, east)]));
///
/// let picked = balancer.pick(PickContext::new(0x5eed, t0)).unwrap();
/// assert_eq!(picked.addr(), addr);
/// picked.complete(Outcome::Success, Duration::from_millis(3), t0);
/// ```
#[derive(Debug)]
pub struct Balancer {
    snapshot: ArcSwap<Snapshot>,
    /// Bumped after every publication, so a thread's cached snapshot is checked with one
    /// load. Every pick reads it, so it gets its own cache line(s).
    version: CachePadded<AtomicU64>,
    /// Each picking thread's copy of the current snapshot and the version it was taken
    /// at (arc-swap's `Cache`, per thread).
    cache: ThreadLocal<RefCell<Cached>>,
    shared: Arc<Shared>,
    policy: Policy,
    /// Hands out the threads' round-robin starting points.
    rr: AtomicU64,
    config: BalancerConfig,
    locality: Locality,
    update: Mutex<UpdateState>,
}

#[derive(Debug)]
struct Cached {
    version: u64,
    snapshot: Arc<Snapshot>,
    /// This thread's round-robin position: each thread goes round on its own (as each
    /// Envoy worker does), so round robin writes no shared counter.
    rr: u32,
    /// The tier settled picks of `snapshot` come from, once one has been made. Held here,
    /// a settled pick goes from this entry straight to the tier's chunk list instead of
    /// through the snapshot and its tier list.
    settled: SettledTier,
    /// The random the next p2c pick on a large tier draws its candidates from (see
    /// [`PREFETCH_FROM`]), once a pick has prefetched them.
    ahead: Option<u64>,
}

/// A thread's handle on the tier that takes every pick while the plan is settled.
#[derive(Debug)]
struct SettledTier {
    index: usize,
    tier: Tier,
}

impl SettledTier {
    const NONE: usize = usize::MAX;

    fn none() -> Self {
        Self {
            index: Self::NONE,
            tier: Tier::default(),
        }
    }

    /// Tier `index` of `snap`, the snapshot this handle was taken from.
    #[inline(always)]
    fn get(&mut self, snap: &Snapshot, index: usize) -> &Tier {
        if self.index != index {
            self.take(snap, index);
        }
        &self.tier
    }

    /// Takes a handle on tier `index` of `snap`: on the first settled pick after a
    /// publication, and whenever the plan settles on another tier.
    #[cold]
    #[inline(never)]
    fn take(&mut self, snap: &Snapshot, index: usize) {
        self.tier = snap.tiers()[index].clone();
        self.index = index;
    }
}

#[derive(Debug, Default)]
struct UpdateState {
    table: EndpointTable,
    eligible: Option<BTreeSet<ClusterId>>,
    preference: Option<ClusterPreference>,
    /// The published tiers and pick-set counts, edited in place by each publication.
    builder: Builder,
    /// The snapshot before the current one, kept until the next publication so that a
    /// pick still holding it rarely drops the last reference itself.
    replaced: Option<Arc<Snapshot>>,
}

impl Balancer {
    /// A balancer with no endpoints yet. `base` is any instant before every `now` the
    /// caller will pass (time is kept as nanoseconds since it).
    pub fn new(locality: Locality, config: BalancerConfig, base: Instant) -> Self {
        Self {
            snapshot: ArcSwap::from_pointee(Snapshot::default()),
            version: CachePadded::new(AtomicU64::new(0)),
            cache: ThreadLocal::new(),
            shared: Arc::new(Shared::new(&config, base)),
            policy: config.policy,
            rr: AtomicU64::new(0),
            update: Mutex::new(UpdateState {
                eligible: config.eligible_clusters.clone(),
                ..UpdateState::default()
            }),
            config,
            locality,
        }
    }

    /// Applies a discovery update and publishes a new snapshot if anything changed.
    /// Returns whether it did. Called off the request path (it takes a lock and
    /// allocates; O(n) for n endpoints).
    pub fn apply(&self, update: Update) -> bool {
        self.apply_all(std::iter::once(update))
    }

    /// Applies several updates (for example everything a discovery stream has ready) and
    /// publishes at most one snapshot. Returns whether anything changed. An
    /// [`Update::ClusterPreference`] does what [`set_cluster_preference`](Self::set_cluster_preference)
    /// does.
    pub fn apply_all(&self, updates: impl IntoIterator<Item = Update>) -> bool {
        let mut st = self.lock();
        let st = &mut *st;
        let mut changed = false;
        // The addresses `Add`s and `Remove`s touch, with their entries before this call,
        // so the snapshot can be rebuilt for just those; `None` after a `Reset` or
        // `DoesNotExist`, which rebuild it all.
        let mut touched: Option<Vec<Touched>> = Some(Vec::new());
        let mut preferred = false;
        for update in updates {
            if let Update::ClusterPreference(preference) = update {
                if st.preference != preference {
                    st.preference = preference;
                    st.builder.invalidate();
                    preferred = true;
                }
                continue;
            }
            let before = |addr: &SocketAddr| (*addr, st.table.get_shared(addr).cloned());
            match (&update, touched.as_mut()) {
                (Update::Add(list), Some(touched)) => {
                    touched.extend(list.iter().map(|e| before(&e.addr)));
                }
                (Update::Remove(addrs), Some(touched)) => {
                    touched.extend(addrs.iter().map(before));
                }
                (Update::Reset(_) | Update::DoesNotExist, _) => touched = None,
                _ => {}
            }
            changed |= st.table.apply(update);
        }
        if preferred {
            // A new preference rebuilds the whole snapshot, once there is a set.
            touched = None;
        }
        if changed || (preferred && st.table.exists().is_some()) {
            if let Some(touched) = touched.as_mut() {
                // The first entry of each address is its state before this call.
                touched.sort_by_key(|&(addr, _)| addr);
                touched.dedup_by_key(|&mut (addr, _)| addr);
            }
            self.publish(st, touched.as_deref());
        }
        changed || preferred
    }

    /// Changes which clusters' endpoints are eligible (`None`: all), for example when the
    /// merge changes which clusters expose the port. Returns whether it changed.
    pub fn set_eligible_clusters(&self, clusters: Option<BTreeSet<ClusterId>>) -> bool {
        self.set_rule(|st| &mut st.eligible, clusters)
    }

    /// Sets the cluster preference (`None`: none), for example when the import's
    /// `clusterSelectorResults` for the caller's cluster change (KEP-5939); see
    /// [`ClusterPreference`]. Returns whether it changed.
    pub fn set_cluster_preference(&self, preference: Option<ClusterPreference>) -> bool {
        self.set_rule(|st| &mut st.preference, preference)
    }

    /// Sets one of the pick-set rules to `value` and, if that changed it, rebuilds the
    /// snapshot in full. Returns whether it changed.
    fn set_rule<T: PartialEq>(
        &self,
        rule: impl FnOnce(&mut UpdateState) -> &mut T,
        value: T,
    ) -> bool {
        let mut st = self.lock();
        let slot = rule(&mut st);
        if *slot == value {
            return false;
        }
        *slot = value;
        st.builder.invalidate();
        if st.table.exists().is_some() {
            self.publish(&mut st, None);
        }
        true
    }

    /// The cluster preference in force (`None`: none).
    pub fn cluster_preference(&self) -> Option<ClusterPreference> {
        self.lock().preference.clone()
    }

    /// The current snapshot.
    pub fn snapshot(&self) -> Guard<Arc<Snapshot>> {
        self.snapshot.load()
    }

    /// Picks an endpoint for one request.
    ///
    /// Cost: one load to check this thread's cached snapshot against the current one, a
    /// few relaxed loads, two candidate reads for p2c (and on a tier of
    /// [`PREFETCH_FROM`] endpoints or more, two prefetches for this thread's next pick),
    /// and one RMW on the endpoint's in-flight count (one more when the guard is
    /// dropped); no lock, clock read or allocation (except for the first pick on a
    /// thread, which makes that thread's cache entry). After an ejection, or once one
    /// expires, the first pick also recomputes the tier shares (O(n)).
    ///
    /// Each thread that picks keeps the snapshot it last used until its next pick, so a
    /// replaced snapshot lives on until every such thread has picked again.
    #[inline]
    pub fn pick(&self, ctx: PickContext) -> Result<Picked, PickError> {
        let version = self.version.load(Ordering::Acquire);
        let cell = match self.cache.get() {
            Some(cell) => cell,
            None => self.new_cache_entry(),
        };
        match cell.try_borrow_mut() {
            Ok(mut cached) => {
                if cached.version != version {
                    self.refresh(&mut cached, version);
                }
                let Cached {
                    snapshot,
                    rr,
                    settled,
                    ahead,
                    ..
                } = &mut *cached;
                self.pick_from(snapshot, ctx, rr, settled, ahead)
            }
            // Only if a pick re-entered on this thread (a pick never calls out).
            Err(_) => self.pick_uncached(ctx),
        }
    }

    /// A pick without this thread's cache (out of line: never taken in practice).
    #[cold]
    #[inline(never)]
    fn pick_uncached(&self, ctx: PickContext) -> Result<Picked, PickError> {
        let (mut rr, mut settled) = (self.next_rr_start(), SettledTier::none());
        let snap = self.snapshot.load();
        self.pick_from(&snap, ctx, &mut rr, &mut settled, &mut None)
    }

    /// Brings this thread's cache entry to the current snapshot (after a publication).
    #[cold]
    #[inline(never)]
    fn refresh(&self, cached: &mut Cached, version: u64) {
        cached.snapshot = self.snapshot.load_full();
        cached.version = version;
        cached.settled = SettledTier::none();
    }

    /// Where a thread starts going round: spread apart so threads do not move in step.
    fn next_rr_start(&self) -> u32 {
        (self.rr.fetch_add(1, Ordering::Relaxed) as u32).wrapping_mul(0x9e37_79b9)
    }

    /// This thread's cache entry, made on its first pick.
    #[cold]
    #[inline(never)]
    fn new_cache_entry(&self) -> &RefCell<Cached> {
        self.cache.get_or(|| {
            RefCell::new(Cached {
                version: 0,
                snapshot: self.snapshot.load_full(),
                rr: self.next_rr_start(),
                settled: SettledTier::none(),
                ahead: None,
            })
        })
    }

    #[inline(always)]
    fn pick_from(
        &self,
        snap: &Snapshot,
        ctx: PickContext,
        rr: &mut u32,
        settled: &mut SettledTier,
        ahead: &mut Option<u64>,
    ) -> Result<Picked, PickError> {
        if !snap.pickable() {
            return Err(unpickable(snap));
        }
        let generation = self.shared.generation.load(Ordering::Relaxed);
        let settled_tier = snap.plan().settled(generation);
        let (state, tier_index) = match settled_tier {
            // One tier takes everything and nothing is ejected: neither endpoint health nor
            // the time needs reading.
            Some(index) if ctx.affinity.is_none() => {
                let tier = settled.get(snap, index);
                let ctx = PickContext {
                    random: self.candidates_random(tier, ctx.random, ahead),
                    ..ctx
                };
                (
                    self.by_policy(tier, ctx, rr, |_| true, false, u64::MAX),
                    index,
                )
            }
            _ => self.pick_unsettled(snap, ctx, rr, generation, settled_tier)?,
        };
        Ok(Picked {
            live: state.begin(),
            tier: tier_index,
        })
    }

    /// The random a settled pick in `tier` draws its p2c candidates from: `random`
    /// itself, except on a tier of [`PREFETCH_FROM`] endpoints or more, where it is the
    /// thread's previous random (`ahead`), whose candidates that pick prefetched; the
    /// candidates of `random` are prefetched for the next pick.
    #[inline(always)]
    fn candidates_random(&self, tier: &Tier, random: u64, ahead: &mut Option<u64>) -> u64 {
        let n = tier.len();
        if n < PREFETCH_FROM || self.policy == Policy::RoundRobin {
            return random;
        }
        let (a, b) = p2c_pair(random, n);
        tier.at(a).prefetch();
        tier.at(b).prefetch();
        ahead.replace(random).unwrap_or(random)
    }

    /// A pick when the plan is not settled (several tiers take load, one is in panic, or
    /// something is ejected) or by affinity: out of line, so the settled pick's code stays
    /// small. Returns the state and its tier.
    #[inline(never)]
    fn pick_unsettled<'s>(
        &self,
        snap: &'s Snapshot,
        ctx: PickContext,
        rr: &mut u32,
        generation: u64,
        settled_tier: Option<usize>,
    ) -> Result<(&'s EndpointState, usize), PickError> {
        // The plan only ever chooses a tier with endpoints (its totals are the tiers'
        // sizes).
        let (tier_index, panic, quiet, now) = match settled_tier {
            Some(index) => (index, false, true, u64::MAX),
            None => self.unsettled_plan(snap, &ctx, generation)?,
        };
        let tier = &snap.tiers()[tier_index];
        let state = match ctx.affinity {
            Some(key) => by_affinity(snap, tier_index, key, panic, now),
            // Nothing is ejected: no endpoint's health needs reading.
            None if quiet => self.by_policy(tier, ctx, rr, |_| true, panic, now),
            None => {
                let usable = |s: &EndpointState| panic || s.usable(now);
                self.by_policy(tier, ctx, rr, usable, panic, now)
            }
        };
        Ok((state, tier_index))
    }

    /// The tier for a pick when the plan is not settled (several tiers take load, one is
    /// in panic, or something is ejected): the tier, whether it is in panic, whether
    /// nothing is ejected, and the time in the plan's units (`u64::MAX` when that is not
    /// needed).
    #[inline(always)]
    fn unsettled_plan(
        &self,
        snap: &Snapshot,
        ctx: &PickContext,
        generation: u64,
    ) -> Result<(usize, bool, bool, u64), PickError> {
        let plan = snap.plan();
        let quiet = plan.is_quiet(generation);
        let now = if quiet {
            u64::MAX
        } else {
            let now = self.shared.nanos(ctx.now);
            if plan.is_stale(generation, now) {
                snap.refresh(now, &self.shared, &self.config);
            }
            now
        };
        let tier_random = || mix64(ctx.affinity.unwrap_or(ctx.random) ^ TIER_SALT);
        let (tier, panic) = plan.choose(tier_random).ok_or(PickError::NoEndpoints)?;
        Ok((tier, panic, quiet, now))
    }

    /// The configured policy's choice in `tier`.
    #[inline(always)]
    fn by_policy<'t>(
        &self,
        tier: &'t Tier,
        ctx: PickContext,
        rr: &mut u32,
        usable: impl Fn(&EndpointState) -> bool,
        panic: bool,
        now: u64,
    ) -> &'t EndpointState {
        match self.policy {
            Policy::RoundRobin => tier.at(round_robin(tier, rr, &usable)),
            Policy::LeastLoaded => p2c(tier, ctx.random, &usable, EndpointState::pick_load),
            Policy::PeakEwma => self.by_peak_ewma(tier, ctx.random, ctx.now, panic, now),
        }
    }

    /// p2c on peak-EWMA cost, out of line so the other policies' picks carry none of its
    /// state.
    #[inline(never)]
    fn by_peak_ewma<'t>(
        &self,
        tier: &'t Tier,
        random: u64,
        instant: Instant,
        panic: bool,
        now: u64,
    ) -> &'t EndpointState {
        let params = self.shared.ewma_params();
        let clock = std::cell::OnceCell::new();
        let now_for_decay = || {
            *clock.get_or_init(|| match now {
                u64::MAX => self.shared.nanos(instant),
                now => now,
            })
        };
        let usable = |s: &EndpointState| panic || s.usable(now);
        p2c(tier, random, &usable, |s| {
            s.ewma_cost(now_for_decay, params)
        })
    }

    /// The caller's locality.
    pub fn locality(&self) -> &Locality {
        &self.locality
    }

    /// The configuration the balancer was built with (eligible clusters as of
    /// construction; see [`Balancer::eligible_clusters`]).
    pub fn config(&self) -> &BalancerConfig {
        &self.config
    }

    /// The clusters whose endpoints are currently eligible (`None`: all).
    pub fn eligible_clusters(&self) -> Option<BTreeSet<ClusterId>> {
        self.lock().eligible.clone()
    }

    /// Endpoints currently holding an ejection slot (an expired ejection holds its slot
    /// until a pick or a new ejection notices). Never more than
    /// [`Balancer::ejection_cap`].
    pub fn ejected(&self) -> usize {
        self.shared.ejected()
    }

    /// Endpoints of the current snapshot that are ejected at `now` (expired ejections do
    /// not count). A scan of the snapshot: for metrics and diagnostics, not the pick path.
    pub fn ejected_at(&self, now: Instant) -> usize {
        let snapshot = self.snapshot();
        snapshot
            .tiers()
            .iter()
            .flat_map(Tier::iter)
            .filter(|state| state.is_ejected(now))
            .count()
    }

    /// The most endpoints that may be ejected at once for the current set.
    pub fn ejection_cap(&self) -> usize {
        self.shared.cap()
    }

    fn lock(&self) -> MutexGuard<'_, UpdateState> {
        // A poisoned lock only means another updater panicked mid-update; the table is
        // still a valid set, so keep going with it.
        self.update.lock().unwrap_or_else(|e| e.into_inner())
    }

    fn publish(&self, st: &mut UpdateState, changed: Option<&[Touched]>) {
        // Only publishers (holding the update lock) replace the snapshot, so this is the
        // one the new snapshot replaces.
        let previous = self.snapshot.load_full();
        let rules = Rules {
            config: &self.config,
            eligible: st.eligible.as_ref(),
            preference: st.preference.as_ref(),
            locality: &self.locality,
        };
        let snapshot = Snapshot::build(&st.table, changed, &rules, &self.shared, &mut st.builder);
        self.snapshot.store(Arc::new(snapshot));
        self.version.fetch_add(1, Ordering::Release);
        st.replaced = Some(previous);
    }
}

/// Round robin over `tier` from this thread's position `rr`, skipping unusable
/// endpoints. Cost: a compare; a division only when the position is past the end (a
/// thread's first pick, or a tier that shrank); a scan only past ejected endpoints.
#[inline]
fn round_robin(tier: &Tier, rr: &mut u32, usable: &impl Fn(&EndpointState) -> bool) -> usize {
    let n = tier.len();
    let mut start = *rr as usize;
    if start >= n {
        start = if start == n { 0 } else { start % n };
    }
    // Tiers hold fewer than 2^32 endpoints.
    *rr = (start + 1) as u32;
    if usable(tier.at(start)) {
        return start;
    }
    (1..n)
        .map(|i| (start + i) % n)
        .find(|&i| usable(tier.at(i)))
        .unwrap_or(start)
}

/// Consistent hashing of `key` over tier `tier_index`: the snapshot's ring, or rendezvous
/// hashing without one.
#[inline(never)]
fn by_affinity(
    snap: &Snapshot,
    tier_index: usize,
    key: u64,
    panic: bool,
    now: u64,
) -> &EndpointState {
    let tier = &snap.tiers()[tier_index];
    let usable = |s: &EndpointState| panic || s.usable(now);
    tier.at(match snap.ring(tier_index) {
        Some(ring) => ring.lookup(key, |i| usable(tier.at(i))).unwrap_or(0),
        None => hash::rendezvous(key, tier.iter().map(|s| (s.key(), usable(s)))),
    })
}

/// Why nothing can be picked from `snap` (off the hot path).
#[cold]
fn unpickable(snap: &Snapshot) -> PickError {
    match snap.exists() {
        None => PickError::NotResolved,
        Some(false) => PickError::DoesNotExist,
        Some(true) => PickError::NoEndpoints,
    }
}

/// The two distinct indices p2c compares, from one 64-bit random number: the low half
/// picks the first of `n`, the high half the second among the other `n - 1` (Lemire's
/// multiply-shift range reduction, no division). `n` must be at least 2.
#[inline]
pub(crate) fn p2c_pair(random: u64, n: usize) -> (usize, usize) {
    let n = n as u64;
    let a = ((random & 0xffff_ffff) * n) >> 32;
    let mut b = ((random >> 32) * (n - 1)) >> 32;
    if b >= a {
        b += 1;
    }
    (a as usize, b as usize)
}

/// Power of two choices: the cheaper of two distinct random endpoints, preferring usable
/// ones. Cost: two candidate reads; when both candidates are ejected, up to two more
/// pairs, then a scan.
#[inline(always)]
fn p2c<'t, C: PartialOrd>(
    tier: &'t Tier,
    random: u64,
    usable: &impl Fn(&EndpointState) -> bool,
    cost: impl Fn(&EndpointState) -> C,
) -> &'t EndpointState {
    let n = tier.len();
    if n == 1 {
        return tier.at(0);
    }
    let mut r = random;
    for _ in 0..3 {
        let (a, b) = p2c_pair(r, n);
        let (sa, sb) = (tier.at(a), tier.at(b));
        match (usable(sa), usable(sb)) {
            (true, true) => return if cost(sb) < cost(sa) { sb } else { sa },
            (true, false) => return sa,
            (false, true) => return sb,
            (false, false) => r = mix64(r),
        }
    }
    let start = p2c_pair(random, n).0;
    let index = (1..n)
        .map(|i| (start + i) % n)
        .find(|&i| usable(tier.at(i)))
        .unwrap_or(start);
    tier.at(index)
}

/// From how many endpoints in a tier on a p2c pick prefetches the candidates of the
/// thread's next pick (see [`PickContext::random`]). At 64 bytes of counters per
/// endpoint, 1,024 endpoints outgrow a 32 or 48 KiB L1 data cache, so a pick would wait
/// on its candidates' lines; below that the prefetch only adds work.
pub const PREFETCH_FROM: usize = 1_024;

/// Separates the tier choice from the endpoint choice of the same random number.
const TIER_SALT: u64 = 0x7f4a_7c15_9e37_79b9;

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn ep(last: u8, cluster: &str) -> Endpoint {
        Endpoint::ready(
            SocketAddr::from(([127, 0, 0, last], 9443)),
            ClusterId::new(cluster).unwrap(),
        )
    }

    #[test]
    fn local_cluster_first_then_spill() {
        let t0 = Instant::now();
        let b = Balancer::new(
            Locality::cluster(ClusterId::new("east").unwrap()),
            BalancerConfig::default(),
            t0,
        );
        assert_eq!(
            b.pick(PickContext::new(1, t0)).unwrap_err(),
            PickError::NotResolved
        );
        b.apply(Update::Reset(vec![ep(1, "east"), ep(2, "west")]));
        for r in 0..20 {
            let p = b.pick(PickContext::new(r, t0)).unwrap();
            assert_eq!(p.endpoint().cluster.as_str(), "east");
        }
        let p = b.pick(PickContext::new(0, t0)).unwrap();
        for _ in 0..5 {
            let q = b.pick(PickContext::new(0, t0)).unwrap();
            q.complete(Outcome::Failure, Duration::ZERO, t0);
        }
        drop(p);
        let p = b.pick(PickContext::new(0, t0)).unwrap();
        assert_eq!(
            p.endpoint().cluster.as_str(),
            "west",
            "east ejected, spill to west"
        );
    }

    #[test]
    fn a_cluster_preference_update_applies_before_and_after_the_set() {
        let t0 = Instant::now();
        let b = Balancer::new(
            Locality::cluster(ClusterId::new("north").unwrap()),
            BalancerConfig::default(),
            t0,
        );
        let clusters = |b: &Balancer| {
            (0..64)
                .map(|r| b.pick(PickContext::new(mix64(r), t0)).unwrap())
                .map(|p| p.endpoint().cluster.as_str().to_owned())
                .collect::<BTreeSet<_>>()
        };
        let west_first = ClusterPreference::new([
            vec![ClusterId::new("west").unwrap()],
            vec![ClusterId::new("east").unwrap()],
        ])
        .unwrap();
        // Before any set: kept, nothing to pick yet.
        assert!(b.apply(Update::ClusterPreference(Some(west_first.clone()))));
        assert!(!b.apply(Update::ClusterPreference(Some(west_first.clone()))));
        assert_eq!(
            b.pick(PickContext::new(1, t0)).unwrap_err(),
            PickError::NotResolved
        );
        b.apply(Update::Reset(vec![
            ep(1, "east"),
            ep(2, "west"),
            ep(3, "west"),
        ]));
        assert_eq!(b.cluster_preference(), Some(west_first));
        assert_eq!(clusters(&b), BTreeSet::from(["west".to_owned()]));
        // West loses its endpoints: the next set takes over.
        b.apply(Update::Remove(vec![ep(2, "west").addr, ep(3, "west").addr]));
        assert_eq!(clusters(&b), BTreeSet::from(["east".to_owned()]));
        b.apply(Update::Add(vec![ep(2, "west")]));
        assert_eq!(clusters(&b), BTreeSet::from(["west".to_owned()]));
        // No preference: every cluster, in one update with a set change.
        assert!(b.apply_all([
            Update::ClusterPreference(None),
            Update::Add(vec![ep(3, "west")]),
        ]));
        assert_eq!(b.cluster_preference(), None);
        assert_eq!(
            clusters(&b),
            BTreeSet::from(["east".to_owned(), "west".to_owned()])
        );
        // The table of the set never holds the preference.
        let mut table = EndpointTable::new();
        assert!(!table.apply(Update::ClusterPreference(None)));
        assert_eq!(table.exists(), None);
    }

    #[test]
    fn a_threads_settled_tier_follows_every_publication() {
        // Every pick here is settled (one tier, nothing ejected), so each one goes
        // through this thread's handle on the tier; it must never outlive a publication.
        let t0 = Instant::now();
        for policy in [Policy::RoundRobin, Policy::LeastLoaded, Policy::PeakEwma] {
            let b = Balancer::new(
                Locality::cluster(ClusterId::new("east").unwrap()),
                BalancerConfig::default().policy(policy),
                t0,
            );
            let picks = |b: &Balancer| {
                (0..64)
                    .map(|r| {
                        let p = b.pick(PickContext::new(mix64(r), t0)).unwrap();
                        (p.addr().ip().to_string(), p.tier())
                    })
                    .collect::<BTreeSet<_>>()
            };
            let at = |last: u8, tier| (format!("127.0.0.{last}"), tier);
            b.apply(Update::Reset(vec![ep(1, "east"), ep(2, "east")]));
            assert_eq!(picks(&b), [at(1, 1), at(2, 1)].into(), "{policy:?}");
            b.apply(Update::Remove(vec![ep(1, "east").addr]));
            assert_eq!(picks(&b), [at(2, 1)].into(), "{policy:?}: 1 left");
            b.apply(Update::Add(vec![ep(3, "west")]));
            assert_eq!(picks(&b), [at(2, 1)].into(), "{policy:?}: east still first");
            b.apply(Update::Remove(vec![ep(2, "east").addr]));
            assert_eq!(picks(&b), [at(3, 2)].into(), "{policy:?}: only west left");
            b.apply(Update::Reset(vec![ep(4, "east")]));
            assert_eq!(picks(&b), [at(4, 1)].into(), "{policy:?}: a new set");
        }
    }

    #[test]
    fn a_threads_settled_tier_follows_every_ejection_and_its_end() {
        // Settled picks go through this thread's handle on the tier without reading any
        // endpoint's health; an ejection must end that at once, and the end of the
        // ejection must bring the endpoint back.
        let t0 = Instant::now();
        let later = t0 + Duration::from_secs(31); // past the 30 s base ejection
        for policy in [Policy::RoundRobin, Policy::LeastLoaded, Policy::PeakEwma] {
            let b = Balancer::new(
                Locality::cluster(ClusterId::new("east").unwrap()),
                BalancerConfig::default().policy(policy),
                t0,
            );
            b.apply(Update::Reset((1..=10).map(|i| ep(i, "east")).collect()));
            let picked = |b: &Balancer, now: Instant| {
                (0..400)
                    .map(|r| b.pick(PickContext::new(mix64(r), now)).unwrap().addr())
                    .collect::<BTreeSet<_>>()
            };
            let x = ep(3, "east").addr;
            assert!(picked(&b, t0).contains(&x), "{policy:?}");
            let snapshot = b.snapshot();
            let state = snapshot.find(x).unwrap();
            // The fifth failure ejects (`any` stops there).
            let ejected = (0..5).any(|_| state.report(Outcome::Failure, Duration::ZERO, t0));
            assert!(ejected, "{policy:?}: five failures eject");
            let during = picked(&b, t0);
            assert!(!during.contains(&x), "{policy:?}: {x} ejected");
            assert_eq!(during.len(), 9, "{policy:?}");
            assert!(picked(&b, later).contains(&x), "{policy:?}: {x} back");
            // Settled again, and still honouring the next ejection.
            let again = (0..5).any(|_| state.report(Outcome::Failure, Duration::ZERO, later));
            assert!(again, "{policy:?}: five more failures eject again");
            assert!(
                !picked(&b, later).contains(&x),
                "{policy:?}: {x} ejected again"
            );
        }
    }

    proptest! {
        #[test]
        fn p2c_pair_is_two_distinct_indices(random: u64, n in 2usize..100_000) {
            let (a, b) = p2c_pair(random, n);
            prop_assert!(a < n && b < n);
            prop_assert_ne!(a, b);
        }
    }

    #[test]
    fn p2c_pairs_are_uniform() {
        // Every unordered pair of 4 comes up about equally often.
        let mut counts = [[0u32; 4]; 4];
        let mut r = 1u64;
        for _ in 0..60_000 {
            r = mix64(r);
            let (a, b) = p2c_pair(r, 4);
            counts[a.min(b)][a.max(b)] += 1;
        }
        for (a, row) in counts.iter().enumerate() {
            for (b, &c) in row.iter().enumerate().skip(a + 1) {
                assert!((9_000..11_000).contains(&c), "pair {a},{b}: {c}");
            }
        }
    }

    #[test]
    fn send_sync() {
        fn is<T: Send + Sync + 'static>() {}
        is::<Balancer>();
        is::<Picked>();
        is::<Snapshot>();
        is::<Arc<Balancer>>();
    }
}
