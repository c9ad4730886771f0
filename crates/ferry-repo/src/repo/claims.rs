//! The blobs one backup has taken on to store.
//!
//! A backup stores each new blob once, whichever of its workers meets it first: the first
//! [`Claims::claim`] of a blob the index does not have yet wins. A claim is only needed until
//! the blob's pack is indexed (the writer then adds the blob to the in-memory index, where
//! every later claim finds it), so claims the index has since taken over are dropped whenever
//! the set has doubled: the set holds about the blobs of the packs not yet indexed, not every
//! blob of the backup (a million small files made a million claims, ~100 MB).
//!
//! Each blob is at every moment in the index, in the set, or neither (not yet met): the index
//! gains a blob before the set drops it, and a claim looks at both under the set's lock.

use std::collections::HashSet;
use std::sync::{Arc, Mutex, PoisonError};

use super::index::MemIndex;
use crate::format::BlobId;

/// The fewest claims the set holds before it drops those the index took over.
const PRUNE_FLOOR: usize = 1 << 16;

/// The blobs one backup has taken on to store. See the module documentation.
pub(crate) struct Claims {
    index: Arc<MemIndex>,
    set: Mutex<ClaimSet>,
}

struct ClaimSet {
    ids: HashSet<BlobId>,
    /// The size at which indexed claims are dropped next.
    prune_at: usize,
}

impl Claims {
    /// No claims yet; blobs `index` has are never claimed.
    pub(crate) fn new(index: Arc<MemIndex>) -> Self {
        Self { index, set: Mutex::new(ClaimSet { ids: HashSet::new(), prune_at: PRUNE_FLOOR }) }
    }

    /// Whether the caller should store blob `id`: true exactly once per blob the index does
    /// not have.
    pub(crate) fn claim(&self, id: BlobId) -> bool {
        // A worker that panicked while holding the lock left the set whole (inserts and
        // `retain` leave it consistent), so its contents are still right.
        let mut set = self.set.lock().unwrap_or_else(PoisonError::into_inner);
        if self.index.contains(&id) {
            return false;
        }
        if set.ids.len() >= set.prune_at {
            set.ids.retain(|c| !self.index.contains(c));
            set.ids.shrink_to_fit();
            set.prune_at = (set.ids.len() * 2).max(PRUNE_FLOOR);
        }
        set.ids.insert(id)
    }

    /// How many claims are held (for tests).
    #[cfg(test)]
    fn held(&self) -> usize {
        self.set.lock().unwrap_or_else(PoisonError::into_inner).ids.len()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use crate::format::{ObjectKind, PackEntry, PackId};

    fn id(n: u32) -> BlobId {
        let mut b = [0u8; 32];
        b[..4].copy_from_slice(&n.to_le_bytes());
        BlobId(b)
    }

    fn entry(n: u32) -> PackEntry {
        PackEntry { id: id(n), kind: ObjectKind::DataBlob, offset: 2, length: 50, raw_length: 7 }
    }

    #[test]
    fn each_new_blob_is_claimed_once_and_indexed_claims_are_dropped() {
        let index = Arc::new(MemIndex::default());
        index.add_pack(PackId([1; 32]), 100, &[entry(0)]);
        let claims = Claims::new(Arc::clone(&index));
        assert!(!claims.claim(id(0)), "an indexed blob is never claimed");
        // One short of the floor: no pruning yet.
        let n = u32::try_from(PRUNE_FLOOR).unwrap() - 1;
        for i in 1..=n {
            assert!(claims.claim(id(i)));
            assert!(!claims.claim(id(i)), "claimed twice");
        }
        assert_eq!(claims.held(), PRUNE_FLOOR - 1);
        // Their packs get indexed; one more claim fills the set, and the next drops the
        // claims the index took over.
        let entries: Vec<PackEntry> = (1..=n).map(entry).collect();
        index.add_pack(PackId([2; 32]), 100, &entries);
        assert!(claims.claim(id(n + 1)));
        assert_eq!(claims.held(), PRUNE_FLOOR);
        assert!(claims.claim(id(n + 2)));
        assert_eq!(claims.held(), 2, "only the claims not yet indexed stay");
        for i in 0..=n {
            assert!(!claims.claim(id(i)), "blob {i} is in the index: never claimed again");
        }
        assert!(!claims.claim(id(n + 1)), "still claimed until indexed");
    }
}
