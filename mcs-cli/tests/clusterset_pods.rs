//! A ClusterSet of three clusters through mcs running as Pods, in both topologies: east,
//! west and north, each with a real node (kubelet and containerd, `support/node.rs`) in the
//! dataplane lab, get `charts/mcs` installed with Helm 4. In mesh mode each agent reads the
//! other two members with the kubeconfig of a Secret (identity `mcs-peer`, bound to the
//! chart's peer-reader ClusterRole there); in hub mode a fourth API server, the hub, gets
//! the chart's hub release (the MemberExport CRD, the shared roles, a namespace per member)
//! and each agent reads and writes only the hub with its own identity (`mcs:member:<id>`).
//! Every API server is reached at the lab's address.
//!
//! Then the seed scenario in containers: `loyalty-accrual` (the seed crate's gRPC server,
//! in an image of its own) runs as 3 Pods in east and 4 in west behind a Service exported
//! with a `v1alpha1` ServiceExport; north, which runs none, gets a ServiceImport with a
//! ClusterSetIP from its own service CIDR and EndpointSlices from both sources. In north two checkout Pods (the seed's
//! `checkout` program) call `loyalty.Accrual/Accrue` on
//! `loyalty-accrual.loyalty.svc.clusterset.local:9443`: a plain gRPC client, which resolves
//! the name through north's CoreDNS and the chart's DNS server and calls the ClusterSetIP
//! through north's kube-proxy, and one through `mcs-client` with the Kubernetes resolver
//! (the Pod's ServiceAccount reads the imports and slices), which dials the Pods of east
//! and west itself. Both are answered by Pods of both clusters, over the lab's routes
//! between nodes. The checkout through `mcs-client` goes on calling while east scales to 0
//! (then only west answers) and west rolls out to new Pods (then only those answer), and
//! none of its calls fails.
//!
//! Then the lifecycle, with that checkout still calling and a Pod in north resolving the name
//! every 200 ms: `helm upgrade` rolls north's agent to a new Pod (north's import is never
//! deleted, its slices never empty, every DNS answer is the ClusterSetIP); north's agent
//! container is killed while its node's kubelet is down and west's exports change meanwhile
//! (a scale-up, a second exported Service), and once kubelet restarts it the agent
//! converges; `kubectl get serviceimports` in north and `kubectl mcs check` of the three
//! members show what a user sees, and pass; last, `helm uninstall` in east: after the
//! grace period north serves west's endpoints only, though east's Pods still run.
//!
//! Needs root and what `scripts/test.sh` installs (kubelet, containerd, helm, umoci,
//! skopeo), and the seed's programs built beside `mcs-agent` (`cargo test --workspace`,
//! as `scripts/test.sh` runs, builds them).

use mcs_testkit as support;

use std::collections::{BTreeMap, BTreeSet};
use std::path::Path;
use std::time::Duration;

use k8s_openapi::api::apps::v1::Deployment;
use k8s_openapi::api::core::v1::{Pod, Secret};
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use mcs_core::api::v1beta1::ServiceImport;
use support::netlab::{LAB_DUMMY, Lab};

const CLUSTERS: [&str; 3] = ["east", "west", "north"];
const RELEASE: &str = "mcs";
const RELEASE_NS: &str = "mcs-system";
const NS: &str = "loyalty";
const SERVICE: &str = "loyalty-accrual";
/// The identity every member's agent reads its peers with.
const PEER_USER: &str = "mcs-peer";
/// The fixed ClusterIP of north's DNS Service (this address of north's service CIDR), so
/// that the chart renders its CoreDNS server block at install. In the range's lower band,
/// which the API server keeps for fixed addresses: it gives Services without one an address
/// above it while it has any (KEP-3070; for a /24, the band is the first 16 addresses).
/// `.53` collided with a Service created earlier ("provided IP is already allocated").
const NORTH_DNS_HOST: u32 = 11;
/// Calls each checkout Pod makes. kube-proxy picks a backend at random for each connection
/// of the plain client: seven backends, 3 in east and 4 in west, so one cluster missing by
/// chance has odds under (4/7)^30, 5 in 10^8.
const CALLS: usize = 30;
/// The service's port (the seed's gRPC server listens there).
const PORT: u16 = 9443;
/// Backends in each serving cluster.
const REPLICAS: [(&str, usize); 2] = [("east", 3), ("west", 4)];
/// The checkout Pod through mcs-client, which calls until the test stops it.
const CHECKOUT: &str = "checkout-mcs";
/// The image of the seed's programs (`loyalty-accrual`, `checkout`), made by the test.
const SEED_IMAGE: &str = "localhost/mcs-seed:1";
/// The Pod resolving the service's name in north again and again, until the test stops it.
const DNS_WATCH: &str = "dns-watch";
/// The agents' grace period for a member that is gone (`agent.unreachableGraceSeconds`),
/// shortened from the chart's 60 s so that the test sees a member leave.
const GRACE_SECONDS: u64 = 10;
/// Seconds of each member's Lease on the hub (`agent.hub.leaseSeconds`): the hub topology's
/// way to see a member gone, shortened from the chart's 40 s.
const HUB_LEASE_SECONDS: u64 = 15;

/// How the members' agents find each other's exports.
#[derive(Clone, Copy, Debug, PartialEq)]
enum Topology {
    /// Each agent reads every peer's API server.
    Mesh,
    /// Each agent reads and writes only a hub API server.
    Hub,
}

#[test]
fn three_clusters_mesh_through_the_charts_agent_pods() {
    support::netlab::with_lab(|lab| Box::pin(clusterset(lab, Topology::Mesh)));
}

#[test]
fn three_members_share_a_hub_through_the_charts_agent_pods() {
    support::netlab::with_lab(|lab| Box::pin(clusterset(lab, Topology::Hub)));
}

/// Not a check: the playground of `scripts/playground.sh`, which sets `MCS_PLAYGROUND_DIR`
/// (and `MCS_PLAYGROUND_TOPOLOGY`, `mesh` or `hub`). It brings up what the tests above start
/// from ([`bring_up`], and CoreDNS in north), writes a kubeconfig of every cluster (contexts
/// `east`, `west`, `north`, and `hub`) to `<dir>/kubeconfig` and the name of the lab's
/// network namespace (where the API servers listen) to `<dir>/netns`, creates `<dir>/ready`, and
/// keeps everything running until `<dir>/stop` exists; then it tears everything down.
#[test]
#[ignore = "a playground for people, not a check: scripts/playground.sh runs it"]
fn playground() {
    let dir = std::env::var_os("MCS_PLAYGROUND_DIR")
        .map(std::path::PathBuf::from)
        .expect("MCS_PLAYGROUND_DIR: scripts/playground.sh runs this");
    let topology = match std::env::var("MCS_PLAYGROUND_TOPOLOGY").as_deref() {
        Ok("hub") => Topology::Hub,
        Ok("mesh") | Err(_) => Topology::Mesh,
        Ok(other) => panic!("MCS_PLAYGROUND_TOPOLOGY={other}: mesh or hub"),
    };
    support::netlab::with_lab(|lab| Box::pin(play(lab, topology, dir)));
}

/// [`playground`]'s body.
async fn play(lab: &mut Lab, topology: Topology, dir: std::path::PathBuf) {
    let set = bring_up(lab, topology).await;
    support::cluster_dns::deploy(&set.clients[2], lab.kubelet(2), "mcs-coredns").await;
    let mut merged: Option<kube::config::Kubeconfig> = None;
    for cluster in set.clusters.iter().chain(&set.hub) {
        let one = kube::config::Kubeconfig::read_from(cluster.kubeconfig_path())
            .expect("a cluster's kubeconfig");
        merged = Some(match merged {
            None => one,
            Some(all) => all.merge(one).expect("merge the kubeconfigs"),
        });
    }
    let kubeconfig = dir.join("kubeconfig");
    support::write_kubeconfig(&kubeconfig, &merged.expect("a cluster"));
    println!(
        "playground: {topology:?}; kubeconfig {} (contexts {}); kubectl in {}; kubectl-mcs in {}",
        kubeconfig.display(),
        set.clusters
            .iter()
            .chain(&set.hub)
            .map(|c| c.name())
            .collect::<Vec<_>>()
            .join(", "),
        support::bin_dir().display(),
        bin_dir().display(),
    );
    // The API servers listen in the lab's network namespace: kubectl runs there.
    std::fs::write(dir.join("netns"), lab.netns()).expect("write the netns file");
    std::fs::write(dir.join("ready"), "").expect("write the ready file");
    // A person stops it, whenever: nothing here to wait on but the file.
    let stop = dir.join("stop");
    while !stop.exists() {
        lab.assert_running();
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    println!("playground: stopping");
}

/// `cluster`'s kubeconfig as `user` in `groups`, with the API server at the lab's address,
/// where Pods reach it (its certificate names that address), as a file's contents.
fn lab_kubeconfig(
    cluster: &support::TestCluster,
    user: &str,
    groups: &[&str],
    scratch: &Path,
) -> String {
    let mut kubeconfig = cluster.kubeconfig_as_user(user, groups);
    let port = cluster.server_url().rsplit(':').next().unwrap().to_owned();
    for named in &mut kubeconfig.clusters {
        if let Some(c) = named.cluster.as_mut() {
            c.server = Some(format!("https://{LAB_DUMMY}:{port}"));
        }
    }
    let file = tempfile::NamedTempFile::new_in(scratch).unwrap();
    support::write_kubeconfig(file.path(), &kubeconfig);
    std::fs::read_to_string(file.path()).unwrap()
}

/// Creates Secret `mcs-system/<name>` holding `kubeconfig` (key `kubeconfig`).
async fn kubeconfig_secret(client: &kube::Client, name: &str, kubeconfig: String) {
    let secret: Secret = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "stringData": { "kubeconfig": kubeconfig },
    }))
    .unwrap();
    Api::<Secret>::namespaced(client.clone(), RELEASE_NS)
        .create(&PostParams::default(), &secret)
        .await
        .unwrap_or_else(|e| panic!("create Secret {name}: {e}"));
}

/// `helm install <release> charts/mcs` into `cluster` with `values`.
fn helm_install(
    cluster: &support::TestCluster,
    release: &str,
    values: &serde_json::Value,
    scratch: &Path,
) {
    let values_file = scratch.join(format!("values-{release}-{}.json", cluster.name()));
    std::fs::write(&values_file, values.to_string()).unwrap();
    let values_file = values_file.to_str().unwrap();
    let args = [
        "install",
        "--create-namespace",
        "--values",
        values_file,
        "--wait=hookOnly",
    ];
    support::helm_mcs_chart(cluster, scratch, &args, release, RELEASE_NS);
}

/// The three clusters of [`bring_up`], mcs installed and the seed's server running.
struct Set {
    /// east, west and north ([`CLUSTERS`]).
    clusters: Vec<support::TestCluster>,
    /// The hub, in the hub topology.
    hub: Option<support::TestCluster>,
    /// An admin client of each of [`Set::clusters`].
    clients: Vec<kube::Client>,
    /// The ready `loyalty-accrual` Pods' addresses, by serving cluster.
    backends: BTreeMap<&'static str, BTreeSet<String>>,
    /// Helm's state, the images, the values files (removed after the clusters stop).
    scratch: tempfile::TempDir,
}

/// The folder of this test build's binaries (`mcs-agent`, `kubectl-mcs`, the seed's).
fn bin_dir() -> &'static Path {
    Path::new(env!("CARGO_BIN_EXE_mcs-agent")).parent().unwrap()
}

/// east, west and north with a real node each in `lab`, `charts/mcs` installed in each in
/// `topology` (and the hub's release on a fourth API server in the hub topology), the
/// agents and DNS servers available, and `loyalty-accrual` running and exported in east
/// (3 Pods) and west (4).
async fn bring_up(lab: &mut Lab, topology: Topology) -> Set {
    let scratch = tempfile::tempdir().unwrap();
    let bin_dir = bin_dir();
    let archive =
        support::build_mcs_image_off_thread(bin_dir, scratch.path().join("image"), "test")
            .await
            .archive;
    let seed_archive = {
        let (bin_dir, dir) = (bin_dir.to_owned(), scratch.path().join("seed-image"));
        tokio::task::spawn_blocking(move || {
            std::fs::create_dir_all(&dir).unwrap();
            let files =
                support::node::program_files(&bin_dir, &["loyalty-accrual", "checkout"], &dir);
            let files: Vec<_> = files
                .iter()
                .map(|(f, at)| (f.clone(), at.as_str()))
                .collect();
            support::node::pack_image(&dir, "mcs-seed", &files, &["/usr/local/bin/checkout"])
        })
        .await
        .unwrap()
    };
    let clusters = support::start_clusters_with(
        &CLUSTERS,
        support::ClusterOptions {
            kubelet_nodes: true,
            ..support::ClusterOptions::default().with_pods()
        },
    )
    .await;
    let mut clients = Vec::new();
    for (i, cluster) in clusters.iter().enumerate() {
        assert_eq!(lab.add_node(cluster), i);
        let node = lab.add_kubelet(i, cluster).await;
        node.import_image(&archive);
        node.import_image(&seed_archive);
        clients.push(cluster.client().await);
    }

    // The hub: an API server with no node, reached by the members' Pods at the lab's address.
    let hub = match topology {
        Topology::Mesh => None,
        Topology::Hub => {
            let hub = support::start_cluster(
                "hub",
                support::ClusterOptions {
                    kubelet_nodes: true,
                    ..support::ClusterOptions::api_only()
                },
            )
            .await;
            helm_install(
                &hub,
                "mcs-hub",
                &serde_json::json!({
                    "agent": { "enabled": false },
                    "dns": { "enabled": false },
                    "dashboard": { "enabled": false },
                    "metrics": { "service": { "enabled": false } },
                    "hub": { "installCRD": true, "rbac": { "create": true }, "members": CLUSTERS },
                }),
                scratch.path(),
            );
            Some(hub)
        }
    };

    // Each member: the kubeconfigs its agent uses as Secrets, then helm install.
    for (i, cluster) in clusters.iter().enumerate() {
        let name = CLUSTERS[i];
        let client = &clients[i];
        support::create_namespace(client, RELEASE_NS).await;
        let node = format!("{name}-kubelet");
        let mut values = serde_json::json!({
            "clusterId": name,
            "image": { "tag": "test", "pullPolicy": "Never" },
            "agent": {
                // The scheduler's other Node is kwok's, which runs no container.
                "nodeSelector": { "kubernetes.io/hostname": node },
                "unreachableGraceSeconds": GRACE_SECONDS,
            },
            "dns": { "replicas": 1, "nodeSelector": { "kubernetes.io/hostname": node } },
        });
        match &hub {
            None => {
                let mut peers = Vec::new();
                for (j, peer) in clusters.iter().enumerate().filter(|(j, _)| *j != i) {
                    let secret = format!("mcs-peer-{}", CLUSTERS[j]);
                    let kubeconfig = lab_kubeconfig(peer, PEER_USER, &[], scratch.path());
                    kubeconfig_secret(client, &secret, kubeconfig).await;
                    peers.push(serde_json::json!({ "name": CLUSTERS[j], "secretName": secret }));
                }
                values["agent"]["mesh"] = serde_json::json!({ "peers": peers });
                values["peerReader"] =
                    serde_json::json!({ "subjects": [{ "kind": "User", "name": PEER_USER }] });
            }
            Some(hub) => {
                let kubeconfig = lab_kubeconfig(
                    hub,
                    &format!("mcs:member:{name}"),
                    &["mcs:members"],
                    scratch.path(),
                );
                kubeconfig_secret(client, "mcs-hub", kubeconfig).await;
                values["agent"]["mode"] = "hub".into();
                values["agent"]["hub"] = serde_json::json!({
                    "secretName": "mcs-hub",
                    "leaseSeconds": HUB_LEASE_SECONDS,
                });
            }
        }
        if name == "north" {
            let dns_ip = support::service_address(cluster.service_cidr(), NORTH_DNS_HOST);
            values["dns"]["service"] = serde_json::json!({ "clusterIP": dns_ip.to_string() });
            values["coredns"] = serde_json::json!({ "snippetConfigMap": { "enabled": true } });
        }
        helm_install(cluster, RELEASE, &values, scratch.path());
    }
    for (i, client) in clients.iter().enumerate() {
        for deployment in ["mcs-agent", "mcs-dns"] {
            available(client, RELEASE_NS, deployment, 1, || {
                lab.kubelet(i)
                    .container_logs(RELEASE_NS, "mcs-agent-", "agent", 20)
            })
            .await;
        }
    }

    // loyalty-accrual in east and west: the seed's gRPC server, answering with its cluster
    // and Pod address.
    let mut backends = BTreeMap::new();
    for (i, client) in clients.iter().enumerate() {
        support::create_namespace(client, NS).await;
        let name = CLUSTERS[i];
        let Some(&(_, replicas)) = REPLICAS.iter().find(|(c, _)| *c == name) else {
            continue;
        };
        let deployment: Deployment = serde_json::from_value(serde_json::json!({
            "metadata": { "name": SERVICE },
            "spec": {
                "replicas": replicas,
                "selector": { "matchLabels": { "app": SERVICE } },
                "template": {
                    "metadata": { "labels": { "app": SERVICE } },
                    "spec": {
                        "nodeSelector": { "kubernetes.io/hostname": format!("{name}-kubelet") },
                        "terminationGracePeriodSeconds": 1,
                        "automountServiceAccountToken": false,
                        "containers": [{
                            "name": "server",
                            "image": SEED_IMAGE,
                            "imagePullPolicy": "Never",
                            "command": ["/usr/local/bin/loyalty-accrual"],
                            "env": [
                                { "name": "CLUSTER", "value": name },
                                { "name": "POD_IP",
                                  "valueFrom": { "fieldRef": { "fieldPath": "status.podIP" } } },
                            ],
                            "ports": [{ "name": "grpc", "containerPort": PORT }],
                            "readinessProbe": {
                                "tcpSocket": { "port": PORT },
                                "periodSeconds": 1,
                            },
                        }],
                    },
                },
            },
        }))
        .unwrap();
        Api::<Deployment>::namespaced(client.clone(), NS)
            .create(&PostParams::default(), &deployment)
            .await
            .unwrap();
        let service = support::service(SERVICE, SERVICE, &[("grpc", PORT.into(), "TCP")], false);
        // The export as the seed's owners write it: multicluster.x-k8s.io/v1alpha1 (the
        // CRD serves it beside v1beta1, which the agent reads).
        Api::<k8s_openapi::api::core::v1::Service>::namespaced(client.clone(), NS)
            .create(&PostParams::default(), &service)
            .await
            .unwrap();
        let export: mcs_core::api::v1alpha1::ServiceExport =
            serde_json::from_value(serde_json::json!({
                "apiVersion": "multicluster.x-k8s.io/v1alpha1",
                "kind": "ServiceExport",
                "metadata": { "name": SERVICE, "namespace": NS },
            }))
            .unwrap();
        Api::<mcs_core::api::v1alpha1::ServiceExport>::namespaced(client.clone(), NS)
            .create(&PostParams::default(), &export)
            .await
            .unwrap();
        available(client, NS, SERVICE, replicas as i32, || {
            format!(
                "{}\nkubelet:\n{}",
                lab.kubelet(i).container_logs(NS, SERVICE, "server", 20),
                lab.kubelet(i).log_tail("kubelet", 20)
            )
        })
        .await;
        let ips = support::cluster_dns::pod_ips(client, NS, &format!("app={SERVICE}")).await;
        assert_eq!(ips.len(), replicas, "{name}'s backends: {ips:?}");
        backends.insert(name, ips);
    }
    Set {
        clusters,
        hub,
        clients,
        backends,
        scratch,
    }
}

async fn clusterset(lab: &mut Lab, topology: Topology) {
    let set = bring_up(lab, topology).await;
    let (clusters, clients, backends) = (&set.clusters, &set.clients, &set.backends);
    let scratch = &set.scratch;
    let bin_dir = bin_dir();

    // north imports it: a ClusterSetIP from north's service CIDR, slices from both sources.
    let north = &clients[2];
    let imports: Api<ServiceImport> = Api::namespaced(north.clone(), NS);
    let imported =
        kube::runtime::wait::await_condition(imports, SERVICE, |si: Option<&ServiceImport>| {
            si.is_some_and(|si| si.spec.ips.is_some())
        });
    let si = match tokio::time::timeout(Duration::from_secs(120), imported).await {
        Ok(Ok(Some(si))) => si,
        other => panic!(
            "north has no ServiceImport with a ClusterSetIP ({other:?}); north's agent:\n{}",
            lab.kubelet(2)
                .container_logs(RELEASE_NS, "mcs-agent-", "agent", 30)
        ),
    };
    let ip: std::net::Ipv4Addr = si.spec.ips.unwrap()[0].parse().unwrap();
    let north_cidr = clusters[2].service_cidr();
    assert_eq!(
        ip.octets()[..3],
        support::service_address(north_cidr, 0).octets()[..3],
        "the ClusterSetIP {ip} comes from north's service CIDR {north_cidr}"
    );
    // north's kube-proxy routes it to every backend: the agent wrote the endpoints of both
    // clusters into north.
    let all: BTreeSet<String> = backends.values().flatten().cloned().collect();
    lab.wait_kube_proxy_endpoints(2, (ip, PORT).into(), &all)
        .await;
    let by_source = endpoints_by_source(north).await;
    let expected: BTreeMap<String, BTreeSet<String>> = backends
        .iter()
        .map(|(k, v)| (k.to_string(), v.clone()))
        .collect();
    assert_eq!(
        by_source, expected,
        "north's EndpointSlices by source cluster"
    );

    // A Pod in north resolves the name the normal way and is answered from both clusters.
    support::cluster_dns::deploy(north, lab.kubelet(2), "mcs-coredns").await;
    let coredns = support::cluster_dns::pod_ips(north, "kube-system", "k8s-app=kube-dns").await;
    let cluster_dns = lab.kubelet(2).cluster_dns();
    lab.wait_kube_proxy_endpoints(2, (cluster_dns, 53).into(), &coredns)
        .await;
    let mcs_dns = support::cluster_dns::pod_ips(
        north,
        RELEASE_NS,
        "app.kubernetes.io/component=dns,app.kubernetes.io/instance=mcs",
    )
    .await;
    let north_dns = support::service_address(clusters[2].service_cidr(), NORTH_DNS_HOST);
    lab.wait_kube_proxy_endpoints(2, (north_dns, 53).into(), &mcs_dns)
        .await;
    let name = format!("{SERVICE}.{NS}.svc.clusterset.local");
    let pods: BTreeMap<String, &str> = backends
        .iter()
        .flat_map(|(cluster, ips)| ips.iter().map(|ip| (format!("{ip}:{PORT}"), *cluster)))
        .collect();

    // The plain gRPC client: the name through north's DNS, the ClusterSetIP through
    // kube-proxy.
    let container = serde_json::json!({
        "image": SEED_IMAGE,
        "command": ["/usr/local/bin/checkout", "plain", CALLS.to_string()],
    });
    let (ok, out) = support::cluster_dns::run_container_to_completion(
        north,
        lab.kubelet(2),
        NS,
        "checkout-plain",
        container,
        None,
        None,
    )
    .await;
    let stdout = container_stdout(&out);
    assert!(
        ok && stdout.contains(&format!("resolved {ip}:{PORT}").as_str()),
        "the plain client resolved {name} to {ip} and every call was answered:\n{out}"
    );
    assert_answered(
        &stdout,
        &pods,
        "the plain client through the ClusterSetIP",
        &out,
    );

    // The checkout through mcs-client: the Pods' addresses from north's imports (its
    // ServiceAccount may read them), each call balanced and dialled by the client. It calls
    // all along, every 20 ms, until the test creates the file `stop` in a folder it mounts,
    // while east scales to 0 and west rolls out to new Pods; no call may fail.
    grant_import_reader(north, "checkout").await;
    let signal = scratch.path().join("signal");
    std::fs::create_dir(&signal).unwrap();
    let container = serde_json::json!({
        "image": SEED_IMAGE,
        "command": ["/usr/local/bin/checkout", "mcs", "--until", "/signal/stop"],
        "env": [{ "name": "CLUSTER", "value": "north" }],
        "volumeMounts": [{ "name": "signal", "mountPath": "/signal", "readOnly": true }],
    });
    let volume = serde_json::json!({
        "name": "signal",
        "hostPath": { "path": signal, "type": "Directory" },
    });
    support::cluster_dns::start_container(
        north,
        lab.kubelet(2),
        NS,
        CHECKOUT,
        container,
        Some("checkout"),
        Some(volume.clone()),
    )
    .await;
    let stdout = checkout_answers(north, lab.kubelet(2), 0, CALLS, "from the start").await;
    assert_answered_by(
        &answers(&stdout)[..CALLS],
        &pods,
        &["east", "west"],
        "the checkout through mcs-client",
        &stdout.join("\n"),
    );

    // east scales to 0: once its Pods are gone and north's slices have none of them, every
    // answer is west's.
    let east = &clients[0];
    support::scale_deployment(east, NS, SERVICE, 0).await;
    wait_until("east has no loyalty-accrual Pod", || async move {
        Api::<Pod>::namespaced(east.clone(), NS)
            .list(&ListParams::default().labels(&format!("app={SERVICE}")))
            .await
            .is_ok_and(|l| l.items.is_empty())
    })
    .await;
    let west_only = &BTreeMap::from([("west".to_owned(), backends["west"].clone())]);
    wait_until("north's slices have only west's endpoints", || async move {
        endpoints_by_source(north).await == *west_only
    })
    .await;
    next_answers_from_west(north, lab.kubelet(2), &backends["west"], "east scaled to 0").await;

    // west rolls out to new Pods (new addresses): once north's slices have only the new
    // ones, they answer.
    let west = &clients[1];
    Api::<Deployment>::namespaced(west.clone(), NS)
        .patch(
            SERVICE,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "template": { "metadata": {
                "annotations": { "mcs.test/rollout": "1" } } } } })),
        )
        .await
        .unwrap();
    let old = &backends["west"];
    let west_replicas = REPLICAS[1].1;
    let what = format!("west's rollout to {west_replicas} new Pods (before: {old:?})");
    let new = support::wait_for(&what, WAIT, || async move {
        // Every Pod of the Deployment, terminating or not, is a new one and ready.
        let all = Api::<Pod>::namespaced(west.clone(), NS)
            .list(&ListParams::default().labels(&format!("app={SERVICE}")))
            .await
            .map(|l| l.items.len())
            .unwrap_or_default();
        let ready = support::cluster_dns::pod_ips(west, NS, &format!("app={SERVICE}")).await;
        (all == west_replicas && ready.len() == west_replicas && ready.is_disjoint(old))
            .then_some(ready)
    })
    .await;
    let west_new = &BTreeMap::from([("west".to_owned(), new.clone())]);
    wait_until(
        "north's slices have west's new endpoints only",
        || async move { endpoints_by_source(north).await == *west_new },
    )
    .await;
    next_answers_from_west(north, lab.kubelet(2), &new, "west rolled out").await;

    // A Pod in north resolves the name through north's CoreDNS (and the chart's DNS server)
    // every 200 ms through the agent's upgrade below, one line an answer:
    // `ok` when the answer is the ClusterSetIP, else `FAILED`.
    let dns_watch = format!(
        "while [ ! -e /signal/dns-stop ]; do \
           if nslookup -type=a {name} 2>&1 | grep -q 'Address: {ip}$'; \
           then echo ok; else echo \"FAILED $(date +%T)\"; fi; \
           sleep 0.2; \
         done"
    );
    support::cluster_dns::start_container(
        north,
        lab.kubelet(2),
        NS,
        DNS_WATCH,
        serde_json::json!({
            "image": support::node::BUSYBOX_IMAGE,
            "command": ["/bin/sh", "-c", dns_watch],
            "volumeMounts": [{ "name": "signal", "mountPath": "/signal", "readOnly": true }],
        }),
        None,
        Some(volume),
    )
    .await;
    let node = lab.kubelet(2);
    support::wait_for("north's DNS watch answered", WAIT, || {
        let log = node.container_output(NS, &format!("{DNS_WATCH}_"), "run");
        std::future::ready(container_stdout(&log).contains(&"ok").then_some(()))
    })
    .await;

    // helm upgrade of north's release with a changed value rolls its agent to a new Pod.
    // Through it north's import and slices stay (watched: the import never deleted, the
    // slices never without an endpoint), the checkout's calls go on, and then the new agent
    // follows a change (west scaled to 3).
    let watched = watch_import_and_slices(north);
    let agents = Api::<Pod>::namespaced(north.clone(), RELEASE_NS);
    let agent_selector = "app.kubernetes.io/component=agent,app.kubernetes.io/instance=mcs";
    let old_agents: BTreeSet<String> = agents
        .list(&ListParams::default().labels(agent_selector))
        .await
        .unwrap()
        .items
        .iter()
        .filter_map(|p| p.metadata.uid.clone())
        .collect();
    support::helm_mcs_chart(
        &clusters[2],
        scratch.path(),
        &[
            "upgrade",
            "--reuse-values",
            "--set",
            "agent.logLevel=debug",
            "--wait=hookOnly",
        ],
        RELEASE,
        RELEASE_NS,
    );
    let agent = support::wait_for("north's agent rolled to a new, ready Pod", WAIT, || async {
        let list = agents
            .list(&ListParams::default().labels(agent_selector))
            .await
            .ok()?;
        match &list.items[..] {
            [pod]
                if !old_agents.contains(pod.metadata.uid.as_deref().unwrap_or_default())
                    && ready(pod) =>
            {
                Some(pod.clone())
            }
            _ => None,
        }
    })
    .await;
    support::scale_deployment(west, NS, SERVICE, 3).await;
    wait_until("north's slices follow west's scale-down to 3", || async {
        let by_source = endpoints_by_source(north).await;
        by_source.len() == 1
            && by_source
                .get("west")
                .is_some_and(|ips| ips.len() == 3 && ips.is_subset(&new))
    })
    .await;
    let from = checkout_answers(north, lab.kubelet(2), 0, 0, "the upgrade")
        .await
        .len();
    checkout_answers(north, lab.kubelet(2), from, CALLS, "the upgrade").await;

    // Every DNS answer of the watch, through the upgrade, was the ClusterSetIP.
    std::fs::write(signal.join("dns-stop"), "").unwrap();
    let (ok, out) =
        support::cluster_dns::container_finished(north, lab.kubelet(2), NS, DNS_WATCH).await;
    let stdout = container_stdout(&out);
    let answered = stdout.iter().filter(|l| **l == "ok").count();
    assert!(
        ok && answered > 0 && answered == stdout.len(),
        "north's Pod resolved {name} to {ip} every time through the agent's upgrade \
         ({answered} of {} answers):\n{out}",
        stdout.len()
    );

    // north's agent killed while its node's kubelet is down, and west's exports change
    // meanwhile: west scales to 4 and exports a second Service. kubelet, started again,
    // restarts the agent's container, which converges: north's slices have west's 4
    // endpoints and north imports the new Service. The same watch runs through it.
    let agent_name = agent.metadata.name.clone().unwrap_or_default();
    let container_id = agent_container(&agent)
        .and_then(|c| c.container_id.clone())
        .expect("the agent's container ID");
    let restarts = agent_container(&agent).map_or(0, |c| c.restart_count);
    lab.kubelet(2).stop_kubelet();
    lab.kubelet(2).kill_container(&container_id);
    support::scale_deployment(west, NS, SERVICE, 4).await;
    let ledger = support::service(
        "loyalty-ledger",
        "loyalty-ledger",
        &[("grpc", PORT.into(), "TCP")],
        false,
    );
    support::create_exported_service(west, NS, &ledger).await;
    lab.kubelet(2).start_kubelet();
    let agent_restarted = format!("north's agent {agent_name} restarted by kubelet and ready");
    support::wait_for(&agent_restarted, WAIT, || async {
        let pod = agents.get(&agent_name).await.ok()?;
        let restarted = agent_container(&pod).is_some_and(|c| c.restart_count > restarts);
        (restarted && ready(&pod)).then_some(())
    })
    .await;
    let west_now = support::wait_for("west's 4 ready Pods", WAIT, || async {
        let ips = support::cluster_dns::pod_ips(west, NS, &format!("app={SERVICE}")).await;
        (ips.len() == 4).then_some(ips)
    })
    .await;
    let west_only = &BTreeMap::from([("west".to_owned(), west_now.clone())]);
    wait_until(
        "north's slices have west's 4 endpoints after the agent's restart",
        || async move { endpoints_by_source(north).await == *west_only },
    )
    .await;
    wait_until("north imports west's second Service", || async {
        Api::<ServiceImport>::namespaced(north.clone(), NS)
            .get_opt("loyalty-ledger")
            .await
            .is_ok_and(|si| si.is_some())
    })
    .await;
    let trouble = watched.stop().await;
    assert!(
        trouble.is_empty(),
        "north's import and slices through helm upgrade and the agent's restart: {trouble:#?}"
    );
    next_answers_from_west(north, lab.kubelet(2), &west_now, "the agent's restart").await;

    // east serves again: 3 new Pods, in north's slices beside west's.
    support::scale_deployment(east, NS, SERVICE, 3).await;
    available(east, NS, SERVICE, 3, || {
        lab.kubelet(0).container_logs(NS, SERVICE, "server", 20)
    })
    .await;
    let east_now = support::cluster_dns::pod_ips(east, NS, &format!("app={SERVICE}")).await;
    let both = &BTreeMap::from([
        ("east".to_owned(), east_now.clone()),
        ("west".to_owned(), west_now.clone()),
    ]);
    wait_until(
        "north's slices have east's new endpoints and west's",
        || async move { endpoints_by_source(north).await == *both },
    )
    .await;

    // What a user sees with kubectl: north's import.
    let kubeconfig =
        std::env::join_paths(clusters.iter().map(|c| c.kubeconfig_path())).expect("kubeconfigs");
    // kubectl finds the plugin kubectl-mcs on PATH, beside mcs-agent.
    let path = std::env::join_paths(std::iter::once(bin_dir.to_path_buf()).chain(
        std::env::split_paths(&std::env::var_os("PATH").unwrap_or_default()),
    ))
    .unwrap();
    let kubectl = |args: &[&str]| {
        let out = std::process::Command::new(support::bin_dir().join("kubectl"))
            .args(args)
            .env("KUBECONFIG", &kubeconfig)
            .env("PATH", &path)
            .stdin(std::process::Stdio::null())
            .output()
            .expect("run kubectl");
        let text = format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        );
        (out.status.success(), text)
    };
    let (ok, imports) = kubectl(&["get", "serviceimports", "-n", NS, "--context", "north"]);
    let row = imports.lines().find(|l| l.starts_with(SERVICE));
    assert!(
        ok && row.is_some_and(|r| r.contains("ClusterSetIP") && r.contains(&ip.to_string())),
        "kubectl get serviceimports -n {NS} --context north shows {SERVICE} as ClusterSetIP \
         {ip}:\n{imports}"
    );
    // And the plugin's pre-flight checks of the three members pass: the chart's agents,
    // CRDs, ClusterProperties and RBAC, north's CoreDNS forwarding clusterset.local, no
    // overlapping ranges.
    let (ok, report) = kubectl(&[
        "mcs",
        "check",
        "--context",
        "east",
        "--context",
        "west",
        "--context",
        "north",
    ]);
    assert!(
        ok && report.contains("PASSED: 0 problem(s)"),
        "kubectl mcs check of east, west and north:\n{report}"
    );

    // helm uninstall in east: east leaves the ClusterSet while its Pods still run. Once
    // north's agent has seen it gone for the grace period (mesh: east refuses north's reads,
    // the uninstall took the peer-reader binding; hub: east's Lease on the hub expired),
    // north's slices have only west's endpoints, and the checkout is answered by west.
    support::helm_uninstall(&clusters[0], scratch.path(), RELEASE, RELEASE_NS);
    wait_until(
        "north's slices without east's endpoints after east's uninstall",
        || async move { endpoints_by_source(north).await == *west_only },
    )
    .await;
    next_answers_from_west(north, lab.kubelet(2), &west_now, "east's uninstall").await;

    // Stopped: it made every call and none failed.
    std::fs::write(signal.join("stop"), "").unwrap();
    let (ok, out) =
        support::cluster_dns::container_finished(north, lab.kubelet(2), NS, CHECKOUT).await;
    let stdout = container_stdout(&out);
    let last = stdout.last().copied().unwrap_or_default();
    assert!(
        ok && last.ends_with(" answered 0 failed"),
        "the mcs-client checkout had every call answered, through east's scale-down, west's \
         rollout, the agent's upgrade and restart, and east's uninstall:\n{out}"
    );
}

/// The endpoint addresses of north's MCS EndpointSlices of the service, by source cluster.
async fn endpoints_by_source(client: &kube::Client) -> BTreeMap<String, BTreeSet<String>> {
    let slices = Api::<EndpointSlice>::namespaced(client.clone(), NS)
        .list(&ListParams::default().labels(&format!(
            "multicluster.kubernetes.io/service-name={SERVICE}"
        )))
        .await
        .unwrap()
        .items;
    let mut by_source: BTreeMap<String, BTreeSet<String>> = BTreeMap::new();
    for slice in &slices {
        let source = slice
            .metadata
            .labels
            .as_ref()
            .and_then(|l| l.get("multicluster.kubernetes.io/source-cluster"))
            .cloned()
            .unwrap_or_else(|| panic!("slice {:?} without a source-cluster", slice.metadata.name));
        by_source
            .entry(source)
            .or_default()
            .extend(slice.endpoints.iter().flat_map(|e| e.addresses.clone()));
    }
    by_source
}

/// What a container wrote on its standard output, line by line, from kubelet's log.
fn container_stdout(log: &str) -> Vec<&str> {
    log.lines()
        .filter_map(|l| l.split_once(" stdout F ").map(|(_, rest)| rest))
        .collect()
}

/// The `answer <cluster> <pod address> <attempts>` lines of the seed's `checkout`, as
/// (cluster, pod address).
fn answers<S: AsRef<str>>(stdout: &[S]) -> Vec<(&str, &str)> {
    stdout
        .iter()
        .filter_map(|l| l.as_ref().strip_prefix("answer "))
        .filter_map(|a| {
            let mut words = a.split_whitespace();
            Some((words.next()?, words.next()?))
        })
        .collect()
}

/// Checks that `stdout` (the seed's `checkout`) has `CALLS` answers, each from one of
/// `pods` (`<pod IP>:<port>` → cluster) and naming that Pod's cluster, and answers from both
/// serving clusters.
fn assert_answered<S: AsRef<str>>(
    stdout: &[S],
    pods: &BTreeMap<String, &str>,
    who: &str,
    log: &str,
) {
    let answers = answers(stdout);
    assert_eq!(answers.len(), CALLS, "{who}: every call answered:\n{log}");
    assert_answered_by(&answers, pods, &["east", "west"], who, log);
}

/// Checks that each of `answers` comes from one of `pods` (`<pod IP>:<port>` → cluster) and
/// names that Pod's cluster, and that `clusters` answered, no other.
fn assert_answered_by(
    answers: &[(&str, &str)],
    pods: &BTreeMap<String, &str>,
    clusters: &[&str],
    who: &str,
    log: &str,
) {
    for (cluster, pod) in answers {
        assert_eq!(
            pods.get(*pod),
            Some(cluster),
            "{who}: {pod} answered as a Pod of {cluster}; the backends are {pods:?}:\n{log}"
        );
    }
    let answered: BTreeSet<&str> = answers.iter().map(|(c, _)| *c).collect();
    assert_eq!(
        answered,
        clusters.iter().copied().collect(),
        "{who}: {} calls answered by:\n{log}",
        answers.len()
    );
}

/// Checks that the running checkout Pod [`CHECKOUT`] settles on `west`'s Pods at these
/// addresses: after what it has written by now, [`CALLS`] answers in a row all come from
/// them. The checkout learns of north's slices through its own watch, a moment after the
/// test saw them change, so the answers in between may still name Pods it knew before;
/// they are not checked. Panics, with the checkout's log, if it has not settled after
/// [`WAIT`].
async fn next_answers_from_west(
    client: &kube::Client,
    node: &support::node::KubeletNode,
    west: &BTreeSet<String>,
    when: &str,
) {
    let pods: BTreeMap<String, &str> = west
        .iter()
        .map(|ip| (format!("{ip}:{PORT}"), "west"))
        .collect();
    let deadline = std::time::Instant::now() + WAIT;
    let from = checkout_answers(client, node, 0, 0, when).await.len();
    let mut want = CALLS;
    loop {
        let stdout = checkout_answers(client, node, from, want, when).await;
        let after = answers(&stdout[from..]);
        // The answers after the last one from elsewhere.
        let settled = after
            .iter()
            .rposition(|(cluster, pod)| pods.get(*pod) != Some(cluster))
            .map_or(0, |last| last + 1);
        if after.len() - settled >= CALLS {
            return;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the checkout after {when}: no {CALLS} answers in a row from west's Pods {west:?} \
             in {WAIT:?} ({} answers since, the last from elsewhere is answer {settled}):\n{}",
            after.len(),
            stdout.join("\n")
        );
        want = settled + CALLS;
    }
}

/// Waits until the running checkout Pod [`CHECKOUT`] has written `n` answers after the first
/// `from` lines of its output, and returns its output lines (whole lines only). Panics, with
/// the Pod's status and log, as soon as a call failed, or after [`WAIT`].
async fn checkout_answers(
    client: &kube::Client,
    node: &support::node::KubeletNode,
    from: usize,
    n: usize,
    when: &str,
) -> Vec<String> {
    let deadline = std::time::Instant::now() + WAIT;
    loop {
        let log = node.container_output(NS, &format!("{CHECKOUT}_"), "run");
        // A line kubelet is still writing is left for the next look.
        let whole = &log[..log.rfind('\n').map_or(0, |end| end + 1)];
        let stdout: Vec<String> = container_stdout(whole)
            .into_iter()
            .map(String::from)
            .collect();
        let failed: Vec<&String> = stdout.iter().filter(|l| l.starts_with("failed ")).collect();
        assert!(
            failed.is_empty(),
            "the mcs-client checkout ({when}): calls failed: {failed:?}\n{}",
            support::cluster_dns::pod_report(client, node, NS, CHECKOUT).await
        );
        if stdout.len() >= from && answers(&stdout[from..]).len() >= n {
            return stdout;
        }
        if std::time::Instant::now() > deadline {
            panic!(
                "the mcs-client checkout ({when}): {} of {n} answers after line {from} in \
                 {WAIT:?}; {}",
                answers(stdout.get(from..).unwrap_or_default()).len(),
                support::cluster_dns::pod_report(client, node, NS, CHECKOUT).await
            );
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// A watch of north's ServiceImport [`SERVICE`] and its MCS EndpointSlices in [`NS`]; see
/// [`watch_import_and_slices`].
struct Watched {
    stop: tokio::sync::oneshot::Sender<()>,
    task: tokio::task::JoinHandle<Vec<String>>,
}

impl Watched {
    /// Ends the watch; returns what went wrong meanwhile.
    async fn stop(self) -> Vec<String> {
        let _ = self.stop.send(());
        self.task.await.expect("the watch task")
    }
}

/// Watches north's import of the service and its MCS EndpointSlices until stopped, noting
/// each moment the import was deleted or the slices had no endpoint address at all.
fn watch_import_and_slices(client: &kube::Client) -> Watched {
    use futures::StreamExt;
    use kube::runtime::watcher::{self, Event};
    enum Seen {
        Import(Event<ServiceImport>),
        Slice(Event<EndpointSlice>),
    }
    let imports = watcher::watcher(
        Api::<ServiceImport>::namespaced(client.clone(), NS),
        watcher::Config::default().fields(&format!("metadata.name={SERVICE}")),
    )
    .map(|e| e.map(Seen::Import));
    let slices = watcher::watcher(
        Api::<EndpointSlice>::namespaced(client.clone(), NS),
        watcher::Config::default().labels(&format!(
            "multicluster.kubernetes.io/service-name={SERVICE}"
        )),
    )
    .map(|e| e.map(Seen::Slice));
    let (stop, mut stopped) = tokio::sync::oneshot::channel();
    let task = tokio::spawn(async move {
        let mut events = std::pin::pin!(futures::stream::select(imports, slices));
        let mut trouble = Vec::new();
        // Endpoint addresses by slice name, once the first listing is done.
        let mut addresses: BTreeMap<String, usize> = BTreeMap::new();
        let mut listed = false;
        loop {
            let event = tokio::select! {
                _ = &mut stopped => return trouble,
                event = events.next() => event,
            };
            match event {
                None => {
                    trouble.push("the watch ended".to_owned());
                    return trouble;
                }
                Some(Err(e)) => trouble.push(format!("watch error: {e}")),
                Some(Ok(Seen::Import(Event::Delete(_)))) => {
                    trouble.push("the ServiceImport was deleted".to_owned())
                }
                Some(Ok(Seen::Slice(Event::Apply(slice) | Event::InitApply(slice)))) => {
                    let n = slice.endpoints.iter().map(|e| e.addresses.len()).sum();
                    addresses.insert(slice.metadata.name.unwrap_or_default(), n);
                }
                Some(Ok(Seen::Slice(Event::Delete(slice)))) => {
                    addresses.remove(&slice.metadata.name.unwrap_or_default());
                }
                Some(Ok(Seen::Slice(Event::InitDone))) => listed = true,
                Some(Ok(_)) => {}
            }
            if listed && addresses.values().sum::<usize>() == 0 {
                trouble.push(format!("no endpoint in north's slices: {addresses:?}"));
            }
        }
    });
    Watched { stop, task }
}

/// The agent's container of an agent Pod, from its status.
fn agent_container(pod: &Pod) -> Option<&k8s_openapi::api::core::v1::ContainerStatus> {
    pod.status
        .as_ref()?
        .container_statuses
        .as_ref()?
        .iter()
        .find(|c| c.name == "agent")
}

/// Whether `pod` is Ready.
fn ready(pod: &Pod) -> bool {
    pod.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

/// How long [`wait_until`] waits.
const WAIT: Duration = Duration::from_secs(120);

/// Waits until `condition` holds ([`support::wait_for`], at most [`WAIT`]).
async fn wait_until<F, Fut>(what: &str, mut condition: F)
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = bool>,
{
    support::wait_for(what, WAIT, || {
        let holds = condition();
        async move { holds.await.then_some(()) }
    })
    .await
}

/// ServiceAccount `ns/<name>` in north, allowed what `mcs_kube::resolver::KubeResolver`
/// reads: the ServiceImports and EndpointSlices of [`NS`].
async fn grant_import_reader(client: &kube::Client, name: &str) {
    use k8s_openapi::api::core::v1::ServiceAccount;
    use k8s_openapi::api::rbac::v1::{Role, RoleBinding};
    let sa: ServiceAccount =
        serde_json::from_value(serde_json::json!({ "metadata": { "name": name } })).unwrap();
    support::create(client, NS, &sa).await;
    let role: Role = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "rules": [
            { "apiGroups": ["multicluster.x-k8s.io"], "resources": ["serviceimports"],
              "verbs": ["get", "list", "watch"] },
            { "apiGroups": ["discovery.k8s.io"], "resources": ["endpointslices"],
              "verbs": ["get", "list", "watch"] },
        ],
    }))
    .unwrap();
    support::create(client, NS, &role).await;
    let binding: RoleBinding = serde_json::from_value(serde_json::json!({
        "metadata": { "name": name },
        "roleRef": { "apiGroup": "rbac.authorization.k8s.io", "kind": "Role", "name": name },
        "subjects": [{ "kind": "ServiceAccount", "name": name, "namespace": NS }],
    }))
    .unwrap();
    support::create(client, NS, &binding).await;
}

/// Waits until Deployment `ns/name` has `replicas` available Pods; panics with `log()`.
async fn available(
    client: &kube::Client,
    ns: &str,
    name: &str,
    replicas: i32,
    log: impl FnOnce() -> String,
) {
    if !support::deployment_available(client, ns, name, replicas, Duration::from_secs(120)).await {
        panic!(
            "Deployment {ns}/{name} never had {replicas} available Pod(s):\n{}",
            log()
        );
    }
}
