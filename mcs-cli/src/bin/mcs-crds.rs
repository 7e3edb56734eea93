//! Prints the mcs CRDs (ServiceExport, ServiceImport, ClusterProperty) as one YAML stream.
//!
//! `cargo run -p mcs-cli --bin mcs-crds > deploy/crds/mcs-crds.yaml`

use std::io::Write;
use std::process::ExitCode;

fn main() -> ExitCode {
    match mcs_core::api::crd::to_yaml(&mcs_core::api::crd::all()) {
        Ok(yaml) => {
            let mut out = std::io::stdout().lock();
            if let Err(e) = out.write_all(yaml.as_bytes()).and_then(|()| out.flush()) {
                eprintln!("mcs-crds: cannot write to stdout: {e}");
                return ExitCode::FAILURE;
            }
            ExitCode::SUCCESS
        }
        Err(e) => {
            eprintln!("mcs-crds: cannot render the CRDs as YAML: {e}");
            ExitCode::FAILURE
        }
    }
}
