//! Velero's and the CSI snapshotter's API types, as Ferry reads and writes them.
//!
//! Everything here is plain data: serde types whose JSON is byte-for-byte what Velero's Go
//! types produce, the label, annotation and finalizer keys of Velero's data-mover contract,
//! and Velero's naming rules. No I/O happens in this crate.
//!
//! - [`DataUpload`] and [`DataDownload`] (`velero.io/v2alpha1`): the work items a data mover
//!   processes. Their phases are [`DataUploadPhase`] / [`DataDownloadPhase`].
//! - [`Backup`], [`Restore`], [`BackupStorageLocation`], [`DeleteBackupRequest`]
//!   (`velero.io/v1`): the parts of Velero's objects that Ferry reads.
//! - [`VolumeSnapshot`], [`VolumeSnapshotContent`], [`VolumeSnapshotClass`]
//!   (`snapshot.storage.k8s.io/v1`).
//! - [`SnapshotMetadataService`] (`cbt.storage.k8s.io/v1beta1`): where a CSI driver's
//!   changed-block tracking service listens.
//! - [`keys`]: every label, annotation and finalizer key of the contract.
//! - [`naming`]: Velero's label-value rule and operation-ID formats.
//! - [`GoDuration`]: Go's `time.Duration` text form (`10m0s`), used by `operationTimeout`.

mod data_download;
mod data_upload;
mod duration;
pub mod keys;
pub mod naming;
pub mod node_agent_config;
mod phase;
mod progress;
mod snapshot;
mod snapshot_metadata;
mod velero_v1;

pub use data_download::{DataDownload, DataDownloadSpec, DataDownloadStatus, TargetVolumeSpec};
pub use data_upload::{
    CsiSnapshotSpec, DataUpload, DataUploadResult, DataUploadSpec, DataUploadStatus, SnapshotType,
};
pub use duration::{GoDuration, InvalidDuration};
pub use phase::{DataDownloadPhase, DataUploadPhase, NodeOs};
pub use progress::DataMoveOperationProgress;
pub use snapshot::{
    VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent, VolumeSnapshotContentSource,
    VolumeSnapshotContentSpec, VolumeSnapshotContentStatus, VolumeSnapshotError, VolumeSnapshotRef,
    VolumeSnapshotSource, VolumeSnapshotSpec, VolumeSnapshotStatus,
};
pub use snapshot_metadata::{SnapshotMetadataService, SnapshotMetadataServiceSpec};
pub use velero_v1::{
    Backup, BackupSpec, BackupStatus, BackupStorageLocation, BackupStorageLocationSpec,
    BackupStorageLocationStatus, CredentialRef, DeleteBackupRequest, DeleteBackupRequestSpec,
    DeleteBackupRequestStatus, ObjectStorageLocation, Restore, RestoreSpec, RestoreStatus,
};

/// Re-export of the Kubernetes types Ferry's API types are built from.
pub use k8s_openapi;

/// `metav1.Time`: a timestamp in RFC 3339 form on the wire.
pub type Time = k8s_openapi::apimachinery::pkg::apis::meta::v1::Time;

/// The API group of Velero's objects.
pub const VELERO_GROUP: &str = "velero.io";
/// The default name under which Ferry claims DataUploads and DataDownloads (`spec.datamover`).
pub const DEFAULT_DATA_MOVER: &str = "ferry";
/// The default namespace Velero is installed in.
pub const DEFAULT_VELERO_NAMESPACE: &str = "velero";
