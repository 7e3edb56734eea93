//! End to end through real API servers, agents and the Kubernetes resolver: the client
//! balances across both exporting clusters and stops sending to an endpoint once it turns
//! unready in its source cluster (the `kube_resolver` example, asserted).

#[path = "../examples/kube_resolver.rs"]
mod example;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn client_through_the_kubernetes_resolver_follows_readiness() {
    let report = example::run().await;
    assert_eq!(report.failed, 0, "{report:?}");
    assert!(
        report.split.get("east").is_some_and(|n| *n > 20),
        "{report:?}"
    );
    assert!(
        report.split.get("west").is_some_and(|n| *n > 20),
        "{report:?}"
    );
    eprintln!(
        "unready -> last request to east: {:?}",
        report.unready_to_last_east
    );
}
