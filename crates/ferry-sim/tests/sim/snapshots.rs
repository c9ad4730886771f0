//! Dynamic and pre-provisioned snapshots, restore from a snapshot, deletion policy.

use ferry_api::{VolumeSnapshot, VolumeSnapshotContent};
use ferry_sim::{Binding, FsTree, VolumeMode};
use kube::Api;
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::{Env, T};

#[tokio::test]
async fn snapshot_is_ready_and_a_claim_from_it_holds_its_data() {
    let env = Env::new("snap").await;
    env.sim
        .create_pvc(&env.ns, "src", "48Mi", VolumeMode::Filesystem, Binding::Immediate)
        .await
        .unwrap();
    // The volume stays mounted by a workload while it is written and snapshotted, as in a
    // live backup: the snapshot must still hold every file written before it.
    let holder = ferry_sim::pod_object("holder", "src", VolumeMode::Filesystem).unwrap();
    let pods: Api<k8s_openapi::api::core::v1::Pod> = Api::namespaced(env.client.clone(), &env.ns);
    pods.create(&PostParams::default(), &holder).await.unwrap();
    env.sim.wait_pod_running(&env.ns, "holder", T).await.unwrap();
    let before = FsTree::sample(2);
    env.sim.write_files(&env.ns, "src", &before).await.unwrap();

    env.sim.snapshot_pvc(&env.ns, "src", "snap").await.unwrap();
    let vs = env.sim.wait_snapshot_ready(&env.ns, "snap", T).await.unwrap();
    let status = vs.status.as_ref().unwrap();
    assert_eq!(status.restore_size.as_ref().unwrap().0, "48Mi");
    assert!(status.creation_time.is_some());
    let content_name = status.bound_volume_snapshot_content_name.clone().unwrap();
    let contents: Api<VolumeSnapshotContent> = Api::all(env.client.clone());
    let content = contents.get(&content_name).await.unwrap();
    assert_eq!(content.spec.driver, env.sim.driver());
    assert_eq!(content.spec.deletion_policy, "Delete");
    assert_eq!(content.spec.volume_snapshot_ref.uid, vs.metadata.uid);
    assert_eq!(content.spec.source_volume_mode.as_deref(), Some("Filesystem"));
    let cs = content.status.as_ref().unwrap();
    assert_eq!(cs.ready_to_use, Some(true));
    assert_eq!(cs.restore_size, Some(48 << 20));
    let handle = cs.snapshot_handle.clone().unwrap();
    assert!(env.sim.snapshot_image(&handle).exists());

    // The source changes after the snapshot; the snapshot does not.
    env.sim.write_files(&env.ns, "src", &FsTree::sample(3)).await.unwrap();
    env.sim
        .create_pvc_from_snapshot(
            &env.ns,
            "restored",
            "snap",
            "64Mi",
            VolumeMode::Filesystem,
            Binding::Immediate,
        )
        .await
        .unwrap();
    let restored = env.sim.wait_pvc_bound(&env.ns, "restored", T).await.unwrap();
    assert_eq!(
        restored.status.unwrap().capacity.unwrap()["storage"].0,
        "64Mi",
        "grown to the request"
    );
    assert_eq!(env.sim.read_files(&env.ns, "restored").await.unwrap(), before);
    assert_eq!(env.sim.read_files(&env.ns, "src").await.unwrap(), FsTree::sample(3));

    // Deleting the snapshot deletes its Delete-policy content and the snapshot image.
    let snaps: Api<VolumeSnapshot> = Api::namespaced(env.client.clone(), &env.ns);
    snaps.delete("snap", &DeleteParams::default()).await.unwrap();
    ferry_sim::wait_gone(&contents, &content_name, T).await.unwrap();
    assert!(!env.sim.snapshot_image(&handle).exists());
    env.finish().await;
}

/// Velero's backup expose: a new content with the same snapshot handle and a snapshot bound to
/// it in Velero's namespace; the source content set to Retain and deleted with its snapshot.
#[tokio::test]
async fn pre_provisioned_content_binds_and_deletion_policy_is_honoured() {
    let env = Env::new("preprov").await;
    env.sim
        .create_pvc(&env.ns, "src", "16Mi", VolumeMode::Block, Binding::Immediate)
        .await
        .unwrap();
    env.sim.write_block(&env.ns, "src", 4096, b"block snapshot payload").await.unwrap();
    env.sim.snapshot_pvc(&env.ns, "src", "source").await.unwrap();
    let source = env.sim.wait_snapshot_ready(&env.ns, "source", T).await.unwrap();
    let contents: Api<VolumeSnapshotContent> = Api::all(env.client.clone());
    let source_content = source.status.unwrap().bound_volume_snapshot_content_name.unwrap();
    let handle =
        contents.get(&source_content).await.unwrap().status.unwrap().snapshot_handle.unwrap();

    let backup_ns = env.ns.clone();
    let backup_content = format!("{}-backup", env.sim.id());
    let content: VolumeSnapshotContent = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": { "name": backup_content },
        "spec": { "deletionPolicy": "Delete", "driver": env.sim.driver(),
                  "source": { "snapshotHandle": handle },
                  "volumeSnapshotClassName": env.sim.snapshot_class(),
                  "sourceVolumeMode": "Block",
                  "volumeSnapshotRef": { "name": "backup", "namespace": backup_ns } }
    }))
    .unwrap();
    contents.create(&PostParams::default(), &content).await.unwrap();
    let snaps: Api<VolumeSnapshot> = Api::namespaced(env.client.clone(), &backup_ns);
    let backup: VolumeSnapshot = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
        "metadata": { "name": "backup" },
        "spec": { "source": { "volumeSnapshotContentName": backup_content },
                  "volumeSnapshotClassName": env.sim.snapshot_class() }
    }))
    .unwrap();
    snaps.create(&PostParams::default(), &backup).await.unwrap();
    let ready = env.sim.wait_snapshot_ready(&backup_ns, "backup", T).await.unwrap();
    let st = ready.status.as_ref().unwrap();
    assert_eq!(st.bound_volume_snapshot_content_name.as_deref(), Some(backup_content.as_str()));
    assert_eq!(st.restore_size.as_ref().unwrap().0, "16Mi");
    let bound = contents.get(&backup_content).await.unwrap();
    assert_eq!(
        bound.spec.volume_snapshot_ref.uid, ready.metadata.uid,
        "content bound to the snapshot's uid"
    );
    assert_eq!(bound.status.unwrap().snapshot_handle.as_deref(), Some(handle.as_str()));

    // The source objects go, the physical snapshot stays (Retain).
    let retain = json!({ "spec": { "deletionPolicy": "Retain" } });
    contents.patch(&source_content, &PatchParams::default(), &Patch::Merge(&retain)).await.unwrap();
    snaps.delete("source", &DeleteParams::default()).await.unwrap();
    contents.delete(&source_content, &DeleteParams::default()).await.unwrap();
    ferry_sim::wait_gone(&contents, &source_content, T).await.unwrap();
    assert!(env.sim.snapshot_image(&handle).exists(), "Retain keeps the snapshot");

    // A claim from the backup snapshot holds the data.
    env.sim
        .create_pvc_from_snapshot(
            &backup_ns,
            "exposed",
            "backup",
            "16Mi",
            VolumeMode::Block,
            Binding::Immediate,
        )
        .await
        .unwrap();
    env.sim.wait_pvc_bound(&backup_ns, "exposed", T).await.unwrap();
    let read = env.sim.read_block(&backup_ns, "exposed", 4096, 22).await.unwrap();
    assert_eq!(read, b"block snapshot payload");

    // Cleanup of the backup objects deletes the physical snapshot (Delete).
    snaps.delete("backup", &DeleteParams::default()).await.unwrap();
    contents.delete(&backup_content, &DeleteParams::default()).await.unwrap();
    ferry_sim::wait_gone(&contents, &backup_content, T).await.unwrap();
    assert!(!env.sim.snapshot_image(&handle).exists(), "Delete removes the snapshot");
    env.finish().await;
}

#[tokio::test]
async fn content_with_an_unknown_handle_reports_an_error() {
    let env = Env::new("badhandle").await;
    let name = format!("{}-nohandle", env.sim.id());
    let contents: Api<VolumeSnapshotContent> = Api::all(env.client.clone());
    let content: VolumeSnapshotContent = serde_json::from_value(json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotContent",
        "metadata": { "name": name },
        "spec": { "deletionPolicy": "Delete", "driver": env.sim.driver(),
                  "source": { "snapshotHandle": "no-such-snapshot" },
                  "volumeSnapshotRef": { "name": "x", "namespace": env.ns } }
    }))
    .unwrap();
    contents.create(&PostParams::default(), &content).await.unwrap();
    let failed = ferry_sim::wait_for(&contents, &name, T, |c| {
        c.status.as_ref().and_then(|s| s.error.as_ref()).is_some()
    })
    .await
    .unwrap();
    let status = failed.status.unwrap();
    assert_eq!(status.ready_to_use, Some(false));
    assert!(status.error.unwrap().message.unwrap().contains("no-such-snapshot"));
    contents.delete(&name, &DeleteParams::default()).await.unwrap();
    ferry_sim::wait_gone(&contents, &name, T).await.unwrap();
    env.finish().await;
}
