//! File-system operations for restore, each relative to a directory descriptor and never
//! following a symbolic link.
//!
//! Names reaching these functions are single components checked by [`validate_name`]; every
//! open uses `openat2` with `RESOLVE_BENEATH | RESOLVE_NO_SYMLINKS | RESOLVE_NO_MAGICLINKS`
//! (falling back to `openat` with `O_NOFOLLOW` on kernels without it), so nothing a previous
//! restore or another process left in the target can redirect a write outside it. An entry in
//! the way of a restored one is removed, but never across a mount point (see [`remove_any`]).

use std::ffi::CString;
use std::os::fd::{AsFd, AsRawFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::{Path, PathBuf};
use std::{fmt, io};

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag, OpenHow, ResolveFlag};
use nix::sys::stat::{FchmodatFlags, Mode, SFlag, UtimensatFlags};
use nix::sys::time::TimeSpec;
use nix::unistd::{Gid, Uid, UnlinkatFlags};

use super::{MAX_DEPTH, Shared};
use crate::error::RepoError;
use crate::format::{Metadata, Timestamp, validate_name};
use crate::sys;

pub(crate) fn err(e: Errno) -> io::Error {
    io::Error::from(e)
}

/// Opens `name` under `dir` without following links and without leaving `dir`.
pub(crate) fn open_beneath(
    dir: &OwnedFd,
    name: &[u8],
    flags: OFlag,
    mode: Mode,
) -> io::Result<OwnedFd> {
    validate_name(name).map_err(|e| io::Error::new(io::ErrorKind::InvalidInput, e.to_string()))?;
    let flags = flags | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let how = OpenHow::new().flags(flags).mode(mode).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS,
    );
    match nix::fcntl::openat2(dir.as_fd(), name, how) {
        Err(Errno::ENOSYS) => nix::fcntl::openat(dir.as_fd(), name, flags, mode).map_err(err),
        other => other.map_err(err),
    }
}

/// Opens the directory `name` under `dir`.
pub(crate) fn open_dir(dir: &OwnedFd, name: &[u8]) -> io::Result<OwnedFd> {
    open_beneath(dir, name, OFlag::O_RDONLY | OFlag::O_DIRECTORY, Mode::empty())
}

/// The type of whatever is at `name`, without following it; `None` if nothing is.
fn existing_type(dir: &OwnedFd, name: &[u8]) -> io::Result<Option<u32>> {
    match nix::sys::stat::fstatat(dir.as_fd(), name, AtFlags::AT_SYMLINK_NOFOLLOW) {
        Ok(st) => Ok(Some(st.st_mode & libc::S_IFMT)),
        Err(Errno::ENOENT) => Ok(None),
        Err(e) => Err(err(e)),
    }
}

/// Why an existing entry in the way of a restored one was not removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Refusal {
    /// It is (or holds) a mount point: removing it would delete another file system's files.
    MountPoint,
    /// Its directories nest deeper than [`MAX_DEPTH`] (one open descriptor per level).
    TooDeep,
}

/// A failure to create an entry where something else may have been in the way.
#[derive(Debug)]
pub(crate) enum ReplaceError {
    Io(io::Error),
    /// What was in the way was not removed (nor anything in `at` and below).
    Refused {
        /// Where, relative to the entry being replaced (empty: the entry itself).
        at: PathBuf,
        reason: Refusal,
    },
}

impl From<io::Error> for ReplaceError {
    fn from(e: io::Error) -> Self {
        Self::Io(e)
    }
}

impl From<Errno> for ReplaceError {
    fn from(e: Errno) -> Self {
        Self::Io(err(e))
    }
}

impl ReplaceError {
    /// The repository error for `operation` on the entry at `path`: a refusal is an
    /// [`RepoError::UnsafeEntry`] naming what was not replaced.
    pub(crate) fn into_repo(self, operation: &'static str, path: &Path) -> RepoError {
        match self {
            Self::Io(e) => RepoError::io(operation, path, e),
            Self::Refused { at, reason } => {
                let what = if at.as_os_str().is_empty() {
                    "it".to_owned()
                } else {
                    path.join(at).display().to_string()
                };
                let reason = match reason {
                    Refusal::MountPoint => {
                        format!(
                            "{what} is a mount point (another file system, or a bind mount); \
                             not replaced"
                        )
                    }
                    Refusal::TooDeep => {
                        format!("{what} nests directories deeper than {MAX_DEPTH}; not replaced")
                    }
                };
                RepoError::UnsafeEntry { path: path.to_path_buf(), reason }
            }
        }
    }
}

/// One step of removing an entry in the way.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Removal {
    /// Not a directory: unlink it.
    Unlink,
    /// A directory: remove what it holds, then it.
    Empty,
    /// A directory at the depth limit: remove it only if it is empty.
    RmdirOnly,
    Refuse(Refusal),
}

/// How to remove an entry of type `file_type` (`S_IFMT` bits) on device `dev`, `depth`
/// directories below the entry being replaced (0: that entry), whose parent directory is on
/// `fs_dev`: nothing on another file system is removed (or entered), and at most [`MAX_DEPTH`]
/// directories are open at once.
pub(crate) fn removal(
    fs_dev: libc::dev_t,
    dev: libc::dev_t,
    file_type: u32,
    depth: usize,
) -> Removal {
    if dev != fs_dev {
        Removal::Refuse(Refusal::MountPoint)
    } else if file_type != libc::S_IFDIR {
        Removal::Unlink
    } else if depth >= MAX_DEPTH {
        Removal::RmdirOnly
    } else {
        Removal::Empty
    }
}

/// A directory being emptied by [`remove_any`].
struct Emptying {
    fd: OwnedFd,
    name: Vec<u8>,
    /// Its entries not removed yet.
    left: Vec<Vec<u8>>,
}

/// Where `name` is, relative to the entry being removed (`stack[0]`; empty: that entry).
fn relative(stack: &[Emptying], name: &[u8]) -> PathBuf {
    if stack.is_empty() {
        return PathBuf::new();
    }
    let mut at: PathBuf =
        stack.iter().skip(1).map(|level| std::ffi::OsStr::from_bytes(&level.name)).collect();
    at.push(std::ffi::OsStr::from_bytes(name));
    at
}

/// Opens the directory `name` under `dir` for removing what it holds: never across a mount
/// (`RESOLVE_NO_XDEV` refuses bind mounts of the same file system too; without `openat2`,
/// the device is checked after opening).
fn open_dir_to_empty(dir: &OwnedFd, name: &[u8], fs_dev: libc::dev_t) -> io::Result<OwnedFd> {
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC;
    let how = OpenHow::new().flags(flags).resolve(
        ResolveFlag::RESOLVE_BENEATH
            | ResolveFlag::RESOLVE_NO_SYMLINKS
            | ResolveFlag::RESOLVE_NO_MAGICLINKS
            | ResolveFlag::RESOLVE_NO_XDEV,
    );
    let fd = match nix::fcntl::openat2(dir.as_fd(), name, how) {
        Err(Errno::ENOSYS) => nix::fcntl::openat(dir.as_fd(), name, flags, Mode::empty()),
        other => other,
    }
    .map_err(err)?;
    if nix::sys::stat::fstat(&fd).map_err(err)?.st_dev == fs_dev {
        Ok(fd)
    } else {
        Err(err(Errno::EXDEV))
    }
}

/// Removes whatever is at `name` (a whole directory tree included), never following links and
/// never crossing into another file system: a mount point found on the way (another file
/// system, or a bind mount) stops the removal before anything in it is touched, as does a tree
/// nested deeper than [`MAX_DEPTH`]. What was removed before either is gone (the entry was
/// being replaced). Iterative: one open descriptor per level, no recursion.
pub(crate) fn remove_any(dir: &OwnedFd, name: &[u8]) -> Result<(), ReplaceError> {
    let fs_dev = nix::sys::stat::fstat(dir)?.st_dev;
    let mut stack: Vec<Emptying> = Vec::new();
    let mut next = Some(name.to_vec());
    loop {
        let name = match next.take() {
            Some(n) => n,
            None => {
                let Some(level) = stack.last_mut() else { return Ok(()) };
                if let Some(n) = level.left.pop() {
                    n
                } else {
                    // Emptied: remove it from its parent.
                    if let Some(done) = stack.pop() {
                        let parent = stack.last().map_or(dir, |l| &l.fd);
                        drop(done.fd);
                        // Gone meanwhile (another process removing it too): as good.
                        match nix::unistd::unlinkat(
                            parent.as_fd(),
                            &*done.name,
                            UnlinkatFlags::RemoveDir,
                        ) {
                            Ok(()) | Err(Errno::ENOENT) => {}
                            Err(e) => return Err(e.into()),
                        }
                    }
                    continue;
                }
            }
        };
        let parent = stack.last().map_or(dir, |l| &l.fd);
        let st = match nix::sys::stat::fstatat(parent.as_fd(), &*name, AtFlags::AT_SYMLINK_NOFOLLOW)
        {
            Ok(st) => st,
            Err(Errno::ENOENT) => continue,
            Err(e) => return Err(e.into()),
        };
        let refused = |reason| ReplaceError::Refused { at: relative(&stack, &name), reason };
        match removal(fs_dev, st.st_dev, st.st_mode & libc::S_IFMT, stack.len()) {
            Removal::Refuse(reason) => return Err(refused(reason)),
            Removal::Unlink => {
                match nix::unistd::unlinkat(parent.as_fd(), &*name, UnlinkatFlags::NoRemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => {}
                    // A file bind-mounted from this file system.
                    Err(Errno::EBUSY) => return Err(refused(Refusal::MountPoint)),
                    Err(e) => return Err(e.into()),
                }
            }
            Removal::RmdirOnly => {
                match nix::unistd::unlinkat(parent.as_fd(), &*name, UnlinkatFlags::RemoveDir) {
                    Ok(()) | Err(Errno::ENOENT) => {}
                    Err(Errno::ENOTEMPTY | Errno::EEXIST) => {
                        return Err(refused(Refusal::TooDeep));
                    }
                    // A mount point (a bind mount of this file system) is busy.
                    Err(Errno::EBUSY) => return Err(refused(Refusal::MountPoint)),
                    Err(e) => return Err(e.into()),
                }
            }
            Removal::Empty => {
                let fd = match open_dir_to_empty(parent, &name, fs_dev) {
                    Ok(fd) => fd,
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => continue,
                    Err(e) if e.raw_os_error() == Some(libc::EXDEV) => {
                        return Err(refused(Refusal::MountPoint));
                    }
                    Err(e) => return Err(e.into()),
                };
                let mut left = Vec::new();
                let mut d = nix::dir::Dir::from_fd(fd.try_clone()?)?;
                for entry in d.iter() {
                    let n = entry?.file_name().to_bytes().to_vec();
                    if n != b"." && n != b".." {
                        left.push(n);
                    }
                }
                stack.push(Emptying { fd, name, left });
            }
        }
    }
}

/// Runs `create`; if something already exists at `name`, removes it (never following it, never
/// across a mount: see [`remove_any`]) and tries once more. Creating first keeps the common
/// case (a fresh target) to one system call.
fn create_replacing<T>(
    dir: &OwnedFd,
    name: &[u8],
    mut create: impl FnMut() -> io::Result<T>,
) -> Result<T, ReplaceError> {
    match create() {
        Err(e) if e.raw_os_error() == Some(libc::EEXIST) => {
            remove_any(dir, name)?;
            Ok(create()?)
        }
        other => Ok(other?),
    }
}

/// Makes `name` a directory we can write into: an existing directory is kept, anything else
/// (a symlink planted by an earlier restore included) is replaced.
pub(crate) fn ensure_dir(dir: &OwnedFd, name: &[u8]) -> Result<OwnedFd, ReplaceError> {
    let mode = Mode::from_bits_truncate(0o700);
    let mut kept = false;
    match nix::sys::stat::mkdirat(dir.as_fd(), name, mode) {
        Ok(()) => {}
        Err(Errno::EEXIST) => {
            if existing_type(dir, name)? == Some(libc::S_IFDIR) {
                kept = true;
            } else {
                remove_any(dir, name)?;
                nix::sys::stat::mkdirat(dir.as_fd(), name, mode)?;
            }
        }
        Err(e) => return Err(e.into()),
    }
    let fd = open_dir(dir, name)?;
    if kept {
        // A directory kept from an earlier restore has its restored mode (say 0555): make it
        // writable for its owner while entries go in; the final pass sets the mode again.
        // Not its owner: nothing to do, and nothing lost by trying.
        if let Ok(st) = nix::sys::stat::fstat(&fd)
            && st.st_mode & 0o700 != 0o700
        {
            let _ = nix::sys::stat::fchmod(
                &fd,
                Mode::from_bits_truncate((st.st_mode | 0o700) & 0o7777),
            );
        }
    }
    Ok(fd)
}

/// Creates a fresh regular file at `name` (replacing whatever was there) for writing, with the
/// permission bits [`created_mode`] gives for the file's final metadata `meta`.
pub(crate) fn create_file(
    dir: &OwnedFd,
    name: &[u8],
    meta: &Metadata,
) -> Result<std::fs::File, ReplaceError> {
    let fd = create_replacing(dir, name, || {
        open_beneath(
            dir,
            name,
            OFlag::O_WRONLY | OFlag::O_CREAT | OFlag::O_EXCL,
            Mode::from_bits_truncate(created_mode(meta)),
        )
    })?;
    Ok(std::fs::File::from(fd))
}

/// The permission bits a file that ends with `meta` is created with (the umask applies). A file
/// being written belongs to the restore's user and group (or a set-group-ID directory's) until
/// its metadata is set, so its final bits are safe to give it only when they let no one do
/// more meanwhile than the final file will: the same bits for group and others (whoever gets
/// them, as either, gets them in the end), none beyond the owner's (the final owner is one of
/// the others meanwhile), and no xattrs (an access ACL can give a user or group less than
/// others get). Set-ID and sticky bits are left to [`apply_fd`]. Then setting its metadata
/// usually leaves the mode as it is: 0644 and 0755 qualify. Otherwise 0600.
pub(crate) fn created_mode(meta: &Metadata) -> u32 {
    let mode = meta.mode;
    let (user, group, other) = ((mode >> 6) & 0o7, (mode >> 3) & 0o7, mode & 0o7);
    if meta.xattrs.is_empty() && group == other && other & !user == 0 {
        mode & 0o777
    } else {
        0o600
    }
}

/// Creates a special node (fifo, device, socket) at `name`, replacing whatever was there.
pub(crate) fn create_node(
    dir: &OwnedFd,
    name: &[u8],
    kind: SFlag,
    rdev: u64,
) -> Result<(), ReplaceError> {
    create_replacing(dir, name, || {
        nix::sys::stat::mknodat(dir.as_fd(), name, kind, Mode::from_bits_truncate(0o600), rdev)
            .map_err(err)
    })
}

/// Creates a symbolic link at `name`, replacing whatever was there. The target text is stored,
/// never resolved.
pub(crate) fn create_symlink(
    dir: &OwnedFd,
    name: &[u8],
    target: &[u8],
) -> Result<(), ReplaceError> {
    create_replacing(dir, name, || nix::unistd::symlinkat(target, dir.as_fd(), name).map_err(err))
}

/// Links `name` to the existing `first` (a hard link inside the target).
pub(crate) fn hard_link(
    first_dir: &OwnedFd,
    first: &[u8],
    dir: &OwnedFd,
    name: &[u8],
) -> Result<(), ReplaceError> {
    create_replacing(dir, name, || {
        nix::unistd::linkat(first_dir.as_fd(), first, dir.as_fd(), name, AtFlags::empty())
            .map_err(err)
    })
}

fn timespec(t: Timestamp) -> TimeSpec {
    TimeSpec::new(t.sec, i64::from(t.nsec))
}

/// Problems setting metadata that do not fail a restore (the target file system may not
/// support them); counted and logged.
#[derive(Debug, Default)]
pub(crate) struct Warnings(pub(crate) Vec<String>);

fn set_xattrs(
    target: sys::Target<'_>,
    meta: &Metadata,
    shared: &Shared,
    what: &dyn fmt::Display,
    warnings: &mut Warnings,
) {
    for x in meta.xattrs.iter().filter(|x| shared.policy.sets_xattr(x)) {
        if let Err(e) = sys::set_xattr(target, &x.name, &x.value) {
            warnings.0.push(format!("{what}: set xattr {}: {e}", String::from_utf8_lossy(&x.name)));
        }
    }
}

/// Sets metadata through an open descriptor of a regular file or directory.
///
/// Owners and mode are set only where they differ: each is a journalled inode change, and a
/// restore running as the files' owner creates most of them with both right already (see
/// [`created_mode`]); on the Linux source tree the two calls were 7 % of the restore's CPU.
pub(crate) fn apply_fd(
    fd: &impl AsFd,
    meta: &Metadata,
    shared: &Shared,
    what: &dyn fmt::Display,
    warnings: &mut Warnings,
) -> io::Result<()> {
    let fd = fd.as_fd();
    let st = nix::sys::stat::fstat(fd).map_err(err)?;
    // Owners first: the kernel drops a file capability (security.capability) on any chown,
    // and chmod last, as chown clears set-user-ID bits.
    let chowned = shared.owners && (st.st_uid != meta.uid || st.st_gid != meta.gid);
    if chowned {
        nix::unistd::fchown(fd, Some(Uid::from_raw(meta.uid)), Some(Gid::from_raw(meta.gid)))
            .map_err(err)?;
    }
    set_xattrs(sys::Target::Fd(fd), meta, shared, what, warnings);
    let is_dir = st.st_mode & libc::S_IFMT == libc::S_IFDIR;
    let mode = if is_dir { meta.mode & 0o7777 } else { shared.policy.file_mode(meta) };
    // A chown may have cleared set-ID bits, and an access ACL (an xattr) sets group bits: the
    // mode read before either is no longer known.
    if chowned || !meta.xattrs.is_empty() || st.st_mode & 0o7777 != mode {
        nix::sys::stat::fchmod(fd, Mode::from_bits_truncate(mode)).map_err(err)?;
    }
    nix::sys::stat::futimens(fd, &timespec(meta.atime), &timespec(meta.mtime)).map_err(err)
}

/// Sets metadata of a symlink or special node by name, never following it.
pub(crate) fn apply_at(
    dir: &OwnedFd,
    name: &[u8],
    meta: &Metadata,
    symlink: bool,
    shared: &Shared,
    what: &dyn fmt::Display,
    warnings: &mut Warnings,
) -> io::Result<()> {
    // `/proc/self/fd/<dir>/<name>`: the magic link resolves to exactly our directory, and the
    // single-component name is not followed by the l*xattr calls.
    let mut path = format!("/proc/self/fd/{}/", dir.as_raw_fd()).into_bytes();
    path.extend_from_slice(name);
    // Owners before xattrs and chmod, as in `apply_fd`.
    if shared.owners {
        nix::unistd::fchownat(
            dir.as_fd(),
            name,
            Some(Uid::from_raw(meta.uid)),
            Some(Gid::from_raw(meta.gid)),
            AtFlags::AT_SYMLINK_NOFOLLOW,
        )
        .map_err(err)?;
    }
    if let Ok(cpath) = CString::new(path) {
        set_xattrs(sys::Target::PathNoFollow(&cpath), meta, shared, what, warnings);
    }
    if !symlink {
        // chmod cannot skip links by name on older kernels; go through an O_PATH descriptor of
        // the node itself, which cannot be a link we did not create.
        let node = open_beneath(dir, name, OFlag::O_PATH, Mode::empty())?;
        let proc = format!("/proc/self/fd/{}", node.as_raw_fd());
        match nix::sys::stat::fchmodat(
            nix::fcntl::AT_FDCWD,
            proc.as_str(),
            Mode::from_bits_truncate(shared.policy.file_mode(meta)),
            FchmodatFlags::FollowSymlink,
        ) {
            Ok(()) => {}
            Err(e) => return Err(err(e)),
        }
    }
    nix::sys::stat::utimensat(
        dir.as_fd(),
        name,
        &timespec(meta.atime),
        &timespec(meta.mtime),
        UtimensatFlags::NoFollowSymlink,
    )
    .map_err(err)
}
