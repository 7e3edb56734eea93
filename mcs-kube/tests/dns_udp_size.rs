//! Property: no UDP answer of the DNS server exceeds the UDP size in force (the server's
//! configured maximum, lowered by the client's EDNS buffer, 512 without EDNS), and an
//! answer that lost records to that limit carries the TC bit. The same question over TCP
//! gives the whole answer (unless it is larger than a DNS message can be, 65,535 bytes),
//! which a UDP answer without TC must equal. An answer to a
//! request with EDNS carries an OPT record (RFC 6891 6.1.1), truncated or not, offering
//! the size in force.
//!
//! The server is the real one (hickory-server on loopback UDP and TCP), fed through its
//! [`ZoneHandle`](mcs_kube::dns::ZoneHandle) with random ServiceImports and EndpointSlices;
//! no API server is needed.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::time::Duration;

use hickory_server::proto::op::{Edns, Message, MessageType, OpCode, Query};
use hickory_server::proto::rr::{Name, RecordType};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::api::ObjectMeta;
use mcs_core::api::{
    LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, Protocol, ServiceImportSpec, ServiceImportType,
    ServicePort, v1beta1::ServiceImport,
};
use mcs_core::dns::ZoneData;
use mcs_core::name::Zone;
use mcs_kube::dns::{DnsConfig, DnsServer, ZoneHandle};
use proptest::prelude::*;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpStream, UdpSocket};

const NS: &str = "size";
/// The largest DNS message over TCP (its length prefix is 16 bits).
const TCP_MAX: usize = 65_535;
/// More than any record of these tests takes on the wire (owner and target names of at
/// most about 100 bytes uncompressed, rdata of at most 16 bytes besides).
const RECORD_MAX: usize = 512;

/// One random service: headless or with a ClusterSet IP, ports, and endpoints per cluster.
#[derive(Clone, Debug)]
struct Svc {
    headless: bool,
    ports: Vec<u16>,
    /// Per cluster: (hostname or none, IPv6?) for each endpoint.
    clusters: Vec<Vec<(Option<String>, bool)>>,
}

fn svc() -> impl Strategy<Value = Svc> {
    let endpoint = (
        prop::option::of("[a-z][a-z0-9]{0,20}"),
        prop::bool::weighted(0.3),
    );
    (
        any::<bool>(),
        prop::collection::btree_set(1u16..2000, 1..4),
        prop::collection::vec(prop::collection::vec(endpoint, 0..80), 1..4),
    )
        .prop_map(|(headless, ports, clusters)| Svc {
            headless,
            ports: ports.into_iter().collect(),
            clusters,
        })
}

/// The question: which service, which name form, which type, and the client's EDNS buffer.
#[derive(Clone, Debug)]
struct Question {
    service: usize,
    form: u8,
    qtype: RecordType,
    edns: Option<u16>,
}

fn question() -> impl Strategy<Value = Question> {
    (
        0usize..3,
        0u8..5,
        prop::sample::select(vec![
            RecordType::A,
            RecordType::AAAA,
            RecordType::SRV,
            RecordType::ANY,
            RecordType::TXT,
            RecordType::NS,
            RecordType::SOA,
        ]),
        prop::option::of(prop_oneof![
            Just(0u16),
            0u16..600,
            512u16..=4096,
            Just(u16::MAX)
        ]),
    )
        .prop_map(|(service, form, qtype, edns)| Question {
            service,
            form,
            qtype,
            edns,
        })
}

fn name_of(i: usize) -> String {
    format!("svc{i}")
}

fn import(i: usize, s: &Svc) -> ServiceImport {
    let type_ = if s.headless {
        ServiceImportType::Headless
    } else {
        ServiceImportType::ClusterSetIp
    };
    let mut spec = ServiceImportSpec::new(type_);
    if !s.headless {
        spec.ips = Some(vec![format!("10.96.0.{}", i + 1)]);
    }
    spec.ports = s
        .ports
        .iter()
        .map(|p| ServicePort {
            name: Some(format!("p{p}")),
            protocol: Some(Protocol::Tcp),
            app_protocol: None,
            port: i32::from(*p),
        })
        .collect();
    let mut si = ServiceImport::new(&name_of(i), spec);
    si.metadata.namespace = Some(NS.into());
    si
}

/// One slice per cluster and address family.
fn slices(i: usize, s: &Svc) -> Vec<EndpointSlice> {
    let mut out = Vec::new();
    for (c, endpoints) in s.clusters.iter().enumerate() {
        for v6 in [false, true] {
            let eps: Vec<Endpoint> = endpoints
                .iter()
                .enumerate()
                .filter(|(_, (_, is_v6))| *is_v6 == v6)
                .map(|(n, (host, _))| Endpoint {
                    addresses: vec![if v6 {
                        format!("fd00:{c}::{}:{n:x}", i + 1)
                    } else {
                        format!("10.{}.{c}.{n}", i + 1)
                    }],
                    // Hostnames must be unique in a cluster: suffix the index.
                    hostname: host.as_ref().map(|h| format!("{h}-{n}")),
                    conditions: Some(EndpointConditions {
                        ready: Some(true),
                        ..Default::default()
                    }),
                    ..Default::default()
                })
                .collect();
            if eps.is_empty() {
                continue;
            }
            out.push(EndpointSlice {
                address_type: if v6 { "IPv6" } else { "IPv4" }.into(),
                metadata: ObjectMeta {
                    name: Some(format!("{}-c{c}-{}", name_of(i), if v6 { 6 } else { 4 })),
                    namespace: Some(NS.into()),
                    labels: Some(BTreeMap::from([
                        (LABEL_SERVICE_NAME.to_string(), name_of(i)),
                        (LABEL_SOURCE_CLUSTER.to_string(), format!("cluster{c}")),
                    ])),
                    ..Default::default()
                },
                endpoints: eps,
                ports: Some(
                    s.ports
                        .iter()
                        .map(|p| EndpointPort {
                            name: Some(format!("p{p}")),
                            port: Some(i32::from(*p)),
                            protocol: Some("TCP".into()),
                            ..Default::default()
                        })
                        .collect(),
                ),
            });
        }
    }
    out
}

/// Replaces the server's data with `services`.
fn load(zone: &ZoneHandle, services: &[Svc]) {
    zone.update(|data| {
        *data = ZoneData::new(Zone::default(), 5);
        data.set_namespace(NS, true);
        for (i, s) in services.iter().enumerate() {
            data.upsert_import(&import(i, s)).unwrap();
            for slice in slices(i, s) {
                data.upsert_slice(&slice).unwrap();
            }
        }
    });
    zone.mark_synced();
}

fn qname(q: &Question, services: &[Svc]) -> String {
    let i = q.service % services.len();
    let svc = format!("{}.{NS}.svc.clusterset.local.", name_of(i));
    let s = &services[i];
    match q.form {
        0 => svc,
        1 => format!("_p{}._tcp.{svc}", s.ports[0]),
        2 => {
            // A per-endpoint name, when there is one.
            match s.clusters[0].first() {
                Some((Some(h), _)) => format!("{h}-0.cluster0.{svc}"),
                Some((None, true)) => format!("fd00-0--{}-0.cluster0.{svc}", i + 1),
                Some((None, false)) => format!("10-{}-0-0.cluster0.{svc}", i + 1),
                None => svc,
            }
        }
        3 => "clusterset.local.".to_owned(),
        // A negative answer (NXDOMAIN with the SOA).
        _ => format!("nope.{NS}.svc.clusterset.local."),
    }
}

fn query_bytes(id: u16, name: &str, qtype: RecordType, edns: Option<u16>) -> Vec<u8> {
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), qtype));
    if let Some(size) = edns {
        let mut e = Edns::new();
        e.set_max_payload(size);
        m.set_edns(e);
    }
    m.to_vec().unwrap()
}

async fn udp(server: SocketAddr, query: &[u8]) -> Vec<u8> {
    let sock = UdpSocket::bind("127.0.0.1:0").await.unwrap();
    sock.send_to(query, server).await.unwrap();
    let mut buf = vec![0u8; 65_535];
    let (n, _) = tokio::time::timeout(Duration::from_secs(5), sock.recv_from(&mut buf))
        .await
        .expect("a UDP answer")
        .unwrap();
    buf.truncate(n);
    buf
}

async fn tcp(server: SocketAddr, query: &[u8]) -> Vec<u8> {
    let mut conn = TcpStream::connect(server).await.unwrap();
    conn.write_u16(u16::try_from(query.len()).unwrap())
        .await
        .unwrap();
    conn.write_all(query).await.unwrap();
    let len = conn.read_u16().await.unwrap();
    let mut buf = vec![0u8; usize::from(len)];
    conn.read_exact(&mut buf).await.unwrap();
    buf
}

/// The records of a message as comparable text, EDNS's OPT left out.
fn records(m: &Message) -> (Vec<String>, Vec<String>) {
    let text = |rs: &[hickory_server::proto::rr::Record]| {
        let mut v: Vec<String> = rs
            .iter()
            .filter(|r| r.record_type() != RecordType::OPT)
            .map(ToString::to_string)
            .collect();
        v.sort();
        v
    };
    (text(&m.answers), text(&m.additionals))
}

fn check_server(max_udp_payload: u16) {
    let runtime = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(1)
        .enable_all()
        .build()
        .unwrap();
    let (server, zone) = runtime.block_on(async {
        let server = DnsServer::bind(
            DnsConfig::default()
                .listen("127.0.0.1:0".parse().unwrap())
                .max_udp_payload(max_udp_payload),
        )
        .await
        .unwrap();
        let (addr, zone) = (server.local_addr(), server.zone());
        tokio::spawn(server.serve(std::future::pending()));
        (addr, zone)
    });
    let truncated = std::cell::Cell::new(0u32);
    let config = ProptestConfig {
        cases: 96,
        ..ProptestConfig::default()
    };
    proptest!(config, |(services in prop::collection::vec(svc(), 1..4), q in question())| {
        load(&zone, &services);
        let name = qname(&q, &services);
        let query = query_bytes(0x5eed, &name, q.qtype, q.edns);
        let (over_udp, over_tcp) = runtime.block_on(async {
            (udp(server, &query).await, tcp(server, &query).await)
        });
        let limit = usize::from(q.edns.map_or(512, |e| e.clamp(512, max_udp_payload)));
        prop_assert!(
            over_udp.len() <= limit,
            "{name} {:?} edns {:?}: {} bytes over UDP, limit {limit}",
            q.qtype, q.edns, over_udp.len()
        );
        let udp_msg = Message::from_vec(&over_udp).unwrap();
        let tcp_msg = Message::from_vec(&over_tcp).unwrap();
        for (transport, m) in [("UDP", &udp_msg), ("TCP", &tcp_msg)] {
            prop_assert_eq!(
                m.edns.as_ref().map(|e| usize::from(e.max_payload())),
                q.edns.map(|_| limit),
                "{} {:?} edns {:?} over {}: the OPT record", name, q.qtype, q.edns, transport
            );
        }
        // Over TCP only an answer larger than a DNS message can be (65,535 bytes: the
        // length prefix is 16 bits) is cut, and then at the last whole record that fits.
        prop_assert!(
            !tcp_msg.metadata.truncation || over_tcp.len() > TCP_MAX - RECORD_MAX,
            "{} {:?}: a TCP answer of {} bytes is truncated", name, q.qtype, over_tcp.len()
        );
        prop_assert_eq!(udp_msg.metadata.response_code, tcp_msg.metadata.response_code);
        let (udp_answers, udp_extra) = records(&udp_msg);
        let (tcp_answers, tcp_extra) = records(&tcp_msg);
        if udp_msg.metadata.truncation {
            truncated.set(truncated.get() + 1);
            prop_assert!(udp_answers.len() + udp_extra.len() < tcp_answers.len() + tcp_extra.len()
                || over_tcp.len() > limit,
                "TC set on an answer that fit");
        } else {
            prop_assert_eq!(&udp_answers, &tcp_answers, "a UDP answer without TC is whole");
            prop_assert_eq!(&udp_extra, &tcp_extra, "additional records too");
        }
    });
    // The generator must reach the interesting case, or the property proves little.
    assert!(truncated.get() > 0, "no case needed truncation");
}

#[test]
fn udp_answers_fit_the_default_size_or_carry_tc() {
    check_server(mcs_kube::dns::DEFAULT_MAX_UDP_PAYLOAD);
}

#[test]
fn udp_answers_fit_a_smaller_configured_size_or_carry_tc() {
    check_server(700);
}
