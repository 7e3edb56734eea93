//! The hub topology's sources: which members there are (their namespaces on the hub), each
//! other member's records and Lease, and the agent's own records.

use std::collections::BTreeMap;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use mcs_core::ClusterId;
use tokio::task::AbortHandle;

use super::{
    Fact, KIND_LEASE, KIND_MEMBERS, KIND_OWN_RECORD, KIND_RECORD, Origin, Tx, forward, forward_with,
};

/// Retries of the hub's watches: from 0.8 s, doubling, at most 10 s, with jitter (the
/// default's 30 s cap would keep members on stale data for half a minute after a hub
/// outage; the jitter spreads the members' re-lists).
fn hub_backoff() -> watcher::ExponentialBackoff {
    backon::ExponentialBuilder::default()
        .with_min_delay(std::time::Duration::from_millis(800))
        .with_max_delay(std::time::Duration::from_secs(10))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .into()
}
use crate::agent::index::Relist;
use crate::hub::record::MemberExport;
use crate::hub::{LABEL_MEMBER, LEASE_NAME, member_namespace};

/// Watches the hub: member namespaces, and for each other member its records and Lease
/// (started and stopped as members come and go); the agent's own records.
pub(crate) fn spawn(
    tasks: &mut tokio::task::JoinSet<()>,
    tx: &Tx,
    local: &ClusterId,
    hub: &kube::Client,
) {
    let own = member_namespace(local);
    let tx_own = tx.clone();
    let own_records = Api::<MemberExport>::namespaced(hub.clone(), &own);
    tasks.spawn(async move {
        let stream =
            super::lean_watcher(own_records, watcher::Config::default()).backoff(hub_backoff());
        forward(
            stream,
            tx_own,
            Origin::Hub,
            KIND_OWN_RECORD,
            Fact::OwnRecord,
        )
        .await;
    });

    let (tx, local, hub) = (tx.clone(), local.clone(), hub.clone());
    tasks.spawn(async move {
        let namespaces = super::lean_watcher(
            Api::<Namespace>::all(hub.clone()),
            watcher::Config::default().labels(LABEL_MEMBER),
        )
        .backoff(hub_backoff());
        let mut namespaces = std::pin::pin!(namespaces);
        let mut watched: BTreeMap<ClusterId, [AbortHandle; 2]> = BTreeMap::new();
        let mut listing: Relist<ClusterId> = Relist::default();
        let mut children = tokio::task::JoinSet::new();
        while let Some(event) = namespaces.next().await {
            let event = match event {
                Ok(event) => event,
                Err(e) => {
                    let (error, forbidden) = super::describe_watch_error(&e);
                    let fact = Fact::WatchError(Origin::Hub, KIND_MEMBERS, error, forbidden);
                    if tx.send(fact).await.is_err() {
                        return;
                    }
                    continue;
                }
            };
            let mut start = Vec::new();
            let mut stop = Vec::new();
            match &event {
                Event::Apply(ns) => start.extend(member_of(ns)),
                Event::Delete(ns) => stop.extend(member_of(ns)),
                Event::Init | Event::InitApply(_) | Event::InitDone => {
                    if let Some(listed) = listing.note(&event, member_of) {
                        stop.extend(watched.keys().filter(|m| !listed.contains(m)).cloned());
                        start.extend(listed);
                    }
                }
            }
            // Members first learn of each other's namespaces, then of their records.
            if tx.send(Fact::Members(event)).await.is_err() {
                return;
            }
            for member in stop {
                if let Some(handles) = watched.remove(&member) {
                    handles.iter().for_each(AbortHandle::abort);
                }
            }
            for member in start {
                if member == local || watched.contains_key(&member) {
                    continue;
                }
                let handles = watch_member(&mut children, &tx, &hub, &member);
                watched.insert(member, handles);
            }
        }
    });
}

/// The member a hub namespace belongs to, from its label.
pub(crate) fn member_of(ns: &Namespace) -> Option<ClusterId> {
    let id = ns.metadata.labels.as_ref()?.get(LABEL_MEMBER)?;
    match ClusterId::new(id.as_str()) {
        Ok(id) => Some(id),
        Err(e) => {
            tracing::warn!(namespace = ns.metadata.name.as_deref().unwrap_or(""), error = %e, "hub namespace labelled with an invalid cluster id; ignored");
            None
        }
    }
}

/// Starts the watches of one member's records and Lease.
fn watch_member(
    children: &mut tokio::task::JoinSet<()>,
    tx: &Tx,
    hub: &kube::Client,
    member: &ClusterId,
) -> [AbortHandle; 2] {
    let ns = member_namespace(member);
    let records = Api::<MemberExport>::namespaced(hub.clone(), &ns);
    let leases = Api::<Lease>::namespaced(hub.clone(), &ns);
    let (tx1, tx2) = (tx.clone(), tx.clone());
    let (m1, m2) = (member.clone(), member.clone());
    let a = children.spawn(async move {
        let stream =
            super::lean_watcher(records, watcher::Config::default()).backoff(hub_backoff());
        let errors = member_errors(m1.clone());
        forward_with(stream, tx1, errors, KIND_RECORD, move |e| {
            Fact::Record(m1.clone(), e)
        })
        .await;
    });
    let b = children.spawn(async move {
        let config = watcher::Config::default().fields(&format!("metadata.name={LEASE_NAME}"));
        let stream = super::lean_watcher(leases, config).backoff(hub_backoff());
        let errors = member_errors(m2.clone());
        forward_with(stream, tx2, errors, KIND_LEASE, move |e| {
            Fact::Lease(m2.clone(), e)
        })
        .await;
    });
    [a, b]
}

/// Where an error of a watch of `member`'s namespace on the hub belongs. A refusal (403) is
/// that member's problem, not the hub's: its namespace exists but the member's reader
/// RoleBinding does not (yet: `deploy/rbac/hub-member.yaml` creates the namespace first),
/// so it counts as a failing member. Other errors mean the hub is not answering.
fn member_errors(member: ClusterId) -> impl Fn(bool) -> Origin {
    move |forbidden| {
        if forbidden {
            Origin::Member(member.clone())
        } else {
            Origin::Hub
        }
    }
}
