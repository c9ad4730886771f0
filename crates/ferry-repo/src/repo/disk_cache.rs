//! A bounded local cache of the repository objects every operation reads again: index files,
//! snapshot manifests and tree packs, kept as `<dir>/<repository id>/<kind>/<object id>`.
//!
//! Each is named by the BLAKE3 hash of its bytes and never rewritten, so a cached copy is
//! either exactly the stored object or detectably damaged: every read hashes the file and a
//! mismatch is treated as a miss (the file is removed and the object read from the store).
//! Nothing in the cache is ever needed: a missing directory, a full disk or a damaged file
//! only costs a read from the store, and the cache directory may be deleted at any time, also
//! while Ferry runs (the next write creates it again).
//!
//! Size: one budget covers the whole directory, every repository's folder together, those of
//! repositories not open in this process included. A file counts the disk blocks it takes (what
//! a size-limited volume such as the agent's emptyDir counts), at least its length; folders
//! are not counted. An object larger than a quarter of the budget is not cached. Every cache
//! of this process on one directory and budget shares one [`Budget`], a running total counted
//! by listing the directory at its first write. Each write reserves its size first: if the
//! files, the writes under way and this one would pass the budget, the directory is listed and
//! the least recently used files of all folders (by modification time, which a hit refreshes)
//! are removed until it holds at most three quarters of the budget (less if the writes under
//! way need it) before the write starts; folders left empty go too; a write for which the
//! writes under way leave no room is skipped. So the directory stays within the budget while
//! several threads write at once: the size-limited volume it lives on needs no room beyond
//! the budget for this process's writes.
//!
//! Eviction never spoils a read: a hit reads the file whole through one descriptor, and a file
//! removed (unlinked) while open stays readable through it; a file removed before it is opened
//! is a miss. Several processes may share a directory: writes are atomic (temporary file and
//! rename), eviction only removes files, and each eviction lists what is on disk, so the bound
//! holds for their union up to the objects written between two evictions. Only files in the
//! layout above are counted or removed; anything else in the directory, and symbolic links,
//! are left alone.

use std::collections::BTreeSet;
use std::fs;
use std::io::Write;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, PoisonError, Weak};
use std::time::SystemTime;

use bytes::Bytes;

use crate::format::content_address;

/// Where the local cache lives and how large it may grow.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CacheOptions {
    /// The cache directory; each repository gets its own folder inside it, named by the
    /// repository's id.
    pub dir: PathBuf,
    /// Most bytes the whole directory may hold: every repository's folder together, open or
    /// not. The repositories of one process given the same directory and budget share one
    /// running total.
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

/// One repository's folder of the cache.
#[derive(Debug)]
pub(crate) struct DiskCache {
    root: PathBuf,
    budget: Arc<Budget>,
}

impl DiskCache {
    pub(crate) fn new(options: &CacheOptions, repo_id: &[u8; 32]) -> Self {
        let budget = Budget::shared(options);
        Self { root: budget.dir.join(hex::encode(repo_id)), budget }
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
        if len > self.budget.max_bytes / 4 || content_address(bytes) != *id {
            return;
        }
        let path = self.path(kind, id);
        if path.exists() {
            return;
        }
        let Some(reserved) = self.budget.reserve(len) else {
            tracing::debug!(path = %path.display(), "not cached: writes under way fill the budget");
            return;
        };
        let size = match write_atomically(&path, bytes) {
            Ok(()) => fs::symlink_metadata(&path).map_or(len, |meta| disk_size(&meta)),
            Err(e) => {
                tracing::debug!(path = %path.display(), error = %e, "not cached");
                0
            }
        };
        self.budget.settle(reserved, size);
    }
}

/// The running total of one cache directory, shared by every cache of this process on it.
#[derive(Debug)]
struct Budget {
    /// The cache directory, made absolute.
    dir: PathBuf,
    max_bytes: u64,
    /// What this process believes the directory holds (`None` until first counted). Held
    /// through an eviction, so this process runs one at a time.
    held: Mutex<Option<Held>>,
}

/// A budget's running counts.
#[derive(Debug, Clone, Copy)]
struct Held {
    /// Bytes the cache's files take.
    on_disk: u64,
    /// Bytes reserved by writes under way: room made before they write.
    in_flight: u64,
}

/// How long a temporary file is taken for a write under way.
const TEMP_FILE_AGE: std::time::Duration = std::time::Duration::from_secs(600);

/// The budgets of this process's caches, found again by directory and size.
static BUDGETS: Mutex<Vec<Weak<Budget>>> = Mutex::new(Vec::new());

/// A file of the cache: where, how many bytes of disk it takes, when last used.
struct CachedFile {
    path: PathBuf,
    size: u64,
    used: SystemTime,
}

impl Budget {
    /// The budget of `options`: the one a live cache of this process on the same directory
    /// and size uses, else a new one.
    fn shared(options: &CacheOptions) -> Arc<Self> {
        let dir = std::path::absolute(&options.dir).unwrap_or_else(|_| options.dir.clone());
        let mut budgets = BUDGETS.lock().unwrap_or_else(PoisonError::into_inner);
        budgets.retain(|b| b.strong_count() > 0);
        let same = |b: &Arc<Self>| b.dir == dir && b.max_bytes == options.max_bytes;
        if let Some(found) = budgets.iter().filter_map(Weak::upgrade).find(same) {
            return found;
        }
        let budget = Arc::new(Self { dir, max_bytes: options.max_bytes, held: Mutex::new(None) });
        budgets.push(Arc::downgrade(&budget));
        budget
    }

    /// Makes room for a write of `len` bytes before it starts and returns what it reserved
    /// (to hand to [`Budget::settle`]): evicts first if the files, the writes under way and
    /// this one would pass the budget, so concurrent writes never take the directory over it
    /// (the first reservation counts the directory). `None`, and nothing evicted, when the
    /// writes under way leave no room for this one: it is not cached.
    fn reserve(&self, len: u64) -> Option<u64> {
        // Files take whole blocks.
        let len = len.next_multiple_of(4096);
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let counts = held.get_or_insert_with(|| Held { on_disk: self.on_disk(), in_flight: 0 });
        let room = self.max_bytes.checked_sub(counts.in_flight + len)?;
        if counts.on_disk > room {
            counts.on_disk = self.evict((self.max_bytes / 4 * 3).min(room));
        }
        counts.in_flight += len;
        Some(len)
    }

    /// Ends a write that [`Budget::reserve`]d `reserved` bytes and took `size` bytes of disk
    /// (0: it failed). A file larger than its reservation may pass the budget: then evicts.
    fn settle(&self, reserved: u64, size: u64) {
        let mut held = self.held.lock().unwrap_or_else(PoisonError::into_inner);
        let counts = held.get_or_insert_with(|| Held { on_disk: self.on_disk(), in_flight: 0 });
        counts.in_flight = counts.in_flight.saturating_sub(reserved);
        counts.on_disk += size;
        if counts.on_disk + counts.in_flight > self.max_bytes {
            let room = self.max_bytes.saturating_sub(counts.in_flight);
            counts.on_disk = self.evict((self.max_bytes / 4 * 3).min(room));
        }
    }

    /// Bytes the cache's files take on disk now.
    fn on_disk(&self) -> u64 {
        self.files().iter().map(|f| f.size).sum()
    }

    /// Every file of the cache: `<dir>/<repository id>/<kind>/*`, never following a symbolic
    /// link. Temporary files of writes under way (younger than [`TEMP_FILE_AGE`]) are left
    /// out: their writers have reserved their room; older ones, left by interrupted writes,
    /// are counted and evicted like the rest.
    fn files(&self) -> Vec<CachedFile> {
        let mut out = Vec::new();
        for (repo, meta) in listing(&self.dir) {
            if !meta.is_dir() || !repo.file_name().is_some_and(is_repo_folder) {
                continue;
            }
            for kind in Cached::ALL {
                for (path, meta) in listing(&repo.join(kind.folder())) {
                    let used = meta.modified().unwrap_or(SystemTime::UNIX_EPOCH);
                    let fresh = !used.elapsed().is_ok_and(|age| age >= TEMP_FILE_AGE);
                    let temporary =
                        path.file_name().is_some_and(|n| n.as_encoded_bytes().starts_with(b"."));
                    if meta.is_file() && !(temporary && fresh) {
                        out.push(CachedFile { path, size: disk_size(&meta), used });
                    }
                }
            }
        }
        out
    }

    /// Removes the least recently used files of all folders until at most `goal` bytes
    /// remain, then the folders it emptied; returns the bytes left.
    fn evict(&self, goal: u64) -> u64 {
        let mut files = self.files();
        files.sort_by_key(|f| f.used);
        let mut total: u64 = files.iter().map(|f| f.size).sum();
        let mut touched = BTreeSet::new();
        for file in files {
            if total <= goal {
                break;
            }
            let gone = match fs::remove_file(&file.path) {
                Ok(()) => true,
                Err(e) => e.kind() == std::io::ErrorKind::NotFound,
            };
            if gone {
                total -= file.size;
                touched.extend(file.path.parent().and_then(Path::parent).map(Path::to_path_buf));
            }
        }
        // Only empty folders go; a writer that loses its folder this way creates it again.
        for repo in touched {
            for kind in Cached::ALL {
                let _ = fs::remove_dir(repo.join(kind.folder()));
            }
            let _ = fs::remove_dir(&repo);
        }
        total
    }
}

/// Whether `name` is a repository's folder: its id in hex.
fn is_repo_folder(name: &std::ffi::OsStr) -> bool {
    name.len() == 64 && name.as_encoded_bytes().iter().all(u8::is_ascii_hexdigit)
}

/// The entries of `dir` with their own metadata (links not followed); none unless `dir` is
/// a directory, not a link to one.
fn listing(dir: &Path) -> Vec<(PathBuf, fs::Metadata)> {
    if !fs::symlink_metadata(dir).is_ok_and(|m| m.is_dir()) {
        return Vec::new();
    }
    let Ok(entries) = fs::read_dir(dir) else { return Vec::new() };
    entries.flatten().filter_map(|e| Some((e.path(), e.metadata().ok()?))).collect()
}

/// The bytes of disk a file takes: its blocks, at least its length.
fn disk_size(meta: &fs::Metadata) -> u64 {
    meta.len().max(meta.blocks().saturating_mul(512))
}

/// Writes `bytes` to `path` through a temporary file in the same folder and a rename, so no
/// reader sees a partial file (a reader would reject one anyway: its hash would not match).
/// Tried twice: an eviction may remove the folder, empty, between its creation and the write.
fn write_atomically(path: &Path, bytes: &[u8]) -> std::io::Result<()> {
    let dir = path.parent().unwrap_or(Path::new("."));
    let mut tries = 0;
    let mut tmp = loop {
        fs::create_dir_all(dir)?;
        match tempfile::NamedTempFile::new_in(dir) {
            Err(e) if e.kind() == std::io::ErrorKind::NotFound && tries == 0 => tries += 1,
            other => break other?,
        }
    };
    tmp.write_all(bytes)?;
    tmp.persist(path).map_err(|e| e.error)?;
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    fn object(n: u8, len: usize) -> (Bytes, [u8; 32]) {
        let bytes = Bytes::from(vec![n; len]);
        let id = content_address(&bytes);
        (bytes, id)
    }

    fn cache_of(dir: &Path, max_bytes: u64, repo: u8) -> DiskCache {
        DiskCache::new(&CacheOptions { dir: dir.to_path_buf(), max_bytes }, &[repo; 32])
    }

    fn cache(dir: &Path, max_bytes: u64) -> DiskCache {
        cache_of(dir, max_bytes, 7)
    }

    fn tempdir() -> tempfile::TempDir {
        tempfile::tempdir().expect("temporary directory")
    }

    /// Marks `path` last used `secs_ago` seconds ago.
    fn age(path: &Path, secs_ago: u64) {
        let file = fs::File::options().write(true).open(path).expect("cache file");
        let then = SystemTime::now() - std::time::Duration::from_secs(secs_ago);
        file.set_modified(then).expect("set mtime");
    }

    #[test]
    fn keeps_and_returns_objects() {
        let dir = tempdir();
        let c = cache(dir.path(), 1 << 20);
        let (bytes, id) = object(1, 1000);
        assert!(c.get(Cached::Index, &id).is_none());
        c.put(Cached::Index, &id, &bytes);
        assert_eq!(c.get(Cached::Index, &id), Some(bytes));
        assert!(c.get(Cached::Snapshot, &id).is_none(), "kinds are kept apart");
    }

    #[test]
    fn refuses_bytes_that_are_not_the_named_object() {
        let dir = tempdir();
        let c = cache(dir.path(), 1 << 20);
        let (_, id) = object(1, 1000);
        c.put(Cached::Index, &id, b"something else");
        assert!(c.get(Cached::Index, &id).is_none());
    }

    #[test]
    fn a_damaged_file_is_a_miss_and_is_removed() {
        let dir = tempdir();
        let c = cache(dir.path(), 1 << 20);
        let (bytes, id) = object(2, 1000);
        c.put(Cached::TreePack, &id, &bytes);
        let path = c.path(Cached::TreePack, &id);
        let mut damaged = bytes.to_vec();
        damaged[500] ^= 1;
        fs::write(&path, damaged).expect("damage the file");
        assert!(c.get(Cached::TreePack, &id).is_none());
        assert!(!path.exists());
    }

    #[test]
    fn stays_within_its_budget_and_evicts_the_least_recently_used() {
        let dir = tempdir();
        let c = cache(dir.path(), 40_000);
        let objects: Vec<_> = (0..20).map(|n| object(n, 4000)).collect();
        let first = &objects[0];
        c.put(Cached::Index, &first.1, &first.0);
        for (n, (bytes, id)) in objects.iter().enumerate().skip(1) {
            // Keep the first one in use: it must survive every eviction.
            assert!(c.get(Cached::Index, &first.1).is_some());
            c.put(Cached::Index, id, bytes);
            age(&c.path(Cached::Index, id), 100 - n as u64);
            assert!(c.budget.on_disk() <= 40_000, "over budget: {}", c.budget.on_disk());
        }
        assert!(c.get(Cached::Index, &first.1).is_some());
        assert!(c.get(Cached::Index, &objects[1].1).is_none(), "oldest unused one evicted");
        assert!(c.get(Cached::Index, &objects[19].1).is_some());
    }

    #[test]
    fn room_is_made_before_a_write_so_writes_at_once_stay_within_the_budget() {
        let dir = tempdir();
        let c = cache(dir.path(), 400_000);
        for n in 0..9 {
            let (bytes, id) = object(n, 40_000);
            c.put(Cached::TreePack, &id, &bytes);
            age(&c.path(Cached::TreePack, &id), 1000 - u64::from(n));
        }
        let before = c.budget.on_disk();
        assert!(before > 300_000, "{before}");
        // Two large writes under way at once (each a quarter of the budget, rounded to blocks):
        // their room is made before either writes.
        let first = c.budget.reserve(100_000).expect("room");
        let second = c.budget.reserve(100_000).expect("room");
        assert_eq!((first, second), (102_400, 102_400));
        let on_disk = c.budget.on_disk();
        assert!(on_disk + first + second <= 400_000, "{on_disk} on disk");
        // Writes under way that leave no room for another: it is not cached, nothing evicted.
        let third = c.budget.reserve(100_000).expect("room");
        let held = c.budget.on_disk();
        assert!(c.budget.reserve(100_000).is_none(), "a fourth quarter does not fit");
        assert_eq!(c.budget.on_disk(), held);
        c.budget.settle(first, 0);
        c.budget.settle(second, 0);
        c.budget.settle(third, 0);
        let (bytes, id) = object(20, 100_000);
        c.put(Cached::TreePack, &id, &bytes);
        assert!(c.budget.on_disk() <= 400_000);
        assert_eq!(c.get(Cached::TreePack, &id), Some(bytes));
    }

    #[test]
    fn repositories_sharing_a_directory_share_one_budget() {
        let dir = tempdir();
        let caches: Vec<_> = (0..5).map(|repo| cache_of(dir.path(), 40_000, repo)).collect();
        assert!(caches.iter().all(|c| Arc::ptr_eq(&c.budget, &caches[0].budget)));
        assert!(!Arc::ptr_eq(&cache_of(dir.path(), 50_000, 0).budget, &caches[0].budget));
        for n in 0..40u8 {
            let (bytes, id) = object(n, 4000);
            let c = &caches[usize::from(n) % 5];
            c.put(Cached::Snapshot, &id, &bytes);
            age(&c.path(Cached::Snapshot, &id), 100 - u64::from(n));
            let held = caches[0].budget.on_disk();
            assert!(held <= 40_000, "five folders hold {held} bytes");
        }
        let (bytes, id) = object(39, 4000);
        assert_eq!(caches[4].get(Cached::Snapshot, &id), Some(bytes), "the newest stays");
    }

    #[test]
    fn the_folder_of_a_repository_not_open_makes_room() {
        let dir = tempdir();
        let closed = cache_of(dir.path(), 40_000, 1);
        for n in 0..6 {
            let (bytes, id) = object(n, 4000);
            closed.put(Cached::TreePack, &id, &bytes);
            age(&closed.path(Cached::TreePack, &id), 3600);
        }
        let closed_folder = closed.root.clone();
        drop(closed);
        // A later process (no budget of this directory alive) counts that folder too.
        let open = cache_of(dir.path(), 40_000, 2);
        for n in 10..20 {
            let (bytes, id) = object(n, 4000);
            open.put(Cached::TreePack, &id, &bytes);
            age(&open.path(Cached::TreePack, &id), 100 - u64::from(n));
            assert!(open.budget.on_disk() <= 40_000);
        }
        assert!(!closed_folder.exists(), "the least recently used folder is gone");
        let (bytes, id) = object(19, 4000);
        assert_eq!(open.get(Cached::TreePack, &id), Some(bytes));
    }

    #[test]
    fn leaves_alone_what_is_not_a_cache_file() {
        let dir = tempdir();
        let elsewhere = tempdir();
        let foreign = [
            dir.path().join("notes.txt"),
            dir.path().join("not-a-repository").join("index").join("f"),
            dir.path().join("ab".repeat(32)).join("other").join("f"),
            elsewhere.path().join("index").join("f"),
        ];
        for path in &foreign {
            fs::create_dir_all(path.parent().expect("parent")).expect("folder");
            fs::write(path, vec![0; 8000]).expect("foreign file");
            age(path, 7200);
        }
        let link = dir.path().join("cd".repeat(32));
        std::os::unix::fs::symlink(elsewhere.path(), &link).expect("symbolic link");
        let c = cache(dir.path(), 40_000);
        for n in 0..20 {
            let (bytes, id) = object(n, 4000);
            c.put(Cached::Index, &id, &bytes);
        }
        assert!(foreign.iter().all(|p| p.exists()), "only cache files are evicted");
    }

    #[test]
    fn a_reader_with_the_file_open_reads_it_whole_after_eviction() {
        let dir = tempdir();
        let c = cache(dir.path(), 40_000);
        let (bytes, id) = object(1, 8000);
        c.put(Cached::Snapshot, &id, &bytes);
        age(&c.path(Cached::Snapshot, &id), 3600);
        let mut reading = fs::File::open(c.path(Cached::Snapshot, &id)).expect("open");
        for n in 2..20 {
            let (other, other_id) = object(n, 4000);
            c.put(Cached::Snapshot, &other_id, &other);
        }
        assert!(!c.path(Cached::Snapshot, &id).exists(), "evicted");
        let mut read = Vec::new();
        std::io::Read::read_to_end(&mut reading, &mut read).expect("read");
        assert_eq!(read, bytes, "an open descriptor still reads the removed file");
        assert!(c.get(Cached::Snapshot, &id).is_none(), "later reads miss");
    }

    #[test]
    fn skips_objects_larger_than_a_quarter_of_the_budget() {
        let dir = tempdir();
        let c = cache(dir.path(), 40_000);
        let (bytes, id) = object(3, 10_001);
        c.put(Cached::TreePack, &id, &bytes);
        assert!(c.get(Cached::TreePack, &id).is_none());
    }

    #[test]
    fn survives_its_directory_being_deleted() {
        let dir = tempdir();
        let root = dir.path().join("cache");
        let c = cache(&root, 1 << 20);
        let (a, a_id) = object(4, 1000);
        c.put(Cached::Snapshot, &a_id, &a);
        fs::remove_dir_all(&root).expect("delete the cache");
        assert!(c.get(Cached::Snapshot, &a_id).is_none());
        let (b, b_id) = object(5, 1000);
        c.put(Cached::Snapshot, &b_id, &b);
        assert_eq!(c.get(Cached::Snapshot, &b_id), Some(b));
    }
}
