//! Real nodes: containerd, runc and kubelet in a lab node's network namespace, running Pods
//! from images built here (nothing is pulled).
//!
//! ```text
//!   lab netns: API server on 127.0.0.1:<port>
//!        | veth 10.254.<i>.1 <-> 10.254.<i>.2
//!   node netns: forwarder 127.0.0.1:<port> -> lab, containerd, kubelet (node IP 10.254.<i>.2),
//!               bridge cni0 = first address of the pod CIDR (CNI bridge + host-local)
//!        | pod veths
//!   Pod sandboxes (netns made by containerd, /run/netns/cni-*)
//! ```
//!
//! containerd and kubelet start through `nsenter --net` (not `ip netns exec`, which would
//! give them a private mount namespace: their mounts and the teardown's must see each other),
//! with every path of theirs under the node's scratch folder: containerd's root, state,
//! sockets and runc root, kubelet's root folder, the CNI configuration and IPAM data. Pods
//! run in cgroups under a root of the node's own in every cgroup v1 hierarchy. Drop stops
//! everything the node started and removes what it left: the Pods' processes (by cgroup),
//! containerd's shims, the mounts under its folder, the sandbox namespaces and the cgroups.
//! A node whose test process was killed is swept by the next process that starts one.
//!
//! Needs root, `containerd` and `ctr` (Debian's `containerd`), `runc`, the CNI plugins in
//! `/usr/lib/cni` (`containernetworking-plugins`), `cc` with a static libc, `umoci`,
//! `skopeo` and a static busybox (`busybox-static`); `scripts/test.sh` installs them. Missing
//! pieces panic with what to install.

use std::collections::BTreeSet;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::Duration;

use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::rbac::v1::{ClusterRoleBinding, RoleRef, Subject};
use kube::api::{Api, ObjectMeta, PostParams};

use super::bins::bin_dir;
use super::cluster::TestCluster;
use super::process::{reap, scratch_dir_on_disk, spawn, tail};

/// The sandbox image every node's containerd is configured with.
pub const PAUSE_IMAGE: &str = "localhost/mcs-pause:1";
/// A static busybox (`/bin/busybox`, with links for its applets in `/bin`): for test Pods.
pub const BUSYBOX_IMAGE: &str = "localhost/mcs-busybox:1";

/// kubelet's `clusterDNS` ([`KubeletNode::cluster_dns`]) is this address of the cluster's
/// service CIDR, one that nothing allocates: [`super::cluster_dns::deploy`] gives CoreDNS's
/// Service this ClusterIP, as a cluster's installer does.
const CLUSTER_DNS_HOST: u32 = 10;

/// Where the CNI plugins are (Debian's `containernetworking-plugins`).
const CNI_BIN: &str = "/usr/lib/cni";

/// Prefix of each node's cgroup root (`/<prefix><pid>-<node>` in every v1 hierarchy).
const CGROUP_PREFIX: &str = "mcs-node-";

/// A kubelet node of a cluster (see the module docs).
pub struct KubeletNode {
    name: String,
    pod_cidr: String,
    cluster_dns: std::net::Ipv4Addr,
    dir: tempfile::TempDir,
    cgroup_root: String,
    containerd: Option<Child>,
    kubelet: Option<Child>,
    /// Where it runs, and kubelet's arguments: for [`KubeletNode::start_kubelet`].
    net: NodeNetwork,
    kubelet_args: Vec<String>,
}

impl std::fmt::Debug for KubeletNode {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("KubeletNode")
            .field("name", &self.name)
            .field("dir", &self.dir.path())
            .finish_non_exhaustive()
    }
}

/// What a node needs from the lab: its namespace and its address. (Its Pods' range is the
/// `podCIDR` the cluster's node IPAM controller gives the Node, inside the cluster's pod
/// CIDR, which the lab routes to the node.)
#[derive(Clone, Debug)]
pub struct NodeNetwork {
    /// The node's network namespace (a name under `/run/netns`).
    pub netns: String,
    /// The node's address (its underlay veth), kubelet's `--node-ip`.
    pub node_ip: std::net::Ipv4Addr,
}

impl KubeletNode {
    /// Starts containerd and kubelet for `cluster` as Node `name` in the lab node `net`
    /// (whose loopback forwards the API server's port to the cluster), imports the images,
    /// gives the node's Pods the `podCIDR` the cluster assigned the Node (CNI bridge and
    /// host-local), and waits until the Node is Ready. The cluster must run its controller
    /// manager with a pod CIDR ([`ClusterOptions::pod_cidr`] or [`ClusterOptions::pods`]).
    /// Must run inside the lab's runtime.
    ///
    /// [`ClusterOptions::pod_cidr`]: super::ClusterOptions::pod_cidr
    /// [`ClusterOptions::pods`]: super::ClusterOptions::pods
    pub async fn start(cluster: &TestCluster, name: &str, net: &NodeNetwork) -> KubeletNode {
        sweep_stale_nodes();
        let containerd_bin = need("containerd", "containerd");
        let ctr = need("ctr", "containerd");
        need("runc", "runc");
        assert!(
            Path::new(CNI_BIN).join("bridge").is_file(),
            "{CNI_BIN}/bridge missing: apt-get install containernetworking-plugins"
        );
        let kubelet_bin = bin_dir().join("kubelet");
        assert!(
            kubelet_bin.is_file(),
            "{} missing: scripts/k8s-bins.sh builds kubelet with the other binaries",
            kubelet_bin.display()
        );
        // On disk: kubelet's eviction manager needs its image store on a block device.
        let dir = scratch_dir_on_disk(&format!("node-{name}"));
        let root = dir.path().to_owned();
        for sub in [
            "containerd/root",
            "containerd/state",
            "runc",
            "cni/net.d",
            "cni/ipam",
            "kubelet",
            "pki",
            "images",
        ] {
            std::fs::create_dir_all(root.join(sub)).expect("the node's folders");
        }
        let cgroup_root = cgroup_root_of(std::process::id(), name);
        let mut node = KubeletNode {
            name: name.to_owned(),
            pod_cidr: String::new(),
            cluster_dns: super::service_address(cluster.service_cidr(), CLUSTER_DNS_HOST),
            dir,
            cgroup_root,
            containerd: None,
            kubelet: None,
            net: net.clone(),
            kubelet_args: Vec::new(),
        };
        create_cgroups(&node.cgroup_root);

        // containerd, and the images every Pod of the lab may use.
        let socket = root.join("containerd.sock");
        std::fs::write(
            root.join("containerd.toml"),
            containerd_config(&root, &socket),
        )
        .expect("write containerd.toml");
        node.containerd = Some(node.spawn_in(
            net,
            "containerd",
            &containerd_bin,
            &[format!(
                "--config={}",
                root.join("containerd.toml").display()
            )],
        ));
        node.wait_for("containerd's socket", || {
            Command::new(&ctr)
                .args(["-a", &socket.display().to_string(), "version"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .await;
        for archive in node_images(&root.join("images")) {
            node.import_image(&archive);
        }

        // kubelet as system:node:<name>.
        let admin = cluster.client().await;
        grant_nodes(&admin).await;
        super::write_kubeconfig(
            &root.join("kubelet.kubeconfig"),
            &cluster.kubeconfig_as_user(&format!("system:node:{name}"), &["system:nodes"]),
        );
        std::fs::write(root.join("resolv.conf"), "options ndots:5\n").expect("resolv.conf");
        std::fs::write(
            root.join("kubelet.yaml"),
            kubelet_config(&root, &socket, net, &node.cgroup_root, node.cluster_dns),
        )
        .expect("write kubelet.yaml");
        node.kubelet_args = vec![
            format!("--config={}", root.join("kubelet.yaml").display()),
            format!("--kubeconfig={}", root.join("kubelet.kubeconfig").display()),
            format!("--root-dir={}", root.join("kubelet").display()),
            format!("--cert-dir={}", root.join("pki").display()),
            format!("--hostname-override={name}"),
            format!("--node-ip={}", net.node_ip),
            "--v=2".to_owned(),
        ];
        node.start_kubelet();
        let nodes: Api<Node> = Api::all(admin);
        // containerd reads its CNI folder as it changes: the network is ready (and so the
        // Node) once the configuration with the Node's range is there.
        let pod_cidr = node
            .wait_node(&nodes, "its podCIDR", |n| {
                n.spec.as_ref().and_then(|s| s.pod_cidr.clone())
            })
            .await;
        std::fs::write(
            root.join("cni/net.d/10-bridge.conflist"),
            cni_config(&network_of(std::process::id(), name), &pod_cidr, &root),
        )
        .expect("write the CNI configuration");
        node.pod_cidr = pod_cidr;
        node.wait_node(&nodes, "Ready", |n| {
            n.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
                .then_some(())
        })
        .await;
        node
    }

    /// The Node's name.
    pub fn name(&self) -> &str {
        &self.name
    }

    /// kubelet's `clusterDNS`: the nameserver of Pods with `dnsPolicy: ClusterFirst` (the
    /// default), searching `<namespace>.svc.cluster.local`, `svc.cluster.local` and
    /// `cluster.local`; the 10th address of the cluster's service CIDR.
    pub fn cluster_dns(&self) -> std::net::Ipv4Addr {
        self.cluster_dns
    }

    /// Imports the image(s) of a docker-archive into the node's containerd, where its Pods
    /// find them (nothing is pulled: Pods use `imagePullPolicy: Never` or `IfNotPresent`).
    /// An archive's `name:tag` is normalized as a Pod's image is (`mcs:test` is
    /// `docker.io/library/mcs:test`).
    pub fn import_image(&self, archive: &Path) {
        let socket = self.dir.path().join("containerd.sock");
        let out = Command::new(need("ctr", "containerd"))
            .args(["-a", &socket.display().to_string(), "-n", "k8s.io"])
            .args(["images", "import"])
            .arg(archive)
            .output()
            .expect("run ctr");
        assert!(
            out.status.success(),
            "node {}: ctr images import {}: {}",
            self.name,
            archive.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// Everything the containers `container` of the Pods in `ns` whose names start with
    /// `pod_prefix` have logged on this node, whole (kubelet's CRI log lines, in file order),
    /// where [`KubeletNode::container_logs`] gives the ends of the files for a message.
    pub fn container_output(&self, ns: &str, pod_prefix: &str, container: &str) -> String {
        let mut out = String::new();
        let prefix = format!("{ns}_{pod_prefix}");
        let mut pods: Vec<_> = std::fs::read_dir(self.dir.path().join("pods"))
            .into_iter()
            .flatten()
            .flatten()
            .filter(|p| p.file_name().to_string_lossy().starts_with(&prefix))
            .collect();
        pods.sort_by_key(|p| p.file_name());
        for pod in pods {
            let mut logs: Vec<_> = std::fs::read_dir(pod.path().join(container))
                .into_iter()
                .flatten()
                .flatten()
                .collect();
            logs.sort_by_key(|l| l.file_name());
            for log in logs {
                out += &std::fs::read_to_string(log.path()).unwrap_or_default();
            }
        }
        out
    }

    /// The last `lines` lines of the logs of every container named `container` of the Pods
    /// in namespace `ns` whose names start with `pod_prefix` (kubelet's log files in the
    /// node's folder, so no API server to kubelet connection is needed).
    pub fn container_logs(
        &self,
        ns: &str,
        pod_prefix: &str,
        container: &str,
        lines: usize,
    ) -> String {
        let mut out = String::new();
        let pods = self.dir.path().join("pods");
        let prefix = format!("{ns}_{pod_prefix}");
        for pod in std::fs::read_dir(&pods).into_iter().flatten().flatten() {
            let name = pod.file_name().to_string_lossy().into_owned();
            if !name.starts_with(&prefix) {
                continue;
            }
            for log in std::fs::read_dir(pod.path().join(container))
                .into_iter()
                .flatten()
                .flatten()
            {
                out += &format!(
                    "--- {name}/{container}/{}\n",
                    log.file_name().to_string_lossy()
                );
                out += &tail(&log.path(), lines);
                out.push('\n');
            }
        }
        if out.is_empty() {
            out = format!(
                "(no log of {ns}/{pod_prefix}*/{container} on node {})",
                self.name
            );
        }
        out
    }

    /// The Node's `podCIDR`, where its Pods' addresses come from.
    pub fn pod_cidr(&self) -> &str {
        &self.pod_cidr
    }

    /// The node's scratch folder (containerd's and kubelet's state, logs).
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// The node's cgroup root (a folder of that name in every cgroup v1 hierarchy).
    pub fn cgroup_root(&self) -> &str {
        &self.cgroup_root
    }

    /// Waits until `get` finds what it looks for in the Node; panics with kubelet's log
    /// after a minute or when containerd or kubelet exits.
    async fn wait_node<T>(
        &mut self,
        nodes: &Api<Node>,
        what: &str,
        get: impl Fn(&Node) -> Option<T>,
    ) -> T {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(60);
        loop {
            if let Some(found) = nodes
                .get_opt(&self.name)
                .await
                .ok()
                .flatten()
                .as_ref()
                .and_then(&get)
            {
                return found;
            }
            self.assert_running();
            assert!(
                tokio::time::Instant::now() < deadline,
                "timed out waiting for Node {}: {what}; kubelet's log:\n{}",
                self.name,
                self.log_tail("kubelet", 40)
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Stops kubelet at once (SIGKILL, as a crash would). containerd and the Pods' containers
    /// run on; nothing reports their state to the API server until [`start_kubelet`].
    ///
    /// [`start_kubelet`]: KubeletNode::start_kubelet
    pub fn stop_kubelet(&mut self) {
        if let Some(kubelet) = self.kubelet.take() {
            reap(kubelet);
        }
    }

    /// Starts kubelet (again, after [`stop_kubelet`]) with the same configuration, root
    /// folder and certificates: it finds the Pods of its Node and their containers where it
    /// left them, and restarts those that exited. Its log goes on in the same file.
    ///
    /// [`stop_kubelet`]: KubeletNode::stop_kubelet
    pub fn start_kubelet(&mut self) {
        assert!(self.kubelet.is_none(), "kubelet of node {} runs", self.name);
        let kubelet_bin = bin_dir().join("kubelet");
        self.kubelet = Some(self.spawn_in(&self.net, "kubelet", &kubelet_bin, &self.kubelet_args));
    }

    /// Kills the processes of container `id` (from its Pod's status, `containerd://<id>`)
    /// with SIGKILL through containerd, as an out-of-memory kill or a crash would; kubelet,
    /// when it runs, restarts it by the Pod's `restartPolicy`.
    pub fn kill_container(&self, id: &str) {
        let id = id.strip_prefix("containerd://").unwrap_or(id);
        let socket = self.dir.path().join("containerd.sock");
        let out = Command::new(need("ctr", "containerd"))
            .args(["-a", &socket.display().to_string(), "-n", "k8s.io"])
            .args(["tasks", "kill", "--signal", "SIGKILL", id])
            .output()
            .expect("run ctr");
        assert!(
            out.status.success(),
            "ctr tasks kill {id} on node {}: {}",
            self.name,
            String::from_utf8_lossy(&out.stderr)
        );
    }

    /// The last `lines` lines of `containerd`'s or `kubelet`'s log.
    pub fn log_tail(&self, component: &str, lines: usize) -> String {
        tail(&self.dir.path().join(format!("{component}.log")), lines)
    }

    /// Panics with its log if containerd or kubelet has exited.
    pub fn assert_running(&mut self) {
        for (what, child) in [
            ("containerd", &mut self.containerd),
            ("kubelet", &mut self.kubelet),
        ] {
            if let Some(c) = child
                && let Ok(Some(status)) = c.try_wait()
            {
                panic!(
                    "{what} of node {} exited ({status}):\n{}",
                    self.name,
                    tail(&self.dir.path().join(format!("{what}.log")), 40)
                );
            }
        }
    }

    fn spawn_in(&self, net: &NodeNetwork, what: &str, exe: &Path, args: &[String]) -> Child {
        let mut all = vec![
            format!("--net=/run/netns/{}", net.netns),
            "--".to_owned(),
            exe.display().to_string(),
        ];
        all.extend_from_slice(args);
        let log = self.dir.path().join(format!("{what}.log"));
        spawn(Path::new("nsenter"), &all, self.dir.path(), &log)
            .unwrap_or_else(|e| panic!("cannot start {what} of node {}: {e}", self.name))
    }

    async fn wait_for(&mut self, what: &str, mut ok: impl FnMut() -> bool) {
        let deadline = tokio::time::Instant::now() + Duration::from_secs(30);
        while !ok() {
            self.assert_running();
            assert!(
                tokio::time::Instant::now() < deadline,
                "node {}: timed out waiting for {what}",
                self.name
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
    }
}

impl Drop for KubeletNode {
    fn drop(&mut self) {
        if let Some(kubelet) = self.kubelet.take() {
            reap(kubelet);
        }
        teardown(
            self.dir.path(),
            std::process::id(),
            &self.name,
            self.containerd.take(),
        );
        if std::env::var_os("MCS_K8S_KEEP").is_some() {
            let dir = std::mem::replace(
                &mut self.dir,
                tempfile::tempdir().expect("a temporary directory"),
            );
            eprintln!("[node] kept {}", dir.keep().display());
        }
    }
}

/// The cgroup root of node `node` of test process `pid`.
fn cgroup_root_of(pid: u32, node: &str) -> String {
    format!("{CGROUP_PREFIX}{pid}-{node}")
}

/// The CNI network name of node `node` of test process `pid` (libcni names its cached
/// results in `/var/lib/cni/results` after it).
fn network_of(pid: u32, node: &str) -> String {
    format!("mcs-{pid}-{node}")
}

/// Stops what node `node` of test process `pid` started and removes what it left behind:
/// the Pods' processes, the shims, containerd, the mounts under `dir`, the sandbox
/// namespaces no process holds any more, the node's cgroups, and what containerd, libcni
/// and kubelet write outside their configured folders (shim sockets in
/// `/run/containerd/s`, cached CNI results in `/var/lib/cni/results`, log links in
/// `/var/log/containers`, the device-plugin socket in `/var/lib/kubelet`).
fn teardown(dir: &Path, pid: u32, node: &str, containerd: Option<Child>) {
    let cgroup_root = cgroup_root_of(pid, node);
    // Pods first: every process in the node's cgroups (containers and sandboxes).
    for _ in 0..50 {
        let pids = cgroup_pids(&cgroup_root);
        if pids.is_empty() {
            break;
        }
        for pid in pids {
            kill(pid);
        }
        std::thread::sleep(Duration::from_millis(20));
    }
    // The shims (they outlive containerd on purpose), then containerd.
    let socket = dir.join("containerd.sock").display().to_string();
    for pid in processes_with_arg(&socket) {
        kill(pid);
    }
    if let Some(c) = containerd {
        reap(c);
    }
    unmount_under(dir);
    remove_unheld_sandbox_namespaces();
    remove_cgroups(&cgroup_root);
    remove_host_traces(dir, &network_of(pid, node));
}

/// What containerd, libcni and kubelet leave outside the node's folder `dir`; folders
/// are removed once empty (none of them exists on a machine without a node).
fn remove_host_traces(dir: &Path, network: &str) {
    // kubelet's links to its Pods' logs (in the node's folder).
    if let Ok(entries) = std::fs::read_dir("/var/log/containers") {
        for e in entries.flatten() {
            if std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(dir)) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let _ = std::fs::remove_dir("/var/log/containers");
    // libcni's cached results: the node's network's, and the loopback's of its sandboxes.
    let results = Path::new("/var/lib/cni/results");
    if let Ok(entries) = std::fs::read_dir(results) {
        let names: Vec<String> = entries
            .flatten()
            .map(|e| e.file_name().to_string_lossy().into_owned())
            .collect();
        let prefix = format!("{network}-");
        for name in &names {
            if let Some(rest) = name.strip_prefix(&prefix) {
                let id = rest.rsplit_once('-').map_or(rest, |(id, _)| id);
                let _ = std::fs::remove_file(results.join(name));
                let _ = std::fs::remove_file(results.join(format!("cni-loopback-{id}-lo")));
            }
        }
    }
    let _ = std::fs::remove_dir(results);
    let _ = std::fs::remove_dir("/var/lib/cni");
    // Shim sockets nobody listens on any more.
    let listening = bound_unix_paths();
    if let Ok(entries) = std::fs::read_dir("/run/containerd/s") {
        for e in entries.flatten() {
            if !listening.contains(&e.path().display().to_string()) {
                let _ = std::fs::remove_file(e.path());
            }
        }
    }
    let _ = std::fs::remove_dir("/run/containerd/s");
    let _ = std::fs::remove_dir("/run/containerd");
    // The device-plugin socket every kubelet makes at the same path, once none runs.
    if !any_process_named("kubelet") {
        let _ = std::fs::remove_file("/var/lib/kubelet/device-plugins/kubelet.sock");
        let _ = std::fs::remove_dir("/var/lib/kubelet/device-plugins");
        let _ = std::fs::remove_dir("/var/lib/kubelet");
    }
}

/// The paths of the unix sockets bound in any network namespace a process is in.
fn bound_unix_paths() -> BTreeSet<String> {
    use std::os::unix::fs::MetadataExt;
    let mut seen = BTreeSet::new();
    let mut paths = BTreeSet::new();
    for pid in all_pids() {
        let Ok(ns) = std::fs::metadata(format!("/proc/{pid}/ns/net")) else {
            continue;
        };
        if !seen.insert(ns.ino()) {
            continue;
        }
        if let Ok(table) = std::fs::read_to_string(format!("/proc/{pid}/net/unix")) {
            paths.extend(
                table
                    .lines()
                    .skip(1)
                    .filter_map(|l| l.split_whitespace().nth(7))
                    .map(str::to_owned),
            );
        }
    }
    paths
}

fn all_pids() -> Vec<u32> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .collect()
}

fn any_process_named(name: &str) -> bool {
    all_pids().into_iter().any(|pid| {
        std::fs::read_to_string(format!("/proc/{pid}/comm")).is_ok_and(|c| c.trim() == name)
    })
}

/// SIGKILL to `pid` (through `kill`, the harness has no signal API of its own).
fn kill(pid: u32) {
    let _ = Command::new("kill")
        .args(["-KILL", &pid.to_string()])
        .stderr(Stdio::null())
        .status();
}

/// The processes whose command line has `arg` as one of its arguments.
fn processes_with_arg(arg: &str) -> Vec<u32> {
    let Ok(entries) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    entries
        .flatten()
        .filter_map(|e| e.file_name().to_str()?.parse::<u32>().ok())
        .filter(|pid| {
            std::fs::read(format!("/proc/{pid}/cmdline"))
                .is_ok_and(|c| c.split(|b| *b == 0).any(|a| a == arg.as_bytes()))
        })
        .collect()
}

/// Unmounts every mount point under `dir`, deepest first (detached, so a busy one goes too).
fn unmount_under(dir: &Path) {
    let Ok(info) = std::fs::read_to_string("/proc/self/mountinfo") else {
        return;
    };
    let prefix = dir.display().to_string();
    let mut points: Vec<String> = info
        .lines()
        .filter_map(|l| l.split(' ').nth(4))
        .map(|p| p.replace("\\040", " "))
        .filter(|p| p == &prefix || p.starts_with(&format!("{prefix}/")))
        .collect();
    points.sort_by_key(|p| std::cmp::Reverse(p.len()));
    for p in points {
        let _ = Command::new("umount")
            .args(["--lazy", &p])
            .stderr(Stdio::null())
            .status();
    }
}

/// Deletes containerd's sandbox namespaces (`/run/netns/cni-*`) that no process is in: a
/// sandbox whose processes were killed leaves its namespace behind.
fn remove_unheld_sandbox_namespaces() {
    use std::os::unix::fs::MetadataExt;
    let Ok(entries) = std::fs::read_dir("/run/netns") else {
        return;
    };
    let held: BTreeSet<u64> = std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter(|e| {
            e.file_name()
                .to_str()
                .is_some_and(|n| n.parse::<u32>().is_ok())
        })
        .filter_map(|e| std::fs::metadata(e.path().join("ns/net")).ok())
        .map(|m| m.ino())
        .collect();
    for e in entries.flatten() {
        let name = e.file_name().to_string_lossy().into_owned();
        if !name.starts_with("cni-") {
            continue;
        }
        if std::fs::metadata(e.path()).is_ok_and(|m| !held.contains(&m.ino())) {
            let _ = Command::new("ip")
                .args(["netns", "del", &name])
                .stderr(Stdio::null())
                .status();
        }
    }
}

/// The cgroup hierarchies (`/sys/fs/cgroup/<controller>`, and `unified`, where kubelet
/// makes its cgroups too).
fn hierarchies() -> Vec<PathBuf> {
    let Ok(entries) = std::fs::read_dir("/sys/fs/cgroup") else {
        return Vec::new();
    };
    let mut all: Vec<PathBuf> = entries
        .flatten()
        .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").is_file())
        .collect();
    all.sort();
    all
}

/// Creates the node's cgroup root in every hierarchy (cpuset's with its parent's CPUs and
/// memory nodes, which a new cpuset starts without).
fn create_cgroups(root: &str) {
    for h in hierarchies() {
        let dir = h.join(root);
        std::fs::create_dir_all(&dir)
            .unwrap_or_else(|e| panic!("create cgroup {}: {e}", dir.display()));
        for file in ["cpuset.cpus", "cpuset.mems"] {
            if let Ok(value) = std::fs::read_to_string(h.join(file)) {
                let _ = std::fs::write(dir.join(file), value.trim());
            }
        }
    }
}

/// Every process in the node's cgroups.
fn cgroup_pids(root: &str) -> BTreeSet<u32> {
    let mut pids = BTreeSet::new();
    for h in hierarchies() {
        for dir in dirs_under(&h.join(root)) {
            if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
                pids.extend(procs.lines().filter_map(|l| l.trim().parse::<u32>().ok()));
            }
        }
    }
    pids
}

/// `dir` and every folder below it.
fn dirs_under(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut todo = vec![dir.to_owned()];
    while let Some(d) = todo.pop() {
        if let Ok(entries) = std::fs::read_dir(&d) {
            todo.extend(
                entries
                    .flatten()
                    .filter(|e| e.file_type().is_ok_and(|t| t.is_dir()))
                    .map(|e| e.path()),
            );
            out.push(d);
        }
    }
    out
}

/// Removes the node's cgroups, deepest first.
fn remove_cgroups(root: &str) {
    for h in hierarchies() {
        let mut dirs = dirs_under(&h.join(root));
        dirs.sort_by_key(|d| std::cmp::Reverse(d.components().count()));
        for d in dirs {
            let _ = std::fs::remove_dir(&d);
        }
    }
}

/// Tears down the nodes of test processes that are gone (killed before their drop ran):
/// their scratch folders still say whose they were.
fn sweep_stale_nodes() {
    static SWEPT: std::sync::Once = std::sync::Once::new();
    SWEPT.call_once(|| {
        for root in [PathBuf::from("/dev/shm"), std::env::temp_dir()] {
            let Ok(entries) = std::fs::read_dir(&root) else {
                continue;
            };
            for e in entries.flatten() {
                let name = e.file_name().to_string_lossy().into_owned();
                let Some(rest) = name.strip_prefix("mcs-k8s-node-") else {
                    continue;
                };
                let Ok(pid) = std::fs::read_to_string(e.path().join("owner.pid")) else {
                    continue;
                };
                let pid = pid.trim();
                if Path::new("/proc").join(pid).exists() {
                    continue;
                }
                // The folder is mcs-k8s-node-<node>-<random>.
                let node = rest.rsplit_once('-').map_or(rest, |(n, _)| n);
                eprintln!("[node] sweeping node {node} of gone process {pid}");
                if let Ok(pid) = pid.parse() {
                    teardown(&e.path(), pid, node, None);
                }
                let _ = std::fs::remove_dir_all(e.path());
            }
        }
    });
}

/// The path of `tool`, or a panic naming the Debian package that has it.
fn need(tool: &str, package: &str) -> PathBuf {
    for dir in [
        "/usr/local/sbin",
        "/usr/local/bin",
        "/usr/sbin",
        "/usr/bin",
        "/sbin",
        "/bin",
    ] {
        let p = Path::new(dir).join(tool);
        if p.is_file() {
            return p;
        }
    }
    panic!("{tool} not found: the kubelet nodes need it (apt-get install {package})")
}

/// Gives group `system:nodes` the `system:node` ClusterRole (the API servers run RBAC
/// alone, without the Node authorizer that would otherwise authorize kubelets).
async fn grant_nodes(admin: &kube::Client) {
    let bindings: Api<ClusterRoleBinding> = Api::all(admin.clone());
    let binding = ClusterRoleBinding {
        metadata: ObjectMeta {
            name: Some("mcs-test:nodes".into()),
            ..Default::default()
        },
        role_ref: RoleRef {
            api_group: "rbac.authorization.k8s.io".into(),
            kind: "ClusterRole".into(),
            name: "system:node".into(),
        },
        subjects: Some(vec![Subject {
            api_group: Some("rbac.authorization.k8s.io".into()),
            kind: "Group".into(),
            name: "system:nodes".into(),
            ..Default::default()
        }]),
    };
    match bindings.create(&PostParams::default(), &binding).await {
        Ok(_) => {}
        Err(kube::Error::Api(s)) if s.code == 409 => {}
        Err(e) => panic!("create ClusterRoleBinding mcs-test:nodes: {e}"),
    }
}

fn containerd_config(root: &Path, socket: &Path) -> String {
    let r = root.display();
    let s = socket.display();
    format!(
        r#"version = 2
root = "{r}/containerd/root"
state = "{r}/containerd/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs", "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs", "io.containerd.tracing.processor.v1.otlp", "io.containerd.internal.v1.tracing"]

[grpc]
  address = "{s}"

[ttrpc]
  address = "{s}.ttrpc"

[plugins."io.containerd.internal.v1.opt"]
  path = "{r}/containerd/opt"

[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "{PAUSE_IMAGE}"
  restrict_oom_score_adj = true
  disable_apparmor = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  enable_selinux = false

  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"

    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"

      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "{r}/runc"

  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "{CNI_BIN}"
    conf_dir = "{r}/cni/net.d"
"#
    )
}

fn cni_config(network: &str, pod_cidr: &str, root: &Path) -> String {
    serde_json::json!({
        "cniVersion": "0.4.0",
        "name": network,
        "plugins": [
            {
                "type": "bridge",
                "bridge": "cni0",
                "isGateway": true,
                "ipMasq": false,
                "hairpinMode": true,
                "ipam": {
                    "type": "host-local",
                    "ranges": [[{ "subnet": pod_cidr }]],
                    "routes": [{ "dst": "0.0.0.0/0" }],
                    "dataDir": root.join("cni/ipam").display().to_string(),
                },
            },
            { "type": "portmap", "capabilities": { "portMappings": true } },
        ],
    })
    .to_string()
}

fn kubelet_config(
    root: &Path,
    socket: &Path,
    net: &NodeNetwork,
    cgroup_root: &str,
    dns: std::net::Ipv4Addr,
) -> String {
    let r = root.display();
    format!(
        r#"apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup_root}
cgroupsPerQOS: true
enforceNodeAllocatable: []
failSwapOn: false
makeIPTablesUtilChains: false
containerRuntimeEndpoint: unix://{s}
address: {ip}
port: 10250
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: 10248
authentication:
  anonymous:
    enabled: false
  webhook:
    enabled: false
authorization:
  mode: AlwaysAllow
resolvConf: {r}/resolv.conf
podLogsDir: {r}/pods
clusterDomain: cluster.local
clusterDNS:
- {dns}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
imageMinimumGCAge: 1000h
evictionHard:
  memory.available: "1Mi"
  nodefs.available: "0%"
  nodefs.inodesFree: "0%"
  imagefs.available: "0%"
serializeImagePulls: false
registerNode: true
fileCheckFrequency: 1s
syncFrequency: 5s
nodeStatusUpdateFrequency: 2s
volumeStatsAggPeriod: 0s
localStorageCapacityIsolation: false
"#,
        s = socket.display(),
        ip = net.node_ip,
    )
}

/// The docker-archives of [`PAUSE_IMAGE`] and [`BUSYBOX_IMAGE`], built in `dir` (a few
/// seconds: a static C program and busybox, each one layer).
fn node_images(dir: &Path) -> Vec<PathBuf> {
    let pause = build_pause(dir);
    vec![
        pack_image(dir, "mcs-pause", &[(pause, "pause")], &["/pause"]),
        pack_image(
            dir,
            "mcs-busybox",
            &[(static_busybox(), "bin/busybox")],
            &["/bin/sh"],
        ),
    ]
}

/// Debian's static busybox (`busybox-static`): the image holds nothing else, so a
/// dynamically linked one would not start.
fn static_busybox() -> PathBuf {
    let path = need("busybox", "busybox-static");
    let elf = std::fs::read(&path).unwrap_or_else(|e| panic!("read {}: {e}", path.display()));
    assert!(
        !has_interpreter(&elf),
        "{} is dynamically linked: the test image needs a static one (apt-get install \
         busybox-static)",
        path.display()
    );
    path
}

/// Whether a 64-bit little-endian ELF file names a program interpreter (a `PT_INTERP`
/// program header): whether it is dynamically linked.
fn has_interpreter(elf: &[u8]) -> bool {
    let u16_at = |at: usize| {
        elf.get(at..at + 2)
            .map(|b| u16::from_le_bytes([b[0], b[1]]))
    };
    let u64_at = |at: usize| {
        elf.get(at..at + 8)
            .map(|b| u64::from_le_bytes(b.try_into().expect("8 bytes")))
    };
    let (Some(phoff), Some(size), Some(count)) = (u64_at(0x20), u16_at(0x36), u16_at(0x38)) else {
        return false;
    };
    let phoff = usize::try_from(phoff).unwrap_or(usize::MAX);
    (0..usize::from(count)).any(|i| {
        let at = phoff.saturating_add(i * usize::from(size));
        elf.get(at..at + 4) == Some(&3u32.to_le_bytes()[..])
    })
}

/// Compiles `testkit/images/pause.c` statically (its text is part of the harness, so the
/// crates that include the harness by path find it too).
fn build_pause(dir: &Path) -> PathBuf {
    let src = dir.join("pause.c");
    std::fs::write(&src, include_str!("../images/pause.c")).expect("write pause.c");
    let out = dir.join("pause");
    let status = Command::new("cc")
        .args(["-static", "-Os", "-s", "-o"])
        .arg(&out)
        .arg(&src)
        .status()
        .unwrap_or_else(|e| panic!("cannot run cc ({e}): apt-get install gcc libc6-dev"));
    assert!(
        status.success(),
        "cc -static pause.c failed: a static libc is needed (apt-get install libc6-dev)"
    );
    out
}

/// The files of an image holding the dynamically linked `programs` of `bin_dir` (a test
/// build's, say): each stripped of symbols and debug information into `dir`, to go at
/// `usr/local/bin/<program>`, and every shared library `ldd` says they load, at its own path
/// (the dynamic loader included), as [`pack_image`] takes them.
pub fn program_files(bin_dir: &Path, programs: &[&str], dir: &Path) -> Vec<(PathBuf, String)> {
    let strip = need("strip", "binutils");
    let stripped = dir.join("stripped");
    std::fs::create_dir_all(&stripped).expect("a folder for the stripped programs");
    let mut files = Vec::new();
    let mut libs = BTreeSet::new();
    for program in programs {
        let exe = bin_dir.join(program);
        assert!(
            exe.is_file(),
            "{} is missing: the image needs it (`cargo test --workspace`, as scripts/test.sh \
             runs, builds every program of the workspace)",
            exe.display()
        );
        let out = stripped.join(program);
        let status = Command::new(&strip)
            .arg("-o")
            .arg(&out)
            .arg(&exe)
            .status()
            .expect("run strip");
        assert!(status.success(), "strip {}: {status}", exe.display());
        files.push((out, format!("usr/local/bin/{program}")));
        let ldd = Command::new("ldd").arg(&exe).output().expect("run ldd");
        assert!(ldd.status.success(), "ldd {}", exe.display());
        // `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x...)` and the loader's
        // `/lib64/ld-linux-x86-64.so.2 (0x...)`.
        for line in String::from_utf8_lossy(&ldd.stdout).lines() {
            let path = match line.split_once("=> ") {
                Some((_, rest)) => rest.split_whitespace().next(),
                None => line.split_whitespace().next(),
            };
            if let Some(path) = path.filter(|p| p.starts_with('/')) {
                libs.insert(path.to_owned());
            }
        }
    }
    for lib in libs {
        let at = lib.trim_start_matches('/').to_owned();
        files.push((PathBuf::from(lib), at));
    }
    files
}

/// A container `httpd` of [`BUSYBOX_IMAGE`] serving `/index.html` on port 8080, Ready once it
/// answers there; the page's one line is `index` as the shell expands it, with `POD_NAME`
/// and `POD_IP` in the environment (`"$POD_NAME $POD_IP"`, say).
pub fn httpd_container(index: &str) -> serde_json::Value {
    serde_json::json!({
        "name": "httpd",
        "image": BUSYBOX_IMAGE,
        "imagePullPolicy": "Never",
        "command": ["/bin/sh", "-c",
            format!("echo \"{index}\" > /index.html && exec httpd -f -p 8080 -h /")],
        "env": [
            { "name": "POD_NAME", "valueFrom": { "fieldRef": { "fieldPath": "metadata.name" } } },
            { "name": "POD_IP", "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
        ],
        "ports": [{ "containerPort": 8080 }],
        "readinessProbe": {
            "httpGet": { "path": "/index.html", "port": 8080 },
            "periodSeconds": 1,
        },
    })
}

/// An image `localhost/<name>:1` holding `files` (source, path in the image) and the
/// entrypoint `entrypoint`, as a docker-archive (umoci makes it, skopeo converts it), for
/// [`KubeletNode::import_image`].
pub fn pack_image(
    dir: &Path,
    name: &str,
    files: &[(PathBuf, &str)],
    entrypoint: &[&str],
) -> PathBuf {
    let umoci = need("umoci", "umoci");
    let skopeo = need("skopeo", "skopeo");
    let layout = dir.join(format!("{name}-oci"));
    let bundle = dir.join(format!("{name}-bundle"));
    let image = format!("{}:1", layout.display());
    let run = |exe: &Path, args: &[&str]| {
        let out = Command::new(exe)
            .args(args)
            .output()
            .expect("run image tool");
        assert!(
            out.status.success(),
            "{} {}: {}",
            exe.display(),
            args.join(" "),
            String::from_utf8_lossy(&out.stderr)
        );
    };
    run(&umoci, &["init", "--layout", &layout.display().to_string()]);
    run(&umoci, &["new", "--image", &image]);
    run(
        &umoci,
        &["unpack", "--image", &image, &bundle.display().to_string()],
    );
    let rootfs = bundle.join("rootfs");
    for (src, at) in files {
        let to = rootfs.join(at);
        std::fs::create_dir_all(to.parent().unwrap()).expect("image folder");
        std::fs::copy(src, &to).unwrap_or_else(|e| panic!("copy {}: {e}", src.display()));
    }
    if name == "mcs-busybox" {
        // The applets busybox answers to, as links beside it.
        for applet in [
            "sh", "httpd", "sleep", "cat", "echo", "wget", "nslookup", "ls",
        ] {
            let _ = std::os::unix::fs::symlink("busybox", rootfs.join("bin").join(applet));
        }
    }
    run(
        &umoci,
        &["repack", "--image", &image, &bundle.display().to_string()],
    );
    let mut config = vec![
        "config",
        "--image",
        &image,
        "--os",
        "linux",
        "--architecture",
        "amd64",
    ];
    for e in entrypoint {
        config.push("--config.entrypoint");
        config.push(e);
    }
    run(&umoci, &config);
    let archive = dir.join(format!("{name}.tar"));
    run(
        &skopeo,
        &[
            "copy",
            "--quiet",
            &format!("oci:{image}"),
            &format!("docker-archive:{}:localhost/{name}:1", archive.display()),
        ],
    );
    archive
}
