//! A member's writes to the hub: its records in its own namespace and its Lease in
//! [`LEASE_NAMESPACE`] (and, for agents of earlier versions, in its own namespace).
//!
//! The agent publishes through [`Publisher`]; so can anything else that speaks for a member
//! with that member's hub identity (the scale bench's simulated members do).

use std::time::Duration;

use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use mcs_core::ClusterId;
use mcs_core::name::ServiceRef;

use super::record::{MemberExport, record_name};
use super::{LABEL_MEMBER, LEASE_NAME, LEASE_NAMESPACE, lease_name, member_namespace};

/// A write to the hub that failed.
#[derive(Debug, thiserror::Error)]
#[error("cannot {action} {object}: {}{}", describe(.source), hint(.source))]
#[non_exhaustive]
pub struct PublishError {
    /// What was attempted: `publish`, `withdraw` or `renew`.
    pub action: &'static str,
    /// The object, as `Kind namespace/name`.
    pub object: String,
    /// What the API server (or the connection) said.
    #[source]
    pub source: kube::Error,
}

fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(s) => format!("{} (HTTP {})", s.message, s.code),
        other => other.to_string(),
    }
}

/// The fix, when the cause is known.
fn hint(e: &kube::Error) -> &'static str {
    match e {
        kube::Error::Api(s) if s.code == 404 && s.reason == "NotFound" => {
            " (is this member's namespace on the hub created? deploy/rbac/hub-member.yaml)"
        }
        kube::Error::Api(s) if s.code == 403 => {
            " (the member's hub identity lacks a permission of deploy/rbac/hub-member.yaml, or its Lease in mcs-hub-leases, which that file creates, is missing)"
        }
        _ => "",
    }
}

/// Writes one member's records into its namespace on the hub, and renews its Lease.
#[derive(Clone)]
pub struct Publisher {
    records: Api<MemberExport>,
    leases: Api<Lease>,
    legacy_leases: Api<Lease>,
    apply: PatchParams,
    namespace: String,
    cluster: ClusterId,
}

impl std::fmt::Debug for Publisher {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Publisher")
            .field("cluster", &self.cluster)
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

impl Publisher {
    /// Publishes for member `cluster` with `hub`, a client carrying that member's hub
    /// identity, applying as `field_manager`.
    pub fn new(hub: kube::Client, cluster: &ClusterId, field_manager: &str) -> Self {
        let namespace = member_namespace(cluster);
        Self {
            records: Api::namespaced(hub.clone(), &namespace),
            leases: Api::namespaced(hub.clone(), LEASE_NAMESPACE),
            legacy_leases: Api::namespaced(hub, &namespace),
            apply: PatchParams::apply(field_manager).force(),
            namespace,
            cluster: cluster.clone(),
        }
    }

    /// The member's namespace on the hub.
    pub fn namespace(&self) -> &str {
        &self.namespace
    }

    /// Makes the record of `service` on the hub what `want` says (`None`: deletes it),
    /// unless `have` (the record as last seen) already does.
    pub async fn publish(
        &self,
        service: &ServiceRef,
        want: Option<MemberExport>,
        have: Option<&MemberExport>,
    ) -> Result<(), PublishError> {
        let name = record_name(service);
        match (want, have) {
            (Some(want), Some(have)) if have.says_the_same_as(&want) => Ok(()),
            (Some(want), _) => self
                .records
                .patch(&name, &self.apply, &Patch::Apply(&want))
                .await
                .map(|_| tracing::debug!(service = %service, "record published on the hub"))
                .map_err(|source| self.error("publish", &name, source)),
            (None, Some(_)) => match self.records.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {
                    tracing::debug!(service = %service, "record withdrawn from the hub");
                    Ok(())
                }
                Err(kube::Error::Api(s)) if s.code == 404 => Ok(()),
                Err(source) => Err(self.error("withdraw", &name, source)),
            },
            (None, None) => Ok(()),
        }
    }

    /// Renews the member's Lease in [`LEASE_NAMESPACE`], valid for `duration` from now,
    /// then the one in its own namespace that agents of earlier versions watch. Only the
    /// first one's failure is an error: the second is logged.
    pub async fn renew_lease(&self, duration: Duration) -> Result<(), PublishError> {
        let seconds = i32::try_from(duration.as_secs().max(1)).unwrap_or(i32::MAX);
        let spec = LeaseSpec {
            holder_identity: Some(self.cluster.to_string()),
            lease_duration_seconds: Some(seconds),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..Default::default()
        };
        let name = lease_name(&self.cluster);
        let lease = Lease {
            metadata: ObjectMeta {
                name: Some(name.clone()),
                namespace: Some(LEASE_NAMESPACE.to_owned()),
                labels: Some([(LABEL_MEMBER.to_owned(), self.cluster.to_string())].into()),
                ..Default::default()
            },
            spec: Some(spec.clone()),
        };
        self.leases
            .patch(&name, &self.apply, &Patch::Apply(&lease))
            .await
            .map_err(|source| PublishError {
                action: "renew",
                object: format!("Lease {LEASE_NAMESPACE}/{name}"),
                source,
            })?;
        let legacy = Lease {
            metadata: ObjectMeta {
                name: Some(LEASE_NAME.to_owned()),
                namespace: Some(self.namespace.clone()),
                ..Default::default()
            },
            spec: Some(spec),
        };
        if let Err(e) = self
            .legacy_leases
            .patch(LEASE_NAME, &self.apply, &Patch::Apply(&legacy))
            .await
        {
            tracing::debug!(
                namespace = self.namespace,
                error = %describe(&e),
                "cannot renew the Lease agents of earlier versions watch"
            );
        }
        Ok(())
    }

    fn error(&self, action: &'static str, name: &str, source: kube::Error) -> PublishError {
        PublishError {
            action,
            object: format!("MemberExport {}/{name}", self.namespace),
            source,
        }
    }
}
