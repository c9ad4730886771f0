//! File-system backend: one file per object under a root directory.
//!
//! Layout: object `a/b/c` is the file `<root>/a/b/c`. Files being written live in
//! `<root>/tmp~/`; `~` is not a key character, so no key can name that directory or anything
//! in it, and [`FsStore::list`](crate::ObjectStore::list) skips every entry whose name could
//! not be a key segment.
//!
//! Why no partial object is ever visible: an object's bytes are written to a fresh temporary
//! file (created with `O_EXCL`), flushed with `fsync`, and only then given their key by a
//! single `rename` — an atomic directory operation — so the key names either nothing or the
//! complete file. A crash or cancellation before the rename leaves at most a stray temporary
//! file, never a key. The directory is `fsync`ed after the rename so the key survives a crash.
//!
//! Why create-if-absent is atomic: the rename is `renameat2(RENAME_NOREPLACE)`, which the
//! kernel performs only if the target name does not exist, as one step. Of several racing
//! writers exactly one rename succeeds; the others get `EEXIST` and report
//! [`PutOutcome::AlreadyExists`](crate::PutOutcome::AlreadyExists). Where the file system
//! lacks `RENAME_NOREPLACE`, `link(2)` — which also refuses to replace an existing name —
//! gives the key to the complete temporary file instead, and the temporary name is unlinked.
//!
//! A key cannot also be a directory of other keys here (`a` and `a/b` cannot both exist);
//! such a put fails with [`StoreError::Backend`]. Ferry's repository layout never does that.

mod read;
mod walk;
mod write;

use std::io;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::{ObjectKey, ObjectMeta, ObjectStore, PutOutcome, StoreError, StoreResult};
use read::Want;

/// Name of the directory under the root that holds files being written.
const TEMP_DIR: &str = "tmp~";

/// Objects stored as files under a root directory. Cheap to clone.
///
/// Each object is written to a temporary file under `<root>/tmp~/`, flushed, and renamed to
/// its key with `RENAME_NOREPLACE`: readers never see a partial object, and of racing
/// creators of one key exactly one succeeds.
#[derive(Debug, Clone)]
pub struct FsStore {
    root: Arc<PathBuf>,
}

impl FsStore {
    /// A store rooted at the existing directory `root`.
    ///
    /// # Errors
    /// [`StoreError::LocationMissing`] when `root` does not exist,
    /// [`StoreError::InvalidConfig`] when it is not a directory, [`StoreError::Io`] when it
    /// cannot be inspected.
    pub fn open(root: impl Into<PathBuf>) -> StoreResult<Self> {
        let root = root.into();
        match std::fs::metadata(&root) {
            Ok(meta) if meta.is_dir() => Ok(Self { root: Arc::new(root) }),
            Ok(_) => Err(StoreError::InvalidConfig {
                location: root.display().to_string(),
                message: "not a directory".into(),
            }),
            Err(e) if e.kind() == io::ErrorKind::NotFound => {
                Err(StoreError::LocationMissing { location: root.display().to_string() })
            }
            Err(e) => Err(StoreError::io("inspect store root", root, e)),
        }
    }

    /// The root directory.
    #[must_use]
    pub fn root(&self) -> &Path {
        &self.root
    }

    /// The file that holds `key`.
    fn path_of(&self, key: &ObjectKey) -> PathBuf {
        // Key segments are never empty, `.`, `..` or contain `/`, so the result stays under
        // the root.
        key.segments().fold(self.root.to_path_buf(), |path, segment| path.join(segment))
    }

    /// Runs blocking file work on tokio's blocking pool. The work receives the token and
    /// checks it between steps; it is always awaited to the end, so a returned
    /// [`StoreError::Cancelled`] means the work really stopped.
    async fn blocking<T, F>(&self, cancel: &CancellationToken, work: F) -> StoreResult<T>
    where
        T: Send + 'static,
        F: FnOnce(&Path, &CancellationToken) -> StoreResult<T> + Send + 'static,
    {
        if cancel.is_cancelled() {
            return Err(StoreError::Cancelled);
        }
        let root = Arc::clone(&self.root);
        let token = cancel.clone();
        tokio::task::spawn_blocking(move || work(&root, &token)).await.map_err(|e| {
            StoreError::Backend {
                location: self.root.display().to_string(),
                operation: "run file-system task".into(),
                message: e.to_string(),
            }
        })?
    }

    /// Reads `want` of the object `key`.
    async fn read(
        &self,
        key: &ObjectKey,
        want: Want,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        let (key, path) = (key.clone(), self.path_of(key));
        self.blocking(cancel, move |root, cancel| read::read(root, &key, &path, want, cancel)).await
    }
}

/// Turns "file not found" into [`StoreError::LocationMissing`] when the root itself is gone,
/// so a deleted or unmounted store is reported as such rather than as a missing object.
fn check_root(root: &Path) -> StoreResult<()> {
    match std::fs::metadata(root) {
        Ok(meta) if meta.is_dir() => Ok(()),
        Ok(_) => Err(StoreError::LocationMissing { location: root.display().to_string() }),
        Err(e) if e.kind() == io::ErrorKind::NotFound => {
            Err(StoreError::LocationMissing { location: root.display().to_string() })
        }
        Err(e) => Err(StoreError::io("inspect store root", root, e)),
    }
}

/// Whether an error means "no such object": the name, or a directory on its way, is missing
/// or is a file where a directory should be.
fn is_absent(e: &io::Error) -> bool {
    e.kind() == io::ErrorKind::NotFound
        || e.raw_os_error() == Some(nix::errno::Errno::ENOTDIR as i32)
}

/// Flushes a directory's entries to disk.
fn sync_dir(dir: &Path) -> StoreResult<()> {
    std::fs::File::open(dir)
        .and_then(|d| d.sync_all())
        .map_err(|e| StoreError::io("fsync directory", dir, e))
}

#[async_trait]
impl ObjectStore for FsStore {
    fn location(&self) -> String {
        format!("directory {}", self.root.display())
    }

    async fn put_if_absent(
        &self,
        key: &ObjectKey,
        data: Bytes,
        cancel: &CancellationToken,
    ) -> StoreResult<PutOutcome> {
        let (key, target) = (key.clone(), self.path_of(key));
        self.blocking(cancel, move |root, cancel| write::create(root, &key, &target, &data, cancel))
            .await
    }

    async fn get(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<Bytes> {
        self.read(key, Want::Whole { max: None }, cancel).await
    }

    async fn get_at_most(
        &self,
        key: &ObjectKey,
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        self.read(key, Want::Whole { max: Some(max_bytes) }, cancel).await
    }

    async fn get_range(
        &self,
        key: &ObjectKey,
        offset: u64,
        len: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        self.read(key, Want::Range(offset, len), cancel).await
    }

    async fn head(
        &self,
        key: &ObjectKey,
        cancel: &CancellationToken,
    ) -> StoreResult<Option<ObjectMeta>> {
        let (key, path) = (key.clone(), self.path_of(key));
        self.blocking(cancel, move |root, _| read::head(root, key, &path)).await
    }

    async fn list(&self, prefix: &str, cancel: &CancellationToken) -> StoreResult<Vec<ObjectMeta>> {
        let prefix = prefix.to_owned();
        self.blocking(cancel, move |root, cancel| walk::list(root, &prefix, cancel)).await
    }

    async fn delete(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<()> {
        let path = self.path_of(key);
        self.blocking(cancel, move |root, _| {
            match std::fs::remove_file(&path) {
                Ok(()) => {}
                Err(e) if is_absent(&e) => return check_root(root),
                // A directory of other keys is not an object: nothing to delete.
                Err(e) if path.is_dir() => {
                    tracing::debug!(path = %path.display(), error = %e, "delete of a directory ignored");
                    return Ok(());
                }
                Err(e) => return Err(StoreError::io("delete object", path, e)),
            }
            match path.parent() {
                Some(dir) => sync_dir(dir),
                None => Ok(()),
            }
        })
        .await
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keys_map_below_the_root() {
        let store = FsStore { root: Arc::new(PathBuf::from("/srv/repo")) };
        let key = ObjectKey::new("data/ab/..x").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(store.path_of(&key), Path::new("/srv/repo/data/ab/..x"));
        assert!(store.path_of(&key).starts_with(store.root()));
        assert!(!ObjectKey::is_valid_segment(TEMP_DIR));
    }

    #[test]
    fn open_reports_missing_and_non_directory_roots() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let missing = dir.path().join("absent");
        assert!(matches!(FsStore::open(&missing), Err(StoreError::LocationMissing { .. })));
        let file = dir.path().join("file");
        std::fs::write(&file, b"x").unwrap_or_else(|e| panic!("{e}"));
        assert!(matches!(FsStore::open(&file), Err(StoreError::InvalidConfig { .. })));
        assert!(FsStore::open(dir.path()).is_ok());
    }
}
