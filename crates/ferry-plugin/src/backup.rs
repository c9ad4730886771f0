//! Backup item actions: called by Velero for each item it backs up.

use async_trait::async_trait;
use serde_json::Value;

use crate::errors::PluginError;
use crate::object::JsonObject;
use crate::types::{OperationProgress, ResourceIdentifier, ResourceSelector};

/// What `Execute` receives: the item being backed up and the `Backup` it belongs to.
#[derive(Debug, Clone, PartialEq)]
pub struct BackupItemInput {
    /// The item, as Velero read it from the API server.
    pub item: JsonObject,
    /// The `velero.io/v1` `Backup`.
    pub backup: JsonObject,
}

/// What a version 1 `Execute` returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackupItemOutput {
    /// The item to store in the backup; `None` stores the item unchanged.
    pub item: Option<Value>,
    /// Further objects Velero should back up.
    pub additional_items: Vec<ResourceIdentifier>,
}

impl BackupItemOutput {
    /// Store the item unchanged; nothing else to back up.
    pub fn unchanged() -> Self {
        Self::default()
    }

    /// Store `item` instead of the original.
    pub fn item(item: Value) -> Self {
        Self { item: Some(item), ..Self::default() }
    }
}

/// What a version 2 `Execute` returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct BackupItemOutputV2 {
    /// The item to store in the backup; `None` stores the item unchanged.
    pub item: Option<Value>,
    /// Further objects Velero should back up.
    pub additional_items: Vec<ResourceIdentifier>,
    /// The asynchronous operation started, which Velero then polls with `Progress`; `None`
    /// when the action finished synchronously.
    pub operation_id: Option<String>,
    /// Objects Velero backs up again once the operation has completed.
    pub post_operation_items: Vec<ResourceIdentifier>,
}

impl BackupItemOutputV2 {
    /// Store the item unchanged; no operation started.
    pub fn unchanged() -> Self {
        Self::default()
    }
}

impl From<BackupItemOutput> for BackupItemOutputV2 {
    fn from(v1: BackupItemOutput) -> Self {
        Self { item: v1.item, additional_items: v1.additional_items, ..Self::default() }
    }
}

/// A version 1 backup item action (plugin kind `BackupItemAction`): synchronous.
#[async_trait]
pub trait BackupItemAction: Send + Sync + 'static {
    /// The objects this action wants to see.
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError>;

    /// Handles one item.
    async fn execute(&self, input: BackupItemInput) -> Result<BackupItemOutput, PluginError>;
}

/// A version 2 backup item action (plugin kind `BackupItemActionV2`): `execute` may start an
/// asynchronous operation that Velero polls with `progress` and may stop with `cancel`.
///
/// `progress` and `cancel` must work for any operation ID this action ever returned, also after
/// the plugin process restarted: keep the operation's state outside the process.
#[async_trait]
pub trait BackupItemActionV2: Send + Sync + 'static {
    /// The objects this action wants to see.
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError>;

    /// Handles one item, possibly starting an operation.
    async fn execute(&self, input: BackupItemInput) -> Result<BackupItemOutputV2, PluginError>;

    /// Reports the state of the operation `operation_id`, started for `backup`.
    async fn progress(
        &self,
        operation_id: &str,
        backup: &JsonObject,
    ) -> Result<OperationProgress, PluginError>;

    /// Asks the operation `operation_id` to stop.
    async fn cancel(&self, operation_id: &str, backup: &JsonObject) -> Result<(), PluginError>;
}
