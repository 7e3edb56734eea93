//! How a metric is described: the one shape in which `mcs-kube` and `mcs-client` list the
//! metrics they record (`mcs_kube::metrics::ALL`, `mcs_client::metrics::ALL`), so that the
//! documentation table and dashboards can be checked against the code.

use std::fmt;

/// A metric's Prometheus type.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
#[non_exhaustive]
pub enum MetricKind {
    /// Only goes up (reset on restart); exposed with a `_total` name.
    Counter,
    /// A value that goes up and down.
    Gauge,
    /// A distribution of observations.
    Histogram,
}

impl MetricKind {
    /// `counter`, `gauge` or `histogram`, as Prometheus spells the type.
    pub fn as_str(self) -> &'static str {
        match self {
            MetricKind::Counter => "counter",
            MetricKind::Gauge => "gauge",
            MetricKind::Histogram => "histogram",
        }
    }
}

impl fmt::Display for MetricKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// One metric: its name, type, label names and meaning.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct MetricDef {
    /// The exposed name, e.g. `mcs_agent_reconciles_total`.
    pub name: &'static str,
    /// Its type.
    pub kind: MetricKind,
    /// Its label names, in the order the documentation lists them.
    pub labels: &'static [&'static str],
    /// What it means (the help text).
    pub help: &'static str,
}
