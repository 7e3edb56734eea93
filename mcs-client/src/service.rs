//! [`Mcs`]: the balancing service.

use std::fmt;
use std::net::SocketAddr;
use std::sync::Arc;
use std::task::{Context, Poll};
use std::time::Instant;

use http::header::HOST;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{HeaderValue, Method, Request, Response, Uri, Version};
use tower::{BoxError, Service, ServiceExt};
use tracing::trace;

use mcs_core::discovery::Endpoint;
use mcs_core::endpoints::{PickContext, PickError, Picked};

use crate::classify::FailureKind;
use crate::error::Error;
use crate::future::{Attempt, BoxResponseFuture, Pick, ResponseFuture, RetryFn};
use crate::layer::Shared;
use crate::retry::ReplayBody;
use crate::target::{Route, Routing, TargetShared, now};

/// The service made by [`McsLayer`](crate::McsLayer): balances requests to ClusterSet
/// services over the wrapped service `S`, and passes every other request through.
///
/// `Mcs` is `Clone` (clones share discovery and endpoint state) and needs no `Buffer`.
/// `poll_ready` is the inner service's. A request whose service already has an endpoint
/// set is picked, rewritten and handed to the inner service inside `call`; only the first
/// request to a service (waiting for its first resolution) and requests to a service that
/// has just lost all endpoints wait, up to the configured limits.
pub struct Mcs<S, R = crate::NoRetry> {
    inner: S,
    shared: Arc<Shared>,
    replay: Option<R>,
}

impl<S, R> Mcs<S, R> {
    pub(crate) fn new(inner: S, shared: Arc<Shared>, replay: Option<R>) -> Self {
        Self {
            inner,
            shared,
            replay,
        }
    }

    /// The wrapped service.
    pub fn inner(&self) -> &S {
        &self.inner
    }
}

impl<S: Clone, R: Clone> Clone for Mcs<S, R> {
    fn clone(&self) -> Self {
        Self {
            inner: self.inner.clone(),
            shared: Arc::clone(&self.shared),
            replay: self.replay.clone(),
        }
    }
}

impl<S: fmt::Debug, R> fmt::Debug for Mcs<S, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mcs")
            .field("inner", &self.inner)
            .finish_non_exhaustive()
    }
}

impl<S, B, R, RB> Service<Request<B>> for Mcs<S, R>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Send + 'static,
    RB: Send + 'static,
    R: ReplayBody<B>,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = ResponseFuture<S::Future, RB>;

    fn poll_ready(&mut self, cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        self.inner.poll_ready(cx).map_err(Into::into)
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let route = match route(&self.shared, &req) {
            Routing::Passthrough => return ResponseFuture::passthrough(self.inner.call(req)),
            Routing::Invalid(err) => return ResponseFuture::failed(err),
            Routing::Target(route) => route,
        };
        let now = now();
        route.target.touch(now);
        match route
            .target
            .balancer
            .pick(PickContext::new(fastrand::u64(..), now))
        {
            Ok(picked) => {
                route.target.picked();
                dispatch(
                    &mut self.inner,
                    &self.shared,
                    self.replay.as_ref(),
                    &route,
                    req,
                    picked,
                    now,
                )
            }
            Err(PickError::DoesNotExist) => ResponseFuture::failed(Error::DoesNotExist {
                service: route.target.name.clone(),
            }),
            Err(_) => {
                // Not resolved yet, or no endpoints: wait (bounded) on the ready service.
                let mut svc = self.inner.clone();
                std::mem::swap(&mut svc, &mut self.inner);
                let shared = Arc::clone(&self.shared);
                let replay = self.replay.clone();
                ResponseFuture::boxed(Box::pin(async move {
                    let picked = wait_for_pick(&shared, &route.target, now).await?;
                    route.target.picked();
                    dispatch(
                        &mut svc,
                        &shared,
                        replay.as_ref(),
                        &route,
                        req,
                        picked,
                        crate::target::now(),
                    )
                    .await
                }))
            }
        }
    }
}

/// Finds the target of a request from its URI authority, or its `Host` header.
fn route<B>(shared: &Shared, req: &Request<B>) -> Routing {
    let authority = match req.uri().authority() {
        Some(authority) => authority.as_str(),
        None => match req.headers().get(HOST).and_then(|h| h.to_str().ok()) {
            Some(host) => host,
            None => return Routing::Passthrough,
        },
    };
    match host_port(authority) {
        Some((host, port)) => {
            let port = port.unwrap_or_else(|| default_port(req.uri().scheme()));
            shared.registry.route(host, port, authority)
        }
        None => Routing::Passthrough,
    }
}

/// Host and port of an authority (`[user@]host[:port]`) in one backward scan each.
/// `None` for an IPv6 literal (never under the zone) or a malformed port.
///
/// Cost: this replaces `Authority::host` and `Authority::port_u16`, which scan the string
/// several times.
fn host_port(authority: &str) -> Option<(&str, Option<u16>)> {
    let host_port = authority.rsplit_once('@').map_or(authority, |(_, hp)| hp);
    if host_port.starts_with('[') {
        return None;
    }
    match host_port.rfind(':') {
        Some(i) => Some((&host_port[..i], Some(host_port[i + 1..].parse().ok()?))),
        None => Some((host_port, None)),
    }
}

fn default_port(scheme: Option<&Scheme>) -> u16 {
    if scheme == Some(&Scheme::HTTPS) {
        443
    } else {
        80
    }
}

/// Waits, within the configured limits, until a pick succeeds.
async fn wait_for_pick(
    shared: &Shared,
    target: &TargetShared,
    started: Instant,
) -> Result<Picked, Error> {
    let mut changes = target.subscribe();
    loop {
        let now = now();
        let deadline = match target
            .balancer
            .pick(PickContext::new(fastrand::u64(..), now))
        {
            Ok(picked) => return Ok(picked),
            Err(PickError::DoesNotExist) => {
                return Err(Error::DoesNotExist {
                    service: target.name.clone(),
                });
            }
            Err(PickError::NotResolved) => {
                let deadline = started + shared.resolution_timeout;
                if now >= deadline {
                    return Err(Error::Resolve {
                        service: target.name.clone(),
                        waited: now.saturating_duration_since(started),
                        cause: target
                            .last_error()
                            .unwrap_or_else(|| "the resolver has not answered".to_owned()),
                    });
                }
                deadline
            }
            Err(_) => {
                let since = target.empty_since(now);
                let deadline = since + shared.fail_fast;
                if now >= deadline {
                    return Err(Error::NoEndpoints {
                        service: target.name.clone(),
                        empty_for: now.saturating_duration_since(since),
                    });
                }
                deadline
            }
        };
        // Wake on any discovery change, or at the deadline to report the error.
        let _ = tokio::time::timeout_at(deadline.into(), changes.changed()).await;
    }
}

/// Rewrites the request to the picked endpoint and sends it on `svc` (which must be ready).
fn dispatch<S, B, R, RB>(
    svc: &mut S,
    shared: &Arc<Shared>,
    replay: Option<&R>,
    route: &Route,
    mut req: Request<B>,
    picked: Picked,
    now: Instant,
) -> ResponseFuture<S::Future, RB>
where
    S: Service<Request<B>, Response = Response<RB>> + Clone + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Send + 'static,
    RB: Send + 'static,
    R: ReplayBody<B>,
{
    let attempt = Attempt::new(
        Pick::Balanced(picked),
        Arc::clone(&route.target),
        now,
        1,
        shared.classify,
        shared.request_timeout,
    );
    let retry = match (&shared.retry, replay) {
        (Some(settings), Some(replay)) if settings.max_retries > 0 && replay.enabled() => {
            settings.budget.deposit(now);
            copy_request(&req, replay).map(|copy| {
                retry_fn(RetryState {
                    svc: svc.clone(),
                    shared: Arc::clone(shared),
                    replay: replay.clone(),
                    route: route.clone(),
                    method: req.method().clone(),
                    next: Some(copy),
                    tried: vec![attempt.addr()],
                    tried_tiers: vec![attempt.tier()],
                    retries: 0,
                })
            })
        }
        _ => None,
    };
    if let Err(err) = rewrite(
        &mut req,
        &attempt.meta().authority,
        route.host_header.as_ref(),
    ) {
        return ResponseFuture::failed(err);
    }
    trace!(service = %route.target.name, endpoint = %attempt.addr(), "dispatch");
    let fut = {
        let _entered = attempt.span().enter();
        svc.call(req)
    };
    ResponseFuture::balanced(fut, attempt, retry)
}

/// Points the request at `authority`, keeping the original host in `Host` (HTTP/1).
///
/// For HTTP/2 no `Host` is added: RFC 9113 section 8.3.1 forbids a `Host` that differs from
/// `:authority`, and hyper derives `:authority` from the URI, so HTTP/2 requests carry the
/// endpoint address there.
fn rewrite<B>(
    req: &mut Request<B>,
    authority: &Authority,
    host: Option<&HeaderValue>,
) -> Result<(), BoxError> {
    let mut parts = std::mem::take(req.uri_mut()).into_parts();
    parts.authority = Some(authority.clone());
    if parts.scheme.is_none() {
        parts.scheme = Some(Scheme::HTTP);
    }
    if parts.path_and_query.is_none() {
        parts.path_and_query = Some(PathAndQuery::from_static("/"));
    }
    *req.uri_mut() = Uri::from_parts(parts)?;
    if req.version() != Version::HTTP_2
        && let Some(host) = host
    {
        req.headers_mut()
            .entry(HOST)
            .or_insert_with(|| host.clone());
    }
    Ok(())
}

/// A copy of the request (before rewriting) for a retry, if its body can be replayed.
fn copy_request<B, R: ReplayBody<B>>(req: &Request<B>, replay: &R) -> Option<Request<B>> {
    let body = replay.replay(req.body())?;
    let mut copy = Request::new(body);
    *copy.method_mut() = req.method().clone();
    *copy.uri_mut() = req.uri().clone();
    *copy.version_mut() = req.version();
    *copy.headers_mut() = req.headers().clone();
    *copy.extensions_mut() = req.extensions().clone();
    Some(copy)
}

struct RetryState<S, B, R> {
    svc: S,
    shared: Arc<Shared>,
    replay: R,
    route: Route,
    method: Method,
    /// The request for the next attempt, if another is allowed and the body replays.
    next: Option<Request<B>>,
    tried: Vec<SocketAddr>,
    tried_tiers: Vec<usize>,
    retries: u32,
}

impl<S, B, R> RetryState<S, B, R> {
    /// The endpoint for the next attempt after a failure of this kind, if a retry is allowed:
    /// the failure is retryable, the request may be retried again, an untried endpoint
    /// exists, and the budget has a retry (taken only then).
    fn next_attempt(&self, kind: FailureKind) -> Option<Pick> {
        let settings = self.shared.retry.as_ref()?;
        if self.next.is_none() || self.retries >= settings.max_retries {
            return None;
        }
        if !kind.retryable(&self.method, settings.idempotent_on_close) {
            return None;
        }
        let now = now();
        // The first retry takes the balancer's choice; later ones prefer a tier this request
        // has not failed in yet.
        let new_tier = self.retries >= 1;
        let Some(picked) = pick_for_retry(
            &self.route.target,
            &self.tried,
            &self.tried_tiers,
            new_tier,
            now,
        ) else {
            trace!(service = %self.route.target.name, "no untried endpoint to retry on");
            return None;
        };
        if !settings.budget.withdraw(now) {
            self.route.target.metrics.retries_exhausted.increment(1);
            return None;
        }
        Some(picked)
    }
}

fn retry_fn<S, B, R, RB>(state: RetryState<S, B, R>) -> RetryFn<RB>
where
    S: Service<Request<B>, Response = Response<RB>> + Send + 'static,
    S::Error: Into<BoxError>,
    S::Future: Send + 'static,
    B: Send + 'static,
    RB: Send + 'static,
    R: ReplayBody<B>,
{
    Box::new(move |err, kind| match state.next_attempt(kind) {
        Some(picked) => {
            let fut: BoxResponseFuture<RB> = Box::pin(retry_loop(state, picked));
            Ok(fut)
        }
        None => Err(err),
    })
}

/// Sends the request again, to `picked` and then to further untried endpoints, while
/// failures stay retryable and the budget allows.
async fn retry_loop<S, B, R, RB>(
    mut state: RetryState<S, B, R>,
    mut picked: Pick,
) -> Result<Response<RB>, BoxError>
where
    S: Service<Request<B>, Response = Response<RB>>,
    S::Error: Into<BoxError>,
    R: ReplayBody<B>,
{
    loop {
        state.retries += 1;
        let Some(mut req) = state.next.take() else {
            return Err("retry without a request copy".into());
        };
        let target = &state.route.target;
        target.metrics.retries_sent.increment(1);
        let max = state.shared.retry.as_ref().map_or(0, |s| s.max_retries);
        if state.retries < max {
            state.next = copy_request(&req, &state.replay);
        }
        let attempt = Attempt::new(
            picked,
            Arc::clone(target),
            now(),
            state.retries + 1,
            state.shared.classify,
            state.shared.request_timeout,
        );
        state.tried.push(attempt.addr());
        state.tried_tiers.push(attempt.tier());
        rewrite(
            &mut req,
            &attempt.meta().authority,
            state.route.host_header.as_ref(),
        )?;
        let svc = state.svc.ready().await.map_err(Into::into)?;
        let fut = {
            let _entered = attempt.span().enter();
            svc.call(req)
        };
        let fut = tracing::Instrument::instrument(fut, attempt.span().clone());
        let result = match state.shared.request_timeout {
            Some(t) => match tokio::time::timeout(t, fut).await {
                Ok(result) => result.map_err(Into::into),
                Err(_) => return Err(attempt.timed_out()),
            },
            None => fut.await.map_err(Into::into),
        };
        match attempt.finish(result) {
            Ok(response) => return Ok(response),
            Err((err, kind)) => match state.next_attempt(kind) {
                Some(next) => picked = next,
                None => return Err(err),
            },
        }
    }
}

/// Picks an endpoint for a retry: never one this request already tried.
///
/// The balancer's draws (up to 8) decide when they offer an untried endpoint; with
/// `new_tier`, only one in a tier this request has not failed in yet. Otherwise an untried
/// endpoint is taken directly from the snapshot, from the first tier not tried yet (Envoy's
/// `previous_priorities` retry predicate), else from any tier. This is what lets a retry
/// reach the next cluster when a whole local cluster refuses connections and is not ejected
/// yet: the balancer keeps offering it. A direct pick is outside the balancer's accounting.
fn pick_for_retry(
    target: &TargetShared,
    tried: &[SocketAddr],
    tried_tiers: &[usize],
    new_tier: bool,
    now: Instant,
) -> Option<Pick> {
    let mut fallback = None;
    for _ in 0..8 {
        let Ok(picked) = target
            .balancer
            .pick(PickContext::new(fastrand::u64(..), now))
        else {
            break;
        };
        if tried.contains(&picked.addr()) {
            continue;
        }
        if !new_tier || !tried_tiers.contains(&picked.tier()) {
            return Some(Pick::Balanced(picked));
        }
        fallback.get_or_insert(picked);
    }
    let snapshot = target.balancer.snapshot();
    let direct = |tier_ok: &dyn Fn(usize) -> bool| {
        snapshot
            .tiers()
            .iter()
            .enumerate()
            .filter(|(tier, _)| tier_ok(*tier))
            .find_map(|(tier, states)| {
                let untried: Vec<&Endpoint> = states
                    .iter()
                    .map(|s| s.endpoint())
                    .filter(|e| !tried.contains(&e.addr))
                    .collect();
                (!untried.is_empty()).then(|| {
                    let endpoint = untried[fastrand::usize(..untried.len())].clone();
                    Pick::Direct(Box::new((endpoint, tier)))
                })
            })
    };
    direct(&|tier| !tried_tiers.contains(&tier))
        .or_else(|| fallback.map(Pick::Balanced))
        .or_else(|| direct(&|_| true))
}

#[cfg(test)]
mod tests {
    use super::host_port;

    #[test]
    fn splits_authorities() {
        assert_eq!(
            host_port("a.b.svc.clusterset.local:9443"),
            Some(("a.b.svc.clusterset.local", Some(9443)))
        );
        assert_eq!(
            host_port("a.b.svc.clusterset.local"),
            Some(("a.b.svc.clusterset.local", None))
        );
        assert_eq!(host_port("user:pw@a.b:80"), Some(("a.b", Some(80))));
        assert_eq!(host_port("[::1]:80"), None);
        assert_eq!(host_port("a.b:99999"), None);
        assert_eq!(host_port("a.b:"), None);
    }
}
