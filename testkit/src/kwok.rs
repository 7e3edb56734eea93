//! Real Pods without a kubelet: kube-scheduler and kwok (`sigs.k8s.io/kwok`) in clusters
//! started with [`ClusterOptions::pods`](crate::ClusterOptions::pods), and the helpers tests
//! drive workloads with.
//!
//! What runs: kube-controller-manager adds the Deployment, ReplicaSet and StatefulSet
//! controllers and node IPAM; kube-scheduler binds Pods to Nodes; kwok, started with its
//! Stage objects (`node-initialize`, `node-heartbeat-with-lease`, `pod-ready`,
//! `pod-complete`, `pod-delete`), manages the Nodes annotated `kwok.x-k8s.io/node=fake`:
//! it marks them Ready, and moves every Pod bound to them to Running and Ready with an
//! IP from the Node's `podCIDR` (both families when the pod CIDR is dual-stack). A Pod
//! being deleted is removed by kwok at once, as a kubelet would after its containers
//! stopped. One such Node, [`KWOK_NODE`], is registered at start; the harness removes the
//! `node.kubernetes.io/not-ready` taint the API server puts on new Nodes (no node
//! lifecycle controller runs to do it), and has kwok give one Pod an IP there before any
//! test's Pods (see `warm_up_ip_pool`: kwok could give two Pods the same first address).
//!
//! Readiness: kwok's `pod-ready` stage only acts on Pending Pods, so a Running Pod keeps
//! the status a test gives it. [`set_pod_ready`] patches the Pod's `Ready` and
//! `ContainersReady` conditions through the status subresource, as a kubelet does when a
//! readiness probe fails or passes again; the EndpointSlice controller follows.
//!
//! Pods that [`super::create_ready_pod`] puts on [`super::FAKE_NODE`] are not kwok's (that
//! Node lacks the annotation), so both kinds can live in one cluster.

use std::collections::BTreeMap;
use std::net::IpAddr;
use std::sync::Arc;
use std::time::Duration;

use futures::StreamExt;
use k8s_openapi::api::apps::v1::{Deployment, StatefulSet};
use k8s_openapi::api::core::v1::{Node, Pod, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};
use kube::runtime::{WatchStreamExt, reflector, watcher};
use kube::{Client, Resource};
use serde::de::DeserializeOwned;

use super::bins::kwok_stages;
use super::cluster::TestCluster;
use super::manifests::apply;

/// The kwok-managed Node every cluster started with [`ClusterOptions::pods`] has.
///
/// [`ClusterOptions::pods`]: super::ClusterOptions::pods
pub const KWOK_NODE: &str = "kwok-node-0";

/// Zone label (`topology.kubernetes.io/zone`) of [`KWOK_NODE`].
pub const KWOK_NODE_ZONE: &str = "zone-a";

/// The annotation kwok selects the Nodes it manages by.
pub const KWOK_NODE_ANNOTATION: (&str, &str) = ("kwok.x-k8s.io/node", "fake");

/// Controllers kube-controller-manager adds for [`ClusterOptions::pods`].
///
/// [`ClusterOptions::pods`]: super::ClusterOptions::pods
pub const KCM_WORKLOAD_CONTROLLERS: &str =
    "deployment-controller,replicaset-controller,statefulset-controller";

/// How long a workload may take to reach the state a helper waits for (kwok needs under a
/// second on a quiet machine; the budget covers a loaded one).
pub const POD_TIMEOUT: Duration = Duration::from_secs(60);

const NODE_TIMEOUT: Duration = Duration::from_secs(120);

/// The pod CIDR [`super::start_clusters_with`] gives the `index`-th cluster of a group when
/// [`ClusterOptions::pods`] is set and [`ClusterOptions::pod_cidr`] is not:
/// `10.<10 + index>.0.0/16`, so the clusters of a ClusterSet never share a pod IP (and
/// none overlaps the default service CIDR `10.0.0.0/24`).
///
/// [`ClusterOptions::pods`]: super::ClusterOptions::pods
/// [`ClusterOptions::pod_cidr`]: super::ClusterOptions::pod_cidr
pub fn pod_cidr_for(index: usize) -> String {
    assert!(index < 240, "pod_cidr_for: index {index} too large");
    format!("10.{}.0.0/16", 10 + index)
}

/// [`pod_cidr_for`] with an IPv6 range as well, `fd00:10:<10 + index>::/56` (each Node gets
/// a /64 of it), for [`ClusterOptions::with_dual_stack`].
///
/// [`ClusterOptions::with_dual_stack`]: super::ClusterOptions::with_dual_stack
pub fn dual_stack_pod_cidr_for(index: usize) -> String {
    format!("{},fd00:10:{}::/56", pod_cidr_for(index), 10 + index)
}

/// kube-scheduler's command line: no leader election, no serving port.
pub(super) fn scheduler_args(cluster: &TestCluster) -> Vec<String> {
    vec![
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        "--leader-elect=false".into(),
        "--secure-port=0".into(),
        "--profiling=false".into(),
    ]
}

/// kwok's command line: its stages, the Nodes annotated [`KWOK_NODE_ANNOTATION`], the
/// cluster's pod CIDR as the fallback for a Node without a `podCIDR`, and no server
/// (no `kubectl exec`/`logs` through it).
pub(super) fn kwok_args(cluster: &TestCluster) -> Vec<String> {
    let fallback = cluster
        .options()
        .pod_cidr
        .as_deref()
        .and_then(|c| c.split(',').next())
        .expect("ClusterOptions::pods sets a pod CIDR")
        .to_owned();
    vec![
        format!("--kubeconfig={}", cluster.kubeconfig_path().display()),
        format!("--config={}", kwok_stages().display()),
        format!(
            "--manage-nodes-with-annotation-selector={}={}",
            KWOK_NODE_ANNOTATION.0, KWOK_NODE_ANNOTATION.1
        ),
        format!("--cidr={fallback}"),
        "--node-ip=127.0.0.1".into(),
        "--v=WARN".into(),
    ]
}

/// Registers [`KWOK_NODE`] and waits until kwok has made it Ready and node IPAM has given it
/// a `podCIDR`, so a Pod scheduled right after gets an IP from the cluster's pod CIDR.
pub(super) async fn add_node(cluster: &mut TestCluster) {
    let client = cluster.client().await;
    let nodes: Api<Node> = Api::all(client);
    let node = Node {
        metadata: ObjectMeta {
            name: Some(KWOK_NODE.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_owned(), KWOK_NODE.to_owned()),
                ("kubernetes.io/os".to_owned(), "linux".to_owned()),
                ("type".to_owned(), "kwok".to_owned()),
                (
                    "topology.kubernetes.io/zone".to_owned(),
                    KWOK_NODE_ZONE.to_owned(),
                ),
            ])),
            annotations: Some(BTreeMap::from([(
                KWOK_NODE_ANNOTATION.0.to_owned(),
                KWOK_NODE_ANNOTATION.1.to_owned(),
            )])),
            ..Default::default()
        },
        ..Default::default()
    };
    nodes
        .create(&PostParams::default(), &node)
        .await
        .unwrap_or_else(|e| panic!("cluster {}: creating node {KWOK_NODE}: {e}", cluster.name()));
    // The TaintNodesByCondition admission plugin taints every new Node not-ready; the node
    // lifecycle controller that would lift it does not run.
    nodes
        .patch(
            KWOK_NODE,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "taints": null } })),
        )
        .await
        .unwrap_or_else(|e| panic!("cluster {}: untainting {KWOK_NODE}: {e}", cluster.name()));
    let what = format!(
        "cluster {}: node {KWOK_NODE} Ready with a podCIDR",
        cluster.name()
    );
    let wait = wait_watched(
        nodes,
        watcher::Config::default().fields(&format!("metadata.name={KWOK_NODE}")),
        &what,
        NODE_TIMEOUT,
        |nodes| {
            let node = nodes.first()?;
            let spec = node.spec.as_ref()?;
            let ready = node
                .status
                .as_ref()?
                .conditions
                .as_ref()?
                .iter()
                .any(|c| c.type_ == "Ready" && c.status == "True");
            (ready && spec.pod_cidr.is_some() && spec.taints.as_ref().is_none_or(Vec::is_empty))
                .then_some(())
        },
    );
    // A kwok or scheduler that died gets reported with its log rather than as a timeout.
    tokio::select! {
        () = wait => {}
        () = async {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                cluster.assert_pods_running();
            }
        } => {}
    }
    let (client, name) = (cluster.client().await, cluster.name().to_owned());
    tokio::select! {
        () = warm_up_ip_pool(client, &name) => {}
        () = async {
            loop {
                tokio::time::sleep(Duration::from_millis(500)).await;
                cluster.assert_pods_running();
            }
        } => {}
    }
}

/// Has kwok give one Pod an IP on [`KWOK_NODE`], alone, and deletes it. kwok makes a node's
/// pool of Pod IPs when it first needs one, without a lock around making it (v0.8.0,
/// `PodController.ipPool`: a load, then a store), so two Pods that reach a new node at once
/// can be given the same first address from two pools (seen: two Pods of one Deployment
/// both at `10.10.0.1`). Once one Pod has had an IP, the node's pool exists and hands out
/// each address once.
async fn warm_up_ip_pool(client: Client, cluster: &str) {
    const NAME: &str = "kwok-ip-pool-warm-up";
    const NS: &str = "default";
    let pods: Api<Pod> = Api::namespaced(client, NS);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": { "name": NAME },
        "spec": {
            "nodeName": KWOK_NODE,
            "containers": [{ "name": "c", "image": "kwok-ip-pool-warm-up" }],
        },
    }))
    .expect("a Pod");
    pods.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("cluster {cluster}: creating pod {NAME}: {e}"));
    let what = format!("cluster {cluster}: pod {NAME} given an IP by kwok");
    wait_watched(
        pods.clone(),
        watcher::Config::default().fields(&format!("metadata.name={NAME}")),
        &what,
        POD_TIMEOUT,
        |pods| pods.first().and_then(|p| p.status.as_ref()?.pod_ip.clone()),
    )
    .await;
    pods.delete(NAME, &DeleteParams::default())
        .await
        .unwrap_or_else(|e| panic!("cluster {cluster}: deleting pod {NAME}: {e}"));
    let what = format!("cluster {cluster}: pod {NAME} gone");
    wait_watched(
        pods,
        watcher::Config::default().fields(&format!("metadata.name={NAME}")),
        &what,
        POD_TIMEOUT,
        |pods| pods.is_empty().then_some(()),
    )
    .await;
}

/// Waits on a watch (`kube::runtime::watcher`, with a reflector store) until `pred`, asked
/// after every event once the first list is complete, returns `Some`. Panics after
/// `timeout` naming `what` and how many objects the store held.
pub async fn wait_watched<K, T>(
    api: Api<K>,
    config: watcher::Config,
    what: &str,
    timeout: Duration,
    mut pred: impl FnMut(&[Arc<K>]) -> Option<T>,
) -> T
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned + Send + Sync + 'static,
    K::DynamicType: Default + Eq + std::hash::Hash + Clone,
{
    let (store, writer) = reflector::store();
    let stream = reflector(writer, watcher(api, config).default_backoff());
    let mut stream = std::pin::pin!(stream);
    let mut listed = false;
    let run = async {
        while let Some(event) = stream.next().await {
            match event {
                Ok(watcher::Event::InitDone) => listed = true,
                Ok(_) => {}
                // The watcher retries with backoff; a test's budget bounds it.
                Err(e) => eprintln!("[harness] watch for {what}: {e}"),
            }
            if listed && let Some(v) = pred(&store.state()) {
                return Some(v);
            }
        }
        None
    };
    match tokio::time::timeout(timeout, run).await {
        Ok(Some(v)) => v,
        Ok(None) => panic!("the watch for {what} ended"),
        Err(_) => panic!(
            "timed out after {timeout:?} waiting for {what} ({} object(s) watched)",
            store.state().len()
        ),
    }
}

/// A Deployment `name` of `replicas` Pods labelled `app: <name>`, one container with the
/// `(name, containerPort, protocol)` ports given. The image is never pulled (kwok runs
/// nothing).
pub fn deployment(name: &str, replicas: i32, ports: &[(&str, i32, &str)]) -> Deployment {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "Deployment",
        "metadata": { "name": name, "labels": { "app": name } },
        "spec": {
            "replicas": replicas,
            "selector": { "matchLabels": { "app": name } },
            "template": pod_template(name, ports),
        },
    }))
    .expect("a Deployment")
}

/// A StatefulSet `name` of `replicas` Pods labelled `app: <name>` whose governing Service
/// is `service`: its Pods are `<name>-0`, `<name>-1`, ..., each with `hostname` its own name
/// and `subdomain` the Service, so the EndpointSlices of a headless `service` carry those
/// hostnames. Pods start and stop in parallel (`podManagementPolicy: Parallel`).
pub fn statefulset(
    name: &str,
    service: &str,
    replicas: i32,
    ports: &[(&str, i32, &str)],
) -> StatefulSet {
    serde_json::from_value(serde_json::json!({
        "apiVersion": "apps/v1",
        "kind": "StatefulSet",
        "metadata": { "name": name, "labels": { "app": name } },
        "spec": {
            "replicas": replicas,
            "serviceName": service,
            "podManagementPolicy": "Parallel",
            "selector": { "matchLabels": { "app": name } },
            "template": pod_template(name, ports),
        },
    }))
    .expect("a StatefulSet")
}

fn pod_template(app: &str, ports: &[(&str, i32, &str)]) -> serde_json::Value {
    serde_json::json!({
        "metadata": { "labels": { "app": app } },
        "spec": {
            "containers": [{
                "name": "app",
                "image": "registry.invalid/mcs-test-app:0",
                "ports": ports.iter().map(|(n, p, proto)| serde_json::json!({
                    "name": n, "containerPort": p, "protocol": proto
                })).collect::<Vec<_>>(),
            }],
        },
    })
}

/// A Service `name` selecting `app: <app>` with `(name, port, protocol)` ports (target port
/// the same number); headless (`clusterIP: None`) when asked.
pub fn service(name: &str, app: &str, ports: &[(&str, i32, &str)], headless: bool) -> Service {
    let mut spec = serde_json::json!({
        "selector": { "app": app },
        "ports": ports.iter().map(|(n, p, proto)| serde_json::json!({
            "name": n, "port": p, "targetPort": p, "protocol": proto
        })).collect::<Vec<_>>(),
    });
    if headless {
        spec["clusterIP"] = "None".into();
    }
    serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Service",
        "metadata": { "name": name },
        "spec": spec,
    }))
    .expect("a Service")
}

/// Creates `obj` in namespace `ns` and returns it as the API server stored it.
pub async fn create<K>(client: &Client, ns: &str, obj: &K) -> K
where
    K: Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + DeserializeOwned,
    K::DynamicType: Default,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    Api::<K>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), obj)
        .await
        .unwrap_or_else(|e| panic!("creating {} {ns}/{name}: {e}", K::kind(&Default::default())))
}

/// Applies (server-side) every document of a YAML manifest `text` (Deployments,
/// StatefulSets, Services, ...), in order, into namespace `ns` unless a document names its
/// own.
pub async fn apply_yaml(client: &Client, ns: &str, text: &str) {
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(text).unwrap_or_else(|e| panic!("invalid YAML manifest: {e}"));
    for value in docs {
        let mut obj: kube::api::DynamicObject = serde_json::from_value(value)
            .unwrap_or_else(|e| panic!("not a Kubernetes object: {e}"));
        obj.metadata.namespace.get_or_insert_with(|| ns.to_owned());
        apply(client, &obj).await;
    }
}

/// Whether the Pod is Running, Ready, has an IP and is not being deleted.
pub fn is_running_ready(pod: &Pod) -> bool {
    let Some(status) = pod.status.as_ref() else {
        return false;
    };
    pod.metadata.deletion_timestamp.is_none()
        && status.phase.as_deref() == Some("Running")
        && status.pod_ip.is_some()
        && status
            .conditions
            .iter()
            .flatten()
            .any(|c| c.type_ == "Ready" && c.status == "True")
}

/// The Pod's IPs (`status.podIPs`, one per family).
pub fn pod_ips(pod: &Pod) -> Vec<IpAddr> {
    pod.status
        .iter()
        .flat_map(|s| s.pod_ips.iter().flatten())
        .map(|ip| {
            ip.ip
                .parse()
                .unwrap_or_else(|e| panic!("pod IP {:?}: {e}", ip.ip))
        })
        .collect()
}

/// Waits (on a watch) until exactly `n` Pods matching the label `selector` exist in `ns`
/// and all of them are Running and Ready with an IP; returns them sorted by name. Pods
/// being deleted count as existing, so after a scale-down this returns once they are gone.
pub async fn wait_ready_pods(client: &Client, ns: &str, selector: &str, n: usize) -> Vec<Pod> {
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    wait_watched(
        api,
        watcher::Config::default().labels(selector),
        &format!("{n} Running and Ready Pod(s) {selector} in {ns}"),
        POD_TIMEOUT,
        |pods| {
            (pods.len() == n && pods.iter().all(|p| is_running_ready(p))).then(|| {
                let mut pods: Vec<Pod> = pods.iter().map(|p| (**p).clone()).collect();
                pods.sort_by(|a, b| a.metadata.name.cmp(&b.metadata.name));
                pods
            })
        },
    )
    .await
}

/// Waits until Deployment `ns/name` has `replicas` available Pods (watched), for at most
/// `timeout`; false if it did not, so that the caller can say why in its panic.
pub async fn deployment_available(
    client: &Client,
    ns: &str,
    name: &str,
    replicas: i32,
    timeout: Duration,
) -> bool {
    let deployments: Api<Deployment> = Api::namespaced(client.clone(), ns);
    let done = kube::runtime::wait::await_condition(deployments, name, |d: Option<&Deployment>| {
        d.and_then(|d| d.status.as_ref())
            .is_some_and(|s| s.available_replicas.unwrap_or(0) >= replicas)
    });
    matches!(tokio::time::timeout(timeout, done).await, Ok(Ok(_)))
}

/// Sets `spec.replicas` of Deployment `ns/name` through its scale subresource.
pub async fn scale_deployment(client: &Client, ns: &str, name: &str, replicas: i32) {
    scale::<Deployment>(client, ns, name, replicas).await;
}

/// Sets `spec.replicas` of StatefulSet `ns/name` through its scale subresource.
pub async fn scale_statefulset(client: &Client, ns: &str, name: &str, replicas: i32) {
    scale::<StatefulSet>(client, ns, name, replicas).await;
}

async fn scale<K>(client: &Client, ns: &str, name: &str, replicas: i32)
where
    K: Resource<Scope = kube::core::NamespaceResourceScope>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned,
    K::DynamicType: Default,
{
    Api::<K>::namespaced(client.clone(), ns)
        .patch_scale(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "replicas": replicas } })),
        )
        .await
        .unwrap_or_else(|e| panic!("scaling {ns}/{name} to {replicas}: {e}"));
}

/// Sets the Pod's `Ready` and `ContainersReady` conditions (a strategic merge patch of the
/// status subresource, as a kubelet reports a readiness probe); its IPs and phase stay.
/// kwok leaves a Running Pod's conditions alone, so the change sticks.
pub async fn set_pod_ready(client: &Client, ns: &str, name: &str, ready: bool) -> Pod {
    let status = if ready { "True" } else { "False" };
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let condition = |type_: &str| serde_json::json!({ "type": type_, "status": status, "lastTransitionTime": now });
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Strategic(serde_json::json!({
                "status": { "conditions": [condition("Ready"), condition("ContainersReady")] }
            })),
        )
        .await
        .unwrap_or_else(|e| panic!("setting Ready={status} on pod {ns}/{name}: {e}"))
}

/// Deletes a Pod the normal way (default grace period): kwok sees the deletion timestamp
/// and removes the Pod, as a kubelet would once its containers stopped; its controller
/// then makes a replacement.
pub async fn delete_pod(client: &Client, ns: &str, name: &str) {
    match Api::<Pod>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default())
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => panic!("deleting pod {ns}/{name}: {e}"),
    }
}

/// Waits (on a watch) until `pred` holds for the EndpointSlices of Service `ns/service`
/// (label `kubernetes.io/service-name`), and returns what it returned.
pub async fn wait_service_slices<T>(
    client: &Client,
    ns: &str,
    service: &str,
    what: &str,
    mut pred: impl FnMut(&[EndpointSlice]) -> Option<T>,
) -> T {
    let api: Api<EndpointSlice> = Api::namespaced(client.clone(), ns);
    wait_watched(
        api,
        watcher::Config::default().labels(&format!("kubernetes.io/service-name={service}")),
        &format!("EndpointSlices of {ns}/{service}: {what}"),
        POD_TIMEOUT,
        |slices| {
            let slices: Vec<EndpointSlice> = slices.iter().map(|s| (**s).clone()).collect();
            pred(&slices)
        },
    )
    .await
}

/// The endpoints of `slices` as `(address, ready, hostname)`, sorted.
pub fn slice_endpoints(slices: &[EndpointSlice]) -> Vec<(String, bool, Option<String>)> {
    let mut out: Vec<_> = slices
        .iter()
        .flat_map(|s| &s.endpoints)
        .flat_map(|e| {
            let ready = e.conditions.as_ref().and_then(|c| c.ready) == Some(true);
            e.addresses
                .iter()
                .map(move |a| (a.clone(), ready, e.hostname.clone()))
        })
        .collect();
    out.sort();
    out
}

/// The names of the Pods matching `selector` in `ns` right now, sorted.
pub async fn pod_names(client: &Client, ns: &str, selector: &str) -> Vec<String> {
    let mut names: Vec<String> = Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap_or_else(|e| panic!("listing pods {selector} in {ns}: {e}"))
        .items
        .into_iter()
        .filter_map(|p| p.metadata.name)
        .collect();
    names.sort();
    names
}
