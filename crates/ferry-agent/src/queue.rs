//! The prepare queue (Velero's `loadConcurrency.prepareQueueLength`): at most so many
//! DataUploads and DataDownloads of this data mover may wait between acceptance and data
//! movement (Accepted or Prepared) at once, cluster-wide. New CRs beyond it stay New until
//! room frees up, so the snapshots, PVCs and pods that exposing creates do not pile up while
//! the nodes' data-movement slots are busy.
//!
//! An agent counts from its controllers' caches (no request to the API server per waiting
//! CR), adding the CRs it accepted itself that its caches do not show yet, and accepts one CR
//! at a time, so one node never overshoots; two nodes accepting at the same moment may each
//! add one, as with Velero's node-agent.

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use kube::ResourceExt;
use kube::runtime::reflector::Store;
use tokio::sync::{Mutex, MutexGuard};

use crate::resource::{MoverCr, Phase};
use ferry_api::{DataDownload, DataUpload};

/// How long a CR this agent accepted counts while its cache does not show the acceptance
/// (a watch that lags longer is resynchronised by then).
const UNSEEN_ACCEPTANCE: Duration = Duration::from_secs(60);

/// How long a count waits for the caches' first listing before the reconcile fails (and is
/// retried), so a watch that cannot list shows in the log instead of a silent wait.
const CACHE_READY: Duration = Duration::from_secs(30);

/// The limit and where to count.
#[derive(Debug, Clone)]
pub(crate) struct PrepareQueue {
    uploads: Store<DataUpload>,
    downloads: Store<DataDownload>,
    data_mover: String,
    limit: usize,
    /// Held from counting to the end of the acceptance.
    turn: Arc<Mutex<()>>,
    /// CRs this agent accepted, by kind and name: the resource version they had before, and
    /// when. Each counts until the cache shows another version of it.
    accepted: Arc<std::sync::Mutex<Acceptances>>,
}

/// CRs accepted here, by kind and name: the resource version before the acceptance, and when.
type Acceptances = HashMap<(&'static str, String), (String, Instant)>;

/// Whether a CR in `phase` occupies the queue.
pub(crate) fn occupies(phase: Phase) -> bool {
    matches!(phase, Phase::Accepted | Phase::Prepared)
}

/// The CRs of `data_mover` in `store` that occupy the queue, and every CR's resource version.
fn occupying<C: MoverCr>(store: &Store<C>, data_mover: &str) -> (usize, HashMap<String, String>) {
    let state = store.state();
    let used = state.iter().filter(|c| c.data_mover() == data_mover && occupies(c.phase())).count();
    let versions =
        state.iter().map(|c| (c.name_any(), c.resource_version().unwrap_or_default())).collect();
    (used, versions)
}

impl PrepareQueue {
    /// A queue of `limit` CRs, counted in the controllers' caches `uploads` and `downloads`.
    pub(crate) fn new(
        uploads: Store<DataUpload>,
        downloads: Store<DataDownload>,
        data_mover: &str,
        limit: usize,
    ) -> Self {
        Self {
            uploads,
            downloads,
            data_mover: data_mover.to_owned(),
            limit,
            turn: Arc::new(Mutex::new(())),
            accepted: Arc::default(),
        }
    }

    /// This node's turn to count and accept; others wait until the guard drops.
    pub(crate) async fn turn(&self) -> MutexGuard<'_, ()> {
        self.turn.lock().await
    }

    /// How many CRs occupy the queue now, and whether one more fits. Waits until both caches
    /// hold their first full listing.
    ///
    /// # Errors
    /// A cache will never be ready (its controller stopped).
    pub(crate) async fn room(&self) -> Result<(usize, bool), crate::BoxError> {
        let ready = async {
            self.uploads.wait_until_ready().await?;
            self.downloads.wait_until_ready().await
        };
        match tokio::time::timeout(CACHE_READY, ready).await {
            Ok(ready) => ready?,
            Err(_) => {
                return Err(format!(
                    "the DataUpload and DataDownload caches have not finished their first \
                     listing within {CACHE_READY:?}: can the agent list and watch them?"
                )
                .into());
            }
        }
        let (uploads, upload_versions) = occupying(&self.uploads, &self.data_mover);
        let (downloads, download_versions) = occupying(&self.downloads, &self.data_mover);
        let mut accepted = self.accepted.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        accepted.retain(|(kind, name), (before, at)| {
            let versions = if *kind == <DataUpload as MoverCr>::KIND {
                &upload_versions
            } else {
                &download_versions
            };
            // Still counted: the cache shows the version before the acceptance, recently.
            versions.get(name) == Some(before) && at.elapsed() < UNSEEN_ACCEPTANCE
        });
        let used = uploads + downloads + accepted.len();
        Ok((used, used < self.limit))
    }

    /// Notes that this agent accepted `cr` (as it was before the acceptance): it counts until
    /// the cache shows its acceptance or a later version.
    pub(crate) fn accepted<C: MoverCr>(&self, cr: &C) {
        let before = cr.resource_version().unwrap_or_default();
        let mut accepted = self.accepted.lock().unwrap_or_else(std::sync::PoisonError::into_inner);
        accepted.insert((C::KIND, cr.name_any()), (before, Instant::now()));
    }

    /// The limit.
    pub(crate) fn limit(&self) -> usize {
        self.limit
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_the_phases_between_acceptance_and_movement_occupy_the_queue() {
        for phase in [Phase::Accepted, Phase::Prepared] {
            assert!(occupies(phase), "{phase:?}");
        }
        for phase in [
            Phase::New,
            Phase::InProgress,
            Phase::Canceling,
            Phase::Canceled,
            Phase::Completed,
            Phase::Failed,
        ] {
            assert!(!occupies(phase), "{phase:?}");
        }
    }

    fn cr<K: serde::de::DeserializeOwned>(
        kind: &str,
        name: &str,
        rv: &str,
        mover: &str,
        phase: &str,
    ) -> K {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "velero.io/v2alpha1", "kind": kind,
            "metadata": { "name": name, "namespace": "velero", "resourceVersion": rv },
            "spec": {
                "snapshotType": "CSI", "sourcePVC": "p", "sourceNamespace": "app",
                "datamover": mover, "backupStorageLocation": "default",
                "operationTimeout": "10m0s", "snapshotID": "s",
                "targetVolume": { "pvc": "p", "namespace": "app", "pv": "" },
            },
            "status": { "phase": phase },
        }))
        .expect("a CR")
    }

    #[tokio::test]
    async fn the_queue_counts_the_caches_and_its_own_acceptances_they_do_not_show_yet() {
        use kube::runtime::reflector::store;
        use kube::runtime::watcher::Event;
        let (uploads, mut up_writer) = store::<DataUpload>();
        let (downloads, mut down_writer) = store::<DataDownload>();
        let queue = PrepareQueue::new(uploads, downloads, "ferry", 3);
        let upload =
            |name, rv, mover, phase| cr::<DataUpload>("DataUpload", name, rv, mover, phase);
        up_writer.apply_watcher_event(&Event::Init);
        for du in [
            upload("a", "1", "ferry", "Accepted"),
            upload("other", "2", "velero", "Prepared"),
            upload("n1", "5", "ferry", "New"),
            upload("n2", "7", "ferry", "New"),
        ] {
            up_writer.apply_watcher_event(&Event::InitApply(du));
        }
        up_writer.apply_watcher_event(&Event::InitDone);
        down_writer.apply_watcher_event(&Event::Init);
        down_writer.apply_watcher_event(&Event::InitApply(cr::<DataDownload>(
            "DataDownload",
            "d",
            "3",
            "ferry",
            "Prepared",
        )));
        down_writer.apply_watcher_event(&Event::InitDone);
        assert_eq!(queue.room().await.expect("ready"), (2, true), "another mover's not counted");

        // Accepted here; the cache still shows it New: it counts, and the queue is full.
        queue.accepted(&upload("n1", "5", "ferry", "New"));
        assert_eq!(queue.room().await.expect("ready"), (3, false));
        // The cache catches up: counted once, from the cache.
        up_writer.apply_watcher_event(&Event::Apply(upload("n1", "6", "ferry", "Accepted")));
        assert_eq!(queue.room().await.expect("ready"), (3, false));
        // Moved on before the cache saw the acceptance: no longer counted.
        queue.accepted(&upload("n2", "7", "ferry", "New"));
        assert_eq!(queue.room().await.expect("ready").0, 4);
        up_writer.apply_watcher_event(&Event::Apply(upload("n2", "9", "ferry", "InProgress")));
        assert_eq!(queue.room().await.expect("ready"), (3, false));
        // Deleted: gone from the count too.
        up_writer.apply_watcher_event(&Event::Delete(upload("n1", "10", "ferry", "Accepted")));
        assert_eq!(queue.room().await.expect("ready"), (2, true));
    }
}
