//! The DataUpload delete item action (`DeleteItemAction` on `datauploads.velero.io`).
//!
//! When a backup is deleted, Velero runs delete item actions over the items stored in it,
//! DataUploads included (they are stored with their final status). Velero's own
//! `velero.io/dataupload-delete` action records, for DataUploads of its built-in mover only, the
//! repository snapshot to forget in a ConfigMap `<dataupload>-info` that Velero's backup
//! deletion controller consumes and then deletes. This action does the same for this mover's
//! DataUploads, with Ferry's own label so that Velero's controller leaves the ConfigMap alone:
//! `<dataupload>-ferry-info` in Velero's namespace, labelled `velero.io/backup-name` and
//! `ferry.io/data-upload-snapshot-info: "true"`, holding `backupStorageLocation`,
//! `volumeNamespace`, `snapshotID`, `sourcePVC` and `datamover`. The record outlives the Backup
//! and the DeleteBackupRequest, so the deletion survives restarts; the agents act on it
//! (`ferry-mover`'s `deletion.rs`: forget the snapshot in the repository, collect garbage, then
//! delete the ConfigMap; end to end in `crates/ferry/tests/e2e/deletion.rs`).

use std::collections::BTreeMap;

use ferry_api::keys::BACKUP_NAME_LABEL;
use ferry_api::naming::valid_label_value;
use ferry_api::{Backup, DataUpload};
use ferry_kube::ApiError;
use ferry_plugin::{DeleteItemAction, DeleteItemInput, PluginError, ResourceSelector, async_trait};
use k8s_openapi::api::core::v1::ConfigMap;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::ResourceExt;
use kube::api::Api;

use crate::backup::decode;
use crate::context::PluginContext;
use crate::error::DmpError;
use crate::keys::FERRY_SNAPSHOT_INFO_LABEL;

/// Records the repository snapshot of each of this mover's DataUploads in a deleted backup.
#[derive(Debug, Clone)]
pub struct DataUploadDeleteAction {
    ctx: PluginContext,
}

impl DataUploadDeleteAction {
    /// The action, working through `ctx`.
    #[must_use]
    pub fn new(ctx: PluginContext) -> Self {
        Self { ctx }
    }
}

/// The ConfigMap recording `du`'s repository snapshot for the deletion of `backup`, or `None`
/// when the DataUpload is another mover's or never produced a snapshot.
#[must_use]
pub fn snapshot_info_config_map(
    backup: &Backup,
    du: &DataUpload,
    data_mover: &str,
) -> Option<ConfigMap> {
    let snapshot_id = du.status.as_ref().map(|s| s.snapshot_id.clone()).unwrap_or_default();
    if du.spec.data_mover != data_mover || snapshot_id.is_empty() {
        return None;
    }
    let backup_name = backup.metadata.name.clone().unwrap_or_default();
    let data = BTreeMap::from([
        (
            "backupStorageLocation".to_owned(),
            backup.spec.storage_location.clone().unwrap_or_default(),
        ),
        ("volumeNamespace".to_owned(), du.spec.source_namespace.clone()),
        ("snapshotID".to_owned(), snapshot_id),
        ("sourcePVC".to_owned(), du.spec.source_pvc.clone()),
        ("datamover".to_owned(), du.spec.data_mover.clone()),
    ]);
    Some(ConfigMap {
        metadata: ObjectMeta {
            name: Some(format!("{}-ferry-info", du.name_any())),
            namespace: backup.metadata.namespace.clone(),
            labels: Some(BTreeMap::from([
                (BACKUP_NAME_LABEL.to_owned(), valid_label_value(&backup_name)),
                (FERRY_SNAPSHOT_INFO_LABEL.to_owned(), "true".to_owned()),
            ])),
            ..ObjectMeta::default()
        },
        data: Some(data),
        ..ConfigMap::default()
    })
}

#[async_trait]
impl DeleteItemAction for DataUploadDeleteAction {
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError> {
        Ok(ResourceSelector::resources(["datauploads.velero.io"]))
    }

    async fn execute(&self, input: DeleteItemInput) -> Result<(), PluginError> {
        let du: DataUpload = decode(&input.item, "item")?;
        let backup: Backup = decode(&input.backup, "backup")?;
        let Some(cm) = snapshot_info_config_map(&backup, &du, &self.ctx.data_mover) else {
            return Ok(());
        };
        let namespace =
            cm.metadata.namespace.clone().unwrap_or_else(|| self.ctx.velero_namespace.clone());
        let api: Api<ConfigMap> = Api::namespaced(self.ctx.client.clone(), &namespace);
        match ferry_kube::create(&api, &cm).await {
            Ok(_) | Err(ApiError::AlreadyExists { .. }) => {
                tracing::info!(upload = %du.name_any(), config_map = %cm.name_any(), "recorded the snapshot to delete");
                Ok(())
            }
            Err(e) => Err(DmpError::api(
                format!("recording the snapshot of DataUpload {} for deletion", du.name_any()),
                e,
            )
            .into()),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use serde_json::json;

    use super::*;

    fn du(mover: &str, snapshot: &str) -> DataUpload {
        serde_json::from_value(json!({
            "apiVersion": "velero.io/v2alpha1", "kind": "DataUpload",
            "metadata": {"name": "nightly-x1", "namespace": "velero"},
            "spec": {"snapshotType": "CSI", "sourcePVC": "data", "datamover": mover,
                     "backupStorageLocation": "primary", "sourceNamespace": "apps",
                     "operationTimeout": "10m0s"},
            "status": {"phase": "Completed", "snapshotID": snapshot, "progress": {}},
        }))
        .unwrap()
    }

    #[test]
    fn records_only_this_movers_finished_uploads() {
        let backup: Backup = serde_json::from_value(json!({
            "metadata": {"name": "nightly", "namespace": "velero"},
            "spec": {"storageLocation": "primary"},
        }))
        .unwrap();
        assert!(snapshot_info_config_map(&backup, &du("velero", "s1"), "ferry").is_none());
        assert!(snapshot_info_config_map(&backup, &du("ferry", ""), "ferry").is_none());
        let cm = snapshot_info_config_map(&backup, &du("ferry", "s1"), "ferry").unwrap();
        assert_eq!(
            serde_json::to_value(&cm).unwrap(),
            json!({"apiVersion": "v1", "kind": "ConfigMap",
                   "metadata": {"name": "nightly-x1-ferry-info", "namespace": "velero",
                       "labels": {"velero.io/backup-name": "nightly",
                                  "ferry.io/data-upload-snapshot-info": "true"}},
                   "data": {"backupStorageLocation": "primary", "volumeNamespace": "apps",
                            "snapshotID": "s1", "sourcePVC": "data", "datamover": "ferry"}})
        );
    }
}
