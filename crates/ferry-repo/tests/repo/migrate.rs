//! Moving a repository to format 3 by copying it under the same keys: the same snapshots
//! (same ids), restorable and clean; resumable; refusing a target it must not write to.

use crate::common;

use std::sync::Arc;

use bytes::Bytes;
use common::{TestResult, assert_same_tree, memory_repo_of, noise};
use ferry_repo::{
    BackupOptions, CheckOptions, RepoError, RepoFormat, Repository, RestoreOptions, backup_tree,
    check, migrate, restore,
};
use ferry_store::{MemoryStore, ObjectKey, ObjectStore};
use tokio_util::sync::CancellationToken;

fn tree(root: &std::path::Path, seed: u8) -> std::io::Result<()> {
    std::fs::create_dir_all(root.join("small"))?;
    for n in 0..60u8 {
        let text = format!("line {n} of a small file, seed {seed}\n").repeat(usize::from(n) + 1);
        std::fs::write(root.join("small").join(format!("f{n}")), text)?;
    }
    std::fs::write(root.join("large"), noise(2 << 20, seed))
}

async fn restores(
    repo: &Repository,
    id: &ferry_repo::SnapshotId,
    source: &std::path::Path,
) -> TestResult {
    let out = tempfile::tempdir()?;
    restore(repo, id, out.path(), &RestoreOptions::default(), None, &CancellationToken::new())
        .await?;
    assert_same_tree(source, out.path());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_1_repository_moves_to_format_3_with_its_snapshots_and_keys() -> TestResult {
    let cancel = CancellationToken::new();
    let (source, _) = memory_repo_of(RepoFormat::V1).await?;
    let (a, b) = (tempfile::tempdir()?, tempfile::tempdir()?);
    tree(a.path(), 1)?;
    tree(b.path(), 2)?;
    let first = backup_tree(&source, a.path(), &BackupOptions::default(), None, &cancel).await?;
    let second = backup_tree(&source, b.path(), &BackupOptions::default(), None, &cancel).await?;

    let target = Arc::new(MemoryStore::new());
    let dyn_target: Arc<dyn ObjectStore> = target.clone();
    let (moved, report) =
        migrate(&source, Arc::clone(&dyn_target), RepoFormat::V3, 2, &cancel).await?;
    assert_eq!((report.format, report.resumed, report.snapshots), (3, false, 2), "{report:?}");
    assert_eq!(report.blobs, report.blobs_copied, "{report:?}");
    assert!(report.blobs >= 2 * 61, "{report:?}");

    // The same password opens it; it is format 3; its snapshots have the same ids, restore
    // exactly and check clean reading every byte.
    let reopened = Repository::open(Arc::clone(&dyn_target), b"secret", &cancel).await?;
    assert_eq!(reopened.config().format, RepoFormat::V3);
    assert_ne!(reopened.config().repo_id, source.config().repo_id, "a repository of its own");
    let mut ids: Vec<_> = reopened.snapshot_ids(&cancel).await?;
    ids.sort();
    let mut expected = vec![first.snapshot_id, second.snapshot_id];
    expected.sort();
    assert_eq!(ids, expected);
    for (summary, dir) in [(&first, &a), (&second, &b)] {
        restores(&reopened, &summary.snapshot_id, dir.path()).await?;
    }
    let report =
        check(&moved, CheckOptions { read_data: true, subset: None }, None, &cancel).await?;
    assert!(report.is_ok(), "{:?}", report.problems);
    let config = target.get(&ObjectKey::new("config")?, &cancel).await?;
    assert_eq!(config[0], 3);

    // Run again (as after an interruption): nothing copied twice. A new snapshot in the
    // source: only its new blobs are copied.
    let (_, again) = migrate(&source, Arc::clone(&dyn_target), RepoFormat::V3, 2, &cancel).await?;
    assert_eq!((again.resumed, again.blobs_copied, again.snapshots), (true, 0, 2), "{again:?}");
    assert_eq!(again.packs_read, 0, "no pack read for blobs the target has: {again:?}");
    let c = tempfile::tempdir()?;
    tree(c.path(), 1)?;
    std::fs::write(c.path().join("new"), noise(10_000, 9))?;
    let third = backup_tree(&source, c.path(), &BackupOptions::default(), None, &cancel).await?;
    let (moved, more) = migrate(&source, dyn_target, RepoFormat::V3, 2, &cancel).await?;
    // The new file's blob and the two directories' pages (new: the files' times differ from
    // a's); the rest of its data was a's.
    assert_eq!((more.blobs_copied, more.snapshots), (3, 3), "{more:?}");
    restores(&moved, &third.snapshot_id, c.path()).await?;
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_target_that_is_not_empty_or_another_repository_is_refused() -> TestResult {
    let cancel = CancellationToken::new();
    let (source, _) = memory_repo_of(RepoFormat::V2).await?;
    let dir = tempfile::tempdir()?;
    tree(dir.path(), 3)?;
    backup_tree(&source, dir.path(), &BackupOptions::default(), None, &cancel).await?;

    // Something else is there.
    let busy = Arc::new(MemoryStore::new());
    busy.put_if_absent(&ObjectKey::new("notes.txt")?, Bytes::from_static(b"mine"), &cancel).await?;
    let result = migrate(&source, busy.clone(), RepoFormat::V3, 1, &cancel).await;
    assert!(
        matches!(&result, Err(RepoError::InvalidInput { reason, .. }) if reason.contains("not empty")),
        "{result:?}"
    );
    assert_eq!(busy.list("", &cancel).await?.len(), 1, "nothing written");
    // Another repository (other keys) is there.
    let (_, other) = memory_repo_of(RepoFormat::V3).await?;
    let result = migrate(&source, other, RepoFormat::V3, 1, &cancel).await;
    assert!(
        matches!(&result, Err(RepoError::InvalidInput { reason, .. }) if reason.contains("other keys")),
        "{result:?}"
    );
    // Back to an older format.
    let result = migrate(&source, Arc::new(MemoryStore::new()), RepoFormat::V1, 1, &cancel).await;
    assert!(matches!(&result, Err(RepoError::InvalidInput { .. })), "{result:?}");
    Ok(())
}

/// A volume snapshot (no tree pages: its chunks are listed inline) whose data the source's
/// index lacks: the migration stops before writing any snapshot.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_source_missing_a_blob_migrates_no_snapshot() -> TestResult {
    let cancel = CancellationToken::new();
    let (source, store) = memory_repo_of(RepoFormat::V2).await?;
    let dir = tempfile::tempdir()?;
    let image = dir.path().join("disk.img");
    std::fs::write(&image, noise(3 << 20, 5))?;
    let options = ferry_repo::VolumeBackupOptions::default();
    ferry_repo::backup_volume(&source, &image, &options, None, &cancel).await?;
    for f in &store.list("index/", &cancel).await? {
        store.delete(&f.key, &cancel).await?;
    }
    let reopened: Arc<dyn ObjectStore> = store.clone();
    let damaged = Repository::open(reopened, b"secret", &cancel).await?;
    let target = Arc::new(MemoryStore::new());
    let result = migrate(&damaged, target.clone(), RepoFormat::V3, 1, &cancel).await;
    assert!(matches!(result, Err(RepoError::MissingBlob { .. })), "{result:?}");
    assert!(target.list("snapshots/", &cancel).await?.is_empty());
    Ok(())
}

/// A format 3 repository (frames) copied again into format 3: every framed blob read out of
/// its frame and written into new ones; the copy restores exactly and checks clean. A run
/// stopped after its key files (before its config) is taken up again; a target of the same
/// keys but another format is refused; a key added to the source is copied by the next run,
/// and one removed from it is reported.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_format_3_repository_copies_its_frames_and_a_run_is_taken_up_again() -> TestResult {
    let cancel = CancellationToken::new();
    let (source, source_store) = memory_repo_of(RepoFormat::V3).await?;
    let dir = tempfile::tempdir()?;
    tree(dir.path(), 6)?;
    let summary =
        backup_tree(&source, dir.path(), &BackupOptions::default(), None, &cancel).await?;

    // Only the key files there, as a run stopped before its config leaves it.
    let target = Arc::new(MemoryStore::new());
    for key in source_store.list("keys/", &cancel).await? {
        let bytes = source_store.get(&key.key, &cancel).await?;
        target.put_if_absent(&key.key, bytes, &cancel).await?;
    }
    let dyn_target: Arc<dyn ObjectStore> = target.clone();
    let (moved, report) =
        migrate(&source, Arc::clone(&dyn_target), RepoFormat::V3, 2, &cancel).await?;
    assert_eq!((report.resumed, report.snapshots), (false, 1), "{report:?}");
    let small = moved.snapshot_ids(&cancel).await?;
    assert_eq!(small, vec![summary.snapshot_id]);
    restores(&moved, &summary.snapshot_id, dir.path()).await?;
    let checked =
        check(&moved, CheckOptions { read_data: true, subset: None }, None, &cancel).await?;
    assert!(checked.is_ok(), "{:?}", checked.problems);
    let stats = moved.stats(&cancel).await?;
    let packs = target.list("data/", &cancel).await?.len() as u64;
    assert!(stats.data_blobs > packs * 10, "small files share frames: {stats:?}");

    // The same keys, another format: refused.
    let (v2_source, _) = memory_repo_of(RepoFormat::V1).await?;
    let other: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    migrate(&v2_source, Arc::clone(&other), RepoFormat::V2, 1, &cancel).await?;
    let result = migrate(&v2_source, other, RepoFormat::V3, 1, &cancel).await;
    assert!(
        matches!(&result, Err(RepoError::InvalidInput { reason, .. }) if reason.contains("format 2")),
        "{result:?}"
    );

    // A password added to the source opens the target after the next run; the source's
    // first key removed (the new password in use): reported as only in the target.
    let fast = ferry_repo::KdfParams::insecure_for_tests();
    let key_id = source.add_password(b"another-password-1234", fast, &cancel).await?;
    let (_, again) = migrate(&source, Arc::clone(&dyn_target), RepoFormat::V3, 1, &cancel).await?;
    assert_eq!(again.keys_only_in_target, 0, "{again:?}");
    Repository::open(Arc::clone(&dyn_target), b"another-password-1234", &cancel).await?;
    let source_dyn: Arc<dyn ObjectStore> = source_store.clone();
    let with_new = Repository::open(source_dyn, b"another-password-1234", &cancel).await?;
    let first = source.key_id();
    with_new.remove_key(&first, &cancel).await?;
    assert_ne!(first, key_id);
    let (_, last) = migrate(&with_new, dyn_target, RepoFormat::V3, 1, &cancel).await?;
    assert_eq!(last.keys_only_in_target, 1, "{last:?}");
    Ok(())
}

/// A copy of a format-3 repository keeps a volume's chunks framed, as its source stored them
/// (too large for a file's frame, they would otherwise be stored alone), and the volume
/// restores bit for bit from the copy.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_copy_keeps_a_volumes_chunks_framed() -> TestResult {
    use ferry_repo::format::ObjectKind;
    let cancel = CancellationToken::new();
    let (source, _) = memory_repo_of(RepoFormat::V3).await?;
    let dir = tempfile::tempdir()?;
    let image = dir.path().join("volume.img");
    std::fs::write(&image, common::text_image(4 << 20))?;
    let options = ferry_repo::VolumeBackupOptions::default();
    let b = ferry_repo::backup_volume(&source, &image, &options, None, &cancel).await?;
    let target: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let (moved, _) = migrate(&source, target, RepoFormat::V3, 2, &cancel).await?;
    for repo in [&source, &moved] {
        let locations = common::volume_chunk_locations(repo, &b.snapshot_id).await;
        assert!(locations.iter().all(|l| l.kind == ObjectKind::FramedData), "{locations:?}");
    }
    let out = dir.path().join("restored.img");
    let restore_options = ferry_repo::VolumeRestoreOptions::default();
    ferry_repo::restore_volume(&moved, &b.snapshot_id, &out, &restore_options, None, &cancel)
        .await?;
    assert!(std::fs::read(&image)? == std::fs::read(&out)?, "restored volume differs");
    let checked =
        check(&moved, CheckOptions { read_data: true, subset: None }, None, &cancel).await?;
    assert!(checked.is_ok(), "{:?}", checked.problems);
    Ok(())
}
