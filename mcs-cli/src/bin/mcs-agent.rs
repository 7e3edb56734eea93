//! `mcs-agent`: the MCS agent of one member cluster.
//!
//! ```text
//! mcs-agent --cluster-id east \
//!   --member east=/etc/mcs/east.kubeconfig \
//!   --member west=/etc/mcs/west.kubeconfig \
//!   --member north=/etc/mcs/north.kubeconfig
//! ```
//!
//! That is the mesh topology: every agent reads every member's API server. In the hub
//! topology every agent reads and writes only a hub API server (and its own cluster):
//!
//! ```text
//! mcs-agent --cluster-id east --hub /etc/mcs/hub.kubeconfig
//! ```
//!
//! Pick the mesh for a handful of clusters (no extra control plane; each agent needs read
//! credentials for every member, and each member's API server serves N agents), the hub
//! beyond that or when members must not hold each other's credentials (each member holds
//! one hub identity that can write only its own namespace there; see `docs/scale.md`).
//!
//! The local cluster is the one the agent runs in, reached with the in-cluster (or default
//! kubeconfig) configuration; a member without a kubeconfig path (`--member east`) is
//! reached the same way. Without `--cluster-id` the agent's id is read from the local
//! cluster's `cluster.clusterset.k8s.io` ClusterProperty (and, in the mesh, must be one of
//! the members); `--cluster-id` overrides it.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Duration;

use clap::Parser;
use mcs_core::ClusterId;
use mcs_core::api::CLUSTER_ID_PROPERTY;
use mcs_kube::admin;
use mcs_kube::agent::{
    Agent, AgentConfig, DEFAULT_MAX_CONCURRENT_WRITES, HubConfig, Member, local_cluster_id,
};

/// The MCS agent: merges every member's ServiceExports (read from each member, or from a
/// hub) and writes ServiceImports, EndpointSlices, derived Services and export conditions
/// into its own cluster.
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// This cluster's id (default: the local cluster's `cluster.clusterset.k8s.io`
    /// ClusterProperty).
    #[arg(long, env = "MCS_CLUSTER_ID")]
    cluster_id: Option<String>,
    /// Mesh topology: a member as `ID=KUBECONFIG[@CONTEXT]` (or just `ID` for the
    /// in-cluster config). Repeat for every member, this cluster included.
    #[arg(
        long = "member",
        required_unless_present = "hub",
        conflicts_with = "hub"
    )]
    members: Vec<String>,
    /// Hub topology: the hub API server as `KUBECONFIG[@CONTEXT]`, with this member's hub
    /// identity (deploy/rbac/hub-member.yaml).
    #[arg(long, env = "MCS_HUB_KUBECONFIG")]
    hub: Option<String>,
    /// Hub topology: seconds of this member's Lease on the hub (renewed every third; longer
    /// in a set so large that its members would renew more than 10 times a second together:
    /// 3 s per 10 members).
    #[arg(long, default_value_t = 40, requires = "hub")]
    hub_lease_seconds: u64,
    /// Seconds an unreachable member's endpoints are kept.
    #[arg(long, default_value_t = 60)]
    unreachable_grace_seconds: u64,
    /// Seconds between full resyncs.
    #[arg(long, default_value_t = 300)]
    resync_seconds: u64,
    /// Only these namespaces may be exported (repeat; default: all).
    #[arg(long = "allow-namespace")]
    allowed_namespaces: Vec<String>,
    /// Address of /metrics, /healthz and /readyz.
    #[arg(long, env = "MCS_ADMIN_LISTEN", default_value = "0.0.0.0:9090")]
    admin_listen: SocketAddr,
    /// Seconds a gauge not set again stays on /metrics (the series of a member that left
    /// go after this); the agent sets live gauges four times as often.
    #[arg(long, default_value_t = mcs_cli::DEFAULT_GAUGE_IDLE.as_secs())]
    metrics_gauge_idle_seconds: u64,
    /// Namespace of the heartbeat Lease `mcs-agent` the agent renews in its own cluster
    /// with its readiness (what `kubectl mcs check` reads).
    #[arg(long, env = "POD_NAMESPACE", default_value = "mcs-system")]
    heartbeat_namespace: String,
    /// Duration of the heartbeat Lease in seconds (renewed every third of it).
    #[arg(long, default_value_t = 40)]
    heartbeat_seconds: u64,
    /// Seconds between CIDR checks (imported endpoints inside this cluster's ranges,
    /// members with overlapping ranges).
    #[arg(long, default_value_t = 60)]
    cidr_check_seconds: u64,
    /// How many services' writes may be in flight at once (one per service; 0 counts as 1).
    #[arg(long, default_value_t = DEFAULT_MAX_CONCURRENT_WRITES)]
    max_concurrent_writes: usize,
    /// Cluster selection (KEP-5939, alpha; mesh topology only): watch every member's
    /// ClusterProperties (deploy/rbac/agent-cluster-selection.yaml) and write each import's
    /// status.clusterSelectorResults. Needs the CRDs of deploy/crds-cluster-selection/.
    #[arg(long, conflicts_with = "hub")]
    cluster_selection: bool,
}

#[tokio::main]
async fn main() -> ExitCode {
    mcs_cli::main(run(Args::parse())).await
}

/// `PATH[@CONTEXT]` as a kubeconfig path and an optional context.
fn kubeconfig_and_context(spec: &str) -> (PathBuf, Option<String>) {
    match spec.rsplit_once('@') {
        Some((path, context)) => (PathBuf::from(path), Some(context.to_owned())),
        None => (PathBuf::from(spec), None),
    }
}

async fn run(args: Args) -> Result<(), Box<dyn std::error::Error>> {
    let mut members = Vec::new();
    for spec in &args.members {
        let (id, rest) = spec
            .split_once('=')
            .map_or((spec.as_str(), None), |(id, rest)| (id, Some(rest)));
        let id = ClusterId::new(id).map_err(|e| format!("--member {spec}: {e}"))?;
        let (path, context) = match rest.map(kubeconfig_and_context) {
            None => (None, None),
            Some((path, context)) => (Some(path), context),
        };
        let client = admin::kube_client(path.as_deref(), context.as_deref())
            .await
            .map_err(|e| format!("--member {spec}: {e}"))?;
        members.push(Member { id, client });
    }
    let local = match &args.cluster_id {
        Some(id) => ClusterId::new(id.as_str()).map_err(|e| format!("--cluster-id: {e}"))?,
        None => {
            // The cluster the agent runs in, whatever the order of the --member flags.
            let client = admin::kube_client(None, None)
                .await
                .map_err(|e| format!("no --cluster-id, and the local cluster: {e}"))?;
            let id = local_cluster_id(&client).await?;
            if args.hub.is_none() && !members.iter().any(|m| m.id == id) {
                return Err(format!(
                    "the local cluster's ClusterProperty {CLUSTER_ID_PROPERTY} says {id}, which no --member names"
                )
                .into());
            }
            id
        }
    };
    // The heartbeat goes to the agent's own cluster.
    let (config, local_client) = match &args.hub {
        None => {
            let own = members
                .iter()
                .find(|m| m.id == local)
                .map(|m| m.client.clone());
            (AgentConfig::new(local.clone(), members), own)
        }
        Some(spec) => {
            let (path, context) = kubeconfig_and_context(spec);
            let hub = admin::kube_client(Some(&path), context.as_deref())
                .await
                .map_err(|e| format!("--hub {spec}: {e}"))?;
            let own = admin::kube_client(None, None)
                .await
                .map_err(|e| format!("the local cluster: {e}"))?;
            let config = AgentConfig::hub(
                local.clone(),
                HubConfig::new(own.clone(), hub)
                    .lease_duration(Duration::from_secs(args.hub_lease_seconds)),
            );
            (config, Some(own))
        }
    };
    let gauge_idle = Duration::from_secs(args.metrics_gauge_idle_seconds.max(1));
    let metrics = mcs_cli::install_metrics(gauge_idle)?;
    let mut config = config
        .metrics_refresh(gauge_idle / 4)
        .unreachable_grace(Duration::from_secs(args.unreachable_grace_seconds))
        .resync(Duration::from_secs(args.resync_seconds))
        .cidr_interval(Duration::from_secs(args.cidr_check_seconds))
        .max_concurrent_writes(args.max_concurrent_writes)
        .cluster_selection(args.cluster_selection);
    if !args.allowed_namespaces.is_empty() {
        config = config.allowed_namespaces(args.allowed_namespaces.clone());
    }
    let agent = Agent::new(config);
    let listener = admin::bind(args.admin_listen).await?;
    let (stop_tx, mut stop_rx) = tokio::sync::watch::channel(false);
    let admin_task = tokio::spawn(admin::serve(
        listener,
        move || metrics.render(),
        agent.readiness(),
        async move {
            let _ = stop_rx.wait_for(|v| *v).await;
        },
    ));
    let heartbeat = local_client.map(|client| {
        let beat = admin::Heartbeat::new(
            &args.heartbeat_namespace,
            admin::AGENT_HEARTBEAT,
            local.as_str(),
        )
        .duration(Duration::from_secs(args.heartbeat_seconds));
        let mut stop = stop_tx.subscribe();
        tokio::spawn(admin::heartbeat(
            client,
            beat,
            agent.readiness(),
            async move {
                let _ = stop.wait_for(|v| *v).await;
            },
        ))
    });
    tracing::info!(cluster = %local, "mcs-agent starting");
    let result = agent.run(admin::shutdown_signal()).await;
    let _ = stop_tx.send(true);
    let _ = admin_task.await;
    if let Some(heartbeat) = heartbeat {
        let _ = heartbeat.await;
    }
    Ok(result?)
}
