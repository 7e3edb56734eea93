//! The response future and the per-attempt bookkeeping (in-flight, latency, outcome).

use std::fmt;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::{Duration, Instant};

use http::Response;
use pin_project_lite::pin_project;
use tokio::time::Sleep;
use tower::BoxError;
use tracing::{Span, debug, debug_span};

use mcs_core::ClusterId;
use mcs_core::discovery::Endpoint;
use mcs_core::endpoints::{Outcome, Picked};

use crate::classify::{Classify, FailureKind};
use crate::error::{EndpointError, Error};
use crate::target::{EndpointMeta, TargetShared, now};

/// Which endpoint served a balanced response: put into the response's extensions.
///
/// A response is not an error, even one that counted against its endpoint (a 5xx by
/// default, see [`Classify`](crate::Classify)): [`Served::counted_as_failure`] says so, and
/// `Served`'s Display names the endpoint, its cluster and that verdict.
///
/// ```no_run
/// # fn f(response: http::Response<()>) {
/// if let Some(served) = response.extensions().get::<mcs_client::Served>() {
///     println!("{} in {} (tier {})", served.addr(), served.cluster(), served.tier());
///     if served.counted_as_failure() {
///         // "503 Service Unavailable from endpoint 10.1.0.7:9443 in cluster east
///         // (counted as an endpoint failure)"
///         eprintln!("{} from {served}", response.status());
///     }
/// }
/// # }
/// ```
#[derive(Clone, Debug)]
pub struct Served {
    meta: Arc<EndpointMeta>,
    tier: usize,
    attempts: u32,
    failure: bool,
}

impl fmt::Display for Served {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "endpoint {} in cluster {}",
            self.meta.endpoint.addr, self.meta.endpoint.cluster
        )?;
        if self.failure {
            f.write_str(" (counted as an endpoint failure)")?;
        }
        Ok(())
    }
}

impl Served {
    /// The endpoint's address.
    pub fn addr(&self) -> SocketAddr {
        self.meta.endpoint.addr
    }

    /// The cluster the endpoint runs in.
    pub fn cluster(&self) -> &ClusterId {
        &self.meta.endpoint.cluster
    }

    /// The endpoint as discovery reported it.
    pub fn endpoint(&self) -> &Endpoint {
        &self.meta.endpoint
    }

    /// The locality tier it was picked from (0 is the most preferred).
    pub fn tier(&self) -> usize {
        self.tier
    }

    /// How many attempts the request took (1 without retries).
    pub fn attempts(&self) -> u32 {
        self.attempts
    }

    /// Whether the response counted as a failure of its endpoint (for outlier ejection and
    /// the failure metric): by default a 5xx or a gRPC UNAVAILABLE (see
    /// [`Classify`](crate::Classify)).
    pub fn counted_as_failure(&self) -> bool {
        self.failure
    }
}

/// How an attempt's endpoint was chosen.
pub(crate) enum Pick {
    /// By the balancer: counted in flight, and the outcome is fed back.
    Balanced(Picked),
    /// By a retry that left the tiers the balancer kept offering (see `pick_for_retry`):
    /// outside the balancer's accounting.
    /// (Boxed to keep the common future small.)
    Direct(Box<(Endpoint, usize)>),
}

impl Pick {
    pub(crate) fn endpoint(&self) -> &Endpoint {
        match self {
            Self::Balanced(p) => p.endpoint(),
            Self::Direct(direct) => &direct.0,
        }
    }

    pub(crate) fn tier(&self) -> usize {
        match self {
            Self::Balanced(p) => p.tier(),
            Self::Direct(direct) => direct.1,
        }
    }

    /// Feeds the outcome back; returns whether it ejected the endpoint.
    fn complete(self, outcome: Outcome, latency: Duration, now: Instant) -> bool {
        match self {
            Self::Balanced(p) => p.complete(outcome, latency, now),
            Self::Direct(_) => false,
        }
    }
}

/// An endpoint a request was sent to, and its tier (see `pick_for_retry` in `service.rs`).
pub(crate) struct Tried {
    meta: Arc<EndpointMeta>,
    tier: usize,
}

impl Tried {
    pub(crate) fn endpoint(&self) -> &Endpoint {
        &self.meta.endpoint
    }

    pub(crate) fn tier(&self) -> usize {
        self.tier
    }
}

/// One attempt of a balanced request: holds the pick (counted in flight) until the
/// response head or an error arrives, then records the outcome and latency.
pub(crate) struct Attempt {
    picked: Pick,
    meta: Arc<EndpointMeta>,
    target: Arc<TargetShared>,
    started: Instant,
    attempts: u32,
    classify: Classify,
    timeout: Option<Duration>,
    span: Span,
}

impl fmt::Debug for Attempt {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Attempt")
            .field("service", &self.target.name)
            .field("endpoint", &self.meta.endpoint.addr)
            .field("attempts", &self.attempts)
            .finish_non_exhaustive()
    }
}

impl Attempt {
    pub(crate) fn new(
        picked: Pick,
        meta: Arc<EndpointMeta>,
        target: Arc<TargetShared>,
        started: Instant,
        attempts: u32,
        classify: Classify,
        timeout: Option<Duration>,
    ) -> Self {
        target.metrics.pick(picked.tier());
        // Cost when no subscriber wants it: one interest check; fields are formatted lazily.
        let span = debug_span!(
            "mcs.request",
            service = %target.name,
            endpoint = %meta.endpoint.addr,
            cluster = %meta.endpoint.cluster,
            tier = picked.tier(),
            attempt = attempts,
        );
        Self {
            span,
            picked,
            meta,
            target,
            started,
            attempts,
            classify,
            timeout,
        }
    }

    pub(crate) fn addr(&self) -> SocketAddr {
        self.meta.endpoint.addr
    }

    /// What a retry needs to know of this attempt: its endpoint and tier.
    pub(crate) fn tried(&self) -> Tried {
        Tried {
            meta: Arc::clone(&self.meta),
            tier: self.picked.tier(),
        }
    }

    /// The span of this attempt.
    pub(crate) fn span(&self) -> &Span {
        &self.span
    }

    /// A timer for this attempt, if a request timeout is configured.
    pub(crate) fn timer(&self) -> Option<Pin<Box<Sleep>>> {
        self.timeout.map(|t| Box::pin(tokio::time::sleep(t)))
    }

    /// Records the result. A response is returned with [`Served`] in its extensions; an
    /// error is returned as an [`EndpointError`] with its kind, so the caller can decide on
    /// a retry.
    pub(crate) fn finish<RB>(
        self,
        result: Result<Response<RB>, BoxError>,
    ) -> Result<Response<RB>, (BoxError, FailureKind)> {
        let now = now();
        let latency = now.saturating_duration_since(self.started);
        match result {
            Ok(mut response) => {
                let failure = self
                    .classify
                    .is_failure(response.status(), response.headers());
                let outcome = if failure {
                    self.meta.failure.increment(1);
                    Outcome::Failure
                } else {
                    self.meta.success.increment(1);
                    Outcome::Success
                };
                let tier = self.picked.tier();
                if self.picked.complete(outcome, latency, now) {
                    ejected(&self.meta, &self.target, now);
                }
                response.extensions_mut().insert(Served {
                    meta: self.meta,
                    tier,
                    attempts: self.attempts,
                    failure,
                });
                Ok(response)
            }
            Err(err) => {
                #[cfg(feature = "tls")]
                let err = crate::connect::explain_tls(err);
                let kind = FailureKind::of(&*err);
                self.meta.failure.increment(1);
                debug!(service = %self.target.name, endpoint = %self.meta.endpoint.addr,
                    cluster = %self.meta.endpoint.cluster, ?kind, error = %err, "request failed");
                if self.picked.complete(Outcome::Failure, latency, now) {
                    ejected(&self.meta, &self.target, now);
                }
                let err = EndpointError::new(
                    self.target.name.clone(),
                    self.meta.endpoint.addr,
                    self.meta.endpoint.cluster.clone(),
                    err,
                );
                Err((err.into(), kind))
            }
        }
    }

    /// Records a timeout and returns its error.
    pub(crate) fn timed_out(self) -> BoxError {
        let now = now();
        self.meta.failure.increment(1);
        if self.picked.complete(
            Outcome::Failure,
            now.saturating_duration_since(self.started),
            now,
        ) {
            ejected(&self.meta, &self.target, now);
        }
        Error::Timeout {
            service: self.target.name.clone(),
            endpoint: self.meta.endpoint.addr,
            cluster: self.meta.endpoint.cluster.clone(),
            after: self.timeout.unwrap_or_default(),
        }
        .into()
    }
}

/// Counts an ejection this attempt's outcome caused and refreshes the ejected gauge.
fn ejected(meta: &EndpointMeta, target: &TargetShared, now: Instant) {
    meta.ejections.increment(1);
    target.publish_ejected(now);
    debug!(service = %target.name, endpoint = %meta.endpoint.addr,
        cluster = %meta.endpoint.cluster, "endpoint ejected by outlier detection");
}

pub(crate) type BoxResponseFuture<RB> =
    Pin<Box<dyn Future<Output = Result<Response<RB>, BoxError>> + Send>>;

/// Called with the error of a failed attempt: either a future that retries elsewhere, or
/// the error back.
pub(crate) type RetryFn<RB> =
    Box<dyn FnOnce(BoxError, FailureKind) -> Result<BoxResponseFuture<RB>, BoxError> + Send>;

pin_project! {
    /// The future returned by [`Mcs`](crate::Mcs).
    ///
    /// Pass-through and balanced requests on a ready endpoint set are polled in place; only
    /// requests that wait for discovery or retry are boxed.
    pub struct ResponseFuture<F, RB> {
        #[pin]
        kind: Kind<F, RB>,
    }
}

pin_project! {
    #[project = KindProj]
    enum Kind<F, RB> {
        Passthrough { #[pin] fut: F },
        Failed { err: Option<BoxError> },
        Balanced {
            #[pin]
            fut: F,
            attempt: Option<Attempt>,
            timer: Option<Pin<Box<Sleep>>>,
            retry: Option<RetryFn<RB>>,
        },
        Boxed { fut: BoxResponseFuture<RB> },
    }
}

impl<F, RB> ResponseFuture<F, RB> {
    pub(crate) fn passthrough(fut: F) -> Self {
        Self {
            kind: Kind::Passthrough { fut },
        }
    }

    pub(crate) fn failed(err: impl Into<BoxError>) -> Self {
        Self {
            kind: Kind::Failed {
                err: Some(err.into()),
            },
        }
    }

    pub(crate) fn balanced(fut: F, attempt: Attempt, retry: Option<RetryFn<RB>>) -> Self {
        let timer = attempt.timer();
        Self {
            kind: Kind::Balanced {
                fut,
                attempt: Some(attempt),
                timer,
                retry,
            },
        }
    }

    pub(crate) fn boxed(fut: BoxResponseFuture<RB>) -> Self {
        Self {
            kind: Kind::Boxed { fut },
        }
    }
}

impl<F, RB> fmt::Debug for ResponseFuture<F, RB> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let kind = match &self.kind {
            Kind::Passthrough { .. } => "passthrough",
            Kind::Failed { .. } => "failed",
            Kind::Balanced { .. } => "balanced",
            Kind::Boxed { .. } => "waiting or retrying",
        };
        f.debug_struct("ResponseFuture")
            .field("kind", &kind)
            .finish()
    }
}

impl<F, E, RB> Future for ResponseFuture<F, RB>
where
    F: Future<Output = Result<Response<RB>, E>>,
    E: Into<BoxError>,
{
    type Output = Result<Response<RB>, BoxError>;

    fn poll(self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<Self::Output> {
        let mut this = self.project();
        loop {
            let next = match this.kind.as_mut().project() {
                KindProj::Passthrough { fut } => return fut.poll(cx).map_err(Into::into),
                KindProj::Failed { err } => {
                    return Poll::Ready(Err(err
                        .take()
                        .unwrap_or_else(|| "response future polled after completion".into())));
                }
                KindProj::Boxed { fut } => return fut.as_mut().poll(cx),
                KindProj::Balanced {
                    fut,
                    attempt,
                    timer,
                    retry,
                } => {
                    let polled = {
                        // The endpoint service's work (connecting, sending) runs in the
                        // attempt's span. Cost without a subscriber: one interest check.
                        let _entered = attempt.as_ref().map(|a| a.span().enter());
                        fut.poll(cx)
                    };
                    let result = match polled {
                        Poll::Ready(result) => result.map_err(Into::into),
                        Poll::Pending => {
                            if let Some(timer) = timer
                                && timer.as_mut().poll(cx).is_ready()
                                && let Some(attempt) = attempt.take()
                            {
                                return Poll::Ready(Err(attempt.timed_out()));
                            }
                            return Poll::Pending;
                        }
                    };
                    let Some(attempt) = attempt.take() else {
                        return Poll::Ready(Err("response future polled after completion".into()));
                    };
                    match attempt.finish(result) {
                        Ok(response) => return Poll::Ready(Ok(response)),
                        Err((err, kind)) => match retry.take() {
                            None => return Poll::Ready(Err(err)),
                            Some(retry) => match retry(err, kind) {
                                Ok(fut) => Kind::Boxed { fut },
                                Err(err) => return Poll::Ready(Err(err)),
                            },
                        },
                    }
                }
            };
            this.kind.set(next);
        }
    }
}
