//! Frames shared by a restore's workers, so each is fetched once.
//!
//! A frame (format 3) holds about 60 small files of one backup worker, and the files that are
//! neighbours in the tree are spread over the frames of all the backup's workers, so a restore
//! batch of a few hundred files ends inside about one frame per backup worker. Fetched per
//! batch, those frames were fetched again by the next batch (on another thread, at the same
//! moment): on the Linux tree a restore downloaded 1.9 times the repository.
//!
//! Here the first batch that needs a frame claims it and fetches it; a batch that needs a frame
//! another one is fetching waits for it (after fetching its own, so no two batches can wait
//! for each other). Opened frames are kept, newest first, within [`KEEP_BYTES`] of plaintext;
//! a frame evicted, or whose fetch failed, is fetched again by whoever needs it next.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, PoisonError};
use std::time::Duration;

use tokio_util::sync::CancellationToken;

use crate::format::{Frame, PackId};

/// Plaintext of opened frames kept for other batches (about 32 frames of 1 MiB).
pub(crate) const KEEP_BYTES: usize = 32 << 20;

/// A frame: its pack and offset.
pub(crate) type FrameKey = (PackId, u32);

/// What a batch does about a frame it needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Claim {
    /// Nobody has it: fetch it, then [`SharedFrames::publish`] or [`SharedFrames::abandon`].
    Fetch,
    /// Another batch has it or is fetching it: [`SharedFrames::wait`] for it.
    Wait,
}

#[derive(Debug)]
enum Slot {
    Fetching,
    Ready(Arc<Frame>, usize),
}

#[derive(Debug, Default)]
struct State {
    slots: HashMap<FrameKey, Slot>,
    /// Ready frames, oldest first.
    order: VecDeque<FrameKey>,
    bytes: usize,
}

/// The frames of one restore. See the module documentation.
#[derive(Debug, Default)]
pub(crate) struct SharedFrames {
    state: Mutex<State>,
    changed: Condvar,
}

impl SharedFrames {
    fn lock(&self) -> MutexGuard<'_, State> {
        // Every update leaves the state whole: a panic elsewhere does not make it wrong.
        self.state.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Whether the caller fetches `key` or waits for it.
    pub(crate) fn claim(&self, key: FrameKey) -> Claim {
        let mut state = self.lock();
        if state.slots.contains_key(&key) {
            return Claim::Wait;
        }
        state.slots.insert(key, Slot::Fetching);
        Claim::Fetch
    }

    /// Hands a frame the caller claimed to every batch waiting for it, and keeps it.
    pub(crate) fn publish(&self, key: FrameKey, frame: Arc<Frame>, bytes: usize) {
        let mut state = self.lock();
        state.slots.insert(key, Slot::Ready(frame, bytes));
        state.order.push_back(key);
        state.bytes += bytes;
        while state.bytes > KEEP_BYTES {
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
        if matches!(state.slots.get(&key), Some(Slot::Fetching)) {
            state.slots.remove(&key);
        }
        drop(state);
        self.changed.notify_all();
    }

    /// The frame, once the batch fetching it has published it; `None` when that fetch was
    /// abandoned or the frame evicted (fetch it then), or the restore stops.
    pub(crate) fn wait(&self, key: FrameKey, stop: &CancellationToken) -> Option<Arc<Frame>> {
        let mut state = self.lock();
        loop {
            match state.slots.get(&key) {
                Some(Slot::Ready(frame, _)) => return Some(Arc::clone(frame)),
                Some(Slot::Fetching) if !stop.is_cancelled() => {}
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
    pub(crate) fn publish(&mut self, key: FrameKey, frame: Arc<Frame>, bytes: usize) {
        self.open.retain(|k| *k != key);
        self.frames.publish(key, frame, bytes);
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

    fn frame(n: u8) -> (Arc<Frame>, usize) {
        let keys = MasterKey::from_secret([3; 32]).derive();
        let mut b = FrameBuilder::default();
        let blob = vec![n; 100];
        b.push(keys.blob_id(&blob), &blob);
        let (mut plain, mut sealed) = (Vec::new(), Vec::new());
        b.seal_into(&keys, 1, &mut plain, &mut sealed);
        let opened = Frame::open(&keys, &sealed).map_err(|e| e.to_string());
        (Arc::new(opened.expect("opens")), 100)
    }

    #[test]
    fn the_first_batch_fetches_and_the_others_wait_for_it() {
        let frames = SharedFrames::default();
        let key = (PackId([1; 32]), 10);
        assert_eq!(frames.claim(key), Claim::Fetch);
        assert_eq!(frames.claim(key), Claim::Wait);
        let stop = CancellationToken::new();
        std::thread::scope(|scope| {
            let waiter = scope.spawn(|| frames.wait(key, &stop).map(|f| f.len()));
            std::thread::sleep(Duration::from_millis(50));
            let (f, bytes) = frame(1);
            frames.publish(key, f, bytes);
            assert_eq!(waiter.join().ok().flatten(), Some(1), "the waiter gets the frame");
        });
        assert_eq!(frames.claim(key), Claim::Wait, "kept for later batches");
    }

    #[test]
    fn an_abandoned_claim_sends_waiters_to_fetch_it_themselves() {
        let frames = SharedFrames::default();
        let key = (PackId([2; 32]), 10);
        let stop = CancellationToken::new();
        {
            let mut claims = Claims::new(&frames);
            assert_eq!(frames.claim(key), Claim::Fetch);
            claims.open.push(key);
            std::thread::scope(|scope| {
                let waiter = scope.spawn(|| frames.wait(key, &stop).is_none());
                std::thread::sleep(Duration::from_millis(50));
                drop(claims);
                assert_eq!(waiter.join().ok(), Some(true));
            });
        }
        assert_eq!(frames.claim(key), Claim::Fetch, "free to fetch again");
        stop.cancel();
        assert!(frames.wait(key, &stop).is_none(), "a stopped restore does not wait");
    }

    #[test]
    fn old_frames_go_once_the_kept_bytes_are_exceeded() {
        let frames = SharedFrames::default();
        let per = KEEP_BYTES / 4;
        for n in 0..6u32 {
            let key = (PackId([3; 32]), n);
            assert_eq!(frames.claim(key), Claim::Fetch);
            frames.publish(key, frame(1).0, per);
        }
        let kept: Vec<_> = (0..6u32).map(|n| frames.claim((PackId([3; 32]), n))).collect();
        assert_eq!(kept[..2], [Claim::Fetch, Claim::Fetch], "the two oldest evicted");
        assert!(kept[2..].iter().all(|c| *c == Claim::Wait));
    }
}
