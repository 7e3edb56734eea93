//! The checkout: a tonic gRPC client over the `mcs-client` layer, calling
//! `loyalty.Accrual/Accrue` on `loyalty-accrual.loyalty.svc.clusterset.local`, and a load
//! driver that counts where the calls went.

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::time::Duration;

use http::uri::PathAndQuery;
use hyper::client::conn::http2;
use hyper_util::rt::TokioExecutor;
use indicatif::{ProgressBar, ProgressStyle};
use mcs_client::connect::Http2;
use mcs_client::{BufferBody, Mcs, McsLayer, Replay, Retry, Served};
use mcs_core::ClusterId;
use mcs_core::discovery::{Endpoint, Resolve, Target};
use mcs_core::endpoints::{BalancerConfig, Locality, OutlierConfig};
use mcs_core::name::ServiceRef;
use tokio::sync::watch;
use tokio::task::JoinSet;
use tonic::body::Body;
use tower::Layer;

use crate::grpc::{ACCRUE, AccrueReply, AccrueRequest, JsonCodec};
use crate::pods::{Network, Pod, Routed};

/// The service's ClusterSet name.
pub const HOST: &str = "loyalty-accrual.loyalty.svc.clusterset.local";

type Rebuild = fn(Replay<Body>) -> Body;
type Channel = Mcs<Http2<Routed, Body>, BufferBody<Rebuild>>;

/// A checkout service's client in one cluster.
#[derive(Clone)]
pub struct Checkout {
    layer: McsLayer<BufferBody<Rebuild>>,
    channel: Channel,
}

/// One answered call.
#[derive(Clone, Debug)]
pub struct Call {
    /// The cluster whose pod answered.
    pub cluster: String,
    /// The pod that answered.
    pub pod: SocketAddr,
    /// Attempts the layer made (more than one: retried after a connect failure).
    pub attempts: u32,
}

impl Checkout {
    /// A client in `cluster` whose endpoints come from `resolver`: local cluster first,
    /// connect failures retried on another endpoint, failing endpoints ejected (up to half
    /// of them), one HTTP/2 connection per endpoint, dialled through `network`.
    pub fn new(cluster: &ClusterId, resolver: impl Resolve, network: &Network) -> Self {
        let outlier = OutlierConfig {
            max_ejection_percent: 50,
            ..OutlierConfig::default()
        };
        let h2 = Http2::<_, Body>::new(
            http2::Builder::new(TokioExecutor::new()),
            Routed::new(network.clone()),
        );
        let rebuild: Rebuild = Body::new;
        let layer = McsLayer::builder(resolver, Locality::cluster(cluster.clone()))
            .balancer(BalancerConfig::default().outlier(outlier))
            .retry(Retry::new(BufferBody::new(64 * 1024, rebuild)))
            .build();
        let channel = layer.layer(h2);
        Self { layer, channel }
    }

    /// Waits until the layer balances calls to the service's `port` over endpoints that
    /// satisfy `ready` (discovery reaches the balancer through its own task, after the
    /// objects change). `false` when no call to `port` has started its discovery yet.
    pub async fn wait_for_endpoints(
        &self,
        port: u16,
        ready: impl FnMut(&[Endpoint]) -> bool,
    ) -> bool {
        let Ok(service) = ServiceRef::new(crate::loyalty::NAMESPACE, crate::loyalty::SERVICE)
        else {
            return false;
        };
        self.layer
            .wait_for_endpoints(&Target { service, port }, ready)
            .await
    }

    /// One `Accrue` call to the service's `port`. Checks that the pod that answered is the
    /// endpoint the layer says it sent the call to.
    pub async fn accrue(&self, port: u16, order: usize) -> Result<Call, String> {
        let origin = format!("http://{HOST}:{port}")
            .parse()
            .map_err(|e| format!("origin: {e}"))?;
        let mut grpc = tonic::client::Grpc::with_origin(self.channel.clone(), origin);
        grpc.ready().await.map_err(|e| chain(&*e))?;
        let request = AccrueRequest {
            order: format!("o-{order}"),
            points: u32::try_from(order % 50 + 1).unwrap_or(1),
        };
        let response = grpc
            .unary(
                tonic::Request::new(request),
                PathAndQuery::from_static(ACCRUE),
                JsonCodec::<AccrueRequest, AccrueReply>::default(),
            )
            .await
            .map_err(|status| {
                let source = std::error::Error::source(&status)
                    .map(chain)
                    .unwrap_or_default();
                format!("{}: {} {source}", status.code(), status.message())
            })?;
        let served = response
            .extensions()
            .get::<Served>()
            .cloned()
            .ok_or("the response carries no Served")?;
        let reply = response.into_inner();
        if reply.pod != served.addr() || reply.cluster != served.cluster().as_str() {
            return Err(format!(
                "{} {} answered, but the layer sent the call to {} {}",
                reply.cluster,
                reply.pod,
                served.cluster(),
                served.addr()
            ));
        }
        Ok(Call {
            cluster: reply.cluster,
            pod: reply.pod,
            attempts: served.attempts(),
        })
    }
}

/// Pods to stop once this many calls have completed.
pub struct StopAt {
    /// Completed calls before the stop.
    pub after: usize,
    /// The pods.
    pub pods: Vec<Pod>,
}

/// Calls answered in one phase of a run.
#[derive(Clone, Debug, Default)]
pub struct Phase {
    /// Calls answered.
    pub total: usize,
    /// Calls answered in each cluster.
    pub by_cluster: BTreeMap<String, usize>,
    /// Calls that needed a retry.
    pub retried: usize,
}

impl Phase {
    /// Calls answered in `cluster`.
    pub fn count(&self, cluster: &str) -> usize {
        self.by_cluster.get(cluster).copied().unwrap_or(0)
    }

    fn add(&mut self, call: &Call) {
        self.total += 1;
        *self.by_cluster.entry(call.cluster.clone()).or_default() += 1;
        self.retried += usize::from(call.attempts > 1);
    }
}

/// Where the calls of a run went.
#[derive(Debug, Default)]
pub struct Tally {
    /// Every answered call.
    pub all: Phase,
    /// Calls sent before a stop began.
    pub before: Phase,
    /// Calls sent or answered while pods were stopping.
    pub during: Phase,
    /// Calls sent after the pods had stopped.
    pub after: Phase,
    /// Calls answered by each pod.
    pub by_pod: BTreeMap<SocketAddr, usize>,
    /// Calls that failed.
    pub failed: usize,
    /// The first failure.
    pub first_error: Option<String>,
    /// Failed calls by root cause (the last part of the error's chain).
    pub causes: BTreeMap<String, usize>,
}

impl Tally {
    /// Prints the split.
    pub fn print(&self) {
        let total = self.all.total.max(1) as f64;
        let split: Vec<String> = self
            .all
            .by_cluster
            .iter()
            .map(|(c, n)| format!("{c} {n} ({:.0} %)", *n as f64 * 100.0 / total))
            .collect();
        println!(
            "   answered {} ({}), {} failed, {} retried, {} pods",
            self.all.total,
            split.join(", "),
            self.failed,
            self.all.retried,
            self.by_pod.len()
        );
        if let Some(e) = &self.first_error {
            println!("   first failure: {e}");
        }
        for (cause, n) in &self.causes {
            println!("   {n} failed: {cause}");
        }
    }
}

#[derive(Clone, Copy, Debug)]
enum When {
    Before,
    During,
    After,
}

/// Makes `n` calls to `port`, `concurrency` at a time; stops `stop`'s pods mid-run.
pub async fn drive(
    checkout: &Checkout,
    port: u16,
    n: usize,
    concurrency: usize,
    label: &str,
    stop: Option<StopAt>,
) -> Tally {
    let bar = ProgressBar::new(n as u64);
    bar.set_style(
        ProgressStyle::with_template("   {prefix:>6} [{bar:32}] {pos}/{len} {msg}")
            .unwrap_or_else(|_| ProgressStyle::default_bar())
            .progress_chars("=> "),
    );
    bar.set_prefix(label.to_owned());
    let next = Arc::new(AtomicUsize::new(0));
    let (done_tx, done_rx) = watch::channel(0usize);
    let done_tx = Arc::new(done_tx);
    // 0: running, 1: stopping, 2: stopped.
    let (phase_tx, phase_rx) = watch::channel(0u8);

    let stopper = stop.map(|stop| {
        let (mut done_rx, bar) = (done_rx.clone(), bar.clone());
        tokio::spawn(async move {
            let after = stop.after.min(n);
            let _ = done_rx.wait_for(|d| *d >= after).await;
            bar.println(format!(
                "   >>> stopping {} pods after {} calls",
                stop.pods.len(),
                stop.after
            ));
            phase_tx.send_replace(1);
            for pod in stop.pods {
                pod.stop().await;
            }
            phase_tx.send_replace(2);
        })
    });

    let mut workers = JoinSet::new();
    for _ in 0..concurrency {
        let (checkout, next, done_tx, phase, bar) = (
            checkout.clone(),
            Arc::clone(&next),
            Arc::clone(&done_tx),
            phase_rx.clone(),
            bar.clone(),
        );
        workers.spawn(async move {
            let mut mine = Vec::new();
            loop {
                let i = next.fetch_add(1, Ordering::Relaxed);
                if i >= n {
                    break;
                }
                let sent = *phase.borrow();
                let result = checkout.accrue(port, i).await;
                let when = match (sent, *phase.borrow()) {
                    (2, _) => When::After,
                    (0, 0) => When::Before,
                    _ => When::During,
                };
                let mut d = 0;
                done_tx.send_modify(|done| {
                    *done += 1;
                    d = *done;
                });
                if d % 100 == 0 {
                    bar.set_position(d as u64);
                }
                mine.push((when, result));
                // Pace the load a little so that a stop lands mid-run.
                tokio::time::sleep(Duration::from_micros(100)).await;
            }
            mine
        });
    }

    let mut tally = Tally::default();
    while let Some(joined) = workers.join_next().await {
        let results = match joined {
            Ok(results) => results,
            Err(e) => {
                tally.failed += 1;
                tally.first_error.get_or_insert(format!("worker: {e}"));
                continue;
            }
        };
        for (when, result) in results {
            match result {
                Ok(call) => {
                    tally.all.add(&call);
                    *tally.by_pod.entry(call.pod).or_default() += 1;
                    match when {
                        When::Before => tally.before.add(&call),
                        When::During => tally.during.add(&call),
                        When::After => tally.after.add(&call),
                    }
                }
                Err(e) => {
                    tally.failed += 1;
                    let cause = e.rsplit(": ").next().unwrap_or_default().to_owned();
                    *tally.causes.entry(cause).or_default() += 1;
                    tally.first_error.get_or_insert(e);
                }
            }
        }
    }
    if let Some(stopper) = stopper {
        let _ = stopper.await;
    }
    bar.finish_and_clear();
    tally
}

/// An error and its sources, `: `-separated.
pub fn chain(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(e) = source {
        text.push_str(": ");
        text.push_str(&e.to_string());
        source = e.source();
    }
    text
}
