//! Backup deletion: the record Ferry's delete action writes for a deleted backup's DataUpload
//! makes an agent forget the snapshot; restoring it afterwards fails, naming the snapshot.

use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::ConfigMap;
use ferry_api::{Backup, DataDownloadPhase, DataUpload, DataUploadPhase};
use ferry_sim::FsTree;
use ferry_testbed::VELERO_NAMESPACE;
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::harness::{TestResult, World, dd_phase, dd_terminal, du_phase, du_terminal};

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_deleted_backup_s_snapshot_is_forgotten() -> TestResult {
    let world = World::start("e2e-delete").await?;
    let vs = world.volume_with_snapshot("doomed", "32Mi", &FsTree::sample(11)).await?;
    let du = world.create_data_upload("doomed-backup", "doomed", &vs.name_any()).await?;
    let du: DataUpload = world.wait_for(&du.name_any(), "terminal", du_terminal).await?;
    assert_eq!(du_phase(&du), Some(DataUploadPhase::Completed), "{:#?}", du.status);
    let snapshot = du.status.clone().unwrap_or_default().snapshot_id;

    // What Velero's deletion of the backup makes Ferry's delete action write.
    let backup: Backup = serde_json::from_value(json!({
        "apiVersion": "velero.io/v1", "kind": "Backup",
        "metadata": { "name": "doomed-backup", "namespace": VELERO_NAMESPACE },
        "spec": { "storageLocation": world.bsl },
    }))?;
    let record = ferry_dmp::snapshot_info_config_map(&backup, &du, &world.mover)
        .ok_or("the delete action wrote no record for a completed DataUpload")?;
    let maps: Api<ConfigMap> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    let record = maps.create(&PostParams::default(), &record).await?;
    let start = Instant::now();
    while maps.get_opt(&record.name_any()).await?.is_some() {
        assert!(
            start.elapsed() < Duration::from_secs(120),
            "the record was never handled\n{}",
            world.agent_logs()
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }

    // The snapshot is gone from the repository: a restore of it fails and says why.
    let dd = world.create_data_download("too-late", &world.ns, "doomed-back", "32Mi", &du).await?;
    let dd = world.wait_for(&dd.name_any(), "terminal", dd_terminal).await?;
    let status = dd.status.clone().unwrap_or_default();
    assert_eq!(dd_phase(&dd), Some(DataDownloadPhase::Failed), "{status:#?}");
    assert!(
        status.message.contains(&snapshot) && status.message.contains("not found"),
        "{}",
        status.message
    );
    world.shutdown().await
}
