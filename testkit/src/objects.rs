//! The objects tests start from: namespaces, the fake Node and Pods that look ready,
//! ServiceAccount tokens, and the workspace's CRDs.

use std::collections::BTreeMap;
use std::fs;
use std::path::{Path, PathBuf};
use std::time::Duration;

use k8s_openapi::api::core::v1::{Namespace, Node, Pod};
use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
use kube::Client;
use kube::api::{Api, DeleteParams, ListParams, ObjectMeta, Patch, PatchParams, PostParams};

use super::wait::wait_for;

/// Name of the fake Node that [`create_ready_pod`] schedules Pods on.
pub const FAKE_NODE: &str = "mcs-test-node";

/// Zone label (`topology.kubernetes.io/zone`) of [`FAKE_NODE`].
pub const FAKE_NODE_ZONE: &str = "zone-a";

/// Create a namespace (no error if it exists).
pub async fn create_namespace(client: &Client, name: &str) {
    let ns = Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<Namespace>::all(client.clone())
        .create(&PostParams::default(), &ns)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating namespace {name}: {e}"),
    }
}

/// Create [`FAKE_NODE`] (zone [`FAKE_NODE_ZONE`]) if it does not exist. The
/// EndpointSlice controller skips Pods whose Node is missing.
pub async fn ensure_fake_node(client: &Client) {
    let node = Node {
        metadata: ObjectMeta {
            name: Some(FAKE_NODE.into()),
            labels: Some(BTreeMap::from([
                ("kubernetes.io/hostname".to_string(), FAKE_NODE.to_string()),
                (
                    "topology.kubernetes.io/zone".to_string(),
                    FAKE_NODE_ZONE.to_string(),
                ),
            ])),
            ..Default::default()
        },
        ..Default::default()
    };
    match Api::<Node>::all(client.clone())
        .create(&PostParams::default(), &node)
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating node {FAKE_NODE}: {e}"),
    }
}

/// Create a Pod bound to [`FAKE_NODE`] and mark it Running and Ready with `pod_ip`, as
/// a kubelet would, so kube-controller-manager publishes it in the EndpointSlices of
/// every Service selecting `labels`. `ports` are `(name, containerPort)` TCP ports.
///
/// `pod_ip` must not be loopback/link-local/unspecified if the Pod is to appear in an
/// EndpointSlice: the API server rejects such EndpointSlice addresses. Use
/// documentation addresses such as `192.0.2.10` (never connected to).
pub async fn create_ready_pod(
    client: &Client,
    ns: &str,
    name: &str,
    labels: &[(&str, &str)],
    pod_ip: &str,
    ports: &[(&str, i32)],
) -> Pod {
    ensure_fake_node(client).await;
    let api: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1",
        "kind": "Pod",
        "metadata": {
            "name": name,
            "namespace": ns,
            "labels": labels.iter().map(|(k, v)| (k.to_string(), v.to_string())).collect::<BTreeMap<_, _>>(),
        },
        "spec": {
            "nodeName": FAKE_NODE,
            "containers": [{
                "name": "app",
                "image": "registry.invalid/mcs-test-app:0",
                "ports": ports.iter().map(|(n, p)| serde_json::json!({
                    "name": n, "containerPort": p, "protocol": "TCP"
                })).collect::<Vec<_>>(),
            }],
        },
    }))
    .unwrap();
    api.create(&PostParams::default(), &pod)
        .await
        .unwrap_or_else(|e| panic!("creating pod {ns}/{name}: {e}"));
    set_pod_status(client, ns, name, Some(pod_ip), true).await
}

/// Set a Pod's Ready condition (and, if given, its IP) through the status subresource,
/// as a kubelet would. Returns the updated Pod.
pub async fn set_pod_status(
    client: &Client,
    ns: &str,
    name: &str,
    pod_ip: Option<&str>,
    ready: bool,
) -> Pod {
    let ready = if ready { "True" } else { "False" };
    let mut status = serde_json::json!({
        "phase": "Running",
        "conditions": [
            {"type": "PodScheduled", "status": "True"},
            {"type": "Initialized", "status": "True"},
            {"type": "ContainersReady", "status": ready},
            {"type": "Ready", "status": ready},
        ],
    });
    if let Some(ip) = pod_ip {
        status["podIP"] = ip.into();
        status["podIPs"] = serde_json::json!([{ "ip": ip }]);
    }
    Api::<Pod>::namespaced(client.clone(), ns)
        .patch_status(
            name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "status": status })),
        )
        .await
        .unwrap_or_else(|e| panic!("patching status of pod {ns}/{name}: {e}"))
}

/// Delete a Pod immediately (grace period 0). A Pod bound to a Node is otherwise only
/// marked Terminating and waits for a kubelet that does not exist here.
pub async fn delete_pod_now(client: &Client, ns: &str, name: &str) {
    match Api::<Pod>::namespaced(client.clone(), ns)
        .delete(name, &DeleteParams::default().grace_period(0))
        .await
    {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => {}
        Err(e) => panic!("deleting pod {ns}/{name}: {e}"),
    }
}

/// Delete a namespace and wait (up to `timeout`) until kube-controller-manager's
/// namespace controller has removed it. Its Pods are deleted with grace period 0
/// first, standing in for the kubelet (see [`delete_pod_now`]). Needs
/// [`ClusterOptions::controller_manager`](crate::ClusterOptions::controller_manager).
pub async fn delete_namespace(client: &Client, ns: &str, timeout: Duration) {
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let list = pods
        .list(&ListParams::default())
        .await
        .unwrap_or_else(|e| panic!("listing pods in {ns}: {e}"));
    for p in list.items {
        delete_pod_now(client, ns, p.metadata.name.as_deref().unwrap_or_default()).await;
    }
    let namespaces: Api<Namespace> = Api::all(client.clone());
    match namespaces.delete(ns, &DeleteParams::default()).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 404 => return,
        Err(e) => panic!("deleting namespace {ns}: {e}"),
    }
    wait_for(&format!("namespace {ns} to be finalized"), timeout, || {
        let namespaces = namespaces.clone();
        async move { namespaces.get_opt(ns).await.ok()?.is_none().then_some(()) }
    })
    .await;
}

/// Creates `service` in `ns` and a ServiceExport of the same name beside it.
pub async fn create_exported_service(
    client: &Client,
    ns: &str,
    service: &k8s_openapi::api::core::v1::Service,
) {
    use mcs_core::api::{ServiceExportSpec, v1beta1::ServiceExport};
    let name = service.metadata.name.clone().expect("a named Service");
    Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), service)
        .await
        .unwrap_or_else(|e| panic!("create Service {ns}/{name}: {e}"));
    let mut export = ServiceExport::new(&name, ServiceExportSpec::default());
    export.metadata.namespace = Some(ns.into());
    Api::<ServiceExport>::namespaced(client.clone(), ns)
        .create(&PostParams::default(), &export)
        .await
        .unwrap_or_else(|e| panic!("create ServiceExport {ns}/{name}: {e}"));
}

/// A token for ServiceAccount `ns/name` through the TokenRequest API (the ServiceAccount is
/// created if missing; valid for an hour). Use it with
/// [`TestCluster::client_with_token`](crate::TestCluster::client_with_token).
pub async fn service_account_token(client: &Client, ns: &str, name: &str) -> String {
    use k8s_openapi::api::authentication::v1::{TokenRequest, TokenRequestSpec};
    use k8s_openapi::api::core::v1::ServiceAccount;
    let sas: Api<ServiceAccount> = Api::namespaced(client.clone(), ns);
    let sa = ServiceAccount {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        ..Default::default()
    };
    match sas.create(&PostParams::default(), &sa).await {
        Ok(_) => {}
        Err(kube::Error::Api(e)) if e.code == 409 => {}
        Err(e) => panic!("creating ServiceAccount {ns}/{name}: {e}"),
    }
    let request = TokenRequest {
        spec: TokenRequestSpec {
            audiences: vec![],
            expiration_seconds: Some(3600),
            bound_object_ref: None,
        },
        ..Default::default()
    };
    let response: TokenRequest = sas
        .create_subresource("token", name, &PostParams::default(), &request)
        .await
        .unwrap_or_else(|e| panic!("requesting a token for ServiceAccount {ns}/{name}: {e}"));
    response.status.expect("TokenRequest without status").token
}

/// Installs the CRDs with KEP-5939's cluster selection
/// ([`all_with_cluster_selection`](mcs_core::api::crd::all_with_cluster_selection)) and
/// waits until the API server keeps their new fields: a dry-run ServiceExport and
/// ServiceImport with `clusterSelectors` come back with them (the server takes a moment to
/// serve a changed CRD's schema, and drops the fields meanwhile).
pub async fn install_cluster_selection_crds(client: &Client) {
    use mcs_core::api::v1beta1::{ServiceExport, ServiceImport};
    use mcs_core::api::{ServiceExportSpec, ServiceImportSpec, ServiceImportType};

    let crds: Api<CustomResourceDefinition> = Api::all(client.clone());
    for crd in mcs_core::api::crd::all_with_cluster_selection() {
        let name = crd.metadata.name.clone().unwrap_or_default();
        crds.patch(
            &name,
            &PatchParams::apply("mcs-test-harness").force(),
            &Patch::Apply(&crd),
        )
        .await
        .unwrap_or_else(|e| panic!("apply CRD {name}: {e}"));
    }
    let selectors: Vec<mcs_core::api::ClusterSelector> = serde_json::from_str(
        r#"[{"propertySelector": {"matchProperties": {"region": "@SameAsImporter@"}}}]"#,
    )
    .expect("a selector");
    let dry_run = PostParams {
        dry_run: true,
        ..Default::default()
    };
    let exports: Api<ServiceExport> = Api::namespaced(client.clone(), "default");
    let export = ServiceExport::new(
        "probe",
        ServiceExportSpec {
            cluster_selectors: Some(selectors.clone()),
            ..Default::default()
        },
    );
    let imports: Api<ServiceImport> = Api::namespaced(client.clone(), "default");
    let mut spec = ServiceImportSpec::new(ServiceImportType::ClusterSetIp);
    spec.cluster_selectors = Some(selectors);
    let import = ServiceImport::new("probe", spec);
    wait_for(
        "the ServiceExport and ServiceImport CRDs keeping clusterSelectors",
        Duration::from_secs(60),
        || async {
            let export = exports.create(&dry_run, &export).await.ok()?;
            let import = imports.create(&dry_run, &import).await.ok()?;
            (export.spec.cluster_selectors.is_some() && import.spec.cluster_selectors.is_some())
                .then_some(())
        },
    )
    .await;
}

/// Every CRD in the workspace's `deploy/crds/*.yaml` (multi-document files allowed),
/// found from this crate upwards. A missing directory or a file that does not parse panics.
pub fn load_crds() -> Vec<CustomResourceDefinition> {
    let manifest = Path::new(env!("CARGO_MANIFEST_DIR"));
    let dir = manifest
        .ancestors()
        .map(|d| d.join("deploy/crds"))
        .find(|d| d.is_dir())
        .unwrap_or_else(|| panic!("no deploy/crds directory above {}", manifest.display()));
    let entries = fs::read_dir(&dir).unwrap_or_else(|e| panic!("read {}: {e}", dir.display()));
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| matches!(p.extension().and_then(|e| e.to_str()), Some("yaml" | "yml")))
        .collect();
    files.sort();
    let mut crds = Vec::new();
    for file in files {
        let text = fs::read_to_string(&file).expect("read CRD file");
        let docs: Vec<CustomResourceDefinition> = serde_saphyr::from_multiple(&text)
            .unwrap_or_else(|e| panic!("{}: not CustomResourceDefinitions: {e}", file.display()));
        crds.extend(docs);
    }
    if crds.is_empty() {
        eprintln!("[harness] no CRDs in {}: none installed", dir.display());
    }
    crds
}
