//! S3 backend: one S3 object per key, below an optional key prefix in one bucket.
//!
//! Why no partial object is ever visible: S3 makes an object visible only once its upload
//! has completed — a `PutObject` when its whole body arrived (and its checksum matched), a
//! multipart upload only at `CompleteMultipartUpload`. Parts of an unfinished multipart upload
//! are not objects: no `GetObject`, `HeadObject` or `ListObjectsV2` shows them. On failure or
//! cancellation the upload is aborted; one that cannot be aborted (the process dies) stays
//! invisible and is removed by the bucket's lifecycle rule for incomplete uploads.
//!
//! Why create-if-absent is atomic: both `PutObject` and `CompleteMultipartUpload` carry
//! `If-None-Match: *`, so S3 itself creates the object only if no object has the key, in one
//! step on the server; a writer that loses gets `412 Precondition Failed`, reported as
//! [`PutOutcome::AlreadyExists`]. Racing conditional writes may get
//! `409 ConditionalRequestConflict`, which is retried (see `retry`).
//!
//! Retries: the SDK's standard retry mode (bounded attempts, exponential backoff with full
//! jitter, for throttling, 5xx, timeouts and connection failures) covers every request; the
//! backend adds its own bounded loop only where the SDK cannot help (see `retry`).
//! Cancellation: every call races its work against the token with `tokio::select!`;
//! dropping an in-flight SDK request cancels it.

mod config;
mod errors;
mod put;
mod read;
mod retry;

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use async_trait::async_trait;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

pub use config::{S3Config, S3Options, ServerSideEncryption, StaticCredentials};

use crate::cancel::until_cancelled;
use crate::{ObjectKey, ObjectMeta, ObjectStore, PutOutcome, StoreError, StoreResult};
use errors::Site;
use read::Want;

/// Objects in an S3 bucket (AWS or compatible). Cheap to clone.
///
/// Creates are conditional (`If-None-Match: *` on `PutObject` and on
/// `CompleteMultipartUpload`), so S3 itself decides races and never shows a partial object.
/// Before its first create, a store checks that the server honours the condition (some older
/// S3-compatible servers ignore it and overwrite), and refuses to write if not.
/// Objects above [`S3Options::multipart_threshold`] go up in parts; failed or cancelled
/// uploads are aborted.
#[derive(Debug, Clone)]
pub struct S3Store {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    client: aws_sdk_s3::Client,
    bucket: String,
    /// Normalized: empty, or ending in `/`.
    prefix: String,
    /// The endpoint as shown in errors.
    endpoint: String,
    options: S3Options,
    /// Whether the bucket was seen to exist, so a bodiless 404 from `HeadObject` means a
    /// missing object rather than a missing bucket.
    bucket_seen: AtomicBool,
    /// Set once a probe showed the server refuses a second `If-None-Match: *` write (see
    /// `put::conditional_writes_honoured`).
    conditional_probed: tokio::sync::OnceCell<()>,
}

impl S3Store {
    /// Builds a client for `config`. Contacts nothing: a missing bucket or bad credentials
    /// show on the first call (or on [`S3Store::check_bucket`]).
    ///
    /// # Errors
    /// [`StoreError::InvalidConfig`] for settings S3 cannot work with, among them a CA bundle
    /// without a usable PEM certificate.
    pub async fn new(config: S3Config) -> StoreResult<Self> {
        config::validate(&config)?;
        let client = config::client(&config.options).await?;
        let endpoint = match &config.options.endpoint {
            Some(url) => url.clone(),
            None => match client.config().region() {
                Some(region) => format!("AWS S3 ({region})"),
                None => "AWS S3".to_owned(),
            },
        };
        Ok(Self {
            inner: Arc::new(Inner {
                client,
                prefix: config::normalized_prefix(&config.prefix),
                bucket: config.bucket,
                endpoint,
                options: config.options,
                bucket_seen: AtomicBool::new(false),
                conditional_probed: tokio::sync::OnceCell::new(),
            }),
        })
    }

    /// The bucket.
    #[must_use]
    pub fn bucket(&self) -> &str {
        &self.inner.bucket
    }

    /// Checks that the bucket exists and the credentials may use it.
    ///
    /// # Errors
    /// [`StoreError::LocationMissing`] naming the bucket, [`StoreError::AccessDenied`],
    /// [`StoreError::Unavailable`], cancellation.
    pub async fn check_bucket(&self, cancel: &CancellationToken) -> StoreResult<()> {
        until_cancelled(cancel, self.inner.check_bucket()).await
    }
}

impl Inner {
    fn site(&self) -> Site<'_> {
        Site { bucket: &self.bucket, endpoint: &self.endpoint }
    }

    fn s3_key(&self, key: &ObjectKey) -> String {
        format!("{}{key}", self.prefix)
    }

    async fn check_bucket(&self) -> StoreResult<()> {
        let result = self.client.head_bucket().bucket(&self.bucket).send().await;
        match result {
            Ok(_) => {
                self.bucket_seen.store(true, Ordering::Relaxed);
                Ok(())
            }
            // HeadBucket answers without a body, so only the status tells.
            Err(e) if errors::status(&e) == Some(404) => Err(StoreError::LocationMissing {
                location: format!("s3 bucket {} at {}", self.bucket, self.endpoint),
            }),
            Err(e) => Err(self.site().error(format!("check bucket {}", self.bucket), None, e)),
        }
    }

    async fn list(&self, prefix: &str) -> StoreResult<Vec<ObjectMeta>> {
        let mut found = Vec::new();
        let mut token: Option<String> = None;
        let operation = || format!("list {prefix}*");
        loop {
            let page = self
                .client
                .list_objects_v2()
                .bucket(&self.bucket)
                .prefix(format!("{}{prefix}", self.prefix))
                .set_max_keys(
                    self.options.list_page_size.map(|n| i32::try_from(n).unwrap_or(i32::MAX)),
                )
                .set_continuation_token(token.clone())
                .send()
                .await
                .map_err(|e| self.site().error(operation(), None, e))?;
            self.bucket_seen.store(true, Ordering::Relaxed);
            for object in page.contents() {
                let Some(text) = object.key().and_then(|k| k.strip_prefix(&self.prefix)) else {
                    continue;
                };
                match ObjectKey::new(text) {
                    Ok(key) => {
                        found.push(ObjectMeta { key, size: size_of(object.size(), text, self)? })
                    }
                    // Not written by Ferry: no key could name it.
                    Err(e) => tracing::debug!(error = %e, "skipping foreign object"),
                }
            }
            if page.is_truncated() != Some(true) {
                break;
            }
            // A truncated page must point past itself, or the listing would be cut short or
            // never end.
            match page.next_continuation_token() {
                Some(next) if !next.is_empty() && token.as_deref() != Some(next) => {
                    token = Some(next.to_owned());
                }
                _ => {
                    return Err(self.backend_error(
                        operation(),
                        "truncated page without a new continuation token",
                    ));
                }
            }
        }
        found.sort_unstable_by(|a, b| a.key.cmp(&b.key));
        Ok(found)
    }

    async fn delete(&self, key: &ObjectKey) -> StoreResult<()> {
        self.client
            .delete_object()
            .bucket(&self.bucket)
            .key(self.s3_key(key))
            .send()
            .await
            .map(drop)
            .map_err(|e| self.site().error(format!("delete {key}"), None, e))
    }

    fn backend_error(&self, operation: String, message: &str) -> StoreError {
        StoreError::Backend {
            location: format!("s3 bucket {} at {}", self.bucket, self.endpoint),
            operation,
            message: message.to_owned(),
        }
    }
}

/// An object size from S3, which types it as optional and signed.
fn size_of(size: Option<i64>, key: &str, inner: &Inner) -> StoreResult<u64> {
    size.and_then(|s| u64::try_from(s).ok()).ok_or_else(|| {
        inner.backend_error(format!("size of {key}"), "missing or negative object size")
    })
}

#[async_trait]
impl ObjectStore for S3Store {
    fn location(&self) -> String {
        let i = &self.inner;
        format!("s3://{}/{} at {}", i.bucket, i.prefix, i.endpoint)
    }

    async fn put_if_absent(
        &self,
        key: &ObjectKey,
        data: Bytes,
        cancel: &CancellationToken,
    ) -> StoreResult<PutOutcome> {
        put::put_if_absent(&self.inner, key, data, cancel).await
    }

    async fn prepare_creates(&self, cancel: &CancellationToken) -> StoreResult<()> {
        put::prepare(&self.inner, cancel).await
    }

    async fn get(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<Bytes> {
        until_cancelled(cancel, self.inner.get(key, Want::Whole)).await
    }

    async fn get_at_most(
        &self,
        key: &ObjectKey,
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        until_cancelled(cancel, self.inner.get(key, Want::AtMost(max_bytes))).await
    }

    async fn get_range(
        &self,
        key: &ObjectKey,
        offset: u64,
        len: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        until_cancelled(cancel, self.inner.get(key, Want::Range(offset, len))).await
    }

    async fn head(
        &self,
        key: &ObjectKey,
        cancel: &CancellationToken,
    ) -> StoreResult<Option<ObjectMeta>> {
        until_cancelled(cancel, self.inner.head(key)).await
    }

    async fn list(&self, prefix: &str, cancel: &CancellationToken) -> StoreResult<Vec<ObjectMeta>> {
        until_cancelled(cancel, self.inner.list(prefix)).await
    }

    async fn delete(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<()> {
        until_cancelled(cancel, self.inner.delete(key)).await
    }
}
