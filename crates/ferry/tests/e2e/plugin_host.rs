//! Ferry's plugin driven the way Velero's server drives it, by `ferry-host`: the `ferry`
//! binary installed as `velero-plugin-ferry` and launched as Velero launches plugins, the PVC
//! backup action executed on a Backup, the operation polled through the monitor while the
//! agents move the data, the records kept in Velero's itemoperations format, the Backup's
//! phase moved as Velero moves it, across a plugin crash and a host restart; then a restore
//! into a new namespace through the restore action; and an operation whose DataUpload fails
//! making the Backup PartiallyFailed.

use std::path::{Path, PathBuf};
use std::time::Duration;

use async_trait::async_trait;
use ferry_api::k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use ferry_api::{Backup, DataUpload, DataUploadPhase, Restore, VolumeSnapshot};
use ferry_host::records::{self, file_name};
use ferry_host::{
    BackupActions, BackupOperation, BackupOperationSpec, LaunchOptions, Monitor, Operation,
    OperationPhase, OperationStatus, Phase, PluginProcess, Recorder, ResourceIdentifier, Restart,
    RestoreActions, RestoreOperation, RestoreOperationSpec, Tally,
};
use ferry_sim::{Binding, FsTree, VolumeMode};
use ferry_testbed::{ControlPlane, VELERO_NAMESPACE};
use kube::ResourceExt;
use kube::api::{Api, DeleteParams, Patch, PatchParams, PostParams};
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::harness::{Setup, TestResult, World, du_phase};

/// The `ferry` binary under the name Velero gives plugin binaries (which selects plugin mode).
pub(crate) fn install_plugin(dir: &Path) -> std::io::Result<PathBuf> {
    let path = dir.join("velero-plugin-ferry");
    std::os::unix::fs::symlink(env!("CARGO_BIN_EXE_ferry"), &path)?;
    Ok(path)
}

async fn launch(path: &Path, world: &World) -> Result<PluginProcess, ferry_host::LaunchError> {
    let env = [
        ("KUBECONFIG", ControlPlane::shared().kubeconfig().display().to_string()),
        ("VELERO_NAMESPACE", VELERO_NAMESPACE.to_owned()),
        ("FERRY_DATA_MOVER", world.mover.clone()),
        // Ferry's own host plays a Velero without CSI support: every action.
        ("FERRY_PLUGIN_ACTIONS", "all".to_owned()),
        // The socket's folder in the test's own folder: a plugin killed like a crash cannot
        // remove it, and the test's folder goes with the test.
        ("PLUGIN_UNIX_SOCKET_DIR", world.logs.path().display().to_string()),
    ];
    let options = LaunchOptions {
        env: env.into_iter().map(|(k, v)| (k.to_owned(), v)).collect(),
        start_timeout: Duration::from_secs(30),
        ..LaunchOptions::default()
    };
    PluginProcess::launch(path, &options).await
}

/// Velero's server side of a Backup or Restore: the record file and the CR's status.
pub(crate) struct StatusRecorder<K> {
    api: Api<K>,
    name: String,
    file: PathBuf,
    phase: Phase,
    /// `backup` or `restore`: the status counters' prefix.
    kind: &'static str,
}

impl<K> StatusRecorder<K>
where
    K: kube::Resource + Clone + serde::de::DeserializeOwned + serde::Serialize + std::fmt::Debug,
{
    async fn set_phase(&mut self, phase: Phase, tally: Tally) -> Result<(), kube::Error> {
        self.phase = phase;
        let patch = ferry_host::status_patch(self.kind, phase, tally);
        self.api.patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch)).await?;
        Ok(())
    }

    /// The CR's `status` as stored.
    async fn status(&self) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
        let stored = serde_json::to_value(self.api.get(&self.name).await?)?;
        Ok(stored["status"].clone())
    }
}

#[async_trait]
impl<K, S> Recorder<S> for StatusRecorder<K>
where
    K: kube::Resource
        + Clone
        + serde::de::DeserializeOwned
        + serde::Serialize
        + std::fmt::Debug
        + Send
        + Sync,
    S: serde::Serialize + Send + Sync,
{
    async fn record(&mut self, ops: &[Operation<S>], tally: Tally) -> Result<(), String> {
        let bytes = records::encode(ops).map_err(|e| e.to_string())?;
        let tmp = self.file.with_extension("tmp");
        std::fs::write(&tmp, bytes).map_err(|e| e.to_string())?;
        std::fs::rename(&tmp, &self.file).map_err(|e| e.to_string())?;
        let phase = if tally.failed > 0 { self.phase.with_failure() } else { self.phase };
        self.set_phase(phase, tally).await.map_err(|e| e.to_string())
    }
}

/// A Backup as `velero backup create --snapshot-move-data --data-mover <mover>` makes it,
/// moved to InProgress, with its recorder writing into `dir`.
pub(crate) async fn start_backup(
    world: &World,
    dir: &Path,
    label: &str,
) -> Result<(Backup, StatusRecorder<Backup>), Box<dyn std::error::Error>> {
    let backups: Api<Backup> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    let name = format!("{}-{label}", world.mover);
    let backup: Backup = serde_json::from_value(json!({
        "apiVersion": "velero.io/v1", "kind": "Backup",
        "metadata": { "name": name, "namespace": VELERO_NAMESPACE },
        "spec": { "snapshotMoveData": true, "datamover": world.mover,
                  "storageLocation": world.bsl, "includedNamespaces": [world.ns],
                  "itemOperationTimeout": "10m0s", "csiSnapshotTimeout": "5m0s" },
    }))?;
    let backup = backups.create(&PostParams::default(), &backup).await?;
    let mut recorder = StatusRecorder {
        api: backups,
        file: dir.join(file_name(&name)),
        name,
        phase: Phase::New,
        kind: "backup",
    };
    recorder.set_phase(Phase::InProgress, Tally::default()).await?;
    Ok((backup, recorder))
}

/// The item pass for PVC `pvc`: the plugin's action runs on it; returns the operation as
/// Velero records it, the DataUpload's name and the PVC as the action returned it (what Velero
/// stores in the backup).
async fn execute_on_pvc(
    world: &World,
    actions: &BackupActions,
    backup: &Backup,
    pvc: &str,
) -> Result<(BackupOperation, String, Vec<u8>), Box<dyn std::error::Error>> {
    let item =
        Api::<PersistentVolumeClaim>::namespaced(world.client.clone(), &world.ns).get(pvc).await?;
    let executed =
        actions.execute(ferry_dmp::PVC_BACKUP_PLUGIN, serde_json::to_vec(&item)?).await?;
    assert!(!executed.operation_id.is_empty(), "an asynchronous operation: {executed:?}");
    let du = executed
        .post_operation_items
        .iter()
        .find(|i| i.resource == "datauploads")
        .ok_or("the DataUpload is a post-operation item")?
        .name
        .clone();
    let op = Operation {
        spec: BackupOperationSpec {
            backup_name: backup.name_any(),
            backup_uid: backup.uid().unwrap_or_default(),
            backup_item_action: ferry_dmp::PVC_BACKUP_PLUGIN.to_owned(),
            resource_identifier: ResourceIdentifier {
                group: String::new(),
                resource: "persistentvolumeclaims".into(),
                namespace: world.ns.clone(),
                name: pvc.into(),
            },
            operation_id: executed.operation_id.clone(),
            post_operation_items: Some(
                executed.post_operation_items.iter().map(ResourceIdentifier::from).collect(),
            ),
        },
        status: OperationStatus::new(jiff::Timestamp::now()),
    };
    Ok((op, du, executed.item))
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_pvc_backup_runs_through_the_plugin_and_the_monitor_across_a_plugin_crash() -> TestResult
{
    let setup = Setup { second_namespace: true, ..Setup::default() };
    let world = World::start_with("e2e-host", setup).await?;
    let tree = FsTree::sample(23);
    world
        .sim()
        .create_pvc(&world.ns, "data", "32Mi", VolumeMode::Filesystem, Binding::Immediate)
        .await?;
    world.sim().write_files(&world.ns, "data", &tree).await?;
    let dir = tempfile::tempdir()?;
    let plugin_path = install_plugin(dir.path())?;

    let (backup, mut recorder) = start_backup(&world, dir.path(), "nightly").await?;
    let name = backup.name_any();
    let plugin = launch(&plugin_path, &world).await?;
    let listed = plugin.list_plugins().await?;
    assert!(
        listed
            .iter()
            .any(|p| p.kind == "BackupItemActionV2" && p.name == ferry_dmp::PVC_BACKUP_PLUGIN),
        "{listed:?}"
    );

    // The item pass: the action runs on the PVC and starts an operation.
    let actions = BackupActions::new(plugin.channel(), serde_json::to_vec(&backup)?);
    let (op, du_name, backed_up_pvc) = execute_on_pvc(&world, &actions, &backup, "data").await?;
    let ops = vec![op];
    recorder.phase = Phase::after_items(false, true);
    recorder.record(&ops, Tally::of(&ops)).await?;

    // The plugin crashes while the agents move the data; Velero's server restarts too.
    world
        .wait_for(&du_name, "InProgress or done", |d: &DataUpload| {
            matches!(du_phase(d), Some(DataUploadPhase::InProgress | DataUploadPhase::Completed))
        })
        .await?;
    let status = plugin.kill().await?;
    assert!(!status.success());
    drop(ops);

    // The restarted host: the Backup's phase says resume, the record says what to poll.
    let stored = recorder.api.get(&name).await?;
    let phase = Phase::parse(stored.status.as_ref().and_then(|s| s.phase.as_deref()).unwrap_or(""))
        .ok_or("unknown phase")?;
    assert_eq!(phase, Phase::WaitingForPluginOperations);
    assert_eq!(phase.on_host_start("backup"), Restart::ResumePolling);
    let mut ops: Vec<BackupOperation> = records::decode(&std::fs::read(&recorder.file)?)?;
    assert_eq!(ops.len(), 1);
    let plugin = launch(&plugin_path, &world).await?;
    let actions = BackupActions::new(plugin.channel(), serde_json::to_vec(&stored)?);
    let monitor =
        Monitor { interval: Duration::from_millis(500), timeout: Duration::from_secs(600) };
    let tally = monitor.wait(&mut ops, &actions, &mut recorder, &CancellationToken::new()).await?;
    assert_eq!(tally, Tally { attempted: 1, completed: 1, failed: 0, pending: 0 }, "{ops:#?}");

    // Finalizing (Velero backs up the post-operation items again), then Completed.
    let phase = recorder.phase.after_operations();
    assert_eq!(phase, Phase::Finalizing);
    recorder.set_phase(phase, tally).await?;
    let du =
        Api::<DataUpload>::namespaced(world.client.clone(), VELERO_NAMESPACE).get(&du_name).await?;
    assert_eq!(du_phase(&du), Some(DataUploadPhase::Completed));
    recorder.set_phase(phase.after_finalizing(), tally).await?;

    let op = &ops[0];
    let du_bytes = du.status.clone().unwrap_or_default().progress;
    assert_eq!(op.status.phase, OperationPhase::Completed);
    assert!(op.status.n_total > 0);
    assert_eq!(op.status.n_completed, op.status.n_total);
    assert_eq!(op.status.n_total, du_bytes.total_bytes);
    assert_eq!(op.status.operation_units, "Bytes");
    assert!(op.status.started.is_some());
    let status = recorder.status().await?;
    assert_eq!(status["phase"], "Completed");
    assert_eq!(status["backupItemOperationsCompleted"], 1);
    // The record on disk is the final state, in Velero's format.
    let on_disk: Vec<BackupOperation> = records::decode(&std::fs::read(&recorder.file)?)?;
    assert_eq!(on_disk, ops);

    // A restore of that backup into a new namespace, through the restore action.
    let target = world.ns2.clone().ok_or("second namespace")?;
    let restores: Api<Restore> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    let restore: Restore = serde_json::from_value(json!({
        "apiVersion": "velero.io/v1", "kind": "Restore",
        "metadata": { "name": format!("{name}-restore"), "namespace": VELERO_NAMESPACE },
        "spec": { "backupName": name, "namespaceMapping": { world.ns.clone(): target },
                  "itemOperationTimeout": "10m0s" },
    }))?;
    let restore = restores.create(&PostParams::default(), &restore).await?;
    let mut restore_recorder = StatusRecorder {
        api: restores,
        name: restore.name_any(),
        file: dir.path().join(file_name(&restore.name_any())),
        phase: Phase::New,
        kind: "restore",
    };
    restore_recorder.set_phase(Phase::InProgress, Tally::default()).await?;
    // What Velero's DataUpload restore action leaves for the PVC action.
    let maps: Api<ConfigMap> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    maps.create(&PostParams::default(), &ferry_dmp::upload_result_config_map(&restore, &du)?)
        .await?;
    let restore_actions = RestoreActions::new(plugin.channel(), serde_json::to_vec(&restore)?);
    let executed = restore_actions
        .execute(ferry_dmp::PVC_RESTORE_PLUGIN, backed_up_pvc.clone(), backed_up_pvc)
        .await?;
    assert!(!executed.operation_id.is_empty() && !executed.skip_restore, "{executed:?}");
    let mut restore_ops = vec![Operation {
        spec: RestoreOperationSpec {
            restore_name: restore.name_any(),
            restore_uid: restore.uid().unwrap_or_default(),
            restore_item_action: ferry_dmp::PVC_RESTORE_PLUGIN.to_owned(),
            resource_identifier: ResourceIdentifier {
                group: String::new(),
                resource: "persistentvolumeclaims".into(),
                namespace: target.clone(),
                name: "data".into(),
            },
            operation_id: executed.operation_id.clone(),
        },
        status: OperationStatus::new(jiff::Timestamp::now()),
    }];
    // Velero creates the item the action returned in the target namespace.
    let mut pvc: serde_json::Value = serde_json::from_slice(&executed.item)?;
    let meta = pvc["metadata"].as_object_mut().ok_or("PVC metadata")?;
    for key in ["uid", "resourceVersion", "creationTimestamp", "managedFields"] {
        meta.remove(key);
    }
    meta.insert("namespace".into(), json!(target));
    pvc.as_object_mut().ok_or("PVC")?.remove("status");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(world.client.clone(), &target);
    pvcs.create(&PostParams::default(), &serde_json::from_value(pvc)?).await?;
    restore_recorder.phase = Phase::after_items(false, true);
    restore_recorder.record(&restore_ops, Tally::of(&restore_ops)).await?;
    let tally = monitor
        .wait(&mut restore_ops, &restore_actions, &mut restore_recorder, &CancellationToken::new())
        .await?;
    assert_eq!(
        tally,
        Tally { attempted: 1, completed: 1, failed: 0, pending: 0 },
        "{restore_ops:#?}"
    );
    let phase = restore_recorder.phase.after_operations();
    restore_recorder.set_phase(phase, tally).await?;
    restore_recorder.set_phase(phase.after_finalizing(), tally).await?;
    assert_eq!(restore_recorder.status().await?["phase"], "Completed");
    let op = &restore_ops[0].status;
    assert_eq!((op.n_completed, op.n_total), (du_bytes.total_bytes, du_bytes.total_bytes));
    assert_eq!(world.sim().read_files(&target, "data").await?, tree);
    let on_disk: Vec<RestoreOperation> = records::decode(&std::fs::read(&restore_recorder.file)?)?;
    assert_eq!(on_disk, restore_ops);
    plugin.shutdown(Duration::from_secs(10)).await?;
    world.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operation_whose_data_upload_fails_makes_the_backup_partially_failed() -> TestResult {
    let mut world = World::start("e2e-host-fail").await?;
    // No agent runs while the item pass takes place, so the DataUpload waits in New.
    for node in world.sim().nodes() {
        world.kill_agent(&node);
    }
    let tree = FsTree::sample(29);
    let sim = world.sim();
    sim.create_pvc(&world.ns, "good", "16Mi", VolumeMode::Filesystem, Binding::Immediate).await?;
    sim.write_files(&world.ns, "good", &tree).await?;
    sim.create_pvc(&world.ns, "lost", "16Mi", VolumeMode::Filesystem, Binding::Immediate).await?;
    let dir = tempfile::tempdir()?;
    let plugin_path = install_plugin(dir.path())?;
    let (backup, mut recorder) = start_backup(&world, dir.path(), "weekly").await?;
    let plugin = launch(&plugin_path, &world).await?;
    let actions = BackupActions::new(plugin.channel(), serde_json::to_vec(&backup)?);
    let (good, good_du, _) = execute_on_pvc(&world, &actions, &backup, "good").await?;
    let (lost, lost_du, _) = execute_on_pvc(&world, &actions, &backup, "lost").await?;
    let mut ops = vec![good, lost];
    recorder.phase = Phase::after_items(false, true);
    recorder.record(&ops, Tally::of(&ops)).await?;

    // The snapshot of `lost` disappears before any agent takes its DataUpload.
    let uploads: Api<DataUpload> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    let du = uploads.get(&lost_du).await?;
    let snapshot = du.spec.csi_snapshot.clone().ok_or("a CSI DataUpload")?.volume_snapshot;
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(world.client.clone(), &world.ns);
    snapshots.delete(&snapshot, &DeleteParams::default()).await?;
    for node in world.sim().nodes() {
        world.start_agent(&node)?;
    }

    let monitor =
        Monitor { interval: Duration::from_millis(500), timeout: Duration::from_secs(600) };
    let tally = monitor.wait(&mut ops, &actions, &mut recorder, &CancellationToken::new()).await?;
    assert_eq!(tally, Tally { attempted: 2, completed: 1, failed: 1, pending: 0 }, "{ops:#?}");
    assert_eq!(recorder.phase, Phase::WaitingForPluginOperationsPartiallyFailed);
    let failed_du = uploads.get(&lost_du).await?;
    assert_eq!(du_phase(&failed_du), Some(DataUploadPhase::Failed));
    let message = failed_du.status.unwrap_or_default().message;
    assert!(!message.is_empty() && message.contains(&snapshot), "{message}");
    assert_eq!(ops[1].status.phase, OperationPhase::Failed);
    assert_eq!(ops[1].status.error, message, "the operation carries the DataUpload's message");
    assert_eq!(ops[0].status.phase, OperationPhase::Completed);
    assert_eq!(du_phase(&uploads.get(&good_du).await?), Some(DataUploadPhase::Completed));

    let phase = recorder.phase.after_operations();
    assert_eq!(phase, Phase::FinalizingPartiallyFailed);
    recorder.set_phase(phase, tally).await?;
    recorder.set_phase(phase.after_finalizing(), tally).await?;
    let status = recorder.status().await?;
    assert_eq!(status["phase"], "PartiallyFailed");
    assert_eq!(status["backupItemOperationsFailed"], 1);
    plugin.shutdown(Duration::from_secs(10)).await?;
    world.shutdown().await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn an_operation_past_the_item_operation_timeout_is_canceled_through_the_plugin() -> TestResult
{
    let mut world = World::start("e2e-host-timeout").await?;
    // No agent runs, so the DataUpload cannot finish before the (short) timeout.
    for node in world.sim().nodes() {
        world.kill_agent(&node);
    }
    let sim = world.sim();
    sim.create_pvc(&world.ns, "slow", "16Mi", VolumeMode::Filesystem, Binding::Immediate).await?;
    sim.write_files(&world.ns, "slow", &FsTree::sample(31)).await?;
    let dir = tempfile::tempdir()?;
    let plugin_path = install_plugin(dir.path())?;
    let (backup, mut recorder) = start_backup(&world, dir.path(), "hourly").await?;
    let plugin = launch(&plugin_path, &world).await?;
    let actions = BackupActions::new(plugin.channel(), serde_json::to_vec(&backup)?);
    let (op, du_name, _) = execute_on_pvc(&world, &actions, &backup, "slow").await?;
    let mut ops = vec![op];
    recorder.phase = Phase::after_items(false, true);
    recorder.record(&ops, Tally::of(&ops)).await?;

    let monitor = Monitor { interval: Duration::from_millis(500), timeout: Duration::from_secs(3) };
    let tally = monitor.wait(&mut ops, &actions, &mut recorder, &CancellationToken::new()).await?;
    assert_eq!(tally, Tally { attempted: 1, completed: 0, failed: 1, pending: 0 });
    assert_eq!(ops[0].status.error, ferry_host::TIMED_OUT);
    let uploads: Api<DataUpload> = Api::namespaced(world.client.clone(), VELERO_NAMESPACE);
    assert!(uploads.get(&du_name).await?.spec.cancel, "the plugin's Cancel set spec.cancel");

    // The agents come back and end the canceled DataUpload, leaving nothing behind.
    for node in world.sim().nodes() {
        world.start_agent(&node)?;
    }
    let du: DataUpload = world.wait_for(&du_name, "terminal", crate::harness::du_terminal).await?;
    assert_eq!(du_phase(&du), Some(DataUploadPhase::Canceled), "{:#?}", du.status);
    assert_eq!(world.leftovers_of(&du_name).await?, Vec::<String>::new());
    let phase = recorder.phase.after_operations();
    assert_eq!(phase, Phase::FinalizingPartiallyFailed);
    recorder.set_phase(phase.after_finalizing(), tally).await?;
    assert_eq!(recorder.status().await?["phase"], "PartiallyFailed");
    plugin.shutdown(Duration::from_secs(10)).await?;
    world.shutdown().await
}
