//! A [`ReadPlan`] turned into per-chunk decisions: which chunks to read, and which to take
//! from the parent snapshot unread.

use std::collections::BTreeMap;

use crate::format::BlobId;
use crate::volume::{ReadPlan, VolumeMap};

/// What the readers do with each chunk.
#[derive(Debug, Default)]
pub(super) struct Plan {
    /// Per chunk: read it (`None`: read every chunk).
    pub read: Option<Vec<bool>>,
    /// The slot table to start from: the parent's chunks where they are not read again.
    pub slots: Vec<Option<BlobId>>,
    /// Bytes of the chunks taken from the parent.
    pub from_parent: u64,
    /// Chunks left unread that are read anyway to check the changed ranges: chunk index →
    /// what the parent holds there (`None`: zeros). Empty unless [`sample_unchanged`] chose.
    pub verify: BTreeMap<u64, Option<BlobId>>,
}

impl Plan {
    /// Whether chunk `i` is read.
    pub fn reads(&self, i: u64) -> bool {
        self.read.as_ref().is_none_or(|r| {
            r.get(usize::try_from(i).unwrap_or(usize::MAX)).copied().unwrap_or(true)
        })
    }

    /// Whether chunk `i` is read, to store it or to check it against the parent.
    pub fn touches(&self, i: u64) -> bool {
        self.reads(i) || self.verify.contains_key(&i)
    }

    /// The first chunk from `from` on that is read or checked; `None` past the last one, or
    /// when the plan reads every chunk.
    pub fn next_touched(&self, from: u64) -> Option<u64> {
        let index = usize::try_from(from).ok()?;
        let read = self.read.as_ref()?.get(index..)?.iter().position(|&r| r);
        let read = read.map(|p| from + p as u64);
        let check = self.verify.range(from..).next().map(|(&i, _)| i);
        match (read, check) {
            (Some(a), Some(b)) => Some(a.min(b)),
            (a, b) => a.or(b),
        }
    }
}

/// The chunks (of `chunk` bytes, the last one short) of a `size`-byte volume that `ranges`
/// touch.
fn touched(ranges: &[(u64, u64)], size: u64, chunk: u64) -> Result<Vec<bool>, String> {
    let chunks = usize::try_from(size.div_ceil(chunk)).map_err(|_| "the volume is too large")?;
    let mut read = vec![false; chunks];
    let mut end_before = 0u64;
    for (n, &(offset, len)) in ranges.iter().enumerate() {
        let end = offset.checked_add(len).filter(|e| *e <= size);
        let Some(end) = end.filter(|_| len > 0) else {
            return Err(format!(
                "range {n} ({offset}, {len} bytes) is empty or ends past the volume's {size} bytes"
            ));
        };
        if n > 0 && offset < end_before {
            return Err(format!("range {n} at {offset} overlaps or precedes the range before it"));
        }
        end_before = end;
        for i in offset / chunk..end.div_ceil(chunk) {
            read[usize::try_from(i).map_err(|_| "the volume is too large")?] = true;
        }
    }
    Ok(read)
}

/// The plan for a backup of a `size`-byte volume in `chunk`-byte chunks. `parent` is the
/// parent's layout, needed for [`ReadPlan::ChangedSinceParent`].
///
/// # Errors
/// The ranges are not ascending, disjoint and inside the volume; or (changed ranges) there is
/// no parent, or its size or chunk cut differs.
pub(super) fn plan(
    read_plan: &ReadPlan,
    size: u64,
    chunk: u64,
    parent: Option<&VolumeMap>,
) -> Result<Plan, String> {
    let slots = usize::try_from(size.div_ceil(chunk)).map_err(|_| "the volume is too large")?;
    let mut plan =
        Plan { read: None, slots: vec![None; slots], from_parent: 0, verify: BTreeMap::new() };
    let ranges = match read_plan {
        ReadPlan::Everything => return Ok(plan),
        ReadPlan::Only(ranges) => {
            plan.read = Some(touched(ranges, size, chunk)?);
            return Ok(plan);
        }
        ReadPlan::ChangedSinceParent(ranges) => ranges,
    };
    let read = touched(ranges, size, chunk)?;
    let parent = parent.ok_or("changed ranges need the parent snapshot they changed from")?;
    if parent.size != size {
        return Err(format!(
            "the volume is {size} bytes, its parent snapshot's {} (resized since)",
            parent.size
        ));
    }
    for &(offset, c) in &parent.chunks {
        let len = u64::from(c.len);
        if offset % chunk != 0 || len != chunk.min(size - offset) {
            return Err(format!(
                "the parent's chunk at {offset} ({len} bytes) was not cut in {chunk}-byte chunks"
            ));
        }
        let i = usize::try_from(offset / chunk).map_err(|_| "the volume is too large")?;
        if !read[i] {
            plan.slots[i] = Some(c.id);
            plan.from_parent += len;
        }
    }
    plan.read = Some(read);
    Ok(plan)
}

/// Chooses up to `count` of the chunks a changed-ranges plan takes from the parent (or as
/// zeros) unread, spread evenly from a `seed`-chosen start, to be read and compared with what
/// the parent holds: a delta that left out a changed chunk among them is caught.
pub(super) fn sample_unchanged(plan: &mut Plan, count: usize, seed: usize) {
    let Some(read) = &plan.read else { return };
    let unread: Vec<usize> =
        read.iter().enumerate().filter(|(_, r)| !**r).map(|(i, _)| i).collect();
    if count == 0 || unread.is_empty() {
        return;
    }
    let stride = (unread.len() / count.min(unread.len())).max(1);
    for &i in unread.iter().skip(seed % stride).step_by(stride).take(count) {
        plan.verify.insert(i as u64, plan.slots[i]);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::format::ChunkRef;

    const K: u64 = 4096;

    fn id(n: u8) -> BlobId {
        BlobId([n; 32])
    }

    fn parent(size: u64, chunks: &[(u64, u32, u8)]) -> VolumeMap {
        VolumeMap {
            size,
            block_size: 4096,
            chunks: chunks.iter().map(|&(o, len, n)| (o, ChunkRef { id: id(n), len })).collect(),
            gaps: Vec::new(),
        }
    }

    #[test]
    fn everything_reads_every_chunk() {
        let p = plan(&ReadPlan::Everything, 10 * K, 4 * K, None).unwrap();
        assert!((0..3).all(|i| p.reads(i)));
        assert_eq!(p.slots.len(), 3);
    }

    #[test]
    fn a_chunk_any_range_touches_is_read_whole() {
        let p = plan(&ReadPlan::Only(vec![(K, 1), (9 * K, K)]), 10 * K, 4 * K, None).unwrap();
        assert_eq!(p.read, Some(vec![true, false, true]));
        let p = plan(&ReadPlan::Only(vec![(3 * K, 2 * K)]), 10 * K, 4 * K, None).unwrap();
        assert_eq!(p.read, Some(vec![true, true, false]));
    }

    #[test]
    fn unchanged_chunks_come_from_the_parent_and_changed_ones_are_read() {
        let parent = parent(10 * K, &[(0, 4096 * 4, 1), (4 * K, 4096 * 4, 2), (8 * K, 8192, 3)]);
        let p =
            plan(&ReadPlan::ChangedSinceParent(vec![(5 * K, 10)]), 10 * K, 4 * K, Some(&parent))
                .unwrap();
        assert_eq!(p.read, Some(vec![false, true, false]));
        assert_eq!(p.slots, [Some(id(1)), None, Some(id(3))]);
        assert_eq!(p.from_parent, 6 * K);
        // A parent gap stays a gap when it did not change.
        let sparse = parent_sparse();
        let p = plan(&ReadPlan::ChangedSinceParent(vec![]), 10 * K, 4 * K, Some(&sparse)).unwrap();
        assert_eq!(p.slots, [None, Some(id(2)), None]);
    }

    fn parent_sparse() -> VolumeMap {
        parent(10 * K, &[(4 * K, 4096 * 4, 2)])
    }

    #[test]
    fn the_sample_of_unchanged_chunks_is_spread_and_expects_the_parents() {
        let parent = parent(16 * K, &[(0, 4096, 1), (4 * K, 4096, 2), (8 * K, 4096, 3)]);
        let ranges = ReadPlan::ChangedSinceParent(vec![(4 * K, 10)]);
        let mut p = plan(&ranges, 16 * K, K, Some(&parent)).unwrap();
        sample_unchanged(&mut p, 3, 0);
        // 15 unread chunks, every fifth from the first; chunk 4 is read, so never sampled.
        let chosen: Vec<_> = p.verify.iter().map(|(i, e)| (*i, *e)).collect();
        assert_eq!(chosen, vec![(0, Some(id(1))), (6, None), (11, None)]);
        let mut all = plan(&ranges, 16 * K, K, Some(&parent)).unwrap();
        sample_unchanged(&mut all, 100, 7);
        assert_eq!(all.verify.len(), 15);
        assert!(!all.verify.contains_key(&4));
        assert_eq!(all.verify.get(&8), Some(&Some(id(3))));
        let mut none = plan(&ReadPlan::Everything, 16 * K, K, None).unwrap();
        sample_unchanged(&mut none, 3, 0);
        assert!(none.verify.is_empty(), "a plan reading everything needs no sample");
    }

    #[test]
    fn a_plan_that_cannot_be_followed_says_why() {
        let cases = [
            (ReadPlan::Only(vec![(0, 0)]), None, "empty"),
            (ReadPlan::Only(vec![(9 * K, 2 * K)]), None, "ends past"),
            (ReadPlan::Only(vec![(4 * K, K), (0, K)]), None, "overlaps or precedes"),
            (ReadPlan::ChangedSinceParent(vec![]), None, "need the parent"),
        ];
        for (read_plan, parent, want) in cases {
            let err = plan(&read_plan, 10 * K, 4 * K, parent).unwrap_err();
            assert!(err.contains(want), "{want:?} not in {err:?}");
        }
        let resized = parent(12 * K, &[]);
        let err =
            plan(&ReadPlan::ChangedSinceParent(vec![]), 10 * K, 4 * K, Some(&resized)).unwrap_err();
        assert!(err.contains("resized"), "{err}");
        let other_cut = parent(10 * K, &[(0, 8192, 1)]);
        let err = plan(&ReadPlan::ChangedSinceParent(vec![]), 10 * K, 4 * K, Some(&other_cut))
            .unwrap_err();
        assert!(err.contains("not cut in"), "{err}");
    }
}
