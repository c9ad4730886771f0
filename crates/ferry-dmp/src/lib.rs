//! Ferry's data mover plugin (DMP) for Velero.
//!
//! Velero moves CSI snapshot data through a *data mover plugin*: per PVC it takes a
//! VolumeSnapshot and creates a DataUpload at backup, creates a DataDownload at restore, and
//! reports each operation's progress from the CR's status. This crate does that for Ferry, with
//! the same objects, names, labels and fields as Velero's built-in CSI plugin, written with the
//! `ferry-plugin` SDK:
//!
//! - [`PvcBackupAction`]: `BackupItemActionV2` on PVCs (`ferry.io/pvc-backup`).
//! - [`PvcRestoreAction`]: `RestoreItemActionV2` on PVCs (`ferry.io/pvc-restore`).
//! - [`DataUploadDeleteAction`]: `DeleteItemAction` on DataUploads
//!   (`ferry.io/dataupload-delete`), recording the repository snapshot of a deleted backup.
//! - [`DataMoverSnapshotter`]: Ferry's `VolumeSnapshotterV2` (`ferry.io/volume-snapshotter`),
//!   a thin layer over the two PVC actions.
//!
//! The plugin holds no state of its own: an operation is its DataUpload or DataDownload,
//! found again by the `velero.io/async-operation-id` label, so `Progress` and `Cancel` answer
//! the same from a restarted plugin process. [`register`] puts the chosen [`Actions`] on a
//! [`PluginServer`]: beside a Velero server only the DataUpload delete action, since Velero's
//! own CSI support creates Ferry's DataUploads and DataDownloads:
//!
//! ```no_run
//! # async fn run(client: kube::Client) -> Result<(), Box<dyn std::error::Error>> {
//! let ctx = ferry_dmp::PluginContext::new(client).with_velero_namespace("velero");
//! let mut server = ferry_plugin::PluginServer::new();
//! ferry_dmp::register(&mut server, &ctx, ferry_dmp::Actions::All)?;
//! server.serve().await?;
//! # Ok(()) }
//! ```

pub mod backup;
mod context;
mod delete;
mod error;
pub mod keys;
mod operation;
pub mod progress;
pub mod restore;
mod snapshotter;

use std::sync::Arc;

use ferry_plugin::{PluginServer, RegisterError};

pub use backup::PvcBackupAction;
pub use context::{DEFAULT_SNAPSHOT_POLL_INTERVAL, PluginContext};
pub use delete::{DataUploadDeleteAction, snapshot_info_config_map};
pub use error::DmpError;
pub use restore::PvcRestoreAction;
pub use restore::download::{UploadResult, upload_result_config_map};
pub use snapshotter::DataMoverSnapshotter;

/// The PVC backup item action's plugin name.
pub const PVC_BACKUP_PLUGIN: &str = "ferry.io/pvc-backup";
/// The PVC restore item action's plugin name.
pub const PVC_RESTORE_PLUGIN: &str = "ferry.io/pvc-restore";
/// The DataUpload delete item action's plugin name.
pub const DATA_UPLOAD_DELETE_PLUGIN: &str = "ferry.io/dataupload-delete";
/// The volume snapshotter's plugin name (kind `VolumeSnapshotterV2`).
pub const VOLUME_SNAPSHOTTER_PLUGIN: &str = "ferry.io/volume-snapshotter";

/// Which of the plugin's actions a plugin process serves.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum Actions {
    /// Beside a Velero server (v1.14 and later): only the DataUpload delete action. Velero's
    /// built-in CSI support already creates the DataUploads and DataDownloads for Ferry's
    /// mover (`--snapshot-move-data --data-mover ferry`) and always runs its own PVC actions,
    /// so Ferry's PVC actions would give every volume a second item operation.
    #[default]
    BesideVelero,
    /// Every action ([`PVC_BACKUP_PLUGIN`], [`PVC_RESTORE_PLUGIN`],
    /// [`DATA_UPLOAD_DELETE_PLUGIN`], [`VOLUME_SNAPSHOTTER_PLUGIN`]): for hosts without
    /// Velero's CSI support, such as Ferry's own host (`ferry volume`).
    All,
}

impl std::str::FromStr for Actions {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        match text {
            "velero" => Ok(Self::BesideVelero),
            "all" => Ok(Self::All),
            other => Err(format!(
                "unknown plugin action set {other:?}: `velero` (beside Velero's own CSI \
                 support, the default) or `all`"
            )),
        }
    }
}

/// Registers the data mover plugin's `actions` on `server` under their names, all working
/// through `ctx`.
///
/// # Errors
/// [`RegisterError::Duplicate`] when one of the names is registered already for its kind.
pub fn register(
    server: &mut PluginServer,
    ctx: &PluginContext,
    actions: Actions,
) -> Result<(), RegisterError> {
    if actions == Actions::All {
        server
            .register_backup_item_action_v2(
                PVC_BACKUP_PLUGIN,
                Arc::new(PvcBackupAction::new(ctx.clone())),
            )?
            .register_restore_item_action_v2(
                PVC_RESTORE_PLUGIN,
                Arc::new(PvcRestoreAction::new(ctx.clone())),
            )?;
    }
    server.register_delete_item_action(
        DATA_UPLOAD_DELETE_PLUGIN,
        Arc::new(DataUploadDeleteAction::new(ctx.clone())),
    )?;
    if actions == Actions::All {
        server.register_volume_snapshotter_v2(
            VOLUME_SNAPSHOTTER_PLUGIN,
            Arc::new(DataMoverSnapshotter::new(ctx.clone())),
        )?;
    }
    Ok(())
}
