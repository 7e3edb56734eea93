//! The seed's programs refuse what they cannot run with, saying why: `loyalty-accrual`
//! without its cluster or Pod address, `checkout` without a mode and count (or `--until`
//! file), or in `mcs` mode without its cluster. (They run for real as Pods in
//! `mcs-cli/tests/clusterset_pods.rs`, which finds them beside `mcs-agent` in the build.)

use std::process::{Command, Output, Stdio};

fn run(program: &str, args: &[&str], env: &[(&str, &str)]) -> Output {
    let mut cmd = Command::new(program);
    cmd.args(args)
        .env_remove("CLUSTER")
        .env_remove("POD_IP")
        .stdin(Stdio::null());
    for (k, v) in env {
        cmd.env(k, v);
    }
    cmd.output()
        .unwrap_or_else(|e| panic!("run {program}: {e}"))
}

fn refused(out: &Output, says: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "exit 2 (usage): {stderr}");
    assert!(stderr.contains(says), "says {says:?}: {stderr}");
}

#[test]
fn loyalty_accrual_needs_its_cluster_and_pod_address() {
    let server = env!("CARGO_BIN_EXE_loyalty-accrual");
    refused(&run(server, &[], &[]), "set CLUSTER");
    refused(&run(server, &[], &[("CLUSTER", "east")]), "set CLUSTER");
    refused(
        &run(server, &[], &[("CLUSTER", "east"), ("POD_IP", "ten")]),
        "POD_IP \"ten\" is not an IP address",
    );
}

#[test]
fn checkout_needs_a_mode_a_count_and_for_mcs_its_cluster() {
    let checkout = env!("CARGO_BIN_EXE_checkout");
    refused(&run(checkout, &[], &[]), "usage: checkout <mcs|plain>");
    refused(
        &run(checkout, &["grpc", "3"], &[]),
        "usage: checkout <mcs|plain>",
    );
    refused(&run(checkout, &["plain", "many"], &[]), "calls \"many\"");
    refused(&run(checkout, &["mcs", "3"], &[]), "set CLUSTER");
    refused(
        &run(checkout, &["mcs", "3"], &[("CLUSTER", "Not A Cluster")]),
        "CLUSTER",
    );
}
