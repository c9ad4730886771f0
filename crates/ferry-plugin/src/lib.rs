//! Velero's plugin SDK in Rust, and a go-plugin server that Velero can launch.
//!
//! Velero loads plugins by running each plugin binary as a child process through hashicorp
//! go-plugin and speaking gRPC to it. This crate provides both halves a plugin binary needs:
//!
//! - **Typed action traits**, one per plugin kind, working on decoded inputs ([`JsonObject`]
//!   for the Kubernetes objects Velero sends as JSON) and returning [`PluginError`]:
//!   [`BackupItemActionV2`], [`RestoreItemActionV2`] and [`VolumeSnapshotterV2`] (the
//!   asynchronous version 2 actions with `progress` and `cancel`), and the version 1
//!   [`BackupItemAction`], [`RestoreItemAction`], [`VolumeSnapshotter`] and
//!   [`DeleteItemAction`]. The [`adapters`] serve a version 1 action as version 2.
//! - **[`PluginServer`]**: registers several named plugins of different kinds in one process and
//!   serves them the way go-plugin does: it checks the magic cookie Velero sets
//!   ([`check_environment`]), listens on a Unix socket in a fresh temporary directory, prints
//!   the handshake line `1|2|unix|<socket>|grpc` on stdout, and serves gRPC health (service
//!   `"plugin"`), go-plugin's controller, stdio and broker services, Velero's `PluginLister`
//!   and every Velero action service, dispatching each request to the plugin named in it.
//!
//! Velero rejects a `ListPlugins` answer naming a kind it does not know, which would fail the
//! discovery of every plugin; so plugins of Ferry's own kinds ([`PluginKind::VolumeSnapshotterV2`])
//! are served to any host but listed only to hosts that ask for them with
//! `FERRY_PLUGIN_EXTRA_KINDS` ([`HostEnv::extra_kinds`]).
//!
//! Each call runs as its own task; when the host abandons a call (or the grace period after a
//! shutdown request runs out), the action's future is dropped, so actions should keep work that
//! must survive that (operations Velero polls) outside the call, e.g. in the cluster.
//!
//! Logs go to stderr (the binary installs a `tracing` subscriber writing there); stdout carries
//! the handshake line only, and the binary must print nothing there before it. The server never looks at the command line: Velero passes its own
//! server flags (`--log-level`, `--features`, ...) to every plugin, and [`HostArgs`] reads the
//! useful ones leniently, ignoring the rest.
//!
//! ```no_run
//! use std::sync::Arc;
//! use ferry_plugin::{
//!     BackupItemActionV2, BackupItemInput, BackupItemOutputV2, JsonObject, OperationProgress,
//!     PluginError, PluginServer, ResourceSelector,
//! };
//!
//! struct Annotate;
//!
//! #[async_trait::async_trait]
//! impl BackupItemActionV2 for Annotate {
//!     async fn applies_to(&self) -> Result<ResourceSelector, PluginError> {
//!         Ok(ResourceSelector::resources(["persistentvolumeclaims"]))
//!     }
//!     async fn execute(&self, input: BackupItemInput) -> Result<BackupItemOutputV2, PluginError> {
//!         Ok(BackupItemOutputV2::unchanged())
//!     }
//!     async fn progress(&self, id: &str, _: &JsonObject) -> Result<OperationProgress, PluginError> {
//!         Err(PluginError::not_found(format!("operation {id}")))
//!     }
//!     async fn cancel(&self, _: &str, _: &JsonObject) -> Result<(), PluginError> {
//!         Ok(())
//!     }
//! }
//!
//! # async fn run() -> Result<(), Box<dyn std::error::Error>> {
//! ferry_plugin::check_environment()?; // exits early, with a clear message, if not under Velero
//! let mut server = PluginServer::new();
//! server.register_backup_item_action_v2("example.com/annotate", Arc::new(Annotate))?;
//! server.serve().await?;
//! # Ok(()) }
//! ```

pub mod adapters;
pub use async_trait::async_trait;
mod args;
mod backup;
mod delete;
mod dispatch;
mod errors;
mod goplugin;
mod handshake;
mod kind;
mod object;
mod registry;
mod restore;
mod server;
mod snapshot;
mod socket;
mod status;
mod types;

pub use args::HostArgs;
pub use backup::{
    BackupItemAction, BackupItemActionV2, BackupItemInput, BackupItemOutput, BackupItemOutputV2,
};
pub use delete::{DeleteItemAction, DeleteItemInput};
pub use errors::{BoxError, PluginError, RegisterError, RequestError, ServeError};
pub use handshake::{HostEnv, check_environment, handshake_line};
pub use kind::PluginKind;
pub use object::{JsonObject, ObjectError};
pub use registry::{PluginIdentifier, validate_plugin_name};
pub use restore::{
    RestoreItemAction, RestoreItemActionV2, RestoreItemInput, RestoreItemOutput,
    RestoreItemOutputV2,
};
pub use server::PluginServer;
pub use snapshot::{NewVolume, VolumeInfo, VolumeSnapshotter, VolumeSnapshotterV2};
pub use status::error_chain;
pub use types::{OperationProgress, ResourceIdentifier, ResourceSelector};
