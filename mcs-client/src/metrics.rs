//! Metrics through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! Install a recorder (for example `metrics-exporter-prometheus`) **before** the first
//! request to a service: handles are registered when a service is first seen and when its
//! endpoint set changes, so the request path only bumps counters it already holds. Call
//! [`describe`] once to attach help texts.
//!
//! | name | kind | labels |
//! |---|---|---|
//! | `mcs_client_endpoints` | gauge | `service`, `port`, `cluster`, `state` (`ready`, `not_ready`, `terminating`) |
//! | `mcs_client_tier_endpoints` | gauge | `service`, `port`, `tier`: endpoints the balancer may pick, by locality tier |
//! | `mcs_client_picks_total` | counter | `service`, `port`, `tier` (`0`, `1`, `2`, `3+`; 0 is the most preferred) |
//! | `mcs_client_responses_total` | counter | `service`, `port`, `cluster`, `outcome` (`success`, `failure`) |
//! | `mcs_client_retries_total` | counter | `service`, `port`, `result` (`sent`, `budget_exhausted`) |
//! | `mcs_client_ejections_total` | counter | `service`, `port`, `cluster`: endpoints ejected by outlier detection |
//! | `mcs_client_ejected_endpoints` | gauge | `service`, `port`: endpoints out of service now (updated on every ejection and on a 5 s tick, so expiries show within seconds) |
//! | `mcs_client_resolve_errors_total` | counter | `service`, `port` |
//! | `mcs_client_snapshot_age_seconds` | gauge | `service`, `port`: time since discovery last confirmed the set |
//!
//! Picks by tier show failover: tier 0 is local, higher tiers take traffic when the local
//! cluster degrades.

use std::collections::BTreeMap;

use metrics::{Counter, Gauge, counter, gauge};

use mcs_core::discovery::{Endpoint, EndpointTable, Target};
use mcs_core::endpoints::Snapshot;

/// Endpoints known for a service, by cluster and state.
pub const ENDPOINTS: &str = "mcs_client_endpoints";
/// Endpoints the balancer may pick, by tier.
pub const TIER_ENDPOINTS: &str = "mcs_client_tier_endpoints";
/// Picks, by tier.
pub const PICKS: &str = "mcs_client_picks_total";
/// Balanced responses and errors, by cluster and outcome.
pub const RESPONSES: &str = "mcs_client_responses_total";
/// Retries after connect failures, by result.
pub const RETRIES: &str = "mcs_client_retries_total";
/// Outlier ejections, by the ejected endpoint's cluster.
pub const EJECTIONS: &str = "mcs_client_ejections_total";
/// Endpoints ejected at the moment.
pub const EJECTED: &str = "mcs_client_ejected_endpoints";
/// Errors reported by the resolver.
pub const RESOLVE_ERRORS: &str = "mcs_client_resolve_errors_total";
/// Seconds since discovery last confirmed the endpoint set.
pub const SNAPSHOT_AGE: &str = "mcs_client_snapshot_age_seconds";

/// Registers help texts for every metric with the installed recorder.
pub fn describe() {
    metrics::describe_gauge!(
        ENDPOINTS,
        "Endpoints known for a multi-cluster service, by cluster and state."
    );
    metrics::describe_gauge!(
        TIER_ENDPOINTS,
        "Endpoints the balancer may pick, by locality tier."
    );
    metrics::describe_counter!(
        PICKS,
        "Endpoint picks, by locality tier (0 is the most preferred)."
    );
    metrics::describe_counter!(
        RESPONSES,
        "Balanced requests, by endpoint cluster and outcome."
    );
    metrics::describe_counter!(RETRIES, "Retries on another endpoint, by result.");
    metrics::describe_counter!(
        EJECTIONS,
        "Endpoints ejected by outlier detection, by the endpoint's cluster."
    );
    metrics::describe_gauge!(EJECTED, "Endpoints ejected by outlier detection now.");
    metrics::describe_counter!(RESOLVE_ERRORS, "Errors reported by the resolver.");
    metrics::describe_gauge!(
        SNAPSHOT_AGE,
        "Seconds since discovery last confirmed the endpoint set."
    );
}

/// Handles for one target, registered once.
#[derive(Debug)]
pub(crate) struct TargetMetrics {
    service: String,
    port: String,
    picks: [Counter; 4],
    pub(crate) retries_sent: Counter,
    pub(crate) retries_exhausted: Counter,
    pub(crate) resolve_errors: Counter,
    pub(crate) snapshot_age: Gauge,
    pub(crate) ejected: Gauge,
}

impl TargetMetrics {
    pub(crate) fn new(target: &Target) -> Self {
        let service = target.service.to_string();
        let port = target.port.to_string();
        let pick = |tier: &'static str| counter!(PICKS, "service" => service.clone(), "port" => port.clone(), "tier" => tier);
        let retry = |result: &'static str| counter!(RETRIES, "service" => service.clone(), "port" => port.clone(), "result" => result);
        Self {
            picks: [pick("0"), pick("1"), pick("2"), pick("3+")],
            retries_sent: retry("sent"),
            retries_exhausted: retry("budget_exhausted"),
            resolve_errors: counter!(RESOLVE_ERRORS, "service" => service.clone(), "port" => port.clone()),
            snapshot_age: gauge!(SNAPSHOT_AGE, "service" => service.clone(), "port" => port.clone()),
            ejected: gauge!(EJECTED, "service" => service.clone(), "port" => port.clone()),
            service,
            port,
        }
    }

    /// Counts one pick from `tier`.
    pub(crate) fn pick(&self, tier: usize) {
        self.picks[tier.min(3)].increment(1);
    }

    /// Outcome counters for one endpoint: success, failure, ejections.
    pub(crate) fn outcomes(&self, endpoint: &Endpoint) -> (Counter, Counter, Counter) {
        let c = |outcome: &'static str| {
            counter!(RESPONSES, "service" => self.service.clone(), "port" => self.port.clone(),
                "cluster" => endpoint.cluster.to_string(), "outcome" => outcome)
        };
        let ejections = counter!(EJECTIONS, "service" => self.service.clone(), "port" => self.port.clone(),
            "cluster" => endpoint.cluster.to_string());
        (c("success"), c("failure"), ejections)
    }
}

/// The endpoint gauges of one target, owned by its discovery task.
#[derive(Debug)]
pub(crate) struct EndpointGauges {
    service: String,
    port: String,
    gauges: BTreeMap<(String, &'static str), Gauge>,
    tiers: Vec<Gauge>,
}

impl EndpointGauges {
    pub(crate) fn new(target: &Target) -> Self {
        Self {
            service: target.service.to_string(),
            port: target.port.to_string(),
            gauges: BTreeMap::new(),
            tiers: Vec::new(),
        }
    }

    /// Publishes the pickable endpoints per tier of the balancer's current snapshot.
    pub(crate) fn publish_tiers(&mut self, snapshot: &Snapshot) {
        let tiers = snapshot.tiers();
        while self.tiers.len() < tiers.len() {
            let tier = self.tiers.len().to_string();
            self.tiers.push(gauge!(TIER_ENDPOINTS, "service" => self.service.clone(), "port" => self.port.clone(), "tier" => tier));
        }
        for (i, gauge) in self.tiers.iter().enumerate() {
            gauge.set(tiers.get(i).map_or(0.0, |t| t.len() as f64));
        }
    }

    /// Publishes endpoint counts by cluster and state; combinations that disappeared go to
    /// 0 and are forgotten.
    pub(crate) fn publish(&mut self, table: &EndpointTable) {
        let mut counts: BTreeMap<(String, &'static str), f64> = BTreeMap::new();
        for ep in table.endpoints() {
            let state = if ep.terminating {
                "terminating"
            } else if ep.ready {
                "ready"
            } else {
                "not_ready"
            };
            *counts.entry((ep.cluster.to_string(), state)).or_default() += 1.0;
        }
        // A combination that disappeared goes to 0 once and its handle is let go, so the
        // map only holds clusters and states that exist (the series itself stays with the
        // recorder, as Prometheus expects; a cluster that comes back gets it again).
        self.gauges.retain(|key, gauge| {
            let present = counts.contains_key(key);
            if !present {
                gauge.set(0.0);
            }
            present
        });
        for (key, n) in counts {
            let gauge = self.gauges.entry(key.clone()).or_insert_with(|| {
                gauge!(ENDPOINTS, "service" => self.service.clone(), "port" => self.port.clone(),
                    "cluster" => key.0, "state" => key.1)
            });
            gauge.set(n);
        }
    }
}
