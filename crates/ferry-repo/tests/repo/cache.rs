//! The local cache of index files, snapshot manifests and tree packs, on a real S3 server
//! (moto) or in memory: later handles read them from disk, a deleted or damaged cache only
//! costs reads from the store, and the whole cache directory, every repository's folder
//! together, stays within one budget.

use crate::common;

use std::os::unix::fs::MetadataExt;
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
        std::mem::take(&mut *self.0.lock().expect("gets"))
    }
}

#[async_trait::async_trait]
impl Hook for Gets {
    async fn before(&self, call: Call<'_>) {
        if let Some(key) = call.whole_read() {
            self.0.lock().expect("gets").push(key.to_string());
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

/// Bytes of disk the files under `dir` take, counted as the cache counts them: blocks, at
/// least the length.
fn disk_usage(dir: &Path) -> u64 {
    let mut total = 0;
    let Ok(entries) = std::fs::read_dir(dir) else { return 0 };
    for entry in entries.flatten() {
        let Ok(meta) = entry.metadata() else { continue };
        if meta.is_dir() {
            total += disk_usage(&entry.path());
        } else {
            total += meta.len().max(meta.blocks() * 512);
        }
    }
    total
}

async fn open(store: &Arc<Counting>, cache: &CacheOptions) -> Repository {
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    let repo =
        Repository::open(dyn_store, b"secret", &CancellationToken::new()).await.expect("open");
    repo.set_cache(cache);
    repo
}

async fn restore_and_compare(repo: &Repository, id: &ferry_repo::SnapshotId, src: &Path) {
    let out = tempfile::tempdir().expect("restore target");
    let target = out.path().join("restored");
    let options = ferry_repo::RestoreOptions::default();
    let summary = ferry_repo::restore(repo, id, &target, &options, None, &CancellationToken::new())
        .await
        .expect("restore");
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
        let held = disk_usage(cache_dir.path());
        // Copies land in the background: allow one round of them beyond the bound.
        assert!(held <= cache.max_bytes + cache.max_bytes / 4 * 3, "cache holds {held} bytes");
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let held = disk_usage(cache_dir.path());
    assert!(held <= cache.max_bytes, "cache holds {held} bytes after the last copy");
    let last = last.expect("twenty backups");
    restore_and_compare(&repo, &last.snapshot_id, src.path()).await;
    Ok(())
}

/// Writes round `round` of a changing tree of fifty small files into `dir`.
fn change_tree(dir: &Path, round: u8, seed: u8) -> std::io::Result<()> {
    for n in 0..50u8 {
        std::fs::write(dir.join(format!("f{n}")), common::noise(2000, round ^ n ^ seed))?;
    }
    Ok(())
}

/// Cached index files and snapshot manifests under `dir`, all repositories' folders together.
fn cached_metadata(dir: &Path) -> usize {
    let folder = |p: &Path| p.parent().and_then(Path::file_name).map(|n| n.to_owned());
    files_under(dir)
        .iter()
        .filter(|(p, _)| folder(p).is_some_and(|n| n == "index" || n == "snapshots"))
        .count()
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn five_repositories_share_one_budget_for_the_directory() -> TestResult {
    let cache_dir = tempfile::tempdir()?;
    let cancel = CancellationToken::new();
    let cache = CacheOptions { dir: cache_dir.path().join("cache"), max_bytes: 300_000 };
    let (mut repos, mut stores) = (Vec::new(), Vec::new());
    for _ in 0..5 {
        let (repo, store) = common::memory_repo().await;
        repo.set_cache(&cache);
        repos.push((repo, tempfile::tempdir()?));
        stores.push(store);
    }
    let options = ferry_repo::BackupOptions::default();
    let mut last = Vec::new();
    // Eight rounds of five concurrent backups: forty snapshots, each with an index file and
    // a tree pack, far more than the budget holds.
    for round in 0..8u8 {
        for (seed, (_, src)) in (0u8..).zip(&repos) {
            change_tree(src.path(), round, seed.wrapping_mul(61))?;
        }
        let backups = repos
            .iter()
            .map(|(repo, src)| ferry_repo::backup_tree(repo, src.path(), &options, None, &cancel));
        last = futures::future::try_join_all(backups).await?;
        let held = disk_usage(&cache.dir);
        assert!(held <= cache.max_bytes + cache.max_bytes / 4 * 3, "cache holds {held} bytes");
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let held = disk_usage(&cache.dir);
    assert!(held <= cache.max_bytes, "cache holds {held} bytes after the last copies");
    let folders = std::fs::read_dir(&cache.dir)?.count();
    assert_eq!(folders, 5, "one folder per repository");
    // Every index file and snapshot was cached when written: fewer are left.
    let mut stored = 0;
    for store in &stores {
        stored += store.list("index/", &cancel).await?.len();
        stored += store.list("snapshots/", &cancel).await?.len();
    }
    let cached = cached_metadata(&cache.dir);
    assert!(cached < stored, "nothing was evicted: {cached} of {stored} cached");

    // Every repository restores its last backup exactly through what is left of the cache.
    for ((repo, src), summary) in repos.iter().zip(&last) {
        restore_and_compare(repo, &summary.snapshot_id, src.path()).await;
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn the_folder_of_a_repository_not_open_is_evicted_for_others() -> TestResult {
    let cache_dir = tempfile::tempdir()?;
    let cancel = CancellationToken::new();
    let cache = CacheOptions { dir: cache_dir.path().to_path_buf(), max_bytes: 200_000 };
    let options = ferry_repo::BackupOptions::default();

    // A repository backs up through the cache, then is closed (as the agent closes one after
    // ten idle minutes): its folder stays.
    let (closed, closed_store) = common::memory_repo().await;
    closed.set_cache(&cache);
    let closed_src = tempfile::tempdir()?;
    common::build_hard_tree(closed_src.path());
    let kept = ferry_repo::backup_tree(&closed, closed_src.path(), &options, None, &cancel).await?;
    let closed_folder = files_under(cache_dir.path())
        .first()
        .and_then(|(p, _)| Some(p.parent()?.parent()?.to_path_buf()))
        .expect("the closed repository's folder");
    drop(closed);

    // Another repository needs room: the closed one's files, least recently used, go first.
    let (busy, _busy_store) = common::memory_repo().await;
    busy.set_cache(&cache);
    let src = tempfile::tempdir()?;
    let mut last = None;
    for round in 0..20u8 {
        change_tree(src.path(), round, 0)?;
        last = Some(ferry_repo::backup_tree(&busy, src.path(), &options, None, &cancel).await?);
    }
    tokio::time::sleep(std::time::Duration::from_millis(300)).await;
    let held = disk_usage(cache_dir.path());
    assert!(held <= cache.max_bytes, "cache holds {held} bytes");
    assert!(files_under(&closed_folder).is_empty(), "the closed repository's files stayed");

    // Both restore exactly: the closed one with nothing cached, the busy one through what is.
    let dyn_store: Arc<dyn ObjectStore> = closed_store;
    let reopened = Repository::open(dyn_store, b"secret", &cancel).await?;
    reopened.set_cache(&cache);
    restore_and_compare(&reopened, &kept.snapshot_id, closed_src.path()).await;
    let last = last.expect("twenty backups");
    restore_and_compare(&busy, &last.snapshot_id, src.path()).await;
    Ok(())
}
