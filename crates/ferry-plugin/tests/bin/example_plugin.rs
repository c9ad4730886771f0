//! An example Velero plugin built on `ferry-plugin`: echo actions of every kind in one process.
//!
//! The integration tests (`tests/host.rs` in Rust, `interop/goplugin-host` in Go through
//! Velero's own plugin manager) launch this binary exactly as Velero does and check each answer
//! against the behaviour written here:
//!
//! - `ferry.dev/echo-backup` (BackupItemActionV2): annotates the item with
//!   `ferry.dev/echoed-by: <backup name>`, returns its PV as an additional item, starts the
//!   operation `echo/<namespace>/<name>` and names a DataUpload as post-operation item.
//! - `ferry.dev/echo-backup-v1` (BackupItemAction) and `ferry.dev/echo-backup-v1-adapted` (the
//!   same action served as BackupItemActionV2 through the SDK's adapter).
//! - `ferry.dev/echo-restore` (RestoreItemActionV2) and `ferry.dev/echo-restore-v1`
//!   (RestoreItemAction).
//! - `ferry.dev/echo-delete` (DeleteItemAction).
//! - `ferry.dev/echo-snapshotter` (VolumeSnapshotter and VolumeSnapshotterV2, one instance).
//!
//! `Progress` of the operation `echo/stuck/forever` never answers, like an action stuck on an
//! unreachable API server. Operations are otherwise stateless apart from cancellation: `Progress` derives its answer from the
//! operation ID, so it answers the same after a restart of the process.

use std::collections::{BTreeMap, BTreeSet};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};

use ferry_plugin::adapters::AdaptedBackupItemAction;
use ferry_plugin::{
    BackupItemAction, BackupItemActionV2, BackupItemInput, BackupItemOutput, BackupItemOutputV2,
    DeleteItemAction, DeleteItemInput, HostArgs, JsonObject, NewVolume, OperationProgress,
    PluginError, PluginServer, RegisterError, ResourceIdentifier, ResourceSelector,
    RestoreItemAction, RestoreItemActionV2, RestoreItemInput, RestoreItemOutput,
    RestoreItemOutputV2, VolumeInfo, VolumeSnapshotter, VolumeSnapshotterV2, async_trait,
};
use serde_json::{Value, json};

fn at(secs: u64) -> Option<SystemTime> {
    Some(UNIX_EPOCH + Duration::from_secs(secs))
}

fn name_of(obj: &JsonObject, what: &str) -> Result<String, PluginError> {
    obj.name()
        .map(str::to_owned)
        .ok_or_else(|| PluginError::invalid_input(format!("the {what} has no metadata.name")))
}

fn annotate(item: &JsonObject, key: &str, value: &str) -> Value {
    let mut v = item.value().clone();
    if let Some(meta) = v.get_mut("metadata").and_then(Value::as_object_mut) {
        let annotations = meta.entry("annotations").or_insert_with(|| json!({}));
        if let Some(map) = annotations.as_object_mut() {
            map.insert(key.to_owned(), json!(value));
        }
    }
    v
}

fn volume_of(obj: &JsonObject) -> Option<ResourceIdentifier> {
    let pv = obj.str_at("/spec/volumeName").filter(|v| !v.is_empty())?;
    Some(ResourceIdentifier::cluster_scoped("", "persistentvolumes", pv))
}

/// Operations this process was asked to cancel.
#[derive(Default)]
struct Cancelled(Mutex<BTreeSet<String>>);

impl Cancelled {
    fn add(&self, id: &str) {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).insert(id.to_owned());
    }
    fn contains(&self, id: &str) -> bool {
        self.0.lock().unwrap_or_else(|e| e.into_inner()).contains(id)
    }
}

/// Progress of an echo operation `<prefix>/<namespace>/<name>`.
fn echo_progress(
    cancelled: &Cancelled,
    prefix: &str,
    operation_id: &str,
    verb: &str,
    owner: &str,
) -> Result<OperationProgress, PluginError> {
    let target = operation_id
        .strip_prefix(prefix)
        .and_then(|rest| rest.strip_prefix('/'))
        .filter(|rest| rest.split('/').count() == 2)
        .ok_or_else(|| PluginError::not_found(format!("operation {operation_id:?}")))?;
    if cancelled.contains(operation_id) {
        return Ok(OperationProgress {
            error: Some("cancelled by the host".into()),
            ..OperationProgress::completed()
        });
    }
    Ok(OperationProgress {
        completed: true,
        error: None,
        n_completed: 4096,
        n_total: 4096,
        operation_units: "bytes".into(),
        description: format!("{verb} {target} for {owner}"),
        started: at(1_700_000_000),
        updated: at(1_700_000_060),
    })
}

#[derive(Default)]
struct EchoBackup {
    cancelled: Cancelled,
}

#[async_trait]
impl BackupItemActionV2 for EchoBackup {
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError> {
        Ok(ResourceSelector::resources(["persistentvolumeclaims"])
            .with_label_selector("ferry.dev/echo=true"))
    }

    async fn execute(&self, input: BackupItemInput) -> Result<BackupItemOutputV2, PluginError> {
        let name = name_of(&input.item, "item")?;
        let namespace = input.item.namespace().unwrap_or_default().to_owned();
        let backup = name_of(&input.backup, "backup")?;
        let backup_namespace = input.backup.namespace().unwrap_or_default();
        Ok(BackupItemOutputV2 {
            item: Some(annotate(&input.item, "ferry.dev/echoed-by", &backup)),
            additional_items: volume_of(&input.item).into_iter().collect(),
            operation_id: Some(format!("echo/{namespace}/{name}")),
            post_operation_items: vec![ResourceIdentifier::namespaced(
                "velero.io",
                "datauploads",
                backup_namespace,
                format!("{backup}-{name}"),
            )],
        })
    }

    async fn progress(
        &self,
        id: &str,
        backup: &JsonObject,
    ) -> Result<OperationProgress, PluginError> {
        if id == "echo/stuck/forever" {
            tokio::time::sleep(Duration::from_secs(24 * 3600)).await;
        }
        let owner = format!("backup {}", name_of(backup, "backup")?);
        echo_progress(&self.cancelled, "echo", id, "echoed", &owner)
    }

    async fn cancel(&self, id: &str, backup: &JsonObject) -> Result<(), PluginError> {
        self.progress(id, backup).await?;
        self.cancelled.add(id);
        Ok(())
    }
}

struct EchoBackupV1;

#[async_trait]
impl BackupItemAction for EchoBackupV1 {
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError> {
        Ok(ResourceSelector::resources(["configmaps"]))
    }

    async fn execute(&self, input: BackupItemInput) -> Result<BackupItemOutput, PluginError> {
        let backup = name_of(&input.backup, "backup")?;
        Ok(BackupItemOutput::item(annotate(&input.item, "ferry.dev/echoed-by-v1", &backup)))
    }
}

#[derive(Default)]
struct EchoRestore {
    cancelled: Cancelled,
}

#[async_trait]
impl RestoreItemActionV2 for EchoRestore {
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError> {
        Ok(ResourceSelector::resources(["persistentvolumeclaims"]))
    }

    async fn execute(&self, input: RestoreItemInput) -> Result<RestoreItemOutputV2, PluginError> {
        let name = name_of(&input.item, "item")?;
        let namespace = input.item.namespace().unwrap_or_default().to_owned();
        let restore = name_of(&input.restore, "restore")?;
        Ok(RestoreItemOutputV2 {
            item: Some(annotate(&input.item, "ferry.dev/restored-by", &restore)),
            additional_items: volume_of(&input.item_from_backup).into_iter().collect(),
            skip_restore: false,
            operation_id: Some(format!("echo-restore/{namespace}/{name}")),
            wait_for_additional_items: true,
            additional_items_ready_timeout: Some(Duration::from_secs(90)),
        })
    }

    async fn progress(
        &self,
        id: &str,
        restore: &JsonObject,
    ) -> Result<OperationProgress, PluginError> {
        let owner = format!("restore {}", name_of(restore, "restore")?);
        echo_progress(&self.cancelled, "echo-restore", id, "restored", &owner)
    }

    async fn cancel(&self, id: &str, restore: &JsonObject) -> Result<(), PluginError> {
        self.progress(id, restore).await?;
        self.cancelled.add(id);
        Ok(())
    }

    async fn are_additional_items_ready(
        &self,
        items: &[ResourceIdentifier],
        _: &JsonObject,
    ) -> Result<bool, PluginError> {
        Ok(items.iter().all(|i| !i.name.starts_with("pending-")))
    }
}

struct EchoRestoreV1;

#[async_trait]
impl RestoreItemAction for EchoRestoreV1 {
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError> {
        Ok(ResourceSelector::resources(["configmaps"]))
    }

    async fn execute(&self, input: RestoreItemInput) -> Result<RestoreItemOutput, PluginError> {
        let restore = name_of(&input.restore, "restore")?;
        Ok(RestoreItemOutput {
            skip_restore: input.item.label("ferry.dev/skip") == Some("true"),
            item: Some(annotate(&input.item, "ferry.dev/restored-by-v1", &restore)),
            additional_items: Vec::new(),
        })
    }
}

struct EchoDelete;

#[async_trait]
impl DeleteItemAction for EchoDelete {
    async fn applies_to(&self) -> Result<ResourceSelector, PluginError> {
        Ok(ResourceSelector::resources(["datauploads.velero.io"]))
    }

    async fn execute(&self, input: DeleteItemInput) -> Result<(), PluginError> {
        if input.item.annotation("ferry.dev/fail-delete").is_some() {
            return Err(PluginError::failed(format!(
                "refusing to delete {} as its ferry.dev/fail-delete annotation asks",
                name_of(&input.item, "item")?
            )));
        }
        Ok(())
    }
}

#[derive(Default)]
struct EchoSnapshotter {
    config: Mutex<Option<BTreeMap<String, String>>>,
    cancelled: Cancelled,
}

impl EchoSnapshotter {
    fn require_init(&self) -> Result<(), PluginError> {
        match &*self.config.lock().unwrap_or_else(|e| e.into_inner()) {
            Some(_) => Ok(()),
            None => Err(PluginError::failed("Init has not been called")),
        }
    }
}

#[async_trait]
impl VolumeSnapshotter for EchoSnapshotter {
    async fn init(&self, config: BTreeMap<String, String>) -> Result<(), PluginError> {
        if !config.contains_key("region") {
            return Err(PluginError::invalid_input("the config has no region"));
        }
        *self.config.lock().unwrap_or_else(|e| e.into_inner()) = Some(config);
        Ok(())
    }

    async fn create_volume_from_snapshot(&self, volume: NewVolume) -> Result<String, PluginError> {
        self.require_init()?;
        Ok(format!("vol-from-{}", volume.snapshot_id))
    }

    async fn get_volume_info(&self, _: &str, _: &str) -> Result<VolumeInfo, PluginError> {
        Ok(VolumeInfo { volume_type: "gp3".into(), iops: Some(3000) })
    }

    async fn create_snapshot(
        &self,
        volume_id: &str,
        _: &str,
        _: BTreeMap<String, String>,
    ) -> Result<String, PluginError> {
        self.require_init()?;
        Ok(format!("snap-{volume_id}"))
    }

    async fn delete_snapshot(&self, _: &str) -> Result<(), PluginError> {
        Ok(())
    }

    async fn get_volume_id(&self, pv: &JsonObject) -> Result<String, PluginError> {
        pv.str_at("/spec/csi/volumeHandle")
            .map(str::to_owned)
            .ok_or_else(|| PluginError::invalid_input("the PV has no spec.csi.volumeHandle"))
    }

    async fn set_volume_id(&self, pv: JsonObject, volume_id: &str) -> Result<Value, PluginError> {
        let mut v = pv.into_value();
        let csi = v
            .pointer_mut("/spec/csi")
            .and_then(Value::as_object_mut)
            .ok_or_else(|| PluginError::invalid_input("the PV has no spec.csi"))?;
        csi.insert("volumeHandle".into(), json!(volume_id));
        Ok(v)
    }
}

#[async_trait]
impl VolumeSnapshotterV2 for EchoSnapshotter {
    async fn progress(&self, snapshot_id: &str) -> Result<OperationProgress, PluginError> {
        if !snapshot_id.starts_with("snap-") {
            return Err(PluginError::not_found(format!("snapshot {snapshot_id:?}")));
        }
        if self.cancelled.contains(snapshot_id) {
            return Ok(OperationProgress {
                error: Some("cancelled by the host".into()),
                ..OperationProgress::completed()
            });
        }
        Ok(OperationProgress {
            completed: true,
            n_completed: 1,
            n_total: 1,
            operation_units: "snapshots".into(),
            description: format!("snapshot {snapshot_id} taken"),
            ..OperationProgress::default()
        })
    }

    async fn cancel(&self, operation_id: &str) -> Result<(), PluginError> {
        self.progress(operation_id).await?;
        self.cancelled.add(operation_id);
        Ok(())
    }
}

fn server() -> Result<PluginServer, RegisterError> {
    let v1_backup = Arc::new(EchoBackupV1);
    let snapshotter = Arc::new(EchoSnapshotter::default());
    let mut server = PluginServer::new();
    server
        .register_backup_item_action_v2("ferry.dev/echo-backup", Arc::new(EchoBackup::default()))?
        .register_backup_item_action("ferry.dev/echo-backup-v1", v1_backup.clone())?
        .register_backup_item_action_v2(
            "ferry.dev/echo-backup-v1-adapted",
            Arc::new(AdaptedBackupItemAction::new(v1_backup)),
        )?
        .register_restore_item_action_v2(
            "ferry.dev/echo-restore",
            Arc::new(EchoRestore::default()),
        )?
        .register_restore_item_action("ferry.dev/echo-restore-v1", Arc::new(EchoRestoreV1))?
        .register_delete_item_action("ferry.dev/echo-delete", Arc::new(EchoDelete))?
        .register_volume_snapshotter("ferry.dev/echo-snapshotter", snapshotter.clone())?
        .register_volume_snapshotter_v2("ferry.dev/echo-snapshotter", snapshotter)?;
    Ok(server)
}

fn main() -> ExitCode {
    let args = HostArgs::parse(std::env::args_os().skip(1));
    // Velero's level for this plugin and the SDK; the gRPC stack's own chatter stays at info.
    let level = args.tracing_level().unwrap_or(tracing::Level::INFO);
    let filter = tracing_subscriber::EnvFilter::new(format!(
        "info,ferry_plugin={level},ferry_plugin_example={level}"
    ));
    tracing_subscriber::fmt()
        .with_writer(std::io::stderr)
        .with_ansi(false)
        .with_env_filter(filter)
        .init();
    tracing::debug!(ignored = ?args.ignored, features = ?args.features, "command line");

    if let Err(e) = ferry_plugin::check_environment() {
        eprintln!("ferry-plugin-example: {e}");
        return ExitCode::FAILURE;
    }
    let server = match server() {
        Ok(server) => server,
        Err(e) => {
            eprintln!("ferry-plugin-example: {e}");
            return ExitCode::FAILURE;
        }
    };
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(2).enable_all().build() {
            Ok(runtime) => runtime,
            Err(e) => {
                eprintln!("ferry-plugin-example: starting the async runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
    match runtime.block_on(server.serve()) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            let mut message = e.to_string();
            let mut source = std::error::Error::source(&e);
            while let Some(s) = source {
                message.push_str(&format!(": {s}"));
                source = s.source();
            }
            eprintln!("ferry-plugin-example: {message}");
            ExitCode::FAILURE
        }
    }
}
