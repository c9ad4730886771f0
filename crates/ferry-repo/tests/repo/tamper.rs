//! Damaged objects are detected and named: packs, index files, snapshots, key files.

use crate::common;

use std::sync::Arc;

use bytes::Bytes;
use common::{TestResult, memory_repo, noise};
use ferry_repo::{
    BackupOptions, CheckOptions, RepoError, Repository, RestoreOptions, SnapshotId, backup_tree,
    check, restore,
};
use ferry_store::{MemoryStore, ObjectKey, ObjectMeta, ObjectStore};
use tokio_util::sync::CancellationToken;

/// Flips one byte in the middle of an object (objects are immutable, so: delete, re-create).
async fn flip(store: &MemoryStore, key: &ObjectKey, at: Option<usize>) -> TestResult {
    let cancel = CancellationToken::new();
    let mut bytes = store.get(key, &cancel).await?.to_vec();
    let i = at.unwrap_or(bytes.len() / 2);
    bytes[i] ^= 0x20;
    store.delete(key, &cancel).await?;
    store.put_if_absent(key, Bytes::from(bytes), &cancel).await?;
    Ok(())
}

async fn listed(
    store: &MemoryStore,
    prefix: &str,
) -> Result<Vec<ObjectMeta>, Box<dyn std::error::Error>> {
    Ok(store.list(prefix, &CancellationToken::new()).await?)
}

/// A repository holding one snapshot of a 1 MiB file (one data pack, one tree pack).
async fn fixture()
-> Result<(Repository, Arc<MemoryStore>, SnapshotId, tempfile::TempDir), Box<dyn std::error::Error>>
{
    let (repo, store) = memory_repo().await;
    let src = tempfile::tempdir()?;
    std::fs::write(src.path().join("data"), noise(1 << 20, 7))?;
    let s =
        backup_tree(&repo, src.path(), &BackupOptions::default(), None, &CancellationToken::new())
            .await?;
    Ok((repo, store, s.snapshot_id, src))
}

async fn reopen(store: &Arc<MemoryStore>) -> Result<Repository, RepoError> {
    let s: Arc<dyn ObjectStore> = store.clone();
    Repository::open(s, b"secret", &CancellationToken::new()).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_byte_in_a_data_pack_fails_restore_and_check_naming_it() -> TestResult {
    let (_, store, id, _src) = fixture().await?;
    let packs = listed(&store, "data/").await?;
    let data_pack = packs.iter().max_by_key(|m| m.size).ok_or("no pack")?;
    flip(&store, &data_pack.key, None).await?;
    let repo = reopen(&store).await?;
    let out = tempfile::tempdir()?;
    let r = restore(
        &repo,
        &id,
        out.path(),
        &RestoreOptions::default(),
        None,
        &CancellationToken::new(),
    )
    .await;
    match r {
        Err(RepoError::Corrupt { object, .. }) => {
            assert!(object.contains(data_pack.key.as_str()), "{object}")
        }
        other => panic!("expected a corruption error, got {other:?}"),
    }
    let report = check(
        &repo,
        CheckOptions { read_data: true, subset: None },
        None,
        &CancellationToken::new(),
    )
    .await?;
    assert!(
        report.problems.iter().any(|p| p.contains(data_pack.key.as_str())),
        "{:?}",
        report.problems
    );
    // Without reading data the structure is intact.
    let quick = check(&repo, CheckOptions::default(), None, &CancellationToken::new()).await?;
    assert!(quick.is_ok(), "{:?}", quick.problems);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_byte_in_a_tree_pack_fails_restore_and_check() -> TestResult {
    let (_, store, id, _src) = fixture().await?;
    let packs = listed(&store, "data/").await?;
    let tree_pack = packs.iter().min_by_key(|m| m.size).ok_or("no pack")?;
    flip(&store, &tree_pack.key, Some(20)).await?;
    let repo = reopen(&store).await?;
    let out = tempfile::tempdir()?;
    let r = restore(
        &repo,
        &id,
        out.path(),
        &RestoreOptions::default(),
        None,
        &CancellationToken::new(),
    )
    .await;
    assert!(
        matches!(&r, Err(RepoError::Corrupt { object, .. }) if object.contains("tree blob")),
        "{r:?}"
    );
    let report = check(&repo, CheckOptions::default(), None, &CancellationToken::new()).await?;
    assert!(
        report.problems.iter().any(|p| p.contains(tree_pack.key.as_str())),
        "{:?}",
        report.problems
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_byte_in_an_index_is_named() -> TestResult {
    let (_, store, id, _src) = fixture().await?;
    let index = listed(&store, "index/").await?;
    flip(&store, &index[0].key, None).await?;
    let repo = reopen(&store).await?;
    let out = tempfile::tempdir()?;
    let r = restore(
        &repo,
        &id,
        out.path(),
        &RestoreOptions::default(),
        None,
        &CancellationToken::new(),
    )
    .await;
    assert!(
        matches!(&r, Err(RepoError::Corrupt { object, .. }) if object.contains(index[0].key.as_str())),
        "{r:?}"
    );
    let report = check(&repo, CheckOptions::default(), None, &CancellationToken::new()).await?;
    assert!(
        report.problems.iter().any(|p| p.contains(index[0].key.as_str())),
        "{:?}",
        report.problems
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_byte_in_a_snapshot_is_named() -> TestResult {
    let (_, store, id, _src) = fixture().await?;
    let snaps = listed(&store, "snapshots/").await?;
    flip(&store, &snaps[0].key, None).await?;
    let repo = reopen(&store).await?;
    let r = repo.load_snapshot(&id, &CancellationToken::new()).await;
    assert!(
        matches!(&r, Err(RepoError::Corrupt { object, .. }) if object.contains(snaps[0].key.as_str())),
        "{r:?}"
    );
    let report = check(&repo, CheckOptions::default(), None, &CancellationToken::new()).await?;
    assert!(
        report.problems.iter().any(|p| p.contains(snaps[0].key.as_str())),
        "{:?}",
        report.problems
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn flipped_byte_in_the_key_file_or_config_refuses_to_open() -> TestResult {
    let (_, store, _, _src) = fixture().await?;
    let keys = listed(&store, "keys/").await?;
    flip(&store, &keys[0].key, Some(keys[0].size as usize - 3)).await?;
    assert!(matches!(reopen(&store).await, Err(RepoError::WrongPassword { .. })));
    let (_, store, _, _src) = fixture().await?;
    flip(&store, &ObjectKey::new("config")?, None).await?;
    let r = reopen(&store).await;
    assert!(
        matches!(r, Err(RepoError::WrongPassword { .. }) | Err(RepoError::Corrupt { .. })),
        "{r:?}"
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleted_pack_is_reported_by_check() -> TestResult {
    let (repo, store, _, _src) = fixture().await?;
    let packs = listed(&store, "data/").await?;
    store.delete(&packs[0].key, &CancellationToken::new()).await?;
    let report = check(&repo, CheckOptions::default(), None, &CancellationToken::new()).await?;
    assert!(report.problems.iter().any(|p| p.contains("missing")), "{:?}", report.problems);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn read_data_subsets_split_the_packs_and_find_the_damage_in_one_of_them() -> TestResult {
    let (_, store, _, _src) = fixture().await?;
    let packs = listed(&store, "data/").await?;
    let data_pack = packs.iter().max_by_key(|m| m.size).ok_or("no pack")?;
    flip(&store, &data_pack.key, None).await?;
    let repo = reopen(&store).await?;
    let cancel = CancellationToken::new();
    let (mut read, mut found) = (0, 0);
    for n in 1..=3 {
        let subset = Some(ferry_repo::PackSubset::Group { n, of: 3 });
        let report = check(&repo, CheckOptions { read_data: true, subset }, None, &cancel).await?;
        read += report.packs_read;
        found += usize::from(report.problems.iter().any(|p| p.contains(data_pack.key.as_str())));
    }
    assert_eq!(read, packs.len() as u64, "the three groups read every pack once");
    assert_eq!(found, 1, "exactly the group holding the damaged pack reports it");
    let all = Some(ferry_repo::PackSubset::Percent(100.0));
    let report = check(&repo, CheckOptions { read_data: true, subset: all }, None, &cancel).await?;
    assert_eq!(report.packs_read, packs.len() as u64);
    assert!(!report.is_ok());
    Ok(())
}
