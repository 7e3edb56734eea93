//! A real node: containerd, runc and kubelet v1.35 in the dataplane lab's node namespace
//! run a Pod from an image built here; the Pod answers at its Pod IP from the lab, its
//! readiness probe is the kubelet's own; and the node's teardown leaves no process, mount,
//! namespace or cgroup behind.

use mcs_testkit as support;

use std::net::{IpAddr, SocketAddr};
use std::path::PathBuf;
use std::time::Duration;

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use support::netlab::{self, Lab};

#[test]
fn a_kubelet_node_runs_a_pod_from_a_local_image_and_leaves_nothing_behind() {
    let left = netlab::with_lab(|lab| Box::pin(run(lab)));
    left.assert_gone();
}

/// Where containerd, libcni and kubelet write outside the folders they are given.
const HOST_PATHS: [&str; 5] = [
    "/var/log/containers",
    "/var/log/pods",
    "/var/lib/cni",
    "/run/containerd",
    "/var/lib/kubelet",
];

/// What the node leaves to check after it is gone.
struct Traces {
    dir: PathBuf,
    socket: String,
    cgroup_root: String,
    /// The [`HOST_PATHS`] that did not exist before the node started.
    absent_before: Vec<&'static str>,
}

impl Traces {
    fn assert_gone(&self) {
        let dir = self.dir.display().to_string();
        let mounts = std::fs::read_to_string("/proc/self/mountinfo").unwrap();
        let left: Vec<&str> = mounts.lines().filter(|l| l.contains(&dir)).collect();
        assert!(left.is_empty(), "mounts left under {dir}: {left:#?}");
        assert!(!self.dir.exists(), "{dir} left behind");
        let procs: Vec<String> = std::fs::read_dir("/proc")
            .unwrap()
            .flatten()
            .filter(|e| e.file_name().to_string_lossy().parse::<u32>().is_ok())
            .filter_map(|e| std::fs::read(e.path().join("cmdline")).ok())
            .map(|c| String::from_utf8_lossy(&c).replace('\0', " "))
            .filter(|c| c.contains(&self.socket) || c.contains(&dir))
            .collect();
        assert!(procs.is_empty(), "processes of the node left: {procs:#?}");
        for h in std::fs::read_dir("/sys/fs/cgroup").unwrap().flatten() {
            let cg = h.path().join(&self.cgroup_root);
            assert!(!cg.exists(), "cgroup {} left", cg.display());
        }
        for path in &self.absent_before {
            assert!(
                !std::path::Path::new(path).exists(),
                "{path} did not exist before the node started and is left"
            );
        }
    }
}

async fn run(lab: &mut Lab) -> Traces {
    let cluster = support::start_cluster(
        "east",
        support::ClusterOptions {
            pod_cidr: Some(support::pod_cidr_for(0)),
            ..support::ClusterOptions::default()
        },
    )
    .await;
    lab.add_node(&cluster);
    let absent_before: Vec<&str> = HOST_PATHS
        .into_iter()
        .filter(|p| !std::path::Path::new(p).exists())
        .collect();
    let node = lab.add_kubelet(0, &cluster).await;
    let node_name = node.name().to_owned();
    let pod_cidr = node.pod_cidr().to_owned();
    let traces = Traces {
        dir: node.dir().to_owned(),
        socket: node.dir().join("containerd.sock").display().to_string(),
        cgroup_root: node.cgroup_root().to_owned(),
        absent_before,
    };

    let client = cluster.client().await;
    support::create_namespace(&client, "loyalty").await;
    let pods: Api<Pod> = Api::namespaced(client.clone(), "loyalty");
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": "accrual-0", "labels": { "app": "accrual" } },
        "spec": {
            "nodeName": node_name,
            "terminationGracePeriodSeconds": 1,
            "containers": [support::node::httpd_container("$POD_NAME $POD_IP")],
        },
    }))
    .unwrap();
    pods.create(&PostParams::default(), &pod).await.unwrap();

    // Ready: kubelet's own probe reached the container through the Pod's network.
    let ready =
        kube::runtime::wait::await_condition(pods.clone(), "accrual-0", |p: Option<&Pod>| {
            p.and_then(|p| p.status.as_ref())
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        });
    let running = match tokio::time::timeout(Duration::from_secs(90), ready).await {
        Ok(Ok(Some(pod))) => pod,
        other => panic!(
            "Pod accrual-0 not Ready ({other:?}): {:#?}\nkubelet:\n{}",
            pods.get("accrual-0").await.map(|p| p.status),
            lab.kubelet(0).log_tail("kubelet", 30)
        ),
    };
    let ip: IpAddr = running
        .status
        .as_ref()
        .and_then(|s| s.pod_ip.as_deref())
        .expect("a Pod IP")
        .parse()
        .unwrap();
    let IpAddr::V4(v4) = ip else {
        panic!("an IPv4 Pod IP, got {ip}")
    };
    let (net, bits) = pod_cidr.split_once('/').unwrap();
    let net: std::net::Ipv4Addr = net.parse().unwrap();
    let mask = u32::MAX << (32 - bits.parse::<u32>().unwrap());
    assert_eq!(
        u32::from(v4) & mask,
        u32::from(net),
        "Pod IP {v4} outside the Node's podCIDR {pod_cidr}"
    );

    // From the lab, through the node: the container answers with its own name and IP.
    let addr = SocketAddr::new(ip, 8080);
    let body =
        tokio::task::spawn_blocking(move || netlab::http_get_once(addr, Duration::from_secs(10)))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("GET {addr}: {e}"));
    assert_eq!(body.trim(), format!("accrual-0 {ip}"));
    traces
}
