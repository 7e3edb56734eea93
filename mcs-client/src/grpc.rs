//! gRPC with tonic (feature `tonic`): a balanced channel for generated clients.
//!
//! tonic's generated clients take any service of `http::Request<tonic::body::Body>`, so
//! the layer needs no adapter, only the right pieces: [`Http2`] (one multiplexed HTTP/2
//! connection per endpoint, as tonic's own `Channel` keeps), unary calls retried on
//! another endpoint after a connect failure (their body is one message, kept up to
//! [`RETRY_BUFFER`] bytes), and the origin by its ClusterSet name, so that `:authority`
//! and TLS carry the service's name. [`channel`] puts them together. Every call is
//! balanced, not every connection.
//!
//! ```no_run
//! # #[cfg(feature = "tls")]
//! # fn run(
//! #     config: rustls::ClientConfig,
//! #     resolver: mcs_client::StaticResolver,
//! # ) -> Result<(), Box<dyn std::error::Error>> {
//! use mcs_client::{McsLayer, grpc};
//! use mcs_core::{ClusterId, discovery::Target, endpoints::Locality, name::ServiceRef};
//!
//! let layer = McsLayer::builder(resolver, Locality::cluster(ClusterId::new("north")?));
//! let channel = grpc::channel(layer, grpc::tls(config)); // or `connect::Tcp::new()` for h2c
//! let target = Target { service: ServiceRef::new("loyalty", "loyalty-accrual")?, port: 9443 };
//! let client = tonic::client::Grpc::with_origin(channel, grpc::origin(&target, true));
//! // With generated code: `AccrualClient::with_origin(channel, grpc::origin(&target, true))`.
//! # let _ = client;
//! # Ok(()) }
//! ```

use http::Uri;
use hyper::client::conn::http2;
use hyper_util::rt::TokioExecutor;
use tonic::body::Body;
use tower::Layer;

use mcs_core::discovery::Target;
use mcs_core::name::Zone;

use crate::connect::{Http2, MakeConnector, MakeEndpoint};
use crate::layer::Builder;
use crate::retry::{BufferBody, Replay, Retry};
use crate::service::Mcs;

/// The largest request body [`channel`] keeps to retry a call on another endpoint: a
/// unary call's message up to this size is retried after a connect failure; larger ones,
/// and streaming calls that outgrow it, are not.
pub const RETRY_BUFFER: usize = 64 * 1024;

/// How a retried call's body is made again from its kept bytes.
pub type Rebuild = fn(Replay<Body>) -> Body;

/// The channel [`channel`] makes: give it to a tonic client.
pub type Channel<C> = Mcs<Http2<C, Body>, BufferBody<Rebuild>>;

/// A channel for tonic clients: `layer`'s settings (locality, balancer, timeouts), calls
/// retried on another endpoint after connect failures (replacing any retry policy set on
/// `layer`; see [`RETRY_BUFFER`]), one HTTP/2 connection per endpoint made by `connect`
/// ([`Tcp`](crate::connect::Tcp) for plaintext h2c, [`tls`] for TLS).
pub fn channel<R, C>(layer: Builder<R>, connect: C) -> Channel<C>
where
    C: MakeConnector,
    Http2<C, Body>: MakeEndpoint,
{
    let rebuild: Rebuild = Body::new;
    layer
        .retry(Retry::new(BufferBody::new(RETRY_BUFFER, rebuild)))
        .build()
        .layer(Http2::new(
            http2::Builder::new(TokioExecutor::new()),
            connect,
        ))
}

/// The origin a tonic client is given: `https://<service>.<namespace>.svc.clusterset.local:<port>`
/// (`http://` without TLS). The channel balances it; every call carries it as `:authority`.
pub fn origin(target: &Target, tls: bool) -> Uri {
    let scheme = if tls { "https" } else { "http" };
    let host = target.service.to_fqdn(&Zone::default());
    let uri = format!("{scheme}://{}:{}", host.trim_end_matches('.'), target.port);
    // A ServiceRef is a valid DNS name and a port a number: always a valid URI.
    Uri::try_from(uri).unwrap_or_else(|e| unreachable!("a ClusterSet origin is a URI: {e}"))
}

/// A TLS connector for gRPC: `config` offering ALPN `h2` only (gRPC is HTTP/2), verifying
/// each endpoint as the service's ClusterSet name (see [`Tls`](crate::connect::Tls) to
/// verify another name, or to rotate the configuration).
#[cfg(feature = "tls")]
pub fn tls(mut config: rustls::ClientConfig) -> crate::connect::Tls {
    config.alpn_protocols = vec![b"h2".to_vec()];
    crate::connect::Tls::new(config)
}
