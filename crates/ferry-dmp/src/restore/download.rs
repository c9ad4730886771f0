//! The DataDownload Velero's CSI plugin creates for a PVC whose data was moved, and the PVC it
//! returns; pure functions.

use std::collections::BTreeMap;

use ferry_api::keys::{
    ASYNC_OPERATION_ID_LABEL, DYNAMIC_PV_RESTORE_LABEL, PARALLEL_FILES_DOWNLOAD,
    RESTORE_NAME_LABEL, RESTORE_UID_LABEL, WRITE_SPARSE_FILES,
};
use ferry_api::naming::{data_download_operation_id, valid_label_value};
use ferry_api::{
    Backup, DataDownload, DataDownloadSpec, DataUpload, NodeOs, Restore, TargetVolumeSpec,
};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{ObjectMeta, OwnerReference};
use rand::Rng as _;
use serde::{Deserialize, Serialize};
use serde_json::{Value, json};

use crate::backup::upload::csi_snapshot_timeout;
use crate::error::DmpError;

/// What Velero keeps of a completed DataUpload for a restore (`DataUploadResult`), as its
/// `velero.io/dataupload` restore action writes it into a ConfigMap, under the restore's UID.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct UploadResult {
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
    /// The snapshot's logical size in bytes (the DataUpload's `progress.totalBytes`).
    #[serde(default, skip_serializing_if = "is_zero")]
    pub snapshot_size: i64,
}

impl UploadResult {
    /// What a (completed) DataUpload leaves for restores.
    #[must_use]
    pub fn of(du: &DataUpload) -> Self {
        let status = du.status.clone().unwrap_or_default();
        Self {
            backup_storage_location: du.spec.backup_storage_location.clone(),
            data_mover: du.spec.data_mover.clone(),
            snapshot_id: status.snapshot_id,
            source_namespace: du.spec.source_namespace.clone(),
            data_mover_result: status.data_mover_result,
            node_os: status.node_os,
            snapshot_size: status.progress.total_bytes,
        }
    }
}

/// The ConfigMap Velero's `velero.io/dataupload` restore action makes from a DataUpload of the
/// backup (the PVC restore action finds it by these labels): beside the Restore, named after
/// the DataUpload, the result under the Restore's UID. A host restoring without Velero makes
/// it itself.
///
/// # Errors
/// [`DmpError`] when the result cannot be written as JSON (not expected).
pub fn upload_result_config_map(
    restore: &Restore,
    du: &DataUpload,
) -> Result<k8s_openapi::api::core::v1::ConfigMap, DmpError> {
    let uid = restore.metadata.uid.clone().unwrap_or_default();
    let pvc = format!("{}.{}", du.spec.source_namespace, du.spec.source_pvc);
    let json =
        serde_json::to_string(&UploadResult::of(du)).map_err(|e| DmpError::DataUploadResult {
            pvc: format!("{}/{}", du.spec.source_namespace, du.spec.source_pvc),
            restore: restore.metadata.name.clone().unwrap_or_default(),
            reason: format!("writing it as JSON: {e}"),
        })?;
    Ok(k8s_openapi::api::core::v1::ConfigMap {
        metadata: ObjectMeta {
            namespace: restore.metadata.namespace.clone(),
            generate_name: Some(format!("{}-", du.metadata.name.as_deref().unwrap_or("ferry"))),
            labels: Some(BTreeMap::from([
                (RESTORE_UID_LABEL.to_owned(), valid_label_value(&uid)),
                (crate::keys::PVC_NAMESPACE_NAME_LABEL.to_owned(), valid_label_value(&pvc)),
                (
                    ferry_api::keys::RESOURCE_USAGE_LABEL.to_owned(),
                    crate::keys::RESOURCE_USAGE_DATA_UPLOAD.to_owned(),
                ),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(BTreeMap::from([(uid, json)])),
        ..Default::default()
    })
}

#[allow(clippy::trivially_copy_pass_by_ref)] // serde hands the field by reference
fn is_zero(v: &i64) -> bool {
    *v == 0
}

/// Velero's alphabet for random name suffixes (no vowels, no look-alike digits).
const SUFFIX_ALPHABET: &[u8] = b"bcdfghjklmnpqrstvwxz2456789";

/// The operation ID of the download of the PVC (by its UID in the backup) for `restore`.
#[must_use]
pub fn download_operation_id(restore: &Restore, pvc_uid_in_backup: &str) -> String {
    data_download_operation_id(
        restore.metadata.uid.as_deref().unwrap_or_default(),
        pvc_uid_in_backup,
    )
}

/// The namespace a PVC of namespace `namespace` is restored into.
#[must_use]
pub fn target_namespace(restore: &Restore, namespace: &str) -> String {
    restore
        .spec
        .namespace_mapping
        .as_ref()
        .and_then(|m| m.get(namespace))
        .cloned()
        .unwrap_or_else(|| namespace.to_owned())
}

/// A fresh value for the `velero.io/dynamic-pv-restore` selector: `<namespace>.<pvc>.<5
/// random characters>` through the label-value rule, as Velero makes it.
#[must_use]
pub fn dynamic_pv_restore_value(namespace: &str, pvc: &str) -> String {
    let mut rng = rand::rng();
    let suffix: String = (0..5)
        .map(|_| char::from(SUFFIX_ALPHABET[rng.random_range(0..SUFFIX_ALPHABET.len())]))
        .collect();
    valid_label_value(&format!("{namespace}.{pvc}.{suffix}"))
}

/// The PVC as Velero's plugin returns it before a download: `spec.volumeName` reset to `""` and
/// `spec.selector.matchLabels` given `velero.io/dynamic-pv-restore: <value>`, so that nothing
/// binds it until the mover's restored PV carries that label. A value already there is kept
/// (the item has been through this already); returns the PVC and the value it carries.
#[must_use]
pub fn reset_pvc_for_download(
    item: &Value,
    fresh_value: impl FnOnce() -> String,
) -> (Value, String) {
    let mut pvc = item.clone();
    let existing = pvc
        .pointer(&format!(
            "/spec/selector/matchLabels/{}",
            DYNAMIC_PV_RESTORE_LABEL.replace('/', "~1")
        ))
        .and_then(Value::as_str)
        .map(str::to_owned);
    let value = existing.unwrap_or_else(fresh_value);
    if let Some(root) = pvc.as_object_mut() {
        let spec = root.entry("spec").or_insert_with(|| json!({}));
        if let Some(spec) = spec.as_object_mut() {
            spec.insert("volumeName".to_owned(), json!(""));
            let selector = spec.entry("selector").or_insert_with(|| json!({}));
            if !selector.is_object() {
                *selector = json!({});
            }
            if let Some(selector) = selector.as_object_mut() {
                let labels = selector.entry("matchLabels").or_insert_with(|| json!({}));
                if !labels.is_object() {
                    *labels = json!({});
                }
                if let Some(labels) = labels.as_object_mut() {
                    labels.insert(DYNAMIC_PV_RESTORE_LABEL.to_owned(), json!(value));
                }
            }
        }
    }
    (pvc, value)
}

/// `dataMoverConfig` from the restore's `spec.uploaderConfig`, as Velero stores it: when the
/// restore has an uploader config, `WriteSparseFiles` (default `false`) and, when positive,
/// `ParallelFilesDownload`.
#[must_use]
pub fn restore_data_mover_config(restore: &Restore) -> Option<BTreeMap<String, String>> {
    let config = restore.spec.other.get("uploaderConfig")?.as_object()?;
    let sparse = config.get("writeSparseFiles").and_then(Value::as_bool).unwrap_or(false);
    let mut out = BTreeMap::from([(WRITE_SPARSE_FILES.to_owned(), sparse.to_string())]);
    if let Some(n) = config.get("parallelFilesDownload").and_then(Value::as_i64).filter(|n| *n > 0)
    {
        out.insert(PARALLEL_FILES_DOWNLOAD.to_owned(), n.to_string());
    }
    Some(out)
}

/// The DataDownload Velero's plugin creates to restore `result` into PVC `pvc` of namespace
/// `target_namespace`, in the Restore's namespace.
///
/// # Errors
/// [`DmpError::InvalidTimeout`] for a bad `csiSnapshotTimeout` in the backup.
pub fn new_data_download(
    restore: &Restore,
    backup: &Backup,
    result: &UploadResult,
    pvc: &str,
    target_namespace: &str,
    operation_id: &str,
) -> Result<DataDownload, DmpError> {
    let restore_name = restore.metadata.name.clone().unwrap_or_default();
    let restore_uid = restore.metadata.uid.clone().unwrap_or_default();
    let spec = DataDownloadSpec {
        target_volume: TargetVolumeSpec {
            pvc: pvc.to_owned(),
            pv: String::new(),
            namespace: target_namespace.to_owned(),
        },
        backup_storage_location: result.backup_storage_location.clone(),
        data_mover: result.data_mover.clone(),
        snapshot_id: result.snapshot_id.clone(),
        source_namespace: result.source_namespace.clone(),
        data_mover_config: restore_data_mover_config(restore),
        cancel: false,
        operation_timeout: csi_snapshot_timeout(backup)?,
        node_os: result.node_os,
        snapshot_size: result.snapshot_size,
    };
    let mut dd = DataDownload::new("", spec);
    dd.metadata = ObjectMeta {
        namespace: restore.metadata.namespace.clone(),
        generate_name: Some(format!("{restore_name}-")),
        owner_references: Some(vec![OwnerReference {
            api_version: "velero.io/v1".to_owned(),
            kind: "Restore".to_owned(),
            name: restore_name.clone(),
            uid: restore_uid.clone(),
            controller: Some(true),
            block_owner_deletion: None,
        }]),
        labels: Some(BTreeMap::from([
            (RESTORE_NAME_LABEL.to_owned(), valid_label_value(&restore_name)),
            (RESTORE_UID_LABEL.to_owned(), restore_uid),
            (ASYNC_OPERATION_ID_LABEL.to_owned(), operation_id.to_owned()),
        ])),
        ..ObjectMeta::default()
    };
    Ok(dd)
}

/// The DataDownload the volume snapshotter creates to restore the finished upload `du` (whose
/// result is `result`) into the PVC it was taken of. It has no owner (no Restore asked for it)
/// and lives beside the DataUpload.
#[must_use]
pub fn new_data_download_for_upload(
    du: &DataUpload,
    result: &UploadResult,
    operation_id: &str,
) -> DataDownload {
    let spec = DataDownloadSpec {
        target_volume: TargetVolumeSpec {
            pvc: du.spec.source_pvc.clone(),
            pv: String::new(),
            namespace: du.spec.source_namespace.clone(),
        },
        backup_storage_location: result.backup_storage_location.clone(),
        data_mover: result.data_mover.clone(),
        snapshot_id: result.snapshot_id.clone(),
        source_namespace: result.source_namespace.clone(),
        data_mover_config: None,
        cancel: false,
        operation_timeout: du.spec.operation_timeout,
        node_os: result.node_os,
        snapshot_size: result.snapshot_size,
    };
    let mut dd = DataDownload::new("", spec);
    dd.metadata = ObjectMeta {
        namespace: du.metadata.namespace.clone(),
        generate_name: Some(format!("{}-", du.metadata.name.as_deref().unwrap_or("ferry"))),
        labels: Some(BTreeMap::from([(
            ASYNC_OPERATION_ID_LABEL.to_owned(),
            operation_id.to_owned(),
        )])),
        ..ObjectMeta::default()
    };
    dd
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn restore(spec: Value) -> Restore {
        serde_json::from_value(json!({
            "apiVersion": "velero.io/v1", "kind": "Restore",
            "metadata": {"name": "r1", "namespace": "velero", "uid": "r-uid"}, "spec": spec,
        }))
        .unwrap()
    }

    fn backup(spec: Value) -> Backup {
        serde_json::from_value(
            json!({"metadata": {"name": "b1", "namespace": "velero"}, "spec": spec}),
        )
        .unwrap()
    }

    fn result() -> UploadResult {
        UploadResult {
            backup_storage_location: "primary".into(),
            data_mover: "ferry".into(),
            snapshot_id: "snap-1".into(),
            source_namespace: "apps".into(),
            data_mover_result: Some([("k".to_owned(), "v".to_owned())].into()),
            node_os: Some(NodeOs::Linux),
            snapshot_size: 4096,
        }
    }

    #[test]
    fn upload_results_read_as_velero_writes_them() {
        let json = r#"{"backupStorageLocation":"primary","datamover":"ferry","snapshotID":"snap-1","sourceNamespace":"apps","dataMoverResult":{"k":"v"},"nodeOS":"linux","snapshotSize":4096}"#;
        let parsed: UploadResult = serde_json::from_str(json).unwrap();
        assert_eq!(parsed, result());
        assert_eq!(serde_json::to_string(&parsed).unwrap(), json);
    }

    #[test]
    fn the_data_download_has_velero_fields() {
        let r = restore(json!({"backupName": "b1",
            "uploaderConfig": {"writeSparseFiles": true, "parallelFilesDownload": 8}}));
        let b = backup(json!({"csiSnapshotTimeout": "15m"}));
        let dd = new_data_download(&r, &b, &result(), "data", "apps-copy", "dd-r-uid.p").unwrap();
        assert_eq!(
            serde_json::to_value(&dd).unwrap(),
            json!({
                "apiVersion": "velero.io/v2alpha1", "kind": "DataDownload",
                "metadata": {"namespace": "velero", "generateName": "r1-",
                    "ownerReferences": [{"apiVersion": "velero.io/v1", "kind": "Restore",
                        "name": "r1", "uid": "r-uid", "controller": true}],
                    "labels": {"velero.io/restore-name": "r1", "velero.io/restore-uid": "r-uid",
                        "velero.io/async-operation-id": "dd-r-uid.p"}},
                "spec": {"targetVolume": {"pvc": "data", "pv": "", "namespace": "apps-copy"},
                    "backupStorageLocation": "primary", "datamover": "ferry",
                    "snapshotID": "snap-1", "sourceNamespace": "apps",
                    "dataMoverConfig": {"WriteSparseFiles": "true", "ParallelFilesDownload": "8"},
                    "operationTimeout": "15m0s", "nodeOS": "linux", "snapshotSize": 4096},
            })
        );
    }

    #[test]
    fn uploader_config_defaults() {
        assert_eq!(restore_data_mover_config(&restore(json!({}))), None);
        let empty = restore(json!({"uploaderConfig": {}}));
        assert_eq!(
            restore_data_mover_config(&empty),
            Some([("WriteSparseFiles".to_owned(), "false".to_owned())].into())
        );
    }

    #[test]
    fn the_pvc_is_reset_and_selected() {
        let item = json!({"metadata": {"name": "data"}, "spec": {"volumeName": "pv-1",
            "selector": {"matchLabels": {"tier": "db"}}, "storageClassName": "fast"}});
        let (pvc, value) = reset_pvc_for_download(&item, || "apps.data.bcdfg".to_owned());
        assert_eq!(value, "apps.data.bcdfg");
        assert_eq!(
            pvc,
            json!({"metadata": {"name": "data"}, "spec": {"volumeName": "",
                "selector": {"matchLabels": {"tier": "db",
                    "velero.io/dynamic-pv-restore": "apps.data.bcdfg"}},
                "storageClassName": "fast"}})
        );
        // Already reset: the value stays.
        let (again, kept) = reset_pvc_for_download(&pvc, || "other".to_owned());
        assert_eq!((again, kept.as_str()), (pvc, "apps.data.bcdfg"));
        let (bare, _) = reset_pvc_for_download(&json!({"metadata": {}}), || "v".to_owned());
        assert_eq!(
            bare["spec"],
            json!({"volumeName": "", "selector": {"matchLabels": {"velero.io/dynamic-pv-restore": "v"}}})
        );
    }

    #[test]
    fn dynamic_values_follow_velero() {
        let v = dynamic_pv_restore_value("apps", "data");
        assert_eq!(v.len(), "apps.data.".len() + 5);
        assert!(v.starts_with("apps.data."));
        assert!(v[10..].bytes().all(|b| SUFFIX_ALPHABET.contains(&b)), "{v}");
        let long = dynamic_pv_restore_value(&"n".repeat(40), &"p".repeat(40));
        assert_eq!(long.len(), 63);
        let r = restore(json!({"namespaceMapping": {"apps": "apps-copy"}}));
        assert_eq!(target_namespace(&r, "apps"), "apps-copy");
        assert_eq!(target_namespace(&r, "other"), "other");
        assert_eq!(download_operation_id(&r, "p-uid"), "dd-r-uid.p-uid");
    }

    #[test]
    fn the_upload_result_config_map_is_velero_s() {
        let mut du: DataUpload = serde_json::from_value(json!({
            "metadata": {"name": "nightly-x1", "namespace": "velero"},
            "spec": {"snapshotType": "CSI", "sourcePVC": "data", "datamover": "ferry",
                     "backupStorageLocation": "primary", "sourceNamespace": "apps",
                     "operationTimeout": "10m0s"},
            "status": {"phase": "Completed", "snapshotID": "snap-42", "nodeOS": "linux",
                       "dataMoverResult": {"k": "v"},
                       "progress": {"totalBytes": 1_048_576, "bytesDone": 1_048_576}}
        }))
        .unwrap();
        let cm = upload_result_config_map(&restore(json!({})), &du).unwrap();
        assert_eq!(
            serde_json::to_value(&cm).unwrap(),
            json!({
                "apiVersion": "v1", "kind": "ConfigMap",
                "metadata": {"generateName": "nightly-x1-", "namespace": "velero",
                    "labels": {"velero.io/restore-uid": "r-uid",
                        "velero.io/pvc-namespace-name": "apps.data",
                        "velero.io/resource-usage": "DataUpload"}},
                "data": {"r-uid": "{\"backupStorageLocation\":\"primary\",\"datamover\":\"ferry\",\"snapshotID\":\"snap-42\",\"sourceNamespace\":\"apps\",\"dataMoverResult\":{\"k\":\"v\"},\"nodeOS\":\"linux\",\"snapshotSize\":1048576}"}
            })
        );
        du.spec.source_pvc = "a-very-long-persistent-volume-claim-name-that-goes-on".into();
        let cm = upload_result_config_map(&restore(json!({})), &du).unwrap();
        let label = &cm.metadata.labels.unwrap()["velero.io/pvc-namespace-name"];
        assert!(label.len() <= 63, "{label}");
    }
}
