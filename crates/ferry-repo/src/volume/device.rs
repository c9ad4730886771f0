//! Block devices and volume image files: what a path is, its size and block size, where its
//! data is (SEEK_DATA/SEEK_HOLE), and zeroing ranges (fallocate) — all without `unsafe`.

use std::fs::File;
use std::os::fd::AsFd;
use std::os::unix::fs::{FileExt, FileTypeExt, MetadataExt, OpenOptionsExt};
use std::path::Path;

use nix::fcntl::{FallocateFlags, PosixFadviseAdvice};
use nix::unistd::Whence;

use super::direct::Direct;
use crate::error::{RepoError, RepoResult};
use crate::place::{Place, reopen_file};

/// What a volume path is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum DeviceKind {
    /// A block device (`/dev/...`).
    Block,
    /// A regular file used as a volume image.
    Image,
}

/// An open volume: a block device or an image file.
#[derive(Debug)]
pub(crate) struct Volume {
    pub(crate) file: File,
    pub(crate) kind: DeviceKind,
    pub(crate) size: u64,
    pub(crate) block_size: u32,
    /// For a block device opened as a restore's target: a second handle with `O_DIRECT`,
    /// when the device takes direct I/O.
    pub(crate) direct: Option<Direct>,
}

/// Sector size assumed for image files.
const IMAGE_BLOCK_SIZE: u32 = 512;

fn size_of(file: &File, path: &Path, kind: DeviceKind) -> RepoResult<u64> {
    match kind {
        DeviceKind::Image => {
            file.metadata().map(|m| m.len()).map_err(|e| RepoError::io("stat volume", path, e))
        }
        // A block device reports size 0 in stat; its end is its size.
        DeviceKind::Block => nix::unistd::lseek(file.as_fd(), 0, Whence::SeekEnd)
            .map(|end| u64::try_from(end).unwrap_or(0))
            .map_err(|e| RepoError::io("find the size of device", path, e.into())),
    }
}

/// The logical block size of a block device from sysfs (512 when it cannot be read).
fn logical_block_size(rdev: u64) -> u32 {
    let (major, minor) = (nix::sys::stat::major(rdev), nix::sys::stat::minor(rdev));
    std::fs::read_to_string(format!("/sys/dev/block/{major}:{minor}/queue/logical_block_size"))
        .ok()
        .and_then(|s| s.trim().parse().ok())
        .unwrap_or(IMAGE_BLOCK_SIZE)
}

/// Classifies an open file; `None` for anything but a block device or a regular file.
fn classify(file: &File, path: &Path) -> RepoResult<Option<(DeviceKind, u32)>> {
    let meta = file.metadata().map_err(|e| RepoError::io("stat volume", path, e))?;
    let ft = meta.file_type();
    Ok(if ft.is_block_device() {
        Some((DeviceKind::Block, logical_block_size(meta.rdev())))
    } else if ft.is_file() {
        Some((DeviceKind::Image, IMAGE_BLOCK_SIZE))
    } else {
        None
    })
}

impl Volume {
    /// Opens a block device or image file for reading.
    pub(crate) fn open_source(place: Place<'_>) -> RepoResult<Self> {
        let path = place.path();
        let file = match place {
            Place::Opened { fd, shown_as } => reopen_file(fd, shown_as, false, 0)?,
            Place::Path(path) => std::fs::OpenOptions::new()
                .read(true)
                .custom_flags(libc::O_CLOEXEC | libc::O_NOCTTY)
                .open(path)
                .map_err(|e| RepoError::io("open volume", path, e))?,
        };
        let Some((kind, block_size)) = classify(&file, path)? else {
            return Err(RepoError::InvalidInput {
                what: "volume source",
                reason: format!("{} is neither a block device nor a regular file", path.display()),
            });
        };
        let size = size_of(&file, path, kind)?;
        Ok(Self { file, kind, size, block_size, direct: None })
    }

    /// Opens an existing block device or image file for writing. A block device is opened
    /// exclusively (`O_EXCL`), so a device that is mounted or otherwise claimed is refused.
    pub(crate) fn open_target(place: Place<'_>) -> RepoResult<Self> {
        let path = place.path();
        let file = match place {
            Place::Opened { fd, shown_as } => {
                let block = nix::sys::stat::fstat(fd)
                    .map_err(|e| RepoError::io("stat target", path, e.into()))?
                    .st_mode
                    & libc::S_IFMT
                    == libc::S_IFBLK;
                reopen_file(fd, shown_as, true, if block { libc::O_EXCL } else { 0 })?
            }
            Place::Path(path) => {
                let meta =
                    std::fs::metadata(path).map_err(|e| RepoError::io("stat target", path, e))?;
                let mut flags = libc::O_CLOEXEC | libc::O_NOCTTY;
                if meta.file_type().is_block_device() {
                    flags |= libc::O_EXCL;
                }
                std::fs::OpenOptions::new()
                    .write(true)
                    .custom_flags(flags)
                    .open(path)
                    .map_err(|e| RepoError::io("open restore target", path, e))?
            }
        };
        let Some((kind, block_size)) = classify(&file, path)? else {
            return Err(RepoError::InvalidInput {
                what: "volume restore target",
                reason: format!("{} is neither a block device nor a regular file", path.display()),
            });
        };
        let size = size_of(&file, path, kind)?;
        let direct = match kind {
            DeviceKind::Block => Direct::open(&file, path, block_size),
            DeviceKind::Image => None,
        };
        Ok(Self { file, kind, size, block_size, direct })
    }

    /// Creates a new, empty image file (fails if `path` exists).
    pub(crate) fn create_image(path: &Path) -> RepoResult<Self> {
        let file = std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .custom_flags(libc::O_CLOEXEC)
            .open(path)
            .map_err(|e| RepoError::io("create image file", path, e))?;
        Ok(Self {
            file,
            kind: DeviceKind::Image,
            size: 0,
            block_size: IMAGE_BLOCK_SIZE,
            direct: None,
        })
    }

    /// The data ranges within `[start, end)` from SEEK_DATA/SEEK_HOLE, or `None` when the
    /// source cannot tell (then everything counts as data).
    pub(crate) fn data_ranges(
        &self,
        start: u64,
        end: u64,
    ) -> std::io::Result<Option<Vec<(u64, u64)>>> {
        if self.kind == DeviceKind::Block {
            // Block devices report everything as data; zero detection does the work.
            return Ok(None);
        }
        let fd = self.file.as_fd();
        let to_i64 = |v: u64| i64::try_from(v).unwrap_or(i64::MAX);
        let mut out = Vec::new();
        let mut pos = to_i64(start);
        let end = to_i64(end);
        while pos < end {
            let data = match nix::unistd::lseek(fd, pos, Whence::SeekData) {
                Ok(d) => d,
                Err(nix::errno::Errno::ENXIO) => break,
                Err(nix::errno::Errno::EINVAL | nix::errno::Errno::EOPNOTSUPP) => return Ok(None),
                Err(e) => return Err(e.into()),
            };
            if data >= end {
                break;
            }
            let hole = nix::unistd::lseek(fd, data, Whence::SeekHole)?.min(end);
            if hole <= data {
                break;
            }
            out.push((u64::try_from(data).unwrap_or(0), u64::try_from(hole).unwrap_or(0)));
            pos = hole;
        }
        Ok(Some(out))
    }

    /// Starts reading `[offset, offset + len)` into the page cache in the background, so
    /// the readers find it there instead of waiting on one small read-ahead after another
    /// (on a loop device or a network disk that is the difference between a few hundred MB/s
    /// and the device's full speed). Only a hint: failures are ignored.
    pub(crate) fn prefetch(&self, offset: u64, len: u64) {
        self.advise(offset, len, PosixFadviseAdvice::POSIX_FADV_WILLNEED);
    }

    /// Drops `[offset, offset + len)` from the page cache once it has been read: a backup
    /// reads each byte once, and keeping a whole volume cached would push the node's working
    /// set out. Only a hint: failures are ignored.
    pub(crate) fn release(&self, offset: u64, len: u64) {
        self.advise(offset, len, PosixFadviseAdvice::POSIX_FADV_DONTNEED);
    }

    fn advise(&self, offset: u64, len: u64, advice: PosixFadviseAdvice) {
        let len = len.min(self.size.saturating_sub(offset));
        if let (Ok(off), Ok(len)) = (i64::try_from(offset), i64::try_from(len))
            && len > 0
        {
            let _ = nix::fcntl::posix_fadvise(self.file.as_fd(), off, len, advice);
        }
    }

    /// Makes `[offset, offset + len)` read as zeros: punches a hole in an image file, or
    /// zeroes the range of a device (the kernel uses the device's write-zeroes or a
    /// zeroing discard where it guarantees zeros, else writes zeros); falls back to writing
    /// zeros when neither is supported. Never changes the size.
    pub(crate) fn zero_range(&self, offset: u64, len: u64, zeros: &[u8]) -> std::io::Result<()> {
        let keep = FallocateFlags::FALLOC_FL_KEEP_SIZE;
        let mode = match self.kind {
            DeviceKind::Image => FallocateFlags::FALLOC_FL_PUNCH_HOLE | keep,
            DeviceKind::Block => FallocateFlags::FALLOC_FL_ZERO_RANGE | keep,
        };
        let (off, l) = (
            i64::try_from(offset).map_err(std::io::Error::other)?,
            i64::try_from(len).map_err(std::io::Error::other)?,
        );
        match nix::fcntl::fallocate(self.file.as_fd(), mode, off, l) {
            Ok(()) => return Ok(()),
            Err(nix::errno::Errno::EOPNOTSUPP | nix::errno::Errno::EINVAL) => {}
            Err(e) => return Err(e.into()),
        }
        let mut pos = offset;
        while pos < offset + len {
            let n = usize::try_from((offset + len - pos).min(zeros.len() as u64)).unwrap_or(0);
            self.file.write_all_at(&zeros[..n], pos)?;
            pos += n as u64;
        }
        Ok(())
    }
}

/// Whether every byte is zero (64 bytes at a time, which vectorises).
pub(crate) fn is_zero(data: &[u8]) -> bool {
    let mut blocks = data.chunks_exact(64);
    blocks.by_ref().all(|b| b.iter().fold(0u8, |acc, x| acc | x) == 0)
        && blocks.remainder().iter().all(|b| *b == 0)
}
