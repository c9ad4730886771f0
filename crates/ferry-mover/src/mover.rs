//! The DataMover: volumes into the repository and back.

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use ferry_agent::{
    BackupOutcome, Breakdown, DataMover, ExposedVolume, ProgressSink, RestoreOutcome, VolumeMode,
    WorkError,
};
use ferry_api::keys::{
    BACKUP_NAME_LABEL, RESTORE_DEVICE_NODES, RESTORE_PRIVILEGED_XATTRS, RESTORE_ROOT_SETID_BITS,
    WRITE_SPARSE_FILES,
};
use ferry_api::{DataDownload, DataUpload};
use ferry_repo::{
    BackupOptions, Fidelity, Place, Progress, ProgressFn, RepoError, Repository, RestoreOptions,
    SnapshotId, SnapshotKind, VolumeBackupOptions, VolumeRestoreOptions, Withheld, backup_tree_at,
    backup_volume_at, restore_at, restore_volume_at, thread_budget,
};
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;

use crate::changed_blocks::{Base, ChangedBlocks, Planned, Refusal};
use crate::{InUse, MoverError, RepositorySource};

/// The tag holding, on a block volume's snapshot, the handle of the CSI snapshot it was read
/// from: the base a later backup asks the changed blocks since.
pub const CSI_SNAPSHOT_HANDLE_TAG: &str = "ferry.io/csi-snapshot-handle";

/// The tag saying that physical snapshot was kept after the backup, as the base of the next
/// backup's delta (`true`).
pub const CSI_SNAPSHOT_KEPT_TAG: &str = "ferry.io/csi-snapshot-kept";

/// The tag naming the CSI handle of the volume that snapshot was taken of.
pub const CSI_SOURCE_VOLUME_TAG: &str = "ferry.io/csi-source-volume";

/// The tag holding the DataUpload's name on each snapshot.
pub const DATA_UPLOAD_TAG: &str = "ferry.io/data-upload";

/// Moves data between exposed volumes and repositories from a [`RepositorySource`].
///
/// File-system restores recreate device nodes, set-ID bits of root's files and `security.*` /
/// `trusted.*` xattrs only as the agent's default [`Fidelity`] (confined unless set with
/// [`RepoMover::with_fidelity`]) and the DataDownload's `dataMoverConfig` keys
/// ([`RESTORE_DEVICE_NODES`], [`RESTORE_ROOT_SETID_BITS`], [`RESTORE_PRIVILEGED_XATTRS`])
/// allow; what was withheld is reported on the DataDownload.
#[derive(Clone)]
pub struct RepoMover {
    repos: Arc<dyn RepositorySource>,
    fidelity: Fidelity,
    /// Data movements this process runs at once (the agent's concurrency): they share the
    /// memory allowance of the data path's threads.
    jobs: usize,
    /// How block backups ask which ranges to read (`None`: they read the whole device).
    changed_blocks: Option<ChangedBlocks>,
}

impl std::fmt::Debug for RepoMover {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("RepoMover").finish_non_exhaustive()
    }
}

impl RepoMover {
    /// A mover using `repos`.
    #[must_use]
    pub fn new(repos: Arc<dyn RepositorySource>) -> Self {
        Self { repos, fidelity: Fidelity::CONFINED, jobs: 1, changed_blocks: None }
    }

    /// Runs up to `jobs` data movements at once: each gets its share of the threads the
    /// pod's memory limit allows ([`thread_budget::ThreadBudget::per_job`]).
    #[must_use]
    pub fn with_concurrent_jobs(mut self, jobs: usize) -> Self {
        self.jobs = jobs.max(1);
        self
    }

    /// Worker threads for one data movement now (the pod's limits are read again each time:
    /// they can be resized in place).
    fn threads(&self) -> usize {
        thread_budget::default_threads().per_job(self.jobs)
    }

    /// Block backups read only the snapshot's allocated ranges where the CSI driver's
    /// SnapshotMetadata service reports them (without this they read the whole device, and say
    /// changed-block tracking is off).
    #[must_use]
    pub fn with_changed_blocks(mut self, changed_blocks: ChangedBlocks) -> Self {
        self.changed_blocks = Some(changed_blocks);
        self
    }

    /// Restores with `fidelity` where the DataDownload does not say otherwise.
    #[must_use]
    pub fn with_fidelity(mut self, fidelity: Fidelity) -> Self {
        self.fidelity = fidelity;
        self
    }
}

/// The fidelity of the restore of `dd`: the agent's `default`, changed by the DataDownload's
/// `dataMoverConfig` keys set to `true` or `false`.
///
/// # Errors
/// A key set to anything else (a typo must not silently withhold or grant).
pub fn restore_fidelity(dd: &DataDownload, default: Fidelity) -> Result<Fidelity, String> {
    let config = dd.spec.data_mover_config.clone().unwrap_or_default();
    let read = |key: &str, default: bool| match config.get(key).map(|v| v.trim()) {
        None => Ok(default),
        Some(v) if v.eq_ignore_ascii_case("true") => Ok(true),
        Some(v) if v.eq_ignore_ascii_case("false") => Ok(false),
        Some(v) => Err(format!("dataMoverConfig {key} is {v:?}: use \"true\" or \"false\"")),
    };
    Ok(Fidelity {
        device_nodes: read(RESTORE_DEVICE_NODES, default.device_nodes)?,
        root_setid_bits: read(RESTORE_ROOT_SETID_BITS, default.root_setid_bits)?,
        privileged_xattrs: read(RESTORE_PRIVILEGED_XATTRS, default.privileged_xattrs)?,
    })
}

/// Warnings of a file-system restore quoted on the DataDownload (all are in the log).
const SHORTFALL_WARNINGS_SHOWN: usize = 3;

/// What the user reads when a restore withheld parts of the snapshot.
fn withheld_note(w: &Withheld) -> Option<String> {
    if !w.any() {
        return None;
    }
    let mut parts = Vec::new();
    if w.device_nodes > 0 {
        parts.push(format!(
            "{} device nodes (dataMoverConfig {RESTORE_DEVICE_NODES})",
            w.device_nodes
        ));
    }
    if w.setid_files > 0 {
        parts.push(format!(
            "the set-ID bits of {} files of root (dataMoverConfig {RESTORE_ROOT_SETID_BITS})",
            w.setid_files
        ));
    }
    if w.xattrs > 0 {
        parts.push(format!(
            "{} security.*/trusted.* extended attributes (dataMoverConfig {RESTORE_PRIVILEGED_XATTRS})",
            w.xattrs
        ));
    }
    Some(format!(
        "the restore withheld {}: they grant privileges in the volume. Set the key to \"true\" \
         on the DataDownload, or start the agents with --restore-fidelity full, to restore them",
        parts.join(", ")
    ))
}

impl RepoMover {
    /// The CR's repository, and a warning found while opening it: logged here at once
    /// (whatever becomes of the data movement), and published by the agent as a Warning
    /// Event on the CR when it completes.
    async fn open(
        &self,
        location: &str,
        namespace: &str,
        cancel: &CancellationToken,
    ) -> Result<(Repository, String, Vec<String>, Option<InUse>), WorkError> {
        let opened = self.repos.open(location, namespace, cancel).await.map_err(|e| {
            // Stopped by the token (a store or KMS call cut short): not a failure of the CR.
            if cancel.is_cancelled() { WorkError::Canceled } else { WorkError::from_error(e) }
        })?;
        if let Some(warning) = &opened.warning {
            tracing::warn!(repository = %opened.location, "{warning}");
        }
        let warnings = opened.warning.into_iter().collect();
        Ok((opened.repo, opened.location, warnings, opened.in_use))
    }
}

/// Repository errors as the agent sees them: cancellation is not a failure.
fn work_error(step: &'static str, location: &str, e: RepoError) -> WorkError {
    match e {
        RepoError::Cancelled => WorkError::Canceled,
        source => WorkError::from_error(MoverError::Repo {
            step,
            location: location.to_owned(),
            source: Box::new(source),
        }),
    }
}

fn reporter(sink: ProgressSink) -> ProgressFn {
    Arc::new(move |p: &Progress| {
        sink.set_total(p.bytes_total_estimate);
        sink.set_done(p.bytes_done);
        sink.set_breakdown(Breakdown {
            read: p.bytes_read,
            skipped: p.bytes_skipped,
            new: p.bytes_new,
        });
    })
}

/// The volume as the data path reaches it: through the descriptor opened when it was located,
/// never by its path (which may lead elsewhere by now).
fn place(volume: &ExposedVolume) -> Result<Place<'_>, WorkError> {
    use std::os::fd::AsFd;
    let fd = volume.root.as_deref().ok_or_else(|| {
        WorkError::failed(format!(
            "volume {} on node {} was not opened when it was located (or was released)",
            volume.path.display(),
            volume.node
        ))
    })?;
    Ok(Place::Opened { fd: fd.as_fd(), shown_as: &volume.path })
}

/// The identity of a volume across backups: its namespace and PVC.
fn source_of(du: &DataUpload) -> String {
    format!("{}/{}", du.spec.source_namespace, du.spec.source_pvc)
}

/// The newest snapshot of the same source and kind (with its tags): the parent of an
/// incremental backup.
async fn parent_of(
    repo: &Repository,
    source: &str,
    kind: SnapshotKind,
    cancel: &CancellationToken,
) -> Result<Option<(SnapshotId, Vec<(String, String)>)>, RepoError> {
    // A damaged manifest (another volume's, or an old one) must not stop every backup into
    // the repository: it is only not a parent candidate.
    let (snapshots, damaged) = repo.readable_snapshots(cancel).await?;
    for e in &damaged {
        tracing::warn!(error = %e, "snapshot manifest unreadable; not considered as a parent");
    }
    Ok(snapshots
        .into_iter()
        .filter(|(_, s)| s.source == source && s.kind().ok() == Some(kind))
        .max_by_key(|(_, s)| s.time)
        .map(|(id, s)| (id, s.tags)))
}

/// What the parent (with `tags`) offers a delta to a snapshot of the volume `volume`: its
/// physical snapshot, if it was kept and taken of the same volume (a PVC deleted and made
/// again under its name is another volume, whose delta from the old one means nothing).
fn base_of<'a>(parent: Option<&'a [(String, String)]>, volume: Option<&str>) -> Base<'a> {
    let Some(tags) = parent else { return Base::None };
    let tag = |key: &str| tags.iter().find(|(k, _)| k == key).map(|(_, v)| v.as_str());
    match (tag(CSI_SNAPSHOT_HANDLE_TAG), tag(CSI_SNAPSHOT_KEPT_TAG)) {
        (Some(handle), Some("true")) if !handle.is_empty() => {
            match (tag(CSI_SOURCE_VOLUME_TAG), volume) {
                (Some(was), Some(now)) if was == now => Base::Kept(handle),
                _ => Base::OtherVolume,
            }
        }
        _ => Base::NotKept,
    }
}

#[async_trait]
impl DataMover for RepoMover {
    async fn backup(
        &self,
        du: &DataUpload,
        volume: &ExposedVolume,
        progress: ProgressSink,
        cancel: CancellationToken,
    ) -> Result<BackupOutcome, WorkError> {
        // Held until the backup ends: the repository is not closed as idle under it.
        let (repo, location, warnings, _in_use) =
            self.open(&du.spec.backup_storage_location, &du.spec.source_namespace, &cancel).await?;
        let source = source_of(du);
        let kind = match volume.mode {
            VolumeMode::Filesystem => SnapshotKind::Tree,
            VolumeMode::Block => SnapshotKind::Volume,
        };
        let found = parent_of(&repo, &source, kind, &cancel)
            .await
            .map_err(|e| work_error("finding the previous backup", &location, e))?;
        let parent = found.as_ref().map(|(id, _)| *id);
        let mut tags = vec![(DATA_UPLOAD_TAG.to_owned(), du.name_any())];
        if let Some(backup) = du.labels().get(BACKUP_NAME_LABEL) {
            tags.push((BACKUP_NAME_LABEL.to_owned(), backup.clone()));
        }
        let hostname = Some(volume.node.clone());
        let report = Some(reporter(progress.clone()));
        let mut block_reads = None;
        let (snapshot_id, total, new) = match volume.mode {
            VolumeMode::Filesystem => {
                let threads = self.threads();
                let options =
                    BackupOptions { parent, tags, source, hostname, threads, ..Default::default() };
                let s = backup_tree_at(&repo, place(volume)?, &options, report, &cancel)
                    .await
                    .map_err(|e| work_error("backing up the volume", &location, e))?;
                (s.snapshot_id, s.bytes_total, s.bytes_new)
            }
            VolumeMode::Block => {
                let source_volume =
                    volume.snapshot.as_ref().and_then(|s| s.source_volume.as_deref());
                let base = base_of(found.as_ref().map(|(_, tags)| tags.as_slice()), source_volume);
                let planned = match &self.changed_blocks {
                    Some(cb) => cb
                        .plan(volume.snapshot.as_ref(), base, &cancel)
                        .await
                        .map_err(|_| WorkError::Canceled)?,
                    None => Planned::off(),
                };
                if let Some(snapshot) = &volume.snapshot {
                    tags.push((CSI_SNAPSHOT_HANDLE_TAG.to_owned(), snapshot.handle.clone()));
                    // The exposer keeps it once the backup completes.
                    if snapshot.kept {
                        tags.push((CSI_SNAPSHOT_KEPT_TAG.to_owned(), "true".to_owned()));
                    }
                    if let Some(volume) = &snapshot.source_volume {
                        tags.push((CSI_SOURCE_VOLUME_TAG.to_owned(), volume.clone()));
                    }
                }
                let mut options = VolumeBackupOptions {
                    parent,
                    tags,
                    source,
                    hostname,
                    threads: self.threads(),
                    ..Default::default()
                };
                // At most three tries: delta, allocated, whole device; each ends the chain
                // or moves down it.
                let mut planned = planned;
                let s = loop {
                    options.read_plan = planned.read_plan.clone();
                    options.plan_size = planned.plan_size;
                    let report = report.clone();
                    match backup_volume_at(&repo, place(volume)?, &options, report, &cancel).await {
                        // Refused before the snapshot was saved: the next path down.
                        Err(RepoError::InvalidInput { what, reason })
                            if planned.by_ranges()
                                && (what == "read plan"
                                    || (what == "parent snapshot" && planned.is_delta())) =>
                        {
                            let refusal = if what == "parent snapshot" {
                                Refusal::Parent(&reason)
                            } else {
                                Refusal::Ranges(&reason)
                            };
                            planned = match &self.changed_blocks {
                                Some(cb) => cb
                                    .after_refusal(
                                        volume.snapshot.as_ref(),
                                        &planned,
                                        refusal,
                                        &cancel,
                                    )
                                    .await
                                    .map_err(|_| WorkError::Canceled)?,
                                None => planned.refused(refusal),
                            };
                        }
                        other => {
                            break other.map_err(|e| {
                                work_error("backing up the block volume", &location, e)
                            })?;
                        }
                    }
                };
                block_reads = Some(planned.report(s.bytes_read, s.size));
                (s.snapshot_id, s.size, s.bytes_new)
            }
        };
        progress.set_total(total);
        progress.set_done(total);
        Ok(BackupOutcome {
            snapshot_id: snapshot_id.to_string(),
            total_bytes: total,
            incremental_bytes: new,
            data_mover_result: BTreeMap::new(),
            warnings,
            block_reads,
        })
    }

    async fn restore(
        &self,
        dd: &DataDownload,
        volume: &ExposedVolume,
        progress: ProgressSink,
        cancel: CancellationToken,
    ) -> Result<RestoreOutcome, WorkError> {
        // Read first: a mistyped key fails the DataDownload before anything is written.
        let fidelity = restore_fidelity(dd, self.fidelity).map_err(WorkError::failed)?;
        let (repo, location, warnings, _in_use) =
            self.open(&dd.spec.backup_storage_location, &dd.spec.source_namespace, &cancel).await?;
        let id = repo
            .find_snapshot(&dd.spec.snapshot_id, &cancel)
            .await
            .map_err(|e| work_error("finding the snapshot", &location, e))?;
        if let Ok(total) = u64::try_from(dd.spec.snapshot_size) {
            progress.set_total(total);
        }
        let sparse = dd
            .spec
            .data_mover_config
            .as_ref()
            .and_then(|c| c.get(WRITE_SPARSE_FILES))
            .is_some_and(|v| v.eq_ignore_ascii_case("true"));
        let report = Some(reporter(progress.clone()));
        let (mut withheld, mut shortfall) = (None, None);
        let written = match volume.mode {
            VolumeMode::Filesystem => {
                let threads = self.threads();
                let options =
                    RestoreOptions { sparse, fidelity, threads, ..RestoreOptions::default() };
                let summary = restore_at(&repo, &id, place(volume)?, &options, report, &cancel)
                    .await
                    .map_err(|e| work_error("restoring the volume", &location, e))?;
                withheld = withheld_note(&summary.withheld);
                // Entries unreadable at backup time and metadata the volume did not take: on
                // the DataDownload, not only in the agent's log.
                shortfall = summary.shortfall(SHORTFALL_WARNINGS_SHOWN);
                summary.bytes
            }
            VolumeMode::Block => {
                // A freshly provisioned volume is not known to read as zeros: write them.
                let options = VolumeRestoreOptions {
                    threads: self.threads(),
                    ..VolumeRestoreOptions::default()
                };
                restore_volume_at(&repo, &id, place(volume)?, &options, report, &cancel)
                    .await
                    .map_err(|e| work_error("restoring the block volume", &location, e))?
                    .size
            }
        };
        progress.set_total(written);
        progress.set_done(written);
        Ok(RestoreOutcome { total_bytes: written, warnings, withheld, shortfall })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use ferry_repo::{BackupOptions, InitOptions, KdfParams};
    use ferry_store::{MemoryStore, ObjectKey, ObjectStore};

    use super::*;

    #[test]
    fn a_delta_base_is_the_parents_kept_snapshot_of_the_same_volume() {
        let tags = |kept: &str, volume: Option<&str>| {
            let mut t = vec![
                (CSI_SNAPSHOT_HANDLE_TAG.to_owned(), "snap-1".to_owned()),
                (CSI_SNAPSHOT_KEPT_TAG.to_owned(), kept.to_owned()),
            ];
            t.extend(volume.map(|v| (CSI_SOURCE_VOLUME_TAG.to_owned(), v.to_owned())));
            t
        };
        assert_eq!(base_of(None, Some("vol-a")), Base::None);
        let same = tags("true", Some("vol-a"));
        assert_eq!(base_of(Some(&same), Some("vol-a")), Base::Kept("snap-1"));
        // The PVC made again: another volume under the same name.
        assert_eq!(base_of(Some(&same), Some("vol-b")), Base::OtherVolume);
        assert_eq!(base_of(Some(&same), None), Base::OtherVolume);
        let unrecorded = tags("true", None);
        assert_eq!(base_of(Some(&unrecorded), Some("vol-a")), Base::OtherVolume);
        let not_kept = tags("false", Some("vol-a"));
        assert_eq!(base_of(Some(&not_kept), Some("vol-a")), Base::NotKept);
    }

    #[tokio::test]
    async fn a_damaged_manifest_does_not_stop_the_parent_lookup() {
        let cancel = CancellationToken::new();
        let store = Arc::new(MemoryStore::new());
        let options =
            InitOptions { kdf: KdfParams::insecure_for_tests(), ..InitOptions::default() };
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        let (repo, _) = Repository::init(dyn_store, b"pw", &options, &cancel).await.unwrap();
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("f"), b"data").unwrap();
        let mut ids = Vec::new();
        for source in ["ns/a", "ns/b"] {
            let options = BackupOptions { source: source.into(), ..BackupOptions::default() };
            let summary =
                ferry_repo::backup_tree(&repo, src.path(), &options, None, &cancel).await.unwrap();
            ids.push(summary.snapshot_id);
        }
        // Damage the other volume's manifest.
        let key = ObjectKey::new(format!("snapshots/{}", ids[1])).unwrap();
        let mut bytes = store.get(&key, &cancel).await.unwrap().to_vec();
        bytes[30] ^= 1;
        store.delete(&key, &cancel).await.unwrap();
        store.put_if_absent(&key, bytes.into(), &cancel).await.unwrap();
        assert!(repo.snapshots(&cancel).await.is_err(), "the damage is seen");

        let parent = parent_of(&repo, "ns/a", SnapshotKind::Tree, &cancel).await.unwrap();
        assert_eq!(parent.map(|(id, _)| id), Some(ids[0]));
        let none = parent_of(&repo, "ns/b", SnapshotKind::Tree, &cancel).await.unwrap();
        assert_eq!(none, None, "the damaged one is no parent");
    }

    #[tokio::test]
    async fn a_file_hard_linked_three_times_counts_once_in_total_bytes() {
        let cancel = CancellationToken::new();
        let mover = memory_mover(&cancel).await;
        let src = tempfile::tempdir().unwrap();
        let data: Vec<u8> = (0..300_000u32).map(|i| (i * 31 % 251) as u8).collect();
        std::fs::write(src.path().join("a"), &data).unwrap();
        std::fs::hard_link(src.path().join("a"), src.path().join("b")).unwrap();
        std::fs::create_dir(src.path().join("sub")).unwrap();
        std::fs::hard_link(src.path().join("a"), src.path().join("sub/c")).unwrap();
        std::fs::write(src.path().join("single"), b"12345").unwrap();
        let du = upload("du-1");
        let volume = opened(src.path());
        let progress = ferry_agent::ProgressSink::new();
        let outcome = mover.backup(&du, &volume, progress, cancel).await.unwrap();
        assert_eq!(outcome.total_bytes, data.len() as u64 + 5, "each inode's data once");
    }

    /// A mover with one new repository in memory.
    async fn memory_mover(cancel: &CancellationToken) -> RepoMover {
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let options =
            InitOptions { kdf: KdfParams::insecure_for_tests(), ..InitOptions::default() };
        let (repo, _) = Repository::init(store, b"pw", &options, cancel).await.unwrap();
        RepoMover::new(Arc::new(crate::FixedRepository::new(repo, "memory")))
    }

    /// A file-system volume as the exposer hands it over: opened where it was found.
    fn opened(path: &std::path::Path) -> ExposedVolume {
        let root = std::fs::File::open(path).unwrap();
        ExposedVolume {
            node: "node-a".into(),
            path: path.to_path_buf(),
            root: Some(Arc::new(root.into())),
            holder: "pod-uid".into(),
            mode: VolumeMode::Filesystem,
            node_os: ferry_api::NodeOs::Linux,
            snapshot: None,
        }
    }

    fn upload(name: &str) -> DataUpload {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "velero.io/v2alpha1", "kind": "DataUpload",
            "metadata": { "name": name, "namespace": "velero" },
            "spec": {
                "snapshotType": "CSI", "sourcePVC": "data", "datamover": "ferry",
                "backupStorageLocation": "default", "sourceNamespace": "app",
                "operationTimeout": "10m0s",
            },
        }))
        .unwrap()
    }

    fn download(snapshot: &str) -> DataDownload {
        serde_json::from_value(serde_json::json!({
            "apiVersion": "velero.io/v2alpha1", "kind": "DataDownload",
            "metadata": { "name": "dd-1", "namespace": "velero" },
            "spec": {
                "targetVolume": { "pvc": "data", "namespace": "app", "pv": "" },
                "datamover": "ferry", "backupStorageLocation": "default",
                "sourceNamespace": "app", "snapshotID": snapshot, "operationTimeout": "10m0s",
            },
        }))
        .unwrap()
    }

    /// The volume's mount went away after it was located and an empty directory is at its
    /// path now (the node's own disk): the restore still writes into the volume it located,
    /// nothing lands at the path, and a released volume is refused.
    #[tokio::test]
    async fn data_goes_to_the_located_volume_never_to_what_is_at_its_path_later() {
        let cancel = CancellationToken::new();
        let mover = memory_mover(&cancel).await;
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("f"), b"tenant data").unwrap();
        let progress = ferry_agent::ProgressSink::new();
        let (du, source) = (upload("du-1"), opened(src.path()));
        let snapshot =
            mover.backup(&du, &source, progress, cancel.clone()).await.unwrap().snapshot_id;

        let work = tempfile::tempdir().unwrap();
        let (mount, moved) = (work.path().join("mount"), work.path().join("the-volume"));
        std::fs::create_dir(&mount).unwrap();
        let mut volume = opened(&mount);
        std::fs::rename(&mount, &moved).unwrap();
        std::fs::create_dir(&mount).unwrap();
        let progress = ferry_agent::ProgressSink::new();
        mover.restore(&download(&snapshot), &volume, progress, cancel.clone()).await.unwrap();
        assert_eq!(std::fs::read(moved.join("f")).unwrap(), b"tenant data");
        assert_eq!(std::fs::read_dir(&mount).unwrap().count(), 0, "nothing at the path");

        volume.release();
        let progress = ferry_agent::ProgressSink::new();
        let refused = mover.restore(&download(&snapshot), &volume, progress, cancel).await;
        let message = refused.unwrap_err().to_string();
        assert!(message.contains("was not opened"), "{message}");
    }

    /// A file unreadable at backup time (a write-only proc file bind-mounted over it: reading
    /// fails even as root) comes back empty: the restore's outcome says so in a warning for
    /// the DataDownload, not only in the log.
    #[tokio::test]
    async fn entries_unreadable_at_backup_are_reported_on_the_download() {
        let cancel = CancellationToken::new();
        let mover = memory_mover(&cancel).await;
        let src = tempfile::tempdir().unwrap();
        std::fs::write(src.path().join("good"), b"fine").unwrap();
        let bad = src.path().join("bad");
        std::fs::write(&bad, b"").unwrap();
        nix::mount::mount(
            Some("/proc/self/clear_refs"),
            &bad,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )
        .expect("bind mount (needs root)");
        let progress = ferry_agent::ProgressSink::new();
        let (du, source) = (upload("du-bad"), opened(src.path()));
        let backup = mover.backup(&du, &source, progress, cancel.clone()).await;
        let _ = nix::mount::umount2(&bad, nix::mount::MntFlags::MNT_DETACH);
        let snapshot = backup.unwrap().snapshot_id;

        let target = tempfile::tempdir().unwrap();
        let progress = ferry_agent::ProgressSink::new();
        let outcome = mover
            .restore(&download(&snapshot), &opened(target.path()), progress, cancel)
            .await
            .unwrap();
        assert_eq!(
            outcome.shortfall.as_deref(),
            Some(
                "1 entry was unreadable when backed up and is restored as recorded (its content \
                 missing)"
            )
        );
        assert!(outcome.warnings.is_empty(), "{:?}", outcome.warnings);
        assert_eq!(std::fs::read(target.path().join("good")).unwrap(), b"fine");
    }

    /// A tenant's snapshot holding a device node and a set-user-ID file of root (made as root
    /// on the real file system) is restored by the agent without them unless the DataDownload
    /// asks; the Completed warning says what and how. (xattrs: `ferry-repo`'s restore tests.)
    #[tokio::test]
    async fn an_agent_restore_withholds_privileges_unless_the_download_asks() {
        use std::os::unix::fs::{FileTypeExt, PermissionsExt};
        assert!(nix::unistd::geteuid().is_root(), "needs root: mknod, files of root");
        let cancel = CancellationToken::new();
        let mover = memory_mover(&cancel).await;
        let src = tempfile::tempdir().unwrap();
        let null = src.path().join("null");
        let dev = nix::sys::stat::makedev(1, 3);
        nix::sys::stat::mknod(
            &null,
            nix::sys::stat::SFlag::S_IFCHR,
            nix::sys::stat::Mode::from_bits_truncate(0o666),
            dev,
        )
        .unwrap();
        let suid = src.path().join("suid");
        std::fs::write(&suid, b"#!/bin/sh\n").unwrap();
        std::fs::set_permissions(&suid, std::fs::Permissions::from_mode(0o4755)).unwrap();
        let progress = ferry_agent::ProgressSink::new();
        let snapshot = mover
            .backup(&upload("du-priv"), &opened(src.path()), progress, cancel.clone())
            .await
            .unwrap()
            .snapshot_id;

        let confined = tempfile::tempdir().unwrap();
        let progress = ferry_agent::ProgressSink::new();
        let outcome = mover
            .restore(&download(&snapshot), &opened(confined.path()), progress, cancel.clone())
            .await
            .unwrap();
        let note = outcome.withheld.expect("a withheld note");
        for part in ["1 device nodes", "1 files of root", "--restore-fidelity full"] {
            assert!(note.contains(part), "{part:?} not in: {note}");
        }
        assert!(!confined.path().join("null").exists());
        let mode = std::fs::metadata(confined.path().join("suid")).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o755);

        let full = tempfile::tempdir().unwrap();
        let mut asked = download(&snapshot);
        asked.spec.data_mover_config = Some(
            [RESTORE_DEVICE_NODES, RESTORE_ROOT_SETID_BITS, RESTORE_PRIVILEGED_XATTRS]
                .map(|k| (k.to_owned(), "true".to_owned()))
                .into(),
        );
        let progress = ferry_agent::ProgressSink::new();
        let outcome =
            mover.restore(&asked, &opened(full.path()), progress, cancel.clone()).await.unwrap();
        assert_eq!(outcome.withheld, None);
        let restored = std::fs::symlink_metadata(full.path().join("null")).unwrap();
        assert!(restored.file_type().is_char_device());
        let mode = std::fs::metadata(full.path().join("suid")).unwrap().permissions().mode();
        assert_eq!(mode & 0o7777, 0o4755);

        let mut typo = download(&snapshot);
        typo.spec.data_mover_config =
            Some([(RESTORE_DEVICE_NODES.to_owned(), "yes".to_owned())].into());
        let progress = ferry_agent::ProgressSink::new();
        let target = tempfile::tempdir().unwrap();
        let err = mover.restore(&typo, &opened(target.path()), progress, cancel).await.unwrap_err();
        assert!(err.to_string().contains("use \"true\" or \"false\""), "{err}");
        assert_eq!(std::fs::read_dir(target.path()).unwrap().count(), 0, "nothing written");
    }
}
