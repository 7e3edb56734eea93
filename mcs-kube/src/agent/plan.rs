//! The agent's decisions over in-memory clusters: what every member's `mcs-agent` would
//! write, computed without an API server.
//!
//! A [`ClusterSetPlan`] holds one in-memory object store per member cluster (Namespaces,
//! Services, ServiceExports, EndpointSlices, ServiceImports) and one agent state per member,
//! the same `State` the running agent keeps. [`ClusterSetPlan::converge`] runs every member's
//! agent as the controller does (its watches' view, the `mcs-core` merge, the planner in
//! `reconcile`, the objects of `desired`) and executes each plan into that member's store,
//! round after round, until no agent has anything left to write. The result is exactly what
//! the agents write into real clusters from the same objects: the `Valid`, `Ready` and
//! `Conflict` conditions of every ServiceExport, a ServiceImport in every member, the derived
//! ClusterIP Service of a `ClusterSetIP` import, and the imported MCS EndpointSlices.
//!
//! Two things a real cluster does are done here by the store, standing in for
//! kube-apiserver:
//!
//! - **ClusterIP allocation.** A Service that needs a cluster IP (one of the member's own,
//!   or the derived Service of a `ClusterSetIP` import, whose IPs become the import's
//!   `spec.ips`) gets one from the member's service CIDRs, as the API server's allocator
//!   does from `--service-cluster-ip-range`. This allocator hands out addresses in order
//!   from the start of each range, skipping the network address and the first host address
//!   (the API server gives that one to the `kubernetes` Service); the API server picks at
//!   random. Deleted Services give their addresses back. `ipFamilyPolicy` is honoured:
//!   `SingleStack` (the default) takes the first range's family, `PreferDualStack` every
//!   family configured, `RequireDualStack` fails without two.
//! - **Object bookkeeping.** Created objects get a `uid`, `creationTimestamp` (the plan's
//!   clock, [`ClusterSetPlan::advance`]) and `generation`; server-side applies replace the
//!   applier's fields and keep the rest (status, allocated IPs); status writes replace the
//!   status. Objects in a namespace the member does not have are refused, as the API server
//!   refuses them.
//!
//! The agent's writer copies a new derived Service's IPs into the import in the same pass;
//! here the next round's plan does it (the planner reads the derived Service's IPs), so the
//! end state is the same. What the EndpointSlice controller does in a real cluster (slices
//! for a Service's ready Pods) is the caller's: give each member the EndpointSlices it would
//! have. The agents read each other directly, as in the mesh topology (a hub carries the
//! same facts between them).
//!
//! ```
//! use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
//! use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
//! use mcs_core::api::{CLUSTER_ID_PROPERTY, ClusterPropertySpec, ServiceExportSpec};
//! use mcs_core::api::v1beta1::{ClusterProperty, ServiceExport};
//! use mcs_core::name::ServiceRef;
//! use mcs_kube::agent::plan::ClusterSetPlan;
//!
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! let mut set = ClusterSetPlan::new("2026-05-01T09:00:00Z".parse()?);
//! let mut ids = Vec::new();
//! for (name, cidr) in [("east", "10.101.0.0/16"), ("north", "10.103.0.0/16")] {
//!     let id = ClusterProperty::new(CLUSTER_ID_PROPERTY, ClusterPropertySpec { value: name.into() });
//!     let id = set.add_cluster(&id, cidr)?;
//!     set.apply_namespace(&id, "loyalty")?;
//!     ids.push(id);
//! }
//! let meta = ObjectMeta {
//!     name: Some("loyalty-accrual".into()),
//!     namespace: Some("loyalty".into()),
//!     ..Default::default()
//! };
//! let service = Service {
//!     metadata: meta.clone(),
//!     spec: Some(ServiceSpec {
//!         ports: Some(vec![ServicePort { name: Some("grpc".into()), port: 9443, ..Default::default() }]),
//!         ..Default::default()
//!     }),
//!     status: None,
//! };
//! set.apply_service(&ids[0], service)?;
//! set.apply_export(&ids[0], ServiceExport { metadata: meta, spec: ServiceExportSpec::default(), status: None })?;
//! set.converge()?;
//!
//! let svc = ServiceRef::new("loyalty", "loyalty-accrual")?;
//! let import = set.cluster(&ids[1]).and_then(|c| c.import(&svc)).expect("north imports it");
//! assert_eq!(import.spec.ips.as_deref(), Some(&["10.103.0.2".to_owned()][..]));
//! # Ok(()) }
//! ```

use std::collections::{BTreeMap, BTreeSet};
use std::net::IpAddr;
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::{Namespace, NamespaceStatus, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use kube::runtime::watcher::Event;
use mcs_core::ClusterId;
use mcs_core::api::v1beta1::{ClusterProperty, ServiceExport, ServiceImport};
use mcs_core::api::{CLUSTER_ID_PROPERTY, IpFamily, LABEL_SERVICE_NAME, ServiceExportStatus};
use mcs_core::cidr::{Cidr, CidrError};
use mcs_core::name::ServiceRef;

use super::desired::{
    self, LABEL_K8S_SERVICE_NAME, LABEL_MANAGED_BY, LABEL_SLICE_MANAGED_BY, MANAGED_BY,
};
use super::reconcile::{self, Plan};
use super::source::Fact;
use super::state::{Mode, Settings, State};

/// How many rounds [`ClusterSetPlan::converge`] runs before it calls the agents looping.
/// A change settles in three: plans and writes, derived IPs copied, statuses settled.
pub const MAX_ROUNDS: usize = 16;

/// Why a plan could not be made.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PlanError {
    /// The ClusterProperty is not the cluster id property.
    #[error(
        "ClusterProperty {name:?} is not the cluster id: the id comes from ClusterProperty {CLUSTER_ID_PROPERTY}"
    )]
    NotClusterIdProperty {
        /// The property's name.
        name: String,
    },
    /// The cluster id property's value is not a cluster id.
    #[error("ClusterProperty {CLUSTER_ID_PROPERTY} is not a usable cluster id: {source}")]
    ClusterId {
        /// Why (it names the value).
        #[source]
        source: mcs_core::cluster::ClusterIdError,
    },
    /// Two members with one id.
    #[error("cluster {cluster} is already a member")]
    DuplicateCluster {
        /// The id.
        cluster: ClusterId,
    },
    /// An operation named a cluster that is not a member.
    #[error("cluster {cluster} is not a member of this ClusterSet plan")]
    UnknownCluster {
        /// The id.
        cluster: ClusterId,
    },
    /// A service CIDR that cannot be parsed or used.
    #[error("cluster {cluster}: service CIDR {cidr:?} is invalid: {problem}")]
    ServiceCidr {
        /// The cluster.
        cluster: ClusterId,
        /// The CIDR as given.
        cidr: String,
        /// What is wrong.
        problem: String,
    },
    /// An object without a name or namespace.
    #[error("cluster {cluster}: {kind} without {field}")]
    Unnamed {
        /// The cluster.
        cluster: ClusterId,
        /// The object's kind.
        kind: &'static str,
        /// `metadata.name` or `metadata.namespace`.
        field: &'static str,
    },
    /// An object in a namespace the cluster does not have (the API server refuses it).
    #[error(
        "cluster {cluster}: {kind} {namespace}/{name} refused: namespace {namespace} not found"
    )]
    NoNamespace {
        /// The cluster.
        cluster: ClusterId,
        /// The object's kind.
        kind: &'static str,
        /// Its namespace.
        namespace: String,
        /// Its name.
        name: String,
    },
    /// A Service's cluster IP cannot be allocated.
    #[error("cluster {cluster}: Service {service}: {problem}")]
    ClusterIp {
        /// The cluster.
        cluster: ClusterId,
        /// `<namespace>/<name>` of the Service.
        service: String,
        /// What is wrong (range exhausted, address taken or outside the ranges, a family
        /// the cluster does not have).
        problem: String,
    },
    /// The agents still had writes to make after [`MAX_ROUNDS`] rounds: they would loop
    /// on their own writes.
    #[error("the agents did not converge in {rounds} rounds; still writing: {pending:?}")]
    NotConverged {
        /// Rounds run.
        rounds: usize,
        /// `<cluster>: <namespace>/<service>` still planning writes.
        pending: Vec<String>,
    },
}

/// What [`ClusterSetPlan::converge`] did.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
#[non_exhaustive]
pub struct Convergence {
    /// Rounds in which some agent wrote something (the last, quiet round not counted).
    pub rounds: usize,
    /// Writes the agents made: object applies, status writes and deletes.
    pub writes: usize,
}

/// Every member's in-memory objects and agent, planned together (see the [module
/// docs](self)).
pub struct ClusterSetPlan {
    now: Timestamp,
    /// Instants are only used by the agents' health checks, which never fail here.
    instant: Instant,
    clusters: BTreeMap<ClusterId, ClusterObjects>,
    agents: BTreeMap<ClusterId, State>,
}

impl std::fmt::Debug for ClusterSetPlan {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ClusterSetPlan")
            .field("now", &self.now)
            .field("clusters", &self.clusters.keys().collect::<Vec<_>>())
            .finish_non_exhaustive()
    }
}

impl ClusterSetPlan {
    /// An empty ClusterSet whose clock reads `now` (creation timestamps of new objects and
    /// the transition times of conditions).
    pub fn new(now: Timestamp) -> Self {
        Self {
            now,
            instant: Instant::now(),
            clusters: BTreeMap::new(),
            agents: BTreeMap::new(),
        }
    }

    /// The clock.
    pub fn now(&self) -> Timestamp {
        self.now
    }

    /// Moves the clock forward (export creation times decide which export wins a
    /// conflict, with one-second resolution as in Kubernetes).
    pub fn advance(&mut self, by: Duration) {
        let by = k8s_openapi::jiff::SignedDuration::try_from(by)
            .unwrap_or(k8s_openapi::jiff::SignedDuration::MAX);
        self.now = self.now.saturating_add(by).unwrap_or(self.now);
    }

    /// Adds a member whose id is the value of its ClusterProperty
    /// `cluster.clusterset.k8s.io`, with these service CIDRs (one range, or an IPv4 and an
    /// IPv6 range separated by a comma, as kube-apiserver's `--service-cluster-ip-range`).
    /// Every member's agent reads every member, the new one included.
    pub fn add_cluster(
        &mut self,
        property: &ClusterProperty,
        service_cidrs: &str,
    ) -> Result<ClusterId, PlanError> {
        let name = property.metadata.name.clone().unwrap_or_default();
        if name != CLUSTER_ID_PROPERTY {
            return Err(PlanError::NotClusterIdProperty { name });
        }
        let id = ClusterId::new(property.spec.value.clone())
            .map_err(|source| PlanError::ClusterId { source })?;
        if self.clusters.contains_key(&id) {
            return Err(PlanError::DuplicateCluster { cluster: id });
        }
        let cidrs = parse_cidrs(&id, service_cidrs)?;
        self.clusters
            .insert(id.clone(), ClusterObjects::new(id.clone(), cidrs));
        let ids: Vec<ClusterId> = self.clusters.keys().cloned().collect();
        // A new member is a new peer of every agent: start them again from what the
        // clusters hold (their merge state starts afresh, as after a restart).
        self.agents = ids
            .iter()
            .map(|local| {
                let settings = Settings {
                    local: local.clone(),
                    mode: Mode::Mesh,
                    grace: Duration::from_secs(60),
                    allowed_namespaces: None,
                    cluster_selection: false,
                };
                (local.clone(), State::new(settings, ids.iter().cloned()))
            })
            .collect();
        Ok(id)
    }

    /// A member's objects: its own and what its agent wrote.
    pub fn cluster(&self, id: &ClusterId) -> Option<&ClusterObjects> {
        self.clusters.get(id)
    }

    /// The members' ids, in order.
    pub fn cluster_ids(&self) -> impl Iterator<Item = &ClusterId> {
        self.clusters.keys()
    }

    /// Creates a Namespace in a member (if it does not exist).
    pub fn apply_namespace(&mut self, cluster: &ClusterId, name: &str) -> Result<(), PlanError> {
        self.member(cluster)?.namespaces.insert(name.to_owned());
        Ok(())
    }

    /// Creates or updates a Service in a member, as a user's apply: its cluster IPs are
    /// allocated when it needs them and has none; on update, allocated IPs are kept.
    pub fn apply_service(
        &mut self,
        cluster: &ClusterId,
        service: Service,
    ) -> Result<(), PlanError> {
        let now = self.now;
        self.member(cluster)?.apply_service(service, now)
    }

    /// Creates or updates a ServiceExport in a member (`v1alpha1` and `v1beta1` exports are
    /// the same object). Its status is kept; only the agent writes it.
    pub fn apply_export(
        &mut self,
        cluster: &ClusterId,
        export: impl Into<ServiceExport>,
    ) -> Result<(), PlanError> {
        let now = self.now;
        self.member(cluster)?.apply_export(export.into(), now)
    }

    /// Creates or replaces an EndpointSlice in a member (as the EndpointSlice controller
    /// writes a Service's slices).
    pub fn apply_slice(
        &mut self,
        cluster: &ClusterId,
        slice: EndpointSlice,
    ) -> Result<(), PlanError> {
        let now = self.now;
        let member = self.member(cluster)?;
        let key = member.key("EndpointSlice", &slice.metadata)?;
        let mut slice = slice;
        member.stamp(&mut slice.metadata, now);
        member.slices.insert(key, slice);
        Ok(())
    }

    /// Deletes a Service from a member (its cluster IPs are released).
    pub fn delete_service(
        &mut self,
        cluster: &ClusterId,
        namespace: &str,
        name: &str,
    ) -> Result<(), PlanError> {
        self.member(cluster)?.delete_service(&key(namespace, name));
        Ok(())
    }

    /// Deletes a ServiceExport from a member.
    pub fn delete_export(
        &mut self,
        cluster: &ClusterId,
        namespace: &str,
        name: &str,
    ) -> Result<(), PlanError> {
        self.member(cluster)?.exports.remove(&key(namespace, name));
        Ok(())
    }

    /// Deletes an EndpointSlice from a member.
    pub fn delete_slice(
        &mut self,
        cluster: &ClusterId,
        namespace: &str,
        name: &str,
    ) -> Result<(), PlanError> {
        self.member(cluster)?.slices.remove(&key(namespace, name));
        Ok(())
    }

    /// Runs every member's agent until none has anything left to write (see the [module
    /// docs](self)). Fails with [`PlanError::NotConverged`] if they still write after
    /// [`MAX_ROUNDS`] rounds, and with the store's error if a write is refused.
    pub fn converge(&mut self) -> Result<Convergence, PlanError> {
        let mut done = Convergence::default();
        let wall = Time(self.now);
        for _ in 0..MAX_ROUNDS {
            let mut writes = 0;
            let mut pending = Vec::new();
            let ids: Vec<ClusterId> = self.clusters.keys().cloned().collect();
            for local in &ids {
                let Some(state) = self.agents.get_mut(local) else {
                    continue;
                };
                for fact in facts(local, &self.clusters) {
                    state.handle(fact, self.instant);
                }
                let mut plans = Vec::new();
                for service in state.all_services() {
                    state.update_merge(&service);
                    let plan = reconcile::plan_at(&state.inputs_for(&service, self.instant), &wall);
                    let n = count_writes(&plan);
                    if n > 0 {
                        pending.push(format!("{local}: {service}"));
                        writes += n;
                        plans.push((service, plan));
                    }
                }
                let Some(member) = self.clusters.get_mut(local) else {
                    continue;
                };
                for (service, plan) in plans {
                    member.execute(&service, plan, self.now)?;
                }
            }
            if writes == 0 {
                return Ok(done);
            }
            done.rounds += 1;
            done.writes += writes;
            if done.rounds == MAX_ROUNDS {
                return Err(PlanError::NotConverged {
                    rounds: done.rounds,
                    pending,
                });
            }
        }
        Ok(done)
    }

    fn member(&mut self, id: &ClusterId) -> Result<&mut ClusterObjects, PlanError> {
        self.clusters
            .get_mut(id)
            .ok_or_else(|| PlanError::UnknownCluster {
                cluster: id.clone(),
            })
    }
}

/// One member's objects, as its API server would hold them: its own (Namespaces, Services,
/// ServiceExports, EndpointSlices) and what its agent wrote (ServiceImports, derived
/// Services, imported EndpointSlices, export conditions).
#[derive(Debug)]
pub struct ClusterObjects {
    id: ClusterId,
    cidrs: Vec<ServiceRange>,
    namespaces: BTreeSet<String>,
    services: BTreeMap<Key, Service>,
    exports: BTreeMap<Key, ServiceExport>,
    slices: BTreeMap<Key, EndpointSlice>,
    imports: BTreeMap<Key, ServiceImport>,
    allocated: BTreeSet<IpAddr>,
    uids: u64,
}

impl ClusterObjects {
    /// The member's id.
    pub fn id(&self) -> &ClusterId {
        &self.id
    }

    /// Its Namespaces.
    pub fn namespaces(&self) -> impl Iterator<Item = &str> {
        self.namespaces.iter().map(String::as_str)
    }

    /// The ServiceImport of `service`.
    pub fn import(&self, service: &ServiceRef) -> Option<&ServiceImport> {
        self.imports.get(&service_key(service))
    }

    /// Every ServiceImport.
    pub fn imports(&self) -> impl Iterator<Item = &ServiceImport> {
        self.imports.values()
    }

    /// The ServiceExport of `service` (with the conditions the agent wrote).
    pub fn export(&self, service: &ServiceRef) -> Option<&ServiceExport> {
        self.exports.get(&service_key(service))
    }

    /// Every ServiceExport.
    pub fn exports(&self) -> impl Iterator<Item = &ServiceExport> {
        self.exports.values()
    }

    /// A Service (the member's own, or a derived one) by namespace and name.
    pub fn service(&self, namespace: &str, name: &str) -> Option<&Service> {
        self.services.get(&key(namespace, name))
    }

    /// Every Service, derived ones included.
    pub fn services(&self) -> impl Iterator<Item = &Service> {
        self.services.values()
    }

    /// The derived Service of `service`'s `ClusterSetIP` import.
    pub fn derived_service(&self, service: &ServiceRef) -> Option<&Service> {
        let name = desired::derived_service_name(service.namespace.as_str(), service.name.as_str());
        self.service(service.namespace.as_str(), &name)
            .filter(|s| labels_say(&s.metadata, LABEL_MANAGED_BY, MANAGED_BY))
    }

    /// Every EndpointSlice: the member's own and the imported ones.
    pub fn slices(&self) -> impl Iterator<Item = &EndpointSlice> {
        self.slices.values()
    }

    /// The MCS EndpointSlices of `service` (labelled
    /// `multicluster.kubernetes.io/service-name`), as the DNS server and the Kubernetes
    /// resolver select them.
    pub fn mcs_slices<'a>(
        &'a self,
        service: &'a ServiceRef,
    ) -> impl Iterator<Item = &'a EndpointSlice> + 'a {
        self.slices.values().filter(move |s| {
            s.metadata.namespace.as_deref() == Some(service.namespace.as_str())
                && labels_say(&s.metadata, LABEL_SERVICE_NAME, service.name.as_str())
        })
    }

    fn new(id: ClusterId, cidrs: Vec<ServiceRange>) -> Self {
        Self {
            id,
            cidrs,
            namespaces: BTreeSet::new(),
            services: BTreeMap::new(),
            exports: BTreeMap::new(),
            slices: BTreeMap::new(),
            imports: BTreeMap::new(),
            allocated: BTreeSet::new(),
            uids: 0,
        }
    }

    /// The key of an object to be written, refused when unnamed or in a missing namespace.
    fn key(&self, kind: &'static str, meta: &ObjectMeta) -> Result<Key, PlanError> {
        let unnamed = |field| PlanError::Unnamed {
            cluster: self.id.clone(),
            kind,
            field,
        };
        let name = meta.name.clone().ok_or_else(|| unnamed("metadata.name"))?;
        let namespace = meta
            .namespace
            .clone()
            .ok_or_else(|| unnamed("metadata.namespace"))?;
        if !self.namespaces.contains(&namespace) {
            return Err(PlanError::NoNamespace {
                cluster: self.id.clone(),
                kind,
                namespace,
                name,
            });
        }
        Ok((namespace, name))
    }

    /// Sets what the API server sets on creation, unless already set: a uid, the creation
    /// time and generation 1.
    fn stamp(&mut self, meta: &mut ObjectMeta, now: Timestamp) {
        if meta.uid.is_none() {
            self.uids += 1;
            meta.uid = Some(format!("{}-{:08}", self.id, self.uids));
        }
        meta.creation_timestamp.get_or_insert(Time(now));
        meta.generation.get_or_insert(1);
    }

    fn apply_export(&mut self, mut export: ServiceExport, now: Timestamp) -> Result<(), PlanError> {
        let key = self.key("ServiceExport", &export.metadata)?;
        match self.exports.get(&key) {
            Some(have) => {
                let spec_changed = have.spec != export.spec;
                let generation = have.metadata.generation.unwrap_or(1) + i64::from(spec_changed);
                export.metadata.uid = have.metadata.uid.clone();
                export.metadata.creation_timestamp = have.metadata.creation_timestamp.clone();
                export.metadata.generation = Some(generation);
                export.status = have.status.clone();
            }
            None => {
                export.status = None;
                self.stamp(&mut export.metadata, now);
            }
        }
        self.exports.insert(key, export);
        Ok(())
    }

    fn apply_service(&mut self, mut service: Service, now: Timestamp) -> Result<(), PlanError> {
        let key = self.key("Service", &service.metadata)?;
        let have = self.services.get(&key).cloned();
        if let Some(have) = &have {
            service.metadata.uid = have.metadata.uid.clone();
            service.metadata.creation_timestamp = have.metadata.creation_timestamp.clone();
            service.metadata.generation = have.metadata.generation;
        } else {
            self.stamp(&mut service.metadata, now);
        }
        self.allocate(&key, &mut service, have.as_ref())?;
        self.services.insert(key, service);
        Ok(())
    }

    fn delete_service(&mut self, key: &Key) {
        if let Some(gone) = self.services.remove(key) {
            for ip in service_ips(&gone) {
                self.allocated.remove(&ip);
            }
        }
    }

    /// Gives `service` its cluster IPs, as the API server's allocator does: kept from the
    /// stored Service on update; none for headless and ExternalName Services.
    fn allocate(
        &mut self,
        key: &Key,
        service: &mut Service,
        have: Option<&Service>,
    ) -> Result<(), PlanError> {
        let spec = service.spec.get_or_insert_with(Default::default);
        let err = |problem: String| PlanError::ClusterIp {
            cluster: self.id.clone(),
            service: format!("{}/{}", key.0, key.1),
            problem,
        };
        if spec.type_.as_deref() == Some("ExternalName") {
            return Ok(());
        }
        spec.type_.get_or_insert_with(|| "ClusterIP".to_owned());
        let have_spec = have.and_then(|h| h.spec.as_ref());
        if spec.cluster_ip.is_none()
            && let Some(h) = have_spec
        {
            spec.cluster_ip = h.cluster_ip.clone();
            spec.cluster_ips = h.cluster_ips.clone();
            spec.ip_families = h.ip_families.clone();
            spec.ip_family_policy = spec.ip_family_policy.clone().or(h.ip_family_policy.clone());
        }
        if spec.cluster_ip.as_deref() == Some("None") {
            spec.cluster_ips = Some(vec!["None".to_owned()]);
            return Ok(());
        }
        if spec.cluster_ips.as_ref().is_some_and(|ips| !ips.is_empty()) {
            return Ok(());
        }
        let policy = spec
            .ip_family_policy
            .get_or_insert_with(|| "SingleStack".to_owned())
            .clone();
        let families: Vec<IpFamily> = match policy.as_str() {
            "SingleStack" => self.cidrs.iter().take(1).map(|c| c.family).collect(),
            "PreferDualStack" => self.cidrs.iter().map(|c| c.family).collect(),
            "RequireDualStack" if self.cidrs.len() == 2 => {
                self.cidrs.iter().map(|c| c.family).collect()
            }
            "RequireDualStack" => {
                return Err(err(
                    "ipFamilyPolicy RequireDualStack in a single-stack cluster".to_owned(),
                ));
            }
            other => return Err(err(format!("ipFamilyPolicy {other:?} is not a policy"))),
        };
        let mut ips = Vec::new();
        let requested: Option<IpAddr> = match spec.cluster_ip.as_deref() {
            None | Some("") => None,
            Some(ip) => Some(
                ip.parse()
                    .map_err(|_| err(format!("clusterIP {ip:?} is not an IP address")))?,
            ),
        };
        for family in &families {
            let Some(cidr) = self.cidrs.iter().find(|c| c.family == *family) else {
                continue;
            };
            let ip = match requested.filter(|ip| cidr.contains(*ip)) {
                Some(ip) if self.allocated.contains(&ip) => {
                    return Err(err(format!("clusterIP {ip} is already allocated")));
                }
                Some(ip) => ip,
                None => cidr
                    .hosts()
                    .find(|ip| !self.allocated.contains(ip))
                    .ok_or_else(|| err(format!("no free address left in {}", cidr.cidr)))?,
            };
            ips.push(ip);
        }
        if let Some(ip) = requested
            && !ips.contains(&ip)
        {
            return Err(err(format!("clusterIP {ip} is outside the service CIDRs")));
        }
        self.allocated.extend(ips.iter().copied());
        let ips: Vec<String> = ips.iter().map(ToString::to_string).collect();
        spec.cluster_ip = ips.first().cloned();
        spec.cluster_ips = Some(ips);
        spec.ip_families = Some(families.iter().map(|f| f.as_str().to_owned()).collect());
        Ok(())
    }

    /// Executes one plan as the agent's writer does, in the same order.
    fn execute(
        &mut self,
        service: &ServiceRef,
        plan: Plan,
        now: Timestamp,
    ) -> Result<(), PlanError> {
        let key = service_key(service);
        if let Some(conditions) = plan.export_conditions
            && let Some(export) = self.exports.get_mut(&key)
        {
            export
                .status
                .get_or_insert_with(ServiceExportStatus::default)
                .conditions = Some(conditions);
        }
        if let Some(mut import) = plan.import {
            let k = self.key("ServiceImport", &import.metadata)?;
            match self.imports.get(&k) {
                Some(have) => {
                    import.metadata.uid = have.metadata.uid.clone();
                    import.metadata.creation_timestamp = have.metadata.creation_timestamp.clone();
                    import.metadata.generation = have.metadata.generation;
                    import.status = have.status.clone();
                }
                None => {
                    self.stamp(&mut import.metadata, now);
                }
            }
            self.imports.insert(k, import);
        }
        if let Some(ports) = plan.derived_ports {
            let uid = self.imports.get(&key).and_then(|i| i.metadata.uid.clone());
            let derived = desired::derived_service(&key.0, &key.1, uid.as_deref(), &ports);
            self.apply_service(derived, now)?;
        }
        for mut slice in plan.apply_slices {
            let k = self.key("EndpointSlice", &slice.metadata)?;
            self.stamp(&mut slice.metadata, now);
            self.slices.insert(k, slice);
        }
        for name in plan.delete_slices {
            self.slices.remove(&(key.0.clone(), name));
        }
        for name in plan.delete_derived {
            self.delete_service(&(key.0.clone(), name));
        }
        if plan.delete_import {
            self.imports.remove(&key);
        }
        if let Some(status) = plan.import_status
            && let Some(import) = self.imports.get_mut(&key)
        {
            import.status = Some(status);
        }
        Ok(())
    }
}

type Key = (String, String);

fn key(namespace: &str, name: &str) -> Key {
    (namespace.to_owned(), name.to_owned())
}

fn service_key(service: &ServiceRef) -> Key {
    key(service.namespace.as_str(), service.name.as_str())
}

fn labels_say(meta: &ObjectMeta, label: &str, value: &str) -> bool {
    meta.labels
        .as_ref()
        .and_then(|l| l.get(label))
        .is_some_and(|v| v == value)
}

fn has_label(meta: &ObjectMeta, label: &str) -> bool {
    meta.labels.as_ref().is_some_and(|l| l.contains_key(label))
}

fn service_ips(service: &Service) -> Vec<IpAddr> {
    service
        .spec
        .as_ref()
        .and_then(|s| s.cluster_ips.as_ref())
        .into_iter()
        .flatten()
        .filter_map(|ip| ip.parse().ok())
        .collect()
}

/// Writes a plan asks for (what the writer sends to the API server).
fn count_writes(plan: &Plan) -> usize {
    usize::from(plan.import.is_some())
        + usize::from(plan.derived_ports.is_some())
        + usize::from(plan.import_status.is_some())
        + plan.apply_slices.len()
        + plan.delete_slices.len()
        + usize::from(plan.delete_import)
        + plan.delete_derived.len()
        + usize::from(plan.export_conditions.is_some())
}

/// What `local`'s agent sees, as one re-list of each of its watches (the mesh topology's:
/// every member's ServiceExports, Services and their own EndpointSlices; its own
/// Namespaces, ServiceImports, imported EndpointSlices and derived Services), with the
/// label selectors those watches use.
fn facts(local: &ClusterId, clusters: &BTreeMap<ClusterId, ClusterObjects>) -> Vec<Fact> {
    fn relist<K: Clone>(objects: impl Iterator<Item = K>) -> Vec<Event<K>> {
        let mut events = vec![Event::Init];
        events.extend(objects.map(Event::InitApply));
        events.push(Event::InitDone);
        events
    }
    let mut facts = Vec::new();
    for (id, member) in clusters {
        facts.extend(
            relist(member.exports.values().cloned())
                .into_iter()
                .map(|e| Fact::Export(id.clone(), e)),
        );
        facts.extend(
            relist(member.services.values().cloned())
                .into_iter()
                .map(|e| Fact::Service(id.clone(), e)),
        );
        // The Services' own slices: those of a Kubernetes Service that no MCS controller
        // wrote (`kubernetes.io/service-name,!multicluster.kubernetes.io/service-name`).
        let own = member.slices.values().filter(|s| {
            has_label(&s.metadata, LABEL_K8S_SERVICE_NAME)
                && !has_label(&s.metadata, LABEL_SERVICE_NAME)
        });
        facts.extend(
            relist(own.cloned())
                .into_iter()
                .map(|e| Fact::Slice(id.clone(), e)),
        );
    }
    let Some(own) = clusters.get(local) else {
        return facts;
    };
    let namespaces = own.namespaces.iter().map(|name| Namespace {
        metadata: ObjectMeta {
            name: Some(name.clone()),
            ..Default::default()
        },
        spec: None,
        status: Some(NamespaceStatus {
            phase: Some("Active".to_owned()),
            ..Default::default()
        }),
    });
    facts.extend(relist(namespaces).into_iter().map(Fact::Namespace));
    facts.extend(
        relist(own.imports.values().cloned())
            .into_iter()
            .map(Fact::Import),
    );
    let imported = own
        .slices
        .values()
        .filter(|s| labels_say(&s.metadata, LABEL_SLICE_MANAGED_BY, MANAGED_BY));
    facts.extend(relist(imported.cloned()).into_iter().map(Fact::Imported));
    let derived = own
        .services
        .values()
        .filter(|s| labels_say(&s.metadata, LABEL_MANAGED_BY, MANAGED_BY));
    facts.extend(relist(derived.cloned()).into_iter().map(Fact::Derived));
    facts
}

/// A service range to allocate ClusterIPs from: a [`Cidr`] written as its network address,
/// with room for the network address, the `kubernetes` Service's and at least one more.
#[derive(Clone, Debug)]
struct ServiceRange {
    cidr: Cidr,
    family: IpFamily,
}

impl ServiceRange {
    fn parse(text: &str) -> Result<Self, String> {
        let cidr: Cidr = text.parse().map_err(|e: CidrError| e.to_string())?;
        let written = text
            .split_once('/')
            .and_then(|(a, _)| a.trim().parse().ok());
        if written != Some(cidr.network()) {
            return Err("host bits are set; give the network address".to_owned());
        }
        let family = match cidr.network() {
            IpAddr::V4(_) => IpFamily::IPv4,
            IpAddr::V6(_) => IpFamily::IPv6,
        };
        let range = Self { cidr, family };
        if range.host_bits() < 2 {
            return Err("the range is too small to allocate from".to_owned());
        }
        Ok(range)
    }

    fn host_bits(&self) -> u32 {
        let bits = if self.family == IpFamily::IPv4 {
            32
        } else {
            128
        };
        bits - u32::from(self.cidr.prefix())
    }

    fn contains(&self, ip: IpAddr) -> bool {
        self.cidr.contains(ip)
    }

    /// Allocatable addresses in order: after the network address and the first host
    /// address, before an IPv4 range's broadcast address. At most 2^16 are offered (enough
    /// for any plan, bounded for an IPv6 /64).
    fn hosts(&self) -> impl Iterator<Item = IpAddr> + '_ {
        let host_mask = match self.host_bits() {
            128 => u128::MAX,
            bits => (1u128 << bits) - 1,
        };
        let network = match self.cidr.network() {
            IpAddr::V4(a) => u128::from(u32::from(a)),
            IpAddr::V6(a) => u128::from(a),
        };
        let last = host_mask.min(1 << 16) - u128::from(self.family == IpFamily::IPv4);
        (2..=last).map(move |offset| {
            let value = network + offset;
            match self.family {
                IpFamily::IPv4 => {
                    IpAddr::from(u32::try_from(value).unwrap_or(u32::MAX).to_be_bytes())
                }
                _ => IpAddr::from(value.to_be_bytes()),
            }
        })
    }
}

fn parse_cidrs(cluster: &ClusterId, text: &str) -> Result<Vec<ServiceRange>, PlanError> {
    let err = |problem: String| PlanError::ServiceCidr {
        cluster: cluster.clone(),
        cidr: text.to_owned(),
        problem,
    };
    let cidrs = text
        .split(',')
        .map(|c| ServiceRange::parse(c.trim()))
        .collect::<Result<Vec<_>, _>>()
        .map_err(err)?;
    match cidrs.as_slice() {
        [_] => Ok(cidrs),
        [a, b] if a.family != b.family => Ok(cidrs),
        [_, _] => Err(err("two ranges must be one IPv4 and one IPv6".to_owned())),
        _ => Err(err(
            "give one range, or one IPv4 and one IPv6 range".to_owned()
        )),
    }
}

#[cfg(test)]
#[path = "plan_tests.rs"]
mod tests;
