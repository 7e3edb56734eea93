//! The `clusterset.local` name grammar, the zone and the label types, and `ClusterId`.
//!
//! Input: text; `name` or `name\nzone` (the zone defaults to `clusterset.local`). Nothing
//! panics, and whatever parses formats back to text that parses to an equal value.
#![no_main]

use std::net::IpAddr;

use libfuzzer_sys::fuzz_target;
use mcs_core::ClusterId;
use mcs_core::name::{
    Hostname, MAX_NAME_LEN, McsName, Namespace, PortName, ServiceName, ServiceRef, Zone,
};
use mcs_fuzz::wire_encodable;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let (name, zone_text) = match text.split_once('\n') {
        Some((name, zone)) => (name, Some(zone)),
        None => (&*text, None),
    };

    for s in [name, zone_text.unwrap_or("")] {
        cluster_id(s);
        labels(s);
        if let Ok(ip) = s.parse::<IpAddr>() {
            let host = Hostname::from_ip(ip);
            assert_eq!(
                Hostname::new(host.as_str()).as_ref(),
                Ok(&host),
                "dashed IP {ip} is not a valid hostname"
            );
        }
    }

    let zone = match zone_text {
        None => Zone::default(),
        Some(z) => match Zone::new(z) {
            Ok(zone) => {
                assert_eq!(Zone::new(&zone.to_string()).as_ref(), Ok(&zone));
                assert_eq!(Zone::new(&zone.fqdn()).as_ref(), Ok(&zone));
                assert_eq!(zone.as_str(), zone.as_str().to_ascii_lowercase());
                assert!(zone.contains(zone.as_str()) && zone.contains(&zone.fqdn()));
                assert!(zone.as_str().len() <= MAX_NAME_LEN);
                zone
            }
            Err(e) => {
                let _ = e.to_string();
                return;
            }
        },
    };

    let parsed = match McsName::parse(name, &zone) {
        Ok(parsed) => parsed,
        Err(e) => {
            let _ = e.to_string();
            return;
        }
    };
    // Names are case-insensitive, and a trailing dot is optional.
    assert_eq!(
        McsName::parse(&name.to_ascii_uppercase(), &zone).as_ref(),
        Ok(&parsed)
    );
    assert!(zone.contains(name));
    let fqdn = parsed.to_fqdn(&zone);
    assert_eq!(
        fqdn,
        format!(
            "{}.",
            name.strip_suffix('.').unwrap_or(name).to_ascii_lowercase()
        )
    );
    assert!(fqdn.len() <= MAX_NAME_LEN + 1, "{fqdn}");
    assert!(wire_encodable(&fqdn), "{fqdn}");
    assert_eq!(McsName::parse(&fqdn, &zone).as_ref(), Ok(&parsed), "{fqdn}");
    assert_eq!(
        McsName::parse(fqdn.trim_end_matches('.'), &zone).as_ref(),
        Ok(&parsed)
    );
    match &parsed {
        McsName::Namespace(ns) => assert_eq!(Namespace::new(ns.as_str()).as_ref(), Ok(ns)),
        McsName::Service(svc) => service_ref(svc),
        McsName::Srv { port, service, .. } => {
            assert_eq!(PortName::new(port.as_str()).as_ref(), Ok(port));
            service_ref(service);
        }
        McsName::Endpoint {
            hostname,
            cluster,
            service,
        } => {
            assert_eq!(Hostname::new(hostname.as_str()).as_ref(), Ok(hostname));
            assert_eq!(ClusterId::new(cluster.as_str()).as_ref(), Ok(cluster));
            service_ref(service);
        }
        McsName::Apex | McsName::DnsVersion | McsName::SvcZone => {}
    }
});

fn cluster_id(s: &str) {
    match ClusterId::new(s) {
        Ok(id) => {
            assert_eq!(id.as_str(), s);
            assert!(!s.is_empty() && s.len() <= 63);
            assert_eq!(id.to_string().parse::<ClusterId>().as_ref(), Ok(&id));
            let json = serde_json::to_string(&id).unwrap();
            assert_eq!(serde_json::from_str::<ClusterId>(&json).unwrap(), id);
        }
        Err(e) => {
            assert_eq!(e.value, s);
            let _ = e.to_string();
            assert!(serde_json::from_value::<ClusterId>(s.into()).is_err());
        }
    }
}

/// Every label type accepts exactly what its rule accepts, and round-trips.
fn labels(s: &str) {
    let namespace = Namespace::new(s).ok();
    let hostname = Hostname::new(s).ok();
    let port = PortName::new(s).ok();
    let service = ServiceName::new(s).ok();
    // The three RFC-1123 label types agree, and so does the cluster id.
    assert_eq!(namespace.is_some(), hostname.is_some());
    assert_eq!(namespace.is_some(), port.is_some());
    assert_eq!(namespace.is_some(), ClusterId::new(s).is_ok());
    // A service name is an RFC-1123 label that starts with a letter.
    assert_eq!(
        service.is_some(),
        namespace.is_some() && s.starts_with(|c: char| c.is_ascii_lowercase())
    );
    if let Some(v) = namespace {
        assert_eq!(v.to_string().parse::<Namespace>().as_ref(), Ok(&v));
    }
    if let Some(v) = hostname {
        assert_eq!(v.to_string().parse::<Hostname>().as_ref(), Ok(&v));
    }
    if let Some(v) = port {
        assert_eq!(v.to_string().parse::<PortName>().as_ref(), Ok(&v));
    }
    if let Some(v) = service {
        assert_eq!(v.to_string().parse::<ServiceName>().as_ref(), Ok(&v));
    }
}

/// `ServiceRef` displays as `<namespace>/<name>`, which splits back into an equal value,
/// and its FQDN parses back to it under the default zone when short enough.
fn service_ref(svc: &ServiceRef) {
    let shown = svc.to_string();
    let (ns, name) = shown.split_once('/').expect("namespace/name");
    assert_eq!(ServiceRef::new(ns, name).as_ref(), Ok(svc));
    let zone = Zone::default();
    let fqdn = svc.to_fqdn(&zone);
    assert_eq!(
        McsName::parse(&fqdn, &zone),
        Ok(McsName::Service(svc.clone())),
        "{fqdn}"
    );
}
