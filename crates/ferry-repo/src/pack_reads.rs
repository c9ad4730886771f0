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
use ferry_store::{ObjectKey, ObjectStore, StoreError};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::AbortOnDropHandle;

use crate::error::{RepoError, RepoResult};
use crate::format::PackId;
use crate::repo::{BlobLocation, layout};

/// Blobs closer than this in one pack are read together (the gap is read and dropped).
pub(crate) const MERGE_GAP: u64 = 256 << 10;
/// The largest merged read.
pub(crate) const MAX_READ: u64 = 32 << 20;
/// The most bytes a worker has fetched or in flight at once (one read may exceed it alone).
pub(crate) const MAX_HELD: u64 = 16 << 20;
/// Reads a worker has in flight at once, at most.
pub(crate) const MAX_CONCURRENT_READS: usize = 8;
/// Reads in flight at once through one open repository, whatever the number of workers and
/// restores: bounds the connections, descriptors and retries a node's restores spend on one
/// store (8 per worker alone would allow 768 on a 96-thread node). A read waits for a permit
/// before its request and gives it back when the response is in; a worker still holds at most
/// [`MAX_HELD`] bytes, so the waiting costs no memory.
pub(crate) const MAX_REPOSITORY_READS: usize = 64;

/// Where a wanted blob's sealed bytes lie: its pack, offset and length there (for a blob in
/// a frame, the frame's).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Span<'a> {
    pub(crate) pack: &'a PackId,
    pub(crate) offset: u32,
    pub(crate) length: u32,
}

impl<'a> From<&'a BlobLocation> for Span<'a> {
    fn from(loc: &'a BlobLocation) -> Self {
        Self { pack: &loc.pack, offset: loc.offset, length: loc.length }
    }
}

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
    pub(crate) fn sealed<'a>(&self, bytes: &'a [u8], loc: Span<'_>) -> RepoResult<&'a [u8]> {
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
pub(crate) fn plan<'a, T>(
    wants: &'a [T],
    loc: impl Fn(&'a T) -> Span<'a>,
) -> RepoResult<Vec<PackRead>> {
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
            key: layout::pack(first.pack)?,
            start: range_start,
            len: range_end - range_start,
            wants: start..end,
        });
        start = end;
    }
    Ok(reads)
}

/// Fetches `reads` through `store` on the runtime behind `handle`, up to
/// [`MAX_CONCURRENT_READS`] at once within the memory bound, each request holding one of
/// `permits` (shared by every worker of the repository), and calls `each` with every read and
/// its bytes, in order, on the calling thread. The first error (a read's or `each`'s) ends it;
/// reads still in flight are then abandoned.
///
/// # Errors
/// Store failures (as [`RepoError::Store`] naming the pack), cancellation, and `each`'s errors.
pub(crate) fn fetch_in_order(
    handle: &tokio::runtime::Handle,
    store: &Arc<dyn ObjectStore>,
    permits: &Arc<Semaphore>,
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
            let permits = Arc::clone(permits);
            let (start, len) = (r.start, r.len);
            in_flight.push_back(AbortOnDropHandle::new(handle.spawn(async move {
                // Never closed, so the permit always comes unless the restore stops first.
                let _permit = tokio::select! {
                    permit = permits.acquire_owned() => permit.ok(),
                    () = stop.cancelled() => return Err(StoreError::Cancelled),
                };
                store.get_range(&key, start, len, &stop).await
            })));
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
        let reads = plan(&wants, Span::from).unwrap();
        let summary: Vec<_> = reads.iter().map(|r| (r.start, r.len, r.wants.clone())).collect();
        assert_eq!(
            summary,
            [(0, 150 + MERGE_GAP, 0..2), (150 + 2 * MERGE_GAP + 1, 10, 2..3), (0, 10, 3..4)]
        );
        assert_ne!(reads[0].key, reads[2].key);
        // The bytes of a blob are found in its read's result.
        let bytes: Vec<u8> = (0..reads[0].len).map(|i| (i % 251) as u8).collect();
        let sealed = reads[0].sealed(&bytes, Span::from(&wants[1])).unwrap();
        assert_eq!(sealed.len(), 50);
        assert_eq!(sealed[0], bytes[100 + gap as usize]);
        assert!(
            reads[0].sealed(&bytes[..120], Span::from(&wants[1])).is_err(),
            "a short read is named"
        );
    }

    /// Counts the ranged reads in the store at once, holding each a moment.
    #[derive(Debug, Default)]
    struct InFlight {
        now: std::sync::atomic::AtomicUsize,
        most: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl ferry_store::Hook for InFlight {
        async fn before(&self, _call: ferry_store::Call<'_>) {
            use std::sync::atomic::Ordering::SeqCst;
            let now = self.now.fetch_add(1, SeqCst) + 1;
            self.most.fetch_max(now, SeqCst);
            tokio::time::sleep(std::time::Duration::from_millis(30)).await;
        }
        fn after(&self, _call: ferry_store::Call<'_>, _ok: bool) {
            self.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
        }
    }

    /// Two workers fetch 12 reads each through a store; returns the most reads the store saw
    /// at once. Each worker gets every read's bytes, in order.
    fn most_in_flight(permits: usize) -> usize {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(2)
            .enable_time()
            .build()
            .unwrap();
        let memory = Arc::new(ferry_store::MemoryStore::new());
        let key = ObjectKey::new("pack").unwrap();
        let bytes: Vec<u8> = (0..12 * 100).map(|i| (i % 251) as u8).collect();
        let stop = CancellationToken::new();
        runtime.block_on(memory.put_if_absent(&key, Bytes::from(bytes.clone()), &stop)).unwrap();
        let hooked = Arc::new(ferry_store::Hooked::new(memory, InFlight::default()));
        let store: Arc<dyn ObjectStore> = hooked.clone();
        let permits = Arc::new(Semaphore::new(permits));
        let reads: Vec<PackRead> = (0..12)
            .map(|i| PackRead { key: key.clone(), start: i * 100, len: 100, wants: 0..0 })
            .collect();
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    let mut seen = Vec::new();
                    fetch_in_order(runtime.handle(), &store, &permits, &reads, &stop, |r, b| {
                        assert_eq!(b.len() as u64, r.len);
                        seen.extend_from_slice(&b);
                        Ok(())
                    })
                    .unwrap();
                    assert_eq!(seen, bytes, "every read, in order");
                });
            }
        });
        hooked.hook().most.load(std::sync::atomic::Ordering::SeqCst)
    }

    #[test]
    fn the_repositorys_permits_bound_the_reads_of_all_its_workers_together() {
        assert!(most_in_flight(3) <= 3, "at most the permits");
        // Without the shared bound, each worker alone keeps up to 8 in flight.
        assert!(most_in_flight(64) > 3, "the test sees concurrency when it is allowed");
    }

    #[test]
    fn no_read_grows_past_the_largest_read() {
        let block = 4 << 20;
        let wants: Vec<_> = (0..20).map(|i| at(7, i * block, block)).collect();
        let reads = plan(&wants, Span::from).unwrap();
        assert!(reads.iter().all(|r| r.len <= MAX_READ));
        assert_eq!(reads.len(), 3, "80 MiB in reads of at most 32 MiB");
        assert_eq!(reads.iter().map(|r| r.wants.len()).sum::<usize>(), 20);
    }
}
