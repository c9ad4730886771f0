//! A bounded local cache of the repository objects every operation reads again: index files,
//! snapshot manifests and tree packs.
//!
//! Each is named by the BLAKE3 hash of its bytes and never rewritten, so a cached copy is
//! either exactly the stored object or detectably damaged: every read hashes the file and a
//! mismatch is treated as a miss (the file is removed and the object read from the store).
//! Nothing in the cache is ever needed: a missing directory, a full disk or a damaged file
//! only costs a read from the store, and the cache directory may be deleted at any time, also
//! while Ferry runs (the next write creates it again).
//!
//! Size: an object larger than a quarter of the budget is not cached. After a write that takes
//! the process's running total over the budget, the directory is listed and the least recently
//! used files (by modification time, which a hit refreshes) are removed until it holds at most
//! three quarters of the budget. Several processes may share a directory: writes are atomic
//! (temporary file and rename), and each eviction lists what is on disk, so the bound holds
//! for their union up to the objects written between two evictions.

use std::fs;
use std::io::Write;
use std::path::{Path, PathBuf};
use std::sync::Mutex;
use std::time::SystemTime;

use bytes::Bytes;

use crate::format::content_address;

/// Where a repository's local cache lives and how large it may grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheOptions {
    /// The cache directory; each repository gets its own folder inside it, named by the
    /// repository's id.
    pub dir: PathBuf,
    /// Most bytes the repository's folder may hold.
    pub max_bytes: u64,
}

impl CacheOptions {
    /// The default budget: 512 MiB.
    pub const DEFAULT_MAX_BYTES: u64 = 512 << 20;
}

/// The kinds of object kept, each in its own folder.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Cached {
    Index,
    Snapshot,
    TreePack,
}

impl Cached {
    const ALL: [Self; 3] = [Self::Index, Self::Snapshot, Self::TreePack];

    fn folder(self) -> &'static str {
        match self {
            Self::Index => "index",
            Self::Snapshot => "snapshots",
            Self::TreePack => "trees",
        }
    }
}

#[derive(Debug)]
pub(crate) struct DiskCache {
    root: PathBuf,
    max_bytes: u64,
    /// Bytes this process believes the folder holds (`None` until first counted).
    held: Mutex<Option<u64>>,
}

impl DiskCache {
    pub(crate) fn new(options: &CacheOptions, repo_id: &[u8; 32]) -> Self {
        Self {
            root: options.dir.join(hex::encode(repo_id)),
            max_bytes: options.max_bytes,
            held: Mutex::new(None),
        }
    }

    fn path(&self, kind: Cached, id: &[u8; 32]) -> PathBuf {
        self.root.join(kind.folder()).join(hex::encode(id))
    }

    /// The cached object named `id`, if present and intact.
    pub(crate) fn get(&self, kind: Cached, id: &[u8; 32]) -> Option<Bytes> {
        let path = self.path(kind, id);
        let bytes = fs::read(&path).ok()?;
        if content_address(&bytes) != *id {
            tracing::warn!(path = %path.display(), "damaged cache file removed");
            let _ = fs::remove_file(&path);
            return None;
        }
        // Mark it recently used; an error here only makes it an earlier eviction candidate.
        if let Ok(file) = fs::File::options().write(true).open(&path) {
            let _ = file.set_modified(SystemTime::now());
        }
        Some(Bytes::from(bytes))
    }

    /// Keeps a copy of `bytes`, the object named `id` (ignored unless they hash to it).
    /// Failures are logged and otherwise ignored: the cache is never needed.
    pub(crate) fn put(&self, kind: Cached, id: &[u8; 32], bytes: &[u8]) {
        let len = bytes.len() as u64;
        if len > self.max_bytes / 4 || content_address(bytes) != *id {
            return;
        }
        let path = self.path(kind, id);
        if path.exists() {
            return;
        }
        if let Err(e) = write_atomically(&path, bytes) {
            tracing::debug!(path = %path.display(), error = %e, "not cached");
            return;
        }
        let over = {
            let Ok(mut held) = self.held.lock() else { return };
            let total = match *held {
                Some(n) => n + len,
                None => self.count(),
            };
            *held = Some(total);
            total > self.max_bytes
        };
        if over {
            self.evict();
        }
    }

    /// Bytes held on disk now.
    fn count(&self) -> u64 {
        self.files().iter().map(|f| f.1).sum()
    }

    /// Every cached file with its size and modification time.
    fn files(&self) -> Vec<(PathBuf, u64, SystemTime)> {
        let mut out = Vec::new();
        for kind in Cached::ALL {
            let Ok(dir) = fs::read_dir(self.root.join(kind.folder())) else { continue };
            for entry in dir.flatten() {
                let Ok(meta) = entry.metadata() else { continue };
                if meta.is_file() {
                    let mtime = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    out.push((entry.path(), meta.len(), mtime));
                }
            }
        }
        out
    }

    /// Removes the least recently used files until at most three quarters of the budget
    /// remain (temporary files of interrupted writes included, oldest first like the rest).
    fn evict(&self) {
        let mut files = self.files();
        files.sort_by_key(|f| f.2);
        let mut total: u64 = files.iter().map(|f| f.1).sum();
        let goal = self.max_bytes / 4 * 3;
        for (path, len, _) in files {
            if total <= goal {
                break;
            }
            if fs::remove_file(&path).is_ok() || !path.exists() {
                total -= len;
            }
        }
        if let Ok(mut held) = self.held.lock() {
            *held = Some(total);
        }
    }
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename, so no
/// reader sees a partial file (a reader would reject one anyway: its hash would not match).
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    fs::create_dir_all(dir)?;
    let mut tmp = tempfile::NamedTempFile::new_in(dir)?;
    tmp.write_all(bytes)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn object(n: u8, len: usize) -> (Bytes, [u8; 32]) {
        let bytes = Bytes::from(vec![n; len]);
        let id = content_address(&bytes);
        (bytes, id)
    }

    fn cache(dir: &Path, max_bytes: u64) -> DiskCache {
        DiskCache::new(&CacheOptions { dir: dir.to_path_buf(), max_bytes }, &[7; 32])
    }

    #[test]
    fn keeps_and_returns_objects() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), 1 << 20);
        let (bytes, id) = object(1, 1000);
        assert!(c.get(Cached::Index, &id).is_none());
        c.put(Cached::Index, &id, &bytes);
        assert_eq!(c.get(Cached::Index, &id), Some(bytes));
        assert!(c.get(Cached::Snapshot, &id).is_none(), "kinds are kept apart");
    }

    #[test]
    fn refuses_bytes_that_are_not_the_named_object() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), 1 << 20);
        let (_, id) = object(1, 1000);
        c.put(Cached::Index, &id, b"something else");
        assert!(c.get(Cached::Index, &id).is_none());
    }

    #[test]
    fn a_damaged_file_is_a_miss_and_is_removed() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), 1 << 20);
        let (bytes, id) = object(2, 1000);
        c.put(Cached::TreePack, &id, &bytes);
        let path = c.path(Cached::TreePack, &id);
        let mut damaged = bytes.to_vec();
        damaged[500] ^= 1;
        fs::write(&path, damaged).unwrap();
        assert!(c.get(Cached::TreePack, &id).is_none());
        assert!(!path.exists());
    }

    #[test]
    fn stays_within_its_budget_and_evicts_the_least_recently_used() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), 40_000);
        let objects: Vec<_> = (0..20).map(|n| object(n, 4000)).collect();
        let first = &objects[0];
        c.put(Cached::Index, &first.1, &first.0);
        for (bytes, id) in &objects[1..] {
            std::thread::sleep(std::time::Duration::from_millis(5));
            // Keep the first one in use: it must survive every eviction.
            assert!(c.get(Cached::Index, &first.1).is_some());
            c.put(Cached::Index, id, bytes);
            assert!(c.count() <= 40_000, "over budget: {}", c.count());
        }
        assert!(c.get(Cached::Index, &first.1).is_some());
        assert!(c.get(Cached::Index, &objects[1].1).is_none(), "oldest unused one evicted");
        assert!(c.get(Cached::Index, &objects[19].1).is_some());
    }

    #[test]
    fn skips_objects_larger_than_a_quarter_of_the_budget() {
        let dir = tempfile::tempdir().unwrap();
        let c = cache(dir.path(), 40_000);
        let (bytes, id) = object(3, 10_001);
        c.put(Cached::TreePack, &id, &bytes);
        assert!(c.get(Cached::TreePack, &id).is_none());
    }

    #[test]
    fn survives_its_directory_being_deleted() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path().join("cache");
        let c = cache(&root, 1 << 20);
        let (a, a_id) = object(4, 1000);
        c.put(Cached::Snapshot, &a_id, &a);
        fs::remove_dir_all(&root).unwrap();
        assert!(c.get(Cached::Snapshot, &a_id).is_none());
        let (b, b_id) = object(5, 1000);
        c.put(Cached::Snapshot, &b_id, &b);
        assert_eq!(c.get(Cached::Snapshot, &b_id), Some(b));
    }
}
