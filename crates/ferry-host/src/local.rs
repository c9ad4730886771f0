//! Item actions run in the host's own process (no plugin binary), for hosts that embed a
//! plugin, such as `ferry volume`: the same monitor drives them.

use async_trait::async_trait;
use ferry_plugin::{BackupItemActionV2, JsonObject, OperationProgress, RestoreItemActionV2};

use crate::monitor::OperationActions;

/// A BackupItemAction v2 in this process, for one Backup.
#[derive(Debug)]
pub struct LocalBackupActions<A> {
    /// The action (every operation is asked of it, whatever action name it was recorded under).
    pub action: A,
    /// The Backup.
    pub backup: JsonObject,
}

#[async_trait]
impl<A: BackupItemActionV2> OperationActions for LocalBackupActions<A> {
    async fn progress(&self, _: &str, id: &str) -> Result<OperationProgress, String> {
        self.action.progress(id, &self.backup).await.map_err(|e| e.to_string())
    }

    async fn cancel(&self, _: &str, id: &str) -> Result<(), String> {
        self.action.cancel(id, &self.backup).await.map_err(|e| e.to_string())
    }
}

/// A RestoreItemAction v2 in this process, for one Restore.
#[derive(Debug)]
pub struct LocalRestoreActions<A> {
    /// The action.
    pub action: A,
    /// The Restore.
    pub restore: JsonObject,
}

#[async_trait]
impl<A: RestoreItemActionV2> OperationActions for LocalRestoreActions<A> {
    async fn progress(&self, _: &str, id: &str) -> Result<OperationProgress, String> {
        self.action.progress(id, &self.restore).await.map_err(|e| e.to_string())
    }

    async fn cancel(&self, _: &str, id: &str) -> Result<(), String> {
        self.action.cancel(id, &self.restore).await.map_err(|e| e.to_string())
    }
}
