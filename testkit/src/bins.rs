//! Where the Kubernetes binaries are.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// Kubernetes versions `scripts/k8s-bins.sh` builds, preferred first.
pub const K8S_VERSIONS: &[&str] = &["1.35.4", "1.34.4"];

/// The directory holding `etcd`, `kube-apiserver` and `kube-controller-manager`:
/// `$MCS_K8S_BIN`, else the newest version found in the cache of `scripts/k8s-bins.sh`.
/// Panics (with instructions) when the binaries are missing.
pub fn bin_dir() -> PathBuf {
    static DIR: OnceLock<PathBuf> = OnceLock::new();
    DIR.get_or_init(|| {
        let need = ["etcd", "kube-apiserver", "kube-controller-manager"];
        let complete = |d: &Path| need.iter().all(|b| d.join(b).is_file());
        if let Ok(dir) = std::env::var("MCS_K8S_BIN") {
            let dir = PathBuf::from(dir);
            assert!(
                complete(&dir),
                "MCS_K8S_BIN={} does not contain {need:?}; run scripts/k8s-bins.sh and \
                 export MCS_K8S_BIN=$(scripts/k8s-bins.sh | tail -1)",
                dir.display()
            );
            return dir;
        }
        let cache = std::env::var_os("MCS_K8S_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/mcs-k8s")))
            .unwrap_or_else(|| PathBuf::from("/root/.cache/mcs-k8s"));
        for v in K8S_VERSIONS {
            let dir = cache.join(format!("v{v}")).join("bin");
            if complete(&dir) {
                return dir;
            }
        }
        panic!(
            "kube-apiserver/etcd/kube-controller-manager not found (looked in $MCS_K8S_BIN and \
             {}/v{{{}}}/bin). Build them once with `scripts/k8s-bins.sh` (10-20 min cold) \
             from the workspace root, or export MCS_K8S_BIN=$(scripts/k8s-bins.sh | tail -1)",
            cache.display(),
            K8S_VERSIONS.join(",")
        );
    })
    .clone()
}

/// Version directory of `scripts/kwok-coredns-bins.sh` in the cache.
pub const KWOK_COREDNS_DIR: &str = "kwok-v0.8.0-coredns-v1.15.0";

/// A file built by `scripts/kwok-coredns-bins.sh`: `$<env>` if set, else `<file>` in that
/// script's cache directory. Panics with instructions when it is missing.
fn kwok_coredns_file(env: &str, file: &str) -> PathBuf {
    let path = std::env::var_os(env).map(PathBuf::from).unwrap_or_else(|| {
        let cache = std::env::var_os("MCS_K8S_CACHE")
            .map(PathBuf::from)
            .or_else(|| std::env::var_os("HOME").map(|h| Path::new(&h).join(".cache/mcs-k8s")))
            .unwrap_or_else(|| PathBuf::from("/root/.cache/mcs-k8s"));
        cache.join(KWOK_COREDNS_DIR).join("bin").join(file)
    });
    assert!(
        path.is_file(),
        "{file} not found at {} (${env}). Build it once with `scripts/kwok-coredns-bins.sh` \
         (a few minutes cold) from the workspace root, or run scripts/test.sh, which exports \
         MCS_KWOK_BIN, MCS_KWOK_STAGES and MCS_COREDNS_BIN",
        path.display()
    );
    path
}

/// The kwok binary: `$MCS_KWOK_BIN`, else `scripts/kwok-coredns-bins.sh`'s cache.
pub fn kwok_bin() -> PathBuf {
    kwok_coredns_file("MCS_KWOK_BIN", "kwok")
}

/// kwok's Stage objects (node-initialize, heartbeat, pod-ready, pod-complete, pod-delete):
/// `$MCS_KWOK_STAGES`, else `scripts/kwok-coredns-bins.sh`'s cache.
pub fn kwok_stages() -> PathBuf {
    kwok_coredns_file("MCS_KWOK_STAGES", "kwok-stages.yaml")
}

/// The CoreDNS binary (with the `kubernetes` plugin's `multicluster` option):
/// `$MCS_COREDNS_BIN`, else `scripts/kwok-coredns-bins.sh`'s cache.
pub fn coredns_bin() -> PathBuf {
    kwok_coredns_file("MCS_COREDNS_BIN", "coredns")
}

/// Helm 4, `$MCS_HELM4` (built by `scripts/helm-bins.sh`; `scripts/test.sh` exports it).
/// Panics (with instructions) when it is missing.
pub fn helm4() -> PathBuf {
    let path = std::env::var_os("MCS_HELM4")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            panic!(
                "MCS_HELM4 is not set: run scripts/test.sh, or export \
             MCS_HELM4=$(scripts/helm-bins.sh | tail -n 1)"
            )
        });
    assert!(
        path.is_file(),
        "MCS_HELM4={} does not exist",
        path.display()
    );
    path
}
