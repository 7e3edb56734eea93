//! Churn soak (issue #8): sustained concurrent requests through `mcs-client` to real HTTP
//! servers on loopback while endpoints are added, removed, made unready and broken
//! thousands of times.
//!
//! Two phases run with the same load, each against its own layer, client and servers
//! (fresh loopback addresses `127.91.x.y` and `127.92.x.y`, never reused):
//!
//! - `baseline`: a fixed set of servers, no churn;
//! - `churn`: the same, while a churn task, every `--churn-every` (default 20 ms), does one
//!   of: **add** a server on a new loopback address and announce it (every fourth time
//!   as a full `Reset` of the set, otherwise as an `Add`); **remove** an endpoint from
//!   discovery, then stop its server gracefully after `--drain`; mark an endpoint
//!   **unready** (ready again 50-500 ms later); or make a server **fail**
//!   (rotating three ways: `refuse` kills the server abruptly, listener and connections
//!   dropped, while it stays in discovery, so connects are refused; `reset` closes every
//!   connection without an answer; `503` answers 503) and **recover** it 0.5-3 s later
//!   (restarted on the same address, or healthy again). At least half of `--servers`
//!   stay serving, at most `--servers` + 4 are in the set, and at most `--max-failing`
//!   (default 2) are broken at a time.
//!
//! The layer: `Retry::new(CloneBody)` (2 retries, idempotent requests also retried when
//! the connection closed before the response head, default budget 20 % + 10/s), outlier
//! detection ejecting after 5 consecutive failures for `--base-ejection` × k (default
//! 1 s, at most 10×), at most `--max-ejection-percent` of the set (default 25, so two
//! broken endpoints can always both be ejected once older ejections have ended), one flat
//! tier, p2c least-loaded. Every server is its own "cluster" (`ep-<x>-<y>-<z>`) so that
//! the layer's per-cluster metrics (`mcs_client_responses_total`,
//! `mcs_client_ejections_total`), read through a recorder installed here, are per
//! endpoint: that gives, per failure event, the failed attempts the layer saw and how many
//! failed before the first ejection.
//!
//! What counts: a **failed** request is one whose call returned an error (the layer's own
//! errors included), took more than 10 s (stuck), whose body failed after the response
//! head, or that got a status other than 2xx or 5xx. The target is zero in both phases; any makes the binary exit with status 1, after
//! printing the most frequent errors. A 503 from a server in `503` mode is a response: it
//! is counted separately (`5xx`), is not retried by design, and feeds outlier detection.
//!
//! The load: `--workers` tasks (default 32) share `--rate` requests per second (default
//! 2000), each worker sending at a fixed interval and never more than one request at a
//! time (a slow request delays that worker's next one); `--rate 0` runs closed-loop, as
//! fast as the machine goes. Latency is from the call to the end of the body, retries
//! included. Also reported: retries sent and refused by the budget, ejections, open file
//! descriptors (before, peak, after teardown), and RSS and live Tokio tasks after each
//! quarter of a phase (leak indicators). The client is hyper-util's legacy client with a
//! pool timer and a 30 s idle timeout (`--pool-idle`; `none` runs it without a pool
//! timer, hyper-util's default, which never evicts idle connections of addresses it does
//! not ask for again: under churn its memory grows without bound).
//!
//! ```text
//! cargo bench -p mcs-client --bench churn_soak -- --duration 60s --workers 32
//! ```
//!
//! (`scripts/soak.sh` runs it.) Without `--bench` (as `cargo test --benches` runs it) it
//! is a 2 s smoke run per phase. Options (`-- --help` lists them with their defaults):
//! `--duration` (default 60 s), `--workers`, `--rate`, `--servers` (initial set, default
//! 12), `--churn-every`, `--max-failing`, `--drain` (default 200 ms), `--base-ejection`,
//! `--max-ejection-percent`, `--pool-idle`, `--one-cluster` (every server in one cluster:
//! per-endpoint metric series no longer pile up in the recorder, for leak checks; no
//! failure-event table); durations as humantime reads them: `500ms`, `1.5s`, `60s`, `5m`.
//! `MCS_SOAK_DURATION`, `MCS_SOAK_WORKERS` and `MCS_SOAK_RATE` set defaults. libtest's own
//! arguments, which cargo may pass (`--nocapture`, `--test-threads 2`, test filters, ...),
//! are accepted and ignored; `--list` lists nothing. Any other argument is an error.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::net::{IpAddr, SocketAddr};
use std::sync::atomic::{AtomicBool, AtomicU8, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clap::{ArgAction, Parser};
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::server::conn::http1;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use mcs_client::connect::Tcp;
use mcs_client::metrics::{EJECTIONS, RESPONSES, RETRIES};
use mcs_client::{CloneBody, Http, Mcs, McsLayer, Retry, Served, StaticResolver};
use mcs_core::ClusterId;
use mcs_core::discovery::{Endpoint, Target};
use mcs_core::endpoints::{BalancerConfig, Locality, OutlierConfig, Tiering};
use mcs_core::name::ServiceRef;
use metrics::{
    Counter, CounterFn, Gauge, Histogram, Key, KeyName, Label, Metadata, Recorder, SharedString,
    Unit,
};
use metrics_util::registry::{AtomicStorage, Registry};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::{JoinHandle, JoinSet};
use tower::{Layer, ServiceExt};

const HOST: &str = "loyalty-accrual.loyalty.svc.clusterset.local";
/// A request taking longer than this is counted as stuck (a failure) and abandoned.
const STUCK: Duration = Duration::from_secs(10);

// ---------------------------------------------------------------------------------------
// Settings

/// The soak's options (`--help` lists them); durations as humantime reads them (`500ms`,
/// `1.5s`, `5m`).
#[derive(Debug, Parser)]
#[command(
    name = "churn_soak",
    bin_name = "churn_soak",
    about = "Churn soak for mcs-client: see mcs-client/benches/churn_soak.rs"
)]
struct Settings {
    /// Length of each phase [default: 60s with --bench, else 2s]
    #[arg(long, env = "MCS_SOAK_DURATION", value_name = "DURATION", value_parser = non_zero)]
    duration: Option<Duration>,
    /// Worker tasks, each with at most one request in flight
    #[arg(long, env = "MCS_SOAK_WORKERS", default_value_t = 32, value_parser = at_least::<1>)]
    workers: usize,
    /// Requests per second offered over all workers; 0 runs closed-loop
    #[arg(long, env = "MCS_SOAK_RATE", default_value_t = 2000)]
    rate: u64,
    /// Servers in the initial set
    #[arg(long, default_value_t = 12, value_parser = at_least::<4>)]
    servers: usize,
    /// Time between two churn events
    #[arg(long, default_value = "20ms", value_name = "DURATION", value_parser = non_zero)]
    churn_every: Duration,
    /// Servers broken at a time, at most
    #[arg(long, default_value_t = 2)]
    max_failing: usize,
    /// How long a removed endpoint's server keeps serving before it stops
    #[arg(long, default_value = "200ms", value_name = "DURATION", value_parser = humantime::parse_duration)]
    drain: Duration,
    /// Outlier detection's first ejection time (at most ten times as long later)
    #[arg(long, default_value = "1s", value_name = "DURATION", value_parser = humantime::parse_duration)]
    base_ejection: Duration,
    /// Outlier detection ejects at most this percentage of the set
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u8).range(..=100))]
    max_ejection_percent: u8,
    /// The client's pool idle timeout; `none`: no pool timer (hyper-util's default)
    #[arg(long, default_value = "30s", value_name = "DURATION|none", value_parser = pool_idle)]
    pool_idle: std::option::Option<Duration>,
    /// Every server in one cluster: no per-endpoint metric series (for leak checks), no
    /// failure-event table
    #[arg(long)]
    one_cluster: bool,
    /// A full run, as `cargo bench` asks; without it (`cargo test --benches`) each phase is
    /// a 2 s smoke run
    #[arg(long, hide = true)]
    bench: bool,
    /// Lists nothing: there are no libtest tests here (`cargo test --benches -- --list`)
    #[arg(long, hide = true)]
    list: bool,
    /// libtest's other flags, which cargo may pass: ignored
    #[arg(long = "test", short = 'q', hide = true, action = ArgAction::Count, aliases = [
        "quiet", "ignored", "include-ignored", "exclude-should-panic", "force-run-in-process",
        "fail-fast", "nocapture", "no-capture", "exact", "show-output", "report-time",
        "ensure-time", "shuffle",
    ])]
    _libtest_flags: u8,
    /// libtest's options with a value: ignored
    #[arg(long = "skip", short = 'Z', hide = true, action = ArgAction::Append, aliases = [
        "logfile", "test-threads", "color", "format", "shuffle-seed",
    ])]
    _libtest_options: Vec<String>,
    /// libtest's test filters: ignored
    #[arg(hide = true)]
    filters: Vec<String>,
}

impl Settings {
    /// The length of each phase.
    fn duration(&self) -> Duration {
        let default = if self.bench { 60 } else { 2 };
        self.duration.unwrap_or(Duration::from_secs(default))
    }
}

fn non_zero(s: &str) -> Result<Duration, String> {
    match humantime::parse_duration(s) {
        Ok(d) if d.is_zero() => Err("must be more than zero".to_owned()),
        parsed => parsed.map_err(|e| e.to_string()),
    }
}

fn pool_idle(s: &str) -> Result<Option<Duration>, String> {
    (s != "none")
        .then(|| humantime::parse_duration(s))
        .transpose()
        .map_err(|e| format!("{e}: expected a duration such as 30s, or none"))
}

fn at_least<const MIN: usize>(s: &str) -> Result<usize, String> {
    match s.parse() {
        Ok(n) if n < MIN => Err(format!("must be at least {MIN}")),
        parsed => parsed.map_err(|e: std::num::ParseIntError| e.to_string()),
    }
}

// ---------------------------------------------------------------------------------------
// Servers

const HEALTHY: u8 = 0;
/// Every connection is closed without an answer.
const RESET: u8 = 1;
/// Every request is answered 503.
const UNAVAILABLE: u8 = 2;

#[derive(Default)]
struct ServerState {
    mode: AtomicU8,
}

/// An HTTP/1 server on one loopback address that can be stopped gracefully, killed
/// abruptly, restarted on the same address, or switched into a failing mode.
///
/// Each server is its own "cluster" (`ep-<x>-<y>-<z>` from its address) under a flat
/// tiering, so the layer's per-cluster metrics are per endpoint.
struct Server {
    addr: SocketAddr,
    cluster: ClusterId,
    state: Arc<ServerState>,
    running: Option<(watch::Sender<bool>, JoinHandle<()>)>,
}

impl Server {
    /// Starts a server on `ip`, in its own cluster unless `one_cluster`.
    async fn start(ip: IpAddr, one_cluster: bool) -> std::io::Result<Self> {
        let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await?;
        let addr = listener.local_addr()?;
        let state = Arc::new(ServerState::default());
        let running = Some(serve(listener, Arc::clone(&state)));
        let cluster = match ip {
            _ if one_cluster => "east".to_owned(),
            IpAddr::V4(v4) => {
                let [_, a, b, c] = v4.octets();
                format!("ep-{a}-{b}-{c}")
            }
            IpAddr::V6(_) => "ep-v6".to_owned(),
        };
        Ok(Self {
            addr,
            cluster: ClusterId::new(cluster).map_err(std::io::Error::other)?,
            state,
            running,
        })
    }

    fn endpoint(&self) -> Endpoint {
        Endpoint::ready(self.addr, self.cluster.clone())
    }

    fn set_mode(&self, mode: u8) {
        self.state.mode.store(mode, Ordering::Relaxed);
    }

    /// Drops the listener and every connection at once, as a crashed process would.
    async fn kill(&mut self) {
        if let Some((_, task)) = self.running.take() {
            task.abort();
            let _ = task.await;
        }
    }

    /// Serves again on the same address after [`Server::kill`].
    async fn restart(&mut self) -> std::io::Result<()> {
        if self.running.is_none() {
            let listener = TcpListener::bind(self.addr).await?;
            self.running = Some(serve(listener, Arc::clone(&self.state)));
        }
        Ok(())
    }

    /// Stops accepting, lets in-flight requests finish, closes connections.
    async fn stop(mut self) {
        if let Some((stop, task)) = self.running.take() {
            let _ = stop.send(true);
            let _ = task.await;
        }
    }
}

async fn wait_stop(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

fn serve(listener: TcpListener, state: Arc<ServerState>) -> (watch::Sender<bool>, JoinHandle<()>) {
    let (stop, mut stopped) = watch::channel(false);
    let task = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let stream = match accepted {
                        Ok((stream, _)) => stream,
                        Err(_) => {
                            // Out of file descriptors or similar: do not spin.
                            tokio::time::sleep(Duration::from_millis(10)).await;
                            continue;
                        }
                    };
                    if state.mode.load(Ordering::Relaxed) == RESET {
                        let _ = stream.set_zero_linger();
                        drop(stream);
                        continue;
                    }
                    let state = Arc::clone(&state);
                    let mut stopped = stopped.clone();
                    conns.spawn(async move {
                        let svc = service_fn(move |_req: Request<Incoming>| {
                            let state = Arc::clone(&state);
                            async move {
                                match state.mode.load(Ordering::Relaxed) {
                                    RESET => {
                                        // An error from the service makes hyper close the
                                        // connection without a response.
                                        Err(std::io::Error::other("reset mode"))
                                    }
                                    UNAVAILABLE => {
                                        let mut r = Response::new(Full::new(Bytes::from_static(b"unavailable")));
                                        *r.status_mut() = StatusCode::SERVICE_UNAVAILABLE;
                                        Ok(r)
                                    }
                                    _ => Ok(Response::new(Full::new(Bytes::from_static(b"ok")))),
                                }
                            }
                        });
                        let conn = http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
                        tokio::pin!(conn);
                        tokio::select! {
                            _ = conn.as_mut() => {}
                            _ = wait_stop(&mut stopped) => {
                                conn.as_mut().graceful_shutdown();
                                let _ = conn.await;
                            }
                        }
                    });
                }
                // Reap finished connections so the set stays small.
                Some(_) = conns.join_next(), if !conns.is_empty() => {}
                _ = wait_stop(&mut stopped) => break,
            }
        }
        drop(listener);
        while conns.join_next().await.is_some() {}
    });
    (stop, task)
}

/// Fresh loopback addresses: `127.<net>.x.y`, never reused within a run.
struct Addresses {
    net: u8,
    next: u32,
}

impl Addresses {
    fn next(&mut self) -> IpAddr {
        let n = self.next;
        self.next += 1;
        assert!(n < 250 * 250, "out of loopback addresses");
        IpAddr::from([127, self.net, (n / 250) as u8, (n % 250 + 1) as u8])
    }
}

// ---------------------------------------------------------------------------------------
// Metrics: the layer's counters and gauges, kept in a metrics-util registry.

/// The ejection counter of one endpoint, which also notes, at every ejection, the time and
/// the endpoint's failure count then.
struct EjectionLog {
    count: Arc<AtomicU64>,
    failures: Arc<AtomicU64>,
    log: Mutex<Vec<(Instant, u64)>>,
}

impl CounterFn for EjectionLog {
    fn increment(&self, value: u64) {
        let failures = self.failures.load(Ordering::Relaxed);
        lock(&self.log).push((Instant::now(), failures));
        self.count.increment(value);
    }

    fn absolute(&self, value: u64) {
        self.count.absolute(value);
    }
}

/// Keeps every counter and gauge the layer registers (labels sorted, so that keys built in
/// any label order meet), and a log of every endpoint's ejections.
#[derive(Clone)]
struct SoakRecorder {
    registry: Arc<Registry<Key, AtomicStorage>>,
    ejection_logs: Arc<Mutex<BTreeMap<Key, Arc<EjectionLog>>>>,
}

fn sorted(name: &str, labels: impl Iterator<Item = Label>) -> Key {
    let mut labels: Vec<Label> = labels.collect();
    labels.sort();
    Key::from_parts(name.to_owned(), labels)
}

/// Whether `key` has every one of `labels`.
fn has_labels(key: &Key, labels: &[(&str, &str)]) -> bool {
    labels
        .iter()
        .all(|&(k, v)| key.labels().any(|l| l.key() == k && l.value() == v))
}

impl SoakRecorder {
    fn new() -> Self {
        Self {
            registry: Arc::new(Registry::atomic()),
            ejection_logs: Arc::default(),
        }
    }

    /// The sum of a counter over all label sets that include `labels`; `None` if the
    /// layer never registered it.
    fn counter(&self, name: &str, labels: &[(&str, &str)]) -> Option<u64> {
        let mut found = None;
        self.registry.visit_counters(|key, value| {
            if key.name() == name && has_labels(key, labels) {
                *found.get_or_insert(0) += value.load(Ordering::Relaxed);
            }
        });
        found
    }

    /// How many metric series are registered.
    fn series(&self) -> usize {
        let mut series = 0;
        self.registry.visit_counters(|_, _| series += 1);
        self.registry.visit_gauges(|_, _| series += 1);
        series
    }

    /// The ejection log of the endpoint whose labels include `labels`.
    fn ejection_log(&self, labels: &[(&str, &str)]) -> Option<Arc<EjectionLog>> {
        lock(&self.ejection_logs)
            .iter()
            .find(|(key, _)| has_labels(key, labels))
            .map(|(_, log)| Arc::clone(log))
    }
}

impl Recorder for SoakRecorder {
    fn describe_counter(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_gauge(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}
    fn describe_histogram(&self, _: KeyName, _: Option<Unit>, _: SharedString) {}

    fn register_counter(&self, key: &Key, _: &Metadata<'_>) -> Counter {
        let key = sorted(key.name(), key.labels().cloned());
        let count = self.registry.get_or_create_counter(&key, Arc::clone);
        if key.name() != EJECTIONS {
            return Counter::from_arc(count);
        }
        let failure = Label::new("outcome", "failure");
        let failures = sorted(RESPONSES, key.labels().cloned().chain([failure]));
        let failures = self.registry.get_or_create_counter(&failures, Arc::clone);
        let mut logs = lock(&self.ejection_logs);
        let log = logs.entry(key).or_insert_with(|| {
            Arc::new(EjectionLog {
                count,
                failures,
                log: Mutex::default(),
            })
        });
        Counter::from_arc(Arc::clone(log))
    }

    fn register_gauge(&self, key: &Key, _: &Metadata<'_>) -> Gauge {
        let key = sorted(key.name(), key.labels().cloned());
        Gauge::from_arc(self.registry.get_or_create_gauge(&key, Arc::clone))
    }

    fn register_histogram(&self, _: &Key, _: &Metadata<'_>) -> Histogram {
        Histogram::noop()
    }
}

/// Locks `mutex`, also after a panic elsewhere (the soak reports what it has).
fn lock<T>(mutex: &Mutex<T>) -> MutexGuard<'_, T> {
    mutex.lock().unwrap_or_else(PoisonError::into_inner)
}

// ---------------------------------------------------------------------------------------
// Load

type Svc = Mcs<Http<Tcp, Full<Bytes>>, CloneBody>;

#[derive(Default)]
struct WorkerStats {
    latencies_us: Vec<u32>,
    ok: u64,
    server_errors: u64,
    transport_errors: u64,
    stuck: u64,
    body_errors: u64,
    retried: u64,
}

impl WorkerStats {
    fn merge(&mut self, other: Self) {
        self.latencies_us.extend(other.latencies_us);
        self.ok += other.ok;
        self.server_errors += other.server_errors;
        self.transport_errors += other.transport_errors;
        self.stuck += other.stuck;
        self.body_errors += other.body_errors;
        self.retried += other.retried;
    }

    fn requests(&self) -> u64 {
        self.latencies_us.len() as u64
    }

    fn failed(&self) -> u64 {
        self.transport_errors + self.stuck + self.body_errors
    }
}

/// Error messages of failed requests, with their source chains, by count.
type ErrorLog = Arc<Mutex<BTreeMap<String, u64>>>;

fn describe_error(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        let _ = write!(text, ": {e}");
        cur = e.source();
    }
    text
}

fn note(errors: &ErrorLog, what: String) {
    *lock(errors).entry(what).or_default() += 1;
}

async fn worker(
    svc: Svc,
    port: u16,
    deadline: tokio::time::Instant,
    pace: Option<Duration>,
    errors: ErrorLog,
) -> WorkerStats {
    let mut stats = WorkerStats::default();
    let uri = format!("http://{HOST}:{port}/accrue");
    let mut ticker = pace.map(|p| {
        // Spread the workers' first requests over one period.
        let start = tokio::time::Instant::now() + p.mul_f64(fastrand::f64());
        let mut t = tokio::time::interval_at(start, p);
        t.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        t
    });
    loop {
        if let Some(t) = &mut ticker {
            t.tick().await;
        }
        if tokio::time::Instant::now() >= deadline {
            break;
        }
        let request = Request::get(uri.as_str())
            .body(Full::new(Bytes::new()))
            .expect("request");
        let started = Instant::now();
        let result = tokio::time::timeout(STUCK, async {
            let response = svc.clone().oneshot(request).await?;
            let status = response.status();
            let attempts = response.extensions().get::<Served>().map(Served::attempts);
            let body = response.into_body().collect().await;
            Ok::<_, tower::BoxError>((status, attempts, body))
        })
        .await;
        let elapsed = started.elapsed();
        stats
            .latencies_us
            .push(u32::try_from(elapsed.as_micros()).unwrap_or(u32::MAX));
        match result {
            Err(_) => {
                stats.stuck += 1;
                note(&errors, format!("stuck for more than {STUCK:?}"));
            }
            Ok(Err(err)) => {
                stats.transport_errors += 1;
                note(&errors, describe_error(&*err));
            }
            Ok(Ok((status, attempts, body))) => {
                if attempts.unwrap_or(1) > 1 {
                    stats.retried += 1;
                }
                if let Err(err) = body {
                    stats.body_errors += 1;
                    note(&errors, format!("body: {}", describe_error(&err)));
                } else if status.is_server_error() {
                    stats.server_errors += 1;
                } else if status.is_success() {
                    stats.ok += 1;
                } else {
                    stats.transport_errors += 1;
                    note(&errors, format!("unexpected status {status}"));
                }
            }
        }
    }
    stats
}

// ---------------------------------------------------------------------------------------
// Churn

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Fail {
    Refuse,
    Reset,
    Unavailable,
}

impl Fail {
    const ALL: [Fail; 3] = [Fail::Refuse, Fail::Reset, Fail::Unavailable];

    fn name(self) -> &'static str {
        match self {
            Fail::Refuse => "refuse",
            Fail::Reset => "reset",
            Fail::Unavailable => "503",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum SlotState {
    Serving,
    Unready,
    Failing(Fail),
}

/// One failure event, followed through the layer's per-endpoint metrics.
struct Track {
    started: Instant,
    /// The endpoint's failure count and ejection log length when the event started.
    failures: u64,
    ejections: usize,
}

struct Slot {
    server: Server,
    state: SlotState,
    track: Option<Track>,
}

enum Pending {
    Ready(SocketAddr),
    Recover(SocketAddr),
}

/// What happened to the failure events of one kind.
#[derive(Debug, Default)]
struct FailStats {
    events: u64,
    /// Attempts the layer saw fail on the failing endpoint, over all events.
    failures: u64,
    /// Ejections of the failing endpoint during its events.
    ejections: u64,
    /// Events in which the endpoint was ejected at least once.
    ejected: u64,
    /// Over those events: failures before the first ejection, and the time it took.
    failures_to_first: u64,
    time_to_first: Duration,
}

#[derive(Debug, Default)]
struct ChurnCounts {
    added: u64,
    removed: u64,
    unready: u64,
    ready: u64,
    recovered: u64,
    failed: [FailStats; 3],
    restart_errors: u64,
}

impl ChurnCounts {
    fn failed_total(&self) -> u64 {
        self.failed.iter().map(|f| f.events).sum()
    }

    fn total(&self) -> u64 {
        self.added + self.removed + self.unready + self.ready + self.failed_total() + self.recovered
    }
}

struct Phase {
    resolver: StaticResolver,
    target: Target,
    recorder: SoakRecorder,
    slots: Vec<Slot>,
    addresses: Addresses,
}

impl Phase {
    fn endpoints(&self) -> Vec<Endpoint> {
        self.slots
            .iter()
            .map(|s| {
                let mut e = s.server.endpoint();
                e.ready = s.state != SlotState::Unready;
                e
            })
            .collect()
    }

    fn count(&self, pred: impl Fn(SlotState) -> bool) -> usize {
        self.slots.iter().filter(|s| pred(s.state)).count()
    }

    fn random_serving(&self) -> Option<usize> {
        let serving: Vec<usize> = (0..self.slots.len())
            .filter(|&i| self.slots[i].state == SlotState::Serving)
            .collect();
        (!serving.is_empty()).then(|| serving[fastrand::usize(..serving.len())])
    }

    fn position(&self, addr: SocketAddr) -> Option<usize> {
        self.slots.iter().position(|s| s.server.addr == addr)
    }

    /// The layer's failure count for one endpoint (its own cluster) and its ejections so
    /// far: when each happened and the failure count then.
    fn endpoint_counts(&self, cluster: &ClusterId) -> (u64, Vec<(Instant, u64)>) {
        let port = self.target.port.to_string();
        let labels = [("port", port.as_str()), ("cluster", cluster.as_str())];
        let failures = self
            .recorder
            .counter(RESPONSES, &[labels[0], labels[1], ("outcome", "failure")])
            .unwrap_or(0);
        let ejections = self
            .recorder
            .ejection_log(&labels)
            .map_or_else(Vec::new, |l| lock(&l.log).clone());
        (failures, ejections)
    }
}

fn jitter(lo: Duration, hi: Duration) -> Duration {
    lo + (hi - lo).mul_f64(fastrand::f64())
}

/// Runs churn until `deadline`, then puts every endpoint back in service.
async fn churn(
    phase: &mut Phase,
    settings: &Settings,
    deadline: tokio::time::Instant,
) -> ChurnCounts {
    let mut counts = ChurnCounts::default();
    let mut pending: Vec<(tokio::time::Instant, Pending)> = Vec::new();
    let mut stops = JoinSet::new();
    let mut next_fail = 0usize;
    let min_serving = settings.servers / 2;
    let max_slots = settings.servers + 4;
    let mut tick = tokio::time::interval(settings.churn_every);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    loop {
        tick.tick().await;
        let now = tokio::time::Instant::now();
        let done = now >= deadline;
        // Follow-ups that are due (all of them once the phase is over).
        let mut i = 0;
        while i < pending.len() {
            if !done && pending[i].0 > now {
                i += 1;
                continue;
            }
            let (_, what) = pending.swap_remove(i);
            match what {
                Pending::Ready(addr) => {
                    if let Some(j) = phase.position(addr) {
                        phase.slots[j].state = SlotState::Serving;
                        let ep = phase.slots[j].server.endpoint();
                        phase.resolver.add(&phase.target, [ep]);
                        counts.ready += 1;
                    }
                }
                Pending::Recover(addr) => {
                    let Some(j) = phase.position(addr) else {
                        continue;
                    };
                    let SlotState::Failing(kind) = phase.slots[j].state else {
                        continue;
                    };
                    let server = &mut phase.slots[j].server;
                    match kind {
                        Fail::Refuse => {
                            if let Err(err) = server.restart().await {
                                counts.restart_errors += 1;
                                if !done {
                                    // Try again on a later tick.
                                    pending.push((
                                        now + Duration::from_millis(100),
                                        Pending::Recover(addr),
                                    ));
                                    continue;
                                }
                                eprintln!("churn: cannot restart {addr}: {err}");
                            }
                        }
                        Fail::Reset | Fail::Unavailable => server.set_mode(HEALTHY),
                    }
                    let (failures, ejections) =
                        phase.endpoint_counts(&phase.slots[j].server.cluster);
                    let slot = &mut phase.slots[j];
                    slot.state = SlotState::Serving;
                    if let Some(t) = slot.track.take() {
                        let stats = &mut counts.failed[kind as usize];
                        stats.failures += failures - t.failures;
                        let during = ejections.get(t.ejections..).unwrap_or_default();
                        stats.ejections += during.len() as u64;
                        if let Some(&(at, failures_then)) = during.first() {
                            stats.ejected += 1;
                            stats.failures_to_first += failures_then - t.failures;
                            stats.time_to_first += at.saturating_duration_since(t.started);
                        }
                    }
                    counts.recovered += 1;
                }
            }
        }
        if done {
            break;
        }
        let serving = phase.count(|s| s == SlotState::Serving);
        let failing = phase.count(|s| matches!(s, SlotState::Failing(_)));
        let mut actions = Vec::with_capacity(4);
        if phase.slots.len() < max_slots {
            actions.push(0); // add
        }
        if serving > min_serving {
            actions.push(1); // remove
            actions.push(2); // unready
            if failing < settings.max_failing {
                actions.push(3); // fail
            }
        }
        if actions.is_empty() {
            continue;
        }
        match actions[fastrand::usize(..actions.len())] {
            0 => {
                let ip = phase.addresses.next();
                match Server::start(ip, settings.one_cluster).await {
                    Ok(server) => {
                        let endpoint = server.endpoint();
                        phase.slots.push(Slot {
                            server,
                            state: SlotState::Serving,
                            track: None,
                        });
                        counts.added += 1;
                        if counts.added % 4 == 0 {
                            phase.resolver.set(&phase.target, phase.endpoints());
                        } else {
                            phase.resolver.add(&phase.target, [endpoint]);
                        }
                    }
                    Err(err) => eprintln!("churn: cannot bind {ip}: {err}"),
                }
            }
            1 => {
                let Some(i) = phase.random_serving() else {
                    continue;
                };
                let slot = phase.slots.swap_remove(i);
                phase.resolver.remove(&phase.target, [slot.server.addr]);
                let drain = settings.drain;
                stops.spawn(async move {
                    tokio::time::sleep(drain).await;
                    slot.server.stop().await;
                });
                counts.removed += 1;
            }
            2 => {
                let Some(i) = phase.random_serving() else {
                    continue;
                };
                let slot = &mut phase.slots[i];
                slot.state = SlotState::Unready;
                let mut ep = slot.server.endpoint();
                ep.ready = false;
                phase.resolver.add(&phase.target, [ep]);
                pending.push((
                    now + jitter(Duration::from_millis(50), Duration::from_millis(500)),
                    Pending::Ready(slot.server.addr),
                ));
                counts.unready += 1;
            }
            _ => {
                let Some(i) = phase.random_serving() else {
                    continue;
                };
                let kind = Fail::ALL[next_fail % 3];
                next_fail += 1;
                let (failures, ejections) = phase.endpoint_counts(&phase.slots[i].server.cluster);
                let slot = &mut phase.slots[i];
                slot.track = Some(Track {
                    started: Instant::now(),
                    failures,
                    ejections: ejections.len(),
                });
                match kind {
                    Fail::Refuse => slot.server.kill().await,
                    Fail::Reset => slot.server.set_mode(RESET),
                    Fail::Unavailable => slot.server.set_mode(UNAVAILABLE),
                }
                slot.state = SlotState::Failing(kind);
                counts.failed[kind as usize].events += 1;
                pending.push((
                    now + jitter(Duration::from_millis(500), Duration::from_secs(3)),
                    Pending::Recover(slot.server.addr),
                ));
            }
        }
        // Reap finished graceful stops.
        while stops.try_join_next().is_some() {}
    }
    while stops.join_next().await.is_some() {}
    counts
}

// ---------------------------------------------------------------------------------------
// Phases

struct PhaseResult {
    name: &'static str,
    stats: WorkerStats,
    elapsed: Duration,
    churn: Option<ChurnCounts>,
    errors: BTreeMap<String, u64>,
    retries_sent: Option<u64>,
    retries_exhausted: Option<u64>,
    endpoint_failures: Option<u64>,
    ejections: Option<u64>,
    fds: (usize, usize, usize),
    /// Metric series the recorder holds at the end (all phases so far).
    series: usize,
    /// RSS (KiB) and live Tokio tasks after each quarter of the phase.
    quarters: Vec<(u64, usize)>,
}

fn open_fds() -> usize {
    std::fs::read_dir("/proc/self/fd").map_or(0, |d| d.count())
}

/// RSS in KiB (0 if unknown) and live Tokio tasks.
fn usage() -> (u64, usize) {
    (
        rss_kib().unwrap_or(0),
        tokio::runtime::Handle::current()
            .metrics()
            .num_alive_tasks(),
    )
}

fn rss_kib() -> Option<u64> {
    let status = std::fs::read_to_string("/proc/self/status").ok()?;
    let line = status.lines().find(|l| l.starts_with("VmRSS:"))?;
    line.split_whitespace().nth(1)?.parse().ok()
}

async fn run_phase(
    name: &'static str,
    with_churn: bool,
    port: u16,
    net: u8,
    settings: &Settings,
    recorder: &SoakRecorder,
) -> PhaseResult {
    let fds_before = open_fds();
    let target = Target {
        service: ServiceRef::new("loyalty", "loyalty-accrual").expect("service"),
        port,
    };
    let resolver = StaticResolver::new();
    let mut phase = Phase {
        resolver: resolver.clone(),
        target: target.clone(),
        recorder: recorder.clone(),
        slots: Vec::new(),
        addresses: Addresses { net, next: 0 },
    };
    for _ in 0..settings.servers {
        let ip = phase.addresses.next();
        let server = Server::start(ip, settings.one_cluster)
            .await
            .expect("bind a loopback address");
        phase.slots.push(Slot {
            server,
            state: SlotState::Serving,
            track: None,
        });
    }
    resolver.set(&target, phase.endpoints());

    let outlier = OutlierConfig {
        consecutive_failures: 5,
        base_ejection: settings.base_ejection,
        max_ejection: settings.base_ejection * 10,
        max_ejection_percent: settings.max_ejection_percent,
    };
    // One flat tier: every server is its own "cluster" only so that the layer's metrics
    // are per endpoint.
    let client_cluster = ClusterId::new("client").expect("cluster id");
    let layer = McsLayer::builder(resolver.clone(), Locality::cluster(client_cluster))
        .balancer(
            BalancerConfig::default()
                .tiering(Tiering::Flat)
                .outlier(outlier),
        )
        .retry(Retry::new(CloneBody))
        .build();
    let mut builder = Client::builder(TokioExecutor::new());
    if let Some(idle) = settings.pool_idle {
        // Without a timer hyper-util never evicts idle connections of an address it does
        // not ask for again, and churn keeps making new addresses.
        builder
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(idle);
    }
    let svc = layer.layer(Http::new(builder));

    let errors: ErrorLog = Arc::default();
    let pace = (settings.rate > 0)
        .then(|| Duration::from_secs_f64(settings.workers as f64 / settings.rate as f64));
    let started = tokio::time::Instant::now();
    let deadline = started + settings.duration();
    let peak = Arc::new(AtomicU64::new(open_fds() as u64));
    let sampling = Arc::new(AtomicBool::new(true));
    let sampler = {
        let (peak, sampling) = (Arc::clone(&peak), Arc::clone(&sampling));
        let quarter = settings.duration() / 4;
        tokio::spawn(async move {
            let mut quarters = Vec::new();
            let mut next = started + quarter;
            while sampling.load(Ordering::Relaxed) {
                peak.fetch_max(open_fds() as u64, Ordering::Relaxed);
                if quarters.len() < 3 && tokio::time::Instant::now() >= next {
                    quarters.push(usage());
                    next += quarter;
                }
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            quarters
        })
    };
    let mut workers = JoinSet::new();
    for _ in 0..settings.workers {
        workers.spawn(worker(
            svc.clone(),
            port,
            deadline,
            pace,
            Arc::clone(&errors),
        ));
    }
    let churn = if with_churn {
        Some(churn(&mut phase, settings, deadline).await)
    } else {
        tokio::time::sleep_until(deadline).await;
        None
    };
    let mut stats = WorkerStats::default();
    while let Some(result) = workers.join_next().await {
        stats.merge(result.expect("worker panicked"));
    }
    let elapsed = started.elapsed();
    sampling.store(false, Ordering::Relaxed);
    let mut quarters = sampler.await.unwrap_or_default();
    quarters.push(usage());

    // Tear down: servers, client and layer; then see that descriptors come back.
    drop(svc);
    drop(layer);
    for slot in phase.slots.drain(..) {
        slot.server.stop().await;
    }
    tokio::time::sleep(Duration::from_millis(200)).await;
    let fds_after = open_fds();

    let port_label = port.to_string();
    let p: &[(&str, &str)] = &[("port", &port_label)];
    let with = |extra: (&'static str, &'static str)| -> Vec<(&str, &str)> {
        let mut v = p.to_vec();
        v.push(extra);
        v
    };
    PhaseResult {
        name,
        stats,
        elapsed,
        churn,
        errors: std::mem::take(&mut *lock(&errors)),
        retries_sent: recorder.counter(RETRIES, &with(("result", "sent"))),
        retries_exhausted: recorder.counter(RETRIES, &with(("result", "budget_exhausted"))),
        endpoint_failures: recorder.counter(RESPONSES, &with(("outcome", "failure"))),
        ejections: recorder.counter(EJECTIONS, p),
        fds: (fds_before, peak.load(Ordering::Relaxed) as usize, fds_after),
        quarters,
        series: recorder.series(),
    }
}

// ---------------------------------------------------------------------------------------
// Report

fn percentile(sorted: &[u32], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
    f64::from(sorted[rank - 1]) / 1000.0
}

fn opt(v: Option<u64>) -> String {
    v.map_or_else(|| "n/a".to_owned(), |v| v.to_string())
}

fn report(settings: &Settings, results: &mut [PhaseResult]) -> bool {
    println!();
    println!(
        "churn soak: {} s per phase, {} workers, {}, {} initial servers, churn every {:?}, \
         at most {} failing, drain {:?}, ejection {:?} x k for at most {} % of the set{}",
        settings.duration().as_secs_f64(),
        settings.workers,
        if settings.rate == 0 {
            "closed loop".to_owned()
        } else {
            format!("{} req/s offered", settings.rate)
        },
        settings.servers,
        settings.churn_every,
        settings.max_failing,
        settings.drain,
        settings.base_ejection,
        settings.max_ejection_percent,
        if !settings.bench {
            " (smoke run: no --bench)"
        } else {
            ""
        },
    );
    println!();
    println!(
        "| phase | requests | req/s | failed | of which stuck | 5xx | retried ok | p50 ms | p99 ms | p99.9 ms | max ms |"
    );
    println!("|---|---|---|---|---|---|---|---|---|---|---|");
    let mut p99s = Vec::new();
    for r in results.iter_mut() {
        r.stats.latencies_us.sort_unstable();
        let l = &r.stats.latencies_us;
        let p99 = percentile(l, 0.99);
        p99s.push(p99);
        println!(
            "| {} | {} | {:.0} | {} | {} | {} | {} | {:.2} | {:.2} | {:.2} | {:.2} |",
            r.name,
            r.stats.requests(),
            r.stats.requests() as f64 / r.elapsed.as_secs_f64(),
            r.stats.failed(),
            r.stats.stuck,
            r.stats.server_errors,
            r.stats.retried,
            percentile(l, 0.50),
            p99,
            percentile(l, 0.999),
            f64::from(l.last().copied().unwrap_or(0)) / 1000.0,
        );
    }
    if let [base, churn] = p99s[..]
        && base > 0.0
    {
        println!();
        println!("p99 churn / baseline: {:.2}", churn / base);
    }
    println!();
    println!(
        "| phase | retries sent | retry budget exhausted | endpoint failures seen | ejections | fds before / peak / after teardown | RSS MiB after each quarter | tasks after each quarter | metric series |"
    );
    println!("|---|---|---|---|---|---|---|---|---|");
    for r in results.iter() {
        println!(
            "| {} | {} | {} | {} | {} | {} / {} / {} | {} | {} | {} |",
            r.name,
            opt(r.retries_sent),
            opt(r.retries_exhausted),
            opt(r.endpoint_failures),
            opt(r.ejections),
            r.fds.0,
            r.fds.1,
            r.fds.2,
            r.quarters
                .iter()
                .map(|(k, _)| format!("{:.1}", *k as f64 / 1024.0))
                .collect::<Vec<_>>()
                .join(" / "),
            r.quarters
                .iter()
                .map(|(_, t)| t.to_string())
                .collect::<Vec<_>>()
                .join(" / "),
            r.series,
        );
    }
    for r in results.iter() {
        let Some(c) = &r.churn else { continue };
        println!();
        println!(
            "churn events ({}): {} in total: {} added, {} removed (drained, then stopped), \
             {} made unready, {} made ready again, {} failed, {} recovered{}",
            r.name,
            c.total(),
            c.added,
            c.removed,
            c.unready,
            c.ready,
            c.failed_total(),
            c.recovered,
            if c.restart_errors > 0 {
                format!(" ({} restarts had to be retried)", c.restart_errors)
            } else {
                String::new()
            },
        );
        if settings.one_cluster {
            println!("(--one-cluster: no per-endpoint metrics, so no failure-event table)");
            continue;
        }
        println!();
        println!(
            "| failure | events | failed attempts per event | events with an ejection | failed \
             attempts before the first ejection | time to the first ejection | ejections per event |"
        );
        println!("|---|---|---|---|---|---|---|");
        let per = |n: u64, d: u64| if d == 0 { 0.0 } else { n as f64 / d as f64 };
        let mut during = 0;
        for kind in Fail::ALL {
            let f = &c.failed[kind as usize];
            during += f.ejections;
            println!(
                "| {} | {} | {:.1} | {} | {:.1} | {:.0} ms | {:.1} |",
                kind.name(),
                f.events,
                per(f.failures, f.events),
                f.ejected,
                per(f.failures_to_first, f.ejected),
                if f.ejected == 0 {
                    0.0
                } else {
                    f.time_to_first.as_secs_f64() * 1000.0 / f.ejected as f64
                },
                per(f.ejections, f.events),
            );
        }
        if let Some(total) = r.ejections {
            println!();
            println!(
                "ejections outside failure events (healthy endpoints, or late failures of \
                 requests sent before a recovery): {}",
                total.saturating_sub(during)
            );
        }
    }
    let mut ok = true;
    for r in results.iter() {
        if r.stats.failed() > 0 {
            ok = false;
            println!();
            println!("{}: {} failed requests:", r.name, r.stats.failed());
            let mut errors: Vec<_> = r.errors.iter().collect();
            errors.sort_by(|a, b| b.1.cmp(a.1));
            for (e, n) in errors.iter().take(10) {
                println!("  {n:>8} × {e}");
            }
        }
        if r.churn.is_none() && r.stats.server_errors > 0 {
            ok = false;
            println!("{}: unexpected 5xx without churn", r.name);
        }
    }
    println!();
    println!(
        "{}",
        if ok {
            "PASS: no transport error, no stuck request"
        } else {
            "FAIL: see above"
        }
    );
    ok
}

fn main() {
    let settings = Settings::parse();
    if settings.list {
        return;
    }
    for filter in &settings.filters {
        eprintln!("churn_soak: ignoring test filter {filter:?}");
    }
    let recorder = SoakRecorder::new();
    if metrics::set_global_recorder(recorder.clone()).is_err() {
        eprintln!("churn_soak: a metrics recorder is already installed");
    }
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()
        .expect("runtime");
    let mut results = runtime.block_on(async {
        eprintln!("churn_soak: baseline phase ({:?})", settings.duration());
        let baseline = run_phase("baseline", false, 8001, 91, &settings, &recorder).await;
        eprintln!("churn_soak: churn phase ({:?})", settings.duration());
        let churn = run_phase("churn", true, 8002, 92, &settings, &recorder).await;
        vec![baseline, churn]
    });
    let ok = report(&settings, &mut results);
    runtime.shutdown_timeout(Duration::from_secs(5));
    if !ok {
        std::process::exit(1);
    }
}
