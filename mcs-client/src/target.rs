//! Per-target state: the balancer, the discovery task that feeds it, and the host routing
//! table that maps request hosts to targets without parsing on the request path.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

use arc_swap::ArcSwap;
use metrics::Counter;
use tokio::sync::watch;
use tokio::task::AbortHandle;
use tracing::{Instrument, debug, info_span, warn};

use mcs_core::discovery::{Endpoint, EndpointTable, Resolution, Resolve, Target, Update};
use mcs_core::endpoints::{Balancer, BalancerConfig, Locality, Outcome};
use mcs_core::name::{McsName, Zone};

use crate::connect::Conns;
use crate::error::Error;
use crate::metrics::{EndpointGauges, TargetMetrics};

/// How often the discovery task refreshes the snapshot-age gauge and checks idleness.
pub(crate) const TICK: Duration = Duration::from_secs(5);
/// Backoff bounds for re-subscribing when a resolution stream ends.
const RESUBSCRIBE_MIN: Duration = Duration::from_secs(1);
const RESUBSCRIBE_MAX: Duration = Duration::from_secs(30);

/// What a balanced request needs to know about the endpoint it goes to. Responses carry it
/// (in [`Served`](crate::Served)), so it holds no connections.
#[derive(Debug)]
pub(crate) struct EndpointMeta {
    pub(crate) endpoint: Endpoint,
    pub(crate) success: Counter,
    pub(crate) failure: Counter,
    pub(crate) ejections: Counter,
}

impl EndpointMeta {
    fn new(endpoint: Endpoint, metrics: &TargetMetrics) -> Self {
        let (success, failure, ejections) = metrics.outcomes(&endpoint);
        Self {
            endpoint,
            success,
            failure,
            ejections,
        }
    }
}

/// An endpoint discovery lists: its metadata and its services (its connections). The
/// services are kept by address across changes of the endpoint's other fields (readiness,
/// zone), so those do not drop connections; they go when the address leaves the set and
/// the last request using them finishes.
#[derive(Clone, Debug)]
struct Listed {
    meta: Arc<EndpointMeta>,
    conns: Arc<Conns>,
}

/// Endpoint metadata by address. Keys come from discovery, not from requests, so a fast
/// non-keyed hash is fine here.
type MetaMap = HashMap<SocketAddr, Listed, BuildHasherDefault<AddrHasher>>;

/// FxHash (rustc's hasher): a multiply and a rotate per word.
#[derive(Default)]
struct AddrHasher(u64);

impl Hasher for AddrHasher {
    fn finish(&self) -> u64 {
        self.0
    }

    fn write(&mut self, bytes: &[u8]) {
        for chunk in bytes.chunks(8) {
            let mut word = [0u8; 8];
            word[..chunk.len()].copy_from_slice(chunk);
            self.write_u64(u64::from_le_bytes(word));
        }
    }

    fn write_u64(&mut self, word: u64) {
        self.0 = (self.0.rotate_left(5) ^ word).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }

    fn write_u8(&mut self, n: u8) {
        self.write_u64(u64::from(n));
    }

    fn write_u16(&mut self, n: u16) {
        self.write_u64(u64::from(n));
    }

    fn write_u32(&mut self, n: u32) {
        self.write_u64(u64::from(n));
    }

    fn write_usize(&mut self, n: usize) {
        self.write_u64(n as u64);
    }
}

/// Everything about one target that requests and its discovery task share.
#[derive(Debug)]
pub(crate) struct TargetShared {
    pub(crate) target: Target,
    /// `<namespace>/<name>:<port>`, for errors and logs.
    pub(crate) name: String,
    /// The ClusterSet name, `<service>.<namespace>.svc.<zone>`: what TLS verifies by default.
    pub(crate) host: Arc<str>,
    pub(crate) balancer: Balancer,
    pub(crate) metrics: TargetMetrics,
    endpoints: ArcSwap<MetaMap>,
    changed: watch::Sender<u64>,
    last_error: Mutex<Option<String>>,
    base: Instant,
    /// Nanoseconds since `base` + 1 at which the set was first seen empty; 0 = not empty.
    empty_since: AtomicU64,
    /// Seconds since `base` of the last request.
    last_used: AtomicU64,
    /// Nanoseconds since `base` of the last confirmation by discovery; 0 = never.
    confirmed_at: AtomicU64,
}

impl TargetShared {
    fn new(
        target: Target,
        zone: &Zone,
        locality: Locality,
        config: BalancerConfig,
        base: Instant,
    ) -> Self {
        let metrics = TargetMetrics::new(&target);
        let fqdn = target.service.to_fqdn(zone);
        Self {
            name: target.to_string(),
            host: Arc::from(fqdn.trim_end_matches('.')),
            balancer: Balancer::new(locality, config, base),
            metrics,
            endpoints: ArcSwap::default(),
            changed: watch::channel(0).0,
            last_error: Mutex::new(None),
            base,
            empty_since: AtomicU64::new(0),
            last_used: AtomicU64::new(0),
            confirmed_at: AtomicU64::new(0),
            target,
        }
    }

    /// The metadata of a picked endpoint, and what `service` makes of its services (made on
    /// the spot, for this request only, if discovery has not listed the address).
    ///
    /// Cost: one hash lookup in a lock-free snapshot, one reference count.
    pub(crate) fn endpoint<S>(
        &self,
        endpoint: &Endpoint,
        service: impl FnOnce(&Conns) -> S,
    ) -> (Arc<EndpointMeta>, S) {
        let listed = self.endpoints.load();
        match listed.get(&endpoint.addr) {
            Some(l) if l.meta.endpoint == *endpoint => (Arc::clone(&l.meta), service(&l.conns)),
            // Listed with other fields (a pick from an older snapshot): same connections.
            Some(l) => (
                Arc::new(EndpointMeta::new(endpoint.clone(), &self.metrics)),
                service(&l.conns),
            ),
            None => (
                Arc::new(EndpointMeta::new(endpoint.clone(), &self.metrics)),
                service(&Conns::default()),
            ),
        }
    }

    /// Notes a request at `now` (a store only when the second changed).
    pub(crate) fn touch(&self, now: Instant) {
        let secs = now.saturating_duration_since(self.base).as_secs();
        if self.last_used.load(Ordering::Relaxed) != secs {
            self.last_used.store(secs, Ordering::Relaxed);
        }
    }

    /// Publishes how many endpoints are ejected at `now` (a scan of the snapshot: called on
    /// an ejection and on the discovery tick, never per request).
    pub(crate) fn publish_ejected(&self, now: Instant) {
        self.metrics
            .ejected
            .set(self.balancer.ejected_at(now) as f64);
    }

    /// Feeds back an outcome for `addr` observed outside a request (a connection a pool
    /// made or failed to make), counted in the endpoint's outcome metrics like a request's.
    /// Nothing happens when the address is not in the pick set.
    #[cfg_attr(not(feature = "reqwest"), allow(dead_code))]
    pub(crate) fn report(
        &self,
        addr: SocketAddr,
        outcome: Outcome,
        latency: Duration,
        now: Instant,
    ) {
        let snapshot = self.balancer.snapshot();
        let Some(state) = snapshot.find(addr) else {
            return;
        };
        let listed = self.endpoints.load();
        let meta = listed.get(&addr).map(|l| &l.meta);
        if let Some(meta) = meta {
            match outcome {
                Outcome::Success => meta.success.increment(1),
                Outcome::Failure => meta.failure.increment(1),
            }
        }
        if state.report(outcome, latency, now) {
            if let Some(meta) = meta {
                meta.ejections.increment(1);
            }
            self.publish_ejected(now);
            debug!(service = %self.name, endpoint = %addr, "endpoint ejected by outlier detection");
        }
    }

    /// Notes that a pick found endpoints.
    pub(crate) fn picked(&self) {
        if self.empty_since.load(Ordering::Relaxed) != 0 {
            self.empty_since.store(0, Ordering::Relaxed);
        }
    }

    /// When the set was first seen empty (set to `now` if it was not known to be).
    pub(crate) fn empty_since(&self, now: Instant) -> Instant {
        let mark = self.nanos(now) + 1;
        let since =
            match self
                .empty_since
                .compare_exchange(0, mark, Ordering::Relaxed, Ordering::Relaxed)
            {
                Ok(_) => mark,
                Err(existing) => existing,
            };
        self.base + Duration::from_nanos(since - 1)
    }

    /// The endpoints discovery last published, in no particular order.
    pub(crate) fn endpoints(&self) -> Vec<Endpoint> {
        self.endpoints
            .load()
            .values()
            .map(|l| l.meta.endpoint.clone())
            .collect()
    }

    /// Subscribes to changes (any update or error from discovery).
    pub(crate) fn subscribe(&self) -> watch::Receiver<u64> {
        self.changed.subscribe()
    }

    /// The last error discovery reported since its last good update.
    pub(crate) fn last_error(&self) -> Option<String> {
        self.last_error
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .clone()
    }

    fn nanos(&self, now: Instant) -> u64 {
        now.saturating_duration_since(self.base)
            .as_nanos()
            .min(u128::from(u64::MAX - 1)) as u64
    }

    /// Applies one update from discovery (off the request path).
    fn apply(&self, update: Update, table: &EndpointTable, now: Instant) {
        let old = self.endpoints.load();
        let mut metas = MetaMap::with_capacity_and_hasher(table.len(), Default::default());
        for ep in table.endpoints() {
            let listed = match old.get(&ep.addr) {
                Some(l) if l.meta.endpoint == *ep => l.clone(),
                Some(l) => Listed {
                    meta: Arc::new(EndpointMeta::new(ep.clone(), &self.metrics)),
                    conns: Arc::clone(&l.conns),
                },
                None => Listed {
                    meta: Arc::new(EndpointMeta::new(ep.clone(), &self.metrics)),
                    conns: Arc::default(),
                },
            };
            metas.insert(ep.addr, listed);
        }
        // Publish new endpoints' metadata before the balancer can pick them, and drop
        // removed ones only after it can no longer pick them: a request finds its
        // endpoint's services, and `endpoints()` lists no endpoint still being picked.
        let removed = old.keys().any(|addr| !metas.contains_key(addr));
        if removed {
            let mut union = metas.clone();
            for (addr, listed) in old.iter() {
                union.entry(*addr).or_insert_with(|| listed.clone());
            }
            self.endpoints.store(Arc::new(union));
            self.balancer.apply(update);
            self.endpoints.store(Arc::new(metas));
        } else {
            self.endpoints.store(Arc::new(metas));
            self.balancer.apply(update);
        }
        let ready = table.endpoints().any(|e| e.ready);
        if ready || table.exists() != Some(true) {
            self.empty_since.store(0, Ordering::Relaxed);
        } else {
            let mark = self.nanos(now) + 1;
            let _ =
                self.empty_since
                    .compare_exchange(0, mark, Ordering::Relaxed, Ordering::Relaxed);
        }
        self.confirmed_at
            .store(self.nanos(now) + 1, Ordering::Relaxed);
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = None;
        self.changed.send_modify(|v| *v += 1);
    }

    fn error(&self, message: String) {
        self.metrics.resolve_errors.increment(1);
        *self.last_error.lock().unwrap_or_else(|e| e.into_inner()) = Some(message);
        self.changed.send_modify(|v| *v += 1);
    }

    fn snapshot_age(&self, now: Instant) -> Option<Duration> {
        match self.confirmed_at.load(Ordering::Relaxed) {
            0 => None,
            at => Some(Duration::from_nanos(self.nanos(now).saturating_sub(at - 1))),
        }
    }

    fn idle_for(&self, now: Instant) -> Duration {
        let last = self.last_used.load(Ordering::Relaxed);
        Duration::from_secs(
            now.saturating_duration_since(self.base)
                .as_secs()
                .saturating_sub(last),
        )
    }
}

/// A host and port the routing table knows, and its target.
#[derive(Clone, Debug)]
pub(crate) struct Route {
    pub(crate) port: u16,
    pub(crate) target: Arc<TargetShared>,
}

type HostMap = HashMap<Box<str>, Vec<Route>>;

/// Where a request goes.
pub(crate) enum Routing {
    /// Not a ClusterSet host: send it unchanged.
    Passthrough,
    /// A ClusterSet service.
    Target(Route),
    /// A ClusterSet host that cannot be balanced.
    Invalid(Error),
}

/// Settings the registry needs to start targets.
#[derive(Debug)]
pub(crate) struct RegistryConfig {
    pub(crate) zone: Zone,
    pub(crate) locality: Locality,
    pub(crate) balancer: BalancerConfig,
    pub(crate) idle_timeout: Option<Duration>,
}

/// All targets of one layer.
pub(crate) struct Registry {
    config: RegistryConfig,
    resolver: Arc<dyn Resolve>,
    base: Instant,
    /// Read on every request; replaced (copy on write) when a host is added or removed.
    hosts: ArcSwap<HostMap>,
    targets: Mutex<HashMap<Target, TargetEntry>>,
}

struct TargetEntry {
    shared: Arc<TargetShared>,
    task: AbortHandle,
}

impl Drop for TargetEntry {
    fn drop(&mut self) {
        self.task.abort();
    }
}

impl std::fmt::Debug for Registry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Registry")
            .field("config", &self.config)
            .finish_non_exhaustive()
    }
}

impl Registry {
    pub(crate) fn new(config: RegistryConfig, resolver: Arc<dyn Resolve>, base: Instant) -> Self {
        Self {
            config,
            resolver,
            base,
            hosts: ArcSwap::default(),
            targets: Mutex::new(HashMap::new()),
        }
    }

    /// The ClusterSet zone.
    #[cfg_attr(not(feature = "reqwest"), allow(dead_code))]
    pub(crate) fn zone(&self) -> &Zone {
        &self.config.zone
    }

    /// Routes a request by its host and port.
    ///
    /// Cost on the hot path: a case-insensitive suffix compare, one lock-free snapshot load
    /// and one hash lookup. Parsing and target creation happen once per host and port.
    pub(crate) fn route(self: &Arc<Self>, host: &str, port: u16) -> Routing {
        if !self.config.zone.contains(host) {
            return Routing::Passthrough;
        }
        if let Some(route) = self
            .hosts
            .load()
            .get(host)
            .and_then(|rs| rs.iter().find(|r| r.port == port))
        {
            return Routing::Target(route.clone());
        }
        self.add_host(host, port)
    }

    fn add_host(self: &Arc<Self>, host: &str, port: u16) -> Routing {
        let service = match McsName::parse(host, &self.config.zone) {
            Ok(McsName::Service(service)) => service,
            Ok(other) => {
                return Routing::Invalid(Error::NotAService {
                    host: host.to_owned(),
                    form: form_of(&other),
                });
            }
            Err(source) => {
                return Routing::Invalid(Error::InvalidName {
                    host: host.to_owned(),
                    source,
                });
            }
        };
        let target = Target { service, port };
        let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        let shared = match targets.get(&target) {
            Some(entry) => Arc::clone(&entry.shared),
            None => {
                let Ok(runtime) = tokio::runtime::Handle::try_current() else {
                    return Routing::Invalid(Error::NoRuntime {
                        service: target.to_string(),
                    });
                };
                let shared = Arc::new(TargetShared::new(
                    target.clone(),
                    &self.config.zone,
                    self.config.locality.clone(),
                    self.config.balancer.clone(),
                    self.base,
                ));
                let span = info_span!("mcs_discovery", service = %shared.name);
                let task = runtime
                    .spawn(
                        discover(
                            Arc::clone(&shared),
                            Arc::clone(&self.resolver),
                            Arc::downgrade(self),
                            self.config.idle_timeout,
                        )
                        .instrument(span),
                    )
                    .abort_handle();
                debug!(service = %shared.name, "discovery started");
                targets.insert(
                    target,
                    TargetEntry {
                        shared: Arc::clone(&shared),
                        task,
                    },
                );
                shared
            }
        };
        let route = Route {
            port,
            target: shared,
        };
        let mut hosts = HostMap::clone(&self.hosts.load());
        let routes = hosts.entry(host.into()).or_default();
        if let Some(existing) = routes.iter().find(|r| r.port == port) {
            // Another request added it first.
            return Routing::Target(existing.clone());
        }
        routes.push(route.clone());
        self.hosts.store(Arc::new(hosts));
        Routing::Target(route)
    }

    /// Forgets a target whose discovery task found it idle.
    fn remove(&self, target: &Target) {
        let mut targets = self.targets.lock().unwrap_or_else(|e| e.into_inner());
        let Some(entry) = targets.remove(target) else {
            return;
        };
        let mut hosts = HostMap::clone(&self.hosts.load());
        for routes in hosts.values_mut() {
            routes.retain(|r| !Arc::ptr_eq(&r.target, &entry.shared));
        }
        hosts.retain(|_, routes| !routes.is_empty());
        self.hosts.store(Arc::new(hosts));
        // Dropping `entry` aborts the task, which is the caller: it returns right after.
        drop(entry);
    }

    /// The target's shared state, if its discovery runs.
    pub(crate) fn get(&self, target: &Target) -> Option<Arc<TargetShared>> {
        self.targets
            .lock()
            .unwrap_or_else(|e| e.into_inner())
            .get(target)
            .map(|entry| Arc::clone(&entry.shared))
    }

    /// The number of live targets.
    pub(crate) fn len(&self) -> usize {
        self.targets.lock().unwrap_or_else(|e| e.into_inner()).len()
    }
}

/// The discovery task of one target: drives the resolution into the balancer, keeps the
/// last good set on errors, re-subscribes if the stream ends, and retires the target when
/// it has been idle for `idle_timeout`.
async fn discover(
    shared: Arc<TargetShared>,
    resolver: Arc<dyn Resolve>,
    registry: Weak<Registry>,
    idle_timeout: Option<Duration>,
) {
    let mut table = EndpointTable::new();
    let mut gauges = EndpointGauges::new(&shared.target);
    let mut backoff = RESUBSCRIBE_MIN;
    let mut tick = tokio::time::interval(TICK);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut first_stream = true;
    loop {
        let mut stream: Resolution = resolver.resolve(&shared.target);
        // A stream after the first one sends a preference before its first set, or has
        // none (see `Update::ClusterPreference`): the earlier stream's is lifted then.
        let mut preference_sent = first_stream;
        first_stream = false;
        loop {
            tokio::select! {
                item = next(&mut stream) => match item {
                    Some(Ok(Update::ClusterPreference(preference))) => {
                        backoff = RESUBSCRIBE_MIN;
                        preference_sent = true;
                        // Not part of the set: the balancer alone holds it.
                        if shared.balancer.set_cluster_preference(preference) {
                            gauges.publish_tiers(&shared.balancer.snapshot());
                            debug!(preference = ?shared.balancer.cluster_preference(), "cluster preference updated");
                        }
                    }
                    Some(Ok(update)) => {
                        backoff = RESUBSCRIBE_MIN;
                        if !preference_sent {
                            preference_sent = true;
                            shared.balancer.set_cluster_preference(None);
                        }
                        table.apply(update.clone());
                        shared.apply(update, &table, now());
                        gauges.publish(&table);
                        gauges.publish_tiers(&shared.balancer.snapshot());
                        shared.metrics.snapshot_age.set(0.0);
                        debug!(endpoints = table.len(), exists = ?table.exists(), "endpoint set updated");
                    }
                    Some(Err(err)) => {
                        warn!(error = %err, "discovery error; keeping the last good endpoint set");
                        shared.error(err.message);
                    }
                    None => break,
                },
                _ = tick.tick() => {
                    let now = now();
                    if let Some(age) = shared.snapshot_age(now) {
                        shared.metrics.snapshot_age.set(age.as_secs_f64());
                    }
                    // Ejections end silently when their deadline passes.
                    shared.publish_ejected(now);
                    // Live gauges are set again; those let go are not (see crate::metrics).
                    gauges.refresh();
                    if let Some(idle) = idle_timeout
                        && shared.idle_for(now) >= idle
                    {
                        debug!(idle = ?idle, "target idle; stopping discovery");
                        if let Some(registry) = registry.upgrade() {
                            registry.remove(&shared.target);
                        }
                        return;
                    }
                }
            }
        }
        warn!(retry_in = ?backoff, "resolution ended; subscribing again");
        shared.error("the resolver ended the resolution".to_owned());
        tokio::time::sleep(backoff).await;
        backoff = (backoff * 2).min(RESUBSCRIBE_MAX);
    }
}

/// What kind of name a valid non-service ClusterSet name is, for errors.
pub(crate) fn form_of(name: &McsName) -> &'static str {
    match name {
        McsName::Apex => "the zone apex",
        McsName::DnsVersion => "the dns-version name",
        McsName::SvcZone => "the `svc` name",
        McsName::Namespace(_) => "a namespace name",
        McsName::Service(_) => "a service name",
        McsName::Srv { .. } => "an SRV name",
        McsName::Endpoint { .. } => "a per-endpoint name",
    }
}

fn next(
    stream: &mut Resolution,
) -> impl Future<Output = Option<<Resolution as futures_core::Stream>::Item>> + '_ {
    std::future::poll_fn(move |cx| Pin::as_mut(stream).poll_next(cx))
}

/// The current time as the balancer sees it (Tokio's clock, so paused tests can move it).
pub(crate) fn now() -> Instant {
    tokio::time::Instant::now().into_std()
}
