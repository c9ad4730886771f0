//! The CSI provisioner's half: volumes made on the host (empty, from a snapshot, cloned from
//! a claim) and their PV objects; and their deletion.

use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, PostParams};
use serde_json::json;

use super::volumes::{annotation, claim_ref};
use super::{State, Volume, World, name, namespace, uid};
use crate::quantity::{format_bytes, parse_bytes};
use crate::sim::{Ctx, VolumeMode};
use crate::{HOSTNAME_LABEL, SELECTED_NODE_ANNOTATION, SimError, host};

const MIB: u64 = 1 << 20;
const SNAPSHOT_GROUP: &str = "snapshot.storage.k8s.io";

/// Why a claim was not provisioned this pass.
pub(super) enum Refusal {
    /// A condition the provisioner waits for (the source snapshot is not ready...).
    Later(String),
    /// A failure.
    Error(SimError),
}

impl From<SimError> for Refusal {
    fn from(e: SimError) -> Self {
        Self::Error(e)
    }
}

pub(super) async fn provision(
    ctx: &Ctx,
    state: &mut State,
    world: &World,
    pvc: &PersistentVolumeClaim,
    class: &StorageClass,
) -> Result<(), Refusal> {
    let pv_name = format!("pvc-{}", uid(&pvc.metadata));
    if world.pv(&pv_name).is_some() {
        return Ok(());
    }
    let spec = pvc.spec.clone().unwrap_or_default();
    let ns = namespace(&pvc.metadata);
    let request = spec
        .resources
        .as_ref()
        .and_then(|r| r.requests.as_ref())
        .and_then(|r| r.get("storage"))
        .ok_or_else(|| Refusal::Later("the claim requests no storage".into()))?;
    let size = parse_bytes(&request.0)?.div_ceil(MIB).max(1) * MIB;
    let mode = VolumeMode::from_field(spec.volume_mode.as_deref());
    if !state.volumes.contains_key(&pv_name) {
        let volume = make_volume(ctx, state, world, pvc, &pv_name, size, mode).await?;
        state.volumes.insert(pv_name.clone(), volume);
    }
    let node = annotation(pvc, SELECTED_NODE_ANNOTATION)
        .filter(|_| class.volume_binding_mode.as_deref() == Some("WaitForFirstConsumer"));
    let affinity = node.map(|n| {
        json!({ "required": { "nodeSelectorTerms": [ { "matchExpressions": [
            { "key": HOSTNAME_LABEL, "operator": "In", "values": [n] } ] } ] } })
    });
    let mut csi = json!({ "driver": ctx.names.driver, "volumeHandle": pv_name,
        "volumeAttributes": { "storage.kubernetes.io/csiProvisionerIdentity": format!("{}-ferry-sim", ctx.names.id) } });
    if mode == VolumeMode::Filesystem {
        csi["fsType"] = json!("ext4");
    }
    let pv: PersistentVolume = serde_json::from_value(json!({
        "metadata": { "name": pv_name, "annotations": { "pv.kubernetes.io/provisioned-by": ctx.names.driver } },
        "spec": {
            "capacity": { "storage": format_bytes(size) },
            "accessModes": spec.access_modes.clone().unwrap_or_else(|| vec!["ReadWriteOnce".into()]),
            "volumeMode": mode.as_str(),
            "persistentVolumeReclaimPolicy": class.reclaim_policy.clone().unwrap_or_else(|| "Delete".into()),
            "storageClassName": name(&class.metadata),
            "claimRef": claim_ref(pvc),
            "csi": csi,
            "nodeAffinity": affinity,
        }
    }))
    .map_err(|e| SimError::Invalid { what: format!("PV {pv_name}"), reason: e.to_string() })?;
    let api: Api<PersistentVolume> = Api::all(ctx.client.clone());
    api.create(&PostParams::default(), &pv)
        .await
        .map_err(|e| SimError::api("creating", "PersistentVolume", &pv_name, e))?;
    tracing::debug!(pv = pv_name, pvc = format!("{ns}/{}", name(&pvc.metadata)), "provisioned");
    Ok(())
}

/// Creates the image (empty, or a copy of the data source), its loop device and file system.
async fn make_volume(
    ctx: &Ctx,
    state: &State,
    world: &World,
    pvc: &PersistentVolumeClaim,
    pv_name: &str,
    size: u64,
    mode: VolumeMode,
) -> Result<Volume, Refusal> {
    let ns = namespace(&pvc.metadata);
    let spec = pvc.spec.clone().unwrap_or_default();
    let source = spec
        .data_source_ref
        .as_ref()
        .map(|r| (r.api_group.clone(), r.kind.clone(), r.name.clone()))
        .or_else(|| {
            spec.data_source.as_ref().map(|r| (r.api_group.clone(), r.kind.clone(), r.name.clone()))
        });
    let image = ctx.volume_image(pv_name);
    let from = match source {
        Some((Some(group), kind, snap)) if group == SNAPSHOT_GROUP && kind == "VolumeSnapshot" => {
            Some(snapshot_source(ctx, world, ns, &snap, size)?)
        }
        Some((None, kind, source_pvc)) if kind == "PersistentVolumeClaim" => {
            Some(clone_source(ctx, state, world, ns, &source_pvc).await?)
        }
        Some((group, kind, _)) => {
            return Err(Refusal::Later(format!(
                "data source {}/{kind} is not supported by driver {}",
                group.unwrap_or_default(),
                ctx.names.driver
            )));
        }
        None => None,
    };
    let grown = match &from {
        Some(source) => {
            host::copy_sparse(source, &image).await?;
            host::grow(&image, size).await?
        }
        None => {
            host::create_sparse(&image, size).await?;
            false
        }
    };
    let device = match host::attach_loop(&image).await {
        Ok(d) => d,
        Err(e) => {
            let _ = tokio::fs::remove_file(&image).await;
            return Err(e.into());
        }
    };
    let formatted = match (mode, from.is_some(), grown) {
        (VolumeMode::Filesystem, false, _) => host::mkfs_ext4(&device).await,
        (VolumeMode::Filesystem, true, true) => host::resize_ext4(&device).await,
        _ => Ok(()),
    };
    if let Err(e) = formatted {
        let _ = host::detach_loop(&device).await;
        let _ = tokio::fs::remove_file(&image).await;
        return Err(e.into());
    }
    Ok(Volume { image, device, mode })
}

fn snapshot_source(
    ctx: &Ctx,
    world: &World,
    ns: &str,
    snap: &str,
    size: u64,
) -> Result<std::path::PathBuf, Refusal> {
    let Some(vs) = world.snapshot(ns, snap) else {
        return Err(Refusal::Later(format!(
            "error getting handle for DataSource Type VolumeSnapshot by Name {snap}: volumesnapshot {ns}/{snap} not found"
        )));
    };
    let status = vs.status.clone().unwrap_or_default();
    if status.ready_to_use != Some(true) {
        return Err(Refusal::Later(format!("snapshot {ns}/{snap} is not Ready")));
    }
    let content = status
        .bound_volume_snapshot_content_name
        .as_deref()
        .and_then(|c| world.content(c))
        .filter(|c| c.spec.driver == ctx.names.driver)
        .ok_or_else(|| {
            Refusal::Later(format!(
                "snapshot {ns}/{snap} has no content of driver {}",
                ctx.names.driver
            ))
        })?;
    let handle =
        content.status.as_ref().and_then(|s| s.snapshot_handle.clone()).ok_or_else(|| {
            Refusal::Later(format!("snapshot content of {ns}/{snap} has no handle"))
        })?;
    let restore = content
        .status
        .as_ref()
        .and_then(|s| s.restore_size)
        .and_then(|s| u64::try_from(s).ok())
        .unwrap_or(0);
    if restore > size {
        return Err(Refusal::Later(format!(
            "requested volume size {size} is less than the size {restore} for the source snapshot {snap}"
        )));
    }
    Ok(ctx.snapshot_image(&handle))
}

async fn clone_source(
    ctx: &Ctx,
    state: &State,
    world: &World,
    ns: &str,
    source: &str,
) -> Result<std::path::PathBuf, Refusal> {
    let pv = world
        .pvc(ns, source)
        .and_then(|c| c.spec.as_ref()?.volume_name.clone())
        .ok_or_else(|| Refusal::Later(format!("source claim {ns}/{source} is not bound")))?;
    let volume = state.volumes.get(&pv).ok_or_else(|| {
        Refusal::Later(format!("source volume {pv} is not held by driver {}", ctx.names.driver))
    })?;
    host::flush_device(&volume.device).await?;
    Ok(volume.image.clone())
}

/// Detaches a volume's loop device and deletes its image.
pub(super) async fn free_storage(ctx: &Ctx, state: &mut State, pv: &str) {
    let image = match state.volumes.remove(pv) {
        Some(volume) => {
            if let Err(e) = host::detach_loop(&volume.device).await {
                tracing::warn!(pv, error = %e, "detaching loop device");
            }
            volume.image
        }
        None => ctx.volume_image(pv),
    };
    match tokio::fs::remove_file(&image).await {
        Ok(()) => tracing::debug!(pv, "volume deleted"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(image = %image.display(), error = %e, "removing volume image"),
    }
}
