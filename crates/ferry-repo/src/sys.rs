//! Thin wrappers over system calls that neither std nor nix offer: extended attributes, and
//! starting a file's writeback (`sync_file_range`).
//!
//! This is the one module allowed `unsafe`: each block passes a valid NUL-terminated path or
//! an open descriptor and a buffer whose length is passed alongside, as the calls require.
#![allow(unsafe_code)]

use std::ffi::CStr;
use std::io;
use std::os::fd::{AsRawFd, BorrowedFd};
use std::sync::atomic::{AtomicBool, Ordering};

use crate::format::Xattr;

/// Where to read or write attributes.
#[derive(Debug, Clone, Copy)]
pub(crate) enum Target<'a> {
    /// An open descriptor (`f*xattr`).
    Fd(BorrowedFd<'a>),
    /// A path whose last component is not followed (`l*xattr`).
    PathNoFollow(&'a CStr),
    /// The entry `name` of the directory `dir`, not followed (`*xattrat`, Linux 6.13; check
    /// [`xattrat_available`] first).
    At(BorrowedFd<'a>, &'a CStr),
}

/// `getxattrat` and `listxattrat` (Linux 6.13), numbered from the shared table of new system
/// calls (x86-64, arm64, riscv64 use it); the libc crate does not name them yet.
const SYS_GETXATTRAT: libc::c_long = 464;
const SYS_LISTXATTRAT: libc::c_long = 465;

/// The `struct xattr_args` of `getxattrat`.
#[repr(C)]
struct XattrArgs {
    value: u64,
    size: u32,
    flags: u32,
}

/// Set once a `*xattrat` call found the kernel without them.
static XATTRAT_MISSING: AtomicBool = AtomicBool::new(false);

/// Whether [`Target::At`] can be used: false on other architectures and after
/// [`disable_xattrat`].
pub(crate) fn xattrat_available() -> bool {
    cfg!(any(target_arch = "x86_64", target_arch = "aarch64", target_arch = "riscv64"))
        && !XATTRAT_MISSING.load(Ordering::Relaxed)
}

/// Stops using [`Target::At`] in this process (the kernel or a seccomp filter refused it).
pub(crate) fn disable_xattrat() {
    XATTRAT_MISSING.store(true, Ordering::Relaxed);
}

fn unsupported(e: &io::Error) -> bool {
    matches!(e.raw_os_error(), Some(libc::ENOTSUP) | Some(libc::ENODATA))
}

fn list_raw(t: Target<'_>, buf: &mut [u8]) -> io::Result<usize> {
    let ptr = buf.as_mut_ptr().cast::<libc::c_char>();
    // SAFETY: `ptr` is valid for `buf.len()` bytes; the path is NUL-terminated.
    let n = unsafe {
        match t {
            Target::Fd(fd) => libc::flistxattr(fd.as_raw_fd(), ptr, buf.len()),
            Target::PathNoFollow(p) => libc::llistxattr(p.as_ptr(), ptr, buf.len()),
            Target::At(dir, name) => libc::syscall(
                SYS_LISTXATTRAT,
                dir.as_raw_fd(),
                name.as_ptr(),
                libc::AT_SYMLINK_NOFOLLOW,
                ptr,
                buf.len(),
            ) as isize,
        }
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

fn get_raw(t: Target<'_>, name: &CStr, buf: &mut [u8]) -> io::Result<usize> {
    let ptr = buf.as_mut_ptr().cast::<libc::c_void>();
    // SAFETY: as in `list_raw`; `name` is NUL-terminated.
    let n = unsafe {
        match t {
            Target::Fd(fd) => libc::fgetxattr(fd.as_raw_fd(), name.as_ptr(), ptr, buf.len()),
            Target::PathNoFollow(p) => libc::lgetxattr(p.as_ptr(), name.as_ptr(), ptr, buf.len()),
            Target::At(dir, entry) => {
                let mut args = XattrArgs {
                    value: ptr as u64,
                    size: u32::try_from(buf.len()).unwrap_or(u32::MAX),
                    flags: 0,
                };
                libc::syscall(
                    SYS_GETXATTRAT,
                    dir.as_raw_fd(),
                    entry.as_ptr(),
                    libc::AT_SYMLINK_NOFOLLOW,
                    name.as_ptr(),
                    &raw mut args,
                    std::mem::size_of::<XattrArgs>(),
                ) as isize
            }
        }
    };
    usize::try_from(n).map_err(|_| io::Error::last_os_error())
}

/// Calls `f` with a buffer large enough, retrying if the value grows between calls.
fn sized(mut f: impl FnMut(&mut [u8]) -> io::Result<usize>) -> io::Result<Vec<u8>> {
    for _ in 0..4 {
        let len = f(&mut [])?;
        if len == 0 {
            return Ok(Vec::new());
        }
        let mut buf = vec![0u8; len];
        match f(&mut buf) {
            Ok(n) => {
                buf.truncate(n);
                return Ok(buf);
            }
            Err(e) if e.raw_os_error() == Some(libc::ERANGE) => continue,
            Err(e) => return Err(e),
        }
    }
    Err(io::Error::from_raw_os_error(libc::ERANGE))
}

/// Every extended attribute, sorted by name. File systems without xattr support give none.
pub(crate) fn list_xattrs(t: Target<'_>) -> io::Result<Vec<Xattr>> {
    let names = match sized(|b| list_raw(t, b)) {
        Ok(n) => n,
        Err(e) if unsupported(&e) => return Ok(Vec::new()),
        Err(e) => return Err(e),
    };
    let mut out = Vec::new();
    for name in names.split(|b| *b == 0).filter(|n| !n.is_empty()) {
        let Ok(cname) = std::ffi::CString::new(name) else { continue };
        match sized(|b| get_raw(t, &cname, b)) {
            Ok(value) => out.push(Xattr { name: name.to_vec(), value }),
            // Removed between list and get.
            Err(e) if unsupported(&e) => {}
            Err(e) => return Err(e),
        }
    }
    out.sort_by(|a, b| a.name.cmp(&b.name));
    Ok(out)
}

/// Sets one extended attribute.
pub(crate) fn set_xattr(t: Target<'_>, name: &[u8], value: &[u8]) -> io::Result<()> {
    let cname =
        std::ffi::CString::new(name).map_err(|_| io::Error::from_raw_os_error(libc::EINVAL))?;
    let ptr = value.as_ptr().cast::<libc::c_void>();
    // SAFETY: `ptr` is valid for `value.len()` bytes; names and paths are NUL-terminated.
    let rc = unsafe {
        match t {
            Target::Fd(fd) => libc::fsetxattr(fd.as_raw_fd(), cname.as_ptr(), ptr, value.len(), 0),
            Target::PathNoFollow(p) => {
                libc::lsetxattr(p.as_ptr(), cname.as_ptr(), ptr, value.len(), 0)
            }
            Target::At(..) => return Err(io::Error::from_raw_os_error(libc::ENOSYS)),
        }
    };
    if rc == 0 { Ok(()) } else { Err(io::Error::last_os_error()) }
}

/// Starts writing back every dirty page of `fd` (`sync_file_range` with
/// `SYNC_FILE_RANGE_WRITE` over the whole file) without waiting for the writes to finish: a
/// later fsync then finds less to write. It may wait while the device's queue is full. Not a
/// durability guarantee (no metadata, no device cache flush): only fsync is.
///
/// # Errors
/// Only those that say the data cannot be written (`EIO`, `ENOSPC`, `EDQUOT`): a file system
/// may return such an error from the writeback it does here without recording it for a later
/// fsync, so it is the caller's failure. Any other (no writeback for this kind of file, a
/// sandbox without the call, short of memory) leaves the pages dirty for the fsync, and is
/// not an error.
pub(crate) fn start_writeback(fd: BorrowedFd<'_>) -> io::Result<()> {
    // SAFETY: a valid open descriptor and plain integers.
    let rc = unsafe { libc::sync_file_range(fd.as_raw_fd(), 0, 0, libc::SYNC_FILE_RANGE_WRITE) };
    if rc == 0 {
        return Ok(());
    }
    let e = io::Error::last_os_error();
    match e.raw_os_error() {
        Some(libc::EIO | libc::ENOSPC | libc::EDQUOT) => Err(e),
        _ => Ok(()),
    }
}

/// Raises the soft limit on open files to the hard limit (deep trees keep one descriptor per
/// level open); returns the limit now in force.
pub(crate) fn raise_fd_limit() -> u64 {
    let mut lim = libc::rlimit { rlim_cur: 0, rlim_max: 0 };
    // SAFETY: `lim` is a valid rlimit to fill and then pass back.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut lim) != 0 {
            return 1024;
        }
        if lim.rlim_cur < lim.rlim_max {
            let wanted = libc::rlimit { rlim_cur: lim.rlim_max, rlim_max: lim.rlim_max };
            if libc::setrlimit(libc::RLIMIT_NOFILE, &wanted) == 0 {
                lim = wanted;
            }
        }
    }
    lim.rlim_cur
}

/// Stack for code that recurses once per directory level, down to
/// [`crate::restore::MAX_DEPTH`] (the default 2 MiB of a blocking task overflows at a few
/// thousand levels; this is reserved address space, touched only as deep as a tree goes).
pub(crate) const DEEP_STACK: usize = 256 << 20;

/// Runs `f` on a scoped thread with a [`DEEP_STACK`], and waits for it.
pub(crate) fn on_deep_stack<'scope, 'env, T: Send + 'scope>(
    scope: &'scope std::thread::Scope<'scope, 'env>,
    what: &'static str,
    f: impl FnOnce() -> crate::RepoResult<T> + Send + 'scope,
) -> crate::RepoResult<T> {
    let internal = |reason: String| crate::RepoError::Internal { what, reason };
    std::thread::Builder::new()
        .stack_size(DEEP_STACK)
        .spawn_scoped(scope, f)
        .map_err(|e| internal(format!("start thread: {e}")))?
        .join()
        .unwrap_or_else(|_| Err(internal("panicked".into())))
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CString;
    use std::os::fd::{AsFd, OwnedFd};

    #[test]
    fn set_then_list_round_trips_on_a_file() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let path = dir.path().join("f");
        let file = std::fs::File::create(&path)?;
        set_xattr(Target::Fd(file.as_fd()), b"user.ferry", b"value\0with nul")?;
        let listed = list_xattrs(Target::Fd(file.as_fd()))?;
        assert!(
            listed.contains(&Xattr {
                name: b"user.ferry".to_vec(),
                value: b"value\0with nul".to_vec()
            })
        );
        let cpath = std::ffi::CString::new(path.as_os_str().as_encoded_bytes().to_vec())
            .map_err(io::Error::other)?;
        assert_eq!(list_xattrs(Target::PathNoFollow(&cpath))?, listed);
        Ok(())
    }

    #[test]
    fn writeback_starts_on_a_file_and_is_no_error_where_there_is_none_to_start() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let file = std::fs::File::create(dir.path().join("f"))?;
        std::io::Write::write_all(&mut &file, &[7u8; 1 << 16])?;
        start_writeback(file.as_fd())?;
        // A pipe has no pages to write (ESPIPE): nothing for the fsync to miss.
        let (read, _write) = nix::unistd::pipe().map_err(io::Error::from)?;
        start_writeback(read.as_fd())
    }

    /// `getxattrat` reads the entry itself: through a symlink to a file with the attribute
    /// it finds none (user attributes exist only on files and directories).
    #[test]
    fn getxattrat_does_not_follow_a_symlink() {
        let tmp = tempfile::tempdir().expect("tempdir");
        let file = tmp.path().join("f");
        std::fs::write(&file, b"x").expect("write");
        let path = CString::new(file.as_os_str().as_encoded_bytes()).expect("path");
        set_xattr(Target::PathNoFollow(&path), b"user.a", &[0, 1, 2]).expect("set");
        std::os::unix::fs::symlink("f", tmp.path().join("link")).expect("symlink");
        let dir = OwnedFd::from(std::fs::File::open(tmp.path()).expect("open"));
        let name = CString::new("user.a").expect("name");
        let (f, link) = (CString::new("f").expect("f"), CString::new("link").expect("link"));
        let mut buf = [0u8; 16];
        match get_raw(Target::At(dir.as_fd(), &f), &name, &mut buf) {
            Ok(n) => assert_eq!(&buf[..n], &[0, 1, 2]),
            Err(e) if matches!(e.raw_os_error(), Some(libc::ENOSYS | libc::EPERM)) => panic!(
                "getxattrat refused ({e}): this test needs Linux 6.13 or later, with the call \
                 not blocked by a seccomp filter"
            ),
            Err(e) => panic!("getxattrat of the file: {e}"),
        }
        let through = get_raw(Target::At(dir.as_fd(), &link), &name, &mut buf);
        assert_eq!(through.map_err(|e| e.raw_os_error()), Err(Some(libc::ENODATA)));
    }
}
