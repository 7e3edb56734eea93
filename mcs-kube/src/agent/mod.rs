//! The MCS agent: one per member cluster (being built).
//!
//! - [`desired`]: the objects the agent wants in its own cluster, computed without I/O;
//! - [`index`]: state from watch events, re-lists applied as atomic resets.

pub mod desired;
pub mod index;
