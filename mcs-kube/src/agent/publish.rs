//! The hub topology's writes, as the agent drives them: records through
//! [`crate::hub::publish::Publisher`], and its Lease renewed every third of its duration.

use std::time::Duration;

use super::source::{Fact, Tx};
use crate::hub::publish::Publisher;

/// What `Fact::HubWrite` calls a record write.
pub(crate) const PUBLISHING: &str = "publishing to the hub";
/// What `Fact::HubWrite` calls a Lease renewal.
pub(crate) const RENEWAL: &str = "Lease renewal on the hub";

/// Renews the agent's Lease on the hub every third of its duration, and reports each
/// result. The duration is `floor`, or longer in a large set
/// ([`crate::hub::lease_duration_for`], with the number of members `members` says).
pub(crate) fn spawn_lease(
    tasks: &mut tokio::task::JoinSet<()>,
    tx: &Tx,
    publisher: &Publisher,
    floor: Duration,
    members: tokio::sync::watch::Receiver<usize>,
) {
    let (tx, publisher) = (tx.clone(), publisher.clone());
    tasks.spawn(async move {
        loop {
            let duration = crate::hub::lease_duration_for(*members.borrow(), floor);
            let result = publisher
                .renew_lease(duration)
                .await
                .map_err(|e| e.to_string());
            if tx.send(Fact::HubWrite(RENEWAL, result)).await.is_err() {
                return;
            }
            tokio::time::sleep((duration / 3).max(Duration::from_millis(100))).await;
        }
    });
}
