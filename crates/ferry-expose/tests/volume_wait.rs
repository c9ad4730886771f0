//! While the kubelet has not exposed a volume, the agent says what it waits for: a Warning
//! Event on the CR naming the holding pod, the volume and the path it expects, once the wait
//! outlasts the grace. A real API server; the pod's state is written by the test, as a kubelet
//! would, and the kubelet's pods directory is a temporary directory.

use std::path::{Path, PathBuf};
use std::time::Duration;

use ferry_agent::Exposer;
use ferry_api::DataUpload;
use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use ferry_api::k8s_openapi::api::events::v1::Event;
use ferry_expose::{CsiBackupExposer, ExposerConfig, WAITING_FOR_VOLUME};
use ferry_testbed::ControlPlane;
use kube::api::{Api, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use rustix::mount::{UnmountFlags, mount_bind, unmount};
use serde_json::json;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// A bind mount undone on drop, also when the test fails.
struct Mounted(PathBuf);

impl Mounted {
    fn bind(source: &Path, target: &Path) -> Result<Self, Box<dyn std::error::Error>> {
        mount_bind(source, target)
            .map_err(|e| format!("bind-mounting {} (needs root): {e}", target.display()))?;
        Ok(Self(target.to_owned()))
    }
}

impl Drop for Mounted {
    fn drop(&mut self) {
        if let Err(e) = unmount(&self.0, UnmountFlags::DETACH) {
            eprintln!("unmounting {}: {e}", self.0.display());
        }
    }
}

/// The Events `reason` on DataUpload `name`, as notes.
async fn notes(client: &Client, ns: &str, name: &str, reason: &str) -> kube::Result<Vec<String>> {
    let events: Api<Event> = Api::namespaced(client.clone(), ns);
    Ok(events
        .list(&ListParams::default())
        .await?
        .items
        .into_iter()
        .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
        .filter(|e| e.reason.as_deref() == Some(reason))
        .map(|e| {
            assert_eq!(e.type_.as_deref(), Some("Warning"));
            assert_eq!(e.reporting_controller.as_deref(), Some("ferry-agent"));
            e.note.unwrap_or_default()
        })
        .collect())
}

/// A DataUpload, and the holding pod (running on `node`) and bound PVC its exposer made.
async fn exposed_upload(
    client: &Client,
    ns: &str,
    name: &str,
    node: &str,
    pv: &str,
) -> Result<(DataUpload, String), Box<dyn std::error::Error>> {
    let post = PostParams::default();
    let du: DataUpload = serde_json::from_value(json!({
        "apiVersion": "velero.io/v2alpha1", "kind": "DataUpload",
        "metadata": { "name": name, "namespace": ns },
        "spec": { "snapshotType": "CSI", "sourcePVC": "data", "sourceNamespace": ns,
                  "backupStorageLocation": "default", "operationTimeout": "10m0s" },
    }))?;
    let du = Api::<DataUpload>::namespaced(client.clone(), ns).create(&post, &du).await?;
    let claim: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": ns },
        "spec": { "accessModes": ["ReadWriteOnce"], "volumeName": pv,
                  "resources": { "requests": { "storage": "8Mi" } } },
    }))?;
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), ns).create(&post, &claim).await?;
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod: Pod = serde_json::from_value(json!({
        "metadata": { "name": name, "namespace": ns },
        "spec": { "nodeName": node, "containers": [{ "name": "hold", "image": "ferry:test" }],
                  "volumes": [{ "name": "volume",
                                "persistentVolumeClaim": { "claimName": name } }] },
    }))?;
    let uid = pods.create(&post, &pod).await?.uid().ok_or("pod without uid")?;
    let running = json!({ "status": { "phase": "Running" } });
    pods.patch_status(name, &PatchParams::default(), &Patch::Merge(&running)).await?;
    Ok((du, uid))
}

#[tokio::test]
async fn a_long_wait_for_the_kubelet_is_told_with_the_expected_path() -> TestResult {
    let cp = ControlPlane::shared();
    let client = cp.client()?;
    let ns = cp.unique_namespace("expose-wait").await?;
    let kubelet = tempfile::tempdir()?;
    let mut config = ExposerConfig::new("ferry:test");
    config.namespace.clone_from(&ns);
    config.kubelet_root = kubelet.path().to_owned();
    config.volume_wait_grace = Duration::ZERO;
    let (du, uid) = exposed_upload(&client, &ns, "du-wait", "node-1", "pv-wait").await?;
    let exposer = CsiBackupExposer::new(client.clone(), config.clone());

    // Not there: the wait is told at once (no grace here), and only once.
    assert!(exposer.locate(&du, "node-1").await?.is_none());
    assert!(exposer.locate(&du, "node-1").await?.is_none());
    let expected =
        kubelet.path().join(format!("pods/{uid}/volumes/kubernetes.io~csi/pv-wait/mount"));
    let told = notes(&client, &ns, "du-wait", WAITING_FOR_VOLUME).await?;
    assert_eq!(told.len(), 1, "{told:?}");
    for part in [
        "on node node-1",
        "volume pv-wait",
        &format!("pod {ns}/du-wait (uid {uid})"),
        &format!("nothing at {}", expected.display()),
        &format!("directory at {}", kubelet.path().display()),
    ] {
        assert!(told[0].contains(part), "note without {part:?}: {}", told[0]);
    }

    // The kubelet made the directory but mounted nothing yet; then it bind-mounts the
    // volume's directory there, on the same file system, and the volume is found.
    std::fs::create_dir_all(&expected)?;
    let restarted = CsiBackupExposer::new(client.clone(), config.clone());
    assert!(restarted.locate(&du, "node-1").await?.is_none());
    let told = notes(&client, &ns, "du-wait", WAITING_FOR_VOLUME).await?;
    assert!(
        told.iter().any(|n| n.contains("is a directory but nothing is mounted on it")),
        "{told:?}"
    );
    let published = kubelet.path().join("plugins/hostpath/pv-wait");
    std::fs::create_dir_all(&published)?;
    let _mounted = Mounted::bind(&published, &expected)?;
    let found = exposer.locate(&du, "node-1").await?.ok_or("volume not found")?;
    assert_eq!(found.path, expected);

    // Within the grace nothing is told.
    let (du2, _) = exposed_upload(&client, &ns, "du-quiet", "node-1", "pv-quiet").await?;
    config.volume_wait_grace = Duration::from_secs(3600);
    let patient = CsiBackupExposer::new(client.clone(), config);
    assert!(patient.locate(&du2, "node-1").await?.is_none());
    assert_eq!(notes(&client, &ns, "du-quiet", WAITING_FOR_VOLUME).await?, Vec::<String>::new());
    Ok(())
}

/// The other way round: after the backup, the PVC is deleted only once the node let go of the
/// volume. The holding pod was evicted (a terminal phase, so the API server removes it at
/// once when deleted); the kubelet's entry for its volume stays until the test removes it, as
/// the kubelet does once it unpublished the volume. Until then the PVC is not deleted.
#[tokio::test]
async fn the_pvc_is_deleted_only_after_the_kubelet_let_go_of_the_volume() -> TestResult {
    use ferry_api::k8s_openapi::api::core::v1::Node;
    let cp = ControlPlane::shared();
    let client = cp.client()?;
    let ns = cp.unique_namespace("expose-release").await?;
    let kubelet = tempfile::tempdir()?;
    let mut config = ExposerConfig::new("ferry:test");
    config.namespace.clone_from(&ns);
    config.kubelet_root = kubelet.path().to_owned();
    // A Ready node of its own (only a running kubelet releases volumes).
    let node_name = format!("{ns}-node");
    let nodes: Api<Node> = Api::all(client.clone());
    nodes
        .create(
            &PostParams::default(),
            &serde_json::from_value(json!({
            "metadata": { "name": node_name } }))?,
        )
        .await?;
    let ready = json!({ "status": { "conditions": [{ "type": "Ready", "status": "True" }] } });
    nodes.patch_status(&node_name, &PatchParams::default(), &Patch::Merge(&ready)).await?;
    let result = async {
        let (du, uid) =
            exposed_upload(&client, &ns, "du-release", &node_name, "pv-release").await?;
        let entry =
            kubelet.path().join(format!("pods/{uid}/volumes/kubernetes.io~csi/pv-release/mount"));
        std::fs::create_dir_all(&entry)?;
        let pods: Api<Pod> = Api::namespaced(client.clone(), &ns);
        let evicted = json!({ "status": { "phase": "Failed", "reason": "Evicted" } });
        pods.patch_status("du-release", &PatchParams::default(), &Patch::Merge(&evicted)).await?;

        let exposer = CsiBackupExposer::new(client.clone(), config.clone());
        let cleanup =
            tokio::spawn(async move { exposer.cleanup(&du, Duration::from_secs(60)).await });
        let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), &ns);
        let deleted = |c: Option<PersistentVolumeClaim>| {
            c.is_none_or(|c| c.metadata.deletion_timestamp.is_some())
        };
        // The pod goes at once; the PVC stays while the kubelet has the volume.
        let until = tokio::time::Instant::now() + Duration::from_secs(20);
        while pods.get_opt("du-release").await?.is_some() {
            assert!(tokio::time::Instant::now() < until, "the evicted pod was not deleted");
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
        tokio::time::sleep(Duration::from_secs(2)).await;
        assert!(!deleted(claims.get_opt("du-release").await?), "PVC deleted while in use");
        assert!(!cleanup.is_finished(), "cleanup ended while the kubelet had the volume");

        // The kubelet unpublishes: the entry goes, and then the PVC.
        std::fs::remove_dir_all(kubelet.path().join("pods").join(&uid))?;
        tokio::time::timeout(Duration::from_secs(20), cleanup).await???;
        assert!(deleted(claims.get_opt("du-release").await?), "PVC not deleted after release");

        // No wait where nothing can be seen or released: a holding pod on another node than
        // this agent's (only its object's removal is waited for), and a node not Ready.
        for (du, node_of_agent, ready) in
            [("du-elsewhere", "another-node", "True"), ("du-lost", node_name.as_str(), "False")]
        {
            let (upload, uid) = exposed_upload(&client, &ns, du, &node_name, du).await?;
            std::fs::create_dir_all(
                kubelet.path().join(format!("pods/{uid}/volumes/kubernetes.io~csi/{du}/mount")),
            )?;
            pods.patch_status(du, &PatchParams::default(), &Patch::Merge(&evicted)).await?;
            let status =
                json!({ "status": { "conditions": [{ "type": "Ready", "status": ready }] } });
            nodes.patch_status(&node_name, &PatchParams::default(), &Patch::Merge(&status)).await?;
            let mut config = config.clone();
            config.node_name = Some(node_of_agent.to_owned());
            let exposer = CsiBackupExposer::new(client.clone(), config);
            tokio::time::timeout(
                Duration::from_secs(20),
                exposer.cleanup(&upload, Duration::from_secs(60)),
            )
            .await??;
            assert!(deleted(claims.get_opt(du).await?), "{du}: PVC not deleted");
        }
        Ok::<(), Box<dyn std::error::Error>>(())
    }
    .await;
    nodes.delete(&node_name, &Default::default()).await?;
    result
}
