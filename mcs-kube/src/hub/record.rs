//! `MemberExport` (`hub.mcs.dev/v1alpha1`): what one member exports of one service, as
//! the hub holds it. Conversions from the member's own objects and back are pure.

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::{Service, ServicePort as CoreServicePort, ServiceSpec};
use k8s_openapi::api::discovery::v1::{Endpoint, EndpointPort, EndpointSlice};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, Time};
use kube::CustomResource;
use mcs_core::ClusterId;
use mcs_core::api::{
    ClusterSelector, LABEL_SERVICE_NAME, ServiceExportSpec, v1beta1::ServiceExport,
};
use mcs_core::name::ServiceRef;
use mcs_core::slices::{endpoints_field, endpoints_of};
use schemars::JsonSchema;
use serde::{Deserialize, Serialize};

use super::{LABEL_CLUSTER, LABEL_SERVICE_NAMESPACE};
use crate::labels::LABEL_K8S_SERVICE_NAME;

/// What one member exports of one service: the export's creation time and exported
/// labels and annotations, the fields of the member's Service that take part in the merge,
/// and the Service's EndpointSlices. One per exported service, in the member's namespace
/// on the hub, named `<namespace>.<name>`; written only by that member's agent.
#[derive(CustomResource, Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[kube(
    group = "hub.mcs.dev",
    version = "v1alpha1",
    kind = "MemberExport",
    plural = "memberexports",
    singular = "memberexport",
    namespaced,
    derive = "PartialEq",
    printcolumn = r#"{"name":"Cluster","type":"string","jsonPath":".spec.cluster"}"#,
    printcolumn = r#"{"name":"Service","type":"string","jsonPath":".spec.name"}"#,
    printcolumn = r#"{"name":"Age","type":"date","jsonPath":".metadata.creationTimestamp"}"#
)]
#[serde(rename_all = "camelCase")]
pub struct MemberExportSpec {
    /// The member's cluster id.
    pub cluster: String,
    /// The exported service's namespace.
    pub namespace: String,
    /// The exported service's name.
    pub name: String,
    /// The ServiceExport's `metadata.creationTimestamp`: the oldest export wins conflicts.
    pub export_created: Time,
    /// `ServiceExport.spec.exportedLabels`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exported_labels: Option<BTreeMap<String, String>>,
    /// `ServiceExport.spec.exportedAnnotations`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub exported_annotations: Option<BTreeMap<String, String>>,
    /// `ServiceExport.spec.clusterSelectors` (KEP-5939, unstable), which the merge
    /// resolves like the other exported fields.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cluster_selectors: Option<Vec<ClusterSelector>>,
    /// The Service's spec, reduced to what the merge reads (type, `clusterIP: None`, ports
    /// by name, protocol, number and appProtocol, session affinity and its config, IP
    /// families, internal traffic policy, traffic distribution). Absent when the member
    /// has no Service of that name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub service: Option<ServiceSpec>,
    /// The Service's endpoints, per address type and port set, as its EndpointSlices in
    /// the member have them (addresses, conditions, hostname, zone).
    #[serde(default)]
    pub slices: Vec<RecordedSlice>,
}

/// One EndpointSlice of the exported Service, reduced to what an import needs.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize, JsonSchema)]
#[serde(rename_all = "camelCase")]
pub struct RecordedSlice {
    /// The slice's name in the member.
    pub name: String,
    /// `IPv4` or `IPv6`.
    pub address_type: String,
    /// The slice's ports.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ports: Option<Vec<EndpointPort>>,
    /// The slice's endpoints (addresses, conditions, hostname, zone).
    #[serde(default)]
    pub endpoints: Vec<Endpoint>,
}

/// The record's name on the hub: `<namespace>.<name>` (both DNS labels, so a valid
/// subdomain of at most 127 characters).
pub fn record_name(service: &ServiceRef) -> String {
    format!("{}.{}", service.namespace, service.name)
}

impl MemberExport {
    /// The record of what `cluster` exports of `export`'s service, from the export, the
    /// Service of the same name (if any) and its EndpointSlices. `None` when the export
    /// has no name, namespace or creation time (it is not a stored object).
    pub fn from_member(
        cluster: &ClusterId,
        export: &ServiceExport,
        service: Option<&Service>,
        slices: &[&EndpointSlice],
    ) -> Option<Self> {
        let namespace = export.metadata.namespace.clone()?;
        let name = export.metadata.name.clone()?;
        let created = export.metadata.creation_timestamp.clone()?;
        let service_ref = ServiceRef::new(&namespace, &name).ok()?;
        let mut slices: Vec<RecordedSlice> = slices.iter().map(|s| record_slice(s)).collect();
        slices.sort_by(|a, b| a.name.cmp(&b.name));
        let mut record = MemberExport::new(
            &record_name(&service_ref),
            MemberExportSpec {
                cluster: cluster.to_string(),
                namespace: namespace.clone(),
                name: name.clone(),
                export_created: created,
                exported_labels: export.spec.exported_labels.clone(),
                exported_annotations: export.spec.exported_annotations.clone(),
                cluster_selectors: export.spec.cluster_selectors.clone(),
                service: service.and_then(|s| s.spec.as_ref()).map(merge_fields),
                slices,
            },
        );
        record.metadata.labels = Some(BTreeMap::from([
            (LABEL_CLUSTER.to_owned(), cluster.to_string()),
            (LABEL_SERVICE_NAMESPACE.to_owned(), namespace),
            (LABEL_SERVICE_NAME.to_owned(), name),
        ]));
        Some(record)
    }

    /// Whether this record says what `other` does (spec and labels; metadata the API
    /// server maintains is ignored).
    pub fn says_the_same_as(&self, other: &MemberExport) -> bool {
        self.spec == other.spec && self.metadata.labels == other.metadata.labels
    }

    /// The service this record is about.
    pub fn service_ref(&self) -> Option<ServiceRef> {
        ServiceRef::new(&self.spec.namespace, &self.spec.name).ok()
    }

    /// The member's objects as the agent would read them in the member: its
    /// ServiceExport, its Service (if it has one) and the Service's EndpointSlices, with
    /// the fields the merge and the imports read.
    pub fn to_objects(&self) -> (ServiceExport, Option<Service>, Vec<EndpointSlice>) {
        let meta = |name: &str| ObjectMeta {
            name: Some(name.to_owned()),
            namespace: Some(self.spec.namespace.clone()),
            ..Default::default()
        };
        let mut export = ServiceExport::new(
            &self.spec.name,
            ServiceExportSpec {
                exported_labels: self.spec.exported_labels.clone(),
                exported_annotations: self.spec.exported_annotations.clone(),
                cluster_selectors: self.spec.cluster_selectors.clone(),
            },
        );
        export.metadata = ObjectMeta {
            creation_timestamp: Some(self.spec.export_created.clone()),
            ..meta(&self.spec.name)
        };
        let service = self.spec.service.as_ref().map(|spec| Service {
            metadata: meta(&self.spec.name),
            spec: Some(spec.clone()),
            status: None,
        });
        let slices = self
            .spec
            .slices
            .iter()
            .map(|s| EndpointSlice {
                metadata: ObjectMeta {
                    labels: Some(BTreeMap::from([(
                        LABEL_K8S_SERVICE_NAME.to_owned(),
                        self.spec.name.clone(),
                    )])),
                    ..meta(&s.name)
                },
                address_type: s.address_type.clone(),
                endpoints: endpoints_field(s.endpoints.clone()),
                ports: s.ports.clone(),
            })
            .collect();
        (export, service, slices)
    }
}

/// The fields of a Service spec that the merge reads.
fn merge_fields(spec: &ServiceSpec) -> ServiceSpec {
    ServiceSpec {
        type_: spec.type_.clone(),
        cluster_ip: spec.cluster_ip.clone().filter(|ip| ip == "None"),
        ports: spec.ports.as_ref().map(|ports| {
            ports
                .iter()
                .map(|p| CoreServicePort {
                    name: p.name.clone(),
                    protocol: p.protocol.clone(),
                    port: p.port,
                    app_protocol: p.app_protocol.clone(),
                    ..Default::default()
                })
                .collect()
        }),
        session_affinity: spec.session_affinity.clone(),
        session_affinity_config: spec.session_affinity_config.clone(),
        ip_families: spec.ip_families.clone(),
        internal_traffic_policy: spec.internal_traffic_policy.clone(),
        traffic_distribution: spec.traffic_distribution.clone(),
        ..Default::default()
    }
}

/// A slice reduced to what imports read.
fn record_slice(slice: &EndpointSlice) -> RecordedSlice {
    RecordedSlice {
        name: slice.metadata.name.clone().unwrap_or_default(),
        address_type: slice.address_type.clone(),
        ports: slice.ports.clone(),
        endpoints: endpoints_of(slice)
            .iter()
            .map(|e| Endpoint {
                addresses: e.addresses.clone(),
                conditions: e.conditions.clone(),
                hostname: e.hostname.clone(),
                zone: e.zone.clone(),
                ..Default::default()
            })
            .collect(),
    }
}

#[cfg(test)]
mod tests {
    use k8s_openapi::api::core::v1::{ClientIPConfig, SessionAffinityConfig};
    use k8s_openapi::api::discovery::v1::EndpointConditions;
    use k8s_openapi::apimachinery::pkg::util::intstr::IntOrString;
    use mcs_core::merge::{Constituent, ServiceFacts};

    use super::*;

    fn export() -> ServiceExport {
        let mut export = ServiceExport::new(
            "loyalty-accrual",
            ServiceExportSpec {
                exported_labels: Some(BTreeMap::from([("tier".into(), "gold".into())])),
                cluster_selectors: Some(
                    serde_json::from_str(
                        r#"[{"propertySelector": {"matchProperties": {"region.topology.k8s.io": "@SameAsImporter@"}}}]"#,
                    )
                    .expect("selectors"),
                ),
                ..ServiceExportSpec::default()
            },
        );
        export.metadata.namespace = Some("loyalty".into());
        export.metadata.uid = Some("u-1".into());
        export.metadata.creation_timestamp =
            Some(Time("2026-12-01T10:00:00Z".parse().expect("timestamp")));
        export
    }

    fn service() -> Service {
        Service {
            metadata: ObjectMeta {
                name: Some("loyalty-accrual".into()),
                namespace: Some("loyalty".into()),
                labels: Some(BTreeMap::from([("app".into(), "accrual".into())])),
                ..Default::default()
            },
            spec: Some(ServiceSpec {
                type_: Some("ClusterIP".into()),
                cluster_ip: Some("10.0.0.12".into()),
                cluster_ips: Some(vec!["10.0.0.12".into()]),
                selector: Some(BTreeMap::from([("app".into(), "accrual".into())])),
                ports: Some(vec![CoreServicePort {
                    name: Some("grpc".into()),
                    port: 9443,
                    target_port: Some(IntOrString::Int(9443)),
                    protocol: Some("TCP".into()),
                    app_protocol: Some("kubernetes.io/h2c".into()),
                    ..Default::default()
                }]),
                session_affinity: Some("ClientIP".into()),
                session_affinity_config: Some(SessionAffinityConfig {
                    client_ip: Some(ClientIPConfig {
                        timeout_seconds: Some(10),
                    }),
                }),
                ip_families: Some(vec!["IPv4".into()]),
                internal_traffic_policy: Some("Cluster".into()),
                traffic_distribution: Some("PreferClose".into()),
                ..Default::default()
            }),
            status: None,
        }
    }

    fn slice() -> EndpointSlice {
        EndpointSlice {
            metadata: ObjectMeta {
                name: Some("loyalty-accrual-abcde".into()),
                namespace: Some("loyalty".into()),
                ..Default::default()
            },
            address_type: "IPv4".into(),
            endpoints: vec![Endpoint {
                addresses: vec!["10.10.0.5".into()],
                conditions: Some(EndpointConditions {
                    ready: Some(true),
                    serving: Some(true),
                    terminating: Some(false),
                }),
                hostname: Some("accrual-0".into()),
                node_name: Some("node-a".into()),
                zone: Some("zone-a".into()),
                ..Default::default()
            }],
            ports: Some(vec![EndpointPort {
                name: Some("grpc".into()),
                port: Some(9443),
                protocol: Some("TCP".into()),
                app_protocol: None,
            }]),
        }
    }

    #[test]
    fn a_record_carries_what_the_merge_and_the_imports_read() {
        let east = ClusterId::new("east").unwrap();
        let (export, service, slice) = (export(), service(), slice());
        let record = MemberExport::from_member(&east, &export, Some(&service), &[&slice]).unwrap();
        assert_eq!(
            record.metadata.name.as_deref(),
            Some("loyalty.loyalty-accrual")
        );
        let (export2, service2, slices2) = record.to_objects();

        // The merge sees the same constituent.
        let facts = |s: &Service| ServiceFacts::try_from(s).unwrap();
        let a = Constituent::from_export(east.clone(), &export, Some(facts(&service))).unwrap();
        let b = Constituent::from_export(east, &export2, service2.as_ref().map(facts)).unwrap();
        assert_eq!(a, b);
        // Only what the merge reads is kept of the Service.
        let spec = service2.unwrap().spec.unwrap();
        assert_eq!(
            spec.cluster_ip, None,
            "an allocated IP is not a merge input"
        );
        assert_eq!(spec.selector, None);
        assert_eq!(spec.ports.unwrap()[0].target_port, None);

        // The imports see the same endpoints, tied to the same Service.
        assert_eq!(slices2.len(), 1);
        assert_eq!(slices2[0].address_type, "IPv4");
        assert_eq!(slices2[0].ports, slice.ports);
        assert_eq!(slices2[0].endpoints[0].addresses, ["10.10.0.5"]);
        assert_eq!(
            slices2[0].endpoints[0].hostname.as_deref(),
            Some("accrual-0")
        );
        assert_eq!(slices2[0].endpoints[0].zone.as_deref(), Some("zone-a"));
        assert_eq!(
            slices2[0].endpoints[0].conditions,
            slice.endpoints[0].conditions
        );
        assert_eq!(slices2[0].endpoints[0].node_name, None);
        assert_eq!(
            slices2[0].metadata.labels.as_ref().unwrap()[LABEL_K8S_SERVICE_NAME],
            "loyalty-accrual"
        );
    }

    #[test]
    fn headless_and_missing_services_survive_the_trip() {
        let east = ClusterId::new("east").unwrap();
        let mut headless = service();
        headless.spec.as_mut().unwrap().cluster_ip = Some("None".into());
        let record = MemberExport::from_member(&east, &export(), Some(&headless), &[]).unwrap();
        let (_, service, slices) = record.to_objects();
        assert_eq!(
            service.unwrap().spec.unwrap().cluster_ip.as_deref(),
            Some("None")
        );
        assert!(slices.is_empty());

        let record = MemberExport::from_member(&east, &export(), None, &[]).unwrap();
        assert!(
            record.to_objects().1.is_none(),
            "no Service: NoService in every member"
        );
    }

    #[test]
    fn records_round_trip_through_json() {
        let east = ClusterId::new("east").unwrap();
        let record =
            MemberExport::from_member(&east, &export(), Some(&service()), &[&slice()]).unwrap();
        let json = serde_json::to_value(&record).unwrap();
        assert_eq!(json["apiVersion"], "hub.mcs.dev/v1alpha1");
        assert_eq!(json["spec"]["exportCreated"], "2026-12-01T10:00:00Z");
        let back: MemberExport = serde_json::from_value(json).unwrap();
        assert_eq!(back, record);
    }
}
