//! A tower layer that resolves `clusterset.local` names and balances every request in-process.
//!
//! Call `https://loyalty-accrual.loyalty.svc.clusterset.local:9443/...` through an [`Mcs`]
//! service (an [`McsLayer`] over an endpoint factory such as [`Http`]). For every request to
//! a host under the ClusterSet zone the layer:
//!
//! 1. maps the host and port to a [`Target`] (`McsName::parse`; only
//!    `<svc>.<ns>.svc.<zone>` is balanced, other forms fail with a typed [`Error`]);
//! 2. picks an endpoint from the target's `mcs_core` balancer: local cluster first, graded
//!    spill-over, p2c on load, outlier ejection; the pick reads an immutable snapshot with no
//!    lock, no task hop and no `Buffer`;
//! 3. sends the request **unchanged** (URI, `Host`, HTTP/2 `:authority`) on that endpoint's
//!    own service, made once per endpoint by the [factory](connect::MakeEndpoint): a client
//!    with its own connection pool that dials the endpoint's address;
//! 4. counts the request in flight until its response head, then feeds latency and outcome
//!    (errors, timeouts, 5xx as [configured](Classify)) back into the balancer;
//! 5. optionally [retries](Retry) connect failures on another endpoint, within a budget.
//!
//! Every other host, `cluster.local` included, goes to the factory's pass-through service
//! untouched. Discovery runs in one background task per target, fed by a [`Resolve`]
//! implementation: [`StaticResolver`], [`DnsResolver`] (feature `dns`), or `mcs-kube`'s
//! Kubernetes resolver. The first request for a service waits for its first resolution
//! (bounded); after that no request waits for discovery, and an empty set fails fast with
//! [`Error::NoEndpoints`].
//!
//! # Authority, SNI and certificates
//!
//! Because each endpoint has its own connections, the request's authority is never
//! rewritten: servers and proxies that route or authorise by `Host` / `:authority` see the
//! ClusterSet name the caller wrote. With [`connect::Tls`] (feature `tls`) the TLS
//! handshake sends as SNI, and verifies the certificate against, the service's ClusterSet
//! name (`loyalty-accrual.loyalty.svc.clusterset.local`), or the name you configure per
//! service or by a function of the target (certificates are often issued for the
//! `cluster.local` name); never the endpoint's IP. A handshake that fails (wrong name,
//! unknown CA, expired, client certificate refused, in TLS 1.3 also when the refusal comes
//! after the handshake) is a [`connect::TlsError`] naming the endpoint, its cluster, the
//! name verified and the cause, inside an [`EndpointError`] ([`Failure::of`] finds it); it
//! counts as a connect failure: retried on another endpoint when retries are on, and
//! towards ejection.
//!
//! # Start here: plaintext
//!
//! ```no_run
//! use http_body_util::Empty;
//! use hyper::body::Bytes;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::{TokioExecutor, TokioTimer};
//! use mcs_client::{Http, McsLayer, StaticResolver};
//! use mcs_core::{ClusterId, discovery::{Endpoint, Target}, endpoints::Locality, name::ServiceRef};
//! use tower::{Layer, ServiceExt};
//!
//! # async fn run() -> Result<(), tower::BoxError> {
//! let east = ClusterId::new("east")?;
//! let resolver = StaticResolver::new();
//! let target = Target { service: ServiceRef::new("loyalty", "loyalty-accrual")?, port: 9443 };
//! resolver.set(&target, [Endpoint::ready("127.10.0.1:9443".parse()?, east.clone())]);
//!
//! // One hyper-util client per endpoint, all built like this; a pool timer closes idle
//! // connections.
//! let builder = Client::builder(TokioExecutor::new())
//!     .pool_timer(TokioTimer::new())
//!     .pool_idle_timeout(std::time::Duration::from_secs(30))
//!     .clone();
//! let svc = McsLayer::new(resolver, Locality::cluster(east)).layer(Http::new(builder));
//!
//! let request = http::Request::get("http://loyalty-accrual.loyalty.svc.clusterset.local:9443/accrue")
//!     .body(Empty::<Bytes>::new())?;
//! let response = svc.oneshot(request).await?;
//! let served = response.extensions().get::<mcs_client::Served>();
//! # Ok(()) }
//! ```
//!
//! # https and mTLS
//!
//! Give [`connect::Tls`] your rustls `ClientConfig`; a client certificate in it makes it
//! mTLS. Keep a clone of the `Tls` to replace the configuration when the certificate is
//! renewed: new connections use the new one, no restart.
//!
//! ```no_run
//! # #[cfg(feature = "tls")]
//! # async fn run(
//! #     roots: rustls::RootCertStore,
//! #     cert_chain: Vec<rustls::pki_types::CertificateDer<'static>>,
//! #     key: rustls::pki_types::PrivateKeyDer<'static>,
//! #     renewed: rustls::ClientConfig,
//! #     resolver: mcs_client::StaticResolver,
//! # ) -> Result<(), tower::BoxError> {
//! use std::sync::Arc;
//! use http_body_util::Empty;
//! use hyper::body::Bytes;
//! use hyper_util::client::legacy::Client;
//! use hyper_util::rt::TokioExecutor;
//! use mcs_client::connect::{Http, Tls};
//! use mcs_client::McsLayer;
//! use mcs_core::{ClusterId, endpoints::Locality, name::ServiceRef};
//! use tower::{Layer, ServiceExt};
//!
//! let provider = Arc::new(rustls::crypto::ring::default_provider());
//! let config = rustls::ClientConfig::builder_with_provider(provider)
//!     .with_safe_default_protocol_versions()?
//!     .with_root_certificates(roots)
//!     .with_client_auth_cert(cert_chain, key)?; // mTLS; `.with_no_client_auth()` for TLS
//! let tls = Tls::new(config)
//!     // This service's certificates carry its cluster.local name.
//!     .server_name_for(ServiceRef::new("loyalty", "loyalty-accrual")?,
//!                      "loyalty-accrual.loyalty.svc.cluster.local");
//! let http = Http::with_connector(Client::builder(TokioExecutor::new()), tls.clone());
//! let svc = McsLayer::new(resolver, Locality::cluster(ClusterId::new("north")?)).layer(http);
//!
//! let request = http::Request::get("https://loyalty-accrual.loyalty.svc.clusterset.local:9443/")
//!     .body(Empty::<Bytes>::new())?;
//! let response = svc.clone().oneshot(request).await?;
//!
//! // Certificate renewed: new connections present the new one.
//! tls.store(renewed);
//! # Ok(()) }
//! ```
//!
//! # gRPC (tonic) over TLS
//!
//! tonic's generated clients take any service of `http::Request<tonic::body::Body>`: give
//! them an [`Mcs`] over [`connect::Http2`] (one multiplexed HTTP/2 connection per endpoint)
//! with ALPN `h2`, and the origin by its ClusterSet name. Every call is balanced (not every
//! connection), and `:authority` is the service's name. Unary calls can be retried on
//! connect failures with [`BufferBody`] (their body is one message). The `grpc` module
//! (feature `tonic`) does exactly this in one call, `grpc::channel`; by hand:
//!
//! ```no_run
//! # #[cfg(feature = "tls")]
//! # fn run(
//! #     mut config: rustls::ClientConfig,
//! #     resolver: mcs_client::StaticResolver,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use hyper::client::conn::http2;
//! use hyper_util::rt::TokioExecutor;
//! use mcs_client::connect::{Http2, Tls};
//! use mcs_client::{BufferBody, McsLayer, Replay, Retry};
//! use mcs_core::{ClusterId, endpoints::Locality};
//! use tower::Layer;
//!
//! config.alpn_protocols = vec![b"h2".to_vec()];
//! let h2 = Http2::<_, tonic::body::Body>::new(
//!     http2::Builder::new(TokioExecutor::new()),
//!     Tls::new(config),
//! );
//! let channel = McsLayer::builder(resolver, Locality::cluster(ClusterId::new("north")?))
//!     .retry(Retry::new(BufferBody::new(64 * 1024, |body: Replay<tonic::body::Body>| {
//!         tonic::body::Body::new(body)
//!     })))
//!     .build()
//!     .layer(h2);
//! let origin: http::Uri = "https://loyalty-accrual.loyalty.svc.clusterset.local:9443".parse()?;
//! let grpc = tonic::client::Grpc::with_origin(channel, origin);
//! // e.g. `LoyaltyClient::with_origin(channel, origin)` with generated code.
//! # let _ = grpc;
//! # Ok(()) }
//! ```
//!
//! # reqwest
//!
//! reqwest picks its own connections, so the layer cannot wrap it; the `reqwest` module
//! (feature `reqwest`) gives it a DNS resolver over the same discovery and balancer, which
//! balances each new connection (not each request) and fails over to other clusters.
//!
//! # Errors
//!
//! Errors travel as `tower::BoxError`; the layer's own are [`Error`]s
//! (`err.downcast_ref::<mcs_client::Error>()`), an endpoint's failure is an
//! [`EndpointError`]. Responses carry [`Served`] in their extensions: which endpoint,
//! cluster and tier.
//!
//! [`Failure::of`] is the one way to ask any of these errors what happened, the same for
//! every connector ([`Http`], [`connect::Http2`], TLS 1.2 or 1.3): [`Failure::Tls`] with
//! the [`connect::TlsError`] (also when a TLS 1.3 server refuses the client certificate
//! after the handshake), `ConnectionRefused`, `ConnectionClosed`, `NotProcessed` (HTTP/2
//! `REFUSED_STREAM` or `GOAWAY`), `Timeout`, `NoEndpoints`, `Resolve`, ... It looks
//! through hyper-util's `client error (Connect)` / `(SendRequest)` layers and the errors
//! `io::Error` and h2 carry, so callers never walk `source()`. Logged with `{err}`, an
//! endpoint's failure names the endpoint, its cluster and the cause in one line:
//!
//! ```text
//! request to loyalty/loyalty-accrual:9443 failed at endpoint 127.10.0.1:9443 in cluster east: TLS: certificate required by the server (the client sent none)
//! request to loyalty/loyalty-accrual:9443 failed at endpoint 127.20.0.1:9443 in cluster west: TLS: certificate not valid for loyalty-accrual.loyalty.svc.cluster.local
//! request to loyalty/loyalty-accrual:9443 failed at endpoint 127.10.0.2:9443 in cluster east: connection refused
//! no endpoints for loyalty/loyalty-accrual:9443: none ready for 3s
//! resolve failed for loyalty/loyalty-accrual:9443: ... (no endpoint set after 5s)
//! ```
//!
//! [`Target`]: mcs_core::discovery::Target
//! [`Resolve`]: mcs_core::discovery::Resolve

mod classify;
pub mod connect;
mod error;
mod future;
#[cfg(feature = "tonic")]
pub mod grpc;
mod layer;
pub mod metrics;
#[cfg(feature = "reqwest")]
pub mod reqwest;
pub mod resolve;
mod retry;
mod service;
mod shared;
mod target;

pub use classify::Classify;
pub use connect::Http;
pub use error::{EndpointError, Error, Failure};
pub use future::{ResponseFuture, Served};
pub use layer::{Builder, McsLayer};
pub use resolve::StaticResolver;
#[cfg(feature = "dns")]
pub use resolve::{DnsBuildError, DnsResolver, DnsResolverBuilder};
pub use retry::{BufferBody, CloneBody, NoRetry, Replay, ReplayBody, Retry};
pub use service::Mcs;

/// The README's examples, compiled as doctests.
#[cfg(doctest)]
#[doc = include_str!("../README.md")]
pub struct ReadmeDoctests;
