//! Ferry's exposers: how a DataUpload's CSI snapshot and a DataDownload's target volume become
//! reachable on a node.
//!
//! - [`CsiBackupExposer`] (DataUploads): waits for the source VolumeSnapshot, hands the
//!   physical snapshot to a backup VolumeSnapshotContent/VolumeSnapshot pair in Velero's
//!   namespace (the source objects are deleted with the content set to `Retain`, so the
//!   snapshot survives them), creates a backup PVC from it and a pod that holds the PVC. The
//!   cluster schedules the pod; the agent on that node reads the volume through the kubelet's
//!   pods directory. Cleanup deletes the pod, the PVC and the backup snapshot objects, and with
//!   them the physical snapshot.
//! - [`CsiRestoreExposer`] (DataDownloads): waits for the target PVC (and, for
//!   WaitForFirstConsumer classes, the node the scheduler chose for it), provisions a restore
//!   PVC like it with a pod on that node; after the data is written it hands the volume to the
//!   target PVC: reclaim policy `Retain`, restore pod and PVC deleted, the PV's `claimRef`
//!   pointed at the target with the `velero.io/dynamic-pv-restore` label, the bind awaited, the
//!   reclaim policy put back.
//!
//! Velero's node-agent ConfigMap shapes both: [`ExposerConfig::apply_node_agent_config`] maps
//! its `backupPVC`, `restorePVC`, `priorityClassName`, `loadAffinity` (node affinity of the
//! holding pods, per storage class), `podResources`, `podLabels` and `podAnnotations`.
//!
//! Every wait is bounded by the CR's `operationTimeout` and its cancellation, and a pod that
//! fails, or that the scheduler rejects for longer than [`ExposerConfig::unschedulable_grace`],
//! fails the CR with the cluster's reason (a claim not bound yet is waited for: a volume made
//! from a snapshot may take minutes to provision; past the grace, what the provisioner last
//! said of the claim is told in a [`WAITING_FOR_PROVISIONING`] Event and ends up in the
//! timeout's message). While the agent looks
//! for the exposed volume on its node (a mount point by mount identity, so bind mounts count),
//! a wait longer than [`ExposerConfig::volume_wait_grace`] is told in a log line and a
//! [`WAITING_FOR_VOLUME`] Warning Event naming the pod, the volume and the path expected.
//! Names become label values by Velero's rule (at most 63 characters, a hash past that).
//!
//! Every step is idempotent: an agent that restarts (or a node that takes a CR over) runs them
//! again and continues from what exists.

mod backup;
mod config;
mod error;
mod kept;
mod kubelet;
mod mount;
mod objects;
mod ops;
mod placement;
mod pod;
mod provisioning;
mod quantity;
mod release;
mod resources;
mod restore;
mod tell;
mod tolerations;
mod topology;
mod volume_wait;
mod wait;

pub use backup::CsiBackupExposer;
pub use config::{ExposerConfig, ExposerConfigError};
pub use error::ExposeError;
pub use kept::{
    KEEP_BASE_ANNOTATION, KEPT_BASE_LABEL, KeptBase, kept_bases, release_kept_base,
    release_orphaned_kept_bases,
};
pub use kubelet::{find_volume, pod_volume_path};
pub use placement::LoadAffinity;
pub use provisioning::WAITING_FOR_PROVISIONING;
pub use quantity::QuantityError;
pub use resources::{PodResourcesError, pod_resources};
pub use restore::CsiRestoreExposer;
pub use tolerations::{
    UNSCHEDULABLE_TAINT, holder_tolerations, no_schedule_keys, tolerates_cordon,
};
pub use volume_wait::WAITING_FOR_VOLUME;

/// Labels and annotations Ferry puts on the objects it creates.
pub mod labels {
    /// On the backup/restore pod and PVC: which data mover made them.
    pub const CREATED_BY: &str = "ferry.io/created-by";
    /// On a restore PV while Ferry holds it: the reclaim policy to put back after the bind.
    pub const ORIGINAL_RECLAIM_POLICY: &str = "ferry.io/original-reclaim-policy";
    /// On a restore PV while Ferry holds it: the DataDownload it belongs to.
    pub const RESTORE_FOR: &str = "ferry.io/restore-for";
}
