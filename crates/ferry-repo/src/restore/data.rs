//! Restore workers: fetch the blobs of a batch of file ranges with few, coalesced reads (several
//! in flight at once, see [`crate::pack_reads`]), verify them, and write them in place.

use std::collections::HashMap;
use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use super::frames::{Claim, Claims, FrameKey};
use crate::error::{RepoError, RepoResult};
use crate::format::{ChunkRef, Frame, Metadata, ObjectKind, open_blob};
use crate::pack_reads;
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
/// merged reads; the frames another batch is fetching are waited for, after (see
/// [`super::frames`]).
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
    let mut claims = Claims::new(&shared.frames);
    let mut decided: HashMap<FrameKey, Claim> = HashMap::new();
    let (mut fetch, mut waiting): (Vec<Want>, Vec<Want>) = wants.into_iter().partition(|w| {
        if w.loc.kind != ObjectKind::FramedData {
            return true;
        }
        let key = (w.loc.pack, w.loc.offset);
        let claim = *decided.entry(key).or_insert_with(|| shared.frames.claim(key));
        if claim == Claim::Fetch && !claims.open.contains(&key) {
            claims.open.push(key);
        }
        claim == Claim::Fetch
    });
    fetch_and_write(shared, &batch, &mut fetch, Some(&mut claims))?;
    // Every frame claimed is published by now; none left for others to wait on.
    drop(claims);
    waiting.sort_by_key(|w| (w.loc.pack, w.loc.offset, w.chunk.id));
    let mut fetch_after = vec![false; waiting.len()];
    let mut i = 0;
    while let Some(first) = waiting.get(i) {
        let key = (first.loc.pack, first.loc.offset);
        let end = waiting[i..]
            .iter()
            .position(|w| (w.loc.pack, w.loc.offset) != key)
            .map_or(waiting.len(), |n| i + n);
        match shared.frames.wait(key, &shared.stop) {
            Some(frame) => {
                for w in &waiting[i..end] {
                    let raw = frame
                        .blob(shared.repo.keys(), &w.chunk.id, w.loc.raw_length)
                        .map_err(|e| RepoError::corrupt(blob_in(w), e))?;
                    write_want(shared, &batch, w, raw)?;
                }
            }
            None if shared.stop.is_cancelled() => return Err(RepoError::Cancelled),
            // Its fetch failed elsewhere, or it was evicted: fetch it here.
            None => fetch_after[i..end].iter_mut().for_each(|f| *f = true),
        }
        i = end;
    }
    let mut rest: Vec<Want> =
        waiting.into_iter().zip(fetch_after).filter(|(_, f)| *f).map(|(w, _)| w).collect();
    fetch_and_write(shared, &batch, &mut rest, None)?;
    for item in batch {
        finish_item(shared, item)?;
    }
    Ok(())
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
    mut claims: Option<&mut Claims<'_>>,
) -> RepoResult<()> {
    if wants.is_empty() {
        return Ok(());
    }
    wants.sort_by_key(|w| (w.loc.pack, w.loc.offset, w.chunk.id));
    let reads = pack_reads::plan(wants, |w| &w.loc)?;
    let keys = shared.repo.keys();
    shared.repo.fetch_packs_in_order(&shared.handle, &reads, &shared.stop, |read, bytes| {
        let mut frame: Option<(FrameKey, Arc<Frame>)> = None;
        let mut last: Option<(crate::format::BlobId, Vec<u8>)> = None;
        for w in &wants[read.wants.clone()] {
            let sealed = read.sealed(&bytes, &w.loc)?;
            let corrupt =
                |e| RepoError::corrupt(format!("data blob {} in pack {}", w.chunk.id, read.key), e);
            if w.loc.kind == ObjectKind::FramedData {
                let at = (w.loc.pack, w.loc.offset);
                let opened = match &frame {
                    Some((key, opened)) if *key == at => Arc::clone(opened),
                    _ => {
                        let opened = Arc::new(Frame::open(keys, sealed).map_err(corrupt)?);
                        if let Some(claims) = claims.as_deref_mut()
                            && claims.open.contains(&at)
                        {
                            claims.publish(at, Arc::clone(&opened), opened.plain_len());
                        }
                        frame = Some((at, Arc::clone(&opened)));
                        opened
                    }
                };
                let raw = opened.blob(keys, &w.chunk.id, w.loc.raw_length).map_err(corrupt)?;
                write_want(shared, batch, w, raw)?;
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

/// Counts a finished item; the last one of its file sets the file's metadata.
pub(crate) fn finish_item(shared: &Shared, item: Item) -> RepoResult<()> {
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
