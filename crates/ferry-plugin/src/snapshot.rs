//! Volume snapshotters: take and restore snapshots of persistent volumes.

use std::collections::BTreeMap;

use async_trait::async_trait;
use serde_json::Value;

use crate::errors::PluginError;
use crate::object::JsonObject;
use crate::types::OperationProgress;

/// What `CreateVolumeFromSnapshot` receives.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct NewVolume {
    /// The snapshot to restore.
    pub snapshot_id: String,
    /// The volume type recorded at backup time.
    pub volume_type: String,
    /// The availability zone to create the volume in.
    pub volume_az: String,
    /// Provisioned IOPS, if the volume type has them.
    pub iops: Option<i64>,
}

/// What `GetVolumeInfo` returns.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct VolumeInfo {
    /// The volume type, e.g. `gp3`.
    pub volume_type: String,
    /// Provisioned IOPS, if the volume type has them.
    pub iops: Option<i64>,
}

/// A version 1 volume snapshotter (plugin kind `VolumeSnapshotter`).
#[async_trait]
pub trait VolumeSnapshotter: Send + Sync + 'static {
    /// Configures the snapshotter from the `VolumeSnapshotLocation`'s config; called before any
    /// other method.
    async fn init(&self, config: BTreeMap<String, String>) -> Result<(), PluginError>;

    /// Creates a volume from a snapshot and returns the new volume's ID.
    async fn create_volume_from_snapshot(&self, volume: NewVolume) -> Result<String, PluginError>;

    /// Reports a volume's type and IOPS.
    async fn get_volume_info(
        &self,
        volume_id: &str,
        volume_az: &str,
    ) -> Result<VolumeInfo, PluginError>;

    /// Snapshots a volume, tagging the snapshot, and returns the snapshot ID.
    async fn create_snapshot(
        &self,
        volume_id: &str,
        volume_az: &str,
        tags: BTreeMap<String, String>,
    ) -> Result<String, PluginError>;

    /// Deletes a snapshot.
    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), PluginError>;

    /// The ID of the volume behind a `PersistentVolume`; empty if this snapshotter does not
    /// handle that kind of volume.
    async fn get_volume_id(&self, persistent_volume: &JsonObject) -> Result<String, PluginError>;

    /// The `PersistentVolume` changed to point at the volume `volume_id`.
    async fn set_volume_id(
        &self,
        persistent_volume: JsonObject,
        volume_id: &str,
    ) -> Result<Value, PluginError>;
}

/// A version 2 volume snapshotter (plugin kind `VolumeSnapshotterV2`): `create_snapshot` may
/// return before the snapshot is finished; its snapshot ID is then the operation ID that
/// `progress` and `cancel` take.
#[async_trait]
pub trait VolumeSnapshotterV2: VolumeSnapshotter {
    /// Reports the state of the snapshot `snapshot_id`.
    async fn progress(&self, snapshot_id: &str) -> Result<OperationProgress, PluginError>;

    /// Asks the snapshot operation `operation_id` to stop.
    async fn cancel(&self, operation_id: &str) -> Result<(), PluginError>;
}
