//! Health decisions, pure and tested: when a member counts as failing and when its
//! endpoints are removed, when to look again, how long to wait before retrying a write,
//! and why the agent is not ready. Time is passed in.

use std::collections::BTreeMap;
use std::time::{Duration, Instant};

use mcs_core::name::ServiceRef;

/// What the agent knows of one member's health.
#[derive(Debug, Default)]
pub(crate) struct MemberHealth {
    /// Since when the member's watches fail (mesh: its API server).
    pub(crate) watch_failing_since: Option<Instant>,
    /// Since when the member's probe fails (mesh).
    pub(crate) probe_failing_since: Option<Instant>,
    /// The member's Lease on the hub, as this agent last saw it renewed (hub).
    pub(crate) lease: Option<LeaseSeen>,
    /// Its endpoints were removed after the grace period; they come back when it recovers.
    pub(crate) removed: bool,
    /// The last error of each failing watch (by kind), and whether it was a 403.
    pub(crate) watch_errors: BTreeMap<&'static str, (String, bool)>,
}

/// A member's Lease as this agent saw it. Renewals are timed by this agent's clock when it
/// sees `renew_time` change, so clock skew between members does not matter (the node
/// lifecycle controller does the same with node Leases).
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct LeaseSeen {
    /// The Lease's `spec.renewTime`, as written.
    pub(crate) renew_time: Option<String>,
    /// When this agent saw that value first.
    pub(crate) seen_at: Instant,
    /// `spec.leaseDurationSeconds`.
    pub(crate) duration: Duration,
}

impl LeaseSeen {
    /// The Lease after an update to `renew_time` and `duration` seen at `now`: a new
    /// renewal restarts the clock, the same one does not.
    pub(crate) fn update(
        previous: Option<&LeaseSeen>,
        renew_time: Option<String>,
        duration: Duration,
        now: Instant,
    ) -> LeaseSeen {
        match previous {
            Some(p) if p.renew_time == renew_time => LeaseSeen {
                duration,
                ..p.clone()
            },
            _ => LeaseSeen {
                renew_time,
                seen_at: now,
                duration,
            },
        }
    }

    /// When the Lease expires unless renewed.
    pub(crate) fn expires_at(&self) -> Instant {
        self.seen_at + self.duration
    }
}

impl MemberHealth {
    /// Since when the member counts as failing at `now`: its watches or probe fail, or its
    /// Lease has expired. While the hub itself is unreachable (`hub_down`) Leases cannot be
    /// seen, so they do not count: members keep their last known state.
    pub(crate) fn failing_since(&self, now: Instant, hub_down: bool) -> Option<Instant> {
        let lease = self
            .lease
            .as_ref()
            .filter(|_| !hub_down)
            .map(LeaseSeen::expires_at)
            .filter(|expiry| *expiry <= now);
        [self.watch_failing_since, self.probe_failing_since, lease]
            .into_iter()
            .flatten()
            .min()
    }
}

/// What to do about a member at `now`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Verdict {
    /// Nothing changes.
    Keep,
    /// Failing for longer than the grace period: remove its endpoints.
    Remove,
    /// It was removed and is healthy again: take its endpoints back.
    Restore,
}

/// What to do about a member at `now`, given the grace period.
pub(crate) fn judge(
    health: &MemberHealth,
    now: Instant,
    grace: Duration,
    hub_down: bool,
) -> Verdict {
    match health.failing_since(now, hub_down) {
        Some(since) if !health.removed && now.saturating_duration_since(since) >= grace => {
            Verdict::Remove
        }
        None if health.removed => Verdict::Restore,
        _ => Verdict::Keep,
    }
}

/// When [`judge`] may give another answer without new facts: the Lease expiring, or the
/// grace period of a failing member ending.
pub(crate) fn next_check(
    health: &MemberHealth,
    now: Instant,
    grace: Duration,
    hub_down: bool,
) -> Option<Instant> {
    if health.removed {
        return None;
    }
    match health.failing_since(now, hub_down) {
        Some(since) => Some(since + grace),
        None => health
            .lease
            .as_ref()
            .filter(|_| !hub_down)
            .map(LeaseSeen::expires_at),
    }
}

/// The delays before the retries of a write that keeps failing: from 500 ms, doubling, at
/// most 32 s, each with a random jitter of up to its own length (so that agents, and the
/// services of one agent, that failed together do not all retry together).
pub(crate) fn retry_backoff() -> backon::ExponentialBackoff {
    use backon::BackoffBuilder;
    backon::ExponentialBuilder::default()
        .with_min_delay(Duration::from_millis(500))
        .with_max_delay(Duration::from_secs(32))
        .with_factor(2.0)
        .with_jitter()
        .without_max_times()
        .build()
}

/// The hub's health, as the agent's watches and writes there see it.
#[derive(Debug, Default)]
pub(crate) struct HubHealth {
    /// The last error of each failing watch or write on the hub.
    pub(crate) errors: BTreeMap<&'static str, String>,
    /// Since when something on the hub fails.
    pub(crate) failing_since: Option<Instant>,
}

impl HubHealth {
    /// Records a failure of `what` at `now`.
    pub(crate) fn fail(&mut self, what: &'static str, error: String, now: Instant) {
        self.errors.insert(what, error);
        self.failing_since.get_or_insert(now);
    }

    /// Records that `what` works again: `None` if it was not failing, else whether the hub
    /// as a whole recovered.
    pub(crate) fn recover(&mut self, what: &'static str) -> Option<bool> {
        self.errors.remove(what)?;
        if self.errors.is_empty() {
            self.failing_since = None;
            return Some(true);
        }
        Some(false)
    }

    /// Whether the hub is unreachable now.
    pub(crate) fn down(&self) -> bool {
        self.failing_since.is_some()
    }
}

/// Everything that makes the agent not ready.
#[derive(Debug, Default)]
pub(crate) struct NotReady<'a> {
    /// Writes its own cluster refused (403), by service.
    pub(crate) forbidden_writes: Option<&'a BTreeMap<ServiceRef, String>>,
    /// Watches its own cluster refuses (403): kind and error.
    pub(crate) forbidden_watches: Vec<(&'static str, &'a str)>,
    /// Its own cluster's id, for messages.
    pub(crate) cluster: &'a str,
    /// First lists not done yet, described (e.g. `ServiceExport in west (list: timeout,
    /// failing for 12s)`).
    pub(crate) waiting: Vec<String>,
    /// How long the agent has been running without being synced (when `waiting` is not
    /// empty).
    pub(crate) unsynced_for: Duration,
    /// The hub, when it is unreachable: the errors by what failed.
    pub(crate) hub_errors: Option<&'a BTreeMap<&'static str, String>>,
}

/// Why the agent is not ready, or `None` when it is.
pub(crate) fn not_ready_reason(n: &NotReady<'_>) -> Option<String> {
    let mut reasons = Vec::new();
    if let Some(forbidden) = n.forbidden_writes
        && let Some((service, error)) = forbidden.iter().next()
    {
        let more = match forbidden.len() - 1 {
            0 => String::new(),
            more => format!(" (and {more} more service(s))"),
        };
        reasons.push(format!(
            "its own cluster refuses a write for {service}{more}: {error}"
        ));
    }
    for (kind, error) in &n.forbidden_watches {
        reasons.push(format!(
            "its own cluster {} refuses to let it read {kind}: {error}",
            n.cluster
        ));
    }
    if let Some(errors) = n.hub_errors.filter(|e| !e.is_empty()) {
        let list: Vec<String> = errors
            .iter()
            .map(|(what, e)| format!("{what}: {e}"))
            .collect();
        reasons.push(format!(
            "the hub is unreachable ({}); imports are kept as last known",
            list.join("; ")
        ));
    }
    if !n.waiting.is_empty() {
        reasons.push(format!(
            "not synced for {}: waiting for the first list of {}",
            for_human(n.unsynced_for),
            n.waiting.join(", ")
        ));
    }
    (!reasons.is_empty()).then(|| reasons.join("; "))
}

/// A duration for people: `250ms`, `12s`, `3m4s`, `2h5m`.
pub(crate) fn for_human(d: Duration) -> String {
    let secs = d.as_secs();
    match secs {
        0 => format!("{}ms", d.as_millis()),
        1..60 => format!("{secs}s"),
        60..3600 => format!("{}m{}s", secs / 60, secs % 60),
        _ => format!("{}h{}m", secs / 3600, secs % 3600 / 60),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const GRACE: Duration = Duration::from_secs(60);

    fn lease(seen_at: Instant, secs: u64) -> LeaseSeen {
        LeaseSeen {
            renew_time: Some("t1".into()),
            seen_at,
            duration: Duration::from_secs(secs),
        }
    }

    #[test]
    fn a_member_is_removed_after_the_grace_period_and_restored() {
        let t0 = Instant::now();
        let mut h = MemberHealth {
            watch_failing_since: Some(t0),
            ..MemberHealth::default()
        };
        assert_eq!(judge(&h, t0 + GRACE / 2, GRACE, false), Verdict::Keep);
        assert_eq!(next_check(&h, t0, GRACE, false), Some(t0 + GRACE));
        assert_eq!(judge(&h, t0 + GRACE, GRACE, false), Verdict::Remove);
        h.removed = true;
        assert_eq!(judge(&h, t0 + 2 * GRACE, GRACE, false), Verdict::Keep);
        assert_eq!(next_check(&h, t0, GRACE, false), None);
        h.watch_failing_since = None;
        assert_eq!(judge(&h, t0 + 2 * GRACE, GRACE, false), Verdict::Restore);
    }

    #[test]
    fn probe_and_watch_failures_count_from_the_earliest() {
        let t0 = Instant::now();
        let h = MemberHealth {
            watch_failing_since: Some(t0 + Duration::from_secs(10)),
            probe_failing_since: Some(t0),
            ..MemberHealth::default()
        };
        assert_eq!(h.failing_since(t0, false), Some(t0));
    }

    #[test]
    fn an_expired_lease_fails_the_member_unless_the_hub_is_down() {
        let t0 = Instant::now();
        let h = MemberHealth {
            lease: Some(lease(t0, 40)),
            ..MemberHealth::default()
        };
        let expiry = t0 + Duration::from_secs(40);
        assert_eq!(h.failing_since(t0 + Duration::from_secs(39), false), None);
        assert_eq!(
            next_check(&h, t0, GRACE, false),
            Some(expiry),
            "look again at expiry"
        );
        assert_eq!(h.failing_since(expiry, false), Some(expiry));
        assert_eq!(judge(&h, expiry + GRACE, GRACE, false), Verdict::Remove);
        // Nothing is removed because of a hub outage.
        assert_eq!(h.failing_since(expiry + GRACE, true), None);
        assert_eq!(judge(&h, expiry + GRACE, GRACE, true), Verdict::Keep);
        assert_eq!(next_check(&h, expiry + GRACE, GRACE, true), None);
    }

    #[test]
    fn a_lease_renewal_restarts_the_clock_and_a_repeat_does_not() {
        let t0 = Instant::now();
        let first = LeaseSeen::update(None, Some("t1".into()), Duration::from_secs(40), t0);
        assert_eq!(first.seen_at, t0);
        let later = t0 + Duration::from_secs(30);
        let same = LeaseSeen::update(
            Some(&first),
            Some("t1".into()),
            Duration::from_secs(40),
            later,
        );
        assert_eq!(same.seen_at, t0, "the same renewTime is not a renewal");
        let renewed = LeaseSeen::update(
            Some(&first),
            Some("t2".into()),
            Duration::from_secs(40),
            later,
        );
        assert_eq!(renewed.expires_at(), later + Duration::from_secs(40));
    }

    /// Each delay is its step (500 ms, doubling, capped at 32 s) plus a jitter below the
    /// step; two sequences differ (the jitter is seeded per sequence).
    #[test]
    fn retries_back_off_to_a_cap_with_jitter() {
        let steps = [
            500, 1_000, 2_000, 4_000, 8_000, 16_000, 32_000, 32_000, 32_000,
        ];
        let first: Vec<Duration> = retry_backoff().take(steps.len()).collect();
        for (delay, step) in first.iter().zip(steps) {
            let step = Duration::from_millis(step);
            assert!(
                *delay >= step && *delay < step * 2,
                "{delay:?} not in [{step:?}, 2 x {step:?})"
            );
        }
        let others: Vec<Vec<Duration>> = (0..4)
            .map(|_| retry_backoff().take(steps.len()).collect())
            .collect();
        assert!(
            others.iter().any(|o| *o != first),
            "five sequences, all with the same jitter"
        );
    }

    #[test]
    fn the_hub_recovers_when_every_failure_has() {
        let t0 = Instant::now();
        let mut hub = HubHealth::default();
        hub.fail("MemberExport", "connection refused".into(), t0);
        hub.fail(
            "Lease renewal",
            "connection refused".into(),
            t0 + Duration::from_secs(1),
        );
        assert_eq!(hub.failing_since, Some(t0));
        assert_eq!(hub.recover("MemberExport"), Some(false));
        assert!(hub.down());
        assert_eq!(hub.recover("Lease renewal"), Some(true));
        assert!(!hub.down());
        assert_eq!(hub.recover("Lease renewal"), None, "was not failing");
    }

    #[test]
    fn durations_read_well() {
        assert_eq!(for_human(Duration::from_millis(250)), "250ms");
        assert_eq!(for_human(Duration::from_secs(12)), "12s");
        assert_eq!(for_human(Duration::from_secs(184)), "3m4s");
        assert_eq!(for_human(Duration::from_secs(7500)), "2h5m");
    }

    #[test]
    fn not_ready_reasons_name_the_cause() {
        assert_eq!(not_ready_reason(&NotReady::default()), None);
        let forbidden = BTreeMap::from([
            (
                ServiceRef::new("loyalty", "accrual").unwrap(),
                "forbidden: patch".to_owned(),
            ),
            (
                ServiceRef::new("loyalty", "points").unwrap(),
                "forbidden: patch".to_owned(),
            ),
        ]);
        let hub = BTreeMap::from([("MemberExport", "connection refused".to_owned())]);
        let reason = not_ready_reason(&NotReady {
            forbidden_writes: Some(&forbidden),
            forbidden_watches: vec![("Namespace", "forbidden: list")],
            cluster: "east",
            waiting: vec!["ServiceExport in west (list: timeout, failing for 12s)".into()],
            unsynced_for: Duration::from_secs(75),
            hub_errors: Some(&hub),
        })
        .unwrap();
        assert!(
            reason.contains("refuses a write for loyalty/accrual (and 1 more service(s))"),
            "{reason}"
        );
        assert!(
            reason.contains("its own cluster east refuses to let it read Namespace"),
            "{reason}"
        );
        assert!(
            reason.contains("the hub is unreachable (MemberExport: connection refused)"),
            "{reason}"
        );
        assert!(
            reason.contains(
                "not synced for 1m15s: waiting for the first list of ServiceExport in west (list: timeout, failing for 12s)"
            ),
            "{reason}"
        );
    }
}
