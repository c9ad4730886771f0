//! Backup deletion without Ferry's plugin: the agent holds each Completed DataUpload of its
//! mover with a finalizer of its own, and forgets the DataUpload's repository snapshot once
//! Velero has deleted the backup.
//!
//! Velero (v1.18) tells a third-party data mover nothing when it deletes a backup: its design's
//! `velero.io/dm-delete-backup` finalizer was never shipped, and its own DataUpload delete
//! action records snapshots only for its built-in mover. What it does, for `velero backup
//! delete` (a DeleteBackupRequest), is mark the Backup `Deleting`, delete the backup's
//! DataUploads, then delete the backup's files from its storage location, then the Backup
//! object. So every round, [`reclaim_round`]:
//!
//! 1. puts [`FINALIZER`] on each Completed DataUpload of this mover that lacks it and is not
//!    being deleted: a deleted DataUpload then stays readable (snapshot ID, location,
//!    namespace) until Ferry has handled it. The agent itself puts it in the write that marks
//!    a DataUpload Completed (`AgentConfig::completed_upload_finalizer`), so a deletion right
//!    after completion (a failed backup deleted at once) is seen too; this step covers
//!    DataUploads completed by older agents;
//! 2. for each DataUpload being deleted that carries [`FINALIZER`], looks at its backup (the
//!    `velero.io/backup-name` label) in the cluster and in the location
//!    (`backups/<name>/velero-backup.json`):
//!    - files gone and the Backup gone or `Deleting`: Velero deleted the backup, so the
//!      snapshot is forgotten (and the repository's garbage collected) and the finalizer
//!      removed;
//!    - Backup `Deleting` and its files still there: Velero is still deleting; the next round
//!      looks again (a deletion that fails leaves the backup, and so the snapshot, in place);
//!    - anything else (the DataUpload or the Backup object deleted by hand, say): Velero's
//!      backup, which its backup sync brings back from the location, may still need the
//!      snapshot, so it is kept and the finalizer removed.
//!
//! Every step is idempotent: a crash at any point leaves the finalizer for the next round, and
//! agents racing on one DataUpload do the same work (a snapshot already gone counts as
//! forgotten; finalizers change by full-object updates at the resource version read). A
//! repository that cannot be reached keeps the finalizer; the reason is logged every round.

use std::collections::BTreeSet;
use std::time::Duration;

use ferry_api::keys::BACKUP_NAME_LABEL;
use ferry_api::{DataUpload, DataUploadPhase};
use ferry_kube::ApiError;
use ferry_repo::RepoError;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::{Client, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::space::{LocationEvents, Uncollected, collect_now};
use crate::{MoverError, RepositorySource};

/// The finalizer Ferry's agents put on the Completed DataUploads of their mover.
pub const FINALIZER: &str = "ferry.io/repository-snapshot";

/// What one round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct ReclaimRound {
    /// DataUploads that got [`FINALIZER`].
    pub held: Vec<String>,
    /// DataUploads whose snapshot was forgotten (or found already gone).
    pub forgotten: Vec<String>,
    /// DataUploads released with their snapshot kept (not a backup deletion).
    pub kept: Vec<String>,
    /// DataUploads waiting for Velero to finish deleting their backup.
    pub waiting: Vec<String>,
    /// DataUploads that could not be handled this round, with the reason.
    pub failed: Vec<(String, String)>,
    /// The repositories (location, namespace) snapshots were forgotten in: their garbage is
    /// collected by [`collect`].
    pub touched: BTreeSet<(String, String)>,
}

/// Whether a Velero backup's metadata is still in its storage location.
#[async_trait::async_trait]
pub trait BackupMetadata: Send + Sync {
    /// Whether `backups/<backup>/velero-backup.json` exists under the prefix of location
    /// `location`.
    ///
    /// # Errors
    /// The location or its storage cannot be reached.
    async fn backup_exists(
        &self,
        location: &str,
        backup: &str,
        cancel: &CancellationToken,
    ) -> Result<bool, MoverError>;
}

/// What became of a DataUpload's backup, as far as its snapshot is concerned.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fate {
    /// Velero deleted the backup: forget the snapshot.
    Deleted,
    /// Velero is deleting it: look again later.
    BeingDeleted,
    /// The backup lives on (or may come back from its location): keep the snapshot.
    Kept,
}

fn fate(backup_phase: Option<&str>, files_exist: bool) -> Fate {
    match (backup_phase, files_exist) {
        (None | Some("Deleting"), false) => Fate::Deleted,
        (Some("Deleting"), true) => Fate::BeingDeleted,
        _ => Fate::Kept,
    }
}

fn backups_api(client: &Client, namespace: &str) -> Api<DynamicObject> {
    let resource = ApiResource {
        group: "velero.io".into(),
        version: "v1".into(),
        api_version: "velero.io/v1".into(),
        kind: "Backup".into(),
        plural: "backups".into(),
    };
    Api::namespaced_with(client.clone(), namespace, &resource)
}

fn api_error(step: &'static str, kind: &'static str, name: &str, e: kube::Error) -> MoverError {
    MoverError::Api { step, source: Box::new(ApiError::from_kube(kind, name, e)) }
}

/// One round of holding and releasing the DataUploads of `data_mover` in Velero's
/// `namespace`. See the module docs.
///
/// # Errors
/// Listing DataUploads failed; per-DataUpload failures are in [`ReclaimRound::failed`].
pub async fn reclaim_round(
    client: &Client,
    namespace: &str,
    data_mover: &str,
    repos: &dyn RepositorySource,
    metadata: &dyn BackupMetadata,
    cancel: &CancellationToken,
) -> Result<ReclaimRound, MoverError> {
    let api: Api<DataUpload> = Api::namespaced(client.clone(), namespace);
    let uploads = api
        .list(&ListParams::default())
        .await
        .map_err(|e| api_error("listing DataUploads", "DataUpload", namespace, e))?;
    let backups = backups_api(client, namespace);
    let mut round = ReclaimRound::default();
    for du in uploads.items.into_iter().filter(|du| du.spec.data_mover == data_mover) {
        let name = du.name_any();
        let completed =
            du.status.as_ref().and_then(|s| s.phase) == Some(DataUploadPhase::Completed);
        let held = du.finalizers().iter().any(|f| f == FINALIZER);
        if du.metadata.deletion_timestamp.is_none() {
            if completed && !held {
                let mut changed = du.clone();
                changed.metadata.finalizers.get_or_insert_default().push(FINALIZER.to_owned());
                match ferry_kube::replace(&api, &changed).await {
                    Ok(_) => round.held.push(name),
                    // Another node or Velero changed it: the next round looks again.
                    Err(ApiError::Conflict { .. } | ApiError::NotFound { .. }) => {}
                    Err(e) => round.failed.push((name, format!("holding it: {e}"))),
                }
            }
            continue;
        }
        if !held {
            continue;
        }
        match release(&api, &backups, &du, repos, metadata, cancel).await {
            Ok(Fate::Deleted) => {
                round.touched.insert((
                    du.spec.backup_storage_location.clone(),
                    du.spec.source_namespace.clone(),
                ));
                round.forgotten.push(name);
            }
            Ok(Fate::BeingDeleted) => round.waiting.push(name),
            Ok(Fate::Kept) => round.kept.push(name),
            Err(reason) => round.failed.push((name, reason)),
        }
    }
    Ok(round)
}

/// The name of the Velero Backup a DataUpload belongs to: its owner of kind Backup (Velero's
/// CSI support sets it), else its `velero.io/backup-name` label when that is surely the name
/// itself: under 63 characters (a longer name is cut and hashed to 63 in the label, which then
/// names no backup, and must never be taken for a deleted one).
fn backup_name(du: &DataUpload) -> Option<String> {
    let owner = du
        .owner_references()
        .iter()
        .find(|o| o.kind == "Backup" && o.api_version.starts_with("velero.io/"))
        .map(|o| o.name.clone());
    owner.or_else(|| du.labels().get(BACKUP_NAME_LABEL).filter(|name| name.len() < 63).cloned())
}

/// Decides a deleted DataUpload's [`Fate`], forgets its snapshot if Velero deleted the
/// backup, and removes the finalizer unless Velero is still deleting.
async fn release(
    api: &Api<DataUpload>,
    backups: &Api<DynamicObject>,
    du: &DataUpload,
    repos: &dyn RepositorySource,
    metadata: &dyn BackupMetadata,
    cancel: &CancellationToken,
) -> Result<Fate, String> {
    let name = du.name_any();
    let location = &du.spec.backup_storage_location;
    let fate = match backup_name(du) {
        // Not Velero's, or no way to tell which backup: nothing is forgotten.
        None => Fate::Kept,
        Some(backup) => {
            let phase = backups
                .get_opt(&backup)
                .await
                .map_err(|e| format!("reading Backup {backup}: {e}"))?
                .map(|b| b.data["status"]["phase"].as_str().unwrap_or_default().to_owned());
            let files = metadata
                .backup_exists(location, &backup, cancel)
                .await
                .map_err(|e| format!("looking for backup {backup} in location {location}: {e}"))?;
            fate(phase.as_deref(), files)
        }
    };
    match fate {
        Fate::BeingDeleted => return Ok(fate),
        Fate::Deleted => forget(du, repos, cancel).await?,
        Fate::Kept => tracing::warn!(
            dataupload = %name,
            "DataUpload deleted while its backup lives on (not by velero backup delete): its repository snapshot is kept"
        ),
    }
    let mut changed = du.clone();
    changed.metadata.finalizers =
        Some(du.finalizers().iter().filter(|f| *f != FINALIZER).cloned().collect());
    match ferry_kube::replace(api, &changed).await {
        Ok(_) | Err(ApiError::NotFound { .. }) => Ok(fate),
        Err(e) => Err(format!("removing the finalizer: {e}")),
    }
}

/// Forgets the DataUpload's snapshot (already gone counts as forgotten).
async fn forget(
    du: &DataUpload,
    repos: &dyn RepositorySource,
    cancel: &CancellationToken,
) -> Result<(), String> {
    let snapshot = du.status.as_ref().map(|s| s.snapshot_id.clone()).unwrap_or_default();
    if snapshot.is_empty() {
        return Ok(());
    }
    let (location, volume_ns) = (&du.spec.backup_storage_location, &du.spec.source_namespace);
    let opened = repos
        .open(location, volume_ns, cancel)
        .await
        .map_err(|e| format!("opening the repository of {location}/{volume_ns}: {e}"))?;
    let (repo, described) = (opened.repo, opened.location);
    let result = match repo.find_snapshot(&snapshot, cancel).await {
        Ok(id) => repo.forget(&id, cancel).await,
        Err(RepoError::SnapshotLookup { .. }) => Ok(()),
        Err(e) => Err(e),
    };
    result.map_err(|e| format!("forgetting {snapshot} in {described}: {e}"))?;
    tracing::info!(dataupload = %du.name_any(), %snapshot, repository = %described, "forgot the repository snapshot of a deleted backup");
    Ok(())
}

/// Collects the garbage of each repository in `pending` (where this agent forgot snapshots)
/// and removes those collected. A collection can only be relied on if it started after the
/// forget, so a repository stays pending while another collector holds its lock, a backup
/// is still running in it, or it cannot be reached: the next round tries again. Returns the
/// repositories not collected and why.
pub async fn collect(
    pending: &mut BTreeSet<(String, String)>,
    repos: &dyn RepositorySource,
    cancel: &CancellationToken,
) -> Vec<Uncollected> {
    let mut done = Vec::new();
    let mut uncollected = Vec::new();
    for (location, namespace) in pending.iter() {
        let result = match repos.open(location, namespace, cancel).await {
            Ok(opened) => collect_now(&opened, location, cancel).await.map(|_| opened.location),
            Err(e) => Err(Uncollected {
                location: location.clone(),
                repository: format!("{location}/{namespace}"),
                reason: e.to_string(),
                stopped: false,
            }),
        };
        match result {
            Ok(described) => {
                tracing::info!(repository = %described, "collected the space of deleted backups");
                done.push((location.clone(), namespace.clone()));
            }
            Err(u) => uncollected.push(u),
        }
    }
    for key in done {
        pending.remove(&key);
    }
    uncollected
}

/// What [`keep_reclaiming`] works with.
pub struct Reclaimer {
    /// The API client.
    pub client: Client,
    /// Velero's namespace.
    pub namespace: String,
    /// The `spec.datamover` handled.
    pub data_mover: String,
    /// Where the DataUploads' repositories are.
    pub repos: std::sync::Arc<dyn RepositorySource>,
    /// Where Velero's backup files are.
    pub metadata: std::sync::Arc<dyn BackupMetadata>,
    /// Where collections that stop are reported.
    pub events: LocationEvents,
}

impl std::fmt::Debug for Reclaimer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Reclaimer")
            .field("namespace", &self.namespace)
            .field("data_mover", &self.data_mover)
            .finish_non_exhaustive()
    }
}

/// Runs [`reclaim_round`] every `interval` until `stop` fires.
pub async fn keep_reclaiming(r: Reclaimer, interval: Duration, stop: CancellationToken) {
    let Reclaimer { client, namespace, data_mover, repos, metadata, events } = r;
    let mut pending = BTreeSet::new();
    loop {
        match reclaim_round(&client, &namespace, &data_mover, &*repos, &*metadata, &stop).await {
            Ok(round) => {
                for (name, reason) in &round.failed {
                    tracing::warn!(dataupload = %name, %reason, "snapshot of a deleted DataUpload not handled yet; will retry");
                }
                pending.extend(round.touched);
            }
            Err(e) => tracing::warn!(error = %e, "backup deletion round failed; will retry"),
        }
        if !pending.is_empty() {
            for u in collect(&mut pending, &*repos, &stop).await {
                events.uncollected(&u).await;
            }
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_a_backup_velero_deleted_loses_its_snapshots() {
        // Velero's deletion: Backup Deleting (or gone), then its files gone.
        assert_eq!(fate(Some("Deleting"), false), Fate::Deleted);
        assert_eq!(fate(None, false), Fate::Deleted);
        // Still deleting: the files are removed after the DataUploads.
        assert_eq!(fate(Some("Deleting"), true), Fate::BeingDeleted);
        // The Backup object deleted by hand: backup sync brings it back from its files.
        assert_eq!(fate(None, true), Fate::Kept);
        // The DataUpload deleted by hand while its backup lives on.
        assert_eq!(fate(Some("Completed"), true), Fate::Kept);
        // A backup still running (no files yet) whose DataUpload is deleted by hand.
        assert_eq!(fate(Some("WaitingForPluginOperations"), false), Fate::Kept);
        assert_eq!(fate(Some("InProgress"), false), Fate::Kept);
    }

    fn upload(labels: serde_json::Value, owners: serde_json::Value) -> DataUpload {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "velero.io/v2alpha1", "kind": "DataUpload",
            "metadata": { "name": "du", "namespace": "velero", "labels": labels,
                          "ownerReferences": owners },
            "spec": { "snapshotType": "CSI", "sourcePVC": "p", "backupStorageLocation": "default",
                      "sourceNamespace": "ns", "operationTimeout": "10m0s" },
        }))
        .expect("a DataUpload")
    }

    #[test]
    fn the_backup_is_named_by_the_owner_never_by_a_hashed_label() {
        let long = "s".repeat(70);
        let hashed = ferry_api::naming::valid_label_value(&long);
        let owner = serde_json::json!([{ "apiVersion": "velero.io/v1", "kind": "Backup",
                                         "name": long, "uid": "u" }]);
        let du = upload(serde_json::json!({ BACKUP_NAME_LABEL: hashed }), owner);
        assert_eq!(backup_name(&du).as_deref(), Some(long.as_str()));
        // Without an owner, a label that may be cut and hashed names nothing.
        let du = upload(serde_json::json!({ BACKUP_NAME_LABEL: hashed }), serde_json::json!([]));
        assert_eq!(backup_name(&du), None);
        let du = upload(serde_json::json!({ BACKUP_NAME_LABEL: "nightly" }), serde_json::json!([]));
        assert_eq!(backup_name(&du).as_deref(), Some("nightly"));
        let du = upload(serde_json::json!({}), serde_json::json!([]));
        assert_eq!(backup_name(&du), None);
    }
}
