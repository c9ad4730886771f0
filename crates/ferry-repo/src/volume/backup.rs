//! Volume backup: reader threads take segments of the device in turn, skip what SEEK_HOLE
//! says is unallocated and chunks that are all zeros, hash the rest in fixed-size aligned
//! chunks and store the new ones.
//!
//! ```text
//! next segment (atomic counter) --> N readers (pread, zero test, hash, compress, encrypt,
//!                                   pack) --packs--> uploader; chunk ids --> slot table
//! ```
//! Reading every chunk, a reader asks the kernel to read its whole segment, and the one a
//! reader will take next, in the background (`POSIX_FADV_WILLNEED`), so the device streams
//! while the readers compute. When a plan names the chunks to read, the readers take their
//! segments through `ahead.rs`, which asks for the next planned chunks across segments.
//! A finished segment is dropped from the page cache.
//! Memory: one chunk buffer, two sealing buffers and one frame (about 1 MiB, with about 2 MiB
//! to compress and seal it) per reader, the shared open packs, the
//! packs being uploaded (their buffers kept for the next packs), and one 33-byte slot per
//! chunk of the device.

use crate::gc::{Lease, LeaseCheck, WRITER_LEASES};
use std::path::Path;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{
    BlobId, ChunkRef, Extent, FileContent, Metadata, Node, NodeBody, ObjectKind, Snapshot,
    SnapshotKind, Summary, Timestamp,
};
use crate::place::Place;
use crate::progress::{Counters, ProgressFn, Ticker};
use crate::repo::claims::Claims;
use crate::repo::writer::{LocalPacker, PackSink, Uploader, WriteStats, upload_cause};
use crate::repo::{Repository, hostname};
use crate::volume::ahead::Ahead;
use crate::volume::device::{Volume, is_zero};
use crate::volume::{ReadPlan, VolumeBackupOptions, VolumeBackupSummary, VolumeMap};

/// Chunks handed to a reader at a time.
const SEGMENT_CHUNKS: u64 = 64;

/// Most bytes the readers ask the kernel to read ahead of them at once when they read every
/// chunk: page cache that counts against the pod's memory, and may be evicted unread if it is
/// too much.
const READ_AHEAD_BUDGET: u64 = 256 << 20;

/// How many bytes of the chunks a plan names the readers ask the kernel for, counted from the
/// start of the newest segment taken, across segments (see `ahead.rs`).
const PLANNED_AHEAD: u64 = 64 << 20;

struct Shared {
    repo: Repository,
    claims: Claims,
    progress: Counters,
    stop: CancellationToken,
    failure: Mutex<Option<RepoError>>,
    volume: Volume,
    path: std::path::PathBuf,
    chunk_size: u64,
    next_segment: AtomicU64,
    /// Segments between the one a reader takes and the one it prefetches: about the number
    /// of readers, so each prefetch lands just before some reader needs it. `None` when the
    /// readers' segments alone fill the read-ahead budget.
    lookahead: Option<u64>,
    /// How much of its own segment a reader asks the kernel to read ahead (reading every
    /// chunk).
    prefetch_len: u64,
    /// When the plan names the chunks to read: the segment counter (instead of
    /// `next_segment`) and the read-ahead across segments.
    ahead: Option<Ahead>,
    /// The chunk id at each chunk index (`None`: unallocated or all zeros).
    slots: Mutex<Vec<Option<BlobId>>>,
    /// Which chunks are read ([`crate::ReadPlan`]); the others keep their starting slot.
    plan: super::plan::Plan,
    /// Whether a chunk left unread is a gap (the plan named the allocated ranges) rather than
    /// the parent's chunk.
    unread_is_gap: bool,
}

impl Shared {
    fn claim(&self, id: BlobId) -> bool {
        self.claims.claim(id)
    }

    fn fail(&self, e: RepoError) {
        if !matches!(e, RepoError::Cancelled)
            && let Ok(mut f) = self.failure.lock()
        {
            f.get_or_insert(e);
        }
        self.stop.cancel();
    }

    fn chunks(&self) -> u64 {
        self.volume.size.div_ceil(self.chunk_size)
    }
}

fn now() -> Timestamp {
    let d = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap_or_default();
    Timestamp { sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nsec: d.subsec_nanos() }
}

fn check_chunk_size(size: u32) -> RepoResult<u64> {
    if size.is_power_of_two() && (4096..=super::map::MAX_VOLUME_CHUNK).contains(&size) {
        Ok(u64::from(size))
    } else {
        Err(RepoError::InvalidInput {
            what: "volume chunk size",
            reason: format!("{size} is not a power of two between 4 KiB and 16 MiB"),
        })
    }
}

/// Backs up the block device or volume image at `path` into `repo` as a volume snapshot.
///
/// The volume is read in fixed-size chunks aligned to its start, by several threads at once.
/// Ranges a regular image file reports as holes are not read; chunks that read as all zeros
/// are not stored (both are recorded as gaps and restored as zeros). Chunks already in the
/// repository (from the parent, another volume, or anything else) are not stored again.
///
/// # Errors
/// [`RepoError::InvalidInput`] when `path` is neither a block device nor a regular file, the
/// chunk size is invalid, or the parent is not a volume snapshot; [`RepoError::Io`] when the
/// volume cannot be read (a volume backup has no partial result); storage failures;
/// [`RepoError::Cancelled`] when `cancel` fires.
pub async fn backup_volume(
    repo: &Repository,
    path: &Path,
    options: &VolumeBackupOptions,
    progress: Option<ProgressFn>,
    cancel: &CancellationToken,
) -> RepoResult<VolumeBackupSummary> {
    backup_volume_at(repo, Place::Path(path), options, progress, cancel).await
}

/// [`backup_volume`] of a device or image given by path or already opened (see [`Place`]).
///
/// # Errors
/// As [`backup_volume`].
pub async fn backup_volume_at(
    repo: &Repository,
    source: Place<'_>,
    options: &VolumeBackupOptions,
    progress: Option<ProgressFn>,
    cancel: &CancellationToken,
) -> RepoResult<VolumeBackupSummary> {
    let volume = Volume::open_source(source)?;
    let lease =
        Lease::acquire(repo, WRITER_LEASES, "volume backup", repo.lease_ttl(), cancel).await?;
    let result = backup_volume_leased(
        repo,
        (volume, source.path()),
        options,
        progress,
        &lease.checker(),
        cancel,
    )
    .await;
    lease.release().await;
    result
}

async fn backup_volume_leased(
    repo: &Repository,
    (volume, path): (Volume, &Path),
    options: &VolumeBackupOptions,
    progress: Option<ProgressFn>,
    lease: &LeaseCheck,
    cancel: &CancellationToken,
) -> RepoResult<VolumeBackupSummary> {
    let started = Instant::now();
    let time = now();
    let chunk_size = check_chunk_size(options.chunk_size)?;
    let meta = metadata(&volume.file);
    let index = repo.refresh_index(cancel).await?;
    let mut parent_map = None;
    if let Some(id) = &options.parent {
        let parent = repo.load_snapshot(id, cancel).await?;
        let kind = parent.kind().map_err(|e| RepoError::corrupt(format!("snapshot {id}"), e))?;
        if kind != SnapshotKind::Volume {
            return Err(RepoError::InvalidInput {
                what: "parent snapshot",
                reason: format!("{id} is a {kind} snapshot, not a volume snapshot"),
            });
        }
        if matches!(options.read_plan, ReadPlan::ChangedSinceParent(_)) {
            let map = VolumeMap::from_snapshot(&parent)
                .map_err(|e| RepoError::corrupt(format!("snapshot {id}"), e))?;
            parent_map = Some(map);
        }
    }
    if let Some(described) = options.plan_size
        && described != volume.size
        && options.read_plan != ReadPlan::Everything
    {
        return Err(RepoError::InvalidInput {
            what: "read plan",
            reason: format!(
                "its ranges describe a volume of {described} bytes; this one is {} bytes",
                volume.size
            ),
        });
    }
    let mut plan =
        super::plan::plan(&options.read_plan, volume.size, chunk_size, parent_map.as_ref())
            .map_err(|reason| RepoError::InvalidInput { what: "read plan", reason })?;
    if matches!(options.read_plan, ReadPlan::ChangedSinceParent(_)) {
        let bytes = options
            .verify_unchanged
            .unwrap_or_else(|| super::default_delta_check(volume.size, options.chunk_size));
        let count = usize::try_from(bytes.div_ceil(chunk_size)).unwrap_or(usize::MAX);
        super::plan::sample_unchanged(&mut plan, count, rand::random::<u32>() as usize);
    }
    // A chunk taken from the parent unread must still be stored: the snapshot would otherwise
    // name data the repository does not hold.
    if let Some(missing) = plan.slots.iter().flatten().find(|id| !index.contains(id)) {
        return Err(RepoError::InvalidInput {
            what: "parent snapshot",
            reason: format!(
                "its chunk {missing} is not in the repository's index (run `ferry check`); back up without the parent's ranges"
            ),
        });
    }
    let stop = cancel.child_token();
    let (sink, uploader) =
        Uploader::start_leased(repo, Arc::clone(&index), Some(lease.clone()), &stop);
    let threads = super::threads(options.threads);
    let shared = Arc::new(Shared {
        repo: repo.clone(),
        claims: Claims::new(index),
        progress: Counters::default(),
        stop: stop.clone(),
        failure: Mutex::new(None),
        chunk_size,
        next_segment: AtomicU64::new(0),
        // Reading ahead of the readers only pays when they read every chunk.
        lookahead: (plan.read.is_none()
            && threads as u64 * SEGMENT_CHUNKS * chunk_size <= READ_AHEAD_BUDGET)
            .then_some(threads as u64),
        prefetch_len: (READ_AHEAD_BUDGET / threads.max(1) as u64).min(SEGMENT_CHUNKS * chunk_size),
        ahead: plan
            .read
            .is_some()
            .then(|| Ahead::new(PLANNED_AHEAD, chunk_size, SEGMENT_CHUNKS, volume.size)),
        slots: Mutex::new(std::mem::take(&mut plan.slots)),
        unread_is_gap: matches!(options.read_plan, ReadPlan::Only(_)),
        plan,
        volume,
        path: path.to_path_buf(),
    });
    let size = shared.volume.size;
    shared.progress.bytes_total.store(size, Ordering::Relaxed);
    let ticker = {
        let shared = Arc::clone(&shared);
        Ticker::start(progress.clone(), move || shared.progress.snapshot(size, false))
    };
    let level = options.compression_level;
    let ran = {
        let shared = Arc::clone(&shared);
        tokio::task::spawn_blocking(move || run_readers(&shared, &sink, threads, level))
            .await
            .map_err(|e| RepoError::Internal { what: "volume readers", reason: e.to_string() })
    };
    let stored = Arc::clone(&uploader.stats);
    let uploaded = uploader.finish().await;
    drop(ticker);
    if cancel.is_cancelled() {
        return Err(RepoError::Cancelled);
    }
    let ran = match shared.failure.lock().ok().and_then(|mut f| f.take()) {
        Some(e) => Err(e),
        None => ran.and_then(|r| r),
    };
    match (ran, uploaded) {
        (Ok(()), Ok(_)) => {}
        (Err(e), uploaded) => return Err(upload_cause(e, uploaded)),
        (Ok(()), Err(e)) => return Err(e),
    }
    let content = content(&shared)?;
    let bytes_new = shared.progress.bytes_new.load(Ordering::Relaxed);
    let bytes_stored = stored.stored_bytes.load(Ordering::Relaxed);
    let summary = Summary {
        bytes_total: size,
        bytes_new,
        bytes_stored,
        duration_ms: u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX),
        ..Summary::default()
    };
    let chunks = content.chunks.len() as u64;
    let data: u64 = content.chunks.iter().map(|c| u64::from(c.len)).sum();
    let snapshot = Snapshot {
        time,
        hostname: options.hostname.clone().unwrap_or_else(hostname),
        source: if options.source.is_empty() {
            path.display().to_string()
        } else {
            options.source.clone()
        },
        paths: vec![path.display().to_string()],
        tags: super::sorted_tags(&options.tags),
        parent: options.parent,
        root: Node {
            name: Vec::new(),
            body: NodeBody::Volume { content, block_size: shared.volume.block_size },
            meta,
            hardlink: None,
            error: None,
        },
        summary,
        program: concat!("ferry ", env!("CARGO_PKG_VERSION")).to_owned(),
    };
    lease.check()?;
    let snapshot_id = repo.save_snapshot(&snapshot, cancel).await?;
    if let Some(f) = &progress {
        f(&shared.progress.snapshot(size, true));
    }
    Ok(VolumeBackupSummary {
        snapshot_id,
        size,
        bytes_data: data,
        bytes_read: shared.progress.bytes_read.load(Ordering::Relaxed),
        bytes_from_parent: shared.plan.from_parent,
        bytes_skipped: size - data,
        bytes_new,
        bytes_stored,
        chunks,
        duration: started.elapsed(),
    })
}

fn metadata(file: &std::fs::File) -> Metadata {
    use std::os::unix::fs::MetadataExt;
    let Ok(m) = file.metadata() else { return Metadata::default() };
    let ts = |sec: i64, nsec: i64| Timestamp { sec, nsec: u32::try_from(nsec).unwrap_or(0) };
    Metadata {
        mode: m.mode() & 0o7777,
        uid: m.uid(),
        gid: m.gid(),
        mtime: ts(m.mtime(), m.mtime_nsec()),
        atime: ts(m.atime(), m.atime_nsec()),
        ctime: ts(m.ctime(), m.ctime_nsec()),
        xattrs: Vec::new(),
    }
}

/// Turns the slot table into extents (runs of stored chunks) and the chunk list.
fn content(shared: &Shared) -> RepoResult<FileContent> {
    let slots = shared.slots.lock().map_err(|_| RepoError::Internal {
        what: "volume backup",
        reason: "slot table lock poisoned".into(),
    })?;
    let size = shared.volume.size;
    let mut extents: Vec<Extent> = Vec::new();
    let mut chunks = Vec::new();
    for (i, slot) in slots.iter().enumerate() {
        let Some(id) = slot else { continue };
        let offset = i as u64 * shared.chunk_size;
        let len = shared.chunk_size.min(size - offset);
        match extents.last_mut() {
            Some(e) if e.offset + e.len == offset => e.len += len,
            _ => extents.push(Extent { offset, len }),
        }
        chunks.push(ChunkRef { id: *id, len: u32::try_from(len).unwrap_or(u32::MAX) });
    }
    Ok(FileContent { size, extents: Some(extents), chunks })
}

fn run_readers(shared: &Shared, sink: &PackSink, threads: usize, level: i32) -> RepoResult<()> {
    let stats = Arc::new(WriteStats::default());
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                let packer = LocalPacker::new(&shared.repo, sink, &stats, level)
                    .framing_below(super::VOLUME_FRAMED_MAX);
                scope.spawn(move || {
                    if let Err(e) = read_segments(shared, packer) {
                        shared.fail(e);
                    }
                })
            })
            .collect();
        for w in workers {
            if w.join().is_err() {
                shared
                    .fail(RepoError::Internal { what: "volume reader", reason: "panicked".into() });
            }
        }
    });
    if shared.stop.is_cancelled() {
        return Err(RepoError::Cancelled);
    }
    sink.flush(&shared.repo)
}

/// Takes segments until none is left.
fn read_segments(shared: &Shared, mut packer: LocalPacker) -> RepoResult<()> {
    let mut buf = vec![0u8; usize::try_from(shared.chunk_size).unwrap_or(0)];
    let (size, chunk) = (shared.volume.size, shared.chunk_size);
    let path = || shared.path.clone();
    loop {
        let (segment, asks) = match &shared.ahead {
            Some(ahead) => ahead.take(&shared.plan),
            None => (shared.next_segment.fetch_add(1, Ordering::Relaxed), Vec::new()),
        };
        for (at, len) in asks {
            shared.volume.prefetch(at, len);
        }
        let first = segment * SEGMENT_CHUNKS;
        if first >= shared.chunks() {
            return packer.finish();
        }
        let last = (first + SEGMENT_CHUNKS).min(shared.chunks());
        let (start, end) = (first * chunk, (last * chunk).min(size));
        let segment_bytes = SEGMENT_CHUNKS * chunk;
        if shared.plan.read.is_some() {
            if !(first..last).any(|i| shared.plan.touches(i)) {
                skip_unread(shared, end - start);
                continue;
            }
        } else {
            shared.volume.prefetch(start, (end - start).min(shared.prefetch_len));
        }
        if let Some(ahead) = shared.lookahead {
            shared.volume.prefetch((segment + ahead) * segment_bytes, segment_bytes);
        }
        let data = shared
            .volume
            .data_ranges(start, end)
            .map_err(|e| RepoError::io("find data ranges (SEEK_DATA)", path(), e))?;
        let mut found = Vec::new();
        for i in first..last {
            if shared.stop.is_cancelled() {
                return Err(RepoError::Cancelled);
            }
            let offset = i * chunk;
            let len = chunk.min(size - offset);
            if !shared.plan.reads(i) {
                if let Some(expected) = shared.plan.verify.get(&i) {
                    check_unchanged(shared, &mut buf, offset, len, *expected)?;
                }
                skip_unread(shared, len);
                continue;
            }
            let allocated = data
                .as_ref()
                .is_none_or(|d| d.iter().any(|&(s, e)| s < offset + len && e > offset));
            let progress = &shared.progress;
            if !allocated {
                progress.bytes_skipped.fetch_add(len, Ordering::Relaxed);
                progress.bytes_done.fetch_add(len, Ordering::Relaxed);
                continue;
            }
            let bytes = &mut buf[..usize::try_from(len).unwrap_or(0)];
            read_exact_at(&shared.volume.file, bytes, offset)
                .map_err(|e| RepoError::io("read volume", path(), e))?;
            progress.bytes_read.fetch_add(len, Ordering::Relaxed);
            if is_zero(bytes) {
                progress.bytes_skipped.fetch_add(len, Ordering::Relaxed);
            } else {
                let id = shared.repo.keys().blob_id(bytes);
                if shared.claim(id) {
                    packer.add(ObjectKind::DataBlob, id, bytes)?;
                    progress.bytes_new.fetch_add(len, Ordering::Relaxed);
                }
                found.push((i, id));
            }
            progress.bytes_done.fetch_add(len, Ordering::Relaxed);
        }
        shared.volume.release(start, end - start);
        let mut slots = shared.slots.lock().map_err(|_| RepoError::Internal {
            what: "volume backup",
            reason: "slot table lock poisoned".into(),
        })?;
        for (i, id) in found {
            if let Some(slot) = slots.get_mut(usize::try_from(i).unwrap_or(usize::MAX)) {
                *slot = Some(id);
            }
        }
    }
}

/// Reads the chunk at `offset`, which the changed ranges say is unchanged, and compares it
/// with what the parent holds there (`expected`; `None`: zeros).
fn check_unchanged(
    shared: &Shared,
    buf: &mut [u8],
    offset: u64,
    len: u64,
    expected: Option<BlobId>,
) -> RepoResult<()> {
    let bytes = &mut buf[..usize::try_from(len).unwrap_or(0)];
    read_exact_at(&shared.volume.file, bytes, offset)
        .map_err(|e| RepoError::io("read volume", shared.path.clone(), e))?;
    shared.progress.bytes_read.fetch_add(len, Ordering::Relaxed);
    let found = (!is_zero(bytes)).then(|| shared.repo.keys().blob_id(bytes));
    if found == expected {
        return Ok(());
    }
    Err(RepoError::InvalidInput {
        what: "read plan",
        reason: format!(
            "the {len} bytes at offset {offset} differ from the parent snapshot's, yet the \
             changed ranges leave them out: the ranges are incomplete"
        ),
    })
}

/// Counts `len` bytes the plan leaves unread as done (and as skipped when they are gaps).
fn skip_unread(shared: &Shared, len: u64) {
    if shared.unread_is_gap {
        shared.progress.bytes_skipped.fetch_add(len, Ordering::Relaxed);
    }
    shared.progress.bytes_done.fetch_add(len, Ordering::Relaxed);
}

fn read_exact_at(file: &std::fs::File, buf: &mut [u8], offset: u64) -> std::io::Result<()> {
    use std::os::unix::fs::FileExt;
    file.read_exact_at(buf, offset).map_err(|e| {
        if e.kind() == std::io::ErrorKind::UnexpectedEof {
            std::io::Error::other("the volume shrank while being read")
        } else {
            e
        }
    })
}
