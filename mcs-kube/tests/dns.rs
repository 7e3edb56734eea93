//! The `clusterset.local` DNS server against a real API server, queried with
//! hickory-resolver and with `dig` as an independent client (KEP-1645, "DNS"; conformance
//! cases 22-27 with imports and slices written straight into the cluster).

use mcs_testkit as support;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::process::Command;
use std::time::Duration;

use hickory_resolver::proto::rr::RecordType;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::api::{Api, DeleteParams, ObjectMeta, PostParams};
use mcs_core::api::{
    LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, Protocol, ServiceImportSpec, ServiceImportType,
    ServicePort, v1beta1::ServiceImport,
};
use mcs_kube::dns::{DnsConfig, DnsServer};
use support::{ClusterOptions, start_cluster, wait_for};

const NS: &str = "demo";

fn import(name: &str, type_: ServiceImportType, ips: &[&str]) -> ServiceImport {
    let mut spec = ServiceImportSpec::new(type_);
    spec.ips = (!ips.is_empty()).then(|| ips.iter().map(|s| s.to_string()).collect());
    spec.ports = vec![
        ServicePort {
            name: Some("tcp".into()),
            protocol: Some(Protocol::Tcp),
            app_protocol: None,
            port: 42,
        },
        ServicePort {
            name: Some("udp".into()),
            protocol: Some(Protocol::Udp),
            app_protocol: None,
            port: 42,
        },
    ];
    let mut si = ServiceImport::new(name, spec);
    si.metadata.namespace = Some(NS.into());
    si
}

fn slice(
    name: &str,
    svc: &str,
    cluster: &str,
    family: &str,
    endpoints: &[(&str, Option<&str>, bool)],
) -> EndpointSlice {
    EndpointSlice {
        address_type: family.into(),
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

fn dig(server: SocketAddr, args: &[&str]) -> String {
    let out = Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string(), "+time=2", "+tries=2"])
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run dig (scripts/test.sh installs bind9-dnsutils): {e}")
        });
    assert!(
        out.status.success(),
        "dig {args:?} failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn sorted_lines(s: &str) -> Vec<String> {
    let mut v: Vec<String> = s
        .lines()
        .filter(|l| !l.is_empty())
        .map(str::to_owned)
        .collect();
    v.sort();
    v
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_conformance_22_to_27_against_a_real_api_server() {
    let cluster = start_cluster("dns", ClusterOptions::api_only()).await;
    let client = cluster.client().await;
    support::create_namespace(&client, NS).await;
    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let pp = PostParams::default();
    imports
        .create(
            &pp,
            &import(
                "hello",
                ServiceImportType::ClusterSetIp,
                &["10.0.0.10", "fd00::10"],
            ),
        )
        .await
        .unwrap();
    imports
        .create(&pp, &import("web", ServiceImportType::Headless, &[]))
        .await
        .unwrap();
    slices
        .create(
            &pp,
            &slice(
                "web-east",
                "web",
                "east",
                "IPv4",
                &[
                    ("10.1.0.1", Some("web-0"), true),
                    ("10.1.0.2", None, true),
                    ("10.1.0.3", Some("web-2"), false),
                ],
            ),
        )
        .await
        .unwrap();
    slices
        .create(
            &pp,
            &slice(
                "web-west",
                "web",
                "west",
                "IPv4",
                &[("10.2.0.1", Some("web-0"), true)],
            ),
        )
        .await
        .unwrap();

    let server = DnsServer::bind(DnsConfig::default().listen("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr = server.local_addr();
    let synced = server.synced();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(client.clone(), async move {
        let _ = stopped.await;
    }));

    // Before the watches sync the server answers SERVFAIL; wait for the sync.
    wait_for("DNS watches synced", Duration::from_secs(20), || {
        let synced = synced.clone();
        async move {
            synced
                .load(std::sync::atomic::Ordering::Acquire)
                .then_some(())
        }
    })
    .await;

    // Case 22: A/AAAA of a ClusterSetIP import are its spec.ips.
    assert_eq!(
        sorted_lines(&dig(
            addr,
            &["+short", "hello.demo.svc.clusterset.local", "A"]
        )),
        ["10.0.0.10"]
    );
    assert_eq!(
        sorted_lines(&dig(
            addr,
            &["+short", "hello.demo.svc.clusterset.local", "AAAA"]
        )),
        ["fd00::10"]
    );
    let r = support::dns_resolver(addr);
    let ips: Vec<IpAddr> = r
        .lookup_ip("hello.demo.svc.clusterset.local.")
        .await
        .unwrap()
        .iter()
        .collect();
    assert!(
        ips.contains(&"10.0.0.10".parse::<IpAddr>().unwrap()),
        "{ips:?}"
    );

    // Case 23: the bare-name SRV query gives exactly one record: port 42, the service name.
    let srv = sorted_lines(&dig(
        addr,
        &["+short", "hello.demo.svc.clusterset.local", "SRV"],
    ));
    assert_eq!(srv.len(), 1, "{srv:?}");
    assert!(
        srv[0].ends_with(" 42 hello.demo.svc.clusterset.local."),
        "{srv:?}"
    );

    // Case 24: cluster.local is not ours: refused, never answered with clusterset data.
    let out = dig(addr, &["hello.demo.svc.cluster.local", "A"]);
    assert!(out.contains("status: REFUSED"), "{out}");

    // Case 25: headless A returns the ready addresses of all clusters.
    assert_eq!(
        sorted_lines(&dig(
            addr,
            &["+short", "web.demo.svc.clusterset.local", "A"]
        )),
        ["10.1.0.1", "10.1.0.2", "10.2.0.1"]
    );

    // Case 26: per-endpoint names, with the cluster id from the slice's source-cluster label.
    assert_eq!(
        sorted_lines(&dig(
            addr,
            &["+short", "web-0.west.web.demo.svc.clusterset.local", "A"]
        )),
        ["10.2.0.1"]
    );
    assert_eq!(
        sorted_lines(&dig(
            addr,
            &["+short", "10-1-0-2.east.web.demo.svc.clusterset.local", "A"]
        )),
        ["10.1.0.2"]
    );
    let a = r
        .lookup("web-0.east.web.demo.svc.clusterset.local.", RecordType::A)
        .await
        .unwrap();
    assert_eq!(a.answers().len(), 1);

    // Case 27: headless SRV, one per ready endpoint, targets prefixed by hostname or dashed IP.
    let srv = sorted_lines(&dig(
        addr,
        &["+short", "web.demo.svc.clusterset.local", "SRV"],
    ));
    let targets: Vec<&str> = srv.iter().map(|l| l.rsplit(' ').next().unwrap()).collect();
    assert_eq!(
        targets,
        [
            "10-1-0-2.east.web.demo.svc.clusterset.local.",
            "web-0.east.web.demo.svc.clusterset.local.",
            "web-0.west.web.demo.svc.clusterset.local."
        ]
    );
    assert!(
        srv.iter().all(|l| l.split(' ').nth(2) == Some("42")),
        "{srv:?}"
    );
    let lookup = r
        .srv_lookup("_tcp._tcp.web.demo.svc.clusterset.local.")
        .await
        .unwrap();
    assert_eq!(lookup.answers().len(), 3);

    // NXDOMAIN vs NODATA, the reserved per-cluster name, the version TXT.
    assert!(dig(addr, &["nope.demo.svc.clusterset.local", "A"]).contains("status: NXDOMAIN"));
    assert!(dig(addr, &["east.web.demo.svc.clusterset.local", "A"]).contains("status: NXDOMAIN"));
    let nodata = dig(addr, &["hello.demo.svc.clusterset.local", "TXT"]);
    assert!(
        nodata.contains("status: NOERROR") && nodata.contains("ANSWER: 0"),
        "{nodata}"
    );
    assert_eq!(
        dig(addr, &["+short", "dns-version.clusterset.local", "TXT"]).trim(),
        "\"1.0.0\""
    );
    // Zone transfers are not served (NOTIMP; dig reports the transfer as failed).
    let axfr = dig(addr, &["clusterset.local", "AXFR"]);
    assert!(
        axfr.contains("Transfer failed") && !axfr.contains("IN\tSOA"),
        "{axfr}"
    );

    // Changes in the cluster reach DNS: a slice goes away, an endpoint turns unready.
    slices
        .delete("web-west", &DeleteParams::default())
        .await
        .unwrap();
    wait_for(
        "west endpoint gone from DNS",
        Duration::from_secs(10),
        || async {
            (sorted_lines(&dig(
                addr,
                &["+short", "web.demo.svc.clusterset.local", "A"],
            )) == ["10.1.0.1", "10.1.0.2"])
            .then_some(())
        },
    )
    .await;
    imports
        .delete("hello", &DeleteParams::default())
        .await
        .unwrap();
    wait_for("import gone from DNS", Duration::from_secs(10), || async {
        dig(addr, &["hello.demo.svc.clusterset.local", "A"])
            .contains("status: NXDOMAIN")
            .then_some(())
    })
    .await;

    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn large_headless_answers_truncate_over_udp_and_complete_over_tcp() {
    let cluster = start_cluster("dnsbig", ClusterOptions::api_only()).await;
    let client = cluster.client().await;
    support::create_namespace(&client, NS).await;
    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    imports
        .create(
            &PostParams::default(),
            &import("big", ServiceImportType::Headless, &[]),
        )
        .await
        .unwrap();
    let addrs: Vec<String> = (1..=100).map(|i| format!("10.3.0.{i}")).collect();
    let eps: Vec<(&str, Option<&str>, bool)> =
        addrs.iter().map(|a| (a.as_str(), None, true)).collect();
    slices
        .create(
            &PostParams::default(),
            &slice("big-east", "big", "east", "IPv4", &eps),
        )
        .await
        .unwrap();

    let server = DnsServer::bind(DnsConfig::default().listen("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr = server.local_addr();
    let synced = server.synced();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(client.clone(), async move {
        let _ = stopped.await;
    }));
    wait_for("DNS watches synced", Duration::from_secs(20), || {
        let synced = synced.clone();
        async move {
            synced
                .load(std::sync::atomic::Ordering::Acquire)
                .then_some(())
        }
    })
    .await;

    // Plain UDP without EDNS: 512 bytes, so the answer is truncated (TC bit).
    let udp = dig(
        addr,
        &["+noedns", "+ignore", "big.demo.svc.clusterset.local", "A"],
    );
    assert!(udp.contains(" tc"), "expected the TC flag: {udp}");
    // dig's default retries over TCP on TC and gets everything.
    let full = sorted_lines(&dig(
        addr,
        &["+short", "+noedns", "big.demo.svc.clusterset.local", "A"],
    ));
    assert_eq!(full.len(), 100);

    // Garbage and 128-label names never crash the server.
    let sock = tokio::net::UdpSocket::bind("127.0.0.1:0").await.unwrap();
    for junk in [
        &b""[..],
        b"\x00",
        &[0xffu8; 700][..],
        b"\x12\x34\x01\x00\x00\x01\x00\x00\x00\x00\x00\x00\xc0\x0c\x00\x01\x00\x01",
    ] {
        sock.send_to(junk, addr).await.unwrap();
    }
    // 118 one-letter labels under the zone (the longest legal name there): NXDOMAIN.
    // 128 labels: not a legal name at all, so FORMERR or no answer. Outside the zone: REFUSED.
    assert_eq!(raw_query(&sock, addr, 118, true).await, Some(3), "NXDOMAIN");
    assert_eq!(raw_query(&sock, addr, 100, false).await, Some(5), "REFUSED");
    let rcode = raw_query(&sock, addr, 128, true).await;
    assert!(
        matches!(rcode, None | Some(1)),
        "FORMERR or dropped, got {rcode:?}"
    );
    assert!(
        dig(addr, &["+short", "big.demo.svc.clusterset.local", "ANY"])
            .lines()
            .count()
            > 0
    );
    // Still answering after the abuse.
    assert!(dig(addr, &["dns-version.clusterset.local", "TXT"]).contains("status: NOERROR"));

    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// Sends an A query for `a.a.…a.` (`labels` labels, under the zone when `in_zone`);
/// returns the response code.
async fn raw_query(
    sock: &tokio::net::UdpSocket,
    addr: SocketAddr,
    labels: usize,
    in_zone: bool,
) -> Option<u8> {
    let mut q = vec![
        0xab, 0xcd, 0x01, 0x00, 0x00, 0x01, 0x00, 0x00, 0x00, 0x00, 0x00, 0x00,
    ];
    for _ in 0..labels {
        q.extend_from_slice(&[1, b'a']);
    }
    if in_zone {
        q.extend_from_slice(b"\x0aclusterset\x05local");
    }
    q.extend_from_slice(&[0, 0x00, 0x01, 0x00, 0x01]);
    sock.send_to(&q, addr).await.unwrap();
    let mut buf = [0u8; 1500];
    loop {
        match tokio::time::timeout(Duration::from_secs(2), sock.recv_from(&mut buf)).await {
            Ok(Ok((n, _))) if n >= 4 && buf[0] == 0xab && buf[1] == 0xcd => {
                return Some(buf[3] & 0x0f);
            }
            Ok(Ok(_)) => continue,
            _ => return None,
        }
    }
}
