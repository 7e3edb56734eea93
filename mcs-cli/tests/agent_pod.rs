//! mcs installed with its chart runs as Pods on a real node: `helm install` of `charts/mcs`
//! into a cluster whose node is kubelet and containerd (`support/node.rs`), with the image
//! `scripts/image.sh` makes from this test build's binaries imported into the node. The
//! agent and the DNS server become Ready by kubelet's own probes; the agent, with the
//! in-cluster configuration and the chart's ServiceAccount and RBAC, imports a Service
//! exported in its cluster and gets it a ClusterSetIP from the cluster's service CIDR; a Pod
//! resolves the name through the cluster's CoreDNS; `kubectl mcs check` passes.
//!
//! Needs root and what `scripts/test.sh` installs (kubelet, containerd, helm, umoci,
//! skopeo).

use mcs_testkit as support;

use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::core::v1::{ConfigMap, Service};
use kube::api::Api;
use mcs_core::api::v1beta1::ServiceImport;
use support::netlab::Lab;

const RELEASE: &str = "mcs";
const RELEASE_NS: &str = "mcs-system";
const NS: &str = "loyalty";
/// The chart's CoreDNS server block ConfigMap (`coredns.snippetConfigMap`), in kube-system.
const COREDNS_SNIPPET: &str = "mcs-coredns";

#[test]
fn the_chart_runs_the_agent_and_the_dns_server_as_pods_on_a_real_node() {
    support::netlab::with_lab(|lab| Box::pin(installed(lab)));
}

async fn installed(lab: &mut Lab) {
    let scratch = tempfile::tempdir().unwrap();
    let bin_dir = Path::new(env!("CARGO_BIN_EXE_mcs-agent")).parent().unwrap();
    let archive =
        support::build_mcs_image_off_thread(bin_dir, scratch.path().join("image"), "test")
            .await
            .archive;
    let cluster = support::start_cluster(
        "east",
        support::ClusterOptions {
            kubelet_nodes: true,
            ..support::ClusterOptions::default().with_pods()
        },
    )
    .await;
    lab.add_node(&cluster);
    let node = lab.add_kubelet(0, &cluster).await;
    node.import_image(&archive);

    // helm install, as a user would, with the image already on the node. The chart's CoreDNS
    // snippet is asked for, and rendered only by the upgrade below: the first install cannot
    // know the DNS Service's ClusterIP.
    let helm = |args: &[&str]| {
        support::helm_mcs_chart(&cluster, scratch.path(), args, RELEASE, RELEASE_NS)
    };
    helm(&[
        "install",
        "--create-namespace",
        "--set",
        "clusterId=east",
        "--set",
        "image.tag=test",
        "--set",
        "image.pullPolicy=Never",
        "--set",
        "dns.replicas=1",
        "--set",
        "coredns.snippetConfigMap.enabled=true",
        // The scheduler's other Node is kwok's, which runs no container.
        "--set",
        "agent.nodeSelector.kubernetes\\.io/hostname=east-kubelet",
        "--set",
        "dns.nodeSelector.kubernetes\\.io/hostname=east-kubelet",
        "--wait=hookOnly",
    ]);

    let client = cluster.client().await;
    for name in ["mcs-agent", "mcs-dns"] {
        let available =
            support::deployment_available(&client, RELEASE_NS, name, 1, Duration::from_secs(120));
        if !available.await {
            panic!(
                "Deployment {RELEASE_NS}/{name} never had an available Pod; {}\nkubelet:\n{}",
                what_happened(&client).await,
                lab.kubelet(0).log_tail("kubelet", 20)
            );
        }
    }

    // The agent in its Pod imports what its cluster exports.
    support::create_namespace(&client, NS).await;
    let service = support::service(
        "loyalty-accrual",
        "loyalty-accrual",
        &[("grpc", 9443, "TCP")],
        false,
    );
    support::create_exported_service(&client, NS, &service).await;
    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), NS);
    let imported = kube::runtime::wait::await_condition(
        imports.clone(),
        "loyalty-accrual",
        |si: Option<&ServiceImport>| si.is_some_and(|si| si.spec.ips.is_some()),
    );
    let si = match tokio::time::timeout(Duration::from_secs(120), imported).await {
        Ok(Ok(Some(si))) => si,
        other => panic!(
            "no ServiceImport with a ClusterSetIP from the agent's Pod ({other:?}); the agent's \
             log:\n{}",
            lab.kubelet(0)
                .container_logs(RELEASE_NS, "mcs-agent-", "agent", 30)
        ),
    };
    let ip: std::net::Ipv4Addr = si.spec.ips.unwrap()[0].parse().unwrap();
    assert_eq!(
        ip.octets()[..3],
        [10, 0, 0],
        "the ClusterSetIP {ip} comes from east's service CIDR {}",
        support::SERVICE_CIDR
    );

    // The cluster's DNS: the upgrade renders the chart's server block for CoreDNS (the DNS
    // Service's ClusterIP found by lookup), CoreDNS imports it, and a Pod resolves the
    // ClusterSet name through its resolv.conf, as any workload would.
    helm(&["upgrade", "--reuse-values"]);
    let services: Api<Service> = Api::namespaced(client.clone(), RELEASE_NS);
    let dns_ip = services
        .get("mcs-dns")
        .await
        .unwrap()
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("the DNS Service's ClusterIP");
    let snippets: Api<ConfigMap> = Api::namespaced(client.clone(), "kube-system");
    let snippet = snippets
        .get_opt(COREDNS_SNIPPET)
        .await
        .unwrap()
        .unwrap_or_else(|| panic!("helm upgrade made no ConfigMap kube-system/{COREDNS_SNIPPET}"))
        .data
        .unwrap_or_default()
        .remove("mcs.server")
        .unwrap_or_default();
    assert!(
        snippet.contains(&format!("forward . {dns_ip}")),
        "the snippet forwards clusterset.local to the DNS Service {dns_ip}:\n{snippet}"
    );
    let coredns = support::cluster_dns::deploy(&client, lab.kubelet(0), COREDNS_SNIPPET).await;
    // Both Services routed by the node's kube-proxy before a Pod asks.
    let mcs_dns = support::cluster_dns::pod_ips(
        &client,
        RELEASE_NS,
        "app.kubernetes.io/component=dns,app.kubernetes.io/instance=mcs",
    )
    .await;
    for (vip, pods) in [
        (lab.kubelet(0).cluster_dns().to_string(), [coredns].into()),
        (dns_ip.clone(), mcs_dns),
    ] {
        lab.wait_kube_proxy_endpoints(0, format!("{vip}:53").parse().unwrap(), &pods)
            .await;
    }
    let (ok, out) = support::cluster_dns::run_to_completion(
        &client,
        lab.kubelet(0),
        NS,
        "resolve",
        "nslookup -type=a loyalty-accrual.loyalty.svc.clusterset.local \
         && nslookup -type=a kubernetes.default.svc.cluster.local",
    )
    .await;
    let answered = |name: &str, ip: &str| {
        out.split(&format!("Name:\t{name}"))
            .nth(1)
            .and_then(|rest| rest.lines().nth(1))
            .is_some_and(|l| l.trim_end().ends_with(&format!("Address: {ip}")))
    };
    assert!(
        ok && answered(
            "loyalty-accrual.loyalty.svc.clusterset.local",
            &ip.to_string()
        ) && answered("kubernetes.default.svc.cluster.local", "10.0.0.1"),
        "a Pod resolves the ClusterSet name to {ip} (and cluster.local names) through the \
         cluster's CoreDNS: {}:\n{out}\nCoreDNS:\n{}\nmcs-dns:\n{}",
        if ok { "exit 0" } else { "failed" },
        lab.kubelet(0)
            .container_logs("kube-system", "coredns-", "coredns", 20),
        lab.kubelet(0)
            .container_logs(RELEASE_NS, "mcs-dns-", "dns", 20)
    );

    // What a user runs next: `kubectl mcs check` (the plugin found on PATH, beside
    // mcs-agent) passes: the agent ready by its heartbeat, the CRDs, the cluster id, every
    // request the agent makes allowed by the chart's RBAC, CoreDNS forwarding the zone.
    let path = std::env::join_paths(std::iter::once(bin_dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let out = std::process::Command::new(support::bin_dir().join("kubectl"))
        .args(["mcs", "check", "--context", "east"])
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .env("PATH", &path)
        .stdin(std::process::Stdio::null())
        .output()
        .expect("run kubectl mcs check");
    let report = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        out.status.success() && report.contains("PASSED: 0 problem(s)"),
        "kubectl mcs check --context east:\n{report}\nthe agent's log:\n{}",
        lab.kubelet(0)
            .container_logs(RELEASE_NS, "mcs-agent-", "agent", 30)
    );
}

/// The release namespace's Pods and Events, for a failure message.
async fn what_happened(client: &kube::Client) -> String {
    use k8s_openapi::api::core::v1::{Event, Pod};
    let pods: Api<Pod> = Api::namespaced(client.clone(), RELEASE_NS);
    let events: Api<Event> = Api::namespaced(client.clone(), RELEASE_NS);
    let mut out = String::from("Pods:\n");
    for p in pods
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        let status = p.status.unwrap_or_default();
        out += &format!(
            "  {} on {:?}: {:?} {:?}\n",
            p.metadata.name.unwrap_or_default(),
            p.spec.and_then(|s| s.node_name),
            status.phase,
            status.container_statuses
        );
    }
    out += "Events:\n";
    for e in events
        .list(&Default::default())
        .await
        .map(|l| l.items)
        .unwrap_or_default()
    {
        out += &format!(
            "  {} {:?} {:?}: {}\n",
            e.involved_object.name.unwrap_or_default(),
            e.type_,
            e.reason,
            e.message.unwrap_or_default()
        );
    }
    out
}
