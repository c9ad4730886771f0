//! Conditional writes: `PutObject` for small objects, a multipart upload for large ones, both
//! with `If-None-Match: *` (see the module docs of `s3` for the atomicity argument).

use std::sync::atomic::Ordering;
use std::time::Duration;

use aws_sdk_s3::config::http::HttpResponse;
use aws_sdk_s3::error::{ProvideErrorMetadata, SdkError};
use aws_sdk_s3::primitives::ByteStream;
use aws_sdk_s3::types::{CompletedMultipartUpload, CompletedPart};
use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tokio_util::sync::CancellationToken;

use super::retry::Backoff;
use super::{Inner, ServerSideEncryption, errors};
use crate::cancel::until_cancelled;
use crate::{ObjectKey, PutOutcome, StoreResult};

/// Most parts S3 accepts in one upload.
const MAX_PARTS: u64 = 10_000;
/// Limit for aborting a failed upload, which runs even after cancellation.
const ABORT_TIMEOUT: Duration = Duration::from_secs(30);
/// How long a cancelled start of a multipart upload may still take to answer (so the upload
/// can be aborted).
const CREATE_GRACE: Duration = Duration::from_secs(5);
/// User metadata naming the write that created an object (`x-amz-meta-ferry-writer`). When
/// the SDK retries a write whose first attempt committed but whose answer was lost, the retry
/// meets its own object (412); this tells that apart from another writer's.
const WRITER: &str = "ferry-writer";

/// The conditional-write probe, if no earlier call made it (see
/// [`crate::ObjectStore::prepare_creates`]).
pub(super) async fn prepare(inner: &Inner, cancel: &CancellationToken) -> StoreResult<()> {
    until_cancelled(cancel, inner.conditional_writes_honoured()).await
}

pub(super) async fn put_if_absent(
    inner: &Inner,
    key: &ObjectKey,
    data: Bytes,
    cancel: &CancellationToken,
) -> StoreResult<PutOutcome> {
    prepare(inner, cancel).await?;
    let writer = format!("{:032x}", rand::random::<u128>());
    if data.len() as u64 <= inner.options.multipart_threshold {
        return until_cancelled(cancel, inner.put_single(key, data, &writer, Ours::Ask)).await;
    }
    // Uploading many MiB only to learn the key exists is wasteful; the condition on
    // completion still decides races.
    if until_cancelled(cancel, inner.head(key)).await?.is_some() {
        return Ok(PutOutcome::AlreadyExists);
    }
    // S3 answers a completion that raced another conditional write with 409: that upload is
    // spent, so start a new one (a few times, with backoff).
    let mut backoff = Backoff::new(&inner.options);
    loop {
        let Some(upload_id) = inner.create_upload_or_cancel(key, &writer, cancel).await? else {
            return Err(crate::StoreError::Cancelled);
        };
        let result = until_cancelled(
            cancel,
            inner.upload_and_complete(key, &upload_id, data.clone(), &writer),
        )
        .await;
        if !matches!(result, Ok(Completion::Done(PutOutcome::Created))) {
            inner.abort_upload(key, &upload_id).await;
        }
        match result? {
            Completion::Done(outcome) => return Ok(outcome),
            Completion::Conflict(_) if backoff.pause().await => {}
            Completion::Conflict(err) => return Err(err),
        }
    }
}

/// How a multipart upload ended.
enum Completion {
    Done(PutOutcome),
    /// 409 on completion: this upload cannot complete; a new one may.
    Conflict(crate::StoreError),
}

/// Whether a refused write may have met its own object (an attempt that committed but whose
/// answer was lost, then retried), which only a `HeadObject` tells.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Ours {
    /// It may have: a refusal asks whose object the key holds.
    Ask,
    /// The caller knows it cannot: the conditional-write probe's second write.
    Never,
}

/// How a conditional write was refused.
enum Refusal {
    /// 412: an object has the key.
    Exists,
    /// 409: another conditional write on the key is in flight; S3 asks for a retry.
    Conflict,
    Other,
}

fn refusal<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> Refusal {
    match (errors::status(err), errors::code(err)) {
        (Some(412), _) | (_, Some("PreconditionFailed")) => Refusal::Exists,
        (Some(409), Some("ConditionalRequestConflict")) => Refusal::Conflict,
        _ => Refusal::Other,
    }
}

impl Inner {
    /// Checks once per store that a second conditional write of a key is refused: writes a
    /// probe object twice and deletes it. Every safety argument of the repository (racing
    /// inits, leases, gc marks) rests on S3 deciding such races.
    async fn conditional_writes_honoured(&self) -> StoreResult<()> {
        self.conditional_probed
            .get_or_try_init(|| async {
                let nonce = format!("{:032x}", rand::random::<u128>());
                let key = ObjectKey::new(format!("probe/conditional-{nonce}"))
                    .map_err(|e| self.backend_error("probe".into(), &e.to_string()))?;
                let first =
                    self.put_single(&key, Bytes::from_static(b"first"), &nonce, Ours::Ask).await?;
                // A server that overwrites would overwrite again on a retry: a refusal of the
                // second write is the answer, whatever its attempt, with no need to ask (for a
                // server that decides every write alike, which is all one probe can judge).
                let second = self
                    .put_single(&key, Bytes::from_static(b"second"), "another", Ours::Never)
                    .await?;
                if let Err(e) = self.delete(&key).await {
                    tracing::warn!(%e, key = %key, "could not delete the conditional-write probe");
                }
                match (first, second) {
                    (PutOutcome::Created, PutOutcome::AlreadyExists) => Ok(()),
                    _ => Err(self.backend_error(
                        "check conditional writes".into(),
                        "the server overwrote an object written with If-None-Match: *; Ferry \
                         needs conditional writes so concurrent writers cannot overwrite each \
                         other (AWS S3 and current MinIO honour them)",
                    )),
                }
            })
            .await?;
        Ok(())
    }

    async fn put_single(
        &self,
        key: &ObjectKey,
        data: Bytes,
        writer: &str,
        ours: Ours,
    ) -> StoreResult<PutOutcome> {
        let mut backoff = Backoff::new(&self.options);
        loop {
            let result = self
                .client
                .put_object()
                .bucket(&self.bucket)
                .key(self.s3_key(key))
                .metadata(WRITER, writer)
                .if_none_match("*")
                .set_server_side_encryption(self.sse_algorithm())
                .set_ssekms_key_id(self.sse_kms_key())
                .body(ByteStream::from(data.clone()))
                .send()
                .await;
            let err = match result {
                Ok(_) => {
                    self.bucket_seen.store(true, Ordering::Relaxed);
                    return Ok(PutOutcome::Created);
                }
                Err(err) => err,
            };
            match refusal(&err) {
                Refusal::Exists if ours == Ours::Never => return Ok(PutOutcome::AlreadyExists),
                Refusal::Exists => return self.refused_unless_ours(key, writer).await,
                Refusal::Conflict if backoff.pause().await => {}
                _ => return Err(self.site().error(format!("put {key}"), None, err)),
            }
        }
    }

    /// The `x-amz-server-side-encryption` of every write, if one is configured.
    fn sse_algorithm(&self) -> Option<aws_sdk_s3::types::ServerSideEncryption> {
        use aws_sdk_s3::types::ServerSideEncryption as Sse;
        match &self.options.server_side_encryption {
            None => None,
            Some(ServerSideEncryption::KmsKey(_)) => Some(Sse::AwsKms),
            Some(ServerSideEncryption::Algorithm(name)) => Some(Sse::from(name.as_str())),
        }
    }

    /// The KMS key of every write, if one is configured.
    fn sse_kms_key(&self) -> Option<String> {
        match &self.options.server_side_encryption {
            Some(ServerSideEncryption::KmsKey(key)) => Some(key.clone()),
            _ => None,
        }
    }

    /// After a 412: `Created` if the object at `key` was written by this very write (an
    /// attempt the SDK retried had committed), else `AlreadyExists`.
    async fn refused_unless_ours(&self, key: &ObjectKey, writer: &str) -> StoreResult<PutOutcome> {
        let out = self
            .client
            .head_object()
            .bucket(&self.bucket)
            .key(self.s3_key(key))
            .send()
            .await
            .map_err(|e| self.site().error(format!("head {key} after a refused write"), None, e))?;
        let ours = out.metadata().and_then(|m| m.get(WRITER)).is_some_and(|w| w == writer);
        Ok(if ours { PutOutcome::Created } else { PutOutcome::AlreadyExists })
    }

    /// Starts a multipart upload; `None` if cancelled. A cancel does not drop an answer that
    /// is on its way: an upload the server created but whose id never reached us could not
    /// be aborted and would keep its parts (billed) until a bucket lifecycle rule removes
    /// them. So the answer gets [`CREATE_GRACE`] to arrive, and the upload is aborted.
    async fn create_upload_or_cancel(
        &self,
        key: &ObjectKey,
        writer: &str,
        cancel: &CancellationToken,
    ) -> StoreResult<Option<String>> {
        let create = self.create_upload(key, writer);
        tokio::pin!(create);
        tokio::select! {
            created = &mut create => created.map(Some),
            () = cancel.cancelled() => {
                match tokio::time::timeout(CREATE_GRACE, create).await {
                    Ok(Ok(upload_id)) => self.abort_upload(key, &upload_id).await,
                    Ok(Err(_)) => {}
                    Err(_) => tracing::warn!(
                        key = %key,
                        "cancelled while a multipart upload was being started and the server \
                         did not answer; if it was created, the bucket's lifecycle rule for \
                         incomplete uploads removes it"
                    ),
                }
                Ok(None)
            }
        }
    }

    async fn create_upload(&self, key: &ObjectKey, writer: &str) -> StoreResult<String> {
        let out = self
            .client
            .create_multipart_upload()
            .bucket(&self.bucket)
            .key(self.s3_key(key))
            .metadata(WRITER, writer)
            .set_server_side_encryption(self.sse_algorithm())
            .set_ssekms_key_id(self.sse_kms_key())
            .send()
            .await
            .map_err(|e| self.site().error(format!("start upload of {key}"), None, e))?;
        out.upload_id.ok_or_else(|| {
            self.backend_error(format!("start upload of {key}"), "no upload id returned")
        })
    }

    async fn upload_and_complete(
        &self,
        key: &ObjectKey,
        upload_id: &str,
        data: Bytes,
        writer: &str,
    ) -> StoreResult<Completion> {
        let part_size = part_size(data.len() as u64, self.options.part_size);
        let bodies = (0..data.len())
            .step_by(part_size)
            .map(|start| data.slice(start..data.len().min(start + part_size)));
        let parts: Vec<CompletedPart> = futures::stream::iter((1..).zip(bodies))
            .map(|(number, body)| self.upload_part(key, upload_id, number, body))
            .buffered(self.options.part_concurrency)
            .try_collect()
            .await?;
        let parts = CompletedMultipartUpload::builder().set_parts(Some(parts)).build();
        let result = self
            .client
            .complete_multipart_upload()
            .bucket(&self.bucket)
            .key(self.s3_key(key))
            .upload_id(upload_id)
            .multipart_upload(parts)
            .if_none_match("*")
            .send()
            .await;
        let err = match result {
            Ok(_) => return Ok(Completion::Done(PutOutcome::Created)),
            Err(err) if completed_with_odd_body(&err) => {
                tracing::debug!(key = %key, "upload completed; result body named its root unusually");
                return Ok(Completion::Done(PutOutcome::Created));
            }
            Err(err) => err,
        };
        let refused = refusal(&err);
        let err = self.site().error(format!("complete upload of {key}"), None, err);
        match refused {
            Refusal::Exists => self.refused_unless_ours(key, writer).await.map(Completion::Done),
            Refusal::Conflict => Ok(Completion::Conflict(err)),
            Refusal::Other => Err(err),
        }
    }

    async fn upload_part(
        &self,
        key: &ObjectKey,
        upload_id: &str,
        number: i32,
        body: Bytes,
    ) -> StoreResult<CompletedPart> {
        let operation = || format!("upload part {number} of {key}");
        let out = self
            .client
            .upload_part()
            .bucket(&self.bucket)
            .key(self.s3_key(key))
            .upload_id(upload_id)
            .part_number(number)
            .body(ByteStream::from(body))
            .send()
            .await
            .map_err(|e| self.site().error(operation(), None, e))?;
        let e_tag = out.e_tag.ok_or_else(|| self.backend_error(operation(), "no ETag returned"))?;
        Ok(CompletedPart::builder().part_number(number).e_tag(e_tag).build())
    }

    /// Aborts an unfinished upload so its parts stop costing storage. Failure is logged, not
    /// returned: the caller's own outcome matters more, and the parts are invisible anyway.
    async fn abort_upload(&self, key: &ObjectKey, upload_id: &str) {
        let request = self
            .client
            .abort_multipart_upload()
            .bucket(&self.bucket)
            .key(self.s3_key(key))
            .upload_id(upload_id)
            .send();
        match tokio::time::timeout(ABORT_TIMEOUT, request).await {
            Ok(Ok(_)) => {}
            Ok(Err(e)) => {
                let error = self.site().error(format!("abort upload of {key}"), None, e);
                tracing::warn!(%error, upload_id, "multipart upload left for the bucket lifecycle rule");
            }
            Err(_) => tracing::warn!(key = %key, upload_id, "aborting multipart upload timed out"),
        }
    }
}

/// Whether a `CompleteMultipartUpload` the SDK could not parse did succeed: status 200, no
/// error code (S3's "200 with an `<Error>` body" is parsed as an error with a code), and a
/// result document that only names its root element differently — some S3-compatible
/// servers (moto among them) answer `<CompleteMultipartUploadResponse>` where AWS answers
/// `<CompleteMultipartUploadResult>`, which the SDK rejects. A body cut short (no closing
/// root element) does not count: that outcome is unknown and is reported as a failure.
fn completed_with_odd_body<E: ProvideErrorMetadata>(err: &SdkError<E, HttpResponse>) -> bool {
    let Some(body) = err.raw_response().and_then(|r| r.body().bytes()) else {
        return false;
    };
    let Ok(text) = std::str::from_utf8(body) else {
        return false;
    };
    let text = text.trim();
    errors::status(err) == Some(200)
        && errors::code(err).is_none()
        && text.contains("<CompleteMultipartUploadResponse")
        && text.contains("</ETag>")
        && text.ends_with("</CompleteMultipartUploadResponse>")
}

/// The part size for an object of `len` bytes: `preferred`, grown so no more than 10,000
/// parts are needed.
fn part_size(len: u64, preferred: u64) -> usize {
    let size = preferred.max(len.div_ceil(MAX_PARTS));
    usize::try_from(size).unwrap_or(usize::MAX)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn part_size_grows_to_stay_within_the_part_limit() {
        assert_eq!(part_size(100 << 20, 8 << 20), 8 << 20);
        let huge = 200u64 << 30;
        let size = part_size(huge, 8 << 20) as u64;
        assert!(huge.div_ceil(size) <= MAX_PARTS);
        assert!(size > 8 << 20);
    }
}
