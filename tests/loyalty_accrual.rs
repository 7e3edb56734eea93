//! The main job, `cargo run --release --example loyalty_accrual`, as a test: the example's
//! own `run` passes every check in memory and with `--real` (real API servers, kwok Pods,
//! `mcs-agent` and `mcs-dns` processes), and with a port conflict routed to both clusters
//! on purpose the checks about that port's routes fail (and only those of the conflict
//! step), so the example exits non-zero.

#[path = "../examples/loyalty_accrual.rs"]
mod example;

use std::process::ExitCode;

async fn run(args: &[&str]) -> mcs_seed::Report {
    let args: Vec<String> = args.iter().map(|a| (*a).to_owned()).collect();
    let report = example::run(&args).await.expect("valid arguments");
    report.print_summary();
    report
}

/// Checks that `report` ran to its end with at least 20 checks, all passed, and exit 0.
fn assert_every_check_passed(report: &mcs_seed::Report) {
    assert!(report.error.is_none(), "{:?}", report.error);
    let failed: Vec<&str> = report.failed().map(|c| c.name.as_str()).collect();
    assert!(failed.is_empty(), "failed checks: {failed:#?}");
    assert!(report.checks.len() >= 20, "{} checks", report.checks.len());
    assert!(report.passed());
    assert_eq!(
        format!("{:?}", report.exit_code()),
        format!("{:?}", ExitCode::SUCCESS)
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_scenario_passes_every_check() {
    assert_every_check_passed(&run(&[]).await);
}

/// `--real`, as the README gives it: the same steps on three real API servers whose Pods
/// kwok runs, an `mcs-agent` process per cluster and `mcs-dns` for north (this build's, found
/// beside the test in the target directory; `cargo test --workspace` builds them).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_seed_scenario_passes_every_check_on_real_api_servers() {
    assert_every_check_passed(&run(&["--real"]).await);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_port_routed_to_both_clusters_fails_its_checks_and_the_exit_code() {
    let report = run(&["--inject-fault=port-routed-to-every-cluster"]).await;
    assert!(report.error.is_none(), "{:?}", report.error);
    let failed: Vec<&str> = report.failed().map(|c| c.name.as_str()).collect();
    assert!(
        failed
            .iter()
            .any(|c| c
                .starts_with("conflict: north's imported slices route port admin to west only")),
        "{failed:#?}"
    );
    assert!(
        failed.contains(&"conflict: east's checkout calls to port 9444 are all answered in west"),
        "{failed:#?}"
    );
    // The fault is targeted: of the conflict step's checks only the two about the admin
    // port's routes fail; the conditions, the ports, the VIP and DNS are still right.
    let conflict: Vec<&str> = failed
        .iter()
        .copied()
        .filter(|c| c.starts_with("conflict:"))
        .collect();
    assert_eq!(conflict.len(), 2, "{failed:#?}");
    assert!(
        report
            .checks
            .iter()
            .filter(|c| c.name.starts_with("conflict:"))
            .count()
            > 2
    );
    assert!(!report.passed());
    assert_eq!(
        format!("{:?}", report.exit_code()),
        format!("{:?}", ExitCode::FAILURE)
    );
}

#[tokio::test]
async fn unknown_arguments_are_refused() {
    let err = example::run(&["--fast".to_owned()]).await.unwrap_err();
    assert!(err.contains("--fast"), "{err}");
}
