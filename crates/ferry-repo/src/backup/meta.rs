//! Reading an entry's metadata from `fstatat` results and extended attributes.

use std::ffi::CString;
use std::path::Path;

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

/// Extended attributes of `path`, not following a final symlink.
pub(crate) fn xattrs_of(path: &Path) -> std::io::Result<Vec<Xattr>> {
    let c = CString::new(path.as_os_str().as_encoded_bytes().to_vec())
        .map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    sys::list_xattrs(sys::Target::PathNoFollow(&c))
}

/// Whether a file has fewer allocated blocks than its size needs (it may have holes).
pub(crate) fn may_be_sparse(st: &FileStat) -> bool {
    let allocated = u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512);
    allocated < u64::try_from(st.st_size).unwrap_or(0)
}
