//! The tree restore's flushes: its target's file system synced while the workers write (the
//! loop of [`crate::flusher`]) and once at the end.
//!
//! A sync covers the whole file system: restoring into a directory of a shared one (a hostPath
//! volume on the node's disk) also writes out other programs' dirty data there sooner than
//! the kernel would, and commits its journal each time.

use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;

use crossbeam_channel::Receiver;

use crate::error::{RepoError, RepoResult};
use crate::flusher::{FLUSH_BYTES, flush_while_running};
use crate::restore::fsops;

/// Everything written reaches the disk before the restore says it is done: a write-back error
/// is this restore's failure, not a later unmount's. `root` was opened before any file was
/// written, so syncfs reports every error since (Linux 5.8 and later); each call reports an
/// error once, so every flush's error fails the restore.
pub(crate) fn flush(root: &impl AsFd, target: &Path) -> RepoResult<()> {
    nix::unistd::syncfs(root.as_fd())
        .map_err(|e| RepoError::io("flush the restored files of", target, fsops::err(e)))
}

/// [`flush_while_running`] of the restore's target, every [`FLUSH_BYTES`].
pub(crate) fn flusher(
    shared: &super::Shared,
    root: &OwnedFd,
    target: &Path,
    running: &Receiver<()>,
) -> RepoResult<()> {
    flush_while_running(&shared.progress.bytes_done, FLUSH_BYTES, running, &shared.stop, || {
        flush(root, target)
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flush_syncs_a_real_directorys_file_system() -> RepoResult<()> {
        let dir = tempfile::tempdir().map_err(|e| RepoError::io("tempdir", "/tmp", e))?;
        let root = nix::fcntl::open(
            dir.path(),
            nix::fcntl::OFlag::O_RDONLY | nix::fcntl::OFlag::O_DIRECTORY,
            nix::sys::stat::Mode::empty(),
        )
        .map_err(|e| RepoError::io("open", dir.path(), std::io::Error::from(e)))?;
        std::fs::write(dir.path().join("f"), [1u8; 4096])
            .map_err(|e| RepoError::io("write", dir.path(), e))?;
        flush(&root, dir.path())
    }
}
