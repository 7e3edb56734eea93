//! The `mcs-agent` binary in the hub topology (`--hub`), against real API servers: two
//! members and a hub, each agent holding only its own cluster's credentials and its
//! least-privilege hub identity (`deploy/rbac/hub-member.yaml`, applied as shipped).

use mcs_testkit as support;

use mcs_testkit::clusterset;

use std::process::Stdio;
use std::time::Duration;

use kube::api::Api;
use mcs_core::ClusterId;
use mcs_core::api::v1beta1::ServiceImport;
use mcs_core::name::ServiceRef;
use mcs_kube::hub::member_namespace;
use mcs_kube::hub::record::{MemberExport, record_name};
use tokio::process::{Child, Command};

use clusterset::{ClusterSet, Topo};

const NS: &str = "loyalty";
/// How long an import may take.
const BUDGET: Duration = Duration::from_secs(60);

/// Starts `mcs-agent --hub` for member `i` of `set`: its own cluster through
/// `KUBECONFIG`, the hub through a kubeconfig with its member identity.
fn hub_agent(set: &ClusterSet, i: usize) -> Child {
    let id = &set.ids[i];
    let cluster = &set.clusters[i];
    let hub = &set.hub().cluster;
    let hub_kubeconfig = cluster.dir().join("hub.kubeconfig");
    support::write_kubeconfig(
        &hub_kubeconfig,
        &hub.kubeconfig_as_user(&format!("mcs:member:{id}"), &["mcs:members"]),
    );
    let log = std::fs::File::create(cluster.dir().join("mcs-agent.log")).expect("agent log");
    Command::new(env!("CARGO_BIN_EXE_mcs-agent"))
        .arg(format!("--cluster-id={id}"))
        .arg(format!("--hub={}", hub_kubeconfig.display()))
        .arg("--hub-lease-seconds=3")
        .arg("--admin-listen=127.0.0.1:0")
        .env("KUBECONFIG", cluster.kubeconfig_path())
        .env("RUST_LOG", "info")
        .env_remove("MCS_CLUSTER_ID")
        .env_remove("MCS_HUB_KUBECONFIG")
        .stdin(Stdio::null())
        .stdout(log.try_clone().expect("agent log"))
        .stderr(log)
        .kill_on_drop(true)
        .spawn()
        .expect("start mcs-agent")
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn mcs_agent_with_hub_imports_through_the_hub() {
    let set = ClusterSet::start_topo(
        Topo::Hub,
        &["east", "west"],
        false,
        Duration::from_secs(60),
        false,
        |c| c,
    )
    .await;
    for client in &set.clients {
        support::create_namespace(client, NS).await;
    }
    let mut agents = [hub_agent(&set, 0), hub_agent(&set, 1)];
    clusterset::create_service(&set.clients[1], NS, &clusterset::hello_service("accrual")).await;
    clusterset::export(&set.clients[1], NS, "accrual", None).await;

    // West's agent publishes its record in its own namespace on the hub...
    let west = ClusterId::new("west").unwrap();
    let records: Api<MemberExport> =
        Api::namespaced(set.hub().admin.clone(), &member_namespace(&west));
    let name = record_name(&ServiceRef::new(NS, "accrual").unwrap());
    let published = support::wait_for("west's record on the hub", BUDGET, || {
        let records = records.clone();
        let name = name.clone();
        async move { records.get_opt(&name).await.ok().flatten() }
    });
    // ... and east's agent imports from it; neither may exit meanwhile.
    let imports: Api<ServiceImport> = Api::namespaced(set.clients[0].clone(), NS);
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
    let [east_agent, west_agent] = &mut agents;
    tokio::select! {
        status = east_agent.wait() => panic!("east's mcs-agent exited: {status:?}"),
        status = west_agent.wait() => panic!("west's mcs-agent exited: {status:?}"),
        _ = async { published.await; imported.await } => {}
    }
    for agent in &mut agents {
        agent.kill().await.expect("stop mcs-agent");
    }
}

/// Runs mcs-agent with `args` (and no hub kubeconfig from the environment), expects it to
/// refuse them, and returns what it wrote to stderr.
async fn refused(args: &[&str]) -> String {
    let output = Command::new(env!("CARGO_BIN_EXE_mcs-agent"))
        .env_remove("MCS_HUB_KUBECONFIG")
        .args(args)
        .output()
        .await
        .expect("run mcs-agent");
    assert!(!output.status.success(), "mcs-agent accepted {args:?}");
    String::from_utf8_lossy(&output.stderr).into_owned()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hub_and_member_flags_exclude_each_other() {
    let stderr = refused(&["--hub=/nonexistent/hub.kubeconfig", "--member=east"]).await;
    assert!(
        stderr.contains("'--hub <HUB>' cannot be used with '--member <MEMBERS>'")
            || stderr.contains("cannot be used with"),
        "{stderr}"
    );
    let stderr = refused(&["--cluster-id=east"]).await;
    assert!(stderr.contains("--member <MEMBERS>"), "{stderr}");
    // Cluster selection needs the mesh topology (hub members do not publish properties).
    let stderr = refused(&["--hub=/nonexistent/hub.kubeconfig", "--cluster-selection"]).await;
    assert!(
        stderr.contains("'--hub <HUB>' cannot be used with '--cluster-selection'"),
        "{stderr}"
    );
}
