//! Frames shared by a restore's workers, so each is fetched once.
//!
//! A frame (format 3) holds about 60 small files of one backup worker, and the files that are
//! neighbours in the tree are spread over the frames of all the backup's workers, so a restore
//! batch of a few hundred files ends inside about one frame per backup worker. Fetched per
//! batch, those frames were fetched again by the next batch (on another thread, at the same
//! moment): on the Linux tree a restore downloaded 1.9 times the repository.
//!
//! Here the first batch that needs a frame claims it and fetches it; a batch that needs a frame
//! another one is fetching waits for that claim, only once its worker has fetched every frame
//! it claimed, for this batch and for the one it took ahead (see [`super::data::work`]), so no
//! two workers can wait for each other. A frame already opened is handed over at once. Opened
//! frames are kept within [`KEEP_BYTES`] of memory (plaintext and table), the first published
//! evicted first (a use does not keep a frame longer); a frame evicted, or whose fetch failed,
//! is claimed again by whoever needs it next.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::format::{Frame, PackId};

/// Memory of opened frames kept for other batches (about 32 frames of 1 MiB; counted in the
/// data path's [`crate::thread_budget::MEMORY_BASE`]).
pub(crate) const KEEP_BYTES: usize = 32 << 20;

/// A frame: its pack and offset.
pub(crate) type FrameKey = (PackId, u32);

/// What a batch does about a frame it needs.
#[derive(Debug)]
pub(crate) enum Claim {
    /// Nobody has it: fetch it, then [`SharedFrames::publish`] or [`SharedFrames::abandon`].
    Fetch,
    /// Another batch is fetching it: [`SharedFrames::wait`] for it. The number names that
    /// batch's claim.
    Wait(u64),
    /// Opened already: here it is (held, so no eviction takes it from the batch).
    Ready(Arc<Frame>),
}

#[derive(Debug)]
enum Slot {
    /// Claimed: the claim's number.
    Fetching(u64),
    Ready(Arc<Frame>, usize),
}

#[derive(Debug, Default)]
struct State {
    slots: HashMap<FrameKey, Slot>,
    /// Ready frames, oldest first.
    order: VecDeque<FrameKey>,
    bytes: usize,
    /// Claims made so far (each claim's number).
    claims: u64,
}

/// The frames of one restore. See the module documentation.
#[derive(Debug)]
pub(crate) struct SharedFrames {
    state: Mutex<State>,
    changed: Condvar,
    /// Memory of opened frames kept.
    keep: usize,
}

impl Default for SharedFrames {
    fn default() -> Self {
        #[cfg(test)]
        let keep = KEEP_FOR_TESTS.load(std::sync::atomic::Ordering::Relaxed);
        #[cfg(not(test))]
        let keep = KEEP_BYTES;
        Self::keeping(keep)
    }
}

/// The memory restores in this crate's unit tests keep (a test that shrinks it to make
/// frames evicted changes only how often others are fetched again, never what is written).
#[cfg(test)]
pub(crate) static KEEP_FOR_TESTS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(KEEP_BYTES);

impl SharedFrames {
    /// Keeping `keep` bytes of opened frames.
    fn keeping(keep: usize) -> Self {
        Self { state: Mutex::default(), changed: Condvar::new(), keep }
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state whole: a panic elsewhere does not make it wrong.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the caller fetches `key`, waits for it, or has it.
    pub(crate) fn claim(&self, key: FrameKey) -> Claim {
        let mut state = self.lock();
        match state.slots.get(&key) {
            Some(Slot::Ready(frame, _)) => Claim::Ready(Arc::clone(frame)),
            Some(Slot::Fetching(n)) => Claim::Wait(*n),
            None => {
                state.claims += 1;
                let n = state.claims;
                state.slots.insert(key, Slot::Fetching(n));
                Claim::Fetch
            }
        }
    }

    /// Hands a frame the caller claimed to every batch waiting for it, and keeps it (a frame
    /// larger than the kept memory is evicted at once: its waiters then fetch it). A frame
    /// not claimed (or published already) is left as it is.
    pub(crate) fn publish(&self, key: FrameKey, frame: Arc<Frame>) {
        let mut state = self.lock();
        let Some(slot @ Slot::Fetching(_)) = state.slots.get_mut(&key) else { return };
        let bytes = frame.memory();
        *slot = Slot::Ready(frame, bytes);
        state.order.push_back(key);
        state.bytes += bytes;
        while state.bytes > self.keep {
            let Some(old) = state.order.pop_front() else { break };
            if let Some(Slot::Ready(_, size)) = state.slots.remove(&old) {
                state.bytes -= size;
            }
        }
        drop(state);
        self.changed.notify_all();
    }

    /// Gives up a claim (the fetch failed): whoever waits fetches it then.
    pub(crate) fn abandon(&self, key: FrameKey) {
        let mut state = self.lock();
        if matches!(state.slots.get(&key), Some(Slot::Fetching(_))) {
            state.slots.remove(&key);
        }
        drop(state);
        self.changed.notify_all();
    }

    /// The frame if it is opened and kept, without waiting.
    pub(crate) fn ready(&self, key: FrameKey) -> Option<Arc<Frame>> {
        match self.lock().slots.get(&key) {
            Some(Slot::Ready(frame, _)) => Some(Arc::clone(frame)),
            _ => None,
        }
    }

    /// The frame, once the batch whose claim is numbered `claim` has published it; `None`
    /// when that fetch was abandoned or the frame evicted (fetch it then), or the restore
    /// stops. Only the claim it was told of is waited for: a later claim of the frame (after
    /// an abandon or an eviction) is not, and the waiter fetches the frame in its last round.
    pub(crate) fn wait(
        &self,
        key: FrameKey,
        claim: u64,
        stop: &CancellationToken,
    ) -> Option<Arc<Frame>> {
        let mut state = self.lock();
        loop {
            match state.slots.get(&key) {
                Some(Slot::Ready(frame, _)) => return Some(Arc::clone(frame)),
                Some(Slot::Fetching(n)) if *n == claim && !stop.is_cancelled() => {}
                _ => return None,
            }
            let waited = self.changed.wait_timeout(state, Duration::from_millis(100));
            state = waited.unwrap_or_else(PoisonError::into_inner).0;
        }
    }
}

/// Abandons, when dropped, the claims of a batch it did not publish (its fetch failed).
pub(crate) struct Claims<'a> {
    frames: &'a SharedFrames,
    pub(crate) open: Vec<FrameKey>,
}

impl<'a> Claims<'a> {
    pub(crate) fn new(frames: &'a SharedFrames) -> Self {
        Self { frames, open: Vec::new() }
    }

    /// Publishes a claimed frame.
    pub(crate) fn publish(&mut self, key: FrameKey, frame: Arc<Frame>) {
        self.open.retain(|k| *k != key);
        self.frames.publish(key, frame);
    }
}

impl Drop for Claims<'_> {
    fn drop(&mut self) {
        for key in self.open.drain(..) {
            self.frames.abandon(key);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{FrameBuilder, MasterKey};

    /// A frame of `n` blobs of 100 bytes.
    fn frame(n: u8) -> Arc<Frame> {
        let keys = MasterKey::from_secret([3; 32]).derive();
        let mut b = FrameBuilder::default();
        for i in 0..n {
            let blob = vec![i; 100];
            b.push(keys.blob_id(&blob), &blob);
        }
        let (mut plain, mut sealed) = (Vec::new(), Vec::new());
        b.seal_into(&keys, 1, &mut plain, &mut sealed);
        let opened = Frame::open(&keys, &sealed).map_err(|e| e.to_string());
        Arc::new(opened.expect("opens"))
    }

    #[test]
    fn the_first_batch_fetches_and_the_others_wait_for_it() {
        let frames = SharedFrames::keeping(KEEP_BYTES);
        let key = (PackId([1; 32]), 10);
        assert!(matches!(frames.claim(key), Claim::Fetch));
        let Claim::Wait(claim) = frames.claim(key) else { panic!("claimed already") };
        let stop = CancellationToken::new();
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| frames.wait(key, claim, &stop).map(|f| f.len()));
            std::thread::sleep(Duration::from_millis(50));
            frames.publish(key, frame(1));
            assert_eq!(waiter.join().ok().flatten(), Some(1), "the waiter gets the frame");
        });
        assert!(matches!(frames.claim(key), Claim::Ready(f) if f.len() == 1), "kept for later");
    }

    #[test]
    fn an_abandoned_claim_sends_waiters_to_fetch_it_themselves() {
        let frames = SharedFrames::default();
        let key = (PackId([2; 32]), 10);
        let stop = CancellationToken::new();
        {
            let mut claims = Claims::new(&frames);
            assert!(matches!(frames.claim(key), Claim::Fetch));
            claims.open.push(key);
            let Claim::Wait(claim) = frames.claim(key) else { panic!("claimed already") };
            std::thread::scope(|scope| {
                let waiter = scope.spawn(|| frames.wait(key, claim, &stop).is_none());
                std::thread::sleep(Duration::from_millis(50));
                drop(claims);
                assert_eq!(waiter.join().ok(), Some(true));
            });
        }
        assert!(matches!(frames.claim(key), Claim::Fetch), "free to fetch again");
        let Claim::Wait(claim) = frames.claim(key) else { panic!("claimed again") };
        stop.cancel();
        assert!(frames.wait(key, claim, &stop).is_none(), "a stopped restore does not wait");
    }

    #[test]
    fn a_waiter_does_not_wait_for_a_claim_made_after_the_one_it_was_told_of() {
        let frames = SharedFrames::keeping(KEEP_BYTES);
        let key = (PackId([6; 32]), 0);
        let stop = CancellationToken::new();
        assert!(matches!(frames.claim(key), Claim::Fetch));
        let Claim::Wait(first) = frames.claim(key) else { panic!("claimed already") };
        frames.abandon(key);
        assert!(matches!(frames.claim(key), Claim::Fetch), "claimed again, by a later batch");
        // Never published: a waiter of the later claim would wait until the restore stops.
        let gave_up = std::thread::scope(|scope| {
            scope.spawn(|| {
                for _ in 0..100 {
                    if stop.is_cancelled() {
                        return;
                    }
                    std::thread::sleep(Duration::from_millis(50));
                }
                stop.cancel();
            });
            let got = frames.wait(key, first, &stop);
            let gave_up = got.is_none() && !stop.is_cancelled();
            stop.cancel();
            gave_up
        });
        assert!(gave_up, "gave up at its own claim's end");
        let Claim::Wait(second) = frames.claim(key) else { panic!("claimed") };
        assert_ne!(first, second);
    }

    #[test]
    fn old_frames_go_once_the_kept_memory_is_exceeded() {
        let one = frame(10).memory();
        assert!(one >= 1000 + 10 * 24, "plaintext and table counted: {one}");
        let frames = SharedFrames::keeping(4 * one);
        for n in 0..6u32 {
            let key = (PackId([3; 32]), n);
            assert!(matches!(frames.claim(key), Claim::Fetch));
            frames.publish(key, frame(10));
        }
        let kept: Vec<_> = (0..6u32).map(|n| frames.claim((PackId([3; 32]), n))).collect();
        assert!(kept[..2].iter().all(|c| matches!(c, Claim::Fetch)), "the two oldest evicted");
        assert!(kept[2..].iter().all(|c| matches!(c, Claim::Ready(_))), "the newest four kept");
    }

    #[test]
    fn a_frame_held_by_a_batch_outlives_its_eviction() {
        let frames = SharedFrames::keeping(frame(10).memory());
        let (a, b) = ((PackId([4; 32]), 0), (PackId([4; 32]), 1));
        assert!(matches!(frames.claim(a), Claim::Fetch));
        frames.publish(a, frame(10));
        let Claim::Ready(held) = frames.claim(a) else { panic!("a is opened") };
        assert!(matches!(frames.claim(b), Claim::Fetch));
        frames.publish(b, frame(10));
        assert!(matches!(frames.claim(a), Claim::Fetch), "a evicted for b");
        assert_eq!(held.len(), 10, "the batch that held it still has it");
    }

    #[test]
    fn only_a_claimed_frame_is_published() {
        let frames = SharedFrames::keeping(KEEP_BYTES);
        let key = (PackId([5; 32]), 0);
        frames.publish(key, frame(1));
        assert!(matches!(frames.claim(key), Claim::Fetch), "not claimed: not kept");
        frames.publish(key, frame(2));
        frames.publish(key, frame(3));
        let Claim::Ready(kept) = frames.claim(key) else { panic!("published") };
        assert_eq!(kept.len(), 2, "the claim's own frame, once");
        assert_eq!(frames.lock().order.len(), 1, "counted once");
    }
}
