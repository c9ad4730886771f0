//! Finding an exposed volume under the kubelet's pods directory.
//!
//! The kubelet puts a pod's volumes at `<root>/pods/<podUID>/volumes/<plugin>/<pvName>` (CSI
//! volumes are mounted one level deeper, at `…/mount`) and a block volume's device at
//! `<root>/pods/<podUID>/volumeDevices/<plugin>/<pvName>`. The plugin directory depends on the
//! volume's driver (`kubernetes.io~csi` for every CSI driver), so it is looked up.

use std::os::fd::OwnedFd;
use std::os::unix::fs::FileTypeExt;
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

/// Looks for the volume in every plugin directory of the pod and returns it once it is usable,
/// opened (`O_PATH`) and checked on the descriptor: a mounted directory (a mount root by mount
/// identity, so a bind mount of a directory on the kubelet's own file system counts, as the
/// CSI hostpath driver publishes volumes; a symbolic link does not) or a block device.
/// `Ok(None)` while the kubelet has not set it up.
///
/// # Errors
/// I/O errors other than "not there (yet)".
pub fn find_volume(
    kubelet_root: &Path,
    pod_uid: &str,
    pv_name: &str,
    mode: VolumeMode,
) -> std::io::Result<Option<(PathBuf, OwnedFd)>> {
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
        if let Some(fd) = open_usable(&path, mode)? {
            return Ok(Some((path, fd)));
        }
    }
    Ok(None)
}

/// Why the volume is not usable at `path` yet, for a message: what the kubelet has set up there.
#[must_use]
pub(crate) fn what_is_at(path: &Path, mode: VolumeMode) -> String {
    let at = path.display();
    let meta = match std::fs::metadata(path) {
        Ok(meta) => meta,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return format!("nothing at {at}"),
        Err(e) => return format!("{at} cannot be examined: {e}"),
    };
    match mode {
        VolumeMode::Block if meta.file_type().is_block_device() => format!("{at} is ready"),
        VolumeMode::Block => format!("{at} is not a block device"),
        VolumeMode::Filesystem if !meta.is_dir() => format!("{at} is not a directory"),
        VolumeMode::Filesystem => match crate::mount::is_mount_point(path) {
            Ok(true) => format!("{at} is mounted"),
            Ok(false) => format!("{at} is a directory but nothing is mounted on it"),
            Err(e) => format!("{at} cannot be examined: {e}"),
        },
    }
}

/// The volume at `path` opened, if it is usable there.
fn open_usable(path: &Path, mode: VolumeMode) -> std::io::Result<Option<OwnedFd>> {
    use rustix::io::Errno;
    // Nothing there, or not what it must be (yet): a file where a directory belongs, a
    // symbolic link.
    let not_yet = |e: &std::io::Error| {
        [Errno::NOENT, Errno::NOTDIR, Errno::LOOP]
            .iter()
            .any(|n| e.raw_os_error() == Some(n.raw_os_error()))
    };
    let opened = match mode {
        VolumeMode::Filesystem => crate::mount::open_mount_root(path),
        VolumeMode::Block => open_block_device(path),
    };
    match opened {
        Ok(fd) => Ok(fd),
        Err(e) if not_yet(&e) => Ok(None),
        Err(e) => Err(e),
    }
}

/// The block device at `path` (the kubelet may link it), opened `O_PATH`; `None` for anything
/// else.
fn open_block_device(path: &Path) -> std::io::Result<Option<OwnedFd>> {
    use rustix::fs::{FileType, Mode, OFlags, fstat, openat};
    let fd = openat(rustix::fs::CWD, path, OFlags::PATH | OFlags::CLOEXEC, Mode::empty())?;
    let is_block = FileType::from_raw_mode(fstat(&fd)?.st_mode) == FileType::BlockDevice;
    Ok(is_block.then_some(fd))
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::MetadataExt;

    use super::*;
    use crate::mount::testing::Mounted;

    /// Where `find_volume` finds volume `pv` of pod `u`.
    fn found(root: &Path, mode: VolumeMode) -> std::io::Result<Option<PathBuf>> {
        Ok(find_volume(root, "u", "pv", mode)?.map(|(path, _)| path))
    }

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
        assert_eq!(found(root.path(), VolumeMode::Filesystem)?, None);
        std::fs::create_dir_all(&dir)?;
        // A plain directory on the same file system is not a mount: not ready.
        assert_eq!(found(root.path(), VolumeMode::Filesystem)?, None);
        // A regular file is not a block device.
        let dev = pod_volume_path(root.path(), "u", "kubernetes.io~csi", "pv", VolumeMode::Block);
        std::fs::create_dir_all(dev.parent().expect("parent"))?;
        std::fs::write(&dev, b"x")?;
        assert_eq!(found(root.path(), VolumeMode::Block)?, None);
        assert!(what_is_at(&dir, VolumeMode::Filesystem).ends_with("nothing is mounted on it"));
        assert!(what_is_at(&dev, VolumeMode::Block).ends_with("is not a block device"));
        Ok(())
    }

    /// The hostpath driver's way: a directory of the kubelet's own file system bind-mounted at
    /// the volume's `mount` directory, on the same device as its parent.
    #[test]
    fn a_bind_mounted_volume_is_found() -> std::io::Result<()> {
        let root = tempfile::tempdir()?;
        let dir =
            pod_volume_path(root.path(), "u", "kubernetes.io~csi", "pv", VolumeMode::Filesystem);
        std::fs::create_dir_all(&dir)?;
        let published = root.path().join("plugins/csi-hostpath/pv");
        std::fs::create_dir_all(&published)?;
        let _mounted = Mounted::bind(&published, &dir)?;
        assert_eq!(std::fs::metadata(&dir)?.dev(), std::fs::metadata(root.path())?.dev());
        assert_eq!(found(root.path(), VolumeMode::Filesystem)?, Some(dir.clone()));
        assert!(what_is_at(&dir, VolumeMode::Filesystem).ends_with("is mounted"));
        Ok(())
    }

    #[test]
    fn a_directory_bind_mounted_onto_itself_is_found() -> std::io::Result<()> {
        let root = tempfile::tempdir()?;
        let dir =
            pod_volume_path(root.path(), "u", "kubernetes.io~csi", "pv", VolumeMode::Filesystem);
        std::fs::create_dir_all(&dir)?;
        let _mounted = Mounted::bind(&dir, &dir)?;
        assert_eq!(found(root.path(), VolumeMode::Filesystem)?, Some(dir));
        Ok(())
    }

    #[test]
    fn a_mounted_file_system_is_found() -> std::io::Result<()> {
        let root = tempfile::tempdir()?;
        let dir = pod_volume_path(
            root.path(),
            "u",
            "kubernetes.io~local-volume",
            "pv",
            VolumeMode::Filesystem,
        );
        std::fs::create_dir_all(&dir)?;
        let _mounted = Mounted::tmpfs(&dir)?;
        assert_eq!(found(root.path(), VolumeMode::Filesystem)?, Some(dir));
        Ok(())
    }
}
