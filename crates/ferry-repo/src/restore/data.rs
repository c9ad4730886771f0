//! Restore workers: fetch the blobs of a batch of file ranges with few, coalesced reads (several
//! in flight at once, see [`crate::pack_reads`]), verify them, and write them in place.

use std::fs::File;
use std::os::fd::OwnedFd;
use std::os::unix::fs::FileExt;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use crate::error::{RepoError, RepoResult};
use crate::format::{BlobOpener, ChunkRef, Metadata, ObjectKind};
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

/// Writes one batch.
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
    wants.sort_by_key(|w| (w.loc.pack, w.loc.offset, w.chunk.id));
    let reads = pack_reads::plan(&wants, |w| &w.loc)?;
    shared.repo.fetch_packs_in_order(&shared.handle, &reads, &shared.stop, |read, bytes| {
        let key = &read.key;
        let mut opener = BlobOpener::default();
        let mut last: Option<(crate::format::BlobId, Vec<u8>)> = None;
        for w in &wants[read.wants.clone()] {
            let raw = match &last {
                Some((id, raw)) if *id == w.chunk.id => raw,
                _ => {
                    let sealed = read.sealed(&bytes, &w.loc)?;
                    let (kind, at) = ((w.loc.kind, w.loc.raw_length), (w.loc.pack, w.loc.offset));
                    let raw = opener
                        .open(shared.repo.keys(), &w.chunk.id, kind, at, sealed)
                        .map_err(|e| {
                            RepoError::corrupt(format!("data blob {} in pack {key}", w.chunk.id), e)
                        })?;
                    &last.insert((w.chunk.id, raw.into_owned())).1
                }
            };
            if raw.len() != w.chunk.len as usize {
                return Err(RepoError::corrupt(
                    format!("data blob {} in pack {key}", w.chunk.id),
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
        }
        Ok(())
    })?;
    for item in batch {
        finish_item(shared, item)?;
    }
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
