//! Backup deletion: the repository snapshots of a deleted backup's DataUploads are forgotten
//! and their space reclaimed.
//!
//! When Velero deletes a backup it runs the delete item actions over the backup's items;
//! Ferry's DataUpload delete action (`ferry plugin`) records each of this mover's snapshots in
//! a ConfigMap `<dataupload>-ferry-info` in Velero's namespace (label
//! [`SNAPSHOT_INFO_LABEL`]; data `backupStorageLocation`, `volumeNamespace`, `snapshotID`,
//! `datamover`). Every agent runs [`forget_recorded`] periodically: it forgets each recorded
//! snapshot of its mover (a snapshot already gone counts as forgotten), runs garbage
//! collection on the repositories it touched, and deletes the record only once that
//! collection has run, so a crash at any point, or a collection that could not run (another
//! collector held the repository's lock: the plugin's records and the DataUpload finalizer
//! both forget), leaves the record for the next round. Agents racing on one record do the
//! same idempotent work; the repository's gc lock lets one collector run at a time.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_api::k8s_openapi::api::core::v1::ConfigMap;
use ferry_repo::RepoError;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use tokio_util::sync::CancellationToken;

use crate::space::{LocationEvents, Uncollected, collect_now};
use crate::{MoverError, RepositorySource};

/// The label of the snapshot records Ferry's delete action writes.
pub const SNAPSHOT_INFO_LABEL: &str = "ferry.io/data-upload-snapshot-info";

/// What one round did.
#[derive(Debug, Default, Clone, PartialEq, Eq)]
pub struct DeletionRound {
    /// Snapshots forgotten (or found already gone).
    pub forgotten: usize,
    /// Records that could not be handled this round, with the reason.
    pub failed: Vec<(String, String)>,
    /// Repositories whose space was not collected after a forget, and why.
    pub uncollected: Vec<Uncollected>,
}

/// Handles every snapshot record of `data_mover` in `namespace` once. See the module docs.
///
/// # Errors
/// Listing the records failed; per-record failures are in [`DeletionRound::failed`].
pub async fn forget_recorded(
    client: &kube::Client,
    namespace: &str,
    data_mover: &str,
    repos: &dyn RepositorySource,
    cancel: &CancellationToken,
) -> Result<DeletionRound, MoverError> {
    let maps: Api<ConfigMap> = Api::namespaced(client.clone(), namespace);
    let records = maps
        .list(&ListParams::default().labels(&format!("{SNAPSHOT_INFO_LABEL}=true")))
        .await
        .map_err(|e| MoverError::Api {
            step: "listing snapshot records of deleted backups",
            source: Box::new(ferry_kube::ApiError::from_kube("ConfigMap", SNAPSHOT_INFO_LABEL, e)),
        })?;
    let mut round = DeletionRound::default();
    // Records grouped by repository, so each repository is collected once.
    let mut by_repo: BTreeMap<(String, String), Vec<(String, String)>> = BTreeMap::new();
    for record in records.items {
        let data = record.data.clone().unwrap_or_default();
        if data.get("datamover").map(String::as_str) != Some(data_mover) {
            continue;
        }
        let get = |k: &str| data.get(k).cloned().unwrap_or_default();
        by_repo
            .entry((get("backupStorageLocation"), get("volumeNamespace")))
            .or_default()
            .push((record.name_any(), get("snapshotID")));
    }
    for ((location, volume_ns), entries) in by_repo {
        let opened = match repos.open(&location, &volume_ns, cancel).await {
            Ok(found) => {
                if let Some(warning) = &found.warning {
                    tracing::warn!(repository = %found.location, "{warning}");
                }
                found
            }
            Err(e) => {
                for (name, _) in entries {
                    round.failed.push((name, e.to_string()));
                }
                continue;
            }
        };
        let (repo, described) = (&opened.repo, &opened.location);
        let mut done = Vec::new();
        for (name, snapshot) in entries {
            let result = match repo.find_snapshot(&snapshot, cancel).await {
                Ok(id) => repo.forget(&id, cancel).await,
                Err(RepoError::SnapshotLookup { .. }) => Ok(()),
                Err(e) => Err(e),
            };
            match result {
                Ok(()) => {
                    tracing::info!(record = %name, %snapshot, repository = %described, "forgot the snapshot of a deleted backup");
                    round.forgotten += 1;
                    done.push(name);
                }
                Err(e) => round.failed.push((name, format!("repository {described}: {e}"))),
            }
        }
        if done.is_empty() {
            continue;
        }
        // Only a collection that started after the forgets frees their space: while none has
        // (another collector holds the lock, the store is unreachable, a damaged object stops
        // it) the records stay, and the next round forgets (already gone) and collects again.
        // The caller logs why, and publishes a stop.
        if let Err(u) = collect_now(&opened, &location, cancel).await {
            round.uncollected.push(u);
            continue;
        }
        for name in done {
            match maps.delete(&name, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(kube::Error::Api(status)) if status.code == 404 => {}
                Err(e) => round.failed.push((name, format!("deleting the record: {e}"))),
            }
        }
    }
    Ok(round)
}

/// Runs [`forget_recorded`] every `interval` until `stop` fires.
pub async fn keep_forgetting(
    client: kube::Client,
    namespace: String,
    data_mover: String,
    repos: std::sync::Arc<dyn RepositorySource>,
    events: LocationEvents,
    interval: Duration,
    stop: CancellationToken,
) {
    loop {
        match forget_recorded(&client, &namespace, &data_mover, &*repos, &stop).await {
            Ok(round) => {
                for (name, reason) in &round.failed {
                    tracing::warn!(record = %name, %reason, "snapshot of a deleted backup not forgotten yet; will retry");
                }
                for u in &round.uncollected {
                    events.uncollected(u).await;
                }
            }
            Err(e) => tracing::warn!(error = %e, "backup deletion round failed; will retry"),
        }
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(interval) => {}
        }
    }
}
