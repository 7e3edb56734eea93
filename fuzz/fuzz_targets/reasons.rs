//! Condition types, statuses and reasons, the `Conflict` reason list, the API's string
//! enums, and `conditions::upsert`.
//!
//! Input: text. The whole text and each of its lines and comma-separated parts go through
//! every parser: nothing panics, what parses formats back to an equal value, and
//! `is_valid_reason` agrees with the CRD's reason pattern. Each line then becomes a desired
//! condition for `upsert`, whose bookkeeping is checked.
#![no_main]

use std::fmt::Display;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};
use k8s_openapi::jiff::Timestamp;
use libfuzzer_sys::fuzz_target;
use mcs_core::api::{InternalTrafficPolicy, IpFamily, Protocol, SessionAffinity};
use mcs_core::conditions::{
    ConditionStatus, ConflictReason, ConflictReasons, DesiredCondition, ExportConditionType,
    ExportReadyReason, ImportConditionType, ImportReadyReason, NO_CONFLICTS, ValidReason,
    is_valid_reason, upsert,
};
use mcs_core::endpoints::TrafficDistribution;

fuzz_target!(|data: &[u8]| {
    let text = String::from_utf8_lossy(data);
    let mut inputs: Vec<&str> = vec![&text];
    inputs.extend(text.lines());
    inputs.extend(text.split(','));
    for s in &inputs {
        parse_all(s);
    }
    upserts(&text);
});

fn parse_all(s: &str) {
    spelled::<ConditionStatus>(s, ConditionStatus::ALL);
    spelled::<ExportConditionType>(s, ExportConditionType::ALL);
    spelled::<ValidReason>(s, ValidReason::ALL);
    spelled::<ExportReadyReason>(s, ExportReadyReason::ALL);
    spelled::<ConflictReason>(s, ConflictReason::ALL);
    spelled::<ImportConditionType>(s, ImportConditionType::ALL);
    spelled::<ImportReadyReason>(s, ImportReadyReason::ALL);
    conflict_list(s);
    reason_pattern(s);

    macro_rules! string_enum {
        ($($t:ty),+) => {$(
            if let Some(v) = <$t>::parse(s) {
                assert_eq!(v.as_str(), s);
                assert_eq!(<$t>::parse(&v.to_string()), Some(v));
                let json = serde_json::to_string(&v).unwrap();
                assert_eq!(serde_json::from_str::<$t>(&json).unwrap(), v);
            } else {
                assert!(<$t>::ALL.iter().all(|v| v.as_str() != s));
            }
        )+};
    }
    string_enum!(SessionAffinity, InternalTrafficPolicy, IpFamily, Protocol);
    if let Some(api) = mcs_core::api::TrafficDistribution::parse(s) {
        assert_eq!(api.as_str(), s);
    }
    assert_eq!(
        TrafficDistribution::from_spec(s).is_some(),
        s == "PreferClose" || s == "PreferSameZone"
    );
}

/// A spelled enum parses exactly its spellings, and each formats back to its input.
fn spelled<T>(s: &str, all: &[T])
where
    T: FromStr + Display + PartialEq + std::fmt::Debug + Copy,
    T::Err: Display,
{
    match s.parse::<T>() {
        Ok(v) => {
            assert_eq!(v.to_string(), s);
            assert!(all.contains(&v));
            assert!(is_valid_reason(s), "{s:?} is not a valid reason");
        }
        Err(e) => {
            assert!(all.iter().all(|v| v.to_string() != s));
            let _ = e.to_string();
        }
    }
}

/// The `Conflict` reason list: a parsed set formats to a canonical list that parses back
/// to the same set, names only reasons present in the input, and is a valid reason.
fn conflict_list(s: &str) {
    let Ok(set) = s.parse::<ConflictReasons>() else {
        return;
    };
    let shown = set.to_string();
    assert_eq!(shown.parse::<ConflictReasons>(), Ok(set));
    assert!(is_valid_reason(&shown), "{shown:?}");
    if s == NO_CONFLICTS {
        assert!(set.is_empty());
        return;
    }
    let parts: Vec<&str> = s.split(',').collect();
    assert!(!set.is_empty());
    assert!(set.len() <= parts.len());
    assert_eq!(set.iter().count(), set.len());
    for reason in set.iter() {
        assert!(parts.contains(&reason.as_str()));
    }
    for part in parts {
        assert!(set.contains(part.parse::<ConflictReason>().unwrap()));
    }
    // The canonical form lists reasons in declaration order, without repeats.
    let canonical: ConflictReasons = set.iter().collect();
    assert_eq!(canonical, set);
    assert_eq!(set.status(), ConditionStatus::True);
}

/// `is_valid_reason` is the CRD's `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`, at most 1024
/// characters, written out independently.
fn reason_pattern(s: &str) {
    let chars: Vec<char> = s.chars().collect();
    let inner = |c: &char| c.is_ascii_alphanumeric() || matches!(c, '_' | ',' | ':');
    let expected = match chars.as_slice() {
        [] => false,
        [first] => first.is_ascii_alphabetic(),
        [first, middle @ .., last] => {
            chars.len() <= 1024
                && first.is_ascii_alphabetic()
                && middle.iter().all(inner)
                && (last.is_ascii_alphanumeric() || *last == '_')
        }
    };
    assert_eq!(is_valid_reason(s), expected, "{s:?}");
}

/// Each line is a desired condition; `upsert` keeps one condition per type, writes what
/// was asked, moves `lastTransitionTime` only when the status flips, and reports a change
/// exactly when something but the timestamp changed.
fn upserts(text: &str) {
    const TYPES: [&str; 3] = ["Valid", "Ready", "Conflict"];
    let mut conditions: Vec<Condition> = Vec::new();
    for (i, line) in text.lines().take(32).enumerate() {
        let b = line
            .bytes()
            .fold(0usize, |a, b| a.wrapping_mul(31) ^ usize::from(b));
        let type_ = TYPES[b % 3];
        let status = ConditionStatus::ALL[(b / 3) % 3];
        let generation = (b % 5 != 0).then_some((b % 4) as i64);
        let (reason, message) = line.split_once(' ').unwrap_or((line, ""));
        let desired = DesiredCondition::new(type_, status, reason, message);
        let now = Time(Timestamp::from_second(1_780_000_000 + i as i64).unwrap());

        let before = conditions.iter().find(|c| c.type_ == type_).cloned();
        let changed = upsert(&mut conditions, &desired, generation, &now);
        let after = conditions
            .iter()
            .filter(|c| c.type_ == type_)
            .collect::<Vec<_>>();
        assert_eq!(after.len(), 1, "one condition per type");
        let after = after[0];
        assert_eq!(after.status, status.as_str());
        assert_eq!(after.reason, desired.reason);
        assert_eq!(after.message, desired.message);
        assert_eq!(after.observed_generation, generation);
        match &before {
            None => {
                assert!(changed);
                assert_eq!(after.last_transition_time, now);
            }
            Some(old) => {
                let flipped = old.status != after.status;
                assert_eq!(
                    after.last_transition_time == now,
                    flipped || old.last_transition_time == now
                );
                let same = old.status == after.status
                    && old.reason == after.reason
                    && old.message == after.message
                    && old.observed_generation == after.observed_generation;
                assert_eq!(changed, !same);
            }
        }
        let snapshot = conditions.clone();
        assert!(!upsert(&mut conditions, &desired, generation, &now));
        assert_eq!(conditions, snapshot, "a repeated upsert changes nothing");
    }
    assert!(conditions.len() <= TYPES.len());
}
