//! The metric table of `docs/metrics.md` is the code's: every row is a metric that
//! `mcs_kube::metrics::ALL` or `mcs_client::metrics::ALL` defines, with the same type,
//! labels and meaning, and every defined metric has its row. The Grafana dashboard in
//! `deploy/grafana/` queries only metrics of that table, and every one of them.

use std::collections::{BTreeMap, BTreeSet};

use mcs_core::metrics::MetricDef;

const DOC: &str = include_str!("../../docs/metrics.md");
const DASHBOARD: &str = include_str!("../../deploy/grafana/mcs-dashboard.json");

/// The rows of the doc's table: name -> (type, labels, meaning).
fn documented() -> BTreeMap<String, (String, Vec<String>, String)> {
    let section = DOC
        .split("## The table")
        .nth(1)
        .expect("docs/metrics.md has a section \"The table\"");
    let mut rows = BTreeMap::new();
    for line in section.lines().filter(|l| l.starts_with("| `")) {
        let cells: Vec<&str> = line.trim_matches('|').split(" | ").map(str::trim).collect();
        assert_eq!(
            cells.len(),
            4,
            "a row has name, type, labels, meaning: {line}"
        );
        let unquote = |s: &str| s.trim_matches('`').to_owned();
        let labels = match cells[2] {
            "-" => Vec::new(),
            list => list.split(", ").map(unquote).collect(),
        };
        let name = unquote(cells[0]);
        let previous = rows.insert(
            name.clone(),
            (cells[1].to_owned(), labels, cells[3].to_owned()),
        );
        assert!(previous.is_none(), "{name} has two rows");
    }
    assert!(!rows.is_empty(), "no table rows found in docs/metrics.md");
    rows
}

fn defined() -> Vec<&'static MetricDef> {
    mcs_kube::metrics::ALL
        .iter()
        .chain(mcs_client::metrics::ALL)
        .collect()
}

#[test]
fn the_doc_table_and_the_code_list_the_same_metrics() {
    let doc = documented();
    let mut missing = Vec::new();
    for m in defined() {
        match doc.get(m.name) {
            None => missing.push(format!(
                "| `{}` | {} | {} | {} |",
                m.name,
                m.kind,
                if m.labels.is_empty() {
                    "-".to_owned()
                } else {
                    m.labels
                        .iter()
                        .map(|l| format!("`{l}`"))
                        .collect::<Vec<_>>()
                        .join(", ")
                },
                m.help
            )),
            Some((kind, labels, meaning)) => {
                assert_eq!(kind, m.kind.as_str(), "type of {}", m.name);
                assert_eq!(labels, m.labels, "labels of {}", m.name);
                assert_eq!(meaning, m.help, "meaning of {}", m.name);
            }
        }
    }
    assert!(
        missing.is_empty(),
        "metrics without a row in docs/metrics.md:\n{}",
        missing.join("\n")
    );
    let names: BTreeSet<&str> = defined().iter().map(|m| m.name).collect();
    let extra: Vec<&String> = doc.keys().filter(|n| !names.contains(n.as_str())).collect();
    assert!(
        extra.is_empty(),
        "rows of docs/metrics.md no code defines: {extra:?}"
    );
}

/// PromQL words that are not metric names.
const PROMQL: &[&str] = &[
    "abs",
    "and",
    "avg",
    "avg_over_time",
    "bool",
    "by",
    "ceil",
    "clamp_max",
    "clamp_min",
    "count",
    "delta",
    "deriv",
    "floor",
    "group_left",
    "group_right",
    "histogram_quantile",
    "ignoring",
    "increase",
    "irate",
    "label_replace",
    "max",
    "max_over_time",
    "min",
    "min_over_time",
    "offset",
    "on",
    "or",
    "rate",
    "round",
    "scalar",
    "sum",
    "time",
    "topk",
    "bottomk",
    "unless",
    "vector",
    "without",
];

/// The metric names an expression reads: identifiers outside label matchers, ranges,
/// strings and `by (...)` / `without (...)` label lists, that are not PromQL words.
fn metrics_in(expr: &str) -> Vec<String> {
    let mut cleaned = String::new();
    let mut depth_brace = 0;
    let mut depth_bracket = 0;
    let mut in_string = false;
    for c in expr.chars() {
        match c {
            '"' if depth_brace == 0 => in_string = !in_string,
            '{' if !in_string => depth_brace += 1,
            '}' if !in_string => depth_brace -= 1,
            '[' if !in_string => depth_bracket += 1,
            ']' if !in_string => depth_bracket -= 1,
            _ if in_string || depth_brace > 0 || depth_bracket > 0 => {}
            c => cleaned.push(c),
        }
    }
    let tokens: Vec<String> = cleaned
        .split(|c: char| {
            !(c.is_ascii_alphanumeric() || c == '_' || c == ':' || c == '(' || c == ')')
        })
        .flat_map(|t| {
            // Keep parentheses as their own tokens.
            let mut out = Vec::new();
            let mut word = String::new();
            for c in t.chars() {
                if c == '(' || c == ')' {
                    if !word.is_empty() {
                        out.push(std::mem::take(&mut word));
                    }
                    out.push(c.to_string());
                } else {
                    word.push(c);
                }
            }
            if !word.is_empty() {
                out.push(word);
            }
            out
        })
        .filter(|t| !t.is_empty())
        .collect();
    let mut names = Vec::new();
    let mut i = 0;
    while i < tokens.len() {
        let t = &tokens[i];
        if (t == "by" || t == "without") && tokens.get(i + 1).is_some_and(|n| n == "(") {
            // Skip the label list.
            while i < tokens.len() && tokens[i] != ")" {
                i += 1;
            }
        } else if t
            .chars()
            .next()
            .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
            && !PROMQL.contains(&t.as_str())
        {
            names.push(t.clone());
        }
        i += 1;
    }
    names
}

fn exprs(value: &serde_json::Value, out: &mut Vec<String>) {
    match value {
        serde_json::Value::Object(map) => {
            for (k, v) in map {
                match (k.as_str(), v) {
                    ("expr", serde_json::Value::String(e)) => out.push(e.clone()),
                    _ => exprs(v, out),
                }
            }
        }
        serde_json::Value::Array(items) => items.iter().for_each(|v| exprs(v, out)),
        _ => {}
    }
}

#[test]
fn the_dashboard_queries_exactly_the_metrics_of_the_table() {
    let doc = documented();
    let dashboard: serde_json::Value =
        serde_json::from_str(DASHBOARD).expect("the dashboard is JSON");
    let mut all = Vec::new();
    exprs(&dashboard, &mut all);
    assert!(!all.is_empty(), "the dashboard has no queries");
    let mut used = BTreeSet::new();
    for expr in &all {
        let names = metrics_in(expr);
        assert!(!names.is_empty(), "no metric in {expr:?}");
        for name in names {
            assert!(
                doc.contains_key(&name),
                "the dashboard queries {name} ({expr:?}), which docs/metrics.md does not list"
            );
            used.insert(name);
        }
    }
    let unused: Vec<&String> = doc.keys().filter(|n| !used.contains(*n)).collect();
    assert!(
        unused.is_empty(),
        "metrics of the table the dashboard does not show: {unused:?}"
    );
}

#[test]
fn the_expression_reader_finds_metrics_and_only_metrics() {
    assert_eq!(
        metrics_in(
            r#"sum by (service, cluster) (rate(mcs_client_responses_total{outcome="failure"}[5m])) / sum by (service) (rate(up[5m]))"#
        ),
        ["mcs_client_responses_total", "up"]
    );
    assert_eq!(metrics_in("mcs_agent_ready"), ["mcs_agent_ready"]);
}
