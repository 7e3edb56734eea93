//! `kubectl mcs check`: the ClusterSet's pre-flight, judged by a pure function
//! ([`judge`]) from what was read from every member ([`MemberFacts`]). Every finding is a
//! [`Finding`] with a [`Verdict`]; any [`Verdict::Problem`] makes the command exit non-zero.

use std::collections::BTreeMap;

use k8s_openapi::jiff::Timestamp;
use mcs_core::ClusterId;
use mcs_core::cidr::{self, ClusterRanges};
use serde::{Deserialize, Serialize};

use crate::status::for_human;
use crate::table::Table;

/// What was read from one member for the checks.
#[derive(Clone, Debug)]
pub struct MemberFacts {
    /// The kubeconfig context.
    pub context: String,
    /// Why the member could not be read at all.
    pub error: Option<String>,
    /// Its ClusterProperty `cluster.clusterset.k8s.io`, if set.
    pub cluster_id: Option<String>,
    /// Its ClusterProperty `clusterset.k8s.io`, if set.
    pub clusterset: Option<String>,
    /// The agent's heartbeat Lease; `None` when there is none.
    pub heartbeat: Option<HeartbeatSeen>,
    /// Versions served, by resource (`serviceexports`, `serviceimports`,
    /// `clusterproperties`); a resource not served is absent.
    pub served: BTreeMap<String, Vec<String>>,
    /// Requests the agent's identity needs, and whether it may make them; `Err` when they
    /// could not be checked.
    pub rbac: Result<Vec<(String, bool)>, String>,
    /// Pod and service ranges; `Err` when they could not be read.
    pub ranges: Result<ClusterRanges, String>,
    /// Whether `clusterset.local` resolves.
    pub dns: DnsFacts,
}

/// The agent's heartbeat as read.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct HeartbeatSeen {
    /// `spec.renewTime`.
    pub renewed: Option<Timestamp>,
    /// `spec.leaseDurationSeconds`.
    pub duration_seconds: i64,
    /// The ready annotation.
    pub ready: bool,
    /// Why not ready.
    pub reason: String,
}

/// What is known of a member's `clusterset.local` resolution.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub enum DnsFacts {
    /// Nothing to go by.
    #[default]
    Unknown,
    /// A DNS server was asked: the zone's SOA answered (what it said), or the error.
    Queried(Result<String, String>),
    /// The cluster's CoreDNS configuration: whether it forwards the zone.
    Corefile(bool),
}

/// How bad a finding is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    /// Fine.
    Ok,
    /// Worth a look; does not fail the check.
    Warning,
    /// Breaks multi-cluster services; fails the check.
    Problem,
}

impl MemberFacts {
    /// Nothing known yet of the member reached through `context`.
    pub fn new(context: &str) -> Self {
        Self {
            context: context.to_owned(),
            error: None,
            cluster_id: None,
            clusterset: None,
            heartbeat: None,
            served: BTreeMap::new(),
            rbac: Err("not checked".to_owned()),
            ranges: Err("not read".to_owned()),
            dns: DnsFacts::Unknown,
        }
    }
}

impl Verdict {
    /// `ok`, `warning` or `problem`.
    pub fn as_str(self) -> &'static str {
        match self {
            Verdict::Ok => "ok",
            Verdict::Warning => "warning",
            Verdict::Problem => "problem",
        }
    }
}

/// One finding.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
pub struct Finding {
    /// Which check: `reachable`, `agent`, `crds`, `cluster-id`, `clusterset`, `rbac`,
    /// `cidrs`, `dns`.
    pub check: String,
    /// The member it is about (its context), or none for the ClusterSet as a whole.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub context: Option<String>,
    /// How bad.
    pub verdict: Verdict,
    /// What was found, and the fix when there is one.
    pub message: String,
}

/// The answer of `kubectl mcs check`.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CheckReport {
    /// Every finding, members in order, then the ClusterSet's.
    pub findings: Vec<Finding>,
    /// Whether no finding is a problem.
    pub passed: bool,
}

impl CheckReport {
    /// The findings as a table at most `width` wide, and a last line with the outcome.
    pub fn render_table(&self, width: usize) -> String {
        let mut t = Table::new(["CHECK", "CONTEXT", "RESULT", "DETAIL"]);
        for f in &self.findings {
            t.row([
                f.check.clone(),
                f.context.clone().unwrap_or_else(|| "-".to_owned()),
                f.verdict.as_str().to_uppercase(),
                f.message.clone(),
            ]);
        }
        let problems = self
            .findings
            .iter()
            .filter(|f| f.verdict == Verdict::Problem)
            .count();
        let warnings = self
            .findings
            .iter()
            .filter(|f| f.verdict == Verdict::Warning)
            .count();
        format!(
            "{}\n{}: {problems} problem(s), {warnings} warning(s)\n",
            t.render(width),
            if self.passed { "PASSED" } else { "FAILED" }
        )
    }
}

/// The resources the agent reads and writes, with the versions it can use.
const MCS_RESOURCES: [&str; 2] = ["serviceexports", "serviceimports"];

/// Judges every member's facts at `now`.
pub fn judge(members: &[MemberFacts], now: Timestamp) -> CheckReport {
    let mut findings = Vec::new();
    let mut add = |check: &str, context: Option<&str>, verdict: Verdict, message: String| {
        findings.push(Finding {
            check: check.to_owned(),
            context: context.map(str::to_owned),
            verdict,
            message,
        });
    };
    for m in members {
        let ctx = Some(m.context.as_str());
        if let Some(e) = &m.error {
            add(
                "reachable",
                ctx,
                Verdict::Problem,
                format!("cannot read the cluster: {e}"),
            );
            continue;
        }
        // The agent.
        match &m.heartbeat {
            None => add(
                "agent",
                ctx,
                Verdict::Problem,
                "no heartbeat Lease mcs-agent: no mcs-agent has run in this cluster (deploy/agent/deployment.yaml)".to_owned(),
            ),
            Some(h) => {
                let age = h.renewed.map(|t| now.duration_since(t).as_secs().max(0));
                match age {
                    Some(age) if age <= h.duration_seconds => {
                        if h.ready {
                            add("agent", ctx, Verdict::Ok, format!("ready (heartbeat {} ago)", for_human(age)));
                        } else if h.reason == mcs_kube::admin::HEARTBEAT_STOPPED {
                            add("agent", ctx, Verdict::Problem, format!("down: stopped {} ago", for_human(age)));
                        } else {
                            add("agent", ctx, Verdict::Problem, format!("running but not ready: {}", h.reason));
                        }
                    }
                    Some(age) => add(
                        "agent",
                        ctx,
                        Verdict::Problem,
                        format!(
                            "down: last heartbeat {} ago, it lasts {}{}",
                            for_human(age),
                            for_human(h.duration_seconds),
                            if h.reason.is_empty() { String::new() } else { format!(" (last said: {})", h.reason) }
                        ),
                    ),
                    None => add("agent", ctx, Verdict::Problem, "the heartbeat Lease was never renewed".to_owned()),
                }
            }
        }
        // CRDs.
        let mut missing = Vec::new();
        let mut alpha_only = Vec::new();
        for r in MCS_RESOURCES.iter().chain(&["clusterproperties"]) {
            match m.served.get(*r) {
                None => missing.push(*r),
                Some(v) if *r != "clusterproperties" && !v.iter().any(|v| v == "v1beta1") => {
                    alpha_only.push(format!("{r} ({})", v.join(",")));
                }
                _ => {}
            }
        }
        if !missing.is_empty() {
            add(
                "crds",
                ctx,
                Verdict::Problem,
                format!(
                    "not served: {} (apply deploy/crds/mcs-crds.yaml)",
                    missing.join(", ")
                ),
            );
        } else if !alpha_only.is_empty() {
            add(
                "crds",
                ctx,
                Verdict::Warning,
                format!(
                    "only v1alpha1 served: {}; the agent copes, but upgrade to the v1beta1 CRDs",
                    alpha_only.join(", ")
                ),
            );
        } else {
            let versions = |r: &str| m.served.get(r).map(|v| v.join(",")).unwrap_or_default();
            add(
                "crds",
                ctx,
                Verdict::Ok,
                format!(
                    "serviceexports {}, serviceimports {}, clusterproperties {}",
                    versions("serviceexports"),
                    versions("serviceimports"),
                    versions("clusterproperties")
                ),
            );
        }
        // The cluster id.
        match m.cluster_id.as_deref().map(ClusterId::new) {
            None => add(
                "cluster-id",
                ctx,
                Verdict::Problem,
                format!(
                    "no ClusterProperty {}: create it with this cluster's id",
                    mcs_core::api::CLUSTER_ID_PROPERTY
                ),
            ),
            Some(Err(e)) => add("cluster-id", ctx, Verdict::Problem, e.to_string()),
            Some(Ok(id)) => add("cluster-id", ctx, Verdict::Ok, id.to_string()),
        }
        // RBAC of the agent.
        match &m.rbac {
            Err(e) => add(
                "rbac",
                ctx,
                Verdict::Warning,
                format!("cannot check the agent's permissions: {e}"),
            ),
            Ok(results) => {
                let denied: Vec<&str> = results
                    .iter()
                    .filter(|(_, ok)| !ok)
                    .map(|(w, _)| w.as_str())
                    .collect();
                if denied.is_empty() {
                    add(
                        "rbac",
                        ctx,
                        Verdict::Ok,
                        format!("the agent may make all {} requests it needs", results.len()),
                    );
                } else {
                    add(
                        "rbac",
                        ctx,
                        Verdict::Problem,
                        format!(
                            "the agent may not: {} (apply deploy/rbac/agent-local.yaml)",
                            denied.join("; ")
                        ),
                    );
                }
            }
        }
        // DNS.
        match &m.dns {
            DnsFacts::Unknown => add(
                "dns",
                ctx,
                Verdict::Warning,
                "not checked: no CoreDNS configuration found and no --dns server given".to_owned(),
            ),
            DnsFacts::Queried(Ok(answer)) => add(
                "dns",
                ctx,
                Verdict::Ok,
                format!("clusterset.local answers: {answer}"),
            ),
            DnsFacts::Queried(Err(e)) => add(
                "dns",
                ctx,
                Verdict::Problem,
                format!("clusterset.local does not resolve: {e}"),
            ),
            DnsFacts::Corefile(true) => add(
                "dns",
                ctx,
                Verdict::Ok,
                "CoreDNS forwards clusterset.local".to_owned(),
            ),
            DnsFacts::Corefile(false) => add(
                "dns",
                ctx,
                Verdict::Problem,
                "CoreDNS does not forward clusterset.local (add the server block of deploy/dns/clusterset.server)"
                    .to_owned(),
            ),
        }
    }
    let reachable: Vec<&MemberFacts> = members.iter().filter(|m| m.error.is_none()).collect();
    // Cluster ids unique.
    let mut by_id: BTreeMap<&str, Vec<&str>> = BTreeMap::new();
    for m in &reachable {
        if let Some(id) = &m.cluster_id {
            by_id.entry(id).or_default().push(&m.context);
        }
    }
    for (id, contexts) in by_id.iter().filter(|(_, c)| c.len() > 1) {
        add(
            "cluster-id",
            None,
            Verdict::Problem,
            format!(
                "cluster id {id} is used by several members: {}",
                contexts.join(", ")
            ),
        );
    }
    // One ClusterSet.
    let sets: BTreeMap<Option<&str>, Vec<&str>> =
        reachable.iter().fold(BTreeMap::new(), |mut acc, m| {
            acc.entry(m.clusterset.as_deref())
                .or_insert_with(Vec::new)
                .push(&m.context);
            acc
        });
    if sets.len() > 1 {
        let list: Vec<String> = sets
            .iter()
            .map(|(set, c)| format!("{} ({})", set.unwrap_or("unset"), c.join(", ")))
            .collect();
        add(
            "clusterset",
            None,
            Verdict::Problem,
            format!(
                "members disagree on ClusterProperty {}: {}",
                mcs_core::api::CLUSTERSET_PROPERTY,
                list.join("; ")
            ),
        );
    }
    // CIDRs.
    // By context: the names the user gave, and distinct even where ids are not.
    let mut ranges: Vec<(String, &ClusterRanges)> = Vec::new();
    for m in &reachable {
        match &m.ranges {
            Err(e) => add(
                "cidrs",
                Some(&m.context),
                Verdict::Warning,
                format!("cannot read the pod and service ranges: {e}"),
            ),
            Ok(r) => {
                if r.pods.is_empty() {
                    add(
                        "cidrs",
                        Some(&m.context),
                        Verdict::Warning,
                        "no pod ranges known: no Node has spec.podCIDRs".to_owned(),
                    );
                }
                if r.services.is_empty() {
                    add(
                        "cidrs",
                        Some(&m.context),
                        Verdict::Warning,
                        "no service ranges known: no ServiceCIDR objects".to_owned(),
                    );
                }
                ranges.push((m.context.clone(), r));
            }
        }
    }
    let overlaps = cidr::overlaps(ranges.iter().map(|(id, r)| (id, *r)));
    if overlaps.is_empty() {
        add(
            "cidrs",
            None,
            Verdict::Ok,
            format!(
                "no overlap between the pod and service ranges of {} member(s)",
                ranges.len()
            ),
        );
    }
    for o in overlaps {
        add(
            "cidrs",
            None,
            Verdict::Problem,
            format!(
                "{o}: addresses of one cannot be routed to from the other; ranges cannot be changed later, so re-create one member with other ranges"
            ),
        );
    }
    let passed = findings.iter().all(|f| f.verdict != Verdict::Problem);
    CheckReport { findings, passed }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn healthy(context: &str, id: &str, services: &str, now: Timestamp) -> MemberFacts {
        MemberFacts {
            context: context.into(),
            error: None,
            cluster_id: Some(id.into()),
            clusterset: Some("set".into()),
            heartbeat: Some(HeartbeatSeen {
                renewed: Some(now),
                duration_seconds: 40,
                ready: true,
                reason: String::new(),
            }),
            served: [
                ("serviceexports", vec!["v1beta1", "v1alpha1"]),
                ("serviceimports", vec!["v1beta1", "v1alpha1"]),
                ("clusterproperties", vec!["v1alpha1"]),
            ]
            .into_iter()
            .map(|(r, v)| (r.to_owned(), v.into_iter().map(str::to_owned).collect()))
            .collect(),
            rbac: Ok(vec![("list serviceexports".into(), true)]),
            ranges: Ok(ClusterRanges {
                pods: vec![],
                services: vec![services.parse().unwrap()],
            }),
            dns: DnsFacts::Queried(Ok("SOA".into())),
        }
    }

    #[test]
    fn a_healthy_set_passes_with_warnings_only() {
        let now = Timestamp::now();
        let report = judge(
            &[
                healthy("east", "east", "10.1.0.0/24", now),
                healthy("west", "west", "10.2.0.0/24", now),
            ],
            now,
        );
        assert!(report.passed, "{report:#?}");
        // No pod ranges: a warning per member, not a failure.
        assert_eq!(
            report
                .findings
                .iter()
                .filter(|f| f.verdict == Verdict::Warning)
                .count(),
            2
        );
    }

    #[test]
    fn problems_fail_and_say_what_and_where() {
        let now = Timestamp::now();
        let mut east = healthy("east", "dup", "10.1.0.0/24", now);
        let mut west = healthy("west", "dup", "10.1.0.128/25", now);
        west.heartbeat.as_mut().unwrap().renewed = Some(now - std::time::Duration::from_secs(100));
        east.served.remove("serviceimports");
        // East's agent stopped cleanly 5 s ago: its last heartbeat says so.
        let beat = east.heartbeat.as_mut().unwrap();
        beat.renewed = Some(now - std::time::Duration::from_secs(5));
        beat.ready = false;
        beat.reason = mcs_kube::admin::HEARTBEAT_STOPPED.to_owned();
        let north = MemberFacts {
            context: "north".into(),
            error: Some("connection refused".into()),
            ..healthy("north", "north", "10.3.0.0/24", now)
        };
        let report = judge(&[east, west, north], now);
        assert!(!report.passed);
        let problem = |check: &str, ctx: Option<&str>, needle: &str| {
            assert!(
                report.findings.iter().any(|f| f.check == check
                    && f.context.as_deref() == ctx
                    && f.verdict == Verdict::Problem
                    && f.message.contains(needle)),
                "no {check} problem for {ctx:?} with {needle:?}: {report:#?}"
            );
        };
        problem("agent", Some("west"), "down: last heartbeat 1m40s ago");
        problem("agent", Some("east"), "down: stopped 5s ago");
        problem("crds", Some("east"), "not served: serviceimports");
        problem(
            "cluster-id",
            None,
            "cluster id dup is used by several members: east, west",
        );
        problem("reachable", Some("north"), "connection refused");
        problem(
            "cidrs",
            None,
            "east service range 10.1.0.0/24 overlaps west service range 10.1.0.128/25",
        );
    }
}
