//! The host side of Velero's plugin protocol, as Velero's server runs it, so that Ferry's
//! plugin can be driven end to end without Velero's Go code:
//!
//! - [`process`]: launch a plugin binary as Velero does (go-plugin's environment, handshake,
//!   gRPC over its socket), `ListPlugins`, `Shutdown`;
//! - [`actions`]: BackupItemAction v2 and RestoreItemAction v2 calls (Execute, Progress,
//!   Cancel, AreAdditionalItemsReady); [`local`]: the same for actions in this process;
//! - [`monitor`]: poll asynchronous operations until each has ended, cancelling those older
//!   than the item operation timeout;
//! - [`phase`]: the Backup/Restore phases around them, and what a restarted host does;
//! - [`records`]: the operations in Velero's `<name>-itemoperations.json.gz` format.
//!
//! Nothing here knows Kubernetes: the caller reads and writes its Backup or Restore and stores
//! the records where it keeps backups.

pub mod actions;
pub mod local;
pub mod monitor;
pub mod phase;
pub mod process;
pub mod records;

pub use actions::{BackupActions, Executed, RestoreActions};
pub use local::{LocalBackupActions, LocalRestoreActions};
pub use monitor::{Monitor, MonitorError, OperationActions, Recorder, TIMED_OUT, Tally};
pub use phase::{Phase, Restart, status_patch};
pub use process::{Handshake, LaunchError, LaunchOptions, PluginProcess};
pub use records::{
    BackupOperation, BackupOperationSpec, Operation, OperationPhase, OperationSpec,
    OperationStatus, RecordError, ResourceIdentifier, RestoreOperation, RestoreOperationSpec,
};
