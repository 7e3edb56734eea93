//! `kubectl-mcs` against real API servers, run as a user runs it: the binary, a merged
//! `KUBECONFIG`, real `mcs-agent` and `mcs-dns` processes, and once through a real
//! `kubectl` as a plugin.
//!
//! - `status_and_check_of_a_clusterset`: a healthy service, a conflict and an export
//!   without a Service, as `status` shows them (JSON parsed back, YAML, table); `check`
//!   passes (exit 0) with every agent, CRD, cluster id, RBAC, CIDR and DNS finding ok, then
//!   fails (exit 1) once an agent is killed. The JSON of both has the shape pinned in
//!   `tests/fixtures/kubectl-mcs-{status,check}.shape` (field names and types, as a user's
//!   script reads them).
//! - `overlapping_ranges_and_unreachable_members`: two clusters started with overlapping
//!   service CIDRs (and Nodes with overlapping pod CIDRs): `check` fails naming both
//!   ranges, `status` warns; the agents report the overlaps and an endpoint imported into
//!   the other cluster's service range as Warning events and on `/metrics`, and `status`
//!   shows that endpoint as local; a member whose API server is down makes `status` exit 1 and
//!   `check` report it; a context that does not exist exits 2.

use mcs_testkit as support;

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Node, Service};
use kube::Client;
use kube::api::{Api, Patch, PatchParams, PostParams};
use mcs_cli::check::{CheckReport, Verdict};
use mcs_cli::status::{ServiceStatus, StatusReport};
use mcs_core::api::v1beta1::{ClusterProperty, ServiceExport};
use mcs_core::api::{CLUSTER_ID_PROPERTY, CLUSTERSET_PROPERTY, ClusterPropertySpec};
use support::{ClusterOptions, TestCluster};
use tokio::process::{Child, Command};

const NS: &str = "loyalty";
/// The agent's namespace (its heartbeat Lease and ServiceAccount), as deployed.
const AGENT_NS: &str = "mcs-system";
/// How long the agents may take to converge, and a command to answer.
const BUDGET: Duration = Duration::from_secs(90);

/// What one `kubectl-mcs` run printed and how it exited.
struct Run {
    code: i32,
    stdout: String,
    stderr: String,
}

impl std::fmt::Display for Run {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "exit {}\n--- stdout\n{}--- stderr\n{}",
            self.code, self.stdout, self.stderr
        )
    }
}

/// `KUBECONFIG` naming every cluster's own kubeconfig, merged as kubectl merges them (the
/// first file's current context wins).
fn kubeconfig_env(clusters: &[&TestCluster]) -> String {
    std::env::join_paths(clusters.iter().map(|c| c.kubeconfig_path()))
        .expect("kubeconfig paths")
        .into_string()
        .expect("UTF-8 paths")
}

/// Runs `program` (kubectl-mcs itself, or kubectl) with `args`.
async fn run_program(program: &Path, kubeconfig: &str, args: &[&str], path: Option<&str>) -> Run {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("COLUMNS", "100")
        .stdin(Stdio::null())
        .kill_on_drop(true);
    if let Some(path) = path {
        cmd.env("PATH", path);
    }
    let output = tokio::time::timeout(BUDGET, cmd.output())
        .await
        .unwrap_or_else(|_| {
            panic!(
                "{} {args:?}: still running after {BUDGET:?}",
                program.display()
            )
        })
        .unwrap_or_else(|e| panic!("run {}: {e}", program.display()));
    Run {
        code: output.status.code().expect("exited, not killed"),
        stdout: String::from_utf8_lossy(&output.stdout).into_owned(),
        stderr: String::from_utf8_lossy(&output.stderr).into_owned(),
    }
}

/// The shape of a JSON document, one line a path: `.services[].name: string` (arrays as
/// `[]`, the JSON type of each value seen at that path). It is what a user's script reads,
/// independent of the Rust types that print it.
fn json_shape(value: &serde_json::Value) -> std::collections::BTreeSet<String> {
    fn walk(value: &serde_json::Value, path: &str, out: &mut std::collections::BTreeSet<String>) {
        use serde_json::Value;
        let kind = match value {
            Value::Null => "null",
            Value::Bool(_) => "boolean",
            Value::Number(_) => "number",
            Value::String(_) => "string",
            Value::Array(items) => {
                for item in items {
                    walk(item, &format!("{path}[]"), out);
                }
                "array"
            }
            Value::Object(fields) => {
                for (key, field) in fields {
                    walk(field, &format!("{path}.{key}"), out);
                }
                "object"
            }
        };
        out.insert(format!(
            "{}: {kind}",
            if path.is_empty() { "." } else { path }
        ));
    }
    let mut out = std::collections::BTreeSet::new();
    walk(value, "", &mut out);
    out
}

/// Checks that the JSON `run` printed has exactly the shape in
/// `tests/fixtures/kubectl-mcs-<name>.shape` ([`json_shape`]): a renamed, retyped, added or
/// removed field fails here, as it would break a user's script. After a deliberate change
/// of the format, `MCS_BLESS=1` rewrites the file; review its diff.
fn assert_shape(run: &Run, name: &str) {
    let value: serde_json::Value =
        serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not JSON: {e}\n{run}"));
    let shape: Vec<String> = json_shape(&value).into_iter().collect();
    let file = Path::new(env!("CARGO_MANIFEST_DIR"))
        .join("tests/fixtures")
        .join(format!("kubectl-mcs-{name}.shape"));
    if std::env::var_os("MCS_BLESS").is_some() {
        std::fs::write(&file, shape.join("\n") + "\n").expect("write the shape file");
        return;
    }
    let pinned = std::fs::read_to_string(&file)
        .unwrap_or_else(|e| panic!("{}: {e} (MCS_BLESS=1 writes it)", file.display()));
    let pinned: Vec<&str> = pinned.lines().collect();
    let missing: Vec<&&str> = pinned
        .iter()
        .filter(|l| !shape.iter().any(|s| s == **l))
        .collect();
    let extra: Vec<&String> = shape
        .iter()
        .filter(|s| !pinned.contains(&s.as_str()))
        .collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "kubectl mcs {name} -o json changed shape against {}: gone {missing:#?}, new \
         {extra:#?} (a deliberate change: MCS_BLESS=1 rewrites the file)\n{run}",
        file.display()
    );
}

async fn kubectl_mcs(kubeconfig: &str, args: &[&str]) -> Run {
    run_program(
        Path::new(env!("CARGO_BIN_EXE_kubectl-mcs")),
        kubeconfig,
        args,
        None,
    )
    .await
}

fn parse<T: serde::de::DeserializeOwned>(run: &Run) -> T {
    serde_json::from_str(&run.stdout).unwrap_or_else(|e| panic!("not the JSON report: {e}\n{run}"))
}

async fn set_property(client: &Client, name: &str, value: &str) {
    let property = ClusterProperty::new(
        name,
        ClusterPropertySpec {
            value: value.into(),
        },
    );
    Api::<ClusterProperty>::all(client.clone())
        .patch(
            name,
            &PatchParams::apply("kubectl-mcs-test").force(),
            &Patch::Apply(&property),
        )
        .await
        .unwrap_or_else(|e| panic!("apply ClusterProperty {name}={value}: {e}"));
}

/// A Service `name` in [`NS`] (`headless` or with a ClusterIP) selecting `app=name` on
/// port 80, with one ready Pod at `pod_ip` when given, and its ServiceExport.
async fn export(client: &Client, name: &str, headless: bool, pod_ip: Option<&str>) {
    let mut spec = serde_json::json!({
        "selector": {"app": name},
        "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
    });
    if headless {
        spec["clusterIP"] = "None".into();
    }
    let service: Service = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "Service",
        "metadata": {"name": name, "namespace": NS},
        "spec": spec,
    }))
    .expect("a Service");
    Api::<Service>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &service)
        .await
        .unwrap_or_else(|e| panic!("create Service {NS}/{name}: {e}"));
    if let Some(ip) = pod_ip {
        support::create_ready_pod(
            client,
            NS,
            &format!("{name}-0"),
            &[("app", name)],
            ip,
            &[("http", 80)],
        )
        .await;
    }
    export_only(client, name).await;
}

/// A ServiceExport `name` in [`NS`].
async fn export_only(client: &Client, name: &str) {
    let mut export = ServiceExport::new(name, Default::default());
    export.metadata.namespace = Some(NS.into());
    Api::<ServiceExport>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &export)
        .await
        .unwrap_or_else(|e| panic!("create ServiceExport {NS}/{name}: {e}"));
}

/// `mcs-agent` of `local` (its kubeconfig as the default configuration, as in a Pod),
/// with every cluster of `all` as a member and a short heartbeat.
fn agent(local: &TestCluster, all: &[&TestCluster]) -> Child {
    agent_with(local, all, &["--admin-listen=127.0.0.1:0".to_owned()])
}

/// [`agent`] with `extra` arguments (which must include `--admin-listen`).
fn agent_with(local: &TestCluster, all: &[&TestCluster], extra: &[String]) -> Child {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcs-agent"));
    cmd.args(extra);
    for c in all {
        cmd.arg(format!(
            "--member={}={}",
            c.name(),
            c.kubeconfig_path().display()
        ));
    }
    cmd.arg(format!("--heartbeat-namespace={AGENT_NS}"))
        .arg("--heartbeat-seconds=6")
        .env("KUBECONFIG", local.kubeconfig_path())
        .env("RUST_LOG", "warn")
        .env_remove("MCS_CLUSTER_ID")
        .env_remove("POD_NAMESPACE")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start mcs-agent")
}

/// A loopback port free for both UDP and TCP right now (DNS needs both).
fn free_port() -> u16 {
    loop {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind UDP");
        let port = udp.local_addr().expect("local address").port();
        if std::net::TcpListener::bind(("127.0.0.1", port)).is_ok() {
            return port;
        }
    }
}

/// `mcs-dns` answering `clusterset.local` from `local` on `port`.
fn dns(local: &TestCluster, port: u16) -> Child {
    Command::new(env!("CARGO_BIN_EXE_mcs-dns"))
        .arg(format!("--listen=127.0.0.1:{port}"))
        .arg("--admin-listen=127.0.0.1:0")
        .arg(format!(
            "--kubeconfig={}",
            local.kubeconfig_path().display()
        ))
        .env("RUST_LOG", "warn")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .kill_on_drop(true)
        .spawn()
        .expect("start mcs-dns")
}

fn service<'a>(report: &'a StatusReport, name: &str) -> &'a ServiceStatus {
    report
        .services
        .iter()
        .find(|s| s.namespace == NS && s.name == name)
        .unwrap_or_else(|| panic!("no service {NS}/{name} in {report:#?}"))
}

/// Whether the agents have written all the test looks at: accrual exported by both, each
/// export's Pod ready (the EndpointSlice controller publishes it after the Pod is ready,
/// so an empty source is in sync too), imported in both clusters with every imported view
/// in sync with its source and holding that ready endpoint, ledger's
/// type conflict, ghost's Valid condition (the agent handles the three services in no set
/// order).
fn converged(report: &StatusReport) -> bool {
    let svc = |name: &str| {
        report
            .services
            .iter()
            .find(|s| s.namespace == NS && s.name == name)
    };
    let (Some(s), Some(ledger), Some(ghost)) = (svc("accrual"), svc("ledger"), svc("ghost")) else {
        return false;
    };
    s.imports.len() == 2
        && s.imports.iter().all(|i| {
            i.clusters == ["east", "west"]
                && i.sources.len() == 2
                && i.sources
                    .iter()
                    .all(|v| v.in_sync == Some(true) && v.endpoints.ready == 1)
        })
        && s.exports.len() == 2
        && s.exports
            .iter()
            .all(|e| e.valid.is_some() && e.conflict.is_some() && e.endpoints.ready == 1)
        && ledger.exports.iter().any(|e| {
            e.conflict
                .as_ref()
                .is_some_and(|c| c.status == "True" && c.reason.contains("TypeConflict"))
        })
        && !ghost.exports.is_empty()
        && ghost.exports.iter().all(|e| e.valid.is_some())
}

fn finding<'a>(
    report: &'a CheckReport,
    check: &str,
    context: Option<&str>,
) -> Vec<&'a mcs_cli::check::Finding> {
    report
        .findings
        .iter()
        .filter(|f| f.check == check && f.context.as_deref() == context)
        .collect()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn status_and_check_of_a_clusterset() {
    let (east, west) = tokio::join!(
        support::start_cluster(
            "east",
            ClusterOptions {
                service_cidr: "10.1.0.0/24".into(),
                pod_cidr: Some("10.101.0.0/16".into()),
                ..Default::default()
            }
        ),
        support::start_cluster(
            "west",
            ClusterOptions {
                service_cidr: "10.2.0.0/24".into(),
                pod_cidr: Some("10.102.0.0/16".into()),
                ..Default::default()
            }
        ),
    );
    let all = [&east, &west];
    let kubeconfig = kubeconfig_env(&all);
    let mut clients = Vec::new();
    for c in all {
        let client = c.client().await;
        support::create_namespace(&client, NS).await;
        support::create_namespace(&client, AGENT_NS).await;
        support::apply_manifest(&client, "deploy/rbac/agent-local.yaml", &[]).await;
        set_property(&client, CLUSTER_ID_PROPERTY, c.name()).await;
        set_property(&client, CLUSTERSET_PROPERTY, "loyalty-set").await;
        support::ensure_fake_node(&client).await;
        clients.push(client);
    }
    let (east_client, west_client) = (&clients[0], &clients[1]);
    // accrual: exported by both, one ready endpoint each. ledger: a ClusterSetIP Service in
    // east, a headless one in west (a type conflict). ghost: exported by east, no Service.
    export(east_client, "accrual", false, Some("192.0.2.10")).await;
    export(west_client, "accrual", false, Some("198.51.100.10")).await;
    export(east_client, "ledger", false, None).await;
    export(west_client, "ledger", true, None).await;
    export_only(east_client, "ghost").await;
    // The controller manager's node IPAM gives the Node a pod range.
    for client in &clients {
        let nodes: Api<Node> = Api::all(client.clone());
        support::wait_for("a pod range on the Node", BUDGET, || async {
            let node = nodes.get(support::FAKE_NODE).await.ok()?;
            node.spec?.pod_cidrs.filter(|c| !c.is_empty())
        })
        .await;
    }
    let _east_agent = agent(&east, &all);
    let mut west_agent = agent(&west, &all);
    let dns_port = free_port();
    let _dns = dns(&east, dns_port);

    // status, every service, once the agents have converged.
    let contexts = ["--context", "east", "--context", "west"];
    let json_args: Vec<&str> = ["status", "-o", "json"]
        .iter()
        .chain(&contexts)
        .copied()
        .collect();
    let (run, report) = support::wait_for(
        "status to show accrual imported everywhere, ledger's conflict and ghost's condition",
        BUDGET,
        || async {
            let run = kubectl_mcs(&kubeconfig, &json_args).await;
            let report: StatusReport = parse(&run);
            converged(&report).then_some((run, report))
        },
    )
    .await;
    assert_eq!(run.code, 0, "every member was read: {run}");
    assert_shape(&run, "status");
    let clusters: Vec<(&str, &str, bool)> = report
        .clusters
        .iter()
        .map(|c| (c.context.as_str(), c.cluster.as_str(), c.error.is_none()))
        .collect();
    assert_eq!(clusters, [("east", "east", true), ("west", "west", true)]);
    assert!(report.warnings.is_empty(), "{report:#?}");

    let accrual = service(&report, "accrual");
    assert!(accrual.problems.is_empty(), "{accrual:#?}");
    for e in &accrual.exports {
        let status =
            |c: &Option<mcs_cli::status::ConditionView>| c.as_ref().map(|c| c.status.clone());
        assert!(e.service_exists, "{e:#?}");
        assert_eq!(status(&e.valid).as_deref(), Some("True"), "{e:#?}");
        assert_eq!(status(&e.conflict).as_deref(), Some("False"), "{e:#?}");
        assert_eq!(
            (
                e.endpoints.ready,
                e.endpoints.serving,
                e.endpoints.terminating
            ),
            (1, 1, 0),
            "{e:#?}"
        );
    }
    for i in &accrual.imports {
        assert_eq!(i.type_, "ClusterSetIP", "{i:#?}");
        assert_eq!(i.ports, ["http:80/TCP"], "{i:#?}");
        for v in &i.sources {
            assert_eq!(v.endpoints.ready, 1, "{i:#?}");
            assert!(v.age_seconds.is_some(), "how stale the view is: {i:#?}");
            assert!(v.local_addresses.is_empty(), "{i:#?}");
        }
    }

    let ledger = service(&report, "ledger");
    let conflicted: Vec<_> = ledger
        .exports
        .iter()
        .filter_map(|e| e.conflict.as_ref().filter(|c| c.status == "True"))
        .collect();
    assert!(
        conflicted.iter().any(|c| c.reason.contains("TypeConflict")),
        "{ledger:#?}"
    );
    assert!(
        ledger
            .problems
            .iter()
            .any(|p| p.contains("conflict (") && p.contains("TypeConflict")),
        "{ledger:#?}"
    );

    let ghost = service(&report, "ghost");
    assert_eq!(ghost.exports.len(), 1, "{ghost:#?}");
    assert!(!ghost.exports[0].service_exists, "{ghost:#?}");
    assert_eq!(
        ghost.exports[0].valid.as_ref().map(|c| c.reason.as_str()),
        Some("NoService"),
        "{ghost:#?}"
    );
    assert!(
        ghost.problems.iter().any(|p| p.contains(
            "east: the ServiceExport names no Service: create Service loyalty/ghost there"
        )),
        "{ghost:#?}"
    );

    // One service, as YAML and as a table; the members found through the ClusterProperty
    // clusterset.k8s.io of the current context (east), as no --context is given.
    let yaml = kubectl_mcs(&kubeconfig, &["status", "loyalty/ghost", "-o", "yaml"]).await;
    assert_eq!(yaml.code, 0, "{yaml}");
    let from_yaml: StatusReport =
        serde_saphyr::from_str(&yaml.stdout).unwrap_or_else(|e| panic!("not YAML: {e}\n{yaml}"));
    assert_eq!(
        from_yaml.clusters.len(),
        2,
        "both members discovered: {yaml}"
    );
    assert_eq!(from_yaml.services.len(), 1, "{yaml}");
    assert_eq!(from_yaml.services[0].name, "ghost", "{yaml}");
    let table = kubectl_mcs(&kubeconfig, &["status", "loyalty/accrual"]).await;
    assert_eq!(table.code, 0, "{table}");
    for needle in [
        "SERVICE loyalty/accrual",
        "EXPORTED BY",
        "IMPORTED BY",
        "in sync",
    ] {
        assert!(table.stdout.contains(needle), "{needle:?} missing: {table}");
    }
    assert!(
        table.stdout.lines().all(|l| l.chars().count() <= 100),
        "wider than COLUMNS: {table}"
    );
    eprintln!("kubectl mcs status loyalty/accrual:\n{}", table.stdout);

    // check: passes once the DNS server answers (it starts in parallel).
    let dns_flag = format!("--dns=east=127.0.0.1:{dns_port}");
    let check_args: Vec<&str> = ["check", "-o", "json", &dns_flag]
        .iter()
        .chain(&contexts)
        .copied()
        .collect();
    let (run, report) = support::wait_for("check to pass", BUDGET, || async {
        let run = kubectl_mcs(&kubeconfig, &check_args).await;
        let report: CheckReport = parse(&run);
        report.passed.then_some((run, report))
    })
    .await;
    assert_eq!(run.code, 0, "{run}");
    assert_shape(&run, "check");
    for ctx in ["east", "west"] {
        for check in ["agent", "crds", "cluster-id", "rbac"] {
            let found = finding(&report, check, Some(ctx));
            assert!(
                found.len() == 1 && found[0].verdict == Verdict::Ok,
                "{check} of {ctx}: {found:#?}"
            );
        }
        assert!(
            finding(&report, "cidrs", Some(ctx)).is_empty(),
            "both ranges known: {report:#?}"
        );
    }
    let dns_east = finding(&report, "dns", Some("east"));
    assert!(
        dns_east[0].verdict == Verdict::Ok && dns_east[0].message.contains("SOA"),
        "{dns_east:#?}"
    );
    // West has neither a CoreDNS configuration nor a --dns server: not checked, a warning.
    assert_eq!(
        finding(&report, "dns", Some("west"))[0].verdict,
        Verdict::Warning
    );
    let cidrs = finding(&report, "cidrs", None);
    assert!(
        cidrs.len() == 1 && cidrs[0].verdict == Verdict::Ok,
        "{cidrs:#?}"
    );
    let table = kubectl_mcs(&kubeconfig, &["check", &dns_flag]).await;
    assert_eq!(table.code, 0, "{table}");
    assert!(table.stdout.contains("PASSED: 0 problem(s)"), "{table}");
    eprintln!("kubectl mcs check:\n{}", table.stdout);

    // Through kubectl, as a plugin found on PATH.
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_kubectl-mcs"))
        .parent()
        .unwrap();
    let path = std::env::join_paths([bin_dir.to_path_buf()].into_iter().chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap()
    .into_string()
    .unwrap();
    let kubectl: PathBuf = support::bin_dir().join("kubectl");
    let plugin = run_program(
        &kubectl,
        &kubeconfig,
        &["mcs", "status", "loyalty/accrual", "--context", "west"],
        Some(&path),
    )
    .await;
    assert_eq!(plugin.code, 0, "{plugin}");
    assert!(
        plugin.stdout.contains("SERVICE loyalty/accrual"),
        "{plugin}"
    );

    // West's agent crashes: once its heartbeat runs out, check fails naming it.
    west_agent.kill().await.expect("kill west's agent");
    let (run, report) = support::wait_for("check to see west's agent down", BUDGET, || async {
        let run = kubectl_mcs(&kubeconfig, &check_args).await;
        let report: CheckReport = parse(&run);
        let down = finding(&report, "agent", Some("west")).iter().any(|f| {
            f.verdict == Verdict::Problem && f.message.starts_with("down: last heartbeat")
        });
        down.then_some((run, report))
    })
    .await;
    assert_eq!(run.code, 1, "{run}");
    assert!(!report.passed);
    assert_eq!(
        finding(&report, "agent", Some("east"))[0].verdict,
        Verdict::Ok
    );
    let table = kubectl_mcs(&kubeconfig, &["check", &dns_flag]).await;
    assert_eq!(table.code, 1, "{table}");
    assert!(table.stdout.contains("FAILED: 1 problem(s)"), "{table}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn overlapping_ranges_and_unreachable_members() {
    let options = |service_cidr: &str| ClusterOptions {
        controller_manager: false,
        service_cidr: service_cidr.into(),
        ..Default::default()
    };
    let (east, mut west) = tokio::join!(
        support::start_cluster("east", options("10.0.0.0/24")),
        support::start_cluster("west", options("10.0.0.128/25")),
    );
    let kubeconfig = kubeconfig_env(&[&east, &west]);
    // A Node in each with the same pod range, as two clusters installed with the same
    // defaults have.
    for c in [&east, &west] {
        let node: Node = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Node",
            "metadata": {"name": format!("{}-node", c.name())},
            "spec": {"podCIDR": "10.244.0.0/24", "podCIDRs": ["10.244.0.0/24"]},
        }))
        .unwrap();
        Api::<Node>::all(c.client().await)
            .create(&PostParams::default(), &node)
            .await
            .expect("create a Node");
        set_property(&c.client().await, CLUSTER_ID_PROPERTY, c.name()).await;
    }
    let contexts = ["--context", "east", "--context", "west"];
    let args = |cmd: &'static str| -> Vec<&str> {
        [cmd, "-o", "json"]
            .iter()
            .chain(&contexts)
            .copied()
            .collect()
    };

    let run = kubectl_mcs(&kubeconfig, &args("check")).await;
    assert_eq!(run.code, 1, "{run}");
    let report: CheckReport = parse(&run);
    assert!(!report.passed);
    let cidrs: Vec<&str> = finding(&report, "cidrs", None)
        .iter()
        .filter(|f| f.verdict == Verdict::Problem)
        .map(|f| f.message.as_str())
        .collect();
    assert_eq!(
        cidrs.len(),
        2,
        "one overlap of pods, one of services: {cidrs:#?}"
    );
    assert!(
        cidrs.iter().any(|m| m.starts_with(
            "east service range 10.0.0.0/24 overlaps west service range 10.0.0.128/25"
        )),
        "{cidrs:#?}"
    );
    assert!(
        cidrs
            .iter()
            .any(|m| m
                .starts_with("east pod range 10.244.0.0/24 overlaps west pod range 10.244.0.0/24")),
        "{cidrs:#?}"
    );
    // No agent ran here: that is reported too.
    for ctx in ["east", "west"] {
        let agent = finding(&report, "agent", Some(ctx));
        assert!(
            agent[0].verdict == Verdict::Problem
                && agent[0].message.starts_with("no heartbeat Lease"),
            "{agent:#?}"
        );
    }
    // status shows the overlap as a warning of the ClusterSet.
    let run = kubectl_mcs(&kubeconfig, &args("status")).await;
    assert_eq!(run.code, 0, "{run}");
    let report: StatusReport = parse(&run);
    assert_eq!(report.warnings.len(), 2, "{report:#?}");
    assert!(report.services.is_empty(), "{report:#?}");

    // The agents see it too. West exports a service whose endpoint lies in east's service
    // range: east's agent imports it and reports it, and the overlaps, as Warning events
    // and on /metrics.
    for c in [&east, &west] {
        let client = c.client().await;
        support::create_namespace(&client, NS).await;
        support::create_namespace(&client, AGENT_NS).await;
    }
    let west_client = west.client().await;
    export(&west_client, "accrual", false, None).await;
    let slice: k8s_openapi::api::discovery::v1::EndpointSlice =
        serde_json::from_value(serde_json::json!({
            "apiVersion": "discovery.k8s.io/v1", "kind": "EndpointSlice",
            "metadata": {"name": "accrual-1", "namespace": NS, "labels": {
                "kubernetes.io/service-name": "accrual",
                "endpointslice.kubernetes.io/managed-by": "kubectl-mcs-test",
            }},
            "addressType": "IPv4",
            "endpoints": [{"addresses": ["10.0.0.50"], "conditions": {"ready": true}}],
            "ports": [{"name": "http", "port": 80, "protocol": "TCP"}],
        }))
        .unwrap();
    Api::<k8s_openapi::api::discovery::v1::EndpointSlice>::namespaced(west_client.clone(), NS)
        .create(&PostParams::default(), &slice)
        .await
        .expect("create west's EndpointSlice");
    let admin_port = free_port();
    let _east_agent = agent_with(
        &east,
        &[&east, &west],
        &[
            format!("--admin-listen=127.0.0.1:{admin_port}"),
            "--cidr-check-seconds=1".to_owned(),
        ],
    );
    let _west_agent = agent(&west, &[&east, &west]);
    let metrics_url = format!("http://127.0.0.1:{admin_port}/metrics");
    let wanted = [
        r#"mcs_agent_cidr_conflicts{kind="local_endpoint",cluster="west"} 1"#,
        r#"mcs_agent_cidr_conflicts{kind="member_overlap",cluster="west"} 2"#,
    ];
    let scraped = support::wait_for(
        "east's agent to count the CIDR problems",
        BUDGET,
        || async {
            let (code, body) = support::http_get(&metrics_url).await.ok()?;
            (code == 200 && wanted.iter().all(|w| body.lines().any(|l| l == *w))).then_some(body)
        },
    )
    .await;
    // Every agent metric of the table (docs/metrics.md, mcs_kube::metrics::ALL) is on the
    // agent's /metrics, with the type the table gives it.
    let missing: Vec<String> = mcs_kube::metrics::ALL
        .iter()
        .filter(|m| m.name.starts_with("mcs_agent_"))
        .map(|m| format!("# TYPE {} {}", m.name, m.kind.as_str()))
        .filter(|line| !scraped.lines().any(|l| l == line))
        .collect();
    assert!(
        missing.is_empty(),
        "not on /metrics: {missing:?}\n{scraped}"
    );
    let events: Api<k8s_openapi::api::events::v1::Event> = Api::all(east.client().await);
    let (local, overlap) = support::wait_for("east's agent's Warning events", BUDGET, || async {
        let list = events.list(&Default::default()).await.ok()?.items;
        let find = |reason: &str| {
            list.iter()
                .find(|e| {
                    e.reason.as_deref() == Some(reason) && e.type_.as_deref() == Some("Warning")
                })
                .cloned()
        };
        Some((
            find("ImportedEndpointInLocalCIDR")?,
            find("OverlappingClusterCIDR")?,
        ))
    })
    .await;
    let regarding = local.regarding.as_ref().expect("regarding");
    assert_eq!(
        (
            regarding.kind.as_deref(),
            regarding.namespace.as_deref(),
            regarding.name.as_deref()
        ),
        (Some("ServiceImport"), Some(NS), Some("accrual"))
    );
    assert_eq!(
        local.note.as_deref(),
        Some(
            "1 endpoint(s) of loyalty/accrual imported from west lie in this cluster's own ranges, so traffic to them stays here: 10.0.0.50 in service range 10.0.0.0/24"
        )
    );
    assert!(
        overlap
            .note
            .as_deref()
            .is_some_and(|n| n.starts_with("east ")),
        "{overlap:#?}"
    );
    // And status shows east's view of west's endpoint as local.
    let report: StatusReport = support::wait_for("status to show the import", BUDGET, || async {
        let report: StatusReport = parse(&kubectl_mcs(&kubeconfig, &args("status")).await);
        let found = report
            .services
            .iter()
            .any(|s| s.imports.iter().any(|i| i.cluster == "east"));
        found.then_some(report)
    })
    .await;
    let accrual = service(&report, "accrual");
    let east_view = accrual
        .imports
        .iter()
        .find(|i| i.cluster == "east")
        .and_then(|i| i.sources.iter().find(|v| v.cluster == "west"))
        .unwrap_or_else(|| panic!("{accrual:#?}"));
    assert_eq!(
        east_view.local_addresses,
        ["10.0.0.50 in service range 10.0.0.0/24"],
        "{accrual:#?}"
    );
    assert!(
        accrual
            .problems
            .iter()
            .any(|p| p.starts_with("east: endpoints imported from west are inside its own ranges")),
        "{accrual:#?}"
    );

    // West's API server goes down: status still shows east, and exits 1; check names west.
    west.stop();
    let run = kubectl_mcs(&kubeconfig, &args("status")).await;
    assert_eq!(run.code, 1, "{run}");
    let report: StatusReport = parse(&run);
    assert!(report.clusters[0].error.is_none(), "{report:#?}");
    assert!(report.clusters[1].error.is_some(), "{report:#?}");
    let run = kubectl_mcs(&kubeconfig, &args("check")).await;
    assert_eq!(run.code, 1, "{run}");
    let report: CheckReport = parse(&run);
    let reachable = finding(&report, "reachable", Some("west"));
    assert!(
        reachable.len() == 1 && reachable[0].verdict == Verdict::Problem,
        "{report:#?}"
    );

    // A context the kubeconfig does not have: cannot run, exit 2, saying which.
    let run = kubectl_mcs(&kubeconfig, &["status", "--context", "north"]).await;
    assert_eq!(run.code, 2, "{run}");
    assert!(run.stderr.contains("north"), "{run}");
    // A malformed service name: exit 2 too.
    let run = kubectl_mcs(&kubeconfig, &["status", "accrual", "--context", "east"]).await;
    assert_eq!(run.code, 2, "{run}");
    assert!(run.stderr.contains("expected NAMESPACE/NAME"), "{run}");
}
