//! Packets, not objects: three clusters (`east`, `west`, `north`) whose nodes and pods are
//! network namespaces of a lab (`support/netlab.rs`), kube-proxy in nftables mode on every
//! node, real listeners in the pods, the agents and `mcs-dns` in-process. A client in a
//! `north` pod resolves ClusterSet names through `mcs-dns` and connects through the rules
//! north's kube-proxy wrote for the agent's derived Service (the ClusterSetIP).
//!
//! One test function runs the cases in sequence on one lab (starting it is most of the
//! time). Needs root, iproute2 and nftables; see `docs/testing.md`.

use mcs_testkit as support;
use mcs_testkit::clusterset;

use std::collections::BTreeSet;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use clusterset::*;
use hickory_resolver::proto::op::{Edns, Message, MessageType, OpCode, Query, ResponseCode};
use hickory_resolver::proto::rr::{Name, RData, RecordType};
use http_body_util::{BodyExt, Empty};
use hyper_util::rt::{TokioExecutor, TokioTimer};
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::Api;
use mcs_client::connect::Tcp;
use mcs_client::{CloneBody, Http, McsLayer, Retry, Served};
use mcs_core::discovery::{Resolution, Resolve, Target};
use mcs_core::endpoints::Locality;
use mcs_kube::dns::{DnsConfig, DnsServer};
use mcs_kube::resolver::KubeResolver;
use support::netlab::{self, Lab, LabPod};
use tower::{Layer, ServiceExt};

/// Per-request budget (connect, send, answer): a safety net, not a measurement.
const REQUEST_TIMEOUT: Duration = Duration::from_secs(3);
/// How long a route may take to appear (agent, then kube-proxy's next sync).
const ROUTE_TIMEOUT: Duration = Duration::from_secs(60);

const EAST: usize = 0;
const WEST: usize = 1;
const NORTH: usize = 2;

#[test]
fn dataplane() {
    netlab::with_lab(|lab| Box::pin(run(lab)));
}

/// Everything the cases share.
struct World {
    set: ClusterSet,
    /// Where pods reach north's `mcs-dns` (the lab's address towards north's node).
    dns: SocketAddr,
    /// The `north` pod the requests come from.
    client: LabPod,
}

async fn run(lab: &mut Lab) {
    let set = ClusterSet::start_with_pods(&["east", "west", "north"]).await;
    for c in &set.clusters {
        lab.add_node(c);
    }
    // north's mcs-dns, listening in the lab: pods reach it through their node.
    let server = DnsServer::bind(DnsConfig::default().listen("0.0.0.0:0".parse().unwrap()))
        .await
        .expect("bind mcs-dns");
    let dns = SocketAddr::new(
        IpAddr::V4(netlab::lab_address(NORTH)),
        server.local_addr().port(),
    );
    tokio::spawn(server.run(set.client(NORTH).clone(), std::future::pending()));

    // The client pod, in north.
    support::create_namespace(set.client(NORTH), "client").await;
    support::create(
        set.client(NORTH),
        "client",
        &support::deployment("client", 1, &[]),
    )
    .await;
    let pod = support::wait_ready_pods(set.client(NORTH), "client", "app=client", 1)
        .await
        .remove(0);
    let client = plumb(lab, NORTH, &pod, &[]);
    let world = World { set, dns, client };

    case_clusterset_ip_through_dns(lab, &world).await;
    lab.assert_running();
    case_unready_east(&world, lab).await;
    lab.assert_running();
    case_conformance_connectivity(lab, &world).await;
    lab.assert_running();
    case_client_layer(lab, &world).await;
    lab.assert_running();
}

/// Gives a Pod its namespace in the lab and starts its listeners on `ports`.
fn plumb(
    lab: &mut Lab,
    node: usize,
    pod: &k8s_openapi::api::core::v1::Pod,
    ports: &[u16],
) -> LabPod {
    let name = pod.metadata.name.clone().unwrap_or_default();
    let ip = support::pod_ips(pod)[0];
    let pod = lab.plumb_pod(node, &name, ip);
    for port in ports {
        netlab::serve_pod(&pod, *port);
    }
    pod
}

/// Starts `replicas` Pods `app` in cluster `i`'s namespace `ns` and plumbs them, each
/// listening on `ports`. Returns the `(cluster, pod IP)` answers they give.
async fn server_pods(
    lab: &mut Lab,
    client: &Client,
    i: usize,
    ns: &str,
    app: &str,
    replicas: i32,
    ports: &[u16],
) -> Vec<String> {
    support::create(client, ns, &support::deployment(app, replicas, &[])).await;
    let pods = support::wait_ready_pods(client, ns, &format!("app={app}"), replicas as usize).await;
    pods.iter()
        .map(|p| {
            let pod = plumb(lab, i, p, ports);
            format!("{} {}", pod.cluster, pod.ip)
        })
        .collect()
}

/// Service ports: `(name, port, targetPort)`.
type Ports<'a> = &'a [(&'a str, i32, i32)];

/// A ClusterIP Service `name` selecting `app: <app>`, ports `(name, port, targetPort)`.
fn service(name: &str, app: &str, ports: &[(&str, i32, i32)]) -> Service {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name },
        "spec": {
            "selector": { "app": app },
            "ports": ports.iter().map(|(n, p, t)| serde_json::json!({
                "name": n, "port": p, "targetPort": t, "protocol": "TCP"
            })).collect::<Vec<_>>(),
        },
    }))
    .expect("a Service")
}

/// The A records of `name` from `server`, asked over UDP from the calling thread's
/// namespace: `Ok(addresses)` for NOERROR (possibly empty), `Err(rcode)` otherwise.
fn dns_a(server: SocketAddr, name: &str) -> Result<Vec<Ipv4Addr>, String> {
    let id = std::process::id() as u16 ^ (name.len() as u16);
    let mut m = Message::new(id, MessageType::Query, OpCode::Query);
    m.metadata.recursion_desired = true;
    m.add_query(Query::query(Name::from_ascii(name).unwrap(), RecordType::A));
    let mut edns = Edns::new();
    edns.set_max_payload(1232);
    m.set_edns(edns);
    let sock = std::net::UdpSocket::bind("0.0.0.0:0").map_err(|e| e.to_string())?;
    sock.set_read_timeout(Some(REQUEST_TIMEOUT)).unwrap();
    sock.send_to(&m.to_vec().unwrap(), server)
        .map_err(|e| format!("send to {server}: {e}"))?;
    let mut buf = vec![0u8; 4096];
    let (n, _) = sock
        .recv_from(&mut buf)
        .map_err(|e| format!("no answer from {server} for {name}: {e}"))?;
    let answer = Message::from_vec(&buf[..n]).map_err(|e| e.to_string())?;
    if answer.metadata.response_code != ResponseCode::NoError {
        return Err(format!("{name}: {:?}", answer.metadata.response_code));
    }
    Ok(answer
        .answers
        .iter()
        .filter_map(|r| match &r.data {
            RData::A(a) => Some(a.0),
            _ => None,
        })
        .collect())
}

/// From the client pod: resolve `name` through mcs-dns, then `n` requests, each on a new
/// connection, to `<address>:<port>`. Returns every answer (or error), in order.
async fn from_client(
    world: &World,
    name: &str,
    port: u16,
    n: usize,
) -> Result<Vec<String>, String> {
    let (ns, dns, name) = (world.client.netns.clone(), world.dns, name.to_owned());
    tokio::task::spawn_blocking(move || {
        netlab::in_netns(&ns, move || {
            let ips = dns_a(dns, &name)?;
            let ip = *ips.first().ok_or_else(|| format!("{name}: no A record"))?;
            let addr = SocketAddr::new(IpAddr::V4(ip), port);
            Ok((0..n)
                .map(|_| netlab::http_get_once(addr, REQUEST_TIMEOUT).unwrap_or_else(|e| e))
                .collect())
        })
    })
    .await
    .expect("the client thread")
}

/// Waits until a request from the client pod through `name:port` gets an answer from one
/// of `expected` (kube-proxy has programmed the route), then sends `n` more and returns
/// their answers.
async fn answers_once_routed(
    world: &World,
    lab: &Lab,
    name: &str,
    port: u16,
    expected: &BTreeSet<String>,
    n: usize,
) -> Vec<String> {
    let mut last: String;
    let deadline = std::time::Instant::now() + ROUTE_TIMEOUT;
    loop {
        match from_client(world, name, port, 1).await {
            Ok(a) if expected.contains(&a[0]) => break,
            Ok(a) => last = a[0].clone(),
            Err(e) => last = e,
        }
        lab.assert_running();
        assert!(
            std::time::Instant::now() < deadline,
            "{name}:{port} not routed to any of {expected:?} after {ROUTE_TIMEOUT:?} (last: \
             {last}).\nnorth's kube-proxy:\n{}\nnorth's nftables:\n{}",
            lab.kube_proxy_log(NORTH, 30),
            lab.nft_ruleset(NORTH)
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    from_client(world, name, port, n)
        .await
        .unwrap_or_else(|e| panic!("{name}:{port}: {e}"))
}

/// Waits until north's agent has written everything it knows (a forced resync, completed)
/// and north's kube-proxy has synced its rules after that.
async fn settled(world: &World, lab: &Lab) {
    world.set.resync(NORTH).await;
    lab.wait_kube_proxy_synced(NORTH, std::time::SystemTime::now())
        .await;
}

/// Issue 26, first case: `loyalty-accrual.loyalty.svc.clusterset.local` resolves (mcs-dns)
/// to north's ClusterSetIP, and connections to it reach the Pods of east and west through
/// north's kube-proxy.
async fn case_clusterset_ip_through_dns(lab: &mut Lab, world: &World) {
    const NS: &str = "loyalty";
    const NAME: &str = "loyalty-accrual.loyalty.svc.clusterset.local.";
    let set = &world.set;
    set.namespace(NS).await;
    let mut pods = BTreeSet::new();
    for i in [EAST, WEST] {
        create_service(
            set.client(i),
            NS,
            &service("loyalty-accrual", "loyalty-accrual", &[("tcp", 42, 42)]),
        )
        .await;
        pods.extend(server_pods(lab, set.client(i), i, NS, "loyalty-accrual", 2, &[42]).await);
        export(set.client(i), NS, "loyalty-accrual", None).await;
    }
    let si = wait_import(
        set.client(NORTH),
        NS,
        "loyalty-accrual",
        "import with ips",
        |si| si.spec.ips.as_ref().is_some_and(|ips| !ips.is_empty()),
    )
    .await;
    // The derived Service kube-proxy programs holds that ClusterSetIP.
    let derived = si
        .metadata
        .annotations
        .as_ref()
        .and_then(|a| a.get("multicluster.kubernetes.io/derived-service"))
        .expect("the import names its derived Service")
        .clone();
    let svc = Api::<Service>::namespaced(set.client(NORTH).clone(), NS)
        .get(&derived)
        .await
        .unwrap_or_else(|e| panic!("derived Service {derived}: {e}"));
    let vip = svc.spec.and_then(|s| s.cluster_ip).unwrap_or_default();
    assert_eq!(si.spec.ips.as_deref(), Some(&[vip.clone()][..]));
    // kube-proxy finds the imported slices by the derived Service's name: one set per
    // exporting cluster carries it. The IP appears once the first member's export is
    // merged; the other member's slices can be written a moment later, so wait until
    // both sources have written, then assert that no other source has.
    let both = BTreeSet::from(["east".to_owned(), "west".to_owned()]);
    let sources = support::wait_watched(
        Api::<EndpointSlice>::namespaced(set.client(NORTH).clone(), NS),
        kube::runtime::watcher::Config::default()
            .labels(&format!("kubernetes.io/service-name={derived}")),
        &format!("north's slices of {derived} from east and west"),
        ROUTE_TIMEOUT,
        |slices| {
            let sources: BTreeSet<String> = slices
                .iter()
                .filter_map(|s| source_cluster(s).map(str::to_owned))
                .collect();
            sources.is_superset(&both).then_some(sources)
        },
    )
    .await;
    assert_eq!(sources, both);
    // Through DNS, from the client pod, to the Pods of both clusters, once north's
    // kube-proxy holds what north's agent wrote.
    settled(world, lab).await;
    // kube-proxy's informer can take in west's slice after the sync `settled` waited for
    // (seen once under load: 40 connections, east only): wait until north's rules send
    // the ClusterSetIP to every exported Pod, then count.
    let pod_ips: BTreeSet<String> = pods
        .iter()
        .filter_map(|p| p.split(' ').nth(1).map(str::to_owned))
        .collect();
    let vip_addr = SocketAddr::new(vip.parse().expect("the ClusterSetIP"), 42);
    lab.wait_kube_proxy_endpoints(NORTH, vip_addr, &pod_ips)
        .await;
    let answers = answers_once_routed(world, lab, NAME, 42, &pods, 40).await;
    let seen: BTreeSet<String> = answers.iter().cloned().collect();
    assert!(
        seen.is_subset(&pods),
        "answers {seen:?} not all from the exported Pods {pods:?}"
    );
    let clusters: BTreeSet<&str> = seen.iter().filter_map(|a| a.split(' ').next()).collect();
    assert_eq!(
        clusters,
        BTreeSet::from(["east", "west"]),
        "40 connections to {vip}:42 reached {seen:?}"
    );
    println!(
        "case 1: {NAME} -> {vip}: 40 connections reached {} pods in {clusters:?}",
        seen.len()
    );
}

/// Creates namespace `ns` everywhere, and in each of `(cluster, ports, listen)`: Service
/// `hello` with `ports` (name, port, targetPort) over one Pod listening on `listen`. Returns
/// each cluster's Pod answer, in the order given.
async fn hello_in(
    lab: &mut Lab,
    world: &World,
    ns: &str,
    clusters: &[(usize, Ports<'_>)],
) -> Vec<String> {
    world.set.namespace(ns).await;
    let mut answers = Vec::new();
    for (i, ports) in clusters {
        let client = world.set.client(*i);
        create_service(client, ns, &service("hello", "hello", ports)).await;
        // Every Pod listens on both test ports, so a connection sent to the wrong cluster
        // is answered (and caught) rather than refused.
        answers.extend(server_pods(lab, client, *i, ns, "hello", 1, &[42, 4242]).await);
    }
    answers
}

/// Asserts that all `answers` came from `only`.
fn assert_only(what: &str, answers: &[String], only: &str) {
    let wrong: Vec<&String> = answers.iter().filter(|a| *a != only).collect();
    assert!(
        wrong.is_empty(),
        "{what}: {} of {} answers not from {only}: {wrong:?}",
        wrong.len(),
        answers.len()
    );
}

/// The conformance connectivity cases (SPEC section 6, 17 and 19-21), from north's pod
/// through mcs-dns and north's kube-proxy.
async fn case_conformance_connectivity(lab: &mut Lab, world: &World) {
    let set = &world.set;
    let hello = |ns: &str| format!("hello.{ns}.svc.clusterset.local.");
    let tcp42: Ports<'_> = &[("tcp", 42, 42)];

    // 19: a Service in two clusters, exported from east only: only east's Pod answers.
    let ns = "conn-one";
    let pods = hello_in(lab, world, ns, &[(EAST, tcp42), (WEST, tcp42)]).await;
    export(set.client(EAST), ns, "hello", None).await;
    wait_import(set.client(NORTH), ns, "hello", "east's import", |_| true).await;
    settled(world, lab).await;
    let answers = answers_once_routed(
        world,
        lab,
        &hello(ns),
        42,
        &BTreeSet::from([pods[0].clone()]),
        10,
    )
    .await;
    assert_only("exported from east only", &answers, &pods[0]);
    println!(
        "case 19: 10 of 10 connections reached east's pod ({})",
        pods[0]
    );

    // 20: same port name, different numbers (west's `tcp` is 4242 -> 42); east exported
    // first, so its port 42 wins and port 42 goes to east only.
    let ns = "conn-port-number";
    let pods = hello_in(
        lab,
        world,
        ns,
        &[(EAST, tcp42), (WEST, &[("tcp", 4242, 42)])],
    )
    .await;
    export(set.client(EAST), ns, "hello", None).await;
    wait_import(set.client(NORTH), ns, "hello", "east's import", |_| true).await;
    conformance_pause().await;
    export(set.client(WEST), ns, "hello", None).await;
    wait_export_condition(set.client(WEST), ns, "hello", "Conflict", "True", None).await;
    wait_import(set.client(NORTH), ns, "hello", "import from both", |si| {
        clusters_of(si).len() == 2
    })
    .await;
    settled(world, lab).await;
    let answers = answers_once_routed(
        world,
        lab,
        &hello(ns),
        42,
        &BTreeSet::from([pods[0].clone()]),
        10,
    )
    .await;
    assert_only("port tcp/42 (east's number wins)", &answers, &pods[0]);
    println!("case 20: 10 of 10 connections to port 42 reached east's pod");

    // 21: different port names (east `tcp` 42, west `tcp2` 4242): each port reaches only
    // the cluster that exposes it.
    let ns = "conn-port-name";
    let pods = hello_in(
        lab,
        world,
        ns,
        &[(EAST, tcp42), (WEST, &[("tcp2", 4242, 4242)])],
    )
    .await;
    export(set.client(EAST), ns, "hello", None).await;
    wait_import(set.client(NORTH), ns, "hello", "east's import", |_| true).await;
    conformance_pause().await;
    export(set.client(WEST), ns, "hello", None).await;
    wait_import(
        set.client(NORTH),
        ns,
        "hello",
        "import with both ports",
        |si| si.spec.ports.len() == 2,
    )
    .await;
    let east = BTreeSet::from([pods[0].clone()]);
    let west = BTreeSet::from([pods[1].clone()]);
    let answers = answers_once_routed(world, lab, &hello(ns), 42, &east, 10).await;
    assert_only("port tcp/42", &answers, &pods[0]);
    let answers = answers_once_routed(world, lab, &hello(ns), 4242, &west, 10).await;
    assert_only("port tcp2/4242", &answers, &pods[1]);
    println!("case 21: port 42 -> east's pod only, port 4242 -> west's pod only (10 each)");

    // 17: a Service that is not exported: its ClusterSet name never answers (20 attempts).
    let ns = "conn-none";
    hello_in(lab, world, ns, &[(EAST, tcp42), (WEST, tcp42)]).await;
    let attempts = from_client_attempts(world, &hello(ns), 42, 20).await;
    let answered: Vec<&String> = attempts.iter().filter_map(|a| a.as_ref().ok()).collect();
    assert!(
        answered.is_empty(),
        "a Service nobody exported answered through its ClusterSet name: {answered:?}"
    );
    // Not because the client cannot reach mcs-dns: mcs-dns said the name does not exist.
    for a in &attempts {
        let e = a.as_ref().unwrap_err();
        assert!(
            e.contains("NXDomain"),
            "expected NXDOMAIN from mcs-dns: {e}"
        );
    }
    println!("case 17: 20 of 20 attempts to an unexported service got no answer");
}

/// `n` attempts from the client pod, each resolving `name` and connecting to `port`: each
/// attempt's answer, or why there was none.
async fn from_client_attempts(
    world: &World,
    name: &str,
    port: u16,
    n: usize,
) -> Vec<Result<String, String>> {
    let (ns, dns, name) = (world.client.netns.clone(), world.dns, name.to_owned());
    tokio::task::spawn_blocking(move || {
        netlab::in_netns(&ns, move || {
            (0..n)
                .map(|_| {
                    let ips = dns_a(dns, &name)?;
                    let ip = *ips.first().ok_or_else(|| format!("{name}: no A record"))?;
                    netlab::http_get_once(SocketAddr::new(IpAddr::V4(ip), port), REQUEST_TIMEOUT)
                })
                .collect()
        })
    })
    .await
    .expect("the client thread")
}

/// North's [`KubeResolver`], run on the lab's runtime (its watches reach the API server in
/// the lab) while the client layer that consumes it runs in a pod's namespace.
struct LabResolver {
    lab: tokio::runtime::Handle,
    inner: KubeResolver,
}

impl Resolve for LabResolver {
    fn resolve(&self, target: &Target) -> Resolution {
        let _lab = self.lab.enter();
        self.inner.resolve(target)
    }
}

/// What one request through the client layer gave: the endpoint it was served by
/// (`<cluster> <ip>`, from the layer's [`Served`]) and the answer body, or the error.
type Outcome = Result<(String, String), String>;

/// The `mcs-client` layer ([`McsLayer`] over [`Http`], north's locality, north's imports
/// through [`LabResolver`]) running on a thread in the client pod's namespace, so it dials
/// pod IPs from there. Each command is "send `n` requests to `url`".
struct PodClient {
    commands:
        tokio::sync::mpsc::Sender<(String, usize, tokio::sync::oneshot::Sender<Vec<Outcome>>)>,
}

impl PodClient {
    fn start(world: &World) -> PodClient {
        let resolver = LabResolver {
            lab: tokio::runtime::Handle::current(),
            inner: KubeResolver::new(world.set.client(NORTH).clone()),
        };
        let north = world.set.ids[NORTH].clone();
        let (commands, mut rx) = tokio::sync::mpsc::channel::<(
            String,
            usize,
            tokio::sync::oneshot::Sender<Vec<Outcome>>,
        )>(1);
        let ns = world.client.netns.clone();
        tokio::spawn(netlab::run_in_netns(&ns, move || async move {
            let builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .clone();
            let svc = McsLayer::builder(resolver, Locality::cluster(north))
                .request_timeout(REQUEST_TIMEOUT)
                .build()
                .layer(Http::new(builder));
            while let Some((url, n, reply)) = rx.recv().await {
                let mut out = Vec::with_capacity(n);
                for _ in 0..n {
                    let req = http::Request::get(url.as_str())
                        .body(Empty::<Bytes>::new())
                        .expect("a request");
                    let one = async {
                        let resp = svc.clone().oneshot(req).await.map_err(|e| e.to_string())?;
                        let served = resp
                            .extensions()
                            .get::<Served>()
                            .map(|s| format!("{} {}", s.cluster(), s.addr().ip()))
                            .ok_or("no Served extension")?;
                        let body = resp
                            .into_body()
                            .collect()
                            .await
                            .map_err(|e| e.to_string())?
                            .to_bytes();
                        Ok((served, String::from_utf8_lossy(&body).into_owned()))
                    };
                    out.push(one.await);
                }
                let _ = reply.send(out);
            }
        }));
        PodClient { commands }
    }

    async fn requests(&self, url: &str, n: usize) -> Vec<Outcome> {
        let (tx, rx) = tokio::sync::oneshot::channel();
        self.commands
            .send((url.to_owned(), n, tx))
            .await
            .expect("the pod client runs");
        rx.await.expect("the pod client answers")
    }
}

/// Issue 26, third case: the `mcs-client` layer inside north's client pod balances across
/// the Pods of east and west by their pod IPs (no VIP, no loopback), and fails over to west
/// when east's Pods go away.
async fn case_client_layer(lab: &mut Lab, world: &World) {
    const NS: &str = "lb";
    const URL: &str = "http://api.lb.svc.clusterset.local:42/";
    let set = &world.set;
    set.namespace(NS).await;
    let mut pods = BTreeSet::new();
    let mut east_pods = Vec::new();
    for i in [EAST, WEST] {
        create_service(
            set.client(i),
            NS,
            &service("api", "api", &[("tcp", 42, 42)]),
        )
        .await;
        let answers = server_pods(lab, set.client(i), i, NS, "api", 2, &[42]).await;
        if i == EAST {
            east_pods = answers.clone();
        }
        pods.extend(answers);
        export(set.client(i), NS, "api", None).await;
    }
    wait_import(set.client(NORTH), NS, "api", "import from both", |si| {
        clusters_of(si).len() == 2
    })
    .await;
    // North's imported slices hold all four Pods, ready.
    let want: BTreeSet<String> = pods
        .iter()
        .map(|a| a.split(' ').nth(1).unwrap().to_owned())
        .collect();
    wait_mcs_endpoints(
        set.client(NORTH),
        NS,
        "api",
        "all four Pods ready",
        |ready| *ready == want,
    )
    .await;

    let client = PodClient::start(world);
    let outcomes = client.requests(URL, 40).await;
    let mut seen = BTreeSet::new();
    for o in &outcomes {
        let (served, body) = o
            .as_ref()
            .unwrap_or_else(|e| panic!("through the layer: {e}"));
        // The answer comes from the very Pod IP the layer picked: no NAT on the way.
        assert_eq!(
            served, body,
            "the layer's endpoint and the Pod that answered"
        );
        assert!(
            pods.contains(body),
            "{body} is not an exported Pod of {pods:?}"
        );
        seen.insert(body.clone());
    }
    let clusters: BTreeSet<&str> = seen.iter().filter_map(|a| a.split(' ').next()).collect();
    assert_eq!(
        clusters,
        BTreeSet::from(["east", "west"]),
        "40 requests through the layer reached {seen:?}"
    );
    println!(
        "case 3: 40 requests through mcs-client from north's pod reached {} pods: {seen:?}",
        seen.len()
    );

    // East's Pods go away while requests keep flowing: first their sandboxes (veths and
    // namespaces removed, as when a node dies before the API server notices), then the
    // Deployment scales to 0 and north's imports follow. The client retries a request whose
    // connection could not be made on another endpoint (as many times as east has Pods, so
    // the last try is west's) and gives up connecting after CONNECT_TIMEOUT.
    let stop = Arc::new(AtomicBool::new(false));
    let log: ProbeLog = Default::default();
    let retries = Retries::On(east_pods.len() as u32);
    let (probe, layer) = probe_layer(world, URL, Arc::clone(&log), Arc::clone(&stop), retries);
    support::wait_for("the prober answered", ROUTE_TIMEOUT, || async {
        (!log.lock().unwrap().is_empty()).then_some(())
    })
    .await;
    let t0 = Instant::now();
    for a in &east_pods {
        lab.remove_pod(a.split(' ').nth(1).unwrap().parse().unwrap());
    }
    // Gone for real: their IPs no longer answer from north's pod.
    let (ns, gone) = (world.client.netns.clone(), east_pods.clone());
    let still = tokio::task::spawn_blocking(move || {
        netlab::in_netns(&ns, move || {
            gone.iter()
                .filter_map(|a| {
                    let ip: IpAddr = a.split(' ').nth(1)?.parse().ok()?;
                    netlab::http_get_once(SocketAddr::new(ip, 42), Duration::from_secs(1)).ok()
                })
                .collect::<Vec<_>>()
        })
    })
    .await
    .unwrap();
    assert!(still.is_empty(), "removed pods still answer: {still:?}");
    // North's imports still list east's Pods as ready, so the layer still picks them: those
    // requests cannot connect, and go to another endpoint. 50 requests go out so before
    // east's Deployment scales down.
    support::wait_for(
        "50 requests sent after the sandboxes went",
        ROUTE_TIMEOUT,
        || async { (answers_after(&log, t0) >= 50).then_some(()) },
    )
    .await;
    support::scale_deployment(set.client(EAST), NS, "api", 0).await;
    support::wait_ready_pods(set.client(EAST), NS, "app=api", 0).await;
    let west: BTreeSet<String> = pods
        .iter()
        .filter(|a| a.starts_with("west "))
        .cloned()
        .collect();
    let west_ips: BTreeSet<String> = west
        .iter()
        .map(|a| a.split(' ').nth(1).unwrap().to_owned())
        .collect();
    wait_mcs_endpoints(set.client(NORTH), NS, "api", "only west's Pods", |ready| {
        *ready == west_ips
    })
    .await;
    // Once north's imports say so and the layer has them, every request goes to west, and
    // succeeds.
    wait_layer_ready(&layer, NS, "api", &west_ips).await;
    let t_settled = Instant::now();
    support::wait_for(
        "50 answers after north's imports caught up",
        ROUTE_TIMEOUT,
        || async { (answers_after(&log, t_settled) >= 50).then_some(()) },
    )
    .await;
    stop.store(true, Ordering::Relaxed);
    probe.await.expect("the prober");
    let log = log.lock().unwrap();
    let after = log.iter().filter(|(at, _, _)| *at > t_settled).count();
    let late: Vec<&Result<String, String>> = log
        .iter()
        .filter(|(at, _, a)| *at > t_settled && !a.as_ref().is_ok_and(|a| west.contains(a)))
        .map(|(_, _, a)| a)
        .collect();
    assert!(
        late.is_empty(),
        "after north's imports held only west, {} requests did not reach west: {late:?}",
        late.len()
    );
    let during: Vec<&(Instant, Instant, Result<String, String>)> = log
        .iter()
        .filter(|(at, _, _)| *at > t0 && *at <= t_settled)
        .collect();
    // What may fail: a request already sent on a connection to an east Pod when its sandbox
    // went (or sent on it before the layer knew): it reached the wire, so it is not sent
    // again, and it times out. The prober sends one request at a time, so its pool holds at
    // most one connection per Pod, and a connection whose request timed out is closed: at
    // most one such failure per east Pod. Every other request is answered.
    let failures: Vec<&String> = during
        .iter()
        .filter_map(|(_, _, a)| a.as_ref().err())
        .collect();
    let east_ips: BTreeSet<String> = east_pods
        .iter()
        .map(|a| a.split(' ').nth(1).unwrap().to_owned())
        .collect();
    let timed_out_at: BTreeSet<String> = failures
        .iter()
        .filter(|e| e.contains("in cluster east: timed out after"))
        .filter_map(|e| {
            let endpoint = e.split(" failed at endpoint ").nth(1)?.split(' ').next()?;
            Some(endpoint.rsplit_once(':')?.0.to_owned())
        })
        .collect();
    assert!(
        failures.len() == timed_out_at.len() && timed_out_at.is_subset(&east_ips),
        "with retries on, a request fails only by timing out on a connection to an east Pod \
         it was sent on, at most one per Pod ({east_ips:?}); {} failed: {failures:#?}",
        failures.len()
    );
    let failed = failures.len();
    let last_failure = during
        .iter()
        .filter(|(_, _, a)| a.is_err())
        .map(|(_, end, _)| *end - t0)
        .max();
    let last_failure = last_failure.map_or("none".to_owned(), |d| format!("{d:.1?}"));
    println!(
        "case 3: east's pods went away: {} requests sent while north caught up ({:.1?}), \
         {failed} failed (the last completed {last_failure} after the sandboxes went); \
         then all {after} sent after reached west",
        during.len(),
        t_settled - t0,
    );
}

/// Waits (on a watch) until the ready addresses of the MCS EndpointSlices of `ns/name` in a
/// cluster satisfy `pred`.
async fn wait_mcs_endpoints(
    client: &Client,
    ns: &str,
    name: &str,
    what: &str,
    pred: impl Fn(&BTreeSet<String>) -> bool,
) {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    support::wait_watched(
        api,
        kube::runtime::watcher::Config::default()
            .labels(&format!("multicluster.kubernetes.io/service-name={name}")),
        &format!("imported endpoints of {ns}/{name}: {what}"),
        ROUTE_TIMEOUT,
        |slices| {
            let slices: Vec<EndpointSlice> = slices.iter().map(|s| (**s).clone()).collect();
            let ready: BTreeSet<String> = support::slice_endpoints(&slices)
                .into_iter()
                .filter(|(_, ready, _)| *ready)
                .map(|(a, _, _)| a)
                .collect();
            pred(&ready).then_some(())
        },
    )
    .await;
}

/// What a prober recorded per request: when it was sent, when it completed, and the answer
/// (`<cluster> <ip>`) or the error.
type ProbeLog = Arc<Mutex<Vec<(Instant, Instant, Result<String, String>)>>>;

/// Pace of each prober: one request every 5 ms at most (bounded traffic).
const PROBE_PACE: Duration = Duration::from_millis(5);
/// Hard bound on one prober's requests.
const PROBE_MAX: usize = 20_000;

/// Probes `addr` from the client pod through kube-proxy: a new connection per request,
/// until `stop` (or [`PROBE_MAX`] requests).
fn probe_kube_proxy(
    world: &World,
    addr: SocketAddr,
    log: ProbeLog,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<()> {
    let ns = world.client.netns.clone();
    tokio::task::spawn_blocking(move || {
        netlab::in_netns(&ns, move || {
            for _ in 0..PROBE_MAX {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                let start = Instant::now();
                let answer = netlab::http_get_once(addr, REQUEST_TIMEOUT);
                log.lock().unwrap().push((start, Instant::now(), answer));
                std::thread::sleep(PROBE_PACE);
            }
        })
    })
}

/// The layer a [`probe_layer`] sends through, kept so a test can wait on its view of the
/// endpoints ([`McsLayer::wait_for_endpoints`]).
type ProbeLayer = McsLayer<CloneBody>;

/// How a [`probe_layer`]'s client treats an endpoint that does not answer.
#[derive(Clone, Copy)]
enum Retries {
    /// No retry; connecting waits as long as the request timeout allows (the layer's
    /// defaults).
    Off,
    /// A request whose connection could not be made goes to another endpoint, up to this
    /// many times; connecting gives up after [`CONNECT_TIMEOUT`].
    On(u32),
}

/// How long a [`Retries::On`] prober waits for a connection to be made.
const CONNECT_TIMEOUT: Duration = Duration::from_millis(500);

/// Probes `url` from the client pod through the `mcs-client` layer (north's resolver),
/// until `stop` (or [`PROBE_MAX`] requests). Returns the prober and its layer.
fn probe_layer(
    world: &World,
    url: &'static str,
    log: ProbeLog,
    stop: Arc<AtomicBool>,
    retries: Retries,
) -> (tokio::task::JoinHandle<()>, ProbeLayer) {
    let resolver = LabResolver {
        lab: tokio::runtime::Handle::current(),
        inner: KubeResolver::new(world.set.client(NORTH).clone()),
    };
    let north = world.set.ids[NORTH].clone();
    let (max_retries, connect_timeout) = match retries {
        Retries::Off => (0, None),
        Retries::On(n) => (n, Some(CONNECT_TIMEOUT)),
    };
    let layer = McsLayer::builder(resolver, Locality::cluster(north))
        .request_timeout(REQUEST_TIMEOUT)
        .retry(Retry::new(CloneBody).max_retries(max_retries))
        .build();
    let probe_layer = layer.clone();
    let probe = tokio::spawn(netlab::run_in_netns(
        &world.client.netns,
        move || async move {
            let builder = hyper_util::client::legacy::Client::builder(TokioExecutor::new())
                .pool_timer(TokioTimer::new())
                .pool_idle_timeout(Duration::from_secs(30))
                .clone();
            let mut connector = hyper_util::client::legacy::connect::HttpConnector::new();
            connector.set_nodelay(true);
            connector.set_connect_timeout(connect_timeout);
            let svc = probe_layer.layer(Http::with_connector(
                builder,
                Tcp::from_connector(connector),
            ));
            let mut pace = tokio::time::interval(PROBE_PACE);
            pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
            for _ in 0..PROBE_MAX {
                if stop.load(Ordering::Relaxed) {
                    break;
                }
                pace.tick().await;
                let req = http::Request::get(url)
                    .body(Empty::<Bytes>::new())
                    .expect("a request");
                let start = Instant::now();
                let answer = async {
                    let resp = svc.clone().oneshot(req).await.map_err(|e| e.to_string())?;
                    let body = resp
                        .into_body()
                        .collect()
                        .await
                        .map_err(|e| e.to_string())?
                        .to_bytes();
                    Ok(String::from_utf8_lossy(&body).into_owned())
                }
                .await;
                log.lock().unwrap().push((start, Instant::now(), answer));
            }
        },
    ));
    (probe, layer)
}

/// Waits until `layer`, which balances `namespace/name:42` for a prober, holds exactly
/// `ready_ips` as its ready endpoints: the layer learns of a change through its own watch,
/// after the API server has it, so a request sent before then may still go to the old set.
async fn wait_layer_ready(
    layer: &ProbeLayer,
    namespace: &str,
    name: &str,
    ready_ips: &BTreeSet<String>,
) {
    let target = Target {
        service: mcs_core::name::ServiceRef::new(namespace, name).expect("a service name"),
        port: 42,
    };
    let caught_up = tokio::time::timeout(
        ROUTE_TIMEOUT,
        layer.wait_for_endpoints(&target, |eps| {
            let ready: BTreeSet<String> = eps
                .iter()
                .filter(|e| e.ready)
                .map(|e| e.addr.ip().to_string())
                .collect();
            ready == *ready_ips
        }),
    )
    .await;
    match caught_up {
        Ok(true) => {}
        Ok(false) => panic!("{target}: the prober's layer has no discovery for it"),
        Err(_) => panic!(
            "{target}: the prober's layer did not hold exactly {ready_ips:?} ready within \
             {ROUTE_TIMEOUT:?}; it holds {:?}",
            layer.endpoints(&target)
        ),
    }
}

/// How many requests in `log` were sent after `t`.
fn answers_after(log: &ProbeLog, t: Instant) -> usize {
    log.lock()
        .unwrap()
        .iter()
        .filter(|(at, _, _)| *at > t)
        .count()
}

/// p50 and p99 (nearest rank) of `v`, milliseconds.
fn percentiles(v: &[Duration]) -> (f64, f64) {
    let mut v: Vec<f64> = v.iter().map(|d| d.as_secs_f64() * 1e3).collect();
    v.sort_by(f64::total_cmp);
    let rank = |p: f64| v[((p * v.len() as f64).ceil() as usize).clamp(1, v.len()) - 1];
    (rank(0.50), rank(0.99))
}

/// Issue 26, fourth case: east's Pods of `loyalty-accrual` turn unready; how long after
/// that the last answer from east reaches north's client pod, through kube-proxy (the
/// ClusterSetIP) and through the client layer, probed side by side. Printed, not asserted;
/// what is asserted is that both stop reaching east once north's imports, kube-proxy's
/// rules and the layer's view of the endpoints have caught up, and that east comes back
/// when ready again.
async fn case_unready_east(world: &World, lab: &Lab) {
    const NS: &str = "loyalty";
    const NAME: &str = "loyalty-accrual.loyalty.svc.clusterset.local.";
    const URL: &str = "http://loyalty-accrual.loyalty.svc.clusterset.local:42/";
    const ROUNDS: usize = 5;
    let set = &world.set;
    let east = support::wait_ready_pods(set.client(EAST), NS, "app=loyalty-accrual", 2).await;
    let west = support::wait_ready_pods(set.client(WEST), NS, "app=loyalty-accrual", 2).await;
    let ips = |pods: &[k8s_openapi::api::core::v1::Pod]| -> BTreeSet<String> {
        pods.iter()
            .flat_map(support::pod_ips)
            .map(|ip| ip.to_string())
            .collect()
    };
    let (east_ips, west_ips) = (ips(&east), ips(&west));
    let all: BTreeSet<String> = east_ips.union(&west_ips).cloned().collect();
    let vip = {
        let (ns, dns) = (world.client.netns.clone(), world.dns);
        tokio::task::spawn_blocking(move || netlab::in_netns(&ns, move || dns_a(dns, NAME)))
            .await
            .unwrap()
            .unwrap_or_else(|e| panic!("{NAME}: {e}"))[0]
    };
    let vip = SocketAddr::new(IpAddr::V4(vip), 42);

    let (mut via_proxy, mut via_layer) = (Vec::new(), Vec::new());
    for round in 1..=ROUNDS {
        // Steady state: all four ready in north's imports, kube-proxy caught up.
        wait_mcs_endpoints(set.client(NORTH), NS, "loyalty-accrual", "all ready", |r| {
            *r == all
        })
        .await;
        settled(world, lab).await;
        lab.wait_kube_proxy_endpoints(NORTH, vip, &all).await;
        let stop = Arc::new(AtomicBool::new(false));
        let (proxy_log, layer_log): (ProbeLog, ProbeLog) = Default::default();
        let (layer_probe, layer) = probe_layer(
            world,
            URL,
            Arc::clone(&layer_log),
            Arc::clone(&stop),
            Retries::Off,
        );
        let probes = [
            probe_kube_proxy(world, vip, Arc::clone(&proxy_log), Arc::clone(&stop)),
            layer_probe,
        ];
        // Both probers reach east before the change (the layer has resolved).
        let from_east = |log: &ProbeLog| {
            log.lock()
                .unwrap()
                .iter()
                .any(|(_, _, a)| a.as_ref().is_ok_and(|a| a.starts_with("east ")))
        };
        support::wait_for("both probers answered by east", ROUTE_TIMEOUT, || async {
            (from_east(&proxy_log) && from_east(&layer_log)).then_some(())
        })
        .await;

        // East's Pods turn unready (their readiness probes fail).
        let t0 = Instant::now();
        for p in &east {
            support::set_pod_ready(
                set.client(EAST),
                NS,
                p.metadata.name.as_deref().unwrap(),
                false,
            )
            .await;
        }
        wait_mcs_endpoints(
            set.client(NORTH),
            NS,
            "loyalty-accrual",
            "only west ready",
            |r| *r == west_ips,
        )
        .await;
        settled(world, lab).await;
        // kube-proxy's rules, not only its metrics: it may not have received the change
        // yet, and then none is pending in them.
        lab.wait_kube_proxy_endpoints(NORTH, vip, &west_ips).await;
        // And the layer's own view, which follows north's imports through its watch.
        wait_layer_ready(&layer, NS, "loyalty-accrual", &west_ips).await;
        let t_settled = Instant::now();
        // Then 50 more answers on each path, none of them from east.
        support::wait_for(
            "50 answers per prober after settling",
            ROUTE_TIMEOUT,
            || async {
                (answers_after(&proxy_log, t_settled) >= 50
                    && answers_after(&layer_log, t_settled) >= 50)
                    .then_some(())
            },
        )
        .await;
        stop.store(true, Ordering::Relaxed);
        for p in probes {
            p.await.expect("a prober");
        }
        for (path, log, out) in [
            ("kube-proxy", &proxy_log, &mut via_proxy),
            ("mcs-client", &layer_log, &mut via_layer),
        ] {
            let log = log.lock().unwrap();
            let late: Vec<&Result<String, String>> = log
                .iter()
                .filter(|(at, _, a)| {
                    *at > t_settled && a.as_ref().is_ok_and(|a| a.starts_with("east "))
                })
                .map(|(_, _, a)| a)
                .collect();
            assert!(
                late.is_empty(),
                "round {round}, {path}: {} answers from east after north caught up: {late:?}",
                late.len()
            );
            let last_east = log
                .iter()
                .filter(|(at, _, a)| *at > t0 && a.as_ref().is_ok_and(|a| a.starts_with("east ")))
                .map(|(at, _, _)| *at)
                .max();
            let errors = log
                .iter()
                .filter(|(at, _, a)| *at > t0 && a.is_err())
                .count();
            let took = last_east.map_or(Duration::ZERO, |t| t - t0);
            println!(
                "case 4 round {round}: {path}: last answer from east {took:.1?} after unready \
                 ({} requests, {errors} errors after the change)",
                log.len()
            );
            out.push(took);
        }
        // East is ready again: both paths reach it again before the next round.
        for p in &east {
            support::set_pod_ready(
                set.client(EAST),
                NS,
                p.metadata.name.as_deref().unwrap(),
                true,
            )
            .await;
        }
    }
    let (p50, p99) = percentiles(&via_proxy);
    let (l50, l99) = percentiles(&via_layer);
    println!(
        "case 4: east unready -> last answer from east, {ROUNDS} rounds:\n  \
         through kube-proxy (ClusterSetIP): p50 {p50:.0} ms, p99 {p99:.0} ms\n  \
         through mcs-client (pod IPs):     p50 {l50:.0} ms, p99 {l99:.0} ms"
    );
}
