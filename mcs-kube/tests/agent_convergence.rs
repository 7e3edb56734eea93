//! The agent converges after edits, deletions, restarts and outages, against three real API
//! servers; and it never loops on its own writes. Tests that neither restart nor configure
//! an agent, nor count all its writes, share a ClusterSet per topology ([`Case`]), each in a
//! namespace of its own.

use mcs_testkit as support;
use mcs_testkit::clusterset;

use std::time::Duration;

use clusterset::*;
use k8s_openapi::api::core::v1::{Namespace, Service};
use k8s_openapi::api::rbac::v1::{ClusterRole, ClusterRoleBinding};
use kube::api::{Api, DeleteParams, PostParams};
use mcs_core::api::{
    ANNOTATION_DERIVED_SERVICE, ServiceImportSpec, ServiceImportType, v1beta1::ServiceImport,
};

const NS: &str = "loyalty";

async fn service_edits_deletion_and_recreation_converge(topo: Topo) {
    // A set of its own: its resync check counts every write of the agent, and a shared
    // set's agent writes for the other tests meanwhile.
    let set = ClusterSet::start_in(topo, &["east", "west", "north"], false).await;
    set.namespace(NS).await;
    let ns = NS;
    create_service(set.client(0), ns, &hello_service("accrual")).await;
    export(set.client(0), ns, "accrual", None).await;
    wait_import(set.client(2), ns, "accrual", "import", |si| {
        si.spec.ports.len() == 2
    })
    .await;

    // A port added to the Service after the export reaches every import.
    let mut edited = hello_service("accrual");
    edited.spec.as_mut().unwrap().ports.as_mut().unwrap().push(
        k8s_openapi::api::core::v1::ServicePort {
            name: Some("admin".into()),
            port: 9090,
            protocol: Some("TCP".into()),
            ..Default::default()
        },
    );
    replace_service(set.client(0), ns, edited).await;
    for i in 0..3 {
        wait_import(set.client(i), ns, "accrual", "edited ports", |si| {
            si.spec.ports.len() == 3
        })
        .await;
    }

    // The Service deleted: the export turns invalid and the import goes.
    delete_service(set.client(0), ns, "accrual").await;
    let valid = wait_export_condition(
        set.client(0),
        ns,
        "accrual",
        "Valid",
        "False",
        Some("NoService"),
    )
    .await;
    assert!(!valid.message.is_empty());
    for i in 0..3 {
        wait_no_import(set.client(i), ns, "accrual", "import gone with the Service").await;
    }
    // Recreated: valid again, imported again.
    create_service(set.client(0), ns, &hello_service("accrual")).await;
    wait_export_condition(set.client(0), ns, "accrual", "Valid", "True", Some("Valid")).await;
    for i in 0..3 {
        wait_import(set.client(i), ns, "accrual", "import back", |_| true).await;
    }

    // No loop on its own writes: once converged, a full resync (what the periodic one does)
    // writes nothing, not even a write the API server would find to change nothing, and
    // leaves the import and the derived Service as they are.
    let si = wait_import(
        set.client(2),
        ns,
        "accrual",
        "ips allocated and Ready",
        |si| si.spec.ips.is_some() && import_ready(si),
    )
    .await;
    // A first pass settles whatever was still in flight; the second is the one checked.
    set.resync(2).await;
    let imports: Api<ServiceImport> = Api::namespaced(set.client(2).clone(), ns);
    let services: Api<Service> = Api::namespaced(set.client(2).clone(), ns);
    let derived = &si.metadata.annotations.as_ref().unwrap()[ANNOTATION_DERIVED_SERVICE];
    let import_watch = ObjectWatch::open(&imports, "accrual").await;
    let derived_watch = ObjectWatch::open(&services, derived).await;
    let requests = set.agent_requests(2);
    let before = requests.len();
    set.resync(2).await;
    import_watch
        .assert_unmodified("the agent rewrote an unchanged import on resync")
        .await;
    derived_watch
        .assert_unmodified("the agent rewrote an unchanged derived Service on resync")
        .await;
    let writes: Vec<_> = requests
        .since(before)
        .into_iter()
        .filter(|r| r.is_write())
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        writes.is_empty(),
        "the agent wrote during a resync with nothing to change: {writes:#?}"
    );
}

/// Whether the import's `Ready` condition is `True`.
fn import_ready(si: &ServiceImport) -> bool {
    si.status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .is_some_and(|c| c.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
}

async fn imports_exist_only_where_the_namespace_exists(topo: Topo) {
    let set = Case::without_namespace(topo, NS).await;
    for i in [0, 1] {
        support::create_namespace(set.client(i), &set.ns).await;
    }
    create_service(set.client(0), &set.ns, &hello_service("accrual")).await;
    export(set.client(0), &set.ns, "accrual", None).await;
    wait_import(set.client(1), &set.ns, "accrual", "import in west", |_| {
        true
    })
    .await;
    // North's agent, caught up with east's exports (a marker in a namespace all three
    // have), made no import there: it does not create the namespace.
    let marker_ns = format!("{}-marker", set.ns);
    set.namespace(&marker_ns).await;
    let imports = set.settled_imports(0, &marker_ns, "accrual").await;
    assert!(
        imports[2].is_none(),
        "north has no namespace {}, and no import: {imports:#?}",
        set.ns
    );
    // The namespace appears in north: so does the import.
    support::create_namespace(set.client(2), &set.ns).await;
    wait_import(
        set.client(2),
        &set.ns,
        "accrual",
        "import in north once the namespace exists",
        |_| true,
    )
    .await;
}

async fn a_terminating_namespace_gets_no_writes_and_leaves_the_agent_ready(topo: Topo) {
    // No controller-manager: a deleted namespace stays Terminating (nothing removes its
    // content or its `kubernetes` finalizer), as it is while the namespace controller works.
    let mut set = ClusterSet::start_in(topo, &["east", "west"], false).await;
    set.namespace(NS).await;
    set.namespace("other").await;
    create_service(set.client(0), NS, &hello_service("accrual")).await;
    export(set.client(0), NS, "accrual", None).await;
    let si = wait_import(set.client(1), NS, "accrual", "import in west", |si| {
        si.spec.ips.is_some()
    })
    .await;

    // While west's agent is stopped, what it would write changes: its import and derived
    // Service go (as the namespace controller removes them), east exports two more
    // services, and west's namespace starts terminating.
    set.stop_agent(1).await;
    let west = set.client(1).clone();
    let imports: Api<ServiceImport> = Api::namespaced(west.clone(), NS);
    imports
        .delete("accrual", &DeleteParams::default())
        .await
        .unwrap();
    let derived = &si.metadata.annotations.as_ref().unwrap()[ANNOTATION_DERIVED_SERVICE];
    Api::<Service>::namespaced(west.clone(), NS)
        .delete(derived, &DeleteParams::default())
        .await
        .unwrap();
    create_service(set.client(0), NS, &hello_service("second")).await;
    export(set.client(0), NS, "second", None).await;
    create_service(set.client(0), "other", &hello_service("beacon")).await;
    export(set.client(0), "other", "beacon", None).await;
    let namespaces: Api<Namespace> = Api::all(west.clone());
    namespaces
        .delete(NS, &DeleteParams::default())
        .await
        .unwrap();
    support::wait_for(
        "the namespace Terminating in west",
        IMPORT_TIMEOUT,
        || async {
            let ns = namespaces.get(NS).await.ok()?;
            (ns.status?.phase.as_deref() == Some("Terminating")).then_some(())
        },
    )
    .await;
    // The API server now refuses new content there, with the cause the agent recognises.
    let probe = ServiceImport::new("probe", ServiceImportSpec::new(ServiceImportType::Headless));
    match imports.create(&PostParams::default(), &probe).await {
        Err(kube::Error::Api(status)) => assert!(
            status.code == 403
                && status
                    .details
                    .as_ref()
                    .is_some_and(|d| d.causes.iter().any(|c| c.reason == "NamespaceTerminating")),
            "{status:?}"
        ),
        other => panic!("a create in a terminating namespace: {other:?}"),
    }

    // (In the hub, east's agent has published its new exports by now.)
    set.wait_published(0, NS, "second").await;
    set.wait_published(0, "other", "beacon").await;

    // A fresh agent lists all that at once. Its first full pass writes the new import in
    // the other namespace and nothing (not even an attempt) into the terminating one, and
    // it is ready: nothing was refused, no reconcile failed.
    set.start_agent(1);
    set.resync(1).await;
    let into_terminating: Vec<_> = set
        .agent_requests(1)
        .snapshot()
        .into_iter()
        .filter(|r| r.is_write() && r.path.contains(&format!("/namespaces/{NS}/")))
        .map(|r| format!("{} {} -> {:?}", r.method, r.path, r.status))
        .collect();
    assert_eq!(set.agent_readiness(1), Ok(()));
    assert_eq!(set.agent_metrics(1).reconcile_errors(), 0);
    assert!(
        into_terminating.is_empty(),
        "the agent wrote into the terminating namespace: {into_terminating:#?}"
    );
    assert!(
        Api::<ServiceImport>::namespaced(west.clone(), "other")
            .get_opt("beacon")
            .await
            .unwrap()
            .is_some(),
        "the agent imports into the namespaces that are not terminating"
    );
    for name in ["accrual", "second"] {
        assert!(imports.get_opt(name).await.unwrap().is_none(), "{name}");
    }
}

async fn a_restarted_agent_catches_up_and_equal_timestamps_tie_break_by_cluster_id(topo: Topo) {
    let mut set = ClusterSet::start_in(topo, &["east", "west", "north"], false).await;
    set.namespace(NS).await;
    set.stop_agent(2).await;
    // Two exports created in the same second: the tie-break (cluster id) picks east's type
    // in every cluster, whichever agent computes it.
    let mut headless = headless(hello_service("accrual"));
    headless.metadata.name = Some("accrual".into());
    create_service(set.client(0), NS, &hello_service("accrual")).await;
    create_service(set.client(1), NS, &headless).await;
    let (a, b) = tokio::join!(
        export(set.client(1), NS, "accrual", None),
        export(set.client(0), NS, "accrual", None)
    );
    let tie = a.metadata.creation_timestamp == b.metadata.creation_timestamp;
    wait_import(set.client(0), NS, "accrual", "import in east", |_| true).await;
    // North's agent is stopped: nothing imports there.
    let imports = Api::<ServiceImport>::namespaced(set.client(2).clone(), NS);
    assert!(imports.get_opt("accrual").await.unwrap().is_none());
    set.start_agent(2);
    let north = wait_import(
        set.client(2),
        NS,
        "accrual",
        "import in north after the agent restarts",
        |si| clusters_of(si).len() == 2,
    )
    .await;
    let east = wait_import(set.client(0), NS, "accrual", "import in east", |si| {
        clusters_of(si).len() == 2
    })
    .await;
    assert_eq!(
        north.spec.type_, east.spec.type_,
        "every agent computes the same import"
    );
    if tie {
        assert_eq!(
            north.spec.type_,
            mcs_core::api::ServiceImportType::ClusterSetIp,
            "equal timestamps: east (lowest id) wins"
        );
    }
    for i in [0, 1] {
        wait_export_condition(set.client(i), NS, "accrual", "Conflict", "True", None).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_unreachable_member_keeps_its_endpoints_for_the_grace_period_then_returns() {
    let mut set =
        ClusterSet::start_with(&["east", "west", "north"], false, Duration::from_secs(4)).await;
    set.namespace(NS).await;
    for i in [0, 1] {
        create_service(set.client(i), NS, &hello_service("accrual")).await;
        export(set.client(i), NS, "accrual", None).await;
    }
    wait_import(set.client(2), NS, "accrual", "both clusters", |si| {
        clusters_of(si).len() == 2
    })
    .await;
    // West's API server goes away: after the grace period north drops it and says why.
    set.clusters[1].stop();
    let si = wait_import(
        set.client(2),
        NS,
        "accrual",
        "west removed after the grace period",
        |si| clusters_of(si) == ["east"],
    )
    .await;
    let ready = si
        .status
        .unwrap()
        .conditions
        .unwrap()
        .into_iter()
        .find(|c| c.type_ == "Ready")
        .unwrap();
    assert!(
        ready.message.contains("west") && ready.message.contains("unreachable"),
        "{}",
        ready.message
    );
    // West comes back: it is merged again without restarting anything.
    set.clusters[1].start().await;
    wait_import(set.client(2), NS, "accrual", "west back", |si| {
        clusters_of(si).len() == 2
    })
    .await;
    let si = wait_import(
        set.client(2),
        NS,
        "accrual",
        "Ready message cleared",
        |si| {
            si.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .and_then(|c| c.iter().find(|c| c.type_ == "Ready"))
                .is_some_and(|c| c.message.is_empty())
        },
    )
    .await;
    assert_eq!(clusters_of(&si), ["east", "west"]);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_whose_read_access_is_revoked_is_dropped_and_recovers() {
    // North's agent reads west with a ServiceAccount bound to the shipped peer-reader role
    // only (least privilege); revoking the binding cuts west off, restoring it heals.
    let set = ClusterSet::start_bare(&["east", "west"]).await;
    set.namespace(NS).await;
    let west = set.client(1).clone();
    let role: ClusterRole = first_doc(include_str!("../../deploy/rbac/agent-peer-reader.yaml"));
    let mut binding: ClusterRoleBinding =
        second_doc(include_str!("../../deploy/rbac/agent-peer-reader.yaml"));
    binding.subjects = Some(vec![k8s_openapi::api::rbac::v1::Subject {
        kind: "ServiceAccount".into(),
        name: "mcs-peer".into(),
        namespace: Some("default".into()),
        api_group: None,
    }]);
    Api::<ClusterRole>::all(west.clone())
        .create(&PostParams::default(), &role)
        .await
        .unwrap();
    let bindings = Api::<ClusterRoleBinding>::all(west.clone());
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    let token = support::service_account_token(&west, "default", "mcs-peer").await;
    let mut config = kube::Config::from_custom_kubeconfig(
        set.clusters[1].kubeconfig().clone(),
        &kube::config::KubeConfigOptions::default(),
    )
    .await
    .unwrap();
    config.auth_info = kube::config::AuthInfo {
        token: Some(token.into()),
        ..Default::default()
    };
    let restricted = kube::Client::try_from(config).unwrap();

    use mcs_kube::agent::{Agent, AgentConfig, Member};
    let ids: Vec<mcs_core::ClusterId> = ["east", "west"]
        .iter()
        .map(|s| s.parse().unwrap())
        .collect();
    let members = vec![
        Member {
            id: ids[0].clone(),
            client: set.client(0).clone(),
        },
        Member {
            id: ids[1].clone(),
            client: restricted,
        },
    ];
    // East's agent, whose only view of west is the restricted client.
    let (stop, stopped) = tokio::sync::oneshot::channel::<()>();
    let agent = Agent::new(
        AgentConfig::new(ids[0].clone(), members)
            .unreachable_grace(Duration::from_secs(3))
            .probe_interval(Duration::from_secs(1)),
    );
    let task = tokio::spawn(agent.run(async move {
        let _ = stopped.await;
    }));

    create_service(set.client(1), NS, &hello_service("accrual")).await;
    export(set.client(1), NS, "accrual", None).await;
    wait_import(
        set.client(0),
        NS,
        "accrual",
        "import through the peer-reader role",
        |si| clusters_of(si) == ["west"],
    )
    .await;

    bindings
        .delete("mcs-agent-peer-reader", &DeleteParams::default())
        .await
        .unwrap();
    // West's watches now fail with 403: after the grace period its export is dropped and,
    // being the only one, so is the import. The agent keeps running.
    wait_no_import(
        set.client(0),
        NS,
        "accrual",
        "import dropped once west is unreadable",
    )
    .await;
    assert!(!task.is_finished(), "the agent must survive a revoked peer");
    bindings
        .create(&PostParams::default(), &binding)
        .await
        .unwrap();
    wait_import(
        set.client(0),
        NS,
        "accrual",
        "import after access is restored",
        |si| clusters_of(si) == ["west"],
    )
    .await;
    let _ = stop.send(());
    task.await.unwrap().unwrap();
}

fn first_doc<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
    let doc = yaml.split("\n---\n").next().unwrap();
    serde_saphyr::from_str(doc).unwrap()
}

fn second_doc<T: serde::de::DeserializeOwned>(yaml: &str) -> T {
    let doc = yaml.split("\n---\n").nth(1).unwrap();
    serde_saphyr::from_str(doc).unwrap()
}

async fn hand_written_and_malformed_imports_are_left_alone(topo: Topo) {
    use kube::api::{ApiResource, DynamicObject};
    let set = Case::start(topo, NS).await;
    let resource = ApiResource::erase::<ServiceImport>(&());
    let dynamic: Api<DynamicObject> =
        Api::namespaced_with(set.client(2).clone(), &set.ns, &resource);
    // Valid for the CRD (sessionAffinity is a free string there), invalid for the typed API.
    let malformed: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1",
        "kind": "ServiceImport",
        "metadata": { "name": "manual", "namespace": &set.ns },
        "spec": { "type": "ClusterSetIP", "ports": [{ "port": 80 }], "sessionAffinity": "Sticky" }
    }))
    .unwrap();
    let malformed = dynamic
        .create(&PostParams::default(), &malformed)
        .await
        .unwrap();
    // Watched from their creation on: the agent never changes or deletes them.
    let manual_watch = ObjectWatch::since(&dynamic, &malformed).await;
    let handmade: DynamicObject = serde_json::from_value(serde_json::json!({
        "apiVersion": "multicluster.x-k8s.io/v1beta1",
        "kind": "ServiceImport",
        "metadata": { "name": "handmade", "namespace": &set.ns },
        "spec": { "type": "Headless", "ports": [] }
    }))
    .unwrap();
    let handmade = dynamic
        .create(&PostParams::default(), &handmade)
        .await
        .unwrap();
    let handmade_watch = ObjectWatch::since(&dynamic, &handmade).await;

    // The agent keeps working for everything else.
    create_service(set.client(0), &set.ns, &hello_service("accrual")).await;
    export(set.client(0), &set.ns, "accrual", None).await;
    wait_import(
        set.client(2),
        &set.ns,
        "accrual",
        "import next to the malformed one",
        |_| true,
    )
    .await;
    // An export with the malformed import's name: the agent does not overwrite it, neither
    // when the export appears nor on a full resync; nor does it delete what it did not create.
    create_service(set.client(0), &set.ns, &hello_service("manual")).await;
    export(set.client(0), &set.ns, "manual", None).await;
    wait_import(set.client(1), &set.ns, "manual", "import in west", |_| true).await;
    // North's agent says why it leaves the import alone, as a Warning event on it: once
    // that is there, it has reconciled "manual" with the export.
    let events: Api<k8s_openapi::api::events::v1::Event> =
        Api::namespaced(set.client(2).clone(), &set.ns);
    support::wait_for("ForeignServiceImport event", IMPORT_TIMEOUT, || async {
        let list = events.list(&Default::default()).await.ok()?;
        list.items.into_iter().find(|e| {
            e.reason.as_deref() == Some("ForeignServiceImport")
                && e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some("manual")
        })
    })
    .await;
    // A full resync (what the periodic one does) leaves them alone too. And at no point did
    // the agent send a write for either, not even a no-op one (its Warning events are its
    // only writes about them).
    set.resync(2).await;
    manual_watch
        .assert_unmodified("the agent touched the hand-written import")
        .await;
    handmade_watch
        .assert_unmodified("the agent touched an import it did not create")
        .await;
    let ours = format!("/namespaces/{}/", set.ns);
    let foreign = |path: &str| {
        ["manual", "handmade"].iter().any(|name| {
            let object = format!("/serviceimports/{name}");
            path.ends_with(&object) || path.ends_with(&format!("{object}/status"))
        })
    };
    let writes: Vec<_> = set
        .agent_requests(2)
        .snapshot()
        .into_iter()
        .filter(|r| r.is_write() && r.path.contains(&ours) && foreign(&r.path))
        .map(|r| format!("{} {}", r.method, r.path))
        .collect();
    assert!(
        writes.is_empty(),
        "the agent wrote ServiceImports it did not create: {writes:#?}"
    );
}

async fn exports_outside_the_allowed_namespaces_are_refused(topo: Topo) {
    let set = ClusterSet::start_topo_configured(topo, &["east", "west"], |c| {
        c.allowed_namespaces(vec![NS.to_owned()])
    })
    .await;
    set.namespace(NS).await;
    set.namespace("kube-system-like").await;
    create_service(set.client(0), "kube-system-like", &hello_service("accrual")).await;
    export(set.client(0), "kube-system-like", "accrual", None).await;
    let valid = wait_export_condition(
        set.client(0),
        "kube-system-like",
        "accrual",
        "Valid",
        "False",
        Some("NamespaceNotAllowed"),
    )
    .await;
    assert!(
        valid.message.contains("kube-system-like"),
        "{}",
        valid.message
    );
    let imports = set
        .settled_imports(0, NS, "kube-system-like", "accrual")
        .await;
    assert!(
        imports.iter().all(Option::is_none),
        "an export in a namespace not allowed imports nothing: {imports:#?}"
    );
    // The allowed namespace works as usual.
    create_service(set.client(0), NS, &hello_service("accrual")).await;
    export(set.client(0), NS, "accrual", None).await;
    wait_import(
        set.client(1),
        NS,
        "accrual",
        "import in the allowed namespace",
        |_| true,
    )
    .await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_peer_serving_only_v1alpha1_is_read_at_v1alpha1() {
    use k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::CustomResourceDefinition;
    let mut set = ClusterSet::start_bare(&["east", "west"]).await;
    set.namespace(NS).await;
    // West has not upgraded: its ServiceExport CRD serves v1alpha1 only.
    let crds: Api<CustomResourceDefinition> = Api::all(set.client(1).clone());
    let mut crd = crds
        .get("serviceexports.multicluster.x-k8s.io")
        .await
        .unwrap();
    for v in &mut crd.spec.versions {
        let alpha = v.name == "v1alpha1";
        v.served = alpha;
        v.storage = alpha;
    }
    crds.replace(
        "serviceexports.multicluster.x-k8s.io",
        &PostParams::default(),
        &crd,
    )
    .await
    .unwrap();
    support::wait_for(
        "v1beta1 no longer served in west",
        Duration::from_secs(20),
        || async {
            let group = kube::discovery::group(set.client(1), "multicluster.x-k8s.io")
                .await
                .ok()?;
            let exports_beta = group
                .versioned_resources("v1beta1")
                .iter()
                .any(|(r, _)| r.plural == "serviceexports");
            (!exports_beta).then_some(())
        },
    )
    .await;
    create_service(set.client(1), NS, &hello_service("accrual")).await;
    let mut se = mcs_core::api::v1alpha1::ServiceExport::new("accrual", Default::default());
    se.metadata.namespace = Some(NS.into());
    Api::<mcs_core::api::v1alpha1::ServiceExport>::namespaced(set.client(1).clone(), NS)
        .create(&PostParams::default(), &se)
        .await
        .unwrap();
    set.start_agent(0);
    let si = wait_import(
        set.client(0),
        NS,
        "accrual",
        "import from a v1alpha1-only peer",
        |si| clusters_of(si) == ["west"],
    )
    .await;
    assert_eq!(si.spec.ports.len(), 2);
}

in_both_topologies!(
    service_edits_deletion_and_recreation_converge,
    imports_exist_only_where_the_namespace_exists,
    a_terminating_namespace_gets_no_writes_and_leaves_the_agent_ready,
    a_restarted_agent_catches_up_and_equal_timestamps_tie_break_by_cluster_id,
    hand_written_and_malformed_imports_are_left_alone,
    exports_outside_the_allowed_namespaces_are_refused,
);
