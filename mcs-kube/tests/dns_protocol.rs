//! DNS protocol rules of the `clusterset.local` server, on the wire: the real server
//! (hickory-server on loopback UDP and TCP) asked with hand-built messages and with `dig`
//! as an independent client, asserting exact response codes and flags.
//!
//! - opcodes other than QUERY get NOTIMP;
//! - EDNS versions above 0 get BADVERS with an OPT record of version 0 (RFC 6891 6.1.3);
//! - classes other than IN get REFUSED;
//! - malformed messages (two OPT records, no question, two questions) get FORMERR;
//! - the SOA's primary server and the apex NS target lie outside the zone;
//! - before the watches have listed (here: the ServiceImport CRD is not installed yet, so
//!   they cannot) names in the zone get SERVFAIL, names outside it REFUSED.

use mcs_testkit as support;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::atomic::Ordering;
use std::time::Duration;

use hickory_server::proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_server::proto::rr::{DNSClass, Name, RData, RecordType};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, PostParams};
use kube::runtime::wait::{await_condition, conditions};
use mcs_core::api::{ServiceImportSpec, ServiceImportType, ServicePort, v1beta1::ServiceImport};
use mcs_core::dns::DEFAULT_NAMESERVER;
use mcs_kube::dns::{DnsConfig, DnsError, DnsServer, ZoneHandle};
use support::{ClusterOptions, start_cluster, wait_for};
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

const ZONE: &str = "clusterset.local.";
const HELLO: &str = "hello.demo.svc.clusterset.local.";

/// A server on a free loopback port, answering from `hello.demo` (ClusterSet IP 10.0.0.10,
/// port `tcp/42`); marked synced when `synced`.
async fn server(config: DnsConfig, synced: bool) -> (SocketAddr, ZoneHandle) {
    let server = DnsServer::bind(config.listen("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let (addr, zone) = (server.local_addr(), server.zone());
    zone.update(|data| {
        data.set_namespace("demo", true);
        let mut spec = ServiceImportSpec::new(ServiceImportType::ClusterSetIp);
        spec.ips = Some(vec!["10.0.0.10".into()]);
        spec.ports = vec![ServicePort {
            name: Some("tcp".into()),
            protocol: None,
            app_protocol: None,
            port: 42,
        }];
        let mut import = ServiceImport::new("hello", spec);
        import.metadata.namespace = Some("demo".into());
        data.upsert_import(&import)
    })
    .unwrap();
    if synced {
        zone.mark_synced();
    }
    tokio::spawn(server.serve(std::future::pending()));
    (addr, zone)
}

/// A request: `op_code`, one question (`name`, `qtype`, `class`), EDNS of `edns` version.
fn request(
    id: u16,
    op_code: OpCode,
    name: &str,
    qtype: RecordType,
    class: DNSClass,
    edns: Option<u8>,
) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, op_code);
    m.metadata.recursion_desired = true;
    let mut q = Query::query(Name::from_ascii(name).unwrap(), qtype);
    q.set_query_class(class);
    m.add_query(q);
    if let Some(version) = edns {
        let mut e = Edns::new();
        e.set_max_payload(1232);
        e.set_version(version);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

fn query(name: &str, qtype: RecordType) -> Vec<u8> {
    request(0x5eed, OpCode::Query, name, qtype, DNSClass::IN, None)
}

/// Sends `msg` over UDP and returns the first datagram that answers its id.
async fn udp(server: SocketAddr, msg: &[u8]) -> Vec<u8> {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.send_to(msg, server).await.unwrap();
    let mut buf = vec![0u8; 65_535];
    loop {
        let (n, _) = tokio::time::timeout(Duration::from_secs(10), sock.recv_from(&mut buf))
            .await
            .expect("a UDP answer")
            .unwrap();
        if n >= 2 && buf[..2] == msg[..2] {
            buf.truncate(n);
            return buf;
        }
    }
}

/// Sends `msg` over TCP (length-prefixed) and returns the answer.
async fn tcp(server: SocketAddr, msg: &[u8]) -> Vec<u8> {
    let mut conn = TcpStream::connect(server).await.unwrap();
    conn.write_u16(u16::try_from(msg.len()).unwrap())
        .await
        .unwrap();
    conn.write_all(msg).await.unwrap();
    let len = conn.read_u16().await.unwrap();
    let mut buf = vec![0u8; usize::from(len)];
    conn.read_exact(&mut buf).await.unwrap();
    buf
}

/// The same request over UDP and TCP; both answers, parsed.
async fn both(server: SocketAddr, msg: &[u8]) -> [(Vec<u8>, Message); 2] {
    let u = udp(server, msg).await;
    let t = tcp(server, msg).await;
    let (mu, mt) = (
        Message::from_vec(&u).unwrap(),
        Message::from_vec(&t).unwrap(),
    );
    [(u, mu), (t, mt)]
}

/// Header checks common to every error answer: our id, QR set, the opcode echoed, the
/// question echoed, no records, RA clear, the low four bits of `code` in the header.
fn assert_error(raw: &[u8], m: &Message, op_code: OpCode, code: ResponseCode, what: &str) {
    assert_eq!(m.metadata.id, 0x5eed, "{what}: id");
    assert_eq!(m.metadata.message_type, MessageType::Response, "{what}: QR");
    assert_eq!(m.metadata.op_code, op_code, "{what}: opcode echoed");
    // Compared as numbers: 16 decodes as BADSIG, which shares its value with BADVERS.
    assert_eq!(
        u16::from(m.metadata.response_code),
        u16::from(code),
        "{what}: rcode {}",
        m.metadata.response_code
    );
    assert_eq!(
        raw[3] & 0x0f,
        code.low(),
        "{what}: header RCODE bits (the rest go in the OPT record)"
    );
    assert!(!m.metadata.recursion_available, "{what}: RA");
    assert!(!m.metadata.truncation, "{what}: TC");
    assert!(
        m.answers.is_empty() && m.authorities.is_empty(),
        "{what}: no records: {m:?}"
    );
}

/// Runs `dig` against `server` (off the runtime's threads, which serve the queries).
async fn dig(server: SocketAddr, args: &[&str]) -> String {
    let mut cmd = Command::new("dig");
    cmd.arg(format!("@{}", server.ip()))
        .args(["-p", &server.port().to_string(), "+time=5", "+tries=1"])
        .args(args);
    let out = tokio::task::spawn_blocking(move || cmd.output())
        .await
        .unwrap()
        .unwrap_or_else(|e| {
            panic!("cannot run dig (scripts/test.sh installs bind9-dnsutils): {e}")
        });
    // dig exits 0 for any answer, whatever its rcode, and 9 when none came.
    assert!(
        out.status.success(),
        "dig {args:?} got no answer: {}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The `;; ->>HEADER<<-` line of dig's output and its flags line.
fn dig_header(out: &str) -> (&str, &str) {
    let header = out
        .lines()
        .find(|l| l.contains("->>HEADER<<-"))
        .unwrap_or_else(|| panic!("no header in {out}"));
    let flags = out
        .lines()
        .find(|l| l.starts_with(";; flags:"))
        .unwrap_or_else(|| panic!("no flags in {out}"));
    (header, flags)
}

#[tokio::test]
async fn opcodes_other_than_query_get_notimp() {
    let (addr, _zone) = server(DnsConfig::default(), true).await;
    // The control: the same question as a QUERY is answered.
    for (raw, m) in both(addr, &query(HELLO, RecordType::A)).await {
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert_eq!(m.answers.len(), 1, "{m:?}");
        assert_eq!(raw[2] >> 3 & 0x0f, 0, "opcode QUERY");
    }
    for (op, number) in [
        (OpCode::Status, 2),
        (OpCode::Notify, 4),
        (OpCode::Update, 5),
        (OpCode::Unknown(1), 1), // IQUERY, retired by RFC 3425
        (OpCode::Unknown(6), 6), // DSO (RFC 8490)
        (OpCode::Unknown(15), 15),
    ] {
        for edns in [None, Some(0)] {
            let msg = request(0x5eed, op, HELLO, RecordType::A, DNSClass::IN, edns);
            for (transport, (raw, m)) in ["udp", "tcp"].iter().zip(both(addr, &msg).await) {
                let what = format!("opcode {number} edns {edns:?} over {transport}");
                assert_error(&raw, &m, op, ResponseCode::NotImp, &what);
                assert_eq!(raw[2] >> 3 & 0x0f, number, "{what}: opcode bits");
                assert!(!m.metadata.authoritative, "{what}: AA");
                // RFC 6891: an OPT record in the request means one in the response.
                assert_eq!(m.edns.is_some(), edns.is_some(), "{what}: OPT");
            }
        }
    }
    // dig as an independent client.
    for op in ["notify", "update", "status"] {
        let out = dig(addr, &[&format!("+opcode={op}"), HELLO, "A"]).await;
        let (header, _) = dig_header(&out);
        assert!(
            header.contains(&format!("opcode: {}", op.to_uppercase()))
                && header.contains("status: NOTIMP"),
            "{out}"
        );
    }
}

#[tokio::test]
async fn edns_versions_above_0_get_badvers_with_an_opt_record() {
    let (addr, _zone) = server(DnsConfig::default(), true).await;
    for version in [1u8, 2, 255] {
        let msg = request(
            0x5eed,
            OpCode::Query,
            HELLO,
            RecordType::A,
            DNSClass::IN,
            Some(version),
        );
        for (transport, (raw, m)) in ["udp", "tcp"].iter().zip(both(addr, &msg).await) {
            let what = format!("EDNS version {version} over {transport}");
            // BADVERS is 16: 0 in the header, 1 in the OPT record's extended RCODE.
            assert_error(&raw, &m, OpCode::Query, ResponseCode::BADVERS, &what);
            let edns = m.edns.as_ref().unwrap_or_else(|| panic!("{what}: no OPT"));
            assert_eq!(edns.rcode_high(), 1, "{what}: extended RCODE");
            assert_eq!(edns.version(), 0, "{what}: the version we speak");
            assert_eq!(edns.max_payload(), 1232, "{what}: our UDP size");
        }
    }
    // Version 0 is answered.
    let msg = request(
        0x5eed,
        OpCode::Query,
        HELLO,
        RecordType::A,
        DNSClass::IN,
        Some(0),
    );
    for (_, m) in both(addr, &msg).await {
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert_eq!(m.answers.len(), 1);
        assert_eq!(m.edns.as_ref().map(Edns::version), Some(0));
    }
    // dig (without +ednsnegotiation it reports BADVERS as it is).
    let out = dig(addr, &["+edns=1", "+noednsnegotiation", HELLO, "A"]).await;
    let (header, _) = dig_header(&out);
    assert!(header.contains("status: BADVERS"), "{out}");
    assert!(out.contains("; EDNS: version: 0"), "{out}");
}

#[tokio::test]
async fn classes_other_than_in_get_refused() {
    let (addr, _zone) = server(DnsConfig::default(), true).await;
    for class in [
        DNSClass::CH,
        DNSClass::HS,
        DNSClass::NONE,
        DNSClass::ANY,
        DNSClass::Unknown(42),
    ] {
        for name in [HELLO, "dns-version.clusterset.local.", ZONE] {
            let msg = request(0x5eed, OpCode::Query, name, RecordType::TXT, class, None);
            for (transport, (raw, m)) in ["udp", "tcp"].iter().zip(both(addr, &msg).await) {
                let what = format!("{name} class {class:?} over {transport}");
                assert_error(&raw, &m, OpCode::Query, ResponseCode::Refused, &what);
                assert!(!m.metadata.authoritative, "{what}: AA");
                assert_eq!(m.queries[0].query_class(), class, "{what}: question echoed");
            }
        }
    }
    let out = dig(addr, &["-c", "CH", "dns-version.clusterset.local", "TXT"]).await;
    assert!(dig_header(&out).0.contains("status: REFUSED"), "{out}");
    // The control: class IN.
    let out = dig(addr, &["-c", "IN", "dns-version.clusterset.local", "TXT"]).await;
    assert!(dig_header(&out).0.contains("status: NOERROR"), "{out}");
}

#[tokio::test]
async fn malformed_requests_get_formerr() {
    let (addr, _zone) = server(DnsConfig::default(), true).await;
    // Two OPT records (RFC 6891 6.1.1): hickory-server refuses to parse the message.
    let mut two_opts = request(
        0x5eed,
        OpCode::Query,
        HELLO,
        RecordType::A,
        DNSClass::IN,
        Some(0),
    );
    assert_eq!(two_opts[11], 1, "ARCOUNT 1");
    // The OPT record is the last 11 bytes: root name, type 41, class, TTL, RDLENGTH 0.
    let opt = two_opts[two_opts.len() - 11..].to_vec();
    assert_eq!(opt[..3], [0, 0, 41]);
    two_opts.extend_from_slice(&opt);
    two_opts[11] = 2;
    // No question, and two questions.
    let mut none = Message::new(0x5eed, MessageType::Query, OpCode::Query);
    none.metadata.recursion_desired = true;
    let mut two = none.clone();
    two.add_query(Query::query(
        Name::from_ascii(HELLO).unwrap(),
        RecordType::A,
    ));
    two.add_query(Query::query(
        Name::from_ascii(ZONE).unwrap(),
        RecordType::SOA,
    ));
    for (what, msg) in [
        ("two OPT records", two_opts),
        ("no question", none.to_vec().unwrap()),
        ("two questions", two.to_vec().unwrap()),
    ] {
        for (transport, (raw, m)) in ["udp", "tcp"].iter().zip(both(addr, &msg).await) {
            let what = format!("{what} over {transport}");
            assert_error(&raw, &m, OpCode::Query, ResponseCode::FormErr, &what);
        }
    }
}

#[tokio::test]
async fn the_soa_and_ns_name_a_server_outside_the_zone() {
    for (config, nameserver) in [
        (DnsConfig::default(), DEFAULT_NAMESERVER),
        (
            DnsConfig::default().nameserver("MCS-DNS.mcs-system.svc.cluster.local"),
            "mcs-dns.mcs-system.svc.cluster.local.",
        ),
    ] {
        let (addr, _zone) = server(config, true).await;
        let ns = Name::from_ascii(nameserver).unwrap();
        let zone = Name::from_ascii(ZONE).unwrap();
        assert!(!zone.zone_of(&ns), "{ns} is outside {zone}");

        for (_, m) in both(addr, &query(ZONE, RecordType::NS)).await {
            assert_eq!(m.metadata.response_code, ResponseCode::NoError);
            assert!(m.metadata.authoritative);
            let targets: Vec<_> = m.answers.iter().map(|r| r.data.clone()).collect();
            assert_eq!(targets.len(), 1, "{m:?}");
            assert!(matches!(&targets[0], RData::NS(n) if n.0 == ns), "{m:?}");
            // No glue: the zone has no address for a name outside it.
            assert!(m.additionals.is_empty(), "{m:?}");
        }
        // The SOA of a positive answer and of a negative one.
        for (q, qtype, section) in [
            (ZONE, RecordType::SOA, "answer"),
            (
                "nope.demo.svc.clusterset.local.",
                RecordType::A,
                "authority",
            ),
        ] {
            for (_, m) in both(addr, &query(q, qtype)).await {
                let records = if section == "answer" {
                    &m.answers
                } else {
                    &m.authorities
                };
                let Some(RData::SOA(soa)) = records.first().map(|r| &r.data) else {
                    panic!("no SOA in the {section} section for {q}: {m:?}");
                };
                assert_eq!(soa.mname, ns, "{q}");
                assert!(zone.zone_of(&soa.rname), "hostmaster.<zone>");
            }
        }
        // dig agrees.
        assert_eq!(dig(addr, &["+short", ZONE, "NS"]).await.trim(), nameserver);
        let soa = dig(addr, &["+short", ZONE, "SOA"]).await;
        assert!(
            soa.starts_with(&format!("{nameserver} hostmaster.{ZONE} ")),
            "{soa}"
        );
    }

    // A name server inside the zone is a configuration error, named before any socket.
    let err = DnsServer::bind(
        DnsConfig::default()
            .listen("127.0.0.1:0".parse().unwrap())
            .nameserver("ns.dns.clusterset.local."),
    )
    .await
    .err()
    .expect("an in-zone nameserver is rejected");
    assert!(matches!(err, DnsError::Zone { .. }), "{err:?}");
    assert_eq!(
        err.to_string(),
        "cannot serve zone clusterset.local: nameserver \"ns.dns.clusterset.local.\": lies \
         inside zone clusterset.local, which has no address records for it; name a host \
         outside the zone"
    );
}

/// Before the first sync, fed without a cluster: SERVFAIL in the zone (whatever the
/// question), REFUSED outside it, and the protocol rules still apply.
#[tokio::test]
async fn servfail_before_the_first_sync_without_a_cluster() {
    let (addr, zone) = server(DnsConfig::default(), false).await;
    for (name, qtype, code) in [
        (HELLO, RecordType::A, ResponseCode::ServFail),
        (ZONE, RecordType::SOA, ResponseCode::ServFail),
        (
            "dns-version.clusterset.local.",
            RecordType::TXT,
            ResponseCode::ServFail,
        ),
        (
            "nope.demo.svc.clusterset.local.",
            RecordType::A,
            ResponseCode::ServFail,
        ),
        ("example.com.", RecordType::A, ResponseCode::Refused),
        (
            "hello.demo.svc.cluster.local.",
            RecordType::A,
            ResponseCode::Refused,
        ),
    ] {
        for edns in [None, Some(0)] {
            let msg = request(0x5eed, OpCode::Query, name, qtype, DNSClass::IN, edns);
            for (transport, (raw, m)) in ["udp", "tcp"].iter().zip(both(addr, &msg).await) {
                let what = format!("{name} {qtype} edns {edns:?} over {transport}, not synced");
                assert_error(&raw, &m, OpCode::Query, code, &what);
                assert_eq!(m.edns.is_some(), edns.is_some(), "{what}: OPT");
            }
        }
    }
    let msg = request(
        0x5eed,
        OpCode::Notify,
        HELLO,
        RecordType::A,
        DNSClass::IN,
        None,
    );
    let (_, m) = &both(addr, &msg).await[0];
    assert_eq!(m.metadata.response_code, ResponseCode::NotImp);
    // Once synced, the same questions are answered.
    zone.mark_synced();
    for (_, m) in both(addr, &query(HELLO, RecordType::A)).await {
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert_eq!(m.answers.len(), 1);
    }
}

/// Against a real API server that does not serve ServiceImports yet (the CRD is not
/// installed), so the server's watches cannot list and it cannot have synced: SERVFAIL.
/// Installing the CRD lets the watches list; the server then answers.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn servfail_until_the_watches_have_listed() {
    let cluster = start_cluster(
        "dnsnosync",
        ClusterOptions {
            controller_manager: false,
            install_crds: false,
            ..Default::default()
        },
    )
    .await;
    let client = cluster.client().await;
    let server = DnsServer::bind(DnsConfig::default().listen("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr = server.local_addr();
    let synced = server.synced();
    let metrics = server.metrics();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(client.clone(), async move {
        let _ = stopped.await;
    }));

    for (_, m) in both(
        addr,
        &query("dns-version.clusterset.local.", RecordType::TXT),
    )
    .await
    {
        assert_eq!(m.metadata.response_code, ResponseCode::ServFail, "{m:?}");
    }
    let out = dig(addr, &["dns-version.clusterset.local", "TXT"]).await;
    assert!(dig_header(&out).0.contains("status: SERVFAIL"), "{out}");
    let out = dig(addr, &["+tcp", HELLO, "A"]).await;
    assert!(dig_header(&out).0.contains("status: SERVFAIL"), "{out}");
    assert!(!synced.load(Ordering::Acquire));
    assert_eq!(metrics.responses("ServFail"), 4);

    // Install the CRDs; the ServiceImport watch lists on its next attempt.
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in support::load_crds() {
        let name = crd.metadata.name.clone().unwrap();
        crds.create(&PostParams::default(), &crd).await.unwrap();
        tokio::time::timeout(
            Duration::from_secs(60),
            await_condition(crds.clone(), &name, conditions::is_crd_established()),
        )
        .await
        .unwrap_or_else(|_| panic!("CRD {name} not established"))
        .unwrap();
    }
    // The watcher backs off up to 30 s between failed lists.
    wait_for("DNS watches synced", Duration::from_secs(90), || {
        let synced = synced.clone();
        async move { synced.load(Ordering::Acquire).then_some(()) }
    })
    .await;
    for (_, m) in both(
        addr,
        &query("dns-version.clusterset.local.", RecordType::TXT),
    )
    .await
    {
        assert_eq!(m.metadata.response_code, ResponseCode::NoError, "{m:?}");
        assert!(m.metadata.authoritative);
        assert_eq!(m.answers.len(), 1);
    }
    // hello.demo does not exist in the cluster: an authoritative NXDOMAIN now.
    let out = dig(addr, &[HELLO, "A"]).await;
    let (header, flags) = dig_header(&out);
    assert!(
        header.contains("status: NXDOMAIN") && flags.contains(" aa"),
        "{out}"
    );

    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

/// Four UDP sockets share the port (`SO_REUSEPORT`): the kernel shows four bound to it,
/// and questions from 64 source ports, which the kernel spreads over the four by source
/// port, are all answered (a socket with no receive loop would leave about a quarter
/// unanswered; the chance it gets none of 64 sources is (3/4)^64, about 1e-8).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_udp_socket_sharing_the_port_answers() {
    let (addr, _zone) = server(DnsConfig::default().udp_sockets(4), true).await;
    let port = format!(":{:04X} ", addr.port());
    let bound = std::fs::read_to_string("/proc/net/udp")
        .unwrap()
        .lines()
        .filter(|l| {
            l.split_whitespace()
                .nth(1)
                .is_some_and(|local| format!("{local} ").ends_with(&port))
        })
        .count();
    assert_eq!(bound, 4, "UDP sockets bound to {addr}");
    let question = query(HELLO, RecordType::A);
    let answers = futures::future::join_all((0..64).map(|_| udp(addr, &question))).await;
    for raw in answers {
        let m = Message::from_vec(&raw).unwrap();
        assert_eq!(m.metadata.response_code, ResponseCode::NoError);
        assert_eq!(m.answers.len(), 1);
    }
    // The TCP listener shares the port with them.
    let (_, m) = &both(addr, &query(HELLO, RecordType::A)).await[1];
    assert_eq!(m.answers.len(), 1);
}

/// One socket (no `SO_REUSEPORT`): a second server cannot take the same port.
#[tokio::test]
async fn one_udp_socket_keeps_its_port_to_itself() {
    let (addr, _zone) = server(DnsConfig::default().udp_sockets(1), true).await;
    let err = DnsServer::bind(DnsConfig::default().listen(addr).udp_sockets(1))
        .await
        .err()
        .expect("the port is taken");
    assert!(matches!(err, DnsError::Bind { .. }), "{err}");
}
