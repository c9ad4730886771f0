//! The PVC backup item action (`BackupItemActionV2` on `persistentvolumeclaims`).
//!
//! For a bound CSI PVC of a backup that moves its data with this mover, it does what Velero's
//! CSI plugin does: takes a VolumeSnapshot in the PVC's namespace with the class chosen for
//! the PVC's driver, waits for the snapshot handle, creates the DataUpload in Velero's
//! namespace, and returns the PVC marked with both, the operation ID and the DataUpload as a
//! post-operation item (Velero backs it up again, with its final status, once the operation
//! completes).
//!
//! Unlike Velero's plugin it first looks for a DataUpload with the same operation ID and adopts
//! it, so that calling `Execute` twice for one PVC of one backup never moves the data twice.

pub mod class;
mod snapshot;
pub mod upload;

use ferry_api::{Backup, DataUpload};
use ferry_plugin::{
    BackupItemActionV2, BackupItemInput, BackupItemOutputV2, JsonObject, OperationProgress,
    PluginError, ResourceIdentifier, ResourceSelector, async_trait,
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::Api;

pub use self::snapshot::new_volume_snapshot;
use self::upload::{add_metadata_map, mark_backed_up_pvc, new_data_upload, skip_reason};
use crate::context::PluginContext;
use crate::error::DmpError;
use crate::keys::SKIPPED_NO_CSI_PV;
use crate::operation;
use crate::progress::data_upload_progress;

/// Velero's PVC backup item action for this data mover.
#[derive(Debug, Clone)]
pub struct PvcBackupAction {
    ctx: PluginContext,
}

/// A data movement started (or found already started) for one PVC.
#[derive(Debug, Clone)]
pub(crate) struct StartedUpload {
    pub(crate) operation_id: String,
    pub(crate) upload: DataUpload,
}

impl PvcBackupAction {
    /// The action, working through `ctx`.
    #[must_use]
    pub fn new(ctx: PluginContext) -> Self {
        Self { ctx }
    }

    /// Snapshots `pvc` (bound to a CSI volume) and creates its DataUpload, or returns the
    /// DataUpload already created for this backup and PVC.
    pub(crate) async fn start_upload(
        &self,
        backup: &Backup,
        pvc: &PersistentVolumeClaim,
    ) -> Result<StartedUpload, DmpError> {
        let client = &self.ctx.client;
        let operation_id = upload::upload_operation_id(backup, pvc);
        let namespace = backup.metadata.namespace.as_deref().unwrap_or(&self.ctx.velero_namespace);
        if let Some(upload) =
            operation::find::<DataUpload>(client, namespace, &operation_id).await?
        {
            tracing::info!(%operation_id, upload = %upload.name_any(), "adopting the existing DataUpload");
            return Ok(StartedUpload { operation_id, upload });
        }
        let pvc_ref = format!("{}/{}", pvc.namespace().unwrap_or_default(), pvc.name_any());
        let storage_class = storage_class_name(pvc)?;
        let timeout = upload::csi_snapshot_timeout(backup)?;
        let driver = snapshot::storage_class_driver(client, pvc, &storage_class).await?;
        let class = snapshot::snapshot_class(client, &driver, pvc, backup).await?;
        tracing::info!(pvc = %pvc_ref, volume_snapshot_class = %class, "taking a CSI snapshot");
        let vs =
            snapshot::create_volume_snapshot(client, &new_volume_snapshot(pvc, backup, &class))
                .await?;
        let interval = self.ctx.snapshot_poll_interval;
        let content =
            match snapshot::wait_for_snapshot_handle(client, &vs, timeout.0, interval).await {
                Ok(content) => content,
                Err(err) => {
                    snapshot::delete_volume_snapshot(client, &vs).await;
                    return Err(err);
                }
            };
        let du = new_data_upload(backup, pvc, &vs, &content.spec.driver, &operation_id)?;
        let api: Api<DataUpload> = Api::namespaced(client.clone(), namespace);
        match ferry_kube::create(&api, &du).await {
            Ok(upload) => {
                tracing::info!(pvc = %pvc_ref, %operation_id, upload = %upload.name_any(), "DataUpload created");
                Ok(StartedUpload { operation_id, upload })
            }
            Err(source) => {
                snapshot::delete_volume_snapshot(client, &vs).await;
                Err(DmpError::CreateDataUpload { pvc: pvc_ref, source: Box::new(source) })
            }
        }
    }
}

/// The PVC's storage class, which a snapshot needs.
fn storage_class_name(pvc: &PersistentVolumeClaim) -> Result<String, DmpError> {
    pvc.spec.as_ref().and_then(|s| s.storage_class_name.clone()).ok_or_else(|| {
        DmpError::NoStorageClass {
            namespace: pvc.namespace().unwrap_or_default(),
            name: pvc.name_any(),
        }
    })
}

/// The PV bound to `pvc`; like Velero, a PVC without `spec.volumeName` or not in phase `Bound`
/// is an error.
pub(crate) async fn bound_volume(
    client: &kube::Client,
    pvc: &PersistentVolumeClaim,
) -> Result<PersistentVolume, DmpError> {
    let (namespace, name) = (pvc.namespace().unwrap_or_default(), pvc.name_any());
    let volume = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
    if volume.is_empty() {
        let reason = "it has no spec.volumeName".to_owned();
        return Err(DmpError::PvcNotBound { namespace, name, reason });
    }
    let phase = pvc.status.as_ref().and_then(|s| s.phase.clone()).unwrap_or_default();
    if phase != "Bound" {
        let reason = format!("it is in phase {phase:?}");
        return Err(DmpError::PvcNotBound { namespace, name, reason });
    }
    let api: Api<PersistentVolume> = Api::all(client.clone());
    api.get(&volume).await.map_err(|e| {
        DmpError::kube(
            format!("reading PersistentVolume {volume} of PVC {namespace}/{name}"),
            "PersistentVolume",
            &volume,
            e,
        )
    })
}

pub(crate) fn decode<T: serde::de::DeserializeOwned>(
    obj: &JsonObject,
    what: &'static str,
) -> Result<T, DmpError> {
    obj.deserialize().map_err(|source| DmpError::Decode { what, source })
}

#[async_trait]
impl BackupItemActionV2 for PvcBackupAction {
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError> {
        Ok(ResourceSelector::resources(["persistentvolumeclaims"]))
    }

    async fn execute(&self, input: BackupItemInput) -> Result<BackupItemOutputV2, PluginError> {
        let backup: Backup = decode(&input.backup, "backup")?;
        if let Some(reason) = skip_reason(&backup, &self.ctx.data_mover) {
            tracing::debug!(pvc = ?input.item.name(), "not moving this PVC's data: {reason}");
            return Ok(BackupItemOutputV2::unchanged());
        }
        let pvc: PersistentVolumeClaim = decode(&input.item, "item")?;
        storage_class_name(&pvc)?;
        let pv = bound_volume(&self.ctx.client, &pvc).await?;
        if pv.spec.as_ref().and_then(|s| s.csi.as_ref()).is_none() {
            tracing::info!(pvc = %pvc.name_any(), pv = %pv.name_any(), "skipping: the PV is not a CSI volume");
            let mut item = input.item.value().clone();
            add_metadata_map(&mut item, "annotations", &[(SKIPPED_NO_CSI_PV, "true")]);
            return Ok(BackupItemOutputV2 { item: Some(item), ..BackupItemOutputV2::default() });
        }
        let started = match self.start_upload(&backup, &pvc).await {
            Ok(started) => started,
            // Velero does not fail the backup here: it logs the error (which makes the backup
            // partially failed) and keeps the PVC unchanged.
            Err(err @ DmpError::CreateDataUpload { .. }) => {
                tracing::error!("{}", ferry_plugin::error_chain(&err));
                return Ok(BackupItemOutputV2::unchanged());
            }
            Err(err) => return Err(err.into()),
        };
        let upload = &started.upload;
        let (du_namespace, du_name) = (upload.namespace().unwrap_or_default(), upload.name_any());
        let snapshot_name = upload
            .spec
            .csi_snapshot
            .as_ref()
            .map(|s| s.volume_snapshot.clone())
            .unwrap_or_default();
        let backup_name = backup.metadata.name.clone().unwrap_or_default();
        let item = mark_backed_up_pvc(
            input.item.value(),
            &snapshot_name,
            &backup_name,
            &du_namespace,
            &du_name,
        );
        Ok(BackupItemOutputV2 {
            item: Some(item),
            additional_items: Vec::new(),
            operation_id: Some(started.operation_id),
            post_operation_items: vec![ResourceIdentifier::namespaced(
                "velero.io",
                "datauploads",
                du_namespace,
                du_name,
            )],
        })
    }

    async fn progress(
        &self,
        operation_id: &str,
        backup: &JsonObject,
    ) -> Result<OperationProgress, PluginError> {
        let namespace = backup.namespace().unwrap_or(&self.ctx.velero_namespace);
        let du: DataUpload = operation::get(&self.ctx.client, namespace, operation_id).await?;
        Ok(data_upload_progress(&du))
    }

    async fn cancel(&self, operation_id: &str, backup: &JsonObject) -> Result<(), PluginError> {
        let namespace = backup.namespace().unwrap_or(&self.ctx.velero_namespace);
        Ok(operation::cancel::<DataUpload>(&self.ctx.client, namespace, operation_id).await?)
    }
}
