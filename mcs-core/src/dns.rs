//! `clusterset.local` DNS answers as plain data (KEP-1645, "DNS").
//!
//! [`ZoneData`] holds what the local cluster knows (its namespaces, ServiceImports and MCS
//! EndpointSlices); [`ZoneData::answer`] builds the answer to one question. A server (the
//! `mcs-dns` binary in `mcs-kube`) puts it on the wire.
//!
//! | name | records |
//! |---|---|
//! | `<svc>.<ns>.svc.<zone>`, ClusterSetIP | A/AAAA: `spec.ips`; SRV: one per port, target the service name |
//! | `<svc>.<ns>.svc.<zone>`, Headless | A/AAAA: ready endpoints of all clusters; SRV: one per ready endpoint × port, target its per-endpoint name |
//! | `_<port>._<proto>.<svc>.<ns>.svc.<zone>` | SRV for that named port |
//! | `<hostname>.<clusterid>.<svc>.<ns>.svc.<zone>` | A/AAAA of that endpoint (headless only) |
//! | `dns-version.<zone>` | TXT [`DNS_SCHEMA_VERSION`] |
//! | `<zone>` | SOA, NS (naming [`ZoneData::nameserver`], outside the zone) |
//!
//! NXDOMAIN versus NODATA follows the reference CoreDNS `multicluster` plugin: NXDOMAIN for a
//! namespace missing in the local cluster, no ServiceImport, malformed or too long names, a
//! headless service with no ready endpoint, the reserved `<clusterid>.<svc>.<ns>` form; NODATA
//! (NOERROR, empty answer) for a name that exists without records of the asked type, the
//! apex, `svc.<zone>`, `<ns>.svc.<zone>`, and TXT for anything but `dns-version`. Names outside
//! the zone are REFUSED (no recursion); zone transfers are NOTIMP.
//!
//! The SOA's primary name server (`mname`) and the apex NS record name a host **outside**
//! the zone, [`DEFAULT_NAMESERVER`] unless [`ZoneData::set_nameserver`] says otherwise. The
//! zone holds no address records for it, so it must not name a host inside the zone: a
//! resolver following the NS record would find NXDOMAIN there.

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

use k8s_openapi::api::discovery::v1::EndpointSlice;

use crate::ClusterId;
use crate::api::{Protocol, ServiceImportType, ServicePort, v1beta1::ServiceImport};
use crate::cluster::check_rfc1123_label;
use crate::name::{Hostname, MAX_NAME_LEN, McsName, NameError, PortName, ServiceRef, Zone};
use crate::slices::{McsSlice, SliceError};

/// The schema version served at `dns-version.<zone>` TXT. The MCS DNS spec says `1.0.0`
/// (the CoreDNS plugin answers `1.1.0`); mcs follows the spec.
pub const DNS_SCHEMA_VERSION: &str = "1.0.0";

/// Default TTL of every record, in seconds (the CoreDNS plugin uses 5).
pub const DEFAULT_TTL: u32 = 5;

/// The default name server of the zone (the SOA `mname` and the apex NS target).
///
/// The CoreDNS `kubernetes` plugin answers `ns.dns.cluster.local` with the address of its
/// own Service: the cluster DNS that pods ask, which forwards the ClusterSet zone to
/// mcs-dns. The name lies outside the ClusterSet zone, so mcs-dns needs no address record
/// for it.
pub const DEFAULT_NAMESERVER: &str = "ns.dns.cluster.local.";

/// The question type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum QueryType {
    /// IPv4 address.
    A,
    /// IPv6 address.
    Aaaa,
    /// Service locator.
    Srv,
    /// Text.
    Txt,
    /// Start of authority.
    Soa,
    /// Name server.
    Ns,
    /// Any type (answered with the A and AAAA records, as RFC 8482 allows).
    Any,
    /// Zone transfer (AXFR or IXFR): not implemented.
    Transfer,
    /// Any other type: NODATA where the name exists.
    Other(u16),
}

/// The response code.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum Rcode {
    /// NOERROR (with or without answers).
    NoError,
    /// The name does not exist.
    NxDomain,
    /// Not our zone.
    Refused,
    /// Not implemented (zone transfers).
    NotImp,
}

/// Record data.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum RData {
    /// An IPv4 address.
    A(Ipv4Addr),
    /// An IPv6 address.
    Aaaa(Ipv6Addr),
    /// A service locator.
    Srv {
        /// Priority (always 0).
        priority: u16,
        /// Weight (100 split across the records).
        weight: u16,
        /// The port.
        port: u16,
        /// The absolute target name.
        target: String,
    },
    /// A text record.
    Txt(String),
    /// Start of authority.
    Soa {
        /// Primary name server.
        mname: String,
        /// Responsible mailbox.
        rname: String,
        /// Serial (changes whenever the data changes).
        serial: u32,
        /// Refresh, seconds.
        refresh: u32,
        /// Retry, seconds.
        retry: u32,
        /// Expire, seconds.
        expire: u32,
        /// Negative-caching TTL, seconds.
        minimum: u32,
    },
    /// A name server.
    Ns(String),
}

/// One resource record.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Record {
    /// The absolute owner name (with the trailing dot).
    pub name: String,
    /// Time to live, seconds.
    pub ttl: u32,
    /// The data.
    pub data: RData,
}

/// The answer to one question.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Answer {
    /// The response code.
    pub rcode: Rcode,
    /// Whether we are authoritative for the name (everything in the zone).
    pub authoritative: bool,
    /// The answer section.
    pub answers: Vec<Record>,
    /// The authority section (the SOA on negative answers).
    pub authority: Vec<Record>,
    /// The additional section (addresses of SRV targets).
    pub additionals: Vec<Record>,
}

impl Answer {
    fn refused() -> Self {
        Self {
            rcode: Rcode::Refused,
            authoritative: false,
            answers: vec![],
            authority: vec![],
            additionals: vec![],
        }
    }
}

/// A ServiceImport the DNS data cannot use.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum DnsDataError {
    /// The import's namespace or name is not a valid service reference.
    #[error("ServiceImport {object}: {source}")]
    Name {
        /// `<namespace>/<name>`.
        object: String,
        /// The problem.
        #[source]
        source: NameError,
    },
    /// An IP in `spec.ips` does not parse.
    #[error("ServiceImport {object}: spec.ips has invalid IP {ip:?}")]
    BadIp {
        /// `<namespace>/<name>`.
        object: String,
        /// The value.
        ip: String,
    },
    /// The slice cannot be used.
    #[error(transparent)]
    Slice(#[from] SliceError),
    /// The zone's name server is not a host name outside the zone.
    #[error("nameserver {name:?}: {problem}")]
    Nameserver {
        /// The name as given.
        name: String,
        /// What is wrong.
        problem: String,
    },
}

#[derive(Clone, Debug, Default)]
struct ServiceEntry {
    import: Option<ImportFacts>,
    slices: BTreeMap<String, McsSlice>,
}

#[derive(Clone, Debug)]
struct ImportFacts {
    type_: ServiceImportType,
    ips: Vec<IpAddr>,
    ports: Vec<ServicePort>,
}

/// What the local cluster knows, indexed for answering.
#[derive(Clone, Debug)]
pub struct ZoneData {
    zone: Zone,
    ttl: u32,
    serial: u32,
    nameserver: String,
    namespaces: BTreeSet<String>,
    services: BTreeMap<ServiceRef, ServiceEntry>,
    slice_owner: HashMap<(String, String), ServiceRef>,
}

impl ZoneData {
    /// Empty data for `zone` with records of `ttl` seconds, naming [`DEFAULT_NAMESERVER`]
    /// as the zone's name server. A zone that contains that name (`cluster.local` or a
    /// parent of it) needs [`ZoneData::set_nameserver`].
    pub fn new(zone: Zone, ttl: u32) -> Self {
        Self {
            zone,
            ttl,
            serial: 1,
            nameserver: DEFAULT_NAMESERVER.to_owned(),
            namespaces: BTreeSet::new(),
            services: BTreeMap::new(),
            slice_owner: HashMap::new(),
        }
    }

    /// The zone.
    pub fn zone(&self) -> &Zone {
        &self.zone
    }

    /// The zone's name server: the SOA `mname` and the apex NS target, an absolute name
    /// (trailing dot) outside the zone.
    pub fn nameserver(&self) -> &str {
        &self.nameserver
    }

    /// Sets the zone's name server. `name` must be a host name (RFC 1123 labels, any case,
    /// trailing dot optional) outside the zone: the zone has no address records for it.
    pub fn set_nameserver(&mut self, name: &str) -> Result<(), DnsDataError> {
        let problem = |p: String| DnsDataError::Nameserver {
            name: name.to_owned(),
            problem: p,
        };
        let host = name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase();
        if host.is_empty() {
            return Err(problem("is empty".into()));
        }
        if host.len() > MAX_NAME_LEN {
            return Err(problem(format!(
                "is {} characters long; at most {MAX_NAME_LEN} are allowed",
                host.len()
            )));
        }
        for label in host.split('.') {
            check_rfc1123_label(label).map_err(|e| problem(format!("label {label:?} {e}")))?;
        }
        if self.zone.contains(&host) {
            return Err(problem(format!(
                "lies inside zone {}, which has no address records for it; name a host outside the zone",
                self.zone
            )));
        }
        let host = format!("{host}.");
        if host != self.nameserver {
            self.nameserver = host;
            self.bump();
        }
        Ok(())
    }

    /// Records that namespace `ns` exists (or no longer does) in the local cluster.
    pub fn set_namespace(&mut self, ns: &str, exists: bool) {
        let changed = if exists {
            self.namespaces.insert(ns.to_owned())
        } else {
            self.namespaces.remove(ns)
        };
        if changed {
            self.bump();
        }
    }

    /// Replaces the set of existing namespaces.
    pub fn reset_namespaces<I: IntoIterator<Item = String>>(&mut self, namespaces: I) {
        self.namespaces = namespaces.into_iter().collect();
        self.bump();
    }

    /// Adds or replaces a ServiceImport.
    pub fn upsert_import(&mut self, import: &ServiceImport) -> Result<(), DnsDataError> {
        let (svc, object) = service_ref(
            import.metadata.namespace.as_deref(),
            import.metadata.name.as_deref(),
        )?;
        let mut ips = Vec::new();
        for ip in import.spec.ips.iter().flatten() {
            ips.push(ip.parse().map_err(|_| DnsDataError::BadIp {
                object: object.clone(),
                ip: ip.clone(),
            })?);
        }
        let facts = ImportFacts {
            type_: import.spec.type_,
            ips,
            ports: import.spec.ports.clone(),
        };
        self.services.entry(svc).or_default().import = Some(facts);
        self.bump();
        Ok(())
    }

    /// Removes a ServiceImport.
    pub fn remove_import(&mut self, namespace: &str, name: &str) {
        let Ok(svc) = ServiceRef::new(namespace, name) else {
            return;
        };
        if let Some(entry) = self.services.get_mut(&svc) {
            entry.import = None;
            if entry.slices.is_empty() {
                self.services.remove(&svc);
            }
            self.bump();
        }
    }

    /// Adds or replaces an MCS EndpointSlice (keyed by namespace and slice name).
    pub fn upsert_slice(&mut self, slice: &EndpointSlice) -> Result<(), DnsDataError> {
        let ns = slice.metadata.namespace.clone().unwrap_or_default();
        let name = slice.metadata.name.clone().unwrap_or_default();
        let parsed = McsSlice::parse(slice)?;
        let (svc, _) = service_ref(Some(&ns), Some(parsed.service.as_str()))?;
        self.remove_slice(&ns, &name);
        self.slice_owner.insert((ns, name.clone()), svc.clone());
        self.services
            .entry(svc)
            .or_default()
            .slices
            .insert(name, parsed);
        self.bump();
        Ok(())
    }

    /// Removes an EndpointSlice.
    pub fn remove_slice(&mut self, namespace: &str, name: &str) {
        let Some(svc) = self
            .slice_owner
            .remove(&(namespace.to_owned(), name.to_owned()))
        else {
            return;
        };
        if let Some(entry) = self.services.get_mut(&svc) {
            entry.slices.remove(name);
            if entry.slices.is_empty() && entry.import.is_none() {
                self.services.remove(&svc);
            }
        }
        self.bump();
    }

    /// Answers one question. `qname` may be in any case, with or without the trailing dot;
    /// answer records carry it as asked (with the trailing dot).
    pub fn answer(&self, qname: &str, qtype: QueryType) -> Answer {
        if !self.zone.contains(qname) {
            return Answer::refused();
        }
        let owner = if qname.ends_with('.') {
            qname.to_owned()
        } else {
            format!("{qname}.")
        };
        if qtype == QueryType::Transfer {
            return Answer {
                rcode: Rcode::NotImp,
                ..self.empty(Rcode::NotImp)
            };
        }
        let name = match McsName::parse(qname, &self.zone) {
            Ok(name) => name,
            Err(_) => return self.negative(Rcode::NxDomain),
        };
        let mut out = Builder {
            owner: &owner,
            ttl: self.ttl,
            answers: vec![],
            additionals: vec![],
        };
        let exists = match &name {
            McsName::Apex => {
                match qtype {
                    QueryType::Soa => out.answers.push(self.soa()),
                    QueryType::Ns => out.push(RData::Ns(self.nameserver.clone())),
                    _ => {}
                }
                true
            }
            McsName::DnsVersion => {
                if qtype == QueryType::Txt {
                    out.push(RData::Txt(DNS_SCHEMA_VERSION.to_owned()));
                }
                true
            }
            McsName::SvcZone => true,
            McsName::Namespace(ns) => self.namespaces.contains(ns.as_str()),
            McsName::Service(svc) => self.service(svc, qtype, &mut out),
            McsName::Srv {
                port,
                protocol,
                service,
            } => self.named_srv(service, port, *protocol, qtype, &mut out),
            McsName::Endpoint {
                hostname,
                cluster,
                service,
            } => self.endpoint(service, hostname, cluster, qtype, &mut out),
        };
        if !exists {
            return self.negative(Rcode::NxDomain);
        }
        if out.answers.is_empty() {
            return self.negative(Rcode::NoError);
        }
        Answer {
            rcode: Rcode::NoError,
            authoritative: true,
            answers: out.answers,
            authority: vec![],
            additionals: out.additionals,
        }
    }

    fn service(&self, svc: &ServiceRef, qtype: QueryType, out: &mut Builder<'_>) -> bool {
        let Some((entry, import)) = self.import(svc) else {
            return false;
        };
        match import.type_ {
            ServiceImportType::ClusterSetIp => {
                out.addresses(import.ips.iter().copied(), qtype);
                if qtype == QueryType::Srv {
                    let target = svc.to_fqdn(&self.zone);
                    let ports: BTreeSet<u16> = import
                        .ports
                        .iter()
                        .filter_map(|p| u16::try_from(p.port).ok())
                        .collect();
                    let weight = weight(ports.len());
                    for port in ports {
                        out.push(RData::Srv {
                            priority: 0,
                            weight,
                            port,
                            target: target.clone(),
                        });
                    }
                    out.additional_addresses(&target, import.ips.iter().copied());
                }
                true
            }
            ServiceImportType::Headless => {
                let ready: Vec<_> = ready_endpoints(entry).collect();
                if ready.is_empty() {
                    return false;
                }
                out.addresses(
                    ready
                        .iter()
                        .flat_map(|(_, ep)| ep.addresses.iter().copied()),
                    qtype,
                );
                if qtype == QueryType::Srv {
                    let mut seen = BTreeSet::new();
                    for (slice, ep) in &ready {
                        let Some(target) = self.endpoint_target(svc, &slice.cluster, ep) else {
                            continue;
                        };
                        for p in &slice.data.ports {
                            seen.insert((target.clone(), p.port));
                        }
                        out.additional_addresses(&target, ep.addresses.iter().copied());
                    }
                    out.srv_set(seen);
                }
                true
            }
        }
    }

    fn named_srv(
        &self,
        svc: &ServiceRef,
        port: &PortName,
        protocol: Protocol,
        qtype: QueryType,
        out: &mut Builder<'_>,
    ) -> bool {
        let Some((entry, import)) = self.import(svc) else {
            return false;
        };
        let matches =
            |name: Option<&str>, proto: Protocol| name == Some(port.as_str()) && proto == protocol;
        match import.type_ {
            ServiceImportType::ClusterSetIp => {
                let Some(p) = import
                    .ports
                    .iter()
                    .find(|p| matches(p.name.as_deref(), p.protocol_or_default()))
                else {
                    return false;
                };
                if qtype == QueryType::Srv {
                    let target = svc.to_fqdn(&self.zone);
                    if let Ok(number) = u16::try_from(p.port) {
                        out.push(RData::Srv {
                            priority: 0,
                            weight: 100,
                            port: number,
                            target: target.clone(),
                        });
                        out.additional_addresses(&target, import.ips.iter().copied());
                    }
                }
                true
            }
            ServiceImportType::Headless => {
                let mut seen = BTreeSet::new();
                for (slice, ep) in ready_endpoints(entry) {
                    let Some(p) = slice
                        .data
                        .ports
                        .iter()
                        .find(|p| matches(Some(p.name.as_str()), p.protocol))
                    else {
                        continue;
                    };
                    let Some(target) = self.endpoint_target(svc, &slice.cluster, ep) else {
                        continue;
                    };
                    // Addresses go to the additional section only for SRV questions.
                    if qtype == QueryType::Srv {
                        out.additional_addresses(&target, ep.addresses.iter().copied());
                    }
                    seen.insert((target, p.port));
                }
                if seen.is_empty() {
                    return false;
                }
                if qtype == QueryType::Srv {
                    out.srv_set(seen);
                }
                true
            }
        }
    }

    fn endpoint(
        &self,
        svc: &ServiceRef,
        hostname: &Hostname,
        cluster: &ClusterId,
        qtype: QueryType,
        out: &mut Builder<'_>,
    ) -> bool {
        let Some((entry, import)) = self.import(svc) else {
            return false;
        };
        if import.type_ != ServiceImportType::Headless {
            return false;
        }
        // One `addresses` call for every match, so an endpoint listed twice (in two
        // slices of its cluster, as during a slice rotation) yields each address once.
        let mut matches = ready_endpoints(entry)
            .filter(|(slice, ep)| {
                slice.cluster == *cluster && ep.dns_hostname().as_ref() == Some(hostname)
            })
            .peekable();
        let found = matches.peek().is_some();
        out.addresses(
            matches.flat_map(|(_, ep)| ep.addresses.iter().copied()),
            qtype,
        );
        found
    }

    fn import(&self, svc: &ServiceRef) -> Option<(&ServiceEntry, &ImportFacts)> {
        if !self.namespaces.contains(svc.namespace.as_str()) {
            return None;
        }
        let entry = self.services.get(svc)?;
        Some((entry, entry.import.as_ref()?))
    }

    fn endpoint_target(
        &self,
        svc: &ServiceRef,
        cluster: &ClusterId,
        ep: &crate::slices::SliceEndpoint,
    ) -> Option<String> {
        let host = ep.dns_hostname()?;
        let target = format!("{host}.{cluster}.{}", svc.to_fqdn(&self.zone));
        // Four labels of up to 63 characters can add up to more than a name may hold: such
        // a name can be neither sent nor asked for, so that endpoint gets no SRV record.
        (target.len() <= MAX_NAME_LEN + 1).then_some(target)
    }

    fn soa(&self) -> Record {
        Record {
            name: self.zone.fqdn(),
            ttl: self.ttl,
            data: RData::Soa {
                mname: self.nameserver.clone(),
                rname: format!("hostmaster.{}.", self.zone),
                serial: self.serial,
                refresh: 7200,
                retry: 1800,
                expire: 86400,
                minimum: self.ttl,
            },
        }
    }

    fn empty(&self, rcode: Rcode) -> Answer {
        Answer {
            rcode,
            authoritative: true,
            answers: vec![],
            authority: vec![],
            additionals: vec![],
        }
    }

    fn negative(&self, rcode: Rcode) -> Answer {
        Answer {
            authority: vec![self.soa()],
            ..self.empty(rcode)
        }
    }

    fn bump(&mut self) {
        self.serial = self.serial.wrapping_add(1).max(1);
    }
}

struct Builder<'a> {
    owner: &'a str,
    ttl: u32,
    answers: Vec<Record>,
    additionals: Vec<Record>,
}

impl Builder<'_> {
    fn push(&mut self, data: RData) {
        self.answers.push(Record {
            name: self.owner.to_owned(),
            ttl: self.ttl,
            data,
        });
    }

    /// A and/or AAAA records for `ips`, as `qtype` asks, de-duplicated.
    fn addresses<I: IntoIterator<Item = IpAddr>>(&mut self, ips: I, qtype: QueryType) {
        let mut seen = BTreeSet::new();
        for ip in ips {
            if !seen.insert(ip) {
                continue;
            }
            match (ip, qtype) {
                (IpAddr::V4(v4), QueryType::A | QueryType::Any) => self.push(RData::A(v4)),
                (IpAddr::V6(v6), QueryType::Aaaa | QueryType::Any) => self.push(RData::Aaaa(v6)),
                _ => {}
            }
        }
    }

    /// One SRV record per (target, port), priority 0, the weight split evenly.
    fn srv_set(&mut self, records: BTreeSet<(String, u16)>) {
        let weight = weight(records.len());
        for (target, port) in records {
            self.push(RData::Srv {
                priority: 0,
                weight,
                port,
                target,
            });
        }
    }

    fn additional_addresses<I: IntoIterator<Item = IpAddr>>(&mut self, target: &str, ips: I) {
        for ip in ips {
            let data = match ip {
                IpAddr::V4(v4) => RData::A(v4),
                IpAddr::V6(v6) => RData::Aaaa(v6),
            };
            let record = Record {
                name: target.to_owned(),
                ttl: self.ttl,
                data,
            };
            if !self.additionals.contains(&record) {
                self.additionals.push(record);
            }
        }
    }
}

fn ready_endpoints(
    entry: &ServiceEntry,
) -> impl Iterator<Item = (&McsSlice, &crate::slices::SliceEndpoint)> {
    entry.slices.values().flat_map(|s| {
        s.data
            .endpoints
            .iter()
            .filter(|e| e.ready)
            .map(move |e| (s, e))
    })
}

fn weight(n: usize) -> u16 {
    u16::try_from(100 / n.max(1)).unwrap_or(100).max(1)
}

fn service_ref(ns: Option<&str>, name: Option<&str>) -> Result<(ServiceRef, String), DnsDataError> {
    let (ns, name) = (ns.unwrap_or(""), name.unwrap_or(""));
    let object = format!("{ns}/{name}");
    ServiceRef::new(ns, name)
        .map(|s| (s, object.clone()))
        .map_err(|source| DnsDataError::Name { object, source })
}

#[cfg(test)]
mod tests;
