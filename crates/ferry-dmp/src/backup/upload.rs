//! The DataUpload Velero's CSI plugin creates for a PVC, and the marks it leaves on the PVC it
//! returns; pure functions, so every field can be checked without a cluster.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_api::keys::{
    ASYNC_OPERATION_ID_LABEL, BACKUP_NAME_LABEL, BACKUP_UID_LABEL, PARALLEL_FILES_UPLOAD,
    PVC_UID_LABEL,
};
use ferry_api::naming::{data_upload_operation_id, valid_label_value};
use ferry_api::{
    Backup, CsiSnapshotSpec, DataUpload, DataUploadSpec, GoDuration, SnapshotType, VolumeSnapshot,
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use serde_json::{Value, json};

use crate::error::DmpError;
use crate::keys::{
    DATA_UPLOAD_NAME_ANNOTATION, MUST_INCLUDE_ADDITIONAL_ITEMS, VOLUME_SNAPSHOT_NAME,
};

/// The `operationTimeout` when a Backup has no `csiSnapshotTimeout` (Velero's default).
pub const DEFAULT_CSI_SNAPSHOT_TIMEOUT: Duration = Duration::from_secs(600);

/// Why the PVC backup action leaves a PVC to others, or `None` when it moves its data.
///
/// The action acts only for backups that ask for data movement (`snapshotMoveData: true`) by
/// this mover (`spec.datamover` equal to `data_mover`; Velero's own mover takes `""` and
/// `velero`), that snapshot volumes at all (`snapshotVolumes` not `false`), and that are not
/// finalizing (Velero's plugin skips PVCs met again while a backup finalizes).
#[must_use]
pub fn skip_reason(backup: &Backup, data_mover: &str) -> Option<String> {
    let phase = backup.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or_default();
    if matches!(phase, "Finalizing" | "FinalizingPartiallyFailed") {
        return Some(format!("the backup is in phase {phase}"));
    }
    if backup.spec.snapshot_move_data != Some(true) {
        return Some("the backup does not move snapshot data (snapshotMoveData)".to_owned());
    }
    let mover = backup.spec.data_mover.as_deref().unwrap_or_default();
    if mover != data_mover {
        let shown = if mover.is_empty() { "velero (built in)" } else { mover };
        return Some(format!("the backup's data mover is {shown}, not {data_mover}"));
    }
    if backup.spec.other.get("snapshotVolumes") == Some(&Value::Bool(false)) {
        return Some("the backup does not snapshot volumes (snapshotVolumes: false)".to_owned());
    }
    None
}

/// The backup's `csiSnapshotTimeout`, or 10 minutes: the bound on waiting for the snapshot and
/// the DataUpload's `operationTimeout`.
///
/// # Errors
/// [`DmpError::InvalidTimeout`] when the field is not a Go duration.
pub fn csi_snapshot_timeout(backup: &Backup) -> Result<GoDuration, DmpError> {
    match backup.spec.csi_snapshot_timeout.as_deref() {
        None | Some("") => Ok(GoDuration(DEFAULT_CSI_SNAPSHOT_TIMEOUT)),
        Some(text) => GoDuration::parse(text).map_err(|source| DmpError::InvalidTimeout { source }),
    }
}

/// The operation ID of the upload of `pvc` for `backup`: `du-<backupUID>.<pvcUID>` through the
/// label-value rule.
#[must_use]
pub fn upload_operation_id(backup: &Backup, pvc: &PersistentVolumeClaim) -> String {
    data_upload_operation_id(
        backup.metadata.uid.as_deref().unwrap_or_default(),
        pvc.metadata.uid.as_deref().unwrap_or_default(),
    )
}

/// The DataUpload Velero's CSI plugin creates for `pvc`, snapshotted as `snapshot` by CSI
/// driver `driver`, in the Backup's namespace.
///
/// # Errors
/// [`DmpError::InvalidTimeout`] for a bad `csiSnapshotTimeout`.
pub fn new_data_upload(
    backup: &Backup,
    pvc: &PersistentVolumeClaim,
    snapshot: &VolumeSnapshot,
    driver: &str,
    operation_id: &str,
) -> Result<DataUpload, DmpError> {
    let backup_name = backup.metadata.name.clone().unwrap_or_default();
    let backup_uid = backup.metadata.uid.clone().unwrap_or_default();
    let labels = BTreeMap::from([
        (BACKUP_NAME_LABEL.to_owned(), valid_label_value(&backup_name)),
        (BACKUP_UID_LABEL.to_owned(), backup_uid.clone()),
        (PVC_UID_LABEL.to_owned(), pvc.metadata.uid.clone().unwrap_or_default()),
        (ASYNC_OPERATION_ID_LABEL.to_owned(), operation_id.to_owned()),
    ]);
    let spec = DataUploadSpec {
        snapshot_type: SnapshotType::Csi,
        csi_snapshot: Some(CsiSnapshotSpec {
            volume_snapshot: snapshot.metadata.name.clone().unwrap_or_default(),
            storage_class: pvc
                .spec
                .as_ref()
                .and_then(|s| s.storage_class_name.clone())
                .unwrap_or_default(),
            snapshot_class: snapshot.spec.volume_snapshot_class_name.clone().unwrap_or_default(),
            driver: driver.to_owned(),
        }),
        source_pvc: pvc.metadata.name.clone().unwrap_or_default(),
        data_mover: backup.spec.data_mover.clone().unwrap_or_default(),
        backup_storage_location: backup.spec.storage_location.clone().unwrap_or_default(),
        source_namespace: pvc.metadata.namespace.clone().unwrap_or_default(),
        data_mover_config: parallel_files_upload(backup)
            .map(|n| BTreeMap::from([(PARALLEL_FILES_UPLOAD.to_owned(), n.to_string())])),
        cancel: false,
        operation_timeout: csi_snapshot_timeout(backup)?,
    };
    let mut du = DataUpload::new("", spec);
    du.metadata = ObjectMeta {
        namespace: backup.metadata.namespace.clone(),
        generate_name: Some(format!("{backup_name}-")),
        owner_references: Some(vec![OwnerReference {
            api_version: "velero.io/v1".to_owned(),
            kind: "Backup".to_owned(),
            name: backup_name,
            uid: backup_uid,
            controller: Some(true),
            block_owner_deletion: None,
        }]),
        labels: Some(labels),
        ..ObjectMeta::default()
    };
    Ok(du)
}

/// `spec.uploaderConfig.parallelFilesUpload`, when positive.
fn parallel_files_upload(backup: &Backup) -> Option<i64> {
    backup
        .spec
        .other
        .get("uploaderConfig")
        .and_then(|c| c.get("parallelFilesUpload"))
        .and_then(Value::as_i64)
        .filter(|n| *n > 0)
}

/// The PVC as Velero's plugin stores it after starting its upload: labelled and annotated with
/// the VolumeSnapshot's name, labelled with the backup's name (as is, not cut), annotated to
/// keep its additional items and with `<namespace>/<name>` of its DataUpload, which tells the
/// restore that the data was moved. Every other field is kept as received.
#[must_use]
pub fn mark_backed_up_pvc(
    item: &Value,
    snapshot_name: &str,
    backup_name: &str,
    upload_namespace: &str,
    upload_name: &str,
) -> Value {
    let mut pvc = item.clone();
    let labels = [(VOLUME_SNAPSHOT_NAME, snapshot_name), (BACKUP_NAME_LABEL, backup_name)];
    let upload = format!("{upload_namespace}/{upload_name}");
    let annotations = [
        (VOLUME_SNAPSHOT_NAME, snapshot_name),
        (MUST_INCLUDE_ADDITIONAL_ITEMS, "true"),
        (DATA_UPLOAD_NAME_ANNOTATION, upload.as_str()),
    ];
    add_metadata_map(&mut pvc, "labels", &labels);
    add_metadata_map(&mut pvc, "annotations", &annotations);
    pvc
}

/// Adds `pairs` to `metadata.<field>` of a JSON object, creating the map if needed.
pub(crate) fn add_metadata_map(obj: &mut Value, field: &str, pairs: &[(&str, &str)]) {
    let Some(root) = obj.as_object_mut() else { return };
    let meta = root.entry("metadata").or_insert_with(|| json!({}));
    let Some(meta) = meta.as_object_mut() else { return };
    let map = meta.entry(field).or_insert_with(|| json!({}));
    if !map.is_object() {
        *map = json!({});
    }
    if let Some(map) = map.as_object_mut() {
        for (k, v) in pairs {
            map.insert((*k).to_owned(), json!(v));
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use ferry_api::{BackupSpec, BackupStatus, VolumeSnapshotSource, VolumeSnapshotSpec};

    use super::*;

    fn backup(spec: Value) -> Backup {
        serde_json::from_value(json!({
            "apiVersion": "velero.io/v1", "kind": "Backup",
            "metadata": {"name": "nightly", "namespace": "velero", "uid": "b-uid"},
            "spec": spec,
        }))
        .unwrap()
    }

    fn pvc() -> PersistentVolumeClaim {
        serde_json::from_value(json!({
            "metadata": {"name": "data", "namespace": "apps", "uid": "p-uid"},
            "spec": {"storageClassName": "fast", "volumeName": "pv-1"},
        }))
        .unwrap()
    }

    fn snapshot() -> VolumeSnapshot {
        let mut vs = VolumeSnapshot::new(
            "velero-data-abcde",
            VolumeSnapshotSpec {
                source: VolumeSnapshotSource {
                    persistent_volume_claim_name: Some("data".into()),
                    volume_snapshot_content_name: None,
                },
                volume_snapshot_class_name: Some("csi-class".into()),
            },
        );
        vs.metadata.namespace = Some("apps".into());
        vs
    }

    #[test]
    fn skips_what_velero_or_another_mover_handles() {
        let ours = json!({"snapshotMoveData": true, "datamover": "ferry"});
        assert_eq!(skip_reason(&backup(ours.clone()), "ferry"), None);
        assert!(skip_reason(&backup(json!({"datamover": "ferry"})), "ferry").is_some());
        assert!(skip_reason(&backup(json!({"snapshotMoveData": false})), "ferry").is_some());
        let builtin = skip_reason(&backup(json!({"snapshotMoveData": true})), "ferry").unwrap();
        assert!(builtin.contains("velero (built in)"), "{builtin}");
        let other = json!({"snapshotMoveData": true, "datamover": "velero"});
        assert!(skip_reason(&backup(other), "ferry").is_some());
        let no_snap =
            json!({"snapshotMoveData": true, "datamover": "ferry", "snapshotVolumes": false});
        assert!(skip_reason(&backup(no_snap), "ferry").unwrap().contains("snapshotVolumes"));
        let mut finalizing = backup(ours);
        finalizing.status =
            Some(BackupStatus { phase: Some("Finalizing".into()), ..BackupStatus::default() });
        assert!(skip_reason(&finalizing, "ferry").unwrap().contains("Finalizing"));
        assert_eq!(
            skip_reason(&backup(json!({"snapshotMoveData": true, "datamover": "x"})), "x"),
            None
        );
    }

    #[test]
    fn the_data_upload_has_velero_fields() {
        let b = backup(json!({
            "snapshotMoveData": true, "datamover": "ferry", "storageLocation": "primary",
            "csiSnapshotTimeout": "30m", "uploaderConfig": {"parallelFilesUpload": 4},
        }));
        let du =
            new_data_upload(&b, &pvc(), &snapshot(), "csi.example.com", "du-b-uid.p-uid").unwrap();
        let v = serde_json::to_value(&du).unwrap();
        assert_eq!(
            v,
            json!({
                "apiVersion": "velero.io/v2alpha1", "kind": "DataUpload",
                "metadata": {
                    "namespace": "velero", "generateName": "nightly-",
                    "ownerReferences": [{"apiVersion": "velero.io/v1", "kind": "Backup",
                        "name": "nightly", "uid": "b-uid", "controller": true}],
                    "labels": {"velero.io/backup-name": "nightly", "velero.io/backup-uid": "b-uid",
                        "velero.io/pvc-uid": "p-uid",
                        "velero.io/async-operation-id": "du-b-uid.p-uid"},
                },
                "spec": {
                    "snapshotType": "CSI",
                    "csiSnapshot": {"volumeSnapshot": "velero-data-abcde", "storageClass": "fast",
                        "snapshotClass": "csi-class", "driver": "csi.example.com"},
                    "sourcePVC": "data", "datamover": "ferry", "backupStorageLocation": "primary",
                    "sourceNamespace": "apps",
                    "dataMoverConfig": {"ParallelFilesUpload": "4"},
                    "operationTimeout": "30m0s",
                },
            })
        );
    }

    #[test]
    fn defaults_and_long_names() {
        let long = "n".repeat(70);
        let mut b = backup(json!({"snapshotMoveData": true, "datamover": "ferry",
                                  "uploaderConfig": {"parallelFilesUpload": 0}}));
        b.metadata.name = Some(long.clone());
        let du = new_data_upload(&b, &pvc(), &snapshot(), "d", "id").unwrap();
        assert_eq!(du.spec.operation_timeout.to_string(), "10m0s");
        assert_eq!(du.spec.data_mover_config, None);
        let labels = du.metadata.labels.unwrap();
        assert_eq!(labels[BACKUP_NAME_LABEL], valid_label_value(&long));
        assert_eq!(labels[BACKUP_NAME_LABEL].len(), 63);
        assert_eq!(du.metadata.generate_name.unwrap(), format!("{long}-"));
        let mut bad = backup(json!({}));
        bad.spec =
            BackupSpec { csi_snapshot_timeout: Some("soon".into()), ..BackupSpec::default() };
        assert!(matches!(csi_snapshot_timeout(&bad), Err(DmpError::InvalidTimeout { .. })));
    }

    #[test]
    fn the_pvc_is_marked_and_otherwise_kept() {
        let item = json!({"metadata": {"name": "data", "labels": {"app": "db"}},
                          "spec": {"volumeName": "pv-1"}, "status": {"phase": "Bound"}});
        let marked = mark_backed_up_pvc(&item, "velero-data-x", "nightly", "velero", "nightly-abc");
        assert_eq!(
            marked,
            json!({"metadata": {"name": "data",
                    "labels": {"app": "db", "velero.io/volume-snapshot-name": "velero-data-x",
                               "velero.io/backup-name": "nightly"},
                    "annotations": {"velero.io/volume-snapshot-name": "velero-data-x",
                        "backup.velero.io/must-include-additional-items": "true",
                        "velero.io/data-upload-name": "velero/nightly-abc"}},
                   "spec": {"volumeName": "pv-1"}, "status": {"phase": "Bound"}})
        );
    }
}
