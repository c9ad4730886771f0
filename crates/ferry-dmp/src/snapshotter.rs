//! Ferry's VolumeSnapshotter v2 on top of the PVC actions.
//!
//! The snapshot of a volume is a data movement: `create_snapshot` starts it for the PV's bound
//! PVC exactly as the PVC backup action does (VolumeSnapshot, then DataUpload) and returns the
//! operation ID, which is the snapshot ID `progress` and `cancel` take. `create_volume_from_snapshot`
//! starts the reverse: a DataDownload of the finished upload into the same PVC, and returns the
//! download's operation ID as the volume ID, which `progress` and `cancel` take as well.
//!
//! - Volume IDs are PV names; `get_volume_id` answers only for CSI volumes with a claim.
//! - `create_snapshot` needs the tag `velero.io/backup` (Velero sets it) to find the Backup.
//! - `delete_snapshot` and `set_volume_id` are unsupported: repository snapshots are deleted
//!   with their backup (see [`crate::DataUploadDeleteAction`]), and the mover itself creates
//!   and binds the restored PV.

use std::collections::BTreeMap;

use ferry_api::keys::{DATA_DOWNLOAD_OPERATION_PREFIX, PVC_UID_LABEL};
use ferry_api::naming::data_download_operation_id;
use ferry_api::{Backup, DataDownload, DataUpload, DataUploadPhase};
use ferry_plugin::{
    JsonObject, NewVolume, OperationProgress, PluginError, VolumeInfo, VolumeSnapshotter,
    VolumeSnapshotterV2, async_trait,
};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::Api;
use serde_json::Value;

use crate::backup::upload::skip_reason;
use crate::backup::{PvcBackupAction, bound_volume};
use crate::context::PluginContext;
use crate::error::DmpError;
use crate::keys::SNAPSHOT_TAG_BACKUP;
use crate::operation;
use crate::progress::{data_download_progress, data_upload_progress};
use crate::restore::download::{UploadResult, new_data_download_for_upload};

/// Ferry's data-moving volume snapshotter (plugin kind `VolumeSnapshotterV2`).
#[derive(Debug, Clone)]
pub struct DataMoverSnapshotter {
    ctx: PluginContext,
    backup_action: PvcBackupAction,
}

impl DataMoverSnapshotter {
    /// The snapshotter, working through `ctx`.
    #[must_use]
    pub fn new(ctx: PluginContext) -> Self {
        Self { backup_action: PvcBackupAction::new(ctx.clone()), ctx }
    }

    fn namespace(&self) -> &str {
        &self.ctx.velero_namespace
    }

    async fn claim_of(&self, pv_name: &str) -> Result<PersistentVolumeClaim, DmpError> {
        let pvs: Api<PersistentVolume> = Api::all(self.ctx.client.clone());
        let pv = pvs.get(pv_name).await.map_err(|e| {
            DmpError::kube(
                format!("reading PersistentVolume {pv_name}"),
                "PersistentVolume",
                pv_name,
                e,
            )
        })?;
        let claim = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref());
        let (Some(namespace), Some(name)) =
            (claim.and_then(|c| c.namespace.clone()), claim.and_then(|c| c.name.clone()))
        else {
            return Err(DmpError::MissingField {
                what: format!("PersistentVolume {pv_name}"),
                field: "spec.claimRef",
            });
        };
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), &namespace);
        pvcs.get(&name).await.map_err(|e| {
            DmpError::kube(
                format!("reading PVC {namespace}/{name} bound to {pv_name}"),
                "PersistentVolumeClaim",
                &name,
                e,
            )
        })
    }
}

fn pv_is_csi_with_claim(pv: &Value) -> bool {
    pv.pointer("/spec/csi").is_some_and(Value::is_object)
        && pv.pointer("/spec/claimRef/name").and_then(Value::as_str).is_some_and(|n| !n.is_empty())
}

#[async_trait]
impl VolumeSnapshotter for DataMoverSnapshotter {
    /// Accepts any configuration: the snapshotter is configured through its [`PluginContext`].
    async fn init(&self, config: BTreeMap<String, String>) -> Result<(), PluginError> {
        if !config.is_empty() {
            tracing::debug!(keys = ?config.keys().collect::<Vec<_>>(), "ignoring VolumeSnapshotLocation config");
        }
        Ok(())
    }

    async fn create_volume_from_snapshot(&self, volume: NewVolume) -> Result<String, PluginError> {
        let id = volume.snapshot_id;
        let du: DataUpload = operation::get(&self.ctx.client, self.namespace(), &id).await?;
        let status = du.status.clone().unwrap_or_default();
        if du.phase() != DataUploadPhase::Completed || status.snapshot_id.is_empty() {
            let reason = format!(
                "its DataUpload {} is {}, not Completed with a snapshot",
                du.name_any(),
                du.phase()
            );
            return Err(DmpError::Snapshot { id, reason }.into());
        }
        let pvc_uid = du.labels().get(PVC_UID_LABEL).cloned().unwrap_or_default();
        let operation_id =
            data_download_operation_id(du.uid().as_deref().unwrap_or_default(), &pvc_uid);
        if operation::find::<DataDownload>(&self.ctx.client, self.namespace(), &operation_id)
            .await?
            .is_some()
        {
            return Ok(operation_id);
        }
        let result = UploadResult::of(&du);
        let dd = new_data_download_for_upload(&du, &result, &operation_id);
        let api: Api<DataDownload> = Api::namespaced(self.ctx.client.clone(), self.namespace());
        ferry_kube::create(&api, &dd)
            .await
            .map_err(|e| DmpError::api(format!("creating the DataDownload of snapshot {id}"), e))?;
        Ok(operation_id)
    }

    /// The volume type is the data mover's name; data movement has no IOPS.
    async fn get_volume_info(
        &self,
        _volume_id: &str,
        _az: &str,
    ) -> Result<VolumeInfo, PluginError> {
        Ok(VolumeInfo { volume_type: self.ctx.data_mover.clone(), iops: None })
    }

    async fn create_snapshot(
        &self,
        volume_id: &str,
        _volume_az: &str,
        tags: BTreeMap<String, String>,
    ) -> Result<String, PluginError> {
        let backup_name = tags.get(SNAPSHOT_TAG_BACKUP).ok_or_else(|| {
            PluginError::invalid_input(format!(
                "CreateSnapshot of {volume_id}: no tag {SNAPSHOT_TAG_BACKUP} naming the backup"
            ))
        })?;
        let backups: Api<Backup> = Api::namespaced(self.ctx.client.clone(), self.namespace());
        let backup = backups.get(backup_name).await.map_err(|e| {
            DmpError::kube(
                format!("reading Backup {}/{backup_name}", self.namespace()),
                "Backup",
                backup_name,
                e,
            )
        })?;
        if let Some(reason) = skip_reason(&backup, &self.ctx.data_mover) {
            return Err(PluginError::invalid_input(format!(
                "CreateSnapshot of {volume_id} for backup {backup_name}: {reason}"
            )));
        }
        let pvc = self.claim_of(volume_id).await?;
        let pv = bound_volume(&self.ctx.client, &pvc).await?;
        if pv.spec.as_ref().and_then(|s| s.csi.as_ref()).is_none() {
            return Err(PluginError::invalid_input(format!(
                "PersistentVolume {volume_id} is not a CSI volume"
            )));
        }
        let started = self.backup_action.start_upload(&backup, &pvc).await?;
        Ok(started.operation_id)
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), PluginError> {
        Err(PluginError::unsupported(format!(
            "DeleteSnapshot of {snapshot_id}: repository snapshots are deleted with their backup"
        )))
    }

    async fn get_volume_id(&self, persistent_volume: &JsonObject) -> Result<String, PluginError> {
        if pv_is_csi_with_claim(persistent_volume.value()) {
            Ok(persistent_volume.name().unwrap_or_default().to_owned())
        } else {
            Ok(String::new())
        }
    }

    async fn set_volume_id(
        &self,
        persistent_volume: JsonObject,
        volume_id: &str,
    ) -> Result<Value, PluginError> {
        let pv = persistent_volume.name().unwrap_or_default().to_owned();
        Err(PluginError::unsupported(format!(
            "SetVolumeID of {pv} to {volume_id}: the data mover creates and binds the restored PV itself"
        )))
    }
}

#[async_trait]
impl VolumeSnapshotterV2 for DataMoverSnapshotter {
    async fn progress(&self, snapshot_id: &str) -> Result<OperationProgress, PluginError> {
        if snapshot_id.starts_with(DATA_DOWNLOAD_OPERATION_PREFIX) {
            let dd: DataDownload =
                operation::get(&self.ctx.client, self.namespace(), snapshot_id).await?;
            Ok(data_download_progress(&dd))
        } else {
            let du: DataUpload =
                operation::get(&self.ctx.client, self.namespace(), snapshot_id).await?;
            Ok(data_upload_progress(&du))
        }
    }

    async fn cancel(&self, operation_id: &str) -> Result<(), PluginError> {
        let client = &self.ctx.client;
        if operation_id.starts_with(DATA_DOWNLOAD_OPERATION_PREFIX) {
            Ok(operation::cancel::<DataDownload>(client, self.namespace(), operation_id).await?)
        } else {
            Ok(operation::cancel::<DataUpload>(client, self.namespace(), operation_id).await?)
        }
    }
}
