//! Thirty DataUploads created at once across three agents: every one Completed, each
//! processed exactly once (one acceptance, one start, one completion, one repository
//! snapshot), no node moving more than its `--concurrency` at a time, and nothing of Ferry's
//! left behind.

use std::collections::{BTreeMap, BTreeSet};

use ferry_api::k8s_openapi::jiff::Timestamp;
use ferry_api::{DataUpload, DataUploadPhase, VolumeSnapshot};
use ferry_sim::{Binding, FsTree, VolumeMode};
use ferry_testbed::VELERO_NAMESPACE;
use kube::ResourceExt;
use kube::api::Api;

use crate::harness::{TestResult, WAIT, World, du_phase, du_terminal};
use crate::spans::max_overlap;

const UPLOADS: usize = 30;
/// The agents' `--concurrency` (see the harness).
const CONCURRENCY: usize = 2;

/// The agent's Events on DataUpload `name` by reason, waiting (bounded) for its Completed one.
async fn events_by_reason(
    world: &World,
    name: &str,
) -> Result<BTreeMap<String, i32>, Box<dyn std::error::Error>> {
    let start = std::time::Instant::now();
    loop {
        let mut by_reason = BTreeMap::new();
        for (reason, _, count) in world.ferry_events(name).await? {
            *by_reason.entry(reason).or_insert(0) += count;
        }
        if by_reason.contains_key("Completed") || start.elapsed() > WAIT {
            return Ok(by_reason);
        }
        tokio::time::sleep(std::time::Duration::from_millis(250)).await;
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn thirty_data_uploads_at_once_each_complete_exactly_once() -> TestResult {
    let world = World::start("e2e-many").await?;
    let sim = world.sim();
    let names: Vec<String> = (0..UPLOADS).map(|i| format!("vol-{i:02}")).collect();
    for pvc in &names {
        sim.create_pvc(&world.ns, pvc, "16Mi", VolumeMode::Filesystem, Binding::Immediate).await?;
    }
    for (seed, pvc) in (100_u64..).zip(&names) {
        sim.write_files(&world.ns, pvc, &FsTree::sample(seed)).await?;
        sim.snapshot_pvc(&world.ns, pvc, &format!("{pvc}-snap")).await?;
    }
    for pvc in &names {
        sim.wait_snapshot_ready(&world.ns, &format!("{pvc}-snap"), WAIT).await?;
    }
    // All thirty at once, as one Velero backup of thirty volumes creates them.
    let mut uploads = Vec::new();
    for pvc in &names {
        let du = world.create_data_upload("many", pvc, &format!("{pvc}-snap")).await?;
        uploads.push(du.name_any());
    }
    let mut done = Vec::new();
    for name in &uploads {
        let du: DataUpload = world.wait_for(name, "terminal", du_terminal).await?;
        assert_eq!(
            du_phase(&du),
            Some(DataUploadPhase::Completed),
            "{name}: {:#?}\n{}",
            du.status,
            world.agent_logs()
        );
        done.push(du);
    }

    // Exactly once: one acceptance, one start, one completion per DataUpload, no takeover,
    // resume or failure.
    let nodes = sim.nodes();
    for du in &done {
        let name = du.name_any();
        let status = du.status.clone().unwrap_or_default();
        assert!(nodes.contains(&status.accepted_by_node), "{name}: {status:#?}");
        assert!(nodes.contains(&status.node), "{name}: {status:#?}");
        let events = events_by_reason(&world, &name).await?;
        for reason in ["Accepted", "Prepared", "InProgress", "Completed"] {
            assert_eq!(events.get(reason), Some(&1), "{name}: {reason} events: {events:?}");
        }
        for reason in ["TakenOver", "Resumed", "Failed", "Canceled", "CleanupFailed"] {
            assert!(!events.contains_key(reason), "{name}: events {events:?}");
        }
    }
    // One repository snapshot per DataUpload: the one its status names.
    let snapshots = world.repo_snapshots().await?;
    let mut by_upload: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in &snapshots {
        let upload = s["tags"]["ferry.io/data-upload"].as_str().unwrap_or_default();
        let id = s["id"].as_str().unwrap_or_default();
        by_upload.entry(upload.to_owned()).or_default().push(id.to_owned());
    }
    assert_eq!(snapshots.len(), UPLOADS, "repository snapshots: {by_upload:#?}");
    for du in &done {
        let id = du.status.clone().unwrap_or_default().snapshot_id;
        assert_eq!(by_upload.get(&du.name_any()), Some(&vec![id]), "{by_upload:#?}");
    }

    // No node moved more than its concurrency at once; the work was spread over nodes.
    let mut spans: BTreeMap<String, Vec<(Timestamp, Timestamp)>> = BTreeMap::new();
    for du in &done {
        let status = du.status.clone().unwrap_or_default();
        let start = status.start_timestamp.clone().ok_or("no startTimestamp")?.0;
        let end = status.completion_timestamp.clone().ok_or("no completionTimestamp")?.0;
        assert!(start <= end, "{}: {status:#?}", du.name_any());
        spans.entry(status.node).or_default().push((start, end));
    }
    for (node, node_spans) in &spans {
        let most = max_overlap(node_spans);
        eprintln!("node {node}: {} uploads, at most {most} at once", node_spans.len());
        assert!(most <= CONCURRENCY, "node {node} moved {most} at once: {node_spans:?}");
    }
    assert!(spans.len() >= 2, "all uploads moved on one node: {spans:?}");

    // Nothing left: no pod, PVC, VolumeSnapshot or content of Ferry's, no finalizer of the
    // data movement or expose label on the CRs, and the source snapshots were taken over.
    let api: Api<DataUpload> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    for name in &uploads {
        let left = world.leftovers_of(name).await?;
        assert!(left.is_empty(), "{name}: left behind {left:?}");
        let du = api.get(name).await?;
        // Only the finalizer that holds a Completed DataUpload until its backup is deleted.
        assert!(
            du.finalizers().iter().all(|f| f == ferry_mover::upload_finalizer::FINALIZER),
            "{name}: finalizers {:?}",
            du.finalizers()
        );
        assert!(
            !du.labels().contains_key(ferry_api::keys::EXPOSE_ON_GOING_LABEL),
            "{name}: labels {:?}",
            du.labels()
        );
    }
    let ours: BTreeSet<&String> = uploads.iter().collect();
    let created_by = ferry_expose::labels::CREATED_BY;
    let params = kube::api::ListParams::default().labels(&format!("{created_by}=ferry"));
    let pods: Api<ferry_api::k8s_openapi::api::core::v1::Pod> =
        Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    let stray: Vec<String> = pods
        .list(&params)
        .await?
        .items
        .iter()
        .map(ResourceExt::name_any)
        .filter(|n| ours.contains(n))
        .collect();
    assert!(stray.is_empty(), "labelled pods left: {stray:?}");
    let sources: Api<VolumeSnapshot> = Api::namespaced(world.client.clone(), &world.ns);
    let kept: Vec<String> =
        sources.list(&Default::default()).await?.iter().map(|s| s.name_any()).collect();
    assert!(kept.is_empty(), "source snapshots kept: {kept:?}");
    world.shutdown().await
}
