//! The simulator's errors, by the step that failed.

use std::path::PathBuf;
use std::time::Duration;

/// What went wrong in the simulator or in a workload helper.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum SimError {
    /// A host command (losetup, mkfs.ext4, mount, cp...) could not be started.
    #[error("starting `{command}`")]
    Spawn {
        /// The command line.
        command: String,
        /// Why it could not start.
        #[source]
        source: std::io::Error,
    },
    /// A host command ran and failed.
    #[error("`{command}` failed ({status}): {stderr}")]
    Command {
        /// The command line.
        command: String,
        /// Its exit status.
        status: String,
        /// What it wrote to stderr.
        stderr: String,
    },
    /// A file-system operation on the host failed.
    #[error("{action} {path}")]
    Io {
        /// What was being done.
        action: &'static str,
        /// The path involved.
        path: PathBuf,
        /// The OS error.
        #[source]
        source: std::io::Error,
    },
    /// The API server refused a call or could not be reached.
    #[error("{action} {kind} {name}")]
    Api {
        /// What was being done (`creating`, `patching status of`...).
        action: &'static str,
        /// The object's kind.
        kind: &'static str,
        /// The object's name (`namespace/name` for namespaced objects).
        name: String,
        /// The client's error.
        #[source]
        source: kube::Error,
    },
    /// A resource quantity (`64Mi`, `1G`, `1048576`) could not be read.
    #[error("invalid quantity {value:?}: {reason}")]
    Quantity {
        /// The text.
        value: String,
        /// What is wrong with it.
        reason: &'static str,
    },
    /// The configuration or a request cannot work.
    #[error("{what}: {reason}")]
    Invalid {
        /// The thing that is wrong.
        what: String,
        /// Why.
        reason: String,
    },
    /// A wait ended before its condition held.
    #[error("timed out after {timeout:?} waiting for {what}{}", last.as_deref().map(|l| format!(" (last seen: {l})")).unwrap_or_default())]
    Timeout {
        /// What was awaited.
        what: String,
        /// How long.
        timeout: Duration,
        /// The last state observed, if any.
        last: Option<String>,
    },
    /// Work that ran on a blocking thread panicked or was cancelled.
    #[error("blocking task for {what} did not finish")]
    Join {
        /// What the task did.
        what: String,
        /// The join error.
        #[source]
        source: tokio::task::JoinError,
    },
}

impl SimError {
    pub(crate) fn api(
        action: &'static str,
        kind: &'static str,
        name: impl Into<String>,
        source: kube::Error,
    ) -> Self {
        Self::Api { action, kind, name: name.into(), source }
    }

    pub(crate) fn io(
        action: &'static str,
        path: impl Into<PathBuf>,
        source: std::io::Error,
    ) -> Self {
        Self::Io { action, path: path.into(), source }
    }

    /// Whether the API server answered 404.
    #[must_use]
    pub fn is_not_found(&self) -> bool {
        matches!(self, Self::Api { source: kube::Error::Api(s), .. } if s.code == 404)
    }

    /// Whether the API server answered 409.
    #[must_use]
    pub fn is_conflict(&self) -> bool {
        matches!(self, Self::Api { source: kube::Error::Api(s), .. } if s.code == 409)
    }
}

/// Whether a client error is a 404.
pub(crate) fn is_not_found(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 404)
}

/// Whether a client error is a 409 AlreadyExists.
pub(crate) fn is_already_exists(e: &kube::Error) -> bool {
    matches!(e, kube::Error::Api(s) if s.code == 409 && s.reason == "AlreadyExists")
}
