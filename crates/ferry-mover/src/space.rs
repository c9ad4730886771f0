//! Collecting the space of deleted backups, and telling the operator when a collection stops.
//!
//! After a backup deletion the agent runs garbage collection on each repository it forgot
//! snapshots in. Most failures are waits (another collector holds the lock, a backup started
//! before the mark is still running, the store cannot be reached) and the next round tries
//! again. A collection can also *stop* because it cannot prove a deletion safe (a blob a
//! snapshot references is in no index, a damaged garbage-collection object): it deletes
//! nothing then, and every round would stop again until someone looks. Those stops are
//! published as a Warning Event [`COLLECTION_STOPPED`] on the BackupStorageLocation, with
//! gc's own reason, besides the log line.

use std::time::Duration;

use ferry_agent::event_recorder::{EventRecorder, note_within_limit};
use ferry_api::BackupStorageLocation;
use ferry_api::k8s_openapi::api::core::v1::ObjectReference;
use ferry_repo::RepoError;
use ferry_repo::gc::{GcOptions, GcReport, gc};
use kube::Resource;
use kube::runtime::events::{Event, EventType, Reporter};
use tokio_util::sync::CancellationToken;

use crate::OpenedRepository;

/// The reason of the Warning Event published when a collection stops.
pub const COLLECTION_STOPPED: &str = "GarbageCollectionStopped";

/// Why a repository's space was not collected this round.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Uncollected {
    /// The BackupStorageLocation.
    pub location: String,
    /// The repository (`s3://bucket/prefix`).
    pub repository: String,
    /// gc's message.
    pub reason: String,
    /// Whether gc stopped because it could not prove its work safe (it will stop again until
    /// someone acts), rather than waited.
    pub stopped: bool,
}

/// Whether a gc failure is a stop an operator must look at, rather than a wait that passes.
#[must_use]
pub fn is_stop(e: &RepoError) -> bool {
    match e {
        // The lock held by another collector is a wait.
        RepoError::Gc { step, .. } => *step != "lock",
        // A snapshot's data in no index, damaged objects: nothing can be proven unreferenced.
        RepoError::MissingBlob { .. } => true,
        // Damaged, or too large to be Ferry's (TooLarge).
        e => e.is_damaged_object(),
    }
}

/// Collects the space of `opened` (the repository of BackupStorageLocation `location`) now,
/// without waiting for running backups.
///
/// # Errors
/// What stopped or delayed the collection.
pub async fn collect_now(
    opened: &OpenedRepository,
    location: &str,
    cancel: &CancellationToken,
) -> Result<GcReport, Uncollected> {
    let options = GcOptions { wait: Duration::ZERO, ..GcOptions::default() };
    gc(&opened.repo, &options, cancel).await.map_err(|e| Uncollected {
        location: location.to_owned(),
        repository: opened.location.clone(),
        reason: e.to_string(),
        stopped: is_stop(&e),
    })
}

/// Publishes Events about BackupStorageLocations in Velero's namespace.
#[derive(Clone)]
pub struct LocationEvents {
    recorder: EventRecorder,
    namespace: String,
}

impl std::fmt::Debug for LocationEvents {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("LocationEvents").field("namespace", &self.namespace).finish_non_exhaustive()
    }
}

impl LocationEvents {
    /// Events about the BSLs of `namespace`, reported by `ferry-agent` on `node`.
    #[must_use]
    pub fn new(client: kube::Client, namespace: impl Into<String>, node: &str) -> Self {
        let reporter = Reporter {
            controller: ferry_agent::REPORTING_CONTROLLER.to_owned(),
            instance: Some(node.to_owned()),
        };
        Self { recorder: EventRecorder::new(client, reporter), namespace: namespace.into() }
    }

    /// Logs why a collection did not happen, and publishes a Warning Event
    /// [`COLLECTION_STOPPED`] on the BSL when it stopped.
    pub async fn uncollected(&self, u: &Uncollected) {
        if !u.stopped {
            tracing::info!(location = %u.location, repository = %u.repository, reason = %u.reason, "space of deleted backups not collected yet; will retry");
            return;
        }
        tracing::warn!(location = %u.location, repository = %u.repository, reason = %u.reason, "garbage collection stopped: nothing was deleted");
        let note = format!(
            "garbage collection of repository {} stopped and deleted nothing: {}. Run `ferry \
             check --repo {}` to see what is damaged",
            u.repository, u.reason, u.repository
        );
        let event = Event {
            type_: EventType::Warning,
            reason: COLLECTION_STOPPED.to_owned(),
            note: Some(note_within_limit(note)),
            action: "CollectGarbage".to_owned(),
            secondary: None,
        };
        let regarding = ObjectReference {
            api_version: Some(BackupStorageLocation::api_version(&()).into_owned()),
            kind: Some(BackupStorageLocation::kind(&()).into_owned()),
            name: Some(u.location.clone()),
            namespace: Some(self.namespace.clone()),
            ..ObjectReference::default()
        };
        if let Err(e) = self.recorder.publish(&event, &regarding).await {
            tracing::warn!(reason = COLLECTION_STOPPED, error = %e, "publishing an event failed");
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn damaged_or_oversized_objects_stop_a_collection_and_a_held_lock_does_not() {
        let too_large = RepoError::TooLarge { object: "index x".into(), size: 9, max: 1 };
        assert!(is_stop(&too_large));
        assert!(is_stop(&RepoError::Gc { step: "sweep", reason: "r".into() }));
        assert!(!is_stop(&RepoError::Gc { step: "lock", reason: "r".into() }));
        assert!(!is_stop(&RepoError::Cancelled));
    }
}
