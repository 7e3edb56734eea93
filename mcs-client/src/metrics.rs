//! Metrics through the [`metrics`](https://docs.rs/metrics) facade.
//!
//! Install a recorder (for example `metrics-exporter-prometheus`) **before** the first
//! request to a service: handles are registered when a service is first seen and when its
//! endpoint set changes, so the request path only bumps counters it already holds. Call
//! [`describe`] once to attach help texts. [`ALL`] lists every metric (name, type, labels,
//! meaning); `docs/metrics.md` has the table.
//!
//! Gauges are set again on every discovery tick ([`GAUGE_REFRESH`]) while what they count
//! exists, and never again once it is gone (a cluster that left the service, a service no
//! longer used). The `metrics` facade cannot delete a series, so configure the recorder
//! to drop gauges idle for longer than a few ticks, for example:
//!
//! ```
//! # use std::time::Duration;
//! use metrics_exporter_prometheus::PrometheusBuilder;
//! use metrics_util::MetricKindMask;
//!
//! let recorder = PrometheusBuilder::new()
//!     .idle_timeout(MetricKindMask::GAUGE, Some(4 * mcs_client::metrics::GAUGE_REFRESH))
//!     .build_recorder();
//! # drop(recorder);
//! ```
//!
//! Then `mcs_client_endpoints{cluster="west"}` disappears from the scrape once `west` no
//! longer serves the service, instead of staying at 0 forever.
//!
//! Picks by tier show failover: tier 0 is local, higher tiers take traffic when the local
//! cluster degrades.

use std::collections::BTreeMap;

use std::time::Duration;

use metrics::{Counter, Gauge, counter, gauge};

use mcs_core::discovery::{Endpoint, EndpointTable, Target};
use mcs_core::endpoints::Snapshot;
use mcs_core::metrics::{MetricDef, MetricKind};

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

/// How often a service's gauges are set again while it is in use (its discovery tick).
pub const GAUGE_REFRESH: Duration = crate::target::TICK;

/// Every metric of this crate.
pub const ALL: &[MetricDef] = &[
    MetricDef {
        name: ENDPOINTS,
        kind: MetricKind::Gauge,
        labels: &["service", "port", "cluster", "state"],
        help: "Endpoints known for a multi-cluster service, by cluster and state (ready, not_ready, terminating); a cluster's series goes when it leaves.",
    },
    MetricDef {
        name: TIER_ENDPOINTS,
        kind: MetricKind::Gauge,
        labels: &["service", "port", "tier"],
        help: "Endpoints the balancer may pick, by locality tier.",
    },
    MetricDef {
        name: PICKS,
        kind: MetricKind::Counter,
        labels: &["service", "port", "tier"],
        help: "Endpoint picks, by locality tier (0, 1, 2, 3+; 0 is the most preferred).",
    },
    MetricDef {
        name: RESPONSES,
        kind: MetricKind::Counter,
        labels: &["service", "port", "cluster", "outcome"],
        help: "Balanced requests, by endpoint cluster and outcome (success, failure).",
    },
    MetricDef {
        name: RETRIES,
        kind: MetricKind::Counter,
        labels: &["service", "port", "result"],
        help: "Retries on another endpoint, by result (sent, budget_exhausted).",
    },
    MetricDef {
        name: EJECTIONS,
        kind: MetricKind::Counter,
        labels: &["service", "port", "cluster"],
        help: "Endpoints ejected by outlier detection, by the endpoint's cluster.",
    },
    MetricDef {
        name: EJECTED,
        kind: MetricKind::Gauge,
        labels: &["service", "port"],
        help: "Endpoints ejected by outlier detection now.",
    },
    MetricDef {
        name: RESOLVE_ERRORS,
        kind: MetricKind::Counter,
        labels: &["service", "port"],
        help: "Errors reported by the resolver.",
    },
    MetricDef {
        name: SNAPSHOT_AGE,
        kind: MetricKind::Gauge,
        labels: &["service", "port"],
        help: "Seconds since discovery last confirmed the endpoint set.",
    },
];

/// Registers help texts for every metric with the installed recorder.
pub fn describe() {
    for m in ALL {
        match m.kind {
            MetricKind::Counter => metrics::describe_counter!(m.name, m.help),
            MetricKind::Gauge => metrics::describe_gauge!(m.name, m.help),
            _ => metrics::describe_histogram!(m.name, m.help),
        }
    }
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
    /// The gauges of the cluster and state combinations present now, with their value.
    gauges: BTreeMap<(String, &'static str), (Gauge, f64)>,
    tiers: Vec<(Gauge, f64)>,
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
            self.tiers.push((gauge!(TIER_ENDPOINTS, "service" => self.service.clone(), "port" => self.port.clone(), "tier" => tier), 0.0));
        }
        for (i, (gauge, value)) in self.tiers.iter_mut().enumerate() {
            *value = tiers.get(i).map_or(0.0, |t| t.len() as f64);
            gauge.set(*value);
        }
    }

    /// Sets every gauge held again to its value (on the discovery tick), so that a recorder
    /// with a gauge idle timeout keeps them and drops only those let go.
    pub(crate) fn refresh(&self) {
        for (gauge, value) in self.gauges.values().chain(&self.tiers) {
            gauge.set(*value);
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
        // A combination that disappeared goes to 0 once and its handle is let go: it is
        // never set again, so a recorder with a gauge idle timeout drops the series (see
        // the module docs); a cluster that comes back gets it again.
        self.gauges.retain(|key, (gauge, _)| {
            let present = counts.contains_key(key);
            if !present {
                gauge.set(0.0);
            }
            present
        });
        for (key, n) in counts {
            let (gauge, value) = self.gauges.entry(key.clone()).or_insert_with(|| {
                let gauge = gauge!(ENDPOINTS, "service" => self.service.clone(), "port" => self.port.clone(),
                    "cluster" => key.0, "state" => key.1);
                (gauge, 0.0)
            });
            *value = n;
            gauge.set(n);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use mcs_core::ClusterId;
    use mcs_core::discovery::Update;
    use mcs_core::name::ServiceRef;
    use metrics_exporter_prometheus::PrometheusBuilder;
    use metrics_util::MetricKindMask;

    use super::*;

    fn endpoint(addr: &str, cluster: &str) -> Endpoint {
        Endpoint::ready(addr.parse().unwrap(), ClusterId::new(cluster).unwrap())
    }

    /// A cluster that leaves the service leaves the scrape: its gauge is not set again,
    /// and a recorder with a gauge idle timeout drops it, while the refreshed gauges of the
    /// cluster still there stay. Waits for the scrape to change, asserting no duration.
    #[test]
    fn the_gauges_of_a_cluster_that_left_disappear_from_the_scrape() {
        let recorder = PrometheusBuilder::new()
            .idle_timeout(MetricKindMask::GAUGE, Some(Duration::from_secs(2)))
            .build_recorder();
        let handle = recorder.handle();
        let target = Target {
            service: ServiceRef::new("loyalty", "accrual").unwrap(),
            port: 80,
        };
        let mut table = EndpointTable::new();
        let mut gauges = EndpointGauges::new(&target);
        metrics::with_local_recorder(&recorder, || {
            table.apply(Update::Reset(vec![
                endpoint("192.0.2.1:80", "east"),
                endpoint("192.0.2.2:80", "west"),
            ]));
            gauges.publish(&table);
        });
        let west = r#"mcs_client_endpoints{service="loyalty/accrual",port="80",cluster="west",state="ready"}"#;
        let east = r#"mcs_client_endpoints{service="loyalty/accrual",port="80",cluster="east",state="ready"} 1"#;
        let scrape = handle.render();
        assert!(scrape.contains(&format!("{west} 1")), "{scrape}");
        assert!(scrape.contains(east), "{scrape}");

        metrics::with_local_recorder(&recorder, || {
            table.apply(Update::Reset(vec![endpoint("192.0.2.1:80", "east")]));
            gauges.publish(&table);
        });
        assert!(handle.render().contains(&format!("{west} 0")), "zero first");
        // The discovery tick refreshes what is present; west's series goes once idle.
        let deadline = Instant::now() + Duration::from_secs(30);
        loop {
            metrics::with_local_recorder(&recorder, || gauges.refresh());
            let scrape = handle.render();
            assert!(
                scrape.contains(east),
                "the refreshed gauge stays:\n{scrape}"
            );
            if !scrape.contains(west) {
                break;
            }
            assert!(Instant::now() < deadline, "west still scraped:\n{scrape}");
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}
