//! The snapshot controller and the CSI snapshotter: VolumeSnapshots of this driver's PVCs,
//! pre-provisioned contents, binding, readiness and deletion policy.
//!
//! Contents carry the real controller's bound-protection finalizer, so a deletion is seen with
//! the deletion policy the content has at that moment (Velero flips the source content to
//! `Retain` just before deleting it).

use ferry_api::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use super::{State, World, is_ours, name, namespace, now, uid};
use crate::error::is_not_found;
use crate::quantity::{format_bytes, parse_bytes};
use crate::sim::Ctx;
use crate::{SimError, host};

/// The finalizer the real snapshot controller puts on bound contents.
pub(crate) const CONTENT_FINALIZER: &str =
    "snapshot.storage.kubernetes.io/volumesnapshotcontent-bound-protection";

pub(super) async fn reconcile(ctx: &Ctx, state: &mut State, world: &World) {
    forget_vanished(ctx, state, world).await;
    for content in world.contents.iter().filter(|c| c.spec.driver == ctx.names.driver) {
        if let Err(e) = content_pass(ctx, state, world, content).await {
            tracing::warn!(content = name(&content.metadata), error = %e, "snapshot content");
        }
    }
    for vs in &world.snapshots {
        if vs.metadata.deletion_timestamp.is_some() {
            continue;
        }
        let result = if let Some(pvc) = vs.spec.source.persistent_volume_claim_name.as_deref() {
            match class_for(ctx, world, vs, pvc) {
                Some(class) => dynamic(ctx, state, world, vs, pvc, class).await,
                None => Ok(()),
            }
        } else if let Some(content) = vs.spec.source.volume_snapshot_content_name.as_deref() {
            pre_provisioned(ctx, world, vs, content).await
        } else {
            Ok(())
        };
        if let Err(e) = result {
            let vs_name = format!("{}/{}", namespace(&vs.metadata), name(&vs.metadata));
            tracing::warn!(snapshot = vs_name, error = %e, "volume snapshot");
        }
    }
}

/// Contents gone from the API without our seeing their deletion (no finalizer yet): apply the
/// policy they last had.
async fn forget_vanished(ctx: &Ctx, state: &mut State, world: &World) {
    let gone: Vec<_> =
        state.contents.keys().filter(|n| world.content(n).is_none()).cloned().collect();
    for content in gone {
        if let Some((handle, policy)) = state.contents.remove(&content)
            && policy == "Delete"
        {
            remove_image(ctx, &handle).await;
        }
    }
}

fn class_for<'w>(
    ctx: &Ctx,
    world: &'w World,
    vs: &VolumeSnapshot,
    pvc: &str,
) -> Option<&'w VolumeSnapshotClass> {
    let class_name = match vs.spec.volume_snapshot_class_name.as_deref() {
        Some(name) => name,
        // No class: the default one, if the PVC is ours.
        None => {
            let claim = world.pvc(namespace(&vs.metadata), pvc)?;
            if !world.pvc_is_ours(ctx, claim) {
                return None;
            }
            &ctx.names.snapshot_class
        }
    };
    world
        .snapshot_classes
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(class_name) && c.driver == ctx.names.driver)
}

fn handle_of(content: &VolumeSnapshotContent) -> Option<&str> {
    content.status.as_ref().and_then(|s| s.snapshot_handle.as_deref()).or(content
        .spec
        .source
        .snapshot_handle
        .as_deref())
}

async fn content_pass(
    ctx: &Ctx,
    state: &mut State,
    world: &World,
    content: &VolumeSnapshotContent,
) -> Result<(), SimError> {
    let api: Api<VolumeSnapshotContent> = Api::all(ctx.client.clone());
    let cname = name(&content.metadata);
    let policy = content.spec.deletion_policy.clone();
    if let Some(handle) = handle_of(content) {
        state.contents.insert(cname.to_owned(), (handle.to_owned(), policy.clone()));
    }
    let finalizers = content.metadata.finalizers.clone().unwrap_or_default();
    if content.metadata.deletion_timestamp.is_some() {
        if policy == "Delete"
            && let Some(handle) = handle_of(content)
        {
            remove_image(ctx, handle).await;
        }
        state.contents.remove(cname);
        if finalizers.iter().any(|f| f == CONTENT_FINALIZER) {
            let kept: Vec<_> = finalizers.into_iter().filter(|f| f != CONTENT_FINALIZER).collect();
            let patch = json!({ "metadata": { "finalizers": kept } });
            patch_content(&api, cname, &patch, false).await?;
        }
        return Ok(());
    }
    if !finalizers.iter().any(|f| f == CONTENT_FINALIZER) {
        let mut with = finalizers;
        with.push(CONTENT_FINALIZER.to_owned());
        patch_content(&api, cname, &json!({ "metadata": { "finalizers": with } }), false).await?;
    }
    // Pre-provisioned: ready once its handle is known to the driver.
    let ready = content.status.as_ref().and_then(|s| s.ready_to_use) == Some(true);
    if let Some(handle) = content.spec.source.snapshot_handle.as_deref()
        && !ready
    {
        let image = ctx.snapshot_image(handle);
        let status = match tokio::fs::metadata(&image).await {
            Ok(meta) => json!({ "status": {
                "snapshotHandle": handle, "readyToUse": true,
                "restoreSize": i64::try_from(meta.len()).unwrap_or(i64::MAX),
                "creationTime": mtime_nanos(&meta) } }),
            Err(_) => {
                let message = format!(
                    "snapshot handle {handle} does not exist on driver {}",
                    ctx.names.driver
                );
                let current = content
                    .status
                    .as_ref()
                    .and_then(|s| s.error.as_ref())
                    .and_then(|e| e.message.as_deref());
                if current == Some(message.as_str()) {
                    return Ok(());
                }
                json!({ "status": { "readyToUse": false, "error": { "message": message, "time": now() } } })
            }
        };
        patch_content(&api, cname, &status, true).await?;
    }
    // Its VolumeSnapshot is gone: the real controller deletes a `Delete` content.
    let r = &content.spec.volume_snapshot_ref;
    let bound_uid = r.uid.as_deref().unwrap_or_default();
    if !bound_uid.is_empty() && policy == "Delete" {
        let vs = world.snapshot(
            r.namespace.as_deref().unwrap_or_default(),
            r.name.as_deref().unwrap_or_default(),
        );
        if vs.is_none_or(|vs| uid(&vs.metadata) != bound_uid) {
            match api.delete(cname, &DeleteParams::default()).await {
                Ok(_) => {}
                Err(e) if is_not_found(&e) => {}
                Err(e) => return Err(SimError::api("deleting", "VolumeSnapshotContent", cname, e)),
            }
        }
    }
    Ok(())
}

async fn dynamic(
    ctx: &Ctx,
    state: &mut State,
    world: &World,
    vs: &VolumeSnapshot,
    pvc_name: &str,
    class: &VolumeSnapshotClass,
) -> Result<(), SimError> {
    let ns = namespace(&vs.metadata);
    let content_name = format!("snapcontent-{}", uid(&vs.metadata));
    if let Some(content) = world.content(&content_name) {
        return sync_snapshot_status(ctx, vs, content).await;
    }
    let Some(pvc) = world.pvc(ns, pvc_name) else {
        return set_snapshot_error(
            ctx,
            vs,
            &format!("PersistentVolumeClaim {ns}/{pvc_name} not found"),
        )
        .await;
    };
    let pv_name = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
    let bound = pvc.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let (Some(pv), true) = (world.pv(&pv_name), bound) else {
        return set_snapshot_error(
            ctx,
            vs,
            &format!("PersistentVolumeClaim {ns}/{pvc_name} is not bound"),
        )
        .await;
    };
    let Some(volume) = state.volumes.get(&pv_name).filter(|_| is_ours(ctx, pv)).cloned() else {
        return set_snapshot_error(
            ctx,
            vs,
            &format!("volume {pv_name} is not held by driver {}", ctx.names.driver),
        )
        .await;
    };
    // Crash-consistent like a real snapshot: flush what mounted file systems hold, then copy.
    for setup in state.pods.values() {
        for mount in setup.mounts.iter().filter(|m| m.ends_with(format!("{pv_name}/mount"))) {
            host::sync_fs(mount).await?;
        }
    }
    host::flush_device(&volume.device).await?;
    let handle = format!("snapshot-{}", uid(&vs.metadata));
    let image = ctx.snapshot_image(&handle);
    host::copy_sparse(&volume.image, &image).await?;
    let size = host::file_size(&image).await?;
    let volume_handle =
        pv.spec.as_ref().and_then(|s| s.csi.as_ref()).map(|c| c.volume_handle.clone());
    let content: VolumeSnapshotContent = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": { "name": content_name, "finalizers": [CONTENT_FINALIZER] },
        "spec": {
            "volumeSnapshotRef": { "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
                "name": name(&vs.metadata), "namespace": ns, "uid": uid(&vs.metadata),
                "resourceVersion": vs.metadata.resource_version },
            "deletionPolicy": class.deletion_policy,
            "driver": ctx.names.driver,
            "volumeSnapshotClassName": class.metadata.name,
            "source": { "volumeHandle": volume_handle },
            "sourceVolumeMode": volume.mode.as_str(),
        }
    }))
    .map_err(|e| SimError::Invalid { what: "snapshot content".into(), reason: e.to_string() })?;
    let api: Api<VolumeSnapshotContent> = Api::all(ctx.client.clone());
    api.create(&PostParams::default(), &content)
        .await
        .map_err(|e| SimError::api("creating", "VolumeSnapshotContent", &content_name, e))?;
    state.contents.insert(content_name.clone(), (handle.clone(), class.deletion_policy.clone()));
    let created = k8s_openapi::jiff::Timestamp::now();
    let nanos = i64::try_from(created.as_nanosecond()).unwrap_or(i64::MAX);
    let status = json!({ "status": { "snapshotHandle": handle, "readyToUse": true,
        "restoreSize": i64::try_from(size).unwrap_or(i64::MAX), "creationTime": nanos } });
    let content = patch_content(&api, &content_name, &status, true).await?;
    sync_snapshot_status(ctx, vs, &content).await
}

async fn pre_provisioned(
    ctx: &Ctx,
    world: &World,
    vs: &VolumeSnapshot,
    content_name: &str,
) -> Result<(), SimError> {
    let Some(content) = world.content(content_name) else {
        // Someone else's (or not there yet): only speak up for our own snapshots.
        return Ok(());
    };
    if content.spec.driver != ctx.names.driver {
        return Ok(());
    }
    let r = &content.spec.volume_snapshot_ref;
    if r.name.as_deref() != vs.metadata.name.as_deref()
        || r.namespace.as_deref() != vs.metadata.namespace.as_deref()
    {
        return set_snapshot_error(
            ctx,
            vs,
            &format!("VolumeSnapshotContent {content_name} is bound to another snapshot"),
        )
        .await;
    }
    match r.uid.as_deref().filter(|u| !u.is_empty()) {
        None => {
            let api: Api<VolumeSnapshotContent> = Api::all(ctx.client.clone());
            let patch = json!({ "spec": { "volumeSnapshotRef": { "uid": uid(&vs.metadata) } } });
            let bound = patch_content(&api, content_name, &patch, false).await?;
            sync_snapshot_status(ctx, vs, &bound).await
        }
        Some(u) if u == uid(&vs.metadata) => sync_snapshot_status(ctx, vs, content).await,
        Some(_) => {
            set_snapshot_error(
                ctx,
                vs,
                &format!("VolumeSnapshotContent {content_name} is bound to another snapshot"),
            )
            .await
        }
    }
}

/// Copies a content's readiness to its VolumeSnapshot, writing only what differs.
async fn sync_snapshot_status(
    ctx: &Ctx,
    vs: &VolumeSnapshot,
    content: &VolumeSnapshotContent,
) -> Result<(), SimError> {
    let cs = content.status.clone().unwrap_or_default();
    let ready = cs.ready_to_use.unwrap_or(false);
    let size = cs.restore_size.map(|s| format_bytes(u64::try_from(s).unwrap_or(0)));
    let created = cs.creation_time.map(|n| {
        k8s_openapi::jiff::Timestamp::from_nanosecond(i128::from(n))
            .map_or_else(|_| now(), |t| t.to_string())
    });
    let current = vs.status.clone().unwrap_or_default();
    let same = current.bound_volume_snapshot_content_name.as_deref()
        == content.metadata.name.as_deref()
        && current.ready_to_use == Some(ready)
        && current.restore_size.as_ref().map(|q| parse_bytes(&q.0).ok())
            == size.as_ref().map(|s| parse_bytes(s).ok())
        && current.error.is_none() == cs.error.is_none();
    if same {
        return Ok(());
    }
    let status = json!({ "status": {
        "boundVolumeSnapshotContentName": content.metadata.name,
        "readyToUse": ready, "restoreSize": size, "creationTime": created,
        "error": cs.error.as_ref().map(|e| json!({ "message": e.message, "time": now() })),
    } });
    patch_snapshot(ctx, vs, &status).await
}

async fn set_snapshot_error(ctx: &Ctx, vs: &VolumeSnapshot, message: &str) -> Result<(), SimError> {
    let current =
        vs.status.as_ref().and_then(|s| s.error.as_ref()).and_then(|e| e.message.as_deref());
    if current == Some(message) {
        return Ok(());
    }
    let status = json!({ "status": { "readyToUse": false, "error": { "message": message, "time": now() } } });
    patch_snapshot(ctx, vs, &status).await
}

async fn patch_snapshot(
    ctx: &Ctx,
    vs: &VolumeSnapshot,
    status: &serde_json::Value,
) -> Result<(), SimError> {
    let ns = namespace(&vs.metadata);
    let api: Api<VolumeSnapshot> = Api::namespaced(ctx.client.clone(), ns);
    api.patch_status(name(&vs.metadata), &PatchParams::default(), &Patch::Merge(status))
        .await
        .map(drop)
        .map_err(|e| {
            SimError::api(
                "patching status of",
                "VolumeSnapshot",
                format!("{ns}/{}", name(&vs.metadata)),
                e,
            )
        })
}

async fn patch_content(
    api: &Api<VolumeSnapshotContent>,
    name: &str,
    patch: &serde_json::Value,
    status: bool,
) -> Result<VolumeSnapshotContent, SimError> {
    let pp = PatchParams::default();
    let result = if status {
        api.patch_status(name, &pp, &Patch::Merge(patch)).await
    } else {
        api.patch(name, &pp, &Patch::Merge(patch)).await
    };
    result.map_err(|e| SimError::api("patching", "VolumeSnapshotContent", name, e))
}

async fn remove_image(ctx: &Ctx, handle: &str) {
    let image = ctx.snapshot_image(handle);
    match tokio::fs::remove_file(&image).await {
        Ok(()) => tracing::debug!(handle, "snapshot deleted"),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => tracing::warn!(image = %image.display(), error = %e, "removing snapshot image"),
    }
}

fn mtime_nanos(meta: &std::fs::Metadata) -> i64 {
    meta.modified()
        .ok()
        .and_then(|t| t.duration_since(std::time::UNIX_EPOCH).ok())
        .and_then(|d| i64::try_from(d.as_nanos()).ok())
        .unwrap_or(0)
}
