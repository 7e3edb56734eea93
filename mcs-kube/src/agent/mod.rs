//! The MCS agent: one per member cluster (being built).
//!
//! - [`desired`]: the objects the agent wants in its own cluster, computed without I/O.

pub mod desired;
