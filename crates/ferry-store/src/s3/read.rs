//! `GetObject` (whole and ranged) and `HeadObject`.

use std::sync::atomic::Ordering;

use bytes::Bytes;

use super::retry::Backoff;
use super::{Inner, errors, size_of};
use crate::cancel::check_range;
use crate::{ObjectKey, ObjectMeta, StoreError, StoreResult};

impl Inner {
    pub(super) async fn head(&self, key: &ObjectKey) -> StoreResult<Option<ObjectMeta>> {
        let result =
            self.client.head_object().bucket(&self.bucket).key(self.s3_key(key)).send().await;
        match result {
            Ok(out) => {
                self.bucket_seen.store(true, Ordering::Relaxed);
                let size = size_of(out.content_length(), key.as_str(), self)?;
                Ok(Some(ObjectMeta { key: key.clone(), size }))
            }
            // HEAD responses have no body, so a missing bucket also looks like a bare 404:
            // tell the two apart once by asking about the bucket.
            Err(e) if errors::status(&e) == Some(404) => {
                if !self.bucket_seen.load(Ordering::Relaxed) {
                    self.check_bucket().await?;
                }
                Ok(None)
            }
            Err(e) => Err(self.site().error(format!("head {key}"), None, e)),
        }
    }

    /// Reads the whole object, or `len` bytes from `offset`.
    pub(super) async fn get(
        &self,
        key: &ObjectKey,
        range: Option<(u64, u64)>,
    ) -> StoreResult<Bytes> {
        let http_range = match range {
            None => None,
            Some((offset, len)) => match offset.checked_add(len) {
                // HTTP ranges cannot be empty; an empty read only needs the size.
                Some(end) if len > 0 => Some(format!("bytes={offset}-{}", end - 1)),
                _ => {
                    let size = self.size(key).await?;
                    check_range(key, offset, len, size)?;
                    return Ok(Bytes::new());
                }
            },
        };
        let mut backoff = Backoff::new(&self.options);
        loop {
            let request = self
                .client
                .get_object()
                .bucket(&self.bucket)
                .key(self.s3_key(key))
                .set_range(http_range.clone());
            let out = match request.send().await {
                Ok(out) => out,
                Err(e)
                    if errors::status(&e) == Some(416)
                        || errors::code(&e) == Some("InvalidRange") =>
                {
                    return Err(self.out_of_bounds(key, range, None).await);
                }
                Err(e) => return Err(self.site().error(format!("get {key}"), Some(key), e)),
            };
            self.bucket_seen.store(true, Ordering::Relaxed);
            // A server that ignores `Range` answers with the whole object: its bytes are not
            // the ones asked for, whatever their number.
            if let Some((offset, _)) = range
                && out.content_range().and_then(range_start) != Some(offset)
            {
                return Err(self.backend_error(
                    format!("get {key}"),
                    &format!(
                        "asked for bytes from {offset}, answered with content range {:?}: the \
                         server does not honour ranged reads",
                        out.content_range().unwrap_or("(none)")
                    ),
                ));
            }
            let total = out.content_range().and_then(total_size);
            match out.body.collect().await {
                Ok(body) => {
                    let bytes = body.into_bytes();
                    return match range {
                        // S3 answers a range that runs past the end with the bytes it has.
                        Some((_, len)) if bytes.len() as u64 != len => {
                            Err(self.out_of_bounds(key, range, total).await)
                        }
                        _ => Ok(bytes),
                    };
                }
                // The SDK cannot retry a body that breaks off mid-stream; retry the request.
                Err(e) => {
                    tracing::debug!(key = %key, error = %e, "object body read failed");
                    if !backoff.pause().await {
                        return Err(StoreError::Unavailable {
                            location: self.endpoint.clone(),
                            operation: format!("get {key}"),
                            message: format!("reading the response body: {e}"),
                        });
                    }
                }
            }
        }
    }

    async fn size(&self, key: &ObjectKey) -> StoreResult<u64> {
        match self.head(key).await? {
            Some(meta) => Ok(meta.size),
            None => Err(StoreError::NotFound { key: key.clone() }),
        }
    }

    /// The error for a range outside `key`, with the object's size (asked for if unknown).
    async fn out_of_bounds(
        &self,
        key: &ObjectKey,
        range: Option<(u64, u64)>,
        size: Option<u64>,
    ) -> StoreError {
        let size = match size {
            Some(size) => size,
            None => match self.size(key).await {
                Ok(size) => size,
                Err(e) => return e,
            },
        };
        let (offset, len) = range.unwrap_or((0, 0));
        match check_range(key, offset, len, size) {
            Err(e) => e,
            // The object changed size between the two requests: objects are immutable, so
            // something other than Ferry rewrote it.
            Ok(_) => self.backend_error(format!("get {key}"), "object size changed while reading"),
        }
    }
}

/// The object size at the end of a `Content-Range` value (`bytes 0-9/1234`).
/// The first byte of `bytes START-END/TOTAL`.
fn range_start(content_range: &str) -> Option<u64> {
    let (start, _) = content_range.strip_prefix("bytes ")?.split_once('-')?;
    start.parse().ok()
}

fn total_size(content_range: &str) -> Option<u64> {
    content_range.rsplit_once('/').and_then(|(_, total)| total.parse().ok())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn content_range_starts() {
        assert_eq!(range_start("bytes 10-99/100"), Some(10));
        assert_eq!(range_start("bytes 0-0/1"), Some(0));
        assert_eq!(range_start("bytes */77"), None);
        assert_eq!(range_start("10-99/100"), None);
    }

    #[test]
    fn content_range_totals() {
        assert_eq!(total_size("bytes 0-9/1234"), Some(1234));
        assert_eq!(total_size("bytes */77"), Some(77));
        assert_eq!(total_size("bytes 0-9/*"), None);
        assert_eq!(total_size("garbage"), None);
    }
}
