//! Volume restore: check the target's size, then writer threads take segments of the volume,
//! fetch their chunks with few merged ranged reads, verify each and write it in place; gaps
//! are zeroed (or skipped when the target is known to read as zeros); fsync last.

use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::Instant;

use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{BlobOpener, ChunkRef, FormatError, ObjectKind, SnapshotId, SnapshotKind};
use crate::pack_reads;
use crate::place::Place;
use crate::progress::{Counters, ProgressFn, Ticker};
use crate::repo::{MemIndex, Repository};
use crate::volume::device::{DeviceKind, Volume, is_zero};
use crate::volume::{VolumeMap, VolumeRestoreOptions, VolumeRestoreSummary};

/// Device bytes per segment handed to a writer.
const SEGMENT_BYTES: u64 = 16 << 20;
/// Granularity at which all-zero parts of a chunk are left unwritten on a zeroed target.
const ZERO_BLOCK: usize = 4096;

#[derive(Debug, Default)]
struct Segment {
    chunks: Vec<(u64, ChunkRef)>,
    gaps: Vec<(u64, u64)>,
}

struct Shared {
    repo: Repository,
    index: Arc<MemIndex>,
    handle: tokio::runtime::Handle,
    stop: CancellationToken,
    target: Volume,
    path: PathBuf,
    zeroed: bool,
    progress: Counters,
    failure: Mutex<Option<RepoError>>,
    segments: Vec<Segment>,
    next: AtomicUsize,
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
    let lease = crate::gc::Lease::acquire(
        repo,
        crate::gc::WRITER_LEASES,
        "volume restore",
        repo.lease_ttl(),
        cancel,
    )
    .await?;
    let result = restore_volume_leased(repo, id, target, options, progress, cancel).await;
    lease.release().await;
    result
}

async fn restore_volume_leased(
    repo: &Repository,
    id: &SnapshotId,
    place: Place<'_>,
    options: &VolumeRestoreOptions,
    progress: Option<ProgressFn>,
    cancel: &CancellationToken,
) -> RepoResult<VolumeRestoreSummary> {
    let started = Instant::now();
    let snapshot = repo.load_snapshot(id, cancel).await?;
    let object = || format!("snapshot {id}");
    let kind = snapshot.kind().map_err(|e| RepoError::corrupt(object(), e))?;
    if kind != SnapshotKind::Volume {
        return Err(RepoError::WrongSnapshotKind {
            snapshot: id.to_string(),
            found: kind,
            expected: SnapshotKind::Volume,
        });
    }
    let map = VolumeMap::from_snapshot(&snapshot).map_err(|e| RepoError::corrupt(object(), e))?;
    let index = repo.refresh_index(cancel).await?;
    let target = place.path();
    let (volume, created, zeroed) = open_target(place, map.size, options.target_zeroed)?;
    let target_size = volume.size.max(map.size);
    let stop = cancel.child_token();
    let shared = Arc::new(Shared {
        repo: repo.clone(),
        index,
        handle: tokio::runtime::Handle::current(),
        stop,
        target: volume,
        path: target.to_path_buf(),
        zeroed,
        progress: Counters::default(),
        failure: Mutex::new(None),
        segments: plan(&map),
        next: AtomicUsize::new(0),
    });
    shared.progress.bytes_total.store(map.size, Ordering::Relaxed);
    let ticker = {
        let shared = Arc::clone(&shared);
        Ticker::start(progress.clone(), move || shared.progress.snapshot(0, false))
    };
    let threads = super::threads(options.threads);
    let ran = {
        let shared = Arc::clone(&shared);
        tokio::task::spawn_blocking(move || run_writers(&shared, threads))
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
        size: map.size,
        target_size,
        bytes_written: shared.progress.bytes_read.load(Ordering::Relaxed),
        bytes_zero: shared.progress.bytes_skipped.load(Ordering::Relaxed),
        created,
        duration: started.elapsed(),
    })
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

/// Cuts the volume into segments of about [`SEGMENT_BYTES`] of device range.
fn plan(map: &VolumeMap) -> Vec<Segment> {
    let mut segments = Vec::new();
    let mut current = Segment::default();
    let mut span = 0u64;
    let (mut chunks, mut gaps) = (map.chunks.iter().peekable(), map.gaps.iter().peekable());
    loop {
        let take_chunk = match (chunks.peek(), gaps.peek()) {
            (Some((c, _)), Some((g, _))) => c < g,
            (Some(_), None) => true,
            (None, Some(_)) => false,
            (None, None) => break,
        };
        if take_chunk {
            if let Some(&(offset, c)) = chunks.next() {
                current.chunks.push((offset, c));
                span += u64::from(c.len);
            }
        } else if let Some(&(offset, len)) = gaps.next() {
            current.gaps.push((offset, len));
            span += len.min(SEGMENT_BYTES);
        }
        if span >= SEGMENT_BYTES {
            segments.push(std::mem::take(&mut current));
            span = 0;
        }
    }
    if !current.chunks.is_empty() || !current.gaps.is_empty() {
        segments.push(current);
    }
    segments
}

fn run_writers(shared: &Shared, threads: usize) -> RepoResult<()> {
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..threads.max(1))
            .map(|_| {
                scope.spawn(move || {
                    let zeros = vec![0u8; 1 << 20];
                    loop {
                        let i = shared.next.fetch_add(1, Ordering::Relaxed);
                        let Some(segment) = shared.segments.get(i) else { return };
                        if let Err(e) = write_segment(shared, segment, &zeros) {
                            shared.fail(e);
                            return;
                        }
                    }
                })
            })
            .collect();
        for w in workers {
            if w.join().is_err() {
                shared
                    .fail(RepoError::Internal { what: "volume writer", reason: "panicked".into() });
            }
        }
    });
    if shared.stop.is_cancelled() {
        return Err(RepoError::Cancelled);
    }
    shared
        .target
        .file
        .sync_all()
        .map_err(|e| RepoError::io("flush (fsync) restore target", &shared.path, e))
}

struct Want {
    loc: crate::repo::BlobLocation,
    chunk: ChunkRef,
    offset: u64,
}

fn write_segment(shared: &Shared, segment: &Segment, zeros: &[u8]) -> RepoResult<()> {
    let progress = &shared.progress;
    for &(offset, len) in &segment.gaps {
        if shared.stop.is_cancelled() {
            return Err(RepoError::Cancelled);
        }
        if !shared.zeroed {
            shared
                .target
                .zero_range(offset, len, zeros)
                .map_err(|e| RepoError::io("zero a range of", &shared.path, e))?;
        }
        progress.bytes_skipped.fetch_add(len, Ordering::Relaxed);
        progress.bytes_done.fetch_add(len, Ordering::Relaxed);
    }
    let mut wants = Vec::with_capacity(segment.chunks.len());
    for &(offset, chunk) in &segment.chunks {
        let loc = shared.index.lookup(&chunk.id).ok_or_else(|| RepoError::MissingBlob {
            id: chunk.id,
            referrer: format!("volume offset {offset}"),
        })?;
        if !loc.kind.is_data() {
            return Err(RepoError::corrupt(
                format!("{} {} referenced as volume data", loc.kind, chunk.id),
                FormatError::WrongKind { expected: ObjectKind::DataBlob, found: loc.kind },
            ));
        }
        wants.push(Want { loc, chunk, offset });
    }
    wants.sort_by_key(|w| (w.loc.pack, w.loc.offset, w.chunk.id));
    let reads = pack_reads::plan(&wants, |w| &w.loc)?;
    shared.repo.fetch_packs_in_order(&shared.handle, &reads, &shared.stop, |read, bytes| {
        let mut opener = BlobOpener::default();
        for w in &wants[read.wants.clone()] {
            let object = || format!("data blob {} in pack {}", w.chunk.id, read.key);
            let sealed = read.sealed(&bytes, &w.loc)?;
            let (kind, at) = ((w.loc.kind, w.loc.raw_length), (w.loc.pack, w.loc.offset));
            let raw = opener
                .open(shared.repo.keys(), &w.chunk.id, kind, at, sealed)
                .map_err(|e| RepoError::corrupt(object(), e))?;
            if raw.len() != w.chunk.len as usize {
                return Err(RepoError::corrupt(
                    object(),
                    FormatError::Invalid {
                        what: "blob",
                        reason: "length differs from the volume snapshot".into(),
                    },
                ));
            }
            write_chunk(shared, &raw, w.offset)?;
            progress.bytes_read.fetch_add(raw.len() as u64, Ordering::Relaxed);
            progress.bytes_done.fetch_add(raw.len() as u64, Ordering::Relaxed);
        }
        Ok(())
    })
}

/// Writes a chunk; on a zeroed target, leaves its all-zero blocks unwritten (holes stay holes).
fn write_chunk(shared: &Shared, raw: &[u8], offset: u64) -> RepoResult<()> {
    let write = |data: &[u8], at: u64| {
        use std::os::unix::fs::FileExt;
        shared
            .target
            .file
            .write_all_at(data, at)
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
