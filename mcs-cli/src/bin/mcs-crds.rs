//! Prints the mcs CRDs (ServiceExport, ServiceImport, ClusterProperty) as one YAML stream,
//! or with `--hub` the hub topology's MemberExport CRD.
//!
//! `cargo run -p mcs-cli --bin mcs-crds > deploy/crds/mcs-crds.yaml`
//! `cargo run -p mcs-cli --bin mcs-crds -- --hub > deploy/hub/memberexports.yaml`

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    let hub = std::env::args().skip(1).any(|a| a == "--hub");
    let yaml = if hub {
        mcs_kube::hub::crd_yaml()
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
