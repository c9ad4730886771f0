//! `DataUpload` (velero.io/v2alpha1): one volume snapshot to move to the backup repository.

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::progress::is_zero;
use crate::{DataMoveOperationProgress, DataUploadPhase, GoDuration, NodeOs, Time};

/// The specification Velero's CSI plugin writes when it creates a DataUpload.
///
/// Field names and `omitempty` behaviour follow Velero's Go type exactly.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "velero.io",
    version = "v2alpha1",
    kind = "DataUpload",
    plural = "datauploads",
    namespaced,
    status = "DataUploadStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct DataUploadSpec {
    /// The kind of snapshot to back up (`CSI`).
    pub snapshot_type: SnapshotType,
    /// The CSI snapshot, when `snapshotType` is `CSI`. Velero writes `null` when absent.
    #[serde(rename = "csiSnapshot", default)]
    pub csi_snapshot: Option<CsiSnapshotSpec>,
    /// Name of the PVC the snapshot was taken of.
    #[serde(rename = "sourcePVC")]
    pub source_pvc: String,
    /// The data mover that must process this DataUpload (`""` or `velero` for Velero's own).
    #[serde(rename = "datamover", default, skip_serializing_if = "String::is_empty")]
    pub data_mover: String,
    /// The BackupStorageLocation holding the backup repository.
    pub backup_storage_location: String,
    /// Namespace of the source PVC and of the source VolumeSnapshot.
    pub source_namespace: String,
    /// Mover-specific settings (`ParallelFilesUpload`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_mover_config: Option<BTreeMap<String, String>>,
    /// Set by Velero to ask the mover to stop.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel: bool,
    /// Bound on each internal wait (snapshot ready, PVC bound, deletions).
    pub operation_timeout: GoDuration,
}

/// The snapshot type of a DataUpload.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum SnapshotType {
    /// A CSI VolumeSnapshot.
    #[serde(rename = "CSI")]
    Csi,
}

/// The CSI snapshot a DataUpload moves.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct CsiSnapshotSpec {
    /// Name of the VolumeSnapshot, in the DataUpload's `sourceNamespace`.
    pub volume_snapshot: String,
    /// Storage class of the source PVC.
    pub storage_class: String,
    /// VolumeSnapshotClass the snapshot was taken with (Velero always writes the key).
    #[serde(default)]
    pub snapshot_class: String,
    /// CSI driver of the snapshot content.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub driver: String,
}

/// What the mover reports about a DataUpload. Written with full-object updates: the CRD has
/// no status subresource.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataUploadStatus {
    /// Lifecycle phase; absent means New.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DataUploadPhase>,
    /// The path of the volume on the node that was backed up.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub path: String,
    /// The snapshot's ID in the backup repository.
    #[serde(rename = "snapshotID", default, skip_serializing_if = "String::is_empty")]
    pub snapshot_id: String,
    /// Mover-specific results, handed back to the DataDownload at restore.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_mover_result: Option<BTreeMap<String, String>>,
    /// A human-readable account of the current state; the cause on failure.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When data movement started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<Time>,
    /// When the DataUpload reached a terminal phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_timestamp: Option<Time>,
    /// Bytes done and total. Velero always writes the object, possibly empty.
    #[serde(default)]
    pub progress: DataMoveOperationProgress,
    /// Bytes actually uploaded (new to the repository).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub incremental_bytes: i64,
    /// The node that moved the data.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// The OS of that node.
    #[serde(rename = "nodeOS", default, skip_serializing_if = "Option::is_none")]
    pub node_os: Option<NodeOs>,
    /// The node that won the object lock.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub accepted_by_node: String,
    /// When the object lock was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_timestamp: Option<Time>,
}

impl DataUpload {
    /// The phase, treating a missing status or phase as New.
    #[must_use]
    pub fn phase(&self) -> DataUploadPhase {
        self.status.as_ref().and_then(|s| s.phase).unwrap_or_default()
    }
}

/// What Velero keeps of a completed DataUpload for the restore (`DataUploadResult`), stored
/// in a ConfigMap during restores.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataUploadResult {
    /// The BackupStorageLocation holding the repository.
    pub backup_storage_location: String,
    /// The mover that wrote the data.
    #[serde(rename = "datamover", default, skip_serializing_if = "String::is_empty")]
    pub data_mover: String,
    /// The snapshot's ID in the repository.
    #[serde(rename = "snapshotID", default, skip_serializing_if = "String::is_empty")]
    pub snapshot_id: String,
    /// The namespace the volume was backed up from.
    pub source_namespace: String,
    /// Mover-specific results.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_mover_result: Option<BTreeMap<String, String>>,
    /// The OS of the node that moved the data.
    #[serde(rename = "nodeOS", default, skip_serializing_if = "Option::is_none")]
    pub node_os: Option<NodeOs>,
}
