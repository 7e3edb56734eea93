//! The `clusterset.local` name grammar (KEP-1645, "DNS").
//!
//! | form | parsed as |
//! |---|---|
//! | `<svc>.<ns>.svc.<zone>` | [`McsName::Service`] |
//! | `_<port>._<proto>.<svc>.<ns>.svc.<zone>` | [`McsName::Srv`] |
//! | `<hostname>.<clusterid>.<svc>.<ns>.svc.<zone>` | [`McsName::Endpoint`] |
//! | `<zone>`, `svc.<zone>`, `<ns>.svc.<zone>`, `dns-version.<zone>` | the structural names |
//!
//! Names are case-insensitive (they are lowercased on parse) and the trailing dot is
//! optional. `<clusterid>.<svc>.<ns>.svc.<zone>` is reserved and never valid: per-cluster
//! targeting of a service is deliberately not part of MCS, so it parses to
//! [`NameError::ClusterScoped`].
//!
//! ```
//! use mcs_core::name::{McsName, Zone};
//!
//! let zone = Zone::default();
//! let name = McsName::parse("Loyalty-Accrual.loyalty.svc.clusterset.local.", &zone).unwrap();
//! let McsName::Service(svc) = &name else { panic!() };
//! assert_eq!(svc.name.as_str(), "loyalty-accrual");
//! assert_eq!(name.to_fqdn(&zone), "loyalty-accrual.loyalty.svc.clusterset.local.");
//! ```

use std::fmt;
use std::str::FromStr;

use crate::cluster::{
    ClusterId, LabelError, MAX_LABEL_LEN, check_rfc1035_label, check_rfc1123_label,
};

string_enum! {
    /// A transport protocol of a service port.
    #[derive(Default)]
    Protocol {
        /// TCP (the default when a port names no protocol).
        #[default]
        Tcp = "TCP",
        /// UDP.
        Udp = "UDP",
        /// SCTP.
        Sctp = "SCTP",
    }
}

/// Maximum length of a domain name in presentation form, without the trailing dot.
pub const MAX_NAME_LEN: usize = 253;

/// The default ClusterSet zone.
pub const DEFAULT_ZONE: &str = "clusterset.local";

/// Longest zone: the DNS answers put `hostmaster.<zone>` (the SOA mailbox) under every
/// zone, and that name must still fit in [`MAX_NAME_LEN`].
const MAX_ZONE_LEN: usize = MAX_NAME_LEN - "hostmaster.".len();

/// Why a name is not a valid `clusterset.local` name.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum NameError {
    /// The name is empty.
    #[error("name is empty")]
    Empty,
    /// The name is longer than 253 characters.
    #[error("name {name:?} is {len} characters long; at most 253 are allowed")]
    TooLong {
        /// The input (cut to 64 characters).
        name: String,
        /// Its length.
        len: usize,
    },
    /// The name is not under the ClusterSet zone.
    #[error("name {name:?} is not under zone {zone:?}")]
    OutsideZone {
        /// The input.
        name: String,
        /// The zone.
        zone: String,
    },
    /// A label breaks the rules for its position.
    #[error("label {label:?} of {name:?} ({role}) {source}")]
    Label {
        /// The input.
        name: String,
        /// The label.
        label: String,
        /// What the label is (service name, namespace, hostname, …).
        role: &'static str,
        /// The rule it breaks.
        #[source]
        source: LabelError,
    },
    /// An empty label (`a..b`).
    #[error("name {name:?} has an empty label")]
    EmptyLabel {
        /// The input.
        name: String,
    },
    /// The label right under the zone is not `svc`.
    #[error(
        "name {name:?} is not a service name: expected `svc` right under the zone, found {found:?}"
    )]
    NotService {
        /// The input.
        name: String,
        /// The label found instead of `svc`.
        found: String,
    },
    /// More labels than any MCS name has.
    #[error("name {name:?} has {count} labels before `svc`; at most 4 are allowed")]
    TooManyLabels {
        /// The input (cut to 64 characters).
        name: String,
        /// How many labels precede `svc.<zone>`.
        count: usize,
    },
    /// `<clusterid>.<svc>.<ns>.svc.<zone>`: reserved, never answered.
    #[error(
        "name {name:?} targets one cluster of a service; per-cluster service names are reserved by the MCS DNS spec"
    )]
    ClusterScoped {
        /// The input.
        name: String,
    },
    /// An SRV name whose labels are not both `_`-prefixed or whose protocol is unknown.
    #[error("SRV name {name:?} is malformed: {problem}")]
    Srv {
        /// The input.
        name: String,
        /// What is wrong.
        problem: String,
    },
    /// The zone itself is not a valid domain name.
    #[error("invalid zone {zone:?}: {problem}")]
    Zone {
        /// The input.
        zone: String,
        /// What is wrong.
        problem: String,
    },
}

/// The ClusterSet DNS zone, `clusterset.local` unless configured otherwise.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub struct Zone {
    name: Box<str>,
    labels: usize,
}

impl Zone {
    /// Validates a zone (case-insensitive, trailing dot optional).
    pub fn new(zone: &str) -> Result<Self, NameError> {
        let lower = zone.trim_end_matches('.').to_ascii_lowercase();
        let problem = |p: String| NameError::Zone {
            zone: zone.to_owned(),
            problem: p,
        };
        if lower.is_empty() {
            return Err(problem("empty".into()));
        }
        if lower.len() > MAX_ZONE_LEN {
            return Err(problem(format!(
                "{} characters long; at most {MAX_ZONE_LEN} leave room for the names under it",
                lower.len()
            )));
        }
        let mut labels = 0;
        for label in lower.split('.') {
            check_rfc1123_label(label).map_err(|e| problem(format!("label {label:?} {e}")))?;
            labels += 1;
        }
        Ok(Self {
            name: lower.into_boxed_str(),
            labels,
        })
    }

    /// The zone without a trailing dot, lowercase.
    pub fn as_str(&self) -> &str {
        &self.name
    }

    /// The zone as an absolute name (with the trailing dot).
    pub fn fqdn(&self) -> String {
        format!("{}.", self.name)
    }

    /// Whether `host` (any case, trailing dot optional) is the zone or under it.
    pub fn contains(&self, host: &str) -> bool {
        // Byte-wise, so a multi-byte character never splits a slice.
        let host = host.strip_suffix('.').unwrap_or(host).as_bytes();
        let zone = self.name.as_bytes();
        let Some(split) = host.len().checked_sub(zone.len()) else {
            return false;
        };
        host[split..].eq_ignore_ascii_case(zone) && (split == 0 || host[split - 1] == b'.')
    }
}

impl Default for Zone {
    fn default() -> Self {
        Self {
            name: DEFAULT_ZONE.into(),
            labels: 2,
        }
    }
}

impl fmt::Display for Zone {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name)
    }
}

impl FromStr for Zone {
    type Err = NameError;

    fn from_str(s: &str) -> Result<Self, NameError> {
        Self::new(s)
    }
}

macro_rules! label_type {
    ($(#[$meta:meta])* $name:ident, $check:path, $role:literal) => {
        $(#[$meta])*
        #[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub struct $name(Box<str>);

        impl $name {
            /// Validates `value`.
            pub fn new(value: &str) -> Result<Self, NameError> {
                $check(value).map_err(|source| NameError::Label {
                    name: value.to_owned(),
                    label: value.to_owned(),
                    role: $role,
                    source,
                })?;
                Ok(Self(value.into()))
            }

            /// The label.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Debug for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                fmt::Debug::fmt(&*self.0, f)
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }

        impl FromStr for $name {
            type Err = NameError;

            fn from_str(s: &str) -> Result<Self, NameError> {
                Self::new(s)
            }
        }

        impl AsRef<str> for $name {
            fn as_ref(&self) -> &str {
                &self.0
            }
        }
    };
}

label_type! {
    /// A Service name: an RFC-1035 label (starts with a letter).
    ServiceName, check_rfc1035_label, "service name"
}

label_type! {
    /// A namespace name: an RFC-1123 label.
    Namespace, check_rfc1123_label, "namespace"
}

label_type! {
    /// An endpoint hostname (or a dashed IP): an RFC-1123 label.
    Hostname, check_rfc1123_label, "hostname"
}

label_type! {
    /// A named port: an RFC-1123 label.
    PortName, check_rfc1123_label, "port name"
}

impl Hostname {
    /// The hostname of an endpoint without one: its IP with `.` and `:` replaced by `-`
    /// (`10-244-0-5`, `fd00--5`), as CoreDNS and the conformance suite expect.
    pub fn from_ip(ip: std::net::IpAddr) -> Self {
        let dashed: String = ip
            .to_string()
            .chars()
            .map(|c| if c == '.' || c == ':' { '-' } else { c })
            .collect();
        // An IPv6 address may end in `::`, which would end the label with `-`: pad with 0
        // so the label stays valid (`fd00::` -> `fd00--0`).
        let dashed = if dashed.ends_with('-') {
            format!("{dashed}0")
        } else {
            dashed
        };
        let dashed = if dashed.starts_with('-') {
            format!("0{dashed}")
        } else {
            dashed
        };
        Self(dashed.into_boxed_str())
    }
}

/// A service in a namespace: `<name>.<namespace>.svc.<zone>`.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ServiceRef {
    /// The namespace.
    pub namespace: Namespace,
    /// The service name.
    pub name: ServiceName,
}

impl ServiceRef {
    /// Validates both parts.
    pub fn new(namespace: &str, name: &str) -> Result<Self, NameError> {
        Ok(Self {
            namespace: Namespace::new(namespace)?,
            name: ServiceName::new(name)?,
        })
    }

    /// `<name>.<namespace>.svc.<zone>.`
    pub fn to_fqdn(&self, zone: &Zone) -> String {
        format!("{}.{}.svc.{}.", self.name, self.namespace, zone)
    }
}

impl fmt::Display for ServiceRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.namespace, self.name)
    }
}

/// A parsed name under the ClusterSet zone.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum McsName {
    /// The zone apex.
    Apex,
    /// `dns-version.<zone>`: the schema version TXT record.
    DnsVersion,
    /// `svc.<zone>`.
    SvcZone,
    /// `<ns>.svc.<zone>`.
    Namespace(Namespace),
    /// `<svc>.<ns>.svc.<zone>`.
    Service(ServiceRef),
    /// `_<port>._<proto>.<svc>.<ns>.svc.<zone>`.
    Srv {
        /// The named port.
        port: PortName,
        /// The protocol.
        protocol: Protocol,
        /// The service.
        service: ServiceRef,
    },
    /// `<hostname>.<clusterid>.<svc>.<ns>.svc.<zone>`: one endpoint of a headless service.
    Endpoint {
        /// The endpoint's hostname (or dashed IP).
        hostname: Hostname,
        /// The cluster the endpoint is in.
        cluster: ClusterId,
        /// The service.
        service: ServiceRef,
    },
}

impl McsName {
    /// Parses `name` under `zone`: case-insensitive, trailing dot optional.
    pub fn parse(name: &str, zone: &Zone) -> Result<Self, NameError> {
        let trimmed = name.strip_suffix('.').unwrap_or(name);
        if trimmed.is_empty() {
            return Err(NameError::Empty);
        }
        if trimmed.len() > MAX_NAME_LEN {
            return Err(NameError::TooLong {
                name: cut(name),
                len: trimmed.len(),
            });
        }
        if !zone.contains(trimmed) {
            return Err(NameError::OutsideZone {
                name: name.to_owned(),
                zone: zone.to_string(),
            });
        }
        let lower = trimmed.to_ascii_lowercase();
        let rel = &lower[..lower.len() - zone.as_str().len()];
        if rel.is_empty() {
            return Ok(Self::Apex);
        }
        // `.<zone>` leaves an empty label here, rejected below like any other.
        let rel = rel.strip_suffix('.').unwrap_or(rel);
        let labels: Vec<&str> = rel.split('.').collect();
        if labels.iter().any(|l| l.is_empty()) {
            return Err(NameError::EmptyLabel {
                name: name.to_owned(),
            });
        }
        let (&last, before) = labels.split_last().unwrap_or((&"", &[]));
        if before.is_empty() && last == "dns-version" {
            return Ok(Self::DnsVersion);
        }
        if last != "svc" {
            return Err(NameError::NotService {
                name: name.to_owned(),
                found: last.to_owned(),
            });
        }
        let label = |label: &str, role: &'static str, check: fn(&str) -> Result<(), LabelError>| {
            check(label).map_err(|source| NameError::Label {
                name: name.to_owned(),
                label: label.to_owned(),
                role,
                source,
            })
        };
        let service = |svc: &str, ns: &str| -> Result<ServiceRef, NameError> {
            label(svc, "service name", check_rfc1035_label)?;
            label(ns, "namespace", check_rfc1123_label)?;
            Ok(ServiceRef {
                namespace: Namespace(ns.into()),
                name: ServiceName(svc.into()),
            })
        };
        match *before {
            [] => Ok(Self::SvcZone),
            [ns] => {
                label(ns, "namespace", check_rfc1123_label)?;
                Ok(Self::Namespace(Namespace(ns.into())))
            }
            [svc, ns] => Ok(Self::Service(service(svc, ns)?)),
            [_, _, _] => Err(NameError::ClusterScoped {
                name: name.to_owned(),
            }),
            [first, second, svc, ns] if first.starts_with('_') || second.starts_with('_') => {
                let srv = |problem: String| NameError::Srv {
                    name: name.to_owned(),
                    problem,
                };
                let (Some(port), Some(proto)) = (first.strip_prefix('_'), second.strip_prefix('_'))
                else {
                    return Err(srv(
                        "both the port and the protocol label must start with `_`".into(),
                    ));
                };
                label(port, "port name", check_rfc1123_label)?;
                // `_<port>` is the label on the wire: the `_` counts towards its 63.
                if first.len() > MAX_LABEL_LEN {
                    return Err(NameError::Label {
                        name: name.to_owned(),
                        label: (*first).to_owned(),
                        role: "port name",
                        source: LabelError::TooLong { len: first.len() },
                    });
                }
                let protocol = match proto {
                    "tcp" => Protocol::Tcp,
                    "udp" => Protocol::Udp,
                    "sctp" => Protocol::Sctp,
                    other => {
                        return Err(srv(format!(
                            "unknown protocol `_{other}`; expected _tcp, _udp or _sctp"
                        )));
                    }
                };
                Ok(Self::Srv {
                    port: PortName(port.into()),
                    protocol,
                    service: service(svc, ns)?,
                })
            }
            [host, cluster, svc, ns] => {
                label(host, "hostname", check_rfc1123_label)?;
                label(cluster, "cluster id", check_rfc1123_label)?;
                let cluster = ClusterId::new(cluster).map_err(|e| NameError::Label {
                    name: name.to_owned(),
                    label: e.value.clone(),
                    role: "cluster id",
                    source: e.source,
                })?;
                Ok(Self::Endpoint {
                    hostname: Hostname(host.into()),
                    cluster,
                    service: service(svc, ns)?,
                })
            }
            _ => Err(NameError::TooManyLabels {
                name: cut(name),
                count: before.len(),
            }),
        }
    }

    /// The absolute name under `zone`, lowercase, with the trailing dot.
    pub fn to_fqdn(&self, zone: &Zone) -> String {
        match self {
            Self::Apex => zone.fqdn(),
            Self::DnsVersion => format!("dns-version.{zone}."),
            Self::SvcZone => format!("svc.{zone}."),
            Self::Namespace(ns) => format!("{ns}.svc.{zone}."),
            Self::Service(svc) => svc.to_fqdn(zone),
            Self::Srv {
                port,
                protocol,
                service,
            } => {
                format!(
                    "_{port}._{}.{}",
                    protocol.as_str().to_ascii_lowercase(),
                    service.to_fqdn(zone)
                )
            }
            Self::Endpoint {
                hostname,
                cluster,
                service,
            } => {
                format!("{hostname}.{cluster}.{}", service.to_fqdn(zone))
            }
        }
    }
}

fn cut(name: &str) -> String {
    name.chars().take(64).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(s: &str) -> Result<McsName, NameError> {
        McsName::parse(s, &Zone::default())
    }

    #[test]
    fn parses_every_form() {
        assert_eq!(parse("clusterset.local").unwrap(), McsName::Apex);
        assert_eq!(
            parse("dns-version.clusterset.local.").unwrap(),
            McsName::DnsVersion
        );
        assert_eq!(parse("svc.clusterset.local").unwrap(), McsName::SvcZone);
        assert!(matches!(
            parse("loyalty.svc.clusterset.local").unwrap(),
            McsName::Namespace(_)
        ));
        let svc = ServiceRef::new("loyalty", "loyalty-accrual").unwrap();
        assert_eq!(
            parse("loyalty-accrual.loyalty.svc.clusterset.local").unwrap(),
            McsName::Service(svc.clone())
        );
        assert_eq!(
            parse("_grpc._tcp.loyalty-accrual.loyalty.svc.clusterset.local.").unwrap(),
            McsName::Srv {
                port: PortName::new("grpc").unwrap(),
                protocol: Protocol::Tcp,
                service: svc.clone()
            }
        );
        assert_eq!(
            parse("web-0.east.loyalty-accrual.loyalty.svc.clusterset.local").unwrap(),
            McsName::Endpoint {
                hostname: Hostname::new("web-0").unwrap(),
                cluster: ClusterId::new("east").unwrap(),
                service: svc,
            }
        );
    }

    #[test]
    fn case_insensitive_and_round_trips() {
        let zone = Zone::default();
        for s in [
            "A.B.SVC.ClusterSet.Local",
            "_Http._TCP.a.b.svc.clusterset.local.",
            "h.c.a.b.svc.clusterset.local",
            "dns-version.clusterset.local",
            "b.svc.clusterset.local",
        ] {
            let name = McsName::parse(s, &zone).unwrap();
            let fqdn = name.to_fqdn(&zone);
            assert_eq!(
                fqdn,
                format!("{}.", s.trim_end_matches('.').to_ascii_lowercase())
            );
            assert_eq!(McsName::parse(&fqdn, &zone).unwrap(), name);
        }
    }

    #[test]
    fn typed_errors() {
        assert!(matches!(
            parse("east.a.b.svc.clusterset.local"),
            Err(NameError::ClusterScoped { .. })
        ));
        assert!(matches!(
            parse("a.b.c.d.e.svc.clusterset.local"),
            Err(NameError::TooManyLabels { count: 5, .. })
        ));
        assert!(matches!(
            parse("a.b.svc.cluster.local"),
            Err(NameError::OutsideZone { .. })
        ));
        assert!(matches!(
            parse("a.b.pod.clusterset.local"),
            Err(NameError::NotService { .. })
        ));
        assert!(matches!(
            parse("a..b.svc.clusterset.local"),
            Err(NameError::EmptyLabel { .. })
        ));
        // Found by the `dns` fuzz target: `_` and a 63-character port name make a
        // 64-character label, which no DNS name can hold.
        let srv = |port: &str| parse(&format!("_{port}._tcp.a.b.svc.clusterset.local"));
        assert!(srv(&"p".repeat(62)).is_ok());
        assert!(matches!(
            srv(&"p".repeat(63)),
            Err(NameError::Label {
                role: "port name",
                source: LabelError::TooLong { len: 64 },
                ..
            })
        ));
        // Found by the `names` fuzz target: this parsed as the apex.
        assert!(matches!(
            parse(".clusterset.local."),
            Err(NameError::EmptyLabel { .. })
        ));
        assert!(matches!(
            parse("_a.b.x.y.svc.clusterset.local"),
            Err(NameError::Srv { .. })
        ));
        assert!(matches!(
            parse("_a._quic.x.y.svc.clusterset.local"),
            Err(NameError::Srv { .. })
        ));
        assert!(matches!(
            parse("1abc.b.svc.clusterset.local"),
            Err(NameError::Label {
                role: "service name",
                ..
            })
        ));
        assert!(matches!(
            parse("notclusterset.local"),
            Err(NameError::OutsideZone { .. })
        ));
        assert!(matches!(parse(""), Err(NameError::Empty)));
        let long = format!("{}.b.svc.clusterset.local", "a".repeat(64));
        let err = parse(&long).unwrap_err();
        assert!(err.to_string().contains("at most 63"), "{err}");
    }

    #[test]
    fn dashed_ip_hostnames() {
        assert_eq!(
            Hostname::from_ip("10.244.0.5".parse().unwrap()).as_str(),
            "10-244-0-5"
        );
        assert_eq!(
            Hostname::from_ip("fd00::5".parse().unwrap()).as_str(),
            "fd00--5"
        );
        assert_eq!(
            Hostname::from_ip("fd00::".parse().unwrap()).as_str(),
            "fd00--0"
        );
        assert_eq!(Hostname::from_ip("::1".parse().unwrap()).as_str(), "0--1");
    }

    #[test]
    fn zone_leaves_room_for_the_soa_names() {
        // Found by the `dns` fuzz target: a 253-character zone was accepted, and every
        // negative answer then carried `hostmaster.<zone>.`, too long for the wire.
        let zone = |len: usize| {
            let name: String = (0..len)
                .map(|i| if i % 64 == 63 { '.' } else { 'a' })
                .collect();
            Zone::new(&name)
        };
        assert_eq!(zone(MAX_ZONE_LEN).unwrap().as_str().len(), 242);
        let err = zone(MAX_ZONE_LEN + 1).unwrap_err();
        assert!(matches!(err, NameError::Zone { .. }), "{err}");
        assert!(err.to_string().contains("at most 242"), "{err}");
    }

    #[test]
    fn custom_zone() {
        let zone = Zone::new("Example.Org.").unwrap();
        assert_eq!(zone.as_str(), "example.org");
        assert!(zone.contains("a.b.svc.EXAMPLE.org."));
        assert!(!zone.contains("a.b.svc.xexample.org"));
        assert!(Zone::new("bad_zone").is_err());
        assert!(matches!(
            McsName::parse("a.b.svc.example.org", &zone).unwrap(),
            McsName::Service(_)
        ));
    }
}
