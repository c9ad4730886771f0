//! A node lost while it holds a DataUpload: the node's agent accepted the upload and is
//! exposing it (its holding pod waits for the data's node) when the node loses power, every
//! process of it at once. The node-lifecycle controller marks the node NotReady; an agent on a
//! live node sees the lost node's liveness lease expire, takes the upload over, finishes the
//! exposure on the data's node and completes it; the data restores identical.

use std::time::{Duration, Instant};

use ferry_api::DataUpload;
use ferry_api::k8s_openapi::api::apps::v1::DaemonSet;
use ferry_api::k8s_openapi::api::core::v1::{Node, Pod};
use ferry_testbed::VELERO_NAMESPACE;
use ferry_testbed::realnode::{self, WAIT_STORAGE_CLASS};
use kube::api::{Api, ListParams, Patch, PatchParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::node::{self, TestResult, WAIT};

const AGENT: &str = "ferry-agent";
const AGENT_LABELS: &str = "app.kubernetes.io/name=ferry,app.kubernetes.io/component=agent";

const WRITE: &str = "set -e; cd /data; mkdir -p d
for i in $(seq 1 12); do dd if=/dev/urandom of=d/f$i bs=16k count=$i 2>/dev/null; done; sync";
const MANIFEST: &str = "cd /data && find d -type f | sort | xargs md5sum > /dev/termination-log";

/// Polls `check` every half second until it returns `Some`, for at most [`WAIT`].
async fn until<T, F, Fut>(what: &str, mut check: F) -> Result<T, Box<dyn std::error::Error>>
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Result<Option<T>, Box<dyn std::error::Error>>>,
{
    let deadline = Instant::now() + WAIT;
    loop {
        if let Some(found) = check().await? {
            return Ok(found);
        }
        if Instant::now() > deadline {
            return Err(format!("{what}: not within {WAIT:?}").into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The nodes with a Ready agent pod that is not being deleted.
async fn agents_ready_on(client: &Client) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let mut nodes: Vec<String> = pods
        .list(&ListParams::default().labels(AGENT_LABELS))
        .await?
        .items
        .into_iter()
        .filter(|p| p.metadata.deletion_timestamp.is_none())
        .filter(|p| {
            p.status
                .as_ref()
                .and_then(|s| s.conditions.as_ref())
                .is_some_and(|cs| cs.iter().any(|c| c.type_ == "Ready" && c.status == "True"))
        })
        .filter_map(|p| p.spec.and_then(|s| s.node_name))
        .collect();
    nodes.sort();
    Ok(nodes)
}

/// Every agent pod (running or not) and its node, for messages.
async fn agent_pods(client: &Client) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    Ok(pods
        .list(&ListParams::default().labels(AGENT_LABELS))
        .await?
        .items
        .iter()
        .map(|p| {
            format!("{} on {:?}", p.name_any(), p.spec.as_ref().and_then(|s| s.node_name.clone()))
        })
        .collect())
}

/// Runs the agents only on `nodes` (`None`: everywhere, as installed), as an operator would
/// with the DaemonSet's node affinity, and waits until exactly those nodes run a Ready agent.
async fn agents_only_on(client: &Client, nodes: Option<&[&str]>) -> TestResult {
    let affinity = nodes.map(|names| {
        json!({ "nodeAffinity": { "requiredDuringSchedulingIgnoredDuringExecution": {
            "nodeSelectorTerms": [{ "matchFields": [
                { "key": "metadata.name", "operator": "In", "values": names },
            ] }],
        } } })
    });
    let api: Api<DaemonSet> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    api.patch(
        AGENT,
        &PatchParams::default(),
        &Patch::Merge(json!({ "spec": { "template": { "spec": { "affinity": affinity } } } })),
    )
    .await?;
    Ok(())
}

async fn cordon(client: &Client, node: &str, unschedulable: bool) -> TestResult {
    Api::<Node>::all(client.clone())
        .patch(
            node,
            &PatchParams::default(),
            &Patch::Merge(json!({ "spec": { "unschedulable": unschedulable } })),
        )
        .await?;
    Ok(())
}

pub async fn a_lost_node_s_upload_is_taken_over(setup: &node::Node) -> TestResult {
    let client = setup.client()?;
    let ns = setup.namespace("lost").await?;
    let (data_node, lost) = (realnode::node_name(0), realnode::node_name(2));
    node::create_pvc_of_class(&client, &ns, "data", "64Mi", "Filesystem", WAIT_STORAGE_CLASS)
        .await?;
    let written = node::run_pod_on(
        &client,
        &ns,
        "data",
        false,
        &format!("{WRITE}\n{MANIFEST}"),
        Some(&data_node),
    )
    .await?;
    assert_eq!(crate::support::volume_node(&client, &ns, "data").await?, data_node);
    assert!(written.lines().count() == 12, "the writer's manifest: {written}");

    // Only the doomed node runs an agent, so it takes the upload; the data's node is cordoned
    // so that the holding pod (which must run where the snapshot is) waits, unschedulable,
    // with the upload Accepted on the doomed node.
    agents_only_on(&client, Some(&[&lost])).await?;
    until("an agent on the doomed node only", || async {
        let ready = agents_ready_on(&client).await?;
        let all = agent_pods(&client).await?;
        Ok((ready == [lost.clone()] && all.len() == 1).then_some(()))
    })
    .await?;
    cordon(&client, &data_node, true).await?;
    let snapshot = node::snapshot(&client, &ns, "data").await?;
    let du = node::data_upload(&client, &ns, "data", &snapshot, "lost").await?;
    let name = du.name_any();
    let uploads: Api<DataUpload> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    until("the upload Accepted by the doomed node, its holding pod waiting", || async {
        let du = uploads.get(&name).await?;
        let status = du.status.unwrap_or_default();
        let holder = pods.get_opt(&name).await?;
        let pending = holder
            .as_ref()
            .is_some_and(|p| p.spec.as_ref().and_then(|s| s.node_name.as_deref()).is_none());
        Ok((status.accepted_by_node == lost && pending).then_some(()))
    })
    .await?;

    // Power cut: the kubelet, containerd, the CSI driver and every pod of the node die at once.
    setup.cluster.power_off(2);
    until("the node-lifecycle controller marking the lost node NotReady", || async {
        let node = Api::<Node>::all(client.clone()).get(&lost).await?;
        let ready = node
            .status
            .and_then(|s| s.conditions)
            .unwrap_or_default()
            .into_iter()
            .find(|c| c.type_ == "Ready")
            .map(|c| c.status);
        Ok((ready.as_deref() != Some("True")).then_some(()))
    })
    .await?;
    // The operator brings the other nodes back into service.
    cordon(&client, &data_node, false).await?;
    agents_only_on(&client, None).await?;

    let du = node::wait_upload(&client, &name).await?;
    let status = du.status.clone().unwrap_or_default();
    assert_eq!(status.node, data_node, "moved where the data is: {status:#?}");
    assert_ne!(status.accepted_by_node, lost, "taken over by a live node: {status:#?}");
    assert_eq!(
        du.annotations().get("ferry.io/lost-nodes").map(String::as_str),
        Some(lost.as_str()),
        "the lost node recorded: {:?}",
        du.annotations()
    );
    let events = node::agent_events_after(&client, &name, "TakenOver").await?;
    assert!(events.contains_key("TakenOver"), "a TakenOver event: {events:?}");

    // The data restores identical (into a volume on a live node).
    let target_ns = setup.namespace("lost-restored").await?;
    let dd =
        node::data_download(&client, &target_ns, "data", "64Mi", "Filesystem", &du, "lost-restore")
            .await?;
    node::wait_download(&client, &dd.name_any()).await?;
    let restored = node::run_pod(&client, &target_ns, "data", false, MANIFEST).await?;
    assert_eq!(restored, written, "the restored tree differs from the written one");
    Ok(())
}
