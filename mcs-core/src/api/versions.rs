//! The served versions. Every version has identical schemas and shares the spec and status
//! types in [`super`]; only the root objects (which carry `apiVersion`) differ.

use std::fmt;
use std::marker::PhantomData;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use serde::de::{self, Deserializer, MapAccess, Visitor};
use serde::ser::{SerializeStruct, Serializer};
use serde::{Deserialize, Serialize};

use super::types::{ClusterPropertySpec, ServiceExportSpec, ServiceImportSpec};

/// What a root object needs from its spec type when the `spec` key is absent.
pub(crate) trait MissingSpec: Sized {
    /// The spec to use when the object has none, or `None` when `spec` is required.
    fn when_missing() -> Option<Self>;
}

impl MissingSpec for ServiceExportSpec {
    fn when_missing() -> Option<Self> {
        Some(Self::default())
    }
}

impl MissingSpec for ServiceImportSpec {
    fn when_missing() -> Option<Self> {
        None
    }
}

impl MissingSpec for ClusterPropertySpec {
    fn when_missing() -> Option<Self> {
        None
    }
}

/// Deserializes `{apiVersion, kind, metadata, spec, status}` and checks that `apiVersion`
/// and `kind`, when present, name the expected type.
pub(crate) fn deserialize_root<'de, D, Spec, Status>(
    deserializer: D,
    api_version: &'static str,
    kind: &'static str,
) -> Result<(ObjectMeta, Spec, Option<Status>), D::Error>
where
    D: Deserializer<'de>,
    Spec: Deserialize<'de> + MissingSpec,
    Status: Deserialize<'de>,
{
    struct RootVisitor<Spec, Status> {
        api_version: &'static str,
        kind: &'static str,
        marker: PhantomData<(Spec, Status)>,
    }

    impl<'de, Spec, Status> Visitor<'de> for RootVisitor<Spec, Status>
    where
        Spec: Deserialize<'de> + MissingSpec,
        Status: Deserialize<'de>,
    {
        type Value = (ObjectMeta, Spec, Option<Status>);

        fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            write!(f, "a {} {} object", self.api_version, self.kind)
        }

        fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Self::Value, A::Error> {
            let mut metadata = None;
            let mut spec = None;
            let mut status = None;
            while let Some(key) = map.next_key::<String>()? {
                match key.as_str() {
                    "apiVersion" => {
                        let v: String = map.next_value()?;
                        if v != self.api_version {
                            return Err(de::Error::custom(format_args!(
                                "apiVersion is {v:?}, expected {:?}",
                                self.api_version
                            )));
                        }
                    }
                    "kind" => {
                        let v: String = map.next_value()?;
                        if v != self.kind {
                            return Err(de::Error::custom(format_args!(
                                "kind is {v:?}, expected {:?}",
                                self.kind
                            )));
                        }
                    }
                    "metadata" => metadata = Some(map.next_value()?),
                    "spec" => spec = Some(map.next_value()?),
                    "status" => status = map.next_value()?,
                    _ => {
                        map.next_value::<de::IgnoredAny>()?;
                    }
                }
            }
            let spec = match spec.or_else(Spec::when_missing) {
                Some(spec) => spec,
                None => return Err(de::Error::missing_field("spec")),
            };
            Ok((metadata.unwrap_or_default(), spec, status))
        }
    }

    deserializer.deserialize_map(RootVisitor {
        api_version,
        kind,
        marker: PhantomData,
    })
}

macro_rules! root {
    (
        $(#[$meta:meta])*
        $root:ident {
            group: $group:literal,
            version: $version:literal,
            kind: $kind:literal,
            list_kind: $list_kind:literal,
            plural: $plural:literal,
            scope: $scope:ty,
            spec: $spec:ty,
            status: $status:ty $(,)?
        }
    ) => {
        $(#[$meta])*
        #[derive(Clone, Debug, PartialEq)]
        pub struct $root {
            /// Standard object metadata.
            pub metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta,
            /// The spec.
            pub spec: $spec,
            /// The status, written through the `status` subresource.
            pub status: Option<$status>,
        }

        impl $root {
            /// A new object with the given name and spec, no namespace and no status.
            pub fn new(name: &str, spec: $spec) -> Self {
                Self {
                    metadata: k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta {
                        name: Some(name.to_owned()),
                        ..Default::default()
                    },
                    spec,
                    status: None,
                }
            }
        }

        impl k8s_openapi::Resource for $root {
            const API_VERSION: &'static str = concat!($group, "/", $version);
            const GROUP: &'static str = $group;
            const KIND: &'static str = $kind;
            const VERSION: &'static str = $version;
            const URL_PATH_SEGMENT: &'static str = $plural;
            type Scope = $scope;
        }

        impl k8s_openapi::ListableResource for $root {
            const LIST_KIND: &'static str = $list_kind;
        }

        impl k8s_openapi::Metadata for $root {
            type Ty = k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;

            fn metadata(&self) -> &Self::Ty {
                &self.metadata
            }

            fn metadata_mut(&mut self) -> &mut Self::Ty {
                &mut self.metadata
            }
        }

        impl kube_core::object::HasSpec for $root {
            type Spec = $spec;

            fn spec(&self) -> &$spec {
                &self.spec
            }

            fn spec_mut(&mut self) -> &mut $spec {
                &mut self.spec
            }
        }

        impl kube_core::object::HasStatus for $root {
            type Status = $status;

            fn status(&self) -> Option<&$status> {
                self.status.as_ref()
            }

            fn status_mut(&mut self) -> &mut Option<$status> {
                &mut self.status
            }
        }

        impl serde::Serialize for $root {
            fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                $crate::api::versions::serialize_root(
                    serializer,
                    <Self as k8s_openapi::Resource>::API_VERSION,
                    $kind,
                    &self.metadata,
                    &self.spec,
                    self.status.as_ref(),
                )
            }
        }

        impl<'de> serde::Deserialize<'de> for $root {
            fn deserialize<D: serde::Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
                let (metadata, spec, status) = $crate::api::versions::deserialize_root(
                    deserializer,
                    <Self as k8s_openapi::Resource>::API_VERSION,
                    $kind,
                )?;
                Ok(Self { metadata, spec, status })
            }
        }
    };
}

/// Serializes `{apiVersion, kind, metadata, spec, status?}`.
pub(crate) fn serialize_root<S, Spec, Status>(
    serializer: S,
    api_version: &'static str,
    kind: &'static str,
    metadata: &ObjectMeta,
    spec: &Spec,
    status: Option<&Status>,
) -> Result<S::Ok, S::Error>
where
    S: Serializer,
    Spec: Serialize,
    Status: Serialize,
{
    let mut obj = serializer.serialize_struct("Object", 4 + usize::from(status.is_some()))?;
    obj.serialize_field("apiVersion", api_version)?;
    obj.serialize_field("kind", kind)?;
    obj.serialize_field("metadata", metadata)?;
    obj.serialize_field("spec", spec)?;
    if let Some(status) = status {
        obj.serialize_field("status", status)?;
    }
    obj.end()
}

macro_rules! mcs_version {
    ($module:ident, $version:literal, $doc:literal) => {
        #[doc = $doc]
        pub mod $module {
            pub use crate::api::types::{
                ServiceExportSpec, ServiceExportStatus, ServiceImportSpec, ServiceImportStatus,
            };

            root! {
                /// Declares that the Service with the same name and namespace is to be
                /// exported to the ClusterSet.
                ServiceExport {
                    group: "multicluster.x-k8s.io",
                    version: $version,
                    kind: "ServiceExport",
                    list_kind: "ServiceExportList",
                    plural: "serviceexports",
                    scope: k8s_openapi::NamespaceResourceScope,
                    spec: ServiceExportSpec,
                    status: ServiceExportStatus,
                }
            }

            root! {
                /// A service imported from the clusters of a ClusterSet. Only the MCS
                /// controller writes these.
                ServiceImport {
                    group: "multicluster.x-k8s.io",
                    version: $version,
                    kind: "ServiceImport",
                    list_kind: "ServiceImportList",
                    plural: "serviceimports",
                    scope: k8s_openapi::NamespaceResourceScope,
                    spec: ServiceImportSpec,
                    status: ServiceImportStatus,
                }
            }
        }
    };
}

macro_rules! about_version {
    ($module:ident, $version:literal) => {
        /// `about.k8s.io` at this version.
        pub mod $module {
            pub use crate::api::types::{ClusterPropertySpec, ClusterPropertyStatus};

            root! {
                /// A cluster-scoped property of this cluster (About API, KEP-2149), such as
                /// its id (`cluster.clusterset.k8s.io`) or its ClusterSet membership
                /// (`clusterset.k8s.io`).
                ClusterProperty {
                    group: "about.k8s.io",
                    version: $version,
                    kind: "ClusterProperty",
                    list_kind: "ClusterPropertyList",
                    plural: "clusterproperties",
                    scope: k8s_openapi::ClusterResourceScope,
                    spec: ClusterPropertySpec,
                    status: ClusterPropertyStatus,
                }
            }
        }
    };
}

/// `v1alpha1`: served, not stored. Identical schema to [`v1beta1`].
pub mod v1alpha1 {
    mcs_version!(mcs, "v1alpha1", "`multicluster.x-k8s.io/v1alpha1`.");
    about_version!(about, "v1alpha1");
    pub use crate::api::types::*;
    pub use about::ClusterProperty;
    pub use mcs::{ServiceExport, ServiceImport};
}

/// `v1beta1`: served and stored. Use this version unless a cluster serves only `v1alpha1`.
pub mod v1beta1 {
    mcs_version!(mcs, "v1beta1", "`multicluster.x-k8s.io/v1beta1`.");
    about_version!(about, "v1beta1");
    pub use crate::api::types::*;
    pub use about::ClusterProperty;
    pub use mcs::{ServiceExport, ServiceImport};
}

macro_rules! convert {
    ($($kind:ident),+) => {$(
        impl From<v1alpha1::$kind> for v1beta1::$kind {
            fn from(o: v1alpha1::$kind) -> Self {
                Self { metadata: o.metadata, spec: o.spec, status: o.status }
            }
        }

        impl From<v1beta1::$kind> for v1alpha1::$kind {
            fn from(o: v1beta1::$kind) -> Self {
                Self { metadata: o.metadata, spec: o.spec, status: o.status }
            }
        }
    )+};
}

convert!(ServiceExport, ServiceImport, ClusterProperty);
