//! Serving a version 1 action as version 2.
//!
//! A version 1 action finishes its work inside `execute`, so adapted it never starts an
//! operation: the operation ID is empty, `progress` reports a completed operation and `cancel`
//! does nothing; `are_additional_items_ready` answers `true`. For a volume snapshotter the
//! snapshot ID is the operation ID, and the snapshot was complete when `create_snapshot`
//! returned, so `progress` reports it completed too.
//!
//! (Velero adapts version 1 actions on the host side as well; there its `Progress` returns an
//! "asynchronous operations not supported" error. Velero never calls it, as the operation ID
//! is empty.)

use std::collections::BTreeMap;
use std::sync::Arc;

use async_trait::async_trait;
use serde_json::Value;

use crate::backup::{BackupItemAction, BackupItemActionV2, BackupItemInput, BackupItemOutputV2};
use crate::errors::PluginError;
use crate::object::JsonObject;
use crate::restore::{
    RestoreItemAction, RestoreItemActionV2, RestoreItemInput, RestoreItemOutputV2,
};
use crate::snapshot::{NewVolume, VolumeInfo, VolumeSnapshotter, VolumeSnapshotterV2};
use crate::types::{OperationProgress, ResourceIdentifier, ResourceSelector};

const NOTHING_PENDING: &str = "version 1 action: the work finished within Execute";

fn nothing_pending() -> OperationProgress {
    OperationProgress { description: NOTHING_PENDING.to_owned(), ..OperationProgress::completed() }
}

/// A version 1 [`BackupItemAction`] served as a [`BackupItemActionV2`].
#[derive(Clone)]
pub struct AdaptedBackupItemAction(Arc<dyn BackupItemAction>);

impl AdaptedBackupItemAction {
    /// Wraps `action`.
    pub fn new(action: Arc<dyn BackupItemAction>) -> Self {
        Self(action)
    }
}

impl std::fmt::Debug for AdaptedBackupItemAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdaptedBackupItemAction")
    }
}

#[async_trait]
impl BackupItemActionV2 for AdaptedBackupItemAction {
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError> {
        self.0.applies_to().await
    }

    async fn execute(&self, input: BackupItemInput) -> Result<BackupItemOutputV2, PluginError> {
        Ok(self.0.execute(input).await?.into())
    }

    async fn progress(&self, _: &str, _: &JsonObject) -> Result<OperationProgress, PluginError> {
        Ok(nothing_pending())
    }

    async fn cancel(&self, _: &str, _: &JsonObject) -> Result<(), PluginError> {
        Ok(())
    }
}

/// A version 1 [`RestoreItemAction`] served as a [`RestoreItemActionV2`].
#[derive(Clone)]
pub struct AdaptedRestoreItemAction(Arc<dyn RestoreItemAction>);

impl AdaptedRestoreItemAction {
    /// Wraps `action`.
    pub fn new(action: Arc<dyn RestoreItemAction>) -> Self {
        Self(action)
    }
}

impl std::fmt::Debug for AdaptedRestoreItemAction {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdaptedRestoreItemAction")
    }
}

#[async_trait]
impl RestoreItemActionV2 for AdaptedRestoreItemAction {
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError> {
        self.0.applies_to().await
    }

    async fn execute(&self, input: RestoreItemInput) -> Result<RestoreItemOutputV2, PluginError> {
        Ok(self.0.execute(input).await?.into())
    }

    async fn progress(&self, _: &str, _: &JsonObject) -> Result<OperationProgress, PluginError> {
        Ok(nothing_pending())
    }

    async fn cancel(&self, _: &str, _: &JsonObject) -> Result<(), PluginError> {
        Ok(())
    }

    async fn are_additional_items_ready(
        &self,
        _: &[ResourceIdentifier],
        _: &JsonObject,
    ) -> Result<bool, PluginError> {
        Ok(true)
    }
}

/// A version 1 [`VolumeSnapshotter`] served as a [`VolumeSnapshotterV2`].
#[derive(Clone)]
pub struct AdaptedVolumeSnapshotter(Arc<dyn VolumeSnapshotter>);

impl AdaptedVolumeSnapshotter {
    /// Wraps `snapshotter`.
    pub fn new(snapshotter: Arc<dyn VolumeSnapshotter>) -> Self {
        Self(snapshotter)
    }
}

impl std::fmt::Debug for AdaptedVolumeSnapshotter {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("AdaptedVolumeSnapshotter")
    }
}

#[async_trait]
impl VolumeSnapshotter for AdaptedVolumeSnapshotter {
    async fn init(&self, config: BTreeMap<String, String>) -> Result<(), PluginError> {
        self.0.init(config).await
    }

    async fn create_volume_from_snapshot(&self, volume: NewVolume) -> Result<String, PluginError> {
        self.0.create_volume_from_snapshot(volume).await
    }

    async fn get_volume_info(&self, id: &str, az: &str) -> Result<VolumeInfo, PluginError> {
        self.0.get_volume_info(id, az).await
    }

    async fn create_snapshot(
        &self,
        volume_id: &str,
        volume_az: &str,
        tags: BTreeMap<String, String>,
    ) -> Result<String, PluginError> {
        self.0.create_snapshot(volume_id, volume_az, tags).await
    }

    async fn delete_snapshot(&self, snapshot_id: &str) -> Result<(), PluginError> {
        self.0.delete_snapshot(snapshot_id).await
    }

    async fn get_volume_id(&self, pv: &JsonObject) -> Result<String, PluginError> {
        self.0.get_volume_id(pv).await
    }

    async fn set_volume_id(&self, pv: JsonObject, volume_id: &str) -> Result<Value, PluginError> {
        self.0.set_volume_id(pv, volume_id).await
    }
}

#[async_trait]
impl VolumeSnapshotterV2 for AdaptedVolumeSnapshotter {
    async fn progress(&self, _: &str) -> Result<OperationProgress, PluginError> {
        Ok(nothing_pending())
    }

    async fn cancel(&self, _: &str) -> Result<(), PluginError> {
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use crate::backup::BackupItemOutput;
    use crate::restore::RestoreItemOutput;
    use serde_json::json;

    struct V1;

    #[async_trait]
    impl BackupItemAction for V1 {
        async fn applies_to(&self) -> Result<ResourceSelector, PluginError> {
            Ok(ResourceSelector::resources(["pods"]))
        }
        async fn execute(&self, input: BackupItemInput) -> Result<BackupItemOutput, PluginError> {
            Ok(BackupItemOutput {
                item: Some(json!({"seen": input.item.name()})),
                additional_items: vec![ResourceIdentifier::cluster_scoped("", "nodes", "n1")],
            })
        }
    }

    #[async_trait]
    impl RestoreItemAction for V1 {
        async fn applies_to(&self) -> Result<ResourceSelector, PluginError> {
            Err(PluginError::failed("no selector"))
        }
        async fn execute(&self, _: RestoreItemInput) -> Result<RestoreItemOutput, PluginError> {
            Ok(RestoreItemOutput { skip_restore: true, ..RestoreItemOutput::unchanged() })
        }
    }

    fn obj(name: &str) -> JsonObject {
        JsonObject::from_value(json!({"metadata": {"name": name}})).unwrap()
    }

    #[tokio::test]
    async fn backup_adapter_delegates_and_starts_no_operation() {
        let a = AdaptedBackupItemAction::new(Arc::new(V1));
        assert_eq!(a.applies_to().await.unwrap().included_resources, ["pods"]);
        let out = a.execute(BackupItemInput { item: obj("p"), backup: obj("b") }).await.unwrap();
        assert_eq!(out.item, Some(json!({"seen": "p"})));
        assert_eq!(out.additional_items.len(), 1);
        assert_eq!(out.operation_id, None);
        assert!(out.post_operation_items.is_empty());
        let progress = a.progress("", &obj("b")).await.unwrap();
        assert!(progress.completed && progress.error.is_none());
        a.cancel("", &obj("b")).await.unwrap();
    }

    #[tokio::test]
    async fn restore_adapter_delegates_errors_and_reports_items_ready() {
        let a = AdaptedRestoreItemAction::new(Arc::new(V1));
        assert!(a.applies_to().await.unwrap_err().to_string().contains("no selector"));
        let input =
            RestoreItemInput { item: obj("i"), item_from_backup: obj("i"), restore: obj("r") };
        let out = a.execute(input).await.unwrap();
        assert!(out.skip_restore);
        assert_eq!(out.operation_id, None);
        assert!(!out.wait_for_additional_items);
        assert!(a.are_additional_items_ready(&[], &obj("r")).await.unwrap());
        assert!(a.progress("x", &obj("r")).await.unwrap().completed);
    }
}
