//! Delete item actions: called by Velero for each backed-up item when a backup is deleted.

use async_trait::async_trait;

use crate::errors::PluginError;
use crate::object::JsonObject;
use crate::types::ResourceSelector;

/// What `Execute` receives: an item from the backup being deleted, and the `Backup`.
#[derive(Debug, Clone, PartialEq)]
pub struct DeleteItemInput {
    /// The item as stored in the backup.
    pub item: JsonObject,
    /// The `velero.io/v1` `Backup` being deleted.
    pub backup: JsonObject,
}

/// A delete item action (plugin kind `DeleteItemAction`).
#[async_trait]
pub trait DeleteItemAction: Send + Sync + 'static {
    /// The objects this action wants to see.
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError>;

    /// Cleans up after one item of the deleted backup.
    async fn execute(&self, input: DeleteItemInput) -> Result<(), PluginError>;
}
