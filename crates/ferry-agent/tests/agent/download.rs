//! DataDownloads: the same machine with the restore side of the backends.

use std::time::Duration;

use ferry_api::DataDownloadPhase;

use crate::sim::{Behaviour, Call, Placement, Sim};
use crate::support::{
    History, TestCluster, dd_progress, released, request_cancel, unique, wait_for,
};

const NODES: [&str; 2] = ["node-a", "node-b"];

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn downloads_complete_with_progress_on_the_volumes_node() {
    let sim = Sim::new(Placement::Fixed(NODES[1].into()), Behaviour::default());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    cluster.start_agents(&NODES).await;
    let names: Vec<String> = (0..4).map(|i| unique(&format!("restore{i}"))).collect();
    let histories: Vec<History> =
        names.iter().map(|n| History::record(&cluster.downloads, n, dd_progress)).collect();
    for name in &names {
        cluster.create_download(name).await;
    }
    for name in &names {
        let dd = wait_for(&cluster.downloads, name, "Completed and released", |dd| {
            dd.phase() == DataDownloadPhase::Completed && released(dd)
        })
        .await;
        let status = dd.status.expect("status");
        assert_eq!(status.node, NODES[1]);
        assert!(NODES.contains(&status.accepted_by_node.as_str()));
        assert_eq!(status.progress.total_bytes, 4 << 20);
        assert_eq!(status.progress.bytes_done, 4 << 20);
        assert!(status.start_timestamp.is_some() && status.completion_timestamp.is_some());
        assert_eq!(sim.count(|c| matches!(c, Call::MoveStart { cr, .. } if cr == name)), 1);
        // The restore side's finishing step (the rebind) ran before Completed.
        assert_eq!(sim.count(|c| matches!(c, Call::Finish { cr } if cr == name)), 1);
        assert!(sim.count(|c| matches!(c, Call::Cleanup { cr } if cr == name)) >= 1);
        let reasons = cluster.event_reasons_after(name, "Completed").await;
        for reason in ["Accepted", "Prepared", "InProgress", "Completed"] {
            assert!(reasons.iter().any(|r| r == reason), "no {reason} event in {reasons:?}");
        }
    }
    for history in &histories {
        // The watch may lag behind the reads above: check once it saw the final version.
        let versions = history.wait_until_seen("Completed").await;
        assert!(
            versions.iter().filter(|(phase, _)| phase == "Completed").all(|(_, d)| *d == 4 << 20),
            "Completed without all bytes done: {versions:?}"
        );
        history.assert_monotonic();
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_download_canceled_in_progress_ends_canceled() {
    let slow =
        Behaviour { chunks: 200, chunk_delay: Duration::from_millis(100), ..Behaviour::default() };
    let sim = Sim::new(Placement::Accepting, slow);
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    cluster.start_agents(&NODES).await;
    let name = unique("restore-cancel");
    cluster.create_download(&name).await;
    wait_for(&cluster.downloads, &name, "InProgress", |dd| {
        dd.phase() == DataDownloadPhase::InProgress
    })
    .await;
    request_cancel(&cluster.downloads, &name).await;
    let dd = wait_for(&cluster.downloads, &name, "Canceled and released", |dd| {
        dd.phase() == DataDownloadPhase::Canceled && released(dd)
    })
    .await;
    let message = dd.status.expect("status").message;
    assert_eq!(message, "canceled: spec.cancel was set");
    assert_eq!(sim.count(|c| matches!(c, Call::MoveCanceled { cr, .. } if *cr == name)), 1);
    assert_eq!(sim.count(|c| matches!(c, Call::Finish { cr } if *cr == name)), 0);
    assert!(sim.count(|c| matches!(c, Call::Cleanup { cr } if *cr == name)) >= 1);
    cluster.shutdown().await;
}
