//! What a hostile or broken bucket can hold: objects larger than any valid one of their kind,
//! planted as sparse files in a file-system store (so a 50 GB object costs nothing), and many
//! key files, which an open with a hint does not try one by one.

use std::path::Path;
use std::sync::{Arc, Mutex};

use ferry_store::{Call, FsStore, Hook, Hooked, MemoryStore, ObjectStore};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use super::tests::{fast_options, write_blobs};
use super::*;
use crate::format::limits::{
    MAX_CONFIG_BYTES, MAX_GC_STATE_BYTES, MAX_INDEX_FILE_BYTES, MAX_KEY_FILE_BYTES, MAX_PACK_BYTES,
    MAX_SNAPSHOT_BYTES,
};
use crate::format::{NodeBody, PackId, SnapshotId};
use crate::{BackupOptions, CheckOptions, backup_tree, check};

/// Every call that reads, in order: `get <key>`, `get <key> at most <max>`, `range <key>`,
/// `list <prefix>`.
#[derive(Debug, Default)]
struct Reads(Mutex<Vec<String>>);

#[async_trait::async_trait]
impl Hook for Reads {
    async fn before(&self, call: Call<'_>) {
        let seen = match call {
            Call::Get(key) => format!("get {key}"),
            Call::GetAtMost(key, max) => format!("get {key} at most {max}"),
            Call::GetRange(key, _, _) => format!("range {key}"),
            Call::List(prefix) => format!("list {prefix}"),
            _ => return,
        };
        self.0.lock().expect("lock").push(seen);
    }
}

impl Reads {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().expect("lock"))
    }
}

/// `store` behind a hook that records its reads.
fn watched(store: &Arc<dyn ObjectStore>) -> (Arc<Hooked<Reads>>, Arc<dyn ObjectStore>) {
    let hooked = Arc::new(Hooked::new(Arc::clone(store), Reads::default()));
    let store: Arc<dyn ObjectStore> = hooked.clone();
    (hooked, store)
}

/// A repository (password `pw`) in a directory.
async fn fs_repo() -> (TempDir, Arc<dyn ObjectStore>, Repository) {
    let dir = tempfile::tempdir().expect("temp dir");
    let store: Arc<dyn ObjectStore> = Arc::new(FsStore::open(dir.path()).expect("fs store"));
    let cancel = CancellationToken::new();
    let (repo, _) =
        Repository::init(Arc::clone(&store), b"pw", &fast_options(), &cancel).await.expect("init");
    (dir, store, repo)
}

/// Puts a sparse file of `size` bytes at `key` (replacing what is there).
fn plant(root: &Path, key: &str, size: u64) {
    let path = root.join(key);
    std::fs::create_dir_all(path.parent().expect("parent")).expect("mkdir");
    let _ = std::fs::remove_file(&path);
    std::fs::File::create(&path).and_then(|f| f.set_len(size)).expect("sparse file");
}

fn hex_id(byte: u8) -> String {
    hex::encode([byte; 32])
}

/// The error must be the cap's, naming the object, its size and the limit.
fn assert_too_large<T: std::fmt::Debug>(result: RepoResult<T>, object: &str, size: u64, max: u64) {
    let message = match &result {
        Err(e) => e.to_string(),
        Ok(_) => String::new(),
    };
    match result {
        Err(RepoError::TooLarge { object: o, size: s, max: m }) => {
            assert_eq!((o.as_str(), s, m), (object, size, max));
            let (size, max) = (size.to_string(), max.to_string());
            assert!(message.contains(&size) && message.contains(&max), "{message}");
        }
        other => panic!("expected TooLarge for {object}, got {other:?}"),
    }
}

/// The planted object was asked for with its kind's cap, and never without one.
fn assert_capped(reads: &[String], key: &str, max: u64) {
    assert!(reads.contains(&format!("get {key} at most {max}")), "{key} capped: {reads:?}");
    assert!(!reads.contains(&format!("get {key}")), "{key} read uncapped: {reads:?}");
}

#[tokio::test]
async fn a_config_over_its_limit_fails_open_and_init_without_being_downloaded() {
    let cancel = CancellationToken::new();
    for size in [MAX_CONFIG_BYTES + 1, 50_000_000_000] {
        let (dir, store, _) = fs_repo().await;
        plant(dir.path(), "config", size);
        let (hooked, store) = watched(&store);
        let opened = Repository::open(Arc::clone(&store), b"pw", &cancel).await;
        assert_too_large(opened, "config config", size, MAX_CONFIG_BYTES);
        assert_capped(&hooked.hook().take(), "config", MAX_CONFIG_BYTES);
        // Not taken for "no repository here": init must not create another one over it.
        let init = Repository::init(Arc::clone(&store), b"pw", &fast_options(), &cancel).await;
        assert_too_large(init.map(|(_, o)| o), "config config", size, MAX_CONFIG_BYTES);
        assert_capped(&hooked.hook().take(), "config", MAX_CONFIG_BYTES);
    }
}

#[tokio::test]
async fn an_index_file_over_its_limit_is_refused_unread() {
    let cancel = CancellationToken::new();
    let (dir, store, repo) = fs_repo().await;
    write_blobs(&repo, vec![b"some data".to_vec()]).await.expect("write");
    let key = format!("index/{}", hex_id(0x1d));
    plant(dir.path(), &key, MAX_INDEX_FILE_BYTES + 1);
    let (hooked, store) = watched(&store);
    let fresh = Repository::open(store, b"pw", &cancel).await.expect("open");
    let loaded = fresh.index(&cancel).await;
    assert_too_large(
        loaded,
        &format!("index {key}"),
        MAX_INDEX_FILE_BYTES + 1,
        MAX_INDEX_FILE_BYTES,
    );
    let report = check(&fresh, CheckOptions::default(), None, &cancel).await.expect("check");
    assert!(
        report.problems.iter().any(|p| p.contains(&key) && p.contains("not read")),
        "{report:?}"
    );
    assert_capped(&hooked.hook().take(), &key, MAX_INDEX_FILE_BYTES);
}

#[tokio::test]
async fn a_snapshot_over_its_limit_is_listed_as_damaged_and_hides_no_other() {
    let cancel = CancellationToken::new();
    let (dir, store, repo) = fs_repo().await;
    let src = tempfile::tempdir().expect("temp dir");
    std::fs::write(src.path().join("f"), b"content").expect("write");
    let good = backup_tree(&repo, src.path(), &BackupOptions::default(), None, &cancel)
        .await
        .expect("backup")
        .snapshot_id;
    let planted = SnapshotId([0x5a; 32]);
    let key = format!("snapshots/{}", planted.to_hex());
    let size = MAX_SNAPSHOT_BYTES + 1;
    plant(dir.path(), &key, size);
    let (hooked, store) = watched(&store);
    let fresh = Repository::open(store, b"pw", &cancel).await.expect("open");
    // Through the local cache too: nothing of it is downloaded or kept.
    let cache = tempfile::tempdir().expect("temp dir");
    fresh.set_cache(&CacheOptions { dir: cache.path().to_path_buf(), max_bytes: 1 << 30 });
    let (readable, damaged) = fresh.readable_snapshots(&cancel).await.expect("list");
    assert_eq!(readable.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [good]);
    assert_eq!(damaged.len(), 1, "{damaged:?}");
    let object = format!("snapshot {key}");
    assert_too_large(
        Err::<(), _>(damaged.into_iter().next().expect("one")),
        &object,
        size,
        MAX_SNAPSHOT_BYTES,
    );
    assert_too_large(fresh.snapshots(&cancel).await, &object, size, MAX_SNAPSHOT_BYTES);
    assert_too_large(
        fresh.load_snapshot(&planted, &cancel).await,
        &object,
        size,
        MAX_SNAPSHOT_BYTES,
    );
    assert_capped(&hooked.hook().take(), &key, MAX_SNAPSHOT_BYTES);
    let report = check(&fresh, CheckOptions::default(), None, &cancel).await.expect("check");
    assert!(report.problems.iter().any(|p| p.contains(&key)), "{report:?}");
}

#[tokio::test]
async fn a_gc_mark_over_its_limit_is_refused_unread() {
    let cancel = CancellationToken::new();
    let (dir, store, _) = fs_repo().await;
    let key = format!("gc/mark-{}", hex_id(0x3c));
    plant(dir.path(), &key, MAX_GC_STATE_BYTES + 1);
    let (hooked, store) = watched(&store);
    let fresh = Repository::open(store, b"pw", &cancel).await.expect("open");
    let loaded = fresh.index(&cancel).await;
    assert_too_large(
        loaded,
        &format!("gc state {key}"),
        MAX_GC_STATE_BYTES + 1,
        MAX_GC_STATE_BYTES,
    );
    assert_capped(&hooked.hook().take(), &key, MAX_GC_STATE_BYTES);
}

#[tokio::test]
async fn check_reports_a_pack_over_its_limit_without_reading_it() {
    let cancel = CancellationToken::new();
    let (dir, store, repo) = fs_repo().await;
    write_blobs(&repo, vec![b"some data".to_vec()]).await.expect("write");
    let key = layout::pack(&PackId([0xab; 32])).expect("key").to_string();
    plant(dir.path(), &key, MAX_PACK_BYTES + 1);
    let (hooked, store) = watched(&store);
    let fresh = Repository::open(store, b"pw", &cancel).await.expect("open");
    let options = CheckOptions { read_data: true, subset: None };
    let report = check(&fresh, options, None, &cancel).await.expect("check");
    let problems: Vec<_> = report.problems.iter().filter(|p| p.contains(&key)).collect();
    assert_eq!(problems.len(), 1, "{report:?}");
    assert!(problems[0].contains(&(MAX_PACK_BYTES + 1).to_string()), "{problems:?}");
    assert_eq!(report.problems.len(), 1, "the real pack checks clean: {report:?}");
    assert_capped(&hooked.hook().take(), &key, MAX_PACK_BYTES);
}

/// A tree pack larger than the index records is not read whole (nor cached); its tree blobs
/// are read by range instead, and still authenticate.
#[tokio::test]
async fn a_tree_pack_larger_than_indexed_is_read_by_range() {
    let cancel = CancellationToken::new();
    let (dir, store, repo) = fs_repo().await;
    let src = tempfile::tempdir().expect("temp dir");
    std::fs::write(src.path().join("f"), b"content").expect("write");
    let id = backup_tree(&repo, src.path(), &BackupOptions::default(), None, &cancel)
        .await
        .expect("backup")
        .snapshot_id;
    let snapshot = repo.load_snapshot(&id, &cancel).await.expect("snapshot");
    let NodeBody::Dir { pages } = &snapshot.root.body else { panic!("not a tree") };
    let loc = repo.index(&cancel).await.expect("index").lookup(&pages[0]).expect("indexed");
    let key = layout::pack(&loc.pack).expect("key").to_string();
    let indexed = std::fs::metadata(dir.path().join(&key)).expect("pack").len();
    let mut file =
        std::fs::OpenOptions::new().append(true).open(dir.path().join(&key)).expect("open");
    std::io::Write::write_all(&mut file, &[0; 100]).expect("append");
    let (hooked, store) = watched(&store);
    let fresh = Repository::open(store, b"pw", &cancel).await.expect("open");
    let page = fresh.read_tree(&pages[0], "test", &cancel).await.expect("read by range");
    assert_eq!(page.entries.len(), 1);
    let reads = hooked.hook().take();
    assert_capped(&reads, &key, indexed);
    assert!(reads.contains(&format!("range {key}")), "{reads:?}");
}

/// Several key files, each costing a derivation to try.
async fn repo_with_keys(store: &Arc<dyn ObjectStore>) -> Vec<KeyId> {
    let cancel = CancellationToken::new();
    let (repo, _) =
        Repository::init(Arc::clone(store), b"a", &fast_options(), &cancel).await.expect("init");
    let mut ids = vec![repo.key_id()];
    for password in [b"b", b"c", b"d"] {
        let kdf = KdfParams::insecure_for_tests();
        ids.push(repo.add_password(password, kdf, &cancel).await.expect("add key"));
    }
    ids
}

fn key_reads(reads: &[String]) -> Vec<&String> {
    reads.iter().filter(|r| r.contains(layout::KEYS)).collect()
}

#[tokio::test]
async fn a_right_hint_opens_with_one_key_file_and_one_derivation() {
    let cancel = CancellationToken::new();
    let memory: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let ids = repo_with_keys(&memory).await;
    let (hooked, store) = watched(&memory);
    for (id, password) in ids.iter().zip([b"a", b"b", b"c", b"d"]) {
        let opened =
            Repository::open_with_hint(Arc::clone(&store), password, Some(*id), &cancel).await;
        let opened = opened.expect("open");
        assert_eq!((opened.key_id(), opened.key_files_tried()), (*id, 1));
        let key = layout::key_file(id).expect("key");
        let reads = hooked.hook().take();
        assert_eq!(key_reads(&reads), [&format!("get {key} at most {MAX_KEY_FILE_BYTES}")]);
    }
    // Without a hint, the last key in listing order costs a derivation per key file.
    let last = *ids.iter().max().expect("keys");
    let password = [b"a", b"b", b"c", b"d"][ids.iter().position(|i| *i == last).expect("last")];
    let opened = Repository::open(Arc::clone(&store), password, &cancel).await.expect("open");
    assert_eq!((opened.key_id(), opened.key_files_tried()), (last, 4));
}

#[tokio::test]
async fn a_stale_or_wrong_hint_still_opens_with_the_right_key() {
    let cancel = CancellationToken::new();
    let memory: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
    let ids = repo_with_keys(&memory).await;
    let (hooked, store) = watched(&memory);
    let open = |hint| Repository::open_with_hint(Arc::clone(&store), b"c", hint, &cancel);
    // Another password's key: tried first, then not again.
    let opened = open(Some(ids[0])).await.expect("open");
    assert_eq!(opened.key_id(), ids[2]);
    let hinted =
        format!("get {} at most {MAX_KEY_FILE_BYTES}", layout::key_file(&ids[0]).expect("key"));
    let reads = hooked.hook().take();
    assert_eq!(key_reads(&reads)[0], &hinted, "{reads:?}");
    assert_eq!(reads.iter().filter(|r| **r == hinted).count(), 1, "{reads:?}");
    // A key that is gone (removed since), and an object at the name that is no key file.
    let junk = layout::key_file(&KeyId([0; 32])).expect("key");
    memory.put_if_absent(&junk, bytes::Bytes::from_static(b"junk"), &cancel).await.expect("put");
    for hint in [KeyId([0x77; 32]), KeyId([0; 32])] {
        let opened = open(Some(hint)).await.expect("open");
        assert_eq!(opened.key_id(), ids[2]);
    }
    // A huge object at the hinted name is refused unread, and skipped in the listing.
    let fs_dir = tempfile::tempdir().expect("temp dir");
    let fs: Arc<dyn ObjectStore> = Arc::new(FsStore::open(fs_dir.path()).expect("fs"));
    let ids = repo_with_keys(&fs).await;
    let huge = KeyId([0x01; 32]);
    let huge_key = layout::key_file(&huge).expect("key").to_string();
    plant(fs_dir.path(), &huge_key, 50_000_000_000);
    let (hooked, store) = watched(&fs);
    let opened = Repository::open_with_hint(store, b"d", Some(huge), &cancel).await.expect("open");
    assert_eq!(opened.key_id(), ids[3]);
    let reads = hooked.hook().take();
    assert_capped(&reads, &huge_key, MAX_KEY_FILE_BYTES);
    assert_eq!(reads.iter().filter(|r| r.contains(&huge_key)).count(), 1, "{reads:?}");
    // A wrong password with a hint is still a wrong password, all keys tried.
    let wrong = Repository::open_with_hint(fs, b"nope", Some(ids[1]), &cancel).await;
    assert!(matches!(wrong, Err(RepoError::WrongPassword { tried: 4, .. })), "{wrong:?}");
}
