//! The repository error type.
//!
//! Policy: every variant names the step that failed and carries what a user needs to act (the
//! object key, the path, the snapshot), with the underlying error as its source. Errors are
//! returned, not logged, by the code that raises them; whoever handles one logs it.

use std::path::PathBuf;

use ferry_store::{KmsError, StoreError};

use crate::format::{BlobId, FormatError, SnapshotKind};

/// Result of a repository operation.
pub type RepoResult<T> = Result<T, RepoError>;

/// What can go wrong in the repository.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RepoError {
    /// No repository at this location (no `config` object).
    #[error("no repository found: {location} has no config object")]
    NotFound {
        /// The store location.
        location: String,
    },
    /// No key file opens with the given password.
    #[error(
        "wrong password: none of the {tried} key files tried opens with it{}",
        untried.as_ref().map(|e| format!(" (another could not be tried: {e})")).unwrap_or_default()
    )]
    WrongPassword {
        /// Key files tried.
        tried: usize,
        /// Why a key file wrapped by a KMS key could not be tried (the KMS refused it): the
        /// password may be right for that one. `None`: every key file was tried.
        untried: Option<Box<RepoError>>,
    },
    /// No key file opened, and key files wrapped by a KMS key were skipped: the open was given
    /// no KMS ([`crate::OpenOptions::key_wrapper`]).
    #[error(
        "the repository's key files are wrapped by KMS key {}: opening it needs that KMS key as \
         well as the password, and none was configured",
        key_ids.join(", ")
    )]
    KmsKeyNeeded {
        /// The KMS keys the skipped key files name.
        key_ids: Vec<String>,
    },
    /// The KMS refused or failed to wrap or unwrap a key file.
    #[error("{step}{}: {source}", key.as_ref().map(|k| format!(" {k}")).unwrap_or_default())]
    Kms {
        /// `unwrap key file`, `wrap a new key file`, ...
        step: &'static str,
        /// The key file (`keys/ab12..`); `None` for one not stored yet.
        key: Option<String>,
        /// The KMS's error (boxed: it is large, and rare).
        #[source]
        source: Box<KmsError>,
    },
    /// A store call failed.
    #[error("{operation} {key}: {source}")]
    Store {
        /// What was being done (`read snapshot`, `upload pack`, ...).
        operation: &'static str,
        /// The object involved (or the prefix listed).
        key: String,
        /// The store's error.
        #[source]
        source: StoreError,
    },
    /// A stored object is damaged, forged or of an unknown format.
    #[error("{object} is damaged or unreadable: {source}")]
    Corrupt {
        /// Kind and key of the object (`pack data/ab/ab12..`, `tree blob 12ab..`).
        object: String,
        /// Why it could not be decoded.
        #[source]
        source: FormatError,
    },
    /// A stored object is larger than any valid object of its kind may be
    /// ([`crate::format::limits`]), so it was refused by its size without being downloaded.
    #[error(
        "{object} is {size} bytes, more than the {max} bytes allowed for it, so it was not \
         read: it is damaged, or something other than Ferry wrote it"
    )]
    TooLarge {
        /// Kind and key of the object (`snapshot snapshots/ab12..`).
        object: String,
        /// Its size as the store reported it.
        size: u64,
        /// The limit.
        max: u64,
    },
    /// A blob referenced by a tree or snapshot is in no index.
    #[error("blob {id} referenced by {referrer} is missing from the index")]
    MissingBlob {
        /// The blob.
        id: BlobId,
        /// Who referenced it.
        referrer: String,
    },
    /// No snapshot matches the given id or prefix, or the prefix is ambiguous.
    #[error("snapshot {query:?}: {reason}")]
    SnapshotLookup {
        /// What the user asked for.
        query: String,
        /// `not found` or `ambiguous`.
        reason: String,
    },
    /// A local file operation failed.
    #[error("{operation} {path}: {source}")]
    Io {
        /// The step (`open`, `read`, `create`, `set owner`...).
        operation: &'static str,
        /// The file.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// A snapshot entry cannot be restored safely (hostile or corrupt metadata).
    #[error("refusing to restore {path}: {reason}")]
    UnsafeEntry {
        /// Path of the entry relative to the target.
        path: PathBuf,
        /// The rule it breaks.
        reason: String,
    },
    /// Invalid arguments or options.
    #[error("invalid {what}: {reason}")]
    InvalidInput {
        /// The argument.
        what: &'static str,
        /// Why.
        reason: String,
    },
    /// A snapshot of another kind than the operation needs (a tree onto a device, a volume
    /// into a directory).
    #[error("snapshot {snapshot} is a {found} snapshot; this needs a {expected} snapshot")]
    WrongSnapshotKind {
        /// The snapshot id.
        snapshot: String,
        /// Its kind.
        found: SnapshotKind,
        /// The kind needed.
        expected: SnapshotKind,
    },
    /// A volume restore target is smaller than the volume (nothing was written).
    #[error(
        "restore target {target} is {target_size} bytes, smaller than the volume's {volume_size} bytes"
    )]
    TargetTooSmall {
        /// The device.
        target: PathBuf,
        /// Its size.
        target_size: u64,
        /// The volume's size.
        volume_size: u64,
    },
    /// A backup's or restore's lease ran out (the process stalled, or storage was unreachable,
    /// for longer than the lease), so garbage collection may have removed data it relied on.
    /// Nothing was committed; running the operation again is safe.
    #[error("{what}: lease {key} lapsed before the commit; nothing was committed, run it again")]
    LeaseLapsed {
        /// The operation holding the lease.
        what: &'static str,
        /// The lease object.
        key: String,
    },
    /// Garbage collection refused a step because it could not prove it safe.
    #[error("garbage collection ({step}): {reason}")]
    Gc {
        /// The phase (`lock`, `mark`, `sweep`).
        step: &'static str,
        /// Why.
        reason: String,
    },
    /// A password change stored the new key file but could not remove the old one: both
    /// passwords open the repository until the old key is removed.
    #[error(
        "the new password works (key {new}), but removing the old key {old} failed, so the old \
         password still opens the repository too: {source}"
    )]
    OldKeyKept {
        /// The new key file.
        new: String,
        /// The key file that is still there.
        old: String,
        /// Why removing it failed.
        source: Box<RepoError>,
    },
    /// A password change stored its new key file but could not prove it, nor remove it
    /// again: the old password still works; the new key may or may not.
    #[error(
        "the new key file {new} was stored but could not be checked ({cause}), and removing it \
         failed too ({cleanup}); the old password still works"
    )]
    NewKeyLeft {
        /// The new key file.
        new: String,
        /// Why checking it failed.
        cause: Box<RepoError>,
        /// Why removing it failed.
        cleanup: Box<RepoError>,
    },
    /// A backup worker could not hand a pack on because the uploader had stopped; the
    /// uploader's own error says why, and is what the backup reports.
    #[error("the pack uploader stopped")]
    UploadStopped,
    /// The operation was cancelled through its token.
    #[error("cancelled")]
    Cancelled,
    /// A worker thread or task died unexpectedly.
    #[error("internal failure in {what}: {reason}")]
    Internal {
        /// The component.
        what: &'static str,
        /// What happened.
        reason: String,
    },
}

impl RepoError {
    /// A store error with context; cancellation stays [`RepoError::Cancelled`].
    pub(crate) fn store(operation: &'static str, key: impl ToString, source: StoreError) -> Self {
        match source {
            StoreError::Cancelled => Self::Cancelled,
            StoreError::TooLarge { key, size, max } => {
                Self::TooLarge { object: key.to_string(), size, max }
            }
            source => Self::Store { operation, key: key.to_string(), source },
        }
    }

    /// A capped whole read's error, the object named by `noun` and its key; cancellation
    /// stays [`RepoError::Cancelled`].
    pub(crate) fn whole_read(
        operation: &'static str,
        noun: &str,
        key: &ferry_store::ObjectKey,
        source: StoreError,
    ) -> Self {
        match source {
            StoreError::TooLarge { size, max, .. } => {
                Self::TooLarge { object: format!("{noun} {key}"), size, max }
            }
            source => Self::store(operation, key, source),
        }
    }

    /// Whether a stored object is damaged: it failed to decode or authenticate, or it is
    /// larger than any valid one. Other objects are still worth reading.
    #[must_use]
    pub fn is_damaged_object(&self) -> bool {
        matches!(self, Self::Corrupt { .. } | Self::TooLarge { .. })
    }

    /// A KMS error with the key file named; cancellation stays [`RepoError::Cancelled`].
    pub(crate) fn kms(step: &'static str, key: Option<String>, source: KmsError) -> Self {
        match source {
            KmsError::Cancelled => Self::Cancelled,
            source => Self::Kms { step, key, source: Box::new(source) },
        }
    }

    /// A decoding error with the object named.
    pub(crate) fn corrupt(object: impl ToString, source: FormatError) -> Self {
        Self::Corrupt { object: object.to_string(), source }
    }

    /// An I/O error with the path.
    pub(crate) fn io(
        operation: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io { operation, path: path.into(), source }
    }

    /// Whether a store object was missing: for an object listed a moment before, it was
    /// removed since (a snapshot forgotten, a key removed) and is simply gone.
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Store { source: StoreError::NotFound { .. }, .. })
    }

    /// Whether retrying later may succeed.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Store { source, .. } => source.is_retryable(),
            Self::Kms { source, .. } => source.is_retryable(),
            _ => false,
        }
    }
}
