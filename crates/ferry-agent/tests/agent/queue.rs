//! Velero's `prepareQueueLength`: no more CRs between acceptance and data movement than the
//! limit; the rest wait in New and all complete; counting costs the API server no LIST.

use std::sync::{Arc, Mutex};
use std::time::Duration;

use ferry_api::{DataUpload, DataUploadPhase};
use kube::api::ListParams;

use crate::sim::{Behaviour, Placement, Sim};
use crate::support::TestCluster;

const NODES: [&str; 1] = ["queue-node"];

/// The most CRs of `data_mover` seen at once in Accepted or Prepared, and whether any CR was
/// New at such a moment (the queue held work back), polled until `stop`.
#[derive(Debug, Default, Clone, Copy)]
struct Seen {
    most_preparing: usize,
    held_back: bool,
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_prepare_queue_holds_new_uploads_back_and_all_complete() {
    let slow =
        Behaviour { chunks: 4, chunk_delay: Duration::from_millis(200), ..Behaviour::default() };
    let sim = Sim::new(Placement::Accepting, slow);
    let mut cluster = TestCluster::new(sim, |c| {
        c.concurrency = 1;
        c.prepare_queue_length = Some(2);
    });
    cluster.start_agents(&NODES).await;
    let seen = Arc::new(Mutex::new(Seen::default()));
    let stop = tokio_util::sync::CancellationToken::new();
    let watcher = {
        let (api, seen, stop) = (cluster.uploads.clone(), Arc::clone(&seen), stop.clone());
        let mover = cluster.data_mover.clone();
        tokio::spawn(async move {
            // Bounded: at most 20 minutes of 50 ms polls, or until the test says stop.
            for _ in 0..24_000 {
                if stop.is_cancelled() {
                    return;
                }
                if let Ok(list) = api.list(&ListParams::default()).await {
                    let ours: Vec<&DataUpload> =
                        list.items.iter().filter(|d| d.spec.data_mover == mover).collect();
                    let phase = |d: &DataUpload| d.phase();
                    let preparing = ours
                        .iter()
                        .filter(|d| {
                            matches!(
                                phase(d),
                                DataUploadPhase::Accepted | DataUploadPhase::Prepared
                            )
                        })
                        .count();
                    let new = ours.iter().any(|d| phase(d) == DataUploadPhase::New);
                    let mut s = seen.lock().expect("seen");
                    s.most_preparing = s.most_preparing.max(preparing);
                    s.held_back |= new && preparing >= 2;
                }
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        })
    };
    let names = cluster.uploads_all_completed("pq", 6).await;
    assert_eq!(names.len(), 6);
    stop.cancel();
    watcher.await.expect("watcher");
    let seen = *seen.lock().expect("seen");
    assert!(seen.most_preparing <= 2, "more than 2 uploads in Accepted/Prepared: {seen:?}");
    assert!(seen.held_back, "the queue never held a New upload back: {seen:?}");
    // The agent counts the queue in its controllers' caches: the uploads are listed by the
    // caches' first listing, not once per count (each of the six was counted several times,
    // the four held back on every retry).
    let requests = &cluster.requests[NODES[0]];
    let lists: Vec<_> =
        requests.all().into_iter().filter(|s| s.is_list_of("datauploads")).collect();
    assert!(
        !lists.is_empty() && lists.len() <= 2,
        "DataUpload LISTs of the agent (its one DataUpload cache lists once, maybe again after a lost watch): {lists:?}"
    );
    cluster.shutdown().await;
}
