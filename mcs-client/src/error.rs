//! The errors the layer itself produces.
//!
//! Inside the tower stack every error travels as a [`BoxError`](tower::BoxError). The
//! layer's own errors are [`Error`]s (`err.downcast_ref::<mcs_client::Error>()`); a failure
//! of an endpoint's service comes back as an [`EndpointError`] naming the endpoint and its
//! cluster, with the service's error as its source; errors of the pass-through service are
//! returned unchanged.

use std::error::Error as StdError;
use std::fmt;
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
    #[error("resolving {service}: no endpoint set after {waited:?}: {cause}")]
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
    #[error("service {service} has no ready endpoints (none for {empty_for:?})")]
    NoEndpoints {
        /// The service and port.
        service: String,
        /// How long the set has been empty, as far as this client saw.
        empty_for: Duration,
    },
    /// The endpoint did not answer within the configured request timeout.
    #[error("request to {service} at {endpoint} timed out after {after:?}")]
    Timeout {
        /// The service and port.
        service: String,
        /// The endpoint the request went to.
        endpoint: SocketAddr,
        /// The configured timeout.
        after: Duration,
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
            Self::InvalidName { host, .. } | Self::NotAService { host, .. } => host,
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
            "request to {} failed at endpoint {} in cluster {}",
            self.service, self.endpoint, self.cluster
        )
    }
}

impl StdError for EndpointError {
    fn source(&self) -> Option<&(dyn StdError + 'static)> {
        Some(&*self.source)
    }
}
