//! Feeds [`ZoneData`] from watches on the local cluster. A re-list is applied as one atomic
//! reset under the write lock, so queries never see half of a re-list.

use std::collections::HashSet;
use std::sync::atomic::{AtomicBool, AtomicU8, Ordering};
use std::sync::{Arc, RwLock};

use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::Namespace;
use k8s_openapi::api::discovery::v1::EndpointSlice;
use kube::api::Api;
use kube::runtime::WatchStreamExt;
use kube::runtime::watcher::{self, Event};
use mcs_core::api::{LABEL_SERVICE_NAME, v1beta1::ServiceImport};
use mcs_core::dns::ZoneData;

/// One watched kind: how its objects go into and out of the zone data.
trait Kind: kube::Resource + Clone + std::fmt::Debug + Send + 'static {
    const NAME: &'static str;
    fn key(&self) -> (String, String) {
        let meta = self.meta();
        (
            meta.namespace.clone().unwrap_or_default(),
            meta.name.clone().unwrap_or_default(),
        )
    }
    fn apply(&self, data: &mut ZoneData);
    fn delete(key: &(String, String), data: &mut ZoneData);
}

impl Kind for Namespace {
    const NAME: &'static str = "Namespace";
    fn key(&self) -> (String, String) {
        (
            String::new(),
            self.metadata.name.clone().unwrap_or_default(),
        )
    }
    fn apply(&self, data: &mut ZoneData) {
        data.set_namespace(self.metadata.name.as_deref().unwrap_or(""), true);
    }
    fn delete(key: &(String, String), data: &mut ZoneData) {
        data.set_namespace(&key.1, false);
    }
}

impl Kind for ServiceImport {
    const NAME: &'static str = "ServiceImport";
    fn apply(&self, data: &mut ZoneData) {
        if let Err(e) = data.upsert_import(self) {
            tracing::warn!(error = %e, "ignoring ServiceImport");
        }
    }
    fn delete(key: &(String, String), data: &mut ZoneData) {
        data.remove_import(&key.0, &key.1);
    }
}

impl Kind for EndpointSlice {
    const NAME: &'static str = "EndpointSlice";
    fn apply(&self, data: &mut ZoneData) {
        if let Err(e) = data.upsert_slice(self) {
            let (ns, name) = Kind::key(self);
            data.remove_slice(&ns, &name);
            tracing::warn!(error = %e, "ignoring EndpointSlice");
        }
    }
    fn delete(key: &(String, String), data: &mut ZoneData) {
        data.remove_slice(&key.0, &key.1);
    }
}

/// Runs the three watches until cancelled. `synced` turns true once all three listed.
pub(super) async fn run(
    client: kube::Client,
    data: Arc<RwLock<ZoneData>>,
    synced: Arc<AtomicBool>,
) {
    let pending = Arc::new(AtomicU8::new(3));
    let slices = watcher::Config::default().labels(LABEL_SERVICE_NAME);
    tokio::join!(
        drive(
            watcher::watcher(
                Api::<Namespace>::all(client.clone()),
                watcher::Config::default()
            )
            .default_backoff(),
            &data,
            &synced,
            &pending
        ),
        drive(
            watcher::watcher(
                Api::<ServiceImport>::all(client.clone()),
                watcher::Config::default()
            )
            .default_backoff(),
            &data,
            &synced,
            &pending
        ),
        drive(
            watcher::watcher(Api::<EndpointSlice>::all(client), slices).default_backoff(),
            &data,
            &synced,
            &pending
        ),
    );
}

async fn drive<K: Kind>(
    stream: impl Stream<Item = Result<Event<K>, watcher::Error>>,
    data: &RwLock<ZoneData>,
    synced: &AtomicBool,
    pending: &AtomicU8,
) {
    let mut stream = std::pin::pin!(stream);
    let mut known: HashSet<(String, String)> = HashSet::new();
    let mut relist: Vec<K> = Vec::new();
    let mut listed_once = false;
    while let Some(event) = stream.next().await {
        let event = match event {
            Ok(event) => event,
            Err(e) => {
                // The watcher retries by itself, with backoff (without it, a refused list
                // is retried at once, hundreds of times a second); the zone keeps its last
                // good data.
                tracing::warn!(kind = K::NAME, error = %e, "watch error");
                continue;
            }
        };
        // A poisoned lock means an earlier update panicked; the data is still usable.
        let guard = || data.write().unwrap_or_else(|e| e.into_inner());
        match event {
            Event::Apply(obj) => {
                known.insert(obj.key());
                obj.apply(&mut guard());
            }
            Event::Delete(obj) => {
                let key = obj.key();
                known.remove(&key);
                K::delete(&key, &mut guard());
            }
            Event::Init => relist.clear(),
            Event::InitApply(obj) => relist.push(obj),
            Event::InitDone => {
                let fresh: HashSet<_> = relist.iter().map(Kind::key).collect();
                let mut data = guard();
                for gone in known.difference(&fresh) {
                    K::delete(gone, &mut data);
                }
                for obj in relist.drain(..) {
                    obj.apply(&mut data);
                }
                drop(data);
                known = fresh;
                if !listed_once {
                    listed_once = true;
                    if pending.fetch_sub(1, Ordering::AcqRel) == 1 {
                        synced.store(true, Ordering::Release);
                        tracing::info!("DNS data synced");
                    }
                }
            }
        }
    }
}
