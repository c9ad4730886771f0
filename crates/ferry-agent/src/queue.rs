//! The prepare queue (Velero's `loadConcurrency.prepareQueueLength`): at most so many
//! DataUploads and DataDownloads of this data mover may wait between acceptance and data
//! movement (Accepted or Prepared) at once, cluster-wide. New CRs beyond it stay New until
//! room frees up, so the snapshots, PVCs and pods that exposing creates do not pile up while
//! the nodes' data-movement slots are busy.
//!
//! An agent counts (a consistent read, not the watch cache) and accepts one CR at a time, so
//! one node never overshoots; two nodes accepting at the same moment may each add one, as
//! with Velero's node-agent.

use std::sync::Arc;

use kube::api::{Api, ListParams};
use tokio::sync::{Mutex, MutexGuard};

use crate::resource::{MoverCr, Phase};
use ferry_api::{DataDownload, DataUpload};

/// The limit and where to count.
#[derive(Debug, Clone)]
pub(crate) struct PrepareQueue {
    uploads: Api<DataUpload>,
    downloads: Api<DataDownload>,
    data_mover: String,
    limit: usize,
    /// Held from counting to the end of the acceptance.
    turn: Arc<Mutex<()>>,
}

/// Whether a CR in `phase` occupies the queue.
pub(crate) fn occupies(phase: Phase) -> bool {
    matches!(phase, Phase::Accepted | Phase::Prepared)
}

async fn count<C: MoverCr>(api: &Api<C>, data_mover: &str) -> Result<usize, kube::Error> {
    let list = api.list(&ListParams::default()).await?;
    Ok(list.items.iter().filter(|c| c.data_mover() == data_mover && occupies(c.phase())).count())
}

impl PrepareQueue {
    /// A queue of `limit` CRs in the namespace of `client`'s APIs.
    pub(crate) fn new(
        client: &kube::Client,
        namespace: &str,
        data_mover: &str,
        limit: usize,
    ) -> Self {
        Self {
            uploads: Api::namespaced(client.clone(), namespace),
            downloads: Api::namespaced(client.clone(), namespace),
            data_mover: data_mover.to_owned(),
            limit,
            turn: Arc::new(Mutex::new(())),
        }
    }

    /// This node's turn to count and accept; others wait until the guard drops.
    pub(crate) async fn turn(&self) -> MutexGuard<'_, ()> {
        self.turn.lock().await
    }

    /// How many CRs occupy the queue now, and whether one more fits.
    ///
    /// # Errors
    /// Listing DataUploads or DataDownloads failed.
    pub(crate) async fn room(&self) -> Result<(usize, bool), kube::Error> {
        let used = count(&self.uploads, &self.data_mover).await?
            + count(&self.downloads, &self.data_mover).await?;
        Ok((used, used < self.limit))
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
}
