//! Restore targets beyond the plain case: a PVC of a WaitForFirstConsumer class whose node is
//! chosen by the workload that uses it, and a PVC that is already bound (refused at once).

use ferry_api::k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use ferry_api::{DataDownload, DataDownloadPhase, DataUpload, DataUploadPhase};
use ferry_sim::{Binding, FsTree, SELECTED_NODE_ANNOTATION, VolumeMode};
use ferry_testbed::VELERO_NAMESPACE;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};

use crate::harness::{TestResult, WAIT, World, dd_phase, dd_terminal, du_phase, du_terminal};

/// Backs up a fresh volume holding `tree`; returns the Completed DataUpload.
async fn backed_up(
    world: &World,
    pvc: &str,
    tree: &FsTree,
) -> Result<DataUpload, Box<dyn std::error::Error>> {
    let vs = world.volume_with_snapshot(pvc, "64Mi", tree).await?;
    let du = world.create_data_upload("targets", pvc, &vs.name_any()).await?;
    let du: DataUpload = world.wait_for(&du.name_any(), "terminal", du_terminal).await?;
    assert_eq!(
        du_phase(&du),
        Some(DataUploadPhase::Completed),
        "{:#?}\n{}",
        du.status,
        world.agent_logs()
    );
    Ok(du)
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_into_a_wait_for_first_consumer_pvc_lands_on_the_workload_s_node() -> TestResult {
    let world = World::start("e2e-wffc").await?;
    let tree = FsTree::sample(23);
    let du = backed_up(&world, "data", &tree).await?;
    // Velero restores the PVC (unbound, WaitForFirstConsumer), then the workload using it.
    world
        .create_target_pvc(&world.ns, "wffc", "64Mi", "Filesystem", Binding::WaitForFirstConsumer)
        .await?;
    let dd = world.create_data_download_for("wffc-restore", &world.ns, "wffc", &du).await?;
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), &world.ns);
    let app = ferry_sim::pod_object("app", "wffc", VolumeMode::Filesystem)?;
    pods.create(&PostParams::default(), &app).await?;

    let dd: DataDownload = world.wait_for(&dd.name_any(), "terminal", dd_terminal).await?;
    let status = dd.status.clone().unwrap_or_default();
    assert_eq!(
        dd_phase(&dd),
        Some(DataDownloadPhase::Completed),
        "{status:#?}\n{}",
        world.agent_logs()
    );
    // The scheduler chose a node for the workload; the restore ran there and the volume
    // is pinned to it.
    let targets: Api<PersistentVolumeClaim> = Api::namespaced(world.client.clone(), &world.ns);
    let target = targets.get("wffc").await?;
    let selected = target
        .annotations()
        .get(SELECTED_NODE_ANNOTATION)
        .cloned()
        .ok_or("the scheduler never selected a node for the target PVC")?;
    assert_eq!(status.node, selected, "restore ran elsewhere: {status:#?}");
    let pv_name = target.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
    let pv = Api::<PersistentVolume>::all(world.client.clone()).get(&pv_name).await?;
    let affinity = serde_json::to_string(&pv.spec.as_ref().and_then(|s| s.node_affinity.clone()))?;
    assert!(affinity.contains(&selected), "PV {pv_name} node affinity: {affinity}");
    // The workload runs on that node and sees the restored data through its own mount.
    let app = world.sim().wait_pod_running(&world.ns, "app", WAIT).await?;
    assert_eq!(app.spec.as_ref().and_then(|s| s.node_name.as_deref()), Some(selected.as_str()));
    let path = world.sim().pod_claim_path(&app, "wffc").await?;
    let seen = tokio::task::spawn_blocking(move || FsTree::read_from(&path)).await??;
    assert!(seen == tree, "the workload sees other data than was backed up");
    // The restore pod and PVC are gone.
    let left = world.leftovers_of(&dd.name_any()).await?;
    assert!(left.is_empty(), "left behind: {left:?}");
    pods.delete("app", &DeleteParams::default()).await?;
    ferry_sim::wait_gone(&pods, "app", WAIT).await?;
    world.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_restore_into_an_already_bound_pvc_fails_at_once_naming_pvc_and_pv() -> TestResult {
    let world = World::start("e2e-bound").await?;
    let du = backed_up(&world, "data", &FsTree::sample(29)).await?;
    let sim = world.sim();
    sim.create_pvc(&world.ns, "taken", "64Mi", VolumeMode::Filesystem, Binding::Immediate).await?;
    let taken = sim.wait_pvc_bound(&world.ns, "taken", WAIT).await?;
    let pv = taken.spec.as_ref().and_then(|s| s.volume_name.clone()).unwrap_or_default();
    assert!(!pv.is_empty());
    let dd = world.create_data_download_for("bound-restore", &world.ns, "taken", &du).await?;
    let name = dd.name_any();
    let dd: DataDownload = world.wait_for(&name, "terminal", dd_terminal).await?;
    let status = dd.status.clone().unwrap_or_default();
    assert_eq!(dd_phase(&dd), Some(DataDownloadPhase::Failed), "{status:#?}");
    let message = &status.message;
    assert!(message.contains(&format!("{}/taken", world.ns)), "{message}");
    assert!(message.contains(&pv), "{message}");
    assert!(!message.contains("timed out"), "{message}");
    // Refused on sight, not after waiting out the operation timeout (10 minutes).
    let created = dd.creation_timestamp().ok_or("no creationTimestamp")?.0;
    let failed = status.completion_timestamp.ok_or("no completionTimestamp")?.0;
    let took = failed.duration_since(created).unsigned_abs();
    assert!(took < std::time::Duration::from_secs(120), "failed after {took:?}");
    // The user's PVC and its volume are untouched; nothing of Ferry's is left.
    let after = Api::<PersistentVolumeClaim>::namespaced(world.client.clone(), &world.ns)
        .get("taken")
        .await?;
    assert_eq!(after.spec.as_ref().and_then(|s| s.volume_name.as_deref()), Some(pv.as_str()));
    assert_eq!(after.status.as_ref().and_then(|s| s.phase.as_deref()), Some("Bound"));
    let left = world.leftovers_of(&name).await?;
    assert!(left.is_empty(), "left behind: {left:?}");
    let api: Api<DataDownload> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    for _ in 0..100 {
        if api.get(&name).await?.finalizers().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    assert!(api.get(&name).await?.finalizers().is_empty(), "finalizer kept");
    world.shutdown().await
}
