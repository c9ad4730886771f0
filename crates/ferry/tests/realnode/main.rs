//! End to end on a real node: a real kubelet with containerd and runc, the CSI hostpath driver
//! with the real provisioner, snapshotter and snapshot-controller, Ferry installed from its own
//! Helm chart as an image of the `ferry` binary, and S3 (moto) behind a BackupStorageLocation.
//! DataUploads and DataDownloads are created exactly as Velero's CSI plugin creates them; data
//! is written and compared by pods.
//!
//! The cluster is started once for this test binary (`RealCluster::shared`); if it cannot
//! start, every test fails with the reason.

mod cbt;
mod cbt_ext4;
mod cbt_wrong;
mod holder;
mod lifecycle;
mod node;
mod round_trip;
mod velero;
#[path = "../support/velero_crs.rs"]
mod velero_crs;
