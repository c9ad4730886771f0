//! What only the three-node tests need besides the shared node support.

use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use ferry_api::{VolumeSnapshot, VolumeSnapshotContent};
use ferry_testbed::VELERO_NAMESPACE;
use ferry_testbed::realnode::RealCluster;
use kube::api::Api;
use kube::{Client, ResourceExt};

use crate::node::TestResult;

/// The node the PV bound to PVC `ns/pvc` lives on (its required node affinity's one value).
pub async fn volume_node(
    client: &Client,
    ns: &str,
    pvc: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    use ferry_api::k8s_openapi::api::core::v1::PersistentVolume;
    let claim = Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns).get(pvc).await?;
    let volume = claim.spec.and_then(|s| s.volume_name).ok_or("the PVC is not bound")?;
    let pv = Api::<PersistentVolume>::all(client.clone()).get(&volume).await?;
    let affinity = serde_json::to_value(pv.spec.and_then(|s| s.node_affinity))?;
    affinity["required"]["nodeSelectorTerms"][0]["matchExpressions"][0]["values"][0]
        .as_str()
        .map(str::to_owned)
        .ok_or_else(|| format!("PV {volume} names no node: {affinity}").into())
}

/// Waits until Velero's namespace holds no pod, PVC or VolumeSnapshot of the CRs `names` (the
/// exposers name them after their CR); fails naming what stays.
///
/// In two stages. Ferry's part, within three minutes: every pod and PVC gone, every snapshot
/// gone or being deleted (thirty uploads' cleanups take well over a minute on a busy two-core
/// machine, seen with other test binaries running beside this one). Then the controllers'
/// part, within five and a half minutes more: each deletion passes through the
/// snapshot-controller, the external-snapshotter and the driver in turn, and both controllers
/// retry a failed step after a wait that doubles from one second up to five minutes (their
/// `--retry-interval-start` and `--retry-interval-max` defaults), so seven failures in a row
/// under load put the next try two minutes on. Every snapshot and content of the CRs must be
/// gone; one still there is reported with its finalizers, its content's state and what the
/// controllers logged of it.
pub async fn nothing_exposed_for<'a>(
    client: &Client,
    cluster: &RealCluster,
    names: impl Iterator<Item = &'a str>,
) -> TestResult {
    let names: Vec<String> = names.map(ferry_api::naming::valid_label_value).collect();
    let ours = |name: &str| names.iter().any(|n| n == name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let contents: Api<VolumeSnapshotContent> = Api::all(client.clone());
    let start = Instant::now();
    let (ferry_part, controllers_part) = (Duration::from_secs(180), Duration::from_secs(330));
    let mut ferry_done: Option<Instant> = None;
    loop {
        let mut left = Vec::new();
        for p in pods.list(&Default::default()).await?.items.iter().filter(|p| ours(&p.name_any()))
        {
            left.push(format!("pod {}", p.name_any()));
        }
        for p in pvcs.list(&Default::default()).await?.items.iter().filter(|p| ours(&p.name_any()))
        {
            left.push(format!("pvc {}", p.name_any()));
        }
        let mut snapshots_left = Vec::new();
        for s in snapshots.list(&Default::default()).await?.items {
            if !ours(&s.name_any()) {
                continue;
            }
            if s.metadata.deletion_timestamp.is_none() {
                left.push(format!("volumesnapshot {} (not being deleted)", s.name_any()));
            }
            snapshots_left.push(s);
        }
        // The backup contents are named after their CRs too.
        let mut contents_left = Vec::new();
        for c in contents.list(&Default::default()).await?.items {
            if !ours(&c.name_any()) {
                continue;
            }
            if c.metadata.deletion_timestamp.is_none() {
                left.push(format!("volumesnapshotcontent {} (not being deleted)", c.name_any()));
            }
            contents_left.push(c.name_any());
        }
        if left.is_empty() && snapshots_left.is_empty() && contents_left.is_empty() {
            return Ok(());
        }
        if !left.is_empty() {
            if start.elapsed() > ferry_part {
                return Err(format!("left behind in {VELERO_NAMESPACE}: {left:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
            continue;
        }
        let since = *ferry_done.get_or_insert_with(Instant::now);
        if since.elapsed() > controllers_part {
            let waited = start.elapsed();
            let mut report = String::new();
            for s in &snapshots_left {
                report.push_str(&snapshot_state(client, cluster, s).await);
            }
            return Err(format!(
                "VolumeSnapshots or contents still being deleted after {}s (contents left: \
                 {contents_left:?}):\n{report}",
                waited.as_secs()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// What holds the VolumeSnapshot `s` back: its finalizers, its content's deletion policy,
/// finalizers and annotations, and the controllers' log lines naming either.
async fn snapshot_state(client: &Client, cluster: &RealCluster, s: &VolumeSnapshot) -> String {
    let name = s.name_any();
    let content_name =
        s.status.as_ref().and_then(|st| st.bound_volume_snapshot_content_name.clone());
    let mut out = format!("- {name}: finalizers {:?}, content {content_name:?}\n", s.finalizers());
    if let Some(c) = &content_name {
        let contents: Api<VolumeSnapshotContent> = Api::all(client.clone());
        match contents.get_opt(c).await {
            Ok(Some(c)) => out.push_str(&format!(
                "  content: deletionPolicy {}, deleting {}, finalizers {:?}, annotations {:?}\n",
                c.spec.deletion_policy,
                c.metadata.deletion_timestamp.is_some(),
                c.finalizers(),
                c.annotations()
            )),
            Ok(None) => out.push_str("  content: gone\n"),
            Err(e) => out.push_str(&format!("  content: not read: {e}\n")),
        }
    }
    let mut logs = vec![cluster.dir().join("logs")];
    logs.extend(cluster.nodes().iter().map(|n| n.dir().join("logs")));
    for dir in logs {
        for file in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(file.path()).unwrap_or_default();
            let lines: Vec<&str> = text
                .lines()
                .filter(|l| {
                    l.contains(&name) || content_name.as_deref().is_some_and(|c| l.contains(c))
                })
                .collect();
            for l in &lines[lines.len().saturating_sub(15)..] {
                out.push_str(&format!("  {}: {l}\n", file.file_name().to_string_lossy()));
            }
        }
    }
    out
}

/// The last lines of every agent container's log on every node (read from the nodes' folders,
/// so a powered-off node's too), for failure messages.
pub fn agent_logs(cluster: &ferry_testbed::realnode::RealCluster) -> String {
    let mut out = String::new();
    for node in cluster.nodes() {
        let pods = node.dir().join("var-log/pods");
        let dirs = std::fs::read_dir(&pods).into_iter().flatten().flatten();
        for dir in dirs.filter(|d| d.file_name().to_string_lossy().contains("ferry-agent")) {
            for log in std::fs::read_dir(dir.path().join("agent")).into_iter().flatten().flatten() {
                let text = std::fs::read_to_string(log.path()).unwrap_or_default();
                let lines: Vec<&str> = text.lines().rev().take(40).collect();
                out.push_str(&format!("--- {} {}\n", node.name(), log.path().display()));
                for l in lines.into_iter().rev() {
                    out.push_str(l);
                    out.push('\n');
                }
            }
        }
    }
    out
}

/// When the agents' first `reason` Event on the CR `name` was recorded (its `eventTime`, to
/// the microsecond), waiting (up to 30 s) for it: the Event follows the status write.
pub async fn event_time(
    client: &Client,
    name: &str,
    reason: &str,
) -> Result<ferry_api::k8s_openapi::jiff::Timestamp, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let first = crate::node::agent_event_list(client, name)
            .await?
            .into_iter()
            .filter(|e| e.reason.as_deref() == Some(reason))
            .filter_map(|e| e.event_time.map(|t| t.0))
            .min();
        if let Some(at) = first {
            return Ok(at);
        }
        if Instant::now() > deadline {
            return Err(format!("no {reason} Event on {name} within 30 s").into());
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}
