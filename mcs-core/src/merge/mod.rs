//! The merge and conflict engine (being built).
