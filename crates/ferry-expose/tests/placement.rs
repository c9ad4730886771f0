//! The node-agent ConfigMap's `loadAffinity`, `podResources`, `podLabels` and `podAnnotations`
//! on real holding pods, and the tolerations they get from the agent's: a real API server, the
//! node simulator's scheduler and volumes.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_agent::{ExposeParams, Exposer};
use ferry_api::k8s_openapi::api::core::v1::Pod;
use ferry_api::node_agent_config::parse;
use ferry_api::{DataDownload, DataUpload};
use ferry_expose::{CsiBackupExposer, CsiRestoreExposer, ExposerConfig};
use ferry_sim::velero::Velero;
use ferry_sim::{Binding, NodeSim, SimConfig, VolumeMode};
use ferry_testbed::ControlPlane;
use kube::{Api, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The bound on every wait: generous, the machine may be loaded.
const WAIT: Duration = Duration::from_secs(180);

fn params(node: &str) -> ExposeParams {
    ExposeParams {
        node: node.to_owned(),
        operation_timeout: WAIT,
        cancel: CancellationToken::new(),
        avoid_nodes: Vec::new(),
    }
}

fn labels(pairs: &[(&str, &str)]) -> BTreeMap<String, String> {
    pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect()
}

#[tokio::test]
async fn holding_pods_follow_the_node_agent_config() -> TestResult {
    let cp = ControlPlane::shared();
    let client = cp.client()?;
    let ns = cp.unique_namespace("expose-placement").await?;
    let nodes: Vec<String> = ["a", "b", "c"].iter().map(|s| format!("{ns}-{s}")).collect();
    let (plain, global, movers) = (&nodes[0], &nodes[1], &nodes[2]);
    let sim = NodeSim::start(
        client.clone(),
        SimConfig {
            namespaces: vec![ns.clone()],
            nodes: nodes.clone(),
            node_labels: BTreeMap::from([
                (global.clone(), labels(&[("example.com/pool", "global")])),
                (movers.clone(), labels(&[("example.com/pool", "movers")])),
            ]),
            ..SimConfig::default()
        },
    )
    .await?;
    let immediate = sim.storage_class(Binding::Immediate).to_owned();
    let wffc = sim.storage_class(Binding::WaitForFirstConsumer).to_owned();
    // The first rule for every class, the second for the source volumes' class, listed later
    // on purpose: the class's own rule wins wherever it is.
    let node_agent = parse(
        &json!({
            "loadAffinity": [
                { "nodeSelector": { "matchLabels": { "example.com/pool": "global" } } },
                { "storageClass": immediate, "nodeSelector": { "matchExpressions": [
                    { "key": "example.com/pool", "operator": "In", "values": ["movers"] } ] } },
            ],
            "podResources": { "cpuRequest": "250m", "cpuLimit": "1", "memoryRequest": "64Mi",
                              "memoryLimit": "256Mi", "ephemeralStorageLimit": "512Mi" },
            "podLabels": { "example.com/team": "storage", "ferry.io/created-by": "not-ferry" },
            "podAnnotations": { "example.com/note": "held for a data movement" },
            "restorePVC": { "ignoreDelayBinding": true },
        })
        .to_string(),
    )?;
    let mut config = ExposerConfig::new("ferry:test");
    config.namespace.clone_from(&ns);
    config.apply_node_agent_config(&node_agent)?;
    let backups = CsiBackupExposer::new(client.clone(), config.clone());
    let restores = CsiRestoreExposer::new(client.clone(), config);
    let velero = Velero::new(client.clone(), &ns, "ferry", "default");

    // Three backups: the scheduler would spread them over the three nodes; the class's rule
    // keeps every one on the movers node.
    let mut uploads: Vec<DataUpload> = Vec::new();
    for i in 0..3 {
        let pvc = format!("data-{i}");
        sim.create_pvc(&ns, &pvc, "8Mi", VolumeMode::Filesystem, Binding::Immediate).await?;
        sim.wait_pvc_bound(&ns, &pvc, WAIT).await?;
        sim.snapshot_pvc(&ns, &pvc, &format!("snap-{i}")).await?;
        uploads.push(
            velero.create_data_upload(&sim, "backup", &ns, &pvc, &format!("snap-{i}")).await?,
        );
    }
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    for du in &uploads {
        let exposed = backups.expose(du, &params(plain)).await?;
        assert_eq!(&exposed.node, movers, "backup pod of {}", du.name_any());
        let pod = pods.get(&du.name_any()).await?;
        assert_eq!(pod.spec.as_ref().and_then(|s| s.node_name.as_ref()), Some(movers));
        let meta = &pod.metadata;
        let pod_labels = meta.labels.clone().unwrap_or_default();
        assert_eq!(pod_labels.get("example.com/team").map(String::as_str), Some("storage"));
        assert_eq!(pod_labels.get("ferry.io/created-by").map(String::as_str), Some("ferry"));
        assert_eq!(pod_labels.get("velero.io/data-upload"), Some(&du.name_any()));
        assert_eq!(
            meta.annotations
                .clone()
                .unwrap_or_default()
                .get("example.com/note")
                .map(String::as_str),
            Some("held for a data movement")
        );
        let container = &pod.spec.as_ref().ok_or("no spec")?.containers[0];
        let resources = serde_json::to_value(container.resources.as_ref().ok_or("no resources")?)?;
        // The API server defaults a request without value to its limit (ephemeral storage).
        assert_eq!(
            resources,
            json!({ "requests": { "cpu": "250m", "memory": "64Mi", "ephemeral-storage": "512Mi" },
                    "limits": { "cpu": "1", "memory": "256Mi", "ephemeral-storage": "512Mi" } })
        );
    }

    // A restore into the other class gets the rule for every class: the global node (the
    // emptiest node, where the scheduler would otherwise put it, is another).
    velero
        .create_restore_pvc(
            &sim,
            &ns,
            "target",
            "8Mi",
            VolumeMode::Filesystem,
            Binding::WaitForFirstConsumer,
        )
        .await?;
    let dd: DataDownload =
        velero.create_data_download("restore", &ns, "target", &uploads[0]).await?;
    let exposed = restores.expose(&dd, &params(plain)).await?;
    assert_eq!(&exposed.node, global, "restore pod in class {wffc}");
    let pod = pods.get(&dd.name_any()).await?;
    assert_eq!(pod.spec.as_ref().and_then(|s| s.node_name.as_ref()), Some(global));

    restores.cleanup(&dd, WAIT).await?;
    for du in &uploads {
        backups.cleanup(du, WAIT).await?;
    }
    for name in uploads.iter().map(ResourceExt::name_any).chain([dd.name_any()]) {
        ferry_sim::wait_gone(&pods, &name, WAIT).await?;
    }
    let dir = sim.dir().to_path_buf();
    sim.shutdown().await?;
    let left = ferry_sim::janitor::leftovers_under(&dir);
    assert!(left.is_empty(), "left behind: {left:?}");
    Ok(())
}

/// An agent tolerating every taint (a keyless `Exists`, as many DaemonSets do) needs the
/// nodes' taint keys for its holding pods' tolerations: five exposures in a row list the nodes
/// once between them (the exposer's taint cache, once per 30 s), from the API server's watch cache
/// (`resourceVersion=0`), and each holding pod gets the narrowed tolerations, never the
/// cordon's.
#[tokio::test]
async fn exposures_in_a_row_list_the_nodes_taints_once() -> TestResult {
    use ferry_api::k8s_openapi::api::core::v1::Toleration;
    let cp = ControlPlane::shared();
    let client = cp.client()?;
    let ns = cp.unique_namespace("expose-taints").await?;
    let node = format!("{ns}-n");
    let sim = NodeSim::start(
        client.clone(),
        SimConfig {
            namespaces: vec![ns.clone()],
            nodes: vec![node.clone()],
            ..SimConfig::default()
        },
    )
    .await?;
    let mut config = ExposerConfig::new("ferry:test");
    config.namespace.clone_from(&ns);
    config.agent_tolerations =
        vec![Toleration { operator: Some("Exists".into()), ..Toleration::default() }];
    let (recording, requests) = ferry_testbed::recording_client(cp.config())?;
    let backups = CsiBackupExposer::new(recording, config);
    let velero = Velero::new(client.clone(), &ns, "ferry", "default");
    let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
    let started = std::time::Instant::now();
    for i in 0..5 {
        let pvc = format!("data-{i}");
        sim.create_pvc(&ns, &pvc, "8Mi", VolumeMode::Filesystem, Binding::Immediate).await?;
        sim.wait_pvc_bound(&ns, &pvc, WAIT).await?;
        sim.snapshot_pvc(&ns, &pvc, &format!("snap-{i}")).await?;
        let du = velero.create_data_upload(&sim, "backup", &ns, &pvc, &format!("snap-{i}")).await?;
        backups.expose(&du, &params(&node)).await?;
        let pod = pods.get(&du.name_any()).await?;
        let tolerations = pod.spec.and_then(|s| s.tolerations).unwrap_or_default();
        assert!(
            !tolerations.iter().any(ferry_expose::tolerates_cordon),
            "holding pod {} tolerates the cordon: {tolerations:?}",
            du.name_any()
        );
    }
    let lists: Vec<_> = requests.all().into_iter().filter(|s| s.is_list_of("nodes")).collect();
    // Once per 30 s (the cache's age): once, unless this machine took that long.
    let allowed = 1 + started.elapsed().as_secs() / 30;
    assert!(
        !lists.is_empty() && lists.len() as u64 <= allowed,
        "node LISTs of five exposures in {:?}, at most {allowed} allowed: {lists:?}",
        started.elapsed()
    );
    assert!(lists[0].query.contains("resourceVersion=0"), "{lists:?}");
    sim.shutdown().await?;
    Ok(())
}
