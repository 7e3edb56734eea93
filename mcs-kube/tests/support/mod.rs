//! Real-Kubernetes test harness: independent etcd + kube-apiserver (+ optionally
//! kube-controller-manager) clusters on loopback, one per name, started in parallel.
//!
//! The binaries are built by `scripts/k8s-bins.sh` into
//! `${MCS_K8S_CACHE:-$HOME/.cache/mcs-k8s}/v<version>/bin`; `MCS_K8S_BIN` overrides the
//! directory. If they are missing the tests panic (they never skip). See
//! `docs/testing.md`.
//!
//! Every process is killed and reaped when its [`TestCluster`] is dropped, also when a
//! test panics. As a second line of defence the processes are started through
//! `setpriv --pdeathsig KILL`, so they also die when the thread that started them
//! exits (for example when the test binary is killed). Consequence: start clusters
//! from the test's own task (or a `tokio::spawn`ed task), never from
//! `spawn_blocking`, and do not share a `TestCluster` between tests through a static.
//!
//! Set `MCS_K8S_KEEP=1` to keep each cluster's directory (certificates, kubeconfig,
//! logs, etcd data) after the test; its path is printed.
#![allow(dead_code, unreachable_pub)]

use std::collections::{BTreeMap, HashSet};
use std::fs::{self, File};
use std::io::{Read, Seek, SeekFrom};
use std::net::TcpListener;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Config};
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use serde::Deserialize;
use tempfile::TempDir;
use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

mod requests;
// Each user of the harness takes what it needs.
#[allow(unused_imports)]
pub use requests::{Recorded, RequestLog, recorded};

/// Kubernetes versions `scripts/k8s-bins.sh` builds, preferred first.
pub const K8S_VERSIONS: &[&str] = &["1.35.4", "1.34.4"];

/// Name of the fake Node that [`create_ready_pod`] schedules Pods on.
pub const FAKE_NODE: &str = "mcs-test-node";

/// Zone label (`topology.kubernetes.io/zone`) of [`FAKE_NODE`].
pub const FAKE_NODE_ZONE: &str = "zone-a";

/// Controllers run by kube-controller-manager when [`ClusterOptions::controller_manager`]
/// is set (current names; the old aliases `endpointslice`, ... also work).
pub const KCM_CONTROLLERS: &str = "endpointslice-controller,endpointslice-mirroring-controller,garbage-collector-controller,namespace-controller";

/// Service CIDR of every test cluster (ClusterIPs are allocated from it).
pub const SERVICE_CIDR: &str = "10.0.0.0/24";

const READY_TIMEOUT: Duration = Duration::from_secs(180);
const CRD_TIMEOUT: Duration = Duration::from_secs(60);
const MAX_ATTEMPTS: usize = 3;

/// How to start a cluster.
#[derive(Clone, Debug)]
pub struct ClusterOptions {
    /// Also run kube-controller-manager with [`KCM_CONTROLLERS`], so Services with a
    /// selector get EndpointSlices, namespaces are finalized and ownerReferences are
    /// garbage-collected, as in a real cluster.
    pub controller_manager: bool,
    /// Install every CRD from `deploy/crds/*.yaml` and wait until it is Established.
    pub install_crds: bool,
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            controller_manager: true,
            install_crds: true,
        }
    }
}

/// The directory holding `etcd`, `kube-apiserver` and `kube-controller-manager`:
/// `$MCS_K8S_BIN`, else the newest version found in the cache of `scripts/k8s-bins.sh`.
/// Panics (with instructions) when the binaries are missing.
pub fn bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let need = ["etcd", "kube-apiserver", "kube-controller-manager"];
        let complete = |d: &Path| need.iter().all(|b| d.join(b).is_file());
        if let Ok(dir) = std::env::var("MCS_K8S_BIN") {
            let dir = PathBuf::from(dir);
            assert!(
                complete(&dir),
                "MCS_K8S_BIN={} does not contain {need:?}; run scripts/k8s-bins.sh and \
                 export MCS_K8S_BIN=$(scripts/k8s-bins.sh | tail -1)",
                dir.display()
            );
            return dir;
        }
        let cache = std::env::var_os("MCS_K8S_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/mcs-k8s")))
            .unwrap_or_else(|| PathBuf::from("/root/.cache/mcs-k8s"));
        for v in K8S_VERSIONS {
            let dir = cache.join(format!("v{v}")).join("bin");
            if complete(&dir) {
                return dir;
            }
        }
        panic!(
            "kube-apiserver/etcd/kube-controller-manager not found (looked in $MCS_K8S_BIN and \
             {}/v{{{}}}/bin). Build them once with `scripts/k8s-bins.sh` (10-20 min cold) \
             from the workspace root, or export MCS_K8S_BIN=$(scripts/k8s-bins.sh | tail -1)",
            cache.display(),
            K8S_VERSIONS.join(",")
        );
    })
    .clone()
}

/// Limits how many clusters one test binary runs at once (cargo runs the tests of a
/// binary in parallel; 2 cores do not start 15 API servers in time). Override with
/// `MCS_K8S_MAX_CLUSTERS`.
fn cluster_slots() -> &'static std::sync::Arc<Semaphore> {
    static SLOTS: OnceLock<std::sync::Arc<Semaphore>> = OnceLock::new();
    SLOTS.get_or_init(|| std::sync::Arc::new(Semaphore::new(max_clusters())))
}

fn max_clusters() -> usize {
    std::env::var("MCS_K8S_MAX_CLUSTERS")
        .ok()
        .and_then(|v| v.parse().ok())
        .filter(|n| *n > 0)
        .unwrap_or(4)
}

/// Start one independent cluster per name, in parallel, with [`ClusterOptions::default`]
/// (controller-manager on, CRDs installed). Panics if any fails to start.
pub async fn start_clusters(names: &[&str]) -> Vec<TestCluster> {
    start_clusters_with(names, ClusterOptions::default()).await
}

/// Start one independent cluster per name, in parallel. Panics if any fails to start.
pub async fn start_clusters_with(names: &[&str], opts: ClusterOptions) -> Vec<TestCluster> {
    assert!(!names.is_empty(), "start_clusters needs at least one name");
    let t0 = Instant::now();
    let bins = bin_dir();
    let crds = if opts.install_crds {
        load_crds()
    } else {
        Vec::new()
    };
    // Wait for enough free slots (all at once, so two tests cannot deadlock each
    // holding half of what they need).
    let want = names.len().min(max_clusters()) as u32;
    let t_wait = Instant::now();
    let mut permit = Some(
        cluster_slots()
            .clone()
            .acquire_many_owned(want)
            .await
            .expect("cluster semaphore closed"),
    );
    let waited = t_wait.elapsed();
    let futs = names.iter().enumerate().map(|(i, name)| {
        // The first cluster carries the permit for the whole group.
        let p = if i == 0 { permit.take() } else { None };
        TestCluster::launch(name, bins.clone(), crds.clone(), opts.clone(), p)
    });
    let clusters = futures::future::join_all(futs).await;
    eprintln!(
        "[harness] started {} cluster(s) {:?} in {:.1?} (waited {:.1?} for a slot; {} CRD(s); \
         controller-manager: {})",
        clusters.len(),
        names,
        t0.elapsed() - waited,
        waited,
        crds.len(),
        opts.controller_manager
    );
    clusters
}

/// Start a single cluster (see [`start_clusters_with`]).
pub async fn start_cluster(name: &str, opts: ClusterOptions) -> TestCluster {
    start_clusters_with(&[name], opts).await.pop().unwrap()
}

/// One independent Kubernetes control plane on loopback: its own etcd (data under
/// `/dev/shm` when available), kube-apiserver, optional kube-controller-manager,
/// certificates and kubeconfig.
pub struct TestCluster {
    name: String,
    dir: Option<TempDir>,
    path: PathBuf,
    bins: PathBuf,
    opts: ClusterOptions,
    etcd_client_port: u16,
    etcd_peer_port: u16,
    apiserver_port: u16,
    etcd: Option<Child>,
    apiserver: Option<Child>,
    controller_manager: Option<Child>,
    kubeconfig: Kubeconfig,
    server_url: String,
    startup: Duration,
    _permit: Option<OwnedSemaphorePermit>,
    /// Appended to the API server's command line (see
    /// [`TestCluster::restart_apiserver_with_args`]).
    extra_apiserver_args: Vec<String>,
}

impl std::fmt::Debug for TestCluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("TestCluster")
            .field("name", &self.name)
            .field("server_url", &self.server_url)
            .field("dir", &self.path)
            .finish_non_exhaustive()
    }
}

impl TestCluster {
    /// The name given to [`start_clusters`] (also the kubeconfig cluster/context name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// `https://127.0.0.1:<port>` of the API server.
    pub fn server_url(&self) -> &str {
        &self.server_url
    }

    /// In-memory kubeconfig (admin user in `system:masters`, certificates embedded).
    pub fn kubeconfig(&self) -> &Kubeconfig {
        &self.kubeconfig
    }

    /// The same kubeconfig as a file, for processes started by a test.
    pub fn kubeconfig_path(&self) -> PathBuf {
        self.path.join("kubeconfig.yaml")
    }

    /// The cluster's scratch directory (certificates, logs, etcd data).
    pub fn dir(&self) -> &Path {
        &self.path
    }

    /// Wall time from process start to ready (readyz + CRDs Established).
    pub fn startup_time(&self) -> Duration {
        self.startup
    }

    /// `http://127.0.0.1:<port>` of etcd's client endpoint (its v3 JSON gateway answers
    /// `POST /v3/kv/range`, `/v3/kv/compaction`, ...).
    pub fn etcd_url(&self) -> String {
        format!("http://127.0.0.1:{}", self.etcd_client_port)
    }

    /// Kill the API server and start it again (same port, same etcd data) with `args`
    /// appended to its command line, for this and every later [`TestCluster::start`];
    /// for example `--watch-cache=false`, so watches are served by etcd and a compaction
    /// expires their history. Waits until it is ready.
    pub async fn restart_apiserver_with_args(&mut self, args: &[&str]) {
        self.stop();
        self.extra_apiserver_args = args.iter().map(|a| (*a).to_owned()).collect();
        self.start().await;
    }

    /// A fresh client for this cluster (default namespace `default`).
    pub async fn client(&self) -> Client {
        let config =
            Config::from_custom_kubeconfig(self.kubeconfig.clone(), &KubeConfigOptions::default())
                .await
                .unwrap_or_else(|e| panic!("cluster {}: bad kubeconfig: {e}", self.name));
        Client::try_from(config)
            .unwrap_or_else(|e| panic!("cluster {}: cannot build client: {e}", self.name))
    }

    /// A client authenticated as user `user` in `groups` (a client certificate from the
    /// cluster's CA), with no other rights than RBAC grants that user or those groups.
    pub async fn client_as_user(&self, user: &str, groups: &[&str]) -> Client {
        let read = |f: &str| {
            fs::read_to_string(self.path.join(f))
                .unwrap_or_else(|e| panic!("cluster {}: read {f}: {e}", self.name))
        };
        // The CA's parameters as `Pki::generate` made them; its key from `ca.key`.
        let ca_key = KeyPair::from_pem(&read("ca.key")).expect("parse CA key");
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name
            .push(DnType::CommonName, format!("mcs-test-{}-ca", self.name));
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let issuer = Issuer::new(ca, ca_key);
        let key = KeyPair::generate().unwrap();
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        for g in groups {
            params.distinguished_name.push(DnType::OrganizationName, *g);
        }
        params.distinguished_name.push(DnType::CommonName, user);
        params.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let cert = params.signed_by(&key, &issuer).unwrap().pem();
        let mut config =
            Config::from_custom_kubeconfig(self.kubeconfig.clone(), &KubeConfigOptions::default())
                .await
                .unwrap_or_else(|e| panic!("cluster {}: bad kubeconfig: {e}", self.name));
        config.auth_info = kube::config::AuthInfo {
            client_certificate_data: Some(base64::engine::general_purpose::STANDARD.encode(cert)),
            client_key_data: Some(
                base64::engine::general_purpose::STANDARD
                    .encode(key.serialize_pem())
                    .into(),
            ),
            ..Default::default()
        };
        Client::try_from(config)
            .unwrap_or_else(|e| panic!("cluster {}: cannot build client: {e}", self.name))
    }

    /// A client authenticated with a bearer `token` (e.g. from [`service_account_token`]).
    pub async fn client_with_token(&self, token: &str) -> Client {
        let mut config =
            Config::from_custom_kubeconfig(self.kubeconfig.clone(), &KubeConfigOptions::default())
                .await
                .unwrap_or_else(|e| panic!("cluster {}: bad kubeconfig: {e}", self.name));
        config.auth_info = kube::config::AuthInfo {
            token: Some(token.to_owned().into()),
            ..Default::default()
        };
        Client::try_from(config)
            .unwrap_or_else(|e| panic!("cluster {}: cannot build client: {e}", self.name))
    }

    /// Whether the API server process is running.
    pub fn is_running(&mut self) -> bool {
        matches!(
            self.apiserver.as_mut().map(|c| c.try_wait()),
            Some(Ok(None))
        )
    }

    /// Kill the API server (SIGKILL, like a crash). etcd and the controller-manager keep
    /// running, so [`TestCluster::start`] brings the same cluster back.
    pub fn stop(&mut self) {
        if let Some(c) = self.apiserver.take() {
            reap(c);
        }
    }

    /// Restart the API server on the same port with the same etcd data and wait until
    /// it is ready. Panics if it is already running or does not come up.
    pub async fn start(&mut self) {
        assert!(
            self.apiserver.is_none(),
            "cluster {}: API server already running",
            self.name
        );
        let t0 = Instant::now();
        self.spawn_apiserver();
        if let Err(e) = self.wait_apiserver_ready().await {
            panic!("cluster {}: API server did not restart: {e}", self.name);
        }
        eprintln!(
            "[harness] cluster {}: API server restarted in {:.1?}",
            self.name,
            t0.elapsed()
        );
    }

    /// The last `lines` lines of a component's log (`etcd`, `kube-apiserver`,
    /// `kube-controller-manager`).
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        tail(&self.path.join(format!("{component}.log")), lines)
    }

    /// Panic (with its log) if the controller-manager has exited.
    pub fn assert_controller_manager_running(&mut self) {
        if let Some(c) = self.controller_manager.as_mut()
            && let Ok(Some(status)) = c.try_wait()
        {
            panic!(
                "cluster {}: kube-controller-manager exited ({status}):\n{}",
                self.name,
                self.log_tail("kube-controller-manager", 40)
            );
        }
    }

    async fn launch(
        name: &str,
        bins: PathBuf,
        crds: Vec<CustomResourceDefinition>,
        opts: ClusterOptions,
        permit: Option<OwnedSemaphorePermit>,
    ) -> TestCluster {
        let t0 = Instant::now();
        let dir = scratch_dir(name);
        let path = dir.path().to_path_buf();
        let pki = Pki::generate(name);
        pki.write(&path);
        let mut cluster = TestCluster {
            name: name.to_string(),
            dir: Some(dir),
            path,
            bins,
            opts,
            etcd_client_port: 0,
            etcd_peer_port: 0,
            apiserver_port: 0,
            etcd: None,
            apiserver: None,
            controller_manager: None,
            kubeconfig: Kubeconfig::default(),
            server_url: String::new(),
            startup: Duration::ZERO,
            _permit: permit,
            extra_apiserver_args: Vec::new(),
        };
        let mut attempt = 0;
        loop {
            attempt += 1;
            let ports = free_ports(3);
            cluster.etcd_client_port = ports[0];
            cluster.etcd_peer_port = ports[1];
            cluster.apiserver_port = ports[2];
            cluster.server_url = format!("https://127.0.0.1:{}", ports[2]);
            let yaml = pki.kubeconfig_yaml(name, &cluster.server_url);
            fs::write(cluster.kubeconfig_path(), &yaml).expect("write kubeconfig");
            cluster.kubeconfig = Kubeconfig::from_yaml(&yaml).expect("parse generated kubeconfig");
            match cluster.boot().await {
                Ok(()) => break,
                Err(e) if attempt < MAX_ATTEMPTS && e.contains("address already in use") => {
                    eprintln!("[harness] cluster {name}: port clash, retrying: {e}");
                    cluster.kill_all();
                    // etcd refuses to rejoin with other peer URLs: start from scratch.
                    let _ = fs::remove_dir_all(cluster.path.join("etcd"));
                }
                Err(e) => panic!("cluster {name} failed to start: {e}"),
            }
        }
        if !crds.is_empty() {
            cluster.install_crds(&crds).await;
        }
        if cluster.opts.controller_manager {
            cluster.spawn_controller_manager();
        }
        cluster.startup = t0.elapsed();
        cluster
    }

    async fn boot(&mut self) -> Result<(), String> {
        self.spawn_etcd();
        self.wait_etcd_healthy().await?;
        self.spawn_apiserver();
        self.wait_apiserver_ready().await
    }

    fn spawn_etcd(&mut self) {
        let client = format!("http://127.0.0.1:{}", self.etcd_client_port);
        let peer = format!("http://127.0.0.1:{}", self.etcd_peer_port);
        let args = vec![
            format!("--name={}", self.name),
            format!("--data-dir={}", self.path.join("etcd").display()),
            format!("--listen-client-urls={client}"),
            format!("--advertise-client-urls={client}"),
            format!("--listen-peer-urls={peer}"),
            format!("--initial-advertise-peer-urls={peer}"),
            format!("--initial-cluster={}={peer}", self.name),
            "--unsafe-no-fsync=true".into(),
            "--log-level=warn".into(),
        ];
        self.etcd = Some(self.spawn("etcd", &args));
    }

    fn spawn_apiserver(&mut self) {
        let p = &self.path;
        let f = |n: &str| p.join(n).display().to_string();
        let mut args = vec![
            format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_client_port),
            "--bind-address=127.0.0.1".into(),
            format!("--secure-port={}", self.apiserver_port),
            format!("--cert-dir={}", f("apiserver-certs")),
            format!("--tls-cert-file={}", f("apiserver.crt")),
            format!("--tls-private-key-file={}", f("apiserver.key")),
            format!("--client-ca-file={}", f("ca.crt")),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", f("sa.pub")),
            format!("--service-account-signing-key-file={}", f("sa.key")),
            format!("--service-cluster-ip-range={SERVICE_CIDR}"),
            "--authorization-mode=RBAC".into(),
            "--disable-admission-plugins=ServiceAccount".into(),
            "--allow-privileged=true".into(),
            // Endpoints may not be loopback: keep the `kubernetes` Service endpoint-less.
            "--endpoint-reconciler-type=none".into(),
            "--profiling=false".into(),
        ];
        args.extend(self.extra_apiserver_args.iter().cloned());
        self.apiserver = Some(self.spawn("kube-apiserver", &args));
    }

    fn spawn_controller_manager(&mut self) {
        let args = vec![
            format!("--kubeconfig={}", self.kubeconfig_path().display()),
            format!("--controllers={KCM_CONTROLLERS}"),
            "--use-service-account-credentials=false".into(),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            // No serving endpoint at all (nothing polls it), so no port to allocate.
            "--secure-port=0".into(),
            "--profiling=false".into(),
        ];
        self.controller_manager = Some(self.spawn("kube-controller-manager", &args));
    }

    fn spawn(&self, bin: &str, args: &[String]) -> Child {
        let exe = self.bins.join(bin);
        let log_path = self.path.join(format!("{bin}.log"));
        let log = File::options()
            .create(true)
            .append(true)
            .open(&log_path)
            .expect("create log file");
        let mut cmd = if has_setpriv() {
            let mut c = Command::new("setpriv");
            c.args(["--pdeathsig", "KILL", "--"]).arg(&exe);
            c
        } else {
            Command::new(&exe)
        };
        cmd.args(args)
            .current_dir(&self.path)
            .stdin(Stdio::null())
            .stdout(log.try_clone().expect("dup log fd"))
            .stderr(log);
        cmd.spawn().unwrap_or_else(|e| {
            panic!("cluster {}: cannot start {}: {e}", self.name, exe.display())
        })
    }

    async fn wait_etcd_healthy(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            if let Some(Ok(Some(status))) = self.etcd.as_mut().map(|c| c.try_wait()) {
                return Err(format!(
                    "etcd exited ({status}):\n{}",
                    self.log_tail("etcd", 30)
                ));
            }
            if http_get_ok(self.etcd_client_port, "/health", "\"health\":\"true\"").await {
                return Ok(());
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "etcd not healthy after {READY_TIMEOUT:?}:\n{}",
                    self.log_tail("etcd", 30)
                ));
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    async fn wait_apiserver_ready(&mut self) -> Result<(), String> {
        let deadline = Instant::now() + READY_TIMEOUT;
        let client = self.client().await;
        let mut last;
        loop {
            if let Some(Ok(Some(status))) = self.apiserver.as_mut().map(|c| c.try_wait()) {
                return Err(format!(
                    "kube-apiserver exited ({status}):\n{}",
                    self.log_tail("kube-apiserver", 40)
                ));
            }
            let req = http::Request::get("/readyz").body(Vec::new()).unwrap();
            match tokio::time::timeout(Duration::from_secs(5), client.request_text(req)).await {
                Ok(Ok(body)) if body.trim() == "ok" => return Ok(()),
                Ok(Ok(body)) => last = body,
                Ok(Err(e)) => last = e.to_string(),
                Err(_) => last = "timeout".into(),
            }
            if Instant::now() > deadline {
                return Err(format!(
                    "kube-apiserver not ready after {READY_TIMEOUT:?} (last: {last}):\n{}",
                    self.log_tail("kube-apiserver", 40)
                ));
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }

    async fn install_crds(&self, crds: &[CustomResourceDefinition]) {
        let api: Api<CustomResourceDefinition> = Api::all(self.client().await);
        let pp = PatchParams::apply("mcs-test-harness").force();
        for crd in crds {
            let name = crd
                .metadata
                .name
                .clone()
                .expect("CRD without metadata.name");
            api.patch(&name, &pp, &Patch::Apply(crd))
                .await
                .unwrap_or_else(|e| panic!("cluster {}: installing CRD {name}: {e}", self.name));
        }
        for crd in crds {
            let name = crd.metadata.name.as_deref().unwrap();
            let established = await_condition(api.clone(), name, conditions::is_crd_established());
            match tokio::time::timeout(CRD_TIMEOUT, established).await {
                Ok(Ok(_)) => {}
                Ok(Err(e)) => panic!("cluster {}: waiting for CRD {name}: {e}", self.name),
                Err(_) => panic!(
                    "cluster {}: CRD {name} not Established after {CRD_TIMEOUT:?}",
                    self.name
                ),
            }
        }
    }

    fn kill_all(&mut self) {
        for c in [
            self.controller_manager.take(),
            self.apiserver.take(),
            self.etcd.take(),
        ]
        .into_iter()
        .flatten()
        {
            reap(c);
        }
    }
}

impl Drop for TestCluster {
    fn drop(&mut self) {
        self.kill_all();
        if std::env::var_os("MCS_K8S_KEEP").is_some()
            && let Some(dir) = self.dir.take()
        {
            eprintln!(
                "[harness] cluster {}: kept {}",
                self.name,
                dir.keep().display()
            );
        }
    }
}

fn reap(mut child: Child) {
    let _ = child.kill();
    let _ = child.wait();
}

fn has_setpriv() -> bool {
    static HAS: OnceLock<bool> = OnceLock::new();
    *HAS.get_or_init(|| {
        Command::new("setpriv")
            .args(["--pdeathsig", "KILL", "--", "true"])
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .status()
            .map(|s| s.success())
            .unwrap_or(false)
    })
}

/// A fresh directory for one cluster, on `/dev/shm` when possible. Directories left
/// behind by test processes that were killed (so never ran `Drop`) are removed first.
fn scratch_dir(name: &str) -> TempDir {
    static CLEANED: OnceLock<()> = OnceLock::new();
    CLEANED.get_or_init(|| {
        for root in [Path::new("/dev/shm").to_path_buf(), std::env::temp_dir()] {
            remove_stale_dirs(&root);
        }
    });
    let dir = create_scratch_dir(name);
    fs::write(dir.path().join("owner.pid"), std::process::id().to_string())
        .expect("write owner.pid");
    dir
}

fn remove_stale_dirs(root: &Path) {
    let Ok(entries) = fs::read_dir(root) else {
        return;
    };
    for e in entries.flatten() {
        let path = e.path();
        let is_ours = e.file_name().to_string_lossy().starts_with("mcs-k8s-");
        let Ok(pid) = fs::read_to_string(path.join("owner.pid")) else {
            continue;
        };
        if is_ours && !Path::new("/proc").join(pid.trim()).exists() {
            let _ = fs::remove_dir_all(&path);
        }
    }
}

fn create_scratch_dir(name: &str) -> TempDir {
    let prefix = format!("mcs-k8s-{name}-");
    let mut b = tempfile::Builder::new();
    b.prefix(&prefix);
    let shm = Path::new("/dev/shm");
    if shm.is_dir()
        && let Ok(d) = b.tempdir_in(shm)
    {
        return d;
    }
    b.tempdir().expect("create temp dir")
}

/// `n` distinct free loopback ports, never handed out twice in this process.
fn free_ports(n: usize) -> Vec<u16> {
    static USED: Mutex<Option<HashSet<u16>>> = Mutex::new(None);
    let mut used = USED.lock().unwrap();
    let used = used.get_or_insert_with(HashSet::new);
    let mut listeners = Vec::new();
    let mut ports = Vec::new();
    while ports.len() < n {
        let l = TcpListener::bind("127.0.0.1:0").expect("bind 127.0.0.1:0");
        let port = l.local_addr().unwrap().port();
        listeners.push(l);
        if used.insert(port) {
            ports.push(port);
        }
    }
    ports
}

async fn http_get_ok(port: u16, path: &str, needle: &str) -> bool {
    let attempt = async {
        let mut s = tokio::net::TcpStream::connect(("127.0.0.1", port))
            .await
            .ok()?;
        s.write_all(format!("GET {path} HTTP/1.0\r\nHost: 127.0.0.1\r\n\r\n").as_bytes())
            .await
            .ok()?;
        let mut buf = Vec::new();
        s.read_to_end(&mut buf).await.ok()?;
        Some(String::from_utf8_lossy(&buf).contains(needle))
    };
    matches!(
        tokio::time::timeout(Duration::from_secs(2), attempt).await,
        Ok(Some(true))
    )
}

fn tail(path: &Path, lines: usize) -> String {
    let Ok(mut f) = File::open(path) else {
        return format!("(no log at {})", path.display());
    };
    let len = f.metadata().map(|m| m.len()).unwrap_or(0);
    let _ = f.seek(SeekFrom::Start(len.saturating_sub(64 * 1024)));
    let mut s = String::new();
    let _ = f.read_to_string(&mut s);
    let all: Vec<&str> = s.lines().collect();
    all[all.len().saturating_sub(lines)..].join("\n")
}

/// Every CRD in the workspace's `deploy/crds/*.yaml` (multi-document files allowed),
/// found from this crate upwards. A missing directory or a file that does not parse panics.
pub fn load_crds() -> Vec<CustomResourceDefinition> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = manifest
        .ancestors()
        .map(|d| d.join("deploy/crds"))
        .find(|d| d.is_dir())
        .unwrap_or_else(|| panic!("no deploy/crds directory above {}", manifest.display()));
    let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).expect("read CRD file");
        for doc in serde_yaml::Deserializer::from_str(&text) {
            let value = serde_yaml::Value::deserialize(doc)
                .unwrap_or_else(|e| panic!("{}: invalid YAML: {e}", file.display()));
            if value.is_null() {
                continue;
            }
            let crd: CustomResourceDefinition = serde_yaml::from_value(value).unwrap_or_else(|e| {
                panic!("{}: not a CustomResourceDefinition: {e}", file.display())
            });
            crds.push(crd);
        }
    }
    if crds.is_empty() {
        eprintln!("[harness] no CRDs in {}: none installed", dir.display());
    }
    crds
}

/// Per-cluster certificates: a CA, the API server's serving cert, an admin client
/// cert (`O=system:masters`) and the service-account signing key.
struct Pki {
    ca_pem: String,
    /// The CA's key, so tests can issue client certificates ([`TestCluster::client_as_user`]).
    ca_key: String,
    server_pem: String,
    server_key: String,
    admin_pem: String,
    admin_key: String,
    sa_key: String,
    sa_pub: String,
}

impl Pki {
    fn generate(name: &str) -> Pki {
        let ca_key = KeyPair::generate().unwrap();
        let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
        ca.distinguished_name
            .push(DnType::CommonName, format!("mcs-test-{name}-ca"));
        ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        ca.key_usages = vec![
            KeyUsagePurpose::KeyCertSign,
            KeyUsagePurpose::CrlSign,
            KeyUsagePurpose::DigitalSignature,
        ];
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let ca_key_pem = ca_key.serialize_pem();
        let issuer = Issuer::new(ca, ca_key);

        let server_key = KeyPair::generate().unwrap();
        let mut server = CertificateParams::new(vec![
            "127.0.0.1".to_string(),
            "localhost".into(),
            "10.0.0.1".into(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
        ])
        .unwrap();
        server
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        server.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_pem = server.signed_by(&server_key, &issuer).unwrap().pem();

        let admin_key = KeyPair::generate().unwrap();
        let mut admin = CertificateParams::new(Vec::<String>::new()).unwrap();
        admin
            .distinguished_name
            .push(DnType::OrganizationName, "system:masters");
        admin
            .distinguished_name
            .push(DnType::CommonName, "mcs-test-admin");
        admin.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        admin.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        let admin_pem = admin.signed_by(&admin_key, &issuer).unwrap().pem();

        let sa = KeyPair::generate().unwrap();
        Pki {
            ca_pem,
            ca_key: ca_key_pem,
            server_pem,
            server_key: server_key.serialize_pem(),
            admin_pem,
            admin_key: admin_key.serialize_pem(),
            sa_key: sa.serialize_pem(),
            sa_pub: sa.public_key_pem(),
        }
    }

    fn write(&self, dir: &Path) {
        for (file, data) in [
            ("ca.crt", &self.ca_pem),
            ("ca.key", &self.ca_key),
            ("apiserver.crt", &self.server_pem),
            ("apiserver.key", &self.server_key),
            ("admin.crt", &self.admin_pem),
            ("admin.key", &self.admin_key),
            ("sa.key", &self.sa_key),
            ("sa.pub", &self.sa_pub),
        ] {
            fs::write(dir.join(file), data).expect("write certificate");
        }
    }

    fn kubeconfig_yaml(&self, name: &str, server: &str) -> String {
        let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
        format!(
            "apiVersion: v1
kind: Config
clusters:
- name: {name}
  cluster:
    server: {server}
    certificate-authority-data: {ca}
users:
- name: {name}-admin
  user:
    client-certificate-data: {cert}
    client-key-data: {key}
contexts:
- name: {name}
  context:
    cluster: {name}
    user: {name}-admin
    namespace: default
current-context: {name}
",
            ca = b64(&self.ca_pem),
            cert = b64(&self.admin_pem),
            key = b64(&self.admin_key),
        )
    }
}

/// Poll `f` every 100 ms until it returns `Some`, or panic after `timeout` naming `what`.
pub async fn wait_for<T, F, Fut>(what: &str, timeout: Duration, mut f: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = Instant::now() + timeout;
    loop {
        if let Some(v) = f().await {
            return v;
        }
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for {what}"
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Create a namespace (no error if it exists).
pub async fn create_namespace(client: &Client, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating namespace {name}: {e}"),
    }
}

/// Create [`FAKE_NODE`] (zone [`FAKE_NODE_ZONE`]) if it does not exist. The
/// EndpointSlice controller skips Pods whose Node is missing.
pub async fn ensure_fake_node(client: &Client) {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(FAKE_NODE.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), FAKE_NODE.to_string()),
                (
                    "topology.kubernetes.io/zone".to_string(),
                    FAKE_NODE_ZONE.to_string(),
                ),
            ])),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating node {FAKE_NODE}: {e}"),
    }
}

/// Create a Pod bound to [`FAKE_NODE`] and mark it Running and Ready with `pod_ip`, as
/// a kubelet would, so kube-controller-manager publishes it in the EndpointSlices of
/// every Service selecting `labels`. `ports` are `(name, containerPort)` TCP ports.
///
/// `pod_ip` must not be loopback/link-local/unspecified if the Pod is to appear in an
/// EndpointSlice: the API server rejects such EndpointSlice addresses. Use
/// documentation addresses such as `192.0.2.10` (never connected to).
pub async fn create_ready_pod(
    client: &Client,
    ns: &str,
    name: &str,
    labels: &[(&str, &str)],
    pod_ip: &str,
    ports: &[(&str, i32)],
) -> Pod {
    ensure_fake_node(client).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        },
        "spec": {
            "nodeName": FAKE_NODE,
            "containers": [{
                "name": "app",
                "image": "registry.invalid/mcs-test-app:0",
                "ports": ports.iter().map(|(n, p)| serde_json::json!({
                    "name": n, "containerPort": p, "protocol": "TCP"
                })).collect::<Vec<_>>(),
            }],
        },
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod {ns}/{name}: {e}"));
    set_pod_status(client, ns, name, Some(pod_ip), true).await
}

/// Set a Pod's Ready condition (and, if given, its IP) through the status subresource,
/// as a kubelet would. Returns the updated Pod.
pub async fn set_pod_status(
    client: &Client,
    ns: &str,
    name: &str,
    pod_ip: Option<&str>,
    ready: bool,
) -> Pod {
    let ready = if ready { "True" } else { "False" };
    let mut status = serde_json::json!({
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": ready},
            {"type": "Ready", "status": ready},
        ],
    });
    if let Some(ip) = pod_ip {
        status["podIP"] = ip.into();
        status["podIPs"] = serde_json::json!([{ "ip": ip }]);
    }
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await
        .unwrap_or_else(|e| panic!("patching status of pod {ns}/{name}: {e}"))
}

/// Delete a Pod immediately (grace period 0). A Pod bound to a Node is otherwise only
/// marked Terminating and waits for a kubelet that does not exist here.
pub async fn delete_pod_now(client: &Client, ns: &str, name: &str) {
    match Api::<Pod>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => panic!("deleting pod {ns}/{name}: {e}"),
    }
}

/// Delete a namespace and wait (up to `timeout`) until kube-controller-manager's
/// namespace controller has removed it. Its Pods are deleted with grace period 0
/// first, standing in for the kubelet (see [`delete_pod_now`]). Needs
/// [`ClusterOptions::controller_manager`].
pub async fn delete_namespace(client: &Client, ns: &str, timeout: Duration) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing pods in {ns}: {e}"));
    for p in list.items {
        delete_pod_now(client, ns, p.metadata.name.as_deref().unwrap_or_default()).await;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.delete(ns, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => return,
        Err(e) => panic!("deleting namespace {ns}: {e}"),
    }
    wait_for(&format!("namespace {ns} to be finalized"), timeout, || {
        let namespaces = namespaces.clone();
        async move { namespaces.get_opt(ns).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

/// A token for ServiceAccount `ns/name` through the TokenRequest API (the ServiceAccount is
/// created if missing; valid for an hour). Use it with [`TestCluster::client_with_token`].
pub async fn service_account_token(client: &Client, ns: &str, name: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match sas.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating ServiceAccount {ns}/{name}: {e}"),
    }
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            bound_object_ref: None,
        },
        ..Default::default()
    };
    let response: TokenRequest = sas
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("requesting a token for ServiceAccount {ns}/{name}: {e}"));
    response.status.expect("TokenRequest without status").token
}

/// A hickory resolver that asks only `server` (UDP, then TCP on truncation), with no cache
/// and no search list: every lookup is a fresh question to the server under test.
pub fn dns_resolver(
    server: std::net::SocketAddr,
) -> hickory_resolver::Resolver<hickory_resolver::net::runtime::TokioRuntimeProvider> {
    use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
    let mut ns = NameServerConfig::udp_and_tcp(server.ip());
    for c in &mut ns.connections {
        c.port = server.port();
    }
    let mut opts = ResolverOpts::default();
    opts.cache_size = 0;
    opts.ndots = 0;
    hickory_resolver::Resolver::builder_with_config(
        ResolverConfig::from_parts(None, vec![], vec![ns]),
        hickory_resolver::net::runtime::TokioRuntimeProvider::default(),
    )
    .with_options(opts)
    .build()
    .expect("resolver")
}
