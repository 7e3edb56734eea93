//! The admin HTTP endpoint of the binaries (crate `mcs-cli`): `/metrics` (Prometheus text),
//! `/healthz` (alive) and `/readyz` (200 when ready; otherwise 503 with the reason as the
//! body); plus the signal handling and client set-up they share. Nothing here installs a
//! global subscriber or reads the command line: that is the binaries' business.

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::Full;
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::rt::TokioIo;
use prometheus_client::registry::Registry;
use tokio::net::TcpListener;

/// What `/readyz` reports.
pub trait Readiness: Send + Sync + 'static {
    /// `Ok` when ready; otherwise why not (the body of the 503 answer).
    fn check(&self) -> Result<(), String>;
}

/// A flag that is set once the process has synced.
impl Readiness for Arc<AtomicBool> {
    fn check(&self) -> Result<(), String> {
        if self.load(Ordering::Acquire) {
            Ok(())
        } else {
            Err("not synced".to_owned())
        }
    }
}

/// Serves the admin endpoint on `listener` until `shutdown` completes.
pub async fn serve(
    listener: TcpListener,
    registry: Arc<Mutex<Registry>>,
    ready: impl Readiness,
    shutdown: impl Future<Output = ()>,
) {
    let ready: Arc<dyn Readiness> = Arc::new(ready);
    let mut shutdown = std::pin::pin!(shutdown);
    loop {
        let (stream, _) = tokio::select! {
            accepted = listener.accept() => match accepted {
                Ok(conn) => conn,
                Err(e) => {
                    tracing::warn!(error = %e, "admin accept failed");
                    continue;
                }
            },
            () = &mut shutdown => return,
        };
        let registry = Arc::clone(&registry);
        let ready = Arc::clone(&ready);
        tokio::spawn(async move {
            let service = service_fn(move |req: Request<Incoming>| {
                let response = respond(req.uri().path(), &registry, &*ready);
                async move { Ok::<_, Infallible>(response) }
            });
            if let Err(e) = hyper::server::conn::http1::Builder::new()
                .serve_connection(TokioIo::new(stream), service)
                .await
            {
                tracing::debug!(error = %e, "admin connection ended");
            }
        });
    }
}

/// Binds the admin address.
pub async fn bind(addr: SocketAddr) -> std::io::Result<TcpListener> {
    TcpListener::bind(addr).await
}

fn respond(path: &str, registry: &Mutex<Registry>, ready: &dyn Readiness) -> Response<Full<Bytes>> {
    let (status, body) = match path {
        "/healthz" | "/livez" => (StatusCode::OK, "ok\n".to_owned()),
        "/readyz" => match ready.check() {
            Ok(()) => (StatusCode::OK, "ready\n".to_owned()),
            Err(reason) => (StatusCode::SERVICE_UNAVAILABLE, format!("{reason}\n")),
        },
        "/metrics" => {
            let mut text = String::new();
            let registry = registry.lock().unwrap_or_else(|e| e.into_inner());
            match prometheus_client::encoding::text::encode(&mut text, &registry) {
                Ok(()) => (StatusCode::OK, text),
                Err(e) => (
                    StatusCode::INTERNAL_SERVER_ERROR,
                    format!("cannot encode metrics: {e}\n"),
                ),
            }
        }
        _ => (StatusCode::NOT_FOUND, "not found\n".to_owned()),
    };
    let mut response = Response::new(Full::new(Bytes::from(body)));
    *response.status_mut() = status;
    response
}

/// Resolves when the process gets SIGINT or SIGTERM.
pub async fn shutdown_signal() {
    let ctrl_c = async {
        if let Err(e) = tokio::signal::ctrl_c().await {
            tracing::warn!(error = %e, "cannot listen for Ctrl-C");
            std::future::pending::<()>().await;
        }
    };
    #[cfg(unix)]
    let term = async {
        match tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate()) {
            Ok(mut s) => {
                s.recv().await;
            }
            Err(e) => {
                tracing::warn!(error = %e, "cannot listen for SIGTERM");
                std::future::pending::<()>().await;
            }
        }
    };
    #[cfg(not(unix))]
    let term = std::future::pending::<()>();
    tokio::select! {
        () = ctrl_c => {}
        () = term => {}
    }
    tracing::info!("shutting down");
}

/// Builds a kube client from an optional kubeconfig path and context (the in-cluster or
/// default configuration when both are absent).
pub async fn kube_client(
    kubeconfig: Option<&std::path::Path>,
    context: Option<&str>,
) -> Result<kube::Client, ClientError> {
    let options = kube::config::KubeConfigOptions {
        context: context.map(str::to_owned),
        ..Default::default()
    };
    let config = match kubeconfig {
        Some(path) => {
            let kc = kube::config::Kubeconfig::read_from(path).map_err(|e| {
                ClientError(format!("cannot read kubeconfig {}: {e}", path.display()))
            })?;
            kube::Config::from_custom_kubeconfig(kc, &options)
                .await
                .map_err(|e| ClientError(format!("kubeconfig {}: {e}", path.display())))?
        }
        None if context.is_some() => kube::Config::from_kubeconfig(&options)
            .await
            .map_err(|e| ClientError(format!("default kubeconfig: {e}")))?,
        None => kube::Config::infer()
            .await
            .map_err(|e| ClientError(format!("no Kubernetes configuration: {e}")))?,
    };
    kube::Client::try_from(config)
        .map_err(|e| ClientError(format!("cannot build a Kubernetes client: {e}")))
}

/// A Kubernetes client could not be configured.
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct ClientError(String);
