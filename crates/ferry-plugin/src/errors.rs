//! The crate's errors.
//!
//! - [`PluginError`]: what an action returns. Each variant says what the host may do about it,
//!   and maps to one gRPC code ([`PluginError::code`]).
//! - [`RequestError`]: a request the server could not hand to an action (unknown plugin name,
//!   undecodable object) or an action that panicked.
//! - [`RegisterError`]: a plugin that cannot be registered (bad name, duplicate).
//! - [`ServeError`]: the server could not start or stop (not launched by Velero, socket, ...).
//!
//! Turning the first two into a gRPC status, with the plugin, method and error chain in the
//! message, happens in one place: `status.rs`.

use std::io;
use std::path::PathBuf;

use crate::kind::PluginKind;
use crate::object::ObjectError;

/// Any error, as the source of a [`PluginError`].
pub type BoxError = Box<dyn std::error::Error + Send + Sync + 'static>;

/// An action's failure, as reported to the host.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum PluginError {
    /// The request carried something the action cannot work with (a malformed item, a missing
    /// field). Retrying the same request fails the same way.
    #[error("invalid input: {message}")]
    InvalidInput {
        /// What is wrong, naming the field or object.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// Something the request names (an operation, a snapshot, an object) does not exist.
    #[error("{what} not found")]
    NotFound {
        /// The missing thing, e.g. `operation "du-123"`.
        what: String,
    },
    /// The action does not support this call.
    #[error("not supported: {what}")]
    Unsupported {
        /// The unsupported call or feature.
        what: String,
    },
    /// A dependency (the API server, an object store) is unreachable; the host may retry.
    #[error("{message}")]
    Unavailable {
        /// What could not be reached.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
    /// The work was cancelled before it finished.
    #[error("cancelled: {message}")]
    Cancelled {
        /// What was cancelled.
        message: String,
    },
    /// Any other failure.
    #[error("{message}")]
    Failed {
        /// What failed.
        message: String,
        /// The underlying error, if any.
        #[source]
        source: Option<BoxError>,
    },
}

impl PluginError {
    /// A request the action cannot work with.
    pub fn invalid_input(message: impl Into<String>) -> Self {
        Self::InvalidInput { message: message.into(), source: None }
    }

    /// A request the action cannot work with, caused by `source`.
    pub fn invalid_input_with(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::InvalidInput { message: message.into(), source: Some(source.into()) }
    }

    /// Something named in the request does not exist.
    pub fn not_found(what: impl Into<String>) -> Self {
        Self::NotFound { what: what.into() }
    }

    /// The action does not support this call.
    pub fn unsupported(what: impl Into<String>) -> Self {
        Self::Unsupported { what: what.into() }
    }

    /// A dependency is unreachable; the host may retry.
    pub fn unavailable(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Unavailable { message: message.into(), source: Some(source.into()) }
    }

    /// The work was cancelled.
    pub fn cancelled(message: impl Into<String>) -> Self {
        Self::Cancelled { message: message.into() }
    }

    /// Any other failure.
    pub fn failed(message: impl Into<String>) -> Self {
        Self::Failed { message: message.into(), source: None }
    }

    /// Any other failure, caused by `source`.
    pub fn failed_with(message: impl Into<String>, source: impl Into<BoxError>) -> Self {
        Self::Failed { message: message.into(), source: Some(source.into()) }
    }

    /// The gRPC code the host receives for this error.
    pub fn code(&self) -> tonic::Code {
        match self {
            Self::InvalidInput { .. } => tonic::Code::InvalidArgument,
            Self::NotFound { .. } => tonic::Code::NotFound,
            Self::Unsupported { .. } => tonic::Code::Unimplemented,
            Self::Unavailable { .. } => tonic::Code::Unavailable,
            Self::Cancelled { .. } => tonic::Code::Cancelled,
            Self::Failed { .. } => tonic::Code::Unknown,
        }
    }

    /// Whether the same call may succeed if retried later.
    pub fn is_retryable(&self) -> bool {
        matches!(self, Self::Unavailable { .. })
    }
}

/// A request the server could not hand to an action, or an action that panicked.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RequestError {
    /// The request names a plugin this process does not serve under that kind.
    #[error(
        "no {kind} plugin named {name:?} is registered in this process (registered: {registered})"
    )]
    UnknownPlugin {
        /// The kind of the service called.
        kind: PluginKind,
        /// The name in the request's `plugin` field.
        name: String,
        /// The names registered under `kind`, comma-separated, or `none`.
        registered: String,
    },
    /// A field holding a Kubernetes object's JSON could not be decoded.
    #[error("field {field}")]
    InvalidObject {
        /// The request field, e.g. `item`.
        field: &'static str,
        /// Why it could not be decoded.
        #[source]
        source: ObjectError,
    },
    /// An action's answer could not be encoded (an item that is not serializable JSON, a
    /// duration out of range).
    #[error("encoding field {field} of the response: {message}")]
    EncodeResponse {
        /// The response field.
        field: &'static str,
        /// What went wrong.
        message: String,
    },
    /// The action panicked while handling the call.
    #[error("the action panicked: {message}")]
    Panicked {
        /// The panic's message, if it had one.
        message: String,
    },
}

impl RequestError {
    /// The gRPC code the host receives for this error.
    pub fn code(&self) -> tonic::Code {
        match self {
            Self::UnknownPlugin { .. } => tonic::Code::NotFound,
            Self::InvalidObject { .. } => tonic::Code::InvalidArgument,
            Self::EncodeResponse { .. } | Self::Panicked { .. } => tonic::Code::Internal,
        }
    }
}

/// A plugin that cannot be registered.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum RegisterError {
    /// The name does not follow Velero's `<DNS subdomain>/<name>` rule.
    #[error("invalid {kind} plugin name {name:?}: {reason}")]
    InvalidName {
        /// The kind it was registered as.
        kind: PluginKind,
        /// The rejected name.
        name: String,
        /// Which rule it breaks.
        reason: String,
    },
    /// A plugin of the same kind and name is already registered.
    #[error("a {kind} plugin named {name:?} is already registered")]
    Duplicate {
        /// The kind.
        kind: PluginKind,
        /// The name.
        name: String,
    },
}

/// The plugin server could not start, serve or stop.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum ServeError {
    /// The magic cookie Velero sets is missing or wrong: someone ran the binary by hand.
    #[error(
        "this program is a Velero plugin: it is meant to be launched by Velero (which sets \
         VELERO_PLUGIN=hello in its environment), not run directly. Install it into Velero with \
         `velero plugin add <image>` instead"
    )]
    NotLaunchedByVelero,
    /// The host offers no plugin protocol version this server speaks (version 2).
    #[error(
        "the plugin host offers plugin protocol versions {offered:?} (PLUGIN_PROTOCOL_VERSIONS), \
         but this plugin speaks version 2 only"
    )]
    UnsupportedProtocolVersion {
        /// The host's list, as given.
        offered: String,
    },
    /// The host asked for go-plugin's automatic mutual TLS, which this server does not support.
    #[error(
        "the plugin host asked for automatic mutual TLS (PLUGIN_CLIENT_CERT is set), which this \
         plugin does not support"
    )]
    MutualTlsUnsupported,
    /// The temporary directory for the socket could not be created.
    #[error("creating a temporary directory for the plugin socket under {parent}")]
    CreateSocketDir {
        /// The parent directory.
        parent: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The Unix socket could not be bound.
    #[error("listening on the Unix socket {path}")]
    Listen {
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The socket could not be made writable by the group the host asked for.
    #[error("giving group {group:?} write access to the plugin socket {path}")]
    SocketGroup {
        /// The group from `PLUGIN_UNIX_SOCKET_GROUP`.
        group: String,
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// Signal handlers could not be installed.
    #[error("installing the {signal} handler")]
    Signals {
        /// The signal's name.
        signal: &'static str,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The handshake line could not be written to stdout.
    #[error("writing the go-plugin handshake line to stdout")]
    Handshake {
        /// The underlying error.
        #[source]
        source: io::Error,
    },
    /// The gRPC server failed.
    #[error("serving gRPC on {path}")]
    Serve {
        /// The socket path.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: tonic::transport::Error,
    },
    /// The socket directory could not be removed on exit.
    #[error("removing the plugin socket directory {path}")]
    RemoveSocketDir {
        /// The directory.
        path: PathBuf,
        /// The underlying error.
        #[source]
        source: io::Error,
    },
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn plugin_errors_map_to_distinct_grpc_codes() {
        let cases = [
            (PluginError::invalid_input("x"), tonic::Code::InvalidArgument),
            (PluginError::not_found("operation \"a\""), tonic::Code::NotFound),
            (PluginError::unsupported("x"), tonic::Code::Unimplemented),
            (PluginError::unavailable("api", io::Error::other("down")), tonic::Code::Unavailable),
            (PluginError::cancelled("x"), tonic::Code::Cancelled),
            (PluginError::failed("x"), tonic::Code::Unknown),
        ];
        for (err, code) in cases {
            assert_eq!(err.code(), code, "{err}");
            assert_eq!(err.is_retryable(), code == tonic::Code::Unavailable, "{err}");
        }
    }

    #[test]
    fn not_launched_by_velero_explains_itself() {
        let msg = ServeError::NotLaunchedByVelero.to_string();
        assert!(msg.contains("Velero plugin"), "{msg}");
        assert!(msg.contains("launched by Velero"), "{msg}");
        assert!(msg.contains("VELERO_PLUGIN"), "{msg}");
    }
}
