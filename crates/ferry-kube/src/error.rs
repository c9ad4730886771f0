//! Classified API server errors.

/// What went wrong talking to the API server, by what the caller should do about it.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ApiError {
    /// The write carried a stale `resourceVersion`: another writer changed the object first.
    /// For an object lock this means another node won.
    #[error("{kind} {name}: another writer won (the object changed since it was read): {message}")]
    Conflict {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The server's message.
        message: String,
    },
    /// The object does not exist (or the endpoint, e.g. `/status`, does not).
    #[error("{kind} {name} not found: {message}")]
    NotFound {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The server's message.
        message: String,
    },
    /// An object with that name exists already.
    #[error("{kind} {name} already exists")]
    AlreadyExists {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
    },
    /// The server rejected the object as invalid (schema, enum, required field).
    #[error("{kind} {name} rejected as invalid: {message}")]
    Invalid {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The server's explanation, naming the offending field.
        message: String,
    },
    /// Authentication or authorization failed.
    #[error("{kind} {name}: access denied: {message}")]
    Forbidden {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The server's message.
        message: String,
    },
    /// Anything else: transport failures, server errors, timeouts. Usually worth a retry.
    #[error("{kind} {name}: {source}")]
    Other {
        /// The object's kind.
        kind: String,
        /// The object's name.
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
}

impl ApiError {
    /// Classifies a client error for the object `kind`/`name`.
    #[must_use]
    pub fn from_kube(kind: &str, name: &str, err: kube::Error) -> Self {
        let (kind, name) = (kind.to_owned(), name.to_owned());
        match err {
            kube::Error::Api(status) => {
                let message = status.message.clone();
                match (status.code, status.reason.as_str()) {
                    (409, "AlreadyExists") => Self::AlreadyExists { kind, name },
                    (409, _) => Self::Conflict { kind, name, message },
                    (404, _) => Self::NotFound { kind, name, message },
                    (422 | 400, _) => Self::Invalid { kind, name, message },
                    (401 | 403, _) => Self::Forbidden { kind, name, message },
                    _ => Self::Other { kind, name, source: kube::Error::Api(status) },
                }
            }
            other => Self::Other { kind, name, source: other },
        }
    }

    /// Whether this is a lost optimistic-concurrency race.
    #[must_use]
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Conflict { .. })
    }

    /// Whether the object (or endpoint) is missing.
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::NotFound { .. })
    }

    /// Whether retrying the same call later may succeed.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Other { .. })
    }
}
