//! The seed scenario end to end on one machine, with real sockets.
//!
//! Two serving clusters, `east` and `west`, each run `loyalty-accrual` pods (hyper servers
//! on their own loopback addresses, 127.10.0.x and 127.20.0.x, port 9443). Their exports
//! are merged into one (headless) ServiceImport. The `clusterset.local` DNS server of
//! `mcs-kube` (the server `mcs-dns` runs) serves that import and the MCS EndpointSlices an
//! agent would write, on loopback UDP and TCP. Checkout clients call
//! `http://loyalty-accrual.loyalty.svc.clusterset.local:9443/accrue` through the
//! `mcs-client` layer, which finds the endpoints with its DNS resolver (SRV records whose
//! targets carry each endpoint's cluster) and balances in-process, with no sidecar:
//!
//! 1. a checkout in a third cluster, `north`, spreads its requests over both clusters;
//! 2. a checkout in `east` keeps every request local;
//! 3. all of east's pods stop in the middle of a run: the east checkout fails over to west
//!    with no failed request (retry on connect failure plus outlier ejection, before
//!    discovery even notices);
//! 4. west adds a port east does not have: the merge raises `PortConflict` on both exports,
//!    and traffic to that port goes only to west.
//!
//! Run with `cargo run --release --example loyalty_accrual`. It exits non-zero if any of
//! that does not hold.

use std::collections::BTreeMap;
use std::convert::Infallible;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::process::ExitCode;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU64, AtomicUsize, Ordering};
use std::time::{Duration, Instant};

use bytes::Bytes;
use hickory_resolver::Resolver;
use hickory_resolver::config::{NameServerConfig, ResolverConfig};
use hickory_resolver::net::runtime::TokioRuntimeProvider;
use hickory_resolver::proto::rr::RData;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use indicatif::{ProgressBar, ProgressStyle};
use k8s_openapi::api::discovery::v1::{
    Endpoint as SliceEndpoint, EndpointConditions, EndpointPort, EndpointSlice,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use mcs::client::connect::Tcp;
use mcs::client::{CloneBody, DnsResolver, Http, Mcs, McsLayer, Retry, Served};
use mcs::core::ClusterId;
use mcs::core::api::{LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER};
use mcs::core::endpoints::{BalancerConfig, Locality, OutlierConfig};
use mcs::core::name::{PortName, ServiceRef};
use mcs::kube::dns::{DnsConfig, DnsServer};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tower::{Layer, ServiceExt};

const HOST: &str = "loyalty-accrual.loyalty.svc.clusterset.local";
const PORT: u16 = 9443;
const ADMIN_PORT: u16 = 9444;

type Checkout = Mcs<Http<Tcp, Full<Bytes>>, CloneBody>;

#[tokio::main]
async fn main() -> ExitCode {
    let started = Instant::now();
    let mut checks = Checks::default();
    if let Err(err) = run(&mut checks).await {
        eprintln!("\nerror: {err}");
        return ExitCode::FAILURE;
    }
    println!("\n== Summary ({:.1} s) ==", started.elapsed().as_secs_f64());
    checks.check(
        "finished in well under a minute",
        started.elapsed() < Duration::from_secs(45),
    );
    checks.summary()
}

#[expect(
    clippy::field_reassign_with_default,
    reason = "OutlierConfig may become #[non_exhaustive]; field assignment stays valid then"
)]
async fn run(checks: &mut Checks) -> Result<(), Box<dyn std::error::Error>> {
    println!("== mcs loyalty_accrual: one ClusterSet name, two serving clusters, no sidecar ==\n");
    let (east, west) = (ClusterId::new("east")?, ClusterId::new("west")?);
    let service = ServiceRef::new("loyalty", "loyalty-accrual")?;

    // 1. The exports and the merged ServiceImport.
    println!(
        "-- 1. ServiceExports in east and west (headless Services), merged into one ServiceImport --"
    );
    let east_export = imports::export(&east, "2026-05-01T09:00:00Z", &[("http", PORT)])?;
    let west_export = imports::export(&west, "2026-05-01T09:00:04Z", &[("http", PORT)])?;
    let merged = imports::merge(&service, &[east_export.clone(), west_export])?;
    println!("{}", indent(&merged.yaml()?));
    merged.print_conditions();
    checks.check(
        "exports agree: Conflict=False (NoConflicts) on both",
        !merged.conflicted(),
    );
    checks.check(
        "the import lists both clusters and port 9443",
        merged.clusters() == ["east", "west"] && merged.ports() == [("http".to_owned(), PORT)],
    );

    // 2. The pods.
    println!("\n-- 2. Pods: hyper servers on loopback addresses, port {PORT} --");
    let east_pods = start_pods(&east, [127, 10, 0], 3, PORT).await?;
    let west_pods = start_pods(&west, [127, 20, 0], 4, PORT).await?;
    for pod in east_pods.iter().chain(&west_pods) {
        println!("   {:<5} {}", pod.cluster, pod.addr);
    }

    // Discovery: the clusterset.local DNS server, answering from the import and the MCS
    // EndpointSlices the agents would write into the checkout's cluster.
    println!(
        "\n-- DNS: the clusterset.local server on loopback, fed the import and the MCS EndpointSlices --"
    );
    let dns =
        DnsServer::bind(DnsConfig::default().listen(SocketAddr::from(([127, 0, 0, 1], 0)))).await?;
    let (dns_addr, zone) = (dns.local_addr(), dns.zone());
    let dns_task = tokio::spawn(dns.serve(std::future::pending()));
    zone.update(|data| -> Result<(), Box<dyn std::error::Error>> {
        data.set_namespace(service.namespace.as_str(), true);
        data.upsert_import(&merged.import_object()?)?;
        data.upsert_slice(&mcs_slice("east", ("http", PORT), &east_pods))?;
        data.upsert_slice(&mcs_slice("west", ("http", PORT), &west_pods))?;
        Ok(())
    })?;
    zone.mark_synced();
    println!("   {dns_addr} (UDP and TCP), zone clusterset.local, TTL 5 s; SRV {HOST}:");
    let srv = print_srv(dns_addr, &format!("{HOST}.")).await?;
    checks.check(
        "DNS answers one SRV record per endpoint, each target naming its cluster",
        srv.len() == east_pods.len() + west_pods.len()
            && srv.iter().filter(|t| t.contains(".east.")).count() == east_pods.len(),
    );
    // Port 9443 is found through the bare name's SRV records; the admin port (step 6) by
    // its name, `_admin._tcp.<service>`.
    let resolver = DnsResolver::builder()
        .name_server(dns_addr)
        .ttl_bounds(Duration::from_secs(1), Duration::from_secs(5))
        .port_name(ADMIN_PORT, PortName::new("admin")?)
        .build()?;

    let http: Http<Tcp, Full<Bytes>> = Http::new(
        Client::builder(TokioExecutor::new())
            .pool_timer(TokioTimer::new())
            .pool_idle_timeout(Duration::from_secs(30))
            .clone(),
    );
    let checkout_in = |cluster: &ClusterId| -> Checkout {
        let mut outlier = OutlierConfig::default();
        // East is 3 of the 7 endpoints: allow ejecting all of them.
        outlier.max_ejection_percent = 50;
        McsLayer::builder(resolver.clone(), Locality::cluster(cluster.clone()))
            .balancer(BalancerConfig::default().outlier(outlier))
            .retry(Retry::new(CloneBody))
            .build()
            .layer(http.clone())
    };

    // 3. A checkout in a third cluster: no local endpoints, so both clusters share the load.
    println!("\n-- 3. Checkout in `north` (no loyalty-accrual pods there): 3000 requests --");
    let north = ClusterId::new("north")?;
    let tally = drive(checkout_in(&north), 3000, 32, "north", None).await;
    tally.print();
    let east_share = tally.share("east");
    checks.check("no failed request", tally.failed == 0);
    checks.check(
        &format!(
            "both clusters serve (east {:.0} %, west {:.0} %)",
            east_share * 100.0,
            (1.0 - east_share) * 100.0
        ),
        (0.25..=0.75).contains(&east_share),
    );
    checks.check(
        "every pod served",
        tally.by_endpoint.len() == east_pods.len() + west_pods.len(),
    );

    // 4. A checkout in east: local first.
    println!("\n-- 4. Checkout in `east`: local cluster first, 2000 requests --");
    let east_checkout = checkout_in(&east);
    let tally = drive(east_checkout.clone(), 2000, 32, "east", None).await;
    tally.print();
    checks.check("no failed request", tally.failed == 0);
    checks.check("every request stayed in east", tally.count("east") == 2000);

    // 5. East's pods all stop in the middle of a run.
    println!("\n-- 5. All east pods stop mid-run; discovery still lists them --");
    println!(
        "   requests are PUT /accrue with an idempotency key; connect failures are retried on"
    );
    println!("   another endpoint (retry budget 20 % + 10/s), failing endpoints are ejected.");
    let stop = StopAt {
        after: 1500,
        pods: east_pods,
    };
    let tally = drive(east_checkout, 6000, 32, "east", Some(stop)).await;
    tally.print();
    let (during, after) = (&tally.during_stop, &tally.after_stop);
    println!(
        "   while the pods stopped: {} requests, {} in west, {} needed a retry",
        during.total, during.west, during.retried
    );
    println!(
        "   after the stop: {} requests, {} in west, {} needed a retry, {} went straight to west",
        after.total, after.west, after.retried, after.direct_west
    );
    checks.check("no failed request during failover", tally.failed == 0);
    checks.check(
        "before the stop, east served everything",
        tally.before_stop.total > 0 && tally.before_stop.west == 0,
    );
    checks.check(
        "after the stop, west served everything",
        after.total > 0 && after.west == after.total,
    );
    checks.check(
        "connect failures were retried",
        during.retried + after.retried > 0,
    );
    checks.check(
        "east was ejected: later requests went straight to west",
        after.direct_west > after.total / 2,
    );

    // 6. A port conflict between the exports.
    println!("\n-- 6. West also exports an admin port (9444); east does not --");
    let west_admin = start_pods(&west, [127, 20, 1], 2, ADMIN_PORT).await?;
    let west_export = imports::export(
        &west,
        "2026-05-01T09:00:04Z",
        &[("http", PORT), ("admin", ADMIN_PORT)],
    )?;
    let merged = imports::merge(&service, &[east_export, west_export])?;
    println!("{}", indent(&merged.yaml()?));
    merged.print_conditions();
    // What the agents write: the new import, and west's slice for the admin port.
    zone.update(|data| -> Result<(), Box<dyn std::error::Error>> {
        data.upsert_import(&merged.import_object()?)?;
        data.upsert_slice(&mcs_slice("west-admin", ("admin", ADMIN_PORT), &west_admin))?;
        Ok(())
    })?;
    checks.check(
        "PortConflict raised on both exports",
        merged.port_conflict_everywhere(),
    );
    checks.check(
        "the import has the union of the ports",
        merged.ports() == [("admin".to_owned(), ADMIN_PORT), ("http".to_owned(), PORT)],
    );
    // Endpoints for a port come only from the clusters whose Service exposes it (the merge's
    // port routes), as an agent would publish them.
    let admin_clusters = merged.clusters_for(ADMIN_PORT);
    println!("   port {ADMIN_PORT} routes to: {admin_clusters:?}");
    checks.check(
        "the merge routes port 9444 to west only",
        admin_clusters == [west.clone()],
    );
    println!("   SRV _admin._tcp.{HOST}:");
    let admin_srv = print_srv(dns_addr, &format!("_admin._tcp.{HOST}.")).await?;
    checks.check(
        "DNS lists only west endpoints for the admin port",
        admin_srv.len() == west_admin.len() && admin_srv.iter().all(|t| t.contains(".west.")),
    );
    let east_checkout = checkout_in(&east);
    let tally = drive_port(east_checkout, ADMIN_PORT, 500, 8, "east").await;
    tally.print();
    checks.check(
        "port 9444 is served only by west, even for the east checkout",
        tally.count("west") == 500,
    );

    for pod in west_pods.into_iter().chain(west_admin) {
        pod.stop().await;
    }
    dns_task.abort();
    Ok(())
}

/// The MCS EndpointSlice the agents write for `cluster_pods` (one cluster's pods) serving
/// `port`, named `<service>-<suffix>`.
fn mcs_slice(suffix: &str, port: (&str, u16), cluster_pods: &[Pod]) -> EndpointSlice {
    let cluster = cluster_pods
        .first()
        .map(|p| p.cluster.to_string())
        .unwrap_or_default();
    EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some(format!("loyalty-accrual-{suffix}")),
            namespace: Some("loyalty".into()),
            labels: Some(BTreeMap::from([
                (LABEL_SERVICE_NAME.to_owned(), "loyalty-accrual".to_owned()),
                (LABEL_SOURCE_CLUSTER.to_owned(), cluster),
            ])),
            ..ObjectMeta::default()
        },
        endpoints: cluster_pods
            .iter()
            .map(|pod| SliceEndpoint {
                addresses: vec![pod.addr.ip().to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                ..SliceEndpoint::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: Some(port.0.to_owned()),
            port: Some(i32::from(port.1)),
            protocol: Some("TCP".into()),
            app_protocol: None,
        }]),
    }
}

/// Queries SRV `name` at the DNS server as any client would, prints the records like `dig`
/// and returns their targets.
async fn print_srv(
    server: SocketAddr,
    name: &str,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let mut ns = NameServerConfig::udp_and_tcp(server.ip());
    for c in &mut ns.connections {
        c.port = server.port();
    }
    let lookup = Resolver::builder_with_config(
        ResolverConfig::from_parts(None, vec![], vec![ns]),
        TokioRuntimeProvider::default(),
    )
    .build()?
    .srv_lookup(name)
    .await?;
    let mut targets = Vec::new();
    for record in lookup.answers() {
        let RData::SRV(srv) = &record.data else {
            continue;
        };
        println!(
            "      {} {} {} {}",
            srv.priority, srv.weight, srv.port, srv.target
        );
        targets.push(srv.target.to_string());
    }
    Ok(targets)
}

/// When a request was sent, relative to a stop.
#[derive(Clone, Copy, Debug)]
enum When {
    Before,
    During,
    After,
}

/// Which pods to stop, after how many completed requests.
struct StopAt {
    after: usize,
    pods: Vec<Pod>,
}

#[derive(Default, Debug)]
struct Phase {
    total: usize,
    west: usize,
    retried: usize,
    direct_west: usize,
}

#[derive(Default, Debug)]
struct Tally {
    by_cluster: BTreeMap<String, usize>,
    by_endpoint: BTreeMap<SocketAddr, (String, usize)>,
    by_tier: BTreeMap<usize, usize>,
    failed: usize,
    first_error: Option<String>,
    before_stop: Phase,
    during_stop: Phase,
    after_stop: Phase,
    elapsed: Duration,
}

impl Tally {
    fn count(&self, cluster: &str) -> usize {
        self.by_cluster.get(cluster).copied().unwrap_or(0)
    }

    fn share(&self, cluster: &str) -> f64 {
        let total: usize = self.by_cluster.values().sum();
        if total == 0 {
            0.0
        } else {
            self.count(cluster) as f64 / total as f64
        }
    }

    fn print(&self) {
        let total: usize = self.by_cluster.values().sum::<usize>() + self.failed;
        println!(
            "   {total} requests in {:.2} s ({:.0}/s), {} failed",
            self.elapsed.as_secs_f64(),
            total as f64 / self.elapsed.as_secs_f64().max(1e-9),
            self.failed
        );
        for (cluster, n) in &self.by_cluster {
            let bar = "#".repeat(n * 40 / total.max(1));
            println!(
                "   {cluster:<5} {n:>5} {:>5.1} % {bar}",
                *n as f64 * 100.0 / total.max(1) as f64
            );
        }
        let endpoints: Vec<String> = self
            .by_endpoint
            .iter()
            .map(|(a, (_, n))| format!("{}={n}", a.ip()))
            .collect();
        println!("   per pod: {}", endpoints.join("  "));
        let tiers: Vec<String> = self
            .by_tier
            .iter()
            .map(|(t, n)| format!("tier {t}: {n}"))
            .collect();
        println!(
            "   picks by locality tier (0 = caller's zone, 1 = caller's cluster, 2 = other clusters): {}",
            tiers.join(", ")
        );
        if let Some(err) = &self.first_error {
            println!("   first error: {err}");
        }
    }
}

async fn drive(
    svc: Checkout,
    n: usize,
    concurrency: usize,
    who: &str,
    stop: Option<StopAt>,
) -> Tally {
    drive_inner(svc, PORT, n, concurrency, who, stop).await
}

async fn drive_port(svc: Checkout, port: u16, n: usize, concurrency: usize, who: &str) -> Tally {
    drive_inner(svc, port, n, concurrency, who, None).await
}

/// Sends `n` requests from `concurrency` workers with a progress bar; optionally stops pods
/// after a number of completed requests.
async fn drive_inner(
    svc: Checkout,
    port: u16,
    n: usize,
    concurrency: usize,
    who: &str,
    stop: Option<StopAt>,
) -> Tally {
    let bar = ProgressBar::new(n as u64);
    bar.set_style(
        ProgressStyle::with_template("   {prefix:>8} [{bar:32}] {pos:>5}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(who.to_owned());
    let next = Arc::new(AtomicUsize::new(0));
    let done = Arc::new(AtomicUsize::new(0));
    let counters = Arc::new([AtomicU64::new(0), AtomicU64::new(0), AtomicU64::new(0)]); // east, west, failed
    // Set when the stop begins and when it is over; requests sent in between count in
    // neither phase.
    let stopping = Arc::new(AtomicBool::new(false));
    let stopped = Arc::new(AtomicBool::new(false));
    let started = Instant::now();

    let stopper = stop.map(|stop| {
        let (done, stopping, stopped, bar) = (
            Arc::clone(&done),
            Arc::clone(&stopping),
            Arc::clone(&stopped),
            bar.clone(),
        );
        tokio::spawn(async move {
            while done.load(Ordering::Relaxed) < stop.after {
                tokio::time::sleep(Duration::from_millis(1)).await;
            }
            bar.println(format!(
                "   >>> stopping all {} east pods after {} requests",
                stop.pods.len(),
                stop.after
            ));
            stopping.store(true, Ordering::SeqCst);
            for pod in stop.pods {
                pod.stop().await;
            }
            stopped.store(true, Ordering::SeqCst);
        })
    });

    let mut workers = JoinSet::new();
    for _ in 0..concurrency {
        let (svc, next, done, counters, bar) = (
            svc.clone(),
            Arc::clone(&next),
            Arc::clone(&done),
            Arc::clone(&counters),
            bar.clone(),
        );
        let (stopping, stopped) = (Arc::clone(&stopping), Arc::clone(&stopped));
        workers.spawn(async move {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let when = if stopped.load(Ordering::SeqCst) {
                    When::After
                } else if stopping.load(Ordering::SeqCst) {
                    When::During
                } else {
                    When::Before
                };
                let result = accrue(svc.clone(), port, i).await;
                // A request sent before the stop but answered after it began counts as during.
                let when = match when {
                    When::Before if stopping.load(Ordering::SeqCst) => When::During,
                    when => when,
                };
                match &result {
                    Ok(served) if served.cluster().as_str() == "east" => {
                        counters[0].fetch_add(1, Ordering::Relaxed)
                    }
                    Ok(_) => counters[1].fetch_add(1, Ordering::Relaxed),
                    Err(_) => counters[2].fetch_add(1, Ordering::Relaxed),
                };
                let d = done.fetch_add(1, Ordering::Relaxed) + 1;
                if d % 50 == 0 || d == n {
                    bar.set_position(d as u64);
                    bar.set_message(format!(
                        "east {} · west {} · failed {}",
                        counters[0].load(Ordering::Relaxed),
                        counters[1].load(Ordering::Relaxed),
                        counters[2].load(Ordering::Relaxed)
                    ));
                }
                mine.push((when, result));
                // Pace the load a little so that a stop lands mid-run and the bar is visible.
                tokio::time::sleep(Duration::from_micros(200)).await;
            }
            mine
        });
    }

    let mut tally = Tally::default();
    while let Some(joined) = workers.join_next().await {
        let Ok(results) = joined else {
            tally.failed += 1;
            continue;
        };
        for (when, result) in results {
            match result {
                Ok(served) => {
                    let cluster = served.cluster().to_string();
                    *tally.by_cluster.entry(cluster.clone()).or_default() += 1;
                    tally
                        .by_endpoint
                        .entry(served.addr())
                        .or_insert((cluster.clone(), 0))
                        .1 += 1;
                    *tally.by_tier.entry(served.tier()).or_default() += 1;
                    let phase = match when {
                        When::Before => &mut tally.before_stop,
                        When::During => &mut tally.during_stop,
                        When::After => &mut tally.after_stop,
                    };
                    phase.total += 1;
                    let west = cluster == "west";
                    phase.west += usize::from(west);
                    phase.retried += usize::from(served.attempts() > 1);
                    phase.direct_west += usize::from(west && served.attempts() == 1);
                }
                Err(err) => {
                    tally.failed += 1;
                    tally.first_error.get_or_insert(err);
                }
            }
        }
    }
    if let Some(stopper) = stopper {
        let _ = stopper.await;
    }
    tally.elapsed = started.elapsed();
    bar.finish();
    tally
}

/// One checkout request: `PUT /accrue` with an idempotency key, so that a retry after a
/// closed connection is safe. Checks that the pod that answered is the one `Served` names.
async fn accrue(svc: Checkout, port: u16, i: usize) -> Result<Served, String> {
    let body = format!(r#"{{"order":"o-{i}","points":{}}}"#, i % 50 + 1);
    let request = Request::put(format!("http://{HOST}:{port}/accrue"))
        .header("idempotency-key", format!("o-{i}"))
        .header("content-type", "application/json")
        .body(Full::new(Bytes::from(body)))
        .map_err(|e| e.to_string())?;
    let response = svc.oneshot(request).await.map_err(|e| chain(&*e))?;
    if !response.status().is_success() {
        return Err(format!("status {}", response.status()));
    }
    let served = response
        .extensions()
        .get::<Served>()
        .cloned()
        .ok_or("no Served extension")?;
    let text = response
        .into_body()
        .collect()
        .await
        .map_err(|e| e.to_string())?
        .to_bytes();
    let text = String::from_utf8_lossy(&text);
    let expected = format!("{} {}", served.cluster(), served.addr());
    if !text.starts_with(&expected) {
        return Err(format!("answer {text:?} is not from {expected}"));
    }
    Ok(served)
}

/// A `loyalty-accrual` pod: a hyper server on one loopback address.
struct Pod {
    addr: SocketAddr,
    cluster: ClusterId,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl Pod {
    /// Stops like a pod on SIGTERM: no new connections, in-flight requests finish,
    /// connections close.
    async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn start_pods(
    cluster: &ClusterId,
    net: [u8; 3],
    n: u8,
    port: u16,
) -> Result<Vec<Pod>, String> {
    let mut pods = Vec::new();
    for i in 1..=n {
        let addr = SocketAddr::new(IpAddr::V4(Ipv4Addr::new(net[0], net[1], net[2], i)), port);
        pods.push(start_pod(cluster.clone(), addr).await?);
    }
    Ok(pods)
}

async fn start_pod(cluster: ClusterId, addr: SocketAddr) -> Result<Pod, String> {
    let listener = TcpListener::bind(addr).await.map_err(|e| {
        format!("binding {addr}: {e} (Linux routes all of 127/8 to lo; is the port in use?)")
    })?;
    let (stop, stopped) = watch::channel(false);
    let answer: Arc<str> = format!("{cluster} {addr}").into();
    let task = tokio::spawn(async move {
        let mut conns = JoinSet::new();
        let mut accept_stopped = stopped.clone();
        loop {
            tokio::select! {
                accepted = listener.accept() => {
                    let Ok((stream, _)) = accepted else { continue };
                    let answer = Arc::clone(&answer);
                    let mut stopped = stopped.clone();
                    conns.spawn(async move {
                        let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                            let answer = Arc::clone(&answer);
                            async move {
                                let _ = req.into_body().collect().await;
                                let body = format!("{answer} accrued");
                                Ok::<_, Infallible>(Response::builder().status(StatusCode::OK).body(Full::new(Bytes::from(body))).unwrap_or_default())
                            }
                        });
                        let conn = hyper::server::conn::http1::Builder::new().serve_connection(TokioIo::new(stream), svc);
                        tokio::pin!(conn);
                        tokio::select! {
                            _ = conn.as_mut() => {}
                            _ = wait(&mut stopped) => {
                                conn.as_mut().graceful_shutdown();
                                let _ = conn.await;
                            }
                        }
                    });
                }
                _ = wait(&mut accept_stopped) => break,
            }
        }
        drop(listener);
        while conns.join_next().await.is_some() {}
    });
    Ok(Pod {
        addr,
        cluster,
        stop,
        task,
    })
}

async fn wait(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// An error and its sources, `: `-separated.
fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}

fn indent(text: &str) -> String {
    text.lines()
        .map(|l| format!("   {l}"))
        .collect::<Vec<_>>()
        .join("\n")
}

/// Pass/fail lines, and the exit code.
#[derive(Default)]
struct Checks {
    failed: Vec<String>,
    passed: usize,
}

impl Checks {
    fn check(&mut self, what: &str, ok: bool) {
        if ok {
            self.passed += 1;
            println!("   ok   {what}");
        } else {
            self.failed.push(what.to_owned());
            println!("   FAIL {what}");
        }
    }

    fn summary(&self) -> ExitCode {
        println!("{} passed, {} failed", self.passed, self.failed.len());
        if self.failed.is_empty() {
            ExitCode::SUCCESS
        } else {
            for f in &self.failed {
                eprintln!("failed: {f}");
            }
            ExitCode::FAILURE
        }
    }
}

/// The exports, their merge by `mcs_core::merge`, and what the example prints and checks.
mod imports {
    use mcs::core::ClusterId;
    use mcs::core::api::{Protocol, ServicePort, v1beta1::ServiceImport};
    use mcs::core::conditions::{ConditionStatus, ConflictReason};
    use mcs::core::merge::{
        Constituent, MergeOutcome, MergedImport, ServiceFacts, ServiceKind, Stability,
    };
    use mcs::core::name::ServiceRef;

    /// One cluster's export of a headless Service with these named TCP ports.
    pub(crate) fn export(
        cluster: &ClusterId,
        created: &str,
        ports: &[(&str, u16)],
    ) -> Result<Constituent, String> {
        let created = created.parse().map_err(|e| format!("{created}: {e}"))?;
        let facts = ServiceFacts::builder(ServiceKind::Headless)
            .ports(ports.iter().map(|(name, port)| ServicePort {
                name: Some((*name).to_owned()),
                protocol: Some(Protocol::Tcp),
                app_protocol: None,
                port: i32::from(*port),
            }))
            .build()
            .map_err(|e| e.to_string())?;
        Ok(Constituent::new(cluster.clone(), created, Some(facts)))
    }

    /// A merge result.
    pub(crate) struct Merged {
        service: ServiceRef,
        outcome: MergeOutcome,
    }

    /// Merges the exports of `service` (fresh: the oldest export wins).
    pub(crate) fn merge(service: &ServiceRef, exports: &[Constituent]) -> Result<Merged, String> {
        let outcome = mcs::core::merge::merge(service, exports, Stability::Fresh, None)
            .map_err(|e| e.to_string())?;
        Ok(Merged {
            service: service.clone(),
            outcome,
        })
    }

    impl Merged {
        fn import(&self) -> Option<&MergedImport> {
            self.outcome.import.as_ref()
        }

        /// The ServiceImport every cluster writes.
        pub(crate) fn import_object(&self) -> Result<ServiceImport, String> {
            let import = self.import().ok_or("no import")?;
            Ok(import.to_service_import(&self.service))
        }

        /// The ServiceImport every cluster writes, as YAML.
        pub(crate) fn yaml(&self) -> Result<String, String> {
            serde_yaml::to_string(&self.import_object()?).map_err(|e| e.to_string())
        }

        pub(crate) fn conflicted(&self) -> bool {
            self.outcome
                .exports
                .values()
                .any(|c| c.conflict.status == ConditionStatus::True)
        }

        pub(crate) fn port_conflict_everywhere(&self) -> bool {
            !self.outcome.exports.is_empty()
                && self.outcome.exports.values().all(|c| {
                    c.conflict.status == ConditionStatus::True
                        && c.conflict
                            .reason
                            .split(',')
                            .any(|r| r == ConflictReason::PortConflict.as_str())
                })
        }

        pub(crate) fn clusters(&self) -> Vec<String> {
            self.import()
                .map(|i| i.clusters.iter().map(ToString::to_string).collect())
                .unwrap_or_default()
        }

        /// `(name, port)` of the merged ports, sorted.
        pub(crate) fn ports(&self) -> Vec<(String, u16)> {
            let mut ports: Vec<(String, u16)> = self
                .import()
                .map(|i| {
                    i.spec
                        .ports
                        .iter()
                        .map(|p| {
                            (
                                p.name.clone().unwrap_or_default(),
                                u16::try_from(p.port).unwrap_or(0),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            ports.sort();
            ports
        }

        /// The clusters whose Service exposes `port`: the only ones that get its traffic.
        pub(crate) fn clusters_for(&self, port: u16) -> Vec<ClusterId> {
            let Some(import) = self.import() else {
                return Vec::new();
            };
            import
                .routes
                .iter()
                .find(|r| r.port.port == i32::from(port))
                .map(|r| r.clusters.clone())
                .unwrap_or_default()
        }

        pub(crate) fn print_conditions(&self) {
            for (cluster, c) in &self.outcome.exports {
                println!(
                    "   ServiceExport loyalty/loyalty-accrual in {cluster}: {}={} reason={}",
                    c.conflict.type_, c.conflict.status, c.conflict.reason
                );
                println!("      message: {}", c.conflict.message);
            }
        }
    }
}
