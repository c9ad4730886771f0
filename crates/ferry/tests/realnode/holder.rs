//! The pod holding an exposed volume deleted or evicted while its CR waits for the node's one
//! data-movement slot or while its data moves: the CR fails saying so and never completes with
//! data missing, a restore is never handed to its PVC, and nothing is written on the node's
//! disk in the volume's place. Also a cancel while Prepared (waiting for the slot) and before
//! any agent took the CR. The data path is held mid-transfer by stalling the network of
//! its storage location (a BSL of its own behind a relay with a gate), so the moment is
//! certain, not a race with the transfer.

use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use ferry_api::{DataDownload, DataUpload, VolumeSnapshotContent};
use ferry_testbed::netns::Gate;
use ferry_testbed::realnode::{self, KUBELET_ROOT};
use ferry_testbed::{S3Server, VELERO_NAMESPACE};
use kube::Client;
use kube::api::{Api, EvictParams};
use tokio::sync::OnceCell;

use crate::node::{self, TestResult, VeleroCr, WAIT, name_of};
use crate::velero_crs;

/// The storage location whose network the tests stall.
pub const GATED_BSL: &str = "gated";
const GATED_BUCKET: &str = "ferry-realnode-gated";
/// Where the node reaches the gated relay.
const GATED_PORT: u16 = 7480;

const WRITE_FILES: &str = "set -e; cd /data; for i in $(seq 1 12); do dd if=/dev/urandom of=blob$i bs=1M count=25 2>/dev/null; done; sync";
pub const WRITE_DEVICE: &str =
    "dd if=/dev/urandom of=/dev/volume bs=1M count=200 conv=fsync 2>/dev/null";

/// The gate of the gated location, set up on first use (a bucket, a relay into the node and
/// the BSL).
pub async fn gate(node: &node::Node) -> Result<&'static Gate, Box<dyn std::error::Error>> {
    static GATED: OnceCell<ferry_testbed::netns::Forwarder> = OnceCell::const_new();
    let relay = GATED
        .get_or_try_init(|| async {
            let s3 = S3Server::shared();
            s3.create_bucket(GATED_BUCKET)?;
            let port: u16 = s3.endpoint().rsplit(':').next().unwrap_or_default().parse()?;
            let relay = node.cluster.relay_host_port(GATED_PORT, port)?;
            let endpoint = format!("http://{}:{GATED_PORT}", realnode::NODE_IP);
            velero_crs::create_bsl(
                &node.client()?,
                GATED_BSL,
                GATED_BUCKET,
                &endpoint,
                node::CREDENTIALS,
                &format!("{GATED_BSL}-credentials"),
            )
            .await?;
            Ok::<_, Box<dyn std::error::Error>>(relay)
        })
        .await?;
    static GATE: std::sync::OnceLock<Gate> = std::sync::OnceLock::new();
    Ok(GATE.get_or_init(|| relay.gate()))
}

/// Opens the gate when dropped, also when a test fails.
pub struct Reopen(pub &'static Gate);

impl Drop for Reopen {
    fn drop(&mut self) {
        self.0.open();
    }
}

/// The CR's status as JSON.
async fn status_of<K: VeleroCr>(
    client: &Client,
    name: &str,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let api: Api<K> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    Ok(serde_json::to_value(api.get(name).await?)?["status"].take())
}

/// With the gate closed: waits until the CR is InProgress, then lets the network through in
/// short bursts until some bytes have moved, and leaves it closed: the transfer is stalled
/// part-way.
pub async fn stall_mid_transfer<K: VeleroCr>(
    client: &Client,
    name: &str,
    gate: &Gate,
) -> TestResult {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = status_of::<K>(client, name).await?;
        let phase = status["phase"].as_str().unwrap_or_default().to_owned();
        let (done, total) = (
            status["progress"]["bytesDone"].as_i64().unwrap_or(0),
            status["progress"]["totalBytes"].as_i64().unwrap_or(0),
        );
        if phase == "InProgress" && done > 0 {
            assert!(done < total || total == 0, "{name} moved everything already: {status}");
            return Ok(());
        }
        if ["Completed", "Failed", "Canceled"].contains(&phase.as_str()) {
            return Err(format!("{name} ended before it was stalled: {status}").into());
        }
        if Instant::now() > deadline {
            return Err(format!("{name} did not move bytes within {WAIT:?}: {status}").into());
        }
        if phase == "InProgress" {
            gate.open();
            tokio::time::sleep(Duration::from_millis(150)).await;
            gate.close();
            // The agent writes progress every second.
            tokio::time::sleep(Duration::from_millis(1200)).await;
        } else {
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
    }
}

/// How a holding pod goes away.
#[derive(Debug, Clone, Copy)]
enum Remove {
    Delete,
    Evict,
}

/// The holding pod of CR `name` once it runs (and, with `located`, once the agent has had time
/// to find its volume: it looks at least every second).
async fn holder_running(
    client: &Client,
    name: &str,
    located: bool,
) -> Result<Pod, Box<dyn std::error::Error>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let deadline = Instant::now() + WAIT;
    let pod = loop {
        let pod = pods.get_opt(name).await?;
        let phase = pod.as_ref().and_then(|p| p.status.as_ref()).and_then(|s| s.phase.clone());
        if let (Some(pod), Some("Running")) = (&pod, phase.as_deref()) {
            break pod.clone();
        }
        if Instant::now() > deadline {
            return Err(format!("holding pod {name} not running after {WAIT:?}: {phase:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    node::admitted_as_restricted(client, &pod).await?;
    if located {
        tokio::time::sleep(Duration::from_secs(5)).await;
    }
    Ok(pod)
}

/// Deletes or evicts the holding pod of CR `name` once it runs (see [`holder_running`]);
/// returns its UID.
async fn remove_holder(
    client: &Client,
    name: &str,
    how: Remove,
    located: bool,
) -> Result<String, Box<dyn std::error::Error>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let pod = holder_running(client, name, located).await?;
    match how {
        Remove::Delete => {
            pods.delete(name, &Default::default()).await?;
        }
        Remove::Evict => {
            pods.evict(name, &EvictParams::default()).await?;
        }
    }
    Ok(pod.metadata.uid.unwrap_or_default())
}

/// The physical snapshot of block backup `name`, whose PVC asks for it to be kept as the next
/// delta's base: its content is `Retain` and labelled pending from the start, not only once
/// the backup completes.
pub async fn pending_base(
    client: &Client,
    name: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    use kube::ResourceExt;
    let contents: Api<VolumeSnapshotContent> = Api::all(client.clone());
    let deadline = Instant::now() + WAIT;
    let content = loop {
        if let Some(content) = contents.get_opt(name).await? {
            break content;
        }
        if Instant::now() > deadline {
            return Err(format!("{name} made no backup content within {WAIT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    };
    assert_eq!(content.spec.deletion_policy, "Retain", "{name}: {content:?}");
    let label = content.labels().get(ferry_expose::KEPT_BASE_LABEL).map(String::as_str);
    assert_eq!(label, Some("pending"), "{name}: {content:?}");
    let handle = content.spec.source.snapshot_handle.ok_or(format!("{name}: no handle"))?;
    let node = node::node();
    assert!(
        node.cluster.hostpath_snapshot_exists(&handle),
        "{name}: the driver keeps no snapshot {handle} while the backup runs"
    );
    Ok(handle)
}

/// A backup that did not complete keeps nothing, though its PVC asked for its base to be kept:
/// its content goes, and the driver deletes the physical snapshot `handle`.
pub async fn nothing_kept(
    node: &node::Node,
    client: &Client,
    name: &str,
    handle: &str,
) -> TestResult {
    let contents: Api<VolumeSnapshotContent> = Api::all(client.clone());
    let deadline = Instant::now() + WAIT;
    while let Some(content) = contents.get_opt(name).await? {
        if Instant::now() > deadline {
            return Err(format!("{name}'s content still there after {WAIT:?}: {content:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    assert!(
        !node.cluster.hostpath_snapshot_exists(handle),
        "{name} did not complete, yet the driver keeps its snapshot {handle}"
    );
    Ok(())
}

/// Waits until CR `name` ends; it must be Failed, saying that the holding pod went away.
async fn wait_failed<K: VeleroCr>(
    client: &Client,
    name: &str,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = status_of::<K>(client, name).await?;
        match status["phase"].as_str().unwrap_or_default() {
            "Failed" => {
                let message = status["message"].as_str().unwrap_or_default();
                assert!(
                    message.contains(&format!("pod {VELERO_NAMESPACE}/{name} holding the volume")),
                    "{message}"
                );
                return Ok(status);
            }
            phase @ ("Completed" | "Canceled") => {
                return Err(format!(
                    "{name} ended {phase} after its holding pod went away: {status}"
                )
                .into());
            }
            _ => {}
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{name} not ended {WAIT:?} after its holding pod went away: {status}"
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// Sets `spec.cancel` on DataUpload `name`, as Velero's plugin does.
async fn cancel(client: &Client, name: &str) -> TestResult {
    use kube::api::{Patch, PatchParams};
    let uploads: Api<DataUpload> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let patch = serde_json::json!({ "spec": { "cancel": true } });
    uploads.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
    Ok(())
}

/// Waits until CR `name` is in `phase`; any other end fails.
async fn wait_phase<K: VeleroCr>(
    client: &Client,
    name: &str,
    phase: &str,
) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let status = status_of::<K>(client, name).await?;
        match status["phase"].as_str().unwrap_or_default() {
            p if p == phase => return Ok(status),
            p @ ("Completed" | "Failed" | "Canceled") => {
                return Err(format!("{name} ended {p}, not {phase}: {status}").into());
            }
            _ => {}
        }
        if Instant::now() > deadline {
            return Err(format!("{name} not {phase} after {WAIT:?}: {status}").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// A failed restore was never handed over: the user's PVC `ns/pvc` stays unbound.
async fn unbound(client: &Client, ns: &str, pvc: &str) -> TestResult {
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns).get(pvc).await?;
    let bound = claim.spec.and_then(|s| s.volume_name).unwrap_or_default();
    assert_eq!(bound, "", "target PVC {ns}/{pvc} bound after a failed restore");
    Ok(())
}

/// The kubelet removes the directory of the deleted pod `uid`: nothing was written there in
/// place of the unmounted volume (the kubelet keeps a pod directory with files in it).
async fn kubelet_forgets(node: &node::Node, uid: &str) -> TestResult {
    let dir = node.cluster.node_path(&std::path::Path::new(KUBELET_ROOT).join("pods").join(uid));
    let deadline = Instant::now() + WAIT;
    while dir.exists() {
        if Instant::now() > deadline {
            let left: Vec<String> = walk(&dir);
            return Err(format!(
                "the kubelet keeps {} of a deleted holding pod: {left:?}",
                dir.display()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}

fn walk(dir: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let path = entry.path();
        out.push(path.display().to_string());
        if entry.file_type().is_ok_and(|t| t.is_dir()) {
            out.extend(walk(&path));
        }
    }
    out
}

/// A file-system PVC `files` (300 MB in 12 files) and a block PVC `disk` (200 MB) in `ns`.
async fn filled_volumes(client: &Client, ns: &str) -> TestResult {
    node::create_pvc(client, ns, "files", "512Mi", "Filesystem").await?;
    node::run_pod(client, ns, "files", false, WRITE_FILES).await?;
    node::create_pvc(client, ns, "disk", "256Mi", "Block").await?;
    node::run_pod(client, ns, "disk", true, WRITE_DEVICE).await?;
    Ok(())
}

/// While the node's one data-movement slot is taken: a DataUpload canceled by Velero while
/// Prepared (waiting for the slot) ends Canceled, its holding pod gone; one canceled before any
/// agent took it (Velero cancels the DataUploads of a backup deleted while they wait) ends
/// Canceled, never exposed.
async fn cancels_while_prepared_or_new(client: &Client, ns: &str) -> TestResult {
    let snapshot = node::snapshot(client, ns, "disk").await?;
    let prepared = name_of(&node::data_upload(client, ns, "disk", &snapshot, "held-cancel").await?);
    holder_running(client, &prepared, true).await?;
    cancel(client, &prepared).await?;
    let status = wait_phase::<DataUpload>(client, &prepared, "Canceled").await?;
    assert!(status["startTimestamp"].is_null(), "it never started moving: {status}");
    let snapshot = node::snapshot(client, ns, "disk").await?;
    let source = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns).get("disk").await?;
    let mover = velero_crs::Mover { datamover: node::MOVER, bsl: node::BSL };
    let mut early = velero_crs::data_upload(
        &mover,
        &node::CLASSES,
        "held-new",
        &node::uid(),
        &source,
        &snapshot,
    )?;
    early.spec.cancel = true;
    let uploads: Api<DataUpload> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let early = name_of(&uploads.create(&Default::default(), &early).await?);
    wait_phase::<DataUpload>(client, &early, "Canceled").await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    for name in [&prepared, &early] {
        let deadline = Instant::now() + WAIT;
        while pods.get_opt(name).await?.is_some() {
            assert!(Instant::now() < deadline, "holding pod {name} left after Canceled");
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }
    Ok(())
}

#[tokio::test]
async fn holding_pods_gone_while_waiting_for_a_slot_or_mid_backup_fail_their_uploads() -> TestResult
{
    let node = node::node();
    // Alone: the stalled transfer holds the node's only data-movement slot, and the tests
    // share the gate.
    let _agent = node::AGENT.write().await;
    let client = node.client()?;
    let gate = gate(node).await?;
    let ns = node.namespace("held-up").await?;
    let _bases = crate::cbt::ReleaseBases(ns.clone());
    filled_volumes(&client, &ns).await?;
    // The block PVC's backups are to keep their base snapshot, had they completed.
    crate::cbt::keep_base(&client, &ns, "disk").await?;

    let _reopen = Reopen(gate);
    let mut gone = Vec::new();
    // Each volume mode in both moments, each moment with both ways a pod goes away.
    for (pvc, mid_move, waiting_for_slot) in
        [("files", Remove::Delete, Remove::Evict), ("disk", Remove::Evict, Remove::Delete)]
    {
        gate.close();
        let snapshot = node::snapshot(&client, &ns, pvc).await?;
        let moving =
            node::data_upload_to(&client, GATED_BSL, &ns, pvc, &snapshot, "held-moving").await?;
        let moving = name_of(&moving);
        stall_mid_transfer::<DataUpload>(&client, &moving, gate).await?;
        // The node's only data-movement slot (the chart's concurrency is 1) is taken: this one
        // waits, Prepared, with its volume located.
        let snapshot = node::snapshot(&client, &ns, pvc).await?;
        let waiting =
            name_of(&node::data_upload(&client, &ns, pvc, &snapshot, "held-waiting").await?);
        let bases = if pvc == "disk" {
            vec![
                (moving.clone(), pending_base(&client, &moving).await?),
                (waiting.clone(), pending_base(&client, &waiting).await?),
            ]
        } else {
            Vec::new()
        };
        gone.push(remove_holder(&client, &waiting, waiting_for_slot, true).await?);
        let status = wait_failed::<DataUpload>(&client, &waiting).await?;
        assert!(status["startTimestamp"].is_null(), "it never started moving: {status}");
        let message = status["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("while it waited for a data-movement slot")
                && message.contains("no data was moved"),
            "{pvc}: {message}"
        );
        if pvc == "files" {
            cancels_while_prepared_or_new(&client, &ns).await?;
        }

        gone.push(remove_holder(&client, &moving, mid_move, false).await?);
        let status = wait_failed::<DataUpload>(&client, &moving).await?;
        let message = status["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("while the data moved")
                && message.contains("nothing of this backup was recorded"),
            "{pvc}: {message}"
        );
        assert_eq!(status["snapshotID"].as_str().unwrap_or_default(), "", "no snapshot: {status}");
        for (name, handle) in &bases {
            nothing_kept(node, &client, name, handle).await?;
        }
        gate.open();
    }

    for uid in &gone {
        kubelet_forgets(node, uid).await?;
    }
    node::delete_pvc(&client, &ns, "files").await?;
    node::delete_pvc(&client, &ns, "disk").await?;
    node::no_leaked_devices(node).await
}

#[tokio::test]
async fn holding_pods_gone_mid_restore_fail_their_downloads_and_nothing_is_handed_over()
-> TestResult {
    let node = node::node();
    // Alone: the stalled transfer holds the node's only data-movement slot, and the tests
    // share the gate.
    let _agent = node::AGENT.write().await;
    let client = node.client()?;
    let gate = gate(node).await?;
    let ns = node.namespace("held-down").await?;
    filled_volumes(&client, &ns).await?;
    let mut backups = Vec::new();
    for pvc in ["files", "disk"] {
        let snapshot = node::snapshot(&client, &ns, pvc).await?;
        let du = node::data_upload_to(&client, GATED_BSL, &ns, pvc, &snapshot, "held").await?;
        backups.push(node::wait_upload(&client, &name_of(&du)).await?);
    }

    let _reopen = Reopen(gate);
    let target = node.namespace("held-down-to").await?;
    let mut gone = Vec::new();
    // Each volume mode in both moments, each moment with both ways a pod goes away.
    for ((pvc, size, mode, mid_move, waiting_for_slot), from) in [
        ("files", "512Mi", "Filesystem", Remove::Delete, Remove::Evict),
        ("disk", "256Mi", "Block", Remove::Evict, Remove::Delete),
    ]
    .into_iter()
    .zip(&backups)
    {
        gate.close();
        let dd = node::data_download(&client, &target, pvc, size, mode, from, "held-r").await?;
        let dd = name_of(&dd);
        stall_mid_transfer::<DataDownload>(&client, &dd, gate).await?;
        // A restore whose volume is located, then unmounted while it waits for the slot the
        // stalled one holds (a file-system restore once restored onto the node's own disk
        // this way).
        let waiting_pvc = format!("waiting-{pvc}");
        let waiting =
            node::data_download(&client, &target, &waiting_pvc, size, mode, from, "held-w").await?;
        let waiting = name_of(&waiting);
        gone.push(remove_holder(&client, &waiting, waiting_for_slot, true).await?);
        let status = wait_failed::<DataDownload>(&client, &waiting).await?;
        assert!(status["startTimestamp"].is_null(), "it never started moving: {status}");
        let message = status["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("while it waited for a data-movement slot")
                && message.contains("no data was moved"),
            "{pvc}: {message}"
        );
        unbound(&client, &target, &waiting_pvc).await?;

        gone.push(remove_holder(&client, &dd, mid_move, false).await?);
        let status = wait_failed::<DataDownload>(&client, &dd).await?;
        let message = status["message"].as_str().unwrap_or_default();
        assert!(
            message.contains("the restored volume is incomplete and was not handed over"),
            "{pvc}: {message}"
        );
        gate.open();
        unbound(&client, &target, pvc).await?;
    }
    for uid in &gone {
        kubelet_forgets(node, uid).await?;
    }
    let claims = [(&ns, "files"), (&ns, "disk"), (&target, "files"), (&target, "disk")];
    let waiting = [(&target, "waiting-files"), (&target, "waiting-disk")];
    for (namespace, pvc) in claims.into_iter().chain(waiting) {
        node::delete_pvc(&client, namespace, pvc).await?;
    }
    node::no_leaked_devices(node).await
}
