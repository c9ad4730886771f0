//! Finding an exposed volume under the kubelet's pods directory.
//!
//! The kubelet puts a pod's volumes at `<root>/pods/<podUID>/volumes/<plugin>/<pvName>` (CSI
//! volumes are mounted one level deeper, at `…/mount`) and a block volume's device at
//! `<root>/pods/<podUID>/volumeDevices/<plugin>/<pvName>`. The plugin directory depends on the
//! volume's driver (`kubernetes.io~csi` for every CSI driver), so it is looked up.

use std::os::unix::fs::{FileTypeExt, MetadataExt};
use std::path::{Path, PathBuf};

use ferry_agent::VolumeMode;

/// Where the kubelet exposes volume `pv_name` of pod `pod_uid` for a plugin directory
/// (`kubernetes.io~csi`): the mount directory or the block device.
#[must_use]
pub fn pod_volume_path(
    kubelet_root: &Path,
    pod_uid: &str,
    plugin_dir: &str,
    pv_name: &str,
    mode: VolumeMode,
) -> PathBuf {
    let pod = kubelet_root.join("pods").join(pod_uid);
    match mode {
        VolumeMode::Filesystem => {
            let dir = pod.join("volumes").join(plugin_dir).join(pv_name);
            if plugin_dir == "kubernetes.io~csi" { dir.join("mount") } else { dir }
        }
        VolumeMode::Block => pod.join("volumeDevices").join(plugin_dir).join(pv_name),
    }
}

/// Looks for the volume in every plugin directory of the pod and returns it once it is usable:
/// a mounted directory (a mount point: its device differs from its parent's) or a block device.
/// `Ok(None)` while the kubelet has not set it up.
///
/// # Errors
/// I/O errors other than "not there (yet)".
pub fn find_volume(
    kubelet_root: &Path,
    pod_uid: &str,
    pv_name: &str,
    mode: VolumeMode,
) -> std::io::Result<Option<PathBuf>> {
    let sub = match mode {
        VolumeMode::Filesystem => "volumes",
        VolumeMode::Block => "volumeDevices",
    };
    let plugins = kubelet_root.join("pods").join(pod_uid).join(sub);
    let entries = match std::fs::read_dir(&plugins) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(None),
        Err(e) => return Err(e),
    };
    for entry in entries {
        let plugin = entry?.file_name();
        let Some(plugin) = plugin.to_str() else { continue };
        let path = pod_volume_path(kubelet_root, pod_uid, plugin, pv_name, mode);
        if usable(&path, mode)? {
            return Ok(Some(path));
        }
    }
    Ok(None)
}

fn usable(path: &Path, mode: VolumeMode) -> std::io::Result<bool> {
    let meta = match std::fs::metadata(path) {
        Ok(m) => m,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(false),
        Err(e) => return Err(e),
    };
    Ok(match mode {
        VolumeMode::Block => meta.file_type().is_block_device(),
        VolumeMode::Filesystem => {
            let Some(parent) = path.parent() else { return Ok(false) };
            meta.is_dir() && std::fs::metadata(parent)?.dev() != meta.dev()
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_follow_the_kubelet_layout() {
        let root = Path::new("/var/lib/kubelet");
        assert_eq!(
            pod_volume_path(root, "u1", "kubernetes.io~csi", "pv-1", VolumeMode::Filesystem),
            Path::new("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~csi/pv-1/mount")
        );
        assert_eq!(
            pod_volume_path(
                root,
                "u1",
                "kubernetes.io~local-volume",
                "pv-1",
                VolumeMode::Filesystem
            ),
            Path::new("/var/lib/kubelet/pods/u1/volumes/kubernetes.io~local-volume/pv-1")
        );
        assert_eq!(
            pod_volume_path(root, "u1", "kubernetes.io~csi", "pv-1", VolumeMode::Block),
            Path::new("/var/lib/kubelet/pods/u1/volumeDevices/kubernetes.io~csi/pv-1")
        );
    }

    #[test]
    fn an_unmounted_directory_is_not_usable_yet() -> std::io::Result<()> {
        let root = tempfile::tempdir()?;
        let dir =
            pod_volume_path(root.path(), "u", "kubernetes.io~csi", "pv", VolumeMode::Filesystem);
        assert_eq!(find_volume(root.path(), "u", "pv", VolumeMode::Filesystem)?, None);
        std::fs::create_dir_all(&dir)?;
        // A plain directory on the same file system is not a mount: not ready.
        assert_eq!(find_volume(root.path(), "u", "pv", VolumeMode::Filesystem)?, None);
        // A regular file is not a block device.
        let dev = pod_volume_path(root.path(), "u", "kubernetes.io~csi", "pv", VolumeMode::Block);
        std::fs::create_dir_all(dev.parent().expect("parent"))?;
        std::fs::write(&dev, b"x")?;
        assert_eq!(find_volume(root.path(), "u", "pv", VolumeMode::Block)?, None);
        Ok(())
    }
}
