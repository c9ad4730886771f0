//! Velero's BackupItemAction v2 and RestoreItemAction v2 called over gRPC, as Velero's server
//! calls them: every request names the plugin and carries the Backup or Restore as JSON.

use async_trait::async_trait;
use ferry_plugin::OperationProgress;
use ferry_proto::generated::ResourceIdentifier;
use ferry_proto::v2;
use ferry_proto::v2::backup_item_action_client::BackupItemActionClient;
use ferry_proto::v2::restore_item_action_client::RestoreItemActionClient;
use tonic::transport::Channel;

use crate::monitor::OperationActions;

/// What an Execute returned.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Executed {
    /// The item as the action changed it (JSON).
    pub item: Vec<u8>,
    /// Items to process too.
    pub additional_items: Vec<ResourceIdentifier>,
    /// Empty when the action finished at once; otherwise the operation to poll.
    pub operation_id: String,
    /// Backup only: items to back up again once the operation completes.
    pub post_operation_items: Vec<ResourceIdentifier>,
    /// Restore only: the item itself is not to be restored.
    pub skip_restore: bool,
}

/// Velero's wording for a failed call: the plugin's message (its status detail carries the
/// plugin's stack in Velero).
fn message(status: &tonic::Status) -> String {
    format!("{}: {}", status.code(), status.message())
}

/// The backup item actions of one plugin process, for one Backup.
#[derive(Debug, Clone)]
pub struct BackupActions {
    client: BackupItemActionClient<Channel>,
    backup: Vec<u8>,
}

impl BackupActions {
    /// Actions reached over `channel`, for the Backup whose JSON is `backup`.
    #[must_use]
    pub fn new(channel: Channel, backup: Vec<u8>) -> Self {
        Self { client: BackupItemActionClient::new(channel), backup }
    }

    /// Runs `plugin` on `item` (JSON).
    ///
    /// # Errors
    /// The plugin's error.
    pub async fn execute(&self, plugin: &str, item: Vec<u8>) -> Result<Executed, tonic::Status> {
        let reply = self
            .client
            .clone()
            .execute(v2::ExecuteRequest {
                plugin: plugin.into(),
                item,
                backup: self.backup.clone(),
            })
            .await?
            .into_inner();
        Ok(Executed {
            item: reply.item,
            additional_items: reply.additional_items,
            operation_id: reply.operation_id,
            post_operation_items: reply.post_operation_items,
            skip_restore: false,
        })
    }
}

#[async_trait]
impl OperationActions for BackupActions {
    async fn progress(&self, action: &str, id: &str) -> Result<OperationProgress, String> {
        let request = v2::BackupItemActionProgressRequest {
            plugin: action.into(),
            operation_id: id.into(),
            backup: self.backup.clone(),
        };
        let reply = self.client.clone().progress(request).await.map_err(|s| message(&s))?;
        Ok(reply.into_inner().progress.unwrap_or_default().into())
    }

    async fn cancel(&self, action: &str, id: &str) -> Result<(), String> {
        let request = v2::BackupItemActionCancelRequest {
            plugin: action.into(),
            operation_id: id.into(),
            backup: self.backup.clone(),
        };
        self.client.clone().cancel(request).await.map(drop).map_err(|s| message(&s))
    }
}

/// The restore item actions of one plugin process, for one Restore.
#[derive(Debug, Clone)]
pub struct RestoreActions {
    client: RestoreItemActionClient<Channel>,
    restore: Vec<u8>,
}

impl RestoreActions {
    /// Actions reached over `channel`, for the Restore whose JSON is `restore`.
    #[must_use]
    pub fn new(channel: Channel, restore: Vec<u8>) -> Self {
        Self { client: RestoreItemActionClient::new(channel), restore }
    }

    /// Runs `plugin` on `item` (as it will be restored) and `item_from_backup` (as stored).
    ///
    /// # Errors
    /// The plugin's error.
    pub async fn execute(
        &self,
        plugin: &str,
        item: Vec<u8>,
        item_from_backup: Vec<u8>,
    ) -> Result<Executed, tonic::Status> {
        let request = v2::RestoreItemActionExecuteRequest {
            plugin: plugin.into(),
            item,
            restore: self.restore.clone(),
            item_from_backup,
        };
        let reply = self.client.clone().execute(request).await?.into_inner();
        Ok(Executed {
            item: reply.item,
            additional_items: reply.additional_items,
            operation_id: reply.operation_id,
            post_operation_items: Vec::new(),
            skip_restore: reply.skip_restore,
        })
    }

    /// Whether the additional items the action named are ready.
    ///
    /// # Errors
    /// The plugin's error.
    pub async fn additional_items_ready(
        &self,
        plugin: &str,
        items: Vec<ResourceIdentifier>,
    ) -> Result<bool, tonic::Status> {
        let request = v2::RestoreItemActionItemsReadyRequest {
            plugin: plugin.into(),
            restore: self.restore.clone(),
            additional_items: items,
        };
        Ok(self.client.clone().are_additional_items_ready(request).await?.into_inner().ready)
    }
}

#[async_trait]
impl OperationActions for RestoreActions {
    async fn progress(&self, action: &str, id: &str) -> Result<OperationProgress, String> {
        let request = v2::RestoreItemActionProgressRequest {
            plugin: action.into(),
            operation_id: id.into(),
            restore: self.restore.clone(),
        };
        let reply = self.client.clone().progress(request).await.map_err(|s| message(&s))?;
        Ok(reply.into_inner().progress.unwrap_or_default().into())
    }

    async fn cancel(&self, action: &str, id: &str) -> Result<(), String> {
        let request = v2::RestoreItemActionCancelRequest {
            plugin: action.into(),
            operation_id: id.into(),
            restore: self.restore.clone(),
        };
        self.client.clone().cancel(request).await.map(drop).map_err(|s| message(&s))
    }
}
