//! Repository tests over the in-memory and file-system stores.

use std::sync::Arc;

use ferry_store::{FsStore, MemoryStore, ObjectStore};
use tokio_util::sync::CancellationToken;

use super::writer::{LocalPacker, Uploader};
use super::*;
use crate::format::PackParams;

pub(crate) fn fast_options() -> InitOptions {
    InitOptions {
        kdf: KdfParams::insecure_for_tests(),
        packs: PackParams { target_size: 1 << 20 },
        ..InitOptions::default()
    }
}

fn stores() -> Vec<(Arc<dyn ObjectStore>, Option<tempfile::TempDir>)> {
    let dir = tempfile::tempdir().ok();
    let mut out: Vec<(Arc<dyn ObjectStore>, Option<tempfile::TempDir>)> =
        vec![(Arc::new(MemoryStore::new()), None)];
    if let Some(dir) = dir
        && let Ok(fs) = FsStore::open(dir.path())
    {
        out.push((Arc::new(fs), Some(dir)));
    }
    assert_eq!(out.len(), 2, "file-system store could not be created");
    out
}

#[tokio::test]
async fn init_open_wrong_password_and_missing() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    for (store, _dir) in stores() {
        let missing = Repository::open(Arc::clone(&store), b"pw", &cancel).await;
        assert!(matches!(missing, Err(RepoError::NotFound { .. })), "{missing:?}");
        let (repo, outcome) =
            Repository::init(Arc::clone(&store), b"pw", &fast_options(), &cancel).await?;
        assert_eq!(outcome, InitOutcome::Created);
        let again = Repository::open(Arc::clone(&store), b"pw", &cancel).await?;
        assert_eq!(again.config(), repo.config());
        let wrong = Repository::open(Arc::clone(&store), b"nope", &cancel).await;
        assert!(matches!(wrong, Err(RepoError::WrongPassword { tried: 1 })), "{wrong:?}");
        let (_, outcome) =
            Repository::init(Arc::clone(&store), b"pw", &fast_options(), &cancel).await?;
        assert_eq!(outcome, InitOutcome::AlreadyExisted);
    }
    Ok(())
}

#[tokio::test]
async fn racing_inits_agree_on_one_repository() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    for (store, _dir) in stores() {
        let tasks: Vec<_> = (0..4)
            .map(|_| {
                let (store, cancel) = (Arc::clone(&store), cancel.clone());
                tokio::spawn(async move {
                    Repository::init(store, b"pw", &fast_options(), &cancel).await
                })
            })
            .collect();
        let mut ids = Vec::new();
        let mut created = 0;
        for t in tasks {
            let (repo, outcome) = t
                .await
                .map_err(|e| RepoError::Internal { what: "test", reason: e.to_string() })??;
            created += usize::from(outcome == InitOutcome::Created);
            ids.push(repo.config().repo_id);
        }
        assert_eq!(created, 1);
        assert!(ids.iter().all(|id| *id == ids[0]));
        // Every surviving key file opens the one repository.
        let repo = Repository::open(Arc::clone(&store), b"pw", &cancel).await?;
        assert_eq!(repo.config().repo_id, ids[0]);
    }
    Ok(())
}

#[tokio::test]
async fn password_change_keeps_data_readable() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let (repo, _) = Repository::init(Arc::clone(&store), b"old", &fast_options(), &cancel).await?;
    let old_keys =
        store.list(layout::KEYS, &cancel).await.map_err(|e| RepoError::store("list", "keys", e))?;
    repo.add_password(b"new", KdfParams::insecure_for_tests(), &cancel).await?;
    let old_id = KeyId(layout::id_of(&old_keys[0].key).unwrap_or_default());
    repo.remove_key(&old_id, &cancel).await?;
    assert!(matches!(
        Repository::open(Arc::clone(&store), b"old", &cancel).await,
        Err(RepoError::WrongPassword { .. })
    ));
    let reopened = Repository::open(store, b"new", &cancel).await?;
    assert_eq!(reopened.config(), repo.config());
    assert!(reopened.remove_key(&old_id, &cancel).await.is_err(), "last key removed");
    Ok(())
}

/// Writes `blobs` through per-thread packers and the uploader, like a backup does.
pub(crate) async fn write_blobs(repo: &Repository, blobs: Vec<Vec<u8>>) -> RepoResult<Vec<BlobId>> {
    write_blobs_of(repo, ObjectKind::DataBlob, blobs).await
}

/// As [`write_blobs`], for blobs of `kind`.
pub(crate) async fn write_blobs_of(
    repo: &Repository,
    kind: ObjectKind,
    blobs: Vec<Vec<u8>>,
) -> RepoResult<Vec<BlobId>> {
    let cancel = CancellationToken::new();
    let index = repo.index(&cancel).await?;
    let (sink, uploader) = Uploader::start_leased(repo, Arc::clone(&index), None, &cancel);
    let stats = Arc::clone(&uploader.stats);
    let repo2 = repo.clone();
    let ids = tokio::task::spawn_blocking(move || -> RepoResult<Vec<BlobId>> {
        let mut packer = LocalPacker::new(&repo2, &sink, &stats, 3);
        let mut ids = Vec::new();
        for b in &blobs {
            let id = repo2.keys().blob_id(b);
            packer.add(kind, id, b)?;
            ids.push(id);
        }
        sink.flush(&repo2)?;
        Ok(ids)
    })
    .await
    .map_err(|e| RepoError::Internal { what: "test", reason: e.to_string() })??;
    uploader.finish().await?;
    Ok(ids)
}

#[tokio::test]
async fn blobs_written_in_packs_read_back_after_reopen() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    for (store, _dir) in stores() {
        let (repo, _) =
            Repository::init(Arc::clone(&store), b"pw", &fast_options(), &cancel).await?;
        // ~3 MiB of mixed data: several packs at the 1 MiB test target, several checkpoints.
        let blobs: Vec<Vec<u8>> = (0..40u32)
            .map(|i| {
                let mut v = vec![0u8; 80_000];
                blake3::Hasher::new_keyed(&[i as u8; 32]).finalize_xof().fill(&mut v[..40_000]);
                v
            })
            .collect();
        let ids = write_blobs(&repo, blobs.clone()).await?;
        let reopened = Repository::open(Arc::clone(&store), b"pw", &cancel).await?;
        for (id, blob) in ids.iter().zip(&blobs) {
            assert_eq!(&reopened.read_blob(id, "test", &cancel).await?, blob);
        }
        let index_files = reopened.index_ids(&cancel).await?;
        assert!(!index_files.is_empty());
        let missing = reopened.read_blob(&BlobId([0; 32]), "test", &cancel).await;
        assert!(matches!(missing, Err(RepoError::MissingBlob { .. })));
    }
    Ok(())
}
