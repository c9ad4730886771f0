//! Volume restore: check the target's size and find every chunk in the index, then writer
//! threads zero the gaps (or skip them when the target is known to read as zeros) and take
//! the pack reads in turn: the chunks are grouped by pack, not by device offset, so each
//! stored byte is downloaded at most once a window (below), in ranged reads of up to
//! [`pack_reads::VOLUME_MAX_READ`], whichever device ranges its chunks go to (a frame of chunks
//! from all over the volume is opened once); each chunk is verified and written in
//! place. A writer starts the reads of its next unit of work while it writes the last of the
//! current one's. A flusher syncs the target as the data comes in, and an fsync ends the
//! restore. A volume of more than [`WINDOW_CHUNKS`] chunks is planned and written that many
//! chunks at a time (its windows, the next planned while one is written), so the plan's
//! memory stays bounded however large the volume: beside the snapshot's list of the chunks
//! (36 bytes each), two windows' plans.

use std::ops::Range;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::flusher::{self, FLUSH_BYTES};
use crate::format::{
    BlobOpener, ChunkRef, FileContent, FormatError, ObjectKind, PackId, PlacedCursor, Snapshot,
    SnapshotId, SnapshotKind,
};
use crate::pack_reads::{self, Fetcher, PackRead, Queue, Span};
use crate::place::Place;
use crate::progress::{Counters, ProgressFn, Ticker};
use crate::repo::{BlobLocation, MemIndex, Repository};
use crate::volume::device::{DeviceKind, Volume, is_zero};
use crate::volume::direct::{Direct, Stager, WriteBehind};
use crate::volume::map::VolumeContent;
use crate::volume::{VolumeRestoreOptions, VolumeRestoreSummary};

/// Bytes a writer takes at once, about: a unit closes once it reaches this, of chunks to write
/// (or of reads, if more), or of gaps to zero (a gap counted as at most this much); one read
/// or gap can take it over.
const UNIT_BYTES: u64 = 16 << 20;
/// Granularity at which all-zero parts of a chunk are left unwritten on a zeroed target.
const ZERO_BLOCK: usize = 4096;
/// Chunks planned and written at once: 256 Ki chunks, 64 GiB of a volume in the default
/// 256 KiB chunks, a plan of 18 MiB (72 bytes a chunk: its offset and id, 48, and its
/// [`Want`], 24). A window reads only its own chunks' bytes, so a pack whose chunks lie in two
/// windows is read in two ranged reads where one would do (and a frame holding chunks of both
/// is fetched twice).
const WINDOW_CHUNKS: usize = 256 << 10;

/// What a writer takes: gaps to zero, or consecutive pack reads.
#[derive(Debug)]
enum Unit {
    Gaps(Range<usize>),
    Reads(Range<usize>),
}

/// One window's work, planned before it is written.
struct Work {
    /// The window's chunks with their device offsets.
    chunks: Vec<(u64, ChunkRef)>,
    /// The gaps (all of them in the first window, none in the others).
    gaps: Vec<(u64, u64)>,
    /// The packs the chunks lie in, each once.
    packs: Vec<PackId>,
    /// Every chunk of the window with its place in the repository, sorted by pack and offset.
    wants: Vec<Want>,
    reads: Vec<PackRead>,
    units: Vec<Unit>,
    /// The next unit a writer takes.
    next: AtomicUsize,
}

struct Shared {
    repo: Repository,
    handle: tokio::runtime::Handle,
    stop: CancellationToken,
    target: Volume,
    path: PathBuf,
    zeroed: bool,
    progress: Counters,
    failure: Mutex<Option<RepoError>>,
}

impl Shared {
    fn fail(&self, e: RepoError) {
        if !matches!(e, RepoError::Cancelled)
            && let Ok(mut f) = self.failure.lock()
        {
            f.get_or_insert(e);
        }
        self.stop.cancel();
    }
}

/// Restores volume snapshot `id` onto the block device or image file `target`.
///
/// A missing `target` is created as an image file of the volume's size (sparse: gaps and
/// all-zero blocks are not written). An existing image file smaller than the volume is
/// extended; a block device smaller than the volume is refused before anything is written.
/// A larger target keeps its bytes past the volume's size. Ranges the snapshot records as
/// zero are zeroed on the target (hole punching for image files, the kernel's zeroing for
/// devices) unless [`VolumeRestoreOptions::target_zeroed`] says they already read as zeros.
/// Everything is flushed to stable storage (fsync) before this returns success. Block devices
/// are opened exclusively, so a mounted device is refused.
///
/// # Errors
/// [`RepoError::WrongSnapshotKind`] for a snapshot that is not a volume snapshot;
/// [`RepoError::TargetTooSmall`]; [`RepoError::Corrupt`] for a damaged snapshot or blob
/// (nothing wrong is ever written as if it were right); [`RepoError::MissingBlob`]; local I/O
/// errors with the path; [`RepoError::Cancelled`] (the target is then partly written).
pub async fn restore_volume(
    repo: &Repository,
    id: &SnapshotId,
    target: &Path,
    options: &VolumeRestoreOptions,
    progress: Option<ProgressFn>,
    cancel: &CancellationToken,
) -> RepoResult<VolumeRestoreSummary> {
    restore_volume_at(repo, id, Place::Path(target), options, progress, cancel).await
}

/// [`restore_volume`] onto a device or image given by path or already opened (see
/// [`Place`]). An opened target is written through its descriptor only: never created,
/// never replaced.
///
/// # Errors
/// As [`restore_volume`].
pub async fn restore_volume_at(
    repo: &Repository,
    id: &SnapshotId,
    target: Place<'_>,
    options: &VolumeRestoreOptions,
    progress: Option<ProgressFn>,
    cancel: &CancellationToken,
) -> RepoResult<VolumeRestoreSummary> {
    // The snapshot manifest is read while the lease is written (collection deletes no
    // manifest); the index is loaded under the lease.
    let (lease, snapshot) = crate::gc::Lease::acquire_while(
        repo,
        "volume restore",
        repo.load_snapshot(id, cancel),
        cancel,
    )
    .await?;
    let result = restore_volume_leased(
        repo,
        (id, snapshot),
        target,
        options,
        progress,
        WINDOW_CHUNKS,
        cancel,
    )
    .await;
    lease.release().await;
    result
}

/// [`restore_volume_at`] under its lease, `window` chunks at a time.
async fn restore_volume_leased(
    repo: &Repository,
    (id, snapshot): (&SnapshotId, Snapshot),
    place: Place<'_>,
    options: &VolumeRestoreOptions,
    progress: Option<ProgressFn>,
    window: usize,
    cancel: &CancellationToken,
) -> RepoResult<VolumeRestoreSummary> {
    let started = Instant::now();
    let window = window.max(1);
    let object = || format!("snapshot {id}");
    let kind = snapshot.kind().map_err(|e| RepoError::corrupt(object(), e))?;
    if kind != SnapshotKind::Volume {
        return Err(RepoError::WrongSnapshotKind {
            snapshot: id.to_string(),
            found: kind,
            expected: SnapshotKind::Volume,
        });
    }
    // The restore keeps the snapshot's list of the chunks (36 bytes each) and places a window
    // of them at a time (two at once: one written, the next planned); the rest of the decoded
    // snapshot is dropped.
    let VolumeContent { content, gaps } =
        VolumeContent::from_snapshot(snapshot).map_err(|e| RepoError::corrupt(object(), e))?;
    let size = content.size;
    let index = repo.refresh_index(cancel).await?;
    let threads = super::threads(options.threads);
    // Every chunk found in the index before the target is touched; the first window planned.
    let content = Arc::new(content);
    let first = {
        let (content, index) = (Arc::clone(&content), Arc::clone(&index));
        tokio::task::spawn_blocking(move || -> RepoResult<(Work, PlacedCursor)> {
            if content.chunks.len() > window {
                check_all(&content, &index, window)?;
            }
            let mut cursor = PlacedCursor::default();
            let chunks = content.placed_next(&mut cursor, window);
            Ok((plan(chunks, gaps, &index, threads)?, cursor))
        })
        .await
        .map_err(|e| RepoError::Internal { what: "volume restore plan", reason: e.to_string() })??
    };
    if cancel.is_cancelled() {
        return Err(RepoError::Cancelled);
    }
    let target = place.path();
    let (volume, created, zeroed) = open_target(place, size, options.target_zeroed)?;
    let target_size = volume.size.max(size);
    let stop = cancel.child_token();
    let shared = Arc::new(Shared {
        repo: repo.clone(),
        handle: tokio::runtime::Handle::current(),
        stop,
        target: volume,
        path: target.to_path_buf(),
        zeroed,
        progress: Counters::default(),
        failure: Mutex::new(None),
    });
    shared.progress.bytes_total.store(size, Ordering::Relaxed);
    let ticker = {
        let shared = Arc::clone(&shared);
        Ticker::start(progress.clone(), move || shared.progress.snapshot(0, false))
    };
    let ran = {
        let shared = Arc::clone(&shared);
        tokio::task::spawn_blocking(move || {
            write_windows(&shared, &content, &index, first, (window, threads))
        })
        .await
        .map_err(|e| RepoError::Internal { what: "volume writers", reason: e.to_string() })
    };
    drop(ticker);
    if cancel.is_cancelled() {
        return Err(RepoError::Cancelled);
    }
    if let Some(e) = shared.failure.lock().ok().and_then(|mut f| f.take()) {
        return Err(e);
    }
    ran??;
    if let Some(f) = &progress {
        f(&shared.progress.snapshot(0, true));
    }
    Ok(VolumeRestoreSummary {
        size,
        target_size,
        bytes_written: shared.progress.bytes_read.load(Ordering::Relaxed),
        bytes_zero: shared.progress.bytes_skipped.load(Ordering::Relaxed),
        bytes_direct: shared.target.direct.as_ref().map_or(0, Direct::bytes_written),
        created,
        duration: started.elapsed(),
    })
}

/// Writes the planned window `first` and then every later one (from its cursor), each of
/// `window` chunks, with `threads` writers, the next window planned while one is written; a
/// flusher thread syncs the target (fdatasync) each [`FLUSH_BYTES`] written meanwhile,
/// and the target is flushed (fsync) last. (Onto a block device taking direct writes, bytes
/// count as written once a writer staged them for the I/O threads, and the flusher's syncs
/// have only the device's write cache to flush.)
///
/// The flusher's syncs wait for the disk, which starting the writeback (`sync_file_range`, as
/// the restore did before) does not: an image file on a loop device (the CSI hostpath driver's
/// block volumes, the benchmarks' targets) is cached again in the loop's backing file, whose
/// pages only a sync writes before the kernel's 30 s expiry; so the final fsync wrote about
/// all of a 2 GiB volume's data (0.48 s of a 2.9 s restore over 20 ms / 1000 Mbit/s).
fn write_windows(
    shared: &Shared,
    content: &FileContent,
    index: &MemIndex,
    first: (Work, PlacedCursor),
    (window, threads): (usize, usize),
) -> RepoResult<()> {
    // The flusher ends once `running` is dropped: after the last window, or on a failure.
    let (running, running_rx) = crossbeam_channel::bounded::<()>(0);
    let fail = |e| shared.fail(e);
    std::thread::scope(|scope| {
        flusher::start(scope, &shared.path, &fail, || {
            let sync =
                || {
                    shared.target.file.sync_data().map_err(|e| {
                        RepoError::io("flush (fdatasync) restore target", &shared.path, e)
                    })
                };
            let (written, stop) = (&shared.progress.bytes_read, &shared.stop);
            flusher::flush_while_running(written, FLUSH_BYTES, &running_rx, stop, sync)
        });
        let written = write_each_window(shared, content, index, first, (window, threads));
        drop(running);
        written
    })?;
    // A flush that failed after the last window: its error is the restore's.
    if shared.stop.is_cancelled() {
        return Err(RepoError::Cancelled);
    }
    shared
        .target
        .file
        .sync_all()
        .map_err(|e| RepoError::io("flush (fsync) restore target", &shared.path, e))
}

/// The windows of [`write_windows`], in turn.
fn write_each_window(
    shared: &Shared,
    content: &FileContent,
    index: &MemIndex,
    (mut work, mut cursor): (Work, PlacedCursor),
    (window, threads): (usize, usize),
) -> RepoResult<()> {
    loop {
        let (ran, next) = std::thread::scope(|scope| {
            let next = scope.spawn(|| {
                let chunks = content.placed_next(&mut cursor, window);
                let more = !chunks.is_empty();
                more.then(|| plan(chunks, Vec::new(), index, threads)).transpose()
            });
            (run_writers(shared, &work, threads), next.join())
        });
        ran?;
        let next = next.map_err(|_| RepoError::Internal {
            what: "volume restore plan",
            reason: "panicked".into(),
        })??;
        match next {
            Some(next) => work = next,
            None => return Ok(()),
        }
    }
}

/// Opens or creates the target; returns it with whether it was created and whether it reads
/// as zeros everywhere a gap is.
fn open_target(place: Place<'_>, size: u64, zeroed: bool) -> RepoResult<(Volume, bool, bool)> {
    let path = place.path();
    let is_dir = |mode: u32| mode & libc::S_IFMT == libc::S_IFDIR;
    let existing = match place {
        Place::Path(path) => std::fs::metadata(path).map(|m| is_dir(m.mode())),
        Place::Opened { fd, .. } => {
            nix::sys::stat::fstat(fd).map(|st| is_dir(st.st_mode)).map_err(Into::into)
        }
    };
    match existing {
        Err(e) if e.kind() == std::io::ErrorKind::NotFound && matches!(place, Place::Path(_)) => {
            let mut v = Volume::create_image(path)?;
            v.file.set_len(size).map_err(|e| RepoError::io("size image file", path, e))?;
            v.size = size;
            Ok((v, true, true))
        }
        Err(e) => Err(RepoError::io("stat restore target", path, e)),
        Ok(true) => Err(RepoError::InvalidInput {
            what: "volume restore target",
            reason: format!(
                "{} is a directory; a volume restores onto a block device or an image file",
                path.display()
            ),
        }),
        Ok(false) => {
            let mut v = Volume::open_target(place)?;
            if v.size >= size {
                return Ok((v, false, zeroed));
            }
            if v.kind == DeviceKind::Block {
                return Err(RepoError::TargetTooSmall {
                    target: path.to_path_buf(),
                    target_size: v.size,
                    volume_size: size,
                });
            }
            let was_empty = v.size == 0;
            v.file.set_len(size).map_err(|e| RepoError::io("extend image file", path, e))?;
            v.size = size;
            Ok((v, false, zeroed || was_empty))
        }
    }
}

/// Finds every chunk of a window in the index and groups them into pack reads (each stored
/// byte read at most once), and the reads and gaps into units for `threads` writers, the gap
/// units spread among the read units (progress then moves as the device is covered).
fn plan(
    chunks: Vec<(u64, ChunkRef)>,
    gaps: Vec<(u64, u64)>,
    index: &MemIndex,
    threads: usize,
) -> RepoResult<Work> {
    // Cannot happen (a snapshot's 512 MiB limit bounds a volume to about 15 M chunks), but a
    // chunk's and a pack's numbers must fit their 32 bits.
    let too_many = || RepoError::InvalidInput {
        what: "volume snapshot",
        reason: format!("{} chunks in a window; at most 2^32", chunks.len()),
    };
    let mut wants = Vec::with_capacity(chunks.len());
    let mut packs = Vec::new();
    let mut numbers = std::collections::HashMap::new();
    let mut raw_total = 0u64;
    for (n, (offset, chunk)) in chunks.iter().enumerate() {
        let loc = locate(index, *offset, chunk)?;
        raw_total += u64::from(chunk.len);
        let pack = match numbers.entry(loc.pack) {
            std::collections::hash_map::Entry::Occupied(e) => *e.get(),
            std::collections::hash_map::Entry::Vacant(e) => {
                let number = u32::try_from(packs.len()).map_err(|_| too_many())?;
                packs.push(loc.pack);
                *e.insert(number)
            }
        };
        wants.push(Want {
            chunk: u32::try_from(n).map_err(|_| too_many())?,
            pack,
            offset: loc.offset,
            length: loc.length,
            raw_length: loc.raw_length,
            kind: loc.kind,
        });
    }
    drop(numbers);
    // Keys are unique (a chunk is one device offset); packs in the order the volume first
    // reaches them.
    wants.sort_unstable_by_key(|w| (w.pack, w.offset, w.chunk));
    let reads =
        pack_reads::plan(&wants, pack_reads::MERGE_GAP, pack_reads::VOLUME_MAX_READ, |w| {
            w.span(&packs)
        })?;
    // Units small enough that every writer gets several, where reads are smaller than a unit
    // (a read is never split: a unit of a compressible volume's reads is often one read).
    let per_unit = UNIT_BYTES.min(raw_total / (4 * threads.max(1) as u64)).max(1 << 20);
    let mut read_units = Vec::new();
    let (mut from, mut bytes) = (0, 0);
    for (i, read) in reads.iter().enumerate() {
        let raw: u64 = wants[read.wants.clone()]
            .iter()
            .map(|w| u64::from(chunks[w.chunk as usize].1.len))
            .sum();
        bytes += raw.max(read.len);
        if bytes >= per_unit {
            read_units.push(Unit::Reads(from..i + 1));
            (from, bytes) = (i + 1, 0);
        }
    }
    if from < reads.len() {
        read_units.push(Unit::Reads(from..reads.len()));
    }
    let mut gap_units = Vec::new();
    let (mut from, mut bytes) = (0, 0);
    for (i, (_, len)) in gaps.iter().enumerate() {
        bytes += (*len).min(UNIT_BYTES);
        if bytes >= UNIT_BYTES {
            gap_units.push(Unit::Gaps(from..i + 1));
            (from, bytes) = (i + 1, 0);
        }
    }
    if from < gaps.len() {
        gap_units.push(Unit::Gaps(from..gaps.len()));
    }
    let units = interleave(read_units, gap_units);
    Ok(Work { chunks, gaps, packs, wants, reads, units, next: AtomicUsize::new(0) })
}

/// Where the index places the data chunk `chunk` (at `offset` on the volume).
///
/// # Errors
/// [`RepoError::MissingBlob`]; [`RepoError::Corrupt`] when the index holds it as another kind.
fn locate(index: &MemIndex, offset: u64, chunk: &ChunkRef) -> RepoResult<BlobLocation> {
    let loc = index.lookup(&chunk.id).ok_or_else(|| RepoError::MissingBlob {
        id: chunk.id,
        referrer: format!("volume offset {offset}"),
    })?;
    if !loc.kind.is_data() {
        return Err(RepoError::corrupt(
            format!("{} {} referenced as volume data", loc.kind, chunk.id),
            FormatError::WrongKind { expected: ObjectKind::DataBlob, found: loc.kind },
        ));
    }
    Ok(loc)
}

/// Finds every chunk of `content` in the index, `window` at a time, as [`plan`] does for
/// one window: a restore planned a window at a time fails on a missing chunk before it
/// touches the target, as one planned whole does.
fn check_all(content: &FileContent, index: &MemIndex, window: usize) -> RepoResult<()> {
    let mut cursor = PlacedCursor::default();
    loop {
        let chunks = content.placed_next(&mut cursor, window);
        if chunks.is_empty() {
            return Ok(());
        }
        for (offset, chunk) in &chunks {
            locate(index, *offset, chunk)?;
        }
    }
}

/// `a` and `b` merged, each one's items spread evenly among the other's.
fn interleave<T>(a: Vec<T>, b: Vec<T>) -> Vec<T> {
    let (na, nb) = (a.len(), b.len());
    let mut out = Vec::with_capacity(na + nb);
    let (mut a, mut b) = (a.into_iter().peekable(), b.into_iter().peekable());
    let (mut ta, mut tb) = (0usize, 0usize);
    while a.peek().is_some() || b.peek().is_some() {
        // Take from `a` while it is behind its share of what was taken.
        let from_a = b.peek().is_none() || (a.peek().is_some() && ta * nb <= tb * na);
        let next = if from_a { a.next() } else { b.next() };
        if let Some(item) = next {
            out.push(item);
        }
        if from_a {
            ta += 1;
        } else {
            tb += 1;
        }
    }
    out
}

/// Writes one window's `work` with `threads` writers (see [`writer`]); onto a block device
/// that takes direct writes, with as many I/O threads making them behind the writers (see
/// [`crate::volume::direct`]), all joined before this returns.
fn run_writers(shared: &Shared, work: &Work, threads: usize) -> RepoResult<()> {
    let threads = threads.max(1);
    std::thread::scope(|scope| {
        let (mut io, mut stagers) = (Vec::new(), Vec::new());
        if let Some(direct) = &shared.target.direct {
            // Two buffers a writer: one it fills while the other is written.
            let behind = WriteBehind::new(2 * threads);
            for _ in 0..threads {
                let end = behind.io_end();
                io.push(scope.spawn(move || {
                    let stopped = || shared.stop.is_cancelled();
                    let fail = |at: u64, e: std::io::Error| {
                        tracing::warn!(offset = at, error = %e, "a write to the restore target failed");
                        shared.fail(RepoError::io("write", &shared.path, e));
                    };
                    end.run(direct, &shared.target.file, stopped, fail);
                }));
                stagers.push(behind.stager(direct, &shared.target.file));
            }
            // The I/O threads end once every writer's stager is dropped too.
            drop(behind);
        }
        let mut stagers = stagers.into_iter();
        let workers: Vec<_> = (0..threads)
            .map(|_| {
                let stager = stagers.next();
                scope.spawn(move || {
                    if let Err(e) = writer(shared, work, stager) {
                        shared.fail(e);
                    }
                })
            })
            .collect();
        for w in workers.into_iter().chain(io) {
            if w.join().is_err() {
                shared
                    .fail(RepoError::Internal { what: "volume writer", reason: "panicked".into() });
            }
        }
    });
    if shared.stop.is_cancelled() {
        return Err(RepoError::Cancelled);
    }
    Ok(())
}

/// One writer: takes units in turn until none is left, zeroing gap units and fetching and
/// writing the pack reads of read units. Once every read of its unit is started and the
/// fetcher's bounds have room for another, it takes its next unit (zeroing gap units on the
/// way) and starts that one's reads while it writes the current one's: its link does not go
/// idle for a round trip between units (within a window: the writers end with each window).
/// The next unit is taken only when a read of up to [`pack_reads::VOLUME_MAX_READ`] could
/// start, so a unit taken ahead most often has its first read in flight at once instead of
/// waiting behind the current one's.
fn writer(shared: &Shared, work: &Work, mut stager: Option<Stager<'_>>) -> RepoResult<()> {
    let zeros = vec![0u8; 1 << 20];
    // The next unit of reads, or None once none is left.
    let take_reads = || -> RepoResult<Option<Range<usize>>> {
        loop {
            let i = work.next.fetch_add(1, Ordering::Relaxed);
            match work.units.get(i) {
                None => return Ok(None),
                Some(Unit::Gaps(gaps)) => zero_gaps(shared, work, gaps.clone(), &zeros)?,
                Some(Unit::Reads(reads)) => return Ok(Some(reads.clone())),
            }
        }
    };
    let mut fetcher = shared.repo.fetcher(&shared.handle, &shared.stop);
    let mut ahead: Option<(Range<usize>, Queue)> = None;
    loop {
        if shared.stop.is_cancelled() {
            return Err(RepoError::Cancelled);
        }
        let (range, mut queue) = match ahead.take() {
            Some(next) => next,
            None => match take_reads()? {
                Some(range) => (range, Queue::default()),
                None => break,
            },
        };
        let mut last = false;
        let take_ahead = |fetcher: &mut Fetcher<'_>| {
            if ahead.is_none() && !last && fetcher.has_room(pack_reads::VOLUME_MAX_READ) {
                match take_reads()? {
                    Some(range) => ahead = Some((range, Queue::default())),
                    None => last = true,
                }
            }
            if let Some((range, queue)) = &mut ahead {
                fetcher.start(&work.reads[range.clone()], queue);
            }
            Ok(())
        };
        let each =
            |read: &PackRead, bytes: Bytes| write_read(shared, work, read, &bytes, stager.as_mut());
        fetcher.drain(&work.reads[range], &mut queue, each, take_ahead)?;
        if last {
            break;
        }
    }
    // The last batch queued for the I/O threads.
    match stager {
        Some(stager) => stager.finish().map_err(|e| RepoError::io("write", &shared.path, e)),
        None => Ok(()),
    }
}

/// A chunk to write and where its sealed bytes lie: 24 bytes, where a copy of the chunk's id,
/// length and offset with its full location took 96 (the id and offset stay in the window's
/// list, the pack id in the plan's table): a window of [`WINDOW_CHUNKS`] plans in 6 MiB of
/// these, beside its list's 12 MiB.
#[derive(Debug, Clone, Copy)]
struct Want {
    /// The chunk's place in [`Work::chunks`].
    chunk: u32,
    /// Its pack's place in [`Work::packs`].
    pack: u32,
    /// Where the sealed blob (or the frame holding it) lies in the pack, and its plaintext
    /// length, as the index gives them.
    offset: u32,
    length: u32,
    raw_length: u32,
    kind: ObjectKind,
}

impl Want {
    fn span<'a>(&self, packs: &'a [PackId]) -> Span<'a> {
        Span { pack: &packs[self.pack as usize], offset: self.offset, length: self.length }
    }
}

const _: () = assert!(std::mem::size_of::<Want>() == 24);

/// Zeroes the gaps of `range` (not at all on a target that reads as zeros).
fn zero_gaps(shared: &Shared, work: &Work, range: Range<usize>, zeros: &[u8]) -> RepoResult<()> {
    for &(offset, len) in &work.gaps[range] {
        if shared.stop.is_cancelled() {
            return Err(RepoError::Cancelled);
        }
        if !shared.zeroed {
            shared
                .target
                .zero_range(offset, len, zeros)
                .map_err(|e| RepoError::io("zero a range of", &shared.path, e))?;
        }
        shared.progress.bytes_skipped.fetch_add(len, Ordering::Relaxed);
        shared.progress.bytes_done.fetch_add(len, Ordering::Relaxed);
    }
    Ok(())
}

/// Opens the chunks of one pack read and writes each where it goes.
fn write_read(
    shared: &Shared,
    work: &Work,
    read: &PackRead,
    bytes: &[u8],
    mut stager: Option<&mut Stager<'_>>,
) -> RepoResult<()> {
    let mut opener = BlobOpener::default();
    for w in &work.wants[read.wants.clone()] {
        let (offset, chunk) = &work.chunks[w.chunk as usize];
        let object = || format!("data blob {} in pack {}", chunk.id, read.key);
        let span = w.span(&work.packs);
        let sealed = read.sealed(bytes, span)?;
        let (kind, at) = ((w.kind, w.raw_length), (*span.pack, w.offset));
        let raw = opener
            .open(shared.repo.keys(), &chunk.id, kind, at, sealed)
            .map_err(|e| RepoError::corrupt(object(), e))?;
        if raw.len() != chunk.len as usize {
            return Err(RepoError::corrupt(
                object(),
                FormatError::Invalid {
                    what: "blob",
                    reason: "length differs from the volume snapshot".into(),
                },
            ));
        }
        write_chunk(shared, &raw, *offset, stager.as_deref_mut())?;
        // Counted as written (`bytes_read` of the progress): the flusher of
        // `write_windows` syncs the target each `FLUSH_BYTES` of them.
        let len = raw.len() as u64;
        shared.progress.bytes_read.fetch_add(len, Ordering::Relaxed);
        shared.progress.bytes_done.fetch_add(len, Ordering::Relaxed);
    }
    Ok(())
}

/// Writes a chunk (queued for a direct write through `stager` where it can be); on a zeroed
/// target, leaves its all-zero blocks unwritten (holes stay holes).
fn write_chunk(
    shared: &Shared,
    raw: &[u8],
    offset: u64,
    mut stager: Option<&mut Stager<'_>>,
) -> RepoResult<()> {
    let mut write = |data: &[u8], at: u64| {
        use std::os::unix::fs::FileExt;
        let staged = match stager.as_deref_mut() {
            Some(stager) => stager.stage(data, at),
            None => Ok(false),
        };
        match staged {
            Ok(true) => Ok(()),
            Ok(false) => shared.target.file.write_all_at(data, at),
            Err(e) => Err(e),
        }
        .map_err(|e| RepoError::io("write", &shared.path, e))
    };
    if !shared.zeroed {
        return write(raw, offset);
    }
    let mut run: Option<usize> = None;
    for (i, block) in raw.chunks(ZERO_BLOCK).enumerate() {
        let at = i * ZERO_BLOCK;
        match (is_zero(block), run) {
            (false, None) => run = Some(at),
            (true, Some(from)) => {
                write(&raw[from..at], offset + from as u64)?;
                run = None;
            }
            _ => {}
        }
    }
    if let Some(from) = run {
        write(&raw[from..], offset + from as u64)?;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Arc;

    use ferry_store::{MemoryStore, ObjectStore};

    use super::*;
    use crate::format::{BlobId, NodeBody};
    use crate::pack_reads::tests::RangesInFlight;
    use crate::repo::tests::fast_options;
    use crate::volume::{VolumeBackupOptions, backup_volume};

    /// A sparse image of 64 KiB chunks: data at the start, at odd places between holes,
    /// and at the end; returns its path and bytes.
    fn image(dir: &Path) -> (PathBuf, Vec<u8>) {
        let mut bytes = vec![0u8; (40 << 16) + 4096];
        for (n, at) in [0usize, 1, 2, 7, 8, 15, 23, 24, 25, 26, 39].into_iter().enumerate() {
            let start = at << 16;
            for (i, b) in bytes[start..start + (40 << 10)].iter_mut().enumerate() {
                *b = (i * 7 + n * 13) as u8 | 1;
            }
        }
        let len = bytes.len();
        bytes[len - 100..].fill(0xa5);
        let path = dir.join("source.img");
        std::fs::write(&path, &bytes).unwrap();
        (path, bytes)
    }

    async fn restore(
        repo: &Repository,
        id: &SnapshotId,
        target: &Path,
        window: usize,
    ) -> RepoResult<VolumeRestoreSummary> {
        let (options, cancel) = (VolumeRestoreOptions::default(), CancellationToken::new());
        let snapshot = repo.load_snapshot(id, &cancel).await?;
        let place = Place::Path(target);
        restore_volume_leased(repo, (id, snapshot), place, &options, None, window, &cancel).await
    }

    /// What a restore wrote and zeroed, without its timing.
    fn counts(s: &VolumeRestoreSummary) -> (u64, u64, u64, bool) {
        (s.size, s.bytes_written, s.bytes_zero, s.created)
    }

    /// A volume restored a few chunks at a time is the volume, whatever the window; a chunk
    /// missing from the index in the last window fails the restore before the target is made.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_volume_restores_whole_a_window_at_a_time() -> RepoResult<()> {
        let cancel = CancellationToken::new();
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let (repo, _) = Repository::init(store, b"pw", &fast_options(), &cancel).await?;
        let dir = tempfile::tempdir().unwrap();
        let (source, bytes) = image(dir.path());
        let options = VolumeBackupOptions { chunk_size: 64 << 10, ..Default::default() };
        let backup = backup_volume(&repo, &source, &options, None, &cancel).await?;
        let id = backup.snapshot_id;
        let snapshot = repo.load_snapshot(&id, &cancel).await?;
        let NodeBody::Volume { content, .. } = &snapshot.root.body else { panic!("a volume") };
        assert!(content.chunks.len() >= 11, "{} chunks", content.chunks.len());
        let mut summaries = Vec::new();
        for window in [1, 3, 4, usize::MAX] {
            // A new image file (gaps left as holes), and one full of other bytes (gaps zeroed).
            let target = dir.path().join(format!("restored-{window}.img"));
            let fresh = restore(&repo, &id, &target, window).await?;
            let restored = std::fs::read(&target).unwrap();
            assert!(restored == bytes, "window of {window}: the restored volume differs");
            let dirty = dir.path().join(format!("over-{window}.img"));
            std::fs::write(&dirty, vec![0xeeu8; bytes.len()]).unwrap();
            let over = restore(&repo, &id, &dirty, window).await?;
            let restored = std::fs::read(&dirty).unwrap();
            assert!(restored == bytes, "window of {window}: the overwritten volume differs");
            summaries.push((counts(&fresh), counts(&over)));
        }
        assert!(summaries.iter().all(|s| *s == summaries[0]), "{summaries:?}");
        assert_eq!(summaries[0].0.0, bytes.len() as u64);

        // A chunk of the second window of three named by a shorter blob: the restore fails
        // there, as corrupt, and writes nothing of the third window.
        let mut short = snapshot.clone();
        let NodeBody::Volume { content, .. } = &mut short.root.body else { unreachable!() };
        let (last, n) = (*content.chunks.last().unwrap(), content.chunks.len());
        assert!(last.len < content.chunks[4].len && n > 6);
        content.chunks[4].id = last.id;
        let third = content.placed_chunks()[6];
        let short = repo.save_snapshot(&short, &cancel).await?;
        let target = dir.path().join("short.img");
        let result = restore(&repo, &short, &target, 3).await;
        assert!(matches!(result, Err(RepoError::Corrupt { .. })), "{result:?}");
        let restored = std::fs::read(&target).unwrap();
        let at = usize::try_from(third.0).unwrap();
        let chunk = &restored[at..at + third.1.len as usize];
        assert!(chunk.iter().all(|b| *b == 0), "the third window was written");
        assert!(bytes[at..at + third.1.len as usize].iter().any(|b| *b != 0));

        // The last chunk named by a blob the repository does not hold.
        let mut broken = snapshot.clone();
        let NodeBody::Volume { content, .. } = &mut broken.root.body else { unreachable!() };
        content.chunks.last_mut().unwrap().id = BlobId([7; 32]);
        let broken = repo.save_snapshot(&broken, &cancel).await?;
        for window in [3, usize::MAX] {
            let target = dir.path().join(format!("never-{window}.img"));
            let result = restore(&repo, &broken, &target, window).await;
            assert!(matches!(result, Err(RepoError::MissingBlob { .. })), "{result:?}");
            assert!(!target.exists(), "window of {window}: the target was made");
        }
        Ok(())
    }

    /// One writer over several units of reads takes each next one while it writes the one
    /// before: more reads are in flight at once than any unit has, and the volume (12 runs of
    /// 1 MiB of incompressible data between holes) restores whole over a target full of other
    /// bytes. With the pack of its last chunk gone, a pack read only a later unit makes, the
    /// restore fails naming that pack.
    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn one_writer_takes_its_units_ahead_and_a_read_taken_ahead_fails_it() -> RepoResult<()> {
        let cancel = CancellationToken::new();
        let memory: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let (repo, _) =
            Repository::init(Arc::clone(&memory), b"pw", &fast_options(), &cancel).await?;
        let dir = tempfile::tempdir().unwrap();
        let (run, hole) = (1usize << 20, 256usize << 10);
        let mut bytes = vec![0u8; 12 * (run + hole)];
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        for n in 0..12 {
            for b in &mut bytes[n * (run + hole)..n * (run + hole) + run] {
                x ^= x << 13;
                x ^= x >> 7;
                x ^= x << 17;
                *b = x as u8;
            }
        }
        let source = dir.path().join("source.img");
        std::fs::write(&source, &bytes).unwrap();
        // One reader: the packs hold the volume in order, whatever the machine.
        let options =
            VolumeBackupOptions { chunk_size: 64 << 10, threads: 1, ..Default::default() };
        let id = backup_volume(&repo, &source, &options, None, &cancel).await?.snapshot_id;

        // The plan one writer follows: several units of reads.
        let snapshot = repo.load_snapshot(&id, &cancel).await?;
        let NodeBody::Volume { content, .. } = &snapshot.root.body else { panic!("a volume") };
        let chunks = content.placed_chunks();
        let index = repo.refresh_index(&cancel).await?;
        let work = plan(chunks.clone(), Vec::new(), &index, 1)?;
        let units: Vec<Range<usize>> = work
            .units
            .iter()
            .filter_map(|u| match u {
                Unit::Reads(r) => Some(r.clone()),
                Unit::Gaps(_) => None,
            })
            .collect();
        assert!(units.len() >= 3, "{} units of reads", units.len());
        let widest = units.iter().map(ExactSizeIterator::len).max().unwrap();

        let overlap = Arc::new(ferry_store::Hooked::new(memory.clone(), RangesInFlight::default()));
        let hooked = Repository::open(overlap.clone(), b"pw", &cancel).await?;
        let one = VolumeRestoreOptions { threads: 1, ..Default::default() };
        let target = dir.path().join("over.img");
        std::fs::write(&target, vec![0xeeu8; bytes.len()]).unwrap();
        let (place, snap) = (Place::Path(&target), snapshot.clone());
        restore_volume_leased(&hooked, (&id, snap), place, &one, None, WINDOW_CHUNKS, &cancel)
            .await?;
        assert!(std::fs::read(&target).unwrap() == bytes, "the restored volume differs");
        let most = overlap.hook().most.load(Ordering::SeqCst);
        assert!(most > widest, "{most} reads at once, a unit has up to {widest}");

        // The last chunk's pack is read in later units than the first only.
        let last = index.lookup(&chunks.last().unwrap().1.id).unwrap();
        let key = crate::repo::layout::pack(&last.pack)?;
        let reading: Vec<usize> = (0..units.len())
            .filter(|n| work.reads[units[*n].clone()].iter().any(|read| read.key == key))
            .collect();
        assert!(!reading.is_empty() && !reading.contains(&0), "read by units {reading:?}");
        memory.delete(&key, &cancel).await.unwrap();
        let target = dir.path().join("broken.img");
        let place = Place::Path(&target);
        let result = restore_volume_leased(
            &repo,
            (&id, snapshot),
            place,
            &one,
            None,
            WINDOW_CHUNKS,
            &cancel,
        )
        .await;
        assert!(
            matches!(&result, Err(RepoError::Store { key: k, .. }) if *k == key.to_string()),
            "{result:?}"
        );
        Ok(())
    }

    #[test]
    fn interleaving_spreads_the_fewer_among_the_more() {
        let mixed = interleave(vec!['r'; 6], vec!['g'; 2]);
        assert_eq!(mixed.iter().collect::<String>(), "rgrrrgrr");
        assert_eq!(interleave(vec![1, 2], Vec::new()), [1, 2]);
        assert_eq!(interleave(Vec::new(), vec![3]), [3]);
        let even = interleave(vec![0; 5], vec![1; 5]);
        assert_eq!(even, [0, 1, 0, 1, 0, 1, 0, 1, 0, 1]);
    }
}
