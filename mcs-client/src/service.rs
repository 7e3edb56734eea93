//! [`Mcs`]: the balancing service.

use std::fmt;
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::task::{Context, Poll};
use std::time::Instant;

use http::header::HOST;
use http::request::Parts;
use http::uri::{Authority, PathAndQuery, Scheme};
use http::{Method, Request, Response, Uri};
use tower::util::Oneshot;
use tower::{BoxError, Service, ServiceExt};
use tracing::trace;

use mcs_core::discovery::Endpoint;
use mcs_core::endpoints::{PickContext, PickError, Picked};

use crate::classify::FailureKind;
use crate::connect::{EndpointTarget, MakeEndpoint};
use crate::error::Error;
use crate::future::{Attempt, BoxResponseFuture, Pick, ResponseFuture, RetryFn, Tried};
use crate::retry::ReplayBody;
use crate::shared::Shared;
use crate::target::{EndpointMeta, Route, Routing, TargetShared, now};

/// The service made by [`McsLayer`](crate::McsLayer) over an endpoint factory `M`: balances
/// requests to ClusterSet services over per-endpoint services, and sends every other
/// request to the factory's pass-through service.
///
/// A balanced request keeps its URI, `Host` and `:authority`: it is sent unchanged on the
/// picked endpoint's own service (made by `M` the first time, one connection pool per
/// endpoint), so TLS verifies the service's name and HTTP/2 carries it as `:authority`.
///
/// `Mcs` is `Clone` (clones share discovery, endpoint state and endpoint services) and needs
/// no `Buffer`; `poll_ready` is always ready, and an endpoint service's own readiness is
/// awaited in the response future. A request whose service already has an endpoint set is
/// picked inside `call`; only the first request to a service (waiting for its first
/// resolution) and requests to a service that has just lost all endpoints wait, up to the
/// configured limits.
pub struct Mcs<M: MakeEndpoint, R = crate::NoRetry> {
    endpoints: Arc<Endpoints<M>>,
    shared: Arc<Shared>,
    replay: Option<R>,
}

impl<M: MakeEndpoint, R> Mcs<M, R> {
    pub(crate) fn new(make: M, shared: Arc<Shared>, replay: Option<R>) -> Self {
        static OWNERS: AtomicU64 = AtomicU64::new(1);
        let passthrough = make.make_passthrough();
        Self {
            endpoints: Arc::new(Endpoints {
                owner: OWNERS.fetch_add(1, Ordering::Relaxed),
                passthrough,
                make,
            }),
            shared,
            replay,
        }
    }

    /// The endpoint factory.
    pub fn make_endpoint(&self) -> &M {
        &self.endpoints.make
    }
}

impl<M: MakeEndpoint, R: Clone> Clone for Mcs<M, R> {
    fn clone(&self) -> Self {
        Self {
            endpoints: Arc::clone(&self.endpoints),
            shared: Arc::clone(&self.shared),
            replay: self.replay.clone(),
        }
    }
}

impl<M: MakeEndpoint + fmt::Debug, R> fmt::Debug for Mcs<M, R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Mcs")
            .field("make", &self.endpoints.make)
            .finish_non_exhaustive()
    }
}

/// The endpoint factory of one [`Mcs`] and what it made once.
struct Endpoints<M: MakeEndpoint> {
    make: M,
    /// Tells this `Mcs`'s services apart from those of other `Mcs` of the same layer in
    /// each endpoint's [`Conns`](crate::connect::Conns).
    owner: u64,
    passthrough: Option<M::Service>,
}

impl<M: MakeEndpoint> Endpoints<M> {
    /// The metadata of the picked endpoint and its service, made the first time.
    ///
    /// Cost after the first time: one hash lookup, one atomic load, a type check and the
    /// service's clone.
    fn endpoint(
        &self,
        target: &TargetShared,
        endpoint: &Endpoint,
    ) -> (Arc<EndpointMeta>, M::Service) {
        target.endpoint(endpoint, |conns| {
            conns.get_or_make(self.owner, || {
                trace!(service = %target.name, endpoint = %endpoint.addr, "new endpoint service");
                self.make.make_endpoint(&EndpointTarget::new(
                    endpoint.clone(),
                    target.target.clone(),
                    Arc::clone(&target.host),
                ))
            })
        })
    }
}

/// The future of an endpoint service's response.
type EndpointFuture<M, B> = Oneshot<<M as MakeEndpoint>::Service, Request<B>>;

impl<M, B, R, RB> Service<Request<B>> for Mcs<M, R>
where
    M: MakeEndpoint,
    M::Service: Service<Request<B>, Response = Response<RB>>,
    <M::Service as Service<Request<B>>>::Error: Into<BoxError>,
    <M::Service as Service<Request<B>>>::Future: Send + 'static,
    B: Send + 'static,
    RB: Send + 'static,
    R: ReplayBody<B>,
{
    type Response = Response<RB>;
    type Error = BoxError;
    type Future = ResponseFuture<EndpointFuture<M, B>, RB>;

    fn poll_ready(&mut self, _cx: &mut Context<'_>) -> Poll<Result<(), Self::Error>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<B>) -> Self::Future {
        let route = match route(&self.shared, &req) {
            Routing::Passthrough => {
                return match &self.endpoints.passthrough {
                    Some(svc) => ResponseFuture::passthrough(svc.clone().oneshot(req)),
                    None => ResponseFuture::failed(Error::NoPassthrough {
                        host: host_of(&req).unwrap_or_default().to_owned(),
                    }),
                };
            }
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
                    &self.endpoints,
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
                // Not resolved yet, or no endpoints: wait (bounded) for a pick.
                let endpoints = Arc::clone(&self.endpoints);
                let shared = Arc::clone(&self.shared);
                let replay = self.replay.clone();
                ResponseFuture::boxed(Box::pin(async move {
                    let picked = wait_for_pick(&shared, &route.target, now).await?;
                    route.target.picked();
                    dispatch(
                        &endpoints,
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
    match host_of(req).and_then(host_port) {
        Some((host, port)) => {
            let port = port.unwrap_or_else(|| default_port(req.uri().scheme()));
            shared.registry.route(host, port)
        }
        None => Routing::Passthrough,
    }
}

/// The request's authority: the URI's, or else its `Host` header.
fn host_of<B>(req: &Request<B>) -> Option<&str> {
    match req.uri().authority() {
        Some(authority) => Some(authority.as_str()),
        None => req.headers().get(HOST).and_then(|h| h.to_str().ok()),
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
pub(crate) async fn wait_for_pick(
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

/// Sends the request to the picked endpoint's service, with retries if they are on.
fn dispatch<M, B, R, RB>(
    endpoints: &Arc<Endpoints<M>>,
    shared: &Arc<Shared>,
    replay: Option<&R>,
    route: &Route,
    mut req: Request<B>,
    picked: Picked,
    now: Instant,
) -> ResponseFuture<EndpointFuture<M, B>, RB>
where
    M: MakeEndpoint,
    M::Service: Service<Request<B>, Response = Response<RB>>,
    <M::Service as Service<Request<B>>>::Error: Into<BoxError>,
    <M::Service as Service<Request<B>>>::Future: Send + 'static,
    B: Send + 'static,
    RB: Send + 'static,
    R: ReplayBody<B>,
{
    let (meta, svc) = endpoints.endpoint(&route.target, picked.endpoint());
    let attempt = Attempt::new(
        Pick::Balanced(picked),
        meta,
        Arc::clone(&route.target),
        now,
        1,
        shared.classify,
        shared.request_timeout,
    );
    if let Err(err) = absolute_form(&mut req) {
        return ResponseFuture::failed(err);
    }
    let retry = match (&shared.retry, replay) {
        (Some(settings), Some(replay)) if settings.max_retries > 0 && replay.enabled() => {
            settings.budget.deposit(now);
            let (head, body) = req.into_parts();
            let (body, copies) = replay.prepare(body);
            let retry = copies.map(|copies| {
                retry_fn(RetryState {
                    endpoints: Arc::clone(endpoints),
                    shared: Arc::clone(shared),
                    replay: replay.clone(),
                    route: route.clone(),
                    head: head.clone(),
                    copies,
                    tried: vec![attempt.tried()],
                    retries: 0,
                })
            });
            req = Request::from_parts(head, body);
            retry
        }
        _ => None,
    };
    trace!(service = %route.target.name, endpoint = %attempt.addr(), "dispatch");
    ResponseFuture::balanced(svc.oneshot(req), attempt, retry)
}

/// Makes a relative-form request (path only, host in `Host`) absolute, as HTTP clients
/// need; the scheme is `http`. Absolute requests are left as they are.
fn absolute_form<B>(req: &mut Request<B>) -> Result<(), BoxError> {
    if req.uri().authority().is_some() {
        return Ok(());
    }
    let Some(host) = req.headers().get(HOST) else {
        return Ok(());
    };
    let authority = Authority::try_from(host.as_bytes())?;
    let mut parts = std::mem::take(req.uri_mut()).into_parts();
    parts.authority = Some(authority);
    parts.scheme.get_or_insert(Scheme::HTTP);
    parts
        .path_and_query
        .get_or_insert(PathAndQuery::from_static("/"));
    *req.uri_mut() = Uri::from_parts(parts)?;
    Ok(())
}

struct RetryState<M: MakeEndpoint, B, R: ReplayBody<B>> {
    endpoints: Arc<Endpoints<M>>,
    shared: Arc<Shared>,
    replay: R,
    route: Route,
    /// The request's head, for every retry.
    head: Parts,
    /// What the body of every retry is copied from.
    copies: R::Copies,
    /// The endpoints this request went to, in order.
    tried: Vec<Tried>,
    retries: u32,
}

impl<M: MakeEndpoint, B, R: ReplayBody<B>> RetryState<M, B, R> {
    fn method(&self) -> &Method {
        &self.head.method
    }

    /// The endpoint for the next attempt after a failure of this kind, if a retry is allowed:
    /// the failure is retryable, the request may be retried again, an untried endpoint
    /// exists, and the budget has a retry (taken only then).
    fn next_attempt(&self, kind: FailureKind) -> Option<Pick> {
        let settings = self.shared.retry.as_ref()?;
        if self.retries >= settings.max_retries {
            return None;
        }
        if !kind.retryable(self.method(), settings.idempotent_on_close) {
            return None;
        }
        let now = now();
        // The first retry takes the balancer's choice; later ones prefer a tier or a cluster
        // this request has not failed in yet.
        let elsewhere = self.retries >= 1;
        let Some(picked) = pick_for_retry(&self.route.target, &self.tried, elsewhere, now) else {
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

fn retry_fn<M, B, R, RB>(state: RetryState<M, B, R>) -> RetryFn<RB>
where
    M: MakeEndpoint,
    M::Service: Service<Request<B>, Response = Response<RB>>,
    <M::Service as Service<Request<B>>>::Error: Into<BoxError>,
    <M::Service as Service<Request<B>>>::Future: Send + 'static,
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
async fn retry_loop<M, B, R, RB>(
    mut state: RetryState<M, B, R>,
    mut picked: Pick,
) -> Result<Response<RB>, BoxError>
where
    M: MakeEndpoint,
    M::Service: Service<Request<B>, Response = Response<RB>>,
    <M::Service as Service<Request<B>>>::Error: Into<BoxError>,
    R: ReplayBody<B>,
{
    loop {
        state.retries += 1;
        let target = &state.route.target;
        target.metrics.retries_sent.increment(1);
        let req = Request::from_parts(state.head.clone(), state.replay.copy(&state.copies));
        let (meta, svc) = state.endpoints.endpoint(target, picked.endpoint());
        let attempt = Attempt::new(
            picked,
            meta,
            Arc::clone(target),
            now(),
            state.retries + 1,
            state.shared.classify,
            state.shared.request_timeout,
        );
        state.tried.push(attempt.tried());
        let fut = tracing::Instrument::instrument(svc.oneshot(req), attempt.span().clone());
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
/// `elsewhere`, only one in a tier or a cluster this request has not failed in yet.
/// Otherwise an untried endpoint is taken directly from the snapshot: from the first tier
/// with one in a tier or cluster not tried yet (Envoy's `previous_priorities` retry
/// predicate, extended to clusters), else from any tier. This is what lets a retry reach
/// another cluster when a whole cluster refuses connections and is not ejected yet: the
/// balancer keeps offering it, in the local tier, or beside the other clusters in the
/// remote tier. A direct pick is outside the balancer's accounting.
fn pick_for_retry(
    target: &TargetShared,
    tried: &[Tried],
    elsewhere: bool,
    now: Instant,
) -> Option<Pick> {
    let untried = |e: &Endpoint| !tried.iter().any(|t| t.endpoint().addr == e.addr);
    let fresh = |tier: usize, e: &Endpoint| {
        !tried.iter().any(|t| t.tier() == tier)
            || !tried.iter().any(|t| t.endpoint().cluster == e.cluster)
    };
    let mut fallback = None;
    for _ in 0..8 {
        let Ok(picked) = target
            .balancer
            .pick(PickContext::new(fastrand::u64(..), now))
        else {
            break;
        };
        if !untried(picked.endpoint()) {
            continue;
        }
        if !elsewhere || fresh(picked.tier(), picked.endpoint()) {
            return Some(Pick::Balanced(picked));
        }
        fallback.get_or_insert(picked);
    }
    let snapshot = target.balancer.snapshot();
    let direct = |ok: &dyn Fn(usize, &Endpoint) -> bool| {
        snapshot
            .tiers()
            .iter()
            .enumerate()
            .find_map(|(tier, states)| {
                let candidates: Vec<&Endpoint> = states
                    .iter()
                    .map(|s| s.endpoint())
                    .filter(|e| untried(e) && ok(tier, e))
                    .collect();
                (!candidates.is_empty()).then(|| {
                    let endpoint = candidates[fastrand::usize(..candidates.len())].clone();
                    Pick::Direct(Box::new((endpoint, tier)))
                })
            })
    };
    direct(&fresh)
        .or_else(|| fallback.map(Pick::Balanced))
        .or_else(|| direct(&|_, _| true))
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
