//! A tower layer that resolves `clusterset.local` names and balances every request in-process.
//!
//! Wrap any HTTP client that is a `tower::Service<http::Request<B>>` (hyper-util's legacy
//! `Client`, a tower stack, the transport under a tonic client) with [`McsLayer`], then call
//! `http://loyalty-accrual.loyalty.svc.clusterset.local:9443/...`. For every request to a
//! host under the ClusterSet zone the layer:
//!
//! 1. maps the host and port to a [`Target`] (`McsName::parse`; only
//!    `<svc>.<ns>.svc.<zone>` is balanced, other forms fail with a typed [`Error`]);
//! 2. picks an endpoint from the target's `mcs_core` balancer: local cluster first, graded
//!    spill-over, p2c on load, outlier ejection; the pick reads an immutable snapshot with no
//!    lock, no task hop and no `Buffer`;
//! 3. rewrites the URI authority to the endpoint address, keeping the original name in
//!    `Host` (HTTP/1; an HTTP/2 request carries the endpoint address in `:authority`,
//!    because RFC 9113 forbids a `Host` that differs from it and hyper derives
//!    `:authority` from the URI);
//! 4. counts the request in flight until its response head, then feeds latency and outcome
//!    (errors, timeouts, 5xx as [configured](Classify)) back into the balancer;
//! 5. optionally [retries](Retry) connect failures on another endpoint, within a budget.
//!
//! Every other host, `cluster.local` included, passes through untouched. Discovery runs in
//! one background task per target, fed by a [`Resolve`] implementation:
//! [`StaticResolver`], [`DnsResolver`] (feature `dns`), or `mcs-kube`'s Kubernetes resolver.
//! The first request for a service waits for its first resolution (bounded); after that no
//! request waits for discovery, and an empty set fails fast with [`Error::NoEndpoints`].
//!
//! Errors travel as `tower::BoxError`; the layer's own are [`Error`]s
//! (`err.downcast_ref::<mcs_client::Error>()`), the inner service's pass unchanged.
//! Responses carry [`Served`] in their extensions: which endpoint, cluster and tier.
//!
//! # Start here
//!
//! ```no_run
//! use http_body_util::Empty;
//! use hyper::body::Bytes;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::{TokioExecutor, TokioTimer};
//! use mcs_client::{McsLayer, StaticResolver};
//! use mcs_core::{ClusterId, discovery::{Endpoint, Target}, endpoints::Locality, name::ServiceRef};
//! use tower::{ServiceBuilder, ServiceExt};
//!
//! # async fn run() -> Result<(), tower::BoxError> {
//! let east = ClusterId::new("east")?;
//! let resolver = StaticResolver::new();
//! let target = Target { service: ServiceRef::new("loyalty", "loyalty-accrual")?, port: 9443 };
//! resolver.set(&target, [Endpoint::ready("127.10.0.1:9443".parse()?, east.clone())]);
//!
//! // A pool timer, so idle connections to endpoints that left are closed: endpoints come
//! // and go, and without a timer the pool keeps an entry for every address it ever used.
//! let client = Client::builder(TokioExecutor::new())
//!     .pool_timer(TokioTimer::new())
//!     .pool_idle_timeout(std::time::Duration::from_secs(30))
//!     .build_http::<Empty<Bytes>>();
//! let svc = ServiceBuilder::new().layer(McsLayer::new(resolver, Locality::cluster(east))).service(client);
//!
//! let request = http::Request::get("http://loyalty-accrual.loyalty.svc.clusterset.local:9443/accrue")
//!     .body(Empty::new())?;
//! let response = svc.oneshot(request).await?;
//! let served = response.extensions().get::<mcs_client::Served>();
//! # Ok(()) }
//! ```
//!
//! With retries on connect failures (bodies must be [replayable](ReplayBody)):
//!
//! ```no_run
//! # use mcs_client::{CloneBody, McsLayer, Retry, StaticResolver};
//! # use mcs_core::{ClusterId, endpoints::Locality};
//! # fn f() -> Result<(), Box<dyn std::error::Error>> {
//! let layer = McsLayer::builder(StaticResolver::new(), Locality::cluster(ClusterId::new("east")?))
//!     .retry(Retry::new(CloneBody))
//!     .build();
//! # Ok(()) }
//! ```
//!
//! [`Target`]: mcs_core::discovery::Target
//! [`Resolve`]: mcs_core::discovery::Resolve

mod classify;
mod error;
mod future;
mod layer;
pub mod metrics;
pub mod resolve;
mod retry;
mod service;
mod target;

pub use classify::Classify;
pub use error::Error;
pub use future::{ResponseFuture, Served};
pub use layer::{Builder, McsLayer};
pub use resolve::StaticResolver;
#[cfg(feature = "dns")]
pub use resolve::{DnsBuildError, DnsResolver, DnsResolverBuilder};
pub use retry::{CloneBody, NoRetry, ReplayBody, Retry};
pub use service::Mcs;
