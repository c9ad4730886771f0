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
