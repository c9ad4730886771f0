//! Velero's objects for a data mover, exactly as Velero v1.18's CSI plugin and restore create
//! them: the DataUpload of a backed-up PVC, the target PVC a restore leaves for the mover, and
//! the DataDownload that fills it. Shared by the simulator's and the real node's end-to-end
//! tests.

use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use ferry_api::{BackupStorageLocation, DataDownload, DataUpload};
use ferry_testbed::VELERO_NAMESPACE;
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

/// Where the data goes: the mover's name and the BackupStorageLocation.
pub struct Mover<'a> {
    pub datamover: &'a str,
    pub bsl: &'a str,
}

/// Velero's own credentials secret, as `velero install --secret-file` names it.
pub const VELERO_SECRET: &str = "cloud-credentials";

/// Creates a BackupStorageLocation `name` on S3 at `endpoint` (bucket `bucket`, prefix
/// `velero`, region us-east-1, path-style) with its credentials (`access_key`, `secret_key`) in
/// Secret `secret_name`, key `cloud`. With [`VELERO_SECRET`], Velero's default location as
/// `velero install --secret-file` makes it: no `spec.credential` (Velero uses its own
/// credentials file, Ferry that Secret). With another secret, a further location with
/// credentials of its own, named by its `spec.credential`.
pub async fn create_bsl(
    client: &Client,
    name: &str,
    bucket: &str,
    endpoint: &str,
    (access_key, secret_key): (&str, &str),
    secret_name: &str,
) -> Result<(), Box<dyn std::error::Error>> {
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": secret_name, "namespace": VELERO_NAMESPACE },
        "stringData": {
            "cloud": ferry_testbed::velero::aws_credentials_file(access_key, secret_key),
        },
    }))?;
    Api::<Secret>::namespaced(client.clone(), VELERO_NAMESPACE)
        .create(&PostParams::default(), &secret)
        .await?;
    let mut spec = json!({
        "provider": "aws",
        "objectStorage": { "bucket": bucket, "prefix": "velero" },
        "config": { "region": "us-east-1", "s3Url": endpoint, "s3ForcePathStyle": "true" },
    });
    if secret_name != VELERO_SECRET {
        spec["credential"] = json!({ "name": secret_name, "key": "cloud" });
    }
    let bsl: BackupStorageLocation = serde_json::from_value(json!({
        "apiVersion": "velero.io/v1", "kind": "BackupStorageLocation",
        "metadata": { "name": name, "namespace": VELERO_NAMESPACE },
        "spec": spec,
    }))?;
    Api::<BackupStorageLocation>::namespaced(client.clone(), VELERO_NAMESPACE)
        .create(&PostParams::default(), &bsl)
        .await?;
    Ok(())
}

/// The CSI classes and driver of the source volume's snapshot.
pub struct Classes<'a> {
    pub storage_class: &'a str,
    pub snapshot_class: &'a str,
    pub driver: &'a str,
}

/// The DataUpload Velero's CSI plugin creates for `pvc` (already created: its UID is a label)
/// snapshotted as `snapshot` in backup `backup` (UID `backup_uid`).
pub fn data_upload(
    mover: &Mover<'_>,
    classes: &Classes<'_>,
    backup: &str,
    backup_uid: &str,
    pvc: &PersistentVolumeClaim,
    snapshot: &str,
) -> serde_json::Result<DataUpload> {
    let pvc_uid = pvc.uid().unwrap_or_default();
    serde_json::from_value(json!({
        "apiVersion": "velero.io/v2alpha1",
        "kind": "DataUpload",
        "metadata": {
            "generateName": format!("{backup}-"),
            "namespace": VELERO_NAMESPACE,
            "labels": {
                "velero.io/backup-name": backup,
                "velero.io/backup-uid": backup_uid,
                "velero.io/pvc-uid": pvc_uid,
                "velero.io/async-operation-id":
                    ferry_api::naming::valid_label_value(&format!("du-{backup_uid}.{pvc_uid}")),
            },
        },
        "spec": {
            "snapshotType": "CSI",
            "csiSnapshot": {
                "volumeSnapshot": snapshot,
                "storageClass": classes.storage_class,
                "snapshotClass": classes.snapshot_class,
                "driver": classes.driver,
            },
            "sourcePVC": pvc.name_any(),
            "datamover": mover.datamover,
            "backupStorageLocation": mover.bsl,
            "sourceNamespace": pvc.namespace().unwrap_or_default(),
            "operationTimeout": "10m0s",
        },
    }))
}

/// A target PVC as Velero's restore leaves it for a data mover: no volumeName, and the
/// `velero.io/dynamic-pv-restore` selector (`selector`) that keeps provisioners away.
pub fn target_pvc(
    namespace: &str,
    name: &str,
    size: &str,
    mode: &str,
    storage_class: &str,
    selector: &str,
) -> serde_json::Result<PersistentVolumeClaim> {
    serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": name, "namespace": namespace },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": storage_class,
            "volumeMode": mode,
            "resources": { "requests": { "storage": size } },
            "selector": { "matchLabels": {
                "velero.io/dynamic-pv-restore": ferry_api::naming::valid_label_value(selector),
            } },
        },
    }))
}

/// The DataDownload Velero's CSI plugin creates to restore `from` into `target` (already
/// created) for restore `restore` (UID `restore_uid`).
pub fn data_download(
    mover: &Mover<'_>,
    restore: &str,
    restore_uid: &str,
    target: &PersistentVolumeClaim,
    from: &DataUpload,
) -> serde_json::Result<DataDownload> {
    let status = from.status.clone().unwrap_or_default();
    let pvc_uid = target.uid().unwrap_or_default();
    serde_json::from_value(json!({
        "apiVersion": "velero.io/v2alpha1",
        "kind": "DataDownload",
        "metadata": {
            "generateName": format!("{restore}-"),
            "namespace": VELERO_NAMESPACE,
            "labels": {
                "velero.io/restore-name": restore,
                "velero.io/restore-uid": restore_uid,
                "velero.io/async-operation-id":
                    ferry_api::naming::valid_label_value(&format!("dd-{restore_uid}.{pvc_uid}")),
            },
        },
        "spec": {
            "targetVolume": {
                "pvc": target.name_any(),
                "pv": "",
                "namespace": target.namespace().unwrap_or_default(),
            },
            "backupStorageLocation": mover.bsl,
            "datamover": mover.datamover,
            "snapshotID": status.snapshot_id,
            "sourceNamespace": from.spec.source_namespace,
            "operationTimeout": "10m0s",
            "nodeOS": "linux",
            "snapshotSize": status.progress.total_bytes,
        },
    }))
}
