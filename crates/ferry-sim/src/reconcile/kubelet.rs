//! The kubelets: make a pod's volumes appear under its node's kubelet root at the real
//! kubelet's relative paths, report the pod Running, and tear everything down on deletion.

use std::collections::HashSet;
use std::path::{Path, PathBuf};

use k8s_openapi::api::core::v1::Pod;
use kube::api::{Api, DeleteParams, Patch, PatchParams, Preconditions};
use serde_json::json;

use super::{PodSetup, State, World, is_ours, name, namespace, now, uid};
use crate::error::is_not_found;
use crate::sim::{Ctx, VolumeMode};
use crate::{CSI_PLUGIN_DIR, SimError, host};

pub(super) async fn reconcile(ctx: &Ctx, state: &mut State, world: &World) {
    let live: HashSet<&str> = world.pods.iter().map(|p| uid(&p.metadata)).collect();
    let orphans: Vec<_> =
        state.pods.keys().filter(|u| !live.contains(u.as_str())).cloned().collect();
    for pod_uid in orphans {
        teardown(ctx, state, &pod_uid, None).await;
    }
    for pod in &world.pods {
        let Some(node) =
            pod.spec.as_ref().and_then(|s| s.node_name.as_deref()).and_then(|n| ctx.node(n))
        else {
            continue;
        };
        let result = if pod.metadata.deletion_timestamp.is_some() {
            teardown(ctx, state, uid(&pod.metadata), Some(&node.kubelet_root)).await;
            delete_now(ctx, pod).await
        } else {
            let phase = pod.status.as_ref().and_then(|s| s.phase.as_deref());
            if matches!(phase, Some("Succeeded" | "Failed")) {
                continue;
            }
            match set_up(ctx, state, world, pod, &node.name, &node.kubelet_root).await {
                Ok(true) if phase != Some("Running") => set_running(ctx, pod).await,
                Ok(_) => Ok(()),
                Err(e) => Err(e),
            }
        };
        if let Err(e) = result {
            let id = format!("{}/{}", namespace(&pod.metadata), name(&pod.metadata));
            tracing::warn!(pod = id, error = %e, "kubelet");
        }
    }
}

fn pod_dir(root: &Path, pod_uid: &str) -> PathBuf {
    root.join("pods").join(pod_uid)
}

fn publish_path(root: &Path, pv: &str, pod_uid: &str) -> PathBuf {
    root.join("plugins/kubernetes.io/csi/volumeDevices/publish").join(pv).join(pod_uid)
}

/// Mounts or maps every volume of the pod; `Ok(true)` once all are in place.
async fn set_up(
    ctx: &Ctx,
    state: &mut State,
    world: &World,
    pod: &Pod,
    node: &str,
    root: &Path,
) -> Result<bool, SimError> {
    let pod_uid = uid(&pod.metadata).to_owned();
    let mut setup = state
        .pods
        .remove(&pod_uid)
        .unwrap_or_else(|| PodSetup { node: node.to_owned(), ..PodSetup::default() });
    let result = if setup.complete {
        Ok(true)
    } else {
        set_up_volumes(ctx, state, world, pod, root, &mut setup).await
    };
    if let Ok(done) = result {
        setup.complete = done;
    }
    state.pods.insert(pod_uid, setup);
    result
}

async fn set_up_volumes(
    ctx: &Ctx,
    state: &State,
    world: &World,
    pod: &Pod,
    root: &Path,
    setup: &mut PodSetup,
) -> Result<bool, SimError> {
    let pod_uid = uid(&pod.metadata);
    let dir = pod_dir(root, pod_uid);
    tokio::fs::create_dir_all(&dir).await.map_err(|e| SimError::io("creating", &dir, e))?;
    let ns = namespace(&pod.metadata);
    for volume in pod.spec.iter().flat_map(|s| s.volumes.iter().flatten()) {
        if volume.empty_dir.is_some() {
            let path = dir.join("volumes/kubernetes.io~empty-dir").join(&volume.name);
            tokio::fs::create_dir_all(&path)
                .await
                .map_err(|e| SimError::io("creating", &path, e))?;
            continue;
        }
        let Some(source) = volume.persistent_volume_claim.as_ref() else { continue };
        let Some(pvc) = world.pvc(ns, &source.claim_name) else { return Ok(false) };
        let pv_name = pvc.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
        let Some(pv) = world.pv(&pv_name).filter(|pv| is_ours(ctx, pv)) else { return Ok(false) };
        let Some(backing) = state.volumes.get(&pv_name) else { return Ok(false) };
        if !setup.pvs.contains(&pv_name) {
            setup.pvs.push(pv_name.clone());
        }
        match backing.mode {
            VolumeMode::Filesystem => {
                let target = dir.join("volumes").join(CSI_PLUGIN_DIR).join(&pv_name).join("mount");
                if !setup.mounts.contains(&target) {
                    let read_only = source.read_only.unwrap_or(false);
                    host::mount_ext4(&backing.device, &target, read_only).await?;
                    setup.mounts.push(target.clone());
                    write_vol_data(ctx, pv, node_of(setup), &target).await?;
                }
            }
            VolumeMode::Block => {
                let publish = publish_path(root, &pv_name, pod_uid);
                if !setup.mounts.contains(&publish) {
                    host::bind_device(&backing.device, &publish).await?;
                    setup.mounts.push(publish.clone());
                }
                let link = dir.join("volumeDevices").join(CSI_PLUGIN_DIR).join(&pv_name);
                if tokio::fs::symlink_metadata(&link).await.is_err() {
                    let parent = dir.join("volumeDevices").join(CSI_PLUGIN_DIR);
                    tokio::fs::create_dir_all(&parent)
                        .await
                        .map_err(|e| SimError::io("creating", &parent, e))?;
                    tokio::fs::symlink(&publish, &link)
                        .await
                        .map_err(|e| SimError::io("linking", &link, e))?;
                }
            }
        }
    }
    Ok(true)
}

fn node_of(setup: &PodSetup) -> &str {
    &setup.node
}

/// The kubelet's `vol_data.json` beside a CSI mount.
async fn write_vol_data(
    ctx: &Ctx,
    pv: &k8s_openapi::api::core::v1::PersistentVolume,
    node: &str,
    mount: &Path,
) -> Result<(), SimError> {
    let Some(parent) = mount.parent() else { return Ok(()) };
    let handle = pv.spec.as_ref().and_then(|s| s.csi.as_ref()).map(|c| c.volume_handle.clone());
    let data = json!({ "driverName": ctx.names.driver, "volumeHandle": handle,
                       "specVolID": name(&pv.metadata), "nodeName": node, "volumeLifecycleMode": "Persistent" });
    let path = parent.join("vol_data.json");
    tokio::fs::write(&path, data.to_string()).await.map_err(|e| SimError::io("writing", &path, e))
}

/// Unmounts and removes everything the kubelet made for a pod.
async fn teardown(ctx: &Ctx, state: &mut State, pod_uid: &str, root: Option<&Path>) {
    let setup = state.pods.remove(pod_uid);
    let root = root
        .map(Path::to_path_buf)
        .or_else(|| setup.as_ref().and_then(|s| ctx.node(&s.node)).map(|n| n.kubelet_root.clone()));
    let mut clean = true;
    if let Some(setup) = &setup {
        for mount in setup.mounts.iter().rev() {
            if let Err(e) = host::unmount(mount).await {
                tracing::warn!(mount = %mount.display(), error = %e, "unmounting");
                clean = false;
            } else if mount.is_file() {
                let _ = tokio::fs::remove_file(mount).await;
            }
        }
    }
    let Some(root) = root else { return };
    let dir = pod_dir(&root, pod_uid);
    if clean
        && let Err(e) = tokio::fs::remove_dir_all(&dir).await
        && e.kind() != std::io::ErrorKind::NotFound
    {
        tracing::warn!(dir = %dir.display(), error = %e, "removing pod folder");
    }
    if !clean {
        // Keep the record so the PV stays in use and a later pass retries.
        if let Some(setup) = setup {
            state.pods.insert(pod_uid.to_owned(), setup);
        }
    }
}

async fn delete_now(ctx: &Ctx, pod: &Pod) -> Result<(), SimError> {
    let ns = namespace(&pod.metadata);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let dp = DeleteParams {
        grace_period_seconds: Some(0),
        preconditions: Some(Preconditions {
            uid: pod.metadata.uid.clone(),
            resource_version: None,
        }),
        ..DeleteParams::default()
    };
    match api.delete(name(&pod.metadata), &dp).await {
        Ok(_) => Ok(()),
        Err(e) if is_not_found(&e) => Ok(()),
        Err(kube::Error::Api(s)) if s.code == 409 => Ok(()),
        Err(e) => Err(SimError::api("deleting", "Pod", format!("{ns}/{}", name(&pod.metadata)), e)),
    }
}

async fn set_running(ctx: &Ctx, pod: &Pod) -> Result<(), SimError> {
    let ns = namespace(&pod.metadata);
    let api: Api<Pod> = Api::namespaced(ctx.client.clone(), ns);
    let now = now();
    let pod_uid = uid(&pod.metadata);
    let ip = format!(
        "10.88.{}.{}",
        pod_uid.len() % 200,
        2 + pod_uid.bytes().map(usize::from).sum::<usize>() % 250
    );
    let condition = |kind: &str| json!({ "type": kind, "status": "True", "lastTransitionTime": now, "lastProbeTime": null });
    let containers: Vec<_> = pod
        .spec
        .iter()
        .flat_map(|s| s.containers.iter())
        .map(|c| {
            json!({ "name": c.name, "image": c.image.clone().unwrap_or_default(), "imageID": "",
                    "containerID": format!("sim://{pod_uid}/{}", c.name), "ready": true, "started": true,
                    "restartCount": 0, "state": { "running": { "startedAt": now } } })
        })
        .collect();
    // The UID makes the patch a precondition, as the real kubelet's status patches: a pod
    // deleted and made again under the same name meanwhile is another pod, not this one.
    let status = json!({ "metadata": { "uid": pod_uid }, "status": {
        "phase": "Running", "hostIP": "127.0.0.1", "hostIPs": [ { "ip": "127.0.0.1" } ],
        "podIP": ip, "podIPs": [ { "ip": ip } ], "startTime": now,
        "conditions": [ condition("PodReadyToStartContainers"), condition("Initialized"),
                        condition("Ready"), condition("ContainersReady"), condition("PodScheduled") ],
        "containerStatuses": containers,
    } });
    api.patch_status(name(&pod.metadata), &PatchParams::default(), &Patch::Merge(&status))
        .await
        .map(drop)
        .map_err(|e| {
            SimError::api("patching status of", "Pod", format!("{ns}/{}", name(&pod.metadata)), e)
        })
}
