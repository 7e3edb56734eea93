//! Settings and state that every service made by one layer shares.

use std::sync::Arc;
use std::time::Duration;

use crate::classify::Classify;
use crate::retry::Budget;
use crate::target::Registry;

/// Settings and state shared by every service of one layer.
pub(crate) struct Shared {
    pub(crate) registry: Arc<Registry>,
    pub(crate) resolution_timeout: Duration,
    pub(crate) fail_fast: Duration,
    pub(crate) request_timeout: Option<Duration>,
    pub(crate) classify: Classify,
    pub(crate) retry: Option<RetrySettings>,
}

/// The retry policy's limits and its budget.
pub(crate) struct RetrySettings {
    pub(crate) max_retries: u32,
    pub(crate) idempotent_on_close: bool,
    pub(crate) budget: Budget,
}
