//! `DataDownload` (velero.io/v2alpha1): one repository snapshot to restore into a volume.

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::progress::is_zero;
use crate::{DataDownloadPhase, DataMoveOperationProgress, GoDuration, NodeOs, Time};

/// The specification Velero's CSI plugin writes when it creates a DataDownload.
#[derive(CustomResource, Debug, Clone, PartialEq, Serialize, Deserialize)]
#[kube(
    group = "velero.io",
    version = "v2alpha1",
    kind = "DataDownload",
    plural = "datadownloads",
    namespaced,
    status = "DataDownloadStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct DataDownloadSpec {
    /// The PVC to restore into.
    pub target_volume: TargetVolumeSpec,
    /// The BackupStorageLocation holding the repository.
    pub backup_storage_location: String,
    /// The data mover that must process this DataDownload.
    #[serde(rename = "datamover", default, skip_serializing_if = "String::is_empty")]
    pub data_mover: String,
    /// The snapshot's ID in the repository (from the DataUpload's status).
    #[serde(rename = "snapshotID")]
    pub snapshot_id: String,
    /// The namespace the volume was backed up from (selects the repository).
    pub source_namespace: String,
    /// Mover-specific settings (`WriteSparseFiles`, `ParallelFilesDownload`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub data_mover_config: Option<BTreeMap<String, String>>,
    /// Set by Velero to ask the mover to stop.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub cancel: bool,
    /// Bound on each internal wait.
    pub operation_timeout: GoDuration,
    /// The OS of the node that backed the data up.
    #[serde(rename = "nodeOS", default, skip_serializing_if = "Option::is_none")]
    pub node_os: Option<NodeOs>,
    /// The snapshot's size in bytes (the DataUpload's `progress.totalBytes`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub snapshot_size: i64,
}

/// The target of a restore. Velero leaves `pv` empty.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct TargetVolumeSpec {
    /// The PVC's name.
    pub pvc: String,
    /// The PV's name (empty when Velero creates the DataDownload).
    #[serde(default)]
    pub pv: String,
    /// The PVC's namespace.
    pub namespace: String,
}

/// What the mover reports about a DataDownload (full-object updates; no status subresource).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DataDownloadStatus {
    /// Lifecycle phase; absent means New.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<DataDownloadPhase>,
    /// A human-readable account of the current state; the cause on failure.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub message: String,
    /// When data movement started.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub start_timestamp: Option<Time>,
    /// When the DataDownload reached a terminal phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub completion_timestamp: Option<Time>,
    /// Bytes done and total.
    #[serde(default)]
    pub progress: DataMoveOperationProgress,
    /// The node that moved the data.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub node: String,
    /// The node that won the object lock.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub accepted_by_node: String,
    /// When the object lock was taken.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub accepted_timestamp: Option<Time>,
}

impl DataDownload {
    /// The phase, treating a missing status or phase as New.
    #[must_use]
    pub fn phase(&self) -> DataDownloadPhase {
        self.status.as_ref().and_then(|s| s.phase).unwrap_or_default()
    }
}
