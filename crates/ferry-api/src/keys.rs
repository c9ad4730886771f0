//! Label, annotation and finalizer keys of Velero's data-mover contract, byte for byte.

/// Label on DataUploads: the (length-limited) name of the Backup that created it.
pub const BACKUP_NAME_LABEL: &str = "velero.io/backup-name";
/// Label on DataUploads: the UID of the Backup that created it.
pub const BACKUP_UID_LABEL: &str = "velero.io/backup-uid";
/// Label on DataDownloads: the (length-limited) name of the Restore that created it.
pub const RESTORE_NAME_LABEL: &str = "velero.io/restore-name";
/// Label on DataDownloads: the UID of the Restore that created it.
pub const RESTORE_UID_LABEL: &str = "velero.io/restore-uid";
/// Label on DataUploads: the UID of the source PVC.
pub const PVC_UID_LABEL: &str = "velero.io/pvc-uid";
/// Label by which Velero's plugin finds the DataUpload/DataDownload of an async operation.
pub const ASYNC_OPERATION_ID_LABEL: &str = "velero.io/async-operation-id";
/// Label a mover keeps on a CR from Accepted until InProgress or a terminal phase.
pub const EXPOSE_ON_GOING_LABEL: &str = "velero.io/expose-on-going";
/// Label on the restored PV, and the target PVC's selector key, that makes them bind.
pub const DYNAMIC_PV_RESTORE_LABEL: &str = "velero.io/dynamic-pv-restore";
/// Label on DataUploads created for a backup: the storage location name.
pub const STORAGE_LOCATION_LABEL: &str = "velero.io/storage-location";
/// Label on the backup pod / PVC naming the DataUpload they serve.
pub const DATA_UPLOAD_LABEL: &str = "velero.io/data-upload";
/// Label on the restore pod / PVC naming the DataDownload they serve.
pub const DATA_DOWNLOAD_LABEL: &str = "velero.io/data-download";
/// Label on DataUploads stored with a backup, marking what they are used for.
pub const RESOURCE_USAGE_LABEL: &str = "velero.io/resource-usage";

/// Finalizer a mover keeps on non-terminal DataUploads and DataDownloads.
pub const DATA_UPLOAD_DOWNLOAD_FINALIZER: &str = "velero.io/data-upload-download-finalizer";
/// Finalizer Velero puts on a DeleteBackupRequest for plugin data movers to remove.
pub const DM_DELETE_BACKUP_FINALIZER: &str = "velero.io/dm-delete-backup";

/// Annotation the scheduler puts on a WaitForFirstConsumer PVC naming the chosen node.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";

/// Prefix of a DataUpload's asynchronous operation ID.
pub const DATA_UPLOAD_OPERATION_PREFIX: &str = "du-";
/// Prefix of a DataDownload's asynchronous operation ID.
pub const DATA_DOWNLOAD_OPERATION_PREFIX: &str = "dd-";

/// `dataMoverConfig` key (DataUpload): how many files to upload in parallel.
pub const PARALLEL_FILES_UPLOAD: &str = "ParallelFilesUpload";
/// `dataMoverConfig` key (DataDownload): whether to write sparse files.
pub const WRITE_SPARSE_FILES: &str = "WriteSparseFiles";
/// `dataMoverConfig` key (DataDownload): how many files to download in parallel.
pub const PARALLEL_FILES_DOWNLOAD: &str = "ParallelFilesDownload";

/// Ferry's `dataMoverConfig` key (DataDownload): `"true"` recreates character and block
/// device nodes, `"false"` withholds them, whatever the agent's default.
pub const RESTORE_DEVICE_NODES: &str = "ferry.io/restore-device-nodes";
/// Ferry's `dataMoverConfig` key (DataDownload): `"true"` keeps the set-user-ID bit of files
/// owned by uid 0 and the set-group-ID bit of files owned by gid 0, `"false"` clears them.
pub const RESTORE_ROOT_SETID_BITS: &str = "ferry.io/restore-root-setid-bits";
/// Ferry's `dataMoverConfig` key (DataDownload): `"true"` sets `security.*` and `trusted.*`
/// extended attributes (file capabilities, security labels), `"false"` skips them.
pub const RESTORE_PRIVILEGED_XATTRS: &str = "ferry.io/restore-privileged-xattrs";
