//! DataUploads: the object lock, the phases and their fields, the data mover filter,
//! progress, failures and timeouts.

use std::time::Duration;

use ferry_agent::annotations;
use ferry_api::{DataUploadPhase, NodeOs, keys};
use kube::ResourceExt;

use crate::sim::{Behaviour, Call, ExposeMode, Placement, Sim};
use crate::support::{History, TestCluster, du_progress, released, unique, wait_for};

const NODES: [&str; 3] = ["node-a", "node-b", "node-c"];

fn spread() -> Placement {
    Placement::Spread(NODES.iter().map(|n| (*n).to_owned()).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn three_agents_process_each_of_24_uploads_exactly_once() {
    let sim = Sim::new(spread(), Behaviour::default());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    cluster.start_agents(&NODES).await;
    let names: Vec<String> = (0..24).map(|i| unique(&format!("race{i}"))).collect();
    for name in &names {
        cluster.create_upload(name).await;
    }
    for name in &names {
        let du = wait_for(&cluster.uploads, name, "Completed and released", |du| {
            du.phase() == DataUploadPhase::Completed && released(du)
        })
        .await;
        let status = du.status.clone().expect("status");
        let moved_on = status.node.clone();
        assert!(NODES.contains(&moved_on.as_str()), "node {moved_on:?}");
        assert!(NODES.contains(&status.accepted_by_node.as_str()));
        assert_eq!(du.annotations().get(annotations::EXPOSED_NODE), Some(&moved_on));
        assert_eq!(status.snapshot_id, format!("snap-{name}"));
        assert_eq!(status.path, Sim::path_of(name).to_string_lossy());
        assert_eq!(status.progress.total_bytes, 4 << 20);
        assert_eq!(status.progress.bytes_done, status.progress.total_bytes);
        assert_eq!(status.incremental_bytes, 2 << 20);
        assert_eq!(status.node_os, Some(NodeOs::Linux));
        assert!(status.message.is_empty(), "{}", status.message);
        let started = status.start_timestamp.expect("startTimestamp").0;
        let completed = status.completion_timestamp.expect("completionTimestamp").0;
        let accepted = status.accepted_timestamp.expect("acceptedTimestamp").0;
        assert!(accepted <= started && started <= completed);
        assert_eq!(
            status.data_mover_result.and_then(|r| r.get("ferry.io/moved-by").cloned()),
            Some(moved_on.clone())
        );
        // Exactly one node exposed it and exactly one moved it: the one the volume was on.
        let exposes = sim.count(|c| matches!(c, Call::Expose { cr, .. } if cr == name));
        assert_eq!(exposes, 1, "{name} exposed {exposes} times");
        let moves: Vec<Call> = sim
            .calls()
            .into_iter()
            .filter(|c| matches!(c, Call::MoveStart { cr, .. } if cr == name))
            .collect();
        assert_eq!(moves, [Call::MoveStart { cr: name.clone(), node: moved_on }]);
        assert!(sim.count(|c| matches!(c, Call::Cleanup { cr } if cr == name)) >= 1);
    }
    let (per_cr, per_node) = sim.max_active();
    assert_eq!(per_cr, 1, "two data movements ran at once for one CR");
    assert!(per_node <= 2, "{per_node} movements at once on a node with a limit of 2");
    // The volumes landed on other nodes than the accepting ones at least sometimes, so the
    // hand-over from the accepting node to the volume's node was exercised.
    let mut handed_over = 0;
    for name in &names {
        let du = cluster.uploads.get(name).await.expect("get");
        let status = du.status.expect("status");
        if status.accepted_by_node != status.node {
            handed_over += 1;
        }
    }
    assert!(handed_over > 0, "every volume landed on its accepting node");
    let reasons = cluster.event_reasons_after(&names[0], "Completed").await;
    for reason in ["Accepted", "Prepared", "InProgress", "Completed"] {
        assert!(reasons.iter().any(|r| r == reason), "no {reason} event in {reasons:?}");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn uploads_for_other_data_movers_are_left_untouched() {
    let sim = Sim::new(Placement::Accepting, Behaviour::default());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    let foreign: Vec<(String, &str)> = vec![
        (unique("velero-own"), "velero"),
        (unique("default-own"), ""),
        (unique("other"), "kopia-x"),
    ];
    let mut before = Vec::new();
    for (name, mover) in &foreign {
        let du = crate::support::data_upload(name, mover);
        let created = cluster.uploads.create(&Default::default(), &du).await.expect("create");
        before.push(created);
    }
    cluster.start_agents(&NODES[..2]).await;
    // A CR of ours, created after the foreign ones, completes: the agents were working.
    let ours = unique("ours");
    cluster.create_upload(&ours).await;
    wait_for(&cluster.uploads, &ours, "Completed", |du| du.phase() == DataUploadPhase::Completed)
        .await;
    // Give the agents several rechecks to misbehave.
    tokio::time::sleep(Duration::from_secs(2)).await;
    for created in before {
        let now = cluster.uploads.get(&created.name_any()).await.expect("get");
        assert_eq!(
            now.resource_version(),
            created.resource_version(),
            "{} was written",
            now.name_any()
        );
        assert_eq!(now.status, created.status);
        assert!(now.finalizers().is_empty());
        let events = cluster.events(&now.name_any()).await;
        assert!(events.is_empty(), "events on a foreign CR: {events:?}");
    }
    for (name, _) in &foreign {
        assert_eq!(
            sim.count(
                |c| matches!(c, Call::Expose { cr, .. } | Call::Cleanup { cr } if cr == name)
            ),
            0
        );
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_is_written_while_moving_and_never_goes_backwards() {
    let slow =
        Behaviour { chunks: 12, chunk_delay: Duration::from_millis(250), ..Behaviour::default() };
    let sim = Sim::new(Placement::Accepting, slow);
    let mut cluster =
        TestCluster::new(sim, |c| c.progress_event_interval = Duration::from_millis(700));
    cluster.start_agents(&NODES[..1]).await;
    let name = unique("progress");
    let history = History::record(&cluster.uploads, &name, du_progress);
    cluster.create_upload(&name).await;
    let du = wait_for(&cluster.uploads, &name, "Completed", |du| {
        du.phase() == DataUploadPhase::Completed
    })
    .await;
    let total = du.status.expect("status").progress.total_bytes;
    history.assert_monotonic();
    let values = history.values();
    let partial = values
        .iter()
        .filter(|(phase, done)| phase == "InProgress" && *done > 0 && *done < total)
        .count();
    assert!(
        partial >= 2,
        "fewer than two partial progress writes while moving for 3 s: {values:?}"
    );
    // Progress events tell rate, time left and what became of the bytes; Completed sums up.
    let events = cluster.events_after(&name, "Completed").await;
    let progress: Vec<&String> =
        events.iter().filter(|(reason, _)| reason == "Progress").map(|(_, note)| note).collect();
    assert!(!progress.is_empty(), "no Progress event while moving for 3 s: {events:?}");
    for note in &progress {
        for part in [" of ", "MB/s", "; read ", "deduplicated ", "uploaded "] {
            assert!(note.contains(part), "Progress note without {part:?}: {note}");
        }
    }
    assert!(progress.iter().any(|n| n.contains(" left")), "no time left told: {progress:?}");
    let completed: Vec<&String> =
        events.iter().filter(|(reason, _)| reason == "Completed").map(|(_, note)| note).collect();
    assert_eq!(completed.len(), 1, "{events:?}");
    for part in ["MB/s", "read ", "uploaded "] {
        assert!(completed[0].contains(part), "Completed note without {part:?}: {completed:?}");
    }
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_data_path_error_fails_the_upload_with_its_message() {
    let failing = Behaviour {
        mover_error: Some("repository unreachable: connection refused".into()),
        ..Behaviour::default()
    };
    let sim = Sim::new(Placement::Accepting, Behaviour::default());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    cluster.start_agents(&NODES[..2]).await;
    let name = unique("fails");
    sim.set(&name, failing);
    cluster.create_upload(&name).await;
    let du = wait_for(&cluster.uploads, &name, "Failed and released", |du| {
        du.phase() == DataUploadPhase::Failed && released(du)
    })
    .await;
    let status = du.status.expect("status");
    assert!(
        status.message.contains("data movement failed")
            && status.message.contains("repository unreachable: connection refused"),
        "{}",
        status.message
    );
    assert!(status.completion_timestamp.is_some());
    assert!(sim.count(|c| matches!(c, Call::Cleanup { cr } if *cr == name)) >= 1);
    assert!(cluster.event_reasons_after(&name, "Failed").await.iter().any(|r| r == "Failed"));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_expose_error_fails_the_upload_with_the_reason() {
    let sim = Sim::new(Placement::Accepting, Behaviour::default());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    cluster.start_agents(&NODES[..1]).await;
    let name = unique("noexpose");
    let broken = Behaviour {
        expose: ExposeMode::Fail("VolumeSnapshot app/velero-x not found".into()),
        ..Behaviour::default()
    };
    sim.set(&name, broken);
    cluster.create_upload(&name).await;
    let du = wait_for(&cluster.uploads, &name, "Failed", |du| {
        du.phase() == DataUploadPhase::Failed && released(du)
    })
    .await;
    let message = du.status.expect("status").message;
    assert!(
        message.contains("exposing the volume failed: VolumeSnapshot app/velero-x not found"),
        "{message}"
    );
    // The operation timeout of the CR reached the exposer.
    assert!(sim.calls().contains(&Call::Expose {
        cr: name.clone(),
        node: NODES[0].into(),
        timeout: Duration::from_secs(600)
    }));
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn prepare_timeouts_fail_accepted_and_prepared_uploads() {
    let sim = Sim::new(Placement::Accepting, Behaviour::default());
    let mut cluster = TestCluster::new(sim.clone(), |c| c.prepare_timeout = Duration::from_secs(2));
    cluster.start_agents(&NODES[..2]).await;
    let never_exposed = unique("hang");
    sim.set(&never_exposed, Behaviour { expose: ExposeMode::Hang, ..Behaviour::default() });
    let never_located = unique("lost");
    sim.set(&never_located, Behaviour { locatable: false, ..Behaviour::default() });
    cluster.create_upload(&never_exposed).await;
    cluster.create_upload(&never_located).await;

    let du = wait_for(&cluster.uploads, &never_exposed, "Failed", |du| {
        du.phase() == DataUploadPhase::Failed && released(du)
    })
    .await;
    let message = du.status.expect("status").message;
    assert!(
        message.contains("prepare timeout") && message.contains("not exposed within 2s"),
        "{message}"
    );
    assert!(sim.count(|c| matches!(c, Call::Cleanup { cr } if *cr == never_exposed)) >= 1);

    let du = wait_for(&cluster.uploads, &never_located, "Failed", |du| {
        du.phase() == DataUploadPhase::Failed && released(du)
    })
    .await;
    let message = du.status.expect("status").message;
    assert!(
        message.contains("prepare timeout") && message.contains("did not become available"),
        "{message}"
    );
    assert!(sim.count(|c| matches!(c, Call::Cleanup { cr } if *cr == never_located)) >= 1);
    cluster.shutdown().await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn the_concurrency_limit_queues_work_without_stalling_it() {
    let slow =
        Behaviour { chunks: 4, chunk_delay: Duration::from_millis(150), ..Behaviour::default() };
    let sim = Sim::new(Placement::Accepting, slow);
    let mut cluster = TestCluster::new(sim.clone(), |c| c.concurrency = 1);
    cluster.start_agents(&NODES[..1]).await;
    let names = cluster.uploads_all_completed("queue", 5).await;
    let (_, per_node) = sim.max_active();
    assert_eq!(per_node, 1, "the limit of one movement per node was exceeded");
    assert_eq!(sim.count(|c| matches!(c, Call::MoveDone { .. })), names.len());
    for name in &names {
        let du = cluster.uploads.get(name).await.expect("get");
        assert!(!du.labels().contains_key(keys::EXPOSE_ON_GOING_LABEL));
    }
    cluster.shutdown().await;
}

/// The holding pod deleted or evicted mid-move and while waiting for a data-movement slot:
/// the data path stops, both uploads fail saying why, neither completes; the one that waited
/// never started moving.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_upload_whose_volume_is_no_longer_held_fails_and_never_completes() {
    // Moving lasts a minute unless its holder goes away first.
    let slow =
        Behaviour { chunks: 600, chunk_delay: Duration::from_millis(100), ..Behaviour::default() };
    let sim = Sim::new(Placement::Accepting, slow);
    let mut cluster = TestCluster::new(sim.clone(), |c| c.concurrency = 1);
    cluster.start_agents(&NODES[..1]).await;
    let (moving, waiting) = (unique("held-moving"), unique("held-waiting"));
    cluster.create_upload(&moving).await;
    wait_for(&cluster.uploads, &moving, "InProgress", |du| {
        du.phase() == DataUploadPhase::InProgress
    })
    .await;
    cluster.create_upload(&waiting).await;
    wait_for(&cluster.uploads, &waiting, "Prepared", |du| du.phase() == DataUploadPhase::Prepared)
        .await;
    sim.lose_holder(&waiting, "pod velero/x holding the volume is being deleted");
    let du = wait_for(&cluster.uploads, &waiting, "Failed", |du| {
        du.phase() == DataUploadPhase::Failed && released(du)
    })
    .await;
    let message = du.status.expect("status").message;
    assert!(
        message.contains("while it waited for a data-movement slot")
            && message.contains("holding the volume is being deleted")
            && message.contains("no data was moved"),
        "{message}"
    );
    assert_eq!(sim.count(|c| matches!(c, Call::MoveStart { cr, .. } if *cr == waiting)), 0);

    sim.lose_holder(&moving, "pod velero/y holding the volume was deleted");
    let du = wait_for(&cluster.uploads, &moving, "Failed", |du| {
        du.phase() == DataUploadPhase::Failed && released(du)
    })
    .await;
    let status = du.status.expect("status");
    assert!(
        status.message.contains("while the data moved") && status.message.contains("was deleted"),
        "{}",
        status.message
    );
    assert!(status.snapshot_id.is_empty(), "no snapshot recorded: {}", status.snapshot_id);
    assert_eq!(sim.count(|c| matches!(c, Call::MoveCanceled { cr, .. } if *cr == moving)), 1);
    assert_eq!(sim.count(|c| matches!(c, Call::MoveDone { cr, .. } if *cr == moving)), 0);
    cluster.shutdown().await;
}

/// The finalizer that holds a Completed DataUpload's snapshot is in the very version that
/// first says Completed: a deletion right after completion (Velero deletes the DataUploads of
/// a backup it deletes, possibly seconds after they completed) can never find the snapshot
/// unheld. It stays after the agent's own finalizer is released; the DataUpload then waits
/// for its holder when deleted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_completed_upload_is_held_from_the_write_that_completes_it() {
    const HOLD: &str = "test.ferry.io/snapshot";
    let sim = Sim::new(Placement::Accepting, Behaviour::default());
    let mut cluster =
        TestCluster::new(sim.clone(), |c| c.completed_upload_finalizer = Some(HOLD.to_owned()));
    cluster.start_agents(&NODES[..1]).await;
    let name = unique("held-at-completion");
    let history = History::record(&cluster.uploads, &name, |du| {
        (du.phase().to_string(), i64::from(du.finalizers().iter().any(|f| f == HOLD)))
    });
    cluster.create_upload(&name).await;
    let du = wait_for(&cluster.uploads, &name, "Completed and released", |du| {
        du.phase() == DataUploadPhase::Completed && released(du)
    })
    .await;
    assert!(du.finalizers().iter().any(|f| f == HOLD), "{:?}", du.finalizers());
    // The watch may lag behind the read above: wait (boundedly) until it saw Completed.
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    let versions = loop {
        let versions = history.values();
        if versions.iter().any(|(phase, _)| phase == "Completed") {
            break versions;
        }
        assert!(std::time::Instant::now() < deadline, "the watch saw no Completed: {versions:?}");
        tokio::time::sleep(Duration::from_millis(100)).await;
    };
    let completed: Vec<_> = versions.iter().filter(|(phase, _)| phase == "Completed").collect();
    assert!(
        completed.iter().all(|(_, held)| *held == 1),
        "Completed without the hold: {versions:?}"
    );
    assert!(
        versions.iter().filter(|(phase, _)| phase != "Completed").all(|(_, held)| *held == 0),
        "held before it recorded a snapshot: {versions:?}"
    );

    cluster.uploads.delete(&name, &Default::default()).await.expect("delete");
    let deleting = cluster.uploads.get(&name).await.expect("still there while held");
    assert!(deleting.metadata.deletion_timestamp.is_some());
    let mut unheld = deleting.clone();
    unheld.metadata.finalizers = Some(Vec::new());
    cluster.uploads.replace(&name, &Default::default(), &unheld).await.expect("release");
    cluster.shutdown().await;
}

/// A backup that succeeded with something for the user to act on (the mover opened the
/// repository only with Velero's password, say) completes and carries each warning as a
/// Warning Event on the DataUpload.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn warnings_of_a_successful_backup_become_warning_events() {
    let sim = Sim::new(Placement::Accepting, Behaviour::default());
    let mut cluster = TestCluster::new(sim.clone(), |_| {});
    cluster.start_agents(&NODES[..1]).await;
    let name = unique("warned");
    let warning = "repository s3://b/p opened only with Velero's published default password";
    sim.set(&name, Behaviour { warnings: vec![warning.to_owned()], ..Behaviour::default() });
    cluster.create_upload(&name).await;
    wait_for(&cluster.uploads, &name, "Completed", |du| du.phase() == DataUploadPhase::Completed)
        .await;
    let deadline = std::time::Instant::now() + Duration::from_secs(30);
    loop {
        let events = cluster.events(&name).await;
        if events.iter().any(|(reason, note)| reason == "RepositoryWarning" && note == warning) {
            break;
        }
        assert!(std::time::Instant::now() < deadline, "no warning event: {events:?}");
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    cluster.shutdown().await;
}
