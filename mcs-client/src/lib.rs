//! A tower layer that resolves `clusterset.local` names and balances every request in-process.
//!
//! This crate is being built; see the project README.
