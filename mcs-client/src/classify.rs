//! Which responses and errors count against an endpoint, and which failures may be retried.
//!
//! The outcome of every balanced request feeds the endpoint's outlier detection and load
//! estimate (`mcs_core::endpoints::Picked::complete`). Errors of the wrapped service
//! (connect errors, resets, timeouts) always count as failures. Responses count as failures
//! when their status is configured so: by default every 5xx does (Envoy's
//! `consecutive_5xx`), 429 does not, and a gRPC trailers-only response with
//! `grpc-status: 14` (UNAVAILABLE) does.

use std::error::Error as StdError;

use http::{HeaderMap, HeaderName, Method, StatusCode};

const GRPC_STATUS: HeaderName = HeaderName::from_static("grpc-status");

/// How responses are classified into success and failure.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
#[must_use]
pub struct Classify {
    server_errors: bool,
    too_many_requests: bool,
    grpc_unavailable: bool,
}

impl Default for Classify {
    fn default() -> Self {
        Self {
            server_errors: true,
            too_many_requests: false,
            grpc_unavailable: true,
        }
    }
}

impl Classify {
    /// Whether 5xx responses count as endpoint failures (default: yes).
    pub fn server_errors(mut self, yes: bool) -> Self {
        self.server_errors = yes;
        self
    }

    /// Whether 429 responses count as endpoint failures (default: no).
    pub fn too_many_requests(mut self, yes: bool) -> Self {
        self.too_many_requests = yes;
        self
    }

    /// Whether trailers-only gRPC responses with `grpc-status: 14` (UNAVAILABLE) count as
    /// endpoint failures (default: yes).
    pub fn grpc_unavailable(mut self, yes: bool) -> Self {
        self.grpc_unavailable = yes;
        self
    }

    /// Whether a response with this status and these headers is a failure of the endpoint.
    pub fn is_failure(&self, status: StatusCode, headers: &HeaderMap) -> bool {
        if status.is_server_error() {
            return self.server_errors;
        }
        if status == StatusCode::TOO_MANY_REQUESTS {
            return self.too_many_requests;
        }
        // Cost: one header lookup per response.
        self.grpc_unavailable
            && headers
                .get(GRPC_STATUS)
                .is_some_and(|v| v.as_bytes() == b"14")
    }
}

/// What kind of failure an error of the wrapped service is, as far as retries care.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum FailureKind {
    /// No connection could be made, or TLS refused it: the request was not processed.
    Connect,
    /// A connection existed but the request was not sent on it (hyper "canceled", or its
    /// task had ended: "channel closed"), or the HTTP/2 server says it did not process it.
    NotSent,
    /// The connection closed before the response head arrived; the request may have been
    /// processed.
    Closed,
    /// Anything else.
    Other,
}

/// Whether an I/O error of this kind means no TCP connection was made (refused, or no
/// route to the address).
pub(crate) fn no_connection(kind: std::io::ErrorKind) -> bool {
    use std::io::ErrorKind::*;
    matches!(
        kind,
        ConnectionRefused | AddrNotAvailable | HostUnreachable | NetworkUnreachable
    )
}

impl FailureKind {
    /// Classifies an error by walking its source chain (into the errors that `io::Error`
    /// and `h2::Error` carry, see [`chain`](crate::error::chain)).
    pub(crate) fn of(err: &(dyn StdError + 'static)) -> Self {
        // A TLS failure anywhere in the chain (a handshake refused either way, or the
        // server's alert after it, such as a refused client certificate, whatever error of
        // hyper or the socket carries it): no request was processed.
        #[cfg(feature = "tls")]
        if crate::error::chain(err)
            .any(|e| e.is::<rustls::Error>() || e.is::<crate::connect::TlsError>())
        {
            return Self::Connect;
        }
        for e in crate::error::chain(err) {
            #[cfg(feature = "tls")]
            if e.is::<crate::error::NotTaken>() {
                return Self::NotSent;
            }
            if let Some(e) = e.downcast_ref::<hyper_util::client::legacy::Error>() {
                if e.is_connect() {
                    return Self::Connect;
                }
            } else if let Some(e) = e.downcast_ref::<hyper::Error>() {
                // Canceled: the connection dropped the request before sending it. Closed:
                // the connection's task had already ended when the request asked it for
                // room (`SendRequest::ready`), so the request was never handed over.
                if e.is_canceled() || e.is_closed() {
                    return Self::NotSent;
                }
                if e.is_incomplete_message() {
                    return Self::Closed;
                }
            } else if let Some(e) = e.downcast_ref::<h2::Error>() {
                // HTTP/2 says when a stream was not processed (RFC 9113 section 8.7): it
                // was refused (REFUSED_STREAM), or it lies above the last stream id of the
                // server's GOAWAY (a graceful shutdown: h2 fails those streams with the
                // GOAWAY's NO_ERROR). Either is safe to send again, whatever the method.
                let refused = e.is_reset() && e.reason() == Some(h2::Reason::REFUSED_STREAM);
                let above_go_away =
                    e.is_go_away() && e.is_remote() && e.reason() == Some(h2::Reason::NO_ERROR);
                if refused || above_go_away {
                    return Self::NotSent;
                }
            } else if let Some(e) = e.downcast_ref::<std::io::Error>() {
                use std::io::ErrorKind::*;
                match e.kind() {
                    kind if no_connection(kind) => return Self::Connect,
                    ConnectionReset | ConnectionAborted | BrokenPipe | UnexpectedEof => {
                        return Self::Closed;
                    }
                    _ => {}
                }
            }
        }
        Self::Other
    }

    /// Whether a request that failed this way may be sent again to another endpoint.
    pub(crate) fn retryable(self, method: &Method, idempotent_on_close: bool) -> bool {
        match self {
            Self::Connect | Self::NotSent => true,
            Self::Closed => idempotent_on_close && is_idempotent(method),
            Self::Other => false,
        }
    }
}

/// RFC 9110 section 9.2.2.
fn is_idempotent(method: &Method) -> bool {
    matches!(
        *method,
        Method::GET | Method::HEAD | Method::OPTIONS | Method::TRACE | Method::PUT | Method::DELETE
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn default_classification() {
        let c = Classify::default();
        let h = HeaderMap::new();
        assert!(c.is_failure(StatusCode::SERVICE_UNAVAILABLE, &h));
        assert!(c.is_failure(StatusCode::INTERNAL_SERVER_ERROR, &h));
        assert!(!c.is_failure(StatusCode::TOO_MANY_REQUESTS, &h));
        assert!(!c.is_failure(StatusCode::NOT_FOUND, &h));
        assert!(
            c.too_many_requests(true)
                .is_failure(StatusCode::TOO_MANY_REQUESTS, &h)
        );
        assert!(
            !c.server_errors(false)
                .is_failure(StatusCode::BAD_GATEWAY, &h)
        );
        let mut g = HeaderMap::new();
        g.insert("grpc-status", http::HeaderValue::from_static("14"));
        assert!(c.is_failure(StatusCode::OK, &g));
        g.insert("grpc-status", http::HeaderValue::from_static("5"));
        assert!(!c.is_failure(StatusCode::OK, &g));
    }

    #[test]
    fn failure_kinds() {
        let refused = std::io::Error::from(std::io::ErrorKind::ConnectionRefused);
        assert_eq!(FailureKind::of(&refused), FailureKind::Connect);
        let reset = std::io::Error::from(std::io::ErrorKind::ConnectionReset);
        assert_eq!(FailureKind::of(&reset), FailureKind::Closed);
        assert!(FailureKind::Closed.retryable(&Method::PUT, true));
        assert!(!FailureKind::Closed.retryable(&Method::POST, true));
        assert!(!FailureKind::Closed.retryable(&Method::GET, false));
        assert!(FailureKind::Connect.retryable(&Method::POST, false));
        let other = std::io::Error::other("boom");
        assert_eq!(FailureKind::of(&other), FailureKind::Other);
    }

    /// A connection whose task has ended refuses the next request in `ready()` with hyper's
    /// "channel closed": nothing was sent, so even a POST may go to another endpoint.
    #[tokio::test]
    async fn a_request_refused_by_an_ended_connection_was_not_sent() {
        use hyper::client::conn::http2;
        use hyper_util::rt::{TokioExecutor, TokioIo};

        let (client, _server) = tokio::io::duplex(64 * 1024);
        let (mut sender, connection) =
            http2::handshake::<_, _, http_body_util::Empty<bytes::Bytes>>(
                TokioExecutor::new(),
                TokioIo::new(client),
            )
            .await
            .expect("the HTTP/2 client handshake does not wait for the server");
        drop(connection);
        let err = std::future::poll_fn(|cx| sender.poll_ready(cx))
            .await
            .expect_err("the connection's task is gone");
        assert!(err.is_closed(), "{err}");
        assert_eq!(FailureKind::of(&err), FailureKind::NotSent);
        assert!(FailureKind::of(&err).retryable(&Method::POST, false));
    }
}
