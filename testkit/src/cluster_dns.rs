//! A cluster's own DNS on a real node: CoreDNS (the binary `scripts/kwok-coredns-bins.sh`
//! builds, packed into an image here) as a Deployment in `kube-system` behind the Service
//! `kube-dns` at [`KubeletNode::cluster_dns`], serving `cluster.local` with the `kubernetes` plugin and
//! importing the server blocks of a ConfigMap (`import /etc/coredns/custom/*.server`, the
//! convention of AKS's and k3s's `coredns-custom`), where charts such as `charts/mcs` put
//! theirs. Pods then resolve through it the normal way: kubelet points their resolv.conf at
//! that address. And [`run_to_completion`], a Pod that runs a command once and its output.

use std::collections::BTreeSet;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{ConfigMap, Pod, Service, ServiceAccount};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, ListParams, PostParams};
use serde::de::DeserializeOwned;

use super::bins::coredns_bin;
use super::kwok::deployment_available;
use super::node::{BUSYBOX_IMAGE, KubeletNode, pack_image};

/// The CoreDNS image [`deploy`] imports into the node.
pub const COREDNS_IMAGE: &str = "localhost/mcs-coredns:1";

/// The Corefile: `cluster.local` and the reverse zones from the API server, and the server
/// blocks of the ConfigMap mounted at `/etc/coredns/custom`. Nothing is forwarded out of the
/// machine: a name outside these zones gets SERVFAIL.
const COREFILE: &str = r#".:53 {
    errors
    ready :8181
    kubernetes cluster.local in-addr.arpa ip6.arpa {
        pods insecure
        fallthrough in-addr.arpa ip6.arpa
    }
    cache 30
    loadbalance
}
import /etc/coredns/custom/*.server
"#;

fn from_json<T: DeserializeOwned>(v: serde_json::Value) -> T {
    serde_json::from_value(v).expect("a valid object")
}

async fn create<K>(api: &Api<K>, obj: serde_json::Value)
where
    K: kube::Resource + Clone + DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    let obj: K = from_json(obj);
    api.create(&PostParams::default(), &obj)
        .await
        .unwrap_or_else(|e| panic!("create {:?}: {e}", obj.meta().name));
}

/// Deploys CoreDNS on `node` as the cluster's DNS (see the module docs), importing the
/// `*.server` keys of the ConfigMap `kube-system/<custom>` (optional: it may come later, but
/// CoreDNS reads it when it starts), and waits until its Pod is Ready (its `ready` plugin:
/// every plugin, the `kubernetes` one included, has synced). Returns its Pod's IP: wait for
/// the node's kube-proxy to route [`KubeletNode::cluster_dns`] there
/// ([`Lab::wait_kube_proxy_endpoints`](super::netlab::Lab::wait_kube_proxy_endpoints))
/// before a Pod resolves.
pub async fn deploy(client: &kube::Client, node: &KubeletNode, custom: &str) -> String {
    let images = node.dir().join("images");
    let archive = {
        let images = images.clone();
        tokio::task::spawn_blocking(move || {
            pack_image(
                &images,
                "mcs-coredns",
                &[(coredns_bin(), "coredns")],
                &["/coredns"],
            )
        })
        .await
        .unwrap()
    };
    node.import_image(&archive);

    let ns = "kube-system";
    create(
        &Api::<ServiceAccount>::namespaced(client.clone(), ns),
        serde_json::json!({ "metadata": { "name": "coredns" } }),
    )
    .await;
    create(
        &Api::<ClusterRole>::all(client.clone()),
        serde_json::json!({
            "metadata": { "name": "system:coredns" },
            "rules": [
                { "apiGroups": [""], "resources": ["endpoints", "services", "pods", "namespaces"],
                  "verbs": ["list", "watch"] },
                { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
                  "verbs": ["list", "watch"] },
            ],
        }),
    )
    .await;
    create(
        &Api::<ClusterRoleBinding>::all(client.clone()),
        serde_json::json!({
            "metadata": { "name": "system:coredns" },
            "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "ClusterRole",
                         "name": "system:coredns" },
            "subjects": [{ "kind": "ServiceAccount", "name": "coredns", "namespace": ns }],
        }),
    )
    .await;
    create(
        &Api::<ConfigMap>::namespaced(client.clone(), ns),
        serde_json::json!({ "metadata": { "name": "coredns" }, "data": { "Corefile": COREFILE } }),
    )
    .await;
    let labels = serde_json::json!({ "k8s-app": "kube-dns" });
    let deployments = Api::<Deployment>::namespaced(client.clone(), ns);
    create(
        &deployments,
        serde_json::json!({
            "metadata": { "name": "coredns", "labels": labels },
            "spec": {
                "replicas": 1,
                "selector": { "matchLabels": labels },
                "template": {
                    "metadata": { "labels": labels },
                    "spec": {
                        "serviceAccountName": "coredns",
                        // Not itself: the node's resolv.conf.
                        "dnsPolicy": "Default",
                        "nodeSelector": { "kubernetes.io/hostname": node.name() },
                        "terminationGracePeriodSeconds": 1,
                        "containers": [{
                            "name": "coredns",
                            "image": COREDNS_IMAGE,
                            "imagePullPolicy": "Never",
                            "args": ["-conf", "/etc/coredns/Corefile"],
                            "ports": [
                                { "name": "dns", "containerPort": 53, "protocol": "UDP" },
                                { "name": "dns-tcp", "containerPort": 53, "protocol": "TCP" },
                            ],
                            "readinessProbe": {
                                "httpGet": { "path": "/ready", "port": 8181 },
                                "periodSeconds": 1,
                            },
                            "volumeMounts": [
                                { "name": "config", "mountPath": "/etc/coredns", "readOnly": true },
                                { "name": "custom", "mountPath": "/etc/coredns/custom",
                                  "readOnly": true },
                            ],
                        }],
                        "volumes": [
                            { "name": "config", "configMap": { "name": "coredns" } },
                            { "name": "custom",
                              "configMap": { "name": custom, "optional": true } },
                        ],
                    },
                },
            },
        }),
    )
    .await;
    create(
        &Api::<Service>::namespaced(client.clone(), ns),
        serde_json::json!({
            "metadata": { "name": "kube-dns", "labels": labels },
            "spec": {
                "clusterIP": node.cluster_dns().to_string(),
                "selector": labels,
                "ports": [
                    { "name": "dns", "port": 53, "protocol": "UDP", "targetPort": 53 },
                    { "name": "dns-tcp", "port": 53, "protocol": "TCP", "targetPort": 53 },
                ],
            },
        }),
    )
    .await;
    if !deployment_available(client, ns, "coredns", 1, Duration::from_secs(90)).await {
        panic!(
            "CoreDNS never became Ready on {}; its log:\n{}\nkubelet:\n{}",
            node.name(),
            node.container_logs(ns, "coredns-", "coredns", 30),
            node.log_tail("kubelet", 20)
        );
    }
    let ips = pod_ips(client, ns, "k8s-app=kube-dns").await;
    assert_eq!(ips.len(), 1, "one CoreDNS Pod with an IP: {ips:?}");
    ips.into_iter().next().unwrap()
}

/// The IPs of the Ready Pods in `ns` matching the label selector `selector`.
pub async fn pod_ips(client: &kube::Client, ns: &str, selector: &str) -> BTreeSet<String> {
    Api::<Pod>::namespaced(client.clone(), ns)
        .list(&ListParams::default().labels(selector))
        .await
        .unwrap_or_else(|e| panic!("list Pods {selector} in {ns}: {e}"))
        .items
        .into_iter()
        .filter_map(|p| p.status)
        .filter(|s| {
            s.conditions
                .iter()
                .flatten()
                .any(|c| c.type_ == "Ready" && c.status == "True")
        })
        .filter_map(|s| s.pod_ip)
        .collect()
}

/// Runs `command` once in a busybox Pod `name` in namespace `ns` on `node` (the cluster's
/// DNS in its resolv.conf) and returns whether it exited 0 and its output, read from
/// kubelet's log files.
pub async fn run_to_completion(
    client: &kube::Client,
    node: &KubeletNode,
    ns: &str,
    name: &str,
    command: &str,
) -> (bool, String) {
    let container = serde_json::json!({
        "image": BUSYBOX_IMAGE,
        "command": ["/bin/sh", "-c", command],
    });
    run_container_to_completion(client, node, ns, name, container, None, None).await
}

/// Runs `container` (its image imported into `node`; its name is set to `run`) once in a Pod
/// `name` in namespace `ns` on `node`, as `service_account` when one is named (otherwise
/// with no API credentials) and with `volume` when one is given (which the container
/// mounts), and returns whether it exited 0 and its output, read from kubelet's log files.
pub async fn run_container_to_completion(
    client: &kube::Client,
    node: &KubeletNode,
    ns: &str,
    name: &str,
    container: serde_json::Value,
    service_account: Option<&str>,
    volume: Option<serde_json::Value>,
) -> (bool, String) {
    start_container(client, node, ns, name, container, service_account, volume).await;
    container_finished(client, node, ns, name).await
}

/// Creates the Pod of [`run_container_to_completion`] and returns at once; read what it
/// writes with [`KubeletNode::container_output`] (`name`, container `run`) and wait for its
/// end with [`container_finished`].
pub async fn start_container(
    client: &kube::Client,
    node: &KubeletNode,
    ns: &str,
    name: &str,
    mut container: serde_json::Value,
    service_account: Option<&str>,
    volume: Option<serde_json::Value>,
) {
    container["name"] = "run".into();
    container["imagePullPolicy"] = "Never".into();
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    create(
        &pods,
        serde_json::json!({
            "metadata": { "name": name },
            "spec": {
                "nodeName": node.name(),
                "restartPolicy": "Never",
                "terminationGracePeriodSeconds": 1,
                "serviceAccountName": service_account.unwrap_or("default"),
                "automountServiceAccountToken": service_account.is_some(),
                "containers": [container],
                "volumes": volume.into_iter().collect::<Vec<_>>(),
            },
        }),
    )
    .await;
}

/// Waits until Pod `ns/name` of [`start_container`] has ended; returns whether it exited 0
/// and its output, read from kubelet's log files.
pub async fn container_finished(
    client: &kube::Client,
    node: &KubeletNode,
    ns: &str,
    name: &str,
) -> (bool, String) {
    let pods = Api::<Pod>::namespaced(client.clone(), ns);
    let done = kube::runtime::wait::await_condition(pods.clone(), name, |p: Option<&Pod>| {
        p.and_then(|p| p.status.as_ref())
            .and_then(|s| s.phase.as_deref())
            .is_some_and(|phase| phase == "Succeeded" || phase == "Failed")
    });
    let phase = match tokio::time::timeout(Duration::from_secs(180), done).await {
        Ok(Ok(Some(p))) => p.status.and_then(|s| s.phase).unwrap_or_default(),
        other => panic!(
            "Pod {ns}/{name} never finished ({other:?}); {}",
            pod_report(client, node, ns, name).await
        ),
    };
    (
        phase == "Succeeded",
        node.container_logs(ns, &format!("{name}_"), "run", 5000),
    )
}

/// What a failure message needs about Pod `ns/name` of [`start_container`]: its status, the
/// namespace's events about it, the end of its log and of kubelet's.
pub async fn pod_report(client: &kube::Client, node: &KubeletNode, ns: &str, name: &str) -> String {
    use k8s_openapi::api::core::v1::Event;
    let status = match Api::<Pod>::namespaced(client.clone(), ns).get(name).await {
        Ok(p) => serde_json::to_string_pretty(&p.status).unwrap_or_default(),
        Err(e) => format!("(reading it: {e})"),
    };
    let events = match Api::<Event>::namespaced(client.clone(), ns)
        .list(&ListParams::default().fields(&format!("involvedObject.name={name}")))
        .await
    {
        Ok(list) => list
            .items
            .iter()
            .map(|e| {
                format!(
                    "{} {}: {}\n",
                    e.type_.as_deref().unwrap_or_default(),
                    e.reason.as_deref().unwrap_or_default(),
                    e.message.as_deref().unwrap_or_default()
                )
            })
            .collect::<String>(),
        Err(e) => format!("(listing them: {e})"),
    };
    format!(
        "Pod {ns}/{name}'s status:\n{status}\nits events:\n{events}its log:\n{}\nkubelet:\n{}",
        node.container_logs(ns, &format!("{name}_"), "run", 30),
        node.log_tail("kubelet", 30)
    )
}
