//! The two streaming calls, resumed after a broken stream and checked as they arrive.

use std::time::Duration;

use ferry_proto::snapshotmetadata::snapshot_metadata_client::SnapshotMetadataClient;
use ferry_proto::snapshotmetadata::{
    BlockMetadata, GetMetadataAllocatedRequest, GetMetadataAllocatedResponse,
    GetMetadataDeltaRequest, GetMetadataDeltaResponse,
};
use tokio_util::sync::CancellationToken;
use tonic::transport::Channel;
use tonic::{Code, Status, Streaming};

use crate::{BlockMap, CbtError, Collector, Tokens};

/// Streams are started again at most this many times in all, however much each one got.
const MAX_STREAMS: u32 = 1000;
/// Responses in a row without a single range a stream may send before it is refused: a
/// service that keeps a stream busy with nothing would otherwise hold a backup forever.
const MAX_EMPTY_RESPONSES: u32 = 1000;

/// What to ask the service.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Query {
    /// The ranges of a snapshot that hold data.
    Allocated {
        /// The VolumeSnapshot's namespace.
        namespace: String,
        /// The VolumeSnapshot.
        snapshot: String,
    },
    /// The ranges that changed between a base snapshot and a target snapshot of one volume.
    Delta {
        /// The target VolumeSnapshot's namespace.
        namespace: String,
        /// The base snapshot's CSI handle (its content's `status.snapshotHandle`).
        base_handle: String,
        /// The target VolumeSnapshot.
        target: String,
    },
}

impl Query {
    /// The gRPC call that answers it.
    #[must_use]
    pub const fn call(&self) -> &'static str {
        match self {
            Self::Allocated { .. } => "GetMetadataAllocated",
            Self::Delta { .. } => "GetMetadataDelta",
        }
    }

    fn subject(&self) -> String {
        match self {
            Self::Allocated { namespace, snapshot } => format!("snapshot {namespace}/{snapshot}"),
            Self::Delta { namespace, base_handle, target } => {
                format!("snapshot {namespace}/{target} since base {base_handle}")
            }
        }
    }
}

/// How streams are retried and bounded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Retry {
    /// Streams that may break in a row without a new range before the query fails.
    pub attempts: u32,
    /// The wait before the first retry; it doubles with each failure in a row (at most 30 s).
    pub backoff: Duration,
    /// Ranges per response asked for (0: the service chooses).
    pub max_results: i32,
    /// The longest wait for the call's answer or the stream's next message; past it the
    /// stream counts as broken and is resumed (`DeadlineExceeded`).
    pub idle: Duration,
    /// The most separate ranges (after merging adjacent ones) an answer may hold: past it,
    /// reading by ranges costs more than reading the volume ([`CbtError::TooFragmented`]).
    pub max_ranges: usize,
}

impl Default for Retry {
    fn default() -> Self {
        Self {
            attempts: 5,
            backoff: Duration::from_millis(500),
            max_results: 0,
            idle: Duration::from_secs(60),
            max_ranges: 1 << 22,
        }
    }
}

/// A connection to one driver's SnapshotMetadata service, with the tokens to call it.
#[derive(Debug)]
pub struct Connection {
    grpc: SnapshotMetadataClient<Channel>,
    tokens: Tokens,
    retry: Retry,
}

/// The fields every response of either call has.
trait Answer {
    fn parts(&self) -> (i32, i64, &[BlockMetadata]);
}

impl Answer for GetMetadataAllocatedResponse {
    fn parts(&self) -> (i32, i64, &[BlockMetadata]) {
        (self.block_metadata_type, self.volume_capacity_bytes, &self.block_metadata)
    }
}

impl Answer for GetMetadataDeltaResponse {
    fn parts(&self) -> (i32, i64, &[BlockMetadata]) {
        (self.block_metadata_type, self.volume_capacity_bytes, &self.block_metadata)
    }
}

/// How one stream ended, short of completing.
enum Stop {
    Status(Status),
    Untrusted(String),
    TooFragmented,
    Cancelled,
}

impl Connection {
    /// A connection over `channel` (see [`crate::Service::connect`]) authenticating with
    /// `tokens`.
    #[must_use]
    pub fn new(channel: Channel, tokens: Tokens, retry: Retry) -> Self {
        Self { grpc: SnapshotMetadataClient::new(channel), tokens, retry }
    }

    /// The ranges of `namespace/snapshot` that hold data.
    ///
    /// # Errors
    /// As [`Self::query`].
    pub async fn allocated(
        &self,
        namespace: &str,
        snapshot: &str,
        cancel: &CancellationToken,
    ) -> Result<BlockMap, CbtError> {
        let query = Query::Allocated { namespace: namespace.into(), snapshot: snapshot.into() };
        self.query(&query, cancel).await
    }

    /// The ranges of `namespace/target` that differ from the snapshot whose CSI handle is
    /// `base_handle`.
    ///
    /// # Errors
    /// As [`Self::query`].
    pub async fn delta(
        &self,
        namespace: &str,
        base_handle: &str,
        target: &str,
        cancel: &CancellationToken,
    ) -> Result<BlockMap, CbtError> {
        let query = Query::Delta {
            namespace: namespace.into(),
            base_handle: base_handle.into(),
            target: target.into(),
        };
        self.query(&query, cancel).await
    }

    /// Runs `query` to the end of its answer. A broken stream is started again at the end of
    /// the last range received (with a fresh token after an `Unauthenticated`), up to
    /// [`Retry::attempts`] times in a row without progress.
    ///
    /// # Errors
    /// [`CbtError::Token`] (no token), [`CbtError::Refused`] (an error retrying cannot fix:
    /// not found, permission denied, invalid argument...), [`CbtError::Broken`] (the stream
    /// kept breaking or went silent), [`CbtError::Untrusted`] (the answer broke the API's
    /// rules), [`CbtError::TooFragmented`] (more ranges than [`Retry::max_ranges`]),
    /// [`CbtError::Cancelled`].
    pub async fn query(
        &self,
        query: &Query,
        cancel: &CancellationToken,
    ) -> Result<BlockMap, CbtError> {
        let untrusted = |reason: String| CbtError::Untrusted {
            call: query.call(),
            subject: query.subject(),
            reason,
        };
        let mut collector = Collector::new();
        let mut failures = 0u32;
        let mut refreshed = false;
        for stream in 0..MAX_STREAMS {
            if stream > 0 {
                collector.restart();
            }
            let before = collector.next_offset();
            let token = tokio::select! {
                () = cancel.cancelled() => return Err(CbtError::Cancelled),
                token = self.tokens.token() => token?,
            };
            let stop = match self.stream(query, &token, &mut collector, cancel).await {
                Ok(()) => return Ok(collector.finish()),
                Err(stop) => stop,
            };
            let status = match stop {
                Stop::Cancelled => return Err(CbtError::Cancelled),
                Stop::Untrusted(reason) => return Err(untrusted(reason)),
                Stop::TooFragmented => {
                    return Err(CbtError::TooFragmented {
                        call: query.call(),
                        subject: query.subject(),
                        limit: self.retry.max_ranges,
                    });
                }
                Stop::Status(status) => status,
            };
            if collector.next_offset() > before {
                failures = 0;
            }
            failures += 1;
            let retry = match status.code() {
                // The token may have expired in a long stream: one fresh token, then refuse.
                Code::Unauthenticated if !refreshed => {
                    refreshed = true;
                    self.tokens.forget().await;
                    true
                }
                Code::Unavailable
                | Code::Aborted
                | Code::DeadlineExceeded
                | Code::Internal
                | Code::Unknown
                | Code::ResourceExhausted
                | Code::Cancelled => true,
                _ => false,
            };
            if !retry {
                return Err(CbtError::Refused {
                    call: query.call(),
                    subject: query.subject(),
                    code: status.code(),
                    message: status.message().to_owned(),
                });
            }
            if failures >= self.retry.attempts {
                return Err(CbtError::Broken {
                    call: query.call(),
                    subject: query.subject(),
                    attempts: failures,
                    code: status.code(),
                    message: status.message().to_owned(),
                });
            }
            let wait = self
                .retry
                .backoff
                .saturating_mul(1 << (failures - 1).min(6))
                .min(Duration::from_secs(30));
            tracing::info!(
                call = query.call(),
                subject = %query.subject(),
                resume_at = collector.next_offset(),
                code = ?status.code(),
                message = status.message(),
                "the SnapshotMetadata stream broke; resuming"
            );
            tokio::select! {
                () = cancel.cancelled() => return Err(CbtError::Cancelled),
                () = tokio::time::sleep(wait) => {}
            }
        }
        Err(CbtError::Broken {
            call: query.call(),
            subject: query.subject(),
            attempts: MAX_STREAMS,
            code: Code::Aborted,
            message: format!("gave up after {MAX_STREAMS} streams"),
        })
    }

    /// One stream from [`Collector::next_offset`] to its end.
    async fn stream(
        &self,
        query: &Query,
        token: &str,
        collector: &mut Collector,
        cancel: &CancellationToken,
    ) -> Result<(), Stop> {
        let start = i64::try_from(collector.next_offset()).unwrap_or(i64::MAX);
        let mut grpc = self.grpc.clone();
        match query {
            Query::Allocated { namespace, snapshot } => {
                let request = GetMetadataAllocatedRequest {
                    security_token: token.to_owned(),
                    namespace: namespace.clone(),
                    snapshot_name: snapshot.clone(),
                    starting_offset: start,
                    max_results: self.retry.max_results,
                };
                let call = grpc.get_metadata_allocated(request);
                let stream = self.within_idle(call, cancel).await?.into_inner();
                self.drain(stream, collector, cancel).await
            }
            Query::Delta { namespace, base_handle, target } => {
                let request = GetMetadataDeltaRequest {
                    security_token: token.to_owned(),
                    namespace: namespace.clone(),
                    base_snapshot_id: base_handle.clone(),
                    target_snapshot_name: target.clone(),
                    starting_offset: start,
                    max_results: self.retry.max_results,
                };
                let call = grpc.get_metadata_delta(request);
                let stream = self.within_idle(call, cancel).await?.into_inner();
                self.drain(stream, collector, cancel).await
            }
        }
    }

    /// Awaits `step` for at most [`Retry::idle`]; silence counts as a broken stream.
    async fn within_idle<T>(
        &self,
        step: impl Future<Output = Result<T, Status>>,
        cancel: &CancellationToken,
    ) -> Result<T, Stop> {
        tokio::select! {
            () = cancel.cancelled() => Err(Stop::Cancelled),
            answer = tokio::time::timeout(self.retry.idle, step) => match answer {
                Ok(answer) => answer.map_err(Stop::Status),
                Err(_) => Err(Stop::Status(Status::deadline_exceeded(format!(
                    "the service sent nothing for {} s",
                    self.retry.idle.as_secs_f64()
                )))),
            },
        }
    }

    /// Reads one stream to its end into `collector`.
    async fn drain<R: Answer>(
        &self,
        mut stream: Streaming<R>,
        collector: &mut Collector,
        cancel: &CancellationToken,
    ) -> Result<(), Stop> {
        let mut empty = 0u32;
        while let Some(answer) = self.within_idle(stream.message(), cancel).await? {
            let (kind, capacity, blocks) = answer.parts();
            collector.push(kind, capacity, blocks).map_err(Stop::Untrusted)?;
            if collector.range_count() > self.retry.max_ranges {
                return Err(Stop::TooFragmented);
            }
            empty = if blocks.is_empty() { empty + 1 } else { 0 };
            if empty > MAX_EMPTY_RESPONSES {
                return Err(Stop::Untrusted(format!(
                    "more than {MAX_EMPTY_RESPONSES} responses in a row carried no range"
                )));
            }
        }
        Ok(())
    }
}
