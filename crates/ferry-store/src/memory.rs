//! An in-memory store for unit tests of the crates built on this one.
//!
//! Each call takes one lock for its whole effect, so create-if-absent is atomic and no
//! reader sees a partial object. Clones share the same objects.

use std::collections::BTreeMap;
use std::ops::Bound;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use async_trait::async_trait;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::cancel::{check_range, check_size};
use crate::{ObjectKey, ObjectMeta, ObjectStore, PutOutcome, StoreError, StoreResult};

/// Objects held in a map in memory. Not for production: nothing survives the process.
#[derive(Debug, Clone, Default)]
pub struct MemoryStore {
    objects: Arc<Mutex<BTreeMap<ObjectKey, Bytes>>>,
}

impl MemoryStore {
    /// An empty store.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Number of objects held.
    #[must_use]
    pub fn len(&self) -> usize {
        self.lock().len()
    }

    /// Whether the store holds no object.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.lock().is_empty()
    }

    fn lock(&self) -> MutexGuard<'_, BTreeMap<ObjectKey, Bytes>> {
        // A panic while holding the lock cannot leave the map half-updated: every update is
        // a single insert or remove.
        self.objects.lock().unwrap_or_else(PoisonError::into_inner)
    }

    fn object(&self, key: &ObjectKey) -> StoreResult<Bytes> {
        self.lock().get(key).cloned().ok_or_else(|| StoreError::NotFound { key: key.clone() })
    }
}

fn check_cancel(cancel: &CancellationToken) -> StoreResult<()> {
    if cancel.is_cancelled() { Err(StoreError::Cancelled) } else { Ok(()) }
}

#[async_trait]
impl ObjectStore for MemoryStore {
    async fn put_if_absent(
        &self,
        key: &ObjectKey,
        data: Bytes,
        cancel: &CancellationToken,
    ) -> StoreResult<PutOutcome> {
        check_cancel(cancel)?;
        let mut objects = self.lock();
        if objects.contains_key(key) {
            return Ok(PutOutcome::AlreadyExists);
        }
        objects.insert(key.clone(), data);
        Ok(PutOutcome::Created)
    }

    async fn get(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<Bytes> {
        check_cancel(cancel)?;
        self.object(key)
    }

    async fn get_at_most(
        &self,
        key: &ObjectKey,
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        check_cancel(cancel)?;
        let data = self.object(key)?;
        check_size(key, data.len() as u64, max_bytes)?;
        Ok(data)
    }

    async fn get_range(
        &self,
        key: &ObjectKey,
        offset: u64,
        len: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        check_cancel(cancel)?;
        let data = self.object(key)?;
        let end = check_range(key, offset, len, data.len() as u64)?;
        // Both bounds are at most `data.len()`, a usize.
        let (start, end) = (offset as usize, end as usize);
        Ok(data.slice(start..end))
    }

    async fn head(
        &self,
        key: &ObjectKey,
        cancel: &CancellationToken,
    ) -> StoreResult<Option<ObjectMeta>> {
        check_cancel(cancel)?;
        Ok(self
            .lock()
            .get(key)
            .map(|data| ObjectMeta { key: key.clone(), size: data.len() as u64 }))
    }

    async fn list(&self, prefix: &str, cancel: &CancellationToken) -> StoreResult<Vec<ObjectMeta>> {
        check_cancel(cancel)?;
        let objects = self.lock();
        let range = objects.range::<str, _>((Bound::Included(prefix), Bound::Unbounded));
        Ok(range
            .take_while(|(key, _)| key.as_str().starts_with(prefix))
            .map(|(key, data)| ObjectMeta { key: key.clone(), size: data.len() as u64 })
            .collect())
    }

    async fn delete(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<()> {
        check_cancel(cancel)?;
        self.lock().remove(key);
        Ok(())
    }
}
