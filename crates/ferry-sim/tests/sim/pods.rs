//! Scheduling, the kubelet's volume paths, pod deletion.

use std::os::unix::fs::FileTypeExt;

use ferry_sim::{Binding, HOSTNAME_LABEL, VolumeMode, pod_object};
use k8s_openapi::api::core::v1::{Event, Pod};
use kube::api::{Api, DeleteParams, ListParams, PostParams};
use serde_json::json;

use crate::support::{Env, T, mount_points};

#[tokio::test]
async fn block_volume_appears_as_a_device_at_the_kubelet_path() {
    let env = Env::new("block").await;
    env.sim
        .create_pvc(&env.ns, "raw", "8Mi", VolumeMode::Block, Binding::WaitForFirstConsumer)
        .await
        .unwrap();
    env.pods()
        .create(&PostParams::default(), &pod_object("mapper", "raw", VolumeMode::Block).unwrap())
        .await
        .unwrap();
    let pod = env.sim.wait_pod_running(&env.ns, "mapper", T).await.unwrap();
    let path = env.sim.pod_claim_path(&pod, "raw").await.unwrap();
    let node = pod.spec.as_ref().unwrap().node_name.clone().unwrap();
    let pv = env.pvcs().get("raw").await.unwrap().spec.unwrap().volume_name.unwrap();
    let uid = pod.metadata.uid.clone().unwrap();
    let root = env.sim.kubelet_root(&node).unwrap();
    assert_eq!(path, root.join(format!("pods/{uid}/volumeDevices/kubernetes.io~csi/{pv}")));
    // As the kubelet does: a symlink to the CSI publish path, where the device is bind-mounted.
    let target = std::fs::read_link(&path).unwrap();
    assert_eq!(
        target,
        root.join(format!("plugins/kubernetes.io/csi/volumeDevices/publish/{pv}/{uid}"))
    );
    assert!(mount_points().contains(&target.display().to_string()));
    assert!(std::fs::metadata(&path).unwrap().file_type().is_block_device());

    // Bytes written through one pod are read back through another.
    env.pods().delete("mapper", &DeleteParams::default()).await.unwrap();
    ferry_sim::wait_gone(&env.pods(), "mapper", T).await.unwrap();
    let data: Vec<u8> = (0..=255u8).cycle().take(3 * 4096 + 17).collect();
    env.sim.write_block(&env.ns, "raw", 1 << 20, &data).await.unwrap();
    assert_eq!(env.sim.read_block(&env.ns, "raw", 1 << 20, data.len()).await.unwrap(), data);
    assert_eq!(
        env.sim.read_block(&env.ns, "raw", 0, 4096).await.unwrap(),
        vec![0; 4096],
        "raw, not formatted"
    );
    env.finish().await;
}

#[tokio::test]
async fn deleting_a_pod_unmounts_and_removes_its_folder() {
    let env = Env::new("podgone").await;
    env.sim
        .create_pvc(&env.ns, "vol", "16Mi", VolumeMode::Filesystem, Binding::Immediate)
        .await
        .unwrap();
    env.pods()
        .create(&PostParams::default(), &pod_object("user", "vol", VolumeMode::Filesystem).unwrap())
        .await
        .unwrap();
    let pod = env.sim.wait_pod_running(&env.ns, "user", T).await.unwrap();
    let status = pod.status.as_ref().unwrap();
    let ready = status.conditions.as_ref().unwrap().iter().find(|c| c.type_ == "Ready").unwrap();
    assert_eq!(ready.status, "True");
    let containers = status.container_statuses.as_ref().unwrap();
    assert_eq!(containers.len(), 1);
    assert!(containers[0].ready && containers[0].state.as_ref().unwrap().running.is_some());
    let mount = env.sim.pod_claim_path(&pod, "vol").await.unwrap();
    assert!(mount_points().contains(&mount.display().to_string()));
    let pod_dir = mount.ancestors().nth(4).unwrap().to_path_buf();
    assert!(pod_dir.ends_with(pod.metadata.uid.as_ref().unwrap()));

    env.pods().delete("user", &DeleteParams::default()).await.unwrap();
    ferry_sim::wait_gone(&env.pods(), "user", T).await.unwrap();
    assert!(!mount_points().contains(&mount.display().to_string()), "unmounted");
    assert!(!pod_dir.exists(), "pod folder removed");
    env.finish().await;
}

#[tokio::test]
async fn unprovisionable_claim_leaves_the_pod_pending_with_a_reason() {
    let env = Env::new("unprov").await;
    env.sim
        .create_pvc_from_snapshot(
            &env.ns,
            "orphan",
            "no-such-snapshot",
            "8Mi",
            VolumeMode::Filesystem,
            Binding::Immediate,
        )
        .await
        .unwrap();
    env.pods()
        .create(
            &PostParams::default(),
            &pod_object("stuck", "orphan", VolumeMode::Filesystem).unwrap(),
        )
        .await
        .unwrap();
    env.pods()
        .create(
            &PostParams::default(),
            &pod_object("lost", "missing", VolumeMode::Filesystem).unwrap(),
        )
        .await
        .unwrap();
    let reason = |name: &'static str, needle: &'static str| {
        let pods = env.pods();
        async move {
            let pod = ferry_sim::wait_for(&pods, name, T, |p: &Pod| {
                scheduled(p).is_some_and(|(status, _, message)| {
                    status == "False" && message.contains(needle)
                })
            })
            .await
            .unwrap();
            assert_eq!(pod.status.as_ref().unwrap().phase.as_deref(), Some("Pending"));
            assert!(pod.spec.as_ref().unwrap().node_name.is_none());
            scheduled(&pod).unwrap().1
        }
    };
    // As kube-scheduler says it: it knows only that the claim is unbound. The provisioner
    // tells why on the claim.
    assert_eq!(
        reason("stuck", "pod has unbound immediate PersistentVolumeClaims").await,
        "Unschedulable"
    );
    let events: Api<Event> = Api::namespaced(env.client.clone(), &env.ns);
    let deadline = std::time::Instant::now() + T;
    let failed = loop {
        let listed = events
            .list(
                &ListParams::default()
                    .fields("involvedObject.kind=PersistentVolumeClaim,involvedObject.name=orphan"),
            )
            .await
            .unwrap();
        if let Some(e) =
            listed.items.into_iter().find(|e| e.reason.as_deref() == Some("ProvisioningFailed"))
        {
            break e;
        }
        assert!(std::time::Instant::now() < deadline, "no ProvisioningFailed Event on the claim");
        tokio::time::sleep(std::time::Duration::from_millis(100)).await;
    };
    assert_eq!(failed.type_.as_deref(), Some("Warning"));
    assert!(
        failed.message.as_deref().unwrap_or_default().contains("no-such-snapshot"),
        "{failed:?}"
    );
    assert_eq!(
        reason("lost", "persistentvolumeclaim \"missing\" not found").await,
        "Unschedulable"
    );
    env.finish().await;
}

fn scheduled(pod: &Pod) -> Option<(String, String, String)> {
    let c = pod.status.as_ref()?.conditions.as_ref()?.iter().find(|c| c.type_ == "PodScheduled")?;
    Some((
        c.status.clone(),
        c.reason.clone().unwrap_or_default(),
        c.message.clone().unwrap_or_default(),
    ))
}

#[tokio::test]
async fn scheduler_honours_node_name_and_selector_and_spreads() {
    let env = Env::new("sched").await;
    let nodes = env.sim.nodes();
    let plain = |name: &str| -> Pod {
        serde_json::from_value(json!({ "metadata": { "name": name },
            "spec": { "containers": [ { "name": "c", "image": "idle" } ] } }))
        .unwrap()
    };
    let mut pinned = plain("pinned");
    pinned.spec.as_mut().unwrap().node_name = Some(nodes[2].clone());
    let mut selected = plain("selected");
    selected.spec.as_mut().unwrap().node_selector =
        Some([(HOSTNAME_LABEL.to_owned(), nodes[1].clone())].into());
    let mut nowhere = plain("nowhere");
    nowhere.spec.as_mut().unwrap().node_selector =
        Some([("zone".to_owned(), "mars".to_owned())].into());
    for pod in [&pinned, &selected, &nowhere] {
        env.pods().create(&PostParams::default(), pod).await.unwrap();
    }
    let node_of = |p: Pod| p.spec.unwrap().node_name.unwrap();
    assert_eq!(node_of(env.sim.wait_pod_running(&env.ns, "pinned", T).await.unwrap()), nodes[2]);
    assert_eq!(node_of(env.sim.wait_pod_running(&env.ns, "selected", T).await.unwrap()), nodes[1]);
    // Nodes b and c hold one pod each: four more pods even the nodes out at two each.
    let mut placed = vec![nodes[2].clone(), nodes[1].clone()];
    for name in ["s1", "s2", "s3", "s4"] {
        env.pods().create(&PostParams::default(), &plain(name)).await.unwrap();
        placed.push(node_of(env.sim.wait_pod_running(&env.ns, name, T).await.unwrap()));
    }
    assert_eq!(placed[2], nodes[0], "the first free pod goes to the empty node");
    for node in &nodes {
        assert_eq!(placed.iter().filter(|p| *p == node).count(), 2, "spread: {placed:?}");
    }
    let stuck = ferry_sim::wait_for(&env.pods(), "nowhere", T, |p: &Pod| scheduled(p).is_some())
        .await
        .unwrap();
    assert!(scheduled(&stuck).unwrap().2.contains("didn't match Pod's node affinity/selector"));
    env.finish().await;
}
