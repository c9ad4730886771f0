//! Restarts and lost nodes: an agent that comes back resumes its CRs; the CRs of an agent
//! that stopped renewing its lease are taken over by another; nothing stalls forever.

use std::time::Duration;

use ferry_agent::annotations;
use ferry_api::{DataUploadPhase, keys};
use kube::ResourceExt;

use crate::sim::{Behaviour, Call, ExposeMode, Placement, Sim};
use crate::support::{History, TestCluster, du_progress, released, unique, wait_for};

fn slow() -> Behaviour {
    Behaviour { chunks: 30, chunk_delay: Duration::from_millis(150), ..Behaviour::default() }
}

/// Waits until the watch saw Completed, then asserts it saw every byte done there and
/// `bytesDone` never went backwards on the way (across the restart or takeover).
async fn assert_completed_monotonic(history: &History, total: i64) {
    let versions = history.wait_until_seen("Completed").await;
    assert!(
        versions.iter().filter(|(phase, _)| phase == "Completed").all(|(_, done)| *done == total),
        "Completed without all {total} bytes done: {versions:?}"
    );
    history.assert_monotonic();
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_agent_restarted_mid_upload_resumes_and_completes() {
    let sim = Sim::new(Placement::Accepting, slow());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    cluster.start_agent("node-a").await;
    let name = unique("restart");
    let history = History::record(&cluster.uploads, &name, du_progress);
    cluster.create_upload(&name).await;
    wait_for(&cluster.uploads, &name, "InProgress with progress", |du| {
        du.phase() == DataUploadPhase::InProgress
            && du.status.as_ref().is_some_and(|s| s.progress.bytes_done > 0)
    })
    .await;
    cluster.stop_agent("node-a").await;
    // Stopping writes nothing: the CR is still InProgress on node-a, finalizer on.
    let stopped = cluster.uploads.get(&name).await.expect("get");
    assert_eq!(stopped.phase(), DataUploadPhase::InProgress);
    assert_eq!(stopped.status.as_ref().expect("status").node, "node-a");
    assert!(stopped.finalizers().iter().any(|f| f == keys::DATA_UPLOAD_DOWNLOAD_FINALIZER));
    assert_eq!(sim.count(|c| matches!(c, Call::MoveCanceled { cr, .. } if *cr == name)), 1);

    cluster.start_agent("node-a").await;
    let du = wait_for(&cluster.uploads, &name, "Completed and released", |du| {
        du.phase() == DataUploadPhase::Completed && released(du)
    })
    .await;
    let status = du.status.expect("status");
    assert_eq!(status.node, "node-a");
    assert_eq!(status.progress.bytes_done, status.progress.total_bytes);
    assert!(status.message.is_empty(), "{}", status.message);
    let moves =
        sim.count(|c| matches!(c, Call::MoveStart { cr, node } if *cr == name && node == "node-a"));
    assert_eq!(moves, 2, "{:?}", sim.calls());
    // The volume was still there: resumed without exposing again.
    assert_eq!(sim.count(|c| matches!(c, Call::Expose { cr, .. } if *cr == name)), 1);
    assert!(cluster.event_reasons_after(&name, "Resumed").await.iter().any(|r| r == "Resumed"));
    assert_completed_monotonic(&history, status.progress.total_bytes).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_of_a_dead_agent_is_taken_over_and_completes() {
    let sim = Sim::new(Placement::Accepting, slow());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    cluster.start_agent("node-a").await;
    let name = unique("takeover");
    let history = History::record(&cluster.uploads, &name, du_progress);
    cluster.create_upload(&name).await;
    wait_for(&cluster.uploads, &name, "InProgress on node-a", |du| {
        du.phase() == DataUploadPhase::InProgress
            && du.status.as_ref().is_some_and(|s| s.node == "node-a" && s.progress.bytes_done > 0)
    })
    .await;
    // node-a dies for good; node-b comes up.
    cluster.stop_agent("node-a").await;
    cluster.start_agent("node-b").await;
    let du = wait_for(&cluster.uploads, &name, "Completed by node-b", |du| {
        du.phase() == DataUploadPhase::Completed && released(du)
    })
    .await;
    let status = du.status.clone().expect("status");
    assert_eq!(status.node, "node-b");
    assert_eq!(status.accepted_by_node, "node-b");
    assert_eq!(du.annotations().get(annotations::TAKEOVERS).map(String::as_str), Some("1"));
    assert_eq!(status.progress.bytes_done, status.progress.total_bytes);
    let moves: Vec<String> = sim
        .calls()
        .into_iter()
        .filter_map(|c| match c {
            Call::MoveStart { cr, node } if cr == name => Some(node),
            _ => None,
        })
        .collect();
    assert_eq!(moves, ["node-a", "node-b"]);
    assert!(cluster.event_reasons_after(&name, "TakenOver").await.iter().any(|r| r == "TakenOver"));
    assert_completed_monotonic(&history, status.progress.total_bytes).await;
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_accepted_by_a_dead_agent_is_taken_over() {
    let sim = Sim::new(Placement::Accepting, Behaviour::default());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    cluster.start_agent("node-a").await;
    let name = unique("takeover-acc");
    sim.set(&name, Behaviour { expose: ExposeMode::Hang, ..Behaviour::default() });
    cluster.create_upload(&name).await;
    wait_for(&cluster.uploads, &name, "Accepted by node-a", |du| {
        du.phase() == DataUploadPhase::Accepted
    })
    .await;
    cluster.stop_agent("node-a").await;
    // The snapshot becomes exposable; node-b must pick the CR up although node-a never comes back.
    sim.set(&name, Behaviour::default());
    cluster.start_agent("node-b").await;
    let du = wait_for(&cluster.uploads, &name, "Completed", |du| {
        du.phase() == DataUploadPhase::Completed && released(du)
    })
    .await;
    let status = du.status.expect("status");
    assert_eq!((status.accepted_by_node.as_str(), status.node.as_str()), ("node-b", "node-b"));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_exposed_on_a_node_without_an_agent_fails_instead_of_stalling() {
    let sim = Sim::new(Placement::Fixed("node-without-agent".into()), Behaviour::default());
    let mut cluster = TestCluster::new(sim.clone(), |c| c.max_takeovers = 1);
    cluster.start_agent("node-a").await;
    let name = unique("ghost");
    cluster.create_upload(&name).await;
    let du = wait_for(&cluster.uploads, &name, "Failed", |du| {
        du.phase() == DataUploadPhase::Failed && released(du)
    })
    .await;
    let message = du.status.expect("status").message;
    assert!(
        message.contains("node node-without-agent stopped renewing its liveness lease")
            && message.contains("taken over 1 times"),
        "{message}"
    );
    assert_eq!(sim.count(|c| matches!(c, Call::Expose { cr, .. } if *cr == name)), 2);
    assert!(sim.count(|c| matches!(c, Call::Cleanup { cr } if *cr == name)) >= 1);
    cluster.shutdown().await;
}
