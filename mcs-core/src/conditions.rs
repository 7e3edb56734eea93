//! Condition types and reasons, spelt exactly as Kubernetes spells them (mcs-api v0.5.0).
//!
//! Every type and reason is an enum with `as_str()` and `Display`; none of the strings
//! appear elsewhere in the code. A `Conflict` condition may carry several reasons at once,
//! comma-joined without spaces (`PortConflict,TypeConflict`): [`ConflictReasons`] is that
//! set, and it formats as `NoConflicts` when empty.
//!
//! [`upsert`] writes a desired condition into a status list the way controllers should:
//! `lastTransitionTime` moves only when the status flips, and it reports whether anything
//! but the timestamp changed, so a controller can skip writes that change nothing.

use std::fmt;
use std::str::FromStr;

use k8s_openapi::apimachinery::pkg::apis::meta::v1::{Condition, Time};

/// A condition reason or type that is not one of the known spellings.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum ReasonError {
    /// The string is not a known value.
    #[error("unknown {what} {value:?}; expected one of: {expected}")]
    Unknown {
        /// What was being parsed (for example `Conflict reason`).
        what: &'static str,
        /// The input.
        value: String,
        /// The accepted spellings, comma-separated.
        expected: String,
    },
    /// A comma-joined reason list has an empty element or mixes `NoConflicts` with
    /// conflict reasons.
    #[error("malformed Conflict reason list {value:?}: {problem}")]
    MalformedList {
        /// The input.
        value: String,
        /// What is wrong with it.
        problem: &'static str,
    },
}

macro_rules! spelled_enum {
    ($(#[$meta:meta])* $name:ident, $what:literal { $($(#[$vmeta:meta])* $variant:ident = $s:literal,)+ }) => {
        $(#[$meta])*
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
        pub enum $name {
            $($(#[$vmeta])* $variant,)+
        }

        impl $name {
            /// Every value, in declaration order.
            pub const ALL: &'static [Self] = &[$(Self::$variant),+];

            /// The exact Kubernetes spelling.
            pub const fn as_str(self) -> &'static str {
                match self {
                    $(Self::$variant => $s,)+
                }
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(self.as_str())
            }
        }

        impl FromStr for $name {
            type Err = ReasonError;

            fn from_str(s: &str) -> Result<Self, ReasonError> {
                match s {
                    $($s => Ok(Self::$variant),)+
                    _ => Err(ReasonError::Unknown {
                        what: $what,
                        value: s.to_owned(),
                        expected: [$($s),+].join(", "),
                    }),
                }
            }
        }
    };
}

spelled_enum! {
    /// The status of a condition.
    ConditionStatus, "condition status" {
        /// `True`.
        True = "True",
        /// `False`.
        False = "False",
        /// `Unknown`.
        Unknown = "Unknown",
    }
}

spelled_enum! {
    /// Condition types of a ServiceExport.
    ExportConditionType, "ServiceExport condition type" {
        /// Whether the export is valid (not whether it has been exported).
        Valid = "Valid",
        /// Whether the service has been exported or is ready to be pulled.
        Ready = "Ready",
        /// Whether a property conflicts between the constituent exports.
        Conflict = "Conflict",
    }
}

spelled_enum! {
    /// Reasons of the ServiceExport `Valid` condition.
    ValidReason, "Valid reason" {
        /// The export is valid (status True).
        Valid = "Valid",
        /// No Service with the export's name exists (status False).
        NoService = "NoService",
        /// The Service's type cannot be exported, e.g. `ExternalName`, or a headless
        /// Service with cluster selectors (KEP-5939) (status False).
        InvalidServiceType = "InvalidServiceType",
        /// The export's `clusterSelectors` are invalid (KEP-5939) (status False).
        InvalidClusterSelector = "InvalidClusterSelector",
    }
}

spelled_enum! {
    /// Reasons of the ServiceExport `Ready` condition.
    ExportReadyReason, "ServiceExport Ready reason" {
        /// Exported to the control or data plane (push model, status True).
        Exported = "Exported",
        /// Ready to be pulled (pull model, status True).
        Ready = "Ready",
        /// Not exported yet (status False or Unknown).
        Pending = "Pending",
        /// The export failed; the message says why (status False).
        Failed = "Failed",
    }
}

spelled_enum! {
    /// One reason of the ServiceExport `Conflict` condition (status True).
    ConflictReason, "Conflict reason" {
        /// The port sets of the constituents differ in any way.
        PortConflict = "PortConflict",
        /// Headless and non-headless constituents are mixed.
        TypeConflict = "TypeConflict",
        /// `sessionAffinity` differs.
        SessionAffinityConflict = "SessionAffinityConflict",
        /// `sessionAffinityConfig` differs.
        SessionAffinityConfigConflict = "SessionAffinityConfigConflict",
        /// The exported annotations differ.
        AnnotationsConflict = "AnnotationsConflict",
        /// The exported labels differ.
        LabelsConflict = "LabelsConflict",
        /// `internalTrafficPolicy` differs.
        InternalTrafficPolicyConflict = "InternalTrafficPolicyConflict",
        /// `trafficDistribution` differs.
        TrafficDistributionConflict = "TrafficDistributionConflict",
        /// IP families differ so that some backends are unreachable over one family.
        IpFamilyConflict = "IPFamilyConflict",
        /// The ordered `clusterSelectors` differ (KEP-5939).
        ClusterSelectorsConflict = "ClusterSelectorsConflict",
    }
}

spelled_enum! {
    /// Condition types of a ServiceImport.
    ImportConditionType, "ServiceImport condition type" {
        /// Whether the import is ready.
        Ready = "Ready",
    }
}

spelled_enum! {
    /// Reasons of the ServiceImport `Ready` condition.
    ImportReadyReason, "ServiceImport Ready reason" {
        /// The import is ready (status True).
        Ready = "Ready",
        /// The import is not ready yet (status False or Unknown).
        Pending = "Pending",
        /// The service cannot be imported because of an IP family mismatch (status False).
        IpFamilyNotSupported = "IPFamilyNotSupported",
    }
}

/// The spelling of a `Conflict` condition with no conflict (status False).
pub const NO_CONFLICTS: &str = "NoConflicts";

/// The set of reasons of a `Conflict` condition: empty means `NoConflicts`.
///
/// Formats as the reasons comma-joined in declaration order of [`ConflictReason`], which is
/// what the CRD's reason pattern allows (no spaces).
///
/// ```
/// use mcs_core::conditions::{ConflictReason, ConflictReasons};
///
/// let reasons: ConflictReasons = "TypeConflict,PortConflict".parse().unwrap();
/// assert!(reasons.contains(ConflictReason::PortConflict));
/// assert_eq!(reasons.to_string(), "PortConflict,TypeConflict");
/// assert_eq!(ConflictReasons::default().to_string(), "NoConflicts");
/// ```
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Hash)]
pub struct ConflictReasons(u16);

impl ConflictReasons {
    /// The empty set (`NoConflicts`).
    pub const NONE: Self = Self(0);

    /// Adds a reason.
    pub fn insert(&mut self, reason: ConflictReason) {
        self.0 |= Self::bit(reason);
    }

    /// Whether the set holds `reason`.
    pub fn contains(self, reason: ConflictReason) -> bool {
        self.0 & Self::bit(reason) != 0
    }

    /// Whether there is no conflict.
    pub fn is_empty(self) -> bool {
        self.0 == 0
    }

    /// Number of reasons.
    pub fn len(self) -> usize {
        self.0.count_ones() as usize
    }

    /// The reasons, in declaration order.
    pub fn iter(self) -> impl Iterator<Item = ConflictReason> {
        ConflictReason::ALL
            .iter()
            .copied()
            .filter(move |r| self.contains(*r))
    }

    /// The condition status: `True` when any reason is present.
    pub fn status(self) -> ConditionStatus {
        if self.is_empty() {
            ConditionStatus::False
        } else {
            ConditionStatus::True
        }
    }

    fn bit(reason: ConflictReason) -> u16 {
        1 << (reason as u16)
    }
}

impl FromIterator<ConflictReason> for ConflictReasons {
    fn from_iter<I: IntoIterator<Item = ConflictReason>>(iter: I) -> Self {
        let mut set = Self::NONE;
        iter.into_iter().for_each(|r| set.insert(r));
        set
    }
}

impl fmt::Display for ConflictReasons {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if self.is_empty() {
            return f.write_str(NO_CONFLICTS);
        }
        for (i, reason) in self.iter().enumerate() {
            if i > 0 {
                f.write_str(",")?;
            }
            f.write_str(reason.as_str())?;
        }
        Ok(())
    }
}

impl FromStr for ConflictReasons {
    type Err = ReasonError;

    fn from_str(s: &str) -> Result<Self, ReasonError> {
        if s == NO_CONFLICTS {
            return Ok(Self::NONE);
        }
        let mut set = Self::NONE;
        for part in s.split(',') {
            if part.is_empty() {
                return Err(ReasonError::MalformedList {
                    value: s.to_owned(),
                    problem: "empty element",
                });
            }
            if part == NO_CONFLICTS {
                return Err(ReasonError::MalformedList {
                    value: s.to_owned(),
                    problem: "NoConflicts cannot be combined with conflict reasons",
                });
            }
            set.insert(part.parse()?);
        }
        Ok(set)
    }
}

/// A condition as a controller wants it, without the bookkeeping fields.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct DesiredCondition {
    /// The condition type, e.g. `Valid`.
    pub type_: &'static str,
    /// The status.
    pub status: ConditionStatus,
    /// The reason (possibly comma-joined).
    pub reason: String,
    /// A human-readable message (may be empty).
    pub message: String,
}

impl DesiredCondition {
    /// A desired condition.
    pub fn new(
        type_: &'static str,
        status: ConditionStatus,
        reason: impl Into<String>,
        message: impl Into<String>,
    ) -> Self {
        Self {
            type_,
            status,
            reason: reason.into(),
            message: message.into(),
        }
    }
}

/// Writes `desired` into `conditions`, keyed by type.
///
/// `lastTransitionTime` becomes `now` only when the condition is new or its status changes;
/// otherwise the old timestamp stays. Returns `true` when anything other than the
/// timestamp changed (so a caller can skip a write that would change nothing).
pub fn upsert(
    conditions: &mut Vec<Condition>,
    desired: &DesiredCondition,
    observed_generation: Option<i64>,
    now: &Time,
) -> bool {
    let status = desired.status.as_str();
    match conditions.iter_mut().find(|c| c.type_ == desired.type_) {
        Some(existing) => {
            let changed = existing.status != status
                || existing.reason != desired.reason
                || existing.message != desired.message
                || existing.observed_generation != observed_generation;
            if existing.status != status {
                existing.last_transition_time = now.clone();
            }
            existing.status = status.to_owned();
            existing.reason.clone_from(&desired.reason);
            existing.message.clone_from(&desired.message);
            existing.observed_generation = observed_generation;
            changed
        }
        None => {
            conditions.push(Condition {
                last_transition_time: now.clone(),
                message: desired.message.clone(),
                observed_generation,
                reason: desired.reason.clone(),
                status: status.to_owned(),
                type_: desired.type_.to_owned(),
            });
            true
        }
    }
}

/// Whether `reason` matches the CRD's reason pattern `^[A-Za-z]([A-Za-z0-9_,:]*[A-Za-z0-9_])?$`
/// and length limit (1..=1024).
pub fn is_valid_reason(reason: &str) -> bool {
    let bytes = reason.as_bytes();
    let (Some(first), Some(last)) = (bytes.first(), bytes.last()) else {
        return false;
    };
    bytes.len() <= 1024
        && first.is_ascii_alphabetic()
        && (bytes.len() == 1 || last.is_ascii_alphanumeric() || *last == b'_')
        && bytes
            .iter()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b',' | b':'))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn spellings_are_exact() {
        assert_eq!(
            ConflictReason::IpFamilyConflict.as_str(),
            "IPFamilyConflict"
        );
        assert_eq!(ConflictReason::LabelsConflict.to_string(), "LabelsConflict");
        assert_eq!(
            ConflictReason::AnnotationsConflict.as_str(),
            "AnnotationsConflict"
        );
        assert_eq!(
            ImportReadyReason::IpFamilyNotSupported.as_str(),
            "IPFamilyNotSupported"
        );
        assert_eq!(
            ValidReason::InvalidServiceType.as_str(),
            "InvalidServiceType"
        );
        assert_eq!(ConflictReasons::NONE.to_string(), "NoConflicts");
    }

    #[test]
    fn every_reason_round_trips_and_matches_the_crd_pattern() {
        for r in ConflictReason::ALL {
            assert_eq!(r.as_str().parse::<ConflictReason>().unwrap(), *r);
            assert!(is_valid_reason(r.as_str()));
        }
        for a in ConflictReason::ALL {
            for b in ConflictReason::ALL {
                let set: ConflictReasons = [*a, *b].into_iter().collect();
                let text = set.to_string();
                assert!(is_valid_reason(&text), "{text}");
                assert_eq!(text.parse::<ConflictReasons>().unwrap(), set);
                assert_eq!(set.len(), if a == b { 1 } else { 2 });
            }
        }
    }

    #[test]
    fn multi_reason_order_is_canonical() {
        let set: ConflictReasons = [ConflictReason::TypeConflict, ConflictReason::PortConflict]
            .into_iter()
            .collect();
        assert_eq!(set.to_string(), "PortConflict,TypeConflict");
        assert_eq!(set.status(), ConditionStatus::True);
    }

    #[test]
    fn bad_reason_lists_are_typed_errors() {
        assert!(matches!(
            "PortConflict,,TypeConflict".parse::<ConflictReasons>(),
            Err(ReasonError::MalformedList { .. })
        ));
        assert!(matches!(
            "NoConflicts,PortConflict".parse::<ConflictReasons>(),
            Err(ReasonError::MalformedList { .. })
        ));
        let err = "NoConflict".parse::<ConflictReasons>().unwrap_err();
        assert!(err.to_string().contains("NoConflict"), "{err}");
        assert!("AppProtocolConflict".parse::<ConflictReason>().is_err());
        assert!("".parse::<ConflictReasons>().is_err());
    }

    #[test]
    fn upsert_moves_transition_time_only_on_status_change() {
        let t0 = Time("2026-01-01T00:00:00Z".parse().unwrap());
        let t1 = Time("2026-01-01T00:01:00Z".parse().unwrap());
        let mut list = Vec::new();
        let valid = DesiredCondition::new("Valid", ConditionStatus::True, "Valid", "");
        assert!(upsert(&mut list, &valid, Some(1), &t0));
        assert!(
            !upsert(&mut list, &valid, Some(1), &t1),
            "same condition: no change"
        );
        assert_eq!(list[0].last_transition_time, t0);
        let msg = DesiredCondition::new("Valid", ConditionStatus::True, "Valid", "ok");
        assert!(upsert(&mut list, &msg, Some(1), &t1));
        assert_eq!(list[0].last_transition_time, t0, "status unchanged");
        let invalid = DesiredCondition::new("Valid", ConditionStatus::False, "NoService", "gone");
        assert!(upsert(&mut list, &invalid, Some(1), &t1));
        assert_eq!(list[0].last_transition_time, t1);
        assert_eq!(list.len(), 1);
    }

    #[test]
    fn reason_pattern() {
        assert!(is_valid_reason("A"));
        assert!(!is_valid_reason("Port Conflict"));
        assert!(!is_valid_reason("PortConflict,"));
        assert!(!is_valid_reason("1Port"));
        assert!(!is_valid_reason(""));
    }
}
