//! Thirty DataUploads created at once, their volumes spread over the three nodes: every one
//! Completed, each taken by exactly one agent (the object lock among agents on different
//! nodes), each moved on the node that holds its volume, no node moving more than its
//! concurrency at a time, the repository holding one snapshot per upload, nothing of Ferry's
//! left behind.

use std::collections::BTreeMap;

use ferry_api::k8s_openapi::jiff::Timestamp;
use ferry_api::{DataUpload, DataUploadPhase};
use ferry_testbed::VELERO_NAMESPACE;
use ferry_testbed::realnode::{self, WAIT_STORAGE_CLASS};
use kube::api::Api;
use kube::{Client, ResourceExt};

use crate::node::{self, TestResult};
use crate::spans::max_overlap;
use crate::support;

const UPLOADS: usize = 30;
/// The chart's node-agent ConfigMap: `loadConcurrency.globalConfig`.
const CONCURRENCY: usize = 1;

/// PVC `name` on node `on`, written by a pod there (a few files seeded by the name), and a
/// ready snapshot of it.
async fn volume_on(
    client: &Client,
    ns: &str,
    name: &str,
    on: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    node::create_pvc_of_class(client, ns, name, "16Mi", "Filesystem", WAIT_STORAGE_CLASS).await?;
    let script = format!(
        "set -e; cd /data; echo {name} > name; for i in 1 2 3; do \
         dd if=/dev/urandom of=f$i bs=64k count=$i 2>/dev/null; done; sync"
    );
    node::run_pod_on(client, ns, name, false, &script, Some(on)).await?;
    let found = crate::support::volume_node(client, ns, name).await?;
    if found != on {
        return Err(format!("PVC {name} was provisioned on {found}, not {on}").into());
    }
    node::snapshot(client, ns, name).await
}

pub async fn thirty_uploads_each_move_once_where_their_data_is(setup: &node::Node) -> TestResult {
    let client = setup.client()?;
    let ns = setup.namespace("spread").await?;
    // Volumes round-robin over the nodes, written and snapshotted in parallel.
    let mut tasks = tokio::task::JoinSet::new();
    for i in 0..UPLOADS {
        let (client, ns) = (client.clone(), ns.clone());
        tasks.spawn(async move {
            let name = format!("vol-{i:02}");
            let on = realnode::node_name(i % crate::NODES);
            let snapshot = volume_on(&client, &ns, &name, &on).await.map_err(|e| e.to_string())?;
            Ok::<_, String>((name, on, snapshot))
        });
    }
    let mut volumes = Vec::new();
    while let Some(done) = tasks.join_next().await {
        volumes.push(done??);
    }
    volumes.sort();

    // All thirty at once, as one Velero backup of thirty volumes creates them.
    let mut uploads = Vec::new();
    for (pvc, on, snapshot) in &volumes {
        let du = node::data_upload(&client, &ns, pvc, snapshot, "spread").await?;
        uploads.push((du.name_any(), on.clone()));
    }
    let mut done = Vec::new();
    for (name, on) in &uploads {
        let du = node::wait_upload(&client, name).await?;
        done.push((du, on.clone()));
    }

    let mut spans: BTreeMap<String, Vec<(Timestamp, Timestamp)>> = BTreeMap::new();
    let mut accepted_by: BTreeMap<String, usize> = BTreeMap::new();
    for (du, on) in &done {
        let name = du.name_any();
        let status = du.status.clone().unwrap_or_default();
        assert_eq!(status.phase, Some(DataUploadPhase::Completed), "{name}: {status:#?}");
        // Moved where the volume (and so its snapshot) lives, whoever took it.
        assert_eq!(&status.node, on, "{name} moved on another node than its data's: {status:#?}");
        *accepted_by.entry(status.accepted_by_node.clone()).or_default() += 1;
        // The Completed Event follows the CR written Completed.
        let events = node::agent_events_after(&client, &name, "Completed").await?;
        for reason in ["Accepted", "Prepared", "InProgress", "Completed"] {
            assert_eq!(events.get(reason), Some(&1), "{name}: {reason} events: {events:?}");
        }
        for reason in ["TakenOver", "Resumed", "Failed", "Canceled", "CleanupFailed"] {
            assert!(!events.contains_key(reason), "{name}: events {events:?}");
        }
        // The status's timestamps are whole seconds, and these transfers take less: the
        // Events' times (microseconds) bound each movement, from the slot taken (InProgress)
        // to the CR written Completed, the slot released only after.
        let start = support::event_time(&client, &name, "InProgress").await?;
        let end = support::event_time(&client, &name, "Completed").await?;
        assert!(start < end, "{name}: InProgress at {start}, Completed at {end}");
        spans.entry(status.node.clone()).or_default().push((start, end));
    }
    eprintln!("accepted by: {accepted_by:?}");
    assert_eq!(spans.len(), crate::NODES, "every node moved its volumes: {spans:?}");
    for (node, node_spans) in &spans {
        let most = max_overlap(node_spans);
        eprintln!("node {node}: {} uploads, at most {most} at once", node_spans.len());
        assert_eq!(node_spans.len(), UPLOADS / crate::NODES, "{node}: {node_spans:?}");
        assert!(most <= CONCURRENCY, "node {node} moved {most} at once: {node_spans:?}");
    }

    // One repository snapshot per DataUpload: the one its status names.
    let listed: serde_json::Value =
        serde_json::from_str(&setup.ferry(&ns, &["snapshots", "--json"]).await?)?;
    let listed = listed.as_array().cloned().unwrap_or_default();
    assert_eq!(listed.len(), UPLOADS, "repository snapshots: {listed:#?}");
    for (du, _) in &done {
        let id = du.status.clone().unwrap_or_default().snapshot_id;
        assert!(listed.iter().any(|s| s["id"] == id.as_str()), "{id} not in the repository");
    }

    // Nothing of Ferry's left in Velero's namespace: holding pods, backup PVCs and snapshots
    // go with each upload's cleanup; no expose label stays on a CR.
    let api: Api<DataUpload> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    for (name, _) in &uploads {
        let du = api.get(name).await?;
        assert!(
            !du.labels().contains_key(ferry_api::keys::EXPOSE_ON_GOING_LABEL),
            "{name}: labels {:?}",
            du.labels()
        );
    }
    crate::support::nothing_exposed_for(
        &client,
        setup.cluster,
        uploads.iter().map(|(n, _)| n.as_str()),
    )
    .await
}
