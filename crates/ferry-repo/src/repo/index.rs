//! The in-memory index: where every blob lives.
//!
//! Loaded entries sit in one vector sorted by blob id, 48 bytes each (32-byte id, pack
//! number, offset, sealed length, raw length with the blob kind in its top bit), plus one
//! 40-byte record per pack. A repository of 1 M chunks therefore needs about 48 MB; lookups
//! are binary searches with no locking. Blobs added by this process sit in a hash map until
//! the next reload (48 bytes a blob, plus the map's spare room).

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
/// the pack by number. 48 bytes a blob in the map (a first backup of a million small files
/// adds a million), not the 80 of a blob id with a whole [`BlobLocation`].
#[derive(Debug, Default)]
struct Added {
    packs: Vec<PackInfo>,
    numbers: HashMap<PackId, u32>,
    blobs: HashMap<BlobId, AddedSlot>,
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
        let superseded: HashSet<IndexId> =
            files.iter().flat_map(|(_, f)| f.supersedes.iter().copied()).collect();
        let mut index = Self::default();
        let mut total = 0usize;
        for (_, f) in &files {
            total += f.packs.iter().map(|p| p.entries.len()).sum::<usize>();
        }
        index.slots.reserve(total);
        for (id, file) in files {
            index.files.insert(id);
            if superseded.contains(&id) {
                continue;
            }
            for pack in file.packs {
                if excluded.contains(&pack.id) {
                    continue;
                }
                let number = *index.pack_numbers.entry(pack.id).or_insert_with(|| {
                    index.packs.push(PackInfo { id: pack.id, size: pack.size });
                    u32::try_from(index.packs.len() - 1).unwrap_or(u32::MAX)
                });
                for e in pack.entries {
                    index.slots.push(Slot {
                        id: e.id,
                        pack: number,
                        offset: e.offset,
                        length: e.length,
                        raw_and_kind: raw_and_kind(e.raw_length, e.kind),
                    });
                }
            }
        }
        index.slots.sort_unstable_by_key(|s| s.id);
        index.slots.dedup_by(|a, b| a.id == b.id);
        index.slots.shrink_to_fit();
        index
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
        let added = self.added.read().ok()?;
        let s = added.blobs.get(id)?;
        Some(located(added.packs.get(s.pack as usize)?, s.offset, s.length, s.raw_and_kind))
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
            added.blobs.insert(
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
