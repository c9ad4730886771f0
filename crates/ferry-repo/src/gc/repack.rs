//! Repacking: copies the live blobs of mostly dead packs into new packs.
//!
//! The in-memory index keeps only the leading bytes of each blob id, so a pack to repack is
//! read whole and its blobs' full ids come from its authenticated header: each blob to keep
//! must be listed there at the place the index gives, with an id starting with the index's.
//! Each blob is authenticated before it is copied (a damaged blob stops the collection
//! rather than being spread), then copied sealed (its encryption binds only its id and kind,
//! not its pack); the live blobs of a frame go into a new frame, the dead ones are left. The
//! new packs are stored, then named by index files, all before the mark that condemns the
//! old packs is written.

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{
    BlobOpener, DEFAULT_DATA_LEVEL, FormatError, FrameBuilder, IndexPack, ObjectKind, PackBuilder,
    PackEntry, SealedPack, read_pack_header,
};
use crate::gc::lease::LeaseCheck;
use crate::repo::capped::{self, Limit};
use crate::repo::writer::{CHECKPOINT_BLOBS, write_index};
use crate::repo::{BlobLocation, Repository, ShortId, layout};

/// What repacking wrote.
#[derive(Debug, Default)]
pub(crate) struct Copied {
    pub(crate) blobs: u64,
    pub(crate) bytes: u64,
}

/// Packs per index file written by repacking.
const PACKS_PER_INDEX: usize = 64;

/// Copies the blobs `entries` locate (grouped by source pack) into new packs and indexes
/// them.
pub(crate) async fn run(
    repo: &Repository,
    entries: Vec<(ShortId, BlobLocation)>,
    lock: &LeaseCheck,
    cancel: &CancellationToken,
) -> RepoResult<Copied> {
    let target = repo.config().packs.target_size as usize;
    let mut copied = Copied::default();
    let mut data = PackBuilder::new();
    let mut tree = PackBuilder::new();
    let mut stored: Vec<IndexPack> = Vec::new();
    let (mut frame, mut plain, mut opener) =
        (FrameBuilder::default(), Vec::new(), BlobOpener::default());
    let mut i = 0;
    while i < entries.len() {
        let pack = entries[i].1.pack;
        let end =
            entries[i..].iter().position(|(_, l)| l.pack != pack).map_or(entries.len(), |n| i + n);
        let key = layout::pack(&pack)?;
        let read =
            capped::read(repo.store().as_ref(), &key, Limit::PACK, "read pack to repack", cancel);
        let bytes = read.await?;
        let mut listed = read_pack_header(&repo.keys().cipher, &bytes)
            .map_err(|err| RepoError::corrupt(format!("pack {key}"), err))?
            .entries;
        listed.sort_unstable_by_key(|e| e.offset);
        for (short, loc) in &entries[i..end] {
            let e = full_entry(&listed, short, loc)
                .map_err(|err| RepoError::corrupt(format!("pack {key}"), err))?;
            let (start, stop) = (e.offset as usize, e.offset as usize + e.length as usize);
            let sealed = bytes.get(start..stop).ok_or_else(|| {
                RepoError::corrupt(
                    format!("pack {key}"),
                    FormatError::Invalid {
                        what: "pack",
                        reason: format!("blob {} lies outside the pack", e.id),
                    },
                )
            })?;
            let opened = opener
                .open(repo.keys(), &e.id, (e.kind, e.raw_length), (pack, e.offset), sealed)
                .map_err(|err| {
                    RepoError::corrupt(format!("{} {} in pack {key}", e.kind, e.id), err)
                })?;
            copied.blobs += 1;
            if e.kind == ObjectKind::FramedData {
                // Into a new frame: a frame is copied blob by blob, only its live ones.
                frame.push(e.id, &opened);
                if frame.is_full() {
                    data.seal_frame(repo.keys(), DEFAULT_DATA_LEVEL, &mut frame, &mut plain);
                }
            } else {
                let builder = if e.kind == ObjectKind::TreeBlob { &mut tree } else { &mut data };
                builder.push_sealed(e.id, e.kind, sealed, e.raw_length as usize);
            }
            for builder in [&mut data, &mut tree] {
                if builder.filled() >= target {
                    let full = std::mem::take(builder);
                    stored.push(store(repo, full, &mut copied, cancel).await?);
                }
            }
        }
        let blobs: usize = stored.iter().map(|p| p.entries.len()).sum();
        if stored.len() >= PACKS_PER_INDEX || blobs >= CHECKPOINT_BLOBS {
            lock.check()?;
            write_index(repo, std::mem::take(&mut stored), cancel).await?;
        }
        i = end;
    }
    if !frame.is_empty() {
        data.seal_frame(repo.keys(), DEFAULT_DATA_LEVEL, &mut frame, &mut plain);
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

/// The entry of a pack's header (`listed`, sorted by offset) for the blob the index places
/// at `loc` under `short`: at that offset, of that length and kind, with an id starting
/// with `short`.
fn full_entry(
    listed: &[PackEntry],
    short: &ShortId,
    loc: &BlobLocation,
) -> Result<PackEntry, FormatError> {
    let start = listed.partition_point(|e| e.offset < loc.offset);
    listed[start..]
        .iter()
        .take_while(|e| e.offset == loc.offset)
        .find(|e| {
            e.length == loc.length
                && e.kind == loc.kind
                && e.raw_length == loc.raw_length
                && short.matches(&e.id)
        })
        .copied()
        .ok_or_else(|| FormatError::Invalid {
            what: "pack",
            reason: format!(
                "the index places a {} at offset {} that the pack's header does not list there",
                loc.kind, loc.offset
            ),
        })
}

async fn store(
    repo: &Repository,
    builder: PackBuilder,
    copied: &mut Copied,
    cancel: &CancellationToken,
) -> RepoResult<IndexPack> {
    let sealed = builder.finish(&repo.keys().cipher, repo.config().format);
    let pack = put_pack(repo, sealed, "upload repacked pack", cancel).await?;
    copied.bytes += pack.size;
    Ok(pack)
}

/// Stores a sealed pack (`what`: the step, for the error) and returns its index listing.
pub(super) async fn put_pack(
    repo: &Repository,
    sealed: SealedPack,
    what: &'static str,
    cancel: &CancellationToken,
) -> RepoResult<IndexPack> {
    let key = layout::pack(&sealed.id)?;
    let size = sealed.bytes.len() as u64;
    repo.store()
        .put_if_absent(&key, Bytes::from(sealed.bytes), cancel)
        .await
        .map_err(|e| RepoError::store(what, &key, e))?;
    Ok(IndexPack { id: sealed.id, size, entries: sealed.entries })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ferry_store::{MemoryStore, ObjectStore};

    use super::*;
    use crate::format::{BlobId, PackId};
    use crate::gc::{GcLock, GcOptions};
    use crate::repo::tests::{fast_options, write_blobs};

    fn entry(id: u8, offset: u32) -> PackEntry {
        PackEntry {
            id: BlobId([id; 32]),
            kind: ObjectKind::DataBlob,
            offset,
            length: 10,
            raw_length: 4,
        }
    }

    fn at(e: &PackEntry) -> BlobLocation {
        BlobLocation {
            pack: PackId([1; 32]),
            offset: e.offset,
            length: e.length,
            raw_length: e.raw_length,
            kind: e.kind,
        }
    }

    #[test]
    fn the_full_id_comes_from_the_header_entry_at_the_indexed_place() {
        let listed = vec![entry(1, 2), entry(2, 12), entry(3, 22)];
        for e in &listed {
            assert_eq!(full_entry(&listed, &ShortId::of(&e.id), &at(e)).ok(), Some(*e));
        }
        // The index's short id names another blob than the header lists there.
        let wrong = full_entry(&listed, &ShortId::of(&BlobId([3; 32])), &at(&listed[0]));
        assert!(wrong.is_err());
        // The right id at another place, length or kind.
        let short = ShortId::of(&listed[1].id);
        let mut moved = at(&listed[1]);
        moved.offset = 13;
        assert!(full_entry(&listed, &short, &moved).is_err());
        let mut longer = at(&listed[1]);
        longer.length = 11;
        assert!(full_entry(&listed, &short, &longer).is_err());
        let mut tree = at(&listed[1]);
        tree.kind = ObjectKind::TreeBlob;
        let err = full_entry(&listed, &short, &tree).err().map(|e| e.to_string());
        assert!(err.is_some_and(|e| e.contains("does not list")), "names the problem");
    }

    #[tokio::test]
    async fn a_blob_the_header_does_not_list_where_the_index_says_stops_the_repack()
    -> RepoResult<()> {
        let cancel = CancellationToken::new();
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let (repo, _) = Repository::init(store, b"pw", &fast_options(), &cancel).await?;
        let ids = write_blobs(&repo, vec![b"first".to_vec(), b"second".to_vec()]).await?;
        let index = repo.index(&cancel).await?;
        let mut places = Vec::new();
        for id in &ids {
            let loc = index
                .lookup(id)
                .ok_or(RepoError::MissingBlob { id: *id, referrer: "test".into() })?;
            places.push((ShortId::of(id), loc));
        }
        places.sort_by(|a, b| a.1.pack.cmp(&b.1.pack).then(a.1.offset.cmp(&b.1.offset)));
        let lock = GcLock::acquire(&repo, &GcOptions::default(), &cancel).await?;
        let copied = run(&repo, places.clone(), &lock.0.checker(), &cancel).await;
        let mut stale = places.clone();
        stale[1].1.offset += 1;
        let refused = run(&repo, stale, &lock.0.checker(), &cancel).await;
        lock.0.release().await;
        assert_eq!(copied?.blobs, 2, "the index's places are copied");
        let err = refused.err().map(|e| (e.to_string(), matches!(e, RepoError::Corrupt { .. })));
        assert!(
            err.as_ref().is_some_and(|(m, corrupt)| *corrupt && m.contains("does not list")),
            "{err:?}"
        );
        Ok(())
    }
}
