//! `kubectl mcs status`: where each multi-cluster service went and why it is (not)
//! reachable, built by a pure function from what was read from every member
//! ([`MemberSnapshot`]) into one serialisable report ([`StatusReport`]), printed as a table,
//! JSON or YAML.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta};
use k8s_openapi::jiff::Timestamp;
use mcs_core::api::v1beta1::{ServiceExport, ServiceImport};
use mcs_core::api::{LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER};
use mcs_core::cidr::{ClusterRanges, Overlap};
use serde::{Deserialize, Serialize};

use crate::table::Table;

/// What was read from one member.
#[derive(Clone, Debug, Default)]
pub struct MemberSnapshot {
    /// The kubeconfig context.
    pub context: String,
    /// The member's cluster id (its ClusterProperty), or the context name when it has none.
    pub cluster: String,
    /// Why the member could not be read, if it could not.
    pub error: Option<String>,
    /// Its ServiceExports.
    pub exports: Vec<ServiceExport>,
    /// The Services its ServiceExports name (those that exist).
    pub services: Vec<Service>,
    /// The EndpointSlices of those Services (their own, not imported ones).
    pub slices: Vec<EndpointSlice>,
    /// Its ServiceImports.
    pub imports: Vec<ServiceImport>,
    /// Its imported EndpointSlices (labelled `multicluster.kubernetes.io/service-name`).
    pub imported: Vec<EndpointSlice>,
    /// Its pod and service ranges (empty when unknown).
    pub ranges: ClusterRanges,
}

/// The whole answer of `kubectl mcs status`.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct StatusReport {
    /// Every member asked.
    pub clusters: Vec<ClusterEntry>,
    /// Every service exported or imported somewhere (or the one asked for).
    pub services: Vec<ServiceStatus>,
    /// Problems of the ClusterSet as a whole (overlapping ranges).
    pub warnings: Vec<String>,
}

/// One member as `status` reached it.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ClusterEntry {
    /// The kubeconfig context.
    pub context: String,
    /// The cluster id.
    pub cluster: String,
    /// Why it could not be read.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<String>,
}

/// One multi-cluster service across the ClusterSet.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ServiceStatus {
    /// Its namespace.
    pub namespace: String,
    /// Its name.
    pub name: String,
    /// One per exporting cluster.
    pub exports: Vec<ExportStatus>,
    /// One per member that has a ServiceImport of it.
    pub imports: Vec<ImportStatus>,
    /// What is wrong, one sentence each (empty when nothing is).
    pub problems: Vec<String>,
}

/// One cluster's export of a service.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ExportStatus {
    /// The exporting cluster.
    pub cluster: String,
    /// Whether the Service it exports exists.
    pub service_exists: bool,
    /// Its `Valid` condition.
    pub valid: Option<ConditionView>,
    /// Its `Ready` condition.
    pub ready: Option<ConditionView>,
    /// Its `Conflict` condition.
    pub conflict: Option<ConditionView>,
    /// The Service's own endpoints in the exporting cluster.
    pub endpoints: EndpointCounts,
}

/// A condition as shown.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ConditionView {
    /// `True`, `False` or `Unknown`.
    pub status: String,
    /// The reason (comma-joined reasons for several conflicts).
    pub reason: String,
    /// The message.
    pub message: String,
    /// Seconds since it last changed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<i64>,
}

/// Endpoints by condition.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct EndpointCounts {
    /// `ready` (an unset condition counts as ready, as Kubernetes consumers read it).
    pub ready: u32,
    /// `serving` (unset: as `ready`).
    pub serving: u32,
    /// `terminating`.
    pub terminating: u32,
}

/// One member's ServiceImport of a service.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct ImportStatus {
    /// The importing cluster.
    pub cluster: String,
    /// `ClusterSetIP` or `Headless`.
    #[serde(rename = "type")]
    pub type_: String,
    /// `spec.ips`.
    pub ips: Vec<String>,
    /// `spec.ports`, as `name:port/protocol`.
    pub ports: Vec<String>,
    /// `status.clusters`.
    pub clusters: Vec<String>,
    /// Its `Ready` condition.
    pub ready: Option<ConditionView>,
    /// The endpoints it has of each source cluster.
    pub sources: Vec<SourceView>,
}

/// What an importing cluster has of one source cluster's endpoints.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
pub struct SourceView {
    /// The source cluster.
    pub cluster: String,
    /// The endpoints as the importing cluster has them.
    pub endpoints: EndpointCounts,
    /// Whether they are the source's own endpoints (addresses and conditions); `None` when
    /// the source could not be read.
    pub in_sync: Option<bool>,
    /// Seconds since the importing cluster's agent last wrote them.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub age_seconds: Option<i64>,
    /// Imported addresses inside the importing cluster's own pod or service ranges
    /// (traffic to them would stay in the importing cluster), with the range.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub local_addresses: Vec<String>,
}

impl StatusReport {
    /// Whether anything is wrong: an unreachable member, a service problem, a warning.
    pub fn has_problems(&self) -> bool {
        self.clusters.iter().any(|c| c.error.is_some())
            || self.services.iter().any(|s| !s.problems.is_empty())
            || !self.warnings.is_empty()
    }

    /// The report as tables at most `width` columns wide.
    pub fn render_table(&self, width: usize) -> String {
        let mut out = String::new();
        let mut clusters = Table::new(["CONTEXT", "CLUSTER", "STATE"]);
        for c in &self.clusters {
            let state = c
                .error
                .as_deref()
                .map_or("reachable".to_owned(), |e| format!("unreachable: {e}"));
            clusters.row([c.context.clone(), c.cluster.clone(), state]);
        }
        out.push_str(&clusters.render(width));
        for w in &self.warnings {
            out.push_str(&crate::table::bullet(&format!("WARNING: {w}"), width));
        }
        if self.services.is_empty() {
            out.push_str("\nNo multi-cluster services.\n");
        }
        for s in &self.services {
            let _ = writeln!(out, "\nSERVICE {}/{}", s.namespace, s.name);
            let mut exports = Table::new([
                "EXPORTED BY",
                "VALID",
                "READY",
                "CONFLICT",
                "ENDPOINTS R/S/T",
            ]);
            for e in &s.exports {
                exports.row([
                    e.cluster.clone(),
                    short(e.valid.as_ref()),
                    short(e.ready.as_ref()),
                    short(e.conflict.as_ref()),
                    e.endpoints.to_string(),
                ]);
            }
            if !exports.is_empty() {
                out.push_str(&exports.render(width));
            }
            let mut imports =
                Table::new(["IMPORTED BY", "TYPE", "IPS", "PORTS", "CLUSTERS", "READY"]);
            for i in &s.imports {
                imports.row([
                    i.cluster.clone(),
                    i.type_.clone(),
                    list(&i.ips),
                    list(&i.ports),
                    list(&i.clusters),
                    short(i.ready.as_ref()),
                ]);
            }
            if !imports.is_empty() {
                out.push('\n');
                out.push_str(&imports.render(width));
            }
            let mut views = Table::new(["IMPORTED BY", "FROM", "R/S/T", "VIEW"]);
            for i in &s.imports {
                for v in &i.sources {
                    let mut view = match v.in_sync {
                        Some(true) => "in sync".to_owned(),
                        Some(false) => "out of date".to_owned(),
                        None => "source unknown".to_owned(),
                    };
                    if let Some(age) = v.age_seconds {
                        let _ = write!(view, ", written {} ago", for_human(age));
                    }
                    if !v.local_addresses.is_empty() {
                        let _ = write!(view, ", LOCAL: {}", v.local_addresses.join(", "));
                    }
                    views.row([
                        i.cluster.clone(),
                        v.cluster.clone(),
                        v.endpoints.to_string(),
                        view,
                    ]);
                }
            }
            if !views.is_empty() {
                out.push('\n');
                out.push_str(&views.render(width));
            }
            if !s.problems.is_empty() {
                out.push_str("\nPROBLEMS\n");
                for p in &s.problems {
                    out.push_str(&crate::table::bullet(p, width));
                }
            }
        }
        out
    }
}

impl std::fmt::Display for EndpointCounts {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}/{}/{}", self.ready, self.serving, self.terminating)
    }
}

/// Builds the report from every member's snapshot at `now`; `only` restricts it to one
/// service (`namespace`, `name`). `overlaps` are the members' overlapping ranges (by
/// context).
pub fn build(
    members: &[MemberSnapshot],
    only: Option<(&str, &str)>,
    overlaps: &[Overlap<String>],
    now: Timestamp,
) -> StatusReport {
    let clusters = members
        .iter()
        .map(|m| ClusterEntry {
            context: m.context.clone(),
            cluster: m.cluster.clone(),
            error: m.error.clone(),
        })
        .collect();
    let mut keys: BTreeSet<(String, String)> = BTreeSet::new();
    for m in members {
        keys.extend(m.exports.iter().filter_map(|e| key(&e.metadata)));
        keys.extend(m.imports.iter().filter_map(|i| key(&i.metadata)));
    }
    if let Some((ns, name)) = only {
        keys.clear();
        keys.insert((ns.to_owned(), name.to_owned()));
    }
    let services = keys
        .into_iter()
        .map(|(ns, name)| service_status(members, &ns, &name, now))
        .collect();
    StatusReport {
        clusters,
        services,
        warnings: overlaps
            .iter()
            .map(|o| format!("{o}: pods and services of these members cannot be told apart"))
            .collect(),
    }
}

fn service_status(
    members: &[MemberSnapshot],
    ns: &str,
    name: &str,
    now: Timestamp,
) -> ServiceStatus {
    let named = |meta: &ObjectMeta| {
        meta.namespace.as_deref() == Some(ns) && meta.name.as_deref() == Some(name)
    };
    fn own_slices<'a>(m: &'a MemberSnapshot, ns: &str, name: &str) -> Vec<&'a EndpointSlice> {
        m.slices
            .iter()
            .filter(|s| {
                s.metadata.namespace.as_deref() == Some(ns)
                    && label(&s.metadata, "kubernetes.io/service-name") == Some(name)
            })
            .collect()
    }
    let mut problems = Vec::new();
    let mut exports = Vec::new();
    // The source clusters' own endpoints, to compare imports with.
    let mut at_source: BTreeMap<&str, BTreeSet<EndpointKey>> = BTreeMap::new();
    for m in members.iter().filter(|m| m.error.is_none()) {
        let Some(export) = m.exports.iter().find(|e| named(&e.metadata)) else {
            continue;
        };
        let conditions = export
            .status
            .as_ref()
            .and_then(|s| s.conditions.as_deref())
            .unwrap_or_default();
        let service_exists = m.services.iter().any(|s| named(&s.metadata));
        let slices = own_slices(m, ns, name);
        at_source.insert(&m.cluster, endpoint_keys(&slices));
        let e = ExportStatus {
            cluster: m.cluster.clone(),
            service_exists,
            valid: view(conditions, "Valid", now),
            ready: view(conditions, "Ready", now),
            conflict: view(conditions, "Conflict", now),
            endpoints: counts(&slices),
        };
        if !service_exists {
            problems.push(format!(
                "{}: the ServiceExport names no Service: create Service {ns}/{name} there or delete the export",
                m.cluster
            ));
        }
        match &e.valid {
            Some(c) if c.status != "True" && service_exists => problems.push(format!(
                "{}: export not valid ({}): {}",
                m.cluster, c.reason, c.message
            )),
            None => problems.push(format!(
                "{}: the export has no Valid condition: is the agent running there?",
                m.cluster
            )),
            _ => {}
        }
        if let Some(c) = e.conflict.as_ref().filter(|c| c.status == "True") {
            problems.push(format!(
                "{}: conflict ({}): {}",
                m.cluster, c.reason, c.message
            ));
        }
        if let Some(c) = e.ready.as_ref().filter(|c| c.status == "False")
            && service_exists
            && e.valid.as_ref().is_some_and(|v| v.status == "True")
        {
            problems.push(format!(
                "{}: export not ready ({}): {}",
                m.cluster, c.reason, c.message
            ));
        }
        exports.push(e);
    }
    let mut imports = Vec::new();
    for m in members.iter().filter(|m| m.error.is_none()) {
        let Some(import) = m.imports.iter().find(|i| named(&i.metadata)) else {
            if !exports.is_empty() {
                problems.push(format!(
                    "{}: no ServiceImport although {} export(s) it: is the agent running there?",
                    m.cluster,
                    exports
                        .iter()
                        .map(|e| e.cluster.as_str())
                        .collect::<Vec<_>>()
                        .join(", ")
                ));
            }
            continue;
        };
        let status = import.status.as_ref();
        let imported: Vec<&EndpointSlice> = m
            .imported
            .iter()
            .filter(|s| {
                s.metadata.namespace.as_deref() == Some(ns)
                    && label(&s.metadata, LABEL_SERVICE_NAME) == Some(name)
            })
            .collect();
        let mut by_source: BTreeMap<String, Vec<&EndpointSlice>> = BTreeMap::new();
        for s in &imported {
            let source = label(&s.metadata, LABEL_SOURCE_CLUSTER).unwrap_or("?");
            by_source.entry(source.to_owned()).or_default().push(s);
        }
        // Every exporter is a source, also one the importer has nothing of.
        for e in &exports {
            by_source.entry(e.cluster.clone()).or_default();
        }
        let mut sources = Vec::new();
        for (source, slices) in by_source {
            let keys = endpoint_keys(&slices);
            let in_sync = at_source.get(source.as_str()).map(|own| *own == keys);
            let written = slices.iter().filter_map(|s| last_write(&s.metadata)).max();
            let local_addresses: Vec<String> = keys
                .iter()
                .filter_map(|k| {
                    let ip = k.address.parse().ok()?;
                    let (kind, range) = m.ranges.containing(ip)?;
                    Some(format!("{} in {kind} range {range}", k.address))
                })
                .collect();
            if in_sync == Some(false) {
                problems.push(format!(
                    "{}: its endpoints of {source} are out of date ({} here, {} in {source})",
                    m.cluster,
                    counts(&slices),
                    exports
                        .iter()
                        .find(|e| e.cluster == source)
                        .map(|e| e.endpoints)
                        .unwrap_or_default()
                ));
            }
            if !local_addresses.is_empty() {
                problems.push(format!(
                    "{}: endpoints imported from {source} are inside its own ranges, so traffic to them stays in {}: {}",
                    m.cluster,
                    m.cluster,
                    local_addresses.join("; ")
                ));
            }
            sources.push(SourceView {
                cluster: source,
                endpoints: counts(&slices),
                in_sync,
                age_seconds: written.map(|t| now.duration_since(t).as_secs().max(0)),
                local_addresses,
            });
        }
        imports.push(ImportStatus {
            cluster: m.cluster.clone(),
            type_: import.spec.type_.to_string(),
            ips: import.spec.ips.clone().unwrap_or_default(),
            ports: import
                .spec
                .ports
                .iter()
                .map(|p| {
                    let protocol = p
                        .protocol
                        .as_ref()
                        .map_or("TCP".to_owned(), |p| p.to_string());
                    match &p.name {
                        Some(n) if !n.is_empty() => format!("{n}:{}/{protocol}", p.port),
                        _ => format!("{}/{protocol}", p.port),
                    }
                })
                .collect(),
            clusters: status
                .and_then(|s| s.clusters.as_ref())
                .map(|c| c.iter().map(|c| c.cluster.clone()).collect())
                .unwrap_or_default(),
            ready: view(
                status
                    .and_then(|s| s.conditions.as_deref())
                    .unwrap_or_default(),
                "Ready",
                now,
            ),
            sources,
        });
    }
    if exports.is_empty() {
        problems.push(format!("no member exports {ns}/{name}"));
    }
    ServiceStatus {
        namespace: ns.to_owned(),
        name: name.to_owned(),
        exports,
        imports,
        problems,
    }
}

/// One endpoint address with its conditions, to compare two clusters' views.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
struct EndpointKey {
    address: String,
    ready: bool,
    serving: bool,
    terminating: bool,
}

fn endpoint_keys(slices: &[&EndpointSlice]) -> BTreeSet<EndpointKey> {
    slices
        .iter()
        .flat_map(|s| &s.endpoints)
        .flat_map(|e| {
            let c = e.conditions.as_ref();
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            let serving = c.and_then(|c| c.serving).unwrap_or(ready);
            let terminating = c.and_then(|c| c.terminating).unwrap_or(false);
            e.addresses.iter().map(move |a| EndpointKey {
                address: a.clone(),
                ready,
                serving,
                terminating,
            })
        })
        .collect()
}

fn counts(slices: &[&EndpointSlice]) -> EndpointCounts {
    let mut n = EndpointCounts::default();
    for s in slices {
        for e in &s.endpoints {
            let c = e.conditions.as_ref();
            let ready = c.and_then(|c| c.ready).unwrap_or(true);
            n.ready += u32::from(ready);
            n.serving += u32::from(c.and_then(|c| c.serving).unwrap_or(ready));
            n.terminating += u32::from(c.and_then(|c| c.terminating).unwrap_or(false));
        }
    }
    n
}

/// When an object was last written: the newest `managedFields` time, else its creation.
fn last_write(meta: &ObjectMeta) -> Option<Timestamp> {
    meta.managed_fields
        .as_ref()
        .and_then(|fields| {
            fields
                .iter()
                .filter_map(|f| f.time.as_ref())
                .map(|t| t.0)
                .max()
        })
        .or_else(|| meta.creation_timestamp.as_ref().map(|t| t.0))
}

fn view(conditions: &[Condition], type_: &str, now: Timestamp) -> Option<ConditionView> {
    conditions
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| ConditionView {
            status: c.status.clone(),
            reason: c.reason.clone(),
            message: c.message.clone(),
            age_seconds: Some(
                now.duration_since(c.last_transition_time.0)
                    .as_secs()
                    .max(0),
            ),
        })
}

fn key(meta: &ObjectMeta) -> Option<(String, String)> {
    Some((meta.namespace.clone()?, meta.name.clone()?))
}

fn label<'a>(meta: &'a ObjectMeta, key: &str) -> Option<&'a str> {
    meta.labels.as_ref()?.get(key).map(String::as_str)
}

fn short(c: Option<&ConditionView>) -> String {
    c.map_or("-".to_owned(), |c| format!("{} {}", c.status, c.reason))
}

fn list(items: &[String]) -> String {
    if items.is_empty() {
        "-".to_owned()
    } else {
        items.join(",")
    }
}

/// Seconds for people: `45s`, `3m4s`, `2h5m`, `3d4h`.
pub(crate) fn for_human(secs: i64) -> String {
    match secs {
        ..60 => format!("{secs}s"),
        60..3600 => format!("{}m{}s", secs / 60, secs % 60),
        3600..86400 => format!("{}h{}m", secs / 3600, secs % 3600 / 60),
        _ => format!("{}d{}h", secs / 86400, secs % 86400 / 3600),
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn obj<T: serde::de::DeserializeOwned>(v: serde_json::Value) -> T {
        serde_json::from_value(v).unwrap()
    }

    fn condition(type_: &str, status: &str, reason: &str) -> serde_json::Value {
        json!({"type": type_, "status": status, "reason": reason, "message": format!("{type_} says {reason}"),
               "lastTransitionTime": "2026-01-01T00:00:00Z"})
    }

    fn export(conditions: Vec<serde_json::Value>) -> ServiceExport {
        obj(
            json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceExport",
            "metadata": {"name": "accrual", "namespace": "loyalty"},
            "spec": {}, "status": {"conditions": conditions}}),
        )
    }

    fn slice(
        labels: serde_json::Value,
        addresses: &[(&str, bool)],
        written: &str,
    ) -> EndpointSlice {
        let endpoints: Vec<_> = addresses
            .iter()
            .map(|(a, ready)| json!({"addresses": [a], "conditions": {"ready": ready}}))
            .collect();
        obj(
            json!({"apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": format!("s-{}", addresses.len()), "namespace": "loyalty", "labels": labels,
                         "managedFields": [{"manager": "mcs-agent", "operation": "Apply", "time": written}]},
            "addressType": "IPv4", "endpoints": endpoints}),
        )
    }

    fn import() -> ServiceImport {
        obj(
            json!({"apiVersion": "multicluster.x-k8s.io/v1beta1", "kind": "ServiceImport",
            "metadata": {"name": "accrual", "namespace": "loyalty"},
            "spec": {"type": "ClusterSetIP", "ips": ["10.0.0.9"], "ports": [{"name": "http", "port": 80, "protocol": "TCP"}]},
            "status": {"clusters": [{"cluster": "east"}], "conditions": [condition("Ready", "True", "Ready")]}}),
        )
    }

    fn service() -> Service {
        obj(
            json!({"apiVersion": "v1", "kind": "Service", "metadata": {"name": "accrual", "namespace": "loyalty"}}),
        )
    }

    #[test]
    fn a_service_seen_from_every_member_with_what_is_wrong() {
        let now: Timestamp = "2026-01-01T00:01:00Z".parse().unwrap();
        let own = json!({"kubernetes.io/service-name": "accrual"});
        let from_east = json!({LABEL_SERVICE_NAME: "accrual", LABEL_SOURCE_CLUSTER: "east"});
        let east = MemberSnapshot {
            context: "ctx-east".into(),
            cluster: "east".into(),
            exports: vec![export(vec![
                condition("Valid", "True", "Valid"),
                condition("Ready", "True", "Ready"),
                condition("Conflict", "False", "NoConflicts"),
            ])],
            services: vec![service()],
            slices: vec![slice(
                own,
                &[("192.0.2.1", true), ("192.0.2.2", false)],
                "2026-01-01T00:00:30Z",
            )],
            imports: vec![import()],
            imported: vec![slice(
                from_east.clone(),
                &[("192.0.2.1", true), ("192.0.2.2", false)],
                "2026-01-01T00:00:50Z",
            )],
            ..Default::default()
        };
        // West exports without a Service, and its view of east is behind and inside its
        // own pod range.
        let west = MemberSnapshot {
            context: "ctx-west".into(),
            cluster: "west".into(),
            exports: vec![export(vec![condition("Valid", "False", "NoService")])],
            imports: vec![import()],
            imported: vec![slice(
                from_east,
                &[("192.0.2.1", true)],
                "2026-01-01T00:00:00Z",
            )],
            ranges: ClusterRanges {
                pods: vec!["192.0.2.0/24".parse().unwrap()],
                services: vec![],
            },
            ..Default::default()
        };
        let north = MemberSnapshot {
            context: "ctx-north".into(),
            cluster: "ctx-north".into(),
            error: Some("connection refused".into()),
            ..Default::default()
        };
        let report = build(&[east, west, north], None, &[], now);
        assert!(report.has_problems());
        assert_eq!(
            report.clusters[2].error.as_deref(),
            Some("connection refused")
        );
        let s = &report.services[0];
        assert_eq!(
            (s.namespace.as_str(), s.name.as_str()),
            ("loyalty", "accrual")
        );
        assert_eq!(s.exports.len(), 2);
        assert_eq!(
            s.exports[0].endpoints,
            EndpointCounts {
                ready: 1,
                serving: 1,
                terminating: 0
            }
        );
        assert!(!s.exports[1].service_exists);
        let west_view = &s.imports[1].sources[0];
        assert_eq!(west_view.cluster, "east");
        assert_eq!(west_view.in_sync, Some(false));
        assert_eq!(west_view.age_seconds, Some(60));
        assert_eq!(
            west_view.local_addresses,
            ["192.0.2.1 in pod range 192.0.2.0/24"]
        );
        let east_view = &s.imports[0].sources[0];
        assert_eq!(
            (east_view.in_sync, east_view.age_seconds),
            (Some(true), Some(10))
        );
        let problems = s.problems.join("\n");
        for needle in [
            "west: the ServiceExport names no Service",
            "west: its endpoints of east are out of date (1/1/0 here, 1/1/0 in east)",
            "west: endpoints imported from east are inside its own ranges",
        ] {
            assert!(problems.contains(needle), "{needle:?} not in:\n{problems}");
        }
        // The JSON parses back into the same report.
        let json = serde_json::to_string(&report).unwrap();
        assert_eq!(serde_json::from_str::<StatusReport>(&json).unwrap(), report);
        let table = report.render_table(100);
        assert!(table.lines().all(|l| l.chars().count() <= 100), "{table}");
        assert!(table.contains("SERVICE loyalty/accrual"), "{table}");
    }
}
