//! Direct writes to a block device: a restore's chunks go straight to the device (`O_DIRECT`)
//! instead of through its page cache, written behind the writers by threads of their own.
//!
//! Through the page cache, every restored byte is copied into newly allocated cache pages and
//! written back from there: a restore of a large volume fills the node's memory with pages
//! nobody will read, pushing other pods' working sets out, and pays for allocating and copying
//! into them (measurements in `VOLUMES.md`, "Writing onto a block device"). A direct write
//! waits for the device, so the writers do not make them: a writer copies each chunk into a
//! page-aligned buffer (direct I/O needs the buffer aligned in memory, and offset and length
//! in multiples of the device's block size), gathering chunks that follow each other on the
//! device up to [`BATCH`], and hands each batch (full, or ended by a chunk that does not
//! follow it, or by the writer's end) to the restore's I/O threads while it goes on decoding ([`WriteBehind`], [`Stager`]). Writes that are not aligned to [`ALIGN`] go
//! through the page cache, from the writer; once the device refused a direct write (`EINVAL`:
//! a driver without direct I/O, or a stricter alignment than it reports) Ferry writes
//! everything through the page cache, and says so in the log.

use std::fs::File;
use std::io;
use std::os::fd::AsFd;
use std::os::unix::fs::FileExt;
use std::path::Path;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};

use crossbeam_channel::{Receiver, Sender};

use crate::place::reopen_file;

/// Alignment of a direct write's offset, length and buffer: 4 KiB, a multiple of every
/// logical block size up to it (512-byte and 4Kn devices) and of the DMA alignment of the
/// devices behind them, whatever sysfs reports. A write in whole 4 KiB blocks also never
/// shares a page-cache block with a write through the other handle (a buffered write to part
/// of a 4 KiB block reads the rest from the device, and could write old bytes back over a
/// direct write to them; on kernels with 4 KiB pages, whose device cache blocks are at most
/// that). Ferry's volume chunks are 4 KiB multiples at 4 KiB multiples.
pub(crate) const ALIGN: usize = 4096;

/// Most bytes one direct write gathers (every buffer holds this from an aligned address):
/// chunks that follow
/// each other on the device (the chunks of a frame most often do) go in one write up to this;
/// a larger chunk is written in pieces of it.
pub(crate) const BATCH: usize = 1 << 20;

/// A second handle on a block device, opened with `O_DIRECT`.
#[derive(Debug)]
pub(crate) struct Direct {
    file: File,
    /// Set once the device refused a direct write: Ferry makes no more.
    refused: AtomicBool,
    /// Bytes written directly, and in how many writes.
    written: AtomicU64,
    writes: AtomicU64,
}

impl Direct {
    /// Opens `device` (a block device already open for writing) again with `O_DIRECT`; `None`
    /// when the device or its driver does not take direct I/O, or its logical block size is
    /// above [`ALIGN`]. Never exclusive: the first handle holds the device's exclusive claim.
    pub(crate) fn open(device: &File, shown_as: &Path, block_size: u32) -> Option<Self> {
        if block_size == 0 || !block_size.is_power_of_two() || block_size as usize > ALIGN {
            return None;
        }
        let file = reopen_file(device.as_fd(), shown_as, true, libc::O_DIRECT)
            .map_err(|e| tracing::info!(error = %e, "no direct writes to the restore target"))
            .ok()?;
        Some(Self {
            file,
            refused: AtomicBool::new(false),
            written: AtomicU64::new(0),
            writes: AtomicU64::new(0),
        })
    }

    /// Bytes written directly so far.
    pub(crate) fn bytes_written(&self) -> u64 {
        self.written.load(Ordering::Relaxed)
    }

    /// Whether `len` bytes at `offset` can be written directly.
    fn takes(&self, offset: u64, len: usize) -> bool {
        len > 0
            && offset.is_multiple_of(ALIGN as u64)
            && len.is_multiple_of(ALIGN)
            && !self.refused.load(Ordering::Relaxed)
    }

    /// Writes the aligned `data` at `offset` directly; `Ok(false)` when the device refuses
    /// it (Ferry then makes no more direct writes).
    fn write(&self, data: &[u8], offset: u64) -> io::Result<bool> {
        if self.refused.load(Ordering::Relaxed) {
            return Ok(false);
        }
        match self.file.write_all_at(data, offset) {
            Ok(()) => {
                self.written.fetch_add(data.len() as u64, Ordering::Relaxed);
                self.writes.fetch_add(1, Ordering::Relaxed);
                Ok(true)
            }
            Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {
                if !self.refused.swap(true, Ordering::Relaxed) {
                    tracing::warn!(error = %e, offset, len = data.len(),
                        "the restore target refused a direct write; writing through the page cache from now on");
                }
                Ok(false)
            }
            Err(e) => Err(e),
        }
    }
}

/// A batch for the I/O threads: `len` bytes from `start` in `buf` (aligned there), to go
/// at `offset`.
struct Batch {
    buf: Vec<u8>,
    start: usize,
    len: usize,
    offset: u64,
}

/// The queue between a restore's writers and its I/O threads, and the buffers that go round
/// between them: a fixed number of [`BATCH`] bytes each, so the memory is bounded (a writer
/// waits for a free buffer while all are queued or being written).
pub(crate) struct WriteBehind {
    queue: (Sender<Batch>, Receiver<Batch>),
    free: (Sender<Vec<u8>>, Receiver<Vec<u8>>),
}

impl WriteBehind {
    /// A queue with `buffers` buffers, each allocated on first use.
    pub(crate) fn new(buffers: usize) -> Self {
        let buffers = buffers.max(1);
        let free = crossbeam_channel::bounded(buffers);
        for _ in 0..buffers {
            let _ = free.0.send(Vec::new());
        }
        Self { queue: crossbeam_channel::bounded(buffers), free }
    }

    /// A writer's end.
    pub(crate) fn stager<'d>(&self, direct: &'d Direct, buffered: &'d File) -> Stager<'d> {
        Stager {
            direct,
            buffered,
            queue: self.queue.0.clone(),
            free: self.free.1.clone(),
            current: None,
        }
    }

    /// An I/O thread's end.
    pub(crate) fn io_end(&self) -> IoEnd {
        IoEnd { queue: self.queue.1.clone(), free: self.free.0.clone() }
    }
}

/// An I/O thread's end of a [`WriteBehind`].
pub(crate) struct IoEnd {
    queue: Receiver<Batch>,
    free: Sender<Vec<u8>>,
}

impl IoEnd {
    /// Writes the batches queued until every [`Stager`] and the [`WriteBehind`] are dropped;
    /// a batch the device refuses goes to `buffered` (its first handle) instead. Once
    /// `stopped()` (a failure or a cancellation), batches are dropped unwritten. A write's
    /// error goes to `fail` with the batch's offset, and is to stop the restore.
    pub(crate) fn run(
        self,
        direct: &Direct,
        buffered: &File,
        stopped: impl Fn() -> bool,
        fail: impl Fn(u64, io::Error),
    ) {
        for batch in self.queue.iter() {
            if !stopped() {
                let data = &batch.buf[batch.start..batch.start + batch.len];
                let written = match direct.write(data, batch.offset) {
                    Ok(true) => Ok(()),
                    Ok(false) => buffered.write_all_at(data, batch.offset),
                    Err(e) => Err(e),
                };
                if let Err(e) = written {
                    fail(batch.offset, e);
                }
            }
            let _ = self.free.send(batch.buf);
        }
    }
}

/// A writer's end of a [`WriteBehind`]: gathers the chunks it is given into the batch it
/// fills and queues full ones. [`Stager::finish`] queues the last; dropped without it (a
/// failed writer), the batch being filled is dropped unwritten.
pub(crate) struct Stager<'d> {
    direct: &'d Direct,
    buffered: &'d File,
    queue: Sender<Batch>,
    free: Receiver<Vec<u8>>,
    current: Option<Batch>,
}

impl Stager<'_> {
    /// Takes `data` for a direct write at `offset` (copied: the caller may reuse it);
    /// `Ok(false)` when it cannot go direct (not aligned, or the device refused a direct
    /// write): the caller writes it through the page cache itself.
    pub(crate) fn stage(&mut self, data: &[u8], offset: u64) -> io::Result<bool> {
        if !self.direct.takes(offset, data.len()) {
            return Ok(false);
        }
        // In pieces of at most a batch (each a multiple of ALIGN, as BATCH is).
        let mut done = 0;
        while done < data.len() {
            let piece = &data[done..data.len().min(done + BATCH)];
            let at = offset + done as u64;
            if let Some(b) = &self.current
                && (b.offset + b.len as u64 != at || b.len + piece.len() > BATCH)
            {
                self.queue_current()?;
            }
            let mut b = match self.current.take() {
                Some(b) => b,
                None => match self.free.recv() {
                    Ok(buf) => new_batch(buf, at),
                    // No buffer ever comes back: every I/O thread is gone (all of them
                    // panicked, and the restore fails). What is left is the caller's to write.
                    Err(_) => {
                        if done == 0 {
                            return Ok(false);
                        }
                        self.buffered.write_all_at(&data[done..], at)?;
                        return Ok(true);
                    }
                },
            };
            b.buf[b.start + b.len..b.start + b.len + piece.len()].copy_from_slice(piece);
            b.len += piece.len();
            let full = b.len == BATCH;
            self.current = Some(b);
            if full {
                self.queue_current()?;
            }
            done += piece.len();
        }
        Ok(true)
    }

    /// Queues the batch being filled, if any: the writer is done.
    pub(crate) fn finish(mut self) -> io::Result<()> {
        self.queue_current()
    }

    /// Queues the batch being filled; writes it here when no I/O thread is left to.
    fn queue_current(&mut self) -> io::Result<()> {
        let Some(b) = self.current.take() else {
            return Ok(());
        };
        match self.queue.send(b) {
            Ok(()) => Ok(()),
            Err(crossbeam_channel::SendError(b)) => {
                self.buffered.write_all_at(&b.buf[b.start..b.start + b.len], b.offset)
            }
        }
    }
}

/// An empty batch for `offset` in `buf`, which is made to hold [`BATCH`] bytes from an
/// [`ALIGN`]ed address (found inside a larger allocation, so without `unsafe`).
fn new_batch(mut buf: Vec<u8>, offset: u64) -> Batch {
    if buf.len() < BATCH + ALIGN {
        buf = vec![0; BATCH + ALIGN];
    }
    let start = (ALIGN - buf.as_ptr().addr() % ALIGN) % ALIGN;
    Batch { buf, start, len: 0, offset }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use std::sync::Mutex;

    use super::*;

    /// A regular file standing in for the device (direct I/O behaves alike on a disk file
    /// system such as ext4, where the tests' temporary directory is): fails, saying why, where
    /// it takes none.
    fn file_and_direct() -> (tempfile::TempDir, File, Direct) {
        let dir = tempfile::tempdir().unwrap();
        let file = std::fs::OpenOptions::new()
            .create_new(true)
            .read(true)
            .write(true)
            .open(dir.path().join("dev"))
            .unwrap();
        file.set_len(4 << 20).unwrap();
        let direct = Direct::open(&file, dir.path(), 512).unwrap_or_else(|| {
            panic!("{} takes no O_DIRECT: set TMPDIR to a disk file system", dir.path().display())
        });
        (dir, file, direct)
    }

    /// A writer of a test: stages what it writes through the stager it is given.
    type Writer<'a> = Box<dyn FnOnce(&mut Stager<'_>) + Send + 'a>;

    fn pattern(len: usize, seed: u8) -> Vec<u8> {
        (0..len).map(|i| (i as u8).wrapping_mul(31).wrapping_add(seed)).collect()
    }

    fn read(file: &File, offset: u64, len: usize) -> Vec<u8> {
        let mut back = vec![0; len];
        file.read_exact_at(&mut back, offset).unwrap();
        back
    }

    /// Runs `writers` (each given a stager) against `io_threads` I/O threads; returns the
    /// offsets and errors the I/O threads reported.
    fn write_behind(
        direct: &Direct,
        file: &File,
        io_threads: usize,
        stopped: bool,
        writers: Vec<Writer<'_>>,
    ) -> Vec<(u64, io::Error)> {
        let errors = Mutex::new(Vec::new());
        std::thread::scope(|scope| {
            let behind = WriteBehind::new(2);
            let io: Vec<_> = (0..io_threads)
                .map(|_| {
                    let end = behind.io_end();
                    let errors = &errors;
                    scope.spawn(move || {
                        let fail = |at, e| errors.lock().unwrap().push((at, e));
                        end.run(direct, file, || stopped, fail);
                    })
                })
                .collect();
            // Every end made before the queue's own ends are dropped, as a restore does.
            let stagers: Vec<_> = writers.iter().map(|_| behind.stager(direct, file)).collect();
            drop(behind);
            let staging: Vec<_> = writers
                .into_iter()
                .zip(stagers)
                .map(|(w, mut stager)| {
                    scope.spawn(move || {
                        w(&mut stager);
                        stager.finish().unwrap();
                    })
                })
                .collect();
            for t in staging.into_iter().chain(io) {
                t.join().unwrap();
            }
        });
        errors.into_inner().unwrap()
    }

    #[test]
    fn staged_chunks_reach_the_device_directly_gathered_and_in_place() {
        let (_dir, file, direct) = file_and_direct();
        let chunks: Vec<(u64, Vec<u8>)> = vec![
            // Three that follow each other (one write), one elsewhere (one), one of a batch and
            // a half (two).
            (0, pattern(256 << 10, 1)),
            (256 << 10, pattern(256 << 10, 2)),
            (512 << 10, pattern(4096, 3)),
            (1 << 20, pattern(8192, 4)),
            (2 << 20, pattern(BATCH + (512 << 10), 5)),
        ];
        let writer = |stager: &mut Stager<'_>| {
            for (offset, data) in &chunks {
                // From an unaligned source buffer: the batch aligns it.
                let mut shifted = vec![0; data.len() + 1];
                shifted[1..].copy_from_slice(data);
                assert!(stager.stage(&shifted[1..], *offset).unwrap());
            }
        };
        let errors = write_behind(&direct, &file, 2, false, vec![Box::new(writer)]);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(!direct.refused.load(Ordering::Relaxed), "the file system refused direct I/O");
        let bytes: usize = chunks.iter().map(|(_, d)| d.len()).sum();
        assert_eq!(direct.bytes_written(), bytes as u64, "every byte written directly");
        assert_eq!(direct.writes.load(Ordering::Relaxed), 4, "gathered into four writes");
        for (offset, data) in &chunks {
            assert_eq!(&read(&file, *offset, data.len()), data, "at {offset}");
        }
        assert!(read(&file, (512 << 10) + 4096, 4096).iter().all(|b| *b == 0), "nothing between");
    }

    #[test]
    fn a_write_not_in_whole_4_kib_blocks_is_left_to_the_caller() {
        let (_dir, file, direct) = file_and_direct();
        let writer = |stager: &mut Stager<'_>| {
            let data = pattern(4096, 3);
            assert!(!stager.stage(&data, 100).unwrap(), "unaligned offset");
            assert!(!stager.stage(&data, 512).unwrap(), "a 512-byte sector, not a 4 KiB block");
            assert!(!stager.stage(&data[..1024], 4096).unwrap(), "unaligned length");
            assert!(!stager.stage(&[], 0).unwrap(), "nothing to write");
        };
        let errors = write_behind(&direct, &file, 1, false, vec![Box::new(writer)]);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(read(&file, 0, 8192).iter().all(|b| *b == 0), "nothing was written");
        assert_eq!(direct.bytes_written(), 0);
    }

    #[test]
    fn a_refused_direct_write_stops_all_later_ones() {
        let (_dir, _file, direct) = file_and_direct();
        // A buffer not aligned in memory: a disk file system refuses it (EINVAL), as a device
        // with a stricter alignment than it reports would refuse an aligned one.
        // An odd address: refused whatever the device's DMA alignment.
        let buf = vec![7u8; 2 * ALIGN];
        let refused = !direct.write(&buf[1..=ALIGN], 0).unwrap();
        assert!(
            refused,
            "the file system took a misaligned direct write (tmpfs, btrfs): run on ext4 or XFS"
        );
        assert!(direct.refused.load(Ordering::Relaxed));
        assert!(!direct.takes(0, ALIGN), "no stager offers it more");
    }

    #[test]
    fn batches_queued_before_a_refusal_are_written_through_the_page_cache() {
        let (_dir, file, direct) = file_and_direct();
        let behind = WriteBehind::new(2);
        let (mut stager, end) = (behind.stager(&direct, &file), behind.io_end());
        drop(behind);
        assert!(stager.stage(&pattern(8192, 9), 4096).unwrap());
        stager.finish().unwrap();
        direct.refused.store(true, Ordering::Relaxed);
        let errors = Mutex::new(Vec::new());
        end.run(&direct, &file, || false, |at, e| errors.lock().unwrap().push((at, e)));
        assert!(errors.into_inner().unwrap().is_empty());
        assert_eq!(read(&file, 4096, 8192), pattern(8192, 9));
        assert_eq!(direct.bytes_written(), 0, "written buffered");
    }

    #[test]
    fn a_failed_write_reaches_the_restore_with_its_offset() {
        let (_dir, file, direct) = file_and_direct();
        // An offset no file can have: the direct write is refused (EINVAL), so the batch
        // goes to the buffered handle, whose write fails too; that failure is reported.
        let at = 1u64 << 63;
        let writer =
            |stager: &mut Stager<'_>| assert!(stager.stage(&pattern(4096, 1), at).unwrap());
        let errors = write_behind(&direct, &file, 1, false, vec![Box::new(writer)]);
        assert!(direct.refused.load(Ordering::Relaxed));
        assert_eq!(errors.len(), 1, "{errors:?}");
        assert_eq!(errors[0].0, at);
    }

    #[test]
    fn once_the_restore_stopped_queued_batches_are_dropped_unwritten() {
        let (_dir, file, direct) = file_and_direct();
        let writer = |stager: &mut Stager<'_>| assert!(stager.stage(&pattern(8192, 1), 0).unwrap());
        let errors = write_behind(&direct, &file, 1, true, vec![Box::new(writer)]);
        assert!(errors.is_empty(), "{errors:?}");
        assert!(read(&file, 0, 8192).iter().all(|b| *b == 0));
    }

    #[test]
    fn with_no_io_thread_left_the_writer_writes_its_batches_itself() {
        let (_dir, file, direct) = file_and_direct();
        // Many writers, more batches than buffers, no I/O thread: nothing waits forever.
        let writers: Vec<Writer<'_>> = (0..4u64)
            .map(|i| {
                Box::new(move |stager: &mut Stager<'_>| {
                    for j in 0..3u64 {
                        let at = (i * 3 + j) * (256 << 10);
                        let data = pattern(256 << 10, (i * 3 + j) as u8);
                        // Left to the writer once no buffer comes back.
                        if !stager.stage(&data, at).unwrap() {
                            stager.buffered.write_all_at(&data, at).unwrap();
                        }
                    }
                }) as Writer<'_>
            })
            .collect();
        let errors = write_behind(&direct, &file, 0, false, writers);
        assert!(errors.is_empty(), "{errors:?}");
        for k in 0..12u64 {
            assert_eq!(
                read(&file, k * (256 << 10), 256 << 10),
                pattern(256 << 10, k as u8),
                "chunk {k}"
            );
        }
    }

    #[test]
    fn every_batch_holds_a_full_batch_from_a_4_kib_boundary() {
        for _ in 0..16 {
            let b = new_batch(Vec::new(), 0);
            assert!((b.buf.as_ptr().addr() + b.start).is_multiple_of(ALIGN));
            assert!(b.start + BATCH <= b.buf.len());
            let start = b.start;
            let again = new_batch(b.buf, 4096);
            assert_eq!(again.start, start, "a reused buffer stays aligned");
        }
    }

    #[test]
    fn a_block_size_above_4_kib_is_not_written_directly() {
        let dir = tempfile::tempdir().unwrap();
        let file = File::create(dir.path().join("dev")).unwrap();
        assert!(Direct::open(&file, dir.path(), 8192).is_none());
        assert!(Direct::open(&file, dir.path(), 0).is_none());
        assert!(Direct::open(&file, dir.path(), 1536).is_none());
    }
}
