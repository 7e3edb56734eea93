//! IP ranges in CIDR notation and the checks MCS routing needs: two members whose pod or
//! service ranges overlap cannot reach each other's endpoints, and an imported endpoint
//! address inside the importing cluster's own ranges would be routed locally.
//!
//! ```
//! use mcs_core::cidr::Cidr;
//!
//! let services: Cidr = "10.96.0.0/12".parse().unwrap();
//! assert!(services.contains("10.100.1.2".parse().unwrap()));
//! assert!(services.overlaps(&"10.96.128.0/17".parse().unwrap()));
//! assert!(!services.overlaps(&"10.128.0.0/16".parse().unwrap()));
//! ```

use std::fmt;
use std::net::IpAddr;
use std::str::FromStr;

use serde::{Deserialize, Serialize};

use crate::ClusterId;

/// An IPv4 or IPv6 range: a network address and a prefix length. Host bits given in the
/// text are cleared (`10.0.0.7/24` is `10.0.0.0/24`).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Cidr {
    network: IpAddr,
    prefix: u8,
}

/// Text that is not a CIDR.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum CidrError {
    /// No `/` between address and prefix length.
    #[error("{0:?} is not a CIDR: expected ADDRESS/PREFIX, e.g. 10.96.0.0/12")]
    Form(String),
    /// The address part is not an IP address.
    #[error("{0:?} is not a CIDR: the address is not an IPv4 or IPv6 address")]
    Address(String),
    /// The prefix length is not a number, or too long for the address family.
    #[error("{0:?} is not a CIDR: the prefix length must be 0-32 for IPv4, 0-128 for IPv6")]
    Prefix(String),
}

impl Cidr {
    /// The range of `prefix` bits starting at `address` (host bits cleared).
    pub fn new(address: IpAddr, prefix: u8) -> Option<Self> {
        let bits = family_bits(address);
        (prefix <= bits).then(|| Self {
            network: mask(address, prefix),
            prefix,
        })
    }

    /// The network address.
    pub fn network(&self) -> IpAddr {
        self.network
    }

    /// The prefix length.
    pub fn prefix(&self) -> u8 {
        self.prefix
    }

    /// Whether `address` is in the range (never across address families).
    pub fn contains(&self, address: IpAddr) -> bool {
        family_bits(address) == family_bits(self.network)
            && mask(address, self.prefix) == self.network
    }

    /// Whether the two ranges share an address: one contains the other's network address.
    pub fn overlaps(&self, other: &Cidr) -> bool {
        self.contains(other.network) || other.contains(self.network)
    }
}

impl FromStr for Cidr {
    type Err = CidrError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let (address, prefix) = s
            .trim()
            .split_once('/')
            .ok_or_else(|| CidrError::Form(s.to_owned()))?;
        let address: IpAddr = address
            .parse()
            .map_err(|_| CidrError::Address(s.to_owned()))?;
        let prefix: u8 = prefix
            .parse()
            .map_err(|_| CidrError::Prefix(s.to_owned()))?;
        Cidr::new(address, prefix).ok_or_else(|| CidrError::Prefix(s.to_owned()))
    }
}

impl fmt::Display for Cidr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.network, self.prefix)
    }
}

impl Serialize for Cidr {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_str(self)
    }
}

impl<'de> Deserialize<'de> for Cidr {
    fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let text = String::deserialize(deserializer)?;
        text.parse().map_err(serde::de::Error::custom)
    }
}

/// Which of a cluster's ranges.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RangeKind {
    /// Pod addresses (Nodes' `spec.podCIDRs`).
    Pod,
    /// Service ClusterIPs (`networking.k8s.io/v1` ServiceCIDR objects).
    Service,
}

impl RangeKind {
    /// `pod` or `service`.
    pub fn as_str(self) -> &'static str {
        match self {
            RangeKind::Pod => "pod",
            RangeKind::Service => "service",
        }
    }
}

impl fmt::Display for RangeKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One member's pod and service ranges.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterRanges {
    /// Pod ranges (one per Node, usually; duplicates are harmless).
    pub pods: Vec<Cidr>,
    /// Service ranges.
    pub services: Vec<Cidr>,
}

impl ClusterRanges {
    /// Every range with its kind.
    pub fn all(&self) -> impl Iterator<Item = (RangeKind, Cidr)> + '_ {
        self.pods
            .iter()
            .map(|c| (RangeKind::Pod, *c))
            .chain(self.services.iter().map(|c| (RangeKind::Service, *c)))
    }

    /// The first of the ranges that contains `address`.
    pub fn containing(&self, address: IpAddr) -> Option<(RangeKind, Cidr)> {
        self.all().find(|(_, c)| c.contains(address))
    }
}

/// Two members' ranges that overlap; members are named by `K` (a cluster id, or a
/// kubeconfig context for a tool that has no ids yet).
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Overlap<K = ClusterId> {
    /// The first member (the lower name) and its range.
    pub a: (K, RangeKind, Cidr),
    /// The second member and its range.
    pub b: (K, RangeKind, Cidr),
}

impl<K: fmt::Display> fmt::Display for Overlap<K> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{} {} range {} overlaps {} {} range {}",
            self.a.0, self.a.1, self.a.2, self.b.0, self.b.1, self.b.2
        )
    }
}

/// Every overlap between ranges of different members: one per pair of members and pair of
/// range kinds (the first witness found; ranges sorted, so the answer does not depend on
/// input order), sorted. Two members with the same name are still two members. Cost:
/// pairwise over the members' ranges.
pub fn overlaps<'a, K: Ord + Clone + 'a>(
    members: impl IntoIterator<Item = (&'a K, &'a ClusterRanges)>,
) -> Vec<Overlap<K>> {
    let mut members: Vec<(&K, Vec<(RangeKind, Cidr)>)> = members
        .into_iter()
        .map(|(id, r)| {
            let mut all: Vec<_> = r.all().collect();
            all.sort();
            all.dedup();
            (id, all)
        })
        .collect();
    members.sort_by(|x, y| x.0.cmp(y.0));
    let mut found = Vec::new();
    for (i, (a, a_ranges)) in members.iter().enumerate() {
        for (b, b_ranges) in &members[i + 1..] {
            let mut seen: Vec<(RangeKind, RangeKind)> = Vec::new();
            for (ka, ca) in a_ranges {
                for (kb, cb) in b_ranges {
                    if seen.contains(&(*ka, *kb)) || !ca.overlaps(cb) {
                        continue;
                    }
                    seen.push((*ka, *kb));
                    found.push(Overlap {
                        a: ((*a).clone(), *ka, *ca),
                        b: ((*b).clone(), *kb, *cb),
                    });
                }
            }
        }
    }
    found.sort();
    found
}

fn family_bits(address: IpAddr) -> u8 {
    match address {
        IpAddr::V4(_) => 32,
        IpAddr::V6(_) => 128,
    }
}

fn mask(address: IpAddr, prefix: u8) -> IpAddr {
    match address {
        IpAddr::V4(a) => {
            let bits = u32::from(a);
            let m = u32::MAX.checked_shl(32 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V4((bits & m).into())
        }
        IpAddr::V6(a) => {
            let bits = u128::from(a);
            let m = u128::MAX.checked_shl(128 - u32::from(prefix)).unwrap_or(0);
            IpAddr::V6((bits & m).into())
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn c(s: &str) -> Cidr {
        s.parse().unwrap()
    }

    fn id(s: &str) -> ClusterId {
        ClusterId::new(s).unwrap()
    }

    #[test]
    fn parses_and_normalises() {
        assert_eq!(c("10.0.0.7/24").to_string(), "10.0.0.0/24");
        assert_eq!(c("fd00::1/64").to_string(), "fd00::/64");
        assert_eq!(c("0.0.0.0/0").prefix(), 0);
        assert_eq!(c("10.1.2.3/32").to_string(), "10.1.2.3/32");
        assert!(matches!(
            "10.0.0.0".parse::<Cidr>(),
            Err(CidrError::Form(_))
        ));
        assert!(matches!(
            "10.0.0/8".parse::<Cidr>(),
            Err(CidrError::Address(_))
        ));
        assert!(matches!(
            "10.0.0.0/33".parse::<Cidr>(),
            Err(CidrError::Prefix(_))
        ));
        assert!(matches!(
            "fd00::/129".parse::<Cidr>(),
            Err(CidrError::Prefix(_))
        ));
        assert!(matches!(
            "10.0.0.0/x".parse::<Cidr>(),
            Err(CidrError::Prefix(_))
        ));
        let e = "10.0.0/8".parse::<Cidr>().unwrap_err().to_string();
        assert!(e.contains("\"10.0.0/8\""), "{e}");
    }

    #[test]
    fn containment_and_overlap() {
        let r = c("10.96.0.0/12");
        assert!(r.contains("10.96.0.0".parse().unwrap()));
        assert!(r.contains("10.111.255.255".parse().unwrap()));
        assert!(!r.contains("10.112.0.0".parse().unwrap()));
        assert!(
            !r.contains("::ffff:10.96.0.1".parse().unwrap()),
            "no cross-family match"
        );
        assert!(r.overlaps(&c("10.100.0.0/16")));
        assert!(c("10.100.0.0/16").overlaps(&r));
        assert!(!r.overlaps(&c("10.112.0.0/12")));
        assert!(c("0.0.0.0/0").overlaps(&c("192.0.2.0/24")));
        assert!(!c("0.0.0.0/0").overlaps(&c("::/0")));
    }

    #[test]
    fn overlaps_between_members_only_one_witness_per_kind_pair() {
        let east = ClusterRanges {
            pods: vec![c("10.244.0.0/24"), c("10.244.1.0/24")],
            services: vec![c("10.96.0.0/16")],
        };
        let west = ClusterRanges {
            pods: vec![c("10.245.0.0/24"), c("10.244.1.0/24"), c("10.244.0.0/24")],
            services: vec![c("10.96.128.0/17")],
        };
        let north = ClusterRanges {
            pods: vec![c("10.246.0.0/24")],
            services: vec![c("10.97.0.0/16")],
        };
        let (e, w, n) = (id("east"), id("west"), id("north"));
        let found = overlaps([(&w, &west), (&n, &north), (&e, &east)]);
        assert_eq!(
            found,
            vec![
                Overlap {
                    a: (e.clone(), RangeKind::Pod, c("10.244.0.0/24")),
                    b: (w.clone(), RangeKind::Pod, c("10.244.0.0/24")),
                },
                Overlap {
                    a: (e.clone(), RangeKind::Service, c("10.96.0.0/16")),
                    b: (w.clone(), RangeKind::Service, c("10.96.128.0/17")),
                },
            ]
        );
        // Input order does not matter; a member never overlaps itself.
        assert_eq!(overlaps([(&e, &east), (&n, &north), (&w, &west)]), found);
        assert!(overlaps([(&e, &east)]).is_empty());
        // A pod range of one inside the service range of another counts too.
        let south = ClusterRanges {
            pods: vec![c("10.96.5.0/24")],
            services: vec![],
        };
        let s = id("south");
        let found = overlaps([(&e, &east), (&s, &south)]);
        assert_eq!(found.len(), 1);
        assert_eq!(found[0].a.1, RangeKind::Service);
        assert_eq!(found[0].b.1, RangeKind::Pod);
        assert_eq!(
            found[0].to_string(),
            "east service range 10.96.0.0/16 overlaps south pod range 10.96.5.0/24"
        );
    }

    #[test]
    fn the_range_holding_an_address() {
        let east = ClusterRanges {
            pods: vec![c("10.244.0.0/24")],
            services: vec![c("10.96.0.0/16")],
        };
        assert_eq!(
            east.containing("10.96.3.4".parse().unwrap()),
            Some((RangeKind::Service, c("10.96.0.0/16")))
        );
        assert_eq!(
            east.containing("10.244.0.9".parse().unwrap()),
            Some((RangeKind::Pod, c("10.244.0.0/24")))
        );
        assert_eq!(east.containing("192.0.2.1".parse().unwrap()), None);
    }

    #[test]
    fn serde_round_trip() {
        let r = c("fd00:10::/108");
        let json = serde_json::to_string(&r).unwrap();
        assert_eq!(json, "\"fd00:10::/108\"");
        assert_eq!(serde_json::from_str::<Cidr>(&json).unwrap(), r);
        assert!(serde_json::from_str::<Cidr>("\"nope\"").is_err());
    }
}
