//! Deleting a holding pod so that its volume is deleted only after its node let go of it.
//!
//! A volume deleted while a kubelet still has it published stays published for good: the
//! driver no longer knows the volume, so the kubelet's unpublish fails on every retry, and the
//! mount (or the block device's mapping) is left on the node. Kubernetes orders this for a
//! pod deleted gracefully (the kubelet removes the pod object only after unmounting its
//! volumes, and PVC protection keeps the claim while the pod object exists), but not for a pod
//! already in a terminal phase (evicted, or its container ended): the API server removes such
//! a pod at once, and PVC protection lets the claim go while the kubelet is still unmounting.
//! Volumes of drivers without attach are not in the node's `status.volumesInUse` either.
//!
//! So the exposers delete a holding pod with [`delete_holder`], which waits until the pod
//! object is gone and, on the agent's own node, until the kubelet's entries for the claim's
//! volume are gone (see [`kubelet_entries`]), before they delete the claim or hand the volume
//! over. The wait is keyed on the exposer's own claim's volume, which only the holding pod
//! uses, so a retry after a failed or interrupted attempt waits again. It ends, saying why,
//! when the holding pod ran on another node (only its object's removal can be seen from here),
//! when that node is not Ready (nothing there can release the volume), and after
//! [`RELEASE_WAIT`] or the CR's operation timeout, whichever is shorter.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_agent::VolumeMode;
use ferry_api::k8s_openapi::api::core::v1::{Node, PersistentVolumeClaim, Pod};
use kube::Client;
use kube::api::Api;

use crate::ops::{delete_if_present, get_opt};
use crate::{ExposeError, ExposerConfig};

/// The longest wait for a node to let go of a deleted holding pod's volume; the claim is
/// deleted after it in any case (the node may have lost its kubelet).
pub(crate) const RELEASE_WAIT: Duration = Duration::from_secs(120);

/// The pause between looks.
const LOOK_EVERY: Duration = Duration::from_millis(500);

/// The CSI plugin's folder names in the kubelet's directory.
const CSI_PLUGIN_DIR: &str = "kubernetes.io~csi";

/// Deletes holding pod `pod` (of claim `claim`) in the exposer's namespace and waits until
/// its node has let go of the claim's volume (see the module's documentation), for at most
/// `timeout` (zero: no bound of the CR's own) and [`RELEASE_WAIT`].
///
/// # Errors
/// The API refused a read or the deletion.
pub(crate) async fn delete_holder(
    client: &Client,
    config: &ExposerConfig,
    pod: &str,
    claim: &str,
    timeout: Duration,
    step: &'static str,
) -> Result<(), ExposeError> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), &config.namespace);
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &config.namespace);
    let holder = get_opt(&pods, pod, "reading the holding pod").await?;
    let spec = get_opt(&claims, claim, "reading the holding pod's PVC")
        .await?
        .and_then(|c| c.spec)
        .unwrap_or_default();
    let pv = spec.volume_name.filter(|v| !v.is_empty());
    let mode =
        spec.volume_mode.as_deref().map_or(VolumeMode::Filesystem, crate::backup::parse_mode);
    let node = holder.as_ref().and_then(|p| p.spec.as_ref()?.node_name.clone());
    delete_if_present(&pods, pod, step).await?;
    let wait = if timeout.is_zero() { RELEASE_WAIT } else { timeout.min(RELEASE_WAIT) };
    let deadline = tokio::time::Instant::now() + wait;
    // Only this agent's node's kubelet can be looked at; on a retry the pod is gone, and its
    // node unknown: the claim's volume is looked for here, as the pod most likely ran here.
    let local = match (&node, &config.node_name) {
        (Some(theirs), Some(ours)) if theirs != ours => {
            tracing::info!(
                pod,
                node = %theirs,
                "the holding pod ran on another node: waiting for its removal only, not for that \
                 node's kubelet to let go of its volume"
            );
            false
        }
        _ => true,
    };
    loop {
        let mut left = Vec::new();
        if get_opt(&pods, pod, "reading the holding pod").await?.is_some() {
            left.push(format!("pod {pod} is still terminating"));
        }
        if let (true, Some(pv)) = (local, &pv) {
            left.extend(kubelet_entries(&config.kubelet_root, pv, mode));
        }
        if left.is_empty() {
            return Ok(());
        }
        if let Some(node) = &node
            && !node_ready(client, node).await?
        {
            tracing::info!(pod, %node, "the holding pod's node is not Ready: not waiting for it");
            return Ok(());
        }
        if tokio::time::Instant::now() >= deadline {
            tracing::warn!(
                pod,
                claim,
                "the node has not let go of the volume {wait:?} after its holding pod was \
                 deleted ({}); deleting the PVC anyway",
                left.join("; ")
            );
            return Ok(());
        }
        tokio::time::sleep(LOOK_EVERY).await;
    }
}

/// What the kubelet under `kubelet_root` (this agent's view of it) still has of volume `pv`:
/// a pod's mount directory for a file-system volume, a pod's device entry and the driver's
/// publish path for a block volume. The kubelet removes a file-system volume's mount
/// directory after the driver unpublished it; for a block volume it removes the pod's device
/// entry *before* the driver unpublishes, and the driver removes the publish path
/// (`plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod uid>`) when it does. An entry
/// that cannot be read counts as held, with the error.
fn kubelet_entries(kubelet_root: &Path, pv: &str, mode: VolumeMode) -> Vec<String> {
    let mut held = Vec::new();
    let mut look = |path: PathBuf| match std::fs::symlink_metadata(&path) {
        Ok(_) => held.push(format!("the kubelet still has {}", path.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {}
        Err(e) => held.push(format!("cannot look at {}: {e}", path.display())),
    };
    match list(&kubelet_root.join("pods")) {
        Ok(uids) => {
            for uid in uids {
                look(crate::pod_volume_path(kubelet_root, &uid, CSI_PLUGIN_DIR, pv, mode));
            }
        }
        Err(e) => held.push(e),
    }
    if mode == VolumeMode::Block {
        let publish = kubelet_root.join("plugins/kubernetes.io/csi/volumeDevices/publish").join(pv);
        match list(&publish) {
            Ok(uids) => held.extend(uids.into_iter().map(|uid| {
                format!("the driver has not unpublished {}", publish.join(uid).display())
            })),
            Err(e) => held.push(e),
        }
    }
    held
}

/// The names in folder `dir`; none when it does not exist.
fn list(dir: &Path) -> Result<Vec<String>, String> {
    match std::fs::read_dir(dir) {
        Ok(entries) => entries
            .map(|e| e.map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect::<Result<_, _>>()
            .map_err(|e| format!("cannot list {}: {e}", dir.display())),
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => Ok(Vec::new()),
        Err(e) => Err(format!("cannot list {}: {e}", dir.display())),
    }
}

/// Whether node `name` exists and is Ready (only a running kubelet releases volumes).
async fn node_ready(client: &Client, name: &str) -> Result<bool, ExposeError> {
    let nodes: Api<Node> = Api::all(client.clone());
    let Some(node) = get_opt(&nodes, name, "reading the holding pod's node").await? else {
        return Ok(false);
    };
    Ok(node
        .status
        .and_then(|s| s.conditions)
        .unwrap_or_default()
        .iter()
        .any(|c| c.type_ == "Ready" && c.status == "True"))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    fn held(root: &Path, pv: &str, mode: VolumeMode) -> bool {
        !kubelet_entries(root, pv, mode).is_empty()
    }

    #[test]
    fn a_file_system_volume_is_held_while_a_pods_mount_directory_for_it_exists() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        assert!(!held(root, "pv-1", VolumeMode::Filesystem), "no kubelet folder yet");
        let mount =
            crate::pod_volume_path(root, "u1", CSI_PLUGIN_DIR, "pv-1", VolumeMode::Filesystem);
        std::fs::create_dir_all(&mount).unwrap();
        std::fs::create_dir_all(root.join("pods/u2")).unwrap();
        assert!(held(root, "pv-1", VolumeMode::Filesystem));
        // Another volume, or the block layout: not this one.
        assert!(!held(root, "pv-2", VolumeMode::Filesystem));
        assert!(!held(root, "pv-1", VolumeMode::Block));
        std::fs::remove_dir_all(mount.parent().unwrap()).unwrap();
        assert!(!held(root, "pv-1", VolumeMode::Filesystem));
    }

    #[test]
    fn a_block_volume_is_held_until_the_driver_removed_its_publish_path() {
        let root = tempfile::tempdir().unwrap();
        let root = root.path();
        // The pod's device entry (a link to the publish path) and the publish path.
        let entry = crate::pod_volume_path(root, "u1", CSI_PLUGIN_DIR, "pv-1", VolumeMode::Block);
        std::fs::create_dir_all(entry.parent().unwrap()).unwrap();
        let publish = root.join("plugins/kubernetes.io/csi/volumeDevices/publish/pv-1/u1");
        std::fs::create_dir_all(publish.parent().unwrap()).unwrap();
        std::fs::write(&publish, b"").unwrap();
        std::os::unix::fs::symlink(&publish, &entry).unwrap();
        assert!(held(root, "pv-1", VolumeMode::Block));
        // The kubelet removes the pod's entry first: still published.
        std::fs::remove_file(&entry).unwrap();
        assert!(held(root, "pv-1", VolumeMode::Block));
        assert!(!held(root, "pv-2", VolumeMode::Block));
        // The driver unpublished it.
        std::fs::remove_file(&publish).unwrap();
        assert!(!held(root, "pv-1", VolumeMode::Block));
    }

    #[test]
    fn an_unreadable_kubelet_folder_counts_as_held() {
        let root = tempfile::tempdir().unwrap();
        // `pods` is a file: listing it fails with something other than "not found".
        std::fs::write(root.path().join("pods"), b"").unwrap();
        let entries = kubelet_entries(root.path(), "pv-1", VolumeMode::Filesystem);
        assert_eq!(entries.len(), 1, "{entries:?}");
        assert!(entries[0].starts_with("cannot list"), "{entries:?}");
    }
}
