//! The file-system store.

use std::path::Path;
use std::time::{Duration, Instant};

use ferry_store::{FsStore, ObjectStore, PutOutcome, StoreError};
use tempfile::TempDir;
use tokio_util::sync::CancellationToken;

use crate::support::{data, key};

async fn fixture() -> (FsStore, TempDir) {
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("temp dir: {e}"));
    let store = FsStore::open(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    (store, dir)
}

mod contract {
    crate::contract_tests!(super::fixture);
}

fn temp_files(root: &Path) -> usize {
    std::fs::read_dir(root.join("tmp~")).map(Iterator::count).unwrap_or(0)
}

#[tokio::test]
async fn removed_root_is_location_missing() {
    let (store, dir) = fixture().await;
    let cancel = CancellationToken::new();
    store.put_if_absent(&key("a/b"), "x".into(), &cancel).await.unwrap_or_else(|e| panic!("{e}"));
    std::fs::remove_dir_all(dir.path()).unwrap_or_else(|e| panic!("{e}"));
    let k = key("a/b");
    let missing = |what: &str, r: Result<(), StoreError>| match r {
        Err(StoreError::LocationMissing { location }) => {
            assert_eq!(location, dir.path().display().to_string(), "{what}");
        }
        other => panic!("{what}: expected LocationMissing, got {other:?}"),
    };
    missing("put", store.put_if_absent(&key("c"), "y".into(), &cancel).await.map(drop));
    missing("get", store.get(&k, &cancel).await.map(drop));
    missing("get_range", store.get_range(&k, 0, 1, &cancel).await.map(drop));
    missing("head", store.head(&k, &cancel).await.map(drop));
    missing("list", store.list("", &cancel).await.map(drop));
    missing("delete", store.delete(&k, &cancel).await);
    assert!(!dir.path().exists(), "a put recreated the missing root");
}

#[tokio::test]
async fn stray_and_temporary_files_are_never_listed() {
    let (store, dir) = fixture().await;
    let cancel = CancellationToken::new();
    store
        .put_if_absent(&key("data/ok"), "x".into(), &cancel)
        .await
        .unwrap_or_else(|e| panic!("{e}"));
    std::fs::create_dir_all(dir.path().join("tmp~")).unwrap_or_else(|e| panic!("{e}"));
    for stray in ["tmp~/0123.part", "data/ok~", "data/.#lock~x", "data/with space"] {
        std::fs::write(dir.path().join(stray), b"junk").unwrap_or_else(|e| panic!("{e}"));
    }
    let listed = store.list("", &cancel).await.unwrap_or_else(|e| panic!("{e}"));
    let names: Vec<_> = listed.iter().map(|m| m.key.as_str()).collect();
    assert_eq!(names, ["data/ok"]);
}

#[tokio::test]
async fn keys_and_directories_do_not_clash_silently() {
    let (store, _dir) = fixture().await;
    let cancel = CancellationToken::new();
    store.put_if_absent(&key("a/b"), "x".into(), &cancel).await.unwrap_or_else(|e| panic!("{e}"));
    // `a` is a directory of keys: creating it as an object must not claim "already exists".
    let over_dir = store.put_if_absent(&key("a"), "y".into(), &cancel).await;
    assert!(matches!(over_dir, Err(StoreError::Backend { .. })), "{over_dir:?}");
    store.put_if_absent(&key("f"), "z".into(), &cancel).await.unwrap_or_else(|e| panic!("{e}"));
    let under_file = store.put_if_absent(&key("f/g"), "w".into(), &cancel).await;
    assert!(matches!(under_file, Err(StoreError::Backend { .. })), "{under_file:?}");
    assert_eq!(store.get(&key("a/b"), &cancel).await.ok().as_deref(), Some(&b"x"[..]));
    assert_eq!(store.get(&key("f"), &cancel).await.ok().as_deref(), Some(&b"z"[..]));
}

/// Cancels a large write while its temporary file is being filled: the call reports
/// `Cancelled`, the key stays absent and the temporary file is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_during_write_leaves_nothing() {
    let (store, dir) = fixture().await;
    let k = key("packs/huge");
    let cancel = CancellationToken::new();
    let writer = {
        let (store, k, cancel) = (store.clone(), k.clone(), cancel.clone());
        tokio::spawn(async move { store.put_if_absent(&k, data(256 << 20, 1), &cancel).await })
    };
    let root = dir.path().to_path_buf();
    let deadline = Instant::now() + Duration::from_secs(30);
    while temp_files(&root) == 0 && Instant::now() < deadline && !writer.is_finished() {
        std::thread::sleep(Duration::from_micros(200));
    }
    cancel.cancel();
    let outcome = writer.await.unwrap_or_else(|e| panic!("{e}"));
    assert!(matches!(outcome, Err(StoreError::Cancelled)), "{outcome:?}");
    let live = CancellationToken::new();
    assert_eq!(
        store.head(&k, &live).await.unwrap_or_else(|e| panic!("head: {e}")),
        None,
        "nothing written"
    );
    assert!(store.list("", &live).await.ok().is_some_and(|l| l.is_empty()));
    assert_eq!(temp_files(&root), 0, "temporary file left behind");
}

#[tokio::test]
async fn created_objects_are_plain_files_at_their_key() {
    let (store, dir) = fixture().await;
    let cancel = CancellationToken::new();
    let outcome = store.put_if_absent(&key("data/ab/cd"), "payload".into(), &cancel).await;
    assert!(matches!(outcome, Ok(PutOutcome::Created)));
    assert_eq!(std::fs::read(dir.path().join("data/ab/cd")).ok().as_deref(), Some(&b"payload"[..]));
    assert_eq!(temp_files(dir.path()), 0);
}

/// A 50 GB object (a sparse file, as a hostile or broken bucket could hold) is refused by its
/// size before any of it is read.
#[tokio::test]
async fn a_huge_object_is_refused_by_its_size_before_reading() {
    let (store, dir) = fixture().await;
    std::fs::create_dir_all(dir.path().join("index")).unwrap_or_else(|e| panic!("{e}"));
    let file =
        std::fs::File::create(dir.path().join("index/huge")).unwrap_or_else(|e| panic!("{e}"));
    let size = 50_000_000_000;
    file.set_len(size).unwrap_or_else(|e| panic!("{e}"));
    let k = key("index/huge");
    let started = Instant::now();
    match store.get_at_most(&k, 64 << 20, &CancellationToken::new()).await {
        Err(StoreError::TooLarge { key: got, size: s, max }) => {
            assert_eq!((got, s, max), (k, size, 64 << 20));
        }
        other => panic!("expected TooLarge, got {other:?}"),
    }
    assert!(started.elapsed() < Duration::from_secs(5), "took {:?}", started.elapsed());
}
