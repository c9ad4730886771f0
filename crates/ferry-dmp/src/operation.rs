//! Finding the DataUpload or DataDownload behind an operation ID, and cancelling it.
//!
//! Velero's plugin keeps no memory of its operations: the CR it created carries the operation
//! ID in the label `velero.io/async-operation-id`, and every later call lists CRs by that label
//! in Velero's namespace. So does this plugin, which is why `Progress` answers the same after a
//! restart of the plugin process.

use std::fmt::Debug;

use ferry_api::keys::ASYNC_OPERATION_ID_LABEL;
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::core::NamespaceResourceScope;
use kube::{Resource, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::error::DmpError;

/// The CR kind's name, for messages.
fn kind_of<K: Resource<DynamicType = ()>>() -> &'static str {
    match K::kind(&()) {
        std::borrow::Cow::Borrowed(kind) => kind,
        std::borrow::Cow::Owned(_) => "object",
    }
}

/// The one CR of kind `K` in `namespace` labelled with `operation_id`, if any.
///
/// # Errors
/// [`DmpError::InvalidOperationId`] for an empty ID, [`DmpError::Api`] when listing fails,
/// [`DmpError::AmbiguousOperation`] when several CRs carry the ID.
pub(crate) async fn find<K>(
    client: &kube::Client,
    namespace: &str,
    operation_id: &str,
) -> Result<Option<K>, DmpError>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned,
{
    if operation_id.is_empty() {
        return Err(DmpError::InvalidOperationId { id: operation_id.to_owned() });
    }
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let selector = format!("{ASYNC_OPERATION_ID_LABEL}={operation_id}");
    let list = api.list(&ListParams::default().labels(&selector)).await.map_err(|e| {
        DmpError::kube(
            format!("listing {}s labelled {selector} in namespace {namespace}", kind_of::<K>()),
            kind_of::<K>(),
            operation_id,
            e,
        )
    })?;
    let mut items = list.items;
    match items.len() {
        0 | 1 => Ok(items.pop()),
        count => Err(DmpError::AmbiguousOperation {
            kind: kind_of::<K>(),
            namespace: namespace.to_owned(),
            id: operation_id.to_owned(),
            count,
        }),
    }
}

/// Like [`find`], but a missing CR is [`DmpError::OperationNotFound`].
///
/// # Errors
/// As [`find`], and [`DmpError::OperationNotFound`].
pub(crate) async fn get<K>(
    client: &kube::Client,
    namespace: &str,
    operation_id: &str,
) -> Result<K, DmpError>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned,
{
    find(client, namespace, operation_id).await?.ok_or_else(|| DmpError::OperationNotFound {
        kind: kind_of::<K>(),
        namespace: namespace.to_owned(),
        id: operation_id.to_owned(),
    })
}

/// Asks the mover to stop the operation: sets `spec.cancel: true` on its CR with a JSON merge
/// patch, as Velero does, and returns without waiting.
///
/// # Errors
/// As [`get`], and [`DmpError::Api`] when the patch fails.
pub(crate) async fn cancel<K>(
    client: &kube::Client,
    namespace: &str,
    operation_id: &str,
) -> Result<(), DmpError>
where
    K: Resource<DynamicType = (), Scope = NamespaceResourceScope>
        + Clone
        + Debug
        + DeserializeOwned,
{
    let cr: K = get(client, namespace, operation_id).await?;
    let name = cr.name_any();
    let api: Api<K> = Api::namespaced(client.clone(), namespace);
    let patch = Patch::Merge(json!({"spec": {"cancel": true}}));
    api.patch(&name, &PatchParams::default(), &patch).await.map_err(|e| {
        DmpError::kube(
            format!("setting spec.cancel on {} {namespace}/{name}", kind_of::<K>()),
            kind_of::<K>(),
            &name,
            e,
        )
    })?;
    tracing::info!(kind = kind_of::<K>(), %namespace, %name, %operation_id, "cancel requested");
    Ok(())
}
