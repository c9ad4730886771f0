//! Where a backup reads and a restore writes: a path, or a descriptor the caller opened.
//!
//! A caller that located a volume and checked it (a mount root, a block device) passes the
//! descriptor it checked; any kind will do, an `O_PATH` one included. The data path opens
//! its own descriptor from that one and never goes by the path again, so an unmount or a
//! path replaced after the check cannot redirect a read or a write (onto the disk below an
//! unmounted volume, say), and nothing is created.

use std::fs::File;
use std::os::fd::{AsFd, AsRawFd, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::Path;

use nix::errno::Errno;
use nix::fcntl::OFlag;
use nix::sys::stat::Mode;

use crate::error::{RepoError, RepoResult};

/// A backup source or restore target.
#[derive(Debug, Clone, Copy)]
pub enum Place<'a> {
    /// Opened by path; a restore creates a missing directory or image file.
    Path(&'a Path),
    /// Already open: a directory for a tree, a block device or image file for a volume.
    /// `shown_as` names it in messages and records.
    Opened {
        /// The descriptor, of any access mode (`O_PATH` is enough).
        fd: BorrowedFd<'a>,
        /// Its path, for messages.
        shown_as: &'a Path,
    },
}

impl<'a> Place<'a> {
    /// The path that names it.
    #[must_use]
    pub fn path(&self) -> &'a Path {
        match *self {
            Self::Path(p) | Self::Opened { shown_as: p, .. } => p,
        }
    }
}

/// A directory descriptor for reading and `*at` calls, from an opened place.
pub(crate) fn reopen_dir(
    fd: BorrowedFd<'_>,
    shown_as: &Path,
    noatime: bool,
) -> RepoResult<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let open = |flags| nix::fcntl::openat(fd.as_fd(), ".", flags, Mode::empty());
    let opened = if noatime {
        match open(flags | OFlag::O_NOATIME) {
            Err(Errno::EPERM) => open(flags),
            other => other,
        }
    } else {
        open(flags)
    };
    opened.map_err(|e| RepoError::io("open the directory", shown_as, e.into()))
}

/// A file descriptor for reading or writing the same inode as `fd` (through its
/// `/proc/self/fd` link, which names the inode, not a path), opened with `flags` besides
/// `O_CLOEXEC | O_NOCTTY`: `O_EXCL` claims a block device exclusively (a mounted device is
/// refused), `O_DIRECT` bypasses its page cache.
pub(crate) fn reopen_file(
    fd: BorrowedFd<'_>,
    shown_as: &Path,
    write: bool,
    flags: libc::c_int,
) -> RepoResult<File> {
    std::fs::OpenOptions::new()
        .read(!write)
        .write(write)
        .custom_flags(flags | libc::O_CLOEXEC | libc::O_NOCTTY)
        .open(format!("/proc/self/fd/{}", fd.as_raw_fd()))
        .map_err(|e| {
            let step = if write { "open for writing" } else { "open for reading" };
            RepoError::io(step, shown_as, e)
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    fn opath(path: &Path, flags: OFlag) -> OwnedFd {
        nix::fcntl::open(path, OFlag::O_PATH | OFlag::O_CLOEXEC | flags, Mode::empty()).unwrap()
    }

    #[test]
    fn a_directory_opened_by_path_only_is_reopened_for_listing() {
        let tmp = tempfile::tempdir().unwrap();
        std::fs::write(tmp.path().join("a"), b"x").unwrap();
        let fd = opath(tmp.path(), OFlag::O_DIRECTORY);
        let dir = reopen_dir(fd.as_fd(), tmp.path(), true).unwrap();
        let mut d = nix::dir::Dir::from_fd(dir).unwrap();
        let names: Vec<_> =
            d.iter().filter_map(Result::ok).map(|e| e.file_name().to_owned()).collect();
        assert!(names.iter().any(|n| n.to_bytes() == b"a"));
    }

    /// The directory moved away and another put at its path: the descriptor still leads to
    /// the one that was checked.
    #[test]
    fn a_reopened_directory_is_the_checked_one_not_what_is_at_its_path_now() {
        let tmp = tempfile::tempdir().unwrap();
        let checked = tmp.path().join("vol");
        std::fs::create_dir(&checked).unwrap();
        let fd = opath(&checked, OFlag::O_DIRECTORY);
        std::fs::rename(&checked, tmp.path().join("moved")).unwrap();
        std::fs::create_dir(&checked).unwrap();
        let dir = reopen_dir(fd.as_fd(), &checked, false).unwrap();
        nix::fcntl::openat(
            dir.as_fd(),
            "new",
            OFlag::O_CREAT | OFlag::O_WRONLY | OFlag::O_CLOEXEC,
            Mode::from_bits_truncate(0o600),
        )
        .unwrap();
        assert!(tmp.path().join("moved/new").exists());
        assert!(!checked.join("new").exists());
    }

    #[test]
    fn a_file_is_reopened_for_writing_and_reading() {
        let tmp = tempfile::tempdir().unwrap();
        let path = tmp.path().join("img");
        std::fs::write(&path, b"old").unwrap();
        let fd = opath(&path, OFlag::O_NOFOLLOW);
        std::fs::remove_file(&path).unwrap();
        use std::io::{Read, Write};
        reopen_file(fd.as_fd(), &path, true, 0).unwrap().write_all(b"new").unwrap();
        let mut text = String::new();
        reopen_file(fd.as_fd(), &path, false, 0).unwrap().read_to_string(&mut text).unwrap();
        assert_eq!(text, "new");
        assert!(!path.exists(), "nothing is created at the path");
    }
}
