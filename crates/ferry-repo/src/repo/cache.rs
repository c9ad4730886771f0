//! A small LRU cache of whole pack files, bounded by bytes.

use std::collections::HashMap;
use std::sync::Mutex;

use bytes::Bytes;

use crate::format::PackId;

/// Whole packs (tree packs, read once and sliced many times), least recently used evicted
/// first once `budget` bytes are held.
#[derive(Debug)]
pub(crate) struct PackCache {
    budget: u64,
    inner: Mutex<Entries>,
}

#[derive(Debug, Default)]
struct Entries {
    map: HashMap<PackId, (Bytes, u64)>,
    bytes: u64,
    tick: u64,
}

impl PackCache {
    pub(crate) fn new(budget: u64) -> Self {
        Self { budget, inner: Mutex::new(Entries::default()) }
    }

    /// Whether a pack of `size` bytes may be cached.
    pub(crate) fn fits(&self, size: u64) -> bool {
        size <= self.budget / 2
    }

    pub(crate) fn get(&self, id: &PackId) -> Option<Bytes> {
        let mut e = self.inner.lock().ok()?;
        e.tick += 1;
        let tick = e.tick;
        let slot = e.map.get_mut(id)?;
        slot.1 = tick;
        Some(slot.0.clone())
    }

    pub(crate) fn insert(&self, id: PackId, bytes: Bytes) {
        let Ok(mut e) = self.inner.lock() else { return };
        let len = bytes.len() as u64;
        if len > self.budget / 2 || e.map.contains_key(&id) {
            return;
        }
        while e.bytes + len > self.budget {
            let Some(oldest) = e.map.iter().min_by_key(|(_, (_, t))| *t).map(|(k, _)| *k) else {
                break;
            };
            if let Some((b, _)) = e.map.remove(&oldest) {
                e.bytes -= b.len() as u64;
            }
        }
        e.tick += 1;
        let tick = e.tick;
        e.bytes += len;
        e.map.insert(id, (bytes, tick));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn evicts_least_recently_used_within_budget() {
        let c = PackCache::new(100);
        c.insert(PackId([1; 32]), Bytes::from(vec![0; 40]));
        c.insert(PackId([2; 32]), Bytes::from(vec![0; 40]));
        assert!(c.get(&PackId([1; 32])).is_some());
        c.insert(PackId([3; 32]), Bytes::from(vec![0; 40]));
        assert!(c.get(&PackId([2; 32])).is_none());
        assert!(c.get(&PackId([1; 32])).is_some());
        assert!(c.get(&PackId([3; 32])).is_some());
        c.insert(PackId([4; 32]), Bytes::from(vec![0; 60]));
        assert!(c.get(&PackId([4; 32])).is_none(), "over half the budget must not be cached");
    }
}
