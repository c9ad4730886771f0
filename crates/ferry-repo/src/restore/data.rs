//! Restore workers: fetch the blobs of a batch of file ranges with few, coalesced reads (several
//! in flight at once, see [`crate::pack_reads`]), verify them, and write them in place.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::frames::{Claim, Claims, FrameKey};
use crate::error::{RepoError, RepoResult};
use crate::format::{BlobOpener, ChunkRef, Frame, Metadata, ObjectKind, open_blob};
use crate::pack_reads::{self, Span};
use crate::repo::BlobLocation;
use crate::restore::Shared;
use crate::restore::fsops::{self, Warnings};

/// A file being written by one or more batches.
#[derive(Debug)]
pub(crate) struct OpenFile {
    pub(crate) file: File,
    pub(crate) path: PathBuf,
    pub(crate) meta: Metadata,
    /// Batches still to write into it; the one that brings this to zero sets its metadata.
    pub(crate) pending: AtomicUsize,
    /// Whether its writeback is started once its data is complete (see [`finish_item`]).
    pub(crate) write_back: bool,
    /// Keeps the directory open while the file is in flight (not otherwise used).
    pub(crate) _dir: Arc<OwnedFd>,
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

/// Writes one batch: the blobs alone and the frames nobody else has are fetched with few
/// merged reads, the frames opened already taken as they are, and the frames another batch
/// is fetching waited for, after (see [`super::frames`]).
pub(crate) fn restore_batch(shared: &Shared, batch: Batch) -> RepoResult<()> {
    let mut wants = Vec::new();
    for (i, item) in batch.iter().enumerate() {
        for (offset, chunk) in &item.chunks {
            let loc = shared.index.lookup(&chunk.id).ok_or_else(|| RepoError::MissingBlob {
                id: chunk.id,
                referrer: item.file.path.display().to_string(),
            })?;
            if !loc.kind.is_data() {
                return Err(RepoError::corrupt(
                    format!(
                        "{} {} referenced as data of {}",
                        loc.kind,
                        chunk.id,
                        item.file.path.display()
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
    for round in 1..=ROUNDS {
        wants = restore_round(shared, &batch, wants, round == ROUNDS)?;
        if wants.is_empty() {
            break;
        }
    }
    if !wants.is_empty() {
        return Err(RepoError::Internal {
            what: "restore",
            reason: format!("{} blobs left unwritten after the last round", wants.len()),
        });
    }
    for item in batch {
        finish_item(shared, item)?;
    }
    Ok(())
}

/// Rounds of claims a batch makes: a frame it waited for that was then abandoned or evicted
/// is claimed again in the next round; the last round fetches what is left itself.
const ROUNDS: usize = 3;

/// One round of a batch: fetches the blobs alone and the frames it claims, writes the frames
/// found opened, then waits for the frames other batches are fetching. Returns the wants of
/// the frames it waited for in vain (abandoned or evicted), for the next round; the last
/// round waits for none.
fn restore_round(
    shared: &Shared,
    batch: &Batch,
    wants: Vec<Want>,
    last: bool,
) -> RepoResult<Vec<Want>> {
    let mut claims = Claims::new(&shared.frames);
    let mut decided: HashMap<FrameKey, Claim> = HashMap::new();
    let (mut fetch, mut ready, mut waiting) = (Vec::new(), Vec::new(), Vec::new());
    for w in wants {
        if w.loc.kind != ObjectKind::FramedData {
            fetch.push(w);
            continue;
        }
        let key = (w.loc.pack, w.loc.offset);
        match decided.entry(key).or_insert_with(|| shared.frames.claim(key)) {
            Claim::Fetch => {
                if !claims.open.contains(&key) {
                    claims.open.push(key);
                }
                fetch.push(w);
            }
            Claim::Ready(frame) => ready.push((Arc::clone(frame), w)),
            Claim::Wait if last => fetch.push(w),
            Claim::Wait => waiting.push(w),
        }
    }
    drop(decided);
    // The frames opened already first (a local write each), so the batch holds them no
    // longer than that, outside the kept memory once evicted.
    for (frame, w) in ready {
        write_framed(shared, batch, &frame, &w)?;
    }
    fetch_and_write(shared, batch, &mut fetch, &mut claims)?;
    // Every frame claimed is published by now (or abandoned here): none left for others to
    // wait on while this batch waits.
    drop(claims);
    waiting.sort_by_key(|w| (w.loc.pack, w.loc.offset, w.chunk.id));
    let mut groups: Vec<Vec<Want>> = Vec::new();
    for w in waiting {
        match groups.last_mut() {
            Some(group)
                if (group[0].loc.pack, group[0].loc.offset) == (w.loc.pack, w.loc.offset) =>
            {
                group.push(w);
            }
            _ => groups.push(vec![w]),
        }
    }
    // The frames published while this batch fetched are taken at once, before it blocks on
    // the others (they could be evicted meanwhile).
    let mut blocked = Vec::new();
    for group in groups {
        match shared.frames.ready((group[0].loc.pack, group[0].loc.offset)) {
            Some(frame) => {
                for w in &group {
                    write_framed(shared, batch, &frame, w)?;
                }
            }
            None => blocked.push(group),
        }
    }
    let mut again = Vec::new();
    for mut group in blocked {
        match shared.frames.wait((group[0].loc.pack, group[0].loc.offset), &shared.stop) {
            Some(frame) => {
                for w in &group {
                    write_framed(shared, batch, &frame, w)?;
                }
            }
            None if shared.stop.is_cancelled() => return Err(RepoError::Cancelled),
            // Its fetch failed elsewhere, or it was evicted: claim it again.
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

/// Fetches `wants` with merged reads and writes them; publishes the frames of `claims` as
/// they are opened.
fn fetch_and_write(
    shared: &Shared,
    batch: &Batch,
    wants: &mut [Want],
    claims: &mut Claims<'_>,
) -> RepoResult<()> {
    if wants.is_empty() {
        return Ok(());
    }
    wants.sort_by_key(|w| (w.loc.pack, w.loc.offset, w.chunk.id));
    let mut reads = pack_reads::plan(wants, |w| Span::from(&w.loc))?;
    // The reads of frames other batches may wait for go first.
    reads.sort_by_cached_key(|read| {
        !wants[read.wants.clone()].iter().any(|w| {
            w.loc.kind == ObjectKind::FramedData
                && claims.open.contains(&(w.loc.pack, w.loc.offset))
        })
    });
    let keys = shared.repo.keys();
    shared.repo.fetch_packs_in_order(&shared.handle, &reads, &shared.stop, |read, bytes| {
        let mut opener = BlobOpener::default();
        let mut last: Option<(crate::format::BlobId, Vec<u8>)> = None;
        for w in &wants[read.wants.clone()] {
            let sealed = read.sealed(&bytes, Span::from(&w.loc))?;
            let corrupt = |e| RepoError::corrupt(blob_in(w), e);
            if w.loc.kind == ObjectKind::FramedData {
                let at = (w.loc.pack, w.loc.offset);
                let (frame, fresh) = opener.frame(keys, at, sealed).map_err(corrupt)?;
                if fresh && claims.open.contains(&at) {
                    claims.publish(at, Arc::clone(frame));
                }
                write_framed(shared, batch, frame, w)?;
                continue;
            }
            let raw = match &last {
                Some((id, raw)) if *id == w.chunk.id => raw,
                _ => {
                    let raw = open_blob(keys, &w.chunk.id, w.loc.kind, sealed).map_err(corrupt)?;
                    &last.insert((w.chunk.id, raw)).1
                }
            };
            write_want(shared, batch, w, raw)?;
        }
        Ok(())
    })
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
            .map_err(|e| RepoError::io("write", &target.path, e))?;
    }
    shared.progress.bytes_done.fetch_add(raw.len() as u64, Ordering::Relaxed);
    Ok(())
}

/// Files at least this large have their writeback started as each of their items (about
/// [`super::BATCH_BYTES`]) is written: the disk writes them while the restore goes on, and the
/// syncfs that ends it has less left (left to the kernel, a restore smaller than its dirty-page
/// threshold, a tenth of the memory, would be written only by that syncfs). Smaller files are
/// left to it: a call per small file cost the Linux tree (78,579 files) 15 % more time, in
/// system calls and small early writes.
pub(crate) const WRITE_BACK_BYTES: u64 = 8 << 20;

/// Counts a finished item, starting its file's writeback (see [`WRITE_BACK_BYTES`]; a disk
/// that cannot write fails the restore, see [`crate::sys::start_writeback`]); the last one of
/// its file sets the file's metadata.
pub(crate) fn finish_item(shared: &Shared, item: Item) -> RepoResult<()> {
    if item.file.write_back {
        crate::sys::start_writeback(item.file.file.as_fd())
            .map_err(|e| RepoError::io("write back", &item.file.path, e))?;
    }
    if item.file.pending.fetch_sub(1, Ordering::AcqRel) == 1 {
        let mut warnings = Warnings::default();
        let f = &item.file;
        fsops::apply_fd(&f.file, &f.meta, shared, &f.path.display().to_string(), &mut warnings)
            .map_err(|e| RepoError::io("set metadata of", &f.path, e))?;
        shared.warn(warnings);
        shared.progress.files_done.fetch_add(1, Ordering::Relaxed);
    }
    Ok(())
}
