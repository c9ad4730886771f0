//! The local cache of index files, snapshot manifests and tree packs, on a real S3 server
//! (moto): later handles read them from disk, a deleted or damaged cache only costs reads from
//! the store, and the cache stays within its budget.
#![allow(clippy::unwrap_used)]

mod common;

use std::path::Path;
use std::sync::{Arc, Mutex};

use common::TestResult;
use ferry_repo::{CacheOptions, Repository};
use ferry_store::{Call, Hook, Hooked, ObjectStore};
use tokio_util::sync::CancellationToken;

/// Records the keys of whole-object reads (a hook for [`Hooked`]).
#[derive(Debug, Default)]
struct Gets(Mutex<Vec<String>>);

impl Gets {
    fn take(&self) -> Vec<String> {
        std::mem::take(&mut *self.0.lock().unwrap())
    }
}

#[async_trait::async_trait]
impl Hook for Gets {
    async fn before(&self, call: Call<'_>) {
        if let Call::Get(key) = call {
            self.0.lock().unwrap().push(key.to_string());
        }
    }
}

type Counting = Hooked<Gets>;

/// Reads from the store that a warm cache would have served.
fn cacheable(gets: &[String]) -> Vec<&String> {
    gets.iter()
        .filter(|k| {
            k.starts_with("index/") || k.starts_with("snapshots/") || k.starts_with("data/")
        })
        .collect()
}

fn files_under(dir: &Path) -> Vec<(std::path::PathBuf, u64)> {
    let mut out = Vec::new();
    let Ok(entries) = std::fs::read_dir(dir) else { return out };
    for entry in entries.flatten() {
        // Eviction may remove a file between listing and looking at it.
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            out.extend(files_under(&entry.path()));
        } else {
            out.push((entry.path(), meta.len()));
        }
    }
    out
}

async fn open(store: &Arc<Counting>, cache: &CacheOptions) -> Repository {
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    let repo = Repository::open(dyn_store, b"secret", &CancellationToken::new()).await.unwrap();
    repo.set_cache(cache);
    repo
}

async fn restore_and_compare(repo: &Repository, id: &ferry_repo::SnapshotId, src: &Path) {
    let out = tempfile::tempdir().unwrap();
    let target = out.path().join("restored");
    let options = ferry_repo::RestoreOptions::default();
    let summary = ferry_repo::restore(repo, id, &target, &options, None, &CancellationToken::new())
        .await
        .unwrap();
    assert!(summary.warnings.is_empty(), "{:?}", summary.warnings);
    common::assert_same_tree(src, &target);
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn later_handles_read_metadata_from_the_cache_which_may_vanish_or_rot() -> TestResult {
    let inner = common::s3_store("ferry-cache", "warm").await;
    let store = Arc::new(Hooked::new(inner, Gets::default()));
    let cancel = CancellationToken::new();
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    Repository::init(dyn_store, b"secret", &common::options(), &cancel).await?;

    let cache_dir = tempfile::tempdir()?;
    let cache = CacheOptions { dir: cache_dir.path().join("cache"), max_bytes: 256 << 20 };
    let src = tempfile::tempdir()?;
    common::build_hard_tree(src.path());

    // A backup keeps what it writes: its index files, snapshot and tree packs.
    let writer = open(&store, &cache).await;
    let options = ferry_repo::BackupOptions::default();
    let first = ferry_repo::backup_tree(&writer, src.path(), &options, None, &cancel).await?;
    drop(writer);
    // Copies are in the cache by the time the backup returns.
    let cached = files_under(&cache.dir);
    assert!(cached.iter().any(|(p, _)| p.to_string_lossy().contains("snapshots")), "{cached:?}");
    store.hook().take();

    // Another handle (another process, in effect) lists and restores without reading any
    // index file, snapshot or tree pack from S3.
    let reader = open(&store, &cache).await;
    assert_eq!(reader.snapshots(&cancel).await?.len(), 1);
    restore_and_compare(&reader, &first.snapshot_id, src.path()).await;
    let gets = store.hook().take();
    assert!(cacheable(&gets).is_empty(), "read from S3 although cached: {:?}", cacheable(&gets));
    let held: u64 = files_under(&cache.dir).iter().map(|f| f.1).sum();
    assert!(held > 0 && held <= cache.max_bytes, "cache holds {held} bytes");

    // Deleted: the next handle reads from S3 and fills the cache again.
    std::fs::remove_dir_all(&cache.dir)?;
    let refill = open(&store, &cache).await;
    restore_and_compare(&refill, &first.snapshot_id, src.path()).await;
    let gets = store.hook().take();
    assert!(gets.iter().any(|k| k.starts_with("index/")), "{gets:?}");
    assert!(gets.iter().any(|k| k.starts_with("snapshots/")), "{gets:?}");
    for _ in 0..100 {
        if files_under(&cache.dir).iter().any(|(p, _)| p.to_string_lossy().contains("index")) {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(20)).await;
    }

    // Damaged: every cached file has a byte flipped; reads notice, go to S3, and restore
    // exactly.
    let cached = files_under(&cache.dir);
    assert!(!cached.is_empty());
    for (path, len) in &cached {
        let mut bytes = std::fs::read(path)?;
        bytes[(*len as usize) / 2] ^= 0x40;
        std::fs::write(path, bytes)?;
    }
    let damaged = open(&store, &cache).await;
    restore_and_compare(&damaged, &first.snapshot_id, src.path()).await;
    let gets = store.hook().take();
    assert!(gets.iter().any(|k| k.starts_with("index/")), "{gets:?}");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_small_cache_stays_within_its_budget() -> TestResult {
    let repo_dir = tempfile::tempdir()?;
    let cache_dir = tempfile::tempdir()?;
    let cancel = CancellationToken::new();
    let repo = common::fs_repo(repo_dir.path()).await;
    let cache = CacheOptions { dir: cache_dir.path().to_path_buf(), max_bytes: 200_000 };
    repo.set_cache(&cache);
    let src = tempfile::tempdir()?;
    let options = ferry_repo::BackupOptions::default();
    let mut last = None;
    // Twenty backups of a changing tree: twenty snapshots, index files and tree packs.
    for round in 0..20u8 {
        for n in 0..50 {
            std::fs::write(src.path().join(format!("f{n}")), common::noise(2000, round ^ n))?;
        }
        last = Some(ferry_repo::backup_tree(&repo, src.path(), &options, None, &cancel).await?);
        let held: u64 = files_under(cache_dir.path()).iter().map(|f| f.1).sum();
        // Copies land in the background: allow one round of them beyond the bound.
        assert!(held <= cache.max_bytes + cache.max_bytes / 4 * 3, "cache holds {held} bytes");
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let held: u64 = files_under(cache_dir.path()).iter().map(|f| f.1).sum();
    assert!(held <= cache.max_bytes, "cache holds {held} bytes after the last copy");
    restore_and_compare(&repo, &last.unwrap().snapshot_id, src.path()).await;
    Ok(())
}
