//! mcs-dns against the reference: CoreDNS v1.15.0 with the `kubernetes` plugin's
//! `multicluster clusterset.local` option (`scripts/kwok-coredns-bins.sh` builds it), both
//! watching the same real API server, asked the same questions. Their response codes and
//! answer sections must agree, except where the MCS DNS spec lets them differ: SRV
//! weights, `dns-version` (the spec's `1.0.0` against CoreDNS's `1.1.0`) and the SOA and
//! NS names (mcs-dns names a server outside the zone, see
//! `mcs_core::dns::DEFAULT_NAMESERVER`).

mod support;

use std::collections::BTreeMap;
use std::net::{SocketAddr, TcpListener, UdpSocket as StdUdpSocket};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use hickory_server::proto::op::{Message, MessageType, OpCode, Query, ResponseCode};
use hickory_server::proto::rr::{Name, RData, RecordType};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::api::{Api, ObjectMeta, PostParams};
use mcs_core::api::{
    LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, Protocol, ServiceImportSpec, ServiceImportType,
    ServicePort, v1beta1::ServiceImport,
};
use mcs_kube::dns::{DnsConfig, DnsServer};
use support::{ClusterOptions, start_cluster, wait_for};
use tokio::net::UdpSocket;

const NS: &str = "demo";

/// `$MCS_COREDNS_BIN`, else where `scripts/kwok-coredns-bins.sh` puts it. Panics with
/// instructions when it is missing.
fn coredns_bin() -> PathBuf {
    let path = std::env::var_os("MCS_COREDNS_BIN")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            let cache = std::env::var_os("MCS_K8S_CACHE")
                .map(PathBuf::from)
                .or_else(|| {
                    std::env::var_os("HOME").map(|h| PathBuf::from(h).join(".cache/mcs-k8s"))
                })
                .unwrap_or_else(|| PathBuf::from("/root/.cache/mcs-k8s"));
            cache.join("kwok-v0.8.0-coredns-v1.15.0/bin/coredns")
        });
    assert!(
        path.is_file(),
        "CoreDNS not found at {} (MCS_COREDNS_BIN). Build it once with \
         `scripts/kwok-coredns-bins.sh` (about 3 min cold), or run scripts/test.sh",
        path.display()
    );
    path
}

/// A loopback port free for both UDP and TCP right now.
fn free_port() -> u16 {
    loop {
        let udp = StdUdpSocket::bind("127.0.0.1:0").unwrap();
        let port = udp.local_addr().unwrap().port();
        if TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// Kills and reaps CoreDNS when the test ends, also on panic.
struct Reaped(Child);

impl Drop for Reaped {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// Whether `server` answers an A question for `name` with records.
async fn answers(server: SocketAddr, name: &str) -> bool {
    tokio::time::timeout(Duration::from_secs(2), ask(server, name, RecordType::A))
        .await
        .is_ok_and(|m| m.metadata.response_code == ResponseCode::NoError && !m.answers.is_empty())
}

/// Starts CoreDNS for `clusterset.local` on a free loopback port, watching `cluster` with
/// the `kubernetes` plugin's `multicluster` option, and returns once it answers `probe`.
/// A port taken between choosing and binding it gets another try.
async fn start_coredns(
    bin: &Path,
    cluster: &support::TestCluster,
    probe: &str,
) -> (Reaped, SocketAddr) {
    let corefile = cluster.dir().join("Corefile");
    let log_path = cluster.dir().join("coredns.log");
    let log = || std::fs::read_to_string(&log_path).unwrap_or_default();
    for attempt in 1..=3 {
        let port = free_port();
        std::fs::write(
            &corefile,
            format!(
                "clusterset.local:{port} {{\n    errors\n    kubernetes clusterset.local {{\n        \
                 kubeconfig {}\n        multicluster clusterset.local\n        ttl 5\n    }}\n}}\n",
                cluster.kubeconfig_path().display()
            ),
        )
        .unwrap();
        let out = std::fs::File::create(&log_path).unwrap();
        let mut child = Reaped(
            Command::new(bin)
                .arg("-conf")
                .arg(&corefile)
                .current_dir(cluster.dir())
                .stdin(Stdio::null())
                .stdout(out.try_clone().unwrap())
                .stderr(out)
                .spawn()
                .unwrap_or_else(|e| panic!("cannot start {}: {e}", bin.display())),
        );
        let addr = SocketAddr::from(([127, 0, 0, 1], port));
        let deadline = Instant::now() + Duration::from_secs(60);
        loop {
            if answers(addr, probe).await {
                return (child, addr);
            }
            if let Some(status) = child.0.try_wait().unwrap() {
                let log = log();
                assert!(
                    attempt < 3 && log.contains("address already in use"),
                    "CoreDNS exited ({status}):\n{log}"
                );
                break;
            }
            assert!(
                Instant::now() < deadline,
                "CoreDNS does not answer {probe}:\n{}",
                log()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }
    unreachable!("the last attempt returns or panics")
}

fn import(name: &str, type_: ServiceImportType, ips: &[&str]) -> ServiceImport {
    let mut spec = ServiceImportSpec::new(type_);
    spec.ips = (!ips.is_empty()).then(|| ips.iter().map(|s| s.to_string()).collect());
    spec.ports = ["tcp", "udp"]
        .into_iter()
        .map(|p| ServicePort {
            name: Some(p.into()),
            protocol: Some(if p == "tcp" {
                Protocol::Tcp
            } else {
                Protocol::Udp
            }),
            app_protocol: None,
            port: 42,
        })
        .collect();
    let mut si = ServiceImport::new(name, spec);
    si.metadata.namespace = Some(NS.into());
    si
}

fn slice(
    name: &str,
    svc: &str,
    cluster: &str,
    endpoints: &[(&str, Option<&str>, bool)],
) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([
                (LABEL_SERVICE_NAME.to_string(), svc.to_string()),
                (LABEL_SOURCE_CLUSTER.to_string(), cluster.to_string()),
                (
                    "endpointslice.kubernetes.io/managed-by".to_string(),
                    "mcs-test".to_string(),
                ),
            ])),
            ..Default::default()
        },
        endpoints: endpoints
            .iter()
            .map(|(addr, host, ready)| Endpoint {
                addresses: vec![addr.to_string()],
                hostname: host.map(str::to_owned),
                conditions: Some(EndpointConditions {
                    ready: Some(*ready),
                    ..Default::default()
                }),
                ..Default::default()
            })
            .collect(),
        ports: Some(vec![
            EndpointPort {
                name: Some("tcp".into()),
                port: Some(42),
                protocol: Some("TCP".into()),
                ..Default::default()
            },
            EndpointPort {
                name: Some("udp".into()),
                port: Some(42),
                protocol: Some("UDP".into()),
                ..Default::default()
            },
        ]),
    }
}

/// Asks `server` over UDP (EDNS 1232, so nothing here truncates).
async fn ask(server: SocketAddr, name: &str, qtype: RecordType) -> Message {
    let mut m = Message::new(0x0c0d, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    let mut edns = hickory_server::proto::op::Edns::new();
    edns.set_max_payload(1232);
    m.set_edns(edns);
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.send_to(&m.to_vec().unwrap(), server).await.unwrap();
    let mut buf = vec![0u8; 4096];
    loop {
        let (n, _) = tokio::time::timeout(Duration::from_secs(10), sock.recv_from(&mut buf))
            .await
            .unwrap_or_else(|_| panic!("no answer from {server} to {name} {qtype}"))
            .unwrap();
        if n >= 2 && buf[..2] == [0x0c, 0x0d] {
            return Message::from_vec(&buf[..n]).unwrap();
        }
    }
}

/// The response code and the answer section as sorted text (owner, TTL, class, type, data),
/// SRV weights left out: the spec does not prescribe them, and CoreDNS splits 100 over the
/// records before it removes duplicates (two ports 42 give one record of weight 50).
fn summary(m: &Message) -> (ResponseCode, Vec<String>) {
    let mut answers: Vec<String> = m
        .answers
        .iter()
        .map(|r| match &r.data {
            RData::SRV(srv) => format!(
                "{} {} {} SRV {} _ {} {}",
                r.name, r.ttl, r.dns_class, srv.priority, srv.port, srv.target
            ),
            _ => r.to_string(),
        })
        .map(|r| r.to_lowercase())
        .collect();
    answers.sort();
    (m.metadata.response_code, answers)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcs_dns_answers_like_coredns_multicluster() {
    let coredns = coredns_bin();
    let cluster = start_cluster(
        "dnscoredns",
        ClusterOptions {
            controller_manager: false,
            install_crds: true,
            ..Default::default()
        },
    )
    .await;
    let client = cluster.client().await;
    support::create_namespace(&client, NS).await;
    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let pp = PostParams::default();
    imports
        .create(
            &pp,
            &import("hello", ServiceImportType::ClusterSetIp, &["10.0.0.10"]),
        )
        .await
        .unwrap();
    imports
        .create(&pp, &import("web", ServiceImportType::Headless, &[]))
        .await
        .unwrap();
    imports
        .create(&pp, &import("empty", ServiceImportType::Headless, &[]))
        .await
        .unwrap();
    let east = [
        ("10.1.0.1", Some("web-0"), true),
        ("10.1.0.2", None, true),
        ("10.1.0.3", Some("web-2"), false),
    ];
    slices
        .create(&pp, &slice("web-east", "web", "east", &east))
        .await
        .unwrap();
    slices
        .create(
            &pp,
            &slice(
                "web-west",
                "web",
                "west",
                &[("10.2.0.1", Some("web-0"), true)],
            ),
        )
        .await
        .unwrap();
    slices
        .create(
            &pp,
            &slice("empty-east", "empty", "east", &[("10.3.0.1", None, false)]),
        )
        .await
        .unwrap();

    // mcs-dns.
    let server = DnsServer::bind(DnsConfig::default().listen("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let mcs = server.local_addr();
    let synced = server.synced();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(client.clone(), async move {
        let _ = stopped.await;
    }));

    // Both have listed everything once they answer for the last object written.
    let probe = "10-1-0-2.east.web.demo.svc.clusterset.local.";
    wait_for("mcs-dns synced", Duration::from_secs(60), || {
        let synced = synced.clone();
        async move {
            synced
                .load(std::sync::atomic::Ordering::Acquire)
                .then_some(())
        }
    })
    .await;
    assert!(answers(mcs, probe).await, "mcs-dns answers {probe}");
    let (_coredns, reference) = start_coredns(&coredns, &cluster, probe).await;

    let questions: &[(&str, RecordType)] = &[
        ("hello.demo.svc.clusterset.local.", RecordType::A),
        ("hello.demo.svc.clusterset.local.", RecordType::AAAA),
        ("hello.demo.svc.clusterset.local.", RecordType::SRV),
        ("hello.demo.svc.clusterset.local.", RecordType::TXT),
        (
            "_tcp._tcp.hello.demo.svc.clusterset.local.",
            RecordType::SRV,
        ),
        (
            "_udp._udp.hello.demo.svc.clusterset.local.",
            RecordType::SRV,
        ),
        (
            "_nope._tcp.hello.demo.svc.clusterset.local.",
            RecordType::SRV,
        ),
        ("HeLLo.Demo.svc.clusterset.local.", RecordType::A),
        ("web.demo.svc.clusterset.local.", RecordType::A),
        ("web.demo.svc.clusterset.local.", RecordType::SRV),
        ("_tcp._tcp.web.demo.svc.clusterset.local.", RecordType::SRV),
        ("web-0.east.web.demo.svc.clusterset.local.", RecordType::A),
        ("web-0.west.web.demo.svc.clusterset.local.", RecordType::A),
        (
            "10-1-0-2.east.web.demo.svc.clusterset.local.",
            RecordType::A,
        ),
        ("web-2.east.web.demo.svc.clusterset.local.", RecordType::A),
        ("empty.demo.svc.clusterset.local.", RecordType::A),
        ("nope.demo.svc.clusterset.local.", RecordType::A),
        ("hello.nons.svc.clusterset.local.", RecordType::A),
        ("demo.svc.clusterset.local.", RecordType::A),
        ("svc.clusterset.local.", RecordType::A),
        ("hello.demo.pod.clusterset.local.", RecordType::A),
        ("a.b.c.hello.demo.svc.clusterset.local.", RecordType::A),
    ];
    let mut differences = Vec::new();
    for &(name, qtype) in questions {
        let ours = summary(&ask(mcs, name, qtype).await);
        let theirs = summary(&ask(reference, name, qtype).await);
        if ours != theirs {
            differences.push(format!(
                "{name} {qtype}:\n  mcs-dns {ours:?}\n  CoreDNS {theirs:?}"
            ));
        }
    }
    assert!(
        differences.is_empty(),
        "mcs-dns and CoreDNS disagree:\n{}",
        differences.join("\n")
    );

    // The documented differences, pinned so a change on either side is noticed.
    let version = "dns-version.clusterset.local.";
    let txt = |m: Message| -> Vec<String> {
        m.answers
            .iter()
            .filter_map(|r| match &r.data {
                RData::TXT(t) => Some(
                    t.txt_data
                        .iter()
                        .map(|d| String::from_utf8_lossy(d))
                        .collect(),
                ),
                _ => None,
            })
            .collect()
    };
    assert_eq!(txt(ask(mcs, version, RecordType::TXT).await), ["1.0.0"]);
    assert_eq!(
        txt(ask(reference, version, RecordType::TXT).await),
        ["1.1.0"]
    );
    let ns = |m: &Message| {
        m.answers
            .iter()
            .map(|r| r.data.to_string())
            .collect::<Vec<_>>()
    };
    assert_eq!(
        ns(&ask(mcs, "clusterset.local.", RecordType::NS).await),
        ["ns.dns.cluster.local."]
    );
    assert_eq!(
        ns(&ask(reference, "clusterset.local.", RecordType::NS).await),
        ["ns.dns.clusterset.local."]
    );

    let _ = stop.send(());
    task.await.unwrap().unwrap();
}
