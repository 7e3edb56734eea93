use std::collections::BTreeMap;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use proptest::prelude::*;

use super::*;
use crate::api::{LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, ServiceImportSpec};

fn import(
    ns: &str,
    name: &str,
    type_: ServiceImportType,
    ips: &[&str],
    ports: &[(&str, Protocol, i32)],
) -> ServiceImport {
    let mut spec = ServiceImportSpec::new(type_);
    spec.ips = (!ips.is_empty()).then(|| ips.iter().map(|s| s.to_string()).collect());
    spec.ports = ports
        .iter()
        .map(|(n, p, port)| ServicePort {
            name: Some(n.to_string()),
            protocol: Some(*p),
            app_protocol: None,
            port: *port,
        })
        .collect();
    let mut si = ServiceImport::new(name, spec);
    si.metadata.namespace = Some(ns.into());
    si
}

/// `endpoints`: (addresses, hostname, ready).
fn slice(
    ns: &str,
    name: &str,
    svc: &str,
    cluster: &str,
    family: &str,
    endpoints: &[(&[&str], Option<&str>, bool)],
) -> EndpointSlice {
    EndpointSlice {
        address_type: family.into(),
        metadata: ObjectMeta {
            name: Some(name.into()),
            namespace: Some(ns.into()),
            labels: Some(BTreeMap::from([
                (LABEL_SERVICE_NAME.to_string(), svc.to_string()),
                (LABEL_SOURCE_CLUSTER.to_string(), cluster.to_string()),
            ])),
            ..Default::default()
        },
        endpoints: endpoints
            .iter()
            .map(|(addrs, host, ready)| Endpoint {
                addresses: addrs.iter().map(|s| s.to_string()).collect(),
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

const HELLO_PORTS: &[(&str, Protocol, i32)] =
    &[("tcp", Protocol::Tcp, 42), ("udp", Protocol::Udp, 42)];

fn data() -> ZoneData {
    let mut z = ZoneData::new(Zone::default(), DEFAULT_TTL);
    z.set_namespace("demo", true);
    z.upsert_import(&import(
        "demo",
        "hello",
        ServiceImportType::ClusterSetIp,
        &["10.0.0.10", "fd00::10"],
        HELLO_PORTS,
    ))
    .unwrap();
    z.upsert_import(&import(
        "demo",
        "web",
        ServiceImportType::Headless,
        &[],
        HELLO_PORTS,
    ))
    .unwrap();
    z.upsert_slice(&slice(
        "demo",
        "web-east",
        "web",
        "east",
        "IPv4",
        &[
            (&["10.1.0.1"], Some("web-0"), true),
            (&["10.1.0.2"], None, true),
            (&["10.1.0.3"], Some("web-2"), false),
        ],
    ))
    .unwrap();
    z.upsert_slice(&slice(
        "demo",
        "web-west",
        "web",
        "west",
        "IPv4",
        &[(&["10.2.0.1"], Some("web-0"), true)],
    ))
    .unwrap();
    z.upsert_slice(&slice(
        "demo",
        "web-west-v6",
        "web",
        "west",
        "IPv6",
        &[(&["fd00::2:1"], Some("web-0"), true)],
    ))
    .unwrap();
    z
}

fn ips(answer: &Answer) -> Vec<String> {
    let mut v: Vec<String> = answer
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.to_string()),
            RData::Aaaa(a) => Some(a.to_string()),
            _ => None,
        })
        .collect();
    v.sort();
    v
}

fn srv(answer: &Answer) -> Vec<(u16, String)> {
    let mut v: Vec<(u16, String)> = answer
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::Srv { port, target, .. } => Some((*port, target.clone())),
            _ => None,
        })
        .collect();
    v.sort();
    v
}

#[test]
fn conformance_22_clusterip_a_and_aaaa_resolve_to_the_clusterset_ips() {
    let z = data();
    assert_eq!(
        ips(&z.answer("hello.demo.svc.clusterset.local.", QueryType::A)),
        ["10.0.0.10"]
    );
    assert_eq!(
        ips(&z.answer("hello.demo.svc.clusterset.local", QueryType::Aaaa)),
        ["fd00::10"]
    );
    let a = z.answer("HELLO.Demo.svc.ClusterSet.local.", QueryType::A);
    assert_eq!(
        a.answers[0].name, "HELLO.Demo.svc.ClusterSet.local.",
        "owner echoes the question"
    );
    assert_eq!(a.answers[0].ttl, DEFAULT_TTL);
}

#[test]
fn conformance_23_clusterip_bare_srv_is_one_record_per_port() {
    let z = data();
    let a = z.answer("hello.demo.svc.clusterset.local.", QueryType::Srv);
    assert_eq!(
        srv(&a),
        [(42, "hello.demo.svc.clusterset.local.".to_owned())]
    );
    assert_eq!(a.additionals.len(), 2, "both VIPs as additional records");
    let named = z.answer("_tcp._tcp.hello.demo.svc.clusterset.local.", QueryType::Srv);
    assert_eq!(
        srv(&named),
        [(42, "hello.demo.svc.clusterset.local.".to_owned())]
    );
    assert_eq!(
        z.answer(
            "_http._tcp.hello.demo.svc.clusterset.local.",
            QueryType::Srv
        )
        .rcode,
        Rcode::NxDomain
    );
}

#[test]
fn conformance_24_cluster_local_is_not_ours() {
    let z = data();
    assert_eq!(
        z.answer("hello.demo.svc.cluster.local.", QueryType::A)
            .rcode,
        Rcode::Refused
    );
}

#[test]
fn conformance_25_headless_a_returns_ready_addresses_of_all_clusters() {
    let z = data();
    assert_eq!(
        ips(&z.answer("web.demo.svc.clusterset.local", QueryType::A)),
        ["10.1.0.1", "10.1.0.2", "10.2.0.1"]
    );
    assert_eq!(
        ips(&z.answer("web.demo.svc.clusterset.local", QueryType::Aaaa)),
        ["fd00::2:1"]
    );
}

#[test]
fn conformance_26_per_endpoint_names_resolve_to_that_endpoint() {
    let z = data();
    assert_eq!(
        ips(&z.answer("web-0.east.web.demo.svc.clusterset.local", QueryType::A)),
        ["10.1.0.1"]
    );
    assert_eq!(
        ips(&z.answer("web-0.west.web.demo.svc.clusterset.local", QueryType::A)),
        ["10.2.0.1"]
    );
    assert_eq!(
        ips(&z.answer("web-0.west.web.demo.svc.clusterset.local", QueryType::Aaaa)),
        ["fd00::2:1"]
    );
    assert_eq!(
        ips(&z.answer("10-1-0-2.east.web.demo.svc.clusterset.local", QueryType::A)),
        ["10.1.0.2"],
        "dashed-IP fallback"
    );
    assert_eq!(
        z.answer("web-2.east.web.demo.svc.clusterset.local", QueryType::A)
            .rcode,
        Rcode::NxDomain,
        "not ready"
    );
    assert_eq!(
        z.answer("web-0.north.web.demo.svc.clusterset.local", QueryType::A)
            .rcode,
        Rcode::NxDomain
    );
    assert_eq!(
        z.answer("x.east.hello.demo.svc.clusterset.local", QueryType::A)
            .rcode,
        Rcode::NxDomain,
        "ClusterSetIP has no per-endpoint names"
    );
}

#[test]
fn conformance_27_headless_srv_one_per_ready_endpoint() {
    let z = data();
    let a = z.answer("web.demo.svc.clusterset.local.", QueryType::Srv);
    assert_eq!(
        srv(&a),
        [
            (
                42,
                "10-1-0-2.east.web.demo.svc.clusterset.local.".to_owned()
            ),
            (42, "web-0.east.web.demo.svc.clusterset.local.".to_owned()),
            (42, "web-0.west.web.demo.svc.clusterset.local.".to_owned()),
        ]
    );
    assert!(
        a.additionals
            .iter()
            .any(|r| r.name == "web-0.west.web.demo.svc.clusterset.local."
                && r.data == RData::Aaaa("fd00::2:1".parse().unwrap()))
    );
    let named = z.answer("_udp._udp.web.demo.svc.clusterset.local.", QueryType::Srv);
    assert_eq!(srv(&named).len(), 3);
}

#[test]
fn nxdomain_and_nodata_follow_the_reference_plugin() {
    let mut z = data();
    let rc = |z: &ZoneData, n: &str, t: QueryType| {
        let a = z.answer(n, t);
        (a.rcode, a.answers.len())
    };
    // NODATA
    for (name, t) in [
        ("clusterset.local.", QueryType::A),
        ("svc.clusterset.local.", QueryType::A),
        ("demo.svc.clusterset.local.", QueryType::A),
        ("hello.demo.svc.clusterset.local.", QueryType::Txt),
        ("web.demo.svc.clusterset.local.", QueryType::Txt),
        ("dns-version.clusterset.local.", QueryType::A),
        ("hello.demo.svc.clusterset.local.", QueryType::Other(99)),
    ] {
        assert_eq!(rc(&z, name, t), (Rcode::NoError, 0), "{name} {t:?}");
        assert_eq!(
            z.answer(name, t).authority.len(),
            1,
            "SOA on negative answers"
        );
    }
    // NXDOMAIN
    for name in [
        "nope.demo.svc.clusterset.local.",
        "hello.other.svc.clusterset.local.",
        "other.svc.clusterset.local.",
        "east.hello.demo.svc.clusterset.local.",
        "a.b.c.d.e.svc.clusterset.local.",
        "hello.demo.pod.clusterset.local.",
        "foo.clusterset.local.",
    ] {
        assert_eq!(rc(&z, name, QueryType::A), (Rcode::NxDomain, 0), "{name}");
    }
    // A headless service with no ready endpoint is NXDOMAIN.
    z.remove_slice("demo", "web-east");
    z.remove_slice("demo", "web-west");
    z.remove_slice("demo", "web-west-v6");
    assert_eq!(
        rc(&z, "web.demo.svc.clusterset.local.", QueryType::A),
        (Rcode::NxDomain, 0)
    );
    // The namespace missing locally hides the import.
    z.set_namespace("demo", false);
    assert_eq!(
        rc(&z, "hello.demo.svc.clusterset.local.", QueryType::A),
        (Rcode::NxDomain, 0)
    );
    // Zone apex and version.
    let z = data();
    assert!(matches!(
        z.answer("clusterset.local", QueryType::Soa).answers[0].data,
        RData::Soa { .. }
    ));
    assert!(matches!(
        z.answer("clusterset.local", QueryType::Ns).answers[0].data,
        RData::Ns(_)
    ));
    assert_eq!(
        z.answer("dns-version.clusterset.local", QueryType::Txt)
            .answers[0]
            .data,
        RData::Txt("1.0.0".into())
    );
    assert_eq!(
        z.answer("clusterset.local", QueryType::Transfer).rcode,
        Rcode::NotImp
    );
    assert_eq!(z.answer("example.com.", QueryType::A).rcode, Rcode::Refused);
}

#[test]
fn the_nameserver_lies_outside_the_zone() {
    let mut z = data();
    let soa = |z: &ZoneData, q: &str| {
        let a = z.answer(q, QueryType::Soa);
        let record = a.answers.first().or(a.authority.first()).cloned();
        match record.map(|r| r.data) {
            Some(RData::Soa { mname, serial, .. }) => (mname, serial),
            other => panic!("no SOA for {q}: {other:?}"),
        }
    };
    let ns = |z: &ZoneData| z.answer("clusterset.local.", QueryType::Ns).answers;
    // By default both name the cluster DNS, outside the zone.
    let (mname, serial) = soa(&z, "clusterset.local.");
    assert_eq!(mname, DEFAULT_NAMESERVER);
    assert_eq!(z.nameserver(), DEFAULT_NAMESERVER);
    assert!(!z.zone().contains(&mname));
    assert_eq!(
        ns(&z),
        [Record {
            name: "clusterset.local.".into(),
            ttl: DEFAULT_TTL,
            data: RData::Ns(DEFAULT_NAMESERVER.into()),
        }]
    );
    // Negative answers carry the same SOA.
    assert_eq!(
        soa(&z, "nope.demo.svc.clusterset.local.").0,
        DEFAULT_NAMESERVER
    );
    // The old in-zone name has nothing behind it and is not offered any more.
    assert_eq!(
        z.answer("ns.dns.clusterset.local.", QueryType::A).rcode,
        Rcode::NxDomain
    );

    // Another name: normalised to lowercase with the trailing dot; the serial moves.
    z.set_nameserver("MCS-DNS.mcs-system.svc.cluster.local")
        .unwrap();
    assert_eq!(z.nameserver(), "mcs-dns.mcs-system.svc.cluster.local.");
    let (mname, serial2) = soa(&z, "clusterset.local.");
    assert_eq!(mname, "mcs-dns.mcs-system.svc.cluster.local.");
    assert_ne!(serial, serial2, "a new SOA gets a new serial");
    assert_eq!(
        ns(&z)[0].data,
        RData::Ns("mcs-dns.mcs-system.svc.cluster.local.".into())
    );

    // Names inside the zone (any case), and names that are not host names, are refused
    // with an error naming the input and the problem; the setting is unchanged.
    for (bad, problem) in [
        (
            "ns.dns.clusterset.local.",
            "lies inside zone clusterset.local",
        ),
        ("NS.Clusterset.Local", "lies inside zone clusterset.local"),
        ("clusterset.local", "lies inside zone clusterset.local"),
        ("", "is empty"),
        (".", "is empty"),
        ("a..b", "label \"\""),
        ("under_score.example", "label \"under_score\""),
    ] {
        let err = z.set_nameserver(bad).unwrap_err();
        assert!(
            matches!(&err, DnsDataError::Nameserver { name, .. } if name == bad),
            "{bad:?}: {err:?}"
        );
        let text = err.to_string();
        assert!(
            text.starts_with(&format!("nameserver {bad:?}: ")) && text.contains(problem),
            "{bad:?}: {text}"
        );
    }
    let long = format!("{}.example", vec!["a".repeat(63); 4].join("."));
    assert!(
        z.set_nameserver(&long)
            .unwrap_err()
            .to_string()
            .contains("at most 253"),
    );
    assert_eq!(z.nameserver(), "mcs-dns.mcs-system.svc.cluster.local.");

    // A zone that contains the default name must be given another one.
    let mut local = ZoneData::new(Zone::new("cluster.local").unwrap(), DEFAULT_TTL);
    assert!(local.set_nameserver(DEFAULT_NAMESERVER).is_err());
    local.set_nameserver("ns.example.").unwrap();
    assert_eq!(soa(&local, "cluster.local.").0, "ns.example.");
}

#[test]
fn slices_move_between_services_and_imports_go_away() {
    let mut z = data();
    // The same slice now labelled for another service.
    let mut moved = slice(
        "demo",
        "web-west",
        "other",
        "west",
        "IPv4",
        &[(&["10.2.0.9"], None, true)],
    );
    z.upsert_import(&import(
        "demo",
        "other",
        ServiceImportType::Headless,
        &[],
        HELLO_PORTS,
    ))
    .unwrap();
    z.upsert_slice(&moved).unwrap();
    assert_eq!(
        ips(&z.answer("web.demo.svc.clusterset.local", QueryType::A)),
        ["10.1.0.1", "10.1.0.2"]
    );
    assert_eq!(
        ips(&z.answer("other.demo.svc.clusterset.local", QueryType::A)),
        ["10.2.0.9"]
    );
    z.remove_import("demo", "other");
    assert_eq!(
        z.answer("other.demo.svc.clusterset.local", QueryType::A)
            .rcode,
        Rcode::NxDomain
    );
    moved
        .metadata
        .labels
        .as_mut()
        .unwrap()
        .remove(LABEL_SOURCE_CLUSTER);
    assert!(matches!(
        z.upsert_slice(&moved),
        Err(DnsDataError::Slice(_))
    ));
    let bad = import(
        "demo",
        "bad",
        ServiceImportType::ClusterSetIp,
        &["10.0.0.300"],
        HELLO_PORTS,
    );
    assert!(matches!(
        z.upsert_import(&bad),
        Err(DnsDataError::BadIp { .. })
    ));
}

#[test]
fn an_endpoint_in_two_slices_answers_each_address_once() {
    // Found by the `dns` fuzz target: every slice that listed the endpoint added its
    // addresses again, so the answer repeated records.
    let mut z = data();
    z.upsert_slice(&slice(
        "demo",
        "web-east-rotated",
        "web",
        "east",
        "IPv4",
        &[(&["10.1.0.1", "10.1.0.9"], Some("web-0"), true)],
    ))
    .unwrap();
    let a = z.answer("web-0.east.web.demo.svc.clusterset.local.", QueryType::A);
    assert_eq!(ips(&a), ["10.1.0.1", "10.1.0.9"]);
}

#[test]
fn names_too_long_for_the_wire_are_never_emitted() {
    // Found by the `dns` fuzz target. Each label fits, but
    // `<hostname>.<clusterid>.<svc>.<ns>.svc.clusterset.local.` would be 277 characters:
    // that endpoint gets no SRV record (its name cannot be sent, nor asked for).
    let long = |c: &str| c.repeat(63);
    let (host, cluster, svc, ns) = (long("h"), long("c"), long("s"), long("n"));
    let mut z = ZoneData::new(Zone::default(), DEFAULT_TTL);
    z.set_namespace(&ns, true);
    z.upsert_import(&import(
        &ns,
        &svc,
        ServiceImportType::Headless,
        &[],
        HELLO_PORTS,
    ))
    .unwrap();
    z.upsert_slice(&slice(
        &ns,
        "s",
        &svc,
        &cluster,
        "IPv4",
        &[
            (&["10.0.0.1"], Some(host.as_str()), true),
            (&["10.0.0.2"], Some("web-0"), true),
        ],
    ))
    .unwrap();
    let name = format!("{svc}.{ns}.svc.clusterset.local.");
    let short = format!("web-0.{cluster}.{name}");
    assert_eq!(
        ips(&z.answer(&name, QueryType::A)),
        ["10.0.0.1", "10.0.0.2"]
    );
    for question in [name.clone(), format!("_tcp._tcp.{name}")] {
        let a = z.answer(&question, QueryType::Srv);
        assert_eq!(srv(&a), [(42, short.clone())], "{question}");
        for r in a.answers.iter().chain(&a.additionals) {
            assert!(r.name.len() <= crate::name::MAX_NAME_LEN + 1, "{}", r.name);
        }
    }
    // The same holds for the SOA names of the longest zone.
    let zone: String = (0..242)
        .map(|i| if i % 64 == 63 { '.' } else { 'z' })
        .collect();
    let z = ZoneData::new(Zone::new(&zone).unwrap(), DEFAULT_TTL);
    let a = z.answer(&zone, QueryType::A);
    let RData::Soa { mname, rname, .. } = &a.authority[0].data else {
        panic!("{a:?}")
    };
    assert!(
        mname.len() <= crate::name::MAX_NAME_LEN + 1
            && rname.len() <= crate::name::MAX_NAME_LEN + 1
    );
}

proptest! {
    /// Every name the builder emits (owners and SRV targets) parses back with the name grammar.
    #[test]
    fn emitted_names_parse_back(hosts in prop::collection::vec(prop::option::of("[a-z][a-z0-9-]{0,10}[a-z0-9]"), 1..20), cluster in "[a-z][a-z0-9]{0,8}") {
        let mut z = ZoneData::new(Zone::default(), DEFAULT_TTL);
        z.set_namespace("ns", true);
        z.upsert_import(&import("ns", "svc", ServiceImportType::Headless, &[], HELLO_PORTS)).unwrap();
        let addrs: Vec<String> = (0..hosts.len()).map(|i| format!("10.9.{}.{}", i / 200, i % 200 + 1)).collect();
        let eps: Vec<(&[&str], Option<&str>, bool)> = Vec::new();
        let addr_refs: Vec<[&str; 1]> = addrs.iter().map(|a| [a.as_str()]).collect();
        let mut eps = eps;
        for (i, h) in hosts.iter().enumerate() {
            eps.push((&addr_refs[i][..], h.as_deref(), true));
        }
        z.upsert_slice(&slice("ns", "s", "svc", &cluster, "IPv4", &eps)).unwrap();
        let zone = Zone::default();
        for q in ["svc.ns.svc.clusterset.local.", "_tcp._tcp.svc.ns.svc.clusterset.local."] {
            let a = z.answer(q, QueryType::Srv);
            prop_assert_eq!(a.rcode, Rcode::NoError);
            for r in a.answers.iter().chain(&a.additionals) {
                prop_assert!(McsName::parse(&r.name, &zone).is_ok(), "owner {}", r.name);
                if let RData::Srv { target, .. } = &r.data {
                    let parsed = McsName::parse(target, &zone);
                    prop_assert!(matches!(parsed, Ok(McsName::Endpoint { .. })), "target {}", target);
                    let again = z.answer(target, QueryType::A);
                    prop_assert_eq!(again.rcode, Rcode::NoError, "target {} resolves", target);
                }
            }
        }
    }
}
