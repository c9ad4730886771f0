//! The one place where errors become gRPC statuses.
//!
//! Every call is described by a [`Call`] (plugin kind, plugin name, method). A failure's status
//! carries the error's own gRPC code ([`PluginError::code`], [`RequestError::code`]) and a
//! message naming the call and the whole error chain, e.g.
//! `BackupItemActionV2 plugin "ferry.dev/pvc": Progress: operation "du-1" not found`.

use std::any::Any;
use std::error::Error;
use std::fmt::Write as _;
use std::future::Future;
use std::panic::AssertUnwindSafe;

use futures::FutureExt as _;
use tonic::Status;

use crate::errors::{PluginError, RequestError};
use crate::kind::PluginKind;
use crate::object::JsonObject;
use crate::registry::Plugins;

/// One call to one plugin.
#[derive(Debug, Clone)]
pub(crate) struct Call {
    kind: PluginKind,
    plugin: String,
    method: &'static str,
}

impl Call {
    pub(crate) fn new(kind: PluginKind, plugin: &str, method: &'static str) -> Self {
        tracing::debug!(kind = %kind, plugin, method, "plugin call");
        Self { kind, plugin: plugin.to_owned(), method }
    }

    /// The plugin the call names, from the plugins of the call's kind.
    pub(crate) fn lookup<T: ?Sized>(
        &self,
        plugins: &Plugins<T>,
    ) -> Result<std::sync::Arc<T>, Status> {
        debug_assert_eq!(plugins.kind(), self.kind);
        plugins.get(&self.plugin).map_err(|e| self.request_status(&e))
    }

    /// Decodes the request field `field` as a Kubernetes object.
    pub(crate) fn object(&self, field: &'static str, bytes: Vec<u8>) -> Result<JsonObject, Status> {
        JsonObject::from_bytes(bytes)
            .map_err(|source| self.request_status(&RequestError::InvalidObject { field, source }))
    }

    /// Encodes the response field `field`: `item` if the action returned one, else `original`.
    pub(crate) fn item(
        &self,
        field: &'static str,
        item: Option<serde_json::Value>,
        original: Vec<u8>,
    ) -> Result<Vec<u8>, Status> {
        match item {
            None => Ok(original),
            Some(value) => serde_json::to_vec(&value).map_err(|e| {
                self.request_status(&RequestError::EncodeResponse { field, message: e.to_string() })
            }),
        }
    }

    /// Runs the action's future, turning its error, or a panic, into a status.
    pub(crate) async fn run<T>(
        &self,
        action: impl Future<Output = Result<T, PluginError>>,
    ) -> Result<T, Status> {
        match AssertUnwindSafe(action).catch_unwind().await {
            Ok(Ok(value)) => Ok(value),
            Ok(Err(err)) => Err(self.status(err.code(), &err)),
            Err(panic) => {
                let err = RequestError::Panicked { message: panic_message(panic.as_ref()) };
                tracing::error!(kind = %self.kind, plugin = %self.plugin, method = self.method, "{err}");
                Err(self.request_status(&err))
            }
        }
    }

    pub(crate) fn request_status(&self, err: &RequestError) -> Status {
        self.status(err.code(), err)
    }

    fn status(&self, code: tonic::Code, err: &dyn Error) -> Status {
        let message = format!(
            "{} plugin {:?}: {}: {}",
            self.kind,
            self.plugin,
            self.method,
            error_chain(err)
        );
        tracing::debug!(code = ?code, "{message}");
        Status::new(code, message)
    }
}

/// `err` and each of its sources, joined by `": "`; a source whose text already ends the line
/// (an error that shows its source in its own message) is said once.
#[must_use]
pub fn error_chain(err: &dyn Error) -> String {
    let mut out = err.to_string();
    let mut source = err.source();
    while let Some(s) = source {
        let text = s.to_string();
        if !out.ends_with(&text) {
            let _ = write!(out, ": {text}");
        }
        source = s.source();
    }
    out
}

fn panic_message(panic: &(dyn Any + Send)) -> String {
    if let Some(s) = panic.downcast_ref::<&str>() {
        (*s).to_owned()
    } else if let Some(s) = panic.downcast_ref::<String>() {
        s.clone()
    } else {
        "(no message)".to_owned()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn call() -> Call {
        Call::new(PluginKind::BackupItemActionV2, "ferry.dev/pvc", "Progress")
    }

    /// An error that shows its source in its own message.
    #[derive(Debug)]
    struct Shows(std::io::Error);

    impl std::fmt::Display for Shows {
        fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
            write!(f, "creating the DataUpload: {}", self.0)
        }
    }

    impl Error for Shows {
        fn source(&self) -> Option<&(dyn Error + 'static)> {
            Some(&self.0)
        }
    }

    #[test]
    fn a_cause_already_in_the_message_is_said_once() {
        let err = Shows(std::io::Error::other("connection refused"));
        assert_eq!(error_chain(&err), "creating the DataUpload: connection refused");
        let plain = std::io::Error::other("timed out");
        assert_eq!(error_chain(&plain), "timed out");
    }

    #[tokio::test]
    async fn plugin_errors_keep_their_code_and_full_chain() {
        let err = PluginError::unavailable(
            "reading DataUpload velero/du-1",
            std::io::Error::other("connection refused"),
        );
        let status = call().run(async { Err::<(), _>(err) }).await.unwrap_err();
        assert_eq!(status.code(), tonic::Code::Unavailable);
        assert_eq!(
            status.message(),
            "BackupItemActionV2 plugin \"ferry.dev/pvc\": Progress: reading DataUpload velero/du-1: connection refused"
        );
        let status =
            call().run(async { Err::<(), _>(PluginError::not_found("operation \"x\"")) }).await;
        assert_eq!(status.unwrap_err().code(), tonic::Code::NotFound);
    }

    #[tokio::test]
    async fn panics_become_internal_errors() {
        let status = call()
            .run(async {
                let v: Vec<u8> = Vec::new();
                if v.is_empty() {
                    panic!("index {} out of range", 3);
                }
                Ok(())
            })
            .await
            .unwrap_err();
        assert_eq!(status.code(), tonic::Code::Internal);
        assert!(
            status.message().contains("panicked: index 3 out of range"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn undecodable_objects_are_invalid_arguments_naming_the_field() {
        let status = call().object("backup", b"{nope".to_vec()).unwrap_err();
        assert_eq!(status.code(), tonic::Code::InvalidArgument);
        assert!(
            status.message().contains("field backup: invalid JSON: key must be a string"),
            "{}",
            status.message()
        );
    }

    #[test]
    fn unchanged_items_are_returned_byte_for_byte() {
        let original = br#"{"b": 1,  "a": 2}"#.to_vec();
        assert_eq!(call().item("item", None, original.clone()).unwrap(), original);
        let changed = call().item("item", Some(serde_json::json!({"a": 1})), original).unwrap();
        assert_eq!(changed, br#"{"a":1}"#);
    }
}
