//! The agent's continuous CIDR checks: an endpoint imported from another member whose
//! address lies inside this cluster's own pod or service ranges (traffic to it would stay
//! in this cluster), and a member whose ranges overlap this cluster's. Each is reported as
//! a Warning event when it appears and counted in the gauge
//! [`mcs_agent_cidr_conflicts`](crate::metrics::AGENT_CIDR_CONFLICTS) while it lasts.
//!
//! [`judge`] decides (pure); [`read_ranges`] and the task behind [`Agent::run`](super::Agent)
//! read the ranges (Nodes' `spec.podCIDRs`, `networking.k8s.io/v1` ServiceCIDRs) and the
//! imported EndpointSlices, and publish. The ranges of the other members are known in the
//! mesh topology only (the agent reads their API servers); in the hub topology only
//! imported endpoints are checked.

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, ObjectReference};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::api::networking::v1::ServiceCIDR;
use kube::api::{Api, ListParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use mcs_core::ClusterId;
use mcs_core::api::{CLUSTER_ID_PROPERTY, LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER};
use mcs_core::cidr::{self, Cidr, ClusterRanges, RangeKind};
use mcs_core::slices::endpoints_of;

use super::desired::{LABEL_SLICE_MANAGED_BY, MANAGED_BY};

/// `kind` label of the gauge for a member whose ranges overlap this cluster's.
pub const MEMBER_OVERLAP: &str = "member_overlap";
/// `kind` label of the gauge for imported endpoints inside this cluster's ranges.
pub const LOCAL_ENDPOINT: &str = "local_endpoint";

/// One imported endpoint address, as this cluster has it.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub struct ImportedAddress {
    /// The service's namespace.
    pub namespace: String,
    /// The service's name.
    pub service: String,
    /// The cluster it was imported from.
    pub source: String,
    /// The address.
    pub address: IpAddr,
}

/// An address with the range that holds it.
type Contained = (IpAddr, RangeKind, Cidr);

/// A CIDR problem seen from one cluster.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[non_exhaustive]
pub enum CidrFinding {
    /// A range of `member` overlaps one of this cluster's.
    MemberOverlap {
        /// The other member.
        member: String,
        /// Which ranges, as a sentence (`east pod range ... overlaps west pod range ...`).
        overlap: String,
    },
    /// Endpoints of a service imported from `source` lie in this cluster's own ranges.
    LocalEndpoints {
        /// The service's namespace.
        namespace: String,
        /// The service's name.
        service: String,
        /// The cluster they were imported from.
        source: String,
        /// Each address with the local range that holds it.
        addresses: Vec<(IpAddr, RangeKind, Cidr)>,
    },
}

impl CidrFinding {
    /// The gauge's `kind` and `cluster` labels.
    pub fn labels(&self) -> (&'static str, &str) {
        match self {
            CidrFinding::MemberOverlap { member, .. } => (MEMBER_OVERLAP, member),
            CidrFinding::LocalEndpoints { source, .. } => (LOCAL_ENDPOINT, source),
        }
    }

    /// What it adds to its gauge: overlaps count one each, endpoints one per address.
    pub fn weight(&self) -> usize {
        match self {
            CidrFinding::MemberOverlap { .. } => 1,
            CidrFinding::LocalEndpoints { addresses, .. } => addresses.len(),
        }
    }

    /// The Warning event's reason.
    pub fn reason(&self) -> &'static str {
        match self {
            CidrFinding::MemberOverlap { .. } => "OverlappingClusterCIDR",
            CidrFinding::LocalEndpoints { .. } => "ImportedEndpointInLocalCIDR",
        }
    }
}

impl std::fmt::Display for CidrFinding {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            CidrFinding::MemberOverlap { overlap, .. } => write!(
                f,
                "{overlap}: addresses in the overlap cannot be routed between these members, and ranges cannot be changed later"
            ),
            CidrFinding::LocalEndpoints {
                namespace,
                service,
                source,
                addresses,
            } => {
                write!(
                    f,
                    "{} endpoint(s) of {namespace}/{service} imported from {source} lie in this cluster's own ranges, so traffic to them stays here:",
                    addresses.len()
                )?;
                for (i, (address, kind, range)) in addresses.iter().enumerate() {
                    if i == 5 {
                        return write!(f, " and {} more", addresses.len() - 5);
                    }
                    write!(
                        f,
                        "{} {address} in {} range {range}",
                        if i == 0 { "" } else { ";" },
                        kind.as_str()
                    )?;
                }
                Ok(())
            }
        }
    }
}

/// The CIDR problems of cluster `local`, whose ranges are `ranges[local]`: every overlap of
/// its ranges with another member's in `ranges`, and every address in `imported` from
/// another member that lies in its own ranges (its own endpoints, imported from itself, are
/// in them by nature). Sorted.
pub fn judge(
    local: &str,
    ranges: &BTreeMap<String, ClusterRanges>,
    imported: &[ImportedAddress],
) -> Vec<CidrFinding> {
    let mut findings = BTreeSet::new();
    for o in cidr::overlaps(ranges.iter()) {
        let other = if o.a.0 == local {
            &o.b.0
        } else if o.b.0 == local {
            &o.a.0
        } else {
            continue;
        };
        findings.insert(CidrFinding::MemberOverlap {
            member: other.clone(),
            overlap: o.to_string(),
        });
    }
    if let Some(own) = ranges.get(local) {
        // By (namespace, service, source).
        let mut by_service: BTreeMap<(&str, &str, &str), BTreeSet<Contained>> = BTreeMap::new();
        for a in imported.iter().filter(|a| a.source != local) {
            if let Some((kind, range)) = own.containing(a.address) {
                by_service
                    .entry((&a.namespace, &a.service, &a.source))
                    .or_default()
                    .insert((a.address, kind, range));
            }
        }
        for ((namespace, service, source), addresses) in by_service {
            findings.insert(CidrFinding::LocalEndpoints {
                namespace: namespace.to_owned(),
                service: service.to_owned(),
                source: source.to_owned(),
                addresses: addresses.into_iter().collect(),
            });
        }
    }
    findings.into_iter().collect()
}

/// A cluster's pod ranges (its Nodes' `spec.podCIDRs`, else `spec.podCIDR`) and service
/// ranges (its `networking.k8s.io/v1` ServiceCIDRs), sorted and without duplicates. Text
/// that is no CIDR is skipped.
pub async fn read_ranges(client: &kube::Client) -> Result<ClusterRanges, kube::Error> {
    let mut ranges = ClusterRanges::default();
    for node in Api::<Node>::all(client.clone())
        .list(&ListParams::default())
        .await?
    {
        let spec = node.spec.unwrap_or_default();
        let cidrs = spec
            .pod_cidrs
            .unwrap_or_else(|| spec.pod_cidr.into_iter().collect());
        ranges
            .pods
            .extend(cidrs.iter().filter_map(|c| c.parse::<Cidr>().ok()));
    }
    for sc in Api::<ServiceCIDR>::all(client.clone())
        .list(&ListParams::default())
        .await?
    {
        let cidrs = sc.spec.and_then(|s| s.cidrs).unwrap_or_default();
        ranges
            .services
            .extend(cidrs.iter().filter_map(|c| c.parse::<Cidr>().ok()));
    }
    ranges.pods.sort();
    ranges.pods.dedup();
    ranges.services.sort();
    ranges.services.dedup();
    Ok(ranges)
}

/// Every address of the EndpointSlices this cluster's agent imported (selected by its
/// own managed-by label: the agent never lists every EndpointSlice of its cluster).
async fn read_imported(client: &kube::Client) -> Result<Vec<ImportedAddress>, kube::Error> {
    let selector = format!(
        "{LABEL_SLICE_MANAGED_BY}={MANAGED_BY},{LABEL_SERVICE_NAME},{LABEL_SOURCE_CLUSTER}"
    );
    let slices = Api::<EndpointSlice>::all(client.clone())
        .list(&ListParams::default().labels(&selector))
        .await?;
    let mut out = Vec::new();
    for slice in slices {
        let Some(labels) = slice.metadata.labels.as_ref() else {
            continue;
        };
        let (Some(namespace), Some(service), Some(source)) = (
            slice.metadata.namespace.as_ref(),
            labels.get(LABEL_SERVICE_NAME),
            labels.get(LABEL_SOURCE_CLUSTER),
        ) else {
            continue;
        };
        for endpoint in endpoints_of(&slice) {
            for address in &endpoint.addresses {
                if let Ok(address) = address.parse() {
                    out.push(ImportedAddress {
                        namespace: namespace.clone(),
                        service: service.clone(),
                        source: source.clone(),
                        address,
                    });
                }
            }
        }
    }
    Ok(out)
}

/// What the checking task needs.
pub(super) struct CidrTask {
    /// This cluster.
    pub(super) local: ClusterId,
    /// A client for it.
    pub(super) local_client: kube::Client,
    /// The other members whose ranges can be read (mesh topology).
    pub(super) peers: Vec<(ClusterId, kube::Client)>,
    /// How often to check.
    pub(super) interval: Duration,
    /// How often to set the gauges again.
    pub(super) refresh: Duration,
    /// The event reporter's name (the field manager).
    pub(super) controller: String,
}

impl CidrTask {
    /// Checks every `interval` and sets the gauges every `refresh`, forever (the agent
    /// aborts it when it stops).
    pub(super) async fn run(self) {
        let recorder = Recorder::new(
            self.local_client.clone(),
            Reporter {
                controller: self.controller.clone(),
                instance: None,
            },
        );
        let mut check = tokio::time::interval(self.interval.max(Duration::from_millis(100)));
        check.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut refresh = tokio::time::interval(self.refresh);
        refresh.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        let mut known: Vec<CidrFinding> = Vec::new();
        let mut gauges: BTreeMap<(&'static str, String), usize> = BTreeMap::new();
        let mut failing: BTreeSet<String> = BTreeSet::new();
        loop {
            tokio::select! {
                _ = check.tick() => {}
                _ = refresh.tick() => {
                    set_gauges(&gauges);
                    continue;
                }
            }
            let Some(findings) = self.check(&mut failing).await else {
                continue;
            };
            for new in findings.iter().filter(|f| !known.contains(f)) {
                tracing::warn!(cluster = %self.local, reason = new.reason(), "{new}");
                publish(&recorder, &self.local, new).await;
            }
            let mut now: BTreeMap<(&'static str, String), usize> = BTreeMap::new();
            for f in &findings {
                let (kind, cluster) = f.labels();
                *now.entry((kind, cluster.to_owned())).or_default() += f.weight();
            }
            // What went away is set to 0 once, then left to the recorder's idle timeout.
            for (key, _) in gauges.iter().filter(|(k, _)| !now.contains_key(*k)) {
                metrics::gauge!(crate::metrics::AGENT_CIDR_CONFLICTS, "kind" => key.0, "cluster" => key.1.clone())
                    .set(0.0);
            }
            set_gauges(&now);
            gauges = now;
            known = findings;
        }
    }

    /// One round; `None` when this cluster's own ranges or imports could not be read.
    async fn check(&self, failing: &mut BTreeSet<String>) -> Option<Vec<CidrFinding>> {
        let mut note = |what: String, result: Result<(), kube::Error>| match result {
            Ok(()) => {
                if failing.remove(&what) {
                    tracing::info!(cluster = %self.local, "CIDR check: {what} readable again");
                }
            }
            Err(e) => {
                if failing.insert(what.clone()) {
                    tracing::warn!(cluster = %self.local, error = %e, "CIDR check: cannot read {what}");
                }
            }
        };
        let mut ranges = BTreeMap::new();
        let own = read_ranges(&self.local_client).await;
        let imported = read_imported(&self.local_client).await;
        let (own, imported) = match (own, imported) {
            (Ok(own), Ok(imported)) => {
                note("the local ranges and imports".to_owned(), Ok(()));
                (own, imported)
            }
            (Err(e), _) | (_, Err(e)) => {
                note("the local ranges and imports".to_owned(), Err(e));
                return None;
            }
        };
        ranges.insert(self.local.to_string(), own);
        for (id, client) in &self.peers {
            match read_ranges(client).await {
                Ok(r) => {
                    note(format!("the ranges of {id}"), Ok(()));
                    ranges.insert(id.to_string(), r);
                }
                Err(e) => note(format!("the ranges of {id}"), Err(e)),
            }
        }
        Some(judge(self.local.as_str(), &ranges, &imported))
    }
}

fn set_gauges(gauges: &BTreeMap<(&'static str, String), usize>) {
    for ((kind, cluster), n) in gauges {
        metrics::gauge!(crate::metrics::AGENT_CIDR_CONFLICTS, "kind" => *kind, "cluster" => cluster.clone())
            .set(*n as f64);
    }
}

/// A Warning event: on the ServiceImport for imported endpoints, on the ClusterProperty
/// holding this cluster's id for an overlap.
async fn publish(recorder: &Recorder, local: &ClusterId, finding: &CidrFinding) {
    let reference = match finding {
        CidrFinding::LocalEndpoints {
            namespace, service, ..
        } => ObjectReference {
            api_version: Some("multicluster.x-k8s.io/v1beta1".into()),
            kind: Some("ServiceImport".into()),
            name: Some(service.clone()),
            namespace: Some(namespace.clone()),
            ..Default::default()
        },
        CidrFinding::MemberOverlap { .. } => ObjectReference {
            api_version: Some("about.k8s.io/v1alpha1".into()),
            kind: Some("ClusterProperty".into()),
            name: Some(CLUSTER_ID_PROPERTY.into()),
            ..Default::default()
        },
    };
    let event = Event {
        type_: EventType::Warning,
        reason: finding.reason().into(),
        note: Some(finding.to_string()),
        action: "CheckCIDRs".into(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, &reference).await {
        tracing::warn!(cluster = %local, error = %e, reason = finding.reason(), "cannot record the CIDR event");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ranges(pods: &[&str], services: &[&str]) -> ClusterRanges {
        ClusterRanges {
            pods: pods.iter().map(|c| c.parse().unwrap()).collect(),
            services: services.iter().map(|c| c.parse().unwrap()).collect(),
        }
    }

    fn imported(service: &str, source: &str, address: &str) -> ImportedAddress {
        ImportedAddress {
            namespace: "loyalty".into(),
            service: service.into(),
            source: source.into(),
            address: address.parse().unwrap(),
        }
    }

    #[test]
    fn overlaps_with_this_cluster_and_foreign_endpoints_in_its_ranges() {
        let all: BTreeMap<String, ClusterRanges> = [
            ("east", ranges(&["10.244.0.0/16"], &["10.96.0.0/24"])),
            ("west", ranges(&["10.245.0.0/16"], &["10.96.0.128/25"])),
            // North overlaps west only: east's agent does not report it.
            ("north", ranges(&["10.245.1.0/24"], &["10.97.0.0/24"])),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v))
        .collect();
        let findings = judge(
            "east",
            &all,
            &[
                // East's own endpoints imported into east: in its range, as they should be.
                imported("accrual", "east", "10.244.0.5"),
                // West's endpoints inside east's pod and service ranges.
                imported("accrual", "west", "10.244.3.7"),
                imported("accrual", "west", "10.96.0.9"),
                imported("accrual", "west", "10.245.0.1"),
                imported("ledger", "north", "192.0.2.1"),
            ],
        );
        assert_eq!(
            findings,
            [
                CidrFinding::MemberOverlap {
                    member: "west".into(),
                    overlap:
                        "east service range 10.96.0.0/24 overlaps west service range 10.96.0.128/25"
                            .into(),
                },
                CidrFinding::LocalEndpoints {
                    namespace: "loyalty".into(),
                    service: "accrual".into(),
                    source: "west".into(),
                    addresses: vec![
                        (
                            "10.96.0.9".parse().unwrap(),
                            RangeKind::Service,
                            "10.96.0.0/24".parse().unwrap()
                        ),
                        (
                            "10.244.3.7".parse().unwrap(),
                            RangeKind::Pod,
                            "10.244.0.0/16".parse().unwrap()
                        ),
                    ],
                },
            ]
        );
        assert_eq!(findings[1].labels(), (LOCAL_ENDPOINT, "west"));
        assert_eq!(findings[1].weight(), 2);
        assert_eq!(
            findings[1].to_string(),
            "2 endpoint(s) of loyalty/accrual imported from west lie in this cluster's own ranges, so traffic to them stays here: 10.96.0.9 in service range 10.96.0.0/24; 10.244.3.7 in pod range 10.244.0.0/16"
        );
        // West sees both north and east.
        let west: Vec<_> = judge("west", &all, &[])
            .iter()
            .map(|f| f.labels().1.to_owned())
            .collect();
        assert_eq!(west, ["east", "north"]);
    }

    #[test]
    fn nothing_without_own_ranges_or_problems() {
        let all: BTreeMap<String, ClusterRanges> =
            [("east".to_owned(), ranges(&["10.244.0.0/16"], &[]))].into();
        assert!(judge("east", &all, &[imported("a", "west", "192.0.2.1")]).is_empty());
        assert!(judge("south", &all, &[imported("a", "west", "10.244.0.1")]).is_empty());
    }
}
