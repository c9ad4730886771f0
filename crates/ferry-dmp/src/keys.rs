//! Velero's keys that only the data mover plugin uses (the data-mover contract's own keys are in
//! [`ferry_api::keys`]). Byte for byte as Velero spells them.

/// Label and annotation on a backed-up PVC: the name of the VolumeSnapshot taken of it.
pub const VOLUME_SNAPSHOT_NAME: &str = "velero.io/volume-snapshot-name";
/// Annotation on a backed-up PVC: `<namespace>/<name>` of its DataUpload. At restore it tells the
/// plugin that the volume's data was moved.
pub const DATA_UPLOAD_NAME_ANNOTATION: &str = "velero.io/data-upload-name";
/// Annotation telling Velero to back up an item's additional items even where it would not.
pub const MUST_INCLUDE_ADDITIONAL_ITEMS: &str = "backup.velero.io/must-include-additional-items";
/// Annotation on a PVC whose PV is not a CSI volume, so no snapshot was taken.
pub const SKIPPED_NO_CSI_PV: &str = "backup.velero.io/skipped-no-csi-pv";

/// Label on a VolumeSnapshotClass choosing it for its driver; also the PVC annotation naming a
/// class, and (followed by `_<driver>`) the Backup annotation naming one.
pub const SNAPSHOT_CLASS_SELECTOR: &str = "velero.io/csi-volumesnapshot-class";
/// Kubernetes' annotation marking a VolumeSnapshotClass as its driver's default.
pub const SNAPSHOT_CLASS_DEFAULT: &str = "snapshot.storage.kubernetes.io/is-default-class";

/// Label on the ConfigMaps carrying DataUpload results into a restore: `<namespace>.<pvc>`
/// (through the label-value rule).
pub const PVC_NAMESPACE_NAME_LABEL: &str = "velero.io/pvc-namespace-name";
/// The value of [`ferry_api::keys::RESOURCE_USAGE_LABEL`] on those ConfigMaps.
pub const RESOURCE_USAGE_DATA_UPLOAD: &str = "DataUpload";

/// Tag Velero gives volume snapshotters: the name of the Backup.
pub const SNAPSHOT_TAG_BACKUP: &str = "velero.io/backup";
/// Tag Velero gives volume snapshotters: the name of the PersistentVolume.
pub const SNAPSHOT_TAG_PV: &str = "velero.io/pv";

/// Label on the ConfigMap recording a Ferry DataUpload's repository snapshot when the backup
/// holding it is deleted (see [`crate::DataUploadDeleteAction`]).
pub const FERRY_SNAPSHOT_INFO_LABEL: &str = "ferry.io/data-upload-snapshot-info";
