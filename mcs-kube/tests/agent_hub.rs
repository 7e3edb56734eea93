//! The hub topology on real API servers: three members and a hub (a fourth kube-apiserver
//! with etcd), agents with least-privilege hub identities (`deploy/rbac/hub*.yaml` as
//! shipped): imports from the hub's records, what a member may do there, Lease expiry and
//! return, a hub outage, a member's restart, and what each agent watches in its own cluster.

use mcs_testkit as support;
use mcs_testkit::clusterset;

use std::time::Duration;

use clusterset::*;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Secret;
use kube::api::{Api, ListParams, PostParams};
use mcs_kube::hub::record::{MemberExport, MemberExportSpec};

const NS: &str = "loyalty";
/// Short enough that an expired Lease shows in seconds.
const GRACE: Duration = Duration::from_secs(3);

/// Exports `accrual` from east (10.10.0.5) and west (10.20.0.5) and waits until north
/// imports both clusters' endpoints.
async fn offer_both(set: &ClusterSet) {
    set.namespace(NS).await;
    for (i, ip) in [(0, "10.10.0.5"), (1, "10.20.0.5")] {
        create_service(set.client(i), NS, &hello_service("accrual")).await;
        set_source(set.client(i), NS, "accrual", &[ip]).await;
        export(set.client(i), NS, "accrual", None).await;
    }
    wait_endpoints(set, 2, "east", &["10.10.0.5"]).await;
    wait_endpoints(set, 2, "west", &["10.20.0.5"]).await;
}

/// Waits until cluster `i` imports exactly `want` from `source`.
async fn wait_endpoints(set: &ClusterSet, i: usize, source: &str, want: &[&str]) {
    let want: Vec<String> = want.iter().map(|s| s.to_string()).collect();
    support::wait_for(
        &format!("{} importing {want:?} from {source}", set.ids[i]),
        SLICE_TIMEOUT,
        || async {
            (imported_from(set.client(i), NS, "accrual", source).await == want).then_some(())
        },
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn members_merge_each_others_records_from_the_hub() {
    let set = ClusterSet::start_in(Topo::Hub, &["east", "west", "north"], false).await;
    offer_both(&set).await;
    for i in 0..3 {
        wait_import(set.client(i), NS, "accrual", "both clusters listed", |si| {
            clusters_of(si) == ["east", "west"]
        })
        .await;
    }
    // Ready: the export reached the hub.
    let ready = wait_export_condition(
        set.client(0),
        NS,
        "accrual",
        "Ready",
        "True",
        Some("Exported"),
    )
    .await;
    assert!(ready.message.contains("hub"), "{}", ready.message);
    // The hub holds one record per exporting member, named <namespace>.<name>.
    let east: Api<MemberExport> = Api::namespaced(set.hub().admin.clone(), "mcs-member-east");
    let record = east.get("loyalty.accrual").await.expect("east's record");
    assert_eq!(
        (
            record.spec.cluster.as_str(),
            record.spec.namespace.as_str(),
            record.spec.name.as_str()
        ),
        ("east", NS, "accrual")
    );
    let addresses: Vec<&str> = record
        .spec
        .slices
        .iter()
        .flat_map(|s| {
            s.endpoints
                .iter()
                .flat_map(|e| e.addresses.iter().map(String::as_str))
        })
        .collect();
    assert_eq!(addresses, ["10.10.0.5"]);
    let north: Api<MemberExport> = Api::namespaced(set.hub().admin.clone(), "mcs-member-north");
    assert!(
        north
            .list(&ListParams::default())
            .await
            .unwrap()
            .items
            .is_empty(),
        "north exports nothing"
    );

    // Each agent watched only what its cluster exports: its Service by name and its slices
    // by label, never every Service or EndpointSlice of the cluster (derived Services and
    // imported slices it wrote are listed by the agent's own label).
    for i in 0..3 {
        for r in set.agent_requests(i).snapshot() {
            let lists_services = r.path.contains("/services") && !r.path.contains("/services/");
            let lists_slices =
                r.path.contains("/endpointslices") && !r.path.contains("/endpointslices/");
            if r.method == "GET" && (lists_services || lists_slices) {
                let query = r.query.replace("%2F", "/").replace("%3D", "=");
                assert!(
                    query.contains("fieldSelector=metadata.name=")
                        || query.contains("managed-by=mcs-agent")
                        || query.contains("kubernetes.io/service-name=accrual"),
                    "{} listed more than what is exported: {}?{}",
                    set.ids[i],
                    r.path,
                    r.query
                );
            }
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_writes_only_its_own_namespace_on_the_hub() {
    let set =
        ClusterSet::start_topo(Topo::Hub, &["east", "west"], false, GRACE, false, |c| c).await;
    let east = set.hub_client_of(0);
    let record = |cluster: &str| {
        MemberExport::new(
            "loyalty.accrual",
            MemberExportSpec {
                cluster: cluster.into(),
                namespace: NS.into(),
                name: "accrual".into(),
                export_created: k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                    k8s_openapi::jiff::Timestamp::now(),
                ),
                exported_labels: None,
                exported_annotations: None,
                cluster_selectors: None,
                service: None,
                slices: Vec::new(),
            },
        )
    };
    let own: Api<MemberExport> = Api::namespaced(east.clone(), "mcs-member-east");
    own.create(&PostParams::default(), &record("east"))
        .await
        .expect("east writes its own records");
    fn forbidden<T: std::fmt::Debug>(r: Result<T, kube::Error>, what: &str) {
        match r {
            Err(kube::Error::Api(s)) if s.code == 403 => {}
            other => panic!("{what}: want 403, got {other:?}"),
        }
    }
    // Not west's records, nor its Lease.
    let wests: Api<MemberExport> = Api::namespaced(east.clone(), "mcs-member-west");
    forbidden(
        wests.create(&PostParams::default(), &record("west")).await,
        "east writing west's record",
    );
    let lease = Lease {
        metadata: kube::api::ObjectMeta {
            name: Some("member".into()),
            ..Default::default()
        },
        spec: None,
    };
    forbidden(
        Api::<Lease>::namespaced(east.clone(), "mcs-member-west")
            .create(&PostParams::default(), &lease)
            .await,
        "east writing west's Lease",
    );
    // West's own write goes through; east reads it, but cannot delete it.
    let west = set.hub_client_of(1);
    Api::<MemberExport>::namespaced(west, "mcs-member-west")
        .create(&PostParams::default(), &record("west"))
        .await
        .expect("west writes its own records");
    assert_eq!(
        wests
            .list(&ListParams::default())
            .await
            .expect("east reads west's records")
            .items
            .len(),
        1
    );
    forbidden(
        wests.delete("loyalty.accrual", &Default::default()).await,
        "east deleting west's record",
    );
    // The agent's publishing code, speaking for west with east's identity, is refused
    // too, and says which permission is missing.
    let impostor = mcs_kube::hub::publish::Publisher::new(
        east.clone(),
        &mcs_core::ClusterId::new("west").unwrap(),
        "mcs-agent",
    );
    let service = mcs_core::name::ServiceRef::new(NS, "accrual").unwrap();
    let err = impostor
        .publish(&service, Some(record("west")), None)
        .await
        .expect_err("east publishing as west");
    assert!(
        matches!(&err.source, kube::Error::Api(s) if s.code == 403),
        "{err:?}"
    );
    let message = err.to_string();
    assert!(
        message.starts_with("cannot publish MemberExport mcs-member-west/loyalty.accrual: ")
            && message.contains("deploy/rbac/hub-member.yaml"),
        "{message}"
    );
    let err = impostor
        .renew_lease(Duration::from_secs(40))
        .await
        .expect_err("east renewing west's Lease");
    assert!(
        err.to_string()
            .starts_with("cannot renew Lease mcs-hub-leases/west: "),
        "{err}"
    );

    // Leases: every member's in mcs-hub-leases, each created with its member's roles. East
    // renews its own and reads them all in one list, but writes no other.
    mcs_kube::hub::publish::Publisher::new(
        east.clone(),
        &mcs_core::ClusterId::new("east").unwrap(),
        "mcs-agent",
    )
    .renew_lease(Duration::from_secs(40))
    .await
    .expect("east renews its own Lease");
    let leases: Api<Lease> = Api::namespaced(east.clone(), mcs_kube::hub::LEASE_NAMESPACE);
    let mut names: Vec<_> = leases
        .list(&ListParams::default())
        .await
        .expect("east lists every member's Lease")
        .items
        .into_iter()
        .map(|l| l.metadata.name.unwrap_or_default())
        .collect();
    names.sort();
    assert_eq!(names, ["east", "west"]);
    let named = |name: &str| Lease {
        metadata: kube::api::ObjectMeta {
            name: Some(name.into()),
            ..Default::default()
        },
        spec: None,
    };
    forbidden(
        leases.create(&PostParams::default(), &named("south")).await,
        "east creating a Lease for another member",
    );
    forbidden(
        leases.delete("west", &Default::default()).await,
        "east deleting west's Lease",
    );
    forbidden(
        leases
            .patch(
                "west",
                &kube::api::PatchParams::apply("mcs-agent").force(),
                &kube::api::Patch::Apply(&named("west")),
            )
            .await,
        "east applying west's Lease",
    );

    // Records are read in one watch across the member namespaces (deploy/rbac/hub.yaml's
    // ClusterRole): east lists every member's records at once, its own included.
    let everyone = Api::<MemberExport>::all(east.clone())
        .list(&ListParams::default())
        .await
        .expect("east lists the records of every member namespace");
    let mut seen: Vec<_> = everyone
        .items
        .iter()
        .map(|r| r.metadata.namespace.clone().unwrap_or_default())
        .collect();
    seen.sort();
    assert_eq!(seen, ["mcs-member-east", "mcs-member-west"]);
    // That grant is read-only: no record outside its own namespace, anywhere.
    forbidden(
        Api::<MemberExport>::namespaced(east.clone(), "default")
            .create(&PostParams::default(), &record("east"))
            .await,
        "east writing a record outside the member namespaces",
    );

    // Nothing else: no Secrets, not even in member namespaces; no cluster-wide reads of
    // Leases; no other namespaces' objects.
    forbidden(
        Api::<Secret>::namespaced(east.clone(), "mcs-member-west")
            .list(&ListParams::default())
            .await,
        "east listing Secrets",
    );
    forbidden(
        Api::<Lease>::all(east.clone())
            .list(&ListParams::default())
            .await,
        "east listing Leases cluster-wide",
    );
    forbidden(
        Api::<Lease>::namespaced(east.clone(), "kube-system")
            .list(&ListParams::default())
            .await,
        "east listing kube-system Leases",
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_lease_expires_leaves_the_imports_and_comes_back() {
    let mut set = ClusterSet::start_topo(
        Topo::Hub,
        &["east", "west", "north"],
        false,
        GRACE,
        true,
        |c| c,
    )
    .await;
    offer_both(&set).await;
    // West's agent stops: its records stay on the hub, its Lease is no longer renewed.
    set.stop_agent(1).await;
    wait_endpoints(&set, 2, "west", &[]).await;
    let si = wait_import(
        set.client(2),
        NS,
        "accrual",
        "west gone from the import",
        |si| clusters_of(si) == ["east"],
    )
    .await;
    let ready = si
        .status
        .and_then(|s| s.conditions)
        .and_then(|c| c.into_iter().find(|c| c.type_ == "Ready"))
        .expect("Ready");
    assert!(
        ready.message.contains("cluster west is unreachable") && ready.message.contains("removed"),
        "{}",
        ready.message
    );
    wait_endpoints(&set, 2, "east", &["10.10.0.5"]).await;
    // It comes back: renewed Lease, its endpoints return.
    set.start_agent(1);
    wait_endpoints(&set, 2, "west", &["10.20.0.5"]).await;
    wait_import(
        set.client(2),
        NS,
        "accrual",
        "west back in the import",
        |si| clusters_of(si) == ["east", "west"],
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_hub_outage_removes_nothing_and_state_resyncs_when_it_is_back() {
    let mut set = ClusterSet::start_topo(
        Topo::Hub,
        &["east", "west", "north"],
        false,
        GRACE,
        true,
        |c| c,
    )
    .await;
    offer_both(&set).await;
    set.hub_mut().cluster.stop();
    // Every agent says so.
    for i in 0..3 {
        support::wait_for(
            "the hub unreachable in readiness",
            IMPORT_TIMEOUT,
            || async {
                set.agent_readiness(i)
                    .err()
                    .filter(|reason| reason.contains("hub is unreachable"))
            },
        )
        .await;
    }
    // West stops exporting while the hub is down: it cannot publish that, and says so.
    unexport(set.client(1), NS, "accrual").await;
    // Longer than a Lease plus the grace period: nothing is removed anywhere.
    let hold = HUB_LEASE + GRACE + Duration::from_secs(2);
    let end = tokio::time::Instant::now() + hold;
    while tokio::time::Instant::now() < end {
        assert_eq!(
            imported_from(set.client(2), NS, "accrual", "east").await,
            ["10.10.0.5"]
        );
        assert_eq!(
            imported_from(set.client(2), NS, "accrual", "west").await,
            ["10.20.0.5"]
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    // North's import stays Ready and says why it may be stale (written by north's agent
    // once it has seen the outage: waited for, not read once).
    wait_import(
        set.client(2),
        NS,
        "accrual",
        "Ready=True saying the hub is unreachable",
        |si| {
            si.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|r| r.status == "True" && r.message.contains("hub is unreachable"))
        },
    )
    .await;
    // The hub is back: every agent re-lists, and west's withdrawal reaches north.
    set.hub_mut().cluster.start().await;
    for i in 0..3 {
        wait_ready(&set, i).await;
    }
    wait_endpoints(&set, 2, "west", &[]).await;
    wait_import(set.client(2), NS, "accrual", "only east listed", |si| {
        clusters_of(si) == ["east"]
    })
    .await;
    for i in 0..3 {
        wait_ready(&set, i).await;
    }
}

/// A member joining: `deploy/rbac/hub-member.yaml` creates its namespace on the hub before
/// the RoleBinding that lets the others read its Lease, and an operator may forget the
/// rest. The others neither stall nor call the hub down meanwhile; once the RoleBinding
/// exists, the new member's records are imported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_member_whose_hub_roles_are_not_applied_yet_holds_nobody_back() {
    use k8s_openapi::api::core::v1::Namespace;
    use kube::api::ObjectMeta;
    use mcs_core::ClusterId;
    use mcs_core::name::ServiceRef;
    use mcs_kube::hub::publish::Publisher;

    let set = ClusterSet::start_in(Topo::Hub, &["east", "west", "north"], false).await;
    let admin = set.hub().admin.clone();
    let namespace = Namespace {
        metadata: ObjectMeta {
            name: Some("mcs-member-south".into()),
            labels: Some([("hub.mcs.dev/member".to_owned(), "south".to_owned())].into()),
            ..Default::default()
        },
        ..Default::default()
    };
    Api::<Namespace>::all(admin.clone())
        .create(&PostParams::default(), &namespace)
        .await
        .expect("south's namespace on the hub");
    // The others go on: exports made now reach north.
    offer_both(&set).await;
    for i in 0..3 {
        if let Err(reason) = set.agent_readiness(i) {
            assert!(
                !reason.contains("hub is unreachable"),
                "{}: {reason}",
                set.ids[i]
            );
        }
    }
    // The rest of south's hub roles (its Lease among them), then its record (east's, with
    // south's address) and Lease.
    for obj in support::manifest_with("deploy/rbac/hub-member.yaml", &[("MEMBER_ID", "south")]) {
        support::apply(&admin, &obj).await;
    }
    let south = ClusterId::new("south").unwrap();
    let publisher = Publisher::new(
        hub_identity(&set.hub().cluster, &south).await,
        &south,
        "mcs-test",
    );
    let mut record = Api::<MemberExport>::namespaced(admin.clone(), "mcs-member-east")
        .get("loyalty.accrual")
        .await
        .expect("east's record");
    record.metadata = ObjectMeta {
        name: record.metadata.name.clone(),
        labels: record.metadata.labels.clone().map(|mut l| {
            l.insert("hub.mcs.dev/cluster".into(), "south".into());
            l
        }),
        ..Default::default()
    };
    record.spec.cluster = "south".into();
    for slice in &mut record.spec.slices {
        for e in &mut slice.endpoints {
            e.addresses = vec!["10.40.0.5".into()];
        }
    }
    publisher
        .renew_lease(Duration::from_secs(40))
        .await
        .expect("south's Lease");
    publisher
        .publish(&ServiceRef::new(NS, "accrual").unwrap(), Some(record), None)
        .await
        .expect("south's record");
    wait_endpoints(&set, 2, "south", &["10.40.0.5"]).await;

    // South's hub watches alone, as the scale bench's simulated members run them: they
    // hold east's and west's records, not south's own.
    #[cfg(feature = "unstable-load")]
    {
        let watcher = mcs_kube::agent::load::watch_hub(
            &hub_identity(&set.hub().cluster, &south).await,
            &south,
        );
        support::wait_for(
            "south's hub watches holding east's and west's records",
            SLICE_TIMEOUT,
            || async { (watcher.records() == 2).then_some(()) },
        )
        .await;
        assert!(watcher.events() > 2, "{}", watcher.events());
        assert_eq!(watcher.errors(), 0);
    }
}

/// How long the agents may take to resume after the hub comes back: the hub watches retry
/// at most every 10 s, and a resumed watch may first be told its version is too old (HTTP
/// 410) and re-list after one more retry.
const HUB_RESUME: Duration = Duration::from_secs(60);

/// Waits until cluster `i`'s agent is ready; the failure says why it was not.
async fn wait_ready(set: &ClusterSet, i: usize) {
    let last = std::sync::Mutex::new(String::new());
    let ready = tokio::time::timeout(HUB_RESUME, async {
        loop {
            match set.agent_readiness(i) {
                Ok(()) => return,
                Err(reason) => *last.lock().unwrap() = reason,
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    })
    .await;
    assert!(
        ready.is_ok(),
        "the agent of {} not ready after {HUB_RESUME:?}: {}",
        set.ids[i],
        last.lock().unwrap()
    );
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restarted_member_replaces_its_records_without_a_gap() {
    let mut set = ClusterSet::start_in(Topo::Hub, &["east", "west", "north"], false).await;
    offer_both(&set).await;
    let records: Api<MemberExport> = Api::namespaced(set.hub().admin.clone(), "mcs-member-east");
    let mut watch = ObjectWatch::open(&records, "loyalty.accrual").await;
    set.stop_agent(0).await;
    set.start_agent(0);
    set.resync(0).await;
    let seen = watch.seen();
    assert!(
        seen.iter().all(|e| !e.starts_with("deleted")),
        "the record went away during the restart: {seen:?}"
    );
    assert!(records.get_opt("loyalty.accrual").await.unwrap().is_some());
    assert_eq!(
        imported_from(set.client(2), NS, "accrual", "east").await,
        ["10.10.0.5"]
    );
    watch
        .assert_unmodified("the restarted agent's record")
        .await;
}
