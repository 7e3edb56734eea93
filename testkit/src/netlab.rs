//! A network lab for dataplane tests: the clusters' control planes, their nodes and their
//! pods in network namespaces the harness creates and removes, with kube-proxy (nftables
//! mode) on every node. Nothing is added to the host's own namespace or routing table.
//!
//! ```text
//!                       lab netns  (test process: etcd, kube-apiserver, KCM, scheduler,
//!                                   kwok, agents, mcs-dns; 127.0.0.1 = control planes)
//!          10.254.0.1 /     10.254.1.1 |      \ 10.254.2.1        (underlay, one veth per node;
//!                    /                 |       \                   routes: pod CIDR i via node i)
//!   node east (netns)      node west (netns)      node north (netns)   kube-proxy --proxy-mode=nftables
//!   10.254.0.2             10.254.1.2             10.254.2.2           127.0.0.1:<api port> forwarded
//!    |  169.254.1.1 on every pod veth, /32 route per pod                to the lab's API server
//!   pod netns (eth0 = the Pod IP kwok gave, default via 169.254.1.1): listeners / clients
//! ```
//!
//! How: [`Lab::enter`] (on the test's own thread, before any runtime exists) creates the lab
//! namespace with `ip netns add` and moves the calling thread into it (`setns`, through
//! rustix), so the tokio runtime built after it, every child process and every socket live
//! in the lab. Nodes and pods are further named namespaces joined by veth pairs. Sockets
//! "in" a node or pod are created by a short-lived thread that joins that namespace
//! ([`in_netns`]); a socket keeps its namespace for life, so the lab's runtime can serve it.
//! Code that must create its own sockets there (a client pool, a resolver) runs on a thread
//! of its own in the namespace ([`run_in_netns`]). Everything the lab created is deleted when
//! it is dropped; namespaces left by a killed test process (their owner pid is gone) are
//! deleted by the next [`Lab::enter`].
//!
//! Needs root, `ip` (iproute2), `sysctl` and `nft` (nftables, which kube-proxy's nftables
//! mode runs); `scripts/test.sh` installs nftables when missing. Missing pieces panic with
//! what to install.

use std::collections::BTreeSet;
use std::fs::File;
use std::future::Future;
use std::net::{IpAddr, Ipv4Addr, SocketAddr, TcpListener as StdListener};
use std::os::fd::AsFd;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http_body_util::Full;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use rustix::thread::{LinkNameSpaceType, move_into_link_name_space};

use super::bins::bin_dir;
use super::cluster::TestCluster;
use super::http::http_get;
use super::node::{KubeletNode, NodeNetwork};
use super::process::{reap, spawn, tail};

/// Prefix of every namespace name a lab creates: `mcslab<pid>-...`.
const PREFIX: &str = "mcslab";

/// The lab namespace's own address (on a dead-end veth holding its default route, which
/// kube-apiserver needs to start); the API servers advertise it.
pub const LAB_DUMMY: Ipv4Addr = Ipv4Addr::new(10, 254, 255, 1);

/// The address every node has on each of its pod veths (the pods' default gateway).
pub const POD_GATEWAY: Ipv4Addr = Ipv4Addr::new(169, 254, 1, 1);

/// The lab's underlay address towards node `i` (`10.254.<i>.1`); the node is `10.254.<i>.2`.
pub fn lab_address(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 254, u8::try_from(i).expect("node index"), 1)
}

fn node_address(i: usize) -> Ipv4Addr {
    Ipv4Addr::new(10, 254, u8::try_from(i).expect("node index"), 2)
}

/// Runs `ip` with `args` (from the calling thread, so in its namespace unless the
/// arguments say otherwise); panics with its output when it fails.
fn ip(args: &[&str]) {
    run("ip", args);
}

fn run(exe: &str, args: &[&str]) {
    let out = Command::new(exe)
        .args(args)
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| {
            panic!(
                "cannot run `{exe}` ({e}): the dataplane tests need iproute2, procps and \
                 nftables (apt-get install iproute2 procps nftables)"
            )
        });
    assert!(
        out.status.success(),
        "`{exe} {}` failed ({}): {}{}",
        args.join(" "),
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// Sets sysctls inside the named namespace.
fn sysctl(ns: &str, settings: &[&str]) {
    let mut args = vec!["netns", "exec", ns, "sysctl", "-q", "-w"];
    args.extend_from_slice(settings);
    ip(&args);
}

fn netns_path(name: &str) -> PathBuf {
    Path::new("/run/netns").join(name)
}

/// Moves the calling thread into the named namespace.
fn join_netns(name: &str) {
    let f = File::open(netns_path(name))
        .unwrap_or_else(|e| panic!("open network namespace {name}: {e}"));
    move_into_link_name_space(f.as_fd(), Some(LinkNameSpaceType::Network))
        .unwrap_or_else(|e| panic!("setns into network namespace {name}: {e}"));
}

/// Whether the calling thread is in this process's [`Lab`] namespace.
pub fn in_a_lab() -> bool {
    let lab = netns_path(&format!("{PREFIX}{}-lab", std::process::id()));
    lab.exists()
        && current_netns_inode("/proc/thread-self/ns/net")
            == current_netns_inode(&lab.display().to_string())
}

fn current_netns_inode(path: &str) -> u64 {
    use std::os::unix::fs::MetadataExt;
    std::fs::metadata(path)
        .unwrap_or_else(|e| panic!("stat {path}: {e}"))
        .ino()
}

/// Runs `f` on a new thread inside the named namespace and returns what it returned
/// (for creating sockets that belong to that namespace).
pub fn in_netns<T: Send + 'static>(ns: &str, f: impl FnOnce() -> T + Send + 'static) -> T {
    let ns = ns.to_owned();
    std::thread::spawn(move || {
        join_netns(&ns);
        f()
    })
    .join()
    .unwrap_or_else(|e| std::panic::resume_unwind(e))
}

/// Runs the future `f` makes on a current-thread runtime of its own, on a new thread inside
/// the named namespace (every socket it opens is in that namespace), and returns its
/// output. The thread starts at once; a panic inside is re-raised by the returned future.
pub fn run_in_netns<T, F, Fut>(ns: &str, f: F) -> impl Future<Output = T> + Send + 'static
where
    T: Send + 'static,
    F: FnOnce() -> Fut + Send + 'static,
    Fut: Future<Output = T>,
{
    let ns = ns.to_owned();
    let (tx, rx) = tokio::sync::oneshot::channel();
    let thread = std::thread::spawn(move || {
        join_netns(&ns);
        let rt = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .build()
            .expect("a runtime for the namespace thread");
        let _ = tx.send(rt.block_on(f()));
    });
    async move {
        match rx.await {
            Ok(v) => v,
            Err(_) => std::panic::resume_unwind(thread.join().expect_err("the thread panicked")),
        }
    }
}

/// One node of the lab: a namespace running kube-proxy against its cluster.
#[derive(Debug)]
pub struct LabNode {
    /// Index of the node (and of its cluster in the lab).
    pub index: usize,
    /// The cluster's name.
    pub cluster: String,
    /// The node's namespace name.
    pub netns: String,
    /// The cluster's pod CIDR (routed by the lab to this node).
    pub pod_cidr: String,
    pods: usize,
    log: PathBuf,
}

/// A Pod plumbed into the lab: its namespace, its IP and its cluster.
#[derive(Clone, Debug)]
pub struct LabPod {
    /// The Pod's name.
    pub name: String,
    /// The Pod's cluster.
    pub cluster: String,
    /// The Pod IP kwok gave it (`eth0` in its namespace).
    pub ip: Ipv4Addr,
    /// The Pod's namespace name.
    pub netns: String,
    node_netns: String,
    veth: String,
}

/// Runs a test in a [`Lab`]: enters it on the calling thread (the test's own), builds the
/// runtime there, runs the future `test` makes with the lab, and drops the runtime, then
/// the lab (what the lab removes must outlive what ran in it). One lab at a time per test
/// process (their names derive from the process id): the tests of a binary that each run in
/// a lab take turns.
///
/// ```ignore
/// #[test]
/// fn packets() {
///     netlab::with_lab(|lab| Box::pin(run(lab)));
/// }
/// ```
pub fn with_lab<T>(
    test: impl for<'a> FnOnce(&'a mut Lab) -> std::pin::Pin<Box<dyn Future<Output = T> + 'a>>,
) -> T {
    static ONE_AT_A_TIME: Mutex<()> = Mutex::new(());
    // A test that panicked in its lab poisons the lock; its lab is gone all the same.
    let _turn = ONE_AT_A_TIME.lock().unwrap_or_else(|e| e.into_inner());
    let mut lab = Lab::enter();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .worker_threads(2)
        .enable_all()
        .build()
        .expect("a runtime for the lab");
    let out = rt.block_on(test(&mut lab));
    drop(rt);
    drop(lab);
    out
}

/// The lab (see the module docs). Drop it after the runtime that used it.
pub struct Lab {
    prefix: String,
    netns: String,
    namespaces: Mutex<Vec<String>>,
    children: Mutex<Vec<(String, Child)>>,
    nodes: Vec<LabNode>,
    pods: Mutex<Vec<LabPod>>,
    kubelets: Vec<KubeletNode>,
    dir: tempfile::TempDir,
}

impl std::fmt::Debug for Lab {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Lab")
            .field("netns", &self.netns)
            .finish_non_exhaustive()
    }
}

impl Lab {
    /// Creates the lab namespace and moves the calling thread into it. Call it on the test's
    /// own thread before building the tokio runtime: the runtime's threads and every process
    /// started from them then live in the lab. Panics (saying why) without root or `ip`.
    pub fn enter() -> Lab {
        assert!(
            rustix::process::geteuid().is_root(),
            "the dataplane tests create network namespaces, veth pairs and nftables rules: \
             run them as root"
        );
        run("nft", &["--version"]);
        remove_stale_namespaces();
        let prefix = format!("{PREFIX}{}", std::process::id());
        let netns = format!("{prefix}-lab");
        ip(&["netns", "add", &netns]);
        let host = current_netns_inode("/proc/thread-self/ns/net");
        join_netns(&netns);
        let lab = current_netns_inode("/proc/thread-self/ns/net");
        assert_ne!(
            host, lab,
            "the test thread did not leave the host's namespace"
        );
        let lab = Lab {
            prefix,
            netns: netns.clone(),
            namespaces: Mutex::new(vec![netns.clone()]),
            children: Mutex::new(Vec::new()),
            nodes: Vec::new(),
            pods: Mutex::new(Vec::new()),
            kubelets: Vec::new(),
            dir: tempfile::Builder::new()
                .prefix("mcs-netlab-")
                .tempdir()
                .expect("a scratch directory for the lab"),
        };
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        // kube-apiserver wants a default route to pick its advertise address from: one into
        // a veth whose peer stays in the lab, unconnected, so it delivers nowhere.
        ip(&[
            "-n", &netns, "link", "add", "lab0", "type", "veth", "peer", "name", "lab1",
        ]);
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{LAB_DUMMY}/32"),
            "dev",
            "lab0",
        ]);
        ip(&["-n", &netns, "link", "set", "lab0", "up"]);
        ip(&["-n", &netns, "route", "add", "default", "dev", "lab0"]);
        sysctl(
            &netns,
            &[
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
            ],
        );
        lab
    }

    /// The lab namespace's name.
    pub fn netns(&self) -> &str {
        &self.netns
    }

    /// The lab's nodes, in the order added.
    pub fn nodes(&self) -> &[LabNode] {
        &self.nodes
    }

    fn track(&self, ns: &str) {
        self.namespaces.lock().unwrap().push(ns.to_owned());
    }

    /// Adds a node for `cluster` (the next index): its namespace, the underlay veth, the
    /// route to the cluster's pod CIDR, a forwarder for the cluster's API server port on
    /// the node's loopback, and kube-proxy in nftables mode as the cluster's kwok Node.
    /// Returns the node's index. Must run inside the lab's runtime.
    pub fn add_node(&mut self, cluster: &TestCluster) -> usize {
        let i = self.nodes.len();
        let name = cluster.name().to_owned();
        let netns = format!("{}-{name}", self.prefix);
        ip(&["netns", "add", &netns]);
        self.track(&netns);
        let pod_cidr = cluster
            .options()
            .pod_cidr
            .clone()
            .expect("a cluster with pods (ClusterOptions::pods)");
        let (lab_ip, node_ip) = (lab_address(i), node_address(i));
        let uplink = format!("u{i}");
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        ip(&[
            "-n",
            &self.netns,
            "link",
            "add",
            &uplink,
            "type",
            "veth",
            "peer",
            "name",
            "eth0",
            "netns",
            &netns,
        ]);
        ip(&[
            "-n",
            &self.netns,
            "addr",
            "add",
            &format!("{lab_ip}/24"),
            "dev",
            &uplink,
        ]);
        ip(&["-n", &self.netns, "link", "set", &uplink, "up"]);
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{node_ip}/24"),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &netns, "link", "set", "eth0", "up"]);
        ip(&[
            "-n",
            &netns,
            "route",
            "add",
            "default",
            "via",
            &lab_ip.to_string(),
        ]);
        ip(&[
            "-n",
            &self.netns,
            "route",
            "add",
            &pod_cidr,
            "via",
            &node_ip.to_string(),
        ]);
        sysctl(
            &netns,
            &[
                "net.ipv4.ip_forward=1",
                "net.ipv4.conf.all.rp_filter=0",
                "net.ipv4.conf.default.rp_filter=0",
            ],
        );
        self.forward_api_server(&netns, cluster);
        let log = self.dir.path().join(format!("kube-proxy-{name}.log"));
        let bin = bin_dir().join("kube-proxy");
        assert!(
            bin.is_file(),
            "{} missing: scripts/k8s-bins.sh builds kube-proxy with the other binaries",
            bin.display()
        );
        let args: Vec<String> = [
            "netns",
            "exec",
            &netns,
            &bin.display().to_string(),
            "--proxy-mode=nftables",
            &format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
            &format!("--hostname-override={}", super::kwok::KWOK_NODE),
            &format!("--cluster-cidr={pod_cidr}"),
            "--detect-local-mode=ClusterCIDR",
            &format!("--bind-address={node_ip}"),
            "--conntrack-max-per-core=0",
            "--conntrack-tcp-timeout-established=0",
            "--conntrack-tcp-timeout-close-wait=0",
            "--healthz-bind-address=127.0.0.1:10256",
            "--metrics-bind-address=127.0.0.1:10249",
            "--config-sync-period=1m",
            "--v=2",
        ]
        .into_iter()
        .map(str::to_owned)
        .collect();
        let child = spawn(Path::new("ip"), &args, self.dir.path(), &log)
            .unwrap_or_else(|e| panic!("cannot start kube-proxy for {name}: {e}"));
        self.children
            .lock()
            .unwrap()
            .push((format!("kube-proxy {name}"), child));
        self.nodes.push(LabNode {
            index: i,
            cluster: name,
            netns,
            pod_cidr,
            pods: 0,
            log,
        });
        i
    }

    /// Starts a real node of `cluster` in lab node `i`'s namespace: containerd and kubelet,
    /// registered as Node `<cluster>-kubelet` (see [`crate::node`]); its Pods get
    /// addresses from the `podCIDR` the cluster gives it, which the lab routes to node `i`
    /// with the rest of the cluster's pod CIDR. Node `i`'s kube-proxy serves its Pods too.
    /// Waits until the Node is Ready. Must run inside the lab's runtime.
    pub async fn add_kubelet(&mut self, i: usize, cluster: &TestCluster) -> &mut KubeletNode {
        let net = NodeNetwork {
            netns: self.nodes[i].netns.clone(),
            node_ip: node_address(i),
        };
        let name = format!("{}-kubelet", cluster.name());
        let node = KubeletNode::start(cluster, &name, &net).await;
        self.kubelets.push(node);
        self.kubelets.last_mut().expect("just added")
    }

    /// The `i`-th real node added with [`Lab::add_kubelet`].
    pub fn kubelet(&mut self, i: usize) -> &mut KubeletNode {
        &mut self.kubelets[i]
    }

    /// The last `lines` lines of node `i`'s kube-proxy log.
    pub fn kube_proxy_log(&self, i: usize, lines: usize) -> String {
        tail(&self.nodes[i].log, lines)
    }

    /// Panics with its log if a kube-proxy has exited.
    pub fn assert_running(&self) {
        let mut children = self.children.lock().unwrap();
        for (what, child) in children.iter_mut() {
            if let Ok(Some(status)) = child.try_wait() {
                let log = self
                    .nodes
                    .iter()
                    .find(|n| what.ends_with(&n.cluster))
                    .map(|n| tail(&n.log, 40))
                    .unwrap_or_default();
                panic!("{what} exited ({status}):\n{log}");
            }
        }
    }

    /// Node `i`'s kube-proxy metric `name` (an unlabelled gauge or counter) from its metrics
    /// endpoint, `None` while it does not answer or lacks the metric.
    pub async fn kube_proxy_metric(&self, i: usize, name: &str) -> Option<f64> {
        let url = "http://127.0.0.1:10249/metrics";
        let (status, body) = run_in_netns(&self.nodes[i].netns, move || super::http::http_get(url))
            .await
            .ok()?;
        if !status.is_success() {
            return None;
        }
        // Unlabelled, or labelled by IP family (then the IPv4 series: the lab is IPv4).
        body.lines().find_map(|l| {
            let rest = l.strip_prefix(name)?;
            let value = match rest.strip_prefix('{') {
                Some(labels) => {
                    let (labels, value) = labels.split_once('}')?;
                    if labels.contains("IPv6") {
                        return None;
                    }
                    value
                }
                None => rest.strip_prefix(' ')?,
            };
            value.trim().parse().ok()
        })
    }

    /// Waits until node `i`'s kube-proxy has synced its rules at least once and, asked after
    /// `since`, has no endpoint or service change pending: what the API server held at
    /// `since` is then in its nftables rules (up to the latency of kube-proxy's watch, which
    /// no metric shows: where a test must know a change is in the rules, it waits on them,
    /// [`Lab::wait_kube_proxy_endpoints`]). Panics after a minute with its log.
    pub async fn wait_kube_proxy_synced(&self, i: usize, since: std::time::SystemTime) {
        let since = since
            .duration_since(std::time::UNIX_EPOCH)
            .unwrap()
            .as_secs_f64();
        // Every answer below is asked for after `since`.
        let what = format!("kube-proxy of {} synced", self.nodes[i].cluster);
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let last = self
                .kube_proxy_metric(i, "kubeproxy_sync_proxy_rules_last_timestamp_seconds")
                .await;
            let endpoints = self
                .kube_proxy_metric(i, "kubeproxy_sync_proxy_rules_endpoint_changes_pending")
                .await;
            let services = self
                .kube_proxy_metric(i, "kubeproxy_sync_proxy_rules_service_changes_pending")
                .await;
            if last.is_some() && endpoints == Some(0.0) && services == Some(0.0) {
                return;
            }
            self.assert_running();
            if std::time::Instant::now() >= deadline {
                let url = "http://127.0.0.1:10249/metrics";
                let metrics =
                    run_in_netns(&self.nodes[i].netns, move || super::http::http_get(url))
                        .await
                        .map(|(_, body)| body)
                        .unwrap_or_else(|e| e);
                let sync: Vec<&str> = metrics
                    .lines()
                    .filter(|l| l.contains("sync_proxy_rules"))
                    .collect();
                eprintln!("[netlab] kube-proxy sync metrics:\n{}", sync.join("\n"));
            }
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what} after {since} (last sync {last:?}, pending \
                 endpoint changes {endpoints:?}, service changes {services:?}):\n{}",
                self.kube_proxy_log(i, 30)
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Lists node `i`'s nftables ruleset (`nft list ruleset` in its namespace).
    pub fn nft_ruleset(&self, i: usize) -> String {
        nft_ruleset_in(&self.nodes[i].netns)
    }

    /// Waits until node `i`'s kube-proxy sends new connections to `vip` to exactly
    /// `expected` (its rules, read with `nft`, not its metrics: a change it has not
    /// received yet is not pending in them either).
    pub async fn wait_kube_proxy_endpoints(
        &self,
        i: usize,
        vip: SocketAddr,
        expected: &BTreeSet<String>,
    ) {
        let what = format!(
            "kube-proxy of {} routing {vip} to {expected:?}",
            self.nodes[i].cluster
        );
        let deadline = std::time::Instant::now() + std::time::Duration::from_secs(60);
        loop {
            let ruleset = {
                let netns = self.nodes[i].netns.clone();
                tokio::task::spawn_blocking(move || nft_ruleset_in(&netns))
                    .await
                    .expect("nft")
            };
            let now = endpoints_in_ruleset(&ruleset, vip);
            if now == *expected {
                return;
            }
            self.assert_running();
            assert!(
                std::time::Instant::now() < deadline,
                "timed out waiting for {what} (now {now:?}):\n{ruleset}"
            );
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
        }
    }

    /// Listens on `127.0.0.1:<API server port>` in the node's namespace and forwards every
    /// connection to the cluster's API server in the lab, so the cluster's own kubeconfig
    /// works unchanged from the node.
    fn forward_api_server(&self, netns: &str, cluster: &TestCluster) {
        let target: SocketAddr = cluster
            .server_url()
            .trim_start_matches("https://")
            .parse()
            .expect("the API server's address");
        let listener = in_netns(netns, move || StdListener::bind(target))
            .unwrap_or_else(|e| panic!("bind {target} in {netns}: {e}"));
        listener.set_nonblocking(true).unwrap();
        let listener = tokio::net::TcpListener::from_std(listener).unwrap();
        tokio::spawn(async move {
            while let Ok((mut inbound, _)) = listener.accept().await {
                tokio::spawn(async move {
                    if let Ok(mut outbound) = tokio::net::TcpStream::connect(target).await {
                        let _ = tokio::io::copy_bidirectional(&mut inbound, &mut outbound).await;
                    }
                });
            }
        });
    }

    /// Removes the plumbed Pod with IP `pod_ip`: its veth (and with it the node's route to
    /// it) and its namespace, as a node tears down a deleted Pod's sandbox: its listeners
    /// become unreachable.
    pub fn remove_pod(&mut self, pod_ip: Ipv4Addr) {
        let mut pods = self.pods.lock().unwrap();
        let at = pods
            .iter()
            .position(|p| p.ip == pod_ip)
            .unwrap_or_else(|| panic!("no plumbed pod with IP {pod_ip}"));
        let pod = pods.remove(at);
        // The veth first: a namespace outlives its name while a socket (the listener) is
        // open in it. Deleting one end of a veth deletes both, and the node's route.
        ip(&["-n", &pod.node_netns, "link", "del", &pod.veth]);
        ip(&["netns", "del", &pod.netns]);
        self.namespaces.lock().unwrap().retain(|n| *n != pod.netns);
    }

    /// Gives a Pod of node `node` its namespace: a veth to the node, `eth0` with the Pod IP,
    /// the default route via [`POD_GATEWAY`], the node's /32 route to it.
    pub fn plumb_pod(&mut self, node: usize, name: &str, pod_ip: IpAddr) -> LabPod {
        let IpAddr::V4(pod_ip) = pod_ip else {
            panic!("pod {name}: the lab is IPv4 only, got {pod_ip}")
        };
        let n = &mut self.nodes[node];
        let k = n.pods;
        n.pods += 1;
        let netns = format!("{}-{}-p{k}", self.prefix, n.cluster);
        let node_ns = n.netns.clone();
        let cluster = n.cluster.clone();
        ip(&["netns", "add", &netns]);
        self.track(&netns);
        let veth = format!("v{k}");
        let gw = POD_GATEWAY.to_string();
        ip(&["-n", &netns, "link", "set", "lo", "up"]);
        ip(&[
            "-n", &node_ns, "link", "add", &veth, "type", "veth", "peer", "name", "eth0", "netns",
            &netns,
        ]);
        ip(&[
            "-n",
            &node_ns,
            "addr",
            "add",
            &format!("{gw}/32"),
            "dev",
            &veth,
        ]);
        ip(&["-n", &node_ns, "link", "set", &veth, "up"]);
        ip(&[
            "-n",
            &node_ns,
            "route",
            "add",
            &format!("{pod_ip}/32"),
            "dev",
            &veth,
        ]);
        ip(&[
            "-n",
            &netns,
            "addr",
            "add",
            &format!("{pod_ip}/32"),
            "dev",
            "eth0",
        ]);
        ip(&["-n", &netns, "link", "set", "eth0", "up"]);
        ip(&[
            "-n", &netns, "route", "add", &gw, "dev", "eth0", "scope", "link",
        ]);
        ip(&[
            "-n", &netns, "route", "add", "default", "via", &gw, "dev", "eth0",
        ]);
        let pod = LabPod {
            name: name.to_owned(),
            cluster,
            ip: pod_ip,
            netns,
            node_netns: node_ns,
            veth,
        };
        self.pods.lock().unwrap().push(pod.clone());
        pod
    }
}

/// Serves HTTP/1.1 on `port` inside the pod's namespace until the runtime ends: every
/// request is answered `200` with `<cluster> <pod IP>` (the address the connection reached,
/// so a wrong DNAT shows). Returns how many requests it answered, live.
pub fn serve_pod(pod: &LabPod, port: u16) -> Arc<std::sync::atomic::AtomicU64> {
    let addr = SocketAddr::new(IpAddr::V4(pod.ip), port);
    let listener = in_netns(&pod.netns, move || StdListener::bind(addr))
        .unwrap_or_else(|e| panic!("bind {addr} in pod {}: {e}", pod.name));
    listener.set_nonblocking(true).unwrap();
    let listener = tokio::net::TcpListener::from_std(listener).unwrap();
    let cluster = pod.cluster.clone();
    let served = Arc::new(std::sync::atomic::AtomicU64::new(0));
    let count = Arc::clone(&served);
    tokio::spawn(async move {
        while let Ok((stream, _)) = listener.accept().await {
            let local = stream.local_addr().map(|a| a.ip().to_string());
            let body = format!("{cluster} {}", local.unwrap_or_default());
            let count = Arc::clone(&count);
            tokio::spawn(async move {
                let svc = service_fn(move |_req| {
                    count.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                    let body = body.clone();
                    async move {
                        Ok::<_, std::convert::Infallible>(http::Response::new(Full::new(
                            Bytes::from(body),
                        )))
                    }
                });
                let _ = hyper::server::conn::http1::Builder::new()
                    .serve_connection(TokioIo::new(stream), svc)
                    .await;
            });
        }
    });
    served
}

impl Drop for Lab {
    fn drop(&mut self) {
        // Real nodes first: their Pods' processes, mounts and cgroups.
        self.kubelets.clear();
        for (_, child) in self.children.lock().unwrap().drain(..) {
            reap(child);
        }
        let mut namespaces = std::mem::take(&mut *self.namespaces.lock().unwrap());
        // Pods and nodes first (their veths go with them), the lab last.
        namespaces.reverse();
        for ns in namespaces {
            let _ = Command::new("ip")
                .args(["netns", "del", &ns])
                .stderr(Stdio::null())
                .status();
        }
        if std::env::var_os("MCS_K8S_KEEP").is_some() {
            let dir = std::mem::replace(
                &mut self.dir,
                tempfile::tempdir().expect("a temporary directory"),
            );
            eprintln!("[netlab] kept {}", dir.keep().display());
        }
    }
}

/// Deletes the namespaces of labs whose test process is gone, and any that carry this
/// process's own id: it has created none yet, so they were left by an earlier process
/// that had the same pid (pids are reused), and `ip netns add` would fail on their names.
fn remove_stale_namespaces() {
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    let own = std::process::id().to_string();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        let Some(rest) = name.strip_prefix(PREFIX) else {
            continue;
        };
        let pid: String = rest.chars().take_while(char::is_ascii_digit).collect();
        if !pid.is_empty() && (pid == own || !Path::new("/proc").join(&pid).exists()) {
            eprintln!("[netlab] removing stale network namespace {name}");
            let _ = Command::new("ip").args(["netns", "del", &name]).status();
        }
    }
}

/// `GET /` over a fresh TCP connection ([`http_get`]'s client lives for one request, so
/// kube-proxy picks an endpoint per request), from whatever namespace the calling thread is
/// in (a current-thread runtime of its own opens the socket on this thread), bounded by
/// `timeout`: the body, or why there is none. Not for a thread already inside a runtime.
pub fn http_get_once(addr: SocketAddr, timeout: std::time::Duration) -> Result<String, String> {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .map_err(|e| format!("a runtime for GET {addr}: {e}"))?;
    let (status, body) = rt.block_on(async {
        tokio::time::timeout(timeout, http_get(&format!("http://{addr}/")))
            .await
            .unwrap_or_else(|_| Err(format!("GET {addr}: no answer within {timeout:?}")))
    })?;
    if status != http::StatusCode::OK {
        return Err(format!("GET {addr}: {status}"));
    }
    Ok(body)
}

/// `nft list ruleset` in network namespace `netns`.
fn nft_ruleset_in(netns: &str) -> String {
    let out = Command::new("ip")
        .args(["netns", "exec", netns, "nft", "list", "ruleset"])
        .output()
        .expect("run nft");
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The endpoint IPs kube-proxy's nftables `ruleset` sends new TCP connections to `vip` to:
/// the `service-ips` element `<vip> . tcp . <port>` names the Service's chain, whose `vmap`
/// jumps to a chain per endpoint, named `endpoint-...__<ip>/<port>`. Empty when the Service
/// has no ready endpoint (kube-proxy then has no such element).
fn endpoints_in_ruleset(ruleset: &str, vip: SocketAddr) -> BTreeSet<String> {
    let element = format!("{} . tcp . {} : goto ", vip.ip(), vip.port());
    let Some(at) = ruleset.find(&element) else {
        return BTreeSet::new();
    };
    let chain: String = ruleset[at + element.len()..]
        .chars()
        .take_while(|c| !c.is_whitespace() && *c != ',' && *c != '}')
        .collect();
    let Some(start) = ruleset.find(&format!("chain {chain} {{")) else {
        return BTreeSet::new();
    };
    let body = &ruleset[start..];
    let body = &body[..body.find("\n\t}").unwrap_or(body.len())];
    body.split("__")
        .skip(1)
        .filter_map(|rest| rest.split('/').next())
        .map(str::to_owned)
        .collect()
}
