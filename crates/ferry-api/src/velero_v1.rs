//! The parts of Velero's `velero.io/v1` objects that Ferry reads: Backup, Restore,
//! BackupStorageLocation and DeleteBackupRequest.
//!
//! Fields Ferry does not interpret are kept in `other` maps, so reading and writing one of
//! these objects back loses nothing.

use std::collections::BTreeMap;

use kube::CustomResource;
use serde::{Deserialize, Serialize};
use serde_json::Value;

/// The fields of a Backup's spec that matter to data movement.
#[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[kube(
    group = "velero.io",
    version = "v1",
    kind = "Backup",
    plural = "backups",
    namespaced,
    status = "BackupStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct BackupSpec {
    /// Whether CSI snapshot data is moved to the repository (`--snapshot-move-data`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_move_data: Option<bool>,
    /// The data mover selected (`--data-mover`).
    #[serde(rename = "datamover", default, skip_serializing_if = "Option::is_none")]
    pub data_mover: Option<String>,
    /// The BackupStorageLocation to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub storage_location: Option<String>,
    /// Timeout for CSI snapshots (becomes each DataUpload's `operationTimeout`).
    #[serde(rename = "csiSnapshotTimeout", default, skip_serializing_if = "Option::is_none")]
    pub csi_snapshot_timeout: Option<String>,
    /// Timeout for asynchronous plugin operations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_operation_timeout: Option<String>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A Backup's status (phase and the rest, verbatim).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupStatus {
    /// The backup's phase (`New`, `InProgress`, `WaitingForPluginOperations`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// The fields of a Restore's spec that matter to data movement.
#[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[kube(
    group = "velero.io",
    version = "v1",
    kind = "Restore",
    plural = "restores",
    namespaced,
    status = "RestoreStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct RestoreSpec {
    /// The Backup to restore from.
    #[serde(default)]
    pub backup_name: String,
    /// Namespace renames (`old: new`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub namespace_mapping: Option<BTreeMap<String, String>>,
    /// Timeout for asynchronous plugin operations.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub item_operation_timeout: Option<String>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A Restore's status (phase and the rest, verbatim).
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct RestoreStatus {
    /// The restore's phase.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// Where backups are stored: the source of Ferry's repository location and credentials.
#[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[kube(
    group = "velero.io",
    version = "v1",
    kind = "BackupStorageLocation",
    plural = "backupstoragelocations",
    namespaced,
    status = "BackupStorageLocationStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct BackupStorageLocationSpec {
    /// The object-store provider (`aws`, ...).
    pub provider: String,
    /// Bucket and prefix.
    pub object_storage: ObjectStorageLocation,
    /// Provider settings (`region`, `s3Url`, `s3ForcePathStyle`, ...).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub config: Option<BTreeMap<String, String>>,
    /// The Secret key holding the provider's credentials file.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub credential: Option<CredentialRef>,
    /// Whether this is the default location.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub default: Option<bool>,
    /// `ReadWrite` or `ReadOnly`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub access_mode: Option<String>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A bucket and an optional prefix.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct ObjectStorageLocation {
    /// The bucket.
    pub bucket: String,
    /// The prefix inside the bucket.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub prefix: Option<String>,
    /// A PEM CA bundle for the endpoint (base64; deprecated by Velero for `caCertRef`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert: Option<String>,
    /// A key of a Secret in the BSL's namespace holding the PEM CA bundle; wins over
    /// `caCert`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ca_cert_ref: Option<CredentialRef>,
}

/// A key in a Secret (`corev1.SecretKeySelector`).
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
pub struct CredentialRef {
    /// The Secret's name.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub name: Option<String>,
    /// The key within it.
    pub key: String,
    /// Whether the Secret may be missing.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub optional: Option<bool>,
}

/// A BackupStorageLocation's status.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct BackupStorageLocationStatus {
    /// `Available` or `Unavailable`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Every other field, kept verbatim.
    #[serde(flatten)]
    pub other: BTreeMap<String, Value>,
}

/// A request to delete a backup; plugin movers delete its repository data.
#[derive(CustomResource, Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[kube(
    group = "velero.io",
    version = "v1",
    kind = "DeleteBackupRequest",
    plural = "deletebackuprequests",
    namespaced,
    status = "DeleteBackupRequestStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct DeleteBackupRequestSpec {
    /// The Backup being deleted.
    pub backup_name: String,
}

/// A DeleteBackupRequest's status.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct DeleteBackupRequestStatus {
    /// `New`, `InProgress` or `Processed`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub phase: Option<String>,
    /// Errors met while deleting.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub errors: Option<Vec<String>>,
}
