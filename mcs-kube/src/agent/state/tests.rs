//! The state's bookkeeping, fact by fact, in both topologies: what it holds, what each fact
//! touches, when it counts as synced and what it says it waits for, when a member loses and
//! regains its endpoints. The agent's integration tests run the same code against real API
//! servers; these reach the branches those rarely do (a re-list dropping a record, a
//! Lease expiring while the hub is down, a member that never renewed its Lease).

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::api::core::v1::{Namespace, Service, ServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta, Time};
use kube::runtime::watcher::Event;
use mcs_core::ClusterId;
use mcs_core::api::{ServiceExportSpec, v1beta1::ServiceExport, v1beta1::ServiceImport};
use mcs_core::name::ServiceRef;

use super::super::desired::LABEL_K8S_SERVICE_NAME;
use super::super::index::Touched;
use super::super::reconcile::Publication;
use super::super::source::{Fact, KIND_EXPORT, KIND_LEASE, KIND_SERVICE, KIND_SLICE, Origin};
use super::properties::property as cluster_property;
use super::{Mode, Settings, State};
use crate::hub::LABEL_MEMBER;
use crate::hub::record::MemberExport;

const GRACE: Duration = Duration::from_secs(10);

fn id(name: &str) -> ClusterId {
    name.parse().unwrap()
}

fn svc(name: &str) -> ServiceRef {
    ServiceRef::new("demo", name).unwrap()
}

fn meta(name: &str) -> ObjectMeta {
    ObjectMeta {
        name: Some(name.into()),
        namespace: Some("demo".into()),
        ..Default::default()
    }
}

fn export(name: &str) -> ServiceExport {
    let mut export = ServiceExport::new(name, ServiceExportSpec::default());
    export.metadata = ObjectMeta {
        uid: Some(format!("uid-{name}")),
        creation_timestamp: Some(Time("2026-12-01T10:00:00Z".parse().unwrap())),
        ..meta(name)
    };
    export
}

fn service(name: &str) -> Service {
    Service {
        metadata: meta(name),
        spec: Some(ServiceSpec {
            type_: Some("ClusterIP".into()),
            cluster_ip: Some("10.0.0.12".into()),
            ports: Some(vec![ServicePort {
                name: Some("http".into()),
                port: 80,
                protocol: Some("TCP".into()),
                ..Default::default()
            }]),
            ..Default::default()
        }),
        status: None,
    }
}

/// A slice of the Kubernetes Service `service` with one endpoint at `ip`.
fn slice(service: &str, ip: &str) -> EndpointSlice {
    let mut metadata = meta(&format!("{service}-{}", ip.replace('.', "-")));
    metadata.labels = Some(BTreeMap::from([(
        LABEL_K8S_SERVICE_NAME.to_owned(),
        service.to_owned(),
    )]));
    EndpointSlice {
        metadata,
        address_type: "IPv4".into(),
        endpoints: vec![Endpoint {
            addresses: vec![ip.into()],
            ..Default::default()
        }],
        ports: None,
    }
}

fn namespace(name: &str, labels: &[(&str, &str)]) -> Namespace {
    Namespace {
        metadata: ObjectMeta {
            name: Some(name.into()),
            labels: Some(
                labels
                    .iter()
                    .map(|(k, v)| ((*k).to_owned(), (*v).to_owned()))
                    .collect(),
            ),
            ..Default::default()
        },
        ..Default::default()
    }
}

/// What `cluster` publishes on the hub of its export of `name`, with one endpoint at `ip`.
fn record(cluster: &str, name: &str, ip: &str) -> MemberExport {
    let slice = slice(name, ip);
    MemberExport::from_member(&id(cluster), &export(name), Some(&service(name)), &[&slice]).unwrap()
}

fn lease(renewed: &str, seconds: i32) -> Lease {
    Lease {
        metadata: ObjectMeta::default(),
        spec: Some(LeaseSpec {
            renew_time: Some(MicroTime(renewed.parse().unwrap())),
            lease_duration_seconds: Some(seconds),
            ..Default::default()
        }),
    }
}

/// A whole first list of `objects`, as a watch delivers it.
fn listed<K>(objects: Vec<K>) -> Vec<Event<K>> {
    let mut events = vec![Event::Init];
    events.extend(objects.into_iter().map(Event::InitApply));
    events.push(Event::InitDone);
    events
}

fn state(mode: Mode, peers: &[&str]) -> State {
    let settings = Settings {
        local: id("north"),
        mode,
        grace: GRACE,
        allowed_namespaces: None,
        cluster_selection: false,
    };
    State::new(settings, peers.iter().map(|p| id(p)))
}

/// Feeds `facts` at `now`; returns the services they touched, to reconcile.
fn feed(state: &mut State, facts: impl IntoIterator<Item = Fact>, now: Instant) -> Vec<ServiceRef> {
    let mut touched = Vec::new();
    for fact in facts {
        touched.extend(state.handle(fact, now).reconcile);
    }
    touched.sort();
    touched.dedup();
    touched
}

/// The first lists of the agent's own cluster, empty.
fn own_lists() -> Vec<Fact> {
    let mut facts: Vec<Fact> = listed(vec![namespace("demo", &[])])
        .into_iter()
        .map(Fact::Namespace)
        .collect();
    facts.extend(
        listed::<ServiceImport>(vec![])
            .into_iter()
            .map(Fact::Import),
    );
    facts.extend(listed(vec![]).into_iter().map(Fact::Imported));
    facts.extend(listed(vec![]).into_iter().map(Fact::Derived));
    facts
}

/// The first lists of a member in the mesh topology.
fn member_lists(
    member: &str,
    exports: Vec<ServiceExport>,
    services: Vec<Service>,
    slices: Vec<EndpointSlice>,
) -> Vec<Fact> {
    let mut facts: Vec<Fact> = listed(exports)
        .into_iter()
        .map(|e| Fact::Export(id(member), e))
        .collect();
    facts.extend(
        listed(services)
            .into_iter()
            .map(|e| Fact::Service(id(member), e)),
    );
    facts.extend(
        listed(slices)
            .into_iter()
            .map(|e| Fact::Slice(id(member), e)),
    );
    facts
}

/// The endpoint addresses the planner would get for `service`, by source cluster.
fn sources(state: &State, service: &ServiceRef, now: Instant) -> BTreeMap<String, Vec<String>> {
    state
        .inputs_for(service, now)
        .sources
        .into_iter()
        .map(|(id, slices)| {
            let ips = slices
                .iter()
                .flat_map(|s| s.endpoints.iter().flat_map(|e| e.addresses.clone()))
                .collect();
            (id.to_string(), ips)
        })
        .filter(|(_, ips): &(String, Vec<String>)| !ips.is_empty())
        .collect()
}

fn not_ready(state: &State, now: Instant) -> Option<String> {
    state.not_ready_reason(&BTreeMap::new(), now, now)
}

#[test]
fn mesh_synced_once_every_watch_listed_and_says_what_it_still_waits_for() {
    let now = Instant::now();
    let mut s = state(Mode::Mesh, &["east", "west"]);
    assert!(!s.synced());
    let reason = not_ready(&s, now).expect("not ready before any list");
    for waited in [
        "Namespace in north",
        "ServiceExport in east",
        "EndpointSlice in west",
    ] {
        assert!(reason.contains(waited), "{waited:?} not in {reason:?}");
    }

    feed(&mut s, own_lists(), now);
    feed(&mut s, member_lists("north", vec![], vec![], vec![]), now);
    feed(&mut s, member_lists("east", vec![], vec![], vec![]), now);
    let mut west = member_lists("west", vec![], vec![], vec![]);
    let west_slices = west.split_off(4);
    feed(&mut s, west, now);
    assert!(!s.synced(), "west's slices have not listed");
    let reason = not_ready(&s, now).expect("still waiting");
    assert!(
        reason.contains("waiting for the first list of EndpointSlice in west"),
        "{reason}"
    );
    assert!(!reason.contains("in east"), "east has listed: {reason}");

    feed(&mut s, west_slices, now);
    assert!(s.synced());
    assert_eq!(not_ready(&s, now), None);
}

#[test]
fn mesh_a_members_export_reaches_the_merge_and_the_planners_inputs() {
    let now = Instant::now();
    let mut s = state(Mode::Mesh, &["east", "west"]);
    feed(&mut s, own_lists(), now);
    for member in ["north", "west"] {
        feed(&mut s, member_lists(member, vec![], vec![], vec![]), now);
    }
    let touched = feed(
        &mut s,
        member_lists(
            "east",
            vec![export("hello")],
            vec![service("hello"), service("unexported")],
            vec![slice("hello", "10.1.0.5")],
        ),
        now,
    );
    assert_eq!(touched, [svc("hello"), svc("unexported")]);
    s.update_merge(&svc("hello"));
    let inputs = s.inputs_for(&svc("hello"), now);
    assert!(inputs.outcome.is_some(), "east's export was merged");
    assert_eq!(inputs.publication, Publication::Direct);
    assert!(inputs.unreachable.is_empty());
    assert_eq!(
        sources(&s, &svc("hello"), now),
        BTreeMap::from([("east".to_owned(), vec!["10.1.0.5".to_owned()])])
    );

    // The export goes: the merge has no constituent left.
    let touched = feed(
        &mut s,
        [Fact::Export(id("east"), Event::Delete(export("hello")))],
        now,
    );
    assert_eq!(touched, [svc("hello")]);
    s.update_merge(&svc("hello"));
    assert!(s.inputs_for(&svc("hello"), now).outcome.is_none());
}

#[test]
fn mesh_a_member_failing_past_the_grace_period_loses_its_endpoints_until_it_recovers() {
    let t0 = Instant::now();
    let mut s = state(Mode::Mesh, &["east"]);
    feed(&mut s, own_lists(), t0);
    feed(&mut s, member_lists("north", vec![], vec![], vec![]), t0);
    feed(
        &mut s,
        member_lists(
            "east",
            vec![export("hello")],
            vec![service("hello")],
            vec![slice("hello", "10.1.0.5")],
        ),
        t0,
    );
    let hello = svc("hello");

    let failed = Fact::WatchError(
        Origin::Member(id("east")),
        KIND_SLICE,
        "connection refused".into(),
        false,
    );
    assert!(s.handle(failed, t0).members, "a member starts failing");
    // Within the grace period: still there, marked unreachable, judged again when it ends.
    let (touched, next) = s.judge_members(t0 + GRACE / 2);
    assert!(touched.is_empty());
    assert_eq!(next, Some(t0 + GRACE));
    assert_eq!(s.inputs_for(&hello, t0).unreachable, [(id("east"), false)]);
    assert_eq!(s.reachable_members(t0), 1);
    assert_eq!(sources(&s, &hello, t0).len(), 1);
    // Past it: its endpoints go, the import says why.
    let (touched, next) = s.judge_members(t0 + GRACE);
    assert_eq!(touched, Touched::from([hello.clone()]));
    assert_eq!(next, None);
    assert!(sources(&s, &hello, t0 + GRACE).is_empty());
    assert_eq!(s.inputs_for(&hello, t0).unreachable, [(id("east"), true)]);
    s.update_merge(&hello);
    assert!(
        s.inputs_for(&hello, t0).outcome.is_none(),
        "east left the merge"
    );
    assert!(s.synced(), "a removed member holds nobody back");

    // The same watch answers again: the member is back once judged.
    let later = t0 + GRACE * 3;
    let changes = s.handle(
        Fact::Slice(id("east"), Event::Apply(slice("hello", "10.1.0.5"))),
        later,
    );
    assert!(changes.members);
    assert!(changes.reconcile.contains(&hello));
    let (touched, _) = s.judge_members(later);
    assert!(touched.contains(&hello));
    assert_eq!(sources(&s, &hello, later).len(), 1);
    assert!(s.inputs_for(&hello, later).unreachable.is_empty());
}

#[test]
fn mesh_a_namespace_starting_to_terminate_touches_only_its_own_services() {
    let now = Instant::now();
    let mut s = state(Mode::Mesh, &["east"]);
    feed(&mut s, own_lists(), now);
    let mut other = export("elsewhere");
    other.metadata.namespace = Some("other".into());
    feed(
        &mut s,
        member_lists("east", vec![export("hello"), other], vec![], vec![]),
        now,
    );
    assert!(!s.inputs_for(&svc("hello"), now).namespace_terminating);

    let mut terminating = namespace("demo", &[]);
    terminating.metadata.deletion_timestamp = Some(Time("2026-12-01T11:00:00Z".parse().unwrap()));
    let touched = feed(
        &mut s,
        [Fact::Namespace(Event::Apply(terminating.clone()))],
        now,
    );
    assert_eq!(touched, [svc("hello")]);
    assert!(s.inputs_for(&svc("hello"), now).namespace_terminating);
    // The same again changes nothing.
    let touched = feed(&mut s, [Fact::Namespace(Event::Apply(terminating))], now);
    assert!(touched.is_empty());
}

/// A hub-topology state with its own cluster's and the hub's first lists done, and
/// member `east` known with its records listed (`records`) and a Lease renewed now.
fn hub_state(records: Vec<MemberExport>, now: Instant) -> State {
    let mut s = state(Mode::Hub, &[]);
    feed(&mut s, own_lists(), now);
    feed(
        &mut s,
        listed(vec![])
            .into_iter()
            .map(|e| Fact::Export(id("north"), e)),
        now,
    );
    feed(&mut s, listed(vec![]).into_iter().map(Fact::OwnRecord), now);
    let members = vec![
        namespace("mcs-member-east", &[(LABEL_MEMBER, "east")]),
        namespace("mcs-member-north", &[(LABEL_MEMBER, "north")]),
    ];
    feed(&mut s, listed(members).into_iter().map(Fact::Members), now);
    feed(
        &mut s,
        listed(records)
            .into_iter()
            .map(|e| Fact::Record(id("east"), e)),
        now,
    );
    feed(
        &mut s,
        listed(vec![lease("2026-12-01T10:00:00Z", 15)])
            .into_iter()
            .map(|e| Fact::Lease(id("east"), e)),
        now,
    );
    s
}

#[test]
fn hub_a_relist_of_a_members_records_replaces_them_at_once() {
    let now = Instant::now();
    let mut s = hub_state(
        vec![
            record("east", "hello", "10.1.0.5"),
            record("east", "gone", "10.1.0.6"),
        ],
        now,
    );
    assert!(s.synced(), "{:?}", not_ready(&s, now));
    assert_eq!(
        sources(&s, &svc("gone"), now),
        BTreeMap::from([("east".to_owned(), vec!["10.1.0.6".to_owned()])])
    );

    // The watch lists again (after a restart of it, say): `gone` was deleted meanwhile and
    // `hello` moved to another endpoint. Nothing changes until the list is done.
    let relist = listed(vec![record("east", "hello", "10.1.0.7")]);
    let (last, first) = relist.split_last().unwrap();
    let touched = feed(
        &mut s,
        first.iter().cloned().map(|e| Fact::Record(id("east"), e)),
        now,
    );
    assert!(touched.is_empty());
    assert_eq!(sources(&s, &svc("gone"), now).len(), 1);
    let touched = feed(&mut s, [Fact::Record(id("east"), last.clone())], now);
    assert_eq!(touched, [svc("gone"), svc("hello")]);
    assert!(sources(&s, &svc("gone"), now).is_empty());
    assert!(s.members[&id("east")].exports.named(&svc("gone")).is_none());
    assert_eq!(
        sources(&s, &svc("hello"), now),
        BTreeMap::from([("east".to_owned(), vec!["10.1.0.7".to_owned()])])
    );

    // A record deleted on its own takes its Service and slices with it.
    let touched = feed(
        &mut s,
        [Fact::Record(
            id("east"),
            Event::Delete(record("east", "hello", "10.1.0.7")),
        )],
        now,
    );
    assert_eq!(touched, [svc("hello")]);
    let east = &s.members[&id("east")];
    assert_eq!(
        (east.exports.len(), east.services.len(), east.slices.len()),
        (0, 0, 0)
    );
}

#[test]
fn hub_a_member_whose_lease_is_not_renewed_is_removed_after_the_grace_period() {
    let t0 = Instant::now();
    let mut s = hub_state(vec![record("east", "hello", "10.1.0.5")], t0);
    let hello = svc("hello");
    let expiry = t0 + Duration::from_secs(15);
    assert_eq!(s.judge_members(t0), (Default::default(), Some(expiry)));

    // A renewal, seen later, restarts the clock; the same renewal seen again does not.
    let renewed = t0 + Duration::from_secs(10);
    let renewal = || Fact::Lease(id("east"), Event::Apply(lease("2026-12-01T10:00:10Z", 15)));
    feed(&mut s, [renewal()], renewed);
    feed(&mut s, [renewal()], renewed + Duration::from_secs(5));
    let expiry = renewed + Duration::from_secs(15);
    assert_eq!(s.judge_members(renewed).1, Some(expiry));
    assert!(s.member_reachability(expiry - Duration::from_millis(1))[&id("east")]);
    assert!(!s.member_reachability(expiry)[&id("east")]);

    // Expired: unreachable, then removed once the grace period has passed since.
    let (touched, next) = s.judge_members(expiry);
    assert!(touched.is_empty());
    assert_eq!(next, Some(expiry + GRACE));
    let (touched, _) = s.judge_members(expiry + GRACE);
    assert_eq!(touched, Touched::from([hello.clone()]));
    assert!(sources(&s, &hello, expiry + GRACE).is_empty());

    // A deleted Lease is an expired one, even right after a renewal.
    let mut s = hub_state(vec![record("east", "hello", "10.1.0.5")], t0);
    feed(
        &mut s,
        [Fact::Lease(
            id("east"),
            Event::Delete(lease("2026-12-01T10:00:00Z", 15)),
        )],
        t0,
    );
    assert!(!s.member_reachability(t0)[&id("east")]);
}

#[test]
fn hub_while_the_hub_is_down_leases_do_not_count_and_imports_are_kept() {
    let t0 = Instant::now();
    let mut s = hub_state(vec![record("east", "hello", "10.1.0.5")], t0);
    let hello = svc("hello");
    let down = t0 + Duration::from_secs(1);
    let changes = s.handle(
        Fact::HubWrite("Lease", Err("connection refused".into())),
        down,
    );
    assert!(
        changes.reconcile.contains(&hello),
        "imports say the hub is down"
    );
    assert!(changes.members);
    assert!(s.inputs_for(&hello, down).hub_unreachable);
    let reason = not_ready(&s, down).expect("not ready while the hub is down");
    assert!(
        reason.contains("the hub is unreachable (Lease: connection refused)"),
        "{reason}"
    );

    // east's Lease would have expired long ago; no renewal can be seen, so nothing goes.
    let late = t0 + Duration::from_secs(600);
    assert_eq!(s.judge_members(late), (Default::default(), None));
    assert_eq!(sources(&s, &hello, late).len(), 1);

    // The hub answers again: everything is looked at again, and Leases count again, from
    // now: east's watch may not have shown its latest renewal yet.
    let changes = s.handle(Fact::HubWrite("Lease", Ok(())), late);
    assert!(changes.hub_answering && changes.members);
    assert!(changes.reconcile.contains(&hello));
    assert_eq!(not_ready(&s, late), None);
    let expiry = late + Duration::from_secs(15);
    assert_eq!(s.judge_members(late), (Touched::new(), Some(expiry)));
    assert_eq!(sources(&s, &hello, late).len(), 1);
    // Not renewed after all: removed after the grace period.
    let (touched, _) = s.judge_members(expiry + GRACE);
    assert_eq!(touched, Touched::from([hello.clone()]));
    assert!(sources(&s, &hello, expiry + GRACE).is_empty());
}

#[test]
fn hub_a_member_is_judged_by_its_lease_from_its_first_renewal_on() {
    let t0 = Instant::now();
    let mut s = hub_state(vec![], t0);
    let members = |name: &str| namespace(&format!("mcs-member-{name}"), &[(LABEL_MEMBER, name)]);
    let west = |e| Fact::Lease(id("west"), e);
    feed(&mut s, [Fact::Members(Event::Apply(members("west")))], t0);
    feed(
        &mut s,
        listed(vec![])
            .into_iter()
            .map(|e| Fact::Record(id("west"), e)),
        t0,
    );
    assert!(!s.synced(), "west's Lease has not listed");
    let reason = not_ready(&s, t0).unwrap();
    assert!(
        reason.contains(&format!("{KIND_LEASE} of west")),
        "{reason}"
    );
    // Listed without a Lease (west runs an earlier version, or has not started): synced,
    // and never judged by a Lease it does not renew.
    feed(&mut s, listed(vec![]).into_iter().map(west), t0);
    assert!(s.synced(), "{:?}", not_ready(&s, t0));
    let late = t0 + Duration::from_secs(600);
    assert!(s.member_reachability(late)[&id("west")]);
    // The Lease its roles created, not renewed yet: the same.
    let created = Lease {
        spec: None,
        ..lease("2026-12-01T10:00:00Z", 15)
    };
    feed(&mut s, [west(Event::Apply(created))], late);
    assert!(s.member_reachability(late + Duration::from_secs(600))[&id("west")]);
    // Renewed once: judged from then on.
    feed(
        &mut s,
        [west(Event::Apply(lease("2026-12-01T10:10:00Z", 15)))],
        late,
    );
    let expiry = late + Duration::from_secs(15);
    assert!(s.member_reachability(expiry - Duration::from_millis(1))[&id("west")]);
    assert!(!s.member_reachability(expiry)[&id("west")]);

    // A re-list without the Lease seen before: deleted meanwhile, so expired.
    let mut s = hub_state(vec![record("east", "hello", "10.1.0.5")], t0);
    assert!(s.member_reachability(t0)[&id("east")]);
    feed(
        &mut s,
        listed(vec![])
            .into_iter()
            .map(|e| Fact::Lease(id("east"), e)),
        t0,
    );
    assert!(!s.member_reachability(t0)[&id("east")]);

    // The Lease watch failing holds every member back until it lists again.
    let mut s = hub_state(vec![], t0);
    feed(&mut s, [Fact::Members(Event::Apply(members("west")))], t0);
    feed(
        &mut s,
        listed(vec![])
            .into_iter()
            .map(|e| Fact::Record(id("west"), e)),
        t0,
    );
    feed(
        &mut s,
        [Fact::WatchError(
            Origin::Hub,
            KIND_LEASE,
            "timeout".into(),
            false,
        )],
        t0,
    );
    assert!(!s.synced());
    let reason = not_ready(&s, t0).unwrap();
    assert!(reason.contains("timeout"), "{reason}");

    // The member namespace goes: so does the member, and what it exported.
    let mut s = hub_state(vec![record("east", "hello", "10.1.0.5")], t0);
    let touched = feed(
        &mut s,
        [Fact::Members(Event::Delete(namespace(
            "mcs-member-east",
            &[(LABEL_MEMBER, "east")],
        )))],
        t0,
    );
    assert_eq!(touched, [svc("hello")]);
    assert!(!s.members.contains_key(&id("east")));
    assert!(sources(&s, &svc("hello"), t0).is_empty());
}

#[test]
fn hub_own_export_is_awaited_per_service_then_published_until_the_record_says_the_same() {
    let now = Instant::now();
    let mut s = hub_state(vec![], now);
    let hello = svc("hello");
    let changes = s.handle(
        Fact::Export(id("north"), Event::Apply(export("hello"))),
        now,
    );
    assert!(
        changes.publish.contains(&hello),
        "a new export is published"
    );
    // Its Service and slices are watched per service; until both listed, the agent waits.
    assert!(!s.own_exports_synced());
    let reason = not_ready(&s, now).unwrap();
    assert!(
        reason.contains(&format!("{KIND_SERVICE} of demo/hello in north")),
        "{reason}"
    );
    assert!(
        reason.contains(&format!("{KIND_SLICE} of demo/hello in north")),
        "{reason}"
    );

    feed(
        &mut s,
        listed(vec![service("hello")])
            .into_iter()
            .map(|e| Fact::ServiceOf(hello.clone(), e)),
        now,
    );
    let slices = listed(vec![slice("hello", "10.2.0.9")]);
    let changes: Vec<_> = slices
        .into_iter()
        .map(|e| s.handle(Fact::SlicesOf(hello.clone(), e), now))
        .collect();
    assert!(changes.last().unwrap().publish.contains(&hello));
    assert!(s.own_exports_synced() && s.synced());

    // What to publish: the export with its Service and slice.
    let want = s.desired_record(&hello).expect("a record to publish");
    assert_eq!(want.spec.cluster, "north");
    assert_eq!(want.spec.slices.len(), 1);
    assert!(want.spec.service.is_some());
    assert_eq!(s.inputs_for(&hello, now).publication, Publication::Pending);
    let mut stale = want.clone();
    stale.spec.slices.clear();
    feed(&mut s, [Fact::OwnRecord(Event::Apply(stale))], now);
    assert_eq!(s.inputs_for(&hello, now).publication, Publication::Pending);
    feed(&mut s, [Fact::OwnRecord(Event::Apply(want))], now);
    assert_eq!(
        s.inputs_for(&hello, now).publication,
        Publication::Published
    );
    assert_eq!(s.own_exported(), Touched::from([hello.clone()]));

    // Unexported: the per-service watches stop and take what they held.
    feed(
        &mut s,
        [Fact::Export(id("north"), Event::Delete(export("hello")))],
        now,
    );
    let changes = s.handle(Fact::Unwatched(hello.clone()), now);
    assert!(changes.publish.contains(&hello));
    assert!(s.desired_record(&hello).is_none());
    let north = &s.members[&id("north")];
    assert_eq!((north.services.len(), north.slices.len()), (0, 0));
}

#[test]
fn a_watch_answering_again_clears_its_error_and_reconciles_the_members_services() {
    let now = Instant::now();
    let mut s = state(Mode::Mesh, &["east"]);
    feed(&mut s, own_lists(), now);
    feed(&mut s, member_lists("north", vec![], vec![], vec![]), now);
    feed(
        &mut s,
        member_lists("east", vec![export("hello")], vec![], vec![]),
        now,
    );
    for kind in [KIND_EXPORT, KIND_SLICE] {
        let error = Fact::WatchError(Origin::Member(id("east")), kind, "timeout".into(), false);
        s.handle(error, now);
    }
    // One of the two watches answers: east still fails.
    let changes = s.handle(
        Fact::Slice(id("east"), Event::Apply(slice("other", "10.1.0.9"))),
        now,
    );
    assert!(!changes.members);
    assert_eq!(s.reachable_members(now), 1);
    // Both: east is reachable again, its exports are reconciled.
    let changes = s.handle(Fact::Export(id("east"), Event::Apply(export("hello"))), now);
    assert!(changes.members);
    assert!(changes.reconcile.contains(&svc("hello")));
    assert_eq!(s.reachable_members(now), 2);
}

/// With cluster selection on, the planner gets this cluster's and the members' properties
/// for a service whose import has selectors (members whose properties are not listed yet
/// left out); a property change reconciles exactly those services; a failing property
/// watch leaves the member reachable and its properties unknown.
#[test]
fn mesh_properties_reach_the_planner_for_services_with_selectors() {
    let now = Instant::now();
    let mut s = state(Mode::Mesh, &["east"]);
    s.settings.cluster_selection = true;
    feed(&mut s, own_lists(), now);
    let mut selecting = export("near");
    selecting.spec.cluster_selectors = Some(
        serde_json::from_str(
            r#"[{"propertySelector": {"matchProperties": {"region": "@SameAsImporter@"}}}]"#,
        )
        .unwrap(),
    );
    feed(&mut s, member_lists("north", vec![], vec![], vec![]), now);
    feed(
        &mut s,
        member_lists(
            "east",
            vec![selecting, export("hello")],
            vec![service("near"), service("hello")],
            vec![],
        ),
        now,
    );
    s.update_merge(&svc("near"));
    s.update_merge(&svc("hello"));
    let known = |s: &State, service: &str| {
        s.inputs_for(&svc(service), now).properties.map(|p| {
            let mut members: Vec<String> = p.members.keys().map(|id| id.to_string()).collect();
            members.insert(0, format!("local region={:?}", p.local.get("region")));
            members
        })
    };
    assert_eq!(known(&s, "near"), None, "nothing listed yet");

    let north = listed(vec![cluster_property("region", "eu")]);
    let touched = feed(
        &mut s,
        north.into_iter().map(|e| Fact::Property(id("north"), e)),
        now,
    );
    assert_eq!(touched, [svc("near")], "only the service with selectors");
    assert_eq!(
        known(&s, "near"),
        Some(vec![
            r#"local region=Some("eu")"#.to_owned(),
            "north".to_owned()
        ]),
        "east not listed yet: not known"
    );
    assert_eq!(known(&s, "hello"), None, "no selectors, no properties");

    feed(
        &mut s,
        listed(vec![cluster_property("region", "eu")])
            .into_iter()
            .map(|e| Fact::Property(id("east"), e)),
        now,
    );
    assert_eq!(
        known(&s, "near").map(|m| m.len()),
        Some(3),
        "north and east known"
    );

    // East's property watch fails: east stays reachable, its properties are unknown.
    let failed = s.handle(
        Fact::WatchError(
            Origin::Member(id("east")),
            super::KIND_PROPERTY,
            "watch: connection refused".into(),
            false,
        ),
        now,
    );
    assert!(!failed.members, "member health is not affected");
    assert_eq!(s.reachable_members(now + GRACE * 2), 2);
    assert_eq!(known(&s, "near").map(|m| m.len()), Some(2));

    // Its watch shows a change: known again, and the selecting service reconciled.
    let touched = feed(
        &mut s,
        [Fact::Property(
            id("east"),
            Event::Apply(cluster_property("region", "us")),
        )],
        now,
    );
    assert_eq!(touched, [svc("near")]);
    assert_eq!(known(&s, "near").map(|m| m.len()), Some(3));

    // Off: no properties even when known.
    s.settings.cluster_selection = false;
    assert_eq!(known(&s, "near"), None);
}
