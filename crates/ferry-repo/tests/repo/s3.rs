//! The repository on a real S3 server (moto over HTTP): racing initialisation, the tree of
//! hard cases, volume images, and two writers backing up into one repository at once.

use crate::common;

use std::os::unix::fs::FileExt;
use std::sync::Arc;

use common::{TestResult, assert_same_tree, hard_cases_round_trip, noise, options, s3_store};
use ferry_repo::{
    BackupOptions, CheckOptions, InitOutcome, OpenOptions, RepoError, Repository, RestoreOptions,
    VolumeBackupOptions, VolumeRestoreOptions, backup_tree, backup_volume, check, restore,
    restore_volume,
};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn racing_inits_on_s3_agree_and_a_missing_repository_names_the_bucket() -> TestResult {
    let cancel = CancellationToken::new();
    let store = s3_store("repo-init-race", "team/a").await;
    let missing = Repository::open(Arc::clone(&store), b"secret", &cancel).await;
    match missing {
        Err(RepoError::NotFound { location }) => {
            assert!(location.starts_with("s3://repo-init-race/team/a"), "{location}")
        }
        other => panic!("expected NotFound, got {other:?}"),
    }
    let tasks: Vec<_> = (0..4)
        .map(|_| {
            let (store, cancel) = (Arc::clone(&store), cancel.clone());
            tokio::spawn(
                async move { Repository::init(store, b"secret", &options(), &cancel).await },
            )
        })
        .collect();
    let mut ids = Vec::new();
    let mut created = 0;
    for task in tasks {
        let (repo, outcome) = task.await??;
        created += usize::from(outcome == InitOutcome::Created);
        ids.push(repo.config().repo_id);
    }
    assert_eq!(created, 1, "exactly one node creates the repository");
    assert!(ids.iter().all(|id| *id == ids[0]));
    let opened = Repository::open(Arc::clone(&store), b"secret", &cancel).await?;
    assert_eq!(opened.config().repo_id, ids[0]);
    let wrong = Repository::open(store, b"not the password", &cancel).await;
    assert!(matches!(wrong, Err(RepoError::WrongPassword { .. })), "{wrong:?}");
    Ok(())
}

/// An open that prepares creates (the CLI's for a backup or a restore: the store's
/// conditional-write probe runs while the key is derived) answers as any open does, and its
/// probe leaves nothing behind.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_open_preparing_creates_answers_as_any_open() -> TestResult {
    let cancel = CancellationToken::new();
    let store = s3_store("repo-open-prepared", "team/b").await;
    let prepared = OpenOptions { prepare_creates: true, ..OpenOptions::default() };
    let missing = Repository::open_with(Arc::clone(&store), b"secret", &prepared, &cancel).await;
    assert!(matches!(missing, Err(RepoError::NotFound { .. })), "{missing:?}");
    Repository::init(Arc::clone(&store), b"secret", &options(), &cancel).await?;
    let wrong = Repository::open_with(Arc::clone(&store), b"not it", &prepared, &cancel).await;
    assert!(matches!(wrong, Err(RepoError::WrongPassword { tried: 1, .. })), "{wrong:?}");
    let repo = Repository::open_with(Arc::clone(&store), b"secret", &prepared, &cancel).await?;
    let source = tempfile::tempdir()?;
    std::fs::write(source.path().join("a"), noise(10_000, 3))?;
    let backed_up =
        backup_tree(&repo, source.path(), &BackupOptions::default(), None, &cancel).await?;
    let target = tempfile::tempdir()?;
    restore(
        &repo,
        &backed_up.snapshot_id,
        target.path(),
        &RestoreOptions::default(),
        None,
        &cancel,
    )
    .await?;
    assert_eq!(std::fs::read(target.path().join("a"))?, noise(10_000, 3));
    let probes: Vec<_> = store.list("probe/", &cancel).await?;
    assert!(probes.is_empty(), "{probes:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_cases_round_trip_on_s3() -> TestResult {
    let store = s3_store("repo-round-trip", "ferry").await;
    let (repo, _) =
        Repository::init(store, b"secret", &options(), &CancellationToken::new()).await?;
    hard_cases_round_trip(&repo).await
}

/// Two agents (two handles on one repository) back up a tree and a volume image at the same
/// time; a third handle restores both exactly and `check --read-data` finds nothing wrong.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn two_writers_at_once_on_s3_lose_nothing() -> TestResult {
    let cancel = CancellationToken::new();
    let store = s3_store("repo-two-writers", "ns/velero").await;
    Repository::init(Arc::clone(&store), b"secret", &options(), &cancel).await?;
    let a = Repository::open(Arc::clone(&store), b"secret", &cancel).await?;
    let b = Repository::open(Arc::clone(&store), b"secret", &cancel).await?;

    let tree = tempfile::tempdir()?;
    std::fs::create_dir(tree.path().join("d"))?;
    for i in 0..20u8 {
        std::fs::write(tree.path().join(format!("d/f{i}")), noise(256 << 10, i))?;
    }
    let images = tempfile::tempdir()?;
    let image = images.path().join("volume.img");
    let file = std::fs::File::create(&image)?;
    file.set_len(24 << 20)?;
    // f3's bytes as one aligned volume chunk: a file of the minimum chunk size is one chunk,
    // so both writers make the same blob at the same time.
    file.write_all_at(&noise(6 << 20, 50), 0)?;
    file.write_all_at(&noise(256 << 10, 3), 16 << 20)?;
    drop(file);

    let (tree_options, volume_options) = (BackupOptions::default(), VolumeBackupOptions::default());
    let (tree_backup, volume_backup) = tokio::join!(
        backup_tree(&a, tree.path(), &tree_options, None, &cancel),
        backup_volume(&b, &image, &volume_options, None, &cancel),
    );
    let (tree_backup, volume_backup) = (tree_backup?, volume_backup?);

    let reader = Repository::open(store, b"secret", &cancel).await?;
    assert_eq!(reader.snapshots(&cancel).await?.len(), 2);
    let out = tempfile::tempdir()?;
    let tree_out = out.path().join("tree");
    restore(
        &reader,
        &tree_backup.snapshot_id,
        &tree_out,
        &RestoreOptions::default(),
        None,
        &cancel,
    )
    .await?;
    assert_same_tree(tree.path(), &tree_out);
    let image_out = out.path().join("restored.img");
    restore_volume(
        &reader,
        &volume_backup.snapshot_id,
        &image_out,
        &VolumeRestoreOptions::default(),
        None,
        &cancel,
    )
    .await?;
    assert!(std::fs::read(&image)? == std::fs::read(&image_out)?, "volume differs");
    let report =
        check(&reader, CheckOptions { read_data: true, subset: None }, None, &cancel).await?;
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.snapshots, 2);
    Ok(())
}
