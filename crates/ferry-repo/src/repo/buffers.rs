//! Pack buffers reused from one pack to the next within a writer.
//!
//! A pack is built in one buffer of about the pack's target size (16 MiB by default), sealed,
//! stored, then freed. Allocating and freeing one such block per pack is what makes glibc's
//! allocator keep memory: it raises its mmap threshold to the largest block freed, so later
//! blocks come from the threads' arenas, and an arena keeps what is freed at its top until
//! twice that threshold is free. A writer that takes its buffers back from the store and reuses
//! them stops large blocks from coming and going: the few a backup needs at once (the open
//! packs, the one being sealed, the ones being stored) are allocated once and freed when the
//! backup ends.

use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Mutex, PoisonError};

use bytes::Bytes;

/// The buffers of stored packs, kept for the next packs.
#[derive(Debug)]
pub(crate) struct PackBuffers {
    kept: Mutex<Vec<Vec<u8>>>,
    /// The capacity a new buffer is allocated with.
    capacity: usize,
    /// At most this many are kept; the rest are freed.
    max_kept: usize,
    /// Buffers allocated so far.
    allocated: AtomicUsize,
}

impl PackBuffers {
    /// Buffers of `capacity` bytes, at most `max_kept` kept.
    pub(crate) fn new(capacity: usize, max_kept: usize) -> Self {
        Self { kept: Mutex::new(Vec::new()), capacity, max_kept, allocated: AtomicUsize::new(0) }
    }

    /// A kept buffer, or a new one; empty either way.
    pub(crate) fn take(&self) -> Vec<u8> {
        let kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner).pop();
        kept.unwrap_or_else(|| {
            self.allocated.fetch_add(1, Ordering::Relaxed);
            Vec::with_capacity(self.capacity)
        })
    }

    /// Keeps `buf` for a later pack, unless enough are kept or its capacity is far from the
    /// usual (smaller than new buffers, or more than twice their size: a pack that grew far
    /// past the target is not worth holding on to).
    pub(crate) fn give(&self, mut buf: Vec<u8>) {
        if buf.capacity() < self.capacity || buf.capacity() > 2 * self.capacity {
            return;
        }
        buf.clear();
        let mut kept = self.kept.lock().unwrap_or_else(PoisonError::into_inner);
        if kept.len() < self.max_kept {
            kept.push(buf);
        }
    }

    /// Takes back a stored pack's bytes when nothing else holds them (the store may keep a
    /// copy, a cache may hold one: then the buffer is simply freed when they let go).
    pub(crate) fn give_back(&self, bytes: Bytes) {
        if let Ok(unique) = bytes.try_into_mut() {
            self.give(Vec::from(unique));
        }
    }

    /// How many buffers are kept now.
    #[cfg(test)]
    pub(crate) fn kept(&self) -> usize {
        self.kept.lock().unwrap_or_else(PoisonError::into_inner).len()
    }

    /// How many buffers were allocated so far.
    #[cfg(test)]
    pub(crate) fn allocated(&self) -> usize {
        self.allocated.load(Ordering::Relaxed)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stored_packs_buffer_comes_back_for_the_next_pack() {
        let buffers = PackBuffers::new(1024, 2);
        let mut buf = buffers.take();
        assert!(buf.capacity() >= 1024 && buf.is_empty());
        buf.extend_from_slice(&[7; 900]);
        let ptr = buf.as_ptr();
        buffers.give_back(Bytes::from(buf));
        assert_eq!(buffers.kept(), 1);
        let again = buffers.take();
        assert_eq!(again.as_ptr(), ptr, "the same allocation");
        assert!(again.is_empty() && again.capacity() >= 1024);
    }

    #[test]
    fn shared_small_huge_or_surplus_buffers_are_not_kept() {
        let buffers = PackBuffers::new(1024, 1);
        let shared = Bytes::from(vec![1u8; 1024]);
        let copy = shared.clone();
        buffers.give_back(shared);
        assert_eq!(buffers.kept(), 0, "a copy is still held");
        drop(copy);
        buffers.give(Vec::with_capacity(100));
        buffers.give(Vec::with_capacity(4096));
        assert_eq!(buffers.kept(), 0);
        buffers.give(Vec::with_capacity(1024));
        buffers.give(Vec::with_capacity(1024));
        assert_eq!(buffers.kept(), 1, "at most max_kept");
    }
}
