//! The in-memory plan against the agent's behaviour: the conformance cases the agent passes
//! against real API servers (`tests/agent_conformance.rs`), over in-memory clusters.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointConditions, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
use mcs_core::api::{
    ClusterPropertySpec, LABEL_SOURCE_CLUSTER, ServiceExportSpec, ServiceImportType,
};

use super::*;

const NS: &str = "demo";

fn property(id: &str) -> ClusterProperty {
    ClusterProperty::new(
        CLUSTER_ID_PROPERTY,
        ClusterPropertySpec { value: id.into() },
    )
}

/// Members `a` (10.1.0.0/16), `b` (10.2.0.0/16) and `c` (10.3.0.0/16), each with namespace
/// `demo`, at 09:00:00.
fn clusterset() -> (ClusterSetPlan, [ClusterId; 3]) {
    let mut set = ClusterSetPlan::new("2026-05-01T09:00:00Z".parse().unwrap());
    let mut ids = Vec::new();
    for (i, name) in ["a", "b", "c"].iter().enumerate() {
        let id = set
            .add_cluster(&property(name), &format!("10.{}.0.0/16", i + 1))
            .unwrap();
        set.apply_namespace(&id, NS).unwrap();
        ids.push(id);
    }
    (set, ids.try_into().unwrap())
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some(NS.into()),
        ..Default::default()
    }
}

fn service(name: &str, ports: &[(&str, i32)], cluster_ip: Option<&str>) -> Service {
    Service {
        metadata: meta(name),
        spec: Some(ServiceSpec {
            cluster_ip: cluster_ip.map(Into::into),
            selector: Some(BTreeMap::from([("app".to_owned(), name.to_owned())])),
            ports: Some(
                ports
                    .iter()
                    .map(|(n, p)| ServicePort {
                        name: Some((*n).into()),
                        port: *p,
                        protocol: Some("TCP".into()),
                        target_port: Some(IntOrString::Int(*p)),
                        ..Default::default()
                    })
                    .collect(),
            ),
            ..Default::default()
        }),
        status: None,
    }
}

fn export(name: &str) -> ServiceExport {
    ServiceExport {
        metadata: meta(name),
        spec: ServiceExportSpec::default(),
        status: None,
    }
}

/// The EndpointSlice controller's slice of `service` with these ready addresses.
fn slice(service: &str, addrs: &[&str], ports: &[(&str, i32)]) -> EndpointSlice {
    let mut m = meta(&format!("{service}-x7k2p"));
    m.labels = Some(BTreeMap::from([(
        LABEL_K8S_SERVICE_NAME.to_owned(),
        service.to_owned(),
    )]));
    EndpointSlice {
        address_type: "IPv4".into(),
        metadata: m,
        endpoints: addrs
            .iter()
            .map(|a| Endpoint {
                addresses: vec![(*a).into()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                ..Default::default()
            })
            .collect(),
        ports: Some(
            ports
                .iter()
                .map(|(n, p)| EndpointPort {
                    name: Some((*n).into()),
                    port: Some(*p),
                    protocol: Some("TCP".into()),
                    app_protocol: None,
                })
                .collect(),
        ),
    }
}

/// Exports `hello` from `cluster` with these ports and endpoints.
fn export_hello(
    set: &mut ClusterSetPlan,
    cluster: &ClusterId,
    ports: &[(&str, i32)],
    addrs: &[&str],
) {
    set.apply_service(cluster, service("hello", ports, None))
        .unwrap();
    set.apply_slice(cluster, slice("hello", addrs, ports))
        .unwrap();
    set.apply_export(cluster, export("hello")).unwrap();
}

fn hello() -> ServiceRef {
    ServiceRef::new(NS, "hello").unwrap()
}

/// `(status, reason)` of an export condition.
fn condition(set: &ClusterSetPlan, cluster: &ClusterId, type_: &str) -> (String, String) {
    let export = set.cluster(cluster).unwrap().export(&hello()).unwrap();
    let c = export
        .status
        .as_ref()
        .and_then(|s| s.conditions.as_ref())
        .and_then(|cs| cs.iter().find(|c| c.type_ == type_))
        .unwrap_or_else(|| panic!("{cluster}: no {type_} condition"));
    (c.status.clone(), c.reason.clone())
}

/// `source cluster -> (ports, addresses)` of a member's imported slices of `hello`.
fn imported(
    set: &ClusterSetPlan,
    cluster: &ClusterId,
) -> BTreeMap<String, (Vec<String>, Vec<String>)> {
    let mut out = BTreeMap::new();
    for s in set.cluster(cluster).unwrap().mcs_slices(&hello()) {
        let labels = s.metadata.labels.as_ref().unwrap();
        assert_eq!(labels[LABEL_SLICE_MANAGED_BY], MANAGED_BY);
        let entry: &mut (Vec<String>, Vec<String>) =
            out.entry(labels[LABEL_SOURCE_CLUSTER].clone()).or_default();
        entry.0.extend(s.ports.iter().flatten().map(|p| {
            format!(
                "{}/{}",
                p.name.clone().unwrap_or_default(),
                p.port.unwrap_or(0)
            )
        }));
        entry
            .1
            .extend(s.endpoints.iter().flat_map(|e| e.addresses.clone()));
        entry.0.sort();
        entry.1.sort();
    }
    out
}

fn import_ports(set: &ClusterSetPlan, cluster: &ClusterId) -> Vec<(String, i32)> {
    let import = set.cluster(cluster).unwrap().import(&hello()).unwrap();
    let mut ports: Vec<_> = import
        .spec
        .ports
        .iter()
        .map(|p| (p.name.clone().unwrap_or_default(), p.port))
        .collect();
    ports.sort();
    ports
}

#[test]
fn a_clusterset_ip_import_in_every_member_with_a_vip_from_its_own_range() {
    let (mut set, [a, b, c]) = clusterset();
    export_hello(&mut set, &a, &[("tcp", 42)], &["10.1.5.1"]);
    set.advance(Duration::from_secs(2));
    export_hello(&mut set, &b, &[("tcp", 42)], &["10.2.5.1", "10.2.5.2"]);
    let done = set.converge().unwrap();
    assert!(done.rounds >= 2 && done.writes > 0, "{done:?}");

    for (i, id) in [&a, &b, &c].into_iter().enumerate() {
        let member = set.cluster(id).unwrap();
        let import = member
            .import(&hello())
            .unwrap_or_else(|| panic!("{id}: no import"));
        assert_eq!(import.spec.type_, ServiceImportType::ClusterSetIp, "{id}");
        assert_eq!(import_ports(&set, id), [("tcp".to_owned(), 42)], "{id}");
        let clusters: Vec<_> = import
            .status
            .as_ref()
            .and_then(|s| s.clusters.clone())
            .unwrap_or_default()
            .into_iter()
            .map(|c| c.cluster)
            .collect();
        assert_eq!(clusters, ["a", "b"], "{id}");
        // The VIP is the derived Service's ClusterIP, from this member's own range.
        let derived = member.derived_service(&hello()).expect("derived Service");
        let vip = derived.spec.as_ref().unwrap().cluster_ip.clone().unwrap();
        assert_eq!(import.spec.ips.as_deref(), Some(&[vip.clone()][..]), "{id}");
        let net = format!("10.{}.", i + 1);
        assert!(vip.starts_with(&net), "{id}: VIP {vip} outside {net}0.0/16");
        // One imported slice per source cluster, with that cluster's endpoints.
        let slices = imported(&set, id);
        assert_eq!(
            slices,
            BTreeMap::from([
                (
                    "a".to_owned(),
                    (vec!["tcp/42".to_owned()], vec!["10.1.5.1".to_owned()])
                ),
                (
                    "b".to_owned(),
                    (
                        vec!["tcp/42".to_owned()],
                        vec!["10.2.5.1".to_owned(), "10.2.5.2".to_owned()]
                    )
                ),
            ]),
            "{id}"
        );
    }
    for id in [&a, &b] {
        assert_eq!(
            condition(&set, id, "Valid"),
            ("True".into(), "Valid".into())
        );
        assert_eq!(
            condition(&set, id, "Ready"),
            ("True".into(), "Ready".into())
        );
        assert_eq!(
            condition(&set, id, "Conflict"),
            ("False".into(), "NoConflicts".into())
        );
    }
    assert!(set.cluster(&c).unwrap().export(&hello()).is_none());
    assert_eq!(
        set.converge().unwrap(),
        Convergence::default(),
        "converged agents write nothing"
    );
}

#[test]
fn a_port_conflict_is_raised_on_both_and_the_extra_port_routes_to_its_cluster_only() {
    let (mut set, [a, b, c]) = clusterset();
    export_hello(&mut set, &a, &[("tcp", 42)], &["10.1.5.1"]);
    set.converge().unwrap();
    let vip = set
        .cluster(&c)
        .unwrap()
        .import(&hello())
        .unwrap()
        .spec
        .ips
        .clone();
    set.advance(Duration::from_secs(2));
    export_hello(&mut set, &b, &[("tcp", 42), ("admin", 43)], &["10.2.5.1"]);
    set.converge().unwrap();

    for id in [&a, &b] {
        let (status, reason) = condition(&set, id, "Conflict");
        assert_eq!(
            (status.as_str(), reason.as_str()),
            ("True", "PortConflict"),
            "{id}"
        );
    }
    for id in [&a, &b, &c] {
        assert_eq!(
            import_ports(&set, id),
            [("admin".to_owned(), 43), ("tcp".to_owned(), 42)],
            "{id}: the union"
        );
        let slices = imported(&set, id);
        assert_eq!(slices["a"].0, ["tcp/42"], "{id}: a does not expose admin");
        assert_eq!(slices["b"].0, ["admin/43", "tcp/42"], "{id}");
    }
    assert_eq!(
        set.cluster(&c).unwrap().import(&hello()).unwrap().spec.ips,
        vip,
        "the VIP stays for the life of the import"
    );
}

#[test]
fn a_headless_import_has_no_ips_and_no_derived_service() {
    let (mut set, [a, _, c]) = clusterset();
    set.apply_service(&a, service("hello", &[("tcp", 42)], Some("None")))
        .unwrap();
    set.apply_slice(&a, slice("hello", &["10.1.5.1"], &[("tcp", 42)]))
        .unwrap();
    set.apply_export(&a, export("hello")).unwrap();
    set.converge().unwrap();
    let member = set.cluster(&c).unwrap();
    let import = member.import(&hello()).unwrap();
    assert_eq!(import.spec.type_, ServiceImportType::Headless);
    assert!(import.spec.ips.as_ref().is_none_or(Vec::is_empty));
    assert!(member.derived_service(&hello()).is_none());
    assert_eq!(imported(&set, &c)["a"].1, ["10.1.5.1"]);
}

#[test]
fn external_name_and_missing_services_are_invalid_and_not_imported() {
    let (mut set, [a, b, c]) = clusterset();
    let mut external = service("hello", &[], None);
    let spec = external.spec.as_mut().unwrap();
    spec.type_ = Some("ExternalName".into());
    spec.external_name = Some("example.com".into());
    spec.ports = None;
    set.apply_service(&a, external).unwrap();
    set.apply_export(&a, export("hello")).unwrap();
    set.apply_export(&b, export("hello")).unwrap();
    set.converge().unwrap();
    assert_eq!(
        condition(&set, &a, "Valid"),
        ("False".into(), "InvalidServiceType".into())
    );
    assert_eq!(
        condition(&set, &b, "Valid"),
        ("False".into(), "NoService".into())
    );
    assert!(set.cluster(&c).unwrap().imports().next().is_none());
    assert_eq!(
        set.cluster(&a)
            .unwrap()
            .service(NS, "hello")
            .unwrap()
            .spec
            .as_ref()
            .unwrap()
            .cluster_ip,
        None,
        "an ExternalName Service gets no cluster IP"
    );
}

#[test]
fn unexporting_removes_everything_the_agents_wrote_and_releases_the_vip() {
    let (mut set, [a, b, c]) = clusterset();
    export_hello(&mut set, &a, &[("tcp", 42)], &["10.1.5.1"]);
    set.converge().unwrap();
    let vip = set
        .cluster(&c)
        .unwrap()
        .import(&hello())
        .unwrap()
        .spec
        .ips
        .clone();
    set.delete_export(&a, NS, "hello").unwrap();
    set.converge().unwrap();
    for id in [&a, &b, &c] {
        let member = set.cluster(id).unwrap();
        assert!(member.import(&hello()).is_none(), "{id}");
        assert!(member.derived_service(&hello()).is_none(), "{id}");
        assert_eq!(member.mcs_slices(&hello()).count(), 0, "{id}");
    }
    // The address is free again: the next import gets it.
    set.apply_export(&a, export("hello")).unwrap();
    set.converge().unwrap();
    assert_eq!(
        set.cluster(&c).unwrap().import(&hello()).unwrap().spec.ips,
        vip
    );
}

#[test]
fn services_get_cluster_ips_from_their_cluster_as_the_api_server_gives_them() {
    let (mut set, [a, ..]) = clusterset();
    set.apply_service(&a, service("one", &[("tcp", 1)], None))
        .unwrap();
    set.apply_service(&a, service("two", &[("tcp", 2)], Some("10.1.0.2")))
        .unwrap_err();
    set.apply_service(&a, service("two", &[("tcp", 2)], Some("10.1.9.9")))
        .unwrap();
    set.apply_service(&a, service("three", &[("tcp", 3)], None))
        .unwrap();
    let ip = |set: &ClusterSetPlan, name| {
        let service = set.cluster(&a).unwrap().service(NS, name).unwrap();
        service.spec.as_ref().unwrap().cluster_ip.clone().unwrap()
    };
    assert_eq!(
        ip(&set, "one"),
        "10.1.0.2",
        "network and first host skipped"
    );
    assert_eq!(ip(&set, "two"), "10.1.9.9", "asked for");
    assert_eq!(ip(&set, "three"), "10.1.0.3");
    // An update without a cluster IP keeps the allocated one.
    set.apply_service(&a, service("one", &[("tcp", 11)], None))
        .unwrap();
    assert_eq!(ip(&set, "one"), "10.1.0.2");
    let err = set
        .apply_service(&a, service("four", &[("tcp", 4)], Some("10.9.0.1")))
        .unwrap_err();
    assert!(
        err.to_string().contains("demo/four") && err.to_string().contains("outside"),
        "{err}"
    );

    let mut tiny = ClusterSetPlan::new(set.now());
    let t = tiny.add_cluster(&property("t"), "10.9.0.0/30").unwrap();
    tiny.apply_namespace(&t, NS).unwrap();
    tiny.apply_service(&t, service("one", &[("tcp", 1)], None))
        .unwrap();
    let err = tiny
        .apply_service(&t, service("two", &[("tcp", 1)], None))
        .unwrap_err();
    assert!(
        err.to_string()
            .contains("no free address left in 10.9.0.0/30"),
        "{err}"
    );

    let mut dual = ClusterSetPlan::new(set.now());
    let d = dual
        .add_cluster(&property("d"), "10.9.0.0/24, fd00::/108")
        .unwrap();
    dual.apply_namespace(&d, NS).unwrap();
    let mut svc = service("one", &[("tcp", 1)], None);
    svc.spec.as_mut().unwrap().ip_family_policy = Some("PreferDualStack".into());
    dual.apply_service(&d, svc).unwrap();
    let spec = dual
        .cluster(&d)
        .unwrap()
        .service(NS, "one")
        .unwrap()
        .spec
        .clone()
        .unwrap();
    assert_eq!(spec.cluster_ips.unwrap(), ["10.9.0.2", "fd00::2"]);
    assert_eq!(spec.ip_families.unwrap(), ["IPv4", "IPv6"]);
}

#[test]
fn bad_input_is_a_typed_error_naming_the_object() {
    let (mut set, [a, ..]) = clusterset();
    let stranger = ClusterId::new("z").unwrap();
    assert!(matches!(
        set.apply_namespace(&stranger, NS),
        Err(PlanError::UnknownCluster { .. })
    ));
    let mut elsewhere = service("hello", &[("tcp", 1)], None);
    elsewhere.metadata.namespace = Some("nowhere".into());
    let err = set.apply_service(&a, elsewhere).unwrap_err();
    assert_eq!(
        err.to_string(),
        "cluster a: Service nowhere/hello refused: namespace nowhere not found"
    );
    let mut unnamed = export("hello");
    unnamed.metadata.name = None;
    assert_eq!(
        set.apply_export(&a, unnamed).unwrap_err().to_string(),
        "cluster a: ServiceExport without metadata.name"
    );
    let other = ClusterProperty::new(
        "clusterset.k8s.io",
        ClusterPropertySpec { value: "x".into() },
    );
    assert!(matches!(
        set.add_cluster(&other, "10.9.0.0/16"),
        Err(PlanError::NotClusterIdProperty { .. })
    ));
    assert!(matches!(
        set.add_cluster(&property("Not_An_Id"), "10.9.0.0/16"),
        Err(PlanError::ClusterId { .. })
    ));
    assert!(matches!(
        set.add_cluster(&property("a"), "10.9.0.0/16"),
        Err(PlanError::DuplicateCluster { .. })
    ));
    for (cidr, problem) in [
        ("10.9.0.1/16", "host bits"),
        ("10.9.0.0", "expected"),
        ("10.9.0.0/33", "prefix length"),
        ("10.9.0.0/31", "too small"),
        ("10.9.0.0/16,10.8.0.0/16", "one IPv4 and one IPv6"),
    ] {
        let err = set.add_cluster(&property("y"), cidr).unwrap_err();
        assert!(
            matches!(err, PlanError::ServiceCidr { .. }) && err.to_string().contains(problem),
            "{cidr}: {err}"
        );
    }
}
