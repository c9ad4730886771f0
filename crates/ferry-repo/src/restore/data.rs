//! Restore workers: fetch the blobs of a batch of file ranges with few, coalesced reads (several
//! in flight at once, see [`crate::pack_reads`]), verify them, and write them in place; the
//! next batch's reads start while the current one's last blobs are written (see [`work`]).

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use bytes::Bytes;

use super::frames::{Claim, Claims, Demand, FrameKey};
use crate::dir_path::DirPath;
use crate::error::{RepoError, RepoResult};
use crate::format::{BlobOpener, ChunkRef, Frame, Metadata, ObjectKind, open_blob};
use crate::pack_reads::{self, Fetcher, PackRead, Queue, Span};
use crate::repo::BlobLocation;
use crate::restore::Shared;
use crate::restore::fsops::{self, Warnings};

/// A file being written by one or more batches.
#[derive(Debug)]
pub(crate) struct OpenFile {
    pub(crate) file: File,
    /// Its directory's place and its name there (its path, for messages: [`Self::path`]).
    pub(crate) loc: Arc<DirPath>,
    pub(crate) name: Vec<u8>,
    pub(crate) meta: Metadata,
    /// Batches still to write into it; the one that brings this to zero sets its metadata.
    pub(crate) pending: AtomicUsize,
    /// Whether its writeback is started once its data is complete (see [`finish_item`]).
    pub(crate) write_back: bool,
    /// Keeps the directory open while the file is in flight (not otherwise used).
    pub(crate) _dir: Arc<OwnedFd>,
}

impl OpenFile {
    /// Its path, for a message.
    pub(crate) fn path(&self) -> PathBuf {
        self.loc.child_path(&self.name)
    }
}

/// Part of one file's content.
#[derive(Debug)]
pub(crate) struct Item {
    pub(crate) file: Arc<OpenFile>,
    pub(crate) chunks: Vec<(u64, ChunkRef)>,
}

/// Items restored together.
pub(crate) type Batch = Vec<Item>;

struct Want {
    loc: BlobLocation,
    chunk: ChunkRef,
    item: usize,
    offset: u64,
}

/// A batch as the planner sends it: its items, where their blobs are, and the frames those lie
/// in, counted as needed until the batch has written what it needs from each (see
/// [`super::frames`]).
pub(crate) struct Located<'s> {
    batch: Batch,
    wants: Vec<Want>,
    demand: Demand<'s>,
}

/// A batch with its first round decided (see [`super::frames`]) and its reads planned; its
/// worker may have started them while it wrote the batch before.
pub(crate) struct Prepared<'s> {
    batch: Batch,
    /// The frames it has still to write blobs from.
    demand: Demand<'s>,
    /// Its first round, until it is fetched.
    round: Option<Round<'s>>,
    /// Then the frames it waits for (each with the number of the claim it waits for).
    waiting: Groups,
}

/// One round of a batch: the frames it claimed, the blobs it fetches (sorted, with the merged
/// reads that cover them), and the frames it waits for.
struct Round<'s> {
    claims: Claims<'s>,
    fetch: Vec<Want>,
    reads: Vec<PackRead>,
    queue: Queue,
    /// With the number of the claim each waits for.
    waiting: Vec<(u64, Want)>,
}

/// Restores the batches `rx` brings until it is closed. While a batch's last reads are in
/// flight and it writes their blobs, the next batch is taken (if one is queued already) and
/// its reads started within the worker's bounds, so a worker's link need not go idle for a
/// round trip between batches (it still does after a batch that waits for another's frames,
/// unless its next batch was taken ahead already).
///
/// A worker waits for frames other batches fetch (see [`super::frames`]) only once every
/// batch it holds has fetched what it claimed: the batch taken ahead, its reads in flight, is
/// fetched (and its frames published) before the current one waits. So a worker that waits
/// holds no frame another could wait for, and no two workers can wait for each other.
pub(crate) fn work<'s>(
    shared: &'s Shared,
    rx: &crossbeam_channel::Receiver<Located<'s>>,
) -> RepoResult<()> {
    let mut fetcher = shared.repo.fetcher(&shared.handle, &shared.stop);
    let mut ahead: Option<Prepared<'_>> = None;
    loop {
        if shared.stop.is_cancelled() {
            return Err(RepoError::Cancelled);
        }
        let mut current = match ahead.take() {
            Some(prepared) => prepared,
            None => match rx.recv() {
                Ok(located) => prepare(shared, located)?,
                Err(_) => return Ok(()),
            },
        };
        let mut take_ahead = |fetcher: &mut Fetcher<'_>| {
            if ahead.is_none()
                && let Ok(located) = rx.try_recv()
            {
                ahead = Some(prepare(shared, located)?);
            }
            if let Some(Prepared { round: Some(next), .. }) = &mut ahead {
                fetcher.start(&next.reads, &mut next.queue);
            }
            Ok(())
        };
        current.fetch(shared, &mut fetcher, &mut take_ahead)?;
        // Its reads are all taken: room for more of the next batch's.
        take_ahead(&mut fetcher)?;
        if !current.waiting.is_empty()
            && let Some(next) = &mut ahead
        {
            // The frames the current batch waits for are taken as they come (between the next
            // batch's reads, once those are all started), so fewer are evicted meanwhile.
            let (batch, waiting) = (&current.batch, &mut current.waiting);
            let demand = &mut current.demand;
            next.fetch(shared, &mut fetcher, &mut |_| {
                *waiting = write_ready(shared, batch, std::mem::take(waiting), demand)?;
                Ok(())
            })?;
        }
        finish_batch(shared, &mut fetcher, current)?;
    }
}

/// Looks up a batch's blobs (the planner does, before it sends the batch) and counts the
/// frames they lie in as needed.
pub(crate) fn locate(shared: &Shared, batch: Batch) -> RepoResult<Located<'_>> {
    let mut wants = Vec::new();
    for (i, item) in batch.iter().enumerate() {
        for (offset, chunk) in &item.chunks {
            let loc = shared.index.lookup(&chunk.id).ok_or_else(|| RepoError::MissingBlob {
                id: chunk.id,
                referrer: item.file.path().display().to_string(),
            })?;
            if !loc.kind.is_data() {
                return Err(RepoError::corrupt(
                    format!(
                        "{} {} referenced as data of {}",
                        loc.kind,
                        chunk.id,
                        item.file.path().display()
                    ),
                    crate::format::FormatError::WrongKind {
                        expected: ObjectKind::DataBlob,
                        found: loc.kind,
                    },
                ));
            }
            wants.push(Want { loc, chunk: *chunk, item: i, offset: *offset });
        }
    }
    let frames = wants.iter().filter(|w| w.loc.kind == ObjectKind::FramedData).map(frame_of);
    let demand = Demand::new(&shared.frames, frames.collect());
    Ok(Located { batch, wants, demand })
}

/// Decides a located batch's first round.
fn prepare<'s>(shared: &'s Shared, located: Located<'s>) -> RepoResult<Prepared<'s>> {
    let Located { batch, wants, mut demand } = located;
    let round = Round::decide(shared, &batch, wants, false, &mut demand)?;
    Ok(Prepared { batch, demand, round: Some(round), waiting: Groups::new() })
}

/// The frame a framed blob lies in.
fn frame_of(w: &Want) -> FrameKey {
    (w.loc.pack, w.loc.offset)
}

impl<'s> Prepared<'s> {
    /// Fetches and writes the blobs of the first round (once), publishing the frames it
    /// claimed, and writes those of the frames others have published meanwhile; `idle` is
    /// called as in [`Fetcher::drain`].
    fn fetch(
        &mut self,
        shared: &Shared,
        fetcher: &mut Fetcher<'_>,
        idle: &mut dyn FnMut(&mut Fetcher<'_>) -> RepoResult<()>,
    ) -> RepoResult<()> {
        if let Some(round) = self.round.take() {
            let waiting = round.run(shared, &self.batch, fetcher, idle, &mut self.demand)?;
            self.waiting = write_ready(shared, &self.batch, group(waiting), &mut self.demand)?;
        }
        Ok(())
    }
}

/// Ends a fetched batch: waits for the frames other batches are fetching and writes their
/// blobs; a frame waited for in vain (its fetch abandoned, or the frame evicted) is fetched
/// in a second, last round, which waits for nothing. Then each item is finished.
fn finish_batch(
    shared: &Shared,
    fetcher: &mut Fetcher<'_>,
    prepared: Prepared<'_>,
) -> RepoResult<()> {
    let Prepared { batch, mut demand, round, waiting } = prepared;
    if round.is_some() {
        return Err(RepoError::Internal {
            what: "restore",
            reason: "a batch was finished before it was fetched".into(),
        });
    }
    let again = wait_for(shared, &batch, waiting, &mut demand)?;
    if !again.is_empty() {
        let last = Round::decide(shared, &batch, again, true, &mut demand)?;
        let left = last.run(shared, &batch, fetcher, &mut |_| Ok(()), &mut demand)?;
        if !left.is_empty() {
            return Err(RepoError::Internal {
                what: "restore",
                reason: format!("{} blobs left unwritten after the last round", left.len()),
            });
        }
    }
    for item in batch {
        finish_item(shared, item)?;
    }
    Ok(())
}

impl<'s> Round<'s> {
    /// Claims the frames of `wants` nobody has (see [`super::frames`]), writes the blobs of
    /// those opened already (a local write each, so the batch holds them no longer than that,
    /// outside the kept memory once evicted) and gives those frames up, and plans the reads of
    /// the blobs to fetch; in
    /// the `last` round, the frames another batch is fetching are fetched too, not waited
    /// for.
    fn decide(
        shared: &'s Shared,
        batch: &Batch,
        wants: Vec<Want>,
        last: bool,
        demand: &mut Demand<'_>,
    ) -> RepoResult<Self> {
        let mut claims = Claims::new(&shared.frames);
        let mut decided: HashMap<FrameKey, Claim> = HashMap::new();
        let (mut fetch, mut waiting) = (Vec::new(), Vec::new());
        for w in wants {
            if w.loc.kind != ObjectKind::FramedData {
                fetch.push(w);
                continue;
            }
            let key = frame_of(&w);
            match decided.entry(key).or_insert_with(|| shared.frames.claim(key)) {
                Claim::Fetch => {
                    if !claims.open.contains(&key) {
                        claims.open.push(key);
                    }
                    fetch.push(w);
                }
                Claim::Ready(frame) => write_framed(shared, batch, frame, &w)?,
                Claim::Wait(_) if last => fetch.push(w),
                Claim::Wait(claim) => waiting.push((*claim, w)),
            }
        }
        // A round decides once per frame: every blob of a frame handed over is written.
        for (key, claim) in &decided {
            if matches!(claim, Claim::Ready(_)) {
                demand.done(*key);
            }
        }
        fetch.sort_by_key(|w| (w.loc.pack, w.loc.offset, w.chunk.id));
        let mut reads =
            pack_reads::plan(&fetch, pack_reads::TREE_MERGE_GAP, pack_reads::MAX_READ, |w| {
                Span::from(&w.loc)
            })?;
        // The reads of frames other batches may wait for go first.
        reads.sort_by_cached_key(|read| {
            !fetch[read.wants.clone()]
                .iter()
                .any(|w| w.loc.kind == ObjectKind::FramedData && claims.open.contains(&frame_of(w)))
        });
        Ok(Self { claims, fetch, reads, queue: Queue::default(), waiting })
    }

    /// Fetches the blobs with merged reads and writes them, publishing the frames it claimed
    /// as they are opened, and giving each frame up once its blobs are written (a frame's
    /// blobs all come in one read, unless it is larger than a read, which only an index
    /// written to mislead has: then it is given up early, and only kept for less long). Returns the wants of the frames other batches are
    /// fetching, to wait for: every frame this round claimed is published by then (or
    /// abandoned).
    fn run(
        self,
        shared: &Shared,
        batch: &Batch,
        fetcher: &mut Fetcher<'_>,
        idle: &mut dyn FnMut(&mut Fetcher<'_>) -> RepoResult<()>,
        demand: &mut Demand<'_>,
    ) -> RepoResult<Vec<(u64, Want)>> {
        let Self { mut claims, fetch, reads, mut queue, waiting } = self;
        let keys = shared.repo.keys();
        let each = |read: &PackRead, bytes: Bytes| {
            let mut written = None;
            let mut opener = BlobOpener::default();
            let mut last: Option<(crate::format::BlobId, Vec<u8>)> = None;
            for w in &fetch[read.wants.clone()] {
                let sealed = read.sealed(&bytes, Span::from(&w.loc))?;
                let corrupt = |e| RepoError::corrupt(blob_in(w), e);
                if w.loc.kind == ObjectKind::FramedData {
                    let at = frame_of(w);
                    let (frame, fresh) = opener.frame(keys, at, sealed).map_err(corrupt)?;
                    if fresh && claims.open.contains(&at) {
                        claims.publish(at, Arc::clone(frame));
                    }
                    write_framed(shared, batch, frame, w)?;
                    if let Some(k) = written.filter(|k| *k != at) {
                        demand.done(k);
                    }
                    written = Some(at);
                    continue;
                }
                let raw = match &last {
                    Some((id, raw)) if *id == w.chunk.id => raw,
                    _ => {
                        let raw =
                            open_blob(keys, &w.chunk.id, w.loc.kind, sealed).map_err(corrupt)?;
                        &last.insert((w.chunk.id, raw)).1
                    }
                };
                write_want(shared, batch, w, raw)?;
            }
            if let Some(k) = written {
                demand.done(k);
            }
            Ok(())
        };
        fetcher.drain(&reads, &mut queue, each, idle)?;
        drop(claims);
        Ok(waiting)
    }
}

/// The wants of `waiting` grouped by frame, in the order of their frames. A batch decides
/// once per frame, so the wants of one frame wait for one claim.
type Groups = Vec<(FrameKey, u64, Vec<Want>)>;

/// Groups `waiting` by frame.
fn group(mut waiting: Vec<(u64, Want)>) -> Groups {
    waiting.sort_by_key(|(_, w)| (w.loc.pack, w.loc.offset, w.chunk.id));
    let mut groups: Groups = Vec::new();
    for (claim, w) in waiting {
        let key = frame_of(&w);
        match groups.last_mut() {
            Some((k, _, group)) if *k == key => group.push(w),
            _ => groups.push((key, claim, vec![w])),
        }
    }
    groups
}

/// Writes the blobs of the frames of `waiting` published already; returns the others.
fn write_ready(
    shared: &Shared,
    batch: &Batch,
    waiting: Groups,
    demand: &mut Demand<'_>,
) -> RepoResult<Groups> {
    let mut blocked = Vec::new();
    for (key, claim, group) in waiting {
        match shared.frames.ready(key) {
            Some(frame) => {
                for w in &group {
                    write_framed(shared, batch, &frame, w)?;
                }
                demand.done(key);
            }
            None => blocked.push((key, claim, group)),
        }
    }
    Ok(blocked)
}

/// Waits for the frames other batches are fetching (each for the claim it was told of, see
/// [`super::frames::SharedFrames::wait`]) and writes their blobs: those published meanwhile
/// first, at once (they could be evicted while the batch blocks on the others). Returns the
/// wants of the frames waited for in vain (the fetch failed elsewhere, or the frame was
/// evicted), for the last round.
fn wait_for(
    shared: &Shared,
    batch: &Batch,
    waiting: Groups,
    demand: &mut Demand<'_>,
) -> RepoResult<Vec<Want>> {
    let blocked = write_ready(shared, batch, waiting, demand)?;
    let mut again = Vec::new();
    for (key, claim, mut group) in blocked {
        match shared.frames.wait(key, claim, &shared.stop) {
            Some(frame) => {
                for w in &group {
                    write_framed(shared, batch, &frame, w)?;
                }
                demand.done(key);
            }
            None if shared.stop.is_cancelled() => return Err(RepoError::Cancelled),
            None => again.append(&mut group),
        }
    }
    Ok(again)
}

/// Writes a framed blob out of its opened frame.
fn write_framed(shared: &Shared, batch: &Batch, frame: &Frame, w: &Want) -> RepoResult<()> {
    let raw = frame
        .blob(shared.repo.keys(), &w.chunk.id, w.loc.raw_length)
        .map_err(|e| RepoError::corrupt(blob_in(w), e))?;
    write_want(shared, batch, w, raw)
}

/// Names a wanted blob and its pack's key, as errors do.
fn blob_in(w: &Want) -> String {
    let pack = crate::repo::layout::pack(&w.loc.pack)
        .map_or_else(|_| w.loc.pack.to_string(), |k| k.to_string());
    format!("data blob {} in pack {pack}", w.chunk.id)
}

/// Writes one blob's bytes where `w` wants them, after checking their length.
fn write_want(shared: &Shared, batch: &Batch, w: &Want, raw: &[u8]) -> RepoResult<()> {
    if raw.len() != w.chunk.len as usize {
        return Err(RepoError::corrupt(
            blob_in(w),
            crate::format::FormatError::Invalid {
                what: "blob",
                reason: "length differs from the tree".into(),
            },
        ));
    }
    let target = &batch[w.item].file;
    if !(shared.sparse && raw.iter().all(|b| *b == 0)) {
        target
            .file
            .write_all_at(raw, w.offset)
            .map_err(|e| RepoError::io("write", target.path(), e))?;
    }
    shared.progress.bytes_done.fetch_add(raw.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// Files at least this large have their writeback started as each of their items (about
/// [`super::BATCH_BYTES`]) is written: the disk writes them while the restore goes on, and the
/// syncfs that ends it has less left. Smaller files are left to the flusher, which syncs the
/// file system every [`super::flush::FLUSH_BYTES`] written: a call per small file cost the
/// Linux tree (78,579 files) 15 % more time, in system calls and small early writes.
pub(crate) const WRITE_BACK_BYTES: u64 = 8 << 20;

/// Counts a finished item, starting its file's writeback (see [`WRITE_BACK_BYTES`]; a disk
/// that cannot write fails the restore, see [`crate::sys::start_writeback`]); the last one of
/// its file sets the file's metadata.
pub(crate) fn finish_item(shared: &Shared, item: Item) -> RepoResult<()> {
    if item.file.write_back {
        crate::sys::start_writeback(item.file.file.as_fd())
            .map_err(|e| RepoError::io("write back", item.file.path(), e))?;
    }
    if item.file.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
        let mut warnings = Warnings::default();
        let f = &item.file;
        let what = f.loc.show(&f.name);
        fsops::apply_fd(&f.file, &f.meta, shared, &what, &mut warnings)
            .map_err(|e| RepoError::io("set metadata of", f.path(), e))?;
        shared.warn(warnings);
        shared.progress.files_done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}
