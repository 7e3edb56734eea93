//! Clusters: starting them in parallel ([`start_clusters`]) and driving one
//! ([`TestCluster`]): clients, API server stop and restart, logs.

use std::path::{Path, PathBuf};
use std::process::Child;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use base64::Engine as _;
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::api::{Api, Patch, PatchParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use kube::runtime::wait::{await_condition, conditions};
use kube::{Client, Config};
use tempfile::TempDir;
use tokio::sync::{OwnedSemaphorePermit, Semaphore};

use super::bins::{bin_dir, kwok_bin};
use super::http::http_get;
use super::kubeconfig;
use super::kwok::{self, KCM_WORKLOAD_CONTROLLERS, dual_stack_pod_cidr_for, pod_cidr_for};
use super::objects::load_crds;
use super::pki::{self, Pki};
use super::process::{self, free_ports, reap, scratch_dir, tail};

/// Controllers run by kube-controller-manager when [`ClusterOptions::controller_manager`]
/// is set (current names; the old aliases `endpointslice`, ... also work).
pub const KCM_CONTROLLERS: &str = "endpointslice-controller,endpointslice-mirroring-controller,garbage-collector-controller,namespace-controller";

/// Service CIDR of a test cluster unless [`ClusterOptions::service_cidr`] says otherwise
/// (ClusterIPs are allocated from it).
pub const SERVICE_CIDR: &str = "10.0.0.0/24";

/// The service CIDR of the `index`-th cluster of [`start_clusters_with`] with
/// [`ClusterOptions::kubelet_nodes`]: `10.0.<index>.0/24`, so that the members of a ClusterSet
/// of real nodes have distinct ranges, as `kubectl mcs check` wants (the first is
/// [`SERVICE_CIDR`]).
pub fn service_cidr_for(index: usize) -> String {
    assert!(index < 256, "service_cidr_for: index {index} too large");
    format!("10.0.{index}.0/24")
}

/// The `n`-th address of the first (IPv4) range of `cidrs` (`a.b.c.d/p[,v6]`), e.g. the
/// `kubernetes` Service's ClusterIP (`n` = 1).
pub fn service_address(cidrs: &str, n: u32) -> std::net::Ipv4Addr {
    let first = cidrs.split(',').next().unwrap_or_default();
    let network: std::net::Ipv4Addr = first
        .split('/')
        .next()
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("service CIDR {cidrs:?}: no IPv4 range first"));
    std::net::Ipv4Addr::from(u32::from(network) + n)
}

/// The service CIDR of [`ClusterOptions::with_dual_stack`]: [`SERVICE_CIDR`] and an IPv6
/// range.
pub const DUAL_STACK_SERVICE_CIDR: &str = "10.0.0.0/24,fd00:10:96::/112";

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
    /// The API server's `--service-cluster-ip-range` (ClusterIPs come from it; the API
    /// server also publishes it as the ServiceCIDR object `kubernetes`).
    pub service_cidr: String,
    /// The cluster's pod CIDR. With [`ClusterOptions::controller_manager`], the
    /// controller manager also runs its node IPAM controller, which gives every Node a
    /// `podCIDR` from this range (as `--allocate-node-cidrs --cluster-cidr` do in a real
    /// cluster). `None`: no pod CIDR, Nodes get none (unless [`ClusterOptions::pods`]
    /// is set: then [`start_clusters_with`] gives the `i`-th cluster [`pod_cidr_for`]`(i)`).
    /// Both this and [`ClusterOptions::service_cidr`] may be dual-stack, `v4,v6`.
    pub pod_cidr: Option<String>,
    /// Run real Pods without a kubelet: kube-scheduler, kwok (its Stage objects applied)
    /// and one kwok-managed Node, [`kwok::KWOK_NODE`], Ready with a `podCIDR` from
    /// [`ClusterOptions::pod_cidr`]; kube-controller-manager also runs the Deployment,
    /// ReplicaSet and StatefulSet controllers ([`KCM_WORKLOAD_CONTROLLERS`]) and node IPAM.
    /// Deployments and StatefulSets then become Running, Ready Pods with IPs from the pod
    /// CIDR, and their Services get EndpointSlices. Needs
    /// [`ClusterOptions::controller_manager`]. See [`crate::kwok`] for the helpers.
    pub pods: bool,
    /// IPv6 as well as IPv4 (set by [`ClusterOptions::with_dual_stack`]): with
    /// [`ClusterOptions::pods`] and no [`ClusterOptions::pod_cidr`], the `i`-th cluster
    /// gets [`dual_stack_pod_cidr_for`]`(i)`, so its Pods have an address of each family.
    pub dual_stack: bool,
    /// Real nodes will run Pods of this cluster ([`crate::node`]), so Pods must reach the
    /// API server as in a real cluster: it listens on every address of the lab's namespace
    /// and advertises [`LAB_DUMMY`] (the `kubernetes` Service's endpoint, which kube-proxy on
    /// the nodes routes to), and Pods get ServiceAccount tokens (the ServiceAccount
    /// admission plugin, and the controller manager's ServiceAccount and `kube-root-ca.crt`
    /// publishers). Only inside a [`Lab`] (the start panics elsewhere: the API server must
    /// not listen on the host's addresses); needs [`ClusterOptions::pod_cidr`] or
    /// [`ClusterOptions::pods`] for the nodes' Pod ranges. Left at [`SERVICE_CIDR`], the
    /// service CIDR of the `i`-th cluster of [`start_clusters_with`] is
    /// [`service_cidr_for`]`(i)`, so that the members of a ClusterSet do not overlap.
    ///
    /// [`LAB_DUMMY`]: super::netlab::LAB_DUMMY
    /// [`Lab`]: super::netlab::Lab
    pub kubelet_nodes: bool,
}

impl ClusterOptions {
    /// An API server (and etcd) with the CRDs and no kube-controller-manager: for tests
    /// whose objects no controller has to act on.
    #[must_use]
    pub fn api_only() -> Self {
        Self {
            controller_manager: false,
            ..Self::default()
        }
    }

    /// These options with [`ClusterOptions::pods`] on (and the controller manager, which
    /// it needs).
    #[must_use]
    pub fn with_pods(mut self) -> Self {
        self.pods = true;
        self.controller_manager = true;
        self
    }

    /// These options dual-stack: the service CIDR [`DUAL_STACK_SERVICE_CIDR`] (so
    /// `PreferDualStack` and `RequireDualStack` Services get a ClusterIP of each family)
    /// and, with [`ClusterOptions::pods`], dual-stack pod CIDRs.
    #[must_use]
    pub fn with_dual_stack(mut self) -> Self {
        self.service_cidr = DUAL_STACK_SERVICE_CIDR.to_owned();
        self.dual_stack = true;
        self
    }
}

impl Default for ClusterOptions {
    fn default() -> Self {
        Self {
            controller_manager: true,
            install_crds: true,
            service_cidr: SERVICE_CIDR.to_string(),
            pod_cidr: None,
            pods: false,
            dual_stack: false,
            kubelet_nodes: false,
        }
    }
}

/// Limits how many clusters one test binary runs at once (cargo runs the tests of a
/// binary in parallel; 2 cores do not start 15 API servers in time). Override with
/// `MCS_K8S_MAX_CLUSTERS`.
fn cluster_slots() -> &'static std::sync::Arc<Semaphore> {
    static SLOTS: OnceLock<std::sync::Arc<Semaphore>> = OnceLock::new();
    SLOTS.get_or_init(|| std::sync::Arc::new(Semaphore::new(max_clusters())))
}

static MAX_CLUSTERS: OnceLock<usize> = OnceLock::new();

/// Lets this process run `n` clusters at once instead of the default (4, or
/// `MCS_K8S_MAX_CLUSTERS`). Takes effect only before the first cluster starts; for
/// benches that need more at once.
pub fn allow_clusters(n: usize) {
    let _ = MAX_CLUSTERS.set(n.max(1));
}

fn max_clusters() -> usize {
    *MAX_CLUSTERS.get_or_init(|| {
        std::env::var("MCS_K8S_MAX_CLUSTERS")
            .ok()
            .and_then(|v| v.parse().ok())
            .filter(|n| *n > 0)
            .unwrap_or(4)
    })
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
    assert!(
        !opts.pods || opts.controller_manager,
        "ClusterOptions::pods needs ClusterOptions::controller_manager"
    );
    let futs = names.iter().enumerate().map(|(i, name)| {
        // The first cluster carries the permit for the whole group.
        let p = if i == 0 { permit.take() } else { None };
        let mut opts = opts.clone();
        if opts.kubelet_nodes && opts.service_cidr == SERVICE_CIDR {
            opts.service_cidr = service_cidr_for(i);
        }
        if opts.pods && opts.pod_cidr.is_none() {
            opts.pod_cidr = Some(if opts.dual_stack {
                dual_stack_pod_cidr_for(i)
            } else {
                pod_cidr_for(i)
            });
        }
        TestCluster::launch(name, bins.clone(), crds.clone(), opts, p)
    });
    let clusters = futures::future::join_all(futs).await;
    eprintln!(
        "[harness] started {} cluster(s) {:?} in {:.1?} (waited {:.1?} for a slot; {} CRD(s); \
         controller-manager: {}; pods: {})",
        clusters.len(),
        names,
        t0.elapsed() - waited,
        waited,
        crds.len(),
        opts.controller_manager,
        opts.pods,
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
    scheduler: Option<Child>,
    kwok: Option<Child>,
    kubeconfig: Kubeconfig,
    server_url: String,
    startup: Duration,
    pods_startup: Duration,
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
    /// The process id of `component` (`etcd`, `kube-apiserver` or
    /// `kube-controller-manager`), while it runs.
    pub fn pid(&self, component: &str) -> Option<u32> {
        match component {
            "etcd" => self.etcd.as_ref(),
            "kube-apiserver" => self.apiserver.as_ref(),
            "kube-controller-manager" => self.controller_manager.as_ref(),
            _ => None,
        }
        .map(Child::id)
    }

    /// How this cluster was started.
    pub fn options(&self) -> &ClusterOptions {
        &self.opts
    }

    /// The name given to [`start_clusters`] (also the kubeconfig cluster/context name).
    pub fn name(&self) -> &str {
        &self.name
    }

    /// The API server's `--service-cluster-ip-range`.
    pub fn service_cidr(&self) -> &str {
        &self.opts.service_cidr
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
        let config = Config::from_custom_kubeconfig(
            self.kubeconfig_as_user(user, groups),
            &KubeConfigOptions::default(),
        )
        .await
        .unwrap_or_else(|e| panic!("cluster {}: bad kubeconfig: {e}", self.name));
        Client::try_from(config)
            .unwrap_or_else(|e| panic!("cluster {}: cannot build client: {e}", self.name))
    }

    /// This cluster's kubeconfig with `user` in `groups` (a client certificate from the
    /// cluster's CA) instead of the admin, for processes a test starts with that identity
    /// (write it with [`write_kubeconfig`](crate::write_kubeconfig)).
    pub fn kubeconfig_as_user(&self, user: &str, groups: &[&str]) -> Kubeconfig {
        let (cert, key) = pki::client_certificate(&self.path, &self.name, user, groups);
        let b64 = |s: String| base64::engine::general_purpose::STANDARD.encode(s);
        let mut kubeconfig = self.kubeconfig.clone();
        for named in &mut kubeconfig.auth_infos {
            named.auth_info = Some(kube::config::AuthInfo {
                client_certificate_data: Some(b64(cert.clone())),
                client_key_data: Some(b64(key.clone()).into()),
                ..Default::default()
            });
        }
        kubeconfig
    }

    /// A client authenticated with a bearer `token` (e.g. from
    /// [`service_account_token`](crate::service_account_token)).
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

    /// Wall time of [`ClusterOptions::pods`]'s part of the start: kube-scheduler and kwok
    /// started, the Node registered, Ready and given its podCIDR (zero without pods).
    pub fn pods_startup_time(&self) -> Duration {
        self.pods_startup
    }

    /// Resident memory (KiB, `VmRSS`) of each running component, by component name
    /// (`etcd`, `kube-apiserver`, `kube-controller-manager`, `kube-scheduler`, `kwok`).
    pub fn component_rss_kib(&self) -> Vec<(&'static str, u64)> {
        let rss = |c: &Option<Child>| {
            let pid = c.as_ref()?.id();
            let status = std::fs::read_to_string(format!("/proc/{pid}/status")).ok()?;
            status
                .lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        };
        [
            ("etcd", &self.etcd),
            ("kube-apiserver", &self.apiserver),
            ("kube-controller-manager", &self.controller_manager),
            ("kube-scheduler", &self.scheduler),
            ("kwok", &self.kwok),
        ]
        .into_iter()
        .filter_map(|(name, c)| Some((name, rss(c)?)))
        .collect()
    }

    /// Panic (with their logs) if kube-scheduler or kwok has exited.
    pub fn assert_pods_running(&mut self) {
        for name in ["kube-scheduler", "kwok"] {
            let child = if name == "kwok" {
                &mut self.kwok
            } else {
                &mut self.scheduler
            };
            if let Some(c) = child.as_mut()
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!(
                    "cluster {}: {name} exited ({status}):\n{}",
                    self.name,
                    self.log_tail(name, 40)
                );
            }
        }
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
        let pki = Pki::generate(name, service_address(&opts.service_cidr, 1));
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
            scheduler: None,
            kwok: None,
            kubeconfig: Kubeconfig::default(),
            server_url: String::new(),
            startup: Duration::ZERO,
            pods_startup: Duration::ZERO,
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
            cluster.kubeconfig = kubeconfig::admin(name, &cluster.server_url, &pki);
            kubeconfig::write(&cluster.kubeconfig_path(), &cluster.kubeconfig);
            match cluster.boot().await {
                Ok(()) => break,
                Err(e) if attempt < MAX_ATTEMPTS && e.contains("address already in use") => {
                    eprintln!("[harness] cluster {name}: port clash, retrying: {e}");
                    cluster.kill_all();
                    // etcd refuses to rejoin with other peer URLs: start from scratch.
                    let _ = std::fs::remove_dir_all(cluster.path.join("etcd"));
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
        if cluster.opts.pods {
            let t_pods = Instant::now();
            cluster.scheduler =
                Some(cluster.spawn("kube-scheduler", &kwok::scheduler_args(&cluster)));
            let kwok_args = kwok::kwok_args(&cluster);
            cluster.kwok = Some(cluster.spawn_exe(&kwok_bin(), "kwok", &kwok_args));
            kwok::add_node(&mut cluster).await;
            cluster.pods_startup = t_pods.elapsed();
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
        let bind = if self.opts.kubelet_nodes {
            assert!(
                super::netlab::in_a_lab(),
                "cluster {}: ClusterOptions::kubelet_nodes makes the API server listen on every \
                 address: start it inside a Lab (testkit/src/netlab.rs), never on the host",
                self.name
            );
            "0.0.0.0"
        } else {
            "127.0.0.1"
        };
        let mut args = vec![
            format!("--etcd-servers=http://127.0.0.1:{}", self.etcd_client_port),
            format!("--bind-address={bind}"),
            format!("--secure-port={}", self.apiserver_port),
            format!("--cert-dir={}", f("apiserver-certs")),
            format!("--tls-cert-file={}", f(pki::SERVER_CERT)),
            format!("--tls-private-key-file={}", f(pki::SERVER_KEY)),
            format!("--client-ca-file={}", f(pki::CA_CERT)),
            "--service-account-issuer=https://kubernetes.default.svc".into(),
            format!("--service-account-key-file={}", f(pki::SA_PUB)),
            format!("--service-account-signing-key-file={}", f(pki::SA_KEY)),
            format!("--service-cluster-ip-range={}", self.opts.service_cidr),
            "--authorization-mode=RBAC".into(),
            "--allow-privileged=true".into(),
            "--profiling=false".into(),
        ];
        if self.opts.kubelet_nodes {
            // The `kubernetes` Service's endpoint: the lab's own address, which Pods reach
            // through their node.
            args.push(format!("--advertise-address={}", super::netlab::LAB_DUMMY));
        } else {
            args.extend([
                "--disable-admission-plugins=ServiceAccount".into(),
                // Endpoints may not be loopback: keep the `kubernetes` Service endpoint-less.
                "--endpoint-reconciler-type=none".into(),
            ]);
        }
        args.extend(self.extra_apiserver_args.iter().cloned());
        self.apiserver = Some(self.spawn("kube-apiserver", &args));
    }

    fn spawn_controller_manager(&mut self) {
        let mut controllers = KCM_CONTROLLERS.to_string();
        if self.opts.pods {
            controllers.push(',');
            controllers.push_str(KCM_WORKLOAD_CONTROLLERS);
        }
        let mut ipam = Vec::new();
        if let Some(pods) = &self.opts.pod_cidr {
            controllers.push_str(",node-ipam-controller");
            ipam = vec![
                "--allocate-node-cidrs=true".to_string(),
                format!("--cluster-cidr={pods}"),
                format!("--service-cluster-ip-range={}", self.opts.service_cidr),
            ];
        }
        let mut args = vec![
            format!("--kubeconfig={}", self.kubeconfig_path().display()),
            format!("--controllers={controllers}"),
            "--use-service-account-credentials=false".into(),
            "--leader-elect=false".into(),
            "--bind-address=127.0.0.1".into(),
            // No serving endpoint at all (nothing polls it), so no port to allocate.
            "--secure-port=0".into(),
            "--profiling=false".into(),
        ];
        args.extend(ipam);
        if self.opts.kubelet_nodes {
            // Every namespace's `default` ServiceAccount and `kube-root-ca.crt`, which a Pod's
            // projected ServiceAccount volume reads; the node lifecycle controller removes
            // the not-ready taint a kubelet registers its Node with, once it is Ready.
            let controllers = args
                .iter_mut()
                .find(|a| a.starts_with("--controllers="))
                .expect("the controllers argument");
            controllers.push_str(
                ",serviceaccount-controller,root-ca-certificate-publisher-controller,\
                 node-lifecycle-controller",
            );
            args.push(format!(
                "--root-ca-file={}",
                self.path.join(pki::CA_CERT).display()
            ));
        }
        self.controller_manager = Some(self.spawn("kube-controller-manager", &args));
    }

    fn spawn(&self, bin: &str, args: &[String]) -> Child {
        self.spawn_exe(&self.bins.join(bin), bin, args)
    }

    /// Starts `exe`, logging to `<component>.log` in the cluster's directory.
    fn spawn_exe(&self, exe: &Path, component: &str, args: &[String]) -> Child {
        let log = self.path.join(format!("{component}.log"));
        process::spawn(exe, args, &self.path, &log).unwrap_or_else(|e| {
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
            let url = format!("{}/health", self.etcd_url());
            if let Ok(Ok((status, body))) =
                tokio::time::timeout(Duration::from_secs(2), http_get(&url)).await
                && status.is_success()
                && body.contains("\"health\":\"true\"")
            {
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
            self.kwok.take(),
            self.scheduler.take(),
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
