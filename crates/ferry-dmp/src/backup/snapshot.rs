//! Taking the CSI snapshot of a PVC: choosing its class, creating the VolumeSnapshot and
//! waiting until its VolumeSnapshotContent has a snapshot handle, as Velero's CSI plugin does.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_api::keys::BACKUP_NAME_LABEL;
use ferry_api::naming::valid_label_value;
use ferry_api::{
    Backup, VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent, VolumeSnapshotSource,
    VolumeSnapshotSpec,
};
use k8s_openapi::api::core::v1::PersistentVolumeClaim;
use k8s_openapi::api::storage::v1::StorageClass;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, ListParams};
use tokio::time::Instant;

use super::class::select_snapshot_class;
use crate::error::DmpError;

/// The VolumeSnapshot Velero's plugin creates for `pvc` in its namespace: named
/// `velero-<pvc>-<random>`, labelled with the PVC's labels and the backup's name, taken with
/// `class`.
#[must_use]
pub fn new_volume_snapshot(
    pvc: &PersistentVolumeClaim,
    backup: &Backup,
    class: &str,
) -> VolumeSnapshot {
    let pvc_name = pvc.name_any();
    let mut labels: BTreeMap<String, String> = pvc.labels().clone();
    labels.insert(
        BACKUP_NAME_LABEL.to_owned(),
        valid_label_value(backup.metadata.name.as_deref().unwrap_or_default()),
    );
    let mut vs = VolumeSnapshot::new(
        "",
        VolumeSnapshotSpec {
            source: VolumeSnapshotSource {
                persistent_volume_claim_name: Some(pvc_name.clone()),
                volume_snapshot_content_name: None,
            },
            volume_snapshot_class_name: Some(class.to_owned()),
        },
    );
    vs.metadata.name = None;
    vs.metadata.generate_name = Some(format!("velero-{pvc_name}-"));
    vs.metadata.namespace = pvc.metadata.namespace.clone();
    vs.metadata.labels = Some(labels);
    vs
}

/// The CSI driver of the PVC's StorageClass (its provisioner), which chooses the snapshot class.
pub(crate) async fn storage_class_driver(
    client: &kube::Client,
    pvc: &PersistentVolumeClaim,
    class_name: &str,
) -> Result<String, DmpError> {
    let api: Api<StorageClass> = Api::all(client.clone());
    let class = api.get(class_name).await.map_err(|e| {
        DmpError::kube(
            format!(
                "reading StorageClass {class_name} of PVC {}/{}",
                pvc.namespace().unwrap_or_default(),
                pvc.name_any()
            ),
            "StorageClass",
            class_name,
            e,
        )
    })?;
    Ok(class.provisioner)
}

/// Chooses the VolumeSnapshotClass for `driver` (see [`select_snapshot_class`]).
pub(crate) async fn snapshot_class(
    client: &kube::Client,
    driver: &str,
    pvc: &PersistentVolumeClaim,
    backup: &Backup,
) -> Result<String, DmpError> {
    let api: Api<VolumeSnapshotClass> = Api::all(client.clone());
    let classes = api.list(&ListParams::default()).await.map_err(|e| {
        DmpError::kube("listing VolumeSnapshotClasses", "VolumeSnapshotClass", "", e)
    })?;
    let backup_annotations = backup.metadata.annotations.clone().unwrap_or_default();
    let class =
        select_snapshot_class(&classes.items, driver, pvc.annotations(), &backup_annotations)
            .map_err(|reason| DmpError::SnapshotClass { driver: driver.to_owned(), reason })?;
    Ok(class.name_any())
}

/// Creates the VolumeSnapshot.
pub(crate) async fn create_volume_snapshot(
    client: &kube::Client,
    vs: &VolumeSnapshot,
) -> Result<VolumeSnapshot, DmpError> {
    let namespace = vs.metadata.namespace.clone().unwrap_or_default();
    let api: Api<VolumeSnapshot> = Api::namespaced(client.clone(), &namespace);
    ferry_kube::create(&api, vs).await.map_err(|e| {
        DmpError::api(
            format!(
                "creating a VolumeSnapshot of PVC {namespace}/{}",
                vs.spec.source.persistent_volume_claim_name.as_deref().unwrap_or_default()
            ),
            e,
        )
    })
}

/// Waits until the VolumeSnapshot is bound to a VolumeSnapshotContent with a snapshot handle,
/// looking every `interval` for at most `timeout`; returns the content.
pub(crate) async fn wait_for_snapshot_handle(
    client: &kube::Client,
    vs: &VolumeSnapshot,
    timeout: Duration,
    interval: Duration,
) -> Result<VolumeSnapshotContent, DmpError> {
    let namespace = vs.namespace().unwrap_or_default();
    let name = vs.name_any();
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), &namespace);
    let contents: Api<VolumeSnapshotContent> = Api::all(client.clone());
    let deadline = Instant::now() + timeout;
    let mut last_error = None;
    loop {
        let current = snapshots.get(&name).await.map_err(|e| {
            DmpError::kube(
                format!("reading VolumeSnapshot {namespace}/{name}"),
                "VolumeSnapshot",
                &name,
                e,
            )
        })?;
        let bound = current.status.and_then(|s| s.bound_volume_snapshot_content_name);
        if let Some(content_name) = bound {
            let content = contents.get(&content_name).await.map_err(|e| {
                DmpError::kube(
                    format!("reading VolumeSnapshotContent {content_name} of VolumeSnapshot {namespace}/{name}"),
                    "VolumeSnapshotContent",
                    &content_name,
                    e,
                )
            })?;
            let status = content.status.clone().unwrap_or_default();
            if status.snapshot_handle.is_some() {
                return Ok(content);
            }
            last_error = status.error.and_then(|e| e.message);
            if let Some(err) = &last_error {
                tracing::warn!(content = %content_name, "VolumeSnapshotContent has an error: {err}");
            }
        }
        if Instant::now() + interval > deadline {
            return Err(DmpError::SnapshotTimeout { namespace, name, timeout, last_error });
        }
        tracing::debug!(%namespace, %name, "waiting for the CSI driver to cut the snapshot");
        tokio::time::sleep(interval).await;
    }
}

/// Deletes the VolumeSnapshot after a failure (best effort: the failure is logged).
pub(crate) async fn delete_volume_snapshot(client: &kube::Client, vs: &VolumeSnapshot) {
    let namespace = vs.namespace().unwrap_or_default();
    let name = vs.name_any();
    let api: Api<VolumeSnapshot> = Api::namespaced(client.clone(), &namespace);
    match api.delete(&name, &DeleteParams::default()).await {
        Ok(_) => tracing::info!(%namespace, %name, "deleted the VolumeSnapshot"),
        Err(kube::Error::Api(status)) if status.code == 404 => {}
        Err(err) => tracing::error!(%namespace, %name, "deleting the VolumeSnapshot: {err}"),
    }
}
