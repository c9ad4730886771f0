//! Whether a directory is a mount point, judged by mount identity.
//!
//! A device-number comparison with the parent misses bind mounts: a CSI driver that publishes
//! a volume by bind-mounting a directory of the kubelet's own file system (the hostpath driver,
//! local-path provisioners) leaves the mount point on the same device as its parent. The kernel
//! knows better: `statx` reports `STATX_ATTR_MOUNT_ROOT` (Linux 5.8) and each path's mount id
//! (`STATX_MNT_ID`, Linux 5.8); on kernels without them `/proc/self/mountinfo` lists every mount
//! point of this mount namespace.

use std::io;
use std::os::fd::{AsFd, BorrowedFd, OwnedFd};
use std::path::{Path, PathBuf};

use rustix::fs::{AtFlags, CWD, Mode, OFlags, StatxAttributes, StatxFlags, openat, statx};
use rustix::io::Errno;

/// Whether `path` (followed if a symlink) is the root of a mount.
///
/// # Errors
/// The path cannot be examined (it does not exist, permissions).
pub(crate) fn is_mount_point(path: &Path) -> io::Result<bool> {
    let fd = openat(CWD, path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
    is_mount_root(fd.as_fd(), path)
}

/// Opens the directory at `path` (not following a symbolic link at its end) if it is the root
/// of a mount, judged on the opened descriptor itself: `None` when it is a plain directory.
/// The descriptor (`O_PATH`) keeps naming that mount whatever happens at `path` later.
///
/// # Errors
/// Nothing at `path`, not a directory, a symbolic link, or it cannot be examined.
pub(crate) fn open_mount_root(path: &Path) -> io::Result<Option<OwnedFd>> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::NOFOLLOW | OFlags::CLOEXEC;
    let fd = openat(CWD, path, flags, Mode::empty())?;
    Ok(is_mount_root(fd.as_fd(), path)?.then_some(fd))
}

/// Whether the open directory `fd` is the root of a mount; `path` (where it was opened) is
/// read in `/proc/self/mountinfo` only on kernels whose `statx` cannot tell.
fn is_mount_root(fd: BorrowedFd<'_>, path: &Path) -> io::Result<bool> {
    match by_statx(fd)? {
        Some(answer) => Ok(answer),
        None => by_mountinfo(path),
    }
}

/// What `statx` says of `fd`, or `None` when this kernel reports neither the mount-root
/// attribute nor mount ids.
pub(crate) fn by_statx(fd: BorrowedFd<'_>) -> io::Result<Option<bool>> {
    let Some(me) = mount_facts(fd, "")? else { return Ok(None) };
    if me.attributes_mask.contains(StatxAttributes::MOUNT_ROOT) {
        return Ok(Some(me.attributes.contains(StatxAttributes::MOUNT_ROOT)));
    }
    let Some(mine) = me.mount_id else { return Ok(None) };
    // `..` of a mount root leads into the mount below it, so the ids differ exactly there.
    let Some(parents) = mount_facts(fd, "..")?.and_then(|p| p.mount_id) else {
        return Ok(None);
    };
    Ok(Some(mine != parents))
}

struct MountFacts {
    attributes: StatxAttributes,
    attributes_mask: StatxAttributes,
    mount_id: Option<u64>,
}

/// `statx` of `name` under `fd` (of `fd` itself when `name` is empty).
fn mount_facts(fd: BorrowedFd<'_>, name: &str) -> io::Result<Option<MountFacts>> {
    let mut flags = AtFlags::NO_AUTOMOUNT;
    if name.is_empty() {
        flags |= AtFlags::EMPTY_PATH;
    }
    match statx(fd, name, flags, StatxFlags::MNT_ID) {
        Ok(s) => Ok(Some(MountFacts {
            attributes: s.stx_attributes,
            attributes_mask: s.stx_attributes_mask,
            mount_id: StatxFlags::from_bits_retain(s.stx_mask)
                .contains(StatxFlags::MNT_ID)
                .then_some(s.stx_mnt_id),
        })),
        // No statx at all (Linux < 4.11, some seccomp filters).
        Err(Errno::NOSYS) => Ok(None),
        Err(e) => Err(e.into()),
    }
}

/// Whether `/proc/self/mountinfo` lists `path` (canonicalized) as a mount point.
pub(crate) fn by_mountinfo(path: &Path) -> io::Result<bool> {
    let path = path.canonicalize()?;
    let table = std::fs::read_to_string("/proc/self/mountinfo")?;
    Ok(mount_points(&table).any(|p| p == path))
}

/// The mount points of a mountinfo table (the fifth field of each line, octal escapes undone).
fn mount_points(table: &str) -> impl Iterator<Item = PathBuf> + '_ {
    table.lines().filter_map(|line| line.split(' ').nth(4)).map(unescape)
}

/// Undoes the kernel's `\ooo` escapes (space, tab, newline, backslash) in a mountinfo path.
fn unescape(field: &str) -> PathBuf {
    use std::os::unix::ffi::OsStringExt;
    let bytes = field.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let octal = bytes.get(i + 1..i + 4).filter(|d| d.iter().all(|b| (b'0'..=b'7').contains(b)));
        match (bytes[i], octal) {
            (b'\\', Some(d)) => {
                let value = d.iter().fold(0u32, |v, b| v * 8 + u32::from(b - b'0'));
                out.push(u8::try_from(value).unwrap_or(b'?'));
                i += 4;
            }
            (b, _) => {
                out.push(b);
                i += 1;
            }
        }
    }
    PathBuf::from(std::ffi::OsString::from_vec(out))
}

/// Test support: mounts that are undone when dropped, also when a test panics.
#[cfg(test)]
pub(crate) mod testing {
    use std::io;
    use std::path::{Path, PathBuf};

    use rustix::mount::{MountFlags, UnmountFlags, mount, mount_bind, unmount};

    /// A mount at `target`, lazily unmounted on drop.
    #[derive(Debug)]
    pub(crate) struct Mounted {
        target: PathBuf,
    }

    impl Mounted {
        /// Bind-mounts `source` at `target` (both directories).
        pub(crate) fn bind(source: &Path, target: &Path) -> io::Result<Self> {
            mount_bind(source, target).map_err(|e| refused("bind-mounting", target, e))?;
            Ok(Self { target: target.to_owned() })
        }

        /// Mounts a small tmpfs at `target`.
        pub(crate) fn tmpfs(target: &Path) -> io::Result<Self> {
            mount("ferry-test", target, "tmpfs", MountFlags::empty(), c"size=1m")
                .map_err(|e| refused("mounting a tmpfs on", target, e))?;
            Ok(Self { target: target.to_owned() })
        }
    }

    impl Drop for Mounted {
        fn drop(&mut self) {
            if let Err(e) = unmount(&self.target, UnmountFlags::DETACH) {
                eprintln!("unmounting {}: {e}", self.target.display());
            }
        }
    }

    fn refused(what: &str, target: &Path, e: rustix::io::Errno) -> io::Error {
        io::Error::other(format!(
            "{what} {}: {e} (these tests mount and need root, as the test machines run them)",
            target.display()
        ))
    }
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::testing::Mounted;
    use super::*;

    /// Every method agrees on `path`, and the answer is `expected`.
    fn assert_mount_point(path: &Path, expected: bool) -> io::Result<()> {
        assert_eq!(is_mount_point(path)?, expected, "{}", path.display());
        let fd = openat(CWD, path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
        assert_eq!(by_statx(fd.as_fd())?, Some(expected), "statx on {}", path.display());
        assert_eq!(open_mount_root(path)?.is_some(), expected, "opened {}", path.display());
        assert_eq!(by_mountinfo(path)?, expected, "mountinfo on {}", path.display());
        Ok(())
    }

    fn same_device_as_parent(path: &Path) -> io::Result<bool> {
        Ok(std::fs::metadata(path)?.dev() == std::fs::metadata(path.join(".."))?.dev())
    }

    #[test]
    fn a_plain_directory_is_not_a_mount_point() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let plain = dir.path().join("plain");
        std::fs::create_dir(&plain)?;
        assert_mount_point(&plain, false)
    }

    #[test]
    fn a_directory_bind_mounted_onto_itself_is_one() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let target = dir.path().join("self");
        std::fs::create_dir(&target)?;
        let _mounted = Mounted::bind(&target, &target)?;
        // What a device comparison cannot see.
        assert!(same_device_as_parent(&target)?);
        assert_mount_point(&target, true)?;
        // Below the mount root nothing is a mount point.
        std::fs::create_dir(target.join("inner"))?;
        assert_mount_point(&target.join("inner"), false)
    }

    #[test]
    fn a_bind_mount_from_elsewhere_on_the_same_file_system_is_one() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let (source, target) = (dir.path().join("source"), dir.path().join("a b\\c"));
        std::fs::create_dir(&source)?;
        std::fs::create_dir(&target)?;
        std::fs::write(source.join("file"), b"data")?;
        let _mounted = Mounted::bind(&source, &target)?;
        assert!(same_device_as_parent(&target)?);
        assert_eq!(std::fs::read(target.join("file"))?, b"data");
        // The name needs the kernel's escapes in mountinfo.
        assert_mount_point(&target, true)
    }

    #[test]
    fn a_tmpfs_is_one() -> io::Result<()> {
        let dir = tempfile::tempdir()?;
        let target = dir.path().join("tmpfs");
        std::fs::create_dir(&target)?;
        let _mounted = Mounted::tmpfs(&target)?;
        assert!(!same_device_as_parent(&target)?);
        assert_mount_point(&target, true)
    }

    #[test]
    fn mountinfo_paths_are_unescaped() {
        let table = "36 35 98:0 /mnt1 /mnt/a\\040b\\134c rw,noatime master:1 - ext3 /dev/root rw\n\
                     37 35 0:5 / /tab\\011in rw - tmpfs none rw\n";
        let points: Vec<PathBuf> = mount_points(table).collect();
        assert_eq!(points, [PathBuf::from("/mnt/a b\\c"), PathBuf::from("/tab\tin")]);
        // A backslash not followed by three octal digits is kept.
        assert_eq!(unescape("/x\\9y\\"), PathBuf::from("/x\\9y\\"));
    }
}
