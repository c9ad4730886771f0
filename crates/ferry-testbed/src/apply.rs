//! Server-side apply of YAML documents of any kind, as `kubectl apply --server-side` does.

use anyhow::Context;
use kube::api::{Api, DynamicObject, Patch, PatchParams};
use kube::discovery::{self, Scope};
use serde::Deserialize;

/// Applies every document of `yaml` (separated by `---`; empty documents skipped), in order.
///
/// # Errors
/// A document is not a Kubernetes object, its kind is not served, or the API server refused it.
pub async fn apply_yaml(client: &kube::Client, yaml: &str) -> anyhow::Result<()> {
    for doc in serde_yaml::Deserializer::from_str(yaml) {
        let value = serde_json::Value::deserialize(doc).context("parsing a YAML document")?;
        if value.is_null() {
            continue;
        }
        let object: DynamicObject =
            serde_json::from_value(value).context("not a Kubernetes object")?;
        apply_object(client, object).await?;
    }
    Ok(())
}

/// Applies one object (field manager `ferry-testbed`, conflicts forced).
///
/// # Errors
/// Its kind is not served, or the API server refused it.
pub async fn apply_object(client: &kube::Client, object: DynamicObject) -> anyhow::Result<()> {
    let types = object.types.clone().context("an object without apiVersion and kind")?;
    let gvk = kube::api::GroupVersionKind::try_from(&types)?;
    let name = object.metadata.name.clone().context("an object without a name")?;
    let (resource, caps) = discovery::pinned_kind(client, &gvk)
        .await
        .with_context(|| format!("{} {name}: kind not served", types.kind))?;
    let api: Api<DynamicObject> = match (caps.scope, object.metadata.namespace.as_deref()) {
        (Scope::Cluster, _) => Api::all_with(client.clone(), &resource),
        (Scope::Namespaced, Some(ns)) => Api::namespaced_with(client.clone(), ns, &resource),
        (Scope::Namespaced, None) => Api::default_namespaced_with(client.clone(), &resource),
    };
    api.patch(&name, &PatchParams::apply("ferry-testbed").force(), &Patch::Apply(&object))
        .await
        .with_context(|| format!("applying {} {name}", types.kind))?;
    Ok(())
}
