//! Reading an entry's metadata from `fstatat` results and extended attributes.

use std::ffi::CString;
use std::os::fd::AsRawFd;

use nix::sys::stat::FileStat;

use crate::format::{Metadata, Timestamp, Xattr};
use crate::sys;

/// The file type bits of `st_mode`.
pub(crate) fn file_type(st: &FileStat) -> u32 {
    st.st_mode & libc::S_IFMT
}

fn ts(sec: i64, nsec: i64) -> Timestamp {
    Timestamp { sec, nsec: u32::try_from(nsec).unwrap_or(0).min(999_999_999) }
}

/// Metadata of an entry (xattrs filled in separately).
pub(crate) fn metadata(st: &FileStat, xattrs: Vec<Xattr>) -> Metadata {
    Metadata {
        mode: st.st_mode & 0o7777,
        uid: st.st_uid,
        gid: st.st_gid,
        mtime: ts(st.st_mtime, st.st_mtime_nsec),
        atime: ts(st.st_atime, st.st_atime_nsec),
        ctime: ts(st.st_ctime, st.st_ctime_nsec),
        xattrs,
    }
}

/// Extended attributes of the entry `name` of the directory open as `dir`, not following it
/// if it is a symlink. It is named as `/proc/self/fd/<dir>/<name>`: the magic link is exactly
/// that directory, so neither a path longer than `PATH_MAX` nor a directory above it swapped
/// for a symlink since it was opened changes what is read.
pub(crate) fn xattrs_at(dir: &impl AsRawFd, name: &[u8]) -> std::io::Result<Vec<Xattr>> {
    let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    path.extend_from_slice(name);
    let c = CString::new(path).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    sys::list_xattrs(sys::Target::PathNoFollow(&c))
}

/// Whether a file has fewer allocated blocks than its size needs (it may have holes).
pub(crate) fn may_be_sparse(st: &FileStat) -> bool {
    let allocated = u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512);
    allocated < u64::try_from(st.st_size).unwrap_or(0)
}
