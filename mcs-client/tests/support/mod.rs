//! Real HTTP servers on loopback addresses standing in for pods, and small helpers.
#![allow(dead_code, unreachable_pub)]

pub mod h2_servers;

use std::convert::Infallible;
use std::future::Future;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicU16, Ordering};
use std::time::Duration;

use bytes::Bytes;
use http::{Request, Response, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper::service::service_fn;
use hyper_util::client::legacy::Client;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use mcs_client::Http;
use mcs_client::connect::Tcp;
use mcs_core::ClusterId;
use mcs_core::discovery::{Endpoint, Target};
use mcs_core::name::ServiceRef;
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio::task::JoinSet;

/// The service every test calls.
pub const HOST: &str = "loyalty-accrual.loyalty.svc.clusterset.local";

pub fn cluster(name: &str) -> ClusterId {
    ClusterId::new(name).unwrap()
}

pub fn target(port: u16) -> Target {
    Target {
        service: ServiceRef::new("loyalty", "loyalty-accrual").unwrap(),
        port,
    }
}

/// An HTTP/1 + HTTP/2 (h2c) server on one loopback address answering
/// `<cluster> <addr> <host header>` with a configurable status.
pub struct TestServer {
    pub addr: SocketAddr,
    pub cluster: ClusterId,
    /// Requests served so far.
    served: Arc<watch::Sender<u64>>,
    /// Connections open now.
    open: Arc<watch::Sender<usize>>,
    status: Arc<AtomicU16>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl TestServer {
    /// Binds `ip:port` (port 0 picks one) and serves until stopped.
    pub async fn start(ip: IpAddr, port: u16, cluster_name: &str) -> Self {
        let listener = TcpListener::bind(SocketAddr::new(ip, port))
            .await
            .expect("bind loopback address");
        let addr = listener.local_addr().unwrap();
        let served = Arc::new(watch::Sender::new(0u64));
        let open = Arc::new(watch::Sender::new(0usize));
        let status = Arc::new(AtomicU16::new(200));
        let (stop, mut stopped) = watch::channel(false);
        let body_prefix = format!("{cluster_name} {addr}");
        let (s, st, o) = (Arc::clone(&served), Arc::clone(&status), Arc::clone(&open));
        let task = tokio::spawn(async move {
            let mut conns = JoinSet::new();
            loop {
                tokio::select! {
                    accepted = listener.accept() => {
                        let Ok((stream, _)) = accepted else { continue };
                        let (s, st, prefix) = (Arc::clone(&s), Arc::clone(&st), body_prefix.clone());
                        let open = OpenGuard::new(Arc::clone(&o));
                        let mut stopped = stopped.clone();
                        conns.spawn(async move {
                            let svc = service_fn(move |req: Request<Incoming>| {
                                let (s, st, prefix) = (Arc::clone(&s), Arc::clone(&st), prefix.clone());
                                async move {
                                    let host = req
                                        .headers()
                                        .get(http::header::HOST)
                                        .and_then(|h| h.to_str().ok())
                                        .map(str::to_owned)
                                        .or_else(|| req.uri().authority().map(|a| a.to_string()))
                                        .unwrap_or_default();
                                    let _ = req.into_body().collect().await;
                                    s.send_modify(|n| *n += 1);
                                    let status = StatusCode::from_u16(st.load(Ordering::Relaxed)).unwrap();
                                    let body = format!("{prefix} {host}");
                                    Ok::<_, Infallible>(Response::builder().status(status).body(Full::new(Bytes::from(body))).unwrap())
                                }
                            });
                            let builder = auto::Builder::new(TokioExecutor::new());
                            let conn = builder.serve_connection(TokioIo::new(stream), svc);
                            tokio::pin!(conn);
                            tokio::select! {
                                _ = conn.as_mut() => {}
                                _ = wait_stop(&mut stopped) => {
                                    conn.as_mut().graceful_shutdown();
                                    let _ = conn.await;
                                }
                            }
                            drop(open);
                        });
                    }
                    _ = wait_stop(&mut stopped) => break,
                }
            }
            drop(listener);
            while conns.join_next().await.is_some() {}
        });
        Self {
            addr,
            cluster: cluster(cluster_name),
            served,
            open,
            status,
            stop,
            task,
        }
    }

    pub fn endpoint(&self) -> Endpoint {
        Endpoint::ready(self.addr, self.cluster.clone())
    }

    pub fn served(&self) -> u64 {
        *self.served.borrow()
    }

    /// Waits until the server has served at least `n` requests.
    pub async fn wait_served(&self, n: u64) {
        let mut rx = self.served.subscribe();
        let _ = rx.wait_for(|s| *s >= n).await;
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        *self.open.borrow()
    }

    /// Waits until the number of open connections satisfies `f`.
    pub async fn wait_connections(&self, f: impl FnMut(&usize) -> bool) {
        let mut rx = self.open.subscribe();
        let _ = rx.wait_for(f).await;
    }

    /// Makes the server answer with `status` from now on.
    pub fn set_status(&self, status: u16) {
        self.status.store(status, Ordering::Relaxed);
    }

    /// Stops accepting, finishes in-flight requests, closes connections.
    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

/// Counts a connection open until dropped.
struct OpenGuard(Arc<watch::Sender<usize>>);

impl OpenGuard {
    fn new(open: Arc<watch::Sender<usize>>) -> Self {
        open.send_modify(|n| *n += 1);
        Self(open)
    }
}

impl Drop for OpenGuard {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

async fn wait_stop(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Starts `n` servers of `cluster_name` on `127.<second>.<third>.1..=n`.
pub async fn servers(
    second: u8,
    third: u8,
    n: u8,
    port: u16,
    cluster_name: &str,
) -> Vec<TestServer> {
    let mut out = Vec::new();
    for i in 1..=n {
        out.push(
            TestServer::start(IpAddr::from([127, second, third, i]), port, cluster_name).await,
        );
    }
    out
}

/// Plaintext hyper-util clients (HTTP/1), one per endpoint, for `Full<Bytes>` bodies.
pub fn http1() -> Http<Tcp, Full<Bytes>> {
    Http::new(Client::builder(TokioExecutor::new()))
}

/// Polls `check` until it returns true or `timeout` passes; panics with `what` then.
pub async fn eventually<F, Fut>(timeout: Duration, what: &str, mut check: F)
where
    F: FnMut() -> Fut,
    Fut: Future<Output = bool>,
{
    let deadline = tokio::time::Instant::now() + timeout;
    loop {
        if check().await {
            return;
        }
        assert!(
            tokio::time::Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        tokio::time::sleep(Duration::from_millis(20)).await;
    }
}

/// A GET to the balanced service on `port`.
pub fn get(port: u16, path: &str) -> Request<Full<Bytes>> {
    Request::get(format!("http://{HOST}:{port}{path}"))
        .body(Full::new(Bytes::new()))
        .unwrap()
}

/// Reads a test server's answer: `(cluster, addr, host header)`.
pub async fn answer(response: Response<Incoming>) -> (String, SocketAddr, String) {
    let body = response.into_body().collect().await.unwrap().to_bytes();
    let text = String::from_utf8(body.to_vec()).unwrap();
    let mut parts = text.split(' ');
    let cluster = parts.next().unwrap().to_owned();
    let addr = parts.next().unwrap().parse().unwrap();
    let host = parts.next().unwrap_or_default().to_owned();
    (cluster, addr, host)
}

/// The error and its sources, on one line (`outer -> source -> ...`).
pub fn report(err: &(dyn std::error::Error + 'static)) -> String {
    let mut out = err.to_string();
    let mut cur = err.source();
    while let Some(e) = cur {
        out.push_str(" -> ");
        out.push_str(&e.to_string());
        cur = e.source();
    }
    out
}
