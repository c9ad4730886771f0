//! Ferry's agent gone from its node while a block backup that keeps its base snapshot moves
//! data (its content `Retain` and labelled pending from the moment it was made):
//! - the agent's pod replaced (an upgrade, its pod deleted): the new agent's sweep leaves the
//!   pending base alone, since its DataUpload is still there; the resumed backup completes,
//!   keeps its base, and the next backup reads the driver's delta from it;
//! - the agent kept off the node (no pod of its DaemonSet runs there) while the DataUpload is
//!   deleted, its finalizer taken off by hand (as an operator unsticks a deletion while Ferry
//!   is not running): the cluster's garbage collector removes what the backup exposed
//!   (holding pod, PVC, VolumeSnapshot: each owned by the DataUpload), but not the
//!   cluster-scoped content, which keeps the physical snapshot. No cleanup will run for a
//!   DataUpload that is gone; the agent, once back, releases the content and the driver
//!   deletes the snapshot.

use std::panic::AssertUnwindSafe;
use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::apps::v1::DaemonSet;
use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use ferry_api::{DataUpload, VolumeSnapshot, VolumeSnapshotContent};
use ferry_testbed::VELERO_NAMESPACE;
use ferry_testbed::netns::Gate;
use futures::FutureExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};

use crate::cbt::{MIB, content_when, is_kept, kept_block_pvc, release_base, restore_block, write};
use crate::holder::{
    GATED_BSL, Reopen, WRITE_DEVICE, gate, nothing_kept, pending_base, stall_mid_transfer,
};
use crate::node::{self, AGENT_DAEMONSET, AGENT_LABELS, TestResult, WAIT, name_of, wait_gone};

/// The node label the agent's DaemonSet is made to require while it is away (no node has it).
const AWAY_LABEL: &str = "ferry.io/test-agent-away";

/// A block backup that keeps its base, moving data when the agent's pod is deleted: it resumes
/// and completes, its base is kept (the same physical snapshot), and the next backup reads
/// only the driver's delta from it; both restore bit for bit.
#[tokio::test]
async fn a_block_backup_resumed_by_a_new_agent_keeps_its_base_for_the_next_delta() -> TestResult {
    let node = node::node();
    // Alone: the agent's pod is replaced, and the tests share the gate.
    let _agent = node::AGENT.write().await;
    let client = node.client()?;
    let gate = gate(node).await?;
    let _reopen = Reopen(gate);
    let Stalled { ns, name: first, handle, written, _bases: _release } =
        stalled_kept_backup(node, &client, gate, "resumed-base").await?;

    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let mut agents = pods.list(&ListParams::default().labels(AGENT_LABELS)).await?.items;
    agents.retain(|p| p.metadata.deletion_timestamp.is_none());
    assert_eq!(agents.len(), 1, "one agent pod on the one node");
    let old = name_of(&agents[0]);
    pods.delete(&old, &DeleteParams::default()).await?;
    wait_gone(&pods, &old).await?;
    node.cluster.wait_agent_ready(&client).await?;
    // The new agent's sweep runs as it starts and leaves the base pending: its DataUpload is
    // there. (The stalled transfer cannot complete meanwhile; were the base released, the
    // completed backup could not keep it either, and the delta below would not be read.)
    tokio::time::sleep(Duration::from_secs(5)).await;
    still_pending(node, &client, &first, &handle).await?;
    gate.open();

    let first = node::wait_upload(&client, &first).await?;
    let first_name = name_of(&first);
    let told = node::agent_events_after(&client, &first_name, "Resumed").await?;
    assert_eq!(told.get("Resumed"), Some(&1), "a Resumed Event on {first_name}: {told:?}");
    let message = &first.status.clone().unwrap_or_default().message;
    assert!(message.contains("allocated ranges"), "{message}");
    let kept = content_when(&client, &first_name, "kept", is_kept).await?;
    let kept_handle = kept.and_then(|c| c.status?.snapshot_handle);
    assert_eq!(kept_handle.as_deref(), Some(handle.as_str()), "the base kept is another snapshot");
    assert!(node.cluster.hostpath_snapshot_exists(&handle), "the kept base {handle} is gone");
    let (target_ns, md5) = restore_block(node, &client, &first, "256Mi").await?;
    assert_eq!(md5, written, "the resumed backup restores other bytes");
    node::delete_pvc(&client, &target_ns, "disk").await?;

    // 1 MiB changed: the next backup reads the delta from the kept base.
    let written = write(
        &client,
        &ns,
        "dd if=/dev/urandom of=/dev/volume bs=1M count=1 seek=100 conv=fsync 2>/dev/null",
    )
    .await?;
    let snapshot = node::snapshot(&client, &ns, "disk").await?;
    let du = node::data_upload_to(&client, GATED_BSL, &ns, "disk", &snapshot, "resumed-2").await?;
    let second = node::wait_upload(&client, &name_of(&du)).await?;
    let message = second.status.clone().unwrap_or_default().message;
    assert!(
        message.contains(&format!("changed since the parent's snapshot ({MIB} bytes)")),
        "the backup after the resumed one did not read by the driver's delta: {message}"
    );
    content_when(&client, &first_name, "released", |c| c.is_none()).await?;
    assert!(!node.cluster.hostpath_snapshot_exists(&handle), "the superseded base {handle} stays");
    let (target_ns, md5) = restore_block(node, &client, &second, "256Mi").await?;
    assert_eq!(md5, written, "the delta backup restores other bytes");
    node::delete_pvc(&client, &target_ns, "disk").await?;
    release_base(&client, &second).await?;
    node::delete_pvc(&client, &ns, "disk").await
}

/// A block backup that keeps its base, moving data when the agent is taken off the node; its
/// DataUpload deleted by hand meanwhile. Its base, which no cleanup will release, stays with
/// its physical snapshot until the agent is back; the agent's sweep then releases both, and
/// nothing of the backup is left on the node.
#[tokio::test]
async fn a_pending_base_left_while_the_agent_was_away_is_released_on_its_return() -> TestResult {
    let node = node::node();
    // Alone: the agent is taken off the node, and the tests share the gate.
    let _agent = node::AGENT.write().await;
    let client = node.client()?;
    let gate = gate(node).await?;
    let _reopen = Reopen(gate);
    let Stalled { ns, name, handle, _bases: _release, .. } =
        stalled_kept_backup(node, &client, gate, "away").await?;

    // The agent is put back whatever happened while it was away: later tests need it.
    let away =
        AssertUnwindSafe(deleted_while_away(node, &client, &name, &handle)).catch_unwind().await;
    let back = agent_back(node, &client).await;
    match away {
        Ok(result) => result.map_err(|e| match &back {
            Ok(()) => e,
            Err(b) => format!("{e}; and the agent could not be put back: {b}").into(),
        })?,
        Err(panic) => std::panic::resume_unwind(panic),
    }
    back?;
    gate.open();

    // The returned agent's sweep releases the content: it is deleted and so is the physical
    // snapshot.
    nothing_kept(node, &client, &name, &handle).await?;
    released_logged(node, &name).await?;
    node::no_leaked_devices(node).await?;
    node::delete_pvc(&client, &ns, "disk").await
}

/// The content of DataUpload `name` is still there, `Retain`, pending, with the physical
/// snapshot `handle`: nothing released it.
async fn still_pending(node: &node::Node, client: &Client, name: &str, handle: &str) -> TestResult {
    let contents: Api<VolumeSnapshotContent> = Api::all(client.clone());
    let content = contents.get_opt(name).await?.ok_or(format!("{name}'s content was released"))?;
    assert_eq!(content.spec.deletion_policy, "Retain", "{content:?}");
    let label = content.labels().get(ferry_expose::KEPT_BASE_LABEL).map(String::as_str);
    assert_eq!(label, Some("pending"), "{content:?}");
    let kept = content.spec.source.snapshot_handle.as_deref();
    assert_eq!(kept, Some(handle), "{name}'s content names another snapshot: {content:?}");
    assert!(
        node.cluster.hostpath_snapshot_exists(handle),
        "the driver no longer keeps {handle}, though nothing released it"
    );
    Ok(())
}

/// The agent logged that it released DataUpload `name`'s base as a deleted backup's (within a
/// minute: the line comes with the deletion, and the log is read as the kubelet writes it).
async fn released_logged(node: &node::Node, name: &str) -> TestResult {
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let logs = node.agent_logs().await?;
        if logs.lines().any(|l| {
            l.contains("released the kept base snapshot of a deleted backup") && l.contains(name)
        }) {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("the returned agent did not log releasing {name}'s base").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// A block backup stalled mid-transfer, its base to be kept (see [`stalled_kept_backup`]).
struct Stalled {
    /// The namespace of its PVC, `disk`.
    ns: String,
    /// The DataUpload's name.
    name: String,
    /// Its pending base's physical snapshot.
    handle: String,
    /// The device's MD5.
    written: String,
    /// Whatever the test leaves kept is released at its end.
    _bases: crate::cbt::ReleaseBases,
}

/// A 256 MiB block PVC `disk` in a new namespace `prefix-…`, its backups to keep their base,
/// with 200 MB of random bytes; its backup into the gated location, stalled mid-transfer with
/// the gate left closed, and the backup's base pending.
async fn stalled_kept_backup(
    node: &node::Node,
    client: &Client,
    gate: &Gate,
    prefix: &str,
) -> Result<Stalled, Box<dyn std::error::Error>> {
    let ns = node.namespace(prefix).await?;
    let bases = crate::cbt::ReleaseBases(ns.clone());
    kept_block_pvc(client, &ns, "256Mi").await?;
    let written = write(client, &ns, WRITE_DEVICE).await?;
    gate.close();
    let snapshot = node::snapshot(client, &ns, "disk").await?;
    let du = node::data_upload_to(client, GATED_BSL, &ns, "disk", &snapshot, prefix).await?;
    let name = name_of(&du);
    stall_mid_transfer::<DataUpload>(client, &name, gate).await?;
    let handle = pending_base(client, &name).await?;
    Ok(Stalled { ns, name, handle, written, _bases: bases })
}

/// With the agent's pod kept off the node: the DataUpload `name` deleted (finalizer removed),
/// its exposed objects collected by the cluster, and its content left `Retain` and pending
/// with the driver's snapshot `handle`, which nothing but Ferry will release.
async fn deleted_while_away(
    node: &node::Node,
    client: &Client,
    name: &str,
    handle: &str,
) -> TestResult {
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let away = serde_json::json!({ "spec": { "template": { "spec": {
        "nodeSelector": { AWAY_LABEL: "true" }
    }}}});
    sets.patch(AGENT_DAEMONSET, &PatchParams::default(), &Patch::Merge(&away)).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let agents = ListParams::default().labels(AGENT_LABELS);
    // The chart's grace period is 60 s; the stalled transfer cannot finish in it.
    wait_until("the agent pods gone", || async { Ok(pods.list(&agents).await?.items.is_empty()) })
        .await?;

    let uploads: Api<DataUpload> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let left = uploads.get(name).await?;
    let phase = left.status.as_ref().and_then(|s| s.phase);
    assert_eq!(
        phase,
        Some(ferry_api::DataUploadPhase::InProgress),
        "the agent left {name} other than InProgress: {:?}",
        left.status
    );
    let held =
        left.finalizers().iter().any(|f| f == ferry_api::keys::DATA_UPLOAD_DOWNLOAD_FINALIZER);
    assert!(held, "{name} is not held by Ferry's finalizer while it moves data: {left:?}");
    uploads.delete(name, &DeleteParams::default()).await?;
    let unstick = serde_json::json!({ "metadata": { "finalizers": null } });
    uploads.patch(name, &PatchParams::default(), &Patch::Merge(&unstick)).await?;
    wait_gone(&uploads, name).await?;

    // What the backup exposed is collected with its owner.
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    wait_until(&format!("{name}'s holding pod, PVC and VolumeSnapshot collected"), || async {
        Ok(pods.get_opt(name).await?.is_none()
            && claims.get_opt(name).await?.is_none()
            && snapshots.get_opt(name).await?.is_none())
    })
    .await?;

    // The content and its physical snapshot stay: only Ferry knows they are no longer needed.
    // A few seconds more, so a release by anything else would show.
    tokio::time::sleep(Duration::from_secs(5)).await;
    still_pending(node, client, name, handle).await
}

/// Lets the agent back on the node (a few tries: later tests need it) and waits until it is
/// Ready.
async fn agent_back(node: &node::Node, client: &Client) -> TestResult {
    let sets: Api<DaemonSet> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let back = serde_json::json!({ "spec": { "template": { "spec": {
        "nodeSelector": { AWAY_LABEL: null }
    }}}});
    let mut tries = 0;
    while let Err(e) =
        sets.patch(AGENT_DAEMONSET, &PatchParams::default(), &Patch::Merge(&back)).await
    {
        tries += 1;
        if tries == 5 {
            return Err(format!("the agent's DaemonSet could not be put back: {e}").into());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
    node.cluster.wait_agent_ready(client).await?;
    Ok(())
}

/// Polls `done` until it holds, for at most [`WAIT`].
async fn wait_until<F, Fut>(what: &str, done: F) -> TestResult
where
    F: Fn() -> Fut,
    Fut: std::future::Future<Output = Result<bool, Box<dyn std::error::Error>>>,
{
    let deadline = Instant::now() + WAIT;
    while !done().await? {
        if Instant::now() > deadline {
            return Err(format!("not done after {WAIT:?}: {what}").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    Ok(())
}
