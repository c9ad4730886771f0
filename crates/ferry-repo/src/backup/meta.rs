//! Reading an entry's metadata from `fstatat` results and extended attributes.

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd};

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
/// if it is a symlink. The entry is named relative to the descriptor, so neither a path longer
/// than `PATH_MAX` nor a directory above it swapped for a symlink since it was opened changes
/// what is read: by `listxattrat`/`getxattrat` where the kernel has them (6.13), else as
/// `/proc/self/fd/<dir>/<name>` (the magic link is exactly that directory, at the cost of a
/// slower lookup).
pub(crate) fn xattrs_at(dir: &impl AsFd, name: &[u8]) -> std::io::Result<Vec<Xattr>> {
    let entry = CString::new(name).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    if !sys::xattrat_available() {
        return xattrs_through_proc(dir, name);
    }
    match sys::list_xattrs(sys::Target::At(dir.as_fd(), &entry)) {
        // An older kernel; or a seccomp filter that refuses system calls it does not know
        // with EPERM (container runtimes' default profiles), which no xattr call gives
        // otherwise: the other way works there, so stop trying this one.
        Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => {
            let other = xattrs_through_proc(dir, name);
            if e.raw_os_error() == Some(libc::ENOSYS) || other.is_ok() {
                sys::disable_xattrat();
            }
            other
        }
        done => done,
    }
}

/// [`xattrs_at`] for kernels without `listxattrat`.
fn xattrs_through_proc(dir: &impl AsFd, name: &[u8]) -> std::io::Result<Vec<Xattr>> {
    let mut path = format!("/proc/self/fd/{}/", dir.as_fd().as_raw_fd()).into_bytes();
    path.extend_from_slice(name);
    let c = CString::new(path).map_err(|_| std::io::Error::from_raw_os_error(libc::EINVAL))?;
    sys::list_xattrs(sys::Target::PathNoFollow(&c))
}

/// Whether a file has fewer allocated blocks than its size needs (it may have holes).
pub(crate) fn may_be_sparse(st: &FileStat) -> bool {
    let allocated = u64::try_from(st.st_blocks).unwrap_or(0).saturating_mul(512);
    allocated < u64::try_from(st.st_size).unwrap_or(0)
}

#[cfg(test)]
mod tests {
    use std::os::fd::OwnedFd;

    use super::*;

    fn set(path: &std::path::Path, name: &str, value: &[u8]) {
        let p = CString::new(path.as_os_str().as_encoded_bytes()).expect("path");
        let n = CString::new(name).expect("name");
        sys::set_xattr(sys::Target::PathNoFollow(&p), n.as_bytes(), value).expect("set xattr");
    }

    /// Both ways of naming an entry by its directory read the same attributes, never through
    /// a symlink, and fail for a missing entry.
    #[test]
    fn xattrs_by_directory_and_name_match_the_proc_path() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        set(&file, "user.b", b"second");
        set(&file, "user.a", &[0, 1, 2]);
        std::os::unix::fs::symlink("f", tmp.path().join("link")).expect("symlink");
        let dir = OwnedFd::from(std::fs::File::open(tmp.path()).expect("open"));
        let want = vec![
            Xattr { name: b"user.a".to_vec(), value: vec![0, 1, 2] },
            Xattr { name: b"user.b".to_vec(), value: b"second".to_vec() },
        ];
        // The direct path must exist here, or `xattrs_at` below would only test the /proc one.
        assert!(
            sys::xattrat_available(),
            "listxattrat is not used: this test needs x86-64, arm64 or riscv64, and Linux 6.13 or \
             later (another test in this process may have found the kernel without it)"
        );
        let name = CString::new("f").expect("name");
        match sys::list_xattrs(sys::Target::At(dir.as_fd(), &name)) {
            Ok(direct) => assert_eq!(direct, want, "listxattrat"),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => panic!(
                "listxattrat refused ({e}): this test needs Linux 6.13 or later, with the call \
                 not blocked by a seccomp filter"
            ),
            Err(e) => panic!("listxattrat of the file: {e}"),
        }
        assert_eq!(xattrs_at(&dir, b"f").expect("xattrs"), want);
        assert_eq!(xattrs_through_proc(&dir, b"f").expect("xattrs"), want);
        assert_eq!(xattrs_at(&dir, b"link").expect("link"), vec![], "not followed");
        assert_eq!(xattrs_through_proc(&dir, b"link").expect("link"), vec![], "not followed");
        assert!(xattrs_at(&dir, b"missing").is_err());
        assert!(xattrs_through_proc(&dir, b"missing").is_err());
        // `xattrs_at` gave up the direct path only on ENOSYS or EPERM from it: still available,
        // so the results above came from listxattrat, not the /proc fallback.
        assert!(sys::xattrat_available(), "xattrs_at fell back from listxattrat to /proc");
    }
}
