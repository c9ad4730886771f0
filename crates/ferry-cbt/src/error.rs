//! What can go wrong when asking for changed blocks, and the short reason a backup reports
//! when it falls back to reading the whole volume.

/// An error of discovery, authentication, connection or a metadata stream. Each variant names
/// the driver and the step; [`CbtError::reason`] gives the short form for events and metrics.
#[derive(Debug, thiserror::Error)]
pub enum CbtError {
    /// The driver publishes no SnapshotMetadataService (or the cluster does not serve the
    /// `cbt.storage.k8s.io/v1beta1` API at all): it has no changed-block tracking.
    #[error(
        "CSI driver {driver} offers no changed-block tracking: no SnapshotMetadataService named {driver} (cbt.storage.k8s.io/v1beta1)"
    )]
    NoService {
        /// The CSI driver.
        driver: String,
    },
    /// Reading the SnapshotMetadataService failed.
    #[error("reading SnapshotMetadataService {driver}: {source}")]
    Discover {
        /// The CSI driver.
        driver: String,
        /// The API's error.
        #[source]
        source: kube::Error,
    },
    /// The SnapshotMetadataService cannot be used as it is.
    #[error("SnapshotMetadataService {driver} cannot be used: {reason}")]
    BadService {
        /// The CSI driver.
        driver: String,
        /// What is wrong with it.
        reason: String,
    },
    /// The TokenRequest API refused a token.
    #[error(
        "requesting a token of service account {namespace}/{name} for audience {audience:?}: {reason}"
    )]
    Token {
        /// The service account's namespace.
        namespace: String,
        /// The service account.
        name: String,
        /// The audience asked for.
        audience: String,
        /// The API's refusal, or what was wrong with its answer.
        reason: String,
    },
    /// No TLS connection to the service.
    #[error("connecting to the SnapshotMetadata service of {driver} at {address}: {source}")]
    Connect {
        /// The CSI driver.
        driver: String,
        /// The service's address.
        address: String,
        /// The transport's error (refused, TLS, timeout).
        #[source]
        source: tonic::transport::Error,
    },
    /// The service answered a call with an error that retrying cannot fix.
    #[error("the SnapshotMetadata service refused {call} for {subject}: {code:?}: {message}")]
    Refused {
        /// `GetMetadataAllocated` or `GetMetadataDelta`.
        call: &'static str,
        /// What was asked about (namespace, snapshot, base).
        subject: String,
        /// The gRPC status code.
        code: tonic::Code,
        /// The service's message.
        message: String,
    },
    /// The stream kept breaking.
    #[error(
        "the SnapshotMetadata stream of {call} for {subject} broke {attempts} times in a row; last: {code:?}: {message}"
    )]
    Broken {
        /// `GetMetadataAllocated` or `GetMetadataDelta`.
        call: &'static str,
        /// What was asked about.
        subject: String,
        /// Attempts made.
        attempts: u32,
        /// The last gRPC status code.
        code: tonic::Code,
        /// The last message.
        message: String,
    },
    /// The service's answer broke a rule of the API: none of it is used.
    #[error(
        "the SnapshotMetadata service answered {call} for {subject} with ranges Ferry cannot trust: {reason}"
    )]
    Untrusted {
        /// `GetMetadataAllocated` or `GetMetadataDelta`.
        call: &'static str,
        /// What was asked about.
        subject: String,
        /// The rule broken, and where.
        reason: String,
    },
    /// The answer holds more separate ranges than a backup reads one by one.
    #[error(
        "the SnapshotMetadata service answered {call} for {subject} with more than {limit} separate ranges: reading them one by one would cost more than reading the volume"
    )]
    TooFragmented {
        /// `GetMetadataAllocated` or `GetMetadataDelta`.
        call: &'static str,
        /// What was asked about.
        subject: String,
        /// The most ranges allowed.
        limit: usize,
    },
    /// The work was cancelled.
    #[error("cancelled")]
    Cancelled,
}

/// Why a backup did not use changed-block tracking (or its delta), in a form fit for an event,
/// a status message and a metric label.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum FallbackReason {
    /// The driver has no SnapshotMetadata service (or the cluster has no such API).
    NoService,
    /// The service's object is unusable, or the connection to it failed.
    Unreachable,
    /// The token was refused (TokenRequest, or the service's own check).
    Unauthorized,
    /// The base snapshot (or the target) is gone or unknown to the service.
    SnapshotNotFound,
    /// The service refused the call for another reason.
    Refused,
    /// The stream kept breaking.
    StreamFailed,
    /// The answer broke the API's rules.
    Untrusted,
    /// The answer held too many separate ranges to be worth reading one by one.
    TooFragmented,
}

impl FallbackReason {
    /// The label value (`no-service`, `unreachable`, …).
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::NoService => "no-service",
            Self::Unreachable => "unreachable",
            Self::Unauthorized => "unauthorized",
            Self::SnapshotNotFound => "snapshot-not-found",
            Self::Refused => "refused",
            Self::StreamFailed => "stream-failed",
            Self::Untrusted => "untrusted",
            Self::TooFragmented => "too-fragmented",
        }
    }
}

impl CbtError {
    /// The short reason a fallback reports; `None` for a cancellation (which is no fallback).
    #[must_use]
    pub const fn reason(&self) -> Option<FallbackReason> {
        Some(match self {
            Self::NoService { .. } => FallbackReason::NoService,
            Self::Discover { .. } | Self::BadService { .. } | Self::Connect { .. } => {
                FallbackReason::Unreachable
            }
            Self::Token { .. } => FallbackReason::Unauthorized,
            Self::Refused { code, .. } => match code {
                tonic::Code::Unauthenticated | tonic::Code::PermissionDenied => {
                    FallbackReason::Unauthorized
                }
                tonic::Code::NotFound => FallbackReason::SnapshotNotFound,
                _ => FallbackReason::Refused,
            },
            Self::Broken { .. } => FallbackReason::StreamFailed,
            Self::Untrusted { .. } => FallbackReason::Untrusted,
            Self::TooFragmented { .. } => FallbackReason::TooFragmented,
            Self::Cancelled => return None,
        })
    }
}
