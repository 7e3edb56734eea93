//! The second seed scenario on real API servers, with the `mcs-agent` and `mcs-dns`
//! binaries and a real `kubectl`.
//!
//! Clusters `uretim-eu` (pod CIDR 10.10.0.0/16, service CIDR 10.110.0.0/16) and `uretim-tr`
//! (10.20.0.0/16, 10.120.0.0/16), each with its ClusterProperty `cluster.clusterset.k8s.io`
//! and an `mcs-agent` that reads its id from it. `uretim-eu` runs Service `odeme` in
//! namespace `magaza` with one ready Pod, and exports it with a `v1alpha1` ServiceExport.
//! A user with a kubeconfig holding both contexts runs
//! `kubectl get serviceimports -n magaza --context uretim-tr` and sees
//! `odeme  ClusterSetIP  ["10.120.x.y"]`, an IP from uretim-tr's own service CIDR; and
//! `odeme.magaza.svc.clusterset.local`, the host of `http://odeme.magaza.svc.clusterset.local`,
//! resolves to it through uretim-tr's `mcs-dns`.

use mcs_testkit as support;

use std::net::{IpAddr, Ipv4Addr};
use std::path::Path;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use kube::Client;
use kube::api::{Api, Patch, PatchParams};
use kube::config::Kubeconfig;
use mcs_core::api::v1beta1::{ClusterProperty, ServiceImport};
use mcs_core::api::{CLUSTER_ID_PROPERTY, ClusterPropertySpec, decode_yaml, v1alpha1};
use support::{ClusterOptions, TestCluster};
use tokio::process::{Child, Command};

const NS: &str = "magaza";
/// The conformance budget for imports, and for DNS.
const BUDGET: Duration = Duration::from_secs(20);
const MANAGER: &str = "seed-odeme";

const ODEME_SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: odeme, namespace: magaza }
spec:
  selector: { app: odeme }
  ports: [{ name: http, protocol: TCP, port: 80, targetPort: 8080 }]
"#;

const ODEME_EXPORT: &str = r#"
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: { name: odeme, namespace: magaza }
"#;

async fn start(name: &str, pods: &str, services: &str) -> TestCluster {
    let options = ClusterOptions {
        controller_manager: true,
        install_crds: true,
        service_cidr: services.to_owned(),
        pod_cidr: Some(pods.to_owned()),
        ..Default::default()
    };
    let cluster = support::start_clusters_with(&[name], options)
        .await
        .remove(0);
    let client = cluster.client().await;
    let property = ClusterProperty::new(
        CLUSTER_ID_PROPERTY,
        ClusterPropertySpec { value: name.into() },
    );
    Api::<ClusterProperty>::all(client)
        .patch(
            CLUSTER_ID_PROPERTY,
            &PatchParams::apply(MANAGER).force(),
            &Patch::Apply(&property),
        )
        .await
        .unwrap_or_else(|e| panic!("{name}: apply ClusterProperty: {e}"));
    cluster
}

/// A process killed when the test ends, its output in the cluster's directory.
fn spawn(exe: &str, args: &[String], kubeconfig: &Path, log: &Path) -> Child {
    let log = std::fs::File::create(log).expect("log file");
    Command::new(exe)
        .args(args)
        .env("KUBECONFIG", kubeconfig)
        .env("RUST_LOG", "info")
        .env_remove("MCS_CLUSTER_ID")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("log file"))
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .unwrap_or_else(|e| panic!("start {exe}: {e}"))
}

/// One kubeconfig with a context per cluster, named after it, as a user keeps one.
fn merged_kubeconfig(clusters: &[&TestCluster]) -> Kubeconfig {
    let mut merged = Kubeconfig::default();
    for cluster in clusters {
        let name = cluster.name().to_owned();
        let own = cluster.kubeconfig();
        let mut server = own.clusters[0].clone();
        server.name = name.clone();
        let mut user = own.auth_infos[0].clone();
        user.name = name.clone();
        let mut context = own.contexts[0].clone();
        context.name = name.clone();
        if let Some(c) = context.context.as_mut() {
            c.cluster = name.clone();
            c.user = Some(name.clone());
        }
        merged.clusters.push(server);
        merged.auth_infos.push(user);
        merged.contexts.push(context);
    }
    merged.current_context = Some(clusters[0].name().to_owned());
    merged
}

/// A loopback port free for both UDP and TCP now, for mcs-dns to bind (a port the kernel
/// gives for UDP may be taken for TCP: try another).
fn free_dns_port() -> std::net::SocketAddr {
    for _ in 0..20 {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").expect("bind UDP on loopback");
        let addr = udp.local_addr().expect("the UDP socket's address");
        if std::net::TcpListener::bind(addr).is_ok() {
            return addr;
        }
    }
    panic!("no loopback port free for both UDP and TCP after 20 tries");
}

async fn vip(client: &Client) -> Option<Ipv4Addr> {
    let import = Api::<ServiceImport>::namespaced(client.clone(), NS)
        .get_opt("odeme")
        .await
        .ok()??;
    match import.spec.ips.as_deref() {
        Some([ip]) => ip.parse().ok(),
        _ => None,
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn odeme_is_imported_into_uretim_tr_as_kubectl_and_mcs_dns_show() {
    let (eu, tr) = tokio::join!(
        start("uretim-eu", "10.10.0.0/16", "10.110.0.0/16"),
        start("uretim-tr", "10.20.0.0/16", "10.120.0.0/16")
    );
    let (eu_client, tr_client) = (eu.client().await, tr.client().await);
    for client in [&eu_client, &tr_client] {
        support::create_namespace(client, NS).await;
    }

    // The agents (ids from their ClusterProperty) and uretim-tr's DNS server.
    let members: Vec<String> = [&eu, &tr]
        .iter()
        .map(|c| format!("--member={}={}", c.name(), c.kubeconfig_path().display()))
        .collect();
    let mut args = members.clone();
    args.push("--admin-listen=127.0.0.1:0".to_owned());
    let mut processes = Vec::new();
    for cluster in [&eu, &tr] {
        processes.push(spawn(
            env!("CARGO_BIN_EXE_mcs-agent"),
            &args,
            &cluster.kubeconfig_path(),
            &cluster.dir().join("mcs-agent.log"),
        ));
    }
    let dns = free_dns_port();
    processes.push(spawn(
        env!("CARGO_BIN_EXE_mcs-dns"),
        &[
            format!("--listen={dns}"),
            "--admin-listen=127.0.0.1:0".to_owned(),
        ],
        &tr.kubeconfig_path(),
        &tr.dir().join("mcs-dns.log"),
    ));

    // uretim-eu runs odeme and exports it, as the seed writes it.
    let service: Service = decode_yaml(ODEME_SERVICE).expect("the seed's Service");
    Api::<Service>::namespaced(eu_client.clone(), NS)
        .patch(
            "odeme",
            &PatchParams::apply(MANAGER),
            &Patch::Apply(&service),
        )
        .await
        .expect("apply Service magaza/odeme in uretim-eu");
    support::create_ready_pod(
        &eu_client,
        NS,
        "odeme-0",
        &[("app", "odeme")],
        "10.10.0.5",
        &[("http", 8080)],
    )
    .await;
    let export: v1alpha1::ServiceExport = decode_yaml(ODEME_EXPORT).expect("the seed's export");
    Api::<v1alpha1::ServiceExport>::namespaced(eu_client.clone(), NS)
        .patch(
            "odeme",
            &PatchParams::apply(MANAGER),
            &Patch::Apply(&export),
        )
        .await
        .expect("apply v1alpha1 ServiceExport magaza/odeme in uretim-eu");

    let ip = support::wait_for("uretim-tr's import of odeme with its IP", BUDGET, || {
        vip(&tr_client)
    })
    .await;
    let [a, b, ..] = ip.octets();
    assert_eq!(
        (a, b),
        (10, 120),
        "{ip} is not in uretim-tr's service CIDR 10.120.0.0/16"
    );

    // What the user sees.
    let kubeconfig = tr.dir().join("uretim.kubeconfig");
    std::fs::write(
        &kubeconfig,
        serde_saphyr::to_string(&merged_kubeconfig(&[&eu, &tr])).expect("kubeconfig as YAML"),
    )
    .expect("write the merged kubeconfig");
    let kubectl = support::bin_dir().join("kubectl");
    assert!(
        kubectl.is_file(),
        "{} is missing: scripts/k8s-bins.sh builds it",
        kubectl.display()
    );
    let output = Command::new(&kubectl)
        .args(["get", "serviceimports", "-n", NS, "--context", "uretim-tr"])
        .env("KUBECONFIG", &kubeconfig)
        .output()
        .await
        .expect("run kubectl");
    let printed = String::from_utf8_lossy(&output.stdout);
    eprintln!(
        "$ kubectl get serviceimports -n {NS} --context uretim-tr\n{printed}{}",
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(output.status.success(), "kubectl failed: {output:?}");
    let lines: Vec<Vec<&str>> = printed
        .lines()
        .map(|l| l.split_whitespace().collect())
        .collect();
    assert_eq!(lines.len(), 2, "a header and one import:\n{printed}");
    assert_eq!(lines[0], ["NAME", "TYPE", "IP", "AGE"], "{printed}");
    assert_eq!(
        lines[1][..3],
        ["odeme", "ClusterSetIP", format!("[\"{ip}\"]").as_str()],
        "{printed}"
    );

    // http://odeme.magaza.svc.clusterset.local: its host resolves through mcs-dns.
    let resolver = support::dns_resolver(dns);
    let answered = support::wait_for("mcs-dns to answer odeme's IP", BUDGET, || async {
        let lookup = resolver
            .lookup_ip("odeme.magaza.svc.clusterset.local.")
            .await
            .ok()?;
        let ips: Vec<IpAddr> = lookup.iter().collect();
        (ips == [IpAddr::V4(ip)]).then_some(ips)
    })
    .await;
    eprintln!("mcs-dns {dns}: odeme.magaza.svc.clusterset.local -> {answered:?}");
    // At RUST_LOG=info, answering queries logs nothing per query (hickory-server would log
    // two lines for each, one naming the question).
    let log = std::fs::read_to_string(tr.dir().join("mcs-dns.log")).expect("mcs-dns's log");
    let per_query: Vec<&str> = log
        .lines()
        .filter(|l| l.contains("odeme.magaza.svc.clusterset.local"))
        .collect();
    assert!(
        per_query.is_empty(),
        "mcs-dns logged its queries at RUST_LOG=info:\n{}",
        per_query.join("\n")
    );

    for mut process in processes {
        assert!(
            process.try_wait().expect("process status").is_none(),
            "an mcs process exited early; its log is in the cluster directory"
        );
        process.kill().await.expect("stop process");
    }
}
