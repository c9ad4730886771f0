//! Provisioning, binding, reclaim and rebinding.

use std::time::Duration;

use ferry_sim::{
    Binding, FsTree, HOSTNAME_LABEL, SELECTED_NODE_ANNOTATION, VolumeMode, pod_object, pvc_object,
};
use kube::api::{DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;

use crate::support::{Env, T, phase};

#[tokio::test]
async fn immediate_pvc_is_provisioned_bound_and_keeps_files() {
    let env = Env::new("imm").await;
    env.sim
        .create_pvc(&env.ns, "data", "64Mi", VolumeMode::Filesystem, Binding::Immediate)
        .await
        .unwrap();
    let pvc = env.sim.wait_pvc_bound(&env.ns, "data", T).await.unwrap();
    let pv_name = pvc.spec.as_ref().unwrap().volume_name.clone().unwrap();
    let status = pvc.status.as_ref().unwrap();
    assert_eq!(status.capacity.as_ref().unwrap()["storage"].0, "64Mi");
    assert_eq!(status.access_modes.as_deref(), Some(&["ReadWriteOnce".to_owned()][..]));

    let pv = env.pvs().get(&pv_name).await.unwrap();
    let spec = pv.spec.as_ref().unwrap();
    let csi = spec.csi.as_ref().unwrap();
    assert_eq!(csi.driver, env.sim.driver());
    assert_eq!(csi.volume_handle, pv_name);
    assert_eq!(spec.persistent_volume_reclaim_policy.as_deref(), Some("Delete"));
    assert_eq!(spec.volume_mode.as_deref(), Some("Filesystem"));
    assert_eq!(spec.storage_class_name.as_deref(), Some(env.sim.storage_class(Binding::Immediate)));
    let claim = spec.claim_ref.as_ref().unwrap();
    assert_eq!(claim.uid, pvc.metadata.uid);
    assert_eq!(claim.name.as_deref(), Some("data"));
    assert_eq!(pv.status.as_ref().unwrap().phase.as_deref(), Some("Bound"));
    assert!(spec.node_affinity.is_none(), "Immediate volumes are reachable from every node");
    assert!(env.sim.volume_image(&pv_name).exists());

    let tree = FsTree::sample(1);
    env.sim.write_files(&env.ns, "data", &tree).await.unwrap();
    let back = env.sim.read_files(&env.ns, "data").await.unwrap();
    assert_eq!(back, tree);
    env.finish().await;
}

#[tokio::test]
async fn wffc_pvc_waits_for_a_consumer_and_gets_node_affinity() {
    let env = Env::new("wffc").await;
    env.sim
        .create_pvc(&env.ns, "late", "32Mi", VolumeMode::Filesystem, Binding::WaitForFirstConsumer)
        .await
        .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    let pvc = env.pvcs().get("late").await.unwrap();
    assert_ne!(phase(&pvc), Some("Bound"), "no consumer yet, so no volume");
    assert!(pvc.spec.as_ref().unwrap().volume_name.is_none());

    env.pods()
        .create(
            &PostParams::default(),
            &pod_object("user", "late", VolumeMode::Filesystem).unwrap(),
        )
        .await
        .unwrap();
    let pod = env.sim.wait_pod_running(&env.ns, "user", T).await.unwrap();
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    assert!(env.sim.nodes().contains(&node));
    let pvc = env.sim.wait_pvc_bound(&env.ns, "late", T).await.unwrap();
    assert_eq!(pvc.metadata.annotations.as_ref().unwrap()[SELECTED_NODE_ANNOTATION], node);
    let pv = env.pvs().get(pvc.spec.as_ref().unwrap().volume_name.as_ref().unwrap()).await.unwrap();
    let term = &pv
        .spec
        .as_ref()
        .unwrap()
        .node_affinity
        .as_ref()
        .unwrap()
        .required
        .as_ref()
        .unwrap()
        .node_selector_terms[0];
    let expr = &term.match_expressions.as_ref().unwrap()[0];
    assert_eq!(expr.key, HOSTNAME_LABEL);
    assert_eq!(expr.values.as_deref(), Some(&[node.clone()][..]));

    // The volume is a real ext4 mount at the kubelet's path on that node.
    let path = env.sim.pod_claim_path(&pod, "late").await.unwrap();
    assert!(path.starts_with(env.sim.kubelet_root(&node).unwrap()));
    assert!(crate::support::mount_points().contains(&path.display().to_string()));
    assert!(path.join("lost+found").is_dir());

    // A second pod of the same claim follows the volume's node affinity.
    env.pods()
        .create(
            &PostParams::default(),
            &pod_object("second", "late", VolumeMode::Filesystem).unwrap(),
        )
        .await
        .unwrap();
    let second = env.sim.wait_pod_running(&env.ns, "second", T).await.unwrap();
    assert_eq!(second.spec.as_ref().unwrap().node_name.as_deref(), Some(node.as_str()));
    env.finish().await;
}

#[tokio::test]
async fn reclaim_delete_removes_the_volume_and_retain_keeps_it() {
    let env = Env::new("reclaim").await;
    let retain = format!("{}-retain", env.sim.id());
    env.sim.create_storage_class(&retain, Binding::Immediate, "Retain").await.unwrap();
    env.sim
        .create_pvc(&env.ns, "gone", "16Mi", VolumeMode::Block, Binding::Immediate)
        .await
        .unwrap();
    env.pvcs()
        .create(
            &PostParams::default(),
            &pvc_object("kept", "16Mi", VolumeMode::Filesystem, &retain).unwrap(),
        )
        .await
        .unwrap();
    let gone = env.sim.wait_pvc_bound(&env.ns, "gone", T).await.unwrap();
    let kept = env.sim.wait_pvc_bound(&env.ns, "kept", T).await.unwrap();
    let gone_pv = gone.spec.unwrap().volume_name.unwrap();
    let kept_pv = kept.spec.unwrap().volume_name.unwrap();
    let loops_before = env.sim.leftovers().loop_devices.len();
    assert_eq!(loops_before, 2, "one loop device per volume");

    env.pvcs().delete("gone", &DeleteParams::default()).await.unwrap();
    env.pvcs().delete("kept", &DeleteParams::default()).await.unwrap();
    ferry_sim::wait_gone(&env.pvs(), &gone_pv, T).await.unwrap();
    assert!(!env.sim.volume_image(&gone_pv).exists(), "Delete removes the image");
    let released = ferry_sim::wait_for(&env.pvs(), &kept_pv, T, |pv| {
        pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")
    })
    .await
    .unwrap();
    assert_eq!(released.spec.unwrap().persistent_volume_reclaim_policy.as_deref(), Some("Retain"));
    assert!(env.sim.volume_image(&kept_pv).exists(), "Retain keeps the image");
    let loops: Vec<_> = env.sim.leftovers().loop_devices;
    assert_eq!(loops.len(), 1, "only the retained volume keeps its loop device: {loops:?}");
    assert_eq!(loops[0].1, env.sim.volume_image(&kept_pv));
    env.finish().await;
}

/// Velero's restore hand-over: a retained PV whose claim is gone is pointed at the target PVC
/// (claimRef without uid) and labelled; the target PVC selects it by that label.
#[tokio::test]
async fn claim_ref_rebinding_honours_the_selector() {
    let env = Env::new("rebind").await;
    let retain = format!("{}-retain", env.sim.id());
    env.sim.create_storage_class(&retain, Binding::Immediate, "Retain").await.unwrap();
    env.pvcs()
        .create(
            &PostParams::default(),
            &pvc_object("restore", "16Mi", VolumeMode::Filesystem, &retain).unwrap(),
        )
        .await
        .unwrap();
    let pv_name = env
        .sim
        .wait_pvc_bound(&env.ns, "restore", T)
        .await
        .unwrap()
        .spec
        .unwrap()
        .volume_name
        .unwrap();
    let tree = FsTree::sample(4);
    env.sim.write_files(&env.ns, "restore", &tree).await.unwrap();
    env.pvcs().delete("restore", &DeleteParams::default()).await.unwrap();
    ferry_sim::wait_for(&env.pvs(), &pv_name, T, |pv| {
        pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Released")
    })
    .await
    .unwrap();

    // The target claim, as Velero's plugin leaves it: empty volumeName and a selector.
    let mut target = pvc_object("target", "16Mi", VolumeMode::Filesystem, &retain).unwrap();
    let spec = target.spec.as_mut().unwrap();
    spec.volume_name = Some(String::new());
    spec.selector = Some(
        serde_json::from_value(json!({ "matchLabels": { "velero.io/dynamic-pv-restore": "x1" } }))
            .unwrap(),
    );
    env.pvcs().create(&PostParams::default(), &target).await.unwrap();

    // Pointed at the target but not labelled yet: the selector keeps them apart.
    let point = json!({ "spec": { "claimRef": { "kind": "PersistentVolumeClaim", "apiVersion": "v1",
        "namespace": env.ns, "name": "target", "uid": null, "resourceVersion": null } } });
    env.pvs().patch(&pv_name, &PatchParams::default(), &Patch::Merge(&point)).await.unwrap();
    ferry_sim::wait_for(&env.pvs(), &pv_name, T, |pv| {
        pv.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Available")
    })
    .await
    .unwrap();
    tokio::time::sleep(Duration::from_secs(2)).await;
    assert_ne!(
        phase(&env.pvcs().get("target").await.unwrap()),
        Some("Bound"),
        "selector does not match yet"
    );

    let label = json!({ "metadata": { "labels": { "velero.io/dynamic-pv-restore": "x1" } } });
    env.pvs().patch(&pv_name, &PatchParams::default(), &Patch::Merge(&label)).await.unwrap();
    let bound = env.sim.wait_pvc_bound(&env.ns, "target", T).await.unwrap();
    assert_eq!(bound.spec.as_ref().unwrap().volume_name.as_deref(), Some(pv_name.as_str()));
    let pv = env.pvs().get(&pv_name).await.unwrap();
    assert_eq!(pv.spec.as_ref().unwrap().claim_ref.as_ref().unwrap().uid, bound.metadata.uid);
    assert_eq!(pv.status.as_ref().unwrap().phase.as_deref(), Some("Bound"));
    assert_eq!(env.sim.read_files(&env.ns, "target").await.unwrap(), tree);
    env.finish().await;
}
