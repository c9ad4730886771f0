//! Cancellation, range and size-cap helpers shared by the backends.

use std::future::Future;

use tokio_util::sync::CancellationToken;

use crate::{ObjectKey, StoreError, StoreResult};

/// Runs `work` unless `cancel` fires first; a token that is already cancelled wins before
/// `work` is polled at all. Dropping `work` must be safe: callers pass futures whose
/// abandonment leaves no partial object (an in-flight S3 request, a read).
pub(crate) async fn until_cancelled<T>(
    cancel: &CancellationToken,
    work: impl Future<Output = StoreResult<T>>,
) -> StoreResult<T> {
    if cancel.is_cancelled() {
        return Err(StoreError::Cancelled);
    }
    tokio::select! {
        biased;
        () = cancel.cancelled() => Err(StoreError::Cancelled),
        result = work => result,
    }
}

/// Checks that `offset..offset + len` lies within an object of `size` bytes and returns the
/// exclusive end of the range.
pub(crate) fn check_range(key: &ObjectKey, offset: u64, len: u64, size: u64) -> StoreResult<u64> {
    match offset.checked_add(len) {
        Some(end) if end <= size => Ok(end),
        _ => Err(StoreError::RangeOutOfBounds { key: key.clone(), offset, len, size }),
    }
}

/// Refuses an object of `size` bytes for a whole read capped at `max` bytes.
pub(crate) fn check_size(key: &ObjectKey, size: u64, max: u64) -> StoreResult<()> {
    if size > max { Err(StoreError::TooLarge { key: key.clone(), size, max }) } else { Ok(()) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_inside_the_object_pass() {
        let key = ObjectKey::new("k").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(check_range(&key, 0, 10, 10).ok(), Some(10));
        assert_eq!(check_range(&key, 10, 0, 10).ok(), Some(10));
        assert!(check_range(&key, 10, 1, 10).is_err());
        assert!(check_range(&key, 11, 0, 10).is_err());
        assert!(check_range(&key, u64::MAX, 2, u64::MAX).is_err());
    }

    #[test]
    fn sizes_up_to_the_cap_pass() {
        let key = ObjectKey::new("k").unwrap_or_else(|e| panic!("{e}"));
        assert!(check_size(&key, 0, 0).is_ok());
        assert!(check_size(&key, 10, 10).is_ok());
        let over = check_size(&key, 11, 10);
        assert!(matches!(over, Err(StoreError::TooLarge { size: 11, max: 10, .. })), "{over:?}");
        let message = over.err().map(|e| e.to_string()).unwrap_or_default();
        assert_eq!(
            message,
            "object k is 11 bytes, more than the 10 bytes a whole read of it may take; it was \
             not read"
        );
    }

    #[tokio::test]
    async fn cancelled_token_wins_before_work_starts() {
        let cancel = CancellationToken::new();
        cancel.cancel();
        let result = until_cancelled(&cancel, async { Ok(1) }).await;
        assert!(matches!(result, Err(StoreError::Cancelled)));
        let live = CancellationToken::new();
        assert_eq!(until_cancelled(&live, async { Ok(1) }).await.ok(), Some(1));
    }
}
