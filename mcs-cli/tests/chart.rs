//! The Helm chart (`charts/mcs`) with real Helm 3 and Helm 4 (`scripts/helm-bins.sh`) and a
//! real API server: `helm lint --strict`, the values schema refusing a mistyped value, the
//! README listing every value, the ClusterProperties following `clusterId` and `clusterSet`,
//! every mode's rendering accepted by the API server's
//! server-side apply (and a broken template refused by it), the chart's RBAC equal to
//! `deploy/rbac/` rule for rule, and `helm install` / `upgrade` / `uninstall` in the mesh
//! and hub topologies leaving nothing behind but the CRDs.

use mcs_testkit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::{Path, PathBuf};
use std::process::{Command, Output, Stdio};

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DynamicObject, GroupVersionKind, ListParams, Patch, PatchParams};
use kube::discovery::Scope;
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, ResourceExt};
use serde_json::Value;

/// The values files of `charts/mcs/ci/`, one per mode.
const MODES: [&str; 4] = ["mesh", "mesh-noid", "hub", "hub-server"];

fn repo() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("..")
}

fn chart() -> PathBuf {
    repo().join("charts/mcs")
}

fn values(mode: &str) -> PathBuf {
    chart().join(format!("ci/{mode}-values.yaml"))
}

/// Helm 3 and Helm 4, built by `scripts/helm-bins.sh` (`scripts/test.sh` exports them).
fn helms() -> [(&'static str, PathBuf); 2] {
    let get = |var: &str| {
        let path = std::env::var_os(var).map(PathBuf::from).unwrap_or_else(|| {
            panic!("{var} is not set: run scripts/test.sh, or export {var}=$(scripts/helm-bins.sh | tail -n 2 ...)")
        });
        assert!(
            path.is_file(),
            "{var}={} does not exist: run scripts/helm-bins.sh",
            path.display()
        );
        path
    };
    [("helm 3", get("MCS_HELM3")), ("helm 4", get("MCS_HELM4"))]
}

fn helm(bin: &Path, args: &[&str], kubeconfig: Option<&Path>) -> Output {
    let mut cmd = Command::new(bin);
    cmd.args(args).stdin(Stdio::null());
    // Helm's own state (repositories, cache) in a temporary home, never the user's.
    let home = std::env::temp_dir().join("mcs-chart-test-helm");
    cmd.env("HELM_CACHE_HOME", home.join("cache"))
        .env("HELM_CONFIG_HOME", home.join("config"))
        .env("HELM_DATA_HOME", home.join("data"));
    match kubeconfig {
        Some(k) => cmd.env("KUBECONFIG", k),
        None => cmd.env("KUBECONFIG", "/nonexistent"),
    };
    cmd.output()
        .unwrap_or_else(|e| panic!("run {}: {e}", bin.display()))
}

fn ok(out: Output, what: &str) -> String {
    let text = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{text}",
        out.status
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

fn render(bin: &Path, mode: &str, extra: &[&str]) -> String {
    let values = values(mode);
    let chart = chart();
    let mut args = vec![
        "template",
        "mcs",
        chart.to_str().unwrap(),
        "--namespace",
        "mcs-system",
        "--include-crds",
        "-f",
        values.to_str().unwrap(),
    ];
    args.extend_from_slice(extra);
    ok(helm(bin, &args, None), &format!("helm template ({mode})"))
}

fn documents(yaml: &str) -> Vec<DynamicObject> {
    let docs: Vec<Value> = serde_saphyr::from_multiple(yaml).expect("helm renders YAML");
    docs.into_iter()
        .filter(|d| !d.is_null())
        .map(|d| serde_json::from_value(d).expect("a Kubernetes object"))
        .collect()
}

fn kind(obj: &DynamicObject) -> &str {
    obj.types.as_ref().map_or("", |t| t.kind.as_str())
}

#[test]
fn chart_lints_strictly_with_helm_3_and_4_in_every_mode() {
    for (name, bin) in helms() {
        for mode in MODES {
            let values = values(mode);
            ok(
                helm(
                    &bin,
                    &[
                        "lint",
                        "--strict",
                        chart().to_str().unwrap(),
                        "-f",
                        values.to_str().unwrap(),
                    ],
                    None,
                ),
                &format!("{name} lint --strict ({mode})"),
            );
        }
    }
}

/// The ClusterProperties rendered, as name → value.
fn cluster_properties(objs: &[DynamicObject]) -> BTreeMap<String, String> {
    objs.iter()
        .filter(|o| kind(o) == "ClusterProperty")
        .map(|o| {
            let value = o.data["spec"]["value"]
                .as_str()
                .unwrap_or_default()
                .to_owned();
            (o.name_any(), value)
        })
        .collect()
}

#[test]
fn cluster_properties_carry_the_cluster_id_and_the_clusterset() {
    let (_, helm4) = &helms()[1];
    let props =
        |mode: &str, extra: &[&str]| cluster_properties(&documents(&render(helm4, mode, extra)));
    // mesh: clusterId east, clusterSet shop.
    assert_eq!(
        props("mesh", &[]),
        BTreeMap::from([
            (
                mcs_core::api::CLUSTER_ID_PROPERTY.to_owned(),
                "east".to_owned()
            ),
            (
                mcs_core::api::CLUSTERSET_PROPERTY.to_owned(),
                "shop".to_owned()
            ),
        ])
    );
    // No clusterId: the agent reads it from a ClusterProperty made elsewhere.
    assert_eq!(props("mesh-noid", &[]), BTreeMap::new());
    // Managed elsewhere.
    assert_eq!(
        props("mesh", &["--set", "clusterProperties.create=false"]),
        BTreeMap::new()
    );
    // A hub API server that is no member has no id.
    assert_eq!(props("hub-server", &[]), BTreeMap::new());
}

#[test]
fn a_mistyped_value_fails_through_the_schema() {
    for (name, bin) in helms() {
        let with = |set: &str| {
            let (values, chart) = (values("mesh"), chart());
            let args = [
                "template",
                "mcs",
                chart.to_str().unwrap(),
                "-f",
                values.to_str().unwrap(),
                "--set",
                set,
            ];
            helm(&bin, &args, None)
        };
        let out = with("agent.mdoe=hub");
        let text = String::from_utf8_lossy(&out.stderr);
        assert!(!out.status.success(), "{name} accepted agent.mdoe");
        assert!(
            text.contains("mdoe") && text.contains("not allowed"),
            "{name}: {text}"
        );
        // A value of the wrong type, too.
        assert!(
            !with("dns.replicas=two").status.success(),
            "{name} accepted dns.replicas=two"
        );
    }
}

/// The keys of values.yaml, dotted: a map is walked into where the schema lists its
/// properties inline; a map or list the schema takes whole (a `$ref` to a definition, such as
/// `resources` or `affinity`, passed to Kubernetes as it is) is one key.
fn value_keys(values: &Value, schema: &Value, prefix: &str, out: &mut BTreeSet<String>) {
    let inline = schema.get("$ref").is_none();
    match (
        values.as_object(),
        schema.get("properties").and_then(Value::as_object),
    ) {
        (Some(map), Some(props)) if inline => {
            for (key, value) in map {
                let sub = props
                    .get(key)
                    .unwrap_or_else(|| panic!("values key {prefix}{key} has no schema"));
                value_keys(value, sub, &format!("{prefix}{key}."), out);
            }
        }
        _ => {
            out.insert(prefix.trim_end_matches('.').to_owned());
        }
    }
}

#[test]
fn readme_lists_every_value_of_values_yaml() {
    let values: Value =
        serde_saphyr::from_str(&std::fs::read_to_string(chart().join("values.yaml")).unwrap())
            .unwrap();
    let schema: Value =
        serde_json::from_str(&std::fs::read_to_string(chart().join("values.schema.json")).unwrap())
            .unwrap();
    let mut keys = BTreeSet::new();
    value_keys(&values, &schema, "", &mut keys);
    let readme = std::fs::read_to_string(chart().join("README.md")).unwrap();
    let listed: BTreeSet<String> = readme
        .lines()
        .filter_map(|l| l.strip_prefix("| `"))
        .filter_map(|l| l.split_once('`').map(|(k, _)| k.to_owned()))
        .collect();
    let missing: Vec<_> = keys.difference(&listed).collect();
    let extra: Vec<_> = listed.difference(&keys).collect();
    assert!(
        missing.is_empty() && extra.is_empty(),
        "README misses {missing:?}; lists unknown {extra:?}"
    );
    assert!(keys.len() > 50, "{keys:?}");
}

/// The rules, role references and subjects of RBAC objects, by kind and name.
fn rbac(objs: &[DynamicObject]) -> Vec<(String, String, Value)> {
    let mut out: Vec<(String, String, Value)> = objs
        .iter()
        .filter(|o| ["Role", "ClusterRole", "RoleBinding", "ClusterRoleBinding"].contains(&kind(o)))
        .map(|o| {
            let mut body = serde_json::json!({
                "namespace": o.namespace(),
                "rules": o.data.get("rules"),
                "roleRef": o.data.get("roleRef"),
                "subjects": o.data.get("subjects").map(|s| {
                    let mut s = s.clone();
                    // The API server defaults apiGroup for User and Group subjects.
                    for subject in s.as_array_mut().into_iter().flatten() {
                        if subject["kind"] != "ServiceAccount" && subject.get("apiGroup").is_none() {
                            subject["apiGroup"] = "rbac.authorization.k8s.io".into();
                        }
                    }
                    s
                }),
            });
            if let Some(rules) = body["rules"].as_array_mut() {
                rules.sort_by_key(|r| r.to_string());
            }
            (kind(o).to_owned(), o.name_any(), body)
        })
        .collect();
    out.sort_by(|a, b| (&a.0, &a.1).cmp(&(&b.0, &b.1)));
    out
}

#[test]
fn chart_rbac_equals_deploy_rbac() {
    // deploy/rbac/ is what the RBAC tests apply; the chart must grant exactly the same.
    let (_, helm3) = &helms()[0];
    let mesh = documents(&render(helm3, "mesh", &[]));
    let mut shipped = Vec::new();
    for f in ["agent-local", "agent-peer-reader", "dns"] {
        shipped.extend(support::manifest(&format!("deploy/rbac/{f}.yaml")));
    }
    let chart_rbac: Vec<_> = rbac(&mesh)
        .into_iter()
        // The binding of the peer reader names the subjects of ci/mesh-values.yaml.
        .filter(|(k, n, _)| !(k == "ClusterRoleBinding" && n.contains("peer-reader")))
        .collect();
    let shipped_rbac: Vec<_> = rbac(&shipped)
        .into_iter()
        .filter(|(k, n, _)| !(k == "ClusterRoleBinding" && n.contains("peer-reader")))
        .collect();
    assert_eq!(
        chart_rbac, shipped_rbac,
        "the chart's RBAC (mesh) and deploy/rbac/ differ"
    );

    let hub = documents(&render(
        helm3,
        "hub-server",
        &["--set", "hub.members={east}"],
    ));
    let mut shipped = support::manifest("deploy/rbac/hub.yaml");
    shipped.extend(support::manifest_with(
        "deploy/rbac/hub-member.yaml",
        &[("MEMBER_ID", "east")],
    ));
    assert_eq!(
        rbac(&hub),
        rbac(&shipped),
        "the chart's hub RBAC and deploy/rbac/hub*.yaml differ"
    );
}

/// Server-side applies `obj` as field manager `helm-template-test`.
async fn try_apply(client: &Client, obj: &DynamicObject) -> Result<(), String> {
    let types = obj.types.as_ref().ok_or("no apiVersion/kind")?;
    let gvk = GroupVersionKind::try_from(types).map_err(|e| e.to_string())?;
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .map_err(|e| format!("{} {}: {e}", kind(obj), obj.name_any()))?;
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            &obj.namespace().unwrap_or_else(|| "mcs-system".into()),
            &resource,
        ),
    };
    api.patch(
        &obj.name_any(),
        &PatchParams::apply("helm-template-test").force(),
        &Patch::Apply(obj),
    )
    .await
    .map(|_| ())
    .map_err(|e| format!("{} {}: {e}", kind(obj), obj.name_any()))
}

/// Applies CRDs first and waits until they are established, then namespaces, then the rest.
async fn apply_all(client: &Client, objs: &[DynamicObject]) -> Result<(), String> {
    let order = |o: &DynamicObject| match kind(o) {
        "CustomResourceDefinition" => 0,
        "Namespace" => 1,
        _ => 2,
    };
    let mut objs: Vec<&DynamicObject> = objs.iter().collect();
    objs.sort_by_key(|o| order(o));
    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    let mut waited = false;
    for obj in objs {
        if !waited && kind(obj) != "CustomResourceDefinition" {
            waited = true;
            for crd in crds
                .list(&ListParams::default())
                .await
                .map_err(|e| e.to_string())?
            {
                let name = crd.name_any();
                let established =
                    await_condition(crds.clone(), &name, conditions::is_crd_established());
                tokio::time::timeout(std::time::Duration::from_secs(60), established)
                    .await
                    .map_err(|_| format!("CRD {} not established", crd.name_any()))?
                    .map_err(|e| e.to_string())?;
            }
        }
        try_apply(client, obj).await?;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn every_mode_renders_what_the_api_server_accepts() {
    let cluster =
        support::start_cluster("chart-template", support::ClusterOptions::api_only()).await;
    let client = cluster.client().await;
    support::create_namespace(&client, "mcs-system").await;
    let (_, helm4) = &helms()[1];
    for mode in MODES {
        // The ServiceMonitor needs the Prometheus operator's CRD, which this cluster lacks.
        let objs: Vec<DynamicObject> = documents(&render(
            helm4,
            mode,
            &["--set", "metrics.serviceMonitor.enabled=false"],
        ));
        assert!(!objs.is_empty(), "{mode} rendered nothing");
        apply_all(&client, &objs)
            .await
            .unwrap_or_else(|e| panic!("{mode}: the API server refused: {e}"));
    }

    // A template broken on purpose (a Deployment field that does not exist) is refused.
    let broken = tempfile::tempdir().unwrap();
    copy_dir(&chart(), broken.path());
    let deployment = broken.path().join("templates/dns-deployment.yaml");
    let text = std::fs::read_to_string(&deployment).unwrap();
    let text = text.replacen("spec:\n", "spec:\n  replicaz: 2\n", 1);
    std::fs::write(&deployment, text).unwrap();
    let out = helm(
        helm4,
        &[
            "template",
            "mcs",
            broken.path().to_str().unwrap(),
            "--namespace",
            "mcs-system",
            "-f",
            values("mesh").to_str().unwrap(),
            "--set",
            "metrics.serviceMonitor.enabled=false",
        ],
        None,
    );
    let objs = documents(&ok(out, "helm template (broken)"));
    let dns = objs
        .iter()
        .find(|o| kind(o) == "Deployment" && o.name_any().contains("dns"))
        .expect("the DNS Deployment");
    let err = try_apply(&client, dns)
        .await
        .expect_err("an unknown field must be refused");
    assert!(err.contains("replicaz"), "{err}");
}

fn copy_dir(from: &Path, to: &Path) {
    let out = Command::new("cp")
        .arg("-a")
        .arg(format!("{}/.", from.display()))
        .arg(to)
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Every object of the release `release` (label app.kubernetes.io/instance) of the kinds the
/// chart makes, as `kind/namespace/name`.
async fn release_objects(client: &Client, release: &str) -> BTreeSet<String> {
    let selector = format!("app.kubernetes.io/instance={release}");
    let mut out = BTreeSet::new();
    let discovery = kube::Discovery::new(client.clone())
        .run()
        .await
        .expect("discovery");
    for group in discovery.groups() {
        for (resource, caps) in group.recommended_resources() {
            if !caps.supports_operation(kube::discovery::verbs::LIST) || resource.kind == "Event" {
                continue;
            }
            let api: Api<DynamicObject> = Api::all_with(client.clone(), &resource);
            let Ok(list) = api.list(&ListParams::default().labels(&selector)).await else {
                continue;
            };
            for obj in list {
                out.insert(format!(
                    "{}/{}/{}",
                    resource.kind,
                    obj.namespace().unwrap_or_default(),
                    obj.name_any()
                ));
            }
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn install_upgrade_uninstall_in_mesh_and_hub() {
    let cluster =
        support::start_cluster("chart-install", support::ClusterOptions::api_only()).await;
    let client = cluster.client().await;
    let kubeconfig = cluster.kubeconfig_path();
    let [(_, helm3), (_, helm4)] = helms();
    let chart = chart();
    let chart = chart.to_str().unwrap();

    for (name, bin, mode) in [("helm 3", &helm3, "mesh"), ("helm 4", &helm4, "hub")] {
        let values = values(mode);
        let base = [
            "--namespace",
            "mcs-system",
            "-f",
            values.to_str().unwrap(),
            "--set",
            "metrics.serviceMonitor.enabled=false",
        ];
        let mut install = vec!["install", "mcs", chart, "--create-namespace"];
        install.extend_from_slice(&base);
        ok(
            helm(bin, &install, Some(&kubeconfig)),
            &format!("{name} install ({mode})"),
        );
        let installed = release_objects(&client, "mcs").await;
        assert!(
            installed
                .iter()
                .any(|o| o.starts_with("Deployment/mcs-system/mcs-agent")),
            "{name} {mode}: {installed:?}"
        );
        assert!(
            installed
                .iter()
                .any(|o| o.starts_with("Service/mcs-system/mcs-dns")),
            "{installed:?}"
        );
        // The cluster id's ClusterProperty where the values give the id (mesh's do).
        let property = format!("ClusterProperty//{}", mcs_core::api::CLUSTER_ID_PROPERTY);
        assert_eq!(
            installed.contains(&property),
            mode == "mesh",
            "{name} {mode}: {property}: {installed:?}"
        );
        let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
        let crd = crds
            .get("serviceexports.multicluster.x-k8s.io")
            .await
            .expect("the chart installs the CRDs");
        assert_eq!(
            crd.labels()["multicluster.x-k8s.io/release-version"],
            "v0.5.0"
        );

        // A values change.
        let mut upgrade = vec!["upgrade", "mcs", chart, "--set", "dns.replicas=3"];
        upgrade.extend_from_slice(&base);
        ok(
            helm(bin, &upgrade, Some(&kubeconfig)),
            &format!("{name} upgrade (values)"),
        );
        let deployments: Api<Deployment> = Api::namespaced(client.clone(), "mcs-system");
        let dns = deployments
            .get("mcs-dns")
            .await
            .expect("the DNS Deployment");
        assert_eq!(dns.spec.and_then(|s| s.replicas), Some(3));

        // A new chart version.
        let next = tempfile::tempdir().unwrap();
        copy_dir(Path::new(chart), next.path());
        let chart_yaml = next.path().join("Chart.yaml");
        let text = std::fs::read_to_string(&chart_yaml)
            .unwrap()
            .replace("version: 0.1.0", "version: 0.1.1");
        std::fs::write(&chart_yaml, text).unwrap();
        let mut upgrade = vec!["upgrade", "mcs", next.path().to_str().unwrap()];
        upgrade.extend_from_slice(&base);
        ok(
            helm(bin, &upgrade, Some(&kubeconfig)),
            &format!("{name} upgrade (chart version)"),
        );
        let agent = deployments
            .get("mcs-agent")
            .await
            .expect("the agent Deployment");
        assert_eq!(agent.labels()["helm.sh/chart"], "mcs-0.1.1");

        // Uninstall: nothing of the release is left; the CRDs stay (Helm never deletes crds/).
        ok(
            helm(
                bin,
                &["uninstall", "mcs", "--namespace", "mcs-system", "--wait"],
                Some(&kubeconfig),
            ),
            &format!("{name} uninstall"),
        );
        let left = release_objects(&client, "mcs").await;
        assert!(left.is_empty(), "{name} {mode}: left behind: {left:?}");
        crds.get("serviceexports.multicluster.x-k8s.io")
            .await
            .expect("the CRDs stay");
    }
}

#[test]
fn chart_copies_equal_the_generated_files() {
    // The chart packages copies (Helm reads only files inside the chart); the originals are
    // generated (`mcs-crds`) or tested (the dashboard's metrics) elsewhere.
    for (copy, original) in [
        ("charts/mcs/crds/mcs-crds.yaml", "deploy/crds/mcs-crds.yaml"),
        (
            "charts/mcs/files/memberexports.yaml",
            "deploy/hub/memberexports.yaml",
        ),
        (
            "charts/mcs/dashboards/mcs.json",
            "deploy/grafana/mcs-dashboard.json",
        ),
    ] {
        let read = |p: &str| std::fs::read(repo().join(p)).unwrap_or_else(|e| panic!("{p}: {e}"));
        assert!(
            read(copy) == read(original),
            "{copy} differs from {original}: cp {original} {copy}"
        );
    }
}

/// The chart runs the image `scripts/image.sh` builds, `mcs:<version>`, in every mode
/// (`tests/image.rs` checks `deploy/` and that the programs are in the image).
#[test]
fn every_image_named_is_the_one_scripts_image_sh_builds() {
    let built = format!("mcs:{}", env!("CARGO_PKG_VERSION"));
    let mut named = Vec::new();
    let (_, helm4) = &helms()[1];
    for mode in MODES {
        for obj in documents(&render(helm4, mode, &[])) {
            for container in obj
                .data
                .pointer("/spec/template/spec/containers")
                .and_then(Value::as_array)
                .into_iter()
                .flatten()
            {
                named.push((
                    format!("{mode}: {} {}", kind(&obj), obj.name_any()),
                    container["image"].as_str().unwrap_or_default().to_owned(),
                    container["command"][0].as_str().map(str::to_owned),
                ));
            }
        }
    }
    assert!(named.len() >= 4, "{named:?}");
    let other: Vec<_> = named
        .iter()
        .filter(|(_, image, _)| *image != built)
        .collect();
    assert!(
        other.is_empty(),
        "images nothing builds (scripts/image.sh builds {built}): {other:?}"
    );
    for (what, _, command) in &named {
        if let Some(program) = command {
            assert!(
                ["/usr/local/bin/mcs-agent", "/usr/local/bin/mcs-dns"].contains(&program.as_str()),
                "{what} runs {program}, which the image does not hold"
            );
        }
    }
}
