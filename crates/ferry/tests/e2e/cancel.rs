//! Cancel from Velero (`spec.cancel`, as its plugin's Cancel() sets it) while waiting for the
//! snapshot and while data moves: Canceled, with everything Ferry created removed.

use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use ferry_api::{DataUpload, DataUploadPhase};
use ferry_testbed::VELERO_NAMESPACE;
use kube::ResourceExt;
use kube::api::{Api, Patch, PatchParams};
use serde_json::json;

use crate::harness::{TestResult, World, big_tree, du_phase, du_terminal};

async fn cancel(world: &World, name: &str) -> TestResult {
    let api: Api<DataUpload> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    // Velero's plugin sets spec.cancel with a JSON merge patch.
    api.patch(name, &PatchParams::default(), &Patch::Merge(json!({ "spec": { "cancel": true } })))
        .await?;
    Ok(())
}

async fn canceled_and_clean(world: &World, name: &str) -> TestResult {
    let du: DataUpload = world.wait_for(name, "terminal", du_terminal).await?;
    assert_eq!(du_phase(&du), Some(DataUploadPhase::Canceled), "{:#?}", du.status);
    let message = du.status.clone().unwrap_or_default().message;
    assert!(message.contains("cancel"), "{message}");
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    for _ in 0..100 {
        let left = pods.get_opt(name).await?.is_some() || pvcs.get_opt(name).await?.is_some();
        let du =
            Api::<DataUpload>::namespaced(world.client.clone(), VELERO_NAMESPACE).get(name).await?;
        if !left && du.finalizers().is_empty() {
            return Ok(());
        }
        tokio::time::sleep(std::time::Duration::from_millis(200)).await;
    }
    Err(format!("DataUpload {name}: pod, PVC or finalizer left after cancel").into())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn cancel_while_waiting_for_the_snapshot_and_while_uploading() -> TestResult {
    let world = World::start("e2e-cancel").await?;
    // 1. Accepted: the snapshot it names never becomes ready, without an error either: its
    // class belongs to a CSI driver nobody runs, so no snapshot controller touches it.
    let sim = world.sim();
    let vs: ferry_api::VolumeSnapshot = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": { "name": "never-ready", "namespace": world.ns },
        "spec": { "source": { "persistentVolumeClaimName": "src" },
                  "volumeSnapshotClassName": "class-of-a-driver-not-running" },
    }))?;
    Api::<ferry_api::VolumeSnapshot>::namespaced(world.client.clone(), &world.ns)
        .create(&Default::default(), &vs)
        .await?;
    sim.create_pvc(
        &world.ns,
        "src",
        "16Mi",
        ferry_sim::VolumeMode::Filesystem,
        ferry_sim::Binding::Immediate,
    )
    .await?;
    let waiting = world.create_data_upload("cancel", "src", "never-ready").await?;
    let accepted: DataUpload = world
        .wait_for(&waiting.name_any(), "Accepted", |d: &DataUpload| {
            du_phase(d) == Some(DataUploadPhase::Accepted) || du_terminal(d)
        })
        .await?;
    assert_eq!(du_phase(&accepted), Some(DataUploadPhase::Accepted), "{:#?}", accepted.status);
    cancel(&world, &waiting.name_any()).await?;
    canceled_and_clean(&world, &waiting.name_any()).await?;

    // 2. InProgress: a volume large enough to still be moving.
    let tree = big_tree(3, 96, 47);
    let vs = world.volume_with_snapshot("big", "1Gi", &tree).await?;
    let du = world.create_data_upload("cancel", "big", &vs.name_any()).await?;
    let moving: DataUpload = world
        .wait_for(&du.name_any(), "InProgress", |d: &DataUpload| {
            du_phase(d) == Some(DataUploadPhase::InProgress) || du_terminal(d)
        })
        .await?;
    assert_eq!(du_phase(&moving), Some(DataUploadPhase::InProgress), "{:#?}", moving.status);
    cancel(&world, &du.name_any()).await?;
    canceled_and_clean(&world, &du.name_any()).await?;
    world.shutdown().await
}
