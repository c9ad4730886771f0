//! The PV controller and the CSI provisioner: dynamic provisioning (empty, from a snapshot, from
//! a PVC), binding both ways, pre-bound `claimRef`s and `volumeName`s, selectors, release and
//! reclaim.

use k8s_openapi::api::core::v1::{Event, PersistentVolume, PersistentVolumeClaim};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::provision::{Refusal, free_storage, provision};
use super::{State, World, is_ours, name, namespace, uid};
use crate::error::is_not_found;
use crate::quantity::parse_bytes;
use crate::select::label_selector_matches;
use crate::sim::{Ctx, VolumeMode};
use crate::{SELECTED_NODE_ANNOTATION, SimError};

/// Put on every PVC by the API server's StorageObjectInUseProtection admission plugin.
const PVC_PROTECTION: &str = "kubernetes.io/pvc-protection";
/// Put on every PV by the same plugin.
const PV_PROTECTION: &str = "kubernetes.io/pv-protection";

pub(super) async fn reconcile(ctx: &Ctx, state: &mut State, world: &World) {
    release_vanished(ctx, state, world).await;
    if let Err(e) = protection(ctx, world).await {
        tracing::warn!(error = %e, "storage object protection");
    }
    for pv in world.pvs.iter().filter(|pv| is_ours(ctx, pv)) {
        if let Err(e) = pv_pass(ctx, state, world, pv).await {
            tracing::warn!(pv = name(&pv.metadata), error = %e, "persistent volume");
        }
    }
    for pvc in &world.pvcs {
        let phase = pvc.status.as_ref().and_then(|s| s.phase.as_deref());
        if pvc.metadata.deletion_timestamp.is_some()
            || phase == Some("Bound")
            || !world.pvc_is_ours(ctx, pvc)
        {
            continue;
        }
        if let Err(e) = claim_pass(ctx, state, world, pvc).await {
            let id = format!("{}/{}", namespace(&pvc.metadata), name(&pvc.metadata));
            tracing::warn!(pvc = id, error = %e, "persistent volume claim");
        }
    }
}

/// The pvc-protection and pv-protection controllers: a deleted PVC goes once no pod uses it, a
/// deleted PV once it is no longer bound.
async fn protection(ctx: &Ctx, world: &World) -> Result<(), SimError> {
    for pvc in world.pvcs.iter().filter(|p| p.metadata.deletion_timestamp.is_some()) {
        if !world.pvc_is_ours(ctx, pvc) || !has_finalizer(&pvc.metadata, PVC_PROTECTION) {
            continue;
        }
        let ns = namespace(&pvc.metadata);
        let in_use = world.pods.iter().any(|pod| {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            namespace(&pod.metadata) == ns
                && !matches!(phase, Some("Succeeded" | "Failed"))
                && pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()).any(|v| {
                    v.persistent_volume_claim
                        .as_ref()
                        .is_some_and(|c| c.claim_name == name(&pvc.metadata))
                })
        });
        if !in_use {
            let api: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
            drop_finalizer(&api, &pvc.metadata, PVC_PROTECTION, "PersistentVolumeClaim").await?;
        }
    }
    for pv in
        world.pvs.iter().filter(|p| p.metadata.deletion_timestamp.is_some() && is_ours(ctx, p))
    {
        let bound = pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
        if !bound && has_finalizer(&pv.metadata, PV_PROTECTION) {
            let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
            drop_finalizer(&api, &pv.metadata, PV_PROTECTION, "PersistentVolume").await?;
        }
    }
    Ok(())
}

fn has_finalizer(meta: &kube::api::ObjectMeta, finalizer: &str) -> bool {
    meta.finalizers.iter().flatten().any(|f| f == finalizer)
}

async fn drop_finalizer<K>(
    api: &Api<K>,
    meta: &kube::api::ObjectMeta,
    finalizer: &str,
    kind: &'static str,
) -> Result<(), SimError>
where
    K: kube::Resource + Clone + std::fmt::Debug + serde::de::DeserializeOwned,
{
    let kept: Vec<_> = meta.finalizers.iter().flatten().filter(|f| *f != finalizer).collect();
    let patch =
        json!({ "metadata": { "finalizers": kept, "resourceVersion": meta.resource_version } });
    match api.patch(name(meta), &PatchParams::default(), &Patch::Merge(&patch)).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()), // Changed meanwhile: next pass.
        Err(e) => Err(SimError::api("removing a finalizer from", kind, name(meta), e)),
    }
}

/// PVs deleted from the API: free their storage once no pod uses them.
async fn release_vanished(ctx: &Ctx, state: &mut State, world: &World) {
    let gone: Vec<_> = state
        .volumes
        .keys()
        .filter(|pv| world.pv(pv).is_none() && !state.pv_in_use(pv))
        .cloned()
        .collect();
    for pv in gone {
        free_storage(ctx, state, &pv).await;
    }
}

async fn pv_pass(
    ctx: &Ctx,
    state: &mut State,
    world: &World,
    pv: &PersistentVolume,
) -> Result<(), SimError> {
    let spec = pv.spec.clone().unwrap_or_default();
    let Some(claim) = spec.claim_ref.as_ref() else {
        return set_pv_phase(ctx, pv, "Available").await;
    };
    let claim_uid = claim.uid.as_deref().unwrap_or_default();
    if claim_uid.is_empty() {
        // Pre-bound by name: the claim side binds it.
        return set_pv_phase(ctx, pv, "Available").await;
    }
    let pvc = world
        .pvc(
            claim.namespace.as_deref().unwrap_or_default(),
            claim.name.as_deref().unwrap_or_default(),
        )
        .filter(|c| uid(&c.metadata) == claim_uid);
    if let Some(pvc) = pvc {
        return complete_binding(ctx, pv, pvc).await;
    }
    let reclaim = spec.persistent_volume_reclaim_policy.as_deref().unwrap_or("Delete");
    let pv_name = name(&pv.metadata);
    if reclaim == "Delete" && !state.pv_in_use(pv_name) {
        set_pv_phase(ctx, pv, "Released").await?;
        free_storage(ctx, state, pv_name).await;
        let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
        return match api.delete(pv_name, &DeleteParams::default()).await {
            Ok(_) => Ok(()),
            Err(e) if is_not_found(&e) => Ok(()),
            Err(e) => Err(SimError::api("deleting", "PersistentVolume", pv_name, e)),
        };
    }
    set_pv_phase(ctx, pv, "Released").await
}

async fn claim_pass(
    ctx: &Ctx,
    state: &mut State,
    world: &World,
    pvc: &PersistentVolumeClaim,
) -> Result<(), SimError> {
    let spec = pvc.spec.clone().unwrap_or_default();
    let wanted = spec.volume_name.clone().unwrap_or_default();
    if !wanted.is_empty() {
        if let Some(pv) = world.pv(&wanted).filter(|pv| is_ours(ctx, pv))
            && claimable_by(pv, pvc)
        {
            let pv = claim_pv(ctx, pv, pvc).await?;
            return complete_binding(ctx, &pv, pvc).await;
        }
        return Ok(());
    }
    let class = world.our_class(ctx, pvc);
    let node_chosen = annotation(pvc, SELECTED_NODE_ANNOTATION).is_some();
    let delayed =
        class.is_some_and(|c| c.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
    let mut candidates: Vec<_> = world
        .pvs
        .iter()
        .filter(|pv| is_ours(ctx, pv) && pv.metadata.deletion_timestamp.is_none())
        .filter(|pv| {
            let pre_bound = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some();
            let available =
                pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available");
            (pre_bound && claimable_by(pv, pvc))
                || (!pre_bound && available && (!delayed || node_chosen))
        })
        .filter(|pv| fits(pv, pvc))
        .collect();
    // Pre-bound volumes first, then the smallest that fits.
    candidates.sort_by_key(|pv| {
        let pre_bound = pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some();
        (!pre_bound, capacity(pv))
    });
    if let Some(pv) = candidates.first() {
        let pv = claim_pv(ctx, pv, pvc).await?;
        return complete_binding(ctx, &pv, pvc).await;
    }
    // Dynamic provisioning: never for claims with a selector (as in Kubernetes).
    let Some(class) = class else { return Ok(()) };
    if spec.selector.is_some() || (delayed && !node_chosen) {
        return Ok(());
    }
    let key = uid(&pvc.metadata).to_owned();
    match provision(ctx, state, world, pvc, class).await {
        Ok(()) => {
            state.provision_errors.remove(&key);
            Ok(())
        }
        Err(Refusal::Later(message)) => {
            provisioning_failed(ctx, state, pvc, message).await;
            Ok(())
        }
        Err(Refusal::Error(e)) => {
            let message = format!(
                "failed to provision volume with StorageClass {:?}: {e}",
                name(&class.metadata)
            );
            provisioning_failed(ctx, state, pvc, message).await;
            Err(e)
        }
    }
}

/// Keeps why `pvc` could not be provisioned, and says so as the external-provisioner does: a
/// `ProvisioningFailed` Warning Event on the claim (written through the core API, as
/// client-go's recorder writes it), once for each new message.
async fn provisioning_failed(
    ctx: &Ctx,
    state: &mut State,
    pvc: &PersistentVolumeClaim,
    message: String,
) {
    let key = uid(&pvc.metadata).to_owned();
    if state.provision_errors.get(&key) == Some(&message) {
        return;
    }
    let (ns, claim) = (namespace(&pvc.metadata), name(&pvc.metadata));
    let now = super::now();
    let event = json!({
        "apiVersion": "v1", "kind": "Event",
        // Named by the API server: a claim's name may be too long to add to.
        "metadata": { "generateName": "provisioning-failed-", "namespace": ns },
        "involvedObject": {
            "apiVersion": "v1", "kind": "PersistentVolumeClaim",
            "namespace": ns, "name": claim, "uid": key,
        },
        "type": "Warning", "reason": "ProvisioningFailed", "message": message,
        "source": { "component": "ferry-sim-provisioner" },
        "firstTimestamp": now, "lastTimestamp": now, "count": 1,
    });
    let created = match serde_json::from_value::<Event>(event) {
        Ok(event) => Api::<Event>::namespaced(ctx.client.clone(), ns)
            .create(&PostParams::default(), &event)
            .await
            .map(|_| ())
            .map_err(|e| e.to_string()),
        Err(e) => Err(e.to_string()),
    };
    if let Err(e) = created {
        tracing::warn!(pvc = claim, error = %e, "recording ProvisioningFailed");
    }
    state.provision_errors.insert(key, message);
}

/// Whether `pv` may go to `pvc`: unclaimed, or claimed by name (and uid) for exactly it.
fn claimable_by(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    match pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()) {
        None => true,
        Some(r) => {
            r.namespace == pvc.metadata.namespace
                && r.name == pvc.metadata.name
                && r.uid.as_deref().is_none_or(|u| u.is_empty() || u == uid(&pvc.metadata))
        }
    }
}

/// Whether `pv` satisfies the claim: class, mode, size, access modes, selector.
fn fits(pv: &PersistentVolume, pvc: &PersistentVolumeClaim) -> bool {
    let (Some(ps), Some(cs)) = (pv.spec.as_ref(), pvc.spec.as_ref()) else { return false };
    let class = |c: Option<&String>| c.cloned().unwrap_or_default();
    let request = cs
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .and_then(|q| parse_bytes(&q.0).ok())
        .unwrap_or(0);
    let modes_ok =
        cs.access_modes.iter().flatten().all(|m| ps.access_modes.iter().flatten().any(|p| p == m));
    let labels = pv.metadata.labels.clone().unwrap_or_default();
    class(cs.storage_class_name.as_ref()) == class(ps.storage_class_name.as_ref())
        && VolumeMode::from_field(cs.volume_mode.as_deref())
            == VolumeMode::from_field(ps.volume_mode.as_deref())
        && capacity(pv) >= request
        && modes_ok
        && cs.selector.as_ref().is_none_or(|s| label_selector_matches(s, &labels))
}

fn capacity(pv: &PersistentVolume) -> u64 {
    pv.spec
        .as_ref()
        .and_then(|s| s.capacity.as_ref())
        .and_then(|c| c.get("storage"))
        .and_then(|q| parse_bytes(&q.0).ok())
        .unwrap_or(0)
}

pub(super) fn annotation<'a>(pvc: &'a PersistentVolumeClaim, key: &str) -> Option<&'a str> {
    pvc.metadata.annotations.as_ref()?.get(key).map(String::as_str)
}

/// Points the PV's `claimRef` at the claim, uid included (the binding decision).
async fn claim_pv(
    ctx: &Ctx,
    pv: &PersistentVolume,
    pvc: &PersistentVolumeClaim,
) -> Result<PersistentVolume, SimError> {
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let patch = json!({ "spec": { "claimRef": claim_ref(pvc) } });
    api.patch(name(&pv.metadata), &PatchParams::default(), &Patch::Merge(&patch))
        .await
        .map_err(|e| SimError::api("binding", "PersistentVolume", name(&pv.metadata), e))
}

pub(super) fn claim_ref(pvc: &PersistentVolumeClaim) -> serde_json::Value {
    json!({ "kind": "PersistentVolumeClaim", "apiVersion": "v1",
            "namespace": namespace(&pvc.metadata), "name": name(&pvc.metadata),
            "uid": uid(&pvc.metadata), "resourceVersion": pvc.metadata.resource_version })
}

/// Makes the binding visible on both sides: PVC `volumeName` and status, PV phase.
async fn complete_binding(
    ctx: &Ctx,
    pv: &PersistentVolume,
    pvc: &PersistentVolumeClaim,
) -> Result<(), SimError> {
    let pv_name = name(&pv.metadata);
    let ns = namespace(&pvc.metadata);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(ctx.client.clone(), ns);
    let id = format!("{ns}/{}", name(&pvc.metadata));
    let spec = pvc.spec.clone().unwrap_or_default();
    match spec.volume_name.as_deref().unwrap_or_default() {
        "" => {
            let mut annotations = json!({ "pv.kubernetes.io/bind-completed": "yes",
                                          "pv.kubernetes.io/bound-by-controller": "yes" });
            if pv
                .metadata
                .annotations
                .as_ref()
                .is_some_and(|a| a.contains_key("pv.kubernetes.io/provisioned-by"))
            {
                annotations["volume.kubernetes.io/storage-provisioner"] = json!(ctx.names.driver);
            }
            let patch = json!({ "metadata": { "annotations": annotations }, "spec": { "volumeName": pv_name } });
            pvcs.patch(name(&pvc.metadata), &PatchParams::default(), &Patch::Merge(&patch))
                .await
                .map_err(|e| SimError::api("binding", "PersistentVolumeClaim", &id, e))?;
        }
        other if other != pv_name => return Ok(()), // The claim went to another volume.
        _ => {}
    }
    // The volume is Bound before the claim, as Kubernetes' PV controller does it: whoever sees
    // a Bound claim finds its volume Bound too.
    set_pv_phase(ctx, pv, "Bound").await?;
    let pv_spec = pv.spec.clone().unwrap_or_default();
    if pvc.status.as_ref().and_then(|s| s.phase.as_deref()) != Some("Bound") {
        let status = json!({ "status": { "phase": "Bound", "capacity": pv_spec.capacity,
                                         "accessModes": pv_spec.access_modes } });
        pvcs.patch_status(name(&pvc.metadata), &PatchParams::default(), &Patch::Merge(&status))
            .await
            .map_err(|e| SimError::api("patching status of", "PersistentVolumeClaim", &id, e))?;
    }
    Ok(())
}

async fn set_pv_phase(ctx: &Ctx, pv: &PersistentVolume, phase: &str) -> Result<(), SimError> {
    if pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some(phase) {
        return Ok(());
    }
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    let status = json!({ "status": { "phase": phase } });
    api.patch_status(name(&pv.metadata), &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map(drop)
        .map_err(|e| SimError::api("patching status of", "PersistentVolume", name(&pv.metadata), e))
}
