//! What can go wrong while exposing, each naming the object and the step.

use std::time::Duration;

use ferry_agent::WorkError;
use ferry_kube::ApiError;

/// An exposer step failed.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ExposeError {
    /// The API server refused or failed a request.
    #[error("{step}: {source}")]
    Api {
        /// What the exposer was doing.
        step: &'static str,
        /// The classified answer.
        #[source]
        source: Box<ApiError>,
    },
    /// Something the CR names does not exist.
    #[error("{what} not found{hint}")]
    Missing {
        /// The object, e.g. `VolumeSnapshot ns/name`.
        what: String,
        /// What the user can do about it (leading `: `), or empty.
        hint: String,
    },
    /// A wait ran out of time.
    #[error("timed out after {after:?} waiting for {what}{last}")]
    Timeout {
        /// What was awaited.
        what: String,
        /// The bound (the CR's operationTimeout).
        after: Duration,
        /// The last state seen (leading `; `), or empty.
        last: String,
    },
    /// The cluster reports a state that cannot get better: a failed pod, a snapshot error,
    /// a target already bound.
    #[error("{0}")]
    Unusable(String),
    /// The CR itself lacks what exposing needs.
    #[error("{0}")]
    Invalid(String),
    /// The wait was canceled.
    #[error("canceled")]
    Canceled,
}

impl From<ExposeError> for WorkError {
    fn from(e: ExposeError) -> Self {
        match e {
            ExposeError::Canceled => WorkError::Canceled,
            other => WorkError::from_error(other),
        }
    }
}
