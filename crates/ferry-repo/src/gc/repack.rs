//! Repacking: copies the live blobs of mostly dead packs into new packs.
//!
//! The in-memory index keeps only the leading bytes of each blob id, so a pack to repack is
//! read whole and its blobs' full ids come from its authenticated header: each blob to keep
//! must be listed there at the place the index gives, with an id starting with the index's.
//! Each blob is authenticated before it is copied (a damaged blob stops the collection
//! rather than being spread), then copied sealed (its encryption binds only its id and kind,
//! not its pack). A frame whose blobs are all live is copied sealed too, as it was stored
//! (nor does its encryption bind its place): it is opened only to check its blobs, never
//! compressed again. The live blobs of a frame that also holds dead ones go into a new frame,
//! in the old frame's order; the dead ones are left. The new packs are stored, then named by
//! index files, all before the mark that condemns the old packs is written.

use std::collections::HashMap;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{
    BlobId, BlobOpener, DEFAULT_DATA_LEVEL, FormatError, Frame, FrameBuilder, IndexPack,
    ObjectKind, PackBuilder, PackEntry, SealedPack, read_pack_header,
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
    /// Frames copied as they were stored (all their blobs live).
    pub(crate) whole_frames: u64,
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
        // The index places every blob of a frame at the frame's offset: one group per object.
        let mut j = i;
        while j < end {
            let offset = entries[j].1.offset;
            let stop =
                entries[j..end].iter().position(|(_, l)| l.offset != offset).map_or(end, |n| j + n);
            let mut group = Vec::with_capacity(stop - j);
            for (short, loc) in &entries[j..stop] {
                group.push(
                    full_entry(&listed, short, loc)
                        .map_err(|err| RepoError::corrupt(format!("pack {key}"), err))?,
                );
            }
            let sealed_of = |e: &PackEntry| {
                sealed_bytes(&bytes, e)
                    .map_err(|err| RepoError::corrupt(format!("pack {key}"), err))
            };
            let first = group[0];
            let mut whole = false;
            if first.kind == ObjectKind::FramedData {
                let (opened, _) = opener
                    .frame(repo.keys(), (pack, offset), sealed_of(&first)?)
                    .map_err(|err| {
                        RepoError::corrupt(
                            format!("{} {} in pack {key}", first.kind, first.id),
                            err,
                        )
                    })?;
                whole = whole_frame(&listed, &group) && opened.len() == group.len();
                if !whole {
                    in_frame_order(&mut group, opened);
                }
            }
            let mut kept = Vec::new();
            for e in &group {
                let sealed = sealed_of(e)?;
                let opened = opener
                    .open(repo.keys(), &e.id, (e.kind, e.raw_length), (pack, e.offset), sealed)
                    .map_err(|err| {
                        RepoError::corrupt(format!("{} {} in pack {key}", e.kind, e.id), err)
                    })?;
                copied.blobs += 1;
                if whole {
                    kept.push((e.id, e.raw_length));
                } else if e.kind == ObjectKind::FramedData {
                    // Into a new frame: only the frame's live blobs.
                    frame.push(e.id, &opened);
                    if frame.is_full() {
                        data.seal_frame(repo.keys(), DEFAULT_DATA_LEVEL, &mut frame, &mut plain);
                    }
                } else {
                    let builder =
                        if e.kind == ObjectKind::TreeBlob { &mut tree } else { &mut data };
                    builder.push_sealed(e.id, e.kind, sealed, e.raw_length as usize);
                }
            }
            if whole {
                // Every blob of the frame is live and checked, and the frame holds no other:
                // the same sealed bytes serve in the new pack.
                data.push_frame(sealed_of(&first)?, &kept);
                copied.whole_frames += 1;
            }
            for builder in [&mut data, &mut tree] {
                if builder.filled() >= target {
                    let full = std::mem::take(builder);
                    stored.push(store(repo, full, &mut copied, cancel).await?);
                }
            }
            j = stop;
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

/// The sealed bytes of the object `e` locates in `pack`.
fn sealed_bytes<'a>(pack: &'a [u8], e: &PackEntry) -> Result<&'a [u8], FormatError> {
    let (start, stop) = (e.offset as usize, e.offset as usize + e.length as usize);
    pack.get(start..stop).ok_or_else(|| FormatError::Invalid {
        what: "pack",
        reason: format!("blob {} lies outside the pack", e.id),
    })
}

/// Whether `group` (the live blobs at one offset, as the pack's header lists them; sorted
/// `listed` is the whole header) is every blob the header lists in that frame, each once.
fn whole_frame(listed: &[PackEntry], group: &[PackEntry]) -> bool {
    let Some(first) = group.first().filter(|e| e.kind == ObjectKind::FramedData) else {
        return false;
    };
    let start = listed.partition_point(|e| e.offset < first.offset);
    let in_frame = listed[start..].iter().take_while(|e| e.offset == first.offset).count();
    let mut ids: Vec<&BlobId> = group.iter().map(|e| &e.id).collect();
    ids.sort_unstable();
    ids.dedup();
    group.iter().all(|e| e.kind == ObjectKind::FramedData && e.length == first.length)
        && ids.len() == group.len()
        && group.len() == in_frame
}

/// Sorts `group` (live blobs of one frame) into the frame's own order: a rebuilt frame then
/// keeps neighbours together as the backup wrote them (the index yields them in hash order,
/// which compresses worse).
fn in_frame_order(group: &mut [PackEntry], frame: &Frame) {
    if group.len() < 2 {
        return;
    }
    let order: HashMap<([u8; 8], usize), usize> =
        frame.blobs().enumerate().map(|(n, (prefix, bytes))| ((prefix, bytes.len()), n)).collect();
    group.sort_by_key(|e| {
        order
            .get(&(crate::format::frame::prefix(&e.id), e.raw_length as usize))
            .copied()
            .unwrap_or(usize::MAX)
    });
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
#[allow(clippy::unwrap_used)]
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
        BlobLocation::listed(PackId([1; 32]), e)
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

    #[test]
    fn a_frame_is_whole_when_its_live_blobs_are_every_blob_the_header_lists_there() {
        let framed = |id: u8, offset: u32| PackEntry {
            kind: ObjectKind::FramedData,
            length: 100,
            ..entry(id, offset)
        };
        let listed = vec![entry(9, 0), framed(1, 10), framed(2, 10), framed(3, 10), framed(4, 110)];
        let frame = &listed[1..4];
        assert!(whole_frame(&listed, frame));
        assert!(!whole_frame(&listed, &frame[..2]), "a dead blob left in it");
        assert!(!whole_frame(&listed, &[frame[0], frame[1], frame[1]]), "a blob twice");
        assert!(whole_frame(&listed, &listed[4..]), "a frame of one blob");
        assert!(!whole_frame(&listed, &listed[..1]), "not a frame");
        assert!(!whole_frame(&listed, &[]));
    }

    /// Repacks a pack holding one frame of `held` blobs whose header lists only the first
    /// `listed`, all of those live.
    async fn repack_frame_listing(held: usize, listed: usize) -> RepoResult<Copied> {
        let cancel = CancellationToken::new();
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let (repo, _) = Repository::init(store, b"pw", &fast_options(), &cancel).await?;
        let mut frame = FrameBuilder::default();
        for n in 0..held {
            let bytes = vec![n as u8; 100 + n];
            frame.push(repo.keys().blob_id(&bytes), &bytes);
        }
        let (mut plain, mut sealed) = (Vec::new(), Vec::new());
        let blobs = frame.seal_into(repo.keys(), 3, &mut plain, &mut sealed);
        let mut builder = PackBuilder::new();
        builder.push_frame(&sealed, &blobs[..listed]);
        let packed = builder.finish(&repo.keys().cipher, repo.config().format);
        let pack = put_pack(&repo, packed, "test", &cancel).await?;
        let places: Vec<_> = pack
            .entries
            .iter()
            .map(|e| (ShortId::of(&e.id), BlobLocation::listed(pack.id, e)))
            .collect();
        let lock = GcLock::acquire(&repo, &GcOptions::default(), &cancel).await?;
        let copied = run(&repo, places, &lock.0.checker(), &cancel).await;
        lock.0.release().await;
        copied
    }

    /// A frame whose table holds a blob its pack's header does not list is rebuilt of the
    /// listed blobs, not copied with an unindexed blob in it.
    #[tokio::test]
    async fn a_frame_holding_a_blob_its_header_does_not_list_is_rebuilt() -> RepoResult<()> {
        let copied = repack_frame_listing(3, 2).await?;
        assert_eq!((copied.blobs, copied.whole_frames), (2, 0));
        let copied = repack_frame_listing(3, 3).await?;
        assert_eq!((copied.blobs, copied.whole_frames), (3, 1), "the same frame, all listed");
        Ok(())
    }

    /// The sealed bytes of the object `e` locates, read from the store.
    async fn stored_object(repo: &Repository, pack: &PackId, e: &PackEntry) -> Vec<u8> {
        let key = layout::pack(pack).unwrap();
        let bytes = repo.store().get(&key, &CancellationToken::new()).await.unwrap();
        sealed_bytes(&bytes, e).unwrap().to_vec()
    }

    /// A frame whose blobs are all live is copied as it was stored (the same sealed bytes:
    /// its nonce is random, so a frame sealed again could not match); a frame also holding
    /// dead blobs gives its live ones to a new frame. Both read back checked.
    #[tokio::test]
    async fn a_frame_of_live_blobs_only_is_copied_as_stored() -> RepoResult<()> {
        let cancel = CancellationToken::new();
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let (repo, _) = Repository::init(store, b"pw", &fast_options(), &cancel).await?;
        assert!(repo.config().format.frames());
        // 6 KiB blobs of noise: about 170 fill a frame, so these make two.
        let blobs: Vec<Vec<u8>> =
            (0..240).map(|_| (0..6 << 10).map(|_| rand::random::<u8>()).collect()).collect();
        let ids = write_blobs(&repo, blobs).await?;
        let index = repo.index(&cancel).await?;
        let mut frames: std::collections::BTreeMap<(PackId, u32), Vec<(BlobId, BlobLocation)>> =
            std::collections::BTreeMap::new();
        for id in &ids {
            let loc = index.lookup(id).unwrap();
            assert_eq!(loc.kind, ObjectKind::FramedData);
            frames.entry((loc.pack, loc.offset)).or_default().push((*id, loc));
        }
        assert_eq!(frames.len(), 2, "two frames");
        let mut frames: Vec<_> = frames.into_values().collect();
        frames.sort_by_key(|f| std::cmp::Reverse(f.len()));
        let (whole, halved) = (&frames[0], &frames[1]);
        // All of the first frame, every other blob of the second.
        let mut places: Vec<(ShortId, BlobLocation)> = whole
            .iter()
            .chain(halved.iter().step_by(2))
            .map(|(id, loc)| (ShortId::of(id), *loc))
            .collect();
        // The index yields a frame's blobs in hash order, not the frame's: here, reversed.
        places.reverse();
        places.sort_by(|a, b| a.1.pack.cmp(&b.1.pack).then(a.1.offset.cmp(&b.1.offset)));
        let before: Vec<_> = repo.store().list(layout::DATA, &cancel).await.unwrap();
        let lock = GcLock::acquire(&repo, &GcOptions::default(), &cancel).await?;
        let copied = run(&repo, places.clone(), &lock.0.checker(), &cancel).await;
        lock.0.release().await;
        let copied = copied?;
        assert_eq!((copied.blobs, copied.whole_frames), (places.len() as u64, 1));

        // Where the new packs put each blob, from their headers.
        let mut new_places = std::collections::HashMap::new();
        for meta in repo.store().list(layout::DATA, &cancel).await.unwrap() {
            if before.iter().any(|m| m.key == meta.key) {
                continue;
            }
            let pack = PackId(layout::id_of(&meta.key).unwrap());
            let bytes = repo.store().get(&meta.key, &cancel).await.unwrap();
            for e in read_pack_header(&repo.keys().cipher, &bytes).unwrap().entries {
                assert!(new_places.insert(e.id, (pack, e)).is_none(), "each blob copied once");
            }
        }
        assert_eq!(new_places.len(), places.len(), "the live blobs and no other");
        let stored = |loc: &BlobLocation| PackEntry {
            id: BlobId([0; 32]),
            kind: loc.kind,
            offset: loc.offset,
            length: loc.length,
            raw_length: loc.raw_length,
        };
        let old_whole = stored_object(&repo, &whole[0].1.pack, &stored(&whole[0].1)).await;
        let old_halved = stored_object(&repo, &halved[0].1.pack, &stored(&halved[0].1)).await;
        let mut opener = BlobOpener::default();
        for (n, (id, loc)) in whole.iter().chain(halved.iter().step_by(2)).enumerate() {
            let (pack, e) = new_places[id];
            let sealed = stored_object(&repo, &pack, &e).await;
            if n < whole.len() {
                assert_eq!(sealed, old_whole, "the whole frame's bytes, unchanged");
            } else {
                assert_ne!(sealed, old_halved, "a new frame");
                assert!(sealed.len() < old_halved.len() * 2 / 3, "of half the blobs");
            }
            if n == whole.len() {
                // The rebuilt frame keeps the old one's order.
                let rebuilt = Frame::open(repo.keys(), &sealed).unwrap();
                let old = Frame::open(repo.keys(), &old_halved).unwrap();
                let old_order: Vec<[u8; 8]> = old.blobs().map(|(p, _)| p).collect();
                let live: Vec<[u8; 8]> = rebuilt.blobs().map(|(p, _)| p).collect();
                let kept: Vec<[u8; 8]> = old_order.iter().copied().step_by(2).collect();
                assert_eq!(live, kept, "the live blobs, in the old frame's order");
            }
            let raw =
                opener.open(repo.keys(), id, (e.kind, e.raw_length), (pack, e.offset), &sealed);
            assert_eq!(repo.keys().blob_id(&raw.unwrap()), *id);
            assert_eq!(e.raw_length, loc.raw_length);
        }
        Ok(())
    }
}
