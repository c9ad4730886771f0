//! DataUploads off the happy path: every agent killed while one waits in Accepted for its
//! snapshot (it completes after the restart), and a source VolumeSnapshot that does not exist
//! (Failed at once, naming it, with nothing left behind).

use ferry_api::{
    DataDownloadPhase, DataUpload, DataUploadPhase, VolumeSnapshot, VolumeSnapshotClass,
};
use ferry_sim::{Binding, FsTree, VolumeMode};
use ferry_testbed::VELERO_NAMESPACE;
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use crate::harness::{TestResult, WAIT, World, dd_phase, dd_terminal, du_phase, du_terminal};

/// Deletes a cluster-scoped snapshot class when dropped, so a failing test leaves none.
struct ClassGuard {
    api: Api<VolumeSnapshotClass>,
    name: String,
}

impl Drop for ClassGuard {
    fn drop(&mut self) {
        let (api, name) = (self.api.clone(), self.name.clone());
        if let Ok(handle) = tokio::runtime::Handle::try_current() {
            handle.spawn(async move {
                let _ = api.delete(&name, &DeleteParams::default()).await;
            });
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn every_agent_killed_while_accepted_and_the_upload_completes_after_restart() -> TestResult {
    let mut world = World::start("e2e-accrestart").await?;
    let sim = world.sim();
    let tree = FsTree::sample(31);
    sim.create_pvc(&world.ns, "src", "16Mi", VolumeMode::Filesystem, Binding::Immediate).await?;
    sim.write_files(&world.ns, "src", &tree).await?;
    // The snapshot names a class that does not exist yet: no snapshot controller acts on it,
    // so it stays not ready (and without error) until the class is created.
    let late_class = format!("{}-late", sim.snapshot_class());
    let vs: VolumeSnapshot = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": { "name": "src-snap", "namespace": world.ns },
        "spec": { "source": { "persistentVolumeClaimName": "src" },
                  "volumeSnapshotClassName": late_class },
    }))?;
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(world.client.clone(), &world.ns);
    snapshots.create(&PostParams::default(), &vs).await?;
    let du = world.create_data_upload("restart", "src", "src-snap").await?;
    let name = du.name_any();
    let accepted: DataUpload = world
        .wait_for(&name, "Accepted", |d: &DataUpload| {
            du_phase(d) == Some(DataUploadPhase::Accepted) || du_terminal(d)
        })
        .await?;
    assert_eq!(du_phase(&accepted), Some(DataUploadPhase::Accepted), "{:#?}", accepted.status);

    for node in world.sim().nodes() {
        world.kill_agent(&node);
    }
    let api: Api<DataUpload> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    let still = api.get(&name).await?;
    assert_eq!(du_phase(&still), Some(DataUploadPhase::Accepted), "{:#?}", still.status);
    // Let every liveness lease run out (6 s) before the agents come back.
    tokio::time::sleep(std::time::Duration::from_secs(8)).await;
    for node in world.sim().nodes() {
        world.start_agent(&node)?;
    }
    // Now the snapshot can be taken.
    let classes: Api<VolumeSnapshotClass> = Api::all(world.client.clone());
    let class = VolumeSnapshotClass::new(&late_class, world.sim().driver(), "Delete");
    classes.create(&PostParams::default(), &class).await?;
    let _class = ClassGuard { api: classes.clone(), name: late_class.clone() };

    let du: DataUpload = world.wait_for(&name, "terminal", du_terminal).await?;
    let status = du.status.clone().unwrap_or_default();
    assert_eq!(
        du_phase(&du),
        Some(DataUploadPhase::Completed),
        "{status:#?}\n{}",
        world.agent_logs()
    );
    eprintln!(
        "accepted by {}, moved on {}, annotations {:?}",
        status.accepted_by_node,
        status.node,
        du.annotations()
    );
    // One snapshot in the repository for it, the one the status names.
    let in_repo: Vec<String> = world
        .repo_snapshots()
        .await?
        .iter()
        .filter(|s| s["tags"]["ferry.io/data-upload"].as_str() == Some(name.as_str()))
        .map(|s| s["id"].as_str().unwrap_or_default().to_owned())
        .collect();
    assert_eq!(in_repo, vec![status.snapshot_id.clone()]);
    let left = world.leftovers_of(&name).await?;
    assert!(left.is_empty(), "left behind: {left:?}");
    // And it restores what the volume held.
    let dd = world.create_data_download("restart-restore", &world.ns, "back", "16Mi", &du).await?;
    let dd = world.wait_for(&dd.name_any(), "terminal", dd_terminal).await?;
    assert_eq!(dd_phase(&dd), Some(DataDownloadPhase::Completed), "{:#?}", dd.status);
    let restored = world.sim().read_files(&world.ns, "back").await?;
    assert!(restored == tree, "restored tree differs from the original");
    classes.delete(&late_class, &DeleteParams::default()).await?;
    world.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_missing_source_snapshot_fails_the_upload_naming_it_and_leaves_nothing() -> TestResult {
    let world = World::start("e2e-nosnap").await?;
    world
        .sim()
        .create_pvc(&world.ns, "src", "16Mi", VolumeMode::Filesystem, Binding::Immediate)
        .await?;
    let du = world.create_data_upload("nosnap", "src", "no-such-snapshot").await?;
    let name = du.name_any();
    let du: DataUpload = world.wait_for(&name, "terminal", du_terminal).await?;
    let status = du.status.clone().unwrap_or_default();
    assert_eq!(du_phase(&du), Some(DataUploadPhase::Failed), "{status:#?}");
    let wanted = format!("{}/no-such-snapshot", world.ns);
    assert!(status.message.contains(&wanted), "{}", status.message);
    assert!(!status.message.contains("timed out"), "{}", status.message);
    // A warning Event says the same.
    let failed = world.event_note(&name, "Failed").await?;
    assert!(failed.contains(&wanted), "Failed event: {failed}");
    // Nothing of Ferry's: no pod, PVC, snapshot or content, no finalizer, no expose label.
    let left = world.leftovers_of(&name).await?;
    assert!(left.is_empty(), "left behind: {left:?}");
    let api: Api<DataUpload> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    let mut du = api.get(&name).await?;
    for _ in 0..100 {
        if du.finalizers().is_empty() {
            break;
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
        du = api.get(&name).await?;
    }
    assert!(du.finalizers().is_empty(), "finalizers {:?}", du.finalizers());
    assert!(!du.labels().contains_key(ferry_api::keys::EXPOSE_ON_GOING_LABEL), "{:?}", du.labels());
    // The source PVC is untouched and no snapshot was made of it.
    let sources: Api<VolumeSnapshot> = Api::namespaced(world.client.clone(), &world.ns);
    assert!(sources.list(&Default::default()).await?.items.is_empty());
    world.sim().wait_pvc_bound(&world.ns, "src", WAIT).await?;
    world.shutdown().await
}
