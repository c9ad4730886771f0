//! Agents killed with SIGKILL in the middle of an upload: restarted, the agent resumes and
//! completes; never restarted, another node takes the DataUpload over and completes it. Both
//! backups restore bit for bit.

use ferry_api::{DataDownloadPhase, DataUpload, DataUploadPhase};
use kube::ResourceExt;

use crate::harness::{TestResult, World, big_tree, dd_phase, dd_terminal, du_phase, du_terminal};

/// Creates a volume big enough to still be uploading when the test strikes, starts its
/// DataUpload and waits until it is InProgress; returns it.
async fn upload_in_progress(
    world: &World,
    tree: &ferry_sim::FsTree,
) -> Result<DataUpload, Box<dyn std::error::Error>> {
    let vs = world.volume_with_snapshot("big", "1Gi", tree).await?;
    let du = world.create_data_upload("kill", "big", &vs.name_any()).await?;
    let du: DataUpload = world
        .wait_for(&du.name_any(), "InProgress", |d: &DataUpload| {
            du_phase(d) == Some(DataUploadPhase::InProgress) || du_terminal(d)
        })
        .await?;
    assert_eq!(
        du_phase(&du),
        Some(DataUploadPhase::InProgress),
        "the upload finished before it could be interrupted: {:#?}",
        du.status
    );
    Ok(du)
}

async fn completes_and_restores(
    world: &World,
    du: &DataUpload,
    tree: &ferry_sim::FsTree,
) -> Result<DataUpload, Box<dyn std::error::Error>> {
    let du: DataUpload = world.wait_for(&du.name_any(), "terminal", du_terminal).await?;
    assert_eq!(
        du_phase(&du),
        Some(DataUploadPhase::Completed),
        "{:#?}\n{}",
        du.status,
        world.agent_logs()
    );
    let dd = world.create_data_download("kill-restore", &world.ns, "big-back", "1Gi", &du).await?;
    let dd = world.wait_for(&dd.name_any(), "terminal", dd_terminal).await?;
    assert_eq!(dd_phase(&dd), Some(DataDownloadPhase::Completed), "{:#?}", dd.status);
    let restored = world.sim().read_files(&world.ns, "big-back").await?;
    assert!(restored == *tree, "restored tree differs from the original");
    Ok(du)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_agent_killed_mid_upload_resumes_after_restart() -> TestResult {
    let mut world = World::start("e2e-kill").await?;
    let tree = big_tree(3, 96, 41);
    let du = upload_in_progress(&world, &tree).await?;
    let node = du.status.clone().unwrap_or_default().node;
    world.kill_agent(&node);
    tokio::time::sleep(std::time::Duration::from_secs(1)).await;
    world.start_agent(&node)?;
    let du = completes_and_restores(&world, &du, &tree).await?;
    let status = du.status.unwrap_or_default();
    eprintln!(
        "resumed upload: {} bytes total, {} new after the restart",
        status.progress.total_bytes, status.incremental_bytes
    );
    world.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_lost_node_s_upload_is_taken_over_by_another_node() -> TestResult {
    let mut world = World::start("e2e-lost").await?;
    let tree = big_tree(3, 96, 43);
    let du = upload_in_progress(&world, &tree).await?;
    let lost = du.status.clone().unwrap_or_default().node;
    world.kill_agent(&lost);
    let du = completes_and_restores(&world, &du, &tree).await?;
    let status = du.status.clone().unwrap_or_default();
    assert_ne!(status.node, lost, "completed on the node that was lost");
    assert_eq!(du.annotations().get("ferry.io/lost-nodes"), Some(&lost));
    world.shutdown().await
}
