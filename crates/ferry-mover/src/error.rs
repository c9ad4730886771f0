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
    /// The volume cannot be handled.
    #[error("{0}")]
    Volume(String),
}
