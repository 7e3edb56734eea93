//! `dnsperf` against `mcs-dns` on loopback, fed by a real API server.
//!
//! ```text
//! scripts/k8s-bins.sh && cargo bench -p mcs-kube --bench dns_load
//! ```
//!
//! The zone holds 200 ClusterSetIP imports and 50 headless imports with 10 endpoints in
//! each of two clusters. The query mix: 60% A of a ClusterSetIP name, 15% A of a headless
//! name, 10% bare-name SRV, 5% per-endpoint A, 10% NXDOMAIN. dnsperf (Debian package) runs
//! for `MCS_DNSPERF_SECONDS` (default 10) with 4 clients; its report is printed as is.

use mcs_testkit as support;

use std::collections::BTreeMap;
use std::io::Write;
use std::process::Command;
use std::time::Duration;

use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use kube::api::{Api, ObjectMeta, PostParams};
use mcs_core::api::{
    LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, Protocol, ServiceImportSpec, ServiceImportType,
    ServicePort, v1beta1::ServiceImport,
};
use mcs_kube::dns::{DnsConfig, DnsServer};

const NS: &str = "load";

fn import(name: &str, type_: ServiceImportType, ip: Option<String>) -> ServiceImport {
    let mut spec = ServiceImportSpec::new(type_);
    spec.ips = ip.map(|ip| vec![ip]);
    spec.ports = vec![ServicePort {
        name: Some("http".into()),
        protocol: Some(Protocol::Tcp),
        app_protocol: None,
        port: 80,
    }];
    let mut si = ServiceImport::new(name, spec);
    si.metadata.namespace = Some(NS.into());
    si
}

fn slice(svc: &str, cluster: &str, third: u8) -> EndpointSlice {
    EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some(format!("{svc}-{cluster}")),
            namespace: Some(NS.into()),
            labels: Some(BTreeMap::from([
                (LABEL_SERVICE_NAME.to_string(), svc.to_string()),
                (LABEL_SOURCE_CLUSTER.to_string(), cluster.to_string()),
            ])),
            ..Default::default()
        },
        endpoints: (1..=10)
            .map(|i| Endpoint {
                addresses: vec![format!("10.{third}.0.{i}")],
                hostname: Some(format!("{svc}-{i}")),
                ..Default::default()
            })
            .collect(),
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    }
}

#[tokio::main(flavor = "multi_thread", worker_threads = 2)]
async fn main() {
    if std::env::args().any(|a| a == "--list") {
        return;
    }
    let seconds: u64 = std::env::var("MCS_DNSPERF_SECONDS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(10);
    let cluster = support::start_cluster("dnsload", support::ClusterOptions::api_only()).await;
    let client = cluster.client().await;
    support::create_namespace(&client, NS).await;
    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), NS);
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    let pp = PostParams::default();
    for i in 0..200u32 {
        imports
            .create(
                &pp,
                &import(
                    &format!("svc-{i}"),
                    ServiceImportType::ClusterSetIp,
                    Some(format!("10.96.{}.{}", i / 250, i % 250 + 1)),
                ),
            )
            .await
            .unwrap();
    }
    for i in 0..50u8 {
        let name = format!("hl-{i}");
        imports
            .create(&pp, &import(&name, ServiceImportType::Headless, None))
            .await
            .unwrap();
        slices
            .create(&pp, &slice(&name, "east", 100 + i))
            .await
            .unwrap();
        slices
            .create(&pp, &slice(&name, "west", 150 + i))
            .await
            .unwrap();
    }
    let server = DnsServer::bind(DnsConfig::default().listen("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let addr = server.local_addr();
    let synced = server.synced();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(client.clone(), async move {
        let _ = stopped.await;
    }));
    support::wait_for("synced", Duration::from_secs(30), || {
        let synced = synced.clone();
        async move {
            synced
                .load(std::sync::atomic::Ordering::Acquire)
                .then_some(())
        }
    })
    .await;
    // Let the watches catch up with every object.
    tokio::time::sleep(Duration::from_secs(2)).await;

    let mut queries = tempfile::NamedTempFile::new().unwrap();
    for i in 0..1000u32 {
        let line = match i % 20 {
            0..=11 => format!("svc-{}.{NS}.svc.clusterset.local A", i % 200),
            12..=14 => format!("hl-{}.{NS}.svc.clusterset.local A", i % 50),
            15 | 16 => format!("hl-{}.{NS}.svc.clusterset.local SRV", i % 50),
            17 => format!(
                "hl-{}-{}.east.hl-{}.{NS}.svc.clusterset.local A",
                i % 50,
                i % 10 + 1,
                i % 50
            ),
            _ => format!("missing-{i}.{NS}.svc.clusterset.local A"),
        };
        writeln!(queries, "{line}").unwrap();
    }
    queries.flush().unwrap();
    let path = queries.path().to_owned();
    let port = addr.port().to_string();
    let out = tokio::task::spawn_blocking(move || {
        Command::new("dnsperf")
            .args(["-s", "127.0.0.1", "-p", &port, "-d"])
            .arg(&path)
            .args([
                "-l",
                &seconds.to_string(),
                "-c",
                "4",
                "-T",
                "1",
                "-q",
                "200",
            ])
            .output()
            .expect("dnsperf (Debian package dnsperf) must be installed")
    })
    .await
    .unwrap();
    println!(
        "mcs-dns under dnsperf, {} cores shared by the server, the API server and dnsperf",
        std::thread::available_parallelism().map_or(0, |n| n.get())
    );
    print!("{}", String::from_utf8_lossy(&out.stdout));
    eprint!("{}", String::from_utf8_lossy(&out.stderr));
    let _ = stop.send(());
    let _ = task.await;
}
