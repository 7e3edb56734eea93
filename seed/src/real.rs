//! The scenario's ClusterSet on real API servers.
//!
//! Three clusters from mcs-kube's test harness (etcd, kube-apiserver,
//! kube-controller-manager and kube-scheduler from `scripts/k8s-bins.sh`, kwok from
//! `scripts/kwok-coredns-bins.sh`, each cluster with its own pod and service CIDR), a
//! ClusterProperty `cluster.clusterset.k8s.io` in each, one `mcs-agent` process per cluster
//! (its id from that property, every member's kubeconfig), and an `mcs-dns` process for
//! north. Pods are real Pod objects that kube-scheduler binds to the cluster's kwok Node and
//! kwok runs (Running, Ready, an address from the Node's pod CIDR; readiness and deletion
//! go through their normal course), so kube-controller-manager publishes their
//! EndpointSlices; the checkouts resolve with [`KubeResolver`] on their own cluster.
//!
//! Nothing listens on a pod's address: its containers are gRPC servers on loopback, and the
//! checkouts dial pod addresses through [`Network`].

use mcs_testkit as support;

use std::collections::BTreeMap;
use std::net::{IpAddr, Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::Client;
use kube::api::{Api, ListParams, Patch, PatchParams};
use mcs_core::ClusterId;
use mcs_core::api::v1alpha1;
use mcs_core::api::v1beta1::{ClusterProperty, ServiceExport, ServiceImport};
use mcs_core::api::{CLUSTER_ID_PROPERTY, ClusterPropertySpec, LABEL_SERVICE_NAME};
use mcs_kube::resolver::KubeResolver;

use crate::loyalty::{ADMIN, CLUSTERS, ClusterSet, GRPC, NAMESPACE, SERVICE, View};
use crate::pods::Network;

/// How long a change may take to show (the conformance budget for EndpointSlices).
const SETTLE: Duration = Duration::from_secs(60);
/// The field manager of the scenario's applies.
const MANAGER: &str = "loyalty-accrual-example";

/// A process that is killed when dropped (and, through `setpriv --pdeathsig`, when the
/// process that started it dies).
struct Process(Child);

impl Drop for Process {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// The ClusterSet on real API servers.
pub(crate) struct Real {
    clusters: BTreeMap<ClusterId, (support::TestCluster, Client)>,
    _processes: Vec<Process>,
    logs: tempfile::TempDir,
    dns: SocketAddr,
    network: Network,
}

/// The binaries `--real` needs, or what to do to get them.
pub(crate) struct Binaries {
    agent: PathBuf,
    dns: PathBuf,
}

impl Binaries {
    /// Finds `mcs-agent` and `mcs-dns` (in `$MCS_CLI_BIN`, else next to this program in the
    /// target directory) and the Kubernetes binaries (`$MCS_K8S_BIN`, else the cache of
    /// `scripts/k8s-bins.sh`); says how to build what is missing.
    pub(crate) fn find() -> Result<Self, String> {
        let k8s = quietly(support::bin_dir)
            .map_err(|message| format!("the Kubernetes binaries are missing: {message}"))?;
        let kubectl_hint = k8s.display();
        for (what, find) in [
            ("kwok", support::kwok_bin as fn() -> PathBuf),
            ("kwok's stages", support::kwok_stages),
        ] {
            quietly(find).map_err(|message| format!("{what} is missing: {message}"))?;
        }
        let cli = |name: &str| -> Result<PathBuf, String> {
            if let Some(dir) = std::env::var_os("MCS_CLI_BIN") {
                let path = Path::new(&dir).join(name);
                return if path.is_file() {
                    Ok(path)
                } else {
                    Err(format!(
                        "{} not found (MCS_CLI_BIN={})",
                        name,
                        path.display()
                    ))
                };
            }
            let exe = std::env::current_exe().map_err(|e| e.to_string())?;
            exe.ancestors()
                .skip(1)
                .take(3)
                .map(|dir| dir.join(name))
                .find(|p| p.is_file())
                .ok_or_else(|| {
                    format!(
                        "{name} not found next to {} or in $MCS_CLI_BIN: build it with \
                         `cargo build -p mcs-cli --release` (the same profile as this run)",
                        exe.display()
                    )
                })
        };
        let binaries = Self {
            agent: cli("mcs-agent")?,
            dns: cli("mcs-dns")?,
        };
        println!(
            "   binaries: {} and {}; Kubernetes from {kubectl_hint}",
            binaries.agent.display(),
            binaries.dns.display()
        );
        Ok(binaries)
    }
}

impl Real {
    /// Starts the clusters, the agents and north's DNS server.
    pub(crate) async fn start(binaries: &Binaries) -> Result<Self, String> {
        let started = Instant::now();
        let launches = CLUSTERS.iter().map(|&(name, pods, services)| async move {
            let options = support::ClusterOptions {
                controller_manager: true,
                install_crds: true,
                service_cidr: services.to_owned(),
                pod_cidr: Some(pods.to_owned()),
                ..Default::default()
            }
            .with_pods();
            support::start_clusters_with(&[name], options).await
        });
        let mut clusters = BTreeMap::new();
        for (started, (name, _, _)) in futures::future::join_all(launches)
            .await
            .into_iter()
            .zip(CLUSTERS)
        {
            let cluster = started
                .into_iter()
                .next()
                .ok_or("the harness started no cluster")?;
            let client = cluster.client().await;
            support::create_namespace(&client, NAMESPACE).await;
            let property = ClusterProperty::new(
                CLUSTER_ID_PROPERTY,
                ClusterPropertySpec { value: name.into() },
            );
            Api::<ClusterProperty>::all(client.clone())
                .patch(
                    CLUSTER_ID_PROPERTY,
                    &PatchParams::apply(MANAGER).force(),
                    &Patch::Apply(&property),
                )
                .await
                .map_err(|e| format!("{name}: apply ClusterProperty {CLUSTER_ID_PROPERTY}: {e}"))?;
            let id = ClusterId::new(name).map_err(|e| e.to_string())?;
            clusters.insert(id, (cluster, client));
        }
        println!(
            "   3 clusters (etcd, kube-apiserver, kube-controller-manager) up in {:.1} s",
            started.elapsed().as_secs_f64()
        );
        let logs = tempfile::Builder::new()
            .prefix("mcs-loyalty-")
            .tempdir()
            .map_err(|e| format!("log directory: {e}"))?;
        let members: Vec<String> = clusters
            .iter()
            .map(|(id, (c, _))| format!("--member={id}={}", c.kubeconfig_path().display()))
            .collect();
        let mut processes = Vec::new();
        for (id, (cluster, _)) in &clusters {
            // Its id from the ClusterProperty of the cluster it runs in (KUBECONFIG).
            let mut args = members.clone();
            args.push("--admin-listen=127.0.0.1:0".to_owned());
            processes.push(spawn(
                &binaries.agent,
                &args,
                &[("KUBECONFIG", cluster.kubeconfig_path().as_os_str())],
                &logs.path().join(format!("mcs-agent-{id}.log")),
            )?);
        }
        let north = clusters
            .iter()
            .find(|(id, _)| id.as_str() == "north")
            .map(|(_, (c, _))| c.kubeconfig_path())
            .ok_or("no north")?;
        let dns = free_port()?;
        processes.push(spawn(
            &binaries.dns,
            &[
                format!("--listen={dns}"),
                "--admin-listen=127.0.0.1:0".to_owned(),
                format!("--kubeconfig={}", north.display()),
            ],
            &[],
            &logs.path().join("mcs-dns-north.log"),
        )?);
        println!(
            "   mcs-agent in each cluster, mcs-dns for north on {dns}; logs in {}",
            logs.path().display()
        );
        Ok(Self {
            clusters,
            _processes: processes,
            logs,
            dns,
            network: Network::default(),
        })
    }

    fn client(&self, cluster: &ClusterId) -> Result<&Client, String> {
        self.clusters
            .get(cluster)
            .map(|(_, c)| c)
            .ok_or_else(|| format!("no cluster {cluster}"))
    }

    async fn view(&self, cluster: &ClusterId) -> Result<View, String> {
        let client = self.client(cluster)?;
        let err = |what: &str| {
            let what = what.to_owned();
            move |e: kube::Error| format!("{cluster}: read {what}: {e}")
        };
        let import = Api::<ServiceImport>::namespaced(client.clone(), NAMESPACE)
            .get_opt(SERVICE)
            .await
            .map_err(err("ServiceImport"))?;
        let export = Api::<ServiceExport>::namespaced(client.clone(), NAMESPACE)
            .get_opt(SERVICE)
            .await
            .map_err(err("ServiceExport"))?;
        let slices = Api::<EndpointSlice>::namespaced(client.clone(), NAMESPACE)
            .list(&ListParams::default().labels(&format!("{LABEL_SERVICE_NAME}={SERVICE}")))
            .await
            .map_err(err("EndpointSlices"))?
            .items;
        Ok(View {
            import,
            export,
            slices,
        })
    }
}

impl ClusterSet for Real {
    type Resolver = KubeResolver;

    async fn apply_service(&mut self, cluster: &ClusterId, service: Service) -> Result<(), String> {
        Api::<Service>::namespaced(self.client(cluster)?.clone(), NAMESPACE)
            .patch(
                SERVICE,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&service),
            )
            .await
            .map(drop)
            .map_err(|e| format!("{cluster}: apply Service {NAMESPACE}/{SERVICE}: {e}"))
    }

    async fn apply_export(
        &mut self,
        cluster: &ClusterId,
        export: v1alpha1::ServiceExport,
    ) -> Result<(), String> {
        Api::<v1alpha1::ServiceExport>::namespaced(self.client(cluster)?.clone(), NAMESPACE)
            .patch(
                SERVICE,
                &PatchParams::apply(MANAGER).force(),
                &Patch::Apply(&export),
            )
            .await
            .map(drop)
            .map_err(|e| {
                format!("{cluster}: apply v1alpha1 ServiceExport {NAMESPACE}/{SERVICE}: {e}")
            })
    }

    async fn pod_up(
        &mut self,
        cluster: &ClusterId,
        name: &str,
        _proposed: Ipv4Addr,
    ) -> Result<Ipv4Addr, String> {
        // A Pod as a controller would make it: kube-scheduler binds it to the cluster's
        // kwok Node, kwok runs it (Running, Ready, an address from the Node's pod CIDR).
        let client = self.client(cluster)?.clone();
        support::create(&client, NAMESPACE, &pod(name)).await;
        let pods =
            support::wait_ready_pods(&client, NAMESPACE, &format!("{POD_LABEL}={name}"), 1).await;
        pods.first()
            .into_iter()
            .flat_map(support::pod_ips)
            .find_map(|ip| match ip {
                IpAddr::V4(v4) => Some(v4),
                IpAddr::V6(_) => None,
            })
            .ok_or_else(|| format!("{cluster}: pod {NAMESPACE}/{name} got no IPv4 address"))
    }

    async fn pod_ready(
        &mut self,
        cluster: &ClusterId,
        name: &str,
        ready: bool,
    ) -> Result<(), String> {
        support::set_pod_ready(self.client(cluster)?, NAMESPACE, name, ready).await;
        Ok(())
    }

    async fn pod_gone(&mut self, cluster: &ClusterId, name: &str) -> Result<(), String> {
        support::delete_pod(self.client(cluster)?, NAMESPACE, name).await;
        Ok(())
    }

    async fn observe(
        &mut self,
        cluster: &ClusterId,
        settled: &dyn Fn(&View) -> bool,
    ) -> Result<View, String> {
        // Polls: the agents' writes arrive within the conformance budget or not at all.
        let deadline = Instant::now() + SETTLE;
        loop {
            let view = self.view(cluster).await?;
            if settled(&view) {
                return Ok(view);
            }
            if Instant::now() > deadline {
                println!(
                    "   {cluster} did not settle within {SETTLE:?}; the agents' logs are in {}",
                    self.logs.path().display()
                );
                return Ok(view);
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    fn resolver(&self, cluster: &ClusterId) -> KubeResolver {
        match self.clusters.get(cluster) {
            Some((_, client)) => KubeResolver::new(client.clone()),
            // Unreachable: the scenario only names members.
            None => unreachable!("no cluster {cluster}"),
        }
    }

    fn settle(&self) -> Duration {
        SETTLE
    }

    fn dns(&self) -> SocketAddr {
        self.dns
    }

    fn network(&self) -> &Network {
        &self.network
    }
}

/// Starts a binary with its output in `log`, through `setpriv --pdeathsig KILL` when there
/// is one.
fn spawn(
    exe: &Path,
    args: &[String],
    env: &[(&str, &std::ffi::OsStr)],
    log: &Path,
) -> Result<Process, String> {
    let file = std::fs::File::create(log).map_err(|e| format!("{}: {e}", log.display()))?;
    let setpriv = Command::new("setpriv")
        .args(["--pdeathsig", "KILL", "--", "true"])
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .status()
        .is_ok_and(|s| s.success());
    let mut cmd = if setpriv {
        let mut c = Command::new("setpriv");
        c.args(["--pdeathsig", "KILL", "--"]).arg(exe);
        c
    } else {
        Command::new(exe)
    };
    cmd.args(args)
        .env("RUST_LOG", "info")
        .env_remove("MCS_CLUSTER_ID")
        .stdin(Stdio::null())
        .stdout(file.try_clone().map_err(|e| e.to_string())?)
        .stderr(file);
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.spawn()
        .map(Process)
        .map_err(|e| format!("start {}: {e}", exe.display()))
}

/// A loopback address whose UDP and TCP port are both free now.
fn free_port() -> Result<SocketAddr, String> {
    for _ in 0..20 {
        let udp = std::net::UdpSocket::bind("127.0.0.1:0").map_err(|e| e.to_string())?;
        let addr = udp.local_addr().map_err(|e| e.to_string())?;
        if std::net::TcpListener::bind(addr).is_ok() {
            return Ok(addr);
        }
    }
    Err("no free loopback port for mcs-dns".to_owned())
}

/// Runs `f`, turning a panic into its message without printing it.
fn quietly<T>(f: impl FnOnce() -> T + std::panic::UnwindSafe) -> Result<T, String> {
    let hook = std::panic::take_hook();
    std::panic::set_hook(Box::new(|_| {}));
    let result = std::panic::catch_unwind(f);
    std::panic::set_hook(hook);
    result.map_err(|payload| {
        payload
            .downcast_ref::<String>()
            .cloned()
            .or_else(|| payload.downcast_ref::<&str>().map(|s| (*s).to_owned()))
            .unwrap_or_else(|| "unknown".to_owned())
    })
}

/// The label naming one scenario pod (the Service selects `app`).
const POD_LABEL: &str = "mcs-seed/pod";

/// A `loyalty-accrual` pod with its two container ports, for kwok to run.
fn pod(name: &str) -> k8s_openapi::api::core::v1::Pod {
    use k8s_openapi::api::core::v1::{Container, ContainerPort, Pod, PodSpec};
    let port = |name: &str, port: u16| ContainerPort {
        name: Some(name.to_owned()),
        container_port: i32::from(port),
        ..Default::default()
    };
    Pod {
        metadata: kube::api::ObjectMeta {
            name: Some(name.to_owned()),
            labels: Some(BTreeMap::from([
                ("app".to_owned(), SERVICE.to_owned()),
                (POD_LABEL.to_owned(), name.to_owned()),
            ])),
            ..Default::default()
        },
        spec: Some(PodSpec {
            containers: vec![Container {
                name: "accrual".to_owned(),
                image: Some("loyalty-accrual:seed".to_owned()),
                ports: Some(vec![port("grpc", GRPC), port("admin", ADMIN)]),
                ..Default::default()
            }],
            ..Default::default()
        }),
        status: None,
    }
}
