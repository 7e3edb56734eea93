//! A cluster's admin kubeconfig, built as a [`Kubeconfig`] and written by serialising it.

use std::fs;
use std::path::Path;

use base64::Engine as _;
use kube::config::{
    AuthInfo, Cluster, Context, Kubeconfig, NamedAuthInfo, NamedCluster, NamedContext,
};

use super::pki::Pki;

/// The kubeconfig of cluster `name` at `server`: its CA, the admin user of `pki`
/// (certificates embedded) and one context, `name`, with namespace `default`.
pub(super) fn admin(name: &str, server: &str, pki: &Pki) -> Kubeconfig {
    let b64 = |s: &str| base64::engine::general_purpose::STANDARD.encode(s);
    let user = format!("{name}-admin");
    Kubeconfig {
        api_version: Some("v1".into()),
        kind: Some("Config".into()),
        clusters: vec![NamedCluster {
            name: name.into(),
            cluster: Some(Cluster {
                server: Some(server.into()),
                certificate_authority_data: Some(b64(&pki.ca_pem)),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        auth_infos: vec![NamedAuthInfo {
            name: user.clone(),
            auth_info: Some(AuthInfo {
                client_certificate_data: Some(b64(&pki.admin_pem)),
                client_key_data: Some(b64(&pki.admin_key).into()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        contexts: vec![NamedContext {
            name: name.into(),
            context: Some(Context {
                cluster: name.into(),
                user: Some(user),
                namespace: Some("default".into()),
                ..Default::default()
            }),
            other: Default::default(),
        }],
        current_context: Some(name.into()),
        ..Default::default()
    }
}

/// Writes `kubeconfig` to `path` as YAML, for processes started by a test.
pub fn write(path: &Path, kubeconfig: &Kubeconfig) {
    let yaml = serde_saphyr::to_string(kubeconfig)
        .unwrap_or_else(|e| panic!("serialise the kubeconfig for {}: {e}", path.display()));
    fs::write(path, yaml).unwrap_or_else(|e| panic!("write {}: {e}", path.display()));
}
