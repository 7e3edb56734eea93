//! Real-Kubernetes test harness: independent etcd + kube-apiserver (+ optionally
//! kube-controller-manager) clusters on loopback, one per name, started in parallel.
//!
//! The binaries are built by `scripts/k8s-bins.sh` into
//! `${MCS_K8S_CACHE:-$HOME/.cache/mcs-k8s}/v<version>/bin`; `MCS_K8S_BIN` overrides the
//! directory. If they are missing the tests panic (they never skip). See
//! `docs/testing.md`.
//!
//! Every process is killed and reaped when its [`TestCluster`] is dropped, also when a
//! test panics. As a second line of defence the processes are started through
//! `setpriv --pdeathsig KILL`, so they also die when the thread that started them
//! exits (for example when the test binary is killed). Consequence: start clusters
//! from the test's own task (or a `tokio::spawn`ed task), never from
//! `spawn_blocking`, and do not share a `TestCluster` between tests through a static.
//!
//! Set `MCS_K8S_KEEP=1` to keep each cluster's directory (certificates, kubeconfig,
//! logs, etcd data) after the test; its path is printed.
//!
//! By concern:
//! - [`cluster`]: starting clusters ([`start_clusters`]) and driving one ([`TestCluster`]);
//! - `bins`: where the Kubernetes binaries are ([`bin_dir`]);
//! - `process`: child processes, scratch directories, ports and logs;
//! - `pki`: each cluster's CA and certificates; `kubeconfig`: its admin kubeconfig;
//! - [`objects`]: namespaces, the fake Node, ready Pods, tokens and the CRDs;
//! - [`kwok`]: real Pods from Deployments and StatefulSets ([`ClusterOptions::pods`]:
//!   kube-scheduler and kwok), scaling, readiness, deletion, watch-based waits;
//! - [`manifests`]: `deploy/` manifests read and applied as shipped;
//! - [`netlab`]: nodes and pods as network namespaces with kube-proxy (dataplane tests);
//!   [`node`]: real nodes there, containerd and kubelet running Pods from local images;
//!   [`cluster_dns`]: CoreDNS as a real node's cluster DNS, and one-shot Pods;
//! - [`wait`]: polling with a deadline ([`wait_for`]); [`requests`]: what one client asked
//!   ([`recorded`]); [`http`]: plain HTTP through hyper; [`dns`]: DNS clients for tests;
//! - [`coredns`]: CoreDNS started with a Corefile the test writes ([`CoreDns`]);
//! - [`image`]: the project's image from a test build's binaries ([`build_mcs_image`]).
//!
//! - [`clusterset`]: a ClusterSet of real API servers with one in-process agent per member,
//!   in the mesh or the hub topology ([`clusterset::ClusterSet`]).
//!
//! Tests name it `support` (`use mcs_testkit as support;`) and use everything as
//! `support::...`. It is not published: its API is the tests' and changes with them.

mod bins;
pub mod cluster;
pub mod cluster_dns;
pub mod clusterset;
pub mod coredns;
pub mod dns;
pub mod http;
pub mod image;
mod kubeconfig;
pub mod kwok;
pub mod manifests;
pub mod netlab;
pub mod node;
pub mod objects;
mod pki;
mod process;
pub mod requests;
pub mod wait;

pub use self::kubeconfig::write as write_kubeconfig;
pub use self::{
    bins::*, cluster::*, coredns::*, dns::*, http::*, image::*, kwok::*, manifests::*, objects::*,
    requests::*, wait::*,
};
