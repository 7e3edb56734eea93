//! The name, cluster-id and reason parsers never panic, and what they accept formats back
//! to an equal value.

use mcs_core::ClusterId;
use mcs_core::conditions::ConflictReasons;
use mcs_core::name::{McsName, Zone};
use proptest::prelude::*;

fn label() -> impl Strategy<Value = String> {
    "[a-z]([a-z0-9-]{0,20}[a-z0-9])?"
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 2_000, ..ProptestConfig::default() })]

    #[test]
    fn cluster_id_parser_never_panics(s in any::<String>()) {
        if let Ok(id) = ClusterId::new(s.clone()) {
            prop_assert_eq!(id.as_str(), s.as_str());
            prop_assert!(id.as_str().len() <= 63);
        }
    }

    #[test]
    fn name_parser_never_panics(s in any::<String>()) {
        let _ = McsName::parse(&s, &Zone::default());
    }

    #[test]
    fn dns_looking_names_never_panic(labels in prop::collection::vec("[A-Za-z0-9_-]{0,70}", 0..8), dot in any::<bool>()) {
        let mut name = labels.join(".");
        name.push_str(".svc.clusterset.local");
        if dot { name.push('.'); }
        let zone = Zone::default();
        if let Ok(parsed) = McsName::parse(&name, &zone) {
            let fqdn = parsed.to_fqdn(&zone);
            prop_assert_eq!(McsName::parse(&fqdn, &zone).unwrap(), parsed);
            prop_assert!(fqdn.len() <= 254);
        }
    }

    #[test]
    fn valid_service_names_round_trip(svc in label(), ns in label(), host in label(), cluster in label()) {
        let zone = Zone::default();
        for name in [
            format!("{svc}.{ns}.svc.clusterset.local"),
            format!("{host}.{cluster}.{svc}.{ns}.svc.clusterset.local."),
            format!("_{host}._udp.{svc}.{ns}.svc.clusterset.local"),
        ] {
            let parsed = McsName::parse(&name.to_uppercase(), &zone).unwrap();
            let expected = format!("{}.", name.trim_end_matches('.'));
            prop_assert_eq!(parsed.to_fqdn(&zone), expected);
        }
    }

    #[test]
    fn reason_parser_never_panics(s in any::<String>()) {
        if let Ok(set) = s.parse::<ConflictReasons>() {
            prop_assert!(mcs_core::conditions::is_valid_reason(&set.to_string()));
        }
    }

    #[test]
    fn zone_parser_never_panics(s in any::<String>()) {
        let _ = Zone::new(&s);
    }
}

#[test]
fn boundary_cases() {
    assert!(ClusterId::new("a".repeat(63)).is_ok());
    assert!(ClusterId::new("a".repeat(64)).is_err());
    assert!(ClusterId::new("UPPER").is_err());
    let labels = vec!["a"; 128].join(".");
    let err =
        McsName::parse(&format!("{labels}.svc.clusterset.local"), &Zone::default()).unwrap_err();
    assert!(
        err.to_string().contains("253") || err.to_string().contains("labels"),
        "{err}"
    );
}
