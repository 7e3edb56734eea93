//! The hub topology: members publish what they export to a hub Kubernetes API server and
//! read each other's records there, instead of every agent watching every member.
//!
//! # Layout on the hub
//!
//! - One namespace per member, `mcs-member-<cluster id>`, labelled
//!   `hub.mcs.dev/member=<cluster id>`. Agents discover members by that label.
//! - In it, one [`MemberExport`](record::MemberExport) per service the member exports
//!   (`hub.mcs.dev/v1alpha1`, named `<namespace>.<name>`): the export's creation time and
//!   exported labels and annotations, the Service fields that take part in the merge, and
//!   the Service's endpoints. Every member merges the same records with the same
//!   `mcs-core` merge, so every member computes the same imports.
//! - One namespace for every member's Lease, `mcs-hub-leases` (as Kubernetes keeps node
//!   Leases in `kube-node-lease`): a `coordination.k8s.io/v1` Lease named after the
//!   member's cluster id, renewed by the member's agent. Each agent watches them all in one
//!   watch. A member whose Lease has expired is treated as gone after the agent's grace
//!   period: its endpoints leave every import, and come back when it renews. A member that
//!   has never renewed its Lease is not judged by it (members of earlier versions renew
//!   only the Lease `member` in their own namespace, which agents still renew too).
//!
//! # Who may do what
//!
//! A member's hub identity (user `mcs:member:<id>`, group `mcs:members`) may write only in
//! its own namespace (records and the earlier versions' Lease) and its own Lease in
//! `mcs-hub-leases` (a Role naming that one Lease; the Lease is created with the member's
//! roles, since a role cannot limit creating to one name). It may list the member
//! namespaces, read MemberExports in every namespace (a ClusterRole: each agent watches all
//! members' records in one watch, so the hub's watches grow with the members, not with
//! their square) and read the Leases in `mcs-hub-leases`. Nothing else: no other kind, no
//! other namespace. It holds no credentials for any other member cluster.
//! `deploy/rbac/hub*.yaml` has the roles.
//!
//! # When to pick it
//!
//! `mesh` (every agent reads every member's API server) is simplest for a handful of
//! clusters. `hub` keeps connections at O(N) instead of O(N²), keeps each agent's memory
//! proportional to what is exported, and keeps credentials to one's own cluster and the
//! hub; pick it beyond about five clusters, or whenever members should not hold read
//! credentials for each other. `docs/scale.md` has the figures.

pub mod publish;
pub mod record;

use kube::CustomResourceExt;

/// The MemberExport CRD as YAML, as shipped in `deploy/hub/memberexports.yaml` (install it
/// on the hub only).
pub fn crd_yaml() -> String {
    // A CRD is plain data (string-keyed maps, strings, numbers, booleans), which always
    // serializes to YAML.
    serde_saphyr::to_string(&record::MemberExport::crd()).expect("a CRD always serializes to YAML")
}

/// The API group of the hub records.
pub const HUB_GROUP: &str = "hub.mcs.dev";
/// Marks a hub namespace as a member's: the value is the member's cluster id.
pub const LABEL_MEMBER: &str = "hub.mcs.dev/member";
/// The member that wrote a record.
pub const LABEL_CLUSTER: &str = "hub.mcs.dev/cluster";
/// The namespace of the service a record is about.
pub const LABEL_SERVICE_NAMESPACE: &str = "hub.mcs.dev/service-namespace";
/// The namespace of every member's Lease on the hub, each named after its member's cluster
/// id ([`lease_name`]).
pub const LEASE_NAMESPACE: &str = "mcs-hub-leases";
/// The name of the Lease in each member's own namespace that agents of earlier versions
/// watch (one watch per member); agents still renew it beside the one in
/// [`LEASE_NAMESPACE`], for members not upgraded yet.
pub const LEASE_NAME: &str = "member";

/// The Lease renewals per second that all members of a ClusterSet write to the hub together
/// at most once the set is large (see [`lease_duration_for`]). Every renewal goes to every
/// member's Lease watch, so the hub sends N times this many events a second to N members.
pub const SET_RENEWALS_PER_SECOND: u32 = 10;

/// The Lease duration of a member of a set of `members` members (itself included): the
/// configured `floor`, or longer once renewing every third of `floor` would make the
/// members write more than [`SET_RENEWALS_PER_SECOND`] renewals a second together (3 s per
/// 10 members: from 134 members with the default 40 s, 300 s at 1,000). Each Lease states
/// its own duration, so members need not agree on it.
pub fn lease_duration_for(members: usize, floor: std::time::Duration) -> std::time::Duration {
    let at_size = members
        .saturating_mul(3)
        .div_ceil(SET_RENEWALS_PER_SECOND as usize);
    floor.max(std::time::Duration::from_secs(at_size as u64))
}

/// The name of a member's Lease in [`LEASE_NAMESPACE`]: its cluster id (a DNS label, so
/// always a valid name).
pub fn lease_name(cluster: &mcs_core::ClusterId) -> String {
    cluster.as_str().to_owned()
}

/// The hub namespace of a member: `mcs-member-<cluster id>`, or, when that exceeds the 63
/// characters of a namespace name, the id's first 43 characters and 8 hex digits of its
/// SHA-256 (the full id is always in the namespace's [`LABEL_MEMBER`] label).
pub fn member_namespace(cluster: &mcs_core::ClusterId) -> String {
    const PREFIX: &str = "mcs-member-";
    let id = cluster.as_str();
    if PREFIX.len() + id.len() <= 63 {
        return format!("{PREFIX}{id}");
    }
    use sha2::{Digest, Sha256};
    let digest = Sha256::digest(id.as_bytes());
    let hex: String = digest[..4].iter().map(|b| format!("{b:02x}")).collect();
    format!("{PREFIX}{}-{hex}", id[..43].trim_end_matches('-'))
}

#[cfg(test)]
mod tests {
    use mcs_core::ClusterId;

    use std::time::Duration;

    use super::{crd_yaml, lease_duration_for, member_namespace};

    #[test]
    fn the_lease_grows_with_the_set_past_ten_renewals_a_second() {
        let floor = Duration::from_secs(40);
        let at = |members| lease_duration_for(members, floor).as_secs();
        assert_eq!(at(1), 40);
        assert_eq!(at(100), 40, "100 members renew 7.5 times a second");
        assert_eq!(at(133), 40);
        assert_eq!(at(134), 41);
        assert_eq!(at(300), 90);
        assert_eq!(at(1000), 300);
        // Renewals a second of the whole set, each renewing every third of its duration.
        for members in [10, 133, 134, 300, 1000, 5000] {
            let rate = members as f64 / (at(members) as f64 / 3.0);
            assert!(rate <= 10.0, "{members}: {rate}");
        }
        assert_eq!(lease_duration_for(3, Duration::from_secs(3)).as_secs(), 3);
    }

    #[test]
    fn the_shipped_crd_is_the_generated_one() {
        let shipped = include_str!("../../../deploy/hub/memberexports.yaml");
        assert_eq!(
            shipped,
            crd_yaml(),
            "regenerate: cargo run -p mcs-cli --bin mcs-crds -- --hub > deploy/hub/memberexports.yaml"
        );
    }

    #[test]
    fn member_namespaces_are_valid_names() {
        assert_eq!(
            member_namespace(&ClusterId::new("east").unwrap()),
            "mcs-member-east"
        );
        let long = ClusterId::new("a".repeat(63)).unwrap();
        let ns = member_namespace(&long);
        assert!(ns.len() <= 63, "{ns}");
        assert!(ns.starts_with("mcs-member-aaa"));
        let other = ClusterId::new(format!("{}b", "a".repeat(62))).unwrap();
        assert_ne!(
            member_namespace(&other),
            ns,
            "ids sharing a prefix get different names"
        );
    }
}
