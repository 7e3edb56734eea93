//! The project's container image and chart for tests: `scripts/image.sh` run on the
//! binaries of the test build, `helm` on `charts/mcs`, and the commands tests run around
//! them.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};

use super::bins::helm4;
use super::cluster::TestCluster;

/// The workspace's root (the folder holding `Cargo.lock`), from the crate being tested.
pub fn workspace_root() -> PathBuf {
    let mut dir = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    while !dir.join("Cargo.lock").is_file() {
        assert!(
            dir.pop(),
            "no Cargo.lock above {}",
            env!("CARGO_MANIFEST_DIR")
        );
    }
    dir
}

/// Runs `cmd` with no input; its standard output, or a panic with both outputs when it
/// fails.
pub fn run_command(cmd: &mut Command, what: &str) -> String {
    let out = cmd
        .stdin(Stdio::null())
        .output()
        .unwrap_or_else(|e| panic!("{what}: {e}"));
    assert!(
        out.status.success(),
        "{what} failed ({}):\n{}{}",
        out.status,
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout).into_owned()
}

/// The image `mcs:<tag>` that `scripts/image.sh` made.
#[derive(Clone, Debug)]
pub struct McsImage {
    /// Its OCI image layout (tag `tag`).
    pub layout: PathBuf,
    /// The same image as a docker-archive named `mcs:<tag>`, for `ctr images import`.
    pub archive: PathBuf,
    /// Its tag.
    pub tag: String,
}

/// Builds the image `mcs:<tag>` from the binaries in `bin_dir` (a test build's, for
/// example the folder of `CARGO_BIN_EXE_mcs-agent`) into `out`.
pub fn build_mcs_image(bin_dir: &Path, out: &Path, tag: &str) -> McsImage {
    let printed = run_command(
        Command::new(workspace_root().join("scripts/image.sh"))
            .arg("--bin-dir")
            .arg(bin_dir)
            .arg("--out")
            .arg(out)
            .arg("--tag")
            .arg(tag),
        "scripts/image.sh",
    );
    assert!(printed.contains(&format!("image: mcs:{tag}")), "{printed}");
    McsImage {
        layout: out.join("oci"),
        archive: out.join(format!("mcs-image-{tag}.tar")),
        tag: tag.to_owned(),
    }
}

/// [`build_mcs_image`] on a blocking thread, for async tests.
pub async fn build_mcs_image_off_thread(bin_dir: &Path, out: PathBuf, tag: &str) -> McsImage {
    let (bin_dir, tag) = (bin_dir.to_owned(), tag.to_owned());
    tokio::task::spawn_blocking(move || build_mcs_image(&bin_dir, &out, &tag))
        .await
        .expect("scripts/image.sh's thread")
}

/// Runs Helm 4 as `helm <args> <release> charts/mcs --namespace <namespace>` against
/// `cluster`, with Helm's own state (cache, configuration, data) under `scratch/helm`, never
/// the user's; its output, or a panic with it when it fails.
pub fn helm_mcs_chart(
    cluster: &TestCluster,
    scratch: &Path,
    args: &[&str],
    release: &str,
    namespace: &str,
) -> String {
    let chart = workspace_root().join("charts/mcs");
    let mut all: Vec<&std::ffi::OsStr> = args.iter().map(|a| a.as_ref()).collect();
    all.extend([release.as_ref(), chart.as_os_str()]);
    helm(cluster, scratch, &all, namespace)
}

/// `helm uninstall <release> --namespace <namespace> --wait` against `cluster` (Helm 4, its
/// state under `scratch/helm` as [`helm_mcs_chart`]'s): returns once the release's objects
/// are gone.
pub fn helm_uninstall(cluster: &TestCluster, scratch: &Path, release: &str, namespace: &str) {
    let args = ["uninstall", release, "--wait"].map(std::ffi::OsStr::new);
    helm(cluster, scratch, &args, namespace);
}

/// Runs `helm <args> --namespace <namespace> --kubeconfig <cluster's>` (Helm 4), its state
/// under `scratch/helm`; its output, or a panic with it when it fails.
fn helm(
    cluster: &TestCluster,
    scratch: &Path,
    args: &[&std::ffi::OsStr],
    namespace: &str,
) -> String {
    let home = scratch.join("helm");
    let shown: Vec<_> = args.iter().map(|a| a.to_string_lossy()).collect();
    run_command(
        Command::new(helm4())
            .env("HELM_CACHE_HOME", home.join("cache"))
            .env("HELM_CONFIG_HOME", home.join("config"))
            .env("HELM_DATA_HOME", home.join("data"))
            .args(args)
            .args(["--namespace", namespace])
            .arg("--kubeconfig")
            .arg(cluster.kubeconfig_path()),
        &format!("helm {} in {}", shown.join(" "), cluster.name()),
    )
}
