//! The hub topology's sources: which members there are (their namespaces on the hub), the
//! other members' records (one watch across their namespaces) and Leases (one watch of
//! their namespace), and the agent's own records.

use std::collections::BTreeSet;

use futures::StreamExt;
use k8s_openapi::api::coordination::v1::Lease;
use k8s_openapi::api::core::v1::Namespace;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use mcs_core::ClusterId;

use super::{Fact, KIND_LEASE, KIND_MEMBERS, KIND_OWN_RECORD, KIND_RECORD, Origin, Tx, forward};
use crate::agent::index::Relist;
use crate::hub::record::MemberExport;
use crate::hub::{LABEL_CLUSTER, LABEL_MEMBER, LEASE_NAMESPACE, member_namespace};

mod per_member;

use per_member::PerMember;

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

/// Watches the hub: member namespaces; every other member's records, in one watch across
/// the member namespaces; their Leases, in one watch of [`LEASE_NAMESPACE`]; the agent's
/// own records. Four watches, however many members there are. Returns the number of
/// members known (this one included), kept up to date.
pub(crate) fn spawn(
    tasks: &mut tokio::task::JoinSet<()>,
    tx: &Tx,
    local: &ClusterId,
    hub: &kube::Client,
) -> tokio::sync::watch::Receiver<usize> {
    let (count_tx, count) = tokio::sync::watch::channel(1);
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
        // Every member's records but this agent's own (which it watches apart): the label is
        // the writer's word, so it only saves the hub sending them; `PerMember` assigns each
        // record to the member whose namespace holds it.
        let records = super::lean_watcher(
            Api::<MemberExport>::all(hub.clone()),
            watcher::Config::default().labels(&format!("{LABEL_CLUSTER}!={local}")),
        )
        .backoff(hub_backoff());
        // Every member's Lease, each named after its member.
        let leases = super::lean_watcher(
            Api::<Lease>::namespaced(hub.clone(), LEASE_NAMESPACE),
            watcher::Config::default(),
        )
        .backoff(hub_backoff());
        let mut namespaces = std::pin::pin!(namespaces);
        let mut records = std::pin::pin!(records);
        let mut leases = std::pin::pin!(leases);
        let mut records_of: PerMember<MemberExport> = PerMember::by_namespace(&local);
        let mut lease_of: PerMember<Lease> = PerMember::by_name(&local);
        let mut known: BTreeSet<ClusterId> = BTreeSet::new();
        let mut listing: Relist<ClusterId> = Relist::default();
        loop {
            let facts = tokio::select! {
                Some(event) = namespaces.next() => {
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
                                stop.extend(known.iter().filter(|m| !listed.contains(m)).cloned());
                                start.extend(listed);
                            }
                        }
                    }
                    // Members first learn of each other's namespaces, then of their records.
                    let mut facts = vec![Fact::Members(event)];
                    for member in stop {
                        records_of.remove(&member);
                        lease_of.remove(&member);
                        known.remove(&member);
                    }
                    for member in start {
                        if member == local || !known.insert(member.clone()) {
                            continue;
                        }
                        facts.extend(
                            records_of
                                .add(&member)
                                .into_iter()
                                .map(|(id, e)| Fact::Record(id, e)),
                        );
                        facts.extend(
                            lease_of
                                .add(&member)
                                .into_iter()
                                .map(|(id, e)| Fact::Lease(id, e)),
                        );
                    }
                    let members = known.len() + 1;
                    count_tx.send_if_modified(|n| std::mem::replace(n, members) != members);
                    facts
                }
                Some(event) = leases.next() => match event {
                    Ok(event) => lease_of
                        .event(event)
                        .into_iter()
                        .map(|(id, e)| Fact::Lease(id, e))
                        .collect(),
                    Err(e) => {
                        let (error, forbidden) = super::describe_watch_error(&e);
                        vec![Fact::WatchError(Origin::Hub, KIND_LEASE, error, forbidden)]
                    }
                },
                Some(event) = records.next() => match event {
                    Ok(event) => records_of
                        .event(event)
                        .into_iter()
                        .map(|(id, e)| Fact::Record(id, e))
                        .collect(),
                    Err(e) => {
                        let (error, forbidden) = super::describe_watch_error(&e);
                        vec![Fact::WatchError(Origin::Hub, KIND_RECORD, error, forbidden)]
                    }
                },
                else => return,
            };
            for fact in facts {
                if tx.send(fact).await.is_err() {
                    return;
                }
            }
        }
    });
    count
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
