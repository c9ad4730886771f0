//! Where a volume can live: storage classes that bind once a pod is scheduled, and the
//! topology a backup's volume inherits from its source.
//!
//! A snapshot of a volume that only some nodes reach (a node-local driver such as the CSI
//! hostpath driver, TopoLVM or ZFS LocalPV: the PV's required node affinity names them) can
//! usually be restored only where its source lives. When the backup PVC's class waits for the
//! first consumer, the holding pod's placement decides where the backup volume is provisioned,
//! so the pod requires the source PV's node affinity: the scheduler then picks a node that can
//! provision it, instead of one whose provisioner fails for good (`snapshot ... does not exist`)
//! while the pod stays Pending. With an Immediate class the provisioner has already chosen and
//! the pod follows the backup PV's own affinity, so nothing is added.

use ferry_api::k8s_openapi::api::core::v1::{
    NodeSelectorTerm, PersistentVolume, PersistentVolumeClaim,
};
use ferry_api::k8s_openapi::api::storage::v1::StorageClass;
use kube::{Api, Client};

use crate::ExposeError;
use crate::ops::get_opt;

/// Whether storage class `class` binds volumes only once a pod uses them
/// (`WaitForFirstConsumer`); no class is not waiting.
///
/// # Errors
/// The class does not exist (`Missing`, with `missing_hint` for the user), or the API failed.
pub(crate) async fn waits_for_consumer(
    client: &Client,
    class: Option<&str>,
    missing_hint: &str,
) -> Result<bool, ExposeError> {
    let Some(class) = class.filter(|c| !c.is_empty()) else { return Ok(false) };
    let classes: Api<StorageClass> = Api::all(client.clone());
    let sc = get_opt(&classes, class, "reading the storage class").await?.ok_or_else(|| {
        ExposeError::Missing {
            what: format!("StorageClass {class}"),
            hint: missing_hint.to_owned(),
        }
    })?;
    Ok(sc.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"))
}

/// The required node affinity terms of the PV bound to PVC `namespace/pvc`; empty when the
/// PVC, its PV or an affinity is missing (the volume is then reachable from anywhere, as far
/// as anyone can tell).
///
/// # Errors
/// The API failed.
pub(crate) async fn source_terms(
    client: &Client,
    namespace: &str,
    pvc: &str,
) -> Result<Vec<NodeSelectorTerm>, ExposeError> {
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), namespace);
    let Some(volume) = get_opt(&pvcs, pvc, "reading the source PVC")
        .await?
        .and_then(|p| p.spec)
        .and_then(|s| s.volume_name)
        .filter(|v| !v.is_empty())
    else {
        return Ok(Vec::new());
    };
    let pvs: Api<PersistentVolume> = Api::all(client.clone());
    Ok(get_opt(&pvs, &volume, "reading the source PV")
        .await?
        .and_then(|pv| pv.spec)
        .and_then(|s| s.node_affinity)
        .and_then(|a| a.required)
        .map(|r| r.node_selector_terms)
        .unwrap_or_default())
}
