//! Wiring only: sources feed facts into the state; the state says which services they
//! touched; kube-runtime's scheduler delays and de-duplicates the work (reconciles,
//! publications, retries, member checks); a backlog starts what is due, publications
//! first; plans go to the writer, records to the publisher, up to
//! [`AgentConfig::max_concurrent_writes`] of them at once and one per service, while new
//! facts keep coming in. Decisions live in `state`, `health`, `reconcile` and `desired`.

use std::collections::{BTreeMap, BTreeSet, HashMap, HashSet, VecDeque};
use std::future::Future;
use std::pin::Pin;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Instant;

use futures::future::BoxFuture;
use futures::stream::FuturesUnordered;
use futures::{FutureExt, StreamExt};
use kube::runtime::scheduler::{ScheduleRequest, Scheduler, scheduler};
use mcs_core::name::ServiceRef;
use tokio::sync::mpsc;
use tracing::Instrument;

use super::health::retry_backoff;
use super::index::Touched;
use super::publish::{self, PUBLISHING};
use super::reconcile;
use super::source::{self, Fact};
use super::state::{Mode, Settings, State};
use super::writer::{WriteError, Writer};
use super::{
    AgentConfig, AgentError, AgentHealth, AgentMetrics, GaugeValues, ResyncRequests, Topology,
};
use crate::hub::publish::Publisher;

/// Work the scheduler hands out.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
enum Due {
    /// Merge, plan and write one service.
    Reconcile(ServiceRef),
    /// Publish the agent's record of one service on the hub.
    Publish(ServiceRef),
    /// Judge member health (a Lease may have expired, a grace period ended).
    Members,
}

impl Due {
    /// Whether this work may run now: reconciles and member checks once every watch has
    /// listed, publications once the agent's own exports have.
    fn may_run(&self, synced: bool, can_publish: bool) -> bool {
        match self {
            Due::Publish(_) => can_publish,
            Due::Reconcile(_) | Due::Members => synced,
        }
    }

    /// Publications first: every other member waits for them, while a reconcile only
    /// affects this cluster. Then member checks (they may withdraw a dead member's
    /// endpoints), then reconciles in the order they became due.
    fn urgent(&self) -> bool {
        matches!(self, Due::Publish(_) | Due::Members)
    }
}

/// Work that is due, taken from the scheduler, not done yet: de-duplicated, urgent work
/// ([`Due::urgent`]) before the rest, so a burst of reconciles (a hundred members' imports
/// after a start) does not hold back the publication of a new local export.
#[derive(Debug, Default)]
struct Backlog {
    urgent: VecDeque<Due>,
    rest: VecDeque<Due>,
    queued: HashSet<Due>,
}

/// Pieces of work started before the agent looks at new facts again.
const BATCH: usize = 16;

/// Work whose writes are in flight: at most `limit` at once, and one per piece of work (a
/// service's next reconcile waits for its writes to be answered, as kube-runtime's
/// controller runs one reconcile per object). Work that comes due while its own writes are
/// in flight runs again once they are answered, with what the agent knows by then.
#[derive(Debug)]
struct InFlight {
    limit: usize,
    running: HashSet<Due>,
    again: HashSet<Due>,
}

impl InFlight {
    fn new(limit: usize) -> Self {
        Self {
            limit: limit.max(1),
            running: HashSet::new(),
            again: HashSet::new(),
        }
    }

    /// Whether another piece of work may start.
    fn has_room(&self) -> bool {
        self.running.len() < self.limit
    }

    /// Starts `due` if its own writes are not in flight; otherwise marks it to run again
    /// when they are answered, and returns false.
    fn start(&mut self, due: &Due) -> bool {
        if self.running.contains(due) {
            self.again.insert(due.clone());
            return false;
        }
        self.running.insert(due.clone());
        true
    }

    /// `due`'s writes were answered; returns whether it came due again meanwhile.
    fn finish(&mut self, due: &Due) -> bool {
        self.running.remove(due);
        self.again.remove(due)
    }
}

/// What a piece of work's writes came to, for [`finish`].
enum Done {
    /// A reconcile's writes, started during pass number `pass`.
    Reconcile {
        service: ServiceRef,
        pass: u64,
        result: Result<(), WriteError>,
    },
    /// A publication on the hub.
    Publish {
        service: ServiceRef,
        result: Result<(), String>,
    },
}

impl Done {
    fn due(&self) -> Due {
        match self {
            Done::Reconcile { service, .. } => Due::Reconcile(service.clone()),
            Done::Publish { service, .. } => Due::Publish(service.clone()),
        }
    }
}

impl Backlog {
    fn push(&mut self, due: Due) {
        if self.queued.insert(due.clone()) {
            if due.urgent() {
                self.urgent.push_back(due);
            } else {
                self.rest.push_back(due);
            }
        }
    }

    fn pop(&mut self) -> Option<Due> {
        let due = self.urgent.pop_front().or_else(|| self.rest.pop_front())?;
        self.queued.remove(&due);
        Some(due)
    }

    fn is_empty(&self) -> bool {
        self.queued.is_empty()
    }
}

/// Services a full pass still has to reconcile, and what to do when it is done.
struct Pass {
    /// Its number: only reconciles started during the pass count for it.
    number: u64,
    remaining: BTreeSet<ServiceRef>,
    /// The resync request it answers (`None`: the first pass after the first sync).
    resync: Option<u64>,
}

/// Runs the agent until `shutdown` completes.
pub(super) async fn run(
    config: AgentConfig,
    ready: Arc<AtomicBool>,
    health: AgentHealth,
    metrics: AgentMetrics,
    mut resync: ResyncRequests,
    shutdown: impl Future<Output = ()>,
) -> Result<(), AgentError> {
    let (tx, mut rx) = mpsc::channel::<Fact>(4096);
    let mut tasks = tokio::task::JoinSet::new();
    let (mode, local_client, peers, publisher) = match &config.topology {
        Topology::Mesh { members } => {
            let local = members
                .iter()
                .find(|m| m.id == config.local)
                .ok_or_else(|| {
                    AgentError::Config(format!(
                        "the members do not include the local cluster {}",
                        config.local
                    ))
                })?;
            for member in members {
                source::mesh::spawn(
                    &mut tasks,
                    &tx,
                    member,
                    config.probe_interval,
                    config.cluster_selection,
                );
            }
            let peers: Vec<_> = members.iter().map(|m| m.id.clone()).collect();
            (Mode::Mesh, local.client.clone(), peers, None)
        }
        Topology::Hub(_) if config.cluster_selection => {
            return Err(AgentError::Config(
                "cluster selection (KEP-5939) needs the mesh topology: hub members do not publish their ClusterProperties yet".to_owned(),
            ));
        }
        Topology::Hub(hub) => {
            source::local::spawn_exported(&mut tasks, &tx, &config.local, &hub.local);
            let members = source::hub::spawn(&mut tasks, &tx, &config.local, &hub.hub);
            let publisher = Publisher::new(hub.hub.clone(), &config.local, &config.field_manager);
            publish::spawn_lease(&mut tasks, &tx, &publisher, hub.lease_duration, members);
            (Mode::Hub, hub.local.clone(), Vec::new(), Some(publisher))
        }
    };
    source::local::spawn_own(&mut tasks, &tx, &config.local, &local_client);
    drop(tx);

    let mut state = State::new(
        Settings {
            local: config.local.clone(),
            mode,
            grace: config.unreachable_grace,
            allowed_namespaces: config.allowed_namespaces.clone(),
            cluster_selection: config.cluster_selection,
        },
        peers,
    );
    let writer = Arc::new(Writer::new(local_client, config.field_manager.clone()));
    let (schedule_tx, schedule_rx) = futures::channel::mpsc::unbounded::<ScheduleRequest<Due>>();
    let mut scheduler = std::pin::pin!(scheduler(schedule_rx));
    let schedule = |due: Due, at: Instant| {
        let _ = schedule_tx.unbounded_send(ScheduleRequest {
            message: due,
            run_at: at.into(),
        });
    };
    let mut attempts: HashMap<Due, Attempts> = HashMap::new();
    let mut in_flight = InFlight::new(config.max_concurrent_writes);
    let mut writes: FuturesUnordered<BoxFuture<'static, Done>> = FuturesUnordered::new();
    let mut passes = 0u64;
    // Writes the own cluster refused (403), by service: they make the agent not ready.
    let mut forbidden: BTreeMap<ServiceRef, String> = BTreeMap::new();
    let mut pass: Option<Pass> = None;
    let mut first_pass_done = false;
    // A resync requested that has not started yet (it starts once synced and idle).
    let mut resync_wanted: Option<u64> = None;
    let mut backlog = Backlog::default();
    let mut resync_timer =
        tokio::time::interval_at(tokio::time::Instant::now() + config.resync, config.resync);
    let mut metrics_timer = tokio::time::interval(config.metrics_refresh);
    let started = Instant::now();
    let mut shutdown = std::pin::pin!(shutdown);

    loop {
        let synced = state.synced();
        let can_publish = state.own_exports_synced();
        tokio::select! {
            biased;
            () = &mut shutdown => break,
            fact = rx.recv() => {
                let Some(fact) = fact else { break };
                let now = Instant::now();
                let mut changes = state.handle(fact, now);
                // Take everything already queued before working (coalesces bursts).
                while let Ok(fact) = rx.try_recv() {
                    let more = state.handle(fact, now);
                    changes.reconcile.extend(more.reconcile);
                    changes.publish.extend(more.publish);
                    changes.members |= more.members;
                    changes.hub_answering |= more.hub_answering;
                }
                if changes.hub_answering {
                    // Publications waiting out a backoff go now.
                    changes.publish.extend(state.own_exported());
                    attempts.retain(|due, _| !matches!(due, Due::Publish(_)));
                }
                if changes.members {
                    let (touched, next) = state.judge_members(now);
                    changes.reconcile.extend(touched);
                    if let Some(at) = next {
                        schedule(Due::Members, at);
                    }
                }
                for service in changes.reconcile {
                    schedule(Due::Reconcile(service), now);
                }
                if mode == Mode::Hub {
                    for service in changes.publish {
                        schedule(Due::Publish(service), now);
                    }
                }
            }
            _ = resync_timer.tick() => {
                let now = Instant::now();
                for service in state.all_services() {
                    schedule(Due::Reconcile(service), now);
                }
                if mode == Mode::Hub {
                    for service in state.own_exported() {
                        schedule(Due::Publish(service), now);
                    }
                }
            }
            // Only wakes the loop: the gauges are set below.
            _ = metrics_timer.tick() => {}
            Ok(()) = resync.requests.changed() => {
                resync_wanted = Some(*resync.requests.borrow_and_update());
            }
            due = next_due(scheduler.as_mut(), synced, can_publish) => {
                let Some(due) = due else { break };
                // Take everything else already due into the backlog.
                backlog.push(due);
                while let Some(Some(more)) =
                    next_due(scheduler.as_mut(), synced, can_publish).now_or_never()
                {
                    backlog.push(more);
                }
            }
            Some(done) = writes.next(), if !writes.is_empty() => {
                let due = done.due();
                finish(
                    done,
                    &mut state,
                    &metrics,
                    &mut attempts,
                    &mut forbidden,
                    &mut pass,
                    &schedule,
                );
                if in_flight.finish(&due) {
                    schedule(due, Instant::now());
                }
            }
            () = std::future::ready(()), if !backlog.is_empty() && in_flight.has_room() => {
                // One batch, urgent work first; then new facts get a look in.
                for _ in 0..BATCH {
                    if !in_flight.has_room() {
                        break;
                    }
                    let Some(due) = backlog.pop() else { break };
                    if !due.may_run(state.synced(), state.own_exports_synced()) {
                        // Held by the scheduler until it may.
                        schedule(due, Instant::now());
                        continue;
                    }
                    if due != Due::Members && !in_flight.start(&due) {
                        continue;
                    }
                    let current = pass.as_ref().map_or(0, |p| p.number);
                    match begin(
                        due.clone(),
                        &mut state,
                        &writer,
                        publisher.as_ref(),
                        &metrics,
                        current,
                        &schedule,
                    ) {
                        Some(write) => writes.push(write),
                        // Nothing to write (member checks run at once).
                        None => {
                            in_flight.finish(&due);
                        }
                    }
                }
            }
        }
        if state.synced() && pass.is_none() {
            if !first_pass_done {
                // The first full pass after the first sync: readiness waits for it.
                passes += 1;
                pass = Some(start_pass(&state, passes, None, &schedule));
            } else if let Some(id) = resync_wanted.take() {
                passes += 1;
                pass = Some(start_pass(&state, passes, Some(id), &schedule));
            }
        }
        let now = Instant::now();
        let finishing = pass.as_ref().is_some_and(|p| p.remaining.is_empty());
        let initial_done =
            first_pass_done || (finishing && pass.as_ref().is_some_and(|p| p.resync.is_none()));
        let reason = if !state.synced() || !initial_done {
            Some(
                state
                    .not_ready_reason(&forbidden, now, started)
                    .unwrap_or_else(|| "starting: the first reconcile has not run yet".to_owned()),
            )
        } else {
            state.not_ready_reason(&forbidden, now, started)
        };
        metrics.publish(&GaugeValues {
            services: state.merge.len(),
            reachable: state.reachable_members(now),
            hub_reachable: mode == Mode::Hub && !state.hub.down(),
            ready: reason.is_none(),
            members: state.member_reachability(now),
        });
        // Readiness first: whoever waits for the pass then reads it up to date.
        report_health(&config, &ready, &health, reason);
        if finishing && let Some(p) = pass.take() {
            match p.resync {
                Some(id) => {
                    resync.completed.send_replace(id);
                }
                None => first_pass_done = true,
            }
        }
    }
    tasks.abort_all();
    Ok(())
}

/// The next piece of work that is due and may run: reconciles and member checks once
/// synced, publications once the agent's own exports are listed.
async fn next_due<R>(
    scheduler: Pin<&mut Scheduler<Due, R>>,
    synced: bool,
    can_publish: bool,
) -> Option<Due>
where
    R: futures::Stream<Item = ScheduleRequest<Due>>,
{
    let mut ready = scheduler.hold_unless(move |due: &Due| due.may_run(synced, can_publish));
    ready.next().await
}

/// Schedules a full pass over every known service now. A service whose writes are in
/// flight runs again when they are answered ([`InFlight`]), and counts for the pass then.
fn start_pass(
    state: &State,
    number: u64,
    resync: Option<u64>,
    schedule: &impl Fn(Due, Instant),
) -> Pass {
    let now = Instant::now();
    let all: Touched = state.all_services();
    for service in &all {
        schedule(Due::Reconcile(service.clone()), now);
    }
    Pass {
        number,
        remaining: all,
        resync,
    }
}

/// The retries of one piece of work that keeps failing: how many, and the next delays.
struct Attempts {
    count: u32,
    delays: backon::ExponentialBackoff,
}

/// Schedules `due` again after the next delay of its backoff; returns the attempt number
/// and the delay.
fn retry(
    attempts: &mut HashMap<Due, Attempts>,
    due: Due,
    schedule: &impl Fn(Due, Instant),
) -> (u32, std::time::Duration) {
    let a = attempts.entry(due.clone()).or_insert_with(|| Attempts {
        count: 0,
        delays: retry_backoff(),
    });
    a.count += 1;
    let delay = a
        .delays
        .next()
        .unwrap_or(std::time::Duration::from_secs(32));
    schedule(due, Instant::now() + delay);
    (a.count, delay)
}

/// Starts one piece of work: judges the members at once, or plans a reconcile or a
/// publication from what the agent knows now and returns its writes, to run while the
/// agent goes on.
fn begin(
    due: Due,
    state: &mut State,
    writer: &Arc<Writer>,
    publisher: Option<&Publisher>,
    metrics: &AgentMetrics,
    pass: u64,
    schedule: &impl Fn(Due, Instant),
) -> Option<BoxFuture<'static, Done>> {
    let now = Instant::now();
    match due {
        Due::Members => {
            let (touched, next) = state.judge_members(now);
            for service in touched {
                schedule(Due::Reconcile(service), now);
            }
            if let Some(at) = next {
                schedule(Due::Members, at);
            }
            None
        }
        Due::Reconcile(service) => {
            // One span per reconcile, naming the service: the merge, the plan and the
            // writes (what the writer logs carries it).
            let span = tracing::debug_span!("reconcile", service = %service);
            let plan = span.in_scope(|| {
                state.update_merge(&service);
                reconcile::plan(&state.inputs_for(&service, now))
            });
            metrics.reconciled();
            let writer = Arc::clone(writer);
            Some(
                async move {
                    let result = writer.execute(&service, plan).await;
                    Done::Reconcile {
                        service,
                        pass,
                        result,
                    }
                }
                .instrument(span)
                .boxed(),
            )
        }
        Due::Publish(service) => {
            let publisher = publisher?.clone();
            let want = state.desired_record(&service);
            let have = state.published(&service).cloned();
            Some(
                async move {
                    let result = publisher
                        .publish(&service, want, have.as_ref())
                        .await
                        .map_err(|e| e.to_string());
                    Done::Publish { service, result }
                }
                .boxed(),
            )
        }
    }
}

/// Takes in what a piece of work's writes came to: retries what failed, says what was
/// refused, counts the reconcile for the pass it was started in.
fn finish(
    done: Done,
    state: &mut State,
    metrics: &AgentMetrics,
    attempts: &mut HashMap<Due, Attempts>,
    forbidden: &mut BTreeMap<ServiceRef, String>,
    pass: &mut Option<Pass>,
    schedule: &impl Fn(Due, Instant),
) {
    let now = Instant::now();
    match done {
        Done::Reconcile {
            service,
            pass: started_in,
            result,
        } => {
            if let Some(p) = pass.as_mut()
                && p.number == started_in
            {
                p.remaining.remove(&service);
            }
            match result {
                Ok(()) => {
                    attempts.remove(&Due::Reconcile(service.clone()));
                    forbidden.remove(&service);
                }
                Err(e) if e.is_namespace_terminating() => {
                    // The namespace started terminating before its watch said so: nothing is
                    // to be written there any more (the next plan for it is empty).
                    tracing::debug!(service = %service, error = %e, "namespace is being terminated; not writing into it");
                    attempts.remove(&Due::Reconcile(service.clone()));
                    forbidden.remove(&service);
                }
                Err(e) => {
                    metrics.failed();
                    let (n, delay) = retry(attempts, Due::Reconcile(service.clone()), schedule);
                    if e.is_forbidden() {
                        if !forbidden.contains_key(&service) {
                            tracing::error!(service = %service, error = %e, "the agent's own cluster refused a write (403): its identity lacks a permission of deploy/rbac/agent-local.yaml; not ready, retrying in {delay:?}");
                        }
                        forbidden.insert(service, e.to_string());
                    } else {
                        forbidden.remove(&service);
                        tracing::warn!(service = %service, error = %e, attempt = n, "reconcile failed; retrying in {delay:?}");
                    }
                }
            }
        }
        Done::Publish { service, result } => {
            let failed = result.is_err();
            if let Err(error) = &result {
                let (n, delay) = retry(attempts, Due::Publish(service.clone()), schedule);
                tracing::warn!(service = %service, error, attempt = n, "publishing to the hub failed; retrying in {delay:?}");
            } else {
                attempts.remove(&Due::Publish(service.clone()));
            }
            let changes = state.handle(Fact::HubWrite(PUBLISHING, result), now);
            for s in changes.reconcile {
                schedule(Due::Reconcile(s), now);
            }
            if failed {
                // The export's Ready condition says the hub cannot be reached.
                schedule(Due::Reconcile(service), now);
            }
        }
    }
}

/// Publishes readiness and its reason; logs when either changes.
fn report_health(
    config: &AgentConfig,
    ready: &AtomicBool,
    health: &AgentHealth,
    reason: Option<String>,
) {
    let cluster = &config.local;
    let now_ready = reason.is_none();
    let was_ready = ready.swap(now_ready, Ordering::AcqRel);
    let changed = health.set(reason.clone());
    match reason {
        None if !was_ready => {
            tracing::info!(cluster = %cluster, "agent synced and reconciled: ready")
        }
        Some(reason) if was_ready => tracing::error!(cluster = %cluster, reason, "agent not ready"),
        Some(reason) if changed => tracing::debug!(cluster = %cluster, reason, "agent not ready"),
        _ => {}
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn svc(name: &str) -> ServiceRef {
        ServiceRef::new("demo", name).unwrap()
    }

    #[test]
    fn the_backlog_puts_publications_and_member_checks_first_and_drops_duplicates() {
        let mut backlog = Backlog::default();
        for name in ["a", "b", "c"] {
            backlog.push(Due::Reconcile(svc(name)));
        }
        backlog.push(Due::Publish(svc("new")));
        backlog.push(Due::Reconcile(svc("a")));
        backlog.push(Due::Members);
        backlog.push(Due::Publish(svc("new")));
        let order: Vec<Due> = std::iter::from_fn(|| backlog.pop()).collect();
        assert_eq!(
            order,
            [
                Due::Publish(svc("new")),
                Due::Members,
                Due::Reconcile(svc("a")),
                Due::Reconcile(svc("b")),
                Due::Reconcile(svc("c")),
            ]
        );
        assert!(backlog.is_empty());
        // Done work may come back.
        backlog.push(Due::Reconcile(svc("a")));
        assert_eq!(backlog.pop(), Some(Due::Reconcile(svc("a"))));
    }

    /// Up to the limit at once, one per service; a service that comes due while its writes
    /// are in flight (any number of times) runs once more after they are answered, and
    /// not again after that.
    #[test]
    fn writes_in_flight_are_bounded_one_per_service_and_rerun_once_when_due_meanwhile() {
        let mut in_flight = InFlight::new(2);
        let (a, b, c) = (
            Due::Reconcile(svc("a")),
            Due::Reconcile(svc("b")),
            Due::Publish(svc("a")),
        );
        assert!(in_flight.has_room());
        assert!(in_flight.start(&a));
        assert!(!in_flight.start(&a), "a's writes are in flight");
        assert!(!in_flight.start(&a));
        assert!(in_flight.has_room(), "a waiting does not take room");
        assert!(
            in_flight.start(&c),
            "a publication is other work than a reconcile"
        );
        assert!(!in_flight.has_room());

        assert!(in_flight.finish(&a), "a came due meanwhile: it runs again");
        assert!(in_flight.has_room());
        assert!(in_flight.start(&a));
        assert!(!in_flight.finish(&a), "not due again since it started");
        assert!(!in_flight.finish(&c));
        assert!(in_flight.start(&b));
        assert!(!in_flight.finish(&b));
        assert!(in_flight.has_room());

        // A limit of zero is one.
        let mut one = InFlight::new(0);
        assert!(one.start(&a));
        assert!(!one.has_room());
    }
}
