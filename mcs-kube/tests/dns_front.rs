//! The realistic front: CoreDNS runs a cluster's usual Corefile (kubeadm's default, with
//! `cluster.local` from its `kubernetes` plugin) with the server block of
//! `deploy/dns/clusterset.server` added as shipped, forwarding `clusterset.local` to
//! mcs-dns. Only the addresses and ports a test needs are substituted (listen ports, the
//! forward target, the health endpoint), and the plugin is pointed at the test's API
//! server through its `kubeconfig` option. Questions go to CoreDNS only.

use mcs_testkit as support;

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use hickory_resolver::proto::op::{Message, ResponseCode};
use hickory_resolver::proto::rr::{RData, RecordType};
use k8s_openapi::api::core::v1::{Service, ServicePort as CoreServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use kube::api::{Api, ObjectMeta, PostParams};
use mcs_core::api::{
    LABEL_SERVICE_NAME, LABEL_SOURCE_CLUSTER, Protocol, ServiceImportSpec, ServiceImportType,
    ServicePort, v1beta1::ServiceImport,
};
use mcs_kube::dns::{DnsConfig, DnsServer};
use support::{ClusterOptions, start_cluster, wait_for};

const NS: &str = "demo";
const MANIFEST: &str = "deploy/dns/clusterset.server";
/// The placeholder the operator replaces with the mcs-dns Service's ClusterIP.
const MCS_DNS_SERVICE_IP: &str = "MCS_DNS_CLUSTER_IP";
/// The Corefile a cluster runs before mcs: kubeadm's default.
const EXISTING_COREFILE: &str = ".:53 {
    errors
    health
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    forward . /etc/resolv.conf
    cache 30
    loop
    reload
    loadbalance
}
";

/// `text` with `from` replaced by `to`; `from` must occur exactly `count` times, so a
/// change of the manifest that this test would silently stop covering fails here.
fn substitute(text: &str, from: &str, to: &str, count: usize) -> String {
    assert_eq!(
        text.matches(from).count(),
        count,
        "{MANIFEST}: expected {count} occurrence(s) of {from:?} in the Corefile:\n{text}"
    );
    text.replace(from, to)
}

/// The existing Corefile with the shipped server block added, for a test: both server
/// blocks on `port`, the ClusterSet zone forwarded to `mcs_dns`, the health endpoint on
/// `health_port`, and the `kubernetes` plugin reading the API server behind `kubeconfig`.
/// Nothing else changes.
fn front_corefile(
    kubeconfig: &Path,
    mcs_dns: SocketAddr,
    health_port: u16,
) -> impl Fn(u16) -> String {
    let block = std::fs::read_to_string(
        Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("..")
            .join(MANIFEST),
    )
    .unwrap_or_else(|e| panic!("{MANIFEST}: {e}"));
    let shipped = format!("{EXISTING_COREFILE}{block}");
    let kubeconfig = kubeconfig.display().to_string();
    move |port| {
        let text = substitute(&shipped, ":53 {", &format!(":{port} {{"), 2);
        let text = substitute(
            &text,
            &format!("forward . {MCS_DNS_SERVICE_IP}\n"),
            &format!("forward . {mcs_dns}\n"),
            1,
        );
        let text = substitute(
            &text,
            "    health\n",
            &format!("    health 127.0.0.1:{health_port}\n"),
            1,
        );
        substitute(
            &text,
            "kubernetes cluster.local in-addr.arpa ip6.arpa {\n",
            &format!(
                "kubernetes cluster.local in-addr.arpa ip6.arpa {{\n            kubeconfig {kubeconfig}\n"
            ),
            1,
        )
    }
}

fn addresses(m: &Message) -> Vec<IpAddr> {
    let mut v = support::answer_addresses(m);
    v.sort();
    v
}

fn txt(m: &Message) -> Vec<String> {
    m.answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::TXT(t) => Some(
                t.txt_data
                    .iter()
                    .map(|d| String::from_utf8_lossy(d))
                    .collect(),
            ),
            _ => None,
        })
        .collect()
}

fn import(name: &str, type_: ServiceImportType, ips: &[&str]) -> ServiceImport {
    let mut spec = ServiceImportSpec::new(type_);
    spec.ips = (!ips.is_empty()).then(|| ips.iter().map(|s| s.to_string()).collect());
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

/// The MCS EndpointSlice an agent writes for a headless import: one ready endpoint.
fn slice(svc: &str, cluster: &str, ip: &str, hostname: &str) -> EndpointSlice {
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
        endpoints: vec![Endpoint {
            addresses: vec![ip.into()],
            hostname: Some(hostname.into()),
            conditions: Some(EndpointConditions {
                ready: Some(true),
                ..Default::default()
            }),
            ..Default::default()
        }],
        ports: Some(vec![EndpointPort {
            name: Some("http".into()),
            port: Some(8080),
            protocol: Some("TCP".into()),
            ..Default::default()
        }]),
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn coredns_with_the_shipped_corefile_answers_both_zones() {
    let cluster = start_cluster("dnsfront", ClusterOptions::api_only()).await;
    let client = cluster.client().await;
    support::create_namespace(&client, NS).await;
    let pp = PostParams::default();

    // A local Service `web`, and ServiceImports `web` (another address: the ClusterSet's)
    // and `db` (headless, one endpoint in east). `db` has no local Service.
    let services: Api<Service> = Api::namespaced(client.clone(), NS);
    let local = services
        .create(
            &pp,
            &Service {
                metadata: ObjectMeta {
                    name: Some("web".into()),
                    ..Default::default()
                },
                spec: Some(ServiceSpec {
                    ports: Some(vec![CoreServicePort {
                        name: Some("http".into()),
                        port: 80,
                        ..Default::default()
                    }]),
                    ..Default::default()
                }),
                status: None,
            },
        )
        .await
        .unwrap();
    let local_ip: IpAddr = local
        .spec
        .and_then(|s| s.cluster_ip)
        .expect("web has a ClusterIP")
        .parse()
        .unwrap();
    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), NS);
    imports
        .create(
            &pp,
            &import("web", ServiceImportType::ClusterSetIp, &["10.96.7.7"]),
        )
        .await
        .unwrap();
    imports
        .create(&pp, &import("db", ServiceImportType::Headless, &[]))
        .await
        .unwrap();
    let slices: Api<EndpointSlice> = Api::namespaced(client.clone(), NS);
    slices
        .create(&pp, &slice("db", "east", "10.10.0.5", "db-0"))
        .await
        .unwrap();

    // mcs-dns, synced on everything written above.
    let server = DnsServer::bind(DnsConfig::default().listen("127.0.0.1:0".parse().unwrap()))
        .await
        .unwrap();
    let mcs = server.local_addr();
    let metrics = server.metrics();
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let task = tokio::spawn(server.run(client.clone(), async move {
        let _ = stopped.await;
    }));
    let db = "db.demo.svc.clusterset.local.";
    wait_for("mcs-dns answering db", Duration::from_secs(60), || async {
        let m = support::dns_query(mcs, db, RecordType::A).await;
        (!m.answers.is_empty()).then_some(())
    })
    .await;

    // CoreDNS with the shipped Corefile, up once its kubernetes plugin has synced.
    let coredns = support::CoreDns::start(
        cluster.dir(),
        "front",
        front_corefile(&cluster.kubeconfig_path(), mcs, support::free_dns_port()),
        ("web.demo.svc.cluster.local.", RecordType::A),
    )
    .await;
    let front = coredns.addr();
    let ask = |name: &'static str, qtype| support::dns_query(front, name, qtype);

    // cluster.local: the local Service, from CoreDNS's kubernetes plugin.
    let m = ask("web.demo.svc.cluster.local.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(
        addresses(&m),
        [local_ip],
        "cluster.local is the local Service"
    );
    let m = ask("kubernetes.default.svc.cluster.local.", RecordType::A).await;
    assert_eq!(addresses(&m), ["10.0.0.1".parse::<IpAddr>().unwrap()]);
    // cluster.local keeps meaning the local cluster only: no local `db` Service.
    let m = ask("db.demo.svc.cluster.local.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NXDomain);

    // clusterset.local: mcs-dns's answers, through the forward.
    let m = ask("web.demo.svc.clusterset.local.", RecordType::A).await;
    assert_eq!(m.metadata.response_code, ResponseCode::NoError);
    assert_eq!(addresses(&m), ["10.96.7.7".parse::<IpAddr>().unwrap()]);
    let m = ask("WEB.Demo.svc.ClusterSet.local.", RecordType::A).await;
    assert_eq!(addresses(&m), ["10.96.7.7".parse::<IpAddr>().unwrap()]);
    let m = ask(db, RecordType::A).await;
    assert_eq!(addresses(&m), ["10.10.0.5".parse::<IpAddr>().unwrap()]);
    let m = ask("db-0.east.db.demo.svc.clusterset.local.", RecordType::A).await;
    assert_eq!(addresses(&m), ["10.10.0.5".parse::<IpAddr>().unwrap()]);
    let m = ask("_http._tcp.db.demo.svc.clusterset.local.", RecordType::SRV).await;
    let srv: Vec<String> = m
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::SRV(s) => Some(format!("{} {}", s.port, s.target)),
            _ => None,
        })
        .collect();
    assert_eq!(srv, ["8080 db-0.east.db.demo.svc.clusterset.local."]);
    // The schema version is mcs-dns's (CoreDNS's own plugin says 1.1.0).
    let m = ask("dns-version.clusterset.local.", RecordType::TXT).await;
    assert_eq!(txt(&m), ["1.0.0"]);

    // Unknown ClusterSet names: NXDOMAIN through the front, from mcs-dns (its SOA, its
    // counter), each forwarded once.
    let nxdomain_before = metrics.responses("NXDomain");
    for name in [
        "nope.demo.svc.clusterset.local.",
        "web.nons.svc.clusterset.local.",
        "east.web.demo.svc.clusterset.local.",
    ] {
        let m = support::dns_query(front, name, RecordType::A).await;
        assert_eq!(m.metadata.response_code, ResponseCode::NXDomain, "{name}");
        assert!(m.answers.is_empty(), "{name}");
        let soa: Vec<String> = m
            .authorities
            .iter()
            .filter_map(|r| match &r.data {
                RData::SOA(soa) => Some(soa.mname.to_string()),
                _ => None,
            })
            .collect();
        assert_eq!(soa, ["ns.dns.cluster.local."], "{name}: mcs-dns's SOA");
    }
    assert_eq!(metrics.responses("NXDomain") - nxdomain_before, 3);

    drop(coredns);
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}
