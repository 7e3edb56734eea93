//! Prints the mcs CRDs (ServiceExport, ServiceImport, ClusterProperty) as one YAML stream;
//! with `--cluster-selection` the same with KEP-5939's unreleased cluster-selection fields
//! (unstable); with `--hub` the hub topology's MemberExport CRD.
//!
//! `cargo run -p mcs-cli --bin mcs-crds > deploy/crds/mcs-crds.yaml`
//! `cargo run -p mcs-cli --bin mcs-crds -- --cluster-selection > deploy/crds-cluster-selection/mcs-crds.yaml`
//! `cargo run -p mcs-cli --bin mcs-crds -- --hub > deploy/hub/memberexports.yaml`

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let has = |flag: &str| args.iter().any(|a| a == flag);
    let yaml = if has("--hub") {
        mcs_kube::hub::crd_yaml()
    } else if has("--cluster-selection") {
        mcs_core::api::crd::to_yaml(&mcs_core::api::crd::all_with_cluster_selection())
    } else {
        mcs_core::api::crd::to_yaml(&mcs_core::api::crd::all())
    };
    let mut out = std::io::stdout().lock();
    if let Err(e) = out.write_all(yaml.as_bytes()).and_then(|()| out.flush()) {
        eprintln!("mcs-crds: cannot write to stdout: {e}");
        return ExitCode::FAILURE;
    }
    ExitCode::SUCCESS
}
