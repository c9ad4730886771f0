//! Why a repository could not be reached or used.

/// A data-path failure, naming what was being done.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum MoverError {
    /// The BackupStorageLocation cannot be used by Ferry.
    #[error("BackupStorageLocation {name}: {reason}")]
    Location {
        /// The BSL.
        name: String,
        /// What is wrong, in terms the user can fix.
        reason: String,
    },
    /// A secret Ferry needs is missing or unreadable.
    #[error("secret {namespace}/{name} key {key}: {reason}")]
    Secret {
        /// Namespace.
        namespace: String,
        /// Secret name.
        name: String,
        /// The key in it.
        key: String,
        /// What is wrong.
        reason: String,
    },
    /// The API server failed a request.
    #[error("{step}: {source}")]
    Api {
        /// What was being done.
        step: &'static str,
        /// The classified answer.
        #[source]
        source: Box<ferry_kube::ApiError>,
    },
    /// The storage backend failed.
    #[error("opening storage {location}: {source}")]
    Store {
        /// Where.
        location: String,
        /// Why.
        #[source]
        source: Box<ferry_store::StoreError>,
    },
    /// The repository failed.
    #[error("{step} (repository {location}): {source}")]
    Repo {
        /// What was being done.
        step: &'static str,
        /// Where the repository is.
        location: String,
        /// Why.
        #[source]
        source: Box<ferry_repo::RepoError>,
    },
    /// The repository's KMS envelope failed: the KMS refused to wrap or unwrap a key file
    /// (access denied, a disabled or unknown key, unreachable), or the repository needs a KMS
    /// key and Ferry's secret names none. `kms` says which key and setting were used and what
    /// to do; the source names the key the KMS refused and why.
    #[error("{step} (repository {location}; {kms}): {source}")]
    Kms {
        /// What was being done.
        step: &'static str,
        /// Where the repository is.
        location: String,
        /// The KMS settings of Ferry's secret in use, and what to do about them.
        kms: String,
        /// The repository's error ([`ferry_repo::RepoError::Kms`] or
        /// [`ferry_repo::RepoError::KmsKeyNeeded`]).
        #[source]
        source: Box<ferry_repo::RepoError>,
    },
    /// The repository is still where earlier Ferry versions kept it, a folder Velero's
    /// BackupStorageLocation validation rejects; it is used only once moved.
    #[error(
        "the repository is still at {old}, where earlier Ferry versions kept it (a folder that \
         makes Velero mark the BackupStorageLocation Unavailable); Ferry now keeps it at {new}. \
         Move it with `ferry repo move --repo {old} --to {new}` (with the repository password \
         and the --s3-endpoint/--s3-region of other repo commands), then retry"
    )]
    RepositoryNotMoved {
        /// The old location.
        old: String,
        /// Where it belongs now.
        new: String,
    },
    /// No password Ferry has opens the repository.
    #[error("opening repository {location}: {reason}")]
    Password {
        /// Where the repository is.
        location: String,
        /// Which passwords were tried.
        reason: String,
    },
    /// The volume cannot be handled.
    #[error("{0}")]
    Volume(String),
}
