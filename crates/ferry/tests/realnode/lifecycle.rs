//! What users run into on a real node beyond one round trip: an incremental backup after a
//! change, the agent's pod deleted in the middle of an upload (the DaemonSet brings it back and
//! the upload completes), and what a user sees (`kubectl get datauploads`, Events, `/metrics`
//! scraped from the agent's pod).

use std::io::Write as _;
use std::time::{Duration, Instant};

use ferry_api::DataUpload;
use ferry_api::k8s_openapi::api::core::v1::Pod;
use ferry_testbed::VELERO_NAMESPACE;
use kube::api::{Api, DeleteParams, ListParams};

use crate::node::{self, AGENT_DAEMONSET, AGENT_LABELS, TestResult, WAIT, name_of};
use crate::round_trip::{FS_MANIFEST, FS_WRITE};
use crate::{holder, metrics};

#[tokio::test]
async fn an_incremental_backup_after_a_change_stores_only_the_change() -> TestResult {
    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    let ns = node.namespace("incr").await?;
    node::create_pvc(&client, &ns, "data", "64Mi", "Filesystem").await?;
    node::run_pod(&client, &ns, "data", false, FS_WRITE).await?;
    let first = node::snapshot(&client, &ns, "data").await?;
    let du = node::data_upload(&client, &ns, "data", &first, "incr-1").await?;
    let first = node::wait_upload(&client, &name_of(&du)).await?;

    // One file rewritten, one added, one removed: about 150 KiB of new data in a 7.7 MB tree.
    let change = "set -e; cd /data; dd if=/dev/urandom of=f3 bs=1k count=111 2>/dev/null
dd if=/dev/urandom of=new bs=1k count=40 2>/dev/null; rm f7; sync";
    let changed =
        node::run_pod(&client, &ns, "data", false, &format!("{change}\n{FS_MANIFEST}")).await?;
    let second = node::snapshot(&client, &ns, "data").await?;
    let du = node::data_upload(&client, &ns, "data", &second, "incr-2").await?;
    let second = node::wait_upload(&client, &name_of(&du)).await?;
    let (s1, s2) =
        (first.status.clone().unwrap_or_default(), second.status.clone().unwrap_or_default());
    assert!(s1.incremental_bytes > 7_000_000, "the first backup stored the tree: {s1:?}");
    assert!(
        s2.incremental_bytes < 1_000_000,
        "the second backup stored about the change only: {} bytes new of {}",
        s2.incremental_bytes,
        s2.progress.total_bytes
    );
    assert_ne!(s1.snapshot_id, s2.snapshot_id);

    let target_ns = node.namespace("incr-restored").await?;
    let dd =
        node::data_download(&client, &target_ns, "data", "64Mi", "Filesystem", &second, "incr-r")
            .await?;
    node::wait_download(&client, &name_of(&dd)).await?;
    let restored = node::run_pod(&client, &target_ns, "data", false, FS_MANIFEST).await?;
    assert_eq!(restored, changed, "the incremental snapshot restores the changed tree");
    Ok(())
}

/// The agent's pod, deleted as a node drain or an upgrade deletes it, while it uploads: the
/// DaemonSet starts a new one, which takes the upload up again; it completes and restores.
#[tokio::test]
async fn the_agent_pod_deleted_mid_upload_comes_back_and_completes_it() -> TestResult {
    let node = node::node();
    let _agent = node::AGENT.write().await;
    let client = node.client()?;
    let ns = node.namespace("restart").await?;
    node::create_pvc(&client, &ns, "big", "512Mi", "Filesystem").await?;
    let written = node::run_pod(
        &client,
        &ns,
        "big",
        false,
        "set -e; cd /data; for i in $(seq 1 12); do dd if=/dev/urandom of=blob$i bs=1M count=25 2>/dev/null; done; sync
cd /data && for f in $(ls | sort); do echo \"$f $(md5sum < $f | cut -d' ' -f1)\"; done > /dev/termination-log",
    )
    .await?;
    let snapshot = node::snapshot(&client, &ns, "big").await?;
    // The transfer is stalled part-way (its storage location's network held) while the pod
    // is deleted: the old agent cannot finish the upload before it stops, however fast.
    let gate = holder::gate(node).await?;
    let reopen = holder::Reopen(gate);
    gate.close();
    let du =
        node::data_upload_to(&client, holder::GATED_BSL, &ns, "big", &snapshot, "restart").await?;
    let name = name_of(&du);
    holder::stall_mid_transfer::<DataUpload>(&client, &name, gate).await?;
    let uploads: Api<DataUpload> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let agent = pods.list(&ListParams::default().labels(AGENT_LABELS)).await?.items;
    assert_eq!(agent.len(), 1, "one agent pod on the one node");
    let old = name_of(&agent[0]);
    pods.delete(&old, &DeleteParams::default()).await?;
    // The old agent stops (its storage location's network held, it can neither finish nor
    // checkpoint) and is gone before the upload completes: the new pod the DaemonSet starts
    // completes it once the network is let through.
    let deadline = Instant::now() + WAIT;
    while pods.get_opt(&old).await?.is_some() {
        assert!(
            Instant::now() < deadline,
            "the deleted agent pod {old} still exists after {WAIT:?}"
        );
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let status = uploads.get(&name).await?.status.unwrap_or_default();
    assert_ne!(
        status.phase,
        Some(ferry_api::DataUploadPhase::Completed),
        "the deleted agent finished the upload instead of handing it over: {status:?}"
    );
    drop(reopen);

    let du = node::wait_upload(&client, &name).await?;
    let by = du.status.as_ref().map(|s| s.node.clone()).unwrap_or_default();
    assert_eq!(by, ferry_testbed::realnode::NODE_NAME);
    // The new agent resumed it (it did not start over from Prepared), and said so.
    let told = node::agent_events_after(&client, &name, "Resumed").await?;
    assert_eq!(told.get("Resumed"), Some(&1), "a Resumed Event on {name}: {told:?}");
    assert_eq!(told.get("Prepared"), Some(&1), "prepared once, by the old agent: {told:?}");
    node.cluster.wait_agent_ready(&client).await?;

    let target_ns = node.namespace("restart-restored").await?;
    let dd =
        node::data_download(&client, &target_ns, "big", "512Mi", "Filesystem", &du, "restart-r")
            .await?;
    node::wait_download(&client, &name_of(&dd)).await?;
    let restored = node::run_pod(
        &client,
        &target_ns,
        "big",
        false,
        "cd /data && for f in $(ls | grep -v lost+found | sort); do echo \"$f $(md5sum < $f | cut -d' ' -f1)\"; done > /dev/termination-log",
    )
    .await?;
    assert_eq!(restored, written);
    Ok(())
}

/// What an operator looks at: `kubectl get datauploads` (Velero's columns), the agent's Events
/// on the CR, and the agent's `/metrics` scraped from its pod's address.
#[tokio::test]
async fn a_user_sees_columns_events_and_metrics() -> TestResult {
    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    let ns = node.namespace("seen").await?;
    node::create_pvc(&client, &ns, "data", "16Mi", "Filesystem").await?;
    node::run_pod(&client, &ns, "data", false, "echo hello > /data/h; sync").await?;
    let snapshot = node::snapshot(&client, &ns, "data").await?;
    let du = node::data_upload(&client, &ns, "data", &snapshot, "seen").await?;
    let name = name_of(&node::wait_upload(&client, &name_of(&du)).await?);

    let kubectl = ferry_testbed::paths::kubectl()?;
    let out = std::process::Command::new(kubectl)
        .arg("--kubeconfig")
        .arg(node.cluster.kubeconfig())
        .args(["get", "datauploads", "-n", VELERO_NAMESPACE, &name])
        .output()?;
    let table = String::from_utf8(out.stdout)?;
    let mut lines = table.lines();
    let header: Vec<&str> = lines.next().unwrap_or_default().split_whitespace().collect();
    for column in
        ["NAME", "STATUS", "STARTED", "BYTES", "DONE", "TOTAL", "STORAGE", "LOCATION", "NODE"]
    {
        assert!(header.contains(&column), "column {column} in {header:?}");
    }
    let row = lines.next().unwrap_or_default();
    assert!(row.contains("Completed") && row.contains(node::BSL), "{table}");
    assert!(row.contains(ferry_testbed::realnode::NODE_NAME), "the node that moved it: {table}");

    // The Events a user sees with `kubectl describe` / `kubectl get events`: each phase the
    // agent moved it through, once, and no warning.
    let ours = node::agent_events_after(&client, &name, "Completed").await?;
    for reason in ["Prepared", "InProgress", "Completed"] {
        assert_eq!(ours.get(reason), Some(&1), "one {reason} Event on {name}: {ours:?}");
    }
    for reason in ["Failed", "CleanupFailed", "Canceled"] {
        assert!(!ours.contains_key(reason), "no {reason} Event on {name}: {ours:?}");
    }

    let metrics = metrics::scrape(node, &client).await?.text;
    let node_label = format!("node=\"{}\"", ferry_testbed::realnode::NODE_NAME);
    let uploads_done = metrics::value(&metrics, "ferry_data_upload_success_total", &[&node_label]);
    assert!(uploads_done >= 1.0, "the agent counted this upload: {metrics}");
    Ok(())
}

/// Cancel from Velero (`spec.cancel`, as its plugin's Cancel() sets it) while the data moves:
/// the upload ends Canceled, and the holding pod, its PVC, the backup snapshot and its content
/// are gone, with the node releasing the volume (no leaked device or mount).
#[tokio::test]
async fn a_canceled_upload_ends_canceled_and_leaves_nothing() -> TestResult {
    use ferry_api::k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use ferry_api::{VolumeSnapshot, VolumeSnapshotContent};
    use kube::api::{Patch, PatchParams};

    let node = node::node();
    // Alone: the tests share the gate.
    let _agent = node::AGENT.write().await;
    let client = node.client()?;
    let ns = node.namespace("cancel").await?;
    node::create_pvc(&client, &ns, "big", "512Mi", "Block").await?;
    // Beyond what the agent reads ahead of the network, so bytes done stay short of the total
    // while the transfer is held.
    node::run_pod(
        &client,
        &ns,
        "big",
        true,
        "dd if=/dev/urandom of=/dev/volume bs=1M count=400 conv=fsync 2>/dev/null",
    )
    .await?;
    let snapshot = node::snapshot(&client, &ns, "big").await?;
    // The transfer is stalled part-way (its storage location's network held), so the cancel
    // lands while data moves however fast the upload is; the network stays held until the
    // upload has ended: a cancel needs nothing from the storage location.
    let gate = holder::gate(node).await?;
    let reopen = holder::Reopen(gate);
    gate.close();
    let du =
        node::data_upload_to(&client, holder::GATED_BSL, &ns, "big", &snapshot, "cancel").await?;
    let name = name_of(&du);
    holder::stall_mid_transfer::<DataUpload>(&client, &name, gate).await?;
    let uploads: Api<DataUpload> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    uploads
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "cancel": true } })),
        )
        .await?;
    let deadline = Instant::now() + WAIT;
    let du = loop {
        let du = uploads.get(&name).await?;
        let phase = du.status.as_ref().and_then(|s| s.phase);
        if matches!(
            phase,
            Some(
                ferry_api::DataUploadPhase::Canceled
                    | ferry_api::DataUploadPhase::Completed
                    | ferry_api::DataUploadPhase::Failed
            )
        ) {
            break du;
        }
        assert!(Instant::now() < deadline, "not ended {WAIT:?} after cancel: {:?}", du.status);
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    drop(reopen);
    let status = du.status.clone().unwrap_or_default();
    assert_eq!(status.phase, Some(ferry_api::DataUploadPhase::Canceled), "{status:?}");
    assert!(status.message.contains("cancel"), "the message says why: {}", status.message);

    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let contents: Api<VolumeSnapshotContent> = Api::all(client.clone());
    let deadline = Instant::now() + WAIT;
    loop {
        let mut left = Vec::new();
        if pods.get_opt(&name).await?.is_some() {
            left.push("holding pod");
        }
        if pvcs.get_opt(&name).await?.is_some() {
            left.push("backup PVC");
        }
        if snapshots.get_opt(&name).await?.is_some() {
            left.push("backup VolumeSnapshot");
        }
        if contents.get_opt(&name).await?.is_some() {
            left.push("backup VolumeSnapshotContent");
        }
        if uploads
            .get(&name)
            .await?
            .metadata
            .finalizers
            .unwrap_or_default()
            .iter()
            .any(|f| f.starts_with("ferry"))
        {
            left.push("Ferry's finalizer");
        }
        if left.is_empty() {
            break;
        }
        assert!(Instant::now() < deadline, "left {WAIT:?} after cancel: {left:?}");
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    node::delete_pvc(&client, &ns, "big").await?;
    node::no_leaked_devices(node).await
}

/// The chart's admission policy is in force on the real cluster: the agent's account (as a
/// stolen node token would use it) cannot create a privileged pod with the host's root and a
/// service account token in Velero's namespace, while the agent's own holding pods run (every other test here needs them).
#[tokio::test]
async fn the_agents_account_cannot_create_a_pod_with_host_access() -> TestResult {
    let node = node::node();
    let _agent = node::AGENT.read().await;
    let pod = serde_json::json!({
        "apiVersion": "v1", "kind": "Pod",
        "metadata": { "name": "escape", "namespace": VELERO_NAMESPACE,
            "labels": { "ferry.io/created-by": "ferry" } },
        "spec": {
            "containers": [{ "name": "x", "image": ferry_testbed::realnode::BUSYBOX_IMAGE,
                "securityContext": { "privileged": true } }],
            "volumes": [{ "name": "root", "hostPath": { "path": "/" } }],
        },
    });
    let out = std::process::Command::new(ferry_testbed::paths::kubectl()?)
        .arg("--kubeconfig")
        .arg(node.cluster.kubeconfig())
        .args(["create", "--dry-run=server", "-f", "-"])
        .arg(format!("--as=system:serviceaccount:{VELERO_NAMESPACE}:ferry-agent"))
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .stderr(std::process::Stdio::piped())
        .spawn()
        .and_then(|mut child| {
            child.stdin.take().map(|mut s| s.write_all(pod.to_string().as_bytes()));
            child.wait_with_output()
        })?;
    let said = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "the agent's account created a privileged pod: {said}");
    assert!(said.contains("ferry-agent-holding-pods"), "refused by the policy: {said}");
    Ok(())
}

/// Canceled while Accepted: the agent took the DataUpload and waits for its source snapshot,
/// which never becomes ready (its class names a CSI driver that is not installed, so the real
/// snapshot controller waits without an error: the state is certain, not a race). The
/// DataUpload ends Canceled saying so, and nothing of an exposure is left.
#[tokio::test]
async fn an_upload_canceled_while_accepted_ends_canceled_and_leaves_nothing() -> TestResult {
    use ferry_api::k8s_openapi::api::core::v1::PersistentVolumeClaim;
    use ferry_api::{VolumeSnapshot, VolumeSnapshotClass};
    use kube::api::{Patch, PatchParams, PostParams};

    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    let ns = node.namespace("accepted").await?;
    node::create_pvc(&client, &ns, "disk", "8Mi", "Block").await?;
    // Bound first: the snapshot controller fails a snapshot of an unbound claim.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
    let deadline = Instant::now() + WAIT;
    while claims.get("disk").await?.status.and_then(|s| s.phase).as_deref() != Some("Bound") {
        assert!(Instant::now() < deadline, "PVC disk not bound");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    let class_name = format!("nobody-{ns}");
    let class: VolumeSnapshotClass = serde_json::from_value(serde_json::json!({
        "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshotClass",
        "metadata": { "name": class_name },
        "driver": "nobody.ferry.io", "deletionPolicy": "Retain",
    }))?;
    let classes: Api<VolumeSnapshotClass> = Api::all(client.clone());
    classes.create(&PostParams::default(), &class).await?;
    // The snapshot controller finds classes in its informer's cache: a snapshot it takes
    // before the new class reaches that cache fails ("Failed to get snapshot class"), which
    // is not the state this test is about. Such a snapshot is replaced by another; one the
    // controller has bound to a content without an error waits for the missing driver.
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), &ns);
    let mut limbo = None;
    for attempt in 0..5 {
        let name = format!("limbo-{attempt}");
        let snapshot: VolumeSnapshot = serde_json::from_value(serde_json::json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": { "name": name, "namespace": ns },
            "spec": { "volumeSnapshotClassName": class_name,
                "source": { "persistentVolumeClaimName": "disk" } },
        }))?;
        snapshots.create(&PostParams::default(), &snapshot).await?;
        let deadline = Instant::now() + WAIT;
        let bound = loop {
            let status = snapshots.get(&name).await?.status.unwrap_or_default();
            if status.error.is_some() {
                break false;
            }
            if status.bound_volume_snapshot_content_name.is_some() {
                break true;
            }
            assert!(Instant::now() < deadline, "snapshot {name} neither bound nor failed");
            tokio::time::sleep(Duration::from_millis(200)).await;
        };
        if bound {
            limbo = Some(name);
            break;
        }
        snapshots.delete(&name, &Default::default()).await?;
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let Some(limbo) = limbo else {
        return Err("the snapshot controller never took a snapshot of the new class".into());
    };

    let du = node::data_upload(&client, &ns, "disk", &limbo, "accepted").await?;
    let name = name_of(&du);
    let uploads: Api<DataUpload> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let phase_of = |du: &DataUpload| du.status.as_ref().and_then(|s| s.phase);
    let deadline = Instant::now() + WAIT;
    loop {
        let du = uploads.get(&name).await?;
        match phase_of(&du) {
            Some(ferry_api::DataUploadPhase::Accepted) => break,
            None | Some(ferry_api::DataUploadPhase::New) => {}
            _ => return Err(format!("not Accepted but {:?}", du.status).into()),
        }
        assert!(Instant::now() < deadline, "not Accepted in time: {:?}", du.status);
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    // It stays there: the source snapshot never becomes ready.
    tokio::time::sleep(Duration::from_secs(3)).await;
    let still = uploads.get(&name).await?;
    assert_eq!(phase_of(&still), Some(ferry_api::DataUploadPhase::Accepted), "{:?}", still.status);

    uploads
        .patch(
            &name,
            &PatchParams::default(),
            &Patch::Merge(serde_json::json!({ "spec": { "cancel": true } })),
        )
        .await?;
    let deadline = Instant::now() + WAIT;
    let status = loop {
        let du = uploads.get(&name).await?;
        let released = !du
            .metadata
            .finalizers
            .clone()
            .unwrap_or_default()
            .iter()
            .any(|f| f == ferry_api::keys::DATA_UPLOAD_DOWNLOAD_FINALIZER);
        if phase_of(&du) == Some(ferry_api::DataUploadPhase::Canceled) && released {
            break du.status.unwrap_or_default();
        }
        assert!(Instant::now() < deadline, "not Canceled after cancel: {:?}", du.status);
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert!(status.message.contains("cancel"), "{}", status.message);
    assert!(status.start_timestamp.is_none(), "it never moved data: {status:?}");
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let backup_snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    assert!(pods.get_opt(&name).await?.is_none(), "no holding pod");
    assert!(pvcs.get_opt(&name).await?.is_none(), "no backup PVC");
    assert!(backup_snapshots.get_opt(&name).await?.is_none(), "no backup VolumeSnapshot");
    // The source snapshot is the user's (Velero's): left as it was.
    assert!(snapshots.get_opt(&limbo).await?.is_some());
    snapshots.delete(&limbo, &Default::default()).await?;
    classes.delete(&class_name, &Default::default()).await?;
    Ok(())
}

/// The agent tolerates every taint (the chart's default), its holding pods never the cordon's:
/// on a cordoned node a DataUpload's holding pod stays unschedulable, and once the node is
/// uncordoned the same DataUpload goes on and completes.
#[tokio::test]
async fn a_cordoned_node_gets_no_holding_pod_until_it_is_uncordoned() -> TestResult {
    use ferry_api::k8s_openapi::api::core::v1::Node;
    use kube::ResourceExt;
    use kube::api::{Patch, PatchParams};

    let node = node::node();
    // Alone: a cordon stops every other test's pods too.
    let _agent = node::AGENT.write().await;
    let client = node.client()?;
    let ns = node.namespace("cordon").await?;
    node::create_pvc(&client, &ns, "data", "64Mi", "Filesystem").await?;
    node::run_pod(&client, &ns, "data", false, FS_WRITE).await?;
    let snapshot = node::snapshot(&client, &ns, "data").await?;
    let nodes: Api<Node> = Api::all(client.clone());
    let listed = nodes.list(&ListParams::default()).await?;
    let [only] = listed.items.as_slice() else { return Err("one node expected".into()) };
    let node_name = only.name_any();
    let cordon = |on: bool| {
        let (nodes, node_name) = (nodes.clone(), node_name.clone());
        async move {
            let patch = Patch::Merge(serde_json::json!({ "spec": { "unschedulable": on } }));
            nodes.patch(&node_name, &PatchParams::default(), &patch).await.map(|_| ())
        }
    };

    cordon(true).await?;
    let cordoned = async {
        let du = node::data_upload(&client, &ns, "data", &snapshot, "cordoned").await?;
        let name = name_of(&du);
        let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
        let deadline = Instant::now() + WAIT;
        let holder = loop {
            let unschedulable = pods.get_opt(&name).await?.filter(|p| {
                p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|c| {
                    c.iter().any(|c| {
                        c.type_ == "PodScheduled"
                            && c.status == "False"
                            && c.reason.as_deref() == Some("Unschedulable")
                    })
                })
            });
            if let Some(pod) = unschedulable {
                break pod;
            }
            assert!(Instant::now() < deadline, "holding pod {name} not reported unschedulable");
            tokio::time::sleep(Duration::from_millis(250)).await;
        };
        let spec = holder.spec.clone().unwrap_or_default();
        assert_eq!(spec.node_name, None, "scheduled onto the cordoned node");
        let tolerations = spec.tolerations.unwrap_or_default();
        assert!(!tolerations.iter().any(ferry_expose::tolerates_cordon), "{tolerations:?}");
        // The agent itself tolerates everything, the cordon included.
        let agents = pods.list(&ListParams::default().labels(AGENT_LABELS)).await?;
        let agent = agents.items.first().ok_or("no agent pod")?;
        let agent_tolerations = agent.spec.clone().unwrap_or_default().tolerations;
        assert!(agent_tolerations.unwrap_or_default().iter().any(ferry_expose::tolerates_cordon));
        Ok::<_, Box<dyn std::error::Error>>(name)
    }
    .await;
    // Uncordoned whatever happened: every other test needs the node.
    cordon(false).await?;
    let name = cordoned?;
    let done = node::wait_upload(&client, &name).await?;
    let placed = done.status.unwrap_or_default().node;
    assert_eq!(placed, node_name, "moved on the node once it was uncordoned");
    node::delete_pvc(&client, &ns, "data").await?;
    Ok(())
}

/// The `data-path threads` line of the Ready agent pod whose container limits are `limits`
/// (JSON, as the API server returns them), once it logged it (read where the kubelet keeps
/// the container's log).
async fn agent_threads_line(
    node: &node::Node,
    client: &kube::Client,
    limits: &serde_json::Value,
) -> Result<String, Box<dyn std::error::Error>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let deadline = Instant::now() + WAIT;
    loop {
        for pod in pods.list(&ListParams::default().labels(AGENT_LABELS)).await?.items {
            let spec = serde_json::to_value(&pod.spec)?;
            let ready = pod
                .status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"));
            if pod.metadata.deletion_timestamp.is_some()
                || !ready
                || &spec["containers"][0]["resources"]["limits"] != limits
            {
                continue;
            }
            let dir = node.cluster.nodes()[0].dir().join("var-log/pods").join(format!(
                "{VELERO_NAMESPACE}_{}_{}",
                name_of(&pod),
                pod.metadata.uid.clone().unwrap_or_default()
            ));
            let files = std::fs::read_dir(dir.join("agent")).into_iter().flatten().flatten();
            let log: String =
                files.map(|f| std::fs::read_to_string(f.path()).unwrap_or_default()).collect();
            if let Some(line) = log.lines().find(|l| l.contains("data-path threads")) {
                return Ok(line.to_owned());
            }
        }
        if Instant::now() > deadline {
            return Err(format!("no Ready agent with limits {limits} logged its threads").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The agent plans its data-path threads from its own pod's limits, as the real kubelet sets
/// them in the pod's cgroups: the chart's memory limit, then a CPU limit of 1 and 1 GiB set on
/// the DaemonSet (one CPU allows two threads), then the chart's again.
#[tokio::test]
async fn the_agents_data_path_threads_follow_its_pods_cpu_and_memory_limits() -> TestResult {
    use kube::api::{Patch, PatchParams};

    let node = node::node();
    // Alone: the agent's pod is replaced twice.
    let _agent = node::AGENT.write().await;
    let client = node.client()?;
    let sets: Api<ferry_api::k8s_openapi::api::apps::v1::DaemonSet> =
        Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let set = serde_json::to_value(sets.get(AGENT_DAEMONSET).await?)?;
    let chart = set["spec"]["template"]["spec"]["containers"][0]["resources"]["limits"].clone();
    assert_eq!(chart["memory"], "2Gi", "the chart's default limits: {chart}");
    let line = agent_threads_line(node, &client, &chart).await?;
    assert!(line.contains("the memory limit of 2048 MiB"), "{line}");

    // Strategic merge on the container named `agent`; a null removes a limit.
    let set_limits = |cpu: serde_json::Value, memory: &str| {
        Patch::Strategic(serde_json::json!({ "spec": { "template": { "spec": { "containers": [{
            "name": "agent",
            "resources": { "limits": { "cpu": cpu, "memory": memory } },
        }]}}}}))
    };
    let small = serde_json::json!({ "cpu": "1", "memory": "1Gi" });
    sets.patch(AGENT_DAEMONSET, &PatchParams::default(), &set_limits("1".into(), "1Gi")).await?;
    let line = agent_threads_line(node, &client, &small).await;
    // The chart's limits again, whatever happened (a few tries: later tests need them).
    let chart_limits = set_limits(chart["cpu"].clone(), chart["memory"].as_str().unwrap_or("2Gi"));
    let mut tries = 0;
    while let Err(e) = sets.patch(AGENT_DAEMONSET, &PatchParams::default(), &chart_limits).await {
        tries += 1;
        assert!(tries < 5, "the DaemonSet's limits could not be put back: {e}");
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    let line = line?;
    // One CPU allows two threads; 1 GiB allows (512 - 160) / 32 = 11.
    assert!(
        line.contains("2 worker threads: 1 CPUs allow 2")
            && line.contains("the memory limit of 1024 MiB")
            && line.contains("allows 11"),
        "{line}"
    );
    agent_threads_line(node, &client, &chart).await?;
    node.cluster.wait_agent_ready(&client).await?;
    Ok(())
}
