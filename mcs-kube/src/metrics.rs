//! Every metric the agent and the DNS server record, in one place.
//!
//! The library records through the [`metrics`](https://docs.rs/metrics) facade and
//! installs no recorder: the binaries (`mcs-agent`, `mcs-dns`) install a Prometheus
//! recorder and serve it on `/metrics` ([`crate::admin`]). Handles that need no label are
//! registered when the agent or the DNS server is built, so install the recorder first.
//!
//! Gauges are set again at least every [`GAUGE_REFRESH`] (the agent's
//! [`AgentConfig::metrics_refresh`](crate::agent::AgentConfig::metrics_refresh)) while what
//! they measure exists, and not after it is gone: a recorder that drops gauges idle for
//! longer than that (`metrics-exporter-prometheus`'s `idle_timeout`, as the binaries set
//! it) drops the series of a member that left.
//!
//! [`ALL`] lists them; `docs/metrics.md` has the same table and a test keeps the two equal.

use std::time::Duration;

use mcs_core::metrics::{MetricDef, MetricKind};

/// Services reconciled.
pub const AGENT_RECONCILES: &str = "mcs_agent_reconciles_total";
/// Reconciles that failed and will be retried.
pub const AGENT_RECONCILE_ERRORS: &str = "mcs_agent_reconcile_errors_total";
/// Exported services known in the ClusterSet.
pub const AGENT_SERVICES: &str = "mcs_agent_services";
/// Members whose watches, probe and Lease are healthy.
pub const AGENT_REACHABLE_MEMBERS: &str = "mcs_agent_reachable_members";
/// Whether each member is reachable, by `cluster`.
pub const AGENT_MEMBER_UP: &str = "mcs_agent_member_up";
/// Whether the hub answers (hub topology).
pub const AGENT_HUB_REACHABLE: &str = "mcs_agent_hub_reachable";
/// Whether the agent is ready.
pub const AGENT_READY: &str = "mcs_agent_ready";
/// CIDR problems the agent sees, by `kind` and the other `cluster`.
pub const AGENT_CIDR_CONFLICTS: &str = "mcs_agent_cidr_conflicts";
/// DNS responses sent, by `rcode`.
pub const DNS_RESPONSES: &str = "mcs_dns_responses_total";

/// How often the agent sets its gauges again by default (see the module docs).
pub const GAUGE_REFRESH: Duration = Duration::from_secs(15);

/// Every metric of this crate.
pub const ALL: &[MetricDef] = &[
    MetricDef {
        name: AGENT_RECONCILES,
        kind: MetricKind::Counter,
        labels: &[],
        help: "Services reconciled (merged, planned and written).",
    },
    MetricDef {
        name: AGENT_RECONCILE_ERRORS,
        kind: MetricKind::Counter,
        labels: &[],
        help: "Reconciles whose writes failed and will be retried.",
    },
    MetricDef {
        name: AGENT_SERVICES,
        kind: MetricKind::Gauge,
        labels: &[],
        help: "Exported services known in the ClusterSet.",
    },
    MetricDef {
        name: AGENT_REACHABLE_MEMBERS,
        kind: MetricKind::Gauge,
        labels: &[],
        help: "Members (this one included) whose watches, probe and Lease are healthy.",
    },
    MetricDef {
        name: AGENT_MEMBER_UP,
        kind: MetricKind::Gauge,
        labels: &["cluster"],
        help: "1 while the member is reachable, 0 while it fails; the series goes when the member leaves.",
    },
    MetricDef {
        name: AGENT_HUB_REACHABLE,
        kind: MetricKind::Gauge,
        labels: &[],
        help: "1 when the hub answers (hub topology), else 0.",
    },
    MetricDef {
        name: AGENT_READY,
        kind: MetricKind::Gauge,
        labels: &[],
        help: "1 when the agent is ready (what /readyz says), else 0.",
    },
    MetricDef {
        name: AGENT_CIDR_CONFLICTS,
        kind: MetricKind::Gauge,
        labels: &["kind", "cluster"],
        help: "CIDR problems: kind=member_overlap (a range of that member overlaps one of this cluster's), kind=local_endpoint (endpoints imported from that member inside this cluster's pod or service ranges).",
    },
    MetricDef {
        name: DNS_RESPONSES,
        kind: MetricKind::Counter,
        labels: &["rcode"],
        help: "DNS responses sent, by response code (NoError, NXDomain, ServFail, ...).",
    },
];

/// Registers the help texts of [`ALL`] with the installed recorder.
pub fn describe() {
    for m in ALL {
        match m.kind {
            MetricKind::Counter => metrics::describe_counter!(m.name, m.help),
            MetricKind::Gauge => metrics::describe_gauge!(m.name, m.help),
            _ => metrics::describe_histogram!(m.name, m.help),
        }
    }
}
