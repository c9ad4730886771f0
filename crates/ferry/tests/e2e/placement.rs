//! Velero's node-agent ConfigMap shaping the holding pods through real `ferry agent --config-map`
//! processes: `loadAffinity` puts the backup and the restore on the one node it selects, and
//! `podLabels`, `podAnnotations` and `podResources` reach the pods; a ConfigMap the API server
//! would refuse stops the agent at start with the reason.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::{ConfigMap, Pod};
use ferry_api::k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use ferry_api::{DataDownload, DataDownloadPhase, DataUpload, DataUploadPhase};
use ferry_sim::FsTree;
use ferry_testbed::{ControlPlane, VELERO_NAMESPACE};
use kube::ResourceExt;
use kube::api::{Api, PostParams};
use serde_json::json;

use crate::harness::{
    Setup, TestResult, WAIT, World, dd_phase, dd_terminal, du_phase, du_terminal,
};

/// Polls for the holding pod `name` until it exists or the CR it serves has ended.
async fn holding_pod<F>(world: &World, name: &str, ended: F) -> Result<Option<Pod>, kube::Error>
where
    F: AsyncFn() -> Result<bool, kube::Error>,
{
    let pods: Api<Pod> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    let deadline = Instant::now() + WAIT;
    while Instant::now() < deadline {
        if let Some(pod) = pods.get_opt(name).await? {
            return Ok(Some(pod));
        }
        if ended().await? {
            return Ok(None);
        }
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
    Ok(None)
}

fn assert_shaped(pod: &Pod, movers: &str) {
    let labels = pod.labels();
    assert_eq!(labels.get("team").map(String::as_str), Some("storage"), "{labels:?}");
    let annotations = pod.annotations();
    assert_eq!(annotations.get("example.com/owner").map(String::as_str), Some("ferry-e2e"));
    let spec = pod.spec.clone().unwrap_or_default();
    let container = &spec.containers[0];
    let resources = container.resources.clone().unwrap_or_default();
    let requests = resources.requests.unwrap_or_default();
    let limits = resources.limits.unwrap_or_default();
    assert_eq!(requests.get("cpu"), Some(&Quantity("20m".into())), "{requests:?}");
    assert_eq!(requests.get("memory"), Some(&Quantity("32Mi".into())));
    assert_eq!(limits.get("memory"), Some(&Quantity("128Mi".into())), "{limits:?}");
    assert_eq!(limits.get("cpu"), None, "a zero limit sets none");
    let affinity = serde_json::to_string(&spec.affinity).unwrap_or_default();
    assert!(affinity.contains("\"pool\"") && affinity.contains(movers), "{affinity}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn load_affinity_and_pod_settings_from_the_config_map_shape_backup_and_restore() -> TestResult
{
    let pool = |value: &str| BTreeMap::from([("pool".to_owned(), value.to_owned())]);
    let world = World::start_with(
        "e2e-placement",
        Setup {
            node_labels: vec![pool("general"), pool("movers"), BTreeMap::new()],
            node_agent_config: Some(json!({
                "loadAffinity": [{ "nodeSelector": { "matchLabels": { "pool": "movers" } } }],
                "podLabels": { "team": "storage" },
                "podAnnotations": { "example.com/owner": "ferry-e2e" },
                "podResources": { "cpuRequest": "20m", "cpuLimit": "0",
                                  "memoryRequest": "32Mi", "memoryLimit": "128Mi" },
            })),
            ..Setup::default()
        },
    )
    .await?;
    let movers = world.sim().nodes()[1].clone();
    let tree = FsTree::sample(19);
    let vs = world.volume_with_snapshot("data", "32Mi", &tree).await?;
    let du = world.create_data_upload("placed", "data", &vs.name_any()).await?;
    let name = du.name_any();
    let uploads: Api<DataUpload> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    let ended = async || Ok(uploads.get(&name).await.is_ok_and(|d| du_terminal(&d)));
    let pod = holding_pod(&world, &name, ended).await?;
    let pod = pod.ok_or("the backup's holding pod was never seen")?;
    assert_shaped(&pod, "movers");

    let du: DataUpload = world.wait_for(&name, "terminal", du_terminal).await?;
    let status = du.status.clone().unwrap_or_default();
    assert_eq!(du_phase(&du), Some(DataUploadPhase::Completed), "{status:#?}");
    assert_eq!(status.node, movers, "the backup ran on the node loadAffinity selects");

    let dd = world.create_data_download("placed-back", &world.ns, "restored", "32Mi", &du).await?;
    let dd_name = dd.name_any();
    let downloads: Api<DataDownload> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    let ended = async || Ok(downloads.get(&dd_name).await.is_ok_and(|d| dd_terminal(&d)));
    let pod = holding_pod(&world, &dd_name, ended).await?;
    let pod = pod.ok_or("the restore's holding pod was never seen")?;
    assert_shaped(&pod, "movers");
    let dd: DataDownload = world.wait_for(&dd_name, "terminal", dd_terminal).await?;
    let status = dd.status.clone().unwrap_or_default();
    assert_eq!(dd_phase(&dd), Some(DataDownloadPhase::Completed), "{status:#?}");
    assert_eq!(status.node, movers, "the restore ran on the node loadAffinity selects");
    assert_eq!(world.sim().read_files(&world.ns, "restored").await?, tree);
    world.shutdown().await
}

#[tokio::test]
async fn a_config_map_the_api_server_would_refuse_stops_the_agent_with_the_reason() -> TestResult {
    let cp = ControlPlane::shared();
    let client = cp.client()?;
    let name = format!("bad-node-agent-{}", std::process::id());
    let maps: Api<ConfigMap> = Api::namespaced(client, VELERO_NAMESPACE);
    let map: ConfigMap = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": VELERO_NAMESPACE },
        "data": { "node-agent-config": json!({
            "podResources": { "cpuRequest": "2", "cpuLimit": "1",
                              "memoryRequest": "0", "memoryLimit": "0" },
        }).to_string() },
    }))?;
    maps.create(&PostParams::default(), &map).await?;
    let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
        .args(["agent", "--node-name", "nowhere", "--namespace", VELERO_NAMESPACE])
        .args(["--config-map", &name, "--metrics-address", "127.0.0.1:0"])
        .env("KUBECONFIG", cp.kubeconfig())
        .stdin(Stdio::null())
        .output()?;
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success(), "{stderr}");
    assert!(
        stderr.contains(&format!("ConfigMap {VELERO_NAMESPACE}/{name}"))
            && stderr.contains("cpu request \"2\" is above its limit \"1\""),
        "{stderr}"
    );
    Ok(())
}
