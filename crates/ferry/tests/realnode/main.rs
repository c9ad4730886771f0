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
mod kept;
mod lifecycle;
mod metrics;
mod node;
mod provisioning;
mod round_trip;
mod velero;
#[path = "../support/velero_crs.rs"]
mod velero_crs;

/// The real Velero server's scenarios (`velero.rs`), one after another as one test. As one test
/// they hold one of libtest's threads while the other runs this binary's other tests beside
/// them; as separate tests they held both threads, one waiting for the other's Velero server.
/// libtest starts tests in the order of their names, and this name sorts first: the longest
/// chain starts at once instead of running alone at the end.
#[tokio::test]
async fn a_real_velero_server_drives_ferry_in_each_scenario_in_turn() -> node::TestResult {
    velero::each_scenario_in_turn().await
}
