//! Atomic create-if-absent of one file (see the module docs of `fs` for the argument).

use std::fs::{self, File, OpenOptions};
use std::io::{self, Write};
use std::path::{Path, PathBuf};

use tokio_util::sync::CancellationToken;

use super::{TEMP_DIR, check_root, sync_dir};
use crate::{ObjectKey, PutOutcome, StoreError, StoreResult};

/// Bytes written between two cancellation checks.
const WRITE_CHUNK: usize = 1 << 20;

/// Writes `data` as the object `key` at `target` unless something already has that name.
pub(super) fn create(
    root: &Path,
    key: &ObjectKey,
    target: &Path,
    data: &[u8],
    cancel: &CancellationToken,
) -> StoreResult<PutOutcome> {
    check_root(root)?;
    let dir = target.parent().unwrap_or(root);
    create_parents(root, dir)?;
    let temp = TempFile::write(root, data, cancel)?;
    if cancel.is_cancelled() {
        return Err(StoreError::Cancelled);
    }
    match temp.link_no_replace(target)? {
        Linked::Created => {
            sync_dir(dir)?;
            Ok(PutOutcome::Created)
        }
        Linked::Exists if target.is_dir() => Err(StoreError::Backend {
            location: root.display().to_string(),
            operation: format!("put {key}"),
            message: "the key names a directory that holds other keys".into(),
        }),
        Linked::Exists => Ok(PutOutcome::AlreadyExists),
    }
}

/// Creates the directories between `root` and `dir`, flushing each parent whose entries
/// changed so the new directory survives a crash.
fn create_parents(root: &Path, dir: &Path) -> StoreResult<()> {
    let Ok(relative) = dir.strip_prefix(root) else {
        return Ok(());
    };
    let mut current = root.to_path_buf();
    for part in relative.components() {
        let parent = current.clone();
        current.push(part);
        match fs::create_dir(&current) {
            Ok(()) => sync_dir(&parent)?,
            // Another writer may have created it and not yet synced its parent: sync it here
            // too, or a crash could lose the directory with the object about to go into it.
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => sync_dir(&parent)?,
            Err(e) => return Err(StoreError::io("create directory", current, e)),
        }
    }
    if dir.is_dir() {
        Ok(())
    } else {
        Err(StoreError::Backend {
            location: root.display().to_string(),
            operation: format!("create directory {}", dir.display()),
            message: "a key already names this path as an object".into(),
        })
    }
}

enum Linked {
    Created,
    Exists,
}

/// A fully written, flushed temporary file; removed on drop unless it was given a key by
/// rename.
struct TempFile {
    path: PathBuf,
    renamed: bool,
}

impl TempFile {
    fn write(root: &Path, data: &[u8], cancel: &CancellationToken) -> StoreResult<Self> {
        let dir = root.join(TEMP_DIR);
        match fs::create_dir(&dir) {
            Ok(()) => sync_dir(root)?,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {}
            Err(e) => return Err(StoreError::io("create temporary directory", dir, e)),
        }
        let (file, temp) = Self::create_unique(&dir)?;
        temp.fill(file, data, cancel)?;
        Ok(temp)
    }

    fn create_unique(dir: &Path) -> StoreResult<(File, Self)> {
        let mut last = None;
        for _ in 0..8 {
            let path = dir.join(format!("{:016x}.part", rand::random::<u64>()));
            match OpenOptions::new().write(true).create_new(true).open(&path) {
                Ok(file) => return Ok((file, Self { path, renamed: false })),
                Err(e) if e.kind() == io::ErrorKind::AlreadyExists => last = Some((path, e)),
                Err(e) => return Err(StoreError::io("create temporary file", path, e)),
            }
        }
        let (path, e) = last.unwrap_or_else(|| {
            (dir.to_path_buf(), io::Error::other("no unique temporary name found"))
        });
        Err(StoreError::io("create temporary file", path, e))
    }

    fn fill(&self, mut file: File, data: &[u8], cancel: &CancellationToken) -> StoreResult<()> {
        for chunk in data.chunks(WRITE_CHUNK) {
            if cancel.is_cancelled() {
                return Err(StoreError::Cancelled);
            }
            file.write_all(chunk)
                .map_err(|e| StoreError::io("write temporary file", &self.path, e))?;
        }
        if cancel.is_cancelled() {
            return Err(StoreError::Cancelled);
        }
        file.sync_all().map_err(|e| StoreError::io("fsync temporary file", &self.path, e))
    }

    /// Gives `target` to this file's complete contents unless `target` exists.
    fn link_no_replace(mut self, target: &Path) -> StoreResult<Linked> {
        match rename_no_replace(&self.path, target) {
            Ok(()) => {
                self.renamed = true;
                return Ok(Linked::Created);
            }
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => return Ok(Linked::Exists),
            Err(e) if !rename_unsupported(&e) => {
                return Err(StoreError::io("rename temporary file into place", target, e));
            }
            Err(_) => {}
        }
        // No RENAME_NOREPLACE here: `link` also refuses to replace, and the temporary name is
        // dropped (by `Drop`) once the key holds the data.
        match fs::hard_link(&self.path, target) {
            Ok(()) => Ok(Linked::Created),
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => Ok(Linked::Exists),
            Err(e) => Err(StoreError::io("link temporary file into place", target, e)),
        }
    }
}

impl Drop for TempFile {
    fn drop(&mut self) {
        if !self.renamed
            && let Err(e) = fs::remove_file(&self.path)
        {
            tracing::warn!(path = %self.path.display(), error = %e, "temporary file left behind");
        }
    }
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn rename_no_replace(from: &Path, to: &Path) -> io::Result<()> {
    use nix::fcntl::{AT_FDCWD, RenameFlags, renameat2};
    renameat2(AT_FDCWD, from, AT_FDCWD, to, RenameFlags::RENAME_NOREPLACE).map_err(io::Error::from)
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn rename_no_replace(_from: &Path, _to: &Path) -> io::Result<()> {
    Err(io::Error::from(io::ErrorKind::Unsupported))
}

/// Whether `rename_no_replace` failed only because the system lacks it.
fn rename_unsupported(e: &io::Error) -> bool {
    use nix::errno::Errno;
    e.kind() == io::ErrorKind::Unsupported
        || matches!(e.raw_os_error(), Some(code) if code == Errno::EINVAL as i32 || code == Errno::ENOSYS as i32)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn link_fallback_refuses_to_replace() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let target = dir.path().join("obj");
        fs::write(&target, b"first").unwrap_or_else(|e| panic!("{e}"));
        let source = dir.path().join("temp");
        fs::write(&source, b"second").unwrap_or_else(|e| panic!("{e}"));
        let err = fs::hard_link(&source, &target).err().map(|e| e.kind());
        assert_eq!(err, Some(io::ErrorKind::AlreadyExists));
        let exists = rename_no_replace(&source, &target).err().map(|e| e.kind());
        assert_eq!(exists, Some(io::ErrorKind::AlreadyExists));
        assert_eq!(fs::read(&target).unwrap_or_default(), b"first");
    }

    #[test]
    fn cancelled_write_leaves_no_temporary_file() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let cancel = CancellationToken::new();
        cancel.cancel();
        let result = TempFile::write(dir.path(), &[7; 3 * WRITE_CHUNK], &cancel);
        assert!(matches!(result, Err(StoreError::Cancelled)));
        let left = fs::read_dir(dir.path().join(TEMP_DIR)).map(Iterator::count).unwrap_or(99);
        assert_eq!(left, 0);
    }
}
