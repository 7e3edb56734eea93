//! The hub topology's writes: the agent's records in its own namespace on the hub, and its
//! Lease there.

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use mcs_core::ClusterId;
use mcs_core::name::ServiceRef;

use super::source::{Fact, Tx};
use super::state::records_match;
use crate::hub::record::{MemberExport, record_name};
use crate::hub::{LEASE_NAME, member_namespace};

/// What `Fact::HubWrite` calls a record write.
pub(crate) const PUBLISHING: &str = "publishing to the hub";
/// What `Fact::HubWrite` calls a Lease renewal.
pub(crate) const RENEWAL: &str = "Lease renewal on the hub";

/// Writes the agent's records into its own namespace on the hub.
pub(crate) struct Publisher {
    records: Api<MemberExport>,
    apply: PatchParams,
    namespace: String,
}

impl Publisher {
    pub(crate) fn new(hub: kube::Client, local: &ClusterId, field_manager: &str) -> Self {
        let namespace = member_namespace(local);
        Self {
            records: Api::namespaced(hub, &namespace),
            apply: PatchParams::apply(field_manager).force(),
            namespace,
        }
    }

    /// Makes the record of `service` on the hub what `want` says (`None`: deletes it),
    /// unless `have` (the record as last seen) already does.
    pub(crate) async fn publish(
        &self,
        service: &ServiceRef,
        want: Option<MemberExport>,
        have: Option<&MemberExport>,
    ) -> Result<(), String> {
        match (want, have) {
            (Some(want), Some(have)) if records_match(have, &want) => Ok(()),
            (Some(want), _) => {
                let name = record_name(service);
                self.records
                    .patch(&name, &self.apply, &Patch::Apply(&want))
                    .await
                    .map(|_| tracing::debug!(service = %service, "record published on the hub"))
                    .map_err(|e| self.describe("publish", &name, &e))
            }
            (None, Some(_)) => {
                let name = record_name(service);
                match self.records.delete(&name, &DeleteParams::default()).await {
                    Ok(_) => {
                        tracing::debug!(service = %service, "record withdrawn from the hub");
                        Ok(())
                    }
                    Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                    Err(e) => Err(self.describe("withdraw", &name, &e)),
                }
            }
            (None, None) => Ok(()),
        }
    }

    fn describe(&self, action: &str, name: &str, e: &kube::Error) -> String {
        describe_hub_error(
            action,
            &format!("MemberExport {}/{name}", self.namespace),
            e,
        )
    }
}

/// Renews the agent's Lease on the hub every third of `duration`, and reports each result.
pub(crate) fn spawn_lease(
    tasks: &mut tokio::task::JoinSet<()>,
    tx: &Tx,
    hub: &kube::Client,
    local: &ClusterId,
    duration: Duration,
    field_manager: &str,
) {
    let namespace = member_namespace(local);
    let leases: Api<Lease> = Api::namespaced(hub.clone(), &namespace);
    let apply = PatchParams::apply(field_manager).force();
    let (tx, local) = (tx.clone(), local.clone());
    let seconds = i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX);
    tasks.spawn(async move {
        let mut tick = tokio::time::interval((duration / 3).max(Duration::from_millis(100)));
        tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
        loop {
            tick.tick().await;
            let lease = Lease {
                metadata: ObjectMeta {
                    name: Some(LEASE_NAME.to_owned()),
                    namespace: Some(namespace.clone()),
                    ..Default::default()
                },
                spec: Some(LeaseSpec {
                    holder_identity: Some(local.to_string()),
                    lease_duration_seconds: Some(seconds),
                    renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
                    ..Default::default()
                }),
            };
            let result = leases
                .patch(LEASE_NAME, &apply, &Patch::Apply(&lease))
                .await
                .map(|_| ())
                .map_err(|e| {
                    describe_hub_error("renew", &format!("Lease {namespace}/{LEASE_NAME}"), &e)
                });
            if tx.send(Fact::HubWrite(RENEWAL, result)).await.is_err() {
                return;
            }
        }
    });
}

/// A failed hub write in one line, with the fix when the cause is known.
fn describe_hub_error(action: &str, object: &str, e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) if s.code == 404 && s.reason == "NotFound" => format!(
            "cannot {action} {object}: {} (is this member's namespace on the hub created? deploy/rbac/hub-member.yaml)",
            s.message
        ),
        kube::Error::Api(s) if s.code == 403 => format!(
            "cannot {action} {object}: {} (the agent's hub identity lacks a permission of deploy/rbac/hub-member.yaml)",
            s.message
        ),
        kube::Error::Api(s) => format!("cannot {action} {object}: {} (HTTP {})", s.message, s.code),
        other => format!("cannot {action} {object}: {other}"),
    }
}
