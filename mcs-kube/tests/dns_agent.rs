//! DNS conformance cases 22, 23 and 25-27 end to end: Pods in two clusters, EndpointSlices
//! from kube-controller-manager, the agents' imports and slices in a third cluster, and
//! that cluster's `mcs-dns`, queried with `dig`.

mod clusterset;
mod support;

use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use clusterset::*;
use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, PostParams};
use mcs_kube::dns::{DnsConfig, DnsServer};

const NS: &str = "mcs-dns";

fn dig(server: SocketAddr, args: &[&str]) -> Vec<String> {
    let out = Command::new("dig")
        .arg(format!("@{}", server.ip()))
        .args([
            "-p",
            &server.port().to_string(),
            "+time=2",
            "+tries=2",
            "+short",
        ])
        .args(args)
        .output()
        .unwrap_or_else(|e| {
            panic!("cannot run dig (scripts/test.sh installs bind9-dnsutils): {e}")
        });
    let mut lines: Vec<String> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(str::to_owned)
        .filter(|l| !l.is_empty())
        .collect();
    lines.sort();
    lines
}

/// A ready Pod with a hostname in the headless service's subdomain (as a StatefulSet makes).
async fn stateful_pod(client: &kube::Client, name: &str, ip: &str) {
    support::ensure_fake_node(client).await;
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": name, "namespace": NS, "labels": { "app": "web" } },
        "spec": {
            "nodeName": support::FAKE_NODE,
            "hostname": name,
            "subdomain": "web",
            "containers": [{ "name": "app", "image": "registry.invalid/web:0", "ports": [{ "name": "tcp", "containerPort": 42 }] }]
        }
    }))
    .unwrap();
    Api::<Pod>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &pod)
        .await
        .unwrap();
    support::set_pod_status(client, NS, name, Some(ip), true).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_answers_what_the_agents_imported() {
    let set = ClusterSet::start(&["east", "west", "north"], true).await;
    set.namespace(NS).await;
    stateful_pod(set.client(0), "web-0", "192.0.2.10").await;
    stateful_pod(set.client(1), "web-0", "192.0.2.20").await;
    for i in [0, 1] {
        let mut web = headless(hello_service("web"));
        web.spec
            .as_mut()
            .unwrap()
            .ports
            .as_mut()
            .unwrap()
            .truncate(1);
        create_service(set.client(i), NS, &web).await;
        export(set.client(i), NS, "web", None).await;
    }
    create_service(set.client(0), NS, &hello_service("hello")).await;
    export(set.client(0), NS, "hello", None).await;

    let server = DnsServer::bind(DnsConfig::default().listen("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr = server.local_addr();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(set.client(2).clone(), async move {
        let _ = stopped.await;
    }));

    // Case 22: A is the ClusterSetIP that north's agent got allocated for the import.
    let si = wait_import(set.client(2), NS, "hello", "import with ips", |si| {
        si.spec.ips.is_some()
    })
    .await;
    let ips = si.spec.ips.unwrap();
    let a = support::wait_for("A record", Duration::from_secs(20), || async {
        let a = dig(addr, &["hello.mcs-dns.svc.clusterset.local", "A"]);
        (a == ips).then_some(a)
    })
    .await;
    assert_eq!(a, ips);
    // Case 23: one SRV for port 42 (tcp and udp share the number).
    let srv = dig(addr, &["hello.mcs-dns.svc.clusterset.local", "SRV"]);
    assert_eq!(srv.len(), 1, "{srv:?}");
    assert!(
        srv[0].ends_with(" 42 hello.mcs-dns.svc.clusterset.local."),
        "{srv:?}"
    );

    // Case 25: headless A lists the ready Pods of both clusters.
    support::wait_for("headless A from both clusters", SLICE_TIMEOUT, || async {
        (dig(addr, &["web.mcs-dns.svc.clusterset.local", "A"]) == ["192.0.2.10", "192.0.2.20"])
            .then_some(())
    })
    .await;
    // Case 26: the per-endpoint name carries the source cluster.
    assert_eq!(
        dig(addr, &["web-0.east.web.mcs-dns.svc.clusterset.local", "A"]),
        ["192.0.2.10"]
    );
    assert_eq!(
        dig(addr, &["web-0.west.web.mcs-dns.svc.clusterset.local", "A"]),
        ["192.0.2.20"]
    );
    // Case 27: one SRV per ready endpoint, targets prefixed by hostname and cluster.
    let srv = dig(addr, &["web.mcs-dns.svc.clusterset.local", "SRV"]);
    let targets: Vec<&str> = srv.iter().map(|l| l.rsplit(' ').next().unwrap()).collect();
    assert_eq!(
        targets,
        [
            "web-0.east.web.mcs-dns.svc.clusterset.local.",
            "web-0.west.web.mcs-dns.svc.clusterset.local."
        ]
    );

    // A Pod turning unready in west disappears from north's DNS.
    support::set_pod_status(set.client(1), NS, "web-0", Some("192.0.2.20"), false).await;
    support::wait_for("unready endpoint gone from DNS", SLICE_TIMEOUT, || async {
        (dig(addr, &["web.mcs-dns.svc.clusterset.local", "A"]) == ["192.0.2.10"]).then_some(())
    })
    .await;
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}
