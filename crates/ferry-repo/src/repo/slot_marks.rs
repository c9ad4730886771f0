//! One bit for each blob loaded into a [`MemIndex`]: what a walk over the snapshots has
//! reached, at an eighth of a byte a blob (a set of 32-byte ids took 32 bytes and more).

use crate::format::BlobId;
use crate::repo::MemIndex;

/// Marks over the slots of one [`MemIndex`] (valid only with the index it was made for).
#[derive(Debug)]
pub(crate) struct SlotMarks {
    bits: Vec<u64>,
    marked: usize,
}

impl SlotMarks {
    /// No blob of `index` marked.
    pub(crate) fn new(index: &MemIndex) -> Self {
        Self { bits: vec![0; index.slots().div_ceil(64)], marked: 0 }
    }

    /// Marks `id`: `Some(true)` if it was not marked yet, `Some(false)` if it was, `None` if
    /// `index` did not load it.
    pub(crate) fn mark(&mut self, index: &MemIndex, id: &BlobId) -> Option<bool> {
        let slot = index.slot_of(id)?;
        let word = self.bits.get_mut(slot / 64)?;
        let bit = 1u64 << (slot % 64);
        let new = *word & bit == 0;
        *word |= bit;
        self.marked += usize::from(new);
        Some(new)
    }

    /// Whether the blob in `slot` is marked.
    pub(crate) fn is_marked(&self, slot: usize) -> bool {
        self.bits.get(slot / 64).is_some_and(|w| w & (1u64 << (slot % 64)) != 0)
    }

    /// How many blobs are marked.
    pub(crate) fn count(&self) -> usize {
        self.marked
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{IndexFile, IndexId, IndexPack, ObjectKind, PackEntry, PackId};

    #[test]
    fn marks_count_each_loaded_blob_once_and_know_no_other() {
        let entries = (0..130u8)
            .map(|n| PackEntry {
                id: BlobId([n; 32]),
                kind: ObjectKind::DataBlob,
                offset: u32::from(n) * 60,
                length: 60,
                raw_length: 20,
            })
            .collect();
        let file = IndexFile {
            packs: vec![IndexPack { id: PackId([1; 32]), size: 9000, entries }],
            supersedes: vec![],
        };
        let index = MemIndex::build(vec![(IndexId([9; 32]), file)]);
        let mut marks = SlotMarks::new(&index);
        assert_eq!(marks.mark(&index, &BlobId([0; 32])), Some(true));
        assert_eq!(marks.mark(&index, &BlobId([129; 32])), Some(true));
        assert_eq!(marks.mark(&index, &BlobId([64; 32])), Some(true));
        assert_eq!(marks.mark(&index, &BlobId([64; 32])), Some(false));
        assert_eq!(marks.mark(&index, &BlobId([200; 32])), None, "not in the index");
        assert_eq!(marks.count(), 3);
        let mut marked = Vec::new();
        index.for_each(|slot, id, _, _| {
            if marks.is_marked(slot) {
                marked.push(id.first());
            }
        });
        assert_eq!(marked, vec![0, 64, 129]);
        assert!(!marks.is_marked(130) && !marks.is_marked(usize::MAX));
    }
}
