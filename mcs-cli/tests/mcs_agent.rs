//! The `mcs-agent` binary against real API servers: without `--cluster-id` it takes its
//! id from the ClusterProperty `cluster.clusterset.k8s.io` of the cluster it runs in (the
//! in-cluster or default configuration), not from whichever `--member` comes first, and it
//! says so clearly when that property is missing or holds no usable id.

use mcs_testkit as support;

use std::collections::BTreeMap;
use std::process::Stdio;
use std::time::Duration;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use kube::Client;
use kube::api::{Api, ObjectMeta, Patch, PatchParams, PostParams};
use mcs_core::api::{
    CLUSTER_ID_PROPERTY, ClusterPropertySpec, ServiceExportSpec,
    v1beta1::{ClusterProperty, ServiceExport, ServiceImport},
};
use support::{ClusterOptions, TestCluster};
use tokio::process::Command;

const NS: &str = "loyalty";
/// How long the agent may take to fail, or to import.
const BUDGET: Duration = Duration::from_secs(60);

/// `mcs-agent` as a cluster's agent would run: `local`'s kubeconfig is the default
/// configuration (`KUBECONFIG`), as the in-cluster one is in a Pod.
fn agent(local: &TestCluster, args: &[String]) -> Command {
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_mcs-agent"));
    cmd.args(args)
        .arg("--admin-listen=127.0.0.1:0")
        .env("KUBECONFIG", local.kubeconfig_path())
        .env("RUST_LOG", "info")
        .env_remove("MCS_CLUSTER_ID")
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    cmd
}

/// Runs the agent, which must exit with a failure; returns what it printed.
async fn fails(mut cmd: Command, what: &str) -> String {
    let output = tokio::time::timeout(BUDGET, cmd.output())
        .await
        .unwrap_or_else(|_| panic!("{what}: mcs-agent still running after {BUDGET:?}"))
        .expect("run mcs-agent");
    let printed = format!(
        "{}{}",
        String::from_utf8_lossy(&output.stdout),
        String::from_utf8_lossy(&output.stderr)
    );
    assert!(
        !output.status.success(),
        "{what}: mcs-agent exited with {}:\n{printed}",
        output.status
    );
    printed
}

async fn set_cluster_id(client: &Client, value: &str) {
    let property = ClusterProperty::new(
        CLUSTER_ID_PROPERTY,
        ClusterPropertySpec {
            value: value.into(),
        },
    );
    Api::<ClusterProperty>::all(client.clone())
        .patch(
            CLUSTER_ID_PROPERTY,
            &PatchParams::apply("mcs-cli-test").force(),
            &Patch::Apply(&property),
        )
        .await
        .unwrap_or_else(|e| panic!("apply ClusterProperty {CLUSTER_ID_PROPERTY}={value}: {e}"));
}

/// Service `name` with one TCP port, exported.
async fn export(client: &Client, name: &str) {
    let service = Service {
        metadata: ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: Some(ServiceSpec {
            selector: Some(BTreeMap::from([("app".to_string(), name.to_string())])),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    };
    Api::<Service>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &service)
        .await
        .expect("create Service");
    let mut export = ServiceExport::new(name, ServiceExportSpec::default());
    export.metadata.namespace = Some(NS.into());
    Api::<ServiceExport>::namespaced(client.clone(), NS)
        .create(&PostParams::default(), &export)
        .await
        .expect("create ServiceExport");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_cluster_id_comes_from_the_local_clusters_cluster_property() {
    let clusters =
        support::start_clusters_with(&["east", "west"], ClusterOptions::api_only()).await;
    let (east, west) = (&clusters[0], &clusters[1]);
    let (east_client, west_client) = (east.client().await, west.client().await);
    // Run as east's agent; west is listed first (the member a naive agent would ask).
    let args = vec![
        format!("--member=west={}", west.kubeconfig_path().display()),
        "--member=east".to_owned(),
    ];
    set_cluster_id(&west_client, "west").await;

    // No ClusterProperty in east: the agent refuses to start and says what is missing
    // (not west's id, which it could read).
    let printed = fails(agent(east, &args), "no ClusterProperty").await;
    assert!(
        printed.contains(&format!(
            "the local cluster has no ClusterProperty {CLUSTER_ID_PROPERTY}"
        )),
        "{printed}"
    );

    // A value that is no cluster id: refused, naming the value.
    set_cluster_id(&east_client, "East_1").await;
    let printed = fails(agent(east, &args), "an invalid cluster id").await;
    assert!(
        printed.contains("is not a usable cluster id") && printed.contains("\"East_1\""),
        "{printed}"
    );

    // An id that no --member names: refused.
    set_cluster_id(&east_client, "north").await;
    let printed = fails(agent(east, &args), "an id no member names").await;
    assert!(
        printed.contains("says north, which no --member names"),
        "{printed}"
    );

    // East's own id: the agent runs as east, so west's export is imported into east.
    set_cluster_id(&east_client, "east").await;
    for client in [&east_client, &west_client] {
        support::create_namespace(client, NS).await;
    }
    export(&west_client, "accrual").await;
    let mut running = agent(east, &args).spawn().expect("start mcs-agent");
    let imports: Api<ServiceImport> = Api::namespaced(east_client.clone(), NS);
    let imported = support::wait_for("west's export imported into east", BUDGET, || async {
        let import = imports.get_opt("accrual").await.ok()??;
        let clusters: Vec<String> = import
            .status?
            .clusters?
            .into_iter()
            .map(|c| c.cluster)
            .collect();
        (clusters == ["west"]).then_some(())
    });
    tokio::select! {
        status = running.wait() => panic!("mcs-agent exited ({status:?}) before importing"),
        () = imported => {}
    }
    // And it wrote nothing into west, as west's agent would have.
    assert!(
        Api::<ServiceImport>::namespaced(west_client.clone(), NS)
            .get_opt("accrual")
            .await
            .expect("read west's imports")
            .is_none(),
        "east's agent wrote into west"
    );
    running.kill().await.expect("stop mcs-agent");
}
