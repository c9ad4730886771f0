//! What only the three-node tests need besides the shared node support.

use std::time::{Duration, Instant};

use ferry_api::VolumeSnapshot;
use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use ferry_testbed::VELERO_NAMESPACE;
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
/// exposers name them after their CR); fails naming what stays. Up to three minutes: each
/// snapshot's deletion passes through the snapshot controller, the external-snapshotter and the
/// driver in turn, and thirty of them take well over a minute on a busy two-core machine (seen
/// with other test binaries running beside this one).
pub async fn nothing_exposed_for<'a>(
    client: &Client,
    names: impl Iterator<Item = &'a str>,
) -> TestResult {
    let names: Vec<String> = names.map(ferry_api::naming::valid_label_value).collect();
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let deadline = Instant::now() + Duration::from_secs(180);
    loop {
        let mut left = Vec::new();
        for p in pods.list(&Default::default()).await?.items {
            left.push(format!("pod {}", p.name_any()));
        }
        for p in pvcs.list(&Default::default()).await?.items {
            left.push(format!("pvc {}", p.name_any()));
        }
        for s in snapshots.list(&Default::default()).await?.items {
            left.push(format!("volumesnapshot {}", s.name_any()));
        }
        left.retain(|l| names.iter().any(|n| l.ends_with(&format!(" {n}"))));
        if left.is_empty() {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!("left behind in {VELERO_NAMESPACE}: {left:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
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
