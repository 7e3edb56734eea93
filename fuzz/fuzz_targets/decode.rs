//! Arbitrary JSON and YAML into the API types (`decode_json`, `decode_yaml`) and through
//! the edges that read core objects (`ServiceFacts::try_from(&Service)`,
//! `McsSlice::parse`, `Constituent::from_export`).
//!
//! Input: text. Nothing panics; a value that decodes re-encodes (as JSON and as YAML) to
//! text that decodes to the same value. The one allowed difference: Kubernetes `Time`
//! fields are written with whole seconds (k8s-openapi's format), so they are compared
//! after the same truncation.
#![no_main]

use std::fmt::Debug;

use k8s_openapi::api::core::v1::Service;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, ObjectMeta, Time};
use k8s_openapi::jiff::Timestamp;
use libfuzzer_sys::fuzz_target;
use mcs_core::ClusterId;
use mcs_core::api::{DecodeError, decode_json, decode_yaml, v1alpha1, v1beta1};
use mcs_core::merge::{Constituent, MAX_PORT, ServiceFacts, ServiceKind};
use mcs_core::slices::{McsSlice, SliceEndpoints};
use serde::Serialize;
use serde::de::DeserializeOwned;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    if let Some(export) = round_trip::<v1beta1::ServiceExport>(text, |e| {
        meta(&mut e.metadata);
        conditions(e.status.as_mut().and_then(|s| s.conditions.as_mut()));
    }) {
        let alpha = v1alpha1::ServiceExport::from(export.clone());
        assert_eq!(v1beta1::ServiceExport::from(alpha), export);
        let cluster = ClusterId::new("east").unwrap();
        let constituent = Constituent::from_export(cluster, &export, None);
        assert_eq!(
            constituent.is_ok(),
            export.metadata.creation_timestamp.is_some()
        );
        if let Ok(c) = constituent {
            assert_eq!(
                c.exported_labels(),
                &export.spec.exported_labels.clone().unwrap_or_default()
            );
        }
    }
    round_trip::<v1alpha1::ServiceExport>(text, |e| {
        meta(&mut e.metadata);
        conditions(e.status.as_mut().and_then(|s| s.conditions.as_mut()));
    });
    if let Some(import) = round_trip::<v1beta1::ServiceImport>(text, |i| {
        meta(&mut i.metadata);
        conditions(i.status.as_mut().and_then(|s| s.conditions.as_mut()));
    }) {
        let alpha = v1alpha1::ServiceImport::from(import.clone());
        assert_eq!(v1beta1::ServiceImport::from(alpha), import);
    }
    round_trip::<v1alpha1::ServiceImport>(text, |i| {
        meta(&mut i.metadata);
        conditions(i.status.as_mut().and_then(|s| s.conditions.as_mut()));
    });
    if let Some(property) = round_trip::<v1beta1::ClusterProperty>(text, |p| meta(&mut p.metadata))
    {
        let _ = property.spec.validate();
    }
    round_trip::<v1alpha1::ClusterProperty>(text, |p| meta(&mut p.metadata));

    if let Ok(service) = serde_json::from_str::<Service>(text) {
        service_facts(&service);
    }
    if let Ok(service) = serde_saphyr::from_str::<Service>(text) {
        service_facts(&service);
    }
    if let Ok(slice) = serde_json::from_str::<EndpointSlice>(text) {
        endpoint_slice(&slice);
    }
    if let Ok(slice) = serde_saphyr::from_str::<EndpointSlice>(text) {
        endpoint_slice(&slice);
    }
});

/// Decodes `text` as JSON and as YAML; every success must survive a re-encoding.
fn round_trip<T>(text: &str, normalise: fn(&mut T)) -> Option<T>
where
    T: DeserializeOwned + Serialize + PartialEq + Debug + Clone,
{
    let json = decode_json::<T>(text).map_err(error).ok();
    let yaml = decode_yaml::<T>(text).map_err(error).ok();
    for value in json.iter().chain(&yaml) {
        let mut expected = value.clone();
        normalise(&mut expected);

        let as_json = serde_json::to_string(value).expect("encodes as JSON");
        let back: T = decode_json(&as_json).unwrap_or_else(|e| panic!("{e}\n{as_json}"));
        assert_eq!(back, expected, "JSON round trip of {as_json}");

        let as_yaml = serde_saphyr::to_string(value).expect("encodes as YAML");
        let back: T = decode_yaml(&as_yaml).unwrap_or_else(|e| panic!("{e}\n{as_yaml}"));
        assert_eq!(back, expected, "YAML round trip of {as_yaml}");
    }
    json.or(yaml)
}

/// A decode error formats and names a path.
fn error(e: DecodeError) {
    let _ = (e.to_string(), e.path().len());
}

/// What k8s-openapi writes for a `Time`: whole seconds, UTC.
fn truncate(time: &mut Time) {
    let shown = k8s_openapi::jiff::fmt::strtime::format("%Y-%m-%dT%H:%M:%SZ", time.0)
        .expect("formats as Kubernetes does");
    time.0 = shown.parse::<Timestamp>().expect("parses back");
}

fn meta(meta: &mut ObjectMeta) {
    meta.creation_timestamp.iter_mut().for_each(truncate);
    meta.deletion_timestamp.iter_mut().for_each(truncate);
    for entry in meta.managed_fields.iter_mut().flatten() {
        entry.time.iter_mut().for_each(truncate);
    }
}

fn conditions(list: Option<&mut Vec<Condition>>) {
    for c in list.into_iter().flatten() {
        truncate(&mut c.last_transition_time);
    }
}

/// A core Service becomes facts or a typed error; facts hold no repeated port name or
/// (protocol, port) pair, only ports in range, and always a protocol.
fn service_facts(service: &Service) {
    match ServiceFacts::try_from(service) {
        Ok(facts) => {
            if facts.kind() == ServiceKind::ExternalName {
                return;
            }
            let mut names = std::collections::BTreeSet::new();
            let mut pairs = std::collections::BTreeSet::new();
            for p in facts.ports() {
                assert!((1..=MAX_PORT).contains(&p.port));
                assert!(p.protocol.is_some());
                assert!(names.insert(p.name.clone().unwrap_or_default()));
                assert!(pairs.insert((p.protocol_or_default(), p.port)));
                assert!(facts.exposes(p));
            }
            let families = facts.ip_families();
            let unique: std::collections::BTreeSet<_> = families.iter().collect();
            assert_eq!(unique.len(), families.len());
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
}

/// Any EndpointSlice parses or fails with a typed error; parsed ports are never 0 and
/// hostnames are valid labels.
fn endpoint_slice(slice: &EndpointSlice) {
    let plain = SliceEndpoints::parse(slice);
    match McsSlice::parse(slice) {
        Ok(mcs) => {
            assert_eq!(Ok(&mcs.data), plain.as_ref());
            for ep in &mcs.data.endpoints {
                if let Some(host) = ep.dns_hostname() {
                    assert!(mcs_core::name::Hostname::new(host.as_str()).is_ok());
                }
            }
        }
        Err(e) => {
            let _ = e.to_string();
        }
    }
    if let Ok(data) = plain {
        assert!(data.ports.iter().all(|p| p.port != 0));
    }
}
