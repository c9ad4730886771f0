//! Cancel (`spec.cancel`, set with a merge patch as Velero does) and deletion, in every
//! phase: the CR ends Canceled with a message naming the cause, in-flight work is stopped,
//! the exposer cleans up, and Ferry's finalizer and label are gone.

use std::time::Duration;

use ferry_api::{DataUpload, DataUploadPhase};

use crate::sim::{Behaviour, Call, ExposeMode, Placement, Sim};
use crate::support::{TestCluster, delete, released, request_cancel, unique, wait_for, wait_gone};

const NODES: [&str; 2] = ["node-a", "node-b"];

fn slow() -> Behaviour {
    Behaviour { chunks: 200, chunk_delay: Duration::from_millis(100), ..Behaviour::default() }
}

async fn wait_canceled(cluster: &TestCluster, name: &str) -> DataUpload {
    let du = wait_for(&cluster.uploads, name, "Canceled and released", |du| {
        du.phase() == DataUploadPhase::Canceled && released(du)
    })
    .await;
    let status = du.status.clone().expect("status");
    assert!(
        status.message.contains("spec.cancel"),
        "message without the cause: {}",
        status.message
    );
    assert!(status.completion_timestamp.is_some());
    assert!(
        cluster.sim.count(|c| matches!(c, Call::Cleanup { cr } if cr == name)) >= 1,
        "no cleanup for {name}: {:?}",
        cluster.sim.calls()
    );
    du
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_in_new_ends_canceled_without_any_node_accepting() {
    let sim = Sim::new(Placement::Accepting, Behaviour::default());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    let name = unique("cancel-new");
    cluster.create_upload(&name).await;
    request_cancel(&cluster.uploads, &name).await;
    cluster.start_agents(&NODES).await;
    let du = wait_canceled(&cluster, &name).await;
    assert!(du.status.expect("status").accepted_by_node.is_empty());
    assert_eq!(sim.count(|c| matches!(c, Call::Expose { .. })), 0);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_in_accepted_stops_the_exposer() {
    let sim = Sim::new(Placement::Accepting, Behaviour::default());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    cluster.start_agents(&NODES).await;
    let name = unique("cancel-acc");
    sim.set(&name, Behaviour { expose: ExposeMode::Hang, ..Behaviour::default() });
    cluster.create_upload(&name).await;
    wait_for(&cluster.uploads, &name, "Accepted and exposing", |du| {
        du.phase() == DataUploadPhase::Accepted
            && sim.count(|c| matches!(c, Call::Expose { cr, .. } if *cr == name)) == 1
    })
    .await;
    request_cancel(&cluster.uploads, &name).await;
    wait_canceled(&cluster, &name).await;
    assert_eq!(sim.count(|c| matches!(c, Call::ExposeCanceled { cr } if *cr == name)), 1);
    let reasons = cluster.event_reasons_after(&name, "Canceled").await;
    for reason in ["Accepted", "Canceling", "Canceled"] {
        assert!(reasons.iter().any(|r| r == reason), "no {reason} event in {reasons:?}");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_in_prepared_ends_canceled() {
    let sim = Sim::new(Placement::Fixed(NODES[1].into()), Behaviour::default());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    cluster.start_agents(&NODES).await;
    let name = unique("cancel-prep");
    sim.set(&name, Behaviour { locatable: false, ..Behaviour::default() });
    cluster.create_upload(&name).await;
    wait_for(&cluster.uploads, &name, "Prepared", |du| du.phase() == DataUploadPhase::Prepared)
        .await;
    request_cancel(&cluster.uploads, &name).await;
    wait_canceled(&cluster, &name).await;
    assert_eq!(sim.count(|c| matches!(c, Call::MoveStart { .. })), 0);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancel_in_progress_stops_the_data_movement() {
    let sim = Sim::new(Placement::Accepting, slow());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    cluster.start_agents(&NODES).await;
    let name = unique("cancel-run");
    cluster.create_upload(&name).await;
    let running = wait_for(&cluster.uploads, &name, "InProgress with progress", |du| {
        du.phase() == DataUploadPhase::InProgress
            && du.status.as_ref().is_some_and(|s| s.progress.bytes_done > 0)
    })
    .await;
    let node = running.status.expect("status").node;
    request_cancel(&cluster.uploads, &name).await;
    let du = wait_canceled(&cluster, &name).await;
    assert_eq!(
        sim.count(|c| matches!(c, Call::MoveCanceled { cr, node: n } if *cr == name && *n == node)),
        1,
        "{:?}",
        sim.calls()
    );
    assert_eq!(sim.count(|c| matches!(c, Call::MoveDone { cr, .. } if *cr == name)), 0);
    assert_eq!(du.status.expect("status").node, node);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn deleting_an_upload_in_progress_cancels_cleans_up_and_lets_it_go() {
    let sim = Sim::new(Placement::Accepting, slow());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    cluster.start_agents(&NODES).await;
    let name = unique("delete-run");
    cluster.create_upload(&name).await;
    wait_for(&cluster.uploads, &name, "InProgress", |du| du.phase() == DataUploadPhase::InProgress)
        .await;
    delete(&cluster.uploads, &name).await;
    wait_gone(&cluster.uploads, &name).await;
    assert_eq!(sim.count(|c| matches!(c, Call::MoveCanceled { cr, .. } if *cr == name)), 1);
    assert!(sim.count(|c| matches!(c, Call::Cleanup { cr } if *cr == name)) >= 1);
    cluster.shutdown().await;
}
