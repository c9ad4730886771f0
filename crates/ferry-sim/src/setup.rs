//! The cluster objects a simulator registers at start and removes at shutdown: its nodes, its
//! CSIDriver, two StorageClasses and a VolumeSnapshotClass.

use ferry_api::VolumeSnapshotClass;
use k8s_openapi::api::core::v1::{Node, PersistentVolume};
use k8s_openapi::api::storage::v1::{CSIDriver, StorageClass};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::core::Resource;
use serde::Serialize;
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::SimError;
use crate::error::{is_already_exists, is_not_found};
use crate::reconcile::node_labels;
use crate::sim::{Binding, Ctx};

/// Creates the simulator's objects (replacing leftovers of an earlier run with the same id).
pub(crate) async fn register(ctx: &Ctx) -> Result<(), SimError> {
    let client = &ctx.client;
    let n = &ctx.names;
    let driver: CSIDriver = serde_json::from_value(json!({
        "metadata": { "name": n.driver },
        "spec": { "attachRequired": false, "podInfoOnMount": false,
                  "volumeLifecycleModes": ["Persistent"] }
    }))
    .map_err(|e| invalid("CSIDriver", &e))?;
    create_or_keep(&Api::<CSIDriver>::all(client.clone()), &driver, "CSIDriver").await?;
    for (name, binding) in
        [(&n.immediate, Binding::Immediate), (&n.wffc, Binding::WaitForFirstConsumer)]
    {
        let class = storage_class(name, &n.driver, binding, "Delete")?;
        create_or_keep(&Api::<StorageClass>::all(client.clone()), &class, "StorageClass").await?;
    }
    let snap_class = VolumeSnapshotClass::new(&n.snapshot_class, &n.driver, "Delete");
    create_or_keep(
        &Api::<VolumeSnapshotClass>::all(client.clone()),
        &snap_class,
        "VolumeSnapshotClass",
    )
    .await?;
    let nodes: Api<Node> = Api::all(client.clone());
    for node in &ctx.nodes {
        let labels = node_labels(ctx, node);
        let obj: Node = serde_json::from_value(json!({
            "metadata": { "name": node.name, "labels": labels },
            "spec": {}
        }))
        .map_err(|e| invalid("Node", &e))?;
        create_or_keep(&nodes, &obj, "Node").await?;
        let status = json!({ "status": node_status(&node.name) });
        nodes
            .patch_status(&node.name, &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(|e| SimError::api("patching status of", "Node", &node.name, e))?;
    }
    Ok(())
}

/// Creates a StorageClass of this simulator's driver with any reclaim policy, e.g. `Retain`.
pub(crate) fn storage_class(
    name: &str,
    driver: &str,
    binding: Binding,
    reclaim: &str,
) -> Result<StorageClass, SimError> {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "provisioner": driver,
        "reclaimPolicy": reclaim,
        "volumeBindingMode": binding.as_str(),
        "allowVolumeExpansion": true
    }))
    .map_err(|e| invalid("StorageClass", &e))
}

/// Deletes the simulator's objects and its PVs.
pub(crate) async fn unregister(ctx: &Ctx) -> Result<(), SimError> {
    let client = &ctx.client;
    let n = &ctx.names;
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    let list = pvs
        .list(&ListParams::default())
        .await
        .map_err(|e| SimError::api("listing", "PersistentVolume", "*", e))?;
    for pv in list.items.iter().filter(|pv| crate::reconcile::pv_driver(pv) == Some(&n.driver)) {
        delete(&pvs, pv.metadata.name.as_deref().unwrap_or_default(), "PersistentVolume").await?;
    }
    let nodes: Api<Node> = Api::all(client.clone());
    for node in &ctx.nodes {
        delete(&nodes, &node.name, "Node").await?;
    }
    let classes: Api<StorageClass> = Api::all(client.clone());
    let list = classes
        .list(&ListParams::default())
        .await
        .map_err(|e| SimError::api("listing", "StorageClass", "*", e))?;
    for class in list.items.iter().filter(|c| c.provisioner == n.driver) {
        delete(&classes, class.metadata.name.as_deref().unwrap_or_default(), "StorageClass")
            .await?;
    }
    delete(
        &Api::<VolumeSnapshotClass>::all(client.clone()),
        &n.snapshot_class,
        "VolumeSnapshotClass",
    )
    .await?;
    delete(&Api::<CSIDriver>::all(client.clone()), &n.driver, "CSIDriver").await
}

fn node_status(name: &str) -> serde_json::Value {
    let now = k8s_openapi::jiff::Timestamp::now().to_string();
    let cond = |kind: &str, status: &str, reason: &str| {
        json!({ "type": kind, "status": status, "reason": reason, "message": "simulated by ferry-sim",
                "lastHeartbeatTime": now, "lastTransitionTime": now })
    };
    json!({
        "conditions": [
            cond("Ready", "True", "KubeletReady"),
            cond("MemoryPressure", "False", "KubeletHasSufficientMemory"),
            cond("DiskPressure", "False", "KubeletHasNoDiskPressure"),
            cond("PIDPressure", "False", "KubeletHasSufficientPID"),
        ],
        "addresses": [ { "type": "InternalIP", "address": "127.0.0.1" },
                       { "type": "Hostname", "address": name } ],
        "capacity": { "cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi" },
        "allocatable": { "cpu": "8", "memory": "32Gi", "pods": "110", "ephemeral-storage": "100Gi" },
        "nodeInfo": {
            "machineID": name, "systemUUID": name, "bootID": name,
            "kernelVersion": "simulated", "osImage": "ferry-sim",
            "containerRuntimeVersion": "sim://1.0", "kubeletVersion": "v1.36.2",
            "kubeProxyVersion": "", "operatingSystem": "linux", "architecture": "amd64"
        }
    })
}

pub(crate) async fn create_or_keep<K>(
    api: &Api<K>,
    obj: &K,
    kind: &'static str,
) -> Result<(), SimError>
where
    K: Resource + Clone + std::fmt::Debug + Serialize + DeserializeOwned,
{
    let name = obj.meta().name.clone().unwrap_or_default();
    match api.create(&PostParams::default(), obj).await {
        Ok(_) => Ok(()),
        Err(e) if is_already_exists(&e) => Ok(()),
        Err(e) => Err(SimError::api("creating", kind, name, e)),
    }
}

pub(crate) async fn delete<K>(api: &Api<K>, name: &str, kind: &'static str) -> Result<(), SimError>
where
    K: Resource + Clone + std::fmt::Debug + DeserializeOwned,
{
    match api.delete(name, &DeleteParams::default()).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(e) => Err(SimError::api("deleting", kind, name, e)),
    }
}

fn invalid(kind: &str, e: &serde_json::Error) -> SimError {
    SimError::Invalid { what: format!("built-in {kind} object"), reason: e.to_string() }
}
