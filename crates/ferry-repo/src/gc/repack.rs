//! Repacking: copies the live blobs of mostly dead packs into new packs.
//!
//! Each blob is authenticated before it is copied (a damaged blob stops the collection
//! rather than being spread), then copied sealed (its encryption binds only its id and kind,
//! not its pack). The new packs are stored, then named by index files, all before the mark
//! that condemns the old packs is written.

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{IndexPack, ObjectKind, PackBuilder, PackEntry, PackId, open_blob};
use crate::gc::lease::LeaseCheck;
use crate::repo::capped::{self, Limit};
use crate::repo::writer::write_index;
use crate::repo::{Repository, layout};

/// What repacking wrote.
#[derive(Debug, Default)]
pub(crate) struct Copied {
    pub(crate) blobs: u64,
    pub(crate) bytes: u64,
}

/// Packs per index file written by repacking.
const PACKS_PER_INDEX: usize = 64;

/// Copies `entries` (grouped by source pack) into new packs and indexes them.
pub(crate) async fn run(
    repo: &Repository,
    entries: Vec<(PackId, PackEntry)>,
    lock: &LeaseCheck,
    cancel: &CancellationToken,
) -> RepoResult<Copied> {
    let target = repo.config().packs.target_size as usize;
    let mut copied = Copied::default();
    let mut data = PackBuilder::new();
    let mut tree = PackBuilder::new();
    let mut stored: Vec<IndexPack> = Vec::new();
    let mut i = 0;
    while i < entries.len() {
        let pack = entries[i].0;
        let end =
            entries[i..].iter().position(|(p, _)| *p != pack).map_or(entries.len(), |n| i + n);
        let key = layout::pack(&pack)?;
        let read =
            capped::read(repo.store().as_ref(), &key, Limit::PACK, "read pack to repack", cancel);
        let bytes = read.await?;
        for (_, e) in &entries[i..end] {
            let (start, stop) = (e.offset as usize, e.offset as usize + e.length as usize);
            let sealed = bytes.get(start..stop).ok_or_else(|| {
                RepoError::corrupt(
                    format!("pack {key}"),
                    crate::format::FormatError::Invalid {
                        what: "pack",
                        reason: format!("blob {} lies outside the pack", e.id),
                    },
                )
            })?;
            open_blob(repo.keys(), &e.id, e.kind, sealed).map_err(|err| {
                RepoError::corrupt(format!("{} {} in pack {key}", e.kind, e.id), err)
            })?;
            let builder = if e.kind == ObjectKind::TreeBlob { &mut tree } else { &mut data };
            builder.push_sealed(e.id, e.kind, sealed, e.raw_length as usize);
            copied.blobs += 1;
            if builder.size() >= target {
                let full = std::mem::take(builder);
                stored.push(store(repo, full, &mut copied, cancel).await?);
            }
        }
        if stored.len() >= PACKS_PER_INDEX {
            lock.check()?;
            write_index(repo, std::mem::take(&mut stored), cancel).await?;
        }
        i = end;
    }
    for builder in [data, tree] {
        if !builder.is_empty() {
            stored.push(store(repo, builder, &mut copied, cancel).await?);
        }
    }
    if !stored.is_empty() {
        lock.check()?;
        write_index(repo, stored, cancel).await?;
    }
    Ok(copied)
}

async fn store(
    repo: &Repository,
    builder: PackBuilder,
    copied: &mut Copied,
    cancel: &CancellationToken,
) -> RepoResult<IndexPack> {
    let sealed = builder.finish(&repo.keys().cipher, repo.config().format);
    let key = layout::pack(&sealed.id)?;
    let size = sealed.bytes.len() as u64;
    repo.store()
        .put_if_absent(&key, Bytes::from(sealed.bytes), cancel)
        .await
        .map_err(|e| RepoError::store("upload repacked pack", &key, e))?;
    copied.bytes += size;
    Ok(IndexPack { id: sealed.id, size, entries: sealed.entries })
}
