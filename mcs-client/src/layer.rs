//! [`McsLayer`] and its [`Builder`].

use std::fmt;
use std::sync::Arc;
use std::time::Duration;

use tower::Layer;

use mcs_core::discovery::{Endpoint, Resolve, Target};
use mcs_core::endpoints::{BalancerConfig, Locality};
use mcs_core::name::Zone;

use crate::classify::Classify;
use crate::connect::MakeEndpoint;
use crate::retry::{Budget, NoRetry, Retry};
use crate::service::Mcs;
use crate::shared::{RetrySettings, Shared};
use crate::target::{Registry, RegistryConfig, now};

/// A tower layer that balances requests to ClusterSet services; see the [crate docs](crate).
///
/// It wraps an endpoint factory ([`MakeEndpoint`], for example
/// [`Http`](crate::connect::Http)): `layer.layer(factory)` is an [`Mcs`] service.
/// Every service made by one layer shares its discovery (one background task per service
/// and port), its endpoint state and its retry budget; each has its own endpoint services.
#[derive(Clone)]
pub struct McsLayer<R = NoRetry> {
    shared: Arc<Shared>,
    replay: Option<R>,
}

impl McsLayer {
    /// A layer with default settings: zone `clusterset.local`, local-first balancing from
    /// `locality`, first resolution within 5 s, fail fast after 3 s without endpoints, no
    /// request timeout, 5xx counted as failures, no retries.
    pub fn new(resolver: impl Resolve, locality: Locality) -> Self {
        Self::builder(resolver, locality).build()
    }

    /// A builder starting from the defaults of [`McsLayer::new`].
    pub fn builder(resolver: impl Resolve, locality: Locality) -> Builder {
        Builder {
            resolver: Arc::new(resolver),
            locality,
            zone: Zone::default(),
            balancer: BalancerConfig::default(),
            resolution_timeout: Duration::from_secs(5),
            fail_fast: Duration::from_secs(3),
            request_timeout: None,
            classify: Classify::default(),
            idle_timeout: Some(Duration::from_secs(600)),
            retry: None,
        }
    }
}

impl<R> McsLayer<R> {
    /// What every service of this layer shares.
    #[cfg_attr(not(feature = "reqwest"), allow(dead_code))]
    pub(crate) fn shared(&self) -> &Arc<Shared> {
        &self.shared
    }

    /// How many services (service and port pairs) have live discovery.
    pub fn active_services(&self) -> usize {
        self.shared.registry.len()
    }

    /// The endpoints the layer balances `target` over now, as discovery last published them
    /// (in no particular order); `None` when no request has started its discovery yet.
    pub fn endpoints(&self, target: &Target) -> Option<Vec<Endpoint>> {
        self.shared.registry.get(target).map(|t| t.endpoints())
    }

    /// Waits until `target`'s endpoint set, as the balancer has it, satisfies `ready`: for
    /// example that an endpoint removed from discovery no longer gets new requests. Returns
    /// `false` at once when no request has started `target`'s discovery.
    pub async fn wait_for_endpoints(
        &self,
        target: &Target,
        mut ready: impl FnMut(&[Endpoint]) -> bool,
    ) -> bool {
        let Some(shared) = self.shared.registry.get(target) else {
            return false;
        };
        let mut changes = shared.subscribe();
        loop {
            if ready(&shared.endpoints()) {
                return true;
            }
            if changes.changed().await.is_err() {
                return false;
            }
        }
    }
}

impl<M: MakeEndpoint, R: Clone> Layer<M> for McsLayer<R> {
    type Service = Mcs<M, R>;

    fn layer(&self, make: M) -> Self::Service {
        Mcs::new(make, Arc::clone(&self.shared), self.replay.clone())
    }
}

impl<R> fmt::Debug for McsLayer<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("McsLayer")
            .field("registry", &self.shared.registry)
            .finish_non_exhaustive()
    }
}

/// Builds an [`McsLayer`].
#[must_use]
pub struct Builder<R = NoRetry> {
    resolver: Arc<dyn Resolve>,
    locality: Locality,
    zone: Zone,
    balancer: BalancerConfig,
    resolution_timeout: Duration,
    fail_fast: Duration,
    request_timeout: Option<Duration>,
    classify: Classify,
    idle_timeout: Option<Duration>,
    retry: Option<Retry<R>>,
}

impl<R> Builder<R> {
    /// The ClusterSet zone (default `clusterset.local`). Hosts under it are balanced; all
    /// others pass through.
    pub fn zone(mut self, zone: Zone) -> Self {
        self.zone = zone;
        self
    }

    /// The balancer settings (policy, tiering, outlier detection).
    pub fn balancer(mut self, config: BalancerConfig) -> Self {
        self.balancer = config;
        self
    }

    /// How long the first request to a service waits for its first resolution (default
    /// 5 s) before failing with [`Error::Resolve`](crate::Error::Resolve).
    pub fn resolution_timeout(mut self, timeout: Duration) -> Self {
        self.resolution_timeout = timeout;
        self
    }

    /// How long requests wait for endpoints when a service has none (default 3 s). After
    /// that, requests fail at once with [`Error::NoEndpoints`](crate::Error::NoEndpoints)
    /// until endpoints return. Zero fails at once.
    pub fn fail_fast(mut self, delay: Duration) -> Self {
        self.fail_fast = delay;
        self
    }

    /// A timeout per attempt, from pick to response head (default: none). A timed-out
    /// attempt counts as a failure of its endpoint.
    pub fn request_timeout(mut self, timeout: Duration) -> Self {
        self.request_timeout = Some(timeout);
        self
    }

    /// Which responses count as endpoint failures.
    pub fn classify(mut self, classify: Classify) -> Self {
        self.classify = classify;
        self
    }

    /// Stop discovery for a service that has had no request for this long (default 10
    /// minutes; `None` keeps every service forever). Checked every 5 s.
    pub fn idle_timeout(mut self, idle: Option<Duration>) -> Self {
        self.idle_timeout = idle;
        self
    }

    /// Retries on another endpoint after connect failures, bounded by a budget (default:
    /// off). See [`Retry`].
    pub fn retry<R2>(self, retry: Retry<R2>) -> Builder<R2> {
        Builder {
            resolver: self.resolver,
            locality: self.locality,
            zone: self.zone,
            balancer: self.balancer,
            resolution_timeout: self.resolution_timeout,
            fail_fast: self.fail_fast,
            request_timeout: self.request_timeout,
            classify: self.classify,
            idle_timeout: self.idle_timeout,
            retry: Some(retry),
        }
    }

    /// The layer.
    pub fn build(self) -> McsLayer<R> {
        let base = now();
        let registry = Registry::new(
            RegistryConfig {
                zone: self.zone,
                locality: self.locality,
                balancer: self.balancer,
                idle_timeout: self.idle_timeout,
            },
            self.resolver,
            base,
        );
        let (retry, replay) = match self.retry {
            Some(r) => (
                Some(RetrySettings {
                    max_retries: r.max_retries,
                    idempotent_on_close: r.idempotent_on_close,
                    budget: Budget::new(r.percent, r.min_per_sec, r.ttl, base),
                }),
                Some(r.replay),
            ),
            None => (None, None),
        };
        McsLayer {
            shared: Arc::new(Shared {
                registry: Arc::new(registry),
                resolution_timeout: self.resolution_timeout,
                fail_fast: self.fail_fast,
                request_timeout: self.request_timeout,
                classify: self.classify,
                retry,
            }),
            replay,
        }
    }
}

impl<R> fmt::Debug for Builder<R> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Builder")
            .field("zone", &self.zone)
            .field("locality", &self.locality)
            .field("balancer", &self.balancer)
            .field("resolution_timeout", &self.resolution_timeout)
            .field("fail_fast", &self.fail_fast)
            .field("request_timeout", &self.request_timeout)
            .field("idle_timeout", &self.idle_timeout)
            .field("retry", &self.retry.is_some())
            .finish_non_exhaustive()
    }
}
