//! The pure merge of one service: constituents in, import and conditions out.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::{self, Write as _};

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

use crate::ClusterId;
use crate::api::v1beta1::ServiceImport;
use crate::api::{
    ClusterSelector, ClusterStatus, IpFamily, ServiceImportSpec, ServiceImportStatus,
    ServiceImportType, ServicePort, SessionAffinityConfig, StringMap,
};
use crate::conditions::{
    ConditionStatus, ConflictReason, ConflictReasons, DesiredCondition, ExportConditionType,
    NO_CONFLICTS, ValidReason,
};
use crate::name::ServiceRef;

use super::input::{Constituent, PortKey, ServiceFacts, ServiceKind, normalise, port_key};

/// The longest condition message the CRD accepts.
pub const MAX_MESSAGE_LEN: usize = 32_768;

/// How many ports a conflict message lists before it says "and N more".
const LISTED_PORTS: usize = 16;

/// What a merge does with the import already published when the export it came from is
/// no longer a valid constituent (KEP-1645, "Constraints and Conflict Resolution").
///
/// Whatever the policy, while the previous winner is still a valid constituent the merge
/// is the same: the oldest valid export wins. The policies differ only once that export
/// leaves (is deleted, its cluster leaves, or its Service is deleted or becomes
/// `ExternalName`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub enum Stability {
    /// Keep the published import when its source export goes away: its type, session
    /// affinity (and config), internal traffic policy, traffic distribution, IP families,
    /// labels and annotations stay, and so do its ports that a remaining cluster still
    /// exposes; ports of the remaining exports are added by precedence. When a fresh merge
    /// would publish exactly the same import, the fresh merge is adopted (so its winner
    /// becomes the source). A constituent that disagrees with a kept value is in conflict.
    /// Ask for [`Stability::Fresh`] (e.g. [`ClusterSetState::refresh`]) to re-elect.
    ///
    /// [`ClusterSetState::refresh`]: super::ClusterSetState::refresh
    #[default]
    Sticky,
    /// Ignore the published import: the oldest valid export wins, always.
    Fresh,
}

/// Why the winning export won.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
pub enum WinReason {
    /// Its `creationTimestamp` is strictly the oldest.
    Oldest,
    /// Several exports share the oldest `creationTimestamp` and its cluster id is the
    /// lowest in lexical (byte) order among them.
    TieBreak {
        /// How many exports share the oldest timestamp (at least 2).
        tied: usize,
    },
}

/// Where the import's properties come from.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub enum Source {
    /// The winning export, by precedence.
    Winner {
        /// The winning export's cluster.
        cluster: ClusterId,
        /// Why it won.
        reason: WinReason,
    },
    /// The previously published import, kept under [`Stability::Sticky`] after the export
    /// it came from stopped being a valid constituent.
    Retained {
        /// The cluster whose export the kept properties came from.
        cluster: ClusterId,
    },
}

impl Source {
    /// The cluster whose export the import's properties came from.
    pub fn cluster(&self) -> &ClusterId {
        match self {
            Self::Winner { cluster, .. } | Self::Retained { cluster } => cluster,
        }
    }
}

/// A merged port and the clusters that may receive its traffic.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct PortRoute {
    /// The merged port, as in the import's `spec.ports`.
    pub port: ServicePort,
    /// The valid exporting clusters whose Service exposes this port (same name, protocol
    /// and number) and shares an IP family with the import, sorted by cluster id (see
    /// the routing rule in the [module docs](super)). Empty only when every cluster that
    /// exposes the port has none of the import's families (an `IPFamilyConflict`).
    pub clusters: Vec<ClusterId>,
}

/// The ServiceImport a merge wants published.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MergedImport {
    /// The spec. `ips` is always `None`: each cluster's agent allocates its own IPs.
    pub spec: ServiceImportSpec,
    /// `metadata.labels`: the exported labels of the source export.
    pub labels: StringMap,
    /// `metadata.annotations`: the exported annotations of the source export.
    pub annotations: StringMap,
    /// `status.clusters`: every valid exporting cluster, sorted by cluster id.
    pub clusters: Vec<ClusterId>,
    /// One route per entry of `spec.ports`, in the same order.
    pub routes: Vec<PortRoute>,
    /// Where the properties come from.
    pub source: Source,
}

impl MergedImport {
    /// The clusters that may receive traffic for `port` (matched on name, protocol and
    /// number), or an empty slice when the import has no such port.
    pub fn clusters_for(&self, port: &ServicePort) -> &[ClusterId] {
        let key = port_key(port);
        self.routes
            .iter()
            .find(|r| port_key(&r.port) == key)
            .map_or(&[], |r| r.clusters.as_slice())
    }

    /// Whether endpoint addresses of `family` may receive the import's traffic: the
    /// import publishes that family, or publishes none. A routed cluster's endpoints of
    /// any other family must not be handed out (see the routing rule in the
    /// [module docs](super)).
    pub fn admits_family(&self, family: IpFamily) -> bool {
        self.spec
            .ip_families
            .as_deref()
            .is_none_or(|published| published.is_empty() || published.contains(&family))
    }

    /// `status` with `clusters` set (no conditions: those belong to the importing agent).
    pub fn status(&self) -> ServiceImportStatus {
        ServiceImportStatus {
            clusters: Some(
                self.clusters
                    .iter()
                    .map(|c| ClusterStatus {
                        cluster: c.as_str().to_owned(),
                    })
                    .collect(),
            ),
            ..ServiceImportStatus::default()
        }
    }

    /// The whole ServiceImport object for `service`, with labels, annotations, spec and
    /// `status.clusters`.
    pub fn to_service_import(&self, service: &ServiceRef) -> ServiceImport {
        let non_empty = |m: &StringMap| (!m.is_empty()).then(|| m.clone());
        ServiceImport {
            metadata: ObjectMeta {
                name: Some(service.name.as_str().to_owned()),
                namespace: Some(service.namespace.as_str().to_owned()),
                labels: non_empty(&self.labels),
                annotations: non_empty(&self.annotations),
                ..ObjectMeta::default()
            },
            spec: self.spec.clone(),
            status: Some(self.status()),
        }
    }
}

/// The `Valid` and `Conflict` conditions one ServiceExport should carry.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct ExportConditions {
    /// `Valid`: `True/Valid`, `False/NoService` or `False/InvalidServiceType`.
    pub valid: DesiredCondition,
    /// `Conflict`: `True` with the comma-joined reasons, or `False/NoConflicts`. The same
    /// on every valid export of a service.
    pub conflict: DesiredCondition,
}

/// The result of merging one service.
#[derive(Clone, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub struct MergeOutcome {
    /// The import to publish, or `None`: there is an import iff at least one export is
    /// valid.
    pub import: Option<MergedImport>,
    /// The conflict reasons (empty: `NoConflicts`).
    pub conflicts: ConflictReasons,
    /// The conditions of every export, valid or not, keyed by cluster.
    pub exports: BTreeMap<ClusterId, ExportConditions>,
}

/// Why a merge could not run.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum MergeError {
    /// Two constituents come from the same cluster.
    #[error(
        "service {service} has two exports from cluster {cluster:?}; a cluster exports a service at most once"
    )]
    DuplicateCluster {
        /// `<namespace>/<name>` of the service.
        service: String,
        /// The repeated cluster.
        cluster: ClusterId,
    },
}

/// Merges every cluster's export of `service` (KEP-1645, "Constraints and Conflict Resolution").
///
/// The result depends only on the set of constituents, not on their order. `previous` is
/// the import this service had before (what [`MergeOutcome::import`] returned last time);
/// it matters only under [`Stability::Sticky`], see there.
///
/// ```
/// use k8s_openapi::jiff::Timestamp;
/// use mcs_core::api::{ServiceImportType, ServicePort};
/// use mcs_core::conditions::ConflictReason;
/// use mcs_core::merge::{merge, Constituent, ServiceFacts, ServiceKind, Stability};
/// use mcs_core::name::ServiceRef;
/// use mcs_core::ClusterId;
///
/// let svc = ServiceRef::new("demo", "hello").unwrap();
/// let (east, west): (ClusterId, ClusterId) = ("east".parse().unwrap(), "west".parse().unwrap());
/// let port = |n: i32| ServicePort { name: Some("tcp".into()), port: n, ..Default::default() };
/// let facts = |kind, n| ServiceFacts::builder(kind).port(port(n)).build().unwrap();
/// let at = |s: i64| Timestamp::from_second(s).unwrap();
/// let exports = [
///     Constituent::new(east, at(10), Some(facts(ServiceKind::ClusterSetIp, 42))),
///     Constituent::new(west.clone(), at(20), Some(facts(ServiceKind::Headless, 42))),
/// ];
/// let outcome = merge(&svc, &exports, Stability::Fresh, None).unwrap();
/// let import = outcome.import.unwrap();
/// assert_eq!(import.spec.type_, ServiceImportType::ClusterSetIp);
/// assert!(outcome.conflicts.contains(ConflictReason::TypeConflict));
/// assert_eq!(
///     outcome.exports[&west].conflict.message,
///     "Conflicting type. Using \"ClusterSetIP\" from oldest service export in \"east\". 1/2 clusters disagree.",
/// );
/// ```
pub fn merge(
    service: &ServiceRef,
    constituents: &[Constituent],
    stability: Stability,
    previous: Option<&MergedImport>,
) -> Result<MergeOutcome, MergeError> {
    let mut by_cluster: Vec<&Constituent> = constituents.iter().collect();
    by_cluster.sort_by(|a, b| a.cluster().cmp(b.cluster()));
    for pair in by_cluster.windows(2) {
        if pair[0].cluster() == pair[1].cluster() {
            return Err(MergeError::DuplicateCluster {
                service: service.to_string(),
                cluster: pair[0].cluster().clone(),
            });
        }
    }
    let resolution = resolve(by_cluster.iter().copied(), stability, previous);
    let mut writer = ConditionWriter::new(service, &resolution);
    let exports = by_cluster
        .iter()
        .map(|c| (c.cluster().clone(), writer.conditions(c)))
        .collect();
    Ok(MergeOutcome {
        import: resolution.import,
        conflicts: resolution.conflicts,
        exports,
    })
}

/// A merge result without per-export conditions, which derive from it and each export.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Resolution {
    pub(crate) import: Option<MergedImport>,
    pub(crate) conflicts: ConflictReasons,
    /// The `Conflict` message shared by every valid export.
    pub(crate) message: String,
}

impl Resolution {
    /// The `Conflict` condition of a valid export.
    pub(crate) fn conflict_condition(&self) -> DesiredCondition {
        let message = if self.conflicts.is_empty() {
            "No conflicting properties between the exports of this service."
        } else {
            &self.message
        };
        DesiredCondition::new(
            ExportConditionType::Conflict.as_str(),
            self.conflicts.status(),
            self.conflicts.to_string(),
            message,
        )
    }
}

/// Writes the conditions of many exports of one service, building the ones every valid
/// export shares only once (a clone is cheaper than formatting them again).
pub(crate) struct ConditionWriter<'a> {
    service: &'a ServiceRef,
    resolution: &'a Resolution,
    valid: Option<ExportConditions>,
}

impl<'a> ConditionWriter<'a> {
    pub(crate) fn new(service: &'a ServiceRef, resolution: &'a Resolution) -> Self {
        Self {
            service,
            resolution,
            valid: None,
        }
    }

    /// The conditions of export `c`.
    pub(crate) fn conditions(&mut self, c: &Constituent) -> ExportConditions {
        if c.validity() != ValidReason::Valid {
            return export_conditions(self.service, c, self.resolution);
        }
        let (service, resolution) = (self.service, self.resolution);
        self.valid
            .get_or_insert_with(|| export_conditions(service, c, resolution))
            .clone()
    }
}

/// The conditions of export `c` of `service` under `resolution`.
pub(crate) fn export_conditions(
    service: &ServiceRef,
    c: &Constituent,
    resolution: &Resolution,
) -> ExportConditions {
    let reason = c.validity();
    let valid_type = ExportConditionType::Valid.as_str();
    let not_merged = |valid: DesiredCondition| ExportConditions {
        valid,
        conflict: DesiredCondition::new(
            ExportConditionType::Conflict.as_str(),
            ConditionStatus::False,
            NO_CONFLICTS,
            "The export is not valid, so it takes no part in the merge.",
        ),
    };
    match reason {
        ValidReason::Valid => ExportConditions {
            valid: DesiredCondition::new(
                valid_type,
                ConditionStatus::True,
                reason.as_str(),
                format!("Service {service} can be exported."),
            ),
            conflict: resolution.conflict_condition(),
        },
        ValidReason::NoService => not_merged(DesiredCondition::new(
            valid_type,
            ConditionStatus::False,
            reason.as_str(),
            format!(
                "No Service {:?} exists in namespace {:?} of cluster {:?}.",
                service.name.as_str(),
                service.namespace.as_str(),
                c.cluster().as_str()
            ),
        )),
        ValidReason::InvalidServiceType => not_merged(DesiredCondition::new(
            valid_type,
            ConditionStatus::False,
            reason.as_str(),
            if c.service()
                .is_some_and(|f| f.kind() == ServiceKind::Headless)
            {
                format!(
                    "Service {service} in cluster {:?} is headless; cluster selectors apply to ClusterSetIP services only.",
                    c.cluster().as_str()
                )
            } else {
                format!(
                    "Service {service} in cluster {:?} has type ExternalName, which cannot be exported.",
                    c.cluster().as_str()
                )
            },
        )),
        ValidReason::InvalidClusterSelector => {
            let mut message = format!(
                "The export of {service} in cluster {:?} has invalid cluster selectors: ",
                c.cluster().as_str()
            );
            if let Some(e) = c.cluster_selector_error() {
                // Writing to a String cannot fail.
                let _ = write!(message, "{e}.");
            }
            truncate(&mut message, MAX_MESSAGE_LEN);
            not_merged(DesiredCondition::new(
                valid_type,
                ConditionStatus::False,
                reason.as_str(),
                message,
            ))
        }
    }
}

/// One valid constituent, with its facts and import type.
#[derive(Clone, Copy)]
struct Member<'a> {
    export: &'a Constituent,
    facts: &'a ServiceFacts,
    type_: ServiceImportType,
}

/// The import's properties before routes, clusters and conflicts are derived.
struct Draft {
    spec: ServiceImportSpec,
    labels: StringMap,
    annotations: StringMap,
    source: Source,
}

/// Merges constituents given in cluster-id order, each cluster at most once.
///
/// Cost: O(k log k + P log P) for k constituents with P ports in all; allocates the import.
pub(crate) fn resolve<'a>(
    by_cluster: impl Iterator<Item = &'a Constituent>,
    stability: Stability,
    previous: Option<&MergedImport>,
) -> Resolution {
    let members: Vec<Member<'a>> = by_cluster
        .filter_map(|export| {
            let (facts, type_) = export.valid_facts()?;
            Some(Member {
                export,
                facts,
                type_,
            })
        })
        .collect();
    let mut ranked = members.clone();
    ranked.sort_by(|a, b| {
        (a.export.created(), a.export.cluster()).cmp(&(b.export.created(), b.export.cluster()))
    });
    let Some(winner) = ranked.first() else {
        return Resolution::default();
    };
    let mut exposure: BTreeMap<PortKey<'a>, Vec<&'a ClusterId>> = BTreeMap::new();
    for m in &members {
        for port in m.facts.ports() {
            exposure
                .entry(port_key(port))
                .or_default()
                .push(m.export.cluster());
        }
    }

    let fresh = fresh_draft(winner, &ranked);
    let draft = match (stability, previous) {
        (Stability::Sticky, Some(prev))
            if !members
                .iter()
                .any(|m| m.export.cluster() == prev.source.cluster()) =>
        {
            // Compared after the kept ports are trimmed to what remains exposed: when that
            // is exactly the fresh merge, the fresh merge (and its winner) is adopted now,
            // not at the next merge, so a sticky merge is a fixed point.
            let retained = retained_draft(prev, &ranked, &exposure);
            if publishes_the_same(&fresh, &retained) {
                fresh
            } else {
                retained
            }
        }
        _ => fresh,
    };

    let published = draft.spec.ip_families.as_deref().unwrap_or_default();
    let unreachable: Vec<&ClusterId> = members
        .iter()
        .filter(|m| !shares_family(m.facts.ip_families(), published))
        .map(|m| m.export.cluster())
        .collect();
    let routes = draft
        .spec
        .ports
        .iter()
        .map(|port| PortRoute {
            port: port.clone(),
            clusters: exposure
                .get(&port_key(port))
                .into_iter()
                .flatten()
                .filter(|id| !unreachable.contains(id))
                .map(|&id| id.clone())
                .collect(),
        })
        .collect();
    let clusters = members.iter().map(|m| m.export.cluster().clone()).collect();
    let (conflicts, message) = conflicts(&draft, &members);
    Resolution {
        import: Some(MergedImport {
            spec: draft.spec,
            labels: draft.labels,
            annotations: draft.annotations,
            clusters,
            routes,
            source: draft.source,
        }),
        conflicts,
        message,
    }
}

/// The oldest export wins; ports are the union by precedence.
fn fresh_draft(winner: &Member<'_>, ranked: &[Member<'_>]) -> Draft {
    let tied = ranked
        .iter()
        .filter(|m| m.export.created() == winner.export.created())
        .count();
    let reason = if tied > 1 {
        WinReason::TieBreak { tied }
    } else {
        WinReason::Oldest
    };
    let facts = winner.facts;
    let spec = ServiceImportSpec {
        ports: union(ranked.iter().flat_map(|m| m.facts.ports())),
        ips: None,
        type_: winner.type_,
        session_affinity: facts.session_affinity(),
        session_affinity_config: facts.session_affinity_config().cloned(),
        ip_families: (!facts.ip_families().is_empty()).then(|| facts.ip_families().to_vec()),
        internal_traffic_policy: facts.internal_traffic_policy(),
        traffic_distribution: facts.traffic_distribution(),
        cluster_selectors: selectors_field(winner.export.cluster_selectors()),
    };
    Draft {
        spec,
        labels: winner.export.exported_labels().clone(),
        annotations: winner.export.exported_annotations().clone(),
        source: Source::Winner {
            cluster: winner.export.cluster().clone(),
            reason,
        },
    }
}

/// The previous import's properties; its ports that someone still exposes come first.
fn retained_draft(
    prev: &MergedImport,
    ranked: &[Member<'_>],
    exposure: &BTreeMap<PortKey<'_>, Vec<&ClusterId>>,
) -> Draft {
    let kept = prev
        .spec
        .ports
        .iter()
        .filter(|p| exposure.contains_key(&port_key(p)));
    let spec = ServiceImportSpec {
        ports: union(kept.chain(ranked.iter().flat_map(|m| m.facts.ports()))),
        ips: None,
        type_: prev.spec.type_,
        session_affinity: prev.spec.session_affinity,
        session_affinity_config: prev.spec.session_affinity_config.clone(),
        ip_families: prev.spec.ip_families.clone(),
        internal_traffic_policy: prev.spec.internal_traffic_policy,
        traffic_distribution: prev.spec.traffic_distribution,
        cluster_selectors: prev.spec.cluster_selectors.clone(),
    };
    Draft {
        spec,
        labels: prev.labels.clone(),
        annotations: prev.annotations.clone(),
        source: Source::Retained {
            cluster: prev.source.cluster().clone(),
        },
    }
}

/// Whether a fresh merge would publish exactly what the retained draft publishes.
fn publishes_the_same(fresh: &Draft, retained: &Draft) -> bool {
    let (a, b) = (&fresh.spec, &retained.spec);
    a.ports == b.ports
        && a.type_ == b.type_
        && a.session_affinity == b.session_affinity
        && a.session_affinity_config == b.session_affinity_config
        && a.ip_families == b.ip_families
        && a.internal_traffic_policy == b.internal_traffic_policy
        && a.traffic_distribution == b.traffic_distribution
        && a.cluster_selectors == b.cluster_selectors
        && fresh.labels == retained.labels
        && fresh.annotations == retained.annotations
}

/// `spec.clusterSelectors` of an import whose winner has these: absent when empty.
fn selectors_field(selectors: &[ClusterSelector]) -> Option<Vec<ClusterSelector>> {
    (!selectors.is_empty()).then(|| selectors.to_vec())
}

/// The union of ports in precedence order: a port whose name, or else whose (protocol,
/// port) pair, is already taken collides and is dropped, so the earlier one wins.
fn union<'a>(ports: impl Iterator<Item = &'a ServicePort>) -> Vec<ServicePort> {
    let mut names = BTreeSet::new();
    let mut pairs = BTreeSet::new();
    let mut out = Vec::new();
    for port in ports {
        let (name, protocol, number) = port_key(port);
        if names.contains(name) || pairs.contains(&(protocol, number)) {
            continue;
        }
        names.insert(name);
        pairs.insert((protocol, number));
        let mut port = port.clone();
        normalise(&mut port);
        out.push(port);
    }
    out
}

/// Counts, per field, the valid constituents that disagree with the draft, and writes the
/// shared `Conflict` message.
fn conflicts(draft: &Draft, members: &[Member<'_>]) -> (ConflictReasons, String) {
    let spec = &draft.spec;
    let published: BTreeSet<PortIdentity<'_>> = spec.ports.iter().map(port_identity).collect();
    let families = spec.ip_families.as_deref().unwrap_or_default();
    let mut tally = [0_usize; ConflictReason::ALL.len()];
    let mut count = |reason: ConflictReason, disagrees: bool| {
        if disagrees {
            tally[reason as usize] += 1;
        }
    };
    for m in members {
        let f = m.facts;
        let ports = f.ports();
        count(
            ConflictReason::PortConflict,
            ports.len() != published.len()
                || ports.iter().any(|p| !published.contains(&port_identity(p))),
        );
        count(ConflictReason::TypeConflict, m.type_ != spec.type_);
        count(
            ConflictReason::SessionAffinityConflict,
            f.session_affinity() != spec.session_affinity,
        );
        count(
            ConflictReason::SessionAffinityConfigConflict,
            f.session_affinity_config() != spec.session_affinity_config.as_ref(),
        );
        count(
            ConflictReason::AnnotationsConflict,
            m.export.exported_annotations() != &draft.annotations,
        );
        count(
            ConflictReason::LabelsConflict,
            m.export.exported_labels() != &draft.labels,
        );
        count(
            ConflictReason::InternalTrafficPolicyConflict,
            f.internal_traffic_policy() != spec.internal_traffic_policy,
        );
        count(
            ConflictReason::TrafficDistributionConflict,
            f.traffic_distribution() != spec.traffic_distribution,
        );
        count(
            ConflictReason::IpFamilyConflict,
            lacks_family(f.ip_families(), families),
        );
        count(
            ConflictReason::ClusterSelectorsConflict,
            m.export.cluster_selectors() != spec.cluster_selectors.as_deref().unwrap_or_default(),
        );
    }

    let total = members.len();
    let mut reasons = ConflictReasons::NONE;
    let mut message = String::new();
    for &reason in ConflictReason::ALL {
        let disagree = tally[reason as usize];
        if disagree == 0 {
            continue;
        }
        reasons.insert(reason);
        if !message.is_empty() {
            message.push(' ');
        }
        let source = SourcePhrase(&draft.source);
        // Writing to a String cannot fail.
        let _ = match reason {
            ConflictReason::PortConflict => write!(
                message,
                "Conflicting ports. Using the union of ports {}, taking a colliding port from {source}.",
                PortList(&spec.ports)
            ),
            _ => write!(
                message,
                "Conflicting {}. Using {} from {source}.",
                field_name(reason),
                FieldValue(reason, draft)
            ),
        };
        let _ = write!(message, " {disagree}/{total} clusters disagree.");
    }
    truncate(&mut message, MAX_MESSAGE_LEN);
    (reasons, message)
}

/// A constituent with stated families conflicts when it lacks a family the import
/// publishes: its backends would be unreachable over that family.
fn lacks_family(own: &[IpFamily], published: &[IpFamily]) -> bool {
    !own.is_empty() && published.iter().any(|f| !own.contains(f))
}

/// Whether a constituent with families `own` can take traffic of an import that publishes
/// `published`: they share a family, or either side states none (nothing to tell them
/// apart). A constituent that shares none is always in `IPFamilyConflict`.
fn shares_family(own: &[IpFamily], published: &[IpFamily]) -> bool {
    own.is_empty() || published.is_empty() || own.iter().any(|f| published.contains(f))
}

/// Name, protocol, number and appProtocol: what makes two port sets identical.
type PortIdentity<'a> = (PortKey<'a>, Option<&'a str>);

fn port_identity(port: &ServicePort) -> PortIdentity<'_> {
    (port_key(port), port.app_protocol.as_deref())
}

fn field_name(reason: ConflictReason) -> &'static str {
    match reason {
        ConflictReason::PortConflict => "ports",
        ConflictReason::TypeConflict => "type",
        ConflictReason::SessionAffinityConflict => "sessionAffinity",
        ConflictReason::SessionAffinityConfigConflict => "sessionAffinityConfig",
        ConflictReason::AnnotationsConflict => "exportedAnnotations",
        ConflictReason::LabelsConflict => "exportedLabels",
        ConflictReason::InternalTrafficPolicyConflict => "internalTrafficPolicy",
        ConflictReason::TrafficDistributionConflict => "trafficDistribution",
        ConflictReason::IpFamilyConflict => "ipFamilies",
        ConflictReason::ClusterSelectorsConflict => "clusterSelectors",
    }
}

/// The published value of the field behind `reason`, for a message.
struct FieldValue<'a>(ConflictReason, &'a Draft);

impl fmt::Display for FieldValue<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fn quoted(f: &mut fmt::Formatter<'_>, value: Option<&str>) -> fmt::Result {
            match value {
                Some(v) => write!(f, "{v:?}"),
                None => f.write_str("no value"),
            }
        }
        let spec = &self.1.spec;
        match self.0 {
            ConflictReason::PortConflict => write!(f, "{}", PortList(&spec.ports)),
            ConflictReason::TypeConflict => quoted(f, Some(spec.type_.as_str())),
            ConflictReason::SessionAffinityConflict => {
                quoted(f, spec.session_affinity.map(|v| v.as_str()))
            }
            ConflictReason::SessionAffinityConfigConflict => match &spec.session_affinity_config {
                Some(SessionAffinityConfig { client_ip: Some(c) }) => match c.timeout_seconds {
                    Some(t) => write!(f, "clientIP.timeoutSeconds={t}"),
                    None => f.write_str("clientIP without timeoutSeconds"),
                },
                Some(SessionAffinityConfig { client_ip: None }) => f.write_str("an empty config"),
                None => f.write_str("no value"),
            },
            ConflictReason::InternalTrafficPolicyConflict => {
                quoted(f, spec.internal_traffic_policy.map(|v| v.as_str()))
            }
            ConflictReason::TrafficDistributionConflict => {
                quoted(f, spec.traffic_distribution.map(|v| v.as_str()))
            }
            ConflictReason::IpFamilyConflict => {
                let families = spec.ip_families.as_deref().unwrap_or_default();
                f.write_str("[")?;
                for (i, family) in families.iter().enumerate() {
                    if i > 0 {
                        f.write_str(", ")?;
                    }
                    write!(f, "{:?}", family.as_str())?;
                }
                f.write_str("]")
            }
            ConflictReason::LabelsConflict => f.write_str("the exported labels"),
            ConflictReason::AnnotationsConflict => f.write_str("the exported annotations"),
            ConflictReason::ClusterSelectorsConflict => {
                match spec.cluster_selectors.as_deref().map_or(0, <[_]>::len) {
                    0 => f.write_str("no cluster selectors"),
                    1 => f.write_str("1 cluster selector"),
                    n => write!(f, "{n} cluster selectors"),
                }
            }
        }
    }
}

/// `[tcp(TCP/42), udp(UDP/42,h2c)]`, cut after [`LISTED_PORTS`] entries.
struct PortList<'a>(&'a [ServicePort]);

impl fmt::Display for PortList<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("[")?;
        for (i, port) in self.0.iter().take(LISTED_PORTS).enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(
                f,
                "{}({}/{}",
                port.name.as_deref().unwrap_or(""),
                port.protocol_or_default(),
                port.port
            )?;
            if let Some(app) = &port.app_protocol {
                write!(f, ",{app}")?;
            }
            f.write_str(")")?;
        }
        if self.0.len() > LISTED_PORTS {
            write!(f, ", and {} more", self.0.len() - LISTED_PORTS)?;
        }
        f.write_str("]")
    }
}

/// "oldest service export in "east"" and friends.
struct SourcePhrase<'a>(&'a Source);

impl fmt::Display for SourcePhrase<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.0 {
            Source::Winner {
                cluster,
                reason: WinReason::Oldest,
            } => {
                write!(f, "oldest service export in {:?}", cluster.as_str())
            }
            Source::Winner {
                cluster,
                reason: WinReason::TieBreak { tied },
            } => write!(
                f,
                "oldest service export in {:?} ({tied} exports share the oldest creationTimestamp; the lowest cluster id wins)",
                cluster.as_str()
            ),
            Source::Retained { cluster } => write!(
                f,
                "the current ServiceImport, kept for traffic stability after the export in {:?} went away (a fresh merge re-elects)",
                cluster.as_str()
            ),
        }
    }
}

/// Cuts `s` to at most `max` bytes on a character boundary.
fn truncate(s: &mut String, max: usize) {
    if s.len() <= max {
        return;
    }
    let mut end = max;
    while !s.is_char_boundary(end) {
        end -= 1;
    }
    s.truncate(end);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn truncate_respects_char_boundaries() {
        let mut s = "é".repeat(10);
        truncate(&mut s, 5);
        assert_eq!(s, "éé");
    }

    #[test]
    fn union_prefers_name_then_pair() {
        let p = |name: &str, port| ServicePort {
            name: Some(name.to_owned()),
            port,
            ..Default::default()
        };
        let ports = [p("a", 1), p("a", 2), p("b", 1), p("c", 3)];
        let merged = union(ports.iter());
        let names: Vec<_> = merged.iter().map(|p| p.name.as_deref().unwrap()).collect();
        assert_eq!(names, ["a", "c"]);
    }
}
