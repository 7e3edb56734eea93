//! What one component asked its API server: a test wraps that component's client
//! ([`recorded`]) and reads or awaits the requests it sent, with the answers' status codes.
//! Scoped to that one client, unlike a process-wide log that parallel tests share.

use std::sync::Arc;
use std::time::{Duration, Instant};

use http::{Method, Request, StatusCode};
use kube::Client;
use kube::client::Body;
use tokio::sync::watch;

/// One request and the status of its answer.
#[derive(Clone, Debug)]
pub struct Recorded {
    /// The HTTP method.
    pub method: Method,
    /// The path, such as `/apis/multicluster.x-k8s.io/v1beta1/namespaces/ns/serviceimports/a`.
    pub path: String,
    /// The query string (empty if none), such as `watch=true&resourceVersion=42`.
    pub query: String,
    /// The status of the answer; `None` if no answer came (connection failed).
    pub status: Option<StatusCode>,
    /// When the request was sent.
    pub sent: Instant,
    /// When the answer's head arrived (or the request failed).
    pub answered: Instant,
}

impl Recorded {
    /// Whether the request may change something (not `GET`, `HEAD` or `OPTIONS`).
    pub fn is_write(&self) -> bool {
        !matches!(self.method, Method::GET | Method::HEAD | Method::OPTIONS)
    }

    /// Whether this is a `LIST` (a `GET` of a collection that is not a watch) of `resource`
    /// (the plural, such as `serviceimports`).
    pub fn is_list_of(&self, resource: &str) -> bool {
        self.method == Method::GET
            && self.path.rsplit('/').next() == Some(resource)
            && !self
                .query
                .split('&')
                .any(|p| p == "watch=true" || p == "watch=1")
    }
}

/// The requests a [`recorded`] client sent, in the order their answers came. Cheap to clone.
#[derive(Clone, Debug)]
pub struct RequestLog(Arc<watch::Sender<Vec<Recorded>>>);

impl Default for RequestLog {
    fn default() -> Self {
        Self(Arc::new(watch::channel(Vec::new()).0))
    }
}

impl RequestLog {
    /// An empty log.
    pub fn new() -> Self {
        Self::default()
    }

    /// How many requests were answered so far.
    pub fn len(&self) -> usize {
        self.0.borrow().len()
    }

    /// Whether no request was answered yet.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// The requests answered so far.
    pub fn snapshot(&self) -> Vec<Recorded> {
        self.0.borrow().clone()
    }

    /// The requests answered after the first `from`.
    pub fn since(&self, from: usize) -> Vec<Recorded> {
        self.0.borrow().get(from..).unwrap_or_default().to_vec()
    }

    /// Waits until `f` returns `Some` for the requests answered so far, re-checking at each
    /// new answer; panics after `timeout` naming `what`.
    pub async fn wait_until<T>(
        &self,
        what: &str,
        timeout: Duration,
        mut f: impl FnMut(&[Recorded]) -> Option<T>,
    ) -> T {
        let mut answers = self.0.subscribe();
        let wait = async {
            loop {
                if let Some(found) = f(&answers.borrow_and_update()) {
                    return found;
                }
                answers
                    .changed()
                    .await
                    .expect("the log outlives its receivers");
            }
        };
        tokio::time::timeout(timeout, wait)
            .await
            .unwrap_or_else(|_| panic!("timed out after {timeout:?} waiting for {what}"))
    }

    fn push(&self, recorded: Recorded) {
        self.0.send_modify(|log| log.push(recorded));
    }
}

/// `client`, recording every request it sends and the status of each answer in `log`.
pub fn recorded(client: &Client, log: &RequestLog) -> Client {
    let inner = client.clone();
    let log = log.clone();
    let service = tower::service_fn(move |request: Request<Body>| {
        let inner = inner.clone();
        let log = log.clone();
        async move {
            let method = request.method().clone();
            let path = request.uri().path().to_owned();
            let query = request.uri().query().unwrap_or_default().to_owned();
            let sent = Instant::now();
            let answer = inner.send(request).await;
            log.push(Recorded {
                method,
                path,
                query,
                status: answer.as_ref().ok().map(|r| r.status()),
                sent,
                answered: Instant::now(),
            });
            answer
        }
    });
    Client::new(service, client.default_namespace().to_owned())
}
