//! The proof that Velero can load Ferry's plugin and drive a real backup: `interop/goplugin-host`
//! (Velero v1.18.3's own plugin registry and manager over hashicorp/go-plugin, built from the Go
//! module proxy) discovers the `ferry` binary installed as `velero-plugin-ferry`, lists its
//! plugins, and calls the PVC backup action's AppliesTo, Execute and Progress on a real PVC
//! while Ferry's agents move the data; this test checks what Velero saw against the cluster.

use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::PersistentVolumeClaim;
use ferry_api::{DataUpload, DataUploadPhase};
use ferry_sim::{Binding, FsTree, VolumeMode};
use ferry_testbed::{ControlPlane, VELERO_NAMESPACE};
use kube::api::Api;
use nix::sys::signal::{Signal, killpg};
use nix::unistd::Pid;
use serde_json::Value;

use crate::harness::{TestResult, World, du_phase};
use crate::plugin_host::{install_plugin, start_backup};

/// The Go host in a process group of its own: the group (with every plugin process Velero's
/// manager started) is killed when dropped, so nothing outlives a failed test.
struct Group(Child);

impl Drop for Group {
    fn drop(&mut self) {
        if let Ok(pid) = i32::try_from(self.0.id()) {
            let _ = killpg(Pid::from_raw(pid), Signal::SIGKILL);
        }
        let _ = self.0.wait();
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn velero_s_plugin_manager_backs_up_a_pvc_through_ferry_s_plugin() -> TestResult {
    let host = tokio::task::spawn_blocking(ferry_testbed::goplugin_host::build).await??;
    let world = World::start("e2e-velero-go").await?;
    let tree = FsTree::sample(41);
    let sim = world.sim();
    sim.create_pvc(&world.ns, "data", "32Mi", VolumeMode::Filesystem, Binding::Immediate).await?;
    sim.write_files(&world.ns, "data", &tree).await?;
    let dir = tempfile::tempdir()?;
    let plugins = dir.path().join("plugins");
    std::fs::create_dir(&plugins)?;
    install_plugin(&plugins)?;
    let (backup, _recorder) = start_backup(&world, dir.path(), "velero-go").await?;
    let pvc = Api::<PersistentVolumeClaim>::namespaced(world.client.clone(), &world.ns)
        .get("data")
        .await?;
    let (pvc_file, backup_file) = (dir.path().join("pvc.json"), dir.path().join("backup.json"));
    std::fs::write(&pvc_file, serde_json::to_vec(&pvc)?)?;
    std::fs::write(&backup_file, serde_json::to_vec(&backup)?)?;

    // Velero passes its environment on to the plugins it starts.
    let out = dir.path().join("stdout");
    let err = dir.path().join("stderr");
    let child = Command::new(&host)
        .arg("ferry")
        .arg("--plugin-dir")
        .arg(&plugins)
        .arg("--pvc")
        .arg(&pvc_file)
        .arg("--backup")
        .arg(&backup_file)
        .args(["--wait", "180s", "--log-level", "info", "--features="])
        .env("KUBECONFIG", ControlPlane::shared().kubeconfig())
        .env("VELERO_NAMESPACE", VELERO_NAMESPACE)
        .env("FERRY_DATA_MOVER", &world.mover)
        .env("FERRY_PLUGIN_ACTIONS", "all")
        .env("TMPDIR", dir.path())
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out)?)
        .stderr(std::fs::File::create(&err)?)
        .process_group(0)
        .spawn()?;
    let mut group = Group(child);
    let start = Instant::now();
    let status = loop {
        if let Some(status) = group.0.try_wait()? {
            break status;
        }
        assert!(start.elapsed() < Duration::from_secs(300), "the Go host did not finish");
        tokio::time::sleep(Duration::from_millis(200)).await;
    };
    drop(group);
    let stdout = std::fs::read_to_string(&out)?;
    let stderr = std::fs::read_to_string(&err)?;
    assert!(status.success(), "{status}\n{stdout}\n--- stderr ---\n{stderr}");
    let seen: Value = serde_json::from_str(&stdout)?;

    let plugins = &seen["plugins"];
    for (kind, name) in [
        ("BackupItemActionV2", ferry_dmp::PVC_BACKUP_PLUGIN),
        ("RestoreItemActionV2", ferry_dmp::PVC_RESTORE_PLUGIN),
        ("DeleteItemAction", ferry_dmp::DATA_UPLOAD_DELETE_PLUGIN),
    ] {
        let listed = plugins[kind].as_array().map(Vec::as_slice).unwrap_or_default();
        assert!(listed.iter().any(|n| n == name), "{kind} {name} not in {plugins}");
    }
    assert_eq!(seen["appliesTo"], serde_json::json!(["persistentvolumeclaims"]));
    let operation_id = seen["operationID"].as_str().unwrap_or_default();
    assert!(!operation_id.is_empty(), "{seen}");
    assert!(seen["annotations"]["velero.io/data-upload-name"].is_string(), "{seen}");
    let du_name = seen["postOperationItems"]
        .as_array()
        .and_then(|items| items.iter().find(|i| i["Resource"] == "datauploads"))
        .and_then(|i| i["Name"].as_str())
        .ok_or_else(|| format!("no DataUpload among the post-operation items: {seen}"))?
        .to_owned();

    let du =
        Api::<DataUpload>::namespaced(world.client.clone(), VELERO_NAMESPACE).get(&du_name).await?;
    assert_eq!(du_phase(&du), Some(DataUploadPhase::Completed), "{:#?}", du.status);
    let bytes = du.status.clone().unwrap_or_default().progress;
    let progress = &seen["progress"];
    assert_eq!(progress["Completed"], true, "{seen}");
    assert_eq!(progress["Err"], "", "{seen}");
    assert_eq!(progress["NTotal"], bytes.total_bytes, "{seen}");
    assert_eq!(progress["NCompleted"], bytes.total_bytes, "{seen}");
    assert!(bytes.total_bytes > 0);
    assert_eq!(progress["OperationUnits"], "Bytes");
    let unknown = seen["unknownOperationError"].as_str().unwrap_or_default();
    assert!(unknown.contains("no-such-operation"), "{seen}");
    // Velero's manager stopped its plugin processes, which left nothing in their TMPDIR.
    let left: Vec<_> = std::fs::read_dir(dir.path())?
        .filter_map(Result::ok)
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| {
            !matches!(n.as_str(), "plugins" | "pvc.json" | "backup.json" | "stdout" | "stderr")
                && !n.ends_with("itemoperations.json.gz")
        })
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
    world.shutdown().await
}
