//! Restore item actions: called by Velero for each item it restores.

use std::time::Duration;

use async_trait::async_trait;
use serde_json::Value;

use crate::errors::PluginError;
use crate::object::JsonObject;
use crate::types::{OperationProgress, ResourceIdentifier, ResourceSelector};

/// What `Execute` receives.
#[derive(Debug, Clone, PartialEq)]
pub struct RestoreItemInput {
    /// The item about to be created, after Velero's own changes (namespace mapping, ...).
    pub item: JsonObject,
    /// The item exactly as stored in the backup.
    pub item_from_backup: JsonObject,
    /// The `velero.io/v1` `Restore`.
    pub restore: JsonObject,
}

/// What a version 1 `Execute` returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RestoreItemOutput {
    /// The item to create; `None` creates the input item unchanged.
    pub item: Option<Value>,
    /// Objects Velero should restore first.
    pub additional_items: Vec<ResourceIdentifier>,
    /// Do not create the item at all.
    pub skip_restore: bool,
}

impl RestoreItemOutput {
    /// Create the item unchanged.
    pub fn unchanged() -> Self {
        Self::default()
    }
}

/// What a version 2 `Execute` returns.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RestoreItemOutputV2 {
    /// The item to create; `None` creates the input item unchanged.
    pub item: Option<Value>,
    /// Objects Velero should restore first.
    pub additional_items: Vec<ResourceIdentifier>,
    /// Do not create the item at all.
    pub skip_restore: bool,
    /// The asynchronous operation started, which Velero then polls with `Progress`; `None`
    /// when the action finished synchronously.
    pub operation_id: Option<String>,
    /// Ask Velero to wait, using `AreAdditionalItemsReady`, until the additional items are
    /// ready before creating this item.
    pub wait_for_additional_items: bool,
    /// How long Velero waits for that; `None` leaves Velero's default.
    pub additional_items_ready_timeout: Option<Duration>,
}

impl RestoreItemOutputV2 {
    /// Create the item unchanged; no operation started.
    pub fn unchanged() -> Self {
        Self::default()
    }
}

impl From<RestoreItemOutput> for RestoreItemOutputV2 {
    fn from(v1: RestoreItemOutput) -> Self {
        Self {
            item: v1.item,
            additional_items: v1.additional_items,
            skip_restore: v1.skip_restore,
            ..Self::default()
        }
    }
}

/// A version 1 restore item action (plugin kind `RestoreItemAction`): synchronous.
#[async_trait]
pub trait RestoreItemAction: Send + Sync + 'static {
    /// The objects this action wants to see.
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError>;

    /// Handles one item.
    async fn execute(&self, input: RestoreItemInput) -> Result<RestoreItemOutput, PluginError>;
}

/// A version 2 restore item action (plugin kind `RestoreItemActionV2`): `execute` may start an
/// asynchronous operation, and may ask Velero to wait until the additional items are ready.
///
/// `progress` and `cancel` must work for any operation ID this action ever returned, also after
/// the plugin process restarted: keep the operation's state outside the process.
#[async_trait]
pub trait RestoreItemActionV2: Send + Sync + 'static {
    /// The objects this action wants to see.
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError>;

    /// Handles one item, possibly starting an operation.
    async fn execute(&self, input: RestoreItemInput) -> Result<RestoreItemOutputV2, PluginError>;

    /// Reports the state of the operation `operation_id`, started for `restore`.
    async fn progress(
        &self,
        operation_id: &str,
        restore: &JsonObject,
    ) -> Result<OperationProgress, PluginError>;

    /// Asks the operation `operation_id` to stop.
    async fn cancel(&self, operation_id: &str, restore: &JsonObject) -> Result<(), PluginError>;

    /// Whether every one of `additional_items` is ready (asked when `execute` set
    /// `wait_for_additional_items`).
    async fn are_additional_items_ready(
        &self,
        additional_items: &[ResourceIdentifier],
        restore: &JsonObject,
    ) -> Result<bool, PluginError>;
}
