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
//! two workers can wait for each other. A frame already opened is handed over at once.
//!
//! Opened frames are kept within [`KEEP_BYTES`] of memory (plaintext and table). The planner
//! counts each batch's frames as it sends the batch ([`Demand`]), and a batch gives each frame
//! up once it has written every blob it needs from it: the frames no batch sent still needs are
//! evicted first, the first published first; only when every kept frame is still needed is the
//! first published of those evicted. (Evicted in publishing order alone, the frames only one
//! batch needs, most of them on the Linux tree, pushed out some a batch to come needed: a
//! restore of it over a network downloaded 5 MB more.) A frame evicted, or whose fetch failed,
//! is claimed again by whoever needs it next.

use std::collections::{BTreeMap, BTreeSet, HashMap};
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
    /// Opened: the frame, its memory, and its place in the publishing order.
    Ready { frame: Arc<Frame>, bytes: usize, seq: u64 },
}

#[derive(Debug, Default)]
struct State {
    slots: HashMap<FrameKey, Slot>,
    /// Ready frames by their place in the publishing order.
    order: BTreeMap<u64, FrameKey>,
    /// The places of the ready frames no batch sent still needs (evicted first).
    idle: BTreeSet<u64>,
    /// Batches sent that still need each frame.
    demand: HashMap<FrameKey, u32>,
    bytes: usize,
    /// Claims made so far (each claim's number).
    claims: u64,
    /// Frames published so far (each one's place in the order).
    published: u64,
}

impl State {
    /// The place of `key` in the publishing order, if it is ready.
    fn seq(&self, key: &FrameKey) -> Option<u64> {
        match self.slots.get(key) {
            Some(Slot::Ready { seq, .. }) => Some(*seq),
            _ => None,
        }
    }

    /// Panics unless the order, the idle set, the demand and the memory count agree.
    #[cfg(test)]
    fn check(&self) {
        let mut bytes = 0;
        let mut ready = 0;
        for (key, slot) in &self.slots {
            if let Slot::Ready { bytes: size, seq, .. } = slot {
                ready += 1;
                bytes += size;
                assert_eq!(self.order.get(seq), Some(key), "in the order at its place");
                let idle = !self.demand.contains_key(key);
                assert_eq!(self.idle.contains(seq), idle, "idle exactly when no batch needs it");
            }
        }
        assert_eq!(self.order.len(), ready, "the order holds the ready frames only");
        assert!(self.idle.iter().all(|seq| self.order.contains_key(seq)));
        assert!(self.demand.values().all(|n| *n > 0));
        assert_eq!(self.bytes, bytes);
    }

    /// Evicts one ready frame: the first published of those no batch needs, else the first
    /// published. False when none is ready.
    fn evict_one(&mut self) -> bool {
        let Some(seq) = self.idle.first().or_else(|| self.order.keys().next()).copied() else {
            return false;
        };
        self.idle.remove(&seq);
        if let Some(key) = self.order.remove(&seq)
            && let Some(Slot::Ready { bytes, .. }) = self.slots.remove(&key)
        {
            self.bytes -= bytes;
        }
        true
    }
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
            Some(Slot::Ready { frame, .. }) => Claim::Ready(Arc::clone(frame)),
            Some(Slot::Fetching(n)) => Claim::Wait(*n),
            None => {
                state.claims += 1;
                let n = state.claims;
                state.slots.insert(key, Slot::Fetching(n));
                Claim::Fetch
            }
        }
    }

    /// Counts a batch about to be sent as needing `keys` (each once).
    fn expect(&self, keys: &[FrameKey]) {
        let mut state = self.lock();
        for key in keys {
            let n = state.demand.entry(*key).or_insert(0);
            *n += 1;
            if *n == 1
                && let Some(seq) = state.seq(key)
            {
                state.idle.remove(&seq);
            }
        }
    }

    /// A batch counted by [`Self::expect`] no longer needs `key`.
    fn release(&self, key: FrameKey) {
        let mut state = self.lock();
        debug_assert!(state.demand.contains_key(&key), "a frame released was counted");
        let Some(n) = state.demand.get_mut(&key) else { return };
        *n -= 1;
        if *n == 0 {
            state.demand.remove(&key);
            if let Some(seq) = state.seq(&key) {
                state.idle.insert(seq);
            }
        }
    }

    /// Hands a frame the caller claimed to every batch waiting for it, and keeps it, evicting
    /// as the module documentation says (a frame larger than the kept memory is evicted at
    /// once: its waiters then fetch it). A frame not claimed (or published already) is left as
    /// it is.
    pub(crate) fn publish(&self, key: FrameKey, frame: Arc<Frame>) {
        let mut state = self.lock();
        let seq = state.published;
        let Some(slot @ Slot::Fetching(_)) = state.slots.get_mut(&key) else { return };
        let bytes = frame.memory();
        *slot = Slot::Ready { frame, bytes, seq };
        state.published += 1;
        state.order.insert(seq, key);
        if !state.demand.contains_key(&key) {
            state.idle.insert(seq);
        }
        state.bytes += bytes;
        while state.bytes > self.keep && state.evict_one() {}
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
            Some(Slot::Ready { frame, .. }) => Some(Arc::clone(frame)),
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
                Some(Slot::Ready { frame, .. }) => return Some(Arc::clone(frame)),
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

/// The frames a batch sent still needs, counted in its [`SharedFrames`] from its sending until
/// it gives each up (or is dropped).
#[derive(Debug)]
pub(crate) struct Demand<'a> {
    frames: &'a SharedFrames,
    keys: Vec<FrameKey>,
}

impl<'a> Demand<'a> {
    /// Counts `keys` (duplicates are counted once) as needed by a batch about to be sent.
    pub(crate) fn new(frames: &'a SharedFrames, mut keys: Vec<FrameKey>) -> Self {
        keys.sort_unstable();
        keys.dedup();
        frames.expect(&keys);
        Self { frames, keys }
    }

    /// The batch has written every blob it needs from `key` (nothing if it was given up).
    pub(crate) fn done(&mut self, key: FrameKey) {
        if let Ok(i) = self.keys.binary_search(&key) {
            self.keys.remove(i);
            self.frames.release(key);
        }
    }
}

impl Drop for Demand<'_> {
    fn drop(&mut self) {
        for key in self.keys.drain(..) {
            self.frames.release(key);
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

    /// Claims and publishes `key` with a frame of 10 blobs.
    fn publish(frames: &SharedFrames, key: FrameKey) {
        assert!(matches!(frames.claim(key), Claim::Fetch));
        frames.publish(key, frame(10));
    }

    #[test]
    fn a_frame_counted_once_opened_or_evicted_while_needed_is_kept_as_needed() {
        let one = frame(10).memory();
        let frames = SharedFrames::keeping(2 * one);
        let key = |n| (PackId([12; 32]), n);
        let kept = |n| frames.ready(key(n)).is_some();
        publish(&frames, key(0));
        frames.lock().check();
        // Counted after it was opened: no longer idle.
        let mut first = Demand::new(&frames, vec![key(0), key(1)]);
        let second = Demand::new(&frames, vec![key(0), key(1)]);
        frames.lock().check();
        publish(&frames, key(2));
        publish(&frames, key(3));
        frames.lock().check();
        assert!(kept(0) && !kept(2) && kept(3), "the idle one goes; the needed one stays");
        // Evicted while needed (every kept frame needed), then opened again: still needed.
        let _third = Demand::new(&frames, vec![key(3)]);
        publish(&frames, key(1));
        frames.lock().check();
        assert!(!kept(0) && kept(1) && kept(3), "the first published of the needed ones went");
        publish(&frames, key(0));
        frames.lock().check();
        assert!(kept(0) && kept(1) && !kept(3), "opened again; the first published went");
        // Given up twice by one batch: the other one's count stays.
        first.done(key(0));
        first.done(key(0));
        assert_eq!(frames.lock().demand.get(&key(0)), Some(&1), "released once only");
        frames.lock().check();
        drop(second);
        frames.lock().check();
        assert!(!frames.lock().demand.contains_key(&key(0)));
    }

    #[test]
    fn frames_a_sent_batch_still_needs_outlast_older_ones_none_needs() {
        let frames = SharedFrames::keeping(3 * frame(10).memory());
        let key = |n| (PackId([7; 32]), n);
        let mut second = Demand::new(&frames, vec![key(0), key(2), key(0)]);
        for n in 0..3 {
            publish(&frames, key(n));
        }
        publish(&frames, key(3));
        publish(&frames, key(4));
        let kept = |n| frames.ready(key(n)).is_some();
        frames.lock().check();
        assert!(kept(0) && kept(2), "still needed: kept, though published first");
        assert!(!kept(1) && !kept(3), "needed by no batch sent: evicted, first published first");
        assert!(kept(4), "the newest");
        // Once given up, a frame goes before those still needed.
        second.done(key(0));
        second.done(key(0));
        publish(&frames, key(1));
        assert!(!kept(0) && kept(2), "given up: evicted first");
        let state = frames.lock();
        assert_eq!(state.demand.get(&key(2)), Some(&1), "released once only");
        assert_eq!(state.order.len(), 3);
        drop(state);
        drop(second);
        frames.lock().check();
        assert!(frames.lock().demand.is_empty(), "a dropped batch needs nothing");
        assert_eq!(frames.lock().idle.len(), 3, "and every kept frame is idle");
    }

    #[test]
    fn when_every_kept_frame_is_needed_the_first_published_goes() {
        let frames = SharedFrames::keeping(2 * frame(10).memory());
        let key = |n| (PackId([8; 32]), n);
        let _batch = Demand::new(&frames, (0..3).map(key).collect());
        for n in 0..3 {
            publish(&frames, key(n));
        }
        let kept = |n| frames.ready(key(n)).is_some();
        assert!(!kept(0) && kept(1) && kept(2), "memory stays bounded");
        let state = frames.lock();
        assert!(state.bytes <= 2 * frame(10).memory() && state.idle.is_empty());
    }
}
