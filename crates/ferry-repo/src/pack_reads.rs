//! Ranged reads of packs for restores: the blobs a worker wants, grouped into few merged reads,
//! fetched several at a time (a remote store's round trips overlap) and handed out in order.
//!
//! Memory: the bytes a worker has fetched, or is fetching, and not yet handed back stay within
//! [`MAX_HELD`], 16 MiB (or one read, when a single one is larger), also when it starts the
//! reads of its next batch before it has taken those of the current one (see [`Fetcher`]). A
//! read never crosses a pack (16 MiB by default), so that is about what one read at a time
//! held before; the per-thread memory budget (`thread_budget`) is unchanged.

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

/// A volume restore's blobs closer than this in one pack are read together (the gap is read
/// and dropped).
pub(crate) const MERGE_GAP: u64 = 256 << 10;
/// A tree restore's: less than a frame of small files (about 100 to 300 KB sealed). Blobs are
/// spread at random over the packs a backup has open, so a gap that could hold a whole frame
/// most often holds one no batch needs yet, which its own batch then fetches again. At
/// 256 KiB a restore of the Linux tree read 245 MB in 410 reads; at 64 KiB, 225 MB in 540, and
/// over a 200 Mbit/s path it took 6 % less time (see
/// `benches/results/2026-11-30-vm-remote-20ms-1000mbit-gaps.md`).
pub(crate) const TREE_MERGE_GAP: u64 = 64 << 10;
/// The largest merged read of a tree restore.
pub(crate) const MAX_READ: u64 = 32 << 20;
/// The largest merged read of a volume restore. A writer decodes a read only once all of it is
/// in, so a read of a whole 16 MiB pack (about 90 MiB of a volume's data at level 1) left the
/// link idle while it was written, and the restore's last reads were written after the last
/// byte came. Over a 20 ms / 1000 Mbit/s path to MinIO, a 2 GiB volume half full of files
/// restored in 2.81–2.91 s with whole-pack reads (22 requests), 2.51 s with reads of at most
/// 4 MiB (66 requests); 2 and 8 MiB were no faster
/// (`benches/results/2026-11-30-vm-remote-20ms-1000mbit-volume-reads.md`).
pub(crate) const VOLUME_MAX_READ: u64 = 4 << 20;
/// The most bytes a worker has fetched or in flight at once (one read may exceed it alone; see
/// also [`Fetcher::drain`]).
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

/// Groups `wants` (sorted by pack, then offset) into reads: blobs of one pack at most `gap`
/// bytes apart share a read of at most `max_read` bytes (one blob may exceed it alone).
///
/// # Errors
/// A pack id that makes no key (cannot happen for ids from the index).
pub(crate) fn plan<'a, T>(
    wants: &'a [T],
    gap: u64,
    max_read: u64,
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
                || u64::from(next.offset) > range_end + gap
                || next_end.max(range_end) - range_start > max_read
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

/// A read started and not yet taken.
type Started = AbortOnDropHandle<Result<Bytes, StoreError>>;

/// Where a worker is in one list of reads (see [`Fetcher`]): the reads started and not yet
/// taken, oldest first, the next to start and the next to take.
#[derive(Default)]
pub(crate) struct Queue {
    started: VecDeque<Started>,
    next: usize,
    taken: usize,
}

impl Queue {
    /// Whether every read of the list has been started.
    pub(crate) fn all_started(&self, reads: &[PackRead]) -> bool {
        self.next >= reads.len()
    }
}

/// One worker's ranged reads, over every list of reads it has begun: at most
/// [`MAX_CONCURRENT_READS`] in flight and [`MAX_HELD`] bytes fetched or being fetched and not
/// yet handed back (one read may exceed that alone), each request holding one of the
/// repository's permits (shared by all its workers). A worker may start the reads of its next
/// list while it takes those of the current one, within the same bounds.
pub(crate) struct Fetcher<'a> {
    handle: &'a tokio::runtime::Handle,
    store: &'a Arc<dyn ObjectStore>,
    permits: &'a Arc<Semaphore>,
    stop: &'a CancellationToken,
    /// Reads started and not yet taken, over all lists.
    in_flight: usize,
    /// Their bytes, and those of the read being handed back.
    held: u64,
}

impl<'a> Fetcher<'a> {
    pub(crate) fn new(
        handle: &'a tokio::runtime::Handle,
        store: &'a Arc<dyn ObjectStore>,
        permits: &'a Arc<Semaphore>,
        stop: &'a CancellationToken,
    ) -> Self {
        Self { handle, store, permits, stop, in_flight: 0, held: 0 }
    }

    /// Whether the bounds let a read of `len` bytes start now.
    pub(crate) fn has_room(&self, len: u64) -> bool {
        self.in_flight < MAX_CONCURRENT_READS
            && (self.in_flight == 0 || self.held + len <= MAX_HELD)
    }

    /// Starts reads of `reads` (where `queue` says) while the bounds allow.
    pub(crate) fn start(&mut self, reads: &[PackRead], queue: &mut Queue) {
        while let Some(r) = reads.get(queue.next) {
            if !self.has_room(r.len) {
                break;
            }
            self.spawn(r, queue);
        }
    }

    fn spawn(&mut self, r: &PackRead, queue: &mut Queue) {
        let (store, key, stop) = (Arc::clone(self.store), r.key.clone(), self.stop.clone());
        let permits = Arc::clone(self.permits);
        let (start, len) = (r.start, r.len);
        queue.started.push_back(AbortOnDropHandle::new(self.handle.spawn(async move {
            // Never closed, so the permit always comes unless the restore stops first.
            let _permit = tokio::select! {
                permit = permits.acquire_owned() => permit.ok(),
                () = stop.cancelled() => return Err(StoreError::Cancelled),
            };
            store.get_range(&key, start, len, &stop).await
        })));
        self.held += len;
        self.in_flight += 1;
        queue.next += 1;
    }

    /// Takes every read of `reads` (where `queue` says) in order, calling `each` with the read
    /// and its bytes on the calling thread, and starting the rest as the bounds allow. Once
    /// all of them are started, `idle` is called before each read is taken, to start other
    /// reads with the room left. The first error (a read's, `each`'s or `idle`'s) ends it;
    /// the reads of `queue` still in flight are abandoned when it is dropped. After an error
    /// the fetcher's counts include reads nobody will take: drop it too.
    ///
    /// # Errors
    /// Store failures (as [`RepoError::Store`] naming the pack), cancellation, and the
    /// callbacks' errors.
    pub(crate) fn drain(
        &mut self,
        reads: &[PackRead],
        queue: &mut Queue,
        mut each: impl FnMut(&PackRead, Bytes) -> RepoResult<()>,
        mut idle: impl FnMut(&mut Self) -> RepoResult<()>,
    ) -> RepoResult<()> {
        while let Some(read) = reads.get(queue.taken) {
            self.start(reads, queue);
            if queue.all_started(reads) {
                idle(self)?;
            }
            if self.stop.is_cancelled() {
                return Err(RepoError::Cancelled);
            }
            if queue.started.is_empty() {
                // Other lists' reads took the room: this one, the next taken, goes anyway, over
                // the bound. A restore's worker never lets that happen (it starts a list's
                // reads only once those of the list before are all started), but a caller
                // that did would otherwise wait for ever.
                self.spawn(read, queue);
            }
            let Some(fetch) = queue.started.pop_front() else {
                return Err(RepoError::Internal {
                    what: "restore",
                    reason: "a pack read was never started".into(),
                });
            };
            let fetched = self.handle.block_on(fetch);
            self.in_flight -= 1;
            queue.taken += 1;
            let handed = fetched
                .map_err(|e| RepoError::Internal { what: "restore", reason: e.to_string() })
                .and_then(|got| got.map_err(|e| RepoError::store("read pack", &read.key, e)))
                .and_then(|bytes| each(read, bytes));
            self.held -= read.len;
            handed?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
pub(crate) mod tests {
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
        let reads = plan(&wants, MERGE_GAP, MAX_READ, Span::from).unwrap();
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

    /// Counts the ranged reads in the store at once (`most`: the most seen), holding each a
    /// moment; other calls pass.
    #[derive(Debug, Default)]
    pub(crate) struct RangesInFlight {
        now: std::sync::atomic::AtomicUsize,
        pub(crate) most: std::sync::atomic::AtomicUsize,
    }

    #[async_trait::async_trait]
    impl ferry_store::Hook for RangesInFlight {
        async fn before(&self, call: ferry_store::Call<'_>) {
            use std::sync::atomic::Ordering::SeqCst;
            if let ferry_store::Call::GetRange(..) = call {
                let now = self.now.fetch_add(1, SeqCst) + 1;
                self.most.fetch_max(now, SeqCst);
                tokio::time::sleep(std::time::Duration::from_millis(30)).await;
            }
        }
        fn after(&self, call: ferry_store::Call<'_>, _ok: bool) {
            if let ferry_store::Call::GetRange(..) = call {
                self.now.fetch_sub(1, std::sync::atomic::Ordering::SeqCst);
            }
        }
    }

    /// A runtime of `threads` workers, and a memory store holding the pack "pack" of `bytes`.
    fn pack_of(
        bytes: &[u8],
        threads: usize,
    ) -> (tokio::runtime::Runtime, Arc<ferry_store::MemoryStore>, ObjectKey) {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(threads)
            .enable_time()
            .build()
            .unwrap();
        let memory = Arc::new(ferry_store::MemoryStore::new());
        let key = ObjectKey::new("pack").unwrap();
        let stop = CancellationToken::new();
        runtime.block_on(memory.put_if_absent(&key, Bytes::from(bytes.to_vec()), &stop)).unwrap();
        (runtime, memory, key)
    }

    /// Two workers fetch 12 reads each through a store; returns the most reads the store saw
    /// at once. Each worker gets every read's bytes, in order.
    fn most_in_flight(permits: usize) -> usize {
        let bytes: Vec<u8> = (0..12 * 100).map(|i| (i % 251) as u8).collect();
        let (runtime, memory, key) = pack_of(&bytes, 2);
        let stop = CancellationToken::new();
        let hooked = Arc::new(ferry_store::Hooked::new(memory, RangesInFlight::default()));
        let store: Arc<dyn ObjectStore> = hooked.clone();
        let permits = Arc::new(Semaphore::new(permits));
        let reads: Vec<PackRead> = (0..12)
            .map(|i| PackRead { key: key.clone(), start: i * 100, len: 100, wants: 0..0 })
            .collect();
        std::thread::scope(|scope| {
            for _ in 0..2 {
                scope.spawn(|| {
                    let mut seen = Vec::new();
                    let mut fetcher = Fetcher::new(runtime.handle(), &store, &permits, &stop);
                    let each = |r: &PackRead, b: Bytes| {
                        assert_eq!(b.len() as u64, r.len);
                        seen.extend_from_slice(&b);
                        Ok(())
                    };
                    fetcher.drain(&reads, &mut Queue::default(), each, |_| Ok(())).unwrap();
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

    /// Records the ranged reads the store has started, holding each a moment.
    #[derive(Debug, Default)]
    struct Started(std::sync::Mutex<Vec<u64>>);

    #[async_trait::async_trait]
    impl ferry_store::Hook for Started {
        async fn before(&self, call: ferry_store::Call<'_>) {
            if let ferry_store::Call::GetRange(_, start, _) = call {
                self.0.lock().unwrap().push(start);
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }

    #[test]
    fn a_workers_next_reads_start_while_it_takes_the_last_of_the_current_ones() {
        let bytes: Vec<u8> = (0..4 * 100).map(|i| (i % 251) as u8).collect();
        let (runtime, memory, key) = pack_of(&bytes, 2);
        let stop = CancellationToken::new();
        let hooked = Arc::new(ferry_store::Hooked::new(memory, Started::default()));
        let store: Arc<dyn ObjectStore> = hooked.clone();
        let permits = Arc::new(Semaphore::new(MAX_REPOSITORY_READS));
        let read = |i: u64| PackRead { key: key.clone(), start: i * 100, len: 100, wants: 0..0 };
        let (current, next) = ([read(0), read(1)], [read(2), read(3)]);
        let mut fetcher = Fetcher::new(runtime.handle(), &store, &permits, &stop);
        let (mut queue, mut ahead) = (Queue::default(), Queue::default());
        let mut seen = Vec::new();
        let mut idle_calls = 0;
        fetcher
            .drain(
                &current,
                &mut queue,
                |r, b| {
                    assert_eq!(b.len() as u64, r.len);
                    seen.extend_from_slice(&b);
                    Ok(())
                },
                |f| {
                    idle_calls += 1;
                    f.start(&next, &mut ahead);
                    Ok(())
                },
            )
            .unwrap();
        assert_eq!(idle_calls, 2, "called before each read once all are started");
        assert!(ahead.all_started(&next), "the next reads were started meanwhile");
        assert_eq!(fetcher.in_flight, 2, "and not taken");
        // The next reads reach the store without being taken (bounded: 5 s).
        let mut seen_by_store = Vec::new();
        for _ in 0..500 {
            seen_by_store = hooked.hook().0.lock().unwrap().clone();
            if seen_by_store.len() == 4 {
                break;
            }
            std::thread::sleep(std::time::Duration::from_millis(10));
        }
        seen_by_store.sort_unstable();
        assert_eq!(seen_by_store, [0, 100, 200, 300]);
        fetcher
            .drain(
                &next,
                &mut ahead,
                |_, b| {
                    seen.extend_from_slice(&b);
                    Ok(())
                },
                |_| Ok(()),
            )
            .unwrap();
        assert_eq!(seen, bytes, "every read, in order");
        assert_eq!((fetcher.in_flight, fetcher.held), (0, 0));
    }

    #[test]
    fn reads_started_ahead_share_the_workers_bounds() {
        let runtime = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_time()
            .build()
            .unwrap();
        let store: Arc<dyn ObjectStore> = Arc::new(ferry_store::MemoryStore::new());
        let stop = CancellationToken::new();
        let permits = Arc::new(Semaphore::new(MAX_REPOSITORY_READS));
        let key = ObjectKey::new("pack").unwrap();
        let read = |len: u64| PackRead { key: key.clone(), start: 0, len, wants: 0..0 };
        let mut fetcher = Fetcher::new(runtime.handle(), &store, &permits, &stop);
        // Many small reads: at most MAX_CONCURRENT_READS at once, over both lists.
        let (first, second): (Vec<_>, Vec<_>) =
            ((0..5).map(|_| read(1)).collect(), (0..9).map(|_| read(1)).collect());
        let (mut a, mut b) = (Queue::default(), Queue::default());
        fetcher.start(&first, &mut a);
        fetcher.start(&second, &mut b);
        assert_eq!((a.next, b.next), (5, MAX_CONCURRENT_READS - 5));
        // Large reads: within MAX_HELD, except a first one alone.
        let mut fetcher = Fetcher::new(runtime.handle(), &store, &permits, &stop);
        let (big, more) = (vec![read(MAX_HELD - 10)], vec![read(11), read(10)]);
        let (mut a, mut b) = (Queue::default(), Queue::default());
        fetcher.start(&big, &mut a);
        fetcher.start(&more, &mut b);
        assert_eq!((a.next, b.next), (1, 0), "11 more bytes would pass MAX_HELD");
        let mut fetcher = Fetcher::new(runtime.handle(), &store, &permits, &stop);
        let huge = vec![read(MAX_HELD * 2)];
        let mut a = Queue::default();
        fetcher.start(&huge, &mut a);
        assert_eq!(a.next, 1, "a read larger than the bound goes alone");
    }

    #[test]
    fn a_lists_next_read_goes_even_when_other_lists_hold_the_room() {
        let bytes: Vec<u8> = (0..=255).collect();
        let (runtime, memory, key) = pack_of(&bytes, 1);
        let stop = CancellationToken::new();
        let store: Arc<dyn ObjectStore> = memory;
        let permits = Arc::new(Semaphore::new(MAX_REPOSITORY_READS));
        let read = |start: u64| PackRead { key: key.clone(), start, len: 1, wants: 0..0 };
        let mut fetcher = Fetcher::new(runtime.handle(), &store, &permits, &stop);
        let others: Vec<_> = (0..MAX_CONCURRENT_READS as u64).map(read).collect();
        let mut queue = Queue::default();
        fetcher.start(&others, &mut queue);
        assert_eq!(fetcher.in_flight, MAX_CONCURRENT_READS, "the room taken");
        let mine = [read(200), read(201)];
        let mut got = Vec::new();
        let each = |_: &PackRead, b: Bytes| {
            got.extend_from_slice(&b);
            Ok(())
        };
        fetcher.drain(&mine, &mut Queue::default(), each, |_| Ok(())).unwrap();
        assert_eq!(got, [200, 201]);
        fetcher.drain(&others, &mut queue, |_, _| Ok(()), |_| Ok(())).unwrap();
        assert_eq!((fetcher.in_flight, fetcher.held), (0, 0), "counted back");
    }

    #[test]
    fn no_read_grows_past_the_largest_read() {
        let block = 4 << 20;
        let wants: Vec<_> = (0..20).map(|i| at(7, i * block, block)).collect();
        let reads = plan(&wants, MERGE_GAP, MAX_READ, Span::from).unwrap();
        assert!(reads.iter().all(|r| r.len <= MAX_READ));
        assert_eq!(reads.len(), 3, "80 MiB in reads of at most 32 MiB");
        assert_eq!(reads.iter().map(|r| r.wants.len()).sum::<usize>(), 20);
        // A smaller bound (the volume restore's) splits them further; a blob larger than the
        // bound is still read, alone.
        let reads = plan(&wants, MERGE_GAP, 6 << 20, Span::from).unwrap();
        assert_eq!(reads.len(), 20, "one 4 MiB blob a read under 6 MiB");
        let reads = plan(&wants, MERGE_GAP, 1 << 20, Span::from).unwrap();
        assert_eq!(reads.len(), 20, "a blob over the bound is read alone");
        assert!(reads.iter().all(|r| r.len == u64::from(block)));
        // A read that reaches the bound exactly is kept whole.
        let reads = plan(&wants, MERGE_GAP, 8 << 20, Span::from).unwrap();
        assert_eq!(reads.len(), 10, "two 4 MiB blobs a read of exactly 8 MiB");
        assert!(reads.iter().all(|r| r.len == 8 << 20));
    }
}
