//! The in-memory index: where every blob lives.
//!
//! Loaded entries sit in one vector sorted by blob id, 48 bytes each (32-byte id, pack
//! number, offset, sealed length, raw length with the blob kind in its top bit), plus one
//! 40-byte record per pack. A repository of 1 M chunks therefore needs about 48 MB; lookups
//! are binary searches with no locking. Blobs added by this process sit in 256 shards by the
//! id's first byte until the next reload, each a sorted vector (48 bytes a blob) and a small
//! map of the latest (see [`Added`]).

use std::collections::{HashMap, HashSet};
use std::sync::RwLock;

use crate::format::{BlobId, IndexFile, IndexId, ObjectKind, PackId};

const TREE_BIT: u32 = 1 << 31;

/// Where one blob is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlobLocation {
    /// The pack holding it.
    pub pack: PackId,
    /// Offset of the sealed blob in the pack.
    pub offset: u32,
    /// Sealed length.
    pub length: u32,
    /// Plaintext length.
    pub raw_length: u32,
    /// Data or tree.
    pub kind: ObjectKind,
}

#[derive(Debug, Clone, Copy)]
struct Slot {
    id: BlobId,
    pack: u32,
    offset: u32,
    length: u32,
    raw_and_kind: u32,
}

/// Blobs stored by this process since the index was loaded: the same fields as a [`Slot`],
/// the pack by number (a first backup of a million small files adds a million blobs).
///
/// The blobs are in [`ADDED_SHARDS`] shards by their id's first byte (ids are keyed hashes, so
/// evenly spread). One hash map of a million blobs grew by doubling: 50 MB copied into a new
/// 100 MB table, 150 MB at once; 256 maps grew in step and took 103 MB. So each shard keeps
/// its blobs in a vector sorted by id (48 bytes a blob), and only the latest in a small map,
/// merged into the vector once it holds an eighth as many.
#[derive(Debug)]
struct Added {
    packs: Vec<PackInfo>,
    numbers: HashMap<PackId, u32>,
    shards: Vec<AddedShard>,
}

const ADDED_SHARDS: usize = 256;

impl Default for Added {
    fn default() -> Self {
        Self {
            packs: Vec::new(),
            numbers: HashMap::new(),
            shards: (0..ADDED_SHARDS).map(|_| AddedShard::default()).collect(),
        }
    }
}

impl Added {
    fn get(&self, id: &BlobId) -> Option<BlobLocation> {
        let s = self.shards.get(usize::from(id.0[0]))?.get(id)?;
        Some(located(self.packs.get(s.pack as usize)?, s.offset, s.length, s.raw_and_kind))
    }
}

/// The added blobs whose id starts with one byte.
#[derive(Debug, Default)]
struct AddedShard {
    /// Sorted by id, one slot per id.
    sorted: Vec<Slot>,
    recent: HashMap<BlobId, AddedSlot>,
}

impl AddedShard {
    /// The latest in `recent` merge into `sorted` once they are this many: a shard grows by
    /// an eighth at each merge, so a slot goes through about nine merges (two copies each),
    /// and the map holds at most an eighth of the shard's blobs.
    fn merge_at(&self) -> usize {
        (self.sorted.len() / 8).max(64)
    }

    fn get(&self, id: &BlobId) -> Option<AddedSlot> {
        if let Some(s) = self.recent.get(id) {
            return Some(*s);
        }
        let s = self.sorted.get(self.sorted.binary_search_by(|s| s.id.cmp(id)).ok()?)?;
        Some(AddedSlot {
            pack: s.pack,
            offset: s.offset,
            length: s.length,
            raw_and_kind: s.raw_and_kind,
        })
    }

    /// Adds a blob; one already here keeps its first location (both are stored and indexed).
    fn insert(&mut self, id: BlobId, slot: AddedSlot) {
        if self.sorted.binary_search_by(|s| s.id.cmp(&id)).is_ok() {
            return;
        }
        self.recent.entry(id).or_insert(slot);
        if self.recent.len() >= self.merge_at() {
            self.merge();
        }
    }

    /// Moves `recent` into `sorted`.
    fn merge(&mut self) {
        let mut merged = Vec::with_capacity(self.sorted.len() + self.recent.len());
        merged.append(&mut self.sorted);
        merged.extend(self.recent.drain().map(|(id, s)| Slot {
            id,
            pack: s.pack,
            offset: s.offset,
            length: s.length,
            raw_and_kind: s.raw_and_kind,
        }));
        // The old vector is one sorted run: a stable sort sorts the new slots and merges the
        // two in one pass (no id is in both: `insert` keeps out what `sorted` holds).
        merged.sort_by_key(|s| s.id);
        self.sorted = merged;
    }
}

#[derive(Debug, Clone, Copy)]
struct AddedSlot {
    pack: u32,
    offset: u32,
    length: u32,
    raw_and_kind: u32,
}

/// What is known about one pack.
#[derive(Debug, Clone, Copy)]
pub(crate) struct PackInfo {
    pub(crate) id: PackId,
    pub(crate) size: u64,
}

/// The set of blob locations.
#[derive(Debug, Default)]
pub(crate) struct MemIndex {
    packs: Vec<PackInfo>,
    pack_numbers: HashMap<PackId, u32>,
    slots: Vec<Slot>,
    added: RwLock<Added>,
    files: HashSet<IndexId>,
    /// Garbage-collection marks whose condemned packs were left out (see `crate::gc`).
    pub(crate) gc_marks: Vec<String>,
}

impl MemIndex {
    /// Builds the index from decoded index files, honouring `supersedes`.
    pub(crate) fn build(files: Vec<(IndexId, IndexFile)>) -> Self {
        Self::build_excluding(files, &HashSet::new())
    }

    /// As [`MemIndex::build`], leaving out the blobs of the `excluded` packs (condemned by
    /// garbage collection), so a copy in another pack is found instead, or none.
    pub(crate) fn build_excluding(
        files: Vec<(IndexId, IndexFile)>,
        excluded: &HashSet<PackId>,
    ) -> Self {
        let mut builder = IndexBuilder::new(excluded.clone());
        for (id, file) in files {
            builder.add(id, file);
        }
        builder.finish()
    }

    /// Index files this index was built from.
    pub(crate) fn files(&self) -> &HashSet<IndexId> {
        &self.files
    }

    /// Packs by number.
    pub(crate) fn packs(&self) -> &[PackInfo] {
        &self.packs
    }

    /// Calls `f` with every loaded blob (one location per id), in id order.
    pub(crate) fn for_each(&self, mut f: impl FnMut(&BlobId, usize, BlobLocation)) {
        for s in &self.slots {
            if let Some(loc) = self.location(s) {
                f(&s.id, s.pack as usize, loc);
            }
        }
    }

    fn location(&self, s: &Slot) -> Option<BlobLocation> {
        Some(located(self.packs.get(s.pack as usize)?, s.offset, s.length, s.raw_and_kind))
    }

    /// Where `id` is, if anywhere.
    pub(crate) fn lookup(&self, id: &BlobId) -> Option<BlobLocation> {
        if let Ok(pos) = self.slots.binary_search_by(|s| s.id.cmp(id)) {
            return self.location(&self.slots[pos]);
        }
        self.added.read().ok()?.get(id)
    }

    /// Whether `id` is stored.
    pub(crate) fn contains(&self, id: &BlobId) -> bool {
        self.lookup(id).is_some()
    }

    /// Records blobs of a pack stored by this process.
    pub(crate) fn add_pack(&self, pack: PackId, size: u64, entries: &[crate::format::PackEntry]) {
        let Ok(mut added) = self.added.write() else { return };
        let added = &mut *added;
        let number = *added.numbers.entry(pack).or_insert_with(|| {
            added.packs.push(PackInfo { id: pack, size });
            u32::try_from(added.packs.len() - 1).unwrap_or(u32::MAX)
        });
        for e in entries {
            let Some(shard) = added.shards.get_mut(usize::from(e.id.0[0])) else { continue };
            shard.insert(
                e.id,
                AddedSlot {
                    pack: number,
                    offset: e.offset,
                    length: e.length,
                    raw_and_kind: raw_and_kind(e.raw_length, e.kind),
                },
            );
        }
    }

    /// Size of a pack, if known.
    pub(crate) fn pack_size(&self, id: &PackId) -> Option<u64> {
        if let Some(n) = self.pack_numbers.get(id) {
            return self.packs.get(*n as usize).map(|p| p.size);
        }
        let added = self.added.read().ok()?;
        added.packs.get(*added.numbers.get(id)? as usize).map(|p| p.size)
    }
}

/// Builds a [`MemIndex`] from index files one at a time, as they are read: each file's
/// entries become slots (48 bytes a blob) and the decoded file is dropped, so loading holds
/// the slots and the files in flight, not every decoded file beside the slots (about twice
/// the memory). A file known to be superseded when it arrives adds nothing; one superseded by
/// a file read later is taken out at [`IndexBuilder::finish`] (until then both are held).
#[derive(Debug)]
pub(crate) struct IndexBuilder {
    index: MemIndex,
    excluded: HashSet<PackId>,
    superseded: HashSet<IndexId>,
    /// Each file added, with the end of its slots in `index.slots` (they follow in order).
    spans: Vec<(IndexId, usize)>,
    /// Every (pack number, file number in `spans`) listing, so a pack only superseded files
    /// list is left out, as its blobs are.
    listings: Vec<(u32, u32)>,
}

impl IndexBuilder {
    /// A builder leaving out the blobs of the `excluded` packs.
    pub(crate) fn new(excluded: HashSet<PackId>) -> Self {
        Self {
            index: MemIndex::default(),
            excluded,
            superseded: HashSet::new(),
            spans: Vec::new(),
            listings: Vec::new(),
        }
    }

    /// Adds one decoded index file.
    pub(crate) fn add(&mut self, id: IndexId, file: IndexFile) {
        let index = &mut self.index;
        index.files.insert(id);
        self.superseded.extend(file.supersedes.iter().copied());
        let file_number = u32::try_from(self.spans.len()).unwrap_or(u32::MAX);
        // A file already known superseded adds nothing (its span stays empty).
        let packs = if self.superseded.contains(&id) { Vec::new() } else { file.packs };
        for pack in packs {
            if self.excluded.contains(&pack.id) {
                continue;
            }
            let number = *index.pack_numbers.entry(pack.id).or_insert_with(|| {
                index.packs.push(PackInfo { id: pack.id, size: pack.size });
                u32::try_from(index.packs.len() - 1).unwrap_or(u32::MAX)
            });
            self.listings.push((number, file_number));
            index.slots.extend(pack.entries.into_iter().map(|e| Slot {
                id: e.id,
                pack: number,
                offset: e.offset,
                length: e.length,
                raw_and_kind: raw_and_kind(e.raw_length, e.kind),
            }));
        }
        self.spans.push((id, index.slots.len()));
    }

    /// The index: superseded files' blobs and packs left out, slots sorted by id (one per id).
    pub(crate) fn finish(self) -> MemIndex {
        let Self { mut index, superseded, spans, listings, .. } = self;
        let dead: Vec<bool> = spans.iter().map(|(id, _)| superseded.contains(id)).collect();
        if dead.iter().any(|d| *d) {
            // Keep the slots of live files, in place.
            let mut kept = 0;
            let mut start = 0;
            for ((_, end), dead) in spans.iter().zip(&dead) {
                if !dead {
                    index.slots.copy_within(start..*end, kept);
                    kept += end - start;
                }
                start = *end;
            }
            index.slots.truncate(kept);
            // Keep the packs a live file lists, numbered anew.
            let mut live = vec![false; index.packs.len()];
            for (pack, file) in listings {
                if !dead.get(file as usize).copied().unwrap_or(true)
                    && let Some(l) = live.get_mut(pack as usize)
                {
                    *l = true;
                }
            }
            let mut renumbered = vec![u32::MAX; index.packs.len()];
            let mut packs = Vec::new();
            for ((info, live), new) in index.packs.iter().zip(&live).zip(&mut renumbered) {
                if *live {
                    *new = u32::try_from(packs.len()).unwrap_or(u32::MAX);
                    packs.push(*info);
                }
            }
            for slot in &mut index.slots {
                slot.pack = renumbered.get(slot.pack as usize).copied().unwrap_or(u32::MAX);
            }
            index.pack_numbers = packs
                .iter()
                .enumerate()
                .map(|(n, p)| (p.id, u32::try_from(n).unwrap_or(u32::MAX)))
                .collect();
            index.packs = packs;
        }
        index.slots.sort_unstable_by_key(|s| s.id);
        index.slots.dedup_by(|a, b| a.id == b.id);
        index.slots.shrink_to_fit();
        index
    }
}

/// A blob's raw length with its kind in the top bit.
fn raw_and_kind(raw_length: u32, kind: ObjectKind) -> u32 {
    let tree = if kind == ObjectKind::TreeBlob { TREE_BIT } else { 0 };
    (raw_length & !TREE_BIT) | tree
}

/// The location of a blob at `offset`/`length` in `pack`, from its packed raw length and kind.
fn located(pack: &PackInfo, offset: u32, length: u32, raw_and_kind: u32) -> BlobLocation {
    BlobLocation {
        pack: pack.id,
        offset,
        length,
        raw_length: raw_and_kind & !TREE_BIT,
        kind: if raw_and_kind & TREE_BIT != 0 {
            ObjectKind::TreeBlob
        } else {
            ObjectKind::DataBlob
        },
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{IndexPack, PackEntry};

    fn entry(id: u8, kind: ObjectKind) -> PackEntry {
        PackEntry {
            id: BlobId([id; 32]),
            kind,
            offset: 2 + u32::from(id),
            length: 50,
            raw_length: 7,
        }
    }

    fn pack(id: u8, entries: Vec<PackEntry>) -> IndexPack {
        IndexPack { id: PackId([id; 32]), size: 1000 + u64::from(id), entries }
    }

    #[test]
    fn a_superseded_file_leaves_its_blobs_and_packs_out_whichever_is_read_first() {
        let old = || IndexFile {
            packs: vec![
                pack(1, vec![entry(1, ObjectKind::DataBlob)]),
                pack(2, vec![entry(2, ObjectKind::DataBlob), entry(3, ObjectKind::TreeBlob)]),
            ],
            supersedes: vec![],
        };
        let unrelated = || IndexFile {
            packs: vec![pack(4, vec![entry(4, ObjectKind::DataBlob)])],
            supersedes: vec![],
        };
        let compacted = || IndexFile {
            packs: vec![pack(2, vec![entry(2, ObjectKind::DataBlob)]), pack(3, vec![])],
            supersedes: vec![IndexId([10; 32])],
        };
        for superseded_first in [true, false] {
            let mut builder = IndexBuilder::new(HashSet::from([PackId([4; 32])]));
            if superseded_first {
                builder.add(IndexId([10; 32]), old());
                builder.add(IndexId([11; 32]), unrelated());
                builder.add(IndexId([12; 32]), compacted());
            } else {
                builder.add(IndexId([12; 32]), compacted());
                builder.add(IndexId([11; 32]), unrelated());
                builder.add(IndexId([10; 32]), old());
            }
            let idx = builder.finish();
            let order = if superseded_first { "superseded first" } else { "superseding first" };
            assert!(!idx.contains(&BlobId([1; 32])), "{order}: a superseded file's blob is used");
            assert!(
                !idx.contains(&BlobId([3; 32])),
                "{order}: a superseded file's listing of a kept pack is used"
            );
            assert!(!idx.contains(&BlobId([4; 32])), "{order}: an excluded pack's blob is used");
            assert_eq!(idx.lookup(&BlobId([2; 32])).map(|l| l.pack), Some(PackId([2; 32])));
            assert_eq!(idx.pack_size(&PackId([1; 32])), None, "{order}: a superseded file's pack");
            assert_eq!(idx.pack_size(&PackId([2; 32])), Some(1002), "{order}");
            assert_eq!(idx.pack_size(&PackId([3; 32])), Some(1003), "{order}: an empty live pack");
            assert_eq!(idx.pack_size(&PackId([4; 32])), None, "{order}");
            let mut seen = Vec::new();
            idx.for_each(|id, number, loc| {
                assert_eq!(idx.packs()[number].id, loc.pack);
                seen.push(id.0[0]);
            });
            assert_eq!(seen, vec![2], "{order}");
            assert_eq!(idx.packs().len(), 2, "{order}: packs 2 and 3 only");
            assert_eq!(idx.files().len(), 3, "{order}");
        }
    }

    #[test]
    fn added_blobs_are_found_in_every_shard() {
        let idx = MemIndex::default();
        // Ids whose first byte differs from the rest: only the first byte picks the shard.
        let id = |b: u8| {
            let mut bytes = [255 - b; 32];
            bytes[0] = b;
            BlobId(bytes)
        };
        let entries: Vec<PackEntry> = (0..=255u8)
            .map(|b| PackEntry { id: id(b), ..entry(b, ObjectKind::DataBlob) })
            .collect();
        idx.add_pack(PackId([7; 32]), 5, &entries);
        for b in 0..=255u8 {
            let loc = idx.lookup(&id(b)).map(|l| (l.pack, l.offset));
            assert_eq!(loc, Some((PackId([7; 32]), 2 + u32::from(b))));
        }
        let mut other = id(9).0;
        other[31] = 0;
        assert!(!idx.contains(&BlobId(other)));
    }

    #[test]
    fn added_blobs_are_found_across_merges_and_keep_their_first_location() {
        let idx = MemIndex::default();
        // Three shards, thousands of blobs each (many merges); the ids' order within a shard
        // is not the order they are added in, so each merge interleaves.
        let id = |n: u32| {
            let mut b = [0u8; 32];
            b[0] = u8::try_from(n % 3).unwrap_or(0);
            b[1..5].copy_from_slice(&(n.wrapping_mul(2_654_435_761)).to_be_bytes());
            b[5..9].copy_from_slice(&n.to_be_bytes());
            BlobId(b)
        };
        let pack_of = |p: u32| PackId([u8::try_from(p % 200).unwrap_or(0) + 1; 32]);
        let entries =
            |range: std::ops::Range<u32>, offset: &dyn Fn(u32) -> u32| -> Vec<PackEntry> {
                range
                    .map(|n| PackEntry {
                        id: id(n),
                        kind: ObjectKind::DataBlob,
                        offset: offset(n),
                        length: 40,
                        raw_length: 1,
                    })
                    .collect()
            };
        for p in 0..100u32 {
            idx.add_pack(pack_of(p), 7, &entries(p * 100..p * 100 + 100, &|n| n));
        }
        let in_maps = |range: std::ops::Range<u32>| {
            let added = idx.added.read().map_err(|_| "poisoned").unwrap_or_else(|e| panic!("{e}"));
            range
                .filter(|n| added.shards[usize::from(id(*n).0[0])].recent.contains_key(&id(*n)))
                .count()
        };
        assert!(in_maps(9_900..10_000) > 0, "the test misses the maps of the latest");
        assert_eq!(in_maps(0..100), 0, "the test misses the sorted vectors");
        // Stored again: the latest (some still in the maps) and the oldest (merged into the
        // sorted vectors long ago). The first location stays.
        idx.add_pack(PackId([250; 32]), 7, &entries(9_900..10_000, &|_| 0));
        idx.add_pack(PackId([251; 32]), 7, &entries(0..100, &|_| 0));
        for n in 0..10_000u32 {
            let loc = idx.lookup(&id(n)).map(|l| (l.pack, l.offset));
            assert_eq!(loc, Some((pack_of(n / 100), n)), "blob {n}");
        }
        assert!(!idx.contains(&id(10_000)));
        let added = idx.added.read().map_err(|_| "poisoned").unwrap_or_else(|e| panic!("{e}"));
        let mut held = 0;
        for shard in &added.shards[..3] {
            assert!(shard.sorted.windows(2).all(|w| w[0].id < w[1].id), "not sorted or not unique");
            assert!(shard.sorted.len() > 2000, "{} sorted", shard.sorted.len());
            held += shard.sorted.len() + shard.recent.len();
        }
        assert_eq!(held, 10_000, "a blob held twice or lost");
    }

    #[test]
    fn lookup_finds_loaded_and_added_blobs_and_skips_superseded_files() {
        let f1 = IndexFile {
            packs: vec![IndexPack {
                id: PackId([1; 32]),
                size: 999,
                entries: vec![entry(1, ObjectKind::DataBlob), entry(2, ObjectKind::TreeBlob)],
            }],
            supersedes: vec![],
        };
        let old = IndexFile {
            packs: vec![IndexPack {
                id: PackId([2; 32]),
                size: 999,
                entries: vec![entry(3, ObjectKind::DataBlob)],
            }],
            supersedes: vec![],
        };
        let newer = IndexFile { packs: vec![], supersedes: vec![IndexId([9; 32])] };
        let idx = MemIndex::build(vec![
            (IndexId([8; 32]), f1),
            (IndexId([9; 32]), old),
            (IndexId([7; 32]), newer),
        ]);
        let loc = idx.lookup(&BlobId([2; 32]));
        assert_eq!(
            loc.map(|l| (l.kind, l.pack, l.offset, l.raw_length)),
            Some((ObjectKind::TreeBlob, PackId([1; 32]), 4, 7))
        );
        assert!(idx.contains(&BlobId([1; 32])));
        assert!(!idx.contains(&BlobId([3; 32])), "superseded index still used");
        idx.add_pack(PackId([5; 32]), 100, &[entry(4, ObjectKind::DataBlob)]);
        assert_eq!(idx.lookup(&BlobId([4; 32])).map(|l| l.pack), Some(PackId([5; 32])));
        assert_eq!(idx.pack_size(&PackId([5; 32])), Some(100));
        assert_eq!(idx.pack_size(&PackId([1; 32])), Some(999));
    }
}
