//! The scenario's ClusterSet in memory.
//!
//! The agents are [`mcs_kube::agent::plan::ClusterSetPlan`]: every member's agent, its state
//! and planner, over in-memory clusters. After every change the plan converges and each
//! member's ServiceImports and MCS EndpointSlices are published on a watch channel, which
//! the member's checkouts resolve from through
//! [`mcs_kube::resolver::SnapshotResolver`] (the Kubernetes resolver's code path), and which
//! feeds north's `clusterset.local` DNS server the way `mcs-dns` feeds it from its watches
//! (Namespaces, ServiceImports, labelled EndpointSlices into the zone data; a re-list
//! replaces what is gone).
//!
//! What kube-controller-manager's EndpointSlice controller does in a real cluster is done
//! here by [`endpoint_slice`]: one slice per Service with a selector, listing the pods it
//! selects with their readiness, on the Service's target ports.

use std::collections::{BTreeMap, BTreeSet};
use std::net::{Ipv4Addr, SocketAddr};
use std::time::Duration;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcs_core::ClusterId;
use mcs_core::api::v1alpha1;
use mcs_core::api::v1beta1::ClusterProperty;
use mcs_core::api::{CLUSTER_ID_PROPERTY, ClusterPropertySpec, LABEL_SERVICE_NAME};
use mcs_core::name::ServiceRef;
use mcs_kube::agent::plan::ClusterSetPlan;
use mcs_kube::dns::{DnsConfig, DnsServer, ZoneHandle};
use mcs_kube::resolver::{ImportedObjects, SnapshotResolver};
use tokio::sync::watch;

use crate::loyalty::{CLUSTERS, ClusterSet, Fault, NAMESPACE, SERVICE, View};
use crate::pods::Network;

/// The label the pods carry and the Service selects.
const APP: (&str, &str) = ("app", "loyalty-accrual");

struct PodObject {
    ip: Ipv4Addr,
    ready: bool,
}

/// The in-memory ClusterSet.
pub(crate) struct Memory {
    plan: ClusterSetPlan,
    pods: BTreeMap<ClusterId, BTreeMap<String, PodObject>>,
    published: BTreeMap<ClusterId, watch::Sender<ImportedObjects>>,
    north: ClusterId,
    zone: ZoneFeed,
    dns: SocketAddr,
    dns_task: tokio::task::JoinHandle<()>,
    network: Network,
    fault: Option<Fault>,
}

impl Drop for Memory {
    fn drop(&mut self) {
        self.dns_task.abort();
    }
}

impl Memory {
    /// The three members with namespace `loyalty`, and north's DNS server on loopback.
    pub(crate) async fn start(fault: Option<Fault>) -> Result<Self, String> {
        let start = "2026-05-01T09:00:00Z".parse().map_err(|e| format!("{e}"))?;
        let mut plan = ClusterSetPlan::new(start);
        let mut published = BTreeMap::new();
        let mut pods = BTreeMap::new();
        for (name, _pods, services) in CLUSTERS {
            let property = ClusterProperty::new(
                CLUSTER_ID_PROPERTY,
                ClusterPropertySpec { value: name.into() },
            );
            let id = plan
                .add_cluster(&property, services)
                .map_err(|e| e.to_string())?;
            plan.apply_namespace(&id, NAMESPACE)
                .map_err(|e| e.to_string())?;
            published.insert(id.clone(), watch::channel(ImportedObjects::default()).0);
            pods.insert(id, BTreeMap::new());
        }
        let server =
            DnsServer::bind(DnsConfig::default().listen(SocketAddr::from(([127, 0, 0, 1], 0))))
                .await
                .map_err(|e| e.to_string())?;
        let (dns, zone) = (server.local_addr(), server.zone());
        let dns_task = tokio::spawn(async move {
            if let Err(e) = server.serve(std::future::pending()).await {
                eprintln!("DNS server stopped: {e}");
            }
        });
        let mut memory = Self {
            plan,
            pods,
            published,
            north: ClusterId::new("north").map_err(|e| e.to_string())?,
            zone: ZoneFeed::new(zone),
            dns,
            dns_task,
            network: Network::default(),
            fault,
        };
        memory.sync()?;
        memory.zone.handle.mark_synced();
        Ok(memory)
    }

    /// Runs the agents to convergence and publishes every member's objects.
    fn sync(&mut self) -> Result<(), String> {
        self.plan.converge().map_err(|e| e.to_string())?;
        let service = service_ref()?;
        for (id, tx) in &self.published {
            let Some(cluster) = self.plan.cluster(id) else {
                continue;
            };
            let mut objects = ImportedObjects {
                imports: cluster.imports().cloned().collect(),
                slices: cluster
                    .slices()
                    .filter(|s| {
                        s.metadata
                            .labels
                            .as_ref()
                            .is_some_and(|l| l.contains_key(LABEL_SERVICE_NAME))
                    })
                    .cloned()
                    .collect(),
            };
            if self.fault == Some(Fault::PortRoutedToEveryCluster) {
                route_every_port_everywhere(&mut objects, &service);
            }
            if *id == self.north {
                let namespaces: Vec<String> = cluster.namespaces().map(str::to_owned).collect();
                self.zone.feed(&namespaces, &objects);
            }
            tx.send_replace(objects);
        }
        Ok(())
    }

    /// What kube-controller-manager would do after a change in `cluster`: its Services'
    /// EndpointSlices, from their selectors and the pods.
    fn endpoint_slices(&mut self, cluster: &ClusterId) -> Result<(), String> {
        let Some(objects) = self.plan.cluster(cluster) else {
            return Err(format!("no cluster {cluster}"));
        };
        let pods = self.pods.get(cluster);
        let slices: Vec<EndpointSlice> = objects
            .services()
            .filter_map(|s| endpoint_slice(s, pods?))
            .collect();
        for slice in slices {
            self.plan
                .apply_slice(cluster, slice)
                .map_err(|e| e.to_string())?;
        }
        Ok(())
    }

    /// Time passes between the user's actions (export creation times order the exports).
    fn tick(&mut self) {
        self.plan.advance(Duration::from_secs(1));
    }
}

impl ClusterSet for Memory {
    type Resolver = SnapshotResolver;

    async fn apply_service(&mut self, cluster: &ClusterId, service: Service) -> Result<(), String> {
        self.tick();
        self.plan
            .apply_service(cluster, service)
            .map_err(|e| e.to_string())?;
        self.endpoint_slices(cluster)
    }

    async fn apply_export(
        &mut self,
        cluster: &ClusterId,
        export: v1alpha1::ServiceExport,
    ) -> Result<(), String> {
        self.tick();
        self.plan
            .apply_export(cluster, export)
            .map_err(|e| e.to_string())
    }

    async fn pod_up(
        &mut self,
        cluster: &ClusterId,
        name: &str,
        ip: Ipv4Addr,
    ) -> Result<Ipv4Addr, String> {
        self.tick();
        self.pods
            .entry(cluster.clone())
            .or_default()
            .insert(name.to_owned(), PodObject { ip, ready: true });
        self.endpoint_slices(cluster)?;
        Ok(ip)
    }

    async fn pod_ready(
        &mut self,
        cluster: &ClusterId,
        name: &str,
        ready: bool,
    ) -> Result<(), String> {
        self.tick();
        let pod = self
            .pods
            .get_mut(cluster)
            .and_then(|p| p.get_mut(name))
            .ok_or_else(|| format!("no pod {name} in {cluster}"))?;
        pod.ready = ready;
        self.endpoint_slices(cluster)
    }

    async fn pod_gone(&mut self, cluster: &ClusterId, name: &str) -> Result<(), String> {
        self.tick();
        self.pods.get_mut(cluster).and_then(|p| p.remove(name));
        self.endpoint_slices(cluster)
    }

    async fn observe(
        &mut self,
        cluster: &ClusterId,
        _settled: &dyn Fn(&View) -> bool,
    ) -> Result<View, String> {
        // Nothing to wait for: the agents converge before the view is read.
        self.sync()?;
        let service = service_ref()?;
        let objects = self
            .published
            .get(cluster)
            .map(|tx| tx.borrow().clone())
            .unwrap_or_default();
        Ok(View {
            import: objects
                .imports
                .into_iter()
                .find(|i| i.metadata.name.as_deref() == Some(SERVICE)),
            export: self
                .plan
                .cluster(cluster)
                .and_then(|c| c.export(&service))
                .cloned(),
            slices: objects
                .slices
                .into_iter()
                .filter(|s| {
                    s.metadata
                        .labels
                        .as_ref()
                        .and_then(|l| l.get(LABEL_SERVICE_NAME))
                        .map(String::as_str)
                        == Some(SERVICE)
                })
                .collect(),
        })
    }

    fn resolver(&self, cluster: &ClusterId) -> SnapshotResolver {
        let rx = match self.published.get(cluster) {
            Some(tx) => tx.subscribe(),
            None => watch::channel(ImportedObjects::default()).1,
        };
        SnapshotResolver::new(rx)
    }

    fn settle(&self) -> Duration {
        // In-process channels: far more than a change needs to reach a task.
        Duration::from_secs(10)
    }

    fn dns(&self) -> SocketAddr {
        self.dns
    }

    fn network(&self) -> &Network {
        &self.network
    }
}

fn service_ref() -> Result<ServiceRef, String> {
    ServiceRef::new(NAMESPACE, SERVICE).map_err(|e| e.to_string())
}

/// The EndpointSlice kube-controller-manager keeps for `service`: the pods its selector
/// matches (here every pod carries `app: loyalty-accrual`), with their readiness, on the
/// Service's target ports. `None` for a Service without a selector (a derived one).
fn endpoint_slice(service: &Service, pods: &BTreeMap<String, PodObject>) -> Option<EndpointSlice> {
    let spec = service.spec.as_ref()?;
    let selector = spec.selector.as_ref()?;
    if selector.get(APP.0).map(String::as_str) != Some(APP.1) {
        return None;
    }
    let name = service.metadata.name.clone()?;
    let ports = spec
        .ports
        .iter()
        .flatten()
        .map(|p| EndpointPort {
            name: p.name.clone(),
            port: Some(match &p.target_port {
                Some(IntOrString::Int(port)) => *port,
                _ => p.port,
            }),
            protocol: p.protocol.clone().or_else(|| Some("TCP".into())),
            app_protocol: p.app_protocol.clone(),
        })
        .collect();
    Some(EndpointSlice {
        address_type: "IPv4".into(),
        metadata: ObjectMeta {
            name: Some(format!("{name}-k8s7x")),
            namespace: service.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/service-name".to_owned(), name),
                (
                    "endpointslice.kubernetes.io/managed-by".to_owned(),
                    "endpointslice-controller.k8s.io".to_owned(),
                ),
            ])),
            ..Default::default()
        },
        endpoints: pods
            .values()
            .map(|pod| Endpoint {
                addresses: vec![pod.ip.to_string()],
                conditions: Some(EndpointConditions {
                    ready: Some(pod.ready),
                    serving: Some(pod.ready),
                    terminating: Some(false),
                }),
                ..Default::default()
            })
            .collect(),
        ports: Some(ports),
    })
}

/// The fault: every imported slice of the service carries every port of its import, as an
/// agent that ignored the merge's port routes would write them.
fn route_every_port_everywhere(objects: &mut ImportedObjects, service: &ServiceRef) {
    let Some(import) = objects
        .imports
        .iter()
        .find(|i| i.metadata.name.as_deref() == Some(service.name.as_str()))
    else {
        return;
    };
    let ports: Vec<EndpointPort> = import
        .spec
        .ports
        .iter()
        .map(|p| EndpointPort {
            name: p.name.clone(),
            port: Some(p.port),
            protocol: Some(p.protocol_or_default().as_str().to_owned()),
            app_protocol: p.app_protocol.clone(),
        })
        .collect();
    for slice in &mut objects.slices {
        slice.ports = Some(ports.clone());
    }
}

/// Feeds a DNS server's zone as `mcs-dns` does from its watches: Namespaces, ServiceImports
/// and EndpointSlices labelled `multicluster.kubernetes.io/service-name`, each kind as a
/// re-list (what is gone is removed, the rest applied) under one write lock.
struct ZoneFeed {
    handle: ZoneHandle,
    namespaces: BTreeSet<String>,
    imports: BTreeSet<(String, String)>,
    slices: BTreeSet<(String, String)>,
}

impl ZoneFeed {
    fn new(handle: ZoneHandle) -> Self {
        Self {
            handle,
            namespaces: BTreeSet::new(),
            imports: BTreeSet::new(),
            slices: BTreeSet::new(),
        }
    }

    fn feed(&mut self, namespaces: &[String], objects: &ImportedObjects) {
        let key = |m: &ObjectMeta| {
            (
                m.namespace.clone().unwrap_or_default(),
                m.name.clone().unwrap_or_default(),
            )
        };
        let namespaces: BTreeSet<String> = namespaces.iter().cloned().collect();
        let imports: BTreeSet<_> = objects.imports.iter().map(|i| key(&i.metadata)).collect();
        let slices: BTreeSet<_> = objects.slices.iter().map(|s| key(&s.metadata)).collect();
        self.handle.update(|data| {
            for gone in self.namespaces.difference(&namespaces) {
                data.set_namespace(gone, false);
            }
            for ns in &namespaces {
                data.set_namespace(ns, true);
            }
            for (ns, name) in self.imports.difference(&imports) {
                data.remove_import(ns, name);
            }
            for import in &objects.imports {
                if let Err(e) = data.upsert_import(import) {
                    eprintln!("DNS: ignoring ServiceImport: {e}");
                }
            }
            for (ns, name) in self.slices.difference(&slices) {
                data.remove_slice(ns, name);
            }
            for slice in &objects.slices {
                if let Err(e) = data.upsert_slice(slice) {
                    let (ns, name) = key(&slice.metadata);
                    data.remove_slice(&ns, &name);
                    eprintln!("DNS: ignoring EndpointSlice: {e}");
                }
            }
        });
        self.namespaces = namespaces;
        self.imports = imports;
        self.slices = slices;
    }
}
