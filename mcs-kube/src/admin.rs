//! The admin HTTP endpoint of the binaries (crate `mcs-cli`): `/metrics` (Prometheus text,
//! rendered by whatever recorder the binary installed), `/healthz` (alive) and `/readyz`
//! (200 when ready; otherwise 503 with the reason as the body); plus the signal handling and
//! client set-up they share. Nothing here installs a global subscriber or recorder, or
//! reads the command line: that is the binaries' business.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use tokio::net::TcpListener;

/// What `/readyz` reports.
pub trait Readiness: Send + Sync + 'static {
    /// `Ok` when ready; otherwise why not (the body of the 503 answer).
    fn check(&self) -> Result<(), String>;
}

/// A flag that is set once the process has synced.
impl Readiness for Arc<AtomicBool> {
    fn check(&self) -> Result<(), String> {
        if self.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err("not synced".to_owned())
        }
    }
}

/// What `/metrics` answers: the Prometheus text exposition of the process's metrics (for
/// example `PrometheusHandle::render` of `metrics-exporter-prometheus`).
pub trait RenderMetrics: Send + Sync + 'static {
    /// The metrics in the Prometheus text format.
    fn render(&self) -> String;
}

impl<F: Fn() -> String + Send + Sync + 'static> RenderMetrics for F {
    fn render(&self) -> String {
        self()
    }
}

/// Serves the admin endpoint on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    metrics: impl RenderMetrics,
    ready: impl Readiness,
    shutdown: impl Future<Output = ()>,
) {
    let ready: Arc<dyn Readiness> = Arc::new(ready);
    let metrics: Arc<dyn RenderMetrics> = Arc::new(metrics);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let metrics = Arc::clone(&metrics);
        let ready = Arc::clone(&ready);
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let response = respond(req.uri().path(), &*metrics, &*ready);
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "admin connection ended");
            }
        });
    }
}

/// Binds the admin address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

fn respond(
    path: &str,
    metrics: &dyn RenderMetrics,
    ready: &dyn Readiness,
) -> Response<Full<Bytes>> {
    let (status, body) = match path {
        "/healthz" | "/livez" => (StatusCode::OK, "ok\n".to_owned()),
        "/readyz" => match ready.check() {
            Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
            Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
        },
        "/metrics" => (StatusCode::OK, metrics.render()),
        _ => (StatusCode::NOT_FOUND, "not found\n".to_owned()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

/// The Lease a process renews in its own cluster to say it runs and whether it is ready
/// ([`heartbeat`]); `kubectl mcs check` reads it.
#[derive(Clone, Debug)]
#[non_exhaustive]
pub struct Heartbeat {
    /// The Lease's namespace (the agent's own, e.g. `mcs-system`).
    pub namespace: String,
    /// The Lease's name (e.g. [`AGENT_HEARTBEAT`]).
    pub name: String,
    /// Its `holderIdentity`: the cluster id.
    pub identity: String,
    /// `leaseDurationSeconds`: the Lease is renewed every third of it.
    pub duration: Duration,
}

/// The name of the agent's heartbeat Lease.
pub const AGENT_HEARTBEAT: &str = "mcs-agent";
/// Annotation of the heartbeat Lease: `true` while ready, else `false`.
pub const HEARTBEAT_READY: &str = "mcs.dev/ready";
/// Annotation of the heartbeat Lease: why the process is not ready (empty when it is).
pub const HEARTBEAT_REASON: &str = "mcs.dev/not-ready-reason";
/// The [`HEARTBEAT_REASON`] a process writes when it stops.
pub const HEARTBEAT_STOPPED: &str = "stopped";
/// How often [`heartbeat`] looks whether the process's readiness changed (a call of
/// [`Readiness::check`], no request): when it did, the Lease is renewed at once, so that
/// `kubectl mcs check` right after a (re)start or a failure does not read a stale state.
pub const READINESS_POLL: Duration = Duration::from_secs(1);

impl Heartbeat {
    /// The heartbeat `name` in `namespace`, held by `identity`, lasting 40 s.
    pub fn new(namespace: &str, name: &str, identity: &str) -> Self {
        Self {
            namespace: namespace.to_owned(),
            name: name.to_owned(),
            identity: identity.to_owned(),
            duration: Duration::from_secs(40),
        }
    }

    /// Sets the Lease duration (at least 1 s).
    #[must_use]
    pub fn duration(mut self, duration: Duration) -> Self {
        self.duration = duration.max(Duration::from_secs(1));
        self
    }
}

/// Renews `beat` through `client` every third of its duration with the readiness `ready`
/// reports (annotations [`HEARTBEAT_READY`] and [`HEARTBEAT_REASON`]), and at once when the
/// process becomes ready or stops being ready (looked at every [`READINESS_POLL`]), until
/// `shutdown` completes; then writes it once more as not ready, `stopped`. Failures are
/// logged when they start and end; they do not stop the heartbeat.
///
/// Every process of a cluster (the replicas, and an old and a new Pod during a rollout)
/// writes the same Lease. So that one stopping does not mark the others down, each watches
/// the Lease (list and watch of that one name) and renews at once when another wrote
/// `stopped`.
pub async fn heartbeat(
    client: kube::Client,
    beat: Heartbeat,
    ready: impl Readiness,
    shutdown: impl Future<Output = ()>,
) {
    use futures::StreamExt;
    use k8s_openapi::api::coordination::v1::{Lease, LeaseSpec};
    use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
    use kube::api::{Api, Patch, PatchParams};
    use kube::runtime::{WatchStreamExt, watcher};

    /// Whether a process wrote `lease` as it stopped.
    fn stopped(lease: &Lease) -> bool {
        lease
            .metadata
            .annotations
            .as_ref()
            .and_then(|a| a.get(HEARTBEAT_REASON))
            .is_some_and(|reason| reason == HEARTBEAT_STOPPED)
    }

    let leases: Api<Lease> = Api::namespaced(client, &beat.namespace);
    let apply = PatchParams::apply("mcs-heartbeat").force();
    let seconds = i32::try_from(beat.duration.as_secs().max(1)).unwrap_or(i32::MAX);
    let lease = |state: Result<(), String>| Lease {
        metadata: ObjectMeta {
            name: Some(beat.name.clone()),
            namespace: Some(beat.namespace.clone()),
            annotations: Some(
                [
                    (HEARTBEAT_READY.to_owned(), state.is_ok().to_string()),
                    (HEARTBEAT_REASON.to_owned(), state.err().unwrap_or_default()),
                ]
                .into(),
            ),
            ..Default::default()
        },
        spec: Some(LeaseSpec {
            holder_identity: Some(beat.identity.clone()),
            lease_duration_seconds: Some(seconds),
            renew_time: Some(MicroTime(k8s_openapi::jiff::Timestamp::now())),
            ..Default::default()
        }),
    };
    let period = (beat.duration / 3).max(Duration::from_millis(100));
    let mut tick = tokio::time::interval(period);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let poll_every = READINESS_POLL.min(period);
    let mut poll = tokio::time::interval_at(tokio::time::Instant::now() + poll_every, poll_every);
    poll.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    // The readiness last written (or tried).
    let mut written: Option<bool> = None;
    let mut shutdown = std::pin::pin!(shutdown);
    let mut others = std::pin::pin!(
        watcher::watcher(
            leases.clone(),
            watcher::Config::default().fields(&format!("metadata.name={}", beat.name)),
        )
        .default_backoff()
    );
    let mut failing = false;
    loop {
        tokio::select! {
            _ = tick.tick() => {}
            _ = poll.tick() => {
                if written == Some(ready.check().is_ok()) {
                    continue;
                }
            }
            () = &mut shutdown => break,
            seen = others.next() => match seen {
                Some(Ok(watcher::Event::Apply(lease) | watcher::Event::InitApply(lease)))
                    if stopped(&lease) => {}
                // This process's own renewals, and watch errors (retried with backoff).
                _ => continue,
            },
        }
        let state = ready.check();
        written = Some(state.is_ok());
        let result = leases
            .patch(&beat.name, &apply, &Patch::Apply(&lease(state)))
            .await;
        match result {
            Ok(_) if failing => {
                failing = false;
                tracing::info!(namespace = %beat.namespace, name = %beat.name, "heartbeat Lease renewed again");
            }
            Err(e) if !failing => {
                failing = true;
                tracing::warn!(namespace = %beat.namespace, name = %beat.name, error = %e, "cannot renew the heartbeat Lease (kubectl mcs check will report this process down)");
            }
            _ => {}
        }
    }
    let _ = leases
        .patch(
            &beat.name,
            &apply,
            &Patch::Apply(&lease(Err(HEARTBEAT_STOPPED.to_owned()))),
        )
        .await;
}

/// Resolves when the process gets SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    tracing::info!("shutting down");
}

/// Builds a kube client from an optional kubeconfig path and context (the in-cluster or
/// default configuration when both are absent).
pub async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> Result<kube::Client, ClientError> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                ClientError(format!("cannot read kubeconfig {}: {e}", path.display()))
            })?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| ClientError(format!("kubeconfig {}: {e}", path.display())))?
        }
        None if context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| ClientError(format!("default kubeconfig: {e}")))?,
        None => kube::Config::infer()
            .await
            .map_err(|e| ClientError(format!("no Kubernetes configuration: {e}")))?,
    };
    kube::Client::try_from(config)
        .map_err(|e| ClientError(format!("cannot build a Kubernetes client: {e}")))
}

/// A Kubernetes client could not be configured.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClientError(String);
