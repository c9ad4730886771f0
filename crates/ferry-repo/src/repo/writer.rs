//! Writing blobs: shared open packs, a concurrent uploader, index checkpoints.
//!
//! Workers share open packs through [`LocalPacker`]s: [`OPEN_DATA_PACKS`] for data blobs, each
//! blob placed in one of them at random, and one for tree blobs. Each blob is compressed and
//! encrypted on its worker and only copied into the pack under a lock. Spreading data blobs
//! at random means a pack's contents are not a run of consecutive chunks of one file, whose
//! sizes would help the attacks on keyed chunking (FORMAT.md); at the end the partly filled
//! data packs are merged into one when they fit, so a small backup still writes one pack
//! (and a file of two chunks does not get a pack per chunk). A full pack is
//! sealed on the worker and handed to the uploader task, which stores up to
//! [`UPLOAD_CONCURRENCY`] packs at once. A stored pack is queued for the next index file, and
//! its blobs join the in-memory index only once that file is written; an index file is written
//! every [`CHECKPOINT_PACKS`] packs, [`CHECKPOINT_BLOBS`] blobs or [`CHECKPOINT_INTERVAL`],
//! and at the end. So an
//! interrupted backup leaves indexed packs that the next backup deduplicates against, and an
//! index never names a pack that is not stored.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use tokio::sync::mpsc;
use tokio::task::JoinSet;
use tokio_util::sync::CancellationToken;

use super::buffers::PackBuffers;
use super::capped::Limit;
use super::disk_cache::Cached;
use crate::error::{RepoError, RepoResult};
use crate::format::{
    BlobId, FrameBuilder, IndexFile, IndexId, IndexPack, ObjectKind, PackBuilder, SealScratch,
    SealedPack, content_address,
};
use crate::repo::{MemIndex, Repository, layout};

/// Open data packs each data blob is placed among at random.
pub(crate) const OPEN_DATA_PACKS: usize = 2;
/// Packs stored at once.
pub(crate) const UPLOAD_CONCURRENCY: usize = 3;
/// Packs per index checkpoint.
pub(crate) const CHECKPOINT_PACKS: usize = 8;
/// Blobs per index checkpoint, at most (about 12 MB of index file): packs of frames of tiny
/// blobs list far more blobs than packs of chunks.
pub(crate) const CHECKPOINT_BLOBS: usize = 1 << 18;
/// Longest time between index checkpoints while packs are being stored.
pub(crate) const CHECKPOINT_INTERVAL: Duration = Duration::from_secs(60);
/// Pack buffers a writer keeps for reuse: one for each full pack that can be in flight at once
/// (one being sealed, one waiting for the uploader, the ones being stored); the open packs
/// hold their own.
pub(crate) const PACK_BUFFERS_KEPT: usize = 1 + 1 + UPLOAD_CONCURRENCY;

/// Counters of what was stored.
#[derive(Debug, Default)]
pub(crate) struct WriteStats {
    /// Plaintext bytes of new blobs.
    pub(crate) raw_bytes: AtomicU64,
    /// Bytes of packs stored.
    pub(crate) stored_bytes: AtomicU64,
    /// Blobs added.
    pub(crate) blobs: AtomicU64,
}

/// Hands sealed packs to the uploader. Cloned into every worker.
#[derive(Debug, Clone)]
pub(crate) struct PackSink {
    tx: mpsc::Sender<SealedPack>,
    data: Arc<[Mutex<PackBuilder>; OPEN_DATA_PACKS]>,
    tree: Arc<Mutex<PackBuilder>>,
    buffers: Arc<PackBuffers>,
    /// Workers holding blobs in a frame not yet sealed into a pack.
    unsealed: Arc<AtomicU64>,
}

impl PackSink {
    fn send(&self, pack: SealedPack) -> RepoResult<()> {
        self.tx.blocking_send(pack).map_err(|_| RepoError::UploadStopped)
    }

    /// The pack buffers the writer reuses.
    #[cfg(test)]
    pub(crate) fn buffers(&self) -> Arc<PackBuffers> {
        Arc::clone(&self.buffers)
    }
}

/// The error a backup reports when its workers failed with `failure`: the uploader's own
/// error when the workers only stopped because the uploader had (a full disk, a store that
/// went away), else the workers' error.
pub(crate) fn upload_cause<T>(failure: RepoError, uploaded: RepoResult<T>) -> RepoError {
    match (failure, uploaded) {
        (RepoError::UploadStopped, Err(cause)) => cause,
        (failure, _) => failure,
    }
}

/// The running uploader.
#[derive(Debug)]
pub(crate) struct Uploader {
    task: tokio::task::JoinHandle<RepoResult<Vec<IndexId>>>,
    pub(crate) stats: Arc<WriteStats>,
}

impl Uploader {
    /// Starts the uploader on the current runtime. Every index file is written only while
    /// `lease` is valid: garbage collection may delete the unindexed packs of a writer whose
    /// lease lapsed, so every writer must hold one (see `crate::gc`).
    pub(crate) fn start_leased(
        repo: &Repository,
        index: Arc<MemIndex>,
        lease: Option<crate::gc::LeaseCheck>,
        cancel: &CancellationToken,
    ) -> (PackSink, Self) {
        let (tx, rx) = mpsc::channel(1);
        let stats = Arc::new(WriteStats::default());
        // A pack ends at the first blob that takes it to the target: room for a file chunk
        // past it and the header, so a buffer rarely grows (a larger volume chunk or tree
        // page past the target makes it grow once).
        let config = repo.config();
        let room = config.packs.target_size as usize + config.chunker.max_size as usize + (1 << 20);
        let buffers = Arc::new(PackBuffers::new(room, PACK_BUFFERS_KEPT));
        let repo = Leased { repo: repo.clone(), lease };
        let uploader =
            run(repo, index, rx, Arc::clone(&stats), Arc::clone(&buffers), cancel.clone());
        let task = tokio::spawn(uploader);
        let open = || Mutex::new(PackBuilder::in_buffer(buffers.take()));
        let (data, tree) = (Arc::new(std::array::from_fn(|_| open())), Arc::new(open()));
        let unsealed = Arc::new(AtomicU64::new(0));
        (PackSink { tx, data, tree, buffers, unsealed }, Self { task, stats })
    }

    /// Waits until every pack sent is stored and indexed. All sinks must be dropped first.
    pub(crate) async fn finish(self) -> RepoResult<Vec<IndexId>> {
        self.task
            .await
            .map_err(|e| RepoError::Internal { what: "pack uploader", reason: e.to_string() })?
    }
}

/// The repository and the lease its index writes depend on.
#[derive(Debug, Clone)]
struct Leased {
    repo: Repository,
    lease: Option<crate::gc::LeaseCheck>,
}

async fn run(
    repo: Leased,
    index: Arc<MemIndex>,
    mut rx: mpsc::Receiver<SealedPack>,
    stats: Arc<WriteStats>,
    buffers: Arc<PackBuffers>,
    cancel: CancellationToken,
) -> RepoResult<Vec<IndexId>> {
    let mut uploads: JoinSet<RepoResult<IndexPack>> = JoinSet::new();
    let mut pending: Vec<IndexPack> = Vec::new();
    let mut written = Vec::new();
    let mut last_checkpoint = Instant::now();
    let mut open = true;
    let result: RepoResult<()> = async {
        while open || !uploads.is_empty() {
            tokio::select! {
                received = rx.recv(), if open && uploads.len() < UPLOAD_CONCURRENCY => match received {
                    Some(pack) => {
                        let (repo, cancel, buffers) = (repo.repo.clone(), cancel.clone(), Arc::clone(&buffers));
                        uploads.spawn(async move { upload(&repo, pack, &buffers, &cancel).await });
                    }
                    None => open = false,
                },
                Some(done) = uploads.join_next() => {
                    let pack = done.map_err(|e| RepoError::Internal { what: "pack upload", reason: e.to_string() })??;
                    stats.stored_bytes.fetch_add(pack.size, Ordering::Relaxed);
                    pending.push(pack);
                    let blobs: usize = pending.iter().map(|p| p.entries.len()).sum();
                    if pending.len() >= CHECKPOINT_PACKS
                        || blobs >= CHECKPOINT_BLOBS
                        || last_checkpoint.elapsed() >= CHECKPOINT_INTERVAL
                    {
                        written.push(checkpoint(&repo, &index, std::mem::take(&mut pending), &cancel).await?);
                        last_checkpoint = Instant::now();
                    }
                }
            }
        }
        Ok(())
    }
    .await;
    match result {
        Ok(()) => {
            if !pending.is_empty() {
                written.push(checkpoint(&repo, &index, pending, &cancel).await?);
            }
            Ok(written)
        }
        Err(e) => {
            // Keep what was stored reusable: index the finished packs, briefly, even after a
            // cancellation (their data is durable, only the index entry is missing).
            if !pending.is_empty() {
                let grace = CancellationToken::new();
                let save = checkpoint(&repo, &index, pending, &grace);
                let _ = tokio::time::timeout(Duration::from_millis(800), save).await;
            }
            Err(e)
        }
    }
}

async fn upload(
    repo: &Repository,
    pack: SealedPack,
    buffers: &PackBuffers,
    cancel: &CancellationToken,
) -> RepoResult<IndexPack> {
    let key = layout::pack(&pack.id)?;
    let size = pack.bytes.len() as u64;
    let bytes = Bytes::from(pack.bytes);
    repo.store()
        .put_if_absent(&key, bytes.clone(), cancel)
        .await
        .map_err(|e| RepoError::store("upload pack", &key, e))?;
    if pack.entries.first().is_some_and(|e| e.kind == ObjectKind::TreeBlob) {
        repo.keep_copy(Cached::TreePack, pack.id.0, bytes.clone()).await;
    }
    buffers.give_back(bytes);
    Ok(IndexPack { id: pack.id, size, entries: pack.entries })
}

/// Writes an index file for stored packs, then makes their blobs visible in the in-memory
/// index. Only indexed blobs may be deduplicated against by later backups of this process:
/// a pack whose index write failed must not be relied on.
async fn checkpoint(
    repo: &Leased,
    index: &MemIndex,
    packs: Vec<IndexPack>,
    cancel: &CancellationToken,
) -> RepoResult<IndexId> {
    if let Some(lease) = &repo.lease {
        lease.check()?;
    }
    let id = write_index(&repo.repo, packs.clone(), cancel).await?;
    for pack in &packs {
        index.add_pack(pack.id, pack.size, &pack.entries);
    }
    Ok(id)
}

/// Stores one index file naming `packs` (all already stored).
pub(crate) async fn write_index(
    repo: &Repository,
    packs: Vec<IndexPack>,
    cancel: &CancellationToken,
) -> RepoResult<IndexId> {
    let file = IndexFile { packs, supersedes: Vec::new() };
    let bytes = file.encode(&repo.keys().cipher);
    let id = IndexId(content_address(&bytes));
    let key = layout::index(&id)?;
    Limit::INDEX.check_write(&key, bytes.len())?;
    let bytes = Bytes::from(bytes);
    repo.store()
        .put_if_absent(&key, bytes.clone(), cancel)
        .await
        .map_err(|e| RepoError::store("write index", &key, e))?;
    repo.keep_copy(Cached::Index, id.0, bytes).await;
    Ok(id)
}

/// A worker's handle on the shared open packs (two for data, one for trees). Blobs are
/// compressed and encrypted on the worker, in its own reused buffers; only the copy into a
/// pack (and, when that fills it, taking the next pack's buffer) happens under its lock, so all
/// workers fill the same packs and memory holds three open packs, not a pack per worker.
///
/// In format 3 a worker gathers its small data blobs in a frame of its own, sealed (on the
/// worker) and copied into one of the open data packs once full; [`LocalPacker::finish`]
/// seals the last one, and [`PackSink::flush`] refuses to end a backup while a worker still
/// holds blobs in a frame (they would be claimed and never stored).
#[derive(Debug)]
pub(crate) struct LocalPacker {
    repo: Repository,
    sink: PackSink,
    stats: Arc<WriteStats>,
    level: i32,
    target: usize,
    scratch: SealScratch,
    /// Small data blobs gathered for one frame (format 3), with scratch space to seal it.
    frame: Option<Box<FrameScratch>>,
    /// Data blobs shorter than this go into frames.
    framed_max: usize,
}

#[derive(Debug, Default)]
struct FrameScratch {
    frame: FrameBuilder,
    plain: Vec<u8>,
    sealed: Vec<u8>,
}

impl LocalPacker {
    pub(crate) fn new(
        repo: &Repository,
        sink: &PackSink,
        stats: &Arc<WriteStats>,
        level: i32,
    ) -> Self {
        Self {
            repo: repo.clone(),
            sink: sink.clone(),
            stats: Arc::clone(stats),
            level,
            target: repo.config().packs.target_size as usize,
            scratch: SealScratch::default(),
            frame: repo.config().format.frames().then(Box::default),
            framed_max: crate::format::FRAMED_MAX,
        }
    }

    /// Frames data blobs shorter than `max` (instead of [`crate::format::FRAMED_MAX`]).
    pub(crate) fn framing_below(mut self, max: usize) -> Self {
        self.framed_max = max;
        self
    }

    /// Compresses, encrypts and packs one blob (in format 3, a small data blob goes into
    /// this worker's frame, stored when the frame is full or at [`LocalPacker::finish`]).
    pub(crate) fn add(&mut self, kind: ObjectKind, id: BlobId, raw: &[u8]) -> RepoResult<()> {
        let framed = kind == ObjectKind::DataBlob && raw.len() < self.framed_max;
        self.add_placed(kind, id, raw, framed)
    }

    /// Packs one data blob into this worker's frame whatever its size (in format 3; as
    /// [`LocalPacker::add`] otherwise): for a copy of a blob its source stored framed.
    pub(crate) fn add_framed(&mut self, id: BlobId, raw: &[u8]) -> RepoResult<()> {
        self.add_placed(ObjectKind::DataBlob, id, raw, true)
    }

    fn add_placed(
        &mut self,
        kind: ObjectKind,
        id: BlobId,
        raw: &[u8],
        framed: bool,
    ) -> RepoResult<()> {
        self.stats.raw_bytes.fetch_add(raw.len() as u64, Ordering::Relaxed);
        self.stats.blobs.fetch_add(1, Ordering::Relaxed);
        if framed && let Some(scratch) = &mut self.frame {
            if scratch.frame.is_empty() {
                self.sink.unsealed.fetch_add(1, Ordering::Relaxed);
            }
            scratch.frame.push(id, raw);
            if scratch.frame.is_full() {
                self.seal_frame()?;
            }
            return Ok(());
        }
        let keys = self.repo.keys();
        let level = if kind == ObjectKind::TreeBlob {
            crate::format::DEFAULT_DATA_LEVEL.max(3)
        } else {
            self.level
        };
        let sealed = self.scratch.seal(keys, id, kind, level, raw);
        let open = if kind == ObjectKind::TreeBlob {
            &*self.sink.tree
        } else {
            &self.sink.data[rand::random_range(0..OPEN_DATA_PACKS)]
        };
        let full = Self::into_pack(open, self.target, &self.sink.buffers, |builder| {
            builder.push_sealed(id, kind, sealed, raw.len());
        })?;
        if let Some(full) = full {
            self.sink.send(full.finish(&keys.cipher, self.repo.config().format))?;
        }
        Ok(())
    }

    /// Seals this worker's frame, if it holds blobs, and copies it into an open data pack.
    /// Call once the worker has added its last blob.
    pub(crate) fn finish(&mut self) -> RepoResult<()> {
        if self.frame.as_ref().is_some_and(|s| !s.frame.is_empty()) {
            self.seal_frame()?;
        }
        Ok(())
    }

    fn seal_frame(&mut self) -> RepoResult<()> {
        let Some(scratch) = &mut self.frame else { return Ok(()) };
        let keys = self.repo.keys();
        scratch.sealed.clear();
        let FrameScratch { frame, plain, sealed } = &mut **scratch;
        let blobs = frame.seal_into(keys, self.level, plain, sealed);
        let open = &self.sink.data[rand::random_range(0..OPEN_DATA_PACKS)];
        let full = Self::into_pack(open, self.target, &self.sink.buffers, |builder| {
            builder.push_frame(sealed, &blobs);
        })?;
        self.sink.unsealed.fetch_sub(1, Ordering::Relaxed);
        if sealed.capacity() > 4 * crate::format::frame::FRAME_TARGET {
            *sealed = Vec::new();
        }
        if let Some(full) = full {
            self.sink.send(full.finish(&keys.cipher, self.repo.config().format))?;
        }
        Ok(())
    }

    /// Runs `push` on the open pack `open` under its lock; returns the pack if that filled it
    /// (a new one, in a reused buffer, takes its place).
    fn into_pack(
        open: &Mutex<PackBuilder>,
        target: usize,
        buffers: &PackBuffers,
        push: impl FnOnce(&mut PackBuilder),
    ) -> RepoResult<Option<PackBuilder>> {
        let mut builder = open.lock().map_err(|_| RepoError::Internal {
            what: "pack writer",
            reason: "lock poisoned".into(),
        })?;
        push(&mut builder);
        Ok((builder.filled() >= target).then(|| {
            let next = PackBuilder::in_buffer(buffers.take());
            std::mem::replace(&mut *builder, next)
        }))
    }
}

impl PackSink {
    /// Seals and sends the partly filled shared packs; call once every writer is done. The
    /// data packs are merged into as few packs as the target allows.
    ///
    /// # Errors
    /// [`RepoError::Internal`] when a worker still holds blobs in a frame it did not seal
    /// ([`LocalPacker::finish`] not called): they were claimed, so nothing else stores them.
    pub(crate) fn flush(&self, repo: &Repository) -> RepoResult<()> {
        let unsealed = self.unsealed.load(Ordering::Relaxed);
        if unsealed != 0 {
            return Err(RepoError::Internal {
                what: "pack writer",
                reason: format!("{unsealed} workers ended with blobs in a frame never stored"),
            });
        }
        let take = |open: &Mutex<PackBuilder>| {
            open.lock().map(|mut b| std::mem::take(&mut *b)).map_err(|_| RepoError::Internal {
                what: "pack writer",
                reason: "lock poisoned".into(),
            })
        };
        let target = repo.config().packs.target_size as usize;
        let mut merged: Vec<PackBuilder> = Vec::new();
        for open in self.data.iter() {
            let builder = take(open)?;
            if builder.is_empty() {
                continue;
            }
            match merged.last_mut() {
                Some(last) if last.filled() + builder.filled() <= target => last.append(builder),
                _ => merged.push(builder),
            }
        }
        merged.push(take(&self.tree)?);
        for builder in merged {
            if !builder.is_empty() {
                self.send(builder.finish(&repo.keys().cipher, repo.config().format))?;
            }
        }
        Ok(())
    }
}
