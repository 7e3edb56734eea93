//! What `kubectl mcs` reads from the members: kubeconfig contexts resolved the way kubectl
//! resolves them, then per member the objects [`status`](crate::status) and
//! [`check`](crate::check) judge. Reads only; every failure is kept as text in what is
//! returned, so that one unreachable member does not hide the others.

use std::collections::BTreeMap;
use std::net::{IpAddr, SocketAddr};
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::authorization::v1::{
    ResourceAttributes, SubjectAccessReview, SubjectAccessReviewSpec,
};
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::{ConfigMap, Service};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, PostParams};
use kube::config::{KubeConfigOptions, Kubeconfig};
use mcs_core::api::v1beta1::{ClusterProperty, ServiceExport, ServiceImport};
use mcs_core::api::{
    ABOUT_GROUP, CLUSTER_ID_PROPERTY, CLUSTERSET_PROPERTY, LABEL_SERVICE_NAME, MCS_GROUP, v1alpha1,
};
use mcs_core::cidr::ClusterRanges;
use mcs_kube::admin::{AGENT_HEARTBEAT, HEARTBEAT_READY, HEARTBEAT_REASON};

use crate::check::{DnsFacts, HeartbeatSeen, MemberFacts};
use crate::status::MemberSnapshot;

/// A member as reached through one kubeconfig context.
#[derive(Clone)]
pub struct Member {
    /// The context's name.
    pub context: String,
    /// A client for it.
    pub client: kube::Client,
}

impl std::fmt::Debug for Member {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Member")
            .field("context", &self.context)
            .finish_non_exhaustive()
    }
}

/// Why the members could not be found.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum GatherError {
    /// The kubeconfig could not be read.
    #[error("cannot read the kubeconfig: {0}")]
    Kubeconfig(String),
    /// A context could not be turned into a client.
    #[error("context {context}: {error}")]
    Context {
        /// The context.
        context: String,
        /// Why.
        error: String,
    },
    /// No context was given and the members could not be discovered.
    #[error("{0}")]
    Discovery(String),
}

/// How long one request may take before the member counts as unreachable.
const TIMEOUT: Duration = Duration::from_secs(10);

/// The members: the `contexts` given, or, when none is, the current context and every
/// other context whose ClusterProperty `clusterset.k8s.io` names the same ClusterSet. The
/// kubeconfig is `kubeconfig`, else `KUBECONFIG` (several files merged) or
/// `~/.kube/config`, as kubectl reads it.
pub async fn members(
    kubeconfig: Option<&Path>,
    contexts: &[String],
) -> Result<Vec<Member>, GatherError> {
    let config = match kubeconfig {
        Some(path) => Kubeconfig::read_from(path),
        None => Kubeconfig::read(),
    }
    .map_err(|e| GatherError::Kubeconfig(e.to_string()))?;
    if !contexts.is_empty() {
        let mut members = Vec::new();
        for context in contexts {
            members.push(connect(&config, context).await?);
        }
        return Ok(members);
    }
    let current = config.current_context.clone().ok_or_else(|| {
        GatherError::Discovery(
            "no --context given and the kubeconfig has no current context".to_owned(),
        )
    })?;
    let first = connect(&config, &current).await?;
    let set = property(&first.client, CLUSTERSET_PROPERTY)
        .await
        .map_err(|e| GatherError::Discovery(format!("no --context given, and the current context {current}: {e}")))?
        .ok_or_else(|| {
            GatherError::Discovery(format!(
                "no --context given, and the current context {current} has no ClusterProperty {CLUSTERSET_PROPERTY} to find the other members by: name the members with --context"
            ))
        })?;
    let mut members = vec![first];
    for named in &config.contexts {
        if named.name == current {
            continue;
        }
        let Ok(member) = connect(&config, &named.name).await else {
            continue;
        };
        // A context that cannot be reached cannot be told a member: it is left out.
        if let Ok(Some(value)) = property(&member.client, CLUSTERSET_PROPERTY).await
            && value == set
        {
            members.push(member);
        }
    }
    Ok(members)
}

async fn connect(config: &Kubeconfig, context: &str) -> Result<Member, GatherError> {
    let error = |error: String| GatherError::Context {
        context: context.to_owned(),
        error,
    };
    let options = KubeConfigOptions {
        context: Some(context.to_owned()),
        ..Default::default()
    };
    let mut cfg = kube::Config::from_custom_kubeconfig(config.clone(), &options)
        .await
        .map_err(|e| error(e.to_string()))?;
    cfg.connect_timeout = Some(TIMEOUT);
    cfg.read_timeout = Some(TIMEOUT);
    let client = kube::Client::try_from(cfg).map_err(|e| error(e.to_string()))?;
    Ok(Member {
        context: context.to_owned(),
        client,
    })
}

/// A ClusterProperty's value, `None` when it does not exist.
async fn property(client: &kube::Client, name: &str) -> Result<Option<String>, String> {
    Api::<ClusterProperty>::all(client.clone())
        .get_opt(name)
        .await
        .map(|p| p.map(|p| p.spec.value))
        .map_err(|e| describe(&e))
}

/// Everything `status` needs from one member, for one service or all.
pub async fn snapshot(member: &Member, only: Option<(&str, &str)>) -> MemberSnapshot {
    let mut snap = MemberSnapshot {
        context: member.context.clone(),
        cluster: member.context.clone(),
        ..Default::default()
    };
    if let Err(e) = fill(member, only, &mut snap).await {
        snap.error = Some(e);
    }
    snap
}

async fn fill(
    member: &Member,
    only: Option<(&str, &str)>,
    snap: &mut MemberSnapshot,
) -> Result<(), String> {
    let client = &member.client;
    if let Some(id) = property(client, CLUSTER_ID_PROPERTY).await? {
        snap.cluster = id;
    }
    let params = match only {
        Some((_, name)) => ListParams::default().fields(&format!("metadata.name={name}")),
        None => ListParams::default(),
    };
    let in_scope = |ns: Option<&str>| only.is_none_or(|(want, _)| ns == Some(want));
    snap.exports = list_exports(client, &params)
        .await?
        .into_iter()
        .filter(|e| in_scope(e.metadata.namespace.as_deref()))
        .collect();
    snap.imports = Api::<ServiceImport>::all(client.clone())
        .list(&params)
        .await
        .map_err(|e| describe(&e))?
        .items
        .into_iter()
        .filter(|i| in_scope(i.metadata.namespace.as_deref()))
        .collect();
    let imported_selector = match only {
        Some((_, name)) => format!("{LABEL_SERVICE_NAME}={name}"),
        None => LABEL_SERVICE_NAME.to_owned(),
    };
    snap.imported = Api::<EndpointSlice>::all(client.clone())
        .list(&ListParams::default().labels(&imported_selector))
        .await
        .map_err(|e| describe(&e))?
        .items;
    for export in &snap.exports {
        let (Some(ns), Some(name)) = (&export.metadata.namespace, &export.metadata.name) else {
            continue;
        };
        if let Some(service) = Api::<Service>::namespaced(client.clone(), ns)
            .get_opt(name)
            .await
            .map_err(|e| describe(&e))?
        {
            snap.services.push(service);
        }
        let own = ListParams::default().labels(&format!(
            "kubernetes.io/service-name={name},!{LABEL_SERVICE_NAME}"
        ));
        snap.slices.extend(
            Api::<EndpointSlice>::namespaced(client.clone(), ns)
                .list(&own)
                .await
                .map_err(|e| describe(&e))?
                .items,
        );
    }
    snap.ranges = ranges(client).await.unwrap_or_default();
    Ok(())
}

/// ServiceExports at v1beta1, or at v1alpha1 from a member that serves only that.
async fn list_exports(
    client: &kube::Client,
    params: &ListParams,
) -> Result<Vec<ServiceExport>, String> {
    match Api::<ServiceExport>::all(client.clone()).list(params).await {
        Ok(list) => Ok(list.items),
        Err(kube::Error::Api(s)) if s.code == 404 => {
            Api::<v1alpha1::ServiceExport>::all(client.clone())
                .list(params)
                .await
                .map(|l| l.items.into_iter().map(Into::into).collect())
                .map_err(|e| describe(&e))
        }
        Err(e) => Err(describe(&e)),
    }
}

/// A member's pod ranges (its Nodes' `spec.podCIDRs`) and service ranges (its
/// `networking.k8s.io/v1` ServiceCIDRs), as the agent reads them.
pub async fn ranges(client: &kube::Client) -> Result<ClusterRanges, String> {
    mcs_kube::agent::cidr::read_ranges(client)
        .await
        .map_err(|e| describe(&e))
}

/// Settings of the checks.
#[derive(Clone, Debug)]
pub struct CheckOptions {
    /// The namespace of the agent (its heartbeat Lease and ServiceAccount).
    pub agent_namespace: String,
    /// The agent's ServiceAccount name.
    pub agent_service_account: String,
    /// DNS servers to ask for `clusterset.local`, by context.
    pub dns: BTreeMap<String, SocketAddr>,
}

/// Everything `check` needs from one member.
pub async fn facts(member: &Member, options: &CheckOptions) -> MemberFacts {
    let client = &member.client;
    let mut facts = MemberFacts::new(&member.context);
    // The first request says whether the member answers at all.
    match property(client, CLUSTER_ID_PROPERTY).await {
        Ok(id) => facts.cluster_id = id,
        Err(e) if e.contains("HTTP 404") => {}
        Err(e) => {
            if kube::discovery::group(client, "").await.is_err() {
                facts.error = Some(e);
                return facts;
            }
        }
    }
    facts.clusterset = property(client, CLUSTERSET_PROPERTY).await.ok().flatten();
    facts.heartbeat = Api::<Lease>::namespaced(client.clone(), &options.agent_namespace)
        .get_opt(AGENT_HEARTBEAT)
        .await
        .ok()
        .flatten()
        .map(|lease| {
            let annotations = lease.metadata.annotations.unwrap_or_default();
            let spec = lease.spec.unwrap_or_default();
            HeartbeatSeen {
                renewed: spec.renew_time.map(|t| t.0),
                duration_seconds: i64::from(spec.lease_duration_seconds.unwrap_or(40)),
                ready: annotations
                    .get(HEARTBEAT_READY)
                    .is_some_and(|v| v == "true"),
                reason: annotations
                    .get(HEARTBEAT_REASON)
                    .cloned()
                    .unwrap_or_default(),
            }
        });
    for group in [MCS_GROUP, ABOUT_GROUP] {
        if let Ok(g) = kube::discovery::group(client, group).await {
            for version in g.versions() {
                for (resource, _) in g.versioned_resources(version) {
                    facts
                        .served
                        .entry(resource.plural.clone())
                        .or_default()
                        .push(version.to_owned());
                }
            }
        }
    }
    facts.rbac = rbac(
        client,
        &format!(
            "system:serviceaccount:{}:{}",
            options.agent_namespace, options.agent_service_account
        ),
    )
    .await;
    facts.ranges = ranges(client).await;
    facts.dns = match options.dns.get(&member.context) {
        Some(server) => DnsFacts::Queried(query_zone(*server).await),
        None => corefile(client).await,
    };
    facts
}

/// The requests the agent makes in its own cluster (deploy/rbac/agent-local.yaml):
/// verb, group, resource, subresource.
const AGENT_REQUESTS: &[(&str, &str, &str, &str)] = &[
    ("list", MCS_GROUP, "serviceexports", ""),
    ("watch", MCS_GROUP, "serviceexports", ""),
    ("patch", MCS_GROUP, "serviceexports", "status"),
    ("watch", MCS_GROUP, "serviceimports", ""),
    ("create", MCS_GROUP, "serviceimports", ""),
    ("patch", MCS_GROUP, "serviceimports", ""),
    ("delete", MCS_GROUP, "serviceimports", ""),
    ("patch", MCS_GROUP, "serviceimports", "status"),
    ("watch", "", "services", ""),
    ("create", "", "services", ""),
    ("patch", "", "services", ""),
    ("delete", "", "services", ""),
    ("watch", "discovery.k8s.io", "endpointslices", ""),
    ("create", "discovery.k8s.io", "endpointslices", ""),
    ("patch", "discovery.k8s.io", "endpointslices", ""),
    ("delete", "discovery.k8s.io", "endpointslices", ""),
    ("watch", "", "namespaces", ""),
    ("list", "", "nodes", ""),
    ("list", "networking.k8s.io", "servicecidrs", ""),
    ("create", "events.k8s.io", "events", ""),
];

/// Asks the API server (SubjectAccessReview) whether `user` may make each request the
/// agent makes.
async fn rbac(client: &kube::Client, user: &str) -> Result<Vec<(String, bool)>, String> {
    let api = Api::<SubjectAccessReview>::all(client.clone());
    let mut results = Vec::new();
    for (verb, group, resource, subresource) in AGENT_REQUESTS {
        let review = SubjectAccessReview {
            spec: SubjectAccessReviewSpec {
                user: Some(user.to_owned()),
                groups: Some(vec![
                    "system:serviceaccounts".to_owned(),
                    "system:authenticated".to_owned(),
                ]),
                resource_attributes: Some(ResourceAttributes {
                    verb: Some((*verb).to_owned()),
                    group: Some((*group).to_owned()),
                    resource: Some((*resource).to_owned()),
                    subresource: (!subresource.is_empty()).then(|| (*subresource).to_owned()),
                    ..Default::default()
                }),
                ..Default::default()
            },
            ..Default::default()
        };
        let answer = api
            .create(&PostParams::default(), &review)
            .await
            .map_err(|e| describe(&e))?;
        let allowed = answer.status.is_some_and(|s| s.allowed);
        let what = match *subresource {
            "" => format!("{verb} {resource}"),
            sub => format!("{verb} {resource}/{sub}"),
        };
        results.push((what, allowed));
    }
    Ok(results)
}

/// Whether the cluster's CoreDNS forwards `clusterset.local`: its ConfigMap
/// `kube-system/coredns` has a server block for the zone, or its Corefile `import`s server
/// files and a ConfigMap in `kube-system` holds a `*.server` block for the zone (the
/// `coredns-custom` convention of AKS and k3s, which the chart's `coredns.snippetConfigMap`
/// follows); unknown without a `coredns` ConfigMap.
async fn corefile(client: &kube::Client) -> DnsFacts {
    let config_maps = Api::<ConfigMap>::namespaced(client.clone(), "kube-system");
    let data = match config_maps.get_opt("coredns").await {
        Ok(Some(cm)) => cm.data.unwrap_or_default(),
        _ => return DnsFacts::Unknown,
    };
    if data
        .values()
        .any(|corefile| corefile.contains("clusterset.local"))
    {
        return DnsFacts::Corefile(true);
    }
    let imports = data.values().any(|corefile| {
        corefile
            .lines()
            .any(|l| l.trim_start().starts_with("import "))
    });
    if !imports {
        return DnsFacts::Corefile(false);
    }
    let snippets = config_maps
        .list(&ListParams::default())
        .await
        .map(|list| list.items)
        .unwrap_or_default();
    DnsFacts::Corefile(snippets.iter().any(|cm| {
        cm.data
            .iter()
            .flatten()
            .any(|(key, block)| key.ends_with(".server") && block.contains("clusterset.local"))
    }))
}

/// Asks `server` for the SOA of `clusterset.local`.
async fn query_zone(server: SocketAddr) -> Result<String, String> {
    use hickory_resolver::config::{NameServerConfig, ResolverConfig, ResolverOpts};
    use hickory_resolver::proto::rr::RecordType;
    let mut ns = NameServerConfig::udp_and_tcp(server.ip());
    for c in &mut ns.connections {
        c.port = server.port();
    }
    let mut opts = ResolverOpts::default();
    opts.cache_size = 0;
    opts.ndots = 0;
    opts.timeout = Duration::from_secs(3);
    opts.attempts = 2;
    let resolver = hickory_resolver::Resolver::builder_with_config(
        ResolverConfig::from_parts(None, vec![], vec![ns]),
        hickory_resolver::net::runtime::TokioRuntimeProvider::default(),
    )
    .with_options(opts)
    .build()
    .map_err(|e| format!("{server}: {e}"))?;
    let answer = resolver
        .lookup("clusterset.local.", RecordType::SOA)
        .await
        .map_err(|e| format!("{server}: {e}"))?;
    let first = answer
        .answers()
        .first()
        .map(|r| r.data.to_string())
        .unwrap_or_default();
    Ok(format!("SOA {first} from {server}"))
}

/// A `--dns` value: `CONTEXT=ADDRESS[:PORT]` (port 53 by default).
pub fn parse_dns(value: &str) -> Result<(String, SocketAddr), String> {
    let (context, addr) = value
        .split_once('=')
        .ok_or_else(|| format!("--dns {value}: expected CONTEXT=ADDRESS[:PORT]"))?;
    let addr = addr
        .parse::<SocketAddr>()
        .or_else(|_| addr.parse::<IpAddr>().map(|ip| SocketAddr::new(ip, 53)))
        .map_err(|_| format!("--dns {value}: {addr} is not an address"))?;
    Ok((context.to_owned(), addr))
}

fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} (HTTP {})", s.message, s.code),
        other => other.to_string(),
    }
}
