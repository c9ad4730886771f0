//! File workers: read a file (skipping holes), chunk it, hash the chunks, store new ones.

use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use nix::unistd::Whence;

use crate::backup::Shared;
use crate::dir_path::DirPath;
use crate::error::{RepoError, RepoResult};
use crate::format::{ChunkRef, Extent, FileContent, ObjectKind};
use crate::repo::writer::LocalPacker;

/// One file to read.
#[derive(Debug)]
pub(crate) struct FileJob {
    pub(crate) dir: Arc<OwnedFd>,
    pub(crate) name: Vec<u8>,
    /// Its directory's place, for messages.
    pub(crate) loc: Arc<DirPath>,
    pub(crate) sparse: bool,
    pub(crate) reply: crossbeam_channel::Sender<FileOutcome>,
}

/// What reading a file gave.
#[derive(Debug)]
pub(crate) enum FileOutcome {
    /// The content.
    Read(FileContent),
    /// The file could not be read; the message says why.
    Failed(String),
}

/// A worker's reusable state.
pub(crate) struct FileWorker<'a> {
    shared: &'a Shared,
    packer: LocalPacker,
    buf: Vec<u8>,
}

/// Opens a listed file for reading, without following links, and returns it with its size
/// now (a file truncated since it was listed must not be recorded at its old length).
/// Anything but a regular file is refused: the entry may have been replaced since it was
/// listed, and a FIFO must neither block the open nor be read.
fn open_regular(dir: &OwnedFd, name: &[u8]) -> std::io::Result<(File, u64)> {
    // O_NONBLOCK: opening a FIFO must not wait for a writer (reads of regular files ignore
    // the flag).
    let flags = OFlag::O_RDONLY
        | OFlag::O_NOFOLLOW
        | OFlag::O_CLOEXEC
        | OFlag::O_NOCTTY
        | OFlag::O_NONBLOCK;
    let fd = match nix::fcntl::openat(dir.as_fd(), name, flags | OFlag::O_NOATIME, Mode::empty()) {
        Err(nix::errno::Errno::EPERM) => {
            nix::fcntl::openat(dir.as_fd(), name, flags, Mode::empty())
        }
        other => other,
    }?;
    let st = nix::sys::stat::fstat(&fd)?;
    if st.st_mode & libc::S_IFMT != libc::S_IFREG {
        return Err(std::io::Error::other(
            "replaced by something other than a regular file since it was listed; not read",
        ));
    }
    Ok((File::from(fd), u64::try_from(st.st_size).unwrap_or(0)))
}

impl<'a> FileWorker<'a> {
    pub(crate) fn new(shared: &'a Shared, packer: LocalPacker) -> Self {
        Self { shared, packer, buf: Vec::new() }
    }

    /// Processes jobs until the channel closes; flushes the worker's packs at the end.
    pub(crate) fn run(mut self, jobs: &crossbeam_channel::Receiver<FileJob>) -> RepoResult<()> {
        while let Ok(job) = jobs.recv() {
            if self.shared.stop.is_cancelled() {
                return Err(RepoError::Cancelled);
            }
            let outcome = match self.read_file(&job) {
                Ok(content) => FileOutcome::Read(content),
                Err(ReadError::Fatal(e)) => return Err(e),
                Err(ReadError::File(e)) => {
                    self.shared.progress.errors.fetch_add(1, Ordering::Relaxed);
                    FileOutcome::Failed(format!("{}: {e}", job.loc.child_path(&job.name).display()))
                }
            };
            self.shared.progress.files_done.fetch_add(1, Ordering::Relaxed);
            // The tree builder may have stopped (cancellation); nothing to do then.
            let _ = job.reply.send(outcome);
        }
        self.packer.finish()
    }

    fn read_file(&mut self, job: &FileJob) -> Result<FileContent, ReadError> {
        let (file, size) = open_regular(&job.dir, &job.name).map_err(ReadError::File)?;
        let extents =
            if job.sparse { data_extents(&file, size).map_err(ReadError::File)? } else { None };
        let mut content = FileContent { size: 0, extents: None, chunks: Vec::new() };
        match extents {
            Some(extents) => {
                for e in &extents {
                    let read =
                        self.read_range(&file, e.offset, Some(e.len), &mut content.chunks)?;
                    if read != e.len {
                        return Err(ReadError::File(std::io::Error::other(
                            "file shrank while being read",
                        )));
                    }
                }
                content.size = size;
                content.extents = Some(extents);
            }
            None => content.size = self.read_range(&file, 0, None, &mut content.chunks)?,
        }
        Ok(content)
    }

    /// Chunks `len` bytes (or up to EOF when `None`) from `offset`; returns bytes read.
    fn read_range(
        &mut self,
        file: &File,
        offset: u64,
        len: Option<u64>,
        chunks: &mut Vec<ChunkRef>,
    ) -> Result<u64, ReadError> {
        let chunker = self.shared.repo.chunker();
        let max = chunker.params().max_size as usize;
        if self.buf.len() < 2 * max {
            self.buf = vec![0u8; 2 * max];
        }
        let end = len.map(|l| offset + l);
        let mut pos = offset; // file offset of buf[start]
        let (mut start, mut filled) = (0usize, 0usize);
        let mut eof = false;
        loop {
            if self.shared.stop.is_cancelled() {
                return Err(ReadError::Fatal(RepoError::Cancelled));
            }
            // Fill until at least `max` bytes are buffered or the range ends.
            while !eof && filled - start < max {
                if start > 0 && filled + max > self.buf.len() {
                    self.buf.copy_within(start..filled, 0);
                    filled -= start;
                    start = 0;
                }
                let file_pos = pos + (filled - start) as u64;
                let mut want = self.buf.len() - filled;
                if let Some(end) = end {
                    want = want.min(usize::try_from(end - file_pos).unwrap_or(usize::MAX));
                }
                if want == 0 {
                    eof = true;
                    break;
                }
                let n = file
                    .read_at(&mut self.buf[filled..filled + want], file_pos)
                    .map_err(ReadError::File)?;
                if n == 0 {
                    eof = true;
                }
                filled += n;
            }
            if start == filled {
                return Ok(pos - offset);
            }
            let cut = chunker.cut(&self.buf[start..filled]);
            let data = &self.buf[start..start + cut];
            let id = self.shared.repo.keys().blob_id(data);
            if self.shared.claim(id) {
                self.packer.add(ObjectKind::DataBlob, id, data).map_err(ReadError::Fatal)?;
                self.shared.progress.bytes_new.fetch_add(cut as u64, Ordering::Relaxed);
            }
            self.shared.progress.bytes_done.fetch_add(cut as u64, Ordering::Relaxed);
            self.shared.progress.bytes_read.fetch_add(cut as u64, Ordering::Relaxed);
            chunks.push(ChunkRef { id, len: u32::try_from(cut).unwrap_or(u32::MAX) });
            start += cut;
            pos += cut as u64;
        }
    }
}

enum ReadError {
    /// The file cannot be read: record it and go on.
    File(std::io::Error),
    /// The backup cannot go on.
    Fatal(RepoError),
}

/// The data ranges of a file with holes, from SEEK_DATA/SEEK_HOLE; `None` when the file
/// system cannot tell (read it densely then).
fn data_extents(file: &File, size: u64) -> std::io::Result<Option<Vec<Extent>>> {
    let mut out = Vec::new();
    let end = i64::try_from(size).unwrap_or(i64::MAX);
    let mut pos = 0i64;
    while pos < end {
        let data = match nix::unistd::lseek(file.as_fd(), pos, Whence::SeekData) {
            Ok(d) => d,
            Err(nix::errno::Errno::ENXIO) => break,
            Err(nix::errno::Errno::EINVAL) => return Ok(None),
            Err(e) => return Err(e.into()),
        };
        if data >= end {
            break;
        }
        let hole = nix::unistd::lseek(file.as_fd(), data, Whence::SeekHole)
            .map_err(std::io::Error::from)?
            .min(end);
        if hole <= data {
            break;
        }
        out.push(Extent {
            offset: u64::try_from(data).unwrap_or(0),
            len: u64::try_from(hole - data).unwrap_or(0),
        });
        pos = hole;
    }
    Ok(Some(out))
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use super::*;

    fn open_in(dir: &std::path::Path) -> std::io::Result<OwnedFd> {
        Ok(OwnedFd::from(File::open(dir)?))
    }

    /// What a worker meets when a listed file was replaced before it opened it: a FIFO
    /// (opening it must not wait for a writer), a directory or a symlink: refused, promptly.
    #[test]
    fn a_listed_file_replaced_by_something_else_is_refused_without_blocking() {
        let tmp = tempfile::tempdir().expect("tempdir");
        nix::unistd::mkfifo(&tmp.path().join("fifo"), Mode::from_bits_truncate(0o644))
            .expect("mkfifo");
        std::fs::create_dir(tmp.path().join("dir")).expect("mkdir");
        std::os::unix::fs::symlink("fifo", tmp.path().join("link")).expect("symlink");
        std::fs::write(tmp.path().join("file"), b"12345").expect("write");
        let (tx, rx) = std::sync::mpsc::channel();
        let dir = open_in(tmp.path()).expect("open dir");
        // On its own thread: an open that blocks fails the test instead of hanging it.
        std::thread::spawn(move || {
            for name in ["fifo", "dir", "link", "file"] {
                let opened = open_regular(&dir, name.as_bytes()).map(|(_, size)| size);
                let _ = tx.send((name, opened.map_err(|e| e.to_string())));
            }
        });
        for want in ["fifo", "dir", "link"] {
            let (name, opened) = rx.recv_timeout(Duration::from_secs(20)).expect("open blocked");
            assert_eq!(name, want);
            assert!(opened.is_err(), "{name} was opened as a file");
        }
        let (_, file) = rx.recv_timeout(Duration::from_secs(20)).expect("open blocked");
        assert_eq!(file, Ok(5), "a regular file opens, with its size now");
    }
}
