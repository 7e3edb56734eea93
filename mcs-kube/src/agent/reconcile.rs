//! The decision: from the merge outcome and what the agent observes in its own cluster, the
//! writes for one service. Pure: no I/O, time passed in.

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use mcs_core::ClusterId;
use mcs_core::api::{
    ANNOTATION_DERIVED_SERVICE, ClusterSelectorResult, EndpointSliceObjects, IpFamily,
    ServiceImportStatus, ServiceImportType, ServicePort,
    v1beta1::{ServiceExport, ServiceImport},
};
use mcs_core::conditions::{
    ConditionStatus, ConflictReasons, DesiredCondition, ExportConditionType, ExportReadyReason,
    ImportConditionType, ImportReadyReason, ValidReason, upsert,
};
use mcs_core::merge::{MergeOutcome, MergedImport};
use mcs_core::name::ServiceRef;
use mcs_core::selection::{self, Properties};
use mcs_core::slices::endpoints_of;

use super::desired::{self, LABEL_MANAGED_BY, MANAGED_BY};

/// What the agent sees of its own objects for one service.
#[derive(Debug, Default)]
pub(crate) struct Observed<'a> {
    /// The ServiceImport, if any.
    pub import: Option<&'a ServiceImport>,
    /// Derived Services the agent wrote for this service.
    pub derived: Vec<&'a Service>,
    /// Imported EndpointSlices the agent wrote for this service.
    pub imported: Vec<&'a EndpointSlice>,
    /// The local ServiceExport, if any.
    pub export: Option<&'a ServiceExport>,
}

/// Where the local export stands in being published to the other members.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Publication {
    /// Mesh: the other members read it from this cluster directly.
    Direct,
    /// Hub: the record on the hub says what this cluster exports.
    Published,
    /// Hub: the record is not written yet.
    Pending,
    /// Hub: the record cannot be written, the hub is unreachable.
    HubUnreachable,
}

/// Everything the planner needs about one service.
#[derive(Debug)]
pub(crate) struct ServiceInputs<'a> {
    /// The service.
    pub service: ServiceRef,
    /// The agent's cluster.
    pub local: ClusterId,
    /// Whether the namespace exists in the agent's cluster.
    pub namespace_exists: bool,
    /// Whether that namespace is being deleted (`deletionTimestamp` set, phase
    /// `Terminating`): nothing is written into it.
    pub namespace_terminating: bool,
    /// Whether the namespace may be exported (allow-list).
    pub namespace_allowed: bool,
    /// The merge outcome (None: no export anywhere).
    pub outcome: Option<MergeOutcome>,
    /// Each reachable member's own slices of the service.
    pub sources: HashMap<ClusterId, Vec<&'a EndpointSlice>>,
    /// Exporting members that are unreachable: `(cluster, removed after the grace period)`.
    pub unreachable: Vec<(ClusterId, bool)>,
    /// The unreachable grace period.
    pub grace: Duration,
    /// The agent's own objects.
    pub observed: Observed<'a>,
    /// Why the local exported Service cannot be merged, if it cannot.
    pub local_service_error: Option<String>,
    /// The hub is unreachable: imports are as last known (hub topology).
    pub hub_unreachable: bool,
    /// Whether the local export has reached the other members.
    pub publication: Publication,
    /// The `ClusterProperty` values of this cluster and of the members, for cluster
    /// selection (KEP-5939); `None` while the agent does not know this cluster's (or
    /// cluster selection is off), and then the import's `status.clusterSelectorResults`
    /// is left as it is.
    pub properties: Option<ClusterProperties<'a>>,
}

/// What the agent knows of the members' `ClusterProperty` values.
#[derive(Clone, Debug)]
pub(crate) struct ClusterProperties<'a> {
    /// This (the importing) cluster's.
    pub local: &'a Properties,
    /// The members whose properties are known, by cluster id (a member without any
    /// has an empty map here; one missing is not known).
    pub members: BTreeMap<ClusterId, &'a Properties>,
}

/// The writes for one service, in order.
#[derive(Debug, Default)]
pub(crate) struct Plan {
    /// Apply this ServiceImport (metadata and spec; `spec.ips` from the derived Service).
    pub import: Option<ServiceImport>,
    /// Apply the derived Service with these ports (ClusterSetIP only).
    pub derived_ports: Option<Vec<ServicePort>>,
    /// The status to write on the ServiceImport (after it exists), when it changes.
    pub import_status: Option<ServiceImportStatus>,
    /// The import has cluster selectors (KEP-5939): the status written carries
    /// `observedGeneration`, the import's generation after this plan's writes to its spec.
    pub observe_generation: bool,
    /// The status written removes `clusterSelectorResults` and `observedGeneration` (the
    /// import has no selectors any more): a merge patch leaves out a field that is `None`,
    /// which keeps it.
    pub clear_selection_status: bool,
    /// Imported slices to apply.
    pub apply_slices: Vec<EndpointSlice>,
    /// Imported slices to delete (names).
    pub delete_slices: Vec<String>,
    /// Delete the ServiceImport (and the derived Services, listed by name).
    pub delete_import: bool,
    /// Derived Services to delete.
    pub delete_derived: Vec<String>,
    /// The full condition list of the local ServiceExport, when it changes.
    pub export_conditions: Option<Vec<Condition>>,
    /// A ServiceImport exists that the agent did not create: nothing is written for it.
    pub foreign_import: bool,
}

/// Computes the writes for one service. `wall` is the current time for new conditions.
pub(crate) fn plan(inputs: &ServiceInputs<'_>) -> Plan {
    plan_at(inputs, &Time(k8s_openapi::jiff::Timestamp::now()))
}

/// [`plan`] with the time passed in.
pub(crate) fn plan_at(inputs: &ServiceInputs<'_>, wall: &Time) -> Plan {
    if inputs.namespace_terminating {
        // The API server refuses new objects there, and the namespace controller removes
        // the agent's objects with everything else: an expected state with nothing to do.
        return Plan::default();
    }
    let mut plan = Plan {
        export_conditions: export_conditions(inputs, wall),
        ..Plan::default()
    };
    let ns = inputs.service.namespace.as_str();
    let name = inputs.service.name.as_str();
    if let Some(existing) = inputs.observed.import
        && !is_ours(existing.metadata.labels.as_ref())
    {
        plan.foreign_import = true;
        return plan;
    }
    let import = inputs.outcome.as_ref().and_then(|o| o.import.as_ref());
    let Some(merged) = import.filter(|_| inputs.namespace_exists && inputs.namespace_allowed)
    else {
        // No import here: remove whatever the agent wrote for this service.
        plan.delete_import = inputs.observed.import.is_some();
        plan.delete_derived = inputs
            .observed
            .derived
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        plan.delete_slices = inputs
            .observed
            .imported
            .iter()
            .filter_map(|s| s.metadata.name.clone())
            .collect();
        return plan;
    };

    let clusterset_ip = merged.spec.type_ == ServiceImportType::ClusterSetIp;
    let derived_name = desired::derived_service_name(ns, name);
    let observed_derived = inputs
        .observed
        .derived
        .iter()
        .find(|s| s.metadata.name.as_deref() == Some(derived_name.as_str()));

    // The ServiceImport: the merged spec; IPs and families from the derived Service.
    let mut want = merged.to_service_import(&inputs.service);
    want.status = None;
    let labels = want.metadata.labels.get_or_insert_with(BTreeMap::new);
    labels.insert(LABEL_MANAGED_BY.to_owned(), MANAGED_BY.to_owned());
    if clusterset_ip {
        want.metadata
            .annotations
            .get_or_insert_with(BTreeMap::new)
            .insert(ANNOTATION_DERIVED_SERVICE.to_owned(), derived_name.clone());
        let (ips, families) = match observed_derived {
            Some(derived) => derived_ips(derived),
            // The derived Service is not in the agent's cache: a watch still relisting
            // (after an API server restart), or the Service was deleted. Keep the IPs the
            // import carries rather than withdraw them for a moment: the writer applies the
            // derived Service below and copies its IPs in, so a real change still lands.
            None => inputs
                .observed
                .import
                .map(|have| {
                    (
                        have.spec.ips.clone().unwrap_or_default(),
                        have.spec.ip_families.clone().unwrap_or_default(),
                    )
                })
                .unwrap_or_default(),
        };
        want.spec.ips = (!ips.is_empty()).then_some(ips);
        if !families.is_empty() {
            want.spec.ip_families = Some(families);
        }
    } else {
        want.spec.ips = None;
    }
    if inputs
        .observed
        .import
        .is_none_or(|have| !import_matches(have, &want))
    {
        plan.import = Some(want);
    }
    if clusterset_ip {
        let ports = merged.spec.ports.clone();
        let derived_ok = observed_derived.is_some_and(|s| derived_matches(s, &ports));
        if !derived_ok || plan.import.is_some() {
            plan.derived_ports = Some(ports);
        }
    }
    plan.delete_derived = inputs
        .observed
        .derived
        .iter()
        .filter_map(|s| s.metadata.name.clone())
        .filter(|n| !clusterset_ip || *n != derived_name)
        .collect();

    // Imported slices: one set per exporting cluster, only for the ports routed there.
    let derived_label = clusterset_ip.then_some(derived_name.as_str());
    let mut wanted_slices = Vec::new();
    for cluster in &merged.clusters {
        let Some(sources) = inputs.sources.get(cluster) else {
            continue;
        };
        let ports = routed_ports(merged, cluster);
        let owned: Vec<EndpointSlice> = sources.iter().map(|s| (*s).clone()).collect();
        wanted_slices.extend(desired::imported_slices(
            ns,
            name,
            derived_label,
            cluster,
            &owned,
            &ports,
        ));
    }
    let observed: BTreeMap<&str, &EndpointSlice> = inputs
        .observed
        .imported
        .iter()
        .filter_map(|s| Some((s.metadata.name.as_deref()?, *s)))
        .collect();
    for slice in &wanted_slices {
        let name = slice.metadata.name.as_deref().unwrap_or_default();
        if observed
            .get(name)
            .is_none_or(|have| !slice_matches(have, slice))
        {
            plan.apply_slices.push(slice.clone());
        }
    }
    let wanted_names: Vec<&str> = wanted_slices
        .iter()
        .filter_map(|s| s.metadata.name.as_deref())
        .collect();
    plan.delete_slices = observed
        .keys()
        .filter(|n| !wanted_names.contains(n))
        .map(|n| (*n).to_owned())
        .collect();

    // The status: exporting clusters, Ready, endpointSliceObjects.
    let eso = if wanted_slices.is_empty() {
        EndpointSliceObjects::Absent
    } else {
        EndpointSliceObjects::Present
    };
    let ready = import_ready(
        inputs,
        merged,
        clusterset_ip,
        want_has_ips(
            &plan,
            inputs.observed.import,
            clusterset_ip,
            observed_derived,
        ),
    );
    let have = inputs
        .observed
        .import
        .and_then(|i| i.status.clone())
        .unwrap_or_default();
    let mut conditions = have.conditions.clone().unwrap_or_default();
    let changed_condition = upsert(&mut conditions, &ready, None, wall);
    // With cluster selectors, `observedGeneration` says which spec the results are for:
    // the generation read, or (when this plan writes the spec) the one the write makes,
    // which the writer fills in.
    let selecting = merged
        .spec
        .cluster_selectors
        .as_ref()
        .is_some_and(|s| !s.is_empty());
    let observed_generation = inputs
        .observed
        .import
        .and_then(|i| i.metadata.generation)
        .filter(|_| selecting);
    let status = ServiceImportStatus {
        clusters: merged.status().clusters,
        conditions: Some(conditions),
        endpoint_slice_objects: Some(eso),
        cluster_selector_results: selector_results(inputs, merged, &have),
        observed_generation,
    };
    let clear_selection_status = !selecting
        && (have.cluster_selector_results.is_some() || have.observed_generation.is_some());
    if changed_condition
        || have.clusters != status.clusters
        || have.endpoint_slice_objects != status.endpoint_slice_objects
        || have.cluster_selector_results != status.cluster_selector_results
        || have.observed_generation != status.observed_generation
        || clear_selection_status
        || plan.import.is_some() && (inputs.observed.import.is_none() || selecting)
    {
        plan.observe_generation = selecting;
        plan.clear_selection_status = clear_selection_status;
        plan.import_status = Some(status);
    }
    plan
}

/// `status.clusterSelectorResults` for this cluster (KEP-5939): the import's selectors
/// evaluated with this cluster as the importer, over the import's source clusters. None
/// when the import has no selectors. Left as it is while the properties of this cluster or
/// of a source cluster are not known, and when the selectors do not evaluate (the KEP asks
/// for the previous complete results, never a partial update; the exports' `Valid`
/// conditions say what is wrong).
fn selector_results(
    inputs: &ServiceInputs<'_>,
    merged: &MergedImport,
    have: &ServiceImportStatus,
) -> Option<Vec<ClusterSelectorResult>> {
    let selectors = merged.spec.cluster_selectors.as_deref().unwrap_or_default();
    if selectors.is_empty() {
        return None;
    }
    let Some(properties) = &inputs.properties else {
        return have.cluster_selector_results.clone();
    };
    let mut sources: BTreeMap<ClusterId, Properties> = BTreeMap::new();
    for c in &merged.clusters {
        let Some(own) = properties.members.get(c) else {
            tracing::debug!(service = %inputs.service, cluster = %c, "a source cluster's properties are not known yet; keeping the previous selector results");
            return have.cluster_selector_results.clone();
        };
        sources.insert(c.clone(), (*own).clone());
    }
    match selection::evaluate(selectors, properties.local, &sources) {
        Ok(results) => Some(
            results
                .iter()
                .map(|clusters| ClusterSelectorResult::from(&clusters[..]))
                .collect(),
        ),
        Err(e) => {
            tracing::warn!(service = %inputs.service, error = %e, "cluster selectors do not evaluate; keeping the previous results");
            have.cluster_selector_results.clone()
        }
    }
}

fn want_has_ips(
    plan: &Plan,
    observed: Option<&ServiceImport>,
    clusterset_ip: bool,
    derived: Option<&&Service>,
) -> bool {
    if !clusterset_ip {
        return true;
    }
    let from_plan = plan
        .import
        .as_ref()
        .and_then(|i| i.spec.ips.as_ref())
        .is_some_and(|v| !v.is_empty());
    let from_observed = observed
        .and_then(|i| i.spec.ips.as_ref())
        .is_some_and(|v| !v.is_empty());
    from_plan || from_observed || derived.is_some_and(|d| !derived_ips(d).0.is_empty())
}

fn import_ready(
    inputs: &ServiceInputs<'_>,
    merged: &MergedImport,
    clusterset_ip: bool,
    has_ips: bool,
) -> DesiredCondition {
    let ready = ImportConditionType::Ready.as_str();
    if !has_ips {
        return DesiredCondition::new(
            ready,
            ConditionStatus::False,
            ImportReadyReason::Pending.as_str(),
            "waiting for the derived Service to be allocated a cluster IP",
        );
    }
    let _ = (merged, clusterset_ip);
    let mut notes = Vec::new();
    if inputs.hub_unreachable {
        notes.push(
            "the hub is unreachable; the endpoints are as last known and nothing is removed until it answers"
                .to_owned(),
        );
    }
    for (cluster, removed) in &inputs.unreachable {
        if *removed {
            notes.push(format!(
                "cluster {cluster} is unreachable for longer than {}s; its endpoints were removed",
                inputs.grace.as_secs()
            ));
        } else {
            notes.push(format!(
                "cluster {cluster} is unreachable; its endpoints are kept for up to {}s",
                inputs.grace.as_secs()
            ));
        }
    }
    DesiredCondition::new(
        ready,
        ConditionStatus::True,
        ImportReadyReason::Ready.as_str(),
        notes.join("; "),
    )
}

fn export_conditions(inputs: &ServiceInputs<'_>, wall: &Time) -> Option<Vec<Condition>> {
    let export = inputs.observed.export?;
    let generation = export.metadata.generation;
    let valid_t = ExportConditionType::Valid.as_str();
    let ready_t = ExportConditionType::Ready.as_str();
    let merged = inputs
        .outcome
        .as_ref()
        .and_then(|o| o.exports.get(&inputs.local));
    let (valid, conflict) = if !inputs.namespace_allowed {
        (
            DesiredCondition::new(
                valid_t,
                ConditionStatus::False,
                "NamespaceNotAllowed",
                format!(
                    "namespace {} is not in the agent's list of exportable namespaces",
                    inputs.service.namespace
                ),
            ),
            no_conflicts("the export takes no part in the merge"),
        )
    } else if let Some(error) = &inputs.local_service_error {
        (
            DesiredCondition::new(
                valid_t,
                ConditionStatus::False,
                ValidReason::InvalidServiceType.as_str(),
                error.clone(),
            ),
            no_conflicts("the export takes no part in the merge"),
        )
    } else if let Some(c) = merged {
        (c.valid.clone(), c.conflict.clone())
    } else {
        // Not in the merge yet (e.g. no creationTimestamp): leave the conditions alone.
        return None;
    };
    let ready = if valid.status == ConditionStatus::True {
        match inputs.publication {
            Publication::Direct => DesiredCondition::new(
                ready_t,
                ConditionStatus::True,
                ExportReadyReason::Ready.as_str(),
                "the service is exported to the ClusterSet",
            ),
            Publication::Published => DesiredCondition::new(
                ready_t,
                ConditionStatus::True,
                ExportReadyReason::Exported.as_str(),
                "the service is published to the ClusterSet's hub",
            ),
            Publication::Pending => DesiredCondition::new(
                ready_t,
                ConditionStatus::False,
                ExportReadyReason::Pending.as_str(),
                "publishing the export to the ClusterSet's hub",
            ),
            Publication::HubUnreachable => DesiredCondition::new(
                ready_t,
                ConditionStatus::False,
                ExportReadyReason::Pending.as_str(),
                "the ClusterSet's hub is unreachable; the export is published when it answers",
            ),
        }
    } else {
        DesiredCondition::new(
            ready_t,
            ConditionStatus::False,
            ExportReadyReason::Failed.as_str(),
            format!("not exported: {}", valid.message),
        )
    };
    let mut list = export
        .status
        .as_ref()
        .and_then(|s| s.conditions.clone())
        .unwrap_or_default();
    let mut changed = false;
    for c in [&valid, &ready, &conflict] {
        changed |= upsert(&mut list, c, generation, wall);
    }
    changed.then_some(list)
}

fn no_conflicts(message: &str) -> DesiredCondition {
    DesiredCondition::new(
        ExportConditionType::Conflict.as_str(),
        ConditionStatus::False,
        ConflictReasons::NONE.to_string(),
        message,
    )
}

fn routed_ports(merged: &MergedImport, cluster: &ClusterId) -> Vec<ServicePort> {
    merged
        .routes
        .iter()
        .filter(|r| r.clusters.contains(cluster))
        .map(|r| r.port.clone())
        .collect()
}

fn is_ours(labels: Option<&BTreeMap<String, String>>) -> bool {
    labels
        .and_then(|l| l.get(LABEL_MANAGED_BY))
        .is_some_and(|v| v == MANAGED_BY)
}

/// The derived Service's allocated IPs and families, in family order.
pub(super) fn derived_ips(service: &Service) -> (Vec<String>, Vec<IpFamily>) {
    let Some(spec) = service.spec.as_ref() else {
        return (Vec::new(), Vec::new());
    };
    let ips: Vec<String> = spec
        .cluster_ips
        .clone()
        .unwrap_or_default()
        .into_iter()
        .filter(|ip| ip != "None")
        .take(2)
        .collect();
    let families: Vec<IpFamily> = spec
        .ip_families
        .clone()
        .unwrap_or_default()
        .iter()
        .filter_map(|f| IpFamily::parse(f))
        .take(ips.len())
        .collect();
    if families.len() != ips.len() {
        return (Vec::new(), Vec::new());
    }
    (ips, families)
}

fn import_matches(have: &ServiceImport, want: &ServiceImport) -> bool {
    have.spec == want.spec
        && same_map(&have.metadata.labels, &want.metadata.labels)
        && same_map(&have.metadata.annotations, &want.metadata.annotations)
}

/// Labels or annotations equal, absent and empty alike. Exact, not "contains": a key the
/// agent applied earlier and no longer wants (an exported label dropped by the winning
/// export, the derived-Service annotation of an import turned Headless) must trigger an
/// apply, which removes it. Keys another manager added only cost a no-op apply.
fn same_map(
    have: &Option<BTreeMap<String, String>>,
    want: &Option<BTreeMap<String, String>>,
) -> bool {
    let empty = BTreeMap::new();
    have.as_ref().unwrap_or(&empty) == want.as_ref().unwrap_or(&empty)
}

fn derived_matches(have: &Service, ports: &[ServicePort]) -> bool {
    let Some(spec) = have.spec.as_ref() else {
        return false;
    };
    let have_ports = spec.ports.as_deref().unwrap_or_default();
    have_ports.len() == ports.len()
        && have_ports.iter().zip(ports).all(|(h, w)| {
            h.name == w.name
                && h.port == w.port
                && h.protocol.as_deref().unwrap_or("TCP") == w.protocol_or_default().as_str()
                && h.app_protocol == w.app_protocol
        })
}

fn slice_matches(have: &EndpointSlice, want: &EndpointSlice) -> bool {
    // Exact labels: the derived Service's `kubernetes.io/service-name` must go when the
    // import turns Headless.
    same_map(&have.metadata.labels, &want.metadata.labels)
        && have.address_type == want.address_type
        && have.ports == want.ports
        && endpoints_match(have, want)
}

fn endpoints_match(have: &EndpointSlice, want: &EndpointSlice) -> bool {
    // The API server fills defaults (conditions) only when absent; compare what we set.
    let (have, want) = (endpoints_of(have), endpoints_of(want));
    have.len() == want.len()
        && have.iter().zip(want).all(|(h, w)| {
            h.addresses == w.addresses
                && h.hostname == w.hostname
                && h.zone == w.zone
                && h.conditions == w.conditions
        })
}

#[cfg(test)]
mod tests {
    use k8s_openapi::jiff::Timestamp;
    use mcs_core::merge::{Constituent, ServiceFacts, ServiceKind, Stability, merge};

    use super::*;

    fn inputs<'a>(outcome: MergeOutcome, observed: Observed<'a>) -> ServiceInputs<'a> {
        ServiceInputs {
            service: ServiceRef::new("demo", "hello").unwrap(),
            local: "north".parse().unwrap(),
            namespace_exists: true,
            namespace_terminating: false,
            namespace_allowed: true,
            outcome: Some(outcome),
            sources: HashMap::new(),
            unreachable: Vec::new(),
            grace: Duration::from_secs(60),
            observed,
            local_service_error: None,
            hub_unreachable: false,
            publication: Publication::Direct,
            properties: None,
        }
    }

    fn outcome() -> MergeOutcome {
        let port = ServicePort {
            name: Some("tcp".into()),
            port: 42,
            ..Default::default()
        };
        let facts = ServiceFacts::builder(ServiceKind::ClusterSetIp)
            .port(port)
            .build()
            .unwrap();
        let east = Constituent::new(
            "east".parse().unwrap(),
            Timestamp::from_second(10).unwrap(),
            Some(facts),
        );
        merge(
            &ServiceRef::new("demo", "hello").unwrap(),
            &[east],
            Stability::Fresh,
            None,
        )
        .unwrap()
    }

    /// East (region eu) and west (region us) export with KEP-5939's "my cluster, then my
    /// region" selectors.
    fn outcome_with_selectors() -> MergeOutcome {
        let selectors: Vec<mcs_core::api::ClusterSelector> = serde_json::from_str(
            r#"[{"propertySelector": {"matchExpressions": [{"key": "cluster.clusterset.k8s.io", "operator": "In", "values": ["@SameAsImporter@"]}]}},
                {"propertySelector": {"matchProperties": {"region": "@SameAsImporter@"}}}]"#,
        )
        .unwrap();
        let facts = || {
            ServiceFacts::builder(ServiceKind::ClusterSetIp)
                .port(ServicePort {
                    name: Some("tcp".into()),
                    port: 42,
                    ..Default::default()
                })
                .build()
                .unwrap()
        };
        let export = |cluster: &str, at: i64| {
            Constituent::new(
                cluster.parse().unwrap(),
                Timestamp::from_second(at).unwrap(),
                Some(facts()),
            )
            .with_cluster_selectors(selectors.clone())
        };
        merge(
            &ServiceRef::new("demo", "hello").unwrap(),
            &[export("east", 10), export("west", 20)],
            Stability::Fresh,
            None,
        )
        .unwrap()
    }

    fn props(pairs: &[(&str, &str)]) -> Properties {
        pairs
            .iter()
            .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
            .collect()
    }

    /// With the members' properties known, the import's status holds this cluster's
    /// results, in selector order; without them (this cluster's, or one source
    /// cluster's), the results already there stay; the status says which generation it
    /// saw; an import without selectors has neither, and loses those it had.
    #[test]
    fn the_import_status_holds_this_clusters_selector_results() {
        let members: BTreeMap<ClusterId, Properties> = BTreeMap::from([
            (
                "east".parse().unwrap(),
                props(&[("cluster.clusterset.k8s.io", "east"), ("region", "eu")]),
            ),
            (
                "west".parse().unwrap(),
                props(&[("cluster.clusterset.k8s.io", "west"), ("region", "us")]),
            ),
        ]);
        let north = props(&[("cluster.clusterset.k8s.io", "north"), ("region", "eu")]);
        let mut with = inputs(outcome_with_selectors(), Observed::default());
        with.properties = Some(ClusterProperties {
            local: &north,
            members: members.iter().map(|(id, p)| (id.clone(), p)).collect(),
        });
        let status = plan(&with)
            .import_status
            .expect("a new import gets a status");
        let results = status.cluster_selector_results.expect("results");
        let clusters: Vec<Vec<String>> = results.into_iter().map(|r| r.clusters).collect();
        assert_eq!(clusters, [vec![], vec!["east".to_string()]]);

        // Properties not known: what the import has stays.
        let mut have = plan(&with).import.unwrap();
        have.metadata.generation = Some(3);
        have.status = Some(ServiceImportStatus {
            cluster_selector_results: Some(vec![ClusterSelectorResult {
                clusters: vec!["west".into()],
            }]),
            ..Default::default()
        });
        let unknown = inputs(
            outcome_with_selectors(),
            Observed {
                import: Some(&have),
                ..Default::default()
            },
        );
        // (`have` has no Ready condition yet, so the status is written.)
        let kept = plan(&unknown);
        assert!(kept.import.is_none(), "the spec is as wanted");
        assert!(kept.observe_generation);
        let kept = kept.import_status.expect("the status is written");
        assert_eq!(
            kept.cluster_selector_results,
            have.status.as_ref().unwrap().cluster_selector_results
        );
        assert_eq!(kept.observed_generation, Some(3), "the generation read");
        // West's properties not known: the same.
        let mut west_unknown = inputs(
            outcome_with_selectors(),
            Observed {
                import: Some(&have),
                ..Default::default()
            },
        );
        west_unknown.properties = Some(ClusterProperties {
            local: &north,
            members: members
                .iter()
                .filter(|(id, _)| id.as_str() != "west")
                .map(|(id, p)| (id.clone(), p))
                .collect(),
        });
        let kept = plan(&west_unknown)
            .import_status
            .expect("the status is written");
        assert_eq!(
            kept.cluster_selector_results,
            have.status.as_ref().unwrap().cluster_selector_results
        );

        // No selectors: no results.
        let none = plan(&inputs(outcome(), Observed::default()));
        assert_eq!(none.import_status.unwrap().cluster_selector_results, None);
        assert!(!none.clear_selection_status, "nothing to remove");
        assert!(!none.observe_generation);

        // The selectors go: the results written before are removed.
        let gone = plan(&inputs(
            outcome(),
            Observed {
                import: Some(&have),
                ..Default::default()
            },
        ));
        assert_eq!(
            gone.import_status
                .expect("the status changes")
                .cluster_selector_results,
            None
        );
        assert!(gone.clear_selection_status);
        assert!(!gone.observe_generation);
    }

    /// A ClusterSetIP import whose derived Service the agent's cache does not hold (a
    /// watch relisting after an API server restart) keeps its IPs: the plan re-applies the
    /// derived Service, it does not withdraw the VIP that DNS and kube-proxy serve.
    #[test]
    fn an_import_keeps_its_ips_while_the_derived_service_is_not_in_the_cache() {
        let first = plan(&inputs(outcome(), Observed::default()));
        let mut have = first.import.expect("a new import is applied");
        assert_eq!(have.spec.ips, None, "no derived Service yet, no IP to copy");
        have.spec.ips = Some(vec!["10.96.0.10".into()]);
        have.spec.ip_families = Some(vec![IpFamily::IPv4]);

        let again = plan(&inputs(
            outcome(),
            Observed {
                import: Some(&have),
                ..Default::default()
            },
        ));
        if let Some(import) = &again.import {
            assert_eq!(
                import.spec.ips, have.spec.ips,
                "the import's IPs were withdrawn"
            );
        }
        assert!(
            again.derived_ports.is_some(),
            "the derived Service missing from the cache is applied again"
        );
    }
}
