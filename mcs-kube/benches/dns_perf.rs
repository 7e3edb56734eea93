//! DNS throughput and latency side by side: `mcs-dns` against CoreDNS v1.15.0 (the
//! `kubernetes` plugin's `multicluster clusterset.local` option, cache off, and again with
//! `cache 30`), on the same machine, the same API server state, the same query file and
//! the same dnsperf parameters. `scripts/dnsperf.sh` installs dnsperf, builds the binaries
//! and runs it:
//!
//! ```text
//! scripts/dnsperf.sh            # or: cargo bench -p mcs-kube --bench dns_perf
//! ```
//!
//! The zone holds 100 imports: 70 ClusterSetIP and 30 headless with 3 endpoints (with
//! hostnames) in each of two clusters. The query file mixes 55% A of a ClusterSetIP
//! name, 15% A of a headless name, 5% AAAA of a ClusterSetIP name (NODATA), 5% bare SRV,
//! 5% `_http._tcp` SRV, 5% per-endpoint A and 10% NXDOMAIN; before measuring, every
//! distinct question must get the same response code and answer count from all servers.
//!
//! mcs-dns runs twice: as the binary runs it (a UDP socket per core) and with one UDP
//! socket, which shows what the sockets add.
//!
//! Each round runs every server in turn (so load from others on the machine hits all of
//! them alike), twice: **throughput**, dnsperf as fast as the server answers (`-c 4 -q
//! 100`, EDNS on), giving queries per second; **latency**, dnsperf at a fixed rate below
//! every server's throughput (`-Q`) with `-v`, giving each query's latency, from which
//! the p50 and p99 are taken. The summary takes the median over the rounds.
//!
//! Environment: `MCS_DNSPERF_SECONDS` (each run, default 10), `MCS_DNSPERF_ROUNDS`
//! (default 3), `MCS_DNSPERF_QPS` (the latency runs' rate, default 2000). mcs-dns runs in
//! this process on a runtime of its own with as many workers as CoreDNS's GOMAXPROCS (the
//! machine's cores), as the `mcs-dns` binary does.

use mcs_testkit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::io::Write;
use std::net::SocketAddr;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use hickory_resolver::proto::rr::RecordType;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::api::{Api, ObjectMeta, PostParams};
use mcs_core::api::{
    LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, Protocol, ServiceImportSpec, ServiceImportType,
    ServicePort, v1beta1::ServiceImport,
};
use mcs_kube::dns::{DnsConfig, DnsServer};

const NS: &str = "perf";
const CLUSTERSET_IP: u32 = 70;
const HEADLESS: u32 = 30;
const ENDPOINTS: u32 = 3;
const CLUSTERS: [&str; 2] = ["east", "west"];

fn env_or(name: &str, default: u64) -> u64 {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}

fn import(name: &str, type_: ServiceImportType, ip: Option<String>) -> ServiceImport {
    let mut spec = ServiceImportSpec::new(type_);
    spec.ips = ip.map(|ip| vec![ip]);
    spec.ports = vec![ServicePort {
        name: Some("http".into()),
        protocol: Some(Protocol::Tcp),
        app_protocol: None,
        port: 80,
    }];
    let mut si = ServiceImport::new(name, spec);
    si.metadata.namespace = Some(NS.into());
    si
}

fn slice(svc: &str, index: u32, cluster: usize) -> EndpointSlice {
    let name = CLUSTERS[cluster];
    EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some(format!("{svc}-{name}")),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([
                (LABEL_SERVICE_NAME.to_string(), svc.to_string()),
                (LABEL_SOURCE_CLUSTER.to_string(), name.to_string()),
            ])),
            ..Default::default()
        },
        endpoints: (1..=ENDPOINTS)
            .map(|i| Endpoint {
                addresses: vec![format!("10.{}.{index}.{i}", 10 + cluster)],
                hostname: Some(format!("{svc}-{i}")),
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    }
}

/// The query file's lines (`name type`), 1000 of them.
fn queries() -> Vec<String> {
    (0..1000u32)
        .map(|i| {
            let cs = |i: u32| format!("svc-{}.{NS}.svc.clusterset.local", i % CLUSTERSET_IP);
            let hl = |i: u32| format!("hl-{}.{NS}.svc.clusterset.local", i % HEADLESS);
            match i % 20 {
                0..=10 => format!("{} A", cs(i)),
                11..=13 => format!("{} A", hl(i)),
                14 => format!("{} AAAA", cs(i)),
                15 => format!("{} SRV", if i % 40 < 20 { cs(i) } else { hl(i) }),
                16 => format!("_http._tcp.{} SRV", if i % 40 < 20 { cs(i) } else { hl(i) }),
                17 => format!(
                    "hl-{h}-{e}.{c}.hl-{h}.{NS}.svc.clusterset.local A",
                    h = i % HEADLESS,
                    e = i % ENDPOINTS + 1,
                    c = CLUSTERS[(i / 20) as usize % 2],
                ),
                _ => format!("missing-{i}.{NS}.svc.clusterset.local A"),
            }
        })
        .collect()
}

/// One dnsperf run against `server`; its stdout (with `-v`, a line per query).
fn dnsperf(server: SocketAddr, file: &Path, seconds: u64, extra: &[String]) -> String {
    let out = Command::new("dnsperf")
        .args([
            "-s",
            &server.ip().to_string(),
            "-p",
            &server.port().to_string(),
        ])
        .arg("-d")
        .arg(file)
        .args([
            "-l",
            &seconds.to_string(),
            "-c",
            "4",
            "-T",
            "1",
            "-q",
            "100",
            "-e",
        ])
        .args(extra)
        .stderr(Stdio::inherit())
        .output()
        .expect("dnsperf (Debian package dnsperf; scripts/dnsperf.sh installs it) must run");
    assert!(out.status.success(), "dnsperf failed: {}", out.status);
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// A number from dnsperf's summary line starting with `label`.
fn summary_number(report: &str, label: &str) -> f64 {
    report
        .lines()
        .find_map(|l| l.trim().strip_prefix(label))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or_else(|| panic!("no {label:?} in dnsperf's report:\n{report}"))
}

/// The `q`-quantile (0..=1) of sorted values.
fn quantile(sorted: &[f64], q: f64) -> f64 {
    let i = ((sorted.len() as f64 - 1.0) * q).round() as usize;
    sorted[i]
}

/// The latencies (seconds) of dnsperf `-v`'s per-query lines (`> RCODE name type latency`).
fn latencies(report: &str) -> Vec<f64> {
    let mut v: Vec<f64> = report
        .lines()
        .filter(|l| l.starts_with('>'))
        .filter_map(|l| l.split_whitespace().last()?.parse().ok())
        .collect();
    v.sort_by(f64::total_cmp);
    v
}

#[derive(Default)]
struct Figures {
    qps: Vec<f64>,
    load_latency_ms: Vec<f64>,
    p50_ms: Vec<f64>,
    p99_ms: Vec<f64>,
    lost: Vec<f64>,
}

fn median(v: &[f64]) -> f64 {
    let mut v = v.to_vec();
    v.sort_by(f64::total_cmp);
    quantile(&v, 0.5)
}

fn corefile(kubeconfig: PathBuf, cache: bool) -> impl Fn(u16) -> String {
    move |port| {
        format!(
            "clusterset.local:{port} {{\n    errors\n{}    kubernetes clusterset.local {{\n        \
             kubeconfig {}\n        multicluster clusterset.local\n        ttl 5\n    }}\n}}\n",
            if cache { "    cache 30\n" } else { "" },
            kubeconfig.display()
        )
    }
}

/// A question's response code and answer count, to compare the servers on the file.
async fn shape(server: SocketAddr, line: &str) -> String {
    let (name, qtype) = line.rsplit_once(' ').unwrap();
    let qtype: RecordType = qtype.parse().unwrap();
    let m = support::dns_query(server, &format!("{name}."), qtype).await;
    format!("{:?} {}", m.metadata.response_code, m.answers.len())
}

fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let seconds = env_or("MCS_DNSPERF_SECONDS", 10);
    let rounds = env_or("MCS_DNSPERF_ROUNDS", 3);
    let rate = env_or("MCS_DNSPERF_QPS", 2000);
    let cores = std::thread::available_parallelism().map_or(1, |n| n.get());
    // The API server's client and the harness run here; mcs-dns gets a runtime of its own.
    let main_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let dns_rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(cores)
        .thread_name("mcs-dns")
        .enable_all()
        .build()
        .unwrap();

    let cluster = main_rt.block_on(support::start_cluster(
        "dnsperf",
        support::ClusterOptions::api_only(),
    ));
    let client = main_rt.block_on(async {
        let client = cluster.client().await;
        support::create_namespace(&client, NS).await;
        let imports: Api<ServiceImport> = Api::namespaced(client.clone(), NS);
        let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
        let pp = PostParams::default();
        for i in 0..CLUSTERSET_IP {
            let ip = format!("10.96.{}.{}", i / 250, i % 250 + 1);
            let si = import(
                &format!("svc-{i}"),
                ServiceImportType::ClusterSetIp,
                Some(ip),
            );
            imports.create(&pp, &si).await.unwrap();
        }
        for i in 0..HEADLESS {
            let name = format!("hl-{i}");
            let si = import(&name, ServiceImportType::Headless, None);
            imports.create(&pp, &si).await.unwrap();
            for c in 0..CLUSTERS.len() {
                slices.create(&pp, &slice(&name, i, c)).await.unwrap();
            }
        }
        client
    });
    // The last object written: every server answers it only once it has listed all.
    let last = format!(
        "hl-{h}-{ENDPOINTS}.{c}.hl-{h}.{NS}.svc.clusterset.local.",
        h = HEADLESS - 1,
        c = CLUSTERS[CLUSTERS.len() - 1]
    );

    // mcs-dns as the binary runs it (one UDP socket per core), and with one UDP socket,
    // each watching through a client of its own runtime.
    let start_mcs = |sockets: usize| {
        let server = dns_rt
            .block_on(DnsServer::bind(
                DnsConfig::default()
                    .listen("127.0.0.1:0".parse().unwrap())
                    .udp_sockets(sockets),
            ))
            .unwrap();
        let addr = server.local_addr();
        let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
        let dns_client = dns_rt.block_on(cluster.client());
        let task = dns_rt.spawn(server.run(dns_client, async move {
            let _ = stopped.await;
        }));
        main_rt.block_on(support::wait_for(
            "mcs-dns answering the last object",
            Duration::from_secs(60),
            || async {
                let m = support::dns_query(addr, &last, RecordType::A).await;
                (!m.answers.is_empty()).then_some(())
            },
        ));
        (addr, stop, task)
    };
    let (mcs, stop, task) = start_mcs(cores);
    let (mcs_one, stop_one, task_one) = start_mcs(1);
    let (plain, cached) = main_rt.block_on(async {
        let kubeconfig = cluster.kubeconfig_path();
        let plain = support::CoreDns::start(
            cluster.dir(),
            "coredns",
            corefile(kubeconfig.clone(), false),
            (&last, RecordType::A),
        )
        .await;
        let cached = support::CoreDns::start(
            cluster.dir(),
            "coredns-cache",
            corefile(kubeconfig, true),
            (&last, RecordType::A),
        )
        .await;
        (plain, cached)
    });
    let one_socket = "mcs-dns, one UDP socket";
    let servers: [(&str, SocketAddr); 4] = [
        ("mcs-dns", mcs),
        (one_socket, mcs_one),
        ("CoreDNS multicluster", plain.addr()),
        ("CoreDNS multicluster + cache 30", cached.addr()),
    ];

    let lines = queries();
    let mut file = tempfile::NamedTempFile::new().unwrap();
    for l in &lines {
        writeln!(file, "{l}").unwrap();
    }
    file.flush().unwrap();

    // Same answers from all: every distinct question, same rcode and answer count.
    let distinct: BTreeSet<&String> = lines.iter().collect();
    main_rt.block_on(async {
        for line in &distinct {
            let ours = shape(mcs, line).await;
            for (name, addr) in &servers[1..] {
                let theirs = shape(*addr, line).await;
                assert_eq!(
                    ours, theirs,
                    "{line}: mcs-dns and {name} answer differently"
                );
            }
        }
    });
    drop(client);

    println!(
        "dnsperf 2.10: {} queries in the file ({} distinct), {seconds} s per run, {rounds} \
         round(s), -c 4 -q 100 -T 1 -e; latency runs at -Q {rate}; {cores} cores shared by \
         the servers, the API server and dnsperf",
        lines.len(),
        distinct.len()
    );
    let mut figures: Vec<Figures> = servers.iter().map(|_| Figures::default()).collect();
    for round in 1..=rounds {
        for ((name, addr), f) in servers.iter().zip(figures.iter_mut()) {
            let load = dnsperf(*addr, file.path(), seconds, &[]);
            let qps = summary_number(&load, "Queries per second:");
            let avg = summary_number(&load, "Average Latency (s):") * 1e3;
            let lost = summary_number(&load, "Queries lost:");
            let timed = dnsperf(
                *addr,
                file.path(),
                seconds,
                &["-Q".into(), rate.to_string(), "-v".into()],
            );
            let lat = latencies(&timed);
            assert!(
                !lat.is_empty(),
                "no per-query lines from dnsperf -v:\n{timed}"
            );
            let (p50, p99) = (quantile(&lat, 0.5) * 1e3, quantile(&lat, 0.99) * 1e3);
            println!(
                "round {round} {name:32} {qps:>9.0} qps  avg {avg:.3} ms under load, \
                 {lost} lost;  at {rate} qps: p50 {p50:.3} ms  p99 {p99:.3} ms ({} queries)",
                lat.len()
            );
            f.qps.push(qps);
            f.load_latency_ms.push(avg);
            f.p50_ms.push(p50);
            f.p99_ms.push(p99);
            f.lost.push(lost);
        }
    }

    println!();
    println!(
        "| server | qps | avg latency under load | p50 at {rate} qps | p99 at {rate} qps | \
         qps ratio mcs-dns / this |"
    );
    println!("|---|---|---|---|---|---|");
    let ours = median(&figures[0].qps);
    for ((name, _), f) in servers.iter().zip(&figures) {
        println!(
            "| {name} | {:.0} | {:.3} ms | {:.3} ms | {:.3} ms | {:.2} |",
            median(&f.qps),
            median(&f.load_latency_ms),
            median(&f.p50_ms),
            median(&f.p99_ms),
            ours / median(&f.qps)
        );
    }
    println!("(medians over {rounds} round(s))");

    drop(plain);
    drop(cached);
    for (stop, task) in [(stop, task), (stop_one, task_one)] {
        let _ = stop.send(());
        let _ = dns_rt.block_on(task);
    }
}
