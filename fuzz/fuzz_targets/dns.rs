//! The `clusterset.local` DNS answer builder (`mcs_core::dns::ZoneData`).
//!
//! Input: a zone (the default, a short one, or one of arbitrary labels), a history of
//! namespace, ServiceImport and EndpointSlice updates and removals (labels of every length
//! up to 63, arbitrary IP text, ports, conditions), then questions: names built from what
//! the history used (service, named-port SRV, per-endpoint, structural names, in mixed
//! case, with or without the trailing dot) or arbitrary text, of every query type.
//!
//! Nothing panics, and every answer:
//! - is REFUSED exactly outside the zone, NOTIMP for a transfer, NXDOMAIN for a name the
//!   grammar rejects; negative answers carry the SOA and no records;
//! - holds only records of the asked type, without repeats, with the zone's TTL;
//! - names only what the DNS wire format can carry (labels of at most 63 characters,
//!   names of at most 253), and every owner name and SRV target parses with the mcs-core
//!   name grammar; every SRV target resolves (NOERROR for an A question);
//! - names as the SOA's primary server and NS target the configured name server, which
//!   lies outside the zone (`set_nameserver` refuses names inside it), unless the zone
//!   contains the default one.
#![no_main]

use std::collections::BTreeSet;
use std::net::IpAddr;

use arbitrary::{Result, Unstructured};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use libfuzzer_sys::fuzz_target;
use mcs_core::api::v1beta1::ServiceImport;
use mcs_core::api::{
    LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, Protocol, ServiceImportSpec, ServiceImportType,
    ServicePort,
};
use mcs_core::dns::{Answer, DEFAULT_NAMESERVER, QueryType, RData, Rcode, ZoneData};
use mcs_core::name::{McsName, Zone};
use mcs_fuzz::{cluster, label, mixed_case, wire_encodable};

/// What the history used, to build questions that hit it.
#[derive(Default)]
struct Seen {
    namespaces: Vec<String>,
    services: Vec<String>,
    clusters: Vec<String>,
    hosts: Vec<String>,
    ports: Vec<String>,
}

impl Seen {
    fn pick(u: &mut Unstructured<'_>, list: &[String]) -> Result<String> {
        if list.is_empty() || u.ratio(1, 8)? {
            label(u)
        } else {
            Ok(u.choose(list)?.clone())
        }
    }
}

fn zone(u: &mut Unstructured<'_>) -> Result<Zone> {
    Ok(match u.int_in_range(0..=3u8)? {
        0 | 1 => Zone::default(),
        2 => Zone::new("example.org").unwrap(),
        _ => {
            let n = u.int_in_range(1..=5usize)?;
            let labels = (0..n).map(|_| label(u)).collect::<Result<Vec<_>>>()?;
            Zone::new(&labels.join(".")).unwrap_or_default()
        }
    })
}

fn ip_text(u: &mut Unstructured<'_>) -> Result<String> {
    Ok(match u.int_in_range(0..=5u8)? {
        0 => (*u.choose(&["10.0.0.1", "10.0.0.2", "fd00::1", "::", "::ffff:10.0.0.1"])?).to_owned(),
        1 | 2 => IpAddr::from(u.arbitrary::<[u8; 4]>()?).to_string(),
        3 | 4 => IpAddr::from(u.arbitrary::<[u8; 16]>()?).to_string(),
        _ => u.arbitrary::<String>()?,
    })
}

fn import(u: &mut Unstructured<'_>, seen: &mut Seen) -> Result<ServiceImport> {
    let ns = Seen::pick(u, &seen.namespaces)?;
    let name = Seen::pick(u, &seen.services)?;
    seen.services.push(name.clone());
    let type_ = if u.arbitrary()? {
        ServiceImportType::Headless
    } else {
        ServiceImportType::ClusterSetIp
    };
    let mut spec = ServiceImportSpec::new(type_);
    let n = u.int_in_range(0..=3usize)?;
    if n > 0 {
        spec.ips = Some((0..n).map(|_| ip_text(u)).collect::<Result<_>>()?);
    }
    for _ in 0..u.int_in_range(0..=4usize)? {
        let port_name = if u.arbitrary()? {
            let p = Seen::pick(u, &seen.ports)?;
            seen.ports.push(p.clone());
            Some(p)
        } else {
            None
        };
        spec.ports.push(ServicePort {
            name: port_name,
            protocol: *u.choose(&[
                None,
                Some(Protocol::Tcp),
                Some(Protocol::Udp),
                Some(Protocol::Sctp),
            ])?,
            app_protocol: None,
            port: *u.choose(&[80, 443, 9443, 0, -1, 65_535, 65_536, i32::MAX])?,
        });
    }
    let mut import = ServiceImport::new(&name, spec);
    import.metadata.namespace = u.ratio(15, 16)?.then_some(ns);
    Ok(import)
}

fn slice(u: &mut Unstructured<'_>, seen: &mut Seen) -> Result<EndpointSlice> {
    let ns = Seen::pick(u, &seen.namespaces)?;
    let svc = Seen::pick(u, &seen.services)?;
    let cluster_id = if u.ratio(1, 2)? && !seen.clusters.is_empty() {
        u.choose(&seen.clusters)?.clone()
    } else {
        cluster(u)?
    };
    seen.clusters.push(cluster_id.clone());
    let mut labels = std::collections::BTreeMap::new();
    if u.ratio(15, 16)? {
        labels.insert(LABEL_SERVICE_NAME.to_owned(), svc);
    }
    if u.ratio(15, 16)? {
        labels.insert(LABEL_SOURCE_CLUSTER.to_owned(), cluster_id);
    }
    let mut endpoints = Vec::new();
    for _ in 0..u.int_in_range(0..=4usize)? {
        let hostname = if u.arbitrary()? {
            let h = Seen::pick(u, &seen.hosts)?;
            seen.hosts.push(h.clone());
            Some(h)
        } else {
            None
        };
        let addresses = (0..u.int_in_range(0..=2usize)?)
            .map(|_| ip_text(u))
            .collect::<Result<Vec<_>>>()?;
        for a in &addresses {
            if let Ok(ip) = a.parse::<IpAddr>() {
                seen.hosts
                    .push(mcs_core::name::Hostname::from_ip(ip).to_string());
            }
        }
        endpoints.push(Endpoint {
            addresses,
            hostname,
            conditions: Some(EndpointConditions {
                ready: u.arbitrary()?,
                serving: u.arbitrary()?,
                terminating: u.arbitrary()?,
            }),
            zone: u.arbitrary::<bool>()?.then(|| "z0".to_owned()),
            ..Endpoint::default()
        });
    }
    let mut ports = Vec::new();
    for _ in 0..u.int_in_range(0..=3usize)? {
        let name = if u.arbitrary()? {
            let p = Seen::pick(u, &seen.ports)?;
            seen.ports.push(p.clone());
            Some(p)
        } else {
            None
        };
        ports.push(EndpointPort {
            name,
            protocol: (*u.choose(&[None, Some("TCP"), Some("UDP"), Some("SCTP"), Some("tcp")])?)
                .map(str::to_owned),
            port: *u.choose(&[Some(80), Some(9443), None, Some(0), Some(70_000)])?,
            app_protocol: None,
        });
    }
    Ok(EndpointSlice {
        address_type: (*u.choose(&["IPv4", "IPv6", "IPv4", "IPv6", "FQDN"])?).to_owned(),
        endpoints,
        metadata: ObjectMeta {
            name: Some(format!("s{}", u.int_in_range(0..=5u8)?)),
            namespace: Some(ns),
            labels: Some(labels),
            ..ObjectMeta::default()
        },
        ports: u.ratio(7, 8)?.then_some(ports),
    })
}

fn build(u: &mut Unstructured<'_>, seen: &mut Seen) -> Result<ZoneData> {
    let zone = zone(u)?;
    let mut data = ZoneData::new(zone, u.int_in_range(0..=300u32)?);
    for _ in 0..u.int_in_range(0..=24usize)? {
        match u.int_in_range(0..=7u8)? {
            0 => {
                let ns = Seen::pick(u, &seen.namespaces)?;
                seen.namespaces.push(ns.clone());
                data.set_namespace(&ns, u.ratio(7, 8)?);
            }
            1 => {
                let list = (0..u.int_in_range(0..=3usize)?)
                    .map(|_| Seen::pick(u, &seen.namespaces))
                    .collect::<Result<Vec<_>>>()?;
                seen.namespaces.extend(list.iter().cloned());
                data.reset_namespaces(list);
            }
            2 | 3 => {
                let _ = data
                    .upsert_import(&import(u, seen)?)
                    .map_err(|e| e.to_string());
            }
            4 => {
                let ns = Seen::pick(u, &seen.namespaces)?;
                let name = Seen::pick(u, &seen.services)?;
                data.remove_import(&ns, &name);
            }
            5 => {
                let _ = data
                    .upsert_slice(&slice(u, seen)?)
                    .map_err(|e| e.to_string());
            }
            6 => {
                let ns = Seen::pick(u, &seen.namespaces)?;
                data.remove_slice(&ns, &format!("s{}", u.int_in_range(0..=5u8)?));
            }
            _ => {
                // A name server outside the zone, inside it, or arbitrary text.
                let z = data.zone().to_string();
                let name = match u.int_in_range(0..=2u8)? {
                    0 => format!("ns{}.example.", u.int_in_range(0..=9u8)?),
                    1 => format!("ns.dns.{z}"),
                    _ => u.arbitrary::<String>()?,
                };
                let before = data.nameserver().to_owned();
                match data.set_nameserver(&mixed_case(u, &name)?) {
                    Ok(()) => assert!(!data.zone().contains(data.nameserver())),
                    Err(_) => {
                        assert_eq!(data.nameserver(), before, "a refused name changes nothing")
                    }
                }
            }
        }
    }
    Ok(data)
}

fn question(u: &mut Unstructured<'_>, seen: &Seen, zone: &Zone) -> Result<(String, QueryType)> {
    let z = zone.as_str();
    let mut pick = |list: &[String]| Seen::pick(u, list);
    let svc = pick(&seen.services)?;
    let ns = pick(&seen.namespaces)?;
    let host = pick(&seen.hosts)?;
    let cluster_id = pick(&seen.clusters)?;
    let port = pick(&seen.ports)?;
    let name = match u.int_in_range(0..=9u8)? {
        0..=2 => format!("{svc}.{ns}.svc.{z}"),
        3 => {
            let proto = u.choose(&["tcp", "udp", "sctp", "quic"])?;
            format!("_{port}._{proto}.{svc}.{ns}.svc.{z}")
        }
        4 | 5 => format!("{host}.{cluster_id}.{svc}.{ns}.svc.{z}"),
        6 => (*u.choose(&["", "svc.", "dns-version.", "x.", "ns.dns."])?).to_owned() + z,
        7 => format!("{ns}.svc.{z}"),
        8 => format!("{cluster_id}.{svc}.{ns}.svc.{z}"),
        _ => u.arbitrary::<String>()?,
    };
    let mut name = mixed_case(u, &name)?;
    if u.arbitrary()? {
        name.push('.');
    }
    let qtype = match u.int_in_range(0..=9u8)? {
        0 | 1 => QueryType::A,
        2 => QueryType::Aaaa,
        3 | 4 => QueryType::Srv,
        5 => QueryType::Txt,
        6 => QueryType::Soa,
        7 => QueryType::Ns,
        8 => QueryType::Any,
        _ => {
            if u.arbitrary()? {
                QueryType::Transfer
            } else {
                QueryType::Other(u.arbitrary()?)
            }
        }
    };
    Ok((name, qtype))
}

fn check(data: &ZoneData, qname: &str, qtype: QueryType, answer: &Answer) {
    let zone = data.zone();
    assert_eq!(&data.answer(qname, qtype), answer, "deterministic");
    if !zone.contains(qname) {
        assert_eq!(answer.rcode, Rcode::Refused);
        assert!(answer.answers.is_empty() && answer.authority.is_empty());
        return;
    }
    assert!(answer.authoritative);
    if qtype == QueryType::Transfer {
        assert_eq!(answer.rcode, Rcode::NotImp);
        return;
    }
    let parsed = McsName::parse(qname, zone);
    if parsed.is_err() {
        assert_eq!(answer.rcode, Rcode::NxDomain, "{qname:?} does not parse");
    }
    if answer.answers.is_empty() {
        assert!(matches!(answer.rcode, Rcode::NxDomain | Rcode::NoError));
        assert!(answer.additionals.is_empty());
        assert_eq!(answer.authority.len(), 1, "negative answers carry the SOA");
        assert!(matches!(answer.authority[0].data, RData::Soa { .. }));
    } else {
        assert_eq!(answer.rcode, Rcode::NoError);
        assert!(parsed.is_ok());
    }
    let mut unique = BTreeSet::new();
    for r in &answer.answers {
        assert!(unique.insert(format!("{r:?}")), "repeated record {r:?}");
        let expected = match &r.data {
            RData::A(_) => matches!(qtype, QueryType::A | QueryType::Any),
            RData::Aaaa(_) => matches!(qtype, QueryType::Aaaa | QueryType::Any),
            RData::Srv { .. } => qtype == QueryType::Srv,
            RData::Txt(_) => qtype == QueryType::Txt,
            RData::Soa { .. } => qtype == QueryType::Soa,
            RData::Ns(_) => qtype == QueryType::Ns,
        };
        assert!(expected, "{r:?} answers {qtype:?}");
    }
    for r in answer
        .answers
        .iter()
        .chain(&answer.authority)
        .chain(&answer.additionals)
    {
        assert!(wire_encodable(&r.name), "owner {:?}", r.name);
        assert!(
            McsName::parse(&r.name, zone).is_ok(),
            "owner {:?} does not parse",
            r.name
        );
        match &r.data {
            RData::Srv { weight, target, .. } => {
                assert!(*weight >= 1);
                assert!(wire_encodable(target), "SRV target {target:?}");
                assert!(
                    matches!(
                        McsName::parse(target, zone),
                        Ok(McsName::Service(_) | McsName::Endpoint { .. })
                    ),
                    "SRV target {target:?} does not parse"
                );
            }
            RData::Ns(name) => {
                assert!(wire_encodable(name), "NS {name:?}");
                assert_eq!(name, data.nameserver());
                assert!(
                    !zone.contains(name) || zone.contains(DEFAULT_NAMESERVER),
                    "NS {name:?} inside the zone"
                );
            }
            RData::Soa {
                mname,
                rname,
                serial,
                minimum,
                ..
            } => {
                assert!(wire_encodable(mname), "SOA mname {mname:?}");
                assert_eq!(mname, data.nameserver());
                assert!(
                    !zone.contains(mname) || zone.contains(DEFAULT_NAMESERVER),
                    "SOA mname {mname:?} inside the zone"
                );
                assert!(wire_encodable(rname), "SOA rname {rname:?}");
                assert!(*serial >= 1);
                assert_eq!(*minimum, r.ttl);
            }
            RData::A(_) | RData::Aaaa(_) | RData::Txt(_) => {}
        }
    }
}

fn run(u: &mut Unstructured<'_>) -> Result<()> {
    let mut seen = Seen::default();
    let data = build(u, &mut seen)?;
    let zone = data.zone().clone();
    for _ in 0..u.int_in_range(1..=16usize)? {
        let (qname, qtype) = question(u, &seen, &zone)?;
        let answer = data.answer(&qname, qtype);
        check(&data, &qname, qtype, &answer);
        // Every SRV target resolves.
        for r in &answer.answers {
            if let RData::Srv { target, .. } = &r.data {
                let again = data.answer(target, QueryType::A);
                assert_eq!(again.rcode, Rcode::NoError, "SRV target {target} resolves");
                check(&data, target, QueryType::A, &again);
            }
        }
    }
    Ok(())
}

fuzz_target!(|data: &[u8]| {
    let _ = run(&mut Unstructured::new(data));
});
