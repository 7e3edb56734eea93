//! Placeholder: replaced by the endpoint_selection benchmark.

fn main() {}
