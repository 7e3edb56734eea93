//! The errors the layer itself produces, and [`Failure`], what any of them is.
//!
//! Inside the tower stack every error travels as a [`BoxError`](tower::BoxError). The
//! layer's own errors are [`Error`]s (`err.downcast_ref::<mcs_client::Error>()`); a failure
//! of an endpoint's service comes back as an [`EndpointError`] naming the endpoint and its
//! cluster, with the service's error as its source; errors of the pass-through service are
//! returned unchanged. [`Failure::of`] says which kind of failure any of them is.

use std::error::Error as StdError;
use std::fmt;
use std::io;
use std::net::SocketAddr;
use std::time::Duration;

use tower::BoxError;

use mcs_core::ClusterId;
use mcs_core::name::NameError;

/// An error made by the [`Mcs`](crate::Mcs) service. Every variant names the service (as
/// `<namespace>/<name>:<port>`) or host it is about and says why.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// The host is under the ClusterSet zone but is not a valid name there.
    #[error("host {host:?} is not a valid ClusterSet name")]
    InvalidName {
        /// The host as the request named it.
        host: String,
        /// Why it is not valid.
        #[source]
        source: NameError,
    },
    /// The host is a valid ClusterSet name but not of the one form that is balanced,
    /// `<service>.<namespace>.svc.<zone>` (it is an SRV name, a per-endpoint name, ...).
    #[error("host {host:?} is {form}; only `<service>.<namespace>.svc.<zone>` names are balanced")]
    NotAService {
        /// The host as the request named it.
        host: String,
        /// What kind of name it is.
        form: &'static str,
    },
    /// The first resolution of a service did not finish in time.
    #[error("resolve failed for {service}: {cause} (no endpoint set after {waited:?})")]
    Resolve {
        /// The service and port.
        service: String,
        /// How long the request waited.
        waited: Duration,
        /// The last error the resolver reported, or that it has not answered.
        cause: String,
    },
    /// Discovery says the service does not exist (no ServiceImport, NXDOMAIN).
    #[error("service {service} does not exist in the ClusterSet")]
    DoesNotExist {
        /// The service and port.
        service: String,
    },
    /// The service exists but has had no usable endpoint for longer than the fail-fast delay.
    #[error("no endpoints for {service}: none ready for {empty_for:?}")]
    NoEndpoints {
        /// The service and port.
        service: String,
        /// How long the set has been empty, as far as this client saw.
        empty_for: Duration,
    },
    /// The endpoint did not answer within the configured request timeout.
    #[error(
        "request to {service} failed at endpoint {endpoint} in cluster {cluster}: timed out after {after:?}"
    )]
    Timeout {
        /// The service and port.
        service: String,
        /// The endpoint the request went to.
        endpoint: SocketAddr,
        /// The endpoint's cluster.
        cluster: ClusterId,
        /// The configured timeout.
        after: Duration,
    },
    /// A resolver that is given host names without ports (reqwest's) has no service port
    /// configured for this service (see `ClusterSetDns::port`, feature `reqwest`).
    #[error(
        "host {host:?}: no service port configured for it (reqwest gives a resolver the host only; set one with ClusterSetDns::port or ::service_port)"
    )]
    NoServicePort {
        /// The host as the request named it.
        host: String,
    },
    /// The layer was used outside a Tokio runtime, so it cannot start discovery.
    #[error("the mcs layer needs a Tokio runtime to run discovery for {service}")]
    NoRuntime {
        /// The service and port.
        service: String,
    },
    /// The host is outside the ClusterSet zone and the endpoint factory has no pass-through
    /// service (see [`MakeEndpoint::make_passthrough`](crate::connect::MakeEndpoint)).
    #[error(
        "host {host:?} is outside the ClusterSet zone and no pass-through service is configured"
    )]
    NoPassthrough {
        /// The host as the request named it.
        host: String,
    },
}

impl Error {
    /// The service (`<namespace>/<name>:<port>`) or host this error is about.
    pub fn service(&self) -> &str {
        match self {
            Self::InvalidName { host, .. }
            | Self::NotAService { host, .. }
            | Self::NoServicePort { host } => host,
            Self::Resolve { service, .. }
            | Self::DoesNotExist { service }
            | Self::NoEndpoints { service, .. }
            | Self::Timeout { service, .. }
            | Self::NoRuntime { service } => service,
            Self::NoPassthrough { host } => host,
        }
    }
}

/// A request to one endpoint failed: its service returned an error (no connection, a TLS
/// handshake refused, the connection closed, ...). The source is that error.
#[derive(Debug)]
pub struct EndpointError {
    service: String,
    endpoint: SocketAddr,
    cluster: ClusterId,
    source: BoxError,
}

impl EndpointError {
    pub(crate) fn new(
        service: String,
        endpoint: SocketAddr,
        cluster: ClusterId,
        source: BoxError,
    ) -> Self {
        Self {
            service,
            endpoint,
            cluster,
            source,
        }
    }

    /// The service and port (`<namespace>/<name>:<port>`).
    pub fn service(&self) -> &str {
        &self.service
    }

    /// The endpoint the request went to.
    pub fn endpoint(&self) -> SocketAddr {
        self.endpoint
    }

    /// The endpoint's cluster.
    pub fn cluster(&self) -> &ClusterId {
        &self.cluster
    }

    /// The endpoint service's error.
    pub fn inner(&self) -> &(dyn StdError + Send + Sync + 'static) {
        &*self.source
    }

    /// The endpoint service's error, owned.
    pub fn into_inner(self) -> BoxError {
        self.source
    }
}

impl fmt::Display for EndpointError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "request to {} failed at endpoint {} in cluster {}: ",
            self.service, self.endpoint, self.cluster
        )?;
        write_reason(&*self.source, f)
    }
}

impl StdError for EndpointError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}

/// A request that its connection's task ended without taking: it was never written, so it
/// was not processed. (See `HttpEndpoint`.)
#[cfg(feature = "tls")]
#[derive(Debug, thiserror::Error)]
#[error("connection closed before the request was sent")]
pub(crate) struct NotTaken;

/// What went wrong with a request, whatever connector carried it: the one way to ask an
/// error returned by [`Mcs`](crate::Mcs) (an [`Error`], an [`EndpointError`], or an error of
/// the pass-through service) which kind of failure it is.
///
/// ```no_run
/// # fn f(err: tower::BoxError) {
/// use mcs_client::Failure;
///
/// match Failure::of(&*err) {
///     Failure::Tls(tls) => eprintln!("TLS with {:?} refused: {err}", tls.endpoint()),
///     Failure::NoEndpoints | Failure::DoesNotExist => eprintln!("nowhere to send it: {err}"),
///     _ => eprintln!("{err}"),
/// }
/// # }
/// ```
///
/// It looks through the whole source chain (hyper-util's `client error (Connect)` and
/// `(SendRequest)` layers, hyper's and h2's errors, and the `io::Error`s that carry TLS
/// errors), so callers never walk `source()` themselves.
///
/// A response is never an error, not even a 5xx that counted against its endpoint: that is
/// marked on the response's [`Served`](crate::Served) (`counted_as_failure`), whose Display
/// names the endpoint and its cluster.
#[derive(Clone, Copy, Debug)]
#[non_exhaustive]
pub enum Failure<'a> {
    /// The TLS handshake with the endpoint failed, or the server refused it after the
    /// client's side of the handshake (a TLS 1.3 server refusing the client certificate):
    /// a certificate for another name, an unknown CA, an expired certificate, no or a
    /// refused client certificate. Made by [`connect::Tls`](crate::connect::Tls).
    #[cfg(feature = "tls")]
    Tls(&'a crate::connect::TlsError),
    /// [`Error::InvalidName`].
    InvalidName,
    /// [`Error::NotAService`].
    NotAService,
    /// [`Error::NoServicePort`].
    NoServicePort,
    /// [`Error::Resolve`]: the first resolution failed or did not finish in time.
    Resolve,
    /// [`Error::DoesNotExist`].
    DoesNotExist,
    /// [`Error::NoEndpoints`].
    NoEndpoints,
    /// [`Error::Timeout`].
    Timeout,
    /// [`Error::NoRuntime`].
    NoRuntime,
    /// [`Error::NoPassthrough`].
    NoPassthrough,
    /// No connection could be made: refused, or the address is unreachable.
    ConnectionRefused,
    /// No connection could be made for another reason (the connector's error says which).
    Connect,
    /// The connection was reset or closed before the response head arrived.
    ConnectionClosed,
    /// The HTTP/2 server said it did not process the request: it refused the stream
    /// (`REFUSED_STREAM`), or the stream was above the last one of its `GOAWAY`.
    NotProcessed,
    /// Anything else: the innermost error of the chain, whose message says what.
    Other(&'a (dyn StdError + 'static)),
}

impl<'a> Failure<'a> {
    /// What kind of failure `err` (or the first error of a kind this crate knows in its
    /// source chain) is.
    pub fn of(err: &'a (dyn StdError + 'static)) -> Self {
        classify(err).0
    }

    /// The TLS error, if this is a TLS failure.
    #[cfg(feature = "tls")]
    pub fn tls(&self) -> Option<&'a crate::connect::TlsError> {
        match self {
            Self::Tls(tls) => Some(tls),
            _ => None,
        }
    }
}

impl Error {
    fn failure(&self) -> Failure<'static> {
        match self {
            Self::InvalidName { .. } => Failure::InvalidName,
            Self::NotAService { .. } => Failure::NotAService,
            Self::NoServicePort { .. } => Failure::NoServicePort,
            Self::Resolve { .. } => Failure::Resolve,
            Self::DoesNotExist { .. } => Failure::DoesNotExist,
            Self::NoEndpoints { .. } => Failure::NoEndpoints,
            Self::Timeout { .. } => Failure::Timeout,
            Self::NoRuntime { .. } => Failure::NoRuntime,
            Self::NoPassthrough { .. } => Failure::NoPassthrough,
        }
    }
}

/// `err` and its sources, looking inside `io::Error`s (whose `source` skips the error they
/// wrap, where tokio-rustls puts rustls's and the TLS connector its own) and `h2::Error`s
/// (which have no `source`, but may carry the connection's `io::Error`).
pub(crate) fn chain<'a>(
    err: &'a (dyn StdError + 'static),
) -> impl Iterator<Item = &'a (dyn StdError + 'static)> {
    let mut next = Some(err);
    std::iter::from_fn(move || {
        let cur = next?;
        let inner: Option<&'a (dyn StdError + 'static)> =
            if let Some(io) = cur.downcast_ref::<io::Error>() {
                io.get_ref().map(|e| e as _)
            } else if let Some(h2) = cur.downcast_ref::<h2::Error>() {
                h2.get_io().map(|e| e as _)
            } else {
                None
            };
        next = inner.or_else(|| cur.source());
        Some(cur)
    })
    // Chains are short; this only bounds a pathological cycle.
    .take(64)
}

/// The kind of failure and, when the kind alone does not say it, the words for it.
fn classify<'a>(err: &'a (dyn StdError + 'static)) -> (Failure<'a>, Option<String>) {
    // A more specific kind found deeper in the chain wins over `Connect` and `Other`;
    // a TLS error or the layer's own error wins over everything.
    let innermost = chain(err).last().unwrap_or(err);
    let mut found = (Failure::Other(innermost), None);
    for e in chain(err) {
        if let Some(e) = e.downcast_ref::<Error>() {
            return (e.failure(), None);
        }
        #[cfg(feature = "tls")]
        if let Some(tls) = e.downcast_ref::<crate::connect::TlsError>() {
            return (Failure::Tls(tls), None);
        }
        if !matches!(found.0, Failure::Other(_) | Failure::Connect) {
            continue;
        }
        #[cfg(feature = "tls")]
        if e.is::<NotTaken>() {
            found = (Failure::ConnectionClosed, Some(e.to_string()));
            continue;
        }
        if let Some(e) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
            if e.is_connect() {
                found = (Failure::Connect, None);
            }
        } else if let Some(e) = e.downcast_ref::<hyper::Error>() {
            if e.is_canceled() || e.is_closed() {
                found = (
                    Failure::ConnectionClosed,
                    Some("connection closed before the request was sent".to_owned()),
                );
            } else if e.is_incomplete_message() {
                found = (
                    Failure::ConnectionClosed,
                    Some("connection closed before the response".to_owned()),
                );
            }
        } else if let Some(e) = e.downcast_ref::<h2::Error>() {
            if e.is_reset() && e.reason() == Some(h2::Reason::REFUSED_STREAM) {
                found = (
                    Failure::NotProcessed,
                    Some("HTTP/2 stream refused by the server (REFUSED_STREAM)".to_owned()),
                );
            } else if e.is_go_away() && e.is_remote() && e.reason() == Some(h2::Reason::NO_ERROR) {
                found = (
                    Failure::NotProcessed,
                    Some("HTTP/2 GOAWAY: the server did not process the request".to_owned()),
                );
            }
        } else if let Some(e) = e.downcast_ref::<io::Error>() {
            use io::ErrorKind::*;
            match e.kind() {
                ConnectionRefused | AddrNotAvailable | HostUnreachable | NetworkUnreachable => {
                    found = (Failure::ConnectionRefused, Some(e.kind().to_string()));
                }
                ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => {
                    found = (Failure::ConnectionClosed, Some(e.kind().to_string()));
                }
                _ => {}
            }
        }
    }
    found
}

/// Writes why `err` happened, in a few words: the TLS reason, `connection refused`, ...,
/// or the innermost error's message.
fn write_reason(err: &(dyn StdError + 'static), f: &mut fmt::Formatter<'_>) -> fmt::Result {
    let (failure, words) = classify(err);
    #[cfg(feature = "tls")]
    if let Failure::Tls(tls) = failure {
        return f.write_str(&tls.reason());
    }
    let innermost = chain(err).last().unwrap_or(err);
    match (failure, words) {
        (Failure::Connect, _) => write!(f, "connect failed: {innermost}"),
        (_, Some(words)) => f.write_str(words.as_str()),
        (_, None) if std::ptr::addr_eq(innermost, err) => write!(f, "{err}"),
        (_, None) => write!(f, "{err}: {innermost}"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn endpoint_error(source: BoxError) -> EndpointError {
        EndpointError::new(
            "loyalty/loyalty-accrual:9443".to_owned(),
            "127.10.0.1:9443".parse().unwrap(),
            ClusterId::new("east").unwrap(),
            source,
        )
    }

    #[test]
    fn an_endpoint_error_names_the_endpoint_its_cluster_and_the_cause() {
        let refused = endpoint_error(io::Error::from(io::ErrorKind::ConnectionRefused).into());
        assert!(matches!(Failure::of(&refused), Failure::ConnectionRefused));
        assert_eq!(
            refused.to_string(),
            "request to loyalty/loyalty-accrual:9443 failed at endpoint 127.10.0.1:9443 in \
             cluster east: connection refused"
        );
        let reset = endpoint_error(io::Error::from(io::ErrorKind::ConnectionReset).into());
        assert!(matches!(Failure::of(&reset), Failure::ConnectionClosed));
        assert!(reset.to_string().ends_with(": connection reset"), "{reset}");
        let other = endpoint_error(io::Error::other("boom").into());
        let Failure::Other(innermost) = Failure::of(&other) else {
            panic!("{other}")
        };
        assert_eq!(innermost.to_string(), "boom");
        assert!(other.to_string().ends_with(": boom"), "{other}");
    }

    #[test]
    fn the_layers_own_errors_are_their_kind() {
        let err: BoxError = Error::NoEndpoints {
            service: "loyalty/loyalty-accrual:9443".to_owned(),
            empty_for: Duration::from_secs(3),
        }
        .into();
        assert!(matches!(Failure::of(&*err), Failure::NoEndpoints));
        assert_eq!(
            err.to_string(),
            "no endpoints for loyalty/loyalty-accrual:9443: none ready for 3s"
        );
    }
}
