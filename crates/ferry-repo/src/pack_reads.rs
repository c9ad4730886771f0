//! Ranged reads of packs for restores: the blobs a worker wants, grouped into few merged reads,
//! fetched several at a time (a remote store's round trips overlap) and handed out in order.
//!
//! Memory: the bytes fetched or being fetched and not yet handed back stay within
//! [`MAX_HELD`], 16 MiB (or one read, when a single one is larger). A read never crosses a pack
//! (16 MiB by default), so that is about what one read at a time held before; the per-thread
//! memory budget (`thread_budget`) is unchanged.

use std::collections::VecDeque;
use std::ops::Range;
use std::sync::Arc;

use bytes::Bytes;
use ferry_store::{ObjectKey, ObjectStore};
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::error::{RepoError, RepoResult};
use crate::repo::{BlobLocation, layout};

/// Blobs closer than this in one pack are read together (the gap is read and dropped).
pub(crate) const MERGE_GAP: u64 = 256 << 10;
/// The largest merged read.
pub(crate) const MAX_READ: u64 = 32 << 20;
/// The most bytes a worker has fetched or in flight at once (one read may exceed it alone).
pub(crate) const MAX_HELD: u64 = 16 << 20;
/// Reads a worker has in flight at once, at most.
pub(crate) const MAX_CONCURRENT_READS: usize = 8;

/// One ranged read of a pack, covering `wants` (indexes into the sorted wants).
#[derive(Debug)]
pub(crate) struct PackRead {
    pub(crate) key: ObjectKey,
    pub(crate) start: u64,
    pub(crate) len: u64,
    pub(crate) wants: Range<usize>,
}

impl PackRead {
    /// The sealed bytes of `loc` (one of this read's blobs) within `bytes`, this read's result.
    pub(crate) fn sealed<'a>(&self, bytes: &'a [u8], loc: &BlobLocation) -> RepoResult<&'a [u8]> {
        let from = u64::from(loc.offset)
            .checked_sub(self.start)
            .and_then(|f| usize::try_from(f).ok())
            .unwrap_or(usize::MAX);
        bytes.get(from..from.saturating_add(loc.length as usize)).ok_or_else(|| {
            RepoError::Internal {
                what: "restore",
                reason: format!("short read of pack {}", self.key),
            }
        })
    }
}

/// Groups `wants` (sorted by pack, then offset) into reads: blobs of one pack at most
/// [`MERGE_GAP`] apart share a read of at most [`MAX_READ`] bytes.
///
/// # Errors
/// A pack id that makes no key (cannot happen for ids from the index).
pub(crate) fn plan<T>(wants: &[T], loc: impl Fn(&T) -> &BlobLocation) -> RepoResult<Vec<PackRead>> {
    let mut reads = Vec::new();
    let mut start = 0;
    while let Some(first) = wants.get(start).map(&loc) {
        let range_start = u64::from(first.offset);
        let mut range_end = range_start + u64::from(first.length);
        let mut end = start + 1;
        while let Some(next) = wants.get(end).map(&loc) {
            let next_end = u64::from(next.offset) + u64::from(next.length);
            if next.pack != first.pack
                || u64::from(next.offset) > range_end + MERGE_GAP
                || next_end.max(range_end) - range_start > MAX_READ
            {
                break;
            }
            range_end = range_end.max(next_end);
            end += 1;
        }
        reads.push(PackRead {
            key: layout::pack(&first.pack)?,
            start: range_start,
            len: range_end - range_start,
            wants: start..end,
        });
        start = end;
    }
    Ok(reads)
}

/// Fetches `reads` through `store` on the runtime behind `handle`, up to
/// [`MAX_CONCURRENT_READS`] at once within the memory bound, and calls `each` with every read
/// and its bytes, in order, on the calling thread. The first error (a read's or `each`'s) ends
/// it; reads still in flight are then abandoned.
///
/// # Errors
/// Store failures (as [`RepoError::Store`] naming the pack), cancellation, and `each`'s errors.
pub(crate) fn fetch_in_order(
    handle: &tokio::runtime::Handle,
    store: &Arc<dyn ObjectStore>,
    reads: &[PackRead],
    stop: &CancellationToken,
    mut each: impl FnMut(&PackRead, Bytes) -> RepoResult<()>,
) -> RepoResult<()> {
    let mut in_flight: VecDeque<AbortOnDropHandle<_>> = VecDeque::new();
    // Bytes of the reads started and not yet handed back.
    let mut held = 0u64;
    let mut next = 0;
    for read in reads {
        while let Some(r) = reads.get(next) {
            let room = in_flight.is_empty() || held + r.len <= MAX_HELD;
            if !room || in_flight.len() >= MAX_CONCURRENT_READS {
                break;
            }
            let (store, key, stop) = (Arc::clone(store), r.key.clone(), stop.clone());
            let (start, len) = (r.start, r.len);
            in_flight.push_back(AbortOnDropHandle::new(
                handle.spawn(async move { store.get_range(&key, start, len, &stop).await }),
            ));
            held += r.len;
            next += 1;
        }
        if stop.is_cancelled() {
            return Err(RepoError::Cancelled);
        }
        let Some(fetch) = in_flight.pop_front() else {
            return Err(RepoError::Internal {
                what: "restore",
                reason: "a pack read was never started".into(),
            });
        };
        let bytes = handle
            .block_on(fetch)
            .map_err(|e| RepoError::Internal { what: "restore", reason: e.to_string() })?
            .map_err(|e| RepoError::store("read pack", &read.key, e))?;
        each(read, bytes)?;
        held -= read.len;
    }
    Ok(())
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::format::{ObjectKind, PackId};

    fn at(pack: u8, offset: u32, length: u32) -> BlobLocation {
        BlobLocation {
            pack: PackId([pack; 32]),
            offset,
            length,
            raw_length: length,
            kind: ObjectKind::DataBlob,
        }
    }

    #[test]
    fn near_blobs_of_a_pack_share_a_read_and_far_or_other_ones_do_not() {
        let gap = u32::try_from(MERGE_GAP).unwrap();
        let wants = [
            at(1, 0, 100),
            at(1, 100 + gap, 50),         // exactly the gap: merged
            at(1, 150 + 2 * gap + 1, 10), // one byte past it: a new read
            at(2, 0, 10),                 // another pack
        ];
        let reads = plan(&wants, |l| l).unwrap();
        let summary: Vec<_> = reads.iter().map(|r| (r.start, r.len, r.wants.clone())).collect();
        assert_eq!(
            summary,
            [(0, 150 + MERGE_GAP, 0..2), (150 + 2 * MERGE_GAP + 1, 10, 2..3), (0, 10, 3..4)]
        );
        assert_ne!(reads[0].key, reads[2].key);
        // The bytes of a blob are found in its read's result.
        let bytes: Vec<u8> = (0..reads[0].len).map(|i| (i % 251) as u8).collect();
        let sealed = reads[0].sealed(&bytes, &wants[1]).unwrap();
        assert_eq!(sealed.len(), 50);
        assert_eq!(sealed[0], bytes[100 + gap as usize]);
        assert!(reads[0].sealed(&bytes[..120], &wants[1]).is_err(), "a short read is named");
    }

    #[test]
    fn no_read_grows_past_the_largest_read() {
        let block = 4 << 20;
        let wants: Vec<_> = (0..20).map(|i| at(7, i * block, block)).collect();
        let reads = plan(&wants, |l| l).unwrap();
        assert!(reads.iter().all(|r| r.len <= MAX_READ));
        assert_eq!(reads.len(), 3, "80 MiB in reads of at most 32 MiB");
        assert_eq!(reads.iter().map(|r| r.wants.len()).sum::<usize>(), 20);
    }
}
