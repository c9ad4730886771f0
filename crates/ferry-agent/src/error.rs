//! Errors of the agent and of the backends it drives.
//!
//! Policy: the controllers log an error where they handle it (an Event on the CR for anything
//! a user should see) and never where they merely pass it on. Errors from the exposer and the
//! data path end up in the CR's `status.message`, so their `Display` (with sources, see
//! [`error_chain`]) must name the cause in words a user can act on.

use std::error::Error as StdError;
use std::fmt::Write as _;

use ferry_kube::ApiError;

/// A boxed error from a backend (exposer or data path).
pub type BoxError = Box<dyn StdError + Send + Sync + 'static>;

/// How an exposer or data-path call ended when it did not succeed.
#[derive(Debug, thiserror::Error)]
pub enum WorkError {
    /// The call stopped because its cancellation token fired. Not a failure: the agent
    /// decides what happens next (cancel the CR, or leave it for a restart to resume).
    #[error("canceled")]
    Canceled,
    /// The call failed; the CR fails with this error as its message.
    #[error(transparent)]
    Failed(BoxError),
}

impl WorkError {
    /// A failure with just a message.
    #[must_use]
    pub fn failed(message: impl Into<String>) -> Self {
        Self::Failed(message.into().into())
    }

    /// A failure wrapping another error.
    #[must_use]
    pub fn from_error(err: impl StdError + Send + Sync + 'static) -> Self {
        Self::Failed(Box::new(err))
    }
}

/// The agent could not start.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum AgentError {
    /// A setting is unusable.
    #[error("invalid agent configuration: {reason}")]
    Config {
        /// What is wrong.
        reason: String,
    },
    /// The first renewal of this node's liveness lease failed.
    #[error("creating the liveness lease {lease} in namespace {namespace}")]
    Lease {
        /// The lease's name.
        lease: String,
        /// Its namespace.
        namespace: String,
        /// The API server's answer.
        #[source]
        source: Box<ApiError>,
    },
}

/// A controller's reconcile step failed; the controller retries after a short delay.
#[derive(Debug, thiserror::Error)]
pub enum ReconcileError {
    /// Taking the object lock failed for a reason other than losing the race.
    #[error("accepting {kind} {name}")]
    Accept {
        /// The CR's kind.
        kind: &'static str,
        /// The CR's name.
        name: String,
        /// The API server's answer.
        #[source]
        source: Box<ApiError>,
    },
    /// Counting the CRs in the prepare queue before accepting one failed.
    #[error(
        "counting the DataUploads and DataDownloads in the prepare queue before accepting {kind} {name}"
    )]
    Queue {
        /// The CR's kind.
        kind: &'static str,
        /// The CR waiting to be accepted.
        name: String,
        /// Why the caches cannot be counted.
        #[source]
        source: BoxError,
    },
    /// Writing Canceled on a CR canceled before any node accepted it failed.
    #[error("canceling new {kind} {name}")]
    CancelNew {
        /// The CR's kind.
        kind: &'static str,
        /// The CR's name.
        name: String,
        /// The API server's answer.
        #[source]
        source: Box<ApiError>,
    },
    /// Taking over a CR from a node that stopped failed for a reason other than losing the race.
    #[error("taking over {kind} {name} from node {from}")]
    TakeOver {
        /// The CR's kind.
        kind: &'static str,
        /// The CR's name.
        name: String,
        /// The node that stopped renewing its lease.
        from: String,
        /// The API server's answer.
        #[source]
        source: Box<ApiError>,
    },
}

/// `err` and all its sources, joined with `: `, for a CR's `status.message`.
#[must_use]
pub fn error_chain(err: &(dyn StdError + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        // Transparent wrappers repeat their source's text; say it once.
        if !text.ends_with(&cause_text) {
            let _ = write!(text, ": {cause_text}");
        }
        source = cause.source();
    }
    text
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("reading chunk 7 of /data/file")]
    struct Outer {
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn chains_name_every_cause_once() {
        let inner = std::io::Error::other("disk on fire");
        let err = WorkError::from_error(Outer { source: inner });
        assert_eq!(error_chain(&err), "reading chunk 7 of /data/file: disk on fire");
        assert_eq!(error_chain(&WorkError::failed("no snapshot")), "no snapshot");
    }
}
