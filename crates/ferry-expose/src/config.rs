//! What the exposers need to know about the cluster and the node.

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::time::Duration;

use ferry_api::DEFAULT_VELERO_NAMESPACE;

/// Settings shared by both exposers.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExposerConfig {
    /// Velero's namespace: the backup/restore PVCs, pods and snapshots are created there.
    pub namespace: String,
    /// The kubelet's root directory as this agent sees it (a DaemonSet mounts the host's
    /// `/var/lib/kubelet` with `HostToContainer` propagation). Volumes are found under
    /// `<kubelet_root>/pods/<podUID>/`.
    pub kubelet_root: PathBuf,
    /// The image of the pods that hold exposed volumes (the agent's own image).
    pub pod_image: String,
    /// The command those pods run: it must only wait.
    pub pod_command: Vec<String>,
    /// Backup PVC storage class per source storage class (the node-agent ConfigMap's
    /// `backupPVC.<class>.storageClass`); unlisted classes keep their own.
    pub backup_storage_class: BTreeMap<String, String>,
    /// Source storage classes whose backup PVCs are read-only (`backupPVC.<class>.readOnly`):
    /// `ReadOnlyMany` access, a read-only mount.
    pub backup_read_only: Vec<String>,
    /// Restore without waiting for a WaitForFirstConsumer target PVC's selected node
    /// (`restorePVC.ignoreDelayBinding`).
    pub ignore_delay_binding: bool,
    /// A priority class for the pods, if any.
    pub priority_class_name: Option<String>,
    /// How long a holding pod may stay unschedulable before the CR fails with the
    /// scheduler's reason (instead of waiting out the whole operation timeout).
    pub unschedulable_grace: Duration,
}

impl ExposerConfig {
    /// Defaults: Velero's namespace, `/var/lib/kubelet`, the given image running `ferry hold`.
    #[must_use]
    pub fn new(pod_image: impl Into<String>) -> Self {
        Self {
            namespace: DEFAULT_VELERO_NAMESPACE.to_owned(),
            kubelet_root: PathBuf::from("/var/lib/kubelet"),
            pod_image: pod_image.into(),
            pod_command: vec!["/ferry".into(), "hold".into()],
            backup_storage_class: BTreeMap::new(),
            backup_read_only: Vec::new(),
            ignore_delay_binding: false,
            priority_class_name: None,
            unschedulable_grace: Duration::from_secs(60),
        }
    }
}
