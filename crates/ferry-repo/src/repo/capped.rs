//! Whole-object reads capped by the limit of the object's kind
//! ([`crate::format::limits`]), and the same limits checked before a write.

use bytes::Bytes;
use ferry_store::{ObjectKey, ObjectStore};
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::limits::{
    MAX_CONFIG_BYTES, MAX_GC_STATE_BYTES, MAX_INDEX_FILE_BYTES, MAX_KEY_FILE_BYTES, MAX_PACK_BYTES,
    MAX_SNAPSHOT_BYTES,
};

/// A kind of object read whole, and the most bytes one may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Limit {
    /// What the object is, in messages.
    pub(crate) noun: &'static str,
    /// The most bytes read.
    pub(crate) max: u64,
}

impl Limit {
    pub(crate) const CONFIG: Self = Self { noun: "config", max: MAX_CONFIG_BYTES };
    pub(crate) const KEY_FILE: Self = Self { noun: "key file", max: MAX_KEY_FILE_BYTES };
    pub(crate) const INDEX: Self = Self { noun: "index", max: MAX_INDEX_FILE_BYTES };
    pub(crate) const SNAPSHOT: Self = Self { noun: "snapshot", max: MAX_SNAPSHOT_BYTES };
    pub(crate) const GC_STATE: Self = Self { noun: "gc state", max: MAX_GC_STATE_BYTES };
    pub(crate) const PACK: Self = Self { noun: "pack", max: MAX_PACK_BYTES };

    /// A pack the index records as `size` bytes: nothing larger is read.
    pub(crate) fn indexed_pack(size: u64) -> Self {
        Self { noun: "pack", max: size.min(MAX_PACK_BYTES) }
    }

    /// Refuses to store `len` bytes at `key` as an object of this kind when readers would
    /// refuse to read it back.
    pub(crate) fn check_write(self, key: &ObjectKey, len: usize) -> RepoResult<()> {
        if len as u64 <= self.max {
            return Ok(());
        }
        Err(RepoError::InvalidInput {
            what: "object size",
            reason: format!(
                "{} {key} would be {len} bytes, more than the {} bytes readers accept; nothing \
                 was written",
                self.noun, self.max
            ),
        })
    }
}

/// Reads `key` whole, refusing it unread ([`RepoError::TooLarge`]) when it is larger than
/// `limit`.
pub(crate) async fn read(
    store: &dyn ObjectStore,
    key: &ObjectKey,
    limit: Limit,
    operation: &'static str,
    cancel: &CancellationToken,
) -> RepoResult<Bytes> {
    store
        .get_at_most(key, limit.max, cancel)
        .await
        .map_err(|e| RepoError::whole_read(operation, limit.noun, key, e))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_over_the_limit_are_refused_naming_the_object() {
        let key = ObjectKey::new("gc/mark-x").expect("key");
        let limit = Limit { noun: "gc state", max: 10 };
        assert!(limit.check_write(&key, 10).is_ok());
        let refused = limit.check_write(&key, 11).expect_err("over the limit");
        let message = refused.to_string();
        assert!(message.contains("gc state gc/mark-x would be 11 bytes"), "{message}");
        assert_eq!(Limit::indexed_pack(u64::MAX), Limit::PACK);
        assert_eq!(Limit::indexed_pack(5).max, 5);
    }
}
