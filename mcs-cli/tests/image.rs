//! The container image (`scripts/image.sh`), built from this test build's binaries: what is
//! inside and how it is configured, and `mcs-agent` run from it by runc with a kubeconfig
//! that names the API server by host name (as a hub's or a peer's does), resolved through
//! the image's own libraries and `/etc/hosts`, against a real API server.
//!
//! Needs root, `umoci`, `skopeo` and `runc` (Debian packages; `scripts/test.sh` installs
//! them) and the Kubernetes binaries of `scripts/k8s-bins.sh`.

use mcs_testkit as support;

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use kube::api::Api;
use kube::runtime::wait::await_condition;
use mcs_core::api::v1beta1::ServiceImport;
use serde_json::{Value, json};

const NS: &str = "loyalty";
/// A name the API server's certificate carries, resolved only by the image's /etc/hosts.
const API_HOST: &str = "kubernetes.default.svc";
const BUDGET: Duration = Duration::from_secs(60);

fn repo() -> PathBuf {
    support::workspace_root()
}

fn run(cmd: &mut Command, what: &str) -> String {
    support::run_command(cmd, what)
}

/// The image, built once for the tests of this binary: its directory, layout and tag.
fn image() -> &'static (tempfile::TempDir, PathBuf, String) {
    static IMAGE: std::sync::OnceLock<(tempfile::TempDir, PathBuf, String)> =
        std::sync::OnceLock::new();
    IMAGE.get_or_init(|| {
        let dir = tempfile::tempdir().unwrap();
        let (layout, tag) = build_image(dir.path());
        (dir, layout, tag)
    })
}

/// Builds the image from the binaries cargo built for this test into `out`; returns the
/// layout directory and the tag.
fn build_image(out: &Path) -> (PathBuf, String) {
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_mcs-agent")).parent().unwrap();
    let image = support::build_mcs_image(bin_dir, out, "test");
    (image.layout, image.tag)
}

fn blob(layout: &Path, digest: &str) -> PathBuf {
    let (algo, hex) = digest.split_once(':').expect("a digest");
    layout.join("blobs").join(algo).join(hex)
}

fn read_json(path: &Path) -> Value {
    serde_json::from_slice(&std::fs::read(path).expect("read blob")).expect("JSON")
}

/// The manifest of `tag` in `layout`.
fn manifest(layout: &Path, tag: &str) -> Value {
    let index = read_json(&layout.join("index.json"));
    let manifest = index["manifests"]
        .as_array()
        .unwrap()
        .iter()
        .find(|m| m["annotations"]["org.opencontainers.image.ref.name"] == tag)
        .expect("the tag in index.json");
    read_json(&blob(layout, manifest["digest"].as_str().unwrap()))
}

/// The paths in the image's one layer, without `./` and trailing slashes.
fn files(layout: &Path, manifest: &Value) -> BTreeSet<String> {
    let layers = manifest["layers"].as_array().unwrap();
    assert_eq!(layers.len(), 1, "{layers:?}");
    let listing = run(
        Command::new("tar")
            .arg("-tzf")
            .arg(blob(layout, layers[0]["digest"].as_str().unwrap())),
        "tar -t",
    );
    listing
        .lines()
        .map(|l| l.trim_start_matches("./").trim_end_matches('/'))
        .filter(|l| !l.is_empty() && *l != ".")
        .map(str::to_owned)
        .collect()
}

#[test]
fn image_holds_the_programs_their_libraries_and_a_non_root_user() {
    let (dir, layout, tag) = image();
    let manifest = manifest(layout, tag);
    let config = read_json(&blob(
        layout,
        manifest["config"]["digest"].as_str().unwrap(),
    ));
    assert_eq!(config["os"], "linux");
    assert_eq!(config["architecture"], "amd64");
    assert_eq!(config["config"]["User"], "65532:65532");
    assert_eq!(
        config["config"]["Entrypoint"],
        json!(["/usr/local/bin/mcs-agent"])
    );
    let labels = &config["config"]["Labels"];
    assert_eq!(
        labels["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );
    let head = run(
        Command::new("git")
            .arg("-C")
            .arg(repo())
            .args(["rev-parse", "HEAD"]),
        "git",
    );
    let revision = labels["org.opencontainers.image.revision"]
        .as_str()
        .unwrap();
    assert!(
        revision.starts_with(head.trim()),
        "revision label {revision}, HEAD {head}"
    );
    assert_eq!(labels["org.opencontainers.image.licenses"], "Apache-2.0");
    assert_eq!(
        manifest["annotations"]["org.opencontainers.image.version"],
        env!("CARGO_PKG_VERSION")
    );

    // One layer with exactly: the three programs, the libraries they load, passwd, group,
    // nsswitch.conf (and the directories holding them). No shell, nothing else.
    let files = files(layout, &manifest);
    for want in [
        "usr/local/bin/mcs-agent",
        "usr/local/bin/mcs-dns",
        "usr/local/bin/kubectl-mcs",
        "etc/passwd",
        "etc/group",
        "etc/nsswitch.conf",
        "lib64/ld-linux-x86-64.so.2",
        "lib/x86_64-linux-gnu/libc.so.6",
    ] {
        assert!(
            files.contains(want),
            "{want} missing from the image: {files:?}"
        );
    }
    let unexpected: Vec<&String> = files
        .iter()
        .filter(|f| {
            !(f.starts_with("usr/local/bin/")
                || f.starts_with("etc/")
                || f.starts_with("lib/x86_64-linux-gnu/lib")
                || f.starts_with("lib64/ld-linux")
                || [
                    "usr",
                    "usr/local",
                    "usr/local/bin",
                    "etc",
                    "lib",
                    "lib/x86_64-linux-gnu",
                    "lib64",
                ]
                .contains(&f.as_str()))
        })
        .collect();
    assert!(
        unexpected.is_empty(),
        "not needed in the image: {unexpected:?}"
    );
    assert!(!files.contains("bin/sh") && !files.contains("usr/bin/sh"));

    // The docker-archive for `ctr images import` names the image.
    let archive = dir.path().join("mcs-image-test.tar");
    let manifest = run(
        Command::new("tar")
            .arg("-xOf")
            .arg(&archive)
            .arg("manifest.json"),
        "tar -x",
    );
    assert!(manifest.contains("mcs:test"), "{manifest}");
}

/// `umoci unpack`s the image into a runc bundle whose process is `args` in the host's
/// network namespace, with `files` bind-mounted read-only (host path, container path) and
/// the root filesystem read-only, as the chart runs it.
fn bundle(
    layout: &Path,
    tag: &str,
    dir: &Path,
    args: &[String],
    files: &[(PathBuf, &str)],
) -> PathBuf {
    let bundle = dir.join("bundle");
    run(
        Command::new("umoci")
            .arg("unpack")
            .arg("--image")
            .arg(format!("{}:{tag}", layout.display()))
            .arg(&bundle),
        "umoci unpack",
    );
    let path = bundle.join("config.json");
    let mut config = read_json(&path);
    config["process"]["args"] = json!(args);
    config["process"]["terminal"] = json!(false);
    config["root"]["readonly"] = json!(true);
    let namespaces = config["linux"]["namespaces"].as_array_mut().unwrap();
    namespaces.retain(|n| n["type"] != "network");
    let mounts = config["mounts"].as_array_mut().unwrap();
    for (host, container) in files {
        mounts.push(json!({
            "destination": container,
            "type": "bind",
            "source": host,
            "options": ["rbind", "ro"],
        }));
    }
    std::fs::write(&path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    bundle
}

/// A runc container, killed and deleted when dropped. runc keeps its state beside the
/// bundle (`--root`), not in the host's `/run/runc`.
struct Container {
    id: String,
    root: PathBuf,
    child: std::process::Child,
    log: PathBuf,
}

impl Container {
    fn start(bundle: &Path, id: &str, log: PathBuf) -> Self {
        let root = bundle.with_file_name(format!("runc-{id}"));
        let _ = Command::new("runc")
            .arg("--root")
            .arg(&root)
            .args(["delete", "--force", id])
            .output();
        let out = std::fs::File::create(&log).unwrap();
        let child = Command::new("runc")
            .arg("--root")
            .arg(&root)
            .arg("run")
            .arg("--bundle")
            .arg(bundle)
            .arg(id)
            .stdin(Stdio::null())
            .stdout(out.try_clone().unwrap())
            .stderr(out)
            .spawn()
            .expect("runc run (Debian's runc)");
        Self {
            id: id.to_owned(),
            root,
            child,
            log,
        }
    }

    fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }
}

impl Drop for Container {
    fn drop(&mut self) {
        let _ = Command::new("runc")
            .arg("--root")
            .arg(&self.root)
            .args(["kill", &self.id, "KILL"])
            .output();
        let _ = self.child.wait();
        let _ = Command::new("runc")
            .arg("--root")
            .arg(&self.root)
            .args(["delete", "--force", &self.id])
            .output();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn agent_in_the_image_reaches_an_api_server_named_by_host() {
    let tmp = tempfile::tempdir().unwrap();
    let (_, layout, tag) = tokio::task::spawn_blocking(image).await.unwrap();
    let cluster = support::start_cluster("image", support::ClusterOptions::api_only()).await;
    let client = cluster.client().await;
    support::create_namespace(&client, NS).await;

    // The kubeconfig names the API server by host name, which only the image's /etc/hosts
    // resolves (the test's own resolver does not know it).
    let mut kubeconfig = cluster.kubeconfig().clone();
    let port = url_port(cluster.server_url());
    for named in &mut kubeconfig.clusters {
        if let Some(c) = named.cluster.as_mut() {
            c.server = Some(format!("https://{API_HOST}:{port}"));
        }
    }
    let kubeconfig_path = tmp.path().join("kubeconfig");
    support::write_kubeconfig(&kubeconfig_path, &kubeconfig);
    let hosts = tmp.path().join("hosts");
    std::fs::write(
        &hosts,
        format!("127.0.0.1 localhost\n127.0.0.1 {API_HOST}\n"),
    )
    .unwrap();
    // Readable by the image's user, 65532.
    for f in [&kubeconfig_path, &hosts] {
        run(Command::new("chmod").arg("0644").arg(f), "chmod");
    }
    let admin = free_port();
    let args = vec![
        "/usr/local/bin/mcs-agent".to_owned(),
        "--cluster-id=east".to_owned(),
        "--member=east".to_owned(),
        format!("--admin-listen=127.0.0.1:{admin}"),
    ];
    let bundle = bundle(
        layout,
        tag,
        tmp.path(),
        &args,
        &[
            (kubeconfig_path, "/etc/mcs/kubeconfig"),
            (hosts, "/etc/hosts"),
        ],
    );
    // KUBECONFIG and the Lease namespace, as the chart sets them.
    let config_path = bundle.join("config.json");
    let mut config = read_json(&config_path);
    let env = config["process"]["env"].as_array_mut().unwrap();
    env.push(json!("KUBECONFIG=/etc/mcs/kubeconfig"));
    env.push(json!("POD_NAMESPACE=default"));
    env.push(json!("RUST_LOG=info"));
    std::fs::write(&config_path, serde_json::to_vec_pretty(&config).unwrap()).unwrap();
    let agent = Container::start(
        &bundle,
        "mcs-image-test-agent",
        tmp.path().join("agent.log"),
    );

    // An export in the cluster: the agent in the image reads it and writes the import.
    let service = support::service(
        "loyalty-accrual",
        "loyalty-accrual",
        &[("grpc", 9443, "TCP")],
        false,
    );
    support::create_exported_service(&client, NS, &service).await;
    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), NS);
    let imported = tokio::time::timeout(
        BUDGET,
        await_condition(imports, "loyalty-accrual", |i: Option<&ServiceImport>| {
            i.is_some()
        }),
    )
    .await;
    assert!(
        matches!(imported, Ok(Ok(Some(_)))),
        "no ServiceImport from the agent in the image within {BUDGET:?}:\n{}",
        agent.log()
    );
    // It got there through the host name, as its own readiness says once its first
    // reconcile is over (the import above may be written during it).
    let readyz = format!("http://127.0.0.1:{admin}/readyz");
    let deadline = tokio::time::Instant::now() + BUDGET;
    loop {
        let answer = support::http_get(&readyz).await;
        if answer.as_ref().is_ok_and(|(status, _)| *status == 200) {
            break;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "the agent in the image not ready within {BUDGET:?} (last /readyz: {answer:?}):\n{}",
            agent.log()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    drop(agent);
}

fn url_port(url: &str) -> u16 {
    url.rsplit(':')
        .next()
        .and_then(|p| p.trim_end_matches('/').parse().ok())
        .expect("a port")
}

fn free_port() -> u16 {
    std::net::TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Every container in `deploy/` runs this image, `mcs:<version>`, and a program that is in
/// it: nothing there names an image that nothing builds.
#[test]
fn deploy_manifests_run_programs_of_this_image() {
    let (_, layout, tag) = image();
    let files = files(layout, &manifest(layout, tag));
    let mut containers = 0;
    for dir in ["agent", "dns", "hub"] {
        let dir = repo().join("deploy").join(dir);
        for entry in std::fs::read_dir(&dir).unwrap() {
            let path = entry.unwrap().path();
            if path.extension().is_none_or(|e| e != "yaml") {
                continue;
            }
            let text = std::fs::read_to_string(&path).unwrap();
            let docs: Vec<Value> = serde_saphyr::from_multiple(&text)
                .unwrap_or_else(|e| panic!("{}: {e}", path.display()));
            for doc in docs {
                let pods = doc["spec"]["template"]["spec"]["containers"].as_array();
                for c in pods.into_iter().flatten() {
                    containers += 1;
                    let name = format!("{} container {}", path.display(), c["name"]);
                    assert_eq!(
                        c["image"],
                        format!("mcs:{}", env!("CARGO_PKG_VERSION")),
                        "{name}"
                    );
                    // The image's entrypoint unless the container names a command.
                    let program = c["command"][0]
                        .as_str()
                        .unwrap_or("/usr/local/bin/mcs-agent");
                    assert!(
                        files.contains(program.trim_start_matches('/')),
                        "{name} runs {program}, which is not in the image"
                    );
                }
            }
        }
    }
    assert_eq!(
        containers, 2,
        "the agent's and the DNS server's Deployments"
    );
}
