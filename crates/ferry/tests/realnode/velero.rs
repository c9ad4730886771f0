//! The real `velero server` (v1.18.3, with its AWS plugin and its own CRDs) drives Ferry on the
//! real node, run as in a cluster: inside the node's network (it reaches the API at the
//! `kubernetes` Service and S3 where pods do). Every scenario requires the storage location
//! `Available` by Velero's own validation after Ferry stored into it.
//!
//! - `velero backup create --snapshot-move-data --data-mover ferry` of a file-system and a
//!   block PVC, `describe --details` and `logs` showing Ferry's work, `velero restore create`
//!   into another namespace, then in place after the application's namespace was deleted, the
//!   data compared by pods; `velero backup delete` makes the agent forget the snapshots.
//! - A Schedule named with 63 characters run twice (the second incremental), restored, its
//!   first backup deleted (only that backup's snapshots forgotten).
//! - Ferry's plugin installed in Velero: one item operation per volume, deletion still whole.
//! - The Velero server killed while Ferry moves a backup's data, then started again.

use std::collections::BTreeSet;
use std::panic::AssertUnwindSafe;
use std::pin::Pin;
use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::{Namespace, PersistentVolumeClaim, Pod};
use ferry_api::{DataUpload, DataUploadPhase};
use ferry_testbed::VELERO_NAMESPACE;
use ferry_testbed::velero::{self, VeleroOptions, VeleroServer};
use futures::FutureExt as _;
use kube::api::{Api, ApiResource, DynamicObject, ListParams};
use kube::{Client, ResourceExt};

use crate::holder;
use crate::node::{self, TestResult, WAIT};
use crate::round_trip::{BLOCK_MANIFEST, BLOCK_WRITE, FS_MANIFEST, FS_WRITE};

/// The server's options: Velero's own credentials are those of the node's default location.
fn velero_options() -> VeleroOptions {
    VeleroOptions::with_credentials(node::CREDENTIALS.0, node::CREDENTIALS.1)
}

fn velero_api<K: kube::Resource<DynamicType = ()>>(client: &Client) -> Api<DynamicObject> {
    Api::namespaced_with(client.clone(), VELERO_NAMESPACE, &ApiResource::erase::<K>(&()))
}

/// The phase of a Backup or Restore.
async fn phase<K: kube::Resource<DynamicType = ()>>(
    client: &Client,
    name: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let object = velero_api::<K>(client).get(name).await?;
    Ok(object.data["status"]["phase"].as_str().unwrap_or_default().to_owned())
}

/// Waits until Velero has validated location `default` since `after`, and requires it
/// `Available`.
async fn location_available(client: &Client, after: jiff::Timestamp) -> TestResult {
    let api = velero_api::<ferry_api::BackupStorageLocation>(client);
    let deadline = Instant::now() + WAIT;
    loop {
        let status = api.get(node::BSL).await?.data["status"].clone();
        let validated =
            status["lastValidationTime"].as_str().and_then(|t| t.parse::<jiff::Timestamp>().ok());
        if validated.is_some_and(|v| v > after) {
            let phase = status["phase"].as_str().unwrap_or_default();
            return if phase == "Available" {
                Ok(())
            } else {
                Err(format!("location {} is {phase:?}: {status}", node::BSL).into())
            };
        }
        if Instant::now() > deadline {
            return Err(format!(
                "Velero did not validate location {} in time: {status}",
                node::BSL
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// The application: a file-system PVC `files` holding a small tree and a block PVC `disk`
/// holding random data; returns their manifests as pods read them.
async fn workload(
    client: &Client,
    ns: &str,
) -> Result<(String, String), Box<dyn std::error::Error>> {
    node::create_pvc(client, ns, "files", "64Mi", "Filesystem").await?;
    node::create_pvc(client, ns, "disk", "32Mi", "Block").await?;
    let tree =
        node::run_pod(client, ns, "files", false, &format!("{FS_WRITE}\n{FS_MANIFEST}")).await?;
    let device =
        node::run_pod(client, ns, "disk", true, &format!("{BLOCK_WRITE}\n{BLOCK_MANIFEST}"))
            .await?;
    Ok((tree, device))
}

/// Requires namespace `ns` to hold the workload's volumes with these manifests.
async fn restored(client: &Client, ns: &str, tree: &str, device: &str) -> TestResult {
    assert_eq!(node::run_pod(client, ns, "files", false, FS_MANIFEST).await?, tree, "in {ns}");
    assert_eq!(node::run_pod(client, ns, "disk", true, BLOCK_MANIFEST).await?, device, "in {ns}");
    Ok(())
}

/// `velero restore create --from-backup BACKUP --namespace-mappings NS:NS-restored --wait`:
/// the restore `Completed` and the volumes in `NS-restored` holding `(tree, device)`.
async fn restore_mapped(
    client: &Client,
    server: &VeleroServer,
    ns: &str,
    backup: &str,
    (tree, device): (&str, &str),
) -> TestResult {
    let target = format!("{ns}-restored");
    let mapping = format!("{ns}:{target}");
    let restore = format!("{backup}-r");
    let out = server.cli(
        &[
            "restore",
            "create",
            &restore,
            "--from-backup",
            backup,
            "--namespace-mappings",
            &mapping,
            "--wait",
        ],
        WAIT,
    )?;
    let done = phase::<ferry_api::Restore>(client, &restore).await?;
    assert_eq!(done, "Completed", "{out}\n{}", server.log_tail(40));
    restored(client, &target, tree, device).await
}

/// `velero backup create NAME --include-namespaces NS --snapshot-move-data --data-mover ferry`
/// with `extra` arguments.
fn backup_args<'a>(name: &'a str, ns: &'a str, extra: &[&'a str]) -> Vec<&'a str> {
    let mut args = vec![
        "backup",
        "create",
        name,
        "--include-namespaces",
        ns,
        "--snapshot-move-data",
        "--data-mover",
        "ferry",
    ];
    args.extend_from_slice(extra);
    args
}

/// The DataUploads Velero made for `backup` (its label value is cut and hashed past 63
/// characters, as Velero does).
async fn uploads_of(
    client: &Client,
    backup: &str,
) -> Result<Vec<DataUpload>, Box<dyn std::error::Error>> {
    let label = format!("velero.io/backup-name={}", ferry_api::naming::valid_label_value(backup));
    Ok(Api::<DataUpload>::namespaced(client.clone(), VELERO_NAMESPACE)
        .list(&ListParams::default().labels(&label))
        .await?
        .items)
}

/// The IDs of the snapshots in namespace `ns`'s repository.
async fn snapshot_ids(
    node: &node::Node,
    ns: &str,
) -> Result<BTreeSet<String>, Box<dyn std::error::Error>> {
    let listed: Vec<serde_json::Value> =
        serde_json::from_str(&node.ferry(ns, &["snapshots", "--json"]).await?)?;
    Ok(listed.iter().filter_map(|s| s["id"].as_str().map(str::to_owned)).collect())
}

/// Waits until namespace `ns`'s repository holds exactly `count` snapshots; returns their IDs.
async fn wait_snapshots(
    node: &node::Node,
    server: &VeleroServer,
    ns: &str,
    count: usize,
) -> Result<BTreeSet<String>, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let ids = snapshot_ids(node, ns).await?;
        if ids.len() == count {
            return Ok(ids);
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} snapshots in {ns}'s repository after {WAIT:?}, not {count}: {ids:?}\n{}",
                ids.len(),
                server.log_tail(30)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// The bytes of the packs in namespace `ns`'s repository.
async fn pack_bytes(node: &node::Node, ns: &str) -> Result<u64, Box<dyn std::error::Error>> {
    let stats: serde_json::Value =
        serde_json::from_str(&node.ferry(ns, &["stats", "--json"]).await?)?;
    stats["pack_bytes"].as_u64().ok_or_else(|| format!("no pack_bytes in {stats}").into())
}

/// Waits until the agent has collected the space of namespace `ns`'s forgotten snapshots:
/// under a tenth of the `before` bytes of packs left.
async fn wait_collected(
    node: &node::Node,
    server: &VeleroServer,
    ns: &str,
    before: u64,
) -> TestResult {
    let deadline = Instant::now() + WAIT;
    loop {
        let left = pack_bytes(node, ns).await?;
        if left * 10 < before {
            return Ok(());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "space not collected in {ns}'s repository: {left} of {before} bytes of packs left\n{}",
                server.log_tail(20)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_secs(1)).await;
    }
}

/// `velero backup delete NAME --confirm`, then waits until the Backup is gone (see
/// [`VeleroServer::delete_backup`]).
async fn delete_backup(client: &Client, server: &VeleroServer, backup: &str) -> TestResult {
    Ok(server.delete_backup(client, backup, WAIT).await?)
}

/// The incremental (newly stored) bytes of these DataUploads.
fn new_bytes(uploads: &[DataUpload]) -> i64 {
    uploads.iter().map(|d| d.status.as_ref().map_or(0, |s| s.incremental_bytes)).sum()
}

/// A scenario: its name and the test it runs.
type Scenario = (&'static str, fn() -> Pin<Box<dyn Future<Output = TestResult>>>);

/// Every scenario, one after another, each even after another failed (a panic included); the
/// error names each one that failed. One Velero server runs at a time: Velero's namespace is
/// fixed, its controller manager always listens on port 8080 of the node's network, and two
/// servers would both act on every Backup.
pub async fn each_scenario_in_turn() -> TestResult {
    let scenarios: [Scenario; 4] = [
        ("velero_backs_up_and_restores_through_ferry_on_the_real_node", || {
            Box::pin(velero_backs_up_and_restores_through_ferry_on_the_real_node())
        }),
        ("a_schedule_with_a_63_character_name_runs_twice_and_restores_on_the_real_node", || {
            Box::pin(a_schedule_with_a_63_character_name_runs_twice_and_restores_on_the_real_node())
        }),
        ("with_ferrys_plugin_each_volume_is_one_operation_on_the_real_node", || {
            Box::pin(with_ferrys_plugin_each_volume_is_one_operation_on_the_real_node())
        }),
        ("velero_restarted_while_ferry_moves_the_data_on_the_real_node", || {
            Box::pin(velero_restarted_while_ferry_moves_the_data_on_the_real_node())
        }),
    ];
    let total = scenarios.len();
    let mut failed = Vec::new();
    for (name, scenario) in scenarios {
        let started = Instant::now();
        eprintln!("velero scenario {name}: started");
        let outcome = match AssertUnwindSafe(scenario()).catch_unwind().await {
            Ok(Ok(())) => None,
            // Debug: with the causes of a contextual error, as libtest prints a test's error.
            Ok(Err(e)) => Some(format!("{e:?}")),
            Err(panic) => Some(
                panic
                    .downcast_ref::<String>()
                    .cloned()
                    .or_else(|| panic.downcast_ref::<&str>().map(|m| (*m).to_owned()))
                    .map_or_else(|| "panicked".to_owned(), |m| format!("panicked: {m}")),
            ),
        };
        let took = started.elapsed().as_secs();
        match outcome {
            None => eprintln!("velero scenario {name}: passed after {took} s"),
            Some(why) => {
                eprintln!("velero scenario {name}: FAILED after {took} s: {why}");
                failed.push(format!("{name}: {why}"));
            }
        }
    }
    if failed.is_empty() {
        return Ok(());
    }
    Err(format!("{} of {total} Velero scenarios failed:\n{}", failed.len(), failed.join("\n"))
        .into())
}

async fn velero_backs_up_and_restores_through_ferry_on_the_real_node() -> TestResult {
    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    velero::install_crds(node.cluster.control_plane())?;
    let mut server = VeleroServer::start_on_node(node.cluster, &velero_options())?;

    let ns = node.namespace("shop").await?;
    let (tree, device) = workload(&client, &ns).await?;
    let backup = format!("{ns}-b1");
    let out = server.cli(&backup_args(&backup, &ns, &["--wait"]), WAIT)?;
    let backed_up = phase::<ferry_api::Backup>(&client, &backup).await?;
    assert_eq!(backed_up, "Completed", "{out}\n{}", server.log_tail(40));
    let uploads = uploads_of(&client, &backup).await?;
    assert_eq!(uploads.len(), 2, "one DataUpload per PVC, by Velero's CSI plugin");
    assert!(uploads.iter().all(|du| du.spec.data_mover == "ferry"));
    location_available(&client, jiff::Timestamp::now()).await?;

    // Velero shows Ferry's work: each volume's operation with the bytes Ferry moved, and the
    // DataUploads in the backup's log (which the CLI reads from the location).
    let details = server.cli(&["backup", "describe", &backup, "--details"], WAIT)?;
    for du in &uploads {
        let done = du.status.as_ref().map_or(0, |s| s.progress.bytes_done);
        assert!(done > 0, "{du:?}");
        assert!(
            details.contains(&format!("{done} of {done} complete")),
            "describe --details does not show the {done} bytes Ferry moved for {}:\n{details}",
            du.name_any()
        );
    }
    let logs = server.cli(&["backup", "logs", &backup], WAIT)?;
    for du in &uploads {
        let operation =
            du.labels().get("velero.io/async-operation-id").cloned().unwrap_or_default();
        assert!(
            !operation.is_empty() && logs.contains(&format!("Operation ID={operation}")),
            "the backup log does not show the operation of {} ({operation:?})",
            du.name_any()
        );
    }
    assert!(logs.contains("DataUpload is submitted successfully"), "backup log:\n{logs}");

    restore_mapped(&client, &server, &ns, &backup, (&tree, &device)).await?;
    location_available(&client, jiff::Timestamp::now()).await?;

    // Disaster: the application's namespace is deleted (its PVCs and volumes with it), then
    // restored from the same backup in place.
    let namespaces: Api<Namespace> = Api::all(client.clone());
    namespaces.delete(&ns, &Default::default()).await?;
    let deadline = Instant::now() + WAIT;
    while namespaces.get_opt(&ns).await?.is_some() {
        assert!(Instant::now() < deadline, "namespace {ns} not gone after {WAIT:?}");
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    let restore = format!("{ns}-r2");
    let out =
        server.cli(&["restore", "create", &restore, "--from-backup", &backup, "--wait"], WAIT)?;
    let done = phase::<ferry_api::Restore>(&client, &restore).await?;
    assert_eq!(done, "Completed", "{out}\n{}", server.log_tail(40));
    restored(&client, &ns, &tree, &device).await?;
    location_available(&client, jiff::Timestamp::now()).await?;

    // `velero backup delete` with Ferry as installed (no plugin of Ferry's in Velero): the
    // agent forgets the backup's snapshots once Velero has deleted the backup.
    assert_eq!(snapshot_ids(node, &ns).await?.len(), 2, "one snapshot per PVC");
    let stored = pack_bytes(node, &ns).await?;
    delete_backup(&client, &server, &backup).await?;
    wait_snapshots(node, &server, &ns, 0).await?;
    wait_collected(node, &server, &ns, stored).await?;
    location_available(&client, jiff::Timestamp::now()).await?;
    server.kill();
    Ok(())
}

/// A Schedule with a 63-character name, run twice (the second backup incremental), restored
/// from its second run; then its first backup deleted. The backups' names exceed 63
/// characters, so their `velero.io/backup-name` labels are cut and hashed: the agent goes by
/// the DataUploads' owner and forgets only the first run's snapshots.
async fn a_schedule_with_a_63_character_name_runs_twice_and_restores_on_the_real_node() -> TestResult
{
    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    velero::install_crds(node.cluster.control_plane())?;
    let mut server = VeleroServer::start_on_node(node.cluster, &velero_options())?;
    let ns = node.namespace("sched").await?;
    workload(&client, &ns).await?;

    let schedule = format!("{ns}-{}", "s".repeat(62 - ns.len()));
    assert_eq!(schedule.len(), 63);
    server.cli(
        &[
            "schedule",
            "create",
            &schedule,
            "--schedule",
            "@every 24h",
            "--include-namespaces",
            &ns,
            "--snapshot-move-data",
            "--data-mover",
            "ferry",
        ],
        WAIT,
    )?;
    // Velero v1.18 runs a new schedule first at its next time, not at once: both runs are
    // asked for as `velero backup create --from-schedule` does.
    server.cli(&["backup", "create", "--from-schedule", &schedule, "--wait"], WAIT)?;
    let first = schedule_backups(&client, &server, &schedule, 1).await?.remove(0);
    // A change between the runs; the manifest is the tree the second run backs up.
    let tree = node::run_pod(
        &client,
        &ns,
        "files",
        false,
        &format!("set -e; dd if=/dev/urandom of=/data/second-run bs=1k count=8 2>/dev/null; sync\n{FS_MANIFEST}"),
    )
    .await?;
    let device = node::run_pod(&client, &ns, "disk", true, BLOCK_MANIFEST).await?;
    server.cli(&["backup", "create", "--from-schedule", &schedule, "--wait"], WAIT)?;
    let second = schedule_backups(&client, &server, &schedule, 2)
        .await?
        .into_iter()
        .find(|b| *b != first)
        .ok_or("no second backup")?;
    assert!(second.len() > 63, "{second}");
    location_available(&client, jiff::Timestamp::now()).await?;
    let (of_first, of_second) =
        (uploads_of(&client, &first).await?, uploads_of(&client, &second).await?);
    assert_eq!((of_first.len(), of_second.len()), (2, 2), "{of_first:#?}\n{of_second:#?}");
    assert!(
        new_bytes(&of_second) * 4 < new_bytes(&of_first),
        "the second run is not incremental: {} new bytes after {}",
        new_bytes(&of_second),
        new_bytes(&of_first)
    );

    restore_mapped(&client, &server, &ns, &second, (&tree, &device)).await?;

    // Deleting the first run forgets its snapshots only.
    assert_eq!(snapshot_ids(node, &ns).await?.len(), 4);
    delete_backup(&client, &server, &first).await?;
    let kept = wait_snapshots(node, &server, &ns, 2).await?;
    for du in &of_second {
        let id = du.status.as_ref().map(|s| s.snapshot_id.clone()).unwrap_or_default();
        assert!(kept.contains(&id), "the second run's snapshot {id} was forgotten: {kept:?}");
    }
    location_available(&client, jiff::Timestamp::now()).await?;
    delete_backup(&client, &server, &second).await?;
    wait_snapshots(node, &server, &ns, 0).await?;
    location_available(&client, jiff::Timestamp::now()).await?;
    server.cli(&["schedule", "delete", &schedule, "--confirm"], WAIT)?;
    server.kill();
    Ok(())
}

/// Waits until `count` Backups of Schedule `schedule` are Completed; returns their names,
/// oldest first.
async fn schedule_backups(
    client: &Client,
    server: &VeleroServer,
    schedule: &str,
    count: usize,
) -> Result<Vec<String>, Box<dyn std::error::Error>> {
    let label =
        format!("velero.io/schedule-name={}", ferry_api::naming::valid_label_value(schedule));
    let deadline = Instant::now() + WAIT;
    loop {
        let mut done: Vec<(String, String)> = velero_api::<ferry_api::Backup>(client)
            .list(&ListParams::default().labels(&label))
            .await?
            .items
            .into_iter()
            .filter(|b| b.data["status"]["phase"] == "Completed")
            .map(|b| {
                let created = b
                    .metadata
                    .creation_timestamp
                    .as_ref()
                    .map(|t| t.0.to_string())
                    .unwrap_or_default();
                (created, b.name_any())
            })
            .collect();
        if done.len() >= count {
            done.sort();
            return Ok(done.into_iter().map(|(_, name)| name).collect());
        }
        if Instant::now() > deadline {
            return Err(format!(
                "{} of {count} backups of schedule {schedule} Completed\n{}",
                done.len(),
                server.log_tail(40)
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// With Ferry's plugin in Velero's plugin folder (as the chart's init container installs it)
/// beside Velero's CSI support, each volume is still one item operation (the plugin registers
/// no PVC action of its own), the restore works, and `velero backup delete` still forgets the
/// snapshots and collects their space (whichever of the plugin and the agent's finalizer
/// gets there first: both are installed as users install them).
async fn with_ferrys_plugin_each_volume_is_one_operation_on_the_real_node() -> TestResult {
    let node = node::node();
    let _agent = node::AGENT.read().await;
    let client = node.client()?;
    velero::install_crds(node.cluster.control_plane())?;
    let options = VeleroOptions {
        plugins: vec![(
            "velero-plugin-ferry".to_owned(),
            std::path::PathBuf::from(env!("CARGO_BIN_EXE_ferry")),
        )],
        ..velero_options()
    };
    let mut server = VeleroServer::start_on_node(node.cluster, &options)?;
    let ns = node.namespace("plugin").await?;
    let (tree, device) = workload(&client, &ns).await?;
    let backup = format!("{ns}-b1");
    let out = server.cli(&backup_args(&backup, &ns, &["--wait"]), WAIT)?;
    assert_eq!(phase::<ferry_api::Backup>(&client, &backup).await?, "Completed", "{out}");
    let status =
        velero_api::<ferry_api::Backup>(&client).get(&backup).await?.data["status"].clone();
    assert_eq!(status["backupItemOperationsAttempted"], 2, "{status}\n{}", server.log_tail(40));
    assert_eq!(status["backupItemOperationsCompleted"], 2, "{status}");
    assert_eq!(uploads_of(&client, &backup).await?.len(), 2);
    assert!(
        server.log().contains("velero-plugin-ferry"),
        "Velero did not load Ferry's plugin:\n{}",
        server.log_tail(40)
    );
    location_available(&client, jiff::Timestamp::now()).await?;

    restore_mapped(&client, &server, &ns, &backup, (&tree, &device)).await?;

    assert_eq!(snapshot_ids(node, &ns).await?.len(), 2);
    let stored = pack_bytes(node, &ns).await?;
    delete_backup(&client, &server, &backup).await?;
    wait_snapshots(node, &server, &ns, 0).await?;
    wait_collected(node, &server, &ns, stored).await?;
    location_available(&client, jiff::Timestamp::now()).await?;
    server.kill();
    Ok(())
}

/// The Velero server killed (with its plugins, as a lost pod) while Ferry works for a backup,
/// then started again, at the two moments Velero's restart rules tell apart:
/// - while the backup is `InProgress` (killed as soon as Velero has handed a volume to Ferry):
///   Velero marks it `Failed`; Ferry ends every DataUpload (Completed, or Canceled when
///   Velero cancels the failed backup's operations) and keeps no holding pod or PVC;
/// - while it is `WaitingForPluginOperations` (held there for certain: a transfer stalled by
///   its location's network takes the node's one data-movement slot): the new server polls
///   the operations again, the backup completes once Ferry has moved the data, and it
///   restores.
///
/// Deleting each backup makes the agent forget whatever it recorded.
async fn velero_restarted_while_ferry_moves_the_data_on_the_real_node() -> TestResult {
    let node = node::node();
    // Alone: the stalled transfer holds the node's only data-movement slot.
    let _agent = node::AGENT.write().await;
    let client = node.client()?;
    velero::install_crds(node.cluster.control_plane())?;
    let mut server = VeleroServer::start_on_node(node.cluster, &velero_options())?;
    let ns = node.namespace("restart").await?;
    let (tree, device) = workload(&client, &ns).await?;

    // Killed while InProgress, as soon as Velero has handed a volume to Ferry; Ferry finishes
    // what it was given while no Velero runs. Deleting the failed backup at once then finds
    // each Completed DataUpload's snapshot held from its completion, and forgets it.
    let b1 = format!("{ns}-b1");
    server.cli(&backup_args(&b1, &ns, &[]), WAIT)?;
    let deadline = Instant::now() + WAIT;
    while uploads_of(&client, &b1).await?.is_empty() {
        assert!(Instant::now() < deadline, "no DataUpload\n{}", server.log_tail(40));
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    server.kill();
    let at_kill = phase::<ferry_api::Backup>(&client, &b1).await?;
    // Velero makes the DataUploads while it backs up the items, one volume at a time.
    assert_eq!(at_kill, "InProgress", "killed too late: {b1} was already {at_kill}");
    for du in uploads_of(&client, &b1).await? {
        node::wait_upload(&client, &du.name_any()).await?;
    }
    server = VeleroServer::start_on_node(node.cluster, &velero_options())?;
    let ended = backup_ended(&client, &server, &b1).await?;
    assert_eq!(ended, "Failed", "killed while InProgress\n{}", server.log_tail(40));
    let completed = uploads_ended_and_released(&client, &server, &b1).await?;
    assert!(completed > 0, "Ferry completed the upload it had");
    eprintln!(
        "Velero killed while {b1} was {at_kill}; it ended {ended}; {completed} DataUploads Completed"
    );
    location_available(&client, jiff::Timestamp::now()).await?;
    assert_eq!(snapshot_ids(node, &ns).await?.len(), completed);
    delete_backup(&client, &server, &b1).await?;
    wait_snapshots(node, &server, &ns, 0).await?;

    // Killed while WaitingForPluginOperations: the node's slot is taken by a transfer
    // stalled part-way, so the backup's DataUploads wait and Velero waits for them.
    let gate = holder::gate(node).await?;
    let reopen = holder::Reopen(gate);
    let other = node.namespace("blocker").await?;
    node::create_pvc(&client, &other, "blocker", "256Mi", "Block").await?;
    node::run_pod(&client, &other, "blocker", true, holder::WRITE_DEVICE).await?;
    let snapshot = node::snapshot(&client, &other, "blocker").await?;
    gate.close();
    let blocker =
        node::data_upload_to(&client, holder::GATED_BSL, &other, "blocker", &snapshot, "blocker")
            .await?;
    let blocker = node::name_of(&blocker);
    holder::stall_mid_transfer::<DataUpload>(&client, &blocker, gate).await?;
    let b2 = format!("{ns}-b2");
    server.cli(&backup_args(&b2, &ns, &[]), WAIT)?;
    let deadline = Instant::now() + WAIT;
    loop {
        let phase = phase::<ferry_api::Backup>(&client, &b2).await?;
        if phase == "WaitingForPluginOperations" {
            break;
        }
        assert!(
            ["", "New", "Queued", "ReadyToStart", "InProgress"].contains(&phase.as_str())
                && Instant::now() < deadline,
            "{b2} is {phase}, not waiting for Ferry\n{}",
            server.log_tail(40)
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    let waiting = uploads_of(&client, &b2).await?;
    assert_eq!(waiting.len(), 2, "{waiting:#?}");
    assert!(
        waiting
            .iter()
            .all(|du| du.status.as_ref().and_then(|s| s.phase) != Some(DataUploadPhase::Completed)),
        "{b2}'s uploads should wait for the slot: {waiting:#?}"
    );
    server.kill();
    server = VeleroServer::start_on_node(node.cluster, &velero_options())?;
    drop(reopen);
    node::wait_upload(&client, &blocker).await?;
    let ended = backup_ended(&client, &server, &b2).await?;
    assert_eq!(
        ended,
        "Completed",
        "killed while WaitingForPluginOperations\n{}",
        server.log_tail(40)
    );
    assert_eq!(uploads_ended_and_released(&client, &server, &b2).await?, 2);
    restore_mapped(&client, &server, &ns, &b2, (&tree, &device)).await?;
    location_available(&client, jiff::Timestamp::now()).await?;
    assert_eq!(snapshot_ids(node, &ns).await?.len(), 2, "b2's files and disk");
    delete_backup(&client, &server, &b2).await?;
    wait_snapshots(node, &server, &ns, 0).await?;
    location_available(&client, jiff::Timestamp::now()).await?;
    node::no_leaked_devices(node).await
}

/// Waits until Backup `backup` has ended; returns its phase.
async fn backup_ended(
    client: &Client,
    server: &VeleroServer,
    backup: &str,
) -> Result<String, Box<dyn std::error::Error>> {
    let deadline = Instant::now() + WAIT;
    loop {
        let phase = phase::<ferry_api::Backup>(client, backup).await?;
        if ["Completed", "Failed", "PartiallyFailed"].contains(&phase.as_str()) {
            return Ok(phase);
        }
        if Instant::now() > deadline {
            return Err(format!("{backup} still {phase}\n{}", server.log_tail(40)).into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}

/// Waits until every DataUpload of `backup` has ended Completed or Canceled (when Velero
/// canceled a failed backup's operations) and Ferry holds no pod or PVC for any; returns how
/// many Completed.
async fn uploads_ended_and_released(
    client: &Client,
    server: &VeleroServer,
    backup: &str,
) -> Result<usize, Box<dyn std::error::Error>> {
    let pods: Api<Pod> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let snapshots: Api<ferry_api::VolumeSnapshot> =
        Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let contents: Api<ferry_api::VolumeSnapshotContent> = Api::all(client.clone());
    let deadline = Instant::now() + WAIT;
    loop {
        let uploads = uploads_of(client, backup).await?;
        let mut left = Vec::new();
        for du in &uploads {
            let phase = du.status.as_ref().and_then(|s| s.phase);
            if !matches!(phase, Some(DataUploadPhase::Completed | DataUploadPhase::Canceled)) {
                left.push(format!("{} {phase:?}", du.name_any()));
            }
            let holder = ferry_api::naming::valid_label_value(&du.name_any());
            if pods.get_opt(&holder).await?.is_some() {
                left.push(format!("holding pod {holder}"));
            }
            if pvcs.get_opt(&du.name_any()).await?.is_some() {
                left.push(format!("backup PVC {}", du.name_any()));
            }
            if snapshots.get_opt(&du.name_any()).await?.is_some() {
                left.push(format!("backup VolumeSnapshot {}", du.name_any()));
            }
            if contents.get_opt(&du.name_any()).await?.is_some() {
                left.push(format!("backup VolumeSnapshotContent {}", du.name_any()));
            }
            if du.finalizers().iter().any(|f| f == ferry_api::keys::DATA_UPLOAD_DOWNLOAD_FINALIZER)
            {
                left.push(format!("the agent's finalizer on {}", du.name_any()));
            }
        }
        if uploads.is_empty() {
            left.push(format!("no DataUpload of {backup}"));
        }
        if left.is_empty() {
            return Ok(uploads
                .iter()
                .filter(|du| {
                    du.status.as_ref().and_then(|s| s.phase) == Some(DataUploadPhase::Completed)
                })
                .count());
        }
        if Instant::now() > deadline {
            return Err(
                format!("{WAIT:?} after the restart: {left:?}\n{}", server.log_tail(40)).into()
            );
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
