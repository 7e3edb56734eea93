//! Cluster identity: [`ClusterId`] and the RFC-1123 label rule it shares with DNS names.
//!
//! KEP-2149 allows any DNS subdomain under 128 characters as a cluster id, but the id is
//! also a label value (`multicluster.kubernetes.io/source-cluster`, at most 63 characters)
//! and a single DNS label in `<hostname>.<clusterid>.<svc>.<ns>.svc.clusterset.local`. For
//! interoperability mcs requires **one RFC-1123 label of at most 63 characters**
//! (KEP-2149, "Uniqueness"): lowercase letters, digits and `-`, starting and ending with a
//! letter or digit. A `kube-system` namespace UID (36 characters) fits.

use std::borrow::Borrow;
use std::fmt;
use std::str::FromStr;

use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// Maximum length of one DNS label.
pub const MAX_LABEL_LEN: usize = 63;

/// Why a string is not an RFC-1123 label.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[non_exhaustive]
pub enum LabelError {
    /// The label is empty.
    #[error("must not be empty")]
    Empty,
    /// The label is longer than 63 characters.
    #[error("is {len} characters long; at most 63 are allowed")]
    TooLong {
        /// Its length in bytes.
        len: usize,
    },
    /// An uppercase letter (RFC-1123 labels in Kubernetes are lowercase).
    #[error("has uppercase letter {ch:?} at position {index}; only lowercase letters are allowed")]
    Uppercase {
        /// The letter.
        ch: char,
        /// Its byte offset.
        index: usize,
    },
    /// A character other than `a-z`, `0-9` or `-`.
    #[error("has invalid character {ch:?} at position {index}; only a-z, 0-9 and '-' are allowed")]
    InvalidChar {
        /// The character.
        ch: char,
        /// Its byte offset.
        index: usize,
    },
    /// Starts or ends with `-`.
    #[error("must start and end with a letter or digit")]
    Edge,
    /// RFC-1035 labels (Service names) must start with a letter.
    #[error("must start with a letter")]
    StartsWithDigit,
}

/// Checks the RFC-1123 label rule: 1 to 63 characters of `a-z`, `0-9`, `-`, starting and
/// ending with a letter or digit.
pub fn check_rfc1123_label(s: &str) -> Result<(), LabelError> {
    if s.is_empty() {
        return Err(LabelError::Empty);
    }
    for (index, ch) in s.char_indices() {
        if ch.is_ascii_uppercase() {
            return Err(LabelError::Uppercase { ch, index });
        }
        if !(ch.is_ascii_lowercase() || ch.is_ascii_digit() || ch == '-') {
            return Err(LabelError::InvalidChar { ch, index });
        }
    }
    if s.len() > MAX_LABEL_LEN {
        return Err(LabelError::TooLong { len: s.len() });
    }
    if s.starts_with('-') || s.ends_with('-') {
        return Err(LabelError::Edge);
    }
    Ok(())
}

/// Checks the RFC-1035 label rule of Service names: an RFC-1123 label that starts with a
/// letter.
pub fn check_rfc1035_label(s: &str) -> Result<(), LabelError> {
    check_rfc1123_label(s)?;
    if s.as_bytes()[0].is_ascii_digit() {
        return Err(LabelError::StartsWithDigit);
    }
    Ok(())
}

/// An invalid cluster id.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid cluster id {value:?}: {source}")]
pub struct ClusterIdError {
    /// The input.
    pub value: String,
    /// The rule it breaks.
    #[source]
    pub source: LabelError,
}

/// A validated cluster id: one RFC-1123 label of at most 63 characters.
///
/// ```
/// use mcs_core::ClusterId;
///
/// let east: ClusterId = "east".parse().unwrap();
/// assert_eq!(east.as_str(), "east");
/// assert!("East".parse::<ClusterId>().is_err());
/// assert!("a".repeat(64).parse::<ClusterId>().is_err());
/// ```
#[derive(Clone, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct ClusterId(Box<str>);

impl ClusterId {
    /// Validates `value` as a cluster id.
    pub fn new(value: impl Into<String>) -> Result<Self, ClusterIdError> {
        let value = value.into();
        match check_rfc1123_label(&value) {
            Ok(()) => Ok(Self(value.into_boxed_str())),
            Err(source) => Err(ClusterIdError { value, source }),
        }
    }

    /// The id as a string.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl fmt::Debug for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        fmt::Debug::fmt(&*self.0, f)
    }
}

impl fmt::Display for ClusterId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl FromStr for ClusterId {
    type Err = ClusterIdError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl TryFrom<String> for ClusterId {
    type Error = ClusterIdError;

    fn try_from(s: String) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl TryFrom<&str> for ClusterId {
    type Error = ClusterIdError;

    fn try_from(s: &str) -> Result<Self, Self::Error> {
        Self::new(s)
    }
}

impl AsRef<str> for ClusterId {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

impl Borrow<str> for ClusterId {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl Serialize for ClusterId {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.serialize_str(&self.0)
    }
}

impl<'de> Deserialize<'de> for ClusterId {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        let s = String::deserialize(deserializer)?;
        Self::new(s).map_err(serde::de::Error::custom)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_labels_and_uids() {
        for ok in [
            "a",
            "east",
            "cluster-1",
            "0",
            "0a",
            "5b7a3e1c-2f4d-4c1e-9a9b-1d2e3f4a5b6c",
        ] {
            ClusterId::new(ok).unwrap();
        }
        ClusterId::new("a".repeat(63)).unwrap();
    }

    #[test]
    fn rejects_with_the_rule_broken() {
        let err = |s: &str| ClusterId::new(s).unwrap_err().source;
        assert_eq!(err(""), LabelError::Empty);
        assert_eq!(err(&"a".repeat(64)), LabelError::TooLong { len: 64 });
        assert_eq!(err("East"), LabelError::Uppercase { ch: 'E', index: 0 });
        assert_eq!(err("east.1"), LabelError::InvalidChar { ch: '.', index: 4 });
        assert_eq!(err("-east"), LabelError::Edge);
        assert_eq!(err("east-"), LabelError::Edge);
        let msg = ClusterId::new("East").unwrap_err().to_string();
        assert!(
            msg.contains("\"East\"") && msg.contains("uppercase"),
            "{msg}"
        );
    }

    #[test]
    fn serde_validates() {
        let id: ClusterId = serde_json::from_str("\"west\"").unwrap();
        assert_eq!(id.as_str(), "west");
        assert!(serde_json::from_str::<ClusterId>("\"We st\"").is_err());
    }
}
