//! DNS cases 22, 23 and 25-27 end to end on real Pods: StatefulSets run by kwok in two
//! clusters, their EndpointSlices from kube-controller-manager, the agents' imports and
//! slices in a third cluster, and that cluster's `mcs-dns`, queried with `dig`. Then
//! readiness changes and scaling while the headless name is asked all along: no
//! answer may fail or come back empty while a ready endpoint exists.

use mcs_testkit as support;
use mcs_testkit::clusterset;

use std::net::SocketAddr;
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use clusterset::*;
use hickory_resolver::proto::op::ResponseCode;
use hickory_resolver::proto::rr::RecordType;
use mcs_kube::dns::{DnsConfig, DnsServer};

const NS: &str = "mcs-dns";
const WEB: &str = "web.mcs-dns.svc.clusterset.local.";

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

/// The IPs of the Running, Ready Pods of StatefulSet `web` once there are `n`, as text,
/// sorted like `dig +short` output.
async fn web_ips(client: &kube::Client, n: usize) -> Vec<String> {
    let pods = support::wait_ready_pods(client, NS, "app=web", n).await;
    let mut ips: Vec<String> = pods
        .iter()
        .flat_map(support::pod_ips)
        .map(|ip| ip.to_string())
        .collect();
    ips.sort();
    ips
}

fn sorted(mut v: Vec<String>) -> Vec<String> {
    v.sort();
    v
}

/// Asks `server` for the A records of the headless service every 2 ms (a steady load that
/// leaves the 2 cores to the clusters) until `stop`, and returns how many questions it
/// asked and every answer that was not NOERROR with at least one address.
fn ask_all_along(
    server: SocketAddr,
    stop: Arc<AtomicBool>,
) -> tokio::task::JoinHandle<(usize, Vec<String>)> {
    tokio::spawn(async move {
        let (mut asked, mut bad) = (0, Vec::new());
        let mut pace = tokio::time::interval(std::time::Duration::from_millis(2));
        pace.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        while !stop.load(Ordering::Relaxed) {
            pace.tick().await;
            let m = support::dns_query(server, WEB, RecordType::A).await;
            asked += 1;
            let addrs = support::answer_addresses(&m);
            if m.metadata.response_code != ResponseCode::NoError || addrs.is_empty() {
                bad.push(format!("{:?} {addrs:?}", m.metadata.response_code));
            }
        }
        (asked, bad)
    })
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn dns_answers_what_the_agents_imported() {
    let set = ClusterSet::start_with_pods(&["east", "west", "north"]).await;
    set.namespace(NS).await;
    let ports = [("tcp", 42, "TCP")];
    for i in [0, 1] {
        // A StatefulSet behind a headless Service: the Pods get hostnames, kwok gives them
        // IPs from each cluster's own pod CIDR.
        support::create(
            set.client(i),
            NS,
            &support::service("web", "web", &ports, true),
        )
        .await;
        support::create(
            set.client(i),
            NS,
            &support::statefulset("web", "web", 1, &ports),
        )
        .await;
        export(set.client(i), NS, "web", None).await;
    }
    let east_ip = web_ips(set.client(0), 1).await;
    let west_ip = web_ips(set.client(1), 1).await;
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
    let a = support::wait_for("A record", IMPORT_TIMEOUT, || async {
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
    let both = sorted([east_ip.clone(), west_ip.clone()].concat());
    support::wait_for("headless A from both clusters", SLICE_TIMEOUT, || async {
        (dig(addr, &["web.mcs-dns.svc.clusterset.local", "A"]) == both).then_some(())
    })
    .await;
    // Case 26: the per-endpoint name (the Pod's hostname) carries the source cluster.
    assert_eq!(
        dig(addr, &["web-0.east.web.mcs-dns.svc.clusterset.local", "A"]),
        east_ip
    );
    assert_eq!(
        dig(addr, &["web-0.west.web.mcs-dns.svc.clusterset.local", "A"]),
        west_ip
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

    // From here on the headless name is asked all along: east's web-0 stays ready
    // throughout, so every answer must have addresses.
    let done = Arc::new(AtomicBool::new(false));
    let load = ask_all_along(addr, Arc::clone(&done));

    // West's Pod turns unready (its readiness probe fails): it leaves north's DNS ...
    support::set_pod_ready(set.client(1), NS, "web-0", false).await;
    support::wait_for("unready endpoint gone from DNS", SLICE_TIMEOUT, || async {
        (dig(addr, &["web.mcs-dns.svc.clusterset.local", "A"]) == east_ip).then_some(())
    })
    .await;
    // ... and comes back when it is ready again.
    support::set_pod_ready(set.client(1), NS, "web-0", true).await;
    support::wait_for("ready endpoint back in DNS", SLICE_TIMEOUT, || async {
        (dig(addr, &["web.mcs-dns.svc.clusterset.local", "A"]) == both).then_some(())
    })
    .await;

    // East scales up to 3: web-1 and web-2 appear, each with its per-endpoint name.
    support::scale_statefulset(set.client(0), NS, "web", 3).await;
    let east3 = web_ips(set.client(0), 3).await;
    let all = sorted([east3.clone(), west_ip.clone()].concat());
    support::wait_for("3 + 1 endpoints in DNS", SLICE_TIMEOUT, || async {
        (dig(addr, &["web.mcs-dns.svc.clusterset.local", "A"]) == all).then_some(())
    })
    .await;
    let per_pod: Vec<String> = ["web-0", "web-1", "web-2"]
        .iter()
        .flat_map(|h| {
            dig(
                addr,
                &[&format!("{h}.east.web.mcs-dns.svc.clusterset.local"), "A"],
            )
        })
        .collect();
    assert_eq!(sorted(per_pod), east3);
    // Down to 1 again: the names of web-1 and web-2 go.
    support::scale_statefulset(set.client(0), NS, "web", 1).await;
    web_ips(set.client(0), 1).await;
    support::wait_for("1 + 1 endpoints in DNS", SLICE_TIMEOUT, || async {
        (dig(addr, &["web.mcs-dns.svc.clusterset.local", "A"]) == both).then_some(())
    })
    .await;
    assert!(dig(addr, &["web-2.east.web.mcs-dns.svc.clusterset.local", "A"]).is_empty());

    done.store(true, Ordering::Relaxed);
    let (asked, bad) = load.await.unwrap();
    println!("{asked} questions during the readiness changes and scaling");
    assert!(asked > 0);
    assert!(
        bad.is_empty(),
        "{} of {asked} answers failed or were empty while an endpoint was ready: {:?}",
        bad.len(),
        &bad[..bad.len().min(10)]
    );
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}
