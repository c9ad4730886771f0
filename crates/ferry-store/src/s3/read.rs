//! `GetObject` (whole and ranged) and `HeadObject`.

use std::sync::atomic::Ordering;

use aws_sdk_s3::primitives::{ByteStream, ByteStreamError};
use bytes::{Bytes, BytesMut};

use super::retry::Backoff;
use super::{Inner, errors, size_of};
use crate::cancel::{check_range, check_size};
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

    /// Reads the whole object (capped or not), or a range of it.
    pub(super) async fn get(&self, key: &ObjectKey, want: Want) -> StoreResult<Bytes> {
        let range = match want {
            Want::Range(offset, len) => Some((offset, len)),
            Want::Whole | Want::AtMost(_) => None,
        };
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
            let body = match want {
                Want::AtMost(max) => {
                    let announced = out.content_length().and_then(|n| u64::try_from(n).ok());
                    if let Some(size) = announced {
                        // Dropping the response unread: none of its body is downloaded.
                        check_size(key, size, max)?;
                    }
                    let overrun = |seen| match announced {
                        Some(size) => self.backend_error(
                            format!("get {key}"),
                            &format!("the body ran past its Content-Length of {size} bytes"),
                        ),
                        None => StoreError::TooLarge { key: key.clone(), size: seen, max },
                    };
                    read_capped(out.body, max, announced).await.map(|r| r.map_err(overrun))
                }
                Want::Whole | Want::Range(..) => {
                    out.body.collect().await.map(|b| Ok(b.into_bytes()))
                }
            };
            match body {
                Ok(bytes) => {
                    let bytes = bytes?;
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

/// What part of an object a `GetObject` asks for.
#[derive(Debug, Clone, Copy)]
pub(super) enum Want {
    /// All of it.
    Whole,
    /// All of it, refused when larger than this many bytes.
    AtMost(u64),
    /// `len` bytes from `offset`.
    Range(u64, u64),
}

/// Reads a response body, stopping as soon as more than `max` bytes, or more than
/// `announced` (the `Content-Length`, already checked against `max`), have arrived; then the
/// bytes seen so far (`Ok(Err(seen))`). `Err` when the body broke off.
async fn read_capped(
    mut body: ByteStream,
    max: u64,
    announced: Option<u64>,
) -> Result<Result<Bytes, u64>, ByteStreamError> {
    let mut capped = Capped::new(max, announced);
    while let Some(chunk) = body.try_next().await? {
        if !capped.push(&chunk) {
            return Ok(Err(capped.seen));
        }
    }
    Ok(Ok(capped.buf.freeze()))
}

/// Body bytes collected up to a limit: the cap, or the announced size when smaller.
#[derive(Debug)]
struct Capped {
    buf: BytesMut,
    seen: u64,
    limit: u64,
}

impl Capped {
    fn new(max: u64, announced: Option<u64>) -> Self {
        let limit = announced.map_or(max, |size| size.min(max));
        let capacity = usize::try_from(announced.map_or(0, |_| limit)).unwrap_or(0);
        Self { buf: BytesMut::with_capacity(capacity), seen: 0, limit }
    }

    /// Keeps `chunk`, unless it takes the bytes seen past the limit: then `false`, and it is
    /// not kept.
    fn push(&mut self, chunk: &[u8]) -> bool {
        self.seen = self.seen.saturating_add(chunk.len() as u64);
        if self.seen > self.limit {
            return false;
        }
        self.buf.extend_from_slice(chunk);
        true
    }
}

/// The first byte of `bytes START-END/TOTAL`.
fn range_start(content_range: &str) -> Option<u64> {
    let (start, _) = content_range.strip_prefix("bytes ")?.split_once('-')?;
    start.parse().ok()
}

/// The object size at the end of a `Content-Range` value (`bytes 0-9/1234`).
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
    fn a_body_is_collected_up_to_the_cap_and_no_further() {
        let mut capped = Capped::new(10, None);
        assert!(capped.push(b"0123"));
        assert!(capped.push(b""));
        assert!(capped.push(b"456789"));
        assert_eq!(&capped.buf[..], b"0123456789");
        // Refused at the first byte past the cap, which is not kept.
        assert!(!capped.push(b"a"));
        assert_eq!((capped.seen, capped.buf.len()), (11, 10));
        // Past an announced size smaller than the cap: refused there.
        let mut announced = Capped::new(10, Some(3));
        assert!(announced.buf.capacity() >= 3);
        assert!(!announced.push(b"abcd"));
        assert!(announced.buf.is_empty());
        // Only an announced size preallocates, and never past the cap.
        assert!(Capped::new(8, Some(u64::MAX)).buf.capacity() < 1024);
        assert!(Capped::new(1 << 30, None).buf.capacity() < 1024);
    }

    #[tokio::test]
    async fn a_streamed_body_stops_past_the_cap() {
        let within = read_capped(ByteStream::from_static(b"abc"), 3, None).await;
        assert_eq!(within.ok().and_then(Result::ok).as_deref(), Some(&b"abc"[..]));
        let over = read_capped(ByteStream::from_static(b"abcd"), 3, None).await;
        assert_eq!(over.ok().and_then(Result::err), Some(4));
        let past_announced = read_capped(ByteStream::from_static(b"abcd"), 10, Some(2)).await;
        assert_eq!(past_announced.ok().and_then(Result::err), Some(4));
    }

    #[test]
    fn content_range_totals() {
        assert_eq!(total_size("bytes 0-9/1234"), Some(1234));
        assert_eq!(total_size("bytes */77"), Some(77));
        assert_eq!(total_size("bytes 0-9/*"), None);
        assert_eq!(total_size("garbage"), None);
    }
}
