//! Each cluster's certificates: a CA, the API server's serving certificate, an admin
//! client certificate (`O=system:masters`) and the service-account signing key; and client
//! certificates for other users, issued by the same CA.

use std::fs;
use std::path::Path;

use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};

/// The PEM files in a cluster's directory.
pub(super) const CA_CERT: &str = "ca.crt";
pub(super) const CA_KEY: &str = "ca.key";
pub(super) const SERVER_CERT: &str = "apiserver.crt";
pub(super) const SERVER_KEY: &str = "apiserver.key";
pub(super) const SA_KEY: &str = "sa.key";
pub(super) const SA_PUB: &str = "sa.pub";

/// A cluster's certificates and keys, PEM-encoded.
pub(super) struct Pki {
    pub(super) ca_pem: String,
    /// The CA's key, so tests can issue client certificates ([`client_certificate`]).
    pub(super) ca_key: String,
    pub(super) server_pem: String,
    pub(super) server_key: String,
    pub(super) admin_pem: String,
    pub(super) admin_key: String,
    pub(super) sa_key: String,
    pub(super) sa_pub: String,
}

/// The CA of cluster `name` (the same parameters each time, so a CA can be rebuilt from
/// its key to issue more certificates).
fn ca_params(name: &str) -> CertificateParams {
    let mut ca = CertificateParams::new(Vec::<String>::new()).unwrap();
    ca.distinguished_name
        .push(DnType::CommonName, format!("mcs-test-{name}-ca"));
    ca.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
    ca.key_usages = vec![
        KeyUsagePurpose::KeyCertSign,
        KeyUsagePurpose::CrlSign,
        KeyUsagePurpose::DigitalSignature,
    ];
    ca
}

/// A client certificate for `user` in `groups` signed by `issuer`: `(certificate, key)`.
fn issue_client(issuer: &Issuer<'_, KeyPair>, user: &str, groups: &[&str]) -> (String, String) {
    let key = KeyPair::generate().unwrap();
    let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
    for g in groups {
        params.distinguished_name.push(DnType::OrganizationName, *g);
    }
    params.distinguished_name.push(DnType::CommonName, user);
    params.key_usages = vec![
        KeyUsagePurpose::DigitalSignature,
        KeyUsagePurpose::KeyEncipherment,
    ];
    params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
    let cert = params.signed_by(&key, issuer).unwrap().pem();
    (cert, key.serialize_pem())
}

impl Pki {
    /// Fresh certificates for cluster `name`, whose `kubernetes` Service has the ClusterIP
    /// `service_ip` (the server certificate names it, as Pods reach the API server there).
    pub(super) fn generate(name: &str, service_ip: std::net::Ipv4Addr) -> Pki {
        let ca_key = KeyPair::generate().unwrap();
        let ca = ca_params(name);
        let ca_pem = ca.self_signed(&ca_key).unwrap().pem();
        let ca_key_pem = ca_key.serialize_pem();
        let issuer = Issuer::new(ca, ca_key);

        let server_key = KeyPair::generate().unwrap();
        let mut server = CertificateParams::new(vec![
            "127.0.0.1".to_string(),
            "localhost".into(),
            service_ip.to_string(),
            // The lab's address, where Pods on real nodes reach every cluster's API server
            // (their own through the `kubernetes` Service, their peers' directly).
            super::netlab::LAB_DUMMY.to_string(),
            "kubernetes".into(),
            "kubernetes.default".into(),
            "kubernetes.default.svc".into(),
        ])
        .unwrap();
        server
            .distinguished_name
            .push(DnType::CommonName, "kube-apiserver");
        server.key_usages = vec![
            KeyUsagePurpose::DigitalSignature,
            KeyUsagePurpose::KeyEncipherment,
        ];
        server.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        let server_pem = server.signed_by(&server_key, &issuer).unwrap().pem();

        let (admin_pem, admin_key) = issue_client(&issuer, "mcs-test-admin", &["system:masters"]);

        let sa = KeyPair::generate().unwrap();
        Pki {
            ca_pem,
            ca_key: ca_key_pem,
            server_pem,
            server_key: server_key.serialize_pem(),
            admin_pem,
            admin_key,
            sa_key: sa.serialize_pem(),
            sa_pub: sa.public_key_pem(),
        }
    }

    /// Writes what the processes read into the cluster's directory.
    pub(super) fn write(&self, dir: &Path) {
        for (file, data) in [
            (CA_CERT, &self.ca_pem),
            (CA_KEY, &self.ca_key),
            (SERVER_CERT, &self.server_pem),
            (SERVER_KEY, &self.server_key),
            ("admin.crt", &self.admin_pem),
            ("admin.key", &self.admin_key),
            (SA_KEY, &self.sa_key),
            (SA_PUB, &self.sa_pub),
        ] {
            fs::write(dir.join(file), data)
                .unwrap_or_else(|e| panic!("write {}: {e}", dir.join(file).display()));
        }
    }
}

/// A client certificate for `user` in `groups` from the CA of cluster `name`, whose key is
/// in `dir` (as [`Pki::write`] left it): `(certificate, key)`, PEM-encoded.
pub(super) fn client_certificate(
    dir: &Path,
    name: &str,
    user: &str,
    groups: &[&str],
) -> (String, String) {
    let path = dir.join(CA_KEY);
    let pem = fs::read_to_string(&path)
        .unwrap_or_else(|e| panic!("cluster {name}: read {}: {e}", path.display()));
    let ca_key = KeyPair::from_pem(&pem).expect("parse CA key");
    let issuer = Issuer::new(ca_params(name), ca_key);
    issue_client(&issuer, user, groups)
}
