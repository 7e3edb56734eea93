//! The seed scenario: `loyalty-accrual` in `east` and `west`, a checkout in `north`.
//!
//! Namespace `loyalty`; Service `loyalty-accrual` (ClusterIP, port `grpc` 9443, targetPort
//! 9443) and a `multicluster.x-k8s.io/v1alpha1` ServiceExport beside it in `east` (3 pods)
//! and `west` (4 pods); every member imports it as one `ClusterSetIP` ServiceImport; a
//! checkout in `north` calls the gRPC method `loyalty.Accrual/Accrue` on
//! `loyalty-accrual.loyalty.svc.clusterset.local:9443`. The steps and what each checks:
//!
//! 1. the exports merge into north's import: Valid, no conflict, ClusterSetIP with port
//!    `grpc`, both clusters, a VIP from north's service CIDR, each cluster's endpoints;
//! 2. north's `clusterset.local` DNS server answers the VIP and one SRV record;
//! 3. the checkout in north spreads its calls over both clusters and every pod;
//! 4. a checkout in east keeps every call in east (local first);
//! 5. east's pods stop mid-run: no call fails (connect failures are retried on another
//!    endpoint); then east rolls out new pods and its checkout is local again;
//! 6. west's Service adds port `admin` 9444, which east's does not have: `PortConflict` on
//!    both exports, the import has both ports, and port 9444 goes only to west.
//!
//! The same steps run over two backends: in memory ([`run_in_memory`]: the
//! agent's planner over in-memory clusters, the DNS server fed from north's objects, the
//! client resolving from them) and on real API servers (`run_real`, feature `real`: the
//! `mcs-agent` and `mcs-dns` binaries, the Kubernetes resolver).

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::time::Instant;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use mcs_core::ClusterId;
use mcs_core::api::decode_yaml;
use mcs_core::api::v1alpha1;
use mcs_core::api::v1beta1::{ServiceExport, ServiceImport};
use mcs_core::discovery::Resolve;

use crate::checkout::{Checkout, HOST, StopAt, drive};
use crate::dns;
use crate::memory::Memory;
use crate::pods::{Network, Pod};
use crate::report::Report;

/// The namespace.
pub const NAMESPACE: &str = "loyalty";
/// The service.
pub const SERVICE: &str = "loyalty-accrual";
/// The `grpc` port.
pub const GRPC: u16 = 9443;
/// The `admin` port west adds in step 6.
pub const ADMIN: u16 = 9444;

/// The members: id, pod CIDR, service CIDR.
pub const CLUSTERS: [(&str, &str, &str); 3] = [
    ("east", "10.10.0.0/16", "10.110.0.0/16"),
    ("west", "10.20.0.0/16", "10.120.0.0/16"),
    ("north", "10.30.0.0/16", "10.130.0.0/16"),
];

/// The seed's Service.
pub const SEED_SERVICE: &str = r#"
apiVersion: v1
kind: Service
metadata: { name: loyalty-accrual, namespace: loyalty }
spec:
  type: ClusterIP
  selector: { app: loyalty-accrual }
  ports:
    - { name: grpc, protocol: TCP, port: 9443, targetPort: 9443 }
"#;

/// The seed's ServiceExport, as the seed writes it (`v1alpha1`).
pub const SEED_EXPORT: &str = r#"
apiVersion: multicluster.x-k8s.io/v1alpha1
kind: ServiceExport
metadata: { name: loyalty-accrual, namespace: loyalty }
"#;

/// A fault injected on purpose, to see the checks fail.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[non_exhaustive]
pub enum Fault {
    /// Every exporting cluster's imported EndpointSlices carry every port of the import:
    /// the merge's port routes are ignored, so a conflicting port is routed to both
    /// clusters (in memory only: applied to the agents' writes before DNS and the client
    /// see them).
    PortRoutedToEveryCluster,
}

/// How to run the scenario.
#[derive(Clone, Debug, Default)]
#[non_exhaustive]
pub struct Options {
    /// A fault to inject.
    pub fault: Option<Fault>,
}

impl Options {
    /// Injects `fault`.
    #[must_use]
    pub fn fault(mut self, fault: Fault) -> Self {
        self.fault = Some(fault);
        self
    }
}

/// Runs the scenario in memory: the agent's planner over in-memory clusters, the
/// `clusterset.local` DNS server on loopback fed from north's objects, pods and checkouts on
/// loopback.
pub async fn run_in_memory(options: &Options) -> Report {
    let started = Instant::now();
    println!("== mcs loyalty_accrual: the seed scenario, in memory ==");
    let mut report = Report::default();
    match Memory::start(options.fault).await {
        Ok(mut set) => {
            if let Err(e) = scenario(&mut set, &mut report).await {
                report.error = Some(e);
            }
        }
        Err(e) => report.error = Some(e),
    }
    report.elapsed = started.elapsed();
    report
}

/// Runs the scenario on three real API servers (mcs-kube's test harness), with an
/// `mcs-agent` process per cluster and `mcs-dns` for north. The report's error says how to
/// get missing binaries.
#[cfg(feature = "real")]
pub async fn run_real() -> Report {
    let started = Instant::now();
    println!("== mcs loyalty_accrual: the seed scenario on real API servers ==");
    let mut report = Report::default();
    let set = match crate::real::Binaries::find() {
        Ok(binaries) => crate::real::Real::start(&binaries).await,
        Err(e) => Err(e),
    };
    match set {
        Ok(mut set) => {
            if let Err(e) = scenario(&mut set, &mut report).await {
                report.error = Some(e);
            }
        }
        Err(e) => report.error = Some(e),
    }
    report.elapsed = started.elapsed();
    report
}

/// One member's view of the service: what the scenario checks.
#[derive(Clone, Debug, Default)]
pub(crate) struct View {
    /// The ServiceImport.
    pub(crate) import: Option<ServiceImport>,
    /// The ServiceExport, with its conditions.
    pub(crate) export: Option<ServiceExport>,
    /// The MCS EndpointSlices (`multicluster.kubernetes.io/service-name`).
    pub(crate) slices: Vec<EndpointSlice>,
}

/// A ClusterSet the scenario runs on.
#[allow(async_fn_in_trait)]
pub(crate) trait ClusterSet {
    /// The resolver a checkout in a member uses.
    type Resolver: Resolve;

    /// Applies a Service in a member.
    async fn apply_service(&mut self, cluster: &ClusterId, service: Service) -> Result<(), String>;
    /// Applies a ServiceExport in a member.
    async fn apply_export(
        &mut self,
        cluster: &ClusterId,
        export: v1alpha1::ServiceExport,
    ) -> Result<(), String>;
    /// A pod of `loyalty-accrual` with this name is running and ready; returns its
    /// address: `ip` where the backend lets the scenario choose it, else the address the
    /// cluster gave the pod.
    async fn pod_up(
        &mut self,
        cluster: &ClusterId,
        name: &str,
        ip: Ipv4Addr,
    ) -> Result<Ipv4Addr, String>;
    /// A pod's readiness changed.
    async fn pod_ready(
        &mut self,
        cluster: &ClusterId,
        name: &str,
        ready: bool,
    ) -> Result<(), String>;
    /// A pod is gone.
    async fn pod_gone(&mut self, cluster: &ClusterId, name: &str) -> Result<(), String>;
    /// The member's view once `settled` holds (or the backend gives up waiting).
    async fn observe(
        &mut self,
        cluster: &ClusterId,
        settled: &dyn Fn(&View) -> bool,
    ) -> Result<View, String>;
    /// The resolver for a checkout in `cluster`.
    fn resolver(&self, cluster: &ClusterId) -> Self::Resolver;
    /// How long to wait for a change to reach a checkout's balancer before calling it
    /// missing (a bound on waiting for an event, not a check).
    fn settle(&self) -> std::time::Duration;
    /// North's `clusterset.local` DNS server.
    fn dns(&self) -> SocketAddr;
    /// How the pods' addresses are reached.
    fn network(&self) -> &Network;
}

/// The scenario's steps over any backend.
pub(crate) async fn scenario<S: ClusterSet>(
    set: &mut S,
    report: &mut Report,
) -> Result<(), String> {
    let id = |name: &str| ClusterId::new(name).map_err(|e| e.to_string());
    let (east, west, north) = (id("east")?, id("west")?, id("north")?);
    let seed_service: Service = decode_yaml(SEED_SERVICE).map_err(|e| e.to_string())?;
    let seed_export: v1alpha1::ServiceExport =
        decode_yaml(SEED_EXPORT).map_err(|e| e.to_string())?;

    println!(
        "\n-- 1. The seed: Service {SERVICE} (ClusterIP, grpc {GRPC}) and a v1alpha1 ServiceExport in east and west --"
    );
    let mut east_pods = start_pods(set, &east, [10, 10, 0], 3).await?;
    let west_pods = start_pods(set, &west, [10, 20, 0], 4).await?;
    for pod in east_pods.iter().chain(&west_pods) {
        println!(
            "   pod {:<20} {:<5} {} (listening on {})",
            pod.name, pod.cluster, pod.ip, pod.listeners[0].1
        );
    }
    for cluster in [&east, &west] {
        set.apply_service(cluster, seed_service.clone()).await?;
        set.apply_export(cluster, seed_export.clone()).await?;
    }
    let east_ips = ips(&east_pods);
    let west_ips = ips(&west_pods);
    let north_view = set
        .observe(&north, &|v| {
            clusters(v) == ["east", "west"]
                && vip(v).is_some()
                && ready_endpoints(v, "grpc")
                    == endpoints_of(&[("east", &east_ips), ("west", &west_ips)])
        })
        .await?;
    let east_view = set
        .observe(&east, &|v| condition(v, "Conflict").is_some())
        .await?;
    let west_view = set
        .observe(&west, &|v| condition(v, "Conflict").is_some())
        .await?;
    if let Some(import) = &north_view.import {
        println!("   north's ServiceImport, as the agent wrote it:");
        print_yaml(import);
    }
    for (name, view) in [("east", &east_view), ("west", &west_view)] {
        for t in ["Valid", "Ready", "Conflict"] {
            let (status, reason) = condition(view, t).unwrap_or_default();
            println!("   ServiceExport in {name}: {t}={status} ({reason})");
        }
    }
    report.check(
        "the exports are Valid in east and west",
        [&east_view, &west_view]
            .iter()
            .all(|v| condition(v, "Valid") == Some(("True".into(), "Valid".into()))),
    );
    report.check(
        "the exports agree: Conflict=False (NoConflicts) on both",
        [&east_view, &west_view]
            .iter()
            .all(|v| condition(v, "Conflict") == Some(("False".into(), "NoConflicts".into()))),
    );
    report.check(
        "north imports one ClusterSetIP service with port grpc/TCP/9443",
        import_type(&north_view).as_deref() == Some("ClusterSetIP")
            && ports(&north_view) == [("grpc".to_owned(), "TCP".to_owned(), GRPC)],
    );
    report.check(
        "north's import lists the clusters east and west",
        clusters(&north_view) == ["east", "west"],
    );
    let north_vip = vip(&north_view);
    report.check(
        format!(
            "north's import has a VIP from north's service CIDR 10.130.0.0/16 ({})",
            north_vip.map_or("none".to_owned(), |ip| ip.to_string())
        ),
        north_vip.is_some_and(|ip| matches!(ip, IpAddr::V4(v4) if v4.octets()[..2] == [10, 130])),
    );
    let split = ready_endpoints(&north_view, "grpc");
    report.check(
        format!(
            "north's imported EndpointSlices: east's 3 pods and west's 4, each from its cluster ({})",
            describe(&split)
        ),
        split == endpoints_of(&[("east", &east_ips), ("west", &west_ips)]),
    );

    println!("\n-- 2. DNS: north's clusterset.local server --");
    let dns_server = set.dns();
    let answered = dns::addresses(dns_server, &format!("{HOST}.")).await?;
    let srv = dns::srv(dns_server, &format!("{HOST}.")).await?;
    println!("   {dns_server}: A {HOST} -> {answered:?}");
    println!("   {dns_server}: SRV {HOST} -> {srv:?}");
    report.check(
        "DNS answers north's VIP for loyalty-accrual.loyalty.svc.clusterset.local",
        north_vip.is_some() && answered == north_vip.into_iter().collect::<Vec<_>>(),
    );
    report.check(
        "DNS answers one SRV record, port 9443, naming the service",
        srv == [(GRPC, format!("{HOST}."))],
    );

    let network = set.network().clone();
    let north_checkout = Checkout::new(&north, set.resolver(&north), &network);
    let east_checkout = Checkout::new(&east, set.resolver(&east), &network);

    println!("\n-- 3. Checkout in north (no loyalty-accrual pods there): 3000 Accrue calls --");
    let tally = drive(&north_checkout, GRPC, 3000, 32, "north", None).await;
    tally.print();
    let east_share = tally.all.count("east") as f64 / tally.all.total.max(1) as f64;
    report.check("north: no call failed", tally.failed == 0);
    report.check(
        format!(
            "north: both clusters answer, in proportion to their pods (east {:.0} % for 3 of 7 pods)",
            east_share * 100.0
        ),
        (0.25..=0.60).contains(&east_share),
    );
    report.check(
        "north: every pod answered",
        tally.by_pod.len() == east_pods.len() + west_pods.len(),
    );

    println!("\n-- 4. Checkout in east: local cluster first, 2000 calls --");
    let tally = drive(&east_checkout, GRPC, 2000, 32, "east", None).await;
    tally.print();
    report.check("east: no call failed", tally.failed == 0);
    report.check(
        "east: every call answered in east",
        tally.all.count("east") == 2000,
    );

    println!("\n-- 5. East's pods stop mid-run (discovery still lists them): 6000 calls --");
    let stop = StopAt {
        after: 1500,
        pods: std::mem::take(&mut east_pods),
    };
    let stopped: Vec<String> = stop.pods.iter().map(|p| p.name.clone()).collect();
    let tally = drive(&east_checkout, GRPC, 6000, 32, "east", Some(stop)).await;
    tally.print();
    println!(
        "   before the stop {} calls, during {} ({} retried), after {} ({} in west)",
        tally.before.total,
        tally.during.total,
        tally.during.retried,
        tally.after.total,
        tally.after.count("west")
    );
    report.check("failover: no call failed", tally.failed == 0);
    report.check(
        "failover: before the stop, east answered everything",
        tally.before.total > 0 && tally.before.count("east") == tally.before.total,
    );
    report.check(
        "failover: after the stop, west answered everything",
        tally.after.total > 0 && tally.after.count("west") == tally.after.total,
    );
    report.check(
        "failover: calls that reached a stopped pod were retried on another endpoint",
        tally.during.retried + tally.after.retried > 0,
    );

    println!("   east's kubelet reports the pods unready; a rollout replaces them (new pod IPs)");
    for name in &stopped {
        set.pod_ready(&east, name, false).await?;
    }
    for name in &stopped {
        set.pod_gone(&east, name).await?;
    }
    let new_east = start_pods(set, &east, [10, 10, 1], 3).await?;
    let new_ips = ips(&new_east);
    let east_view = set
        .observe(&east, &|v| {
            ready_endpoints(v, "grpc") == endpoints_of(&[("east", &new_ips), ("west", &west_ips)])
        })
        .await?;
    report.check(
        "rollout: east imports its new pods and none of the old ones",
        ready_endpoints(&east_view, "grpc")
            == endpoints_of(&[("east", &new_ips), ("west", &west_ips)]),
    );
    // The imported slices reach the checkout's balancer through its discovery task: wait
    // for that event, so that the calls below test local-first, not the propagation.
    let expected = endpoints_of(&[("east", &new_ips), ("west", &west_ips)]);
    let balanced = tokio::time::timeout(
        set.settle(),
        east_checkout.wait_for_endpoints(GRPC, |endpoints| balanced(endpoints) == expected),
    )
    .await
    .unwrap_or(false);
    report.check(
        "rollout: east's checkout balances over east's new pods and west's",
        balanced,
    );
    let tally = drive(&east_checkout, GRPC, 1000, 16, "east", None).await;
    tally.print();
    report.check(
        "rollout: east's checkout is local again, no call failed",
        tally.failed == 0 && tally.all.count("east") == 1000,
    );

    println!(
        "\n-- 6. West's Service adds port admin {ADMIN}; east's does not (east's pods listen on it anyway) --"
    );
    let mut west_service = seed_service.clone();
    if let Some(ports) = west_service.spec.as_mut().and_then(|s| s.ports.as_mut()) {
        let mut admin = ports[0].clone();
        admin.name = Some("admin".into());
        admin.port = i32::from(ADMIN);
        admin.target_port =
            Some(k8s_openapi::apimachinery::pkg::util::intstr::IntOrString::Int(i32::from(ADMIN)));
        ports.push(admin);
    }
    set.apply_service(&west, west_service).await?;
    let north_view = set
        .observe(&north, &|v| {
            ports(v).len() == 2 && !ready_endpoints(v, "admin").is_empty()
        })
        .await?;
    let east_view = set
        .observe(&east, &|v| {
            condition(v, "Conflict").is_some_and(|(s, _)| s == "True")
                && !ready_endpoints(v, "admin").is_empty()
        })
        .await?;
    let west_view = set
        .observe(&west, &|v| {
            condition(v, "Conflict").is_some_and(|(s, _)| s == "True")
        })
        .await?;
    if let Some(import) = &north_view.import {
        println!("   north's ServiceImport now:");
        print_yaml(&import.spec);
    }
    for (name, view) in [("east", &east_view), ("west", &west_view)] {
        let (status, reason) = condition(view, "Conflict").unwrap_or_default();
        println!("   ServiceExport in {name}: Conflict={status} ({reason})");
    }
    report.check(
        "conflict: PortConflict on the exports of both east and west",
        [&east_view, &west_view]
            .iter()
            .all(|v| condition(v, "Conflict") == Some(("True".into(), "PortConflict".into()))),
    );
    report.check(
        "conflict: north's import has the union of the ports (admin 9444, grpc 9443)",
        ports(&north_view)
            == [
                ("admin".to_owned(), "TCP".to_owned(), ADMIN),
                ("grpc".to_owned(), "TCP".to_owned(), GRPC),
            ],
    );
    let admin = ready_endpoints(&north_view, "admin");
    report.check(
        format!(
            "conflict: north's imported slices route port admin to west only, as the merge does ({})",
            describe(&admin)
        ),
        admin == endpoints_of(&[("west", &west_ips)]),
    );
    report.check(
        "conflict: north's VIP is unchanged",
        vip(&north_view) == north_vip,
    );
    let srv = dns::srv(dns_server, &format!("{HOST}.")).await?;
    report.check(
        "conflict: DNS answers an SRV record for each port (9443, 9444)",
        srv == [(GRPC, format!("{HOST}.")), (ADMIN, format!("{HOST}."))],
    );
    let tally = drive(&east_checkout, ADMIN, 500, 8, "east", None).await;
    tally.print();
    report.check(
        "conflict: east's checkout calls to port 9444 are all answered in west",
        tally.failed == 0 && tally.all.count("west") == 500,
    );

    for pod in new_east.into_iter().chain(west_pods) {
        pod.stop().await;
    }
    Ok(())
}

/// Starts `n` pods in `cluster` (addresses `<net>.1` to `<net>.n` where the backend lets
/// the scenario choose).
async fn start_pods<S: ClusterSet>(
    set: &mut S,
    cluster: &ClusterId,
    net: [u8; 3],
    n: u8,
) -> Result<Vec<Pod>, String> {
    let mut pods = Vec::new();
    for i in 1..=n {
        let proposed = Ipv4Addr::new(net[0], net[1], net[2], i);
        let name = format!("{SERVICE}-{}-{i}", net[2]);
        // The pod's containers start once it has its address (a real cluster's may be
        // another than the one proposed), long before the pod's endpoint has travelled
        // through the EndpointSlice, the agents and a checkout's resolver.
        let ip = set.pod_up(cluster, &name, proposed).await?;
        let pod = Pod::start(set.network(), cluster.as_str(), &name, ip, &[GRPC, ADMIN]).await?;
        pods.push(pod);
    }
    Ok(pods)
}

fn ips(pods: &[Pod]) -> Vec<Ipv4Addr> {
    pods.iter().map(|p| p.ip).collect()
}

/// `cluster -> ready addresses`, sorted.
type Split = BTreeMap<String, Vec<String>>;

fn endpoints_of(clusters: &[(&str, &Vec<Ipv4Addr>)]) -> Split {
    clusters
        .iter()
        .map(|(c, ips)| {
            let mut ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
            ips.sort();
            ((*c).to_owned(), ips)
        })
        .collect()
}

/// The ready addresses of the view's MCS slices that carry port `port_name`, by source
/// cluster.
fn ready_endpoints(view: &View, port_name: &str) -> Split {
    let mut split = Split::new();
    for slice in &view.slices {
        let Some(cluster) = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get(mcs_core::api::LABEL_SOURCE_CLUSTER))
        else {
            continue;
        };
        let has_port = slice
            .ports
            .iter()
            .flatten()
            .any(|p| p.name.as_deref() == Some(port_name));
        if !has_port {
            continue;
        }
        let ready = slice
            .endpoints
            .iter()
            .filter(|e| e.conditions.as_ref().and_then(|c| c.ready).unwrap_or(true))
            .flat_map(|e| e.addresses.clone());
        split.entry(cluster.clone()).or_default().extend(ready);
    }
    split.retain(|_, ips| !ips.is_empty());
    for ips in split.values_mut() {
        ips.sort();
    }
    split
}

/// The ready endpoints a checkout's balancer has, by cluster (the same shape as
/// [`ready_endpoints`]).
fn balanced(endpoints: &[mcs_core::discovery::Endpoint]) -> Split {
    let mut split = Split::new();
    for endpoint in endpoints.iter().filter(|e| e.ready) {
        split
            .entry(endpoint.cluster.as_str().to_owned())
            .or_default()
            .push(endpoint.addr.ip().to_string());
    }
    for ips in split.values_mut() {
        ips.sort();
    }
    split
}

fn describe(split: &Split) -> String {
    let parts: Vec<String> = split
        .iter()
        .map(|(c, ips)| format!("{c}: {}", ips.len()))
        .collect();
    if parts.is_empty() {
        "none".to_owned()
    } else {
        parts.join(", ")
    }
}

fn condition(view: &View, type_: &str) -> Option<(String, String)> {
    view.export
        .as_ref()?
        .status
        .as_ref()?
        .conditions
        .as_ref()?
        .iter()
        .find(|c| c.type_ == type_)
        .map(|c| (c.status.clone(), c.reason.clone()))
}

fn import_type(view: &View) -> Option<String> {
    view.import
        .as_ref()
        .map(|i| i.spec.type_.as_str().to_owned())
}

fn clusters(view: &View) -> Vec<String> {
    view.import
        .as_ref()
        .and_then(|i| i.status.as_ref())
        .and_then(|s| s.clusters.as_ref())
        .map(|c| c.iter().map(|c| c.cluster.clone()).collect())
        .unwrap_or_default()
}

/// `(name, protocol, port)` of the import's ports, sorted.
fn ports(view: &View) -> Vec<(String, String, u16)> {
    let mut ports: Vec<_> = view
        .import
        .iter()
        .flat_map(|i| &i.spec.ports)
        .map(|p| {
            (
                p.name.clone().unwrap_or_default(),
                p.protocol_or_default().as_str().to_owned(),
                u16::try_from(p.port).unwrap_or(0),
            )
        })
        .collect();
    ports.sort();
    ports
}

fn vip(view: &View) -> Option<IpAddr> {
    let ips = view.import.as_ref()?.spec.ips.as_ref()?;
    match ips.as_slice() {
        [one] => one.parse().ok(),
        _ => None,
    }
}

fn print_yaml<T: serde::Serialize>(value: &T) {
    let mut value = serde_json::to_value(value).unwrap_or_default();
    if let Some(meta) = value.get_mut("metadata").and_then(|m| m.as_object_mut()) {
        for noisy in ["managedFields", "resourceVersion", "uid", "generation"] {
            meta.remove(noisy);
        }
    }
    let text = serde_saphyr::to_string(&value).unwrap_or_default();
    for line in text.lines() {
        println!("      {line}");
    }
}
