//! The storage error type.

use crate::ObjectKey;

/// Result of a storage call.
pub type StoreResult<T> = Result<T, StoreError>;

/// What can go wrong talking to object storage. Every variant names the object or location
/// involved, so the message alone tells a user what to fix.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum StoreError {
    /// The object does not exist.
    #[error("object {key} not found")]
    NotFound {
        /// The missing key.
        key: ObjectKey,
    },
    /// A ranged read asked for bytes past the end of the object.
    #[error("range {offset}+{len} is outside object {key} of {size} bytes")]
    RangeOutOfBounds {
        /// The object read.
        key: ObjectKey,
        /// Start of the requested range.
        offset: u64,
        /// Length of the requested range.
        len: u64,
        /// The object's size.
        size: u64,
    },
    /// A capped whole-object read ([`ObjectStore::get_at_most`](crate::ObjectStore::get_at_most))
    /// met an object larger than its cap. Refused by the size the backend announced before
    /// any of the body was read, or, when it announced none, as soon as the bytes received
    /// passed the cap: never more than the cap is kept.
    #[error(
        "object {key} is {size} bytes, more than the {max} bytes a whole read of it may take; \
         it was not read"
    )]
    TooLarge {
        /// The object.
        key: ObjectKey,
        /// Its size as announced; when the backend announced none, the bytes received before
        /// reading stopped (then a lower bound).
        size: u64,
        /// The cap of the read.
        max: u64,
    },
    /// The storage location (bucket, directory) does not exist.
    #[error("storage location {location} does not exist")]
    LocationMissing {
        /// The bucket or directory.
        location: String,
    },
    /// Credentials were rejected or missing permissions.
    #[error("access to {location} denied: {message}")]
    AccessDenied {
        /// The bucket or directory.
        location: String,
        /// The backend's explanation.
        message: String,
    },
    /// The backend could not be reached or answered with a transient failure after retries.
    #[error("storage at {location} unavailable during {operation}: {message}")]
    Unavailable {
        /// The endpoint or directory.
        location: String,
        /// The operation attempted (`put data/ab/..`).
        operation: String,
        /// The last failure seen.
        message: String,
    },
    /// A local I/O failure (file-system backend).
    #[error("{operation} {path}: {source}")]
    Io {
        /// The step that failed (`write`, `fsync`, `rename`...).
        operation: &'static str,
        /// The file involved.
        path: std::path::PathBuf,
        /// The underlying error.
        #[source]
        source: std::io::Error,
    },
    /// Any other backend failure.
    #[error("storage at {location} failed during {operation}: {message}")]
    Backend {
        /// The endpoint or directory.
        location: String,
        /// The operation attempted.
        operation: String,
        /// The backend's explanation.
        message: String,
    },
    /// A backend was configured with settings it cannot work with.
    #[error("invalid storage configuration for {location}: {message}")]
    InvalidConfig {
        /// The bucket or directory configured.
        location: String,
        /// What is wrong with the settings.
        message: String,
    },
    /// The call was cancelled through its token.
    #[error("cancelled")]
    Cancelled,
}

impl StoreError {
    /// Whether retrying the same call later may succeed.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }

    /// Whether this is [`StoreError::NotFound`].
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// A local I/O failure during `operation` on `path`.
    pub(crate) fn io(
        operation: &'static str,
        path: impl Into<std::path::PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io { operation, path: path.into(), source }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn only_unavailable_is_retryable() {
        let unavailable = StoreError::Unavailable {
            location: "http://127.0.0.1:1".into(),
            operation: "get config".into(),
            message: "connection refused".into(),
        };
        assert!(unavailable.is_retryable());
        assert!(!StoreError::Cancelled.is_retryable());
        let missing = StoreError::LocationMissing { location: "bucket b".into() };
        assert!(!missing.is_retryable());
        assert_eq!(missing.to_string(), "storage location bucket b does not exist");
    }
}
