//! The workspace's manifests (`deploy/...`), read and applied as they are shipped.

use std::path::PathBuf;

use kube::api::{Api, DynamicObject, GroupVersionKind, Patch, PatchParams};
use kube::discovery::Scope;
use kube::{Client, ResourceExt};

/// Every document of a manifest of this workspace (`path` from the workspace root), in
/// order, with each `(from, to)` of `replace` substituted in the text first.
pub fn manifest_with(path: &str, replace: &[(&str, &str)]) -> Vec<DynamicObject> {
    let file = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("..")
        .join(path);
    let mut text =
        std::fs::read_to_string(&file).unwrap_or_else(|e| panic!("read {}: {e}", file.display()));
    for (from, to) in replace {
        text = text.replace(from, to);
    }
    let docs: Vec<serde_json::Value> =
        serde_saphyr::from_multiple(&text).unwrap_or_else(|e| panic!("{path}: invalid YAML: {e}"));
    docs.into_iter()
        .map(|value| {
            serde_json::from_value::<DynamicObject>(value)
                .unwrap_or_else(|e| panic!("{path}: not a Kubernetes object: {e}"))
        })
        .collect()
}

/// Every document of a manifest of this workspace, in order.
pub fn manifest(path: &str) -> Vec<DynamicObject> {
    manifest_with(path, &[])
}

/// The kind of a manifest document.
pub fn kind_of(obj: &DynamicObject) -> &str {
    obj.types.as_ref().map_or("", |t| t.kind.as_str())
}

/// The one document of `kind` in a manifest, typed.
pub fn typed<T: serde::de::DeserializeOwned>(path: &str, kind: &str) -> T {
    let docs: Vec<DynamicObject> = manifest(path)
        .into_iter()
        .filter(|d| kind_of(d) == kind)
        .collect();
    assert_eq!(docs.len(), 1, "{path}: expected one {kind}");
    serde_json::from_value(serde_json::to_value(&docs[0]).unwrap())
        .unwrap_or_else(|e| panic!("{path}: bad {kind}: {e}"))
}

/// Server-side applies one object, whatever its kind.
pub async fn apply(client: &Client, obj: &DynamicObject) {
    let types = obj.types.as_ref().expect("apiVersion and kind");
    let gvk = GroupVersionKind::try_from(types).expect("apiVersion");
    let (resource, caps) = kube::discovery::pinned_kind(client, &gvk)
        .await
        .unwrap_or_else(|e| panic!("discovering {gvk:?}: {e}"));
    let api: Api<DynamicObject> = match caps.scope {
        Scope::Cluster => Api::all_with(client.clone(), &resource),
        Scope::Namespaced => Api::namespaced_with(
            client.clone(),
            obj.metadata.namespace.as_deref().unwrap_or("default"),
            &resource,
        ),
    };
    let pp = PatchParams::apply("mcs-test-harness").force();
    api.patch(&obj.name_any(), &pp, &Patch::Apply(obj))
        .await
        .unwrap_or_else(|e| panic!("applying {} {}: {e}", gvk.kind, obj.name_any()));
}

/// Applies every document of `path` whose kind is in `kinds` (all when empty).
pub async fn apply_manifest(client: &Client, path: &str, kinds: &[&str]) {
    for obj in manifest(path) {
        if kinds.is_empty() || kinds.contains(&kind_of(&obj)) {
            apply(client, &obj).await;
        }
    }
}
