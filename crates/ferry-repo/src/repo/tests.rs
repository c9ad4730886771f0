//! Repository tests over the in-memory and file-system stores.

use std::sync::Arc;

use ferry_store::{FsStore, MemoryStore, ObjectStore};
use tokio_util::sync::CancellationToken;

use super::writer::{LocalPacker, Uploader};
use super::*;
use crate::format::PackParams;
use crate::format::limits::MAX_KEY_FILE_BYTES;

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
        assert!(matches!(wrong, Err(RepoError::WrongPassword { tried: 1, .. })), "{wrong:?}");
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

/// Deletes `doomed` just before the store answers a read (or, with `on_delete`, a delete) of
/// `trigger`: another process's delete landing at that moment (a node that lost an init race,
/// or `repo key remove`).
#[derive(Debug)]
struct DeleteBefore {
    store: Arc<dyn ObjectStore>,
    on_delete: bool,
    trigger: ferry_store::ObjectKey,
    doomed: ferry_store::ObjectKey,
}

#[async_trait::async_trait]
impl ferry_store::Hook for DeleteBefore {
    async fn before(&self, call: ferry_store::Call<'_>) {
        let triggered = if self.on_delete {
            call == ferry_store::Call::Delete(&self.trigger)
        } else {
            call.whole_read() == Some(&self.trigger)
        };
        if triggered {
            let _ = self.store.delete(&self.doomed, &CancellationToken::new()).await;
        }
    }
}

#[tokio::test]
async fn a_key_file_removed_after_the_listing_is_skipped() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    for (store, _dir) in stores() {
        let (repo, _) =
            Repository::init(Arc::clone(&store), b"a", &fast_options(), &cancel).await?;
        let b = repo.add_password(b"b", KdfParams::insecure_for_tests(), &cancel).await?;
        // Open with the password whose key file is listed second; the first one vanishes.
        let (gone, password): (KeyId, &[u8]) =
            if repo.key_id() < b { (repo.key_id(), b"b") } else { (b, b"a") };
        let gone_key = layout::key_file(&gone)?;
        let hook = DeleteBefore {
            store: Arc::clone(&store),
            on_delete: false,
            trigger: gone_key.clone(),
            doomed: gone_key,
        };
        let hooked: Arc<dyn ObjectStore> = Arc::new(ferry_store::Hooked::new(store, hook));
        let opened = Repository::open(hooked, password, &cancel).await?;
        assert_eq!(opened.config(), repo.config());
        assert_ne!(opened.key_id(), gone);
    }
    Ok(())
}

/// Lets a `keys/` listing through, then, before the store answers the first read of
/// `config`, initialises the repository: the key file and `config` of another node's `init`
/// landing between an open's listing of `keys/` and its read of `config`.
#[derive(Debug)]
struct InitAfterListing {
    store: Arc<dyn ObjectStore>,
    listed: tokio::sync::watch::Sender<bool>,
    done: std::sync::atomic::AtomicBool,
}

#[async_trait::async_trait]
impl ferry_store::Hook for InitAfterListing {
    async fn before(&self, call: ferry_store::Call<'_>) {
        let config = call.whole_read().is_some_and(|k| k.as_str() == "config");
        if config && !self.done.swap(true, std::sync::atomic::Ordering::SeqCst) {
            let mut listed = self.listed.subscribe();
            let wait = listed.wait_for(|l| *l);
            let waited = tokio::time::timeout(std::time::Duration::from_secs(30), wait).await;
            waited.expect("the open listed keys/ in time").expect("the hook lives");
            let (options, cancel) = (fast_options(), live());
            let init = Repository::init(Arc::clone(&self.store), b"pw", &options, &cancel);
            init.await.expect("the racing init");
        }
    }

    fn after(&self, call: ferry_store::Call<'_>, _ok: bool) {
        if matches!(call, ferry_store::Call::List(prefix) if prefix == layout::KEYS) {
            self.listed.send_replace(true);
        }
    }
}

fn live() -> CancellationToken {
    CancellationToken::new()
}

/// An open lists `keys/` while it reads `config`; when a racing `init` wrote its key file
/// after that listing and its `config` before the read, the open lists `keys/` again rather
/// than call the password wrong.
#[tokio::test]
async fn an_open_lists_the_keys_again_when_an_init_overtook_its_listing() -> RepoResult<()> {
    for (store, _dir) in stores() {
        let hook = InitAfterListing {
            store: Arc::clone(&store),
            listed: tokio::sync::watch::Sender::new(false),
            done: std::sync::atomic::AtomicBool::new(false),
        };
        let hooked: Arc<dyn ObjectStore> = Arc::new(ferry_store::Hooked::new(store, hook));
        let opened = Repository::open(Arc::clone(&hooked), b"pw", &live()).await?;
        let again = Repository::open(hooked, b"pw", &live()).await?;
        assert_eq!(opened.config(), again.config());
    }
    Ok(())
}

#[tokio::test]
async fn password_change_keeps_data_readable() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    for (store, _dir) in stores() {
        let (repo, _) =
            Repository::init(Arc::clone(&store), b"old", &fast_options(), &cancel).await?;
        let ids = write_blobs(&repo, vec![b"kept across password changes".to_vec()]).await?;
        let old_id = repo.key_id();
        let new_id = repo.change_password(b"new", KdfParams::insecure_for_tests(), &cancel).await?;
        assert_ne!(new_id, old_id);
        assert_eq!(repo.key_id(), new_id, "the handle now counts as opened with the new key");
        assert!(matches!(
            Repository::open(Arc::clone(&store), b"old", &cancel).await,
            Err(RepoError::WrongPassword { tried: 1, .. })
        ));
        let reopened = Repository::open(Arc::clone(&store), b"new", &cancel).await?;
        assert_eq!(reopened.config(), repo.config());
        assert_eq!(reopened.key_id(), new_id);
        let blob = reopened.read_blob(&ids[0], "test", &cancel).await?;
        assert_eq!(&blob[..], b"kept across password changes");
        let keys = reopened.key_files(&cancel).await?;
        assert_eq!(keys.len(), 1);
        assert!(keys[0].current && keys[0].id == new_id, "{keys:?}");
    }
    Ok(())
}

/// Replaces any key file other than `keep` with junk just before it is read: a new key file
/// that does not read back as written.
#[derive(Debug)]
struct SpoilNewKeys {
    store: Arc<dyn ObjectStore>,
    keep: ferry_store::ObjectKey,
}

#[async_trait::async_trait]
impl ferry_store::Hook for SpoilNewKeys {
    async fn before(&self, call: ferry_store::Call<'_>) {
        if let Some(key) = call.whole_read()
            && key.as_str().starts_with(layout::KEYS)
            && *key != self.keep
        {
            let cancel = CancellationToken::new();
            let _ = self.store.delete(key, &cancel).await;
            let _ =
                self.store.put_if_absent(key, bytes::Bytes::from_static(b"junk"), &cancel).await;
        }
    }
}

#[tokio::test]
async fn a_new_key_that_does_not_read_back_is_taken_away_again() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    for (store, _dir) in stores() {
        let (repo, _) =
            Repository::init(Arc::clone(&store), b"old", &fast_options(), &cancel).await?;
        let old = repo.key_id();
        let hook = SpoilNewKeys { store: Arc::clone(&store), keep: layout::key_file(&old)? };
        let hooked: Arc<dyn ObjectStore> =
            Arc::new(ferry_store::Hooked::new(Arc::clone(&store), hook));
        let as_old = Repository::open(hooked, b"old", &cancel).await?;
        let failed = as_old.change_password(b"new", KdfParams::insecure_for_tests(), &cancel).await;
        assert!(matches!(failed, Err(RepoError::Corrupt { .. })), "{failed:?}");
        assert_eq!(as_old.key_id(), old);
        let left: Vec<KeyId> = repo.key_files(&cancel).await?.iter().map(|k| k.id).collect();
        assert_eq!(left, vec![old], "nothing changed: the unproven key is gone");
        Repository::open(Arc::clone(&store), b"old", &cancel).await?;
    }
    Ok(())
}

#[tokio::test]
async fn keys_are_listed_found_by_prefix_and_removed_with_care() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    for (store, _dir) in stores() {
        let (repo, _) =
            Repository::init(Arc::clone(&store), b"a", &fast_options(), &cancel).await?;
        let first = repo.key_id();
        let refused = repo.remove_key(&first, &cancel).await;
        assert!(matches!(refused, Err(RepoError::InvalidInput { .. })), "own key: {refused:?}");
        let second = repo.add_password(b"b", KdfParams::insecure_for_tests(), &cancel).await?;

        let keys = repo.key_files(&cancel).await?;
        assert_eq!(keys.len(), 2, "{keys:?}");
        let current: Vec<_> = keys.iter().filter(|k| k.current).map(|k| k.id).collect();
        assert_eq!(current, vec![first]);
        for k in &keys {
            let details = k
                .file
                .as_ref()
                .map_err(|e| RepoError::Internal { what: "test", reason: e.clone() })?;
            assert_eq!(details.kdf, KdfParams::insecure_for_tests());
            assert!(details.created_unix > 0);
        }

        let hex = second.to_hex();
        assert_eq!(repo.find_key(&hex[..8], &cancel).await?, second);
        assert_eq!(repo.find_key(&hex.to_ascii_uppercase(), &cancel).await?, second);
        for bad in ["abc", "zzzzzzzz", "00000000000000000000"] {
            let found = repo.find_key(bad, &cancel).await;
            assert!(matches!(found, Err(RepoError::InvalidInput { .. })), "{bad}: {found:?}");
        }
        let unknown = KeyId([7; 32]);
        let refused = repo.remove_key(&unknown, &cancel).await;
        assert!(matches!(refused, Err(RepoError::InvalidInput { .. })), "unknown: {refused:?}");

        // Opened with "b", the first key can go; then "b"'s own key is the last one.
        let as_b = Repository::open(Arc::clone(&store), b"b", &cancel).await?;
        assert_eq!(as_b.key_id(), second);
        as_b.remove_key(&first, &cancel).await?;
        assert!(matches!(
            Repository::open(Arc::clone(&store), b"a", &cancel).await,
            Err(RepoError::WrongPassword { .. })
        ));
        let refused = as_b.remove_key(&second, &cancel).await;
        assert!(matches!(refused, Err(RepoError::InvalidInput { .. })), "own key: {refused:?}");
        assert_eq!(as_b.key_files(&cancel).await?.len(), 1);
    }
    Ok(())
}

fn refusal(result: RepoResult<()>) -> String {
    match result {
        Err(RepoError::InvalidInput { reason, .. }) => reason,
        other => panic!("expected a refusal, got {other:?}"),
    }
}

#[tokio::test]
async fn no_key_is_removed_once_this_passwords_own_key_has_gone() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    for (store, _dir) in stores() {
        let (repo, _) =
            Repository::init(Arc::clone(&store), b"a", &fast_options(), &cancel).await?;
        let b = repo.add_password(b"b", KdfParams::insecure_for_tests(), &cancel).await?;
        // Another process (opened with "b") removes "a"'s key: "a" must not remove "b"'s,
        // the last one.
        let own = layout::key_file(&repo.key_id())?;
        store.delete(&own, &cancel).await.map_err(|e| RepoError::store("delete", &own, e))?;
        let reason = refusal(repo.remove_key(&b, &cancel).await);
        assert!(reason.contains("is gone"), "{reason}");
        Repository::open(Arc::clone(&store), b"b", &cancel).await?;
    }
    Ok(())
}

#[tokio::test]
async fn removing_each_others_keys_at_once_leaves_a_key_that_opens() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    for (store, _dir) in stores() {
        let (repo, _) =
            Repository::init(Arc::clone(&store), b"a", &fast_options(), &cancel).await?;
        let (a, b) = (
            repo.key_id(),
            repo.add_password(b"b", KdfParams::insecure_for_tests(), &cancel).await?,
        );
        // Just as "a" deletes b's key, a process opened with "b" deletes a's.
        let hook = DeleteBefore {
            store: Arc::clone(&store),
            on_delete: true,
            trigger: layout::key_file(&b)?,
            doomed: layout::key_file(&a)?,
        };
        let hooked: Arc<dyn ObjectStore> =
            Arc::new(ferry_store::Hooked::new(Arc::clone(&store), hook));
        let as_a = Repository::open(hooked, b"a", &cancel).await?;
        let reason = refusal(as_a.remove_key(&b, &cancel).await);
        assert!(reason.contains("is back"), "{reason}");
        let left: Vec<KeyId> = repo.key_files(&cancel).await?.iter().map(|k| k.id).collect();
        assert_eq!(left, vec![a], "a's key put back, b's gone");
        Repository::open(Arc::clone(&store), b"a", &cancel).await?;
    }
    Ok(())
}

#[tokio::test]
async fn a_damaged_key_file_is_listed_not_fatal() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let (repo, _) = Repository::init(Arc::clone(&store), b"pw", &fast_options(), &cancel).await?;
    let junk = layout::key_file(&KeyId([9; 32]))?;
    store
        .put_if_absent(&junk, bytes::Bytes::from_static(b"not a key file"), &cancel)
        .await
        .map_err(|e| RepoError::store("write", &junk, e))?;
    let keys = repo.key_files(&cancel).await?;
    assert_eq!(keys.len(), 2);
    let damaged: Vec<_> = keys.iter().filter(|k| k.file.is_err()).collect();
    assert_eq!(damaged.len(), 1);
    assert_eq!(damaged[0].id, KeyId([9; 32]));
    assert!(!damaged[0].current);
    // The password still opens the repository past the damaged file.
    Repository::open(Arc::clone(&store), b"pw", &cancel).await?;

    // A key file under a name that is not its id is no key file: `key list` would not show
    // it, nor `key remove` protect it, so it opens nothing.
    let spare = repo.add_password(b"spare", KdfParams::insecure_for_tests(), &cancel).await?;
    let named = layout::key_file(&spare)?;
    let bytes = store.get(&named, &cancel).await.map_err(|e| RepoError::store("get", &named, e))?;
    let renamed = ferry_store::ObjectKey::new(format!("{}spare", layout::KEYS))
        .map_err(|e| RepoError::Internal { what: "test", reason: e.to_string() })?;
    store.delete(&named, &cancel).await.map_err(|e| RepoError::store("delete", &named, e))?;
    store
        .put_if_absent(&renamed, bytes, &cancel)
        .await
        .map_err(|e| RepoError::store("write", &renamed, e))?;
    let opened = Repository::open(store, b"spare", &cancel).await;
    assert!(matches!(opened, Err(RepoError::WrongPassword { .. })), "{opened:?}");
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
        packer.finish()?;
        sink.flush(&repo2)?;
        Ok(ids)
    })
    .await
    .map_err(|e| RepoError::Internal { what: "test", reason: e.to_string() })??;
    uploader.finish().await?;
    Ok(ids)
}

/// A stored pack's buffer comes back for a later pack: a backup of many packs allocates no more
/// buffers than can be in flight at once (a file store lets go of a pack's bytes once written).
#[tokio::test]
async fn stored_packs_lend_their_buffers_to_the_next() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    let dir = tempfile::tempdir()
        .map_err(|e| RepoError::Internal { what: "test", reason: e.to_string() })?;
    let store: Arc<dyn ObjectStore> = Arc::new(
        FsStore::open(dir.path())
            .map_err(|e| RepoError::Internal { what: "test", reason: e.to_string() })?,
    );
    let (repo, _) = Repository::init(Arc::clone(&store), b"pw", &fast_options(), &cancel).await?;
    let index = repo.index(&cancel).await?;
    let (sink, uploader) = Uploader::start_leased(&repo, index, None, &cancel);
    let buffers = sink.buffers();
    let stats = Arc::clone(&uploader.stats);
    let writer = repo.clone();
    // 16 MiB of incompressible blobs: 16 packs at the 1 MiB test target.
    tokio::task::spawn_blocking(move || -> RepoResult<()> {
        let mut packer = LocalPacker::new(&writer, &sink, &stats, 3);
        for i in 0..400u32 {
            let mut blob = vec![0u8; 42_000];
            blake3::Hasher::new_keyed(&[0; 32])
                .update(&i.to_le_bytes())
                .finalize_xof()
                .fill(&mut blob);
            packer.add(ObjectKind::DataBlob, writer.keys().blob_id(&blob), &blob)?;
        }
        packer.finish()?;
        sink.flush(&writer)
    })
    .await
    .map_err(|e| RepoError::Internal { what: "test", reason: e.to_string() })??;
    uploader.finish().await?;
    let packs = store
        .list(layout::DATA, &cancel)
        .await
        .map_err(|e| RepoError::store("list", layout::DATA, e))?
        .len();
    assert!(packs >= 14, "{packs} packs");
    let in_flight = super::writer::OPEN_DATA_PACKS + 1 + super::writer::PACK_BUFFERS_KEPT;
    assert!(buffers.allocated() <= in_flight, "{} buffers for {packs} packs", buffers.allocated());
    assert!(buffers.kept() > 0, "no buffer came back");
    Ok(())
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
        // An id sharing a stored blob's leading 16 bytes (all the in-memory index keeps)
        // finds that blob's place, and its read fails authentication: an error, never the
        // other blob's bytes. Both the loaded index and this process's additions.
        for repo in [&reopened, &repo] {
            for id in [ids[0], ids[39]] {
                let mut twin = id;
                twin.0[31] ^= 1;
                let read = repo.read_blob(&twin, "test", &cancel).await;
                assert!(matches!(read, Err(RepoError::Corrupt { .. })), "{read:?}");
            }
        }
    }
    Ok(())
}

/// An object under `keys/` larger than any key file is never downloaded: a bucket stuffed
/// with huge objects there cannot make an open read them.
#[tokio::test]
async fn an_open_reads_no_oversized_object_under_keys() -> RepoResult<()> {
    #[derive(Debug, Default)]
    struct Reads(std::sync::Mutex<Vec<String>>);
    #[async_trait::async_trait]
    impl ferry_store::Hook for Reads {
        async fn before(&self, call: ferry_store::Call<'_>) {
            if let Some(key) = call.whole_read() {
                self.0.lock().expect("lock").push(key.as_str().to_owned());
            }
        }
    }
    let cancel = CancellationToken::new();
    for (store, _dir) in stores() {
        Repository::init(Arc::clone(&store), b"pw", &fast_options(), &cancel).await?;
        // Listed (lexicographically) before any real key file, so an open would reach it.
        let huge = ferry_store::ObjectKey::new(format!("keys/{}", "00".repeat(32))).expect("key");
        let filler = bytes::Bytes::from(vec![0u8; MAX_KEY_FILE_BYTES as usize + 1]);
        store.put_if_absent(&huge, filler, &cancel).await.expect("put");
        let hooked = Arc::new(ferry_store::Hooked::new(Arc::clone(&store), Reads::default()));
        let watched: Arc<dyn ObjectStore> = hooked.clone();
        Repository::open(watched, b"pw", &cancel).await?;
        let reads = hooked.hook().0.lock().expect("lock").clone();
        assert!(reads.iter().any(|k| k.starts_with("keys/")), "the real key was read: {reads:?}");
        assert!(!reads.contains(&huge.as_str().to_owned()), "the huge object was read: {reads:?}");
    }
    Ok(())
}

/// A worker that ends without sealing its frame would leave claimed blobs unstored: the
/// writer refuses to finish instead, and a worker that seals it stores the blob.
#[tokio::test]
async fn blobs_left_in_an_unsealed_frame_fail_the_flush() -> RepoResult<()> {
    let cancel = CancellationToken::new();
    let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let (repo, _) = Repository::init(store, b"pw", &fast_options(), &cancel).await?;
    assert!(repo.config().format.frames());
    for seal in [false, true] {
        let index = repo.index(&cancel).await?;
        let (sink, uploader) = Uploader::start_leased(&repo, index, None, &cancel);
        let stats = Arc::clone(&uploader.stats);
        let writer = repo.clone();
        let blob = format!("small blob {seal}").into_bytes();
        let id = repo.keys().blob_id(&blob);
        let flushed = tokio::task::spawn_blocking(move || -> RepoResult<()> {
            let mut packer = LocalPacker::new(&writer, &sink, &stats, 3);
            packer.add(ObjectKind::DataBlob, id, &blob)?;
            if seal {
                packer.finish()?;
            }
            sink.flush(&writer)
        })
        .await
        .map_err(|e| RepoError::Internal { what: "test", reason: e.to_string() })?;
        uploader.finish().await?;
        match (seal, flushed) {
            (false, Err(RepoError::Internal { reason, .. })) => {
                assert!(reason.contains("never stored"), "{reason}");
            }
            (true, Ok(())) => {
                let read = repo.read_blob(&id, "test", &cancel).await?;
                assert_eq!(read, format!("small blob {seal}").into_bytes());
                let loc = repo.locate(&id, &cancel).await?.map(|l| l.kind);
                assert_eq!(loc, Some(ObjectKind::FramedData));
            }
            (seal, other) => panic!("sealed {seal}: {other:?}"),
        }
    }
    Ok(())
}
