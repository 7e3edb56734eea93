//! Executes a [`Plan`] against the agent's own cluster: server-side apply with one field
//! manager, status through the status subresource, deletes that tolerate "already gone".

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::{Api, DeleteParams, Patch, PatchParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};
use mcs_core::api::{v1beta1::ServiceExport, v1beta1::ServiceImport};
use mcs_core::name::ServiceRef;
use serde_json::json;

use super::desired;
use super::reconcile::{self, Plan};

/// A failed write.
#[derive(Debug, thiserror::Error)]
#[error("{action} {object}: {}", describe(.source))]
pub struct WriteError {
    action: &'static str,
    object: String,
    #[source]
    source: kube::Error,
}

impl WriteError {
    /// Whether the API server refused the write for lack of permission (HTTP 403): a
    /// missing RBAC rule, which retrying does not fix. A namespace being terminated is not
    /// that ([`WriteError::is_namespace_terminating`]).
    pub fn is_forbidden(&self) -> bool {
        forbidden(&self.source)
    }

    /// Whether the API server refused to create the object because its namespace is being
    /// terminated (HTTP 403 with the cause `NamespaceTerminating`): an expected state, not
    /// a missing permission.
    pub fn is_namespace_terminating(&self) -> bool {
        namespace_terminating(&self.source)
    }
}

pub(super) struct Writer {
    client: kube::Client,
    apply: PatchParams,
    recorder: Recorder,
}

impl Writer {
    pub(super) fn new(client: kube::Client, field_manager: String) -> Self {
        let reporter = Reporter {
            controller: field_manager.clone(),
            instance: None,
        };
        Self {
            recorder: Recorder::new(client.clone(), reporter),
            client,
            apply: PatchParams::apply(&field_manager).force(),
        }
    }

    pub(super) async fn execute(&self, service: &ServiceRef, plan: Plan) -> Result<(), WriteError> {
        let ns = service.namespace.as_str();
        let name = service.name.as_str();
        let err = |action: &'static str, object: String| {
            move |source| WriteError {
                action,
                object,
                source,
            }
        };
        if plan.foreign_import {
            tracing::warn!(service = %service, "a ServiceImport exists that mcs-agent did not create; leaving it alone");
            let reference = ObjectReference {
                api_version: Some("multicluster.x-k8s.io/v1beta1".into()),
                kind: Some("ServiceImport".into()),
                name: Some(name.to_owned()),
                namespace: Some(ns.to_owned()),
                ..Default::default()
            };
            let event = Event {
                type_: EventType::Warning,
                reason: "ForeignServiceImport".into(),
                note: Some(format!(
                    "{ns}/{name} is exported in the ClusterSet, but this ServiceImport was not created by mcs-agent; it is left alone"
                )),
                action: "Reconcile".into(),
                secondary: None,
            };
            match self.recorder.publish(&event, &reference).await {
                Ok(()) => {}
                Err(e) if namespace_terminating(&e) => {
                    tracing::debug!(service = %service, "namespace is being terminated; no event");
                }
                // Events are optional, but a missing permission should be seen.
                Err(e) if forbidden(&e) => {
                    tracing::warn!(service = %service, error = %e, "not allowed to record events");
                }
                Err(e) => tracing::debug!(service = %service, error = %e, "cannot record event"),
            }
        }

        let imports: Api<ServiceImport> = Api::namespaced(self.client.clone(), ns);
        let services: Api<Service> = Api::namespaced(self.client.clone(), ns);
        let slices: Api<EndpointSlice> = Api::namespaced(self.client.clone(), ns);

        if let Some(conditions) = &plan.export_conditions {
            let exports: Api<ServiceExport> = Api::namespaced(self.client.clone(), ns);
            let patch = json!({ "status": { "conditions": conditions } });
            match exports
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(e) if not_found(&e) => {} // The export went away meanwhile.
                Err(e) => {
                    return Err(err(
                        "update status of ServiceExport",
                        format!("{ns}/{name}"),
                    )(e));
                }
            }
        }

        let mut import_uid = None;
        let mut applied_import = None;
        // The import's generation after this plan's writes to its spec, if it made any.
        let mut generation = None;
        if let Some(import) = &plan.import {
            let applied = imports
                .patch(name, &self.apply, &Patch::Apply(import))
                .await
                .map_err(err("apply ServiceImport", format!("{ns}/{name}")))?;
            import_uid = applied.metadata.uid.clone();
            generation = applied.metadata.generation;
            applied_import = Some(applied);
        }
        if let Some(ports) = &plan.derived_ports {
            let uid = match import_uid.clone() {
                Some(uid) => Some(uid),
                None => imports
                    .get_opt(name)
                    .await
                    .map_err(err("read ServiceImport", format!("{ns}/{name}")))?
                    .and_then(|i| i.metadata.uid),
            };
            let derived = desired::derived_service(ns, name, uid.as_deref(), ports);
            let derived_name = derived.metadata.name.clone().unwrap_or_default();
            let applied = services
                .patch(&derived_name, &self.apply, &Patch::Apply(&derived))
                .await
                .map_err(err("apply derived Service", format!("{ns}/{derived_name}")))?;
            // Copy the allocated IPs into the import when they are new to it.
            let (ips, families) = reconcile::derived_ips(&applied);
            if !ips.is_empty() && ips.len() == families.len() {
                let mut want = match applied_import.or(plan.import.clone()) {
                    Some(i) => i,
                    None => match imports
                        .get_opt(name)
                        .await
                        .map_err(err("read ServiceImport", format!("{ns}/{name}")))?
                    {
                        Some(i) => i,
                        None => return Ok(()),
                    },
                };
                if want.spec.ips.as_ref() != Some(&ips)
                    || want.spec.ip_families.as_ref() != Some(&families)
                {
                    want.spec.ips = Some(ips);
                    want.spec.ip_families = Some(families);
                    let clean = ServiceImport {
                        metadata: kube::api::ObjectMeta {
                            name: want.metadata.name.clone(),
                            namespace: want.metadata.namespace.clone(),
                            labels: want.metadata.labels.clone(),
                            annotations: want.metadata.annotations.clone(),
                            ..Default::default()
                        },
                        spec: want.spec,
                        status: None,
                    };
                    let applied = imports
                        .patch(name, &self.apply, &Patch::Apply(&clean))
                        .await
                        .map_err(err("apply ServiceImport IPs", format!("{ns}/{name}")))?;
                    generation = applied.metadata.generation;
                }
            }
        }
        for slice in &plan.apply_slices {
            let slice_name = slice.metadata.name.clone().unwrap_or_default();
            slices
                .patch(&slice_name, &self.apply, &Patch::Apply(slice))
                .await
                .map_err(err("apply EndpointSlice", format!("{ns}/{slice_name}")))?;
        }
        for slice_name in &plan.delete_slices {
            delete(&slices, slice_name)
                .await
                .map_err(err("delete EndpointSlice", format!("{ns}/{slice_name}")))?;
        }
        for derived_name in &plan.delete_derived {
            delete(&services, derived_name).await.map_err(err(
                "delete derived Service",
                format!("{ns}/{derived_name}"),
            ))?;
        }
        if plan.delete_import {
            delete(&imports, name)
                .await
                .map_err(err("delete ServiceImport", format!("{ns}/{name}")))?;
        }
        if let Some(status) = &plan.import_status {
            let mut patch = json!({ "status": status });
            if plan.observe_generation
                && let Some(generation) = generation.or(status.observed_generation)
            {
                patch["status"]["observedGeneration"] = json!(generation);
            }
            if plan.clear_selection_status {
                patch["status"]["clusterSelectorResults"] = serde_json::Value::Null;
                patch["status"]["observedGeneration"] = serde_json::Value::Null;
            }
            match imports
                .patch_status(name, &PatchParams::default(), &Patch::Merge(&patch))
                .await
            {
                Ok(_) => {}
                Err(e) if not_found(&e) => {}
                Err(e) => {
                    return Err(err(
                        "update status of ServiceImport",
                        format!("{ns}/{name}"),
                    )(e));
                }
            }
        }
        Ok(())
    }
}

async fn delete<K>(api: &Api<K>, name: &str) -> Result<(), kube::Error>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + std::fmt::Debug,
{
    match api.delete(name, &DeleteParams::background()).await {
        Ok(_) => Ok(()),
        Err(e) if not_found(&e) => Ok(()),
        Err(e) => Err(e),
    }
}

/// An API error as the server's message and code (its `Display` also dumps the status).
fn describe(e: &kube::Error) -> String {
    match e {
        kube::Error::Api(status) => format!("{} (HTTP {})", status.message, status.code),
        other => other.to_string(),
    }
}

/// Whether the API server refused a request for lack of permission (HTTP 403), not
/// because the namespace is being terminated.
pub(super) fn forbidden(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.is_forbidden()) && !namespace_terminating(e)
}

/// The cause the API server gives when it refuses to create an object in a namespace that is
/// being terminated (`NamespaceTerminatingCause` of `k8s.io/api/core/v1`).
const NAMESPACE_TERMINATING: &str = "NamespaceTerminating";

/// Whether the API server refused a request because the namespace is being terminated:
/// HTTP 403 ("unable to create new content in namespace ... because it is being
/// terminated") with the cause `NamespaceTerminating`.
fn namespace_terminating(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status)
        if status.is_forbidden()
            && status
                .details
                .as_ref()
                .is_some_and(|d| d.causes.iter().any(|c| c.reason == NAMESPACE_TERMINATING)))
}

fn not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(status) if status.code == 404)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A 403 as the API server's NamespaceLifecycle admission answers it (the body as the
    /// API server sends it; agent_convergence.rs checks the real one has this cause).
    fn refused(body: serde_json::Value) -> kube::Error {
        kube::Error::Api(serde_json::from_value(body).expect("a Status"))
    }

    #[test]
    fn a_terminating_namespace_is_not_a_missing_permission() {
        let terminating = refused(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "serviceimports.multicluster.x-k8s.io \"a\" is forbidden: unable to create new content in namespace ns because it is being terminated",
            "reason": "Forbidden",
            "details": {
                "name": "a", "group": "multicluster.x-k8s.io", "kind": "serviceimports",
                "causes": [{
                    "reason": "NamespaceTerminating",
                    "message": "namespace ns is being terminated",
                    "field": "metadata.namespace"
                }]
            },
            "code": 403
        }));
        assert!(namespace_terminating(&terminating));
        assert!(!forbidden(&terminating));
        let rbac = refused(json!({
            "kind": "Status", "apiVersion": "v1", "metadata": {}, "status": "Failure",
            "message": "serviceimports.multicluster.x-k8s.io \"a\" is forbidden: User \"u\" cannot patch resource \"serviceimports\" in API group \"multicluster.x-k8s.io\" in the namespace \"ns\"",
            "reason": "Forbidden",
            "details": { "name": "a", "group": "multicluster.x-k8s.io", "kind": "serviceimports" },
            "code": 403
        }));
        assert!(forbidden(&rbac));
        assert!(!namespace_terminating(&rbac));
    }
}
