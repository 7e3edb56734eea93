//! Placeholder: replaced by the merge benchmark.

fn main() {}
