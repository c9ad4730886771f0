//! The PVC restore item action (`RestoreItemActionV2` on `persistentvolumeclaims`).
//!
//! For a PVC whose data this mover moved at backup (the backup has `snapshotMoveData` and this
//! mover; the PVC in the backup carries `velero.io/data-upload-name`), it does what Velero's CSI
//! plugin does: reads the DataUpload result Velero's own `velero.io/dataupload` restore action
//! left in a ConfigMap (labelled `velero.io/pvc-namespace-name`, `velero.io/restore-uid` and
//! `velero.io/resource-usage: DataUpload`, keyed by the restore's UID), creates the
//! DataDownload, and returns the PVC with `spec.volumeName` reset and the
//! `velero.io/dynamic-pv-restore` selector the mover's restored PV will match.
//!
//! A DataDownload that already carries the operation ID is adopted rather than duplicated.

pub mod download;

use ferry_api::keys::{RESOURCE_USAGE_LABEL, RESTORE_UID_LABEL};
use ferry_api::naming::valid_label_value;
use ferry_api::{Backup, DataDownload, Restore};
use ferry_plugin::{
    JsonObject, OperationProgress, PluginError, ResourceIdentifier, ResourceSelector,
    RestoreItemActionV2, RestoreItemInput, RestoreItemOutputV2, async_trait,
};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::Value;

use self::download::{
    UploadResult, download_operation_id, dynamic_pv_restore_value, new_data_download,
    reset_pvc_for_download, target_namespace,
};
use crate::backup::decode;
use crate::context::PluginContext;
use crate::error::DmpError;
use crate::keys::{
    DATA_UPLOAD_NAME_ANNOTATION, PVC_NAMESPACE_NAME_LABEL, RESOURCE_USAGE_DATA_UPLOAD,
};
use crate::operation;
use crate::progress::data_download_progress;

/// Velero's PVC restore item action for this data mover.
#[derive(Debug, Clone)]
pub struct PvcRestoreAction {
    ctx: PluginContext,
}

impl PvcRestoreAction {
    /// The action, working through `ctx`.
    #[must_use]
    pub fn new(ctx: PluginContext) -> Self {
        Self { ctx }
    }

    async fn pvc_exists(&self, namespace: &str, name: &str) -> Result<bool, DmpError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), namespace);
        api.get_opt(name).await.map(|p| p.is_some()).map_err(|e| {
            DmpError::kube(
                format!("reading PVC {namespace}/{name}"),
                "PersistentVolumeClaim",
                name,
                e,
            )
        })
    }

    async fn backup_of(&self, restore: &Restore) -> Result<Backup, DmpError> {
        let namespace = restore.metadata.namespace.as_deref().unwrap_or(&self.ctx.velero_namespace);
        let name = &restore.spec.backup_name;
        let api: Api<Backup> = Api::namespaced(self.ctx.client.clone(), namespace);
        api.get(name).await.map_err(|e| {
            DmpError::kube(
                format!("reading Backup {namespace}/{name} of the restore"),
                "Backup",
                name,
                e,
            )
        })
    }

    /// The DataUpload result of PVC `namespace/name` (as backed up) for `restore`.
    async fn upload_result(
        &self,
        restore: &Restore,
        namespace: &str,
        name: &str,
    ) -> Result<UploadResult, DmpError> {
        let restore_uid = restore.metadata.uid.clone().unwrap_or_default();
        let restore_name = restore.metadata.name.clone().unwrap_or_default();
        let selector = format!(
            "{PVC_NAMESPACE_NAME_LABEL}={},{RESTORE_UID_LABEL}={},{RESOURCE_USAGE_LABEL}={}",
            valid_label_value(&format!("{namespace}.{name}")),
            valid_label_value(&restore_uid),
            valid_label_value(RESOURCE_USAGE_DATA_UPLOAD),
        );
        let cm_namespace =
            restore.metadata.namespace.as_deref().unwrap_or(&self.ctx.velero_namespace);
        let api: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), cm_namespace);
        let list = api.list(&ListParams::default().labels(&selector)).await.map_err(|e| {
            DmpError::kube(format!("listing ConfigMaps labelled {selector}"), "ConfigMap", "", e)
        })?;
        let failure = |reason: String| DmpError::DataUploadResult {
            pvc: format!("{namespace}/{name}"),
            restore: restore_name.clone(),
            reason,
        };
        let cm = match list.items.as_slice() {
            [cm] => cm,
            [] => return Err(failure(format!("no ConfigMap labelled {selector}"))),
            many => return Err(failure(format!("{} ConfigMaps labelled {selector}", many.len()))),
        };
        let json = cm.data.as_ref().and_then(|d| d.get(&restore_uid)).ok_or_else(|| {
            failure(format!("ConfigMap {} has no key {restore_uid}", cm.name_any()))
        })?;
        serde_json::from_str(json)
            .map_err(|e| failure(format!("ConfigMap {}: key {restore_uid}: {e}", cm.name_any())))
    }
}

#[async_trait]
impl RestoreItemActionV2 for PvcRestoreAction {
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError> {
        Ok(ResourceSelector::resources(["persistentvolumeclaims"]))
    }

    async fn execute(&self, input: RestoreItemInput) -> Result<RestoreItemOutputV2, PluginError> {
        let pvc: PersistentVolumeClaim = decode(&input.item, "item")?;
        let restore: Restore = decode(&input.restore, "restore")?;
        let (namespace, name) = (pvc.namespace().unwrap_or_default(), pvc.name_any());
        let new_namespace = target_namespace(&restore, &namespace);
        if self.pvc_exists(&new_namespace, &name).await? {
            tracing::warn!(pvc = %format!("{new_namespace}/{name}"), "the PVC exists already; not restoring its data");
            return Ok(RestoreItemOutputV2::unchanged());
        }
        if restore.spec.other.get("restorePVs") == Some(&Value::Bool(false)) {
            return Ok(RestoreItemOutputV2::unchanged());
        }
        let backup = self.backup_of(&restore).await?;
        let ours = backup.spec.snapshot_move_data == Some(true)
            && backup.spec.data_mover.as_deref().unwrap_or_default() == self.ctx.data_mover;
        if !ours || input.item_from_backup.annotation(DATA_UPLOAD_NAME_ANNOTATION).is_none() {
            tracing::debug!(pvc = %format!("{namespace}/{name}"), "no data moved by this mover for this PVC");
            return Ok(RestoreItemOutputV2::unchanged());
        }
        let pvc_uid = input.item_from_backup.uid().ok_or_else(|| DmpError::MissingField {
            what: format!("PVC {namespace}/{name} in the backup"),
            field: "metadata.uid",
        })?;
        let operation_id = download_operation_id(&restore, pvc_uid);
        let (item, _) = reset_pvc_for_download(input.item.value(), || {
            dynamic_pv_restore_value(&new_namespace, &name)
        });
        let dd_namespace =
            restore.metadata.namespace.as_deref().unwrap_or(&self.ctx.velero_namespace);
        let client = &self.ctx.client;
        if let Some(dd) =
            operation::find::<DataDownload>(client, dd_namespace, &operation_id).await?
        {
            tracing::info!(%operation_id, download = %dd.name_any(), "adopting the existing DataDownload");
        } else {
            let result = self.upload_result(&restore, &namespace, &name).await?;
            let dd = new_data_download(
                &restore,
                &backup,
                &result,
                &name,
                &new_namespace,
                &operation_id,
            )?;
            let api: Api<DataDownload> = Api::namespaced(client.clone(), dd_namespace);
            let created = ferry_kube::create(&api, &dd).await.map_err(|e| {
                DmpError::api(
                    format!("creating the DataDownload for PVC {new_namespace}/{name}"),
                    e,
                )
            })?;
            tracing::info!(%operation_id, download = %created.name_any(), "DataDownload created");
        }
        Ok(RestoreItemOutputV2 {
            item: Some(item),
            operation_id: Some(operation_id),
            ..RestoreItemOutputV2::default()
        })
    }

    async fn progress(
        &self,
        operation_id: &str,
        restore: &JsonObject,
    ) -> Result<OperationProgress, PluginError> {
        let namespace = restore.namespace().unwrap_or(&self.ctx.velero_namespace);
        let dd: DataDownload = operation::get(&self.ctx.client, namespace, operation_id).await?;
        Ok(data_download_progress(&dd))
    }

    async fn cancel(&self, operation_id: &str, restore: &JsonObject) -> Result<(), PluginError> {
        let namespace = restore.namespace().unwrap_or(&self.ctx.velero_namespace);
        Ok(operation::cancel::<DataDownload>(&self.ctx.client, namespace, operation_id).await?)
    }

    /// Velero's plugin returns no additional items and so answers `true`.
    async fn are_additional_items_ready(
        &self,
        _additional_items: &[ResourceIdentifier],
        _restore: &JsonObject,
    ) -> Result<bool, PluginError> {
        Ok(true)
    }
}
