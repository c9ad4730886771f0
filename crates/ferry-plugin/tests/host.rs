//! The example plugin launched exactly as Velero launches plugins (environment, extra flags,
//! handshake over stdout, gRPC over the Unix socket), driven by a Rust host.
#![allow(clippy::unwrap_used)]

mod support;

use std::collections::HashMap;
use std::time::Duration;

use ferry_proto::generated::backup_item_action_client::BackupItemActionClient as BackupV1Client;
use ferry_proto::generated::delete_item_action_client::DeleteItemActionClient;
use ferry_proto::generated::plugin_lister_client::PluginListerClient;
use ferry_proto::generated::restore_item_action_client::RestoreItemActionClient as RestoreV1Client;
use ferry_proto::generated::volume_snapshotter_client::VolumeSnapshotterClient as SnapshotterV1Client;
use ferry_proto::plugin::grpc_broker_client::GrpcBrokerClient;
use ferry_proto::plugin::grpc_controller_client::GrpcControllerClient;
use ferry_proto::plugin::grpc_stdio_client::GrpcStdioClient;
use ferry_proto::v2::backup_item_action_client::BackupItemActionClient;
use ferry_proto::v2::restore_item_action_client::RestoreItemActionClient;
use ferry_proto::v2::volume_snapshotter_client::VolumeSnapshotterClient;
use ferry_proto::{generated, plugin, v2};
use futures::StreamExt as _;
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;
use serde_json::{Value, json};
use support::{Plugin, json, run_to_exit, velero_env};
use tonic::Code;
use tonic_health::pb::HealthCheckRequest;
use tonic_health::pb::health_check_response::ServingStatus;
use tonic_health::pb::health_client::HealthClient;

const BACKUP: &str = "ferry.dev/echo-backup";
const RESTORE: &str = "ferry.dev/echo-restore";
const SNAPSHOTTER: &str = "ferry.dev/echo-snapshotter";

fn pvc(namespace: &str, name: &str, volume: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"namespace": namespace, "name": name}, "spec": {"volumeName": volume}})
}

fn backup() -> Vec<u8> {
    json(&json!({"apiVersion": "velero.io/v1", "kind": "Backup",
                 "metadata": {"namespace": "velero", "name": "nightly"}}))
}

fn restore() -> Vec<u8> {
    json(&json!({"apiVersion": "velero.io/v1", "kind": "Restore",
                 "metadata": {"namespace": "velero", "name": "nightly-restore"}}))
}

fn pv_id(name: &str) -> generated::ResourceIdentifier {
    generated::ResourceIdentifier {
        resource: "persistentvolumes".into(),
        name: name.into(),
        ..Default::default()
    }
}

/// Asks the plugin to exit, then checks it did, cleanly, printing nothing more on stdout and
/// leaving nothing in its temporary directory.
async fn shut_down(plugin: Plugin) {
    GrpcControllerClient::new(plugin.channel().await).shutdown(plugin::Empty {}).await.unwrap();
    let (plugin, status, stdout) = plugin.wait_async().await;
    assert!(status.success(), "exit status {status}; stderr:\n{}", plugin.stderr());
    assert!(
        !plugin.stderr().contains("shutdown grace period"),
        "the plugin had to drop connections: {}",
        plugin.stderr()
    );
    assert!(stdout.is_empty(), "stdout after the handshake: {stdout:?}");
    let left: Vec<_> = std::fs::read_dir(plugin.tmp()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}

#[tokio::test]
async fn handshake_health_and_go_plugin_streams() {
    let plugin = Plugin::launch();
    let socket = plugin.socket();
    assert_eq!(plugin.handshake, format!("1|2|unix|{}|grpc", socket.display()));
    let dir = socket.parent().unwrap();
    assert_eq!(dir.parent(), Some(plugin.tmp()), "the socket lives in a fresh dir under TMPDIR");
    assert!(dir.file_name().unwrap().to_str().unwrap().starts_with("ferry-plugin-"));
    plugin.await_stderr("serving Velero plugins"); // logs go to stderr

    let channel = plugin.channel().await;
    let health = HealthClient::new(channel.clone())
        .check(HealthCheckRequest { service: "plugin".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(health.status, ServingStatus::Serving as i32);

    // go-plugin's host opens both streams as soon as it connects; they stay open.
    let mut stdio =
        GrpcStdioClient::new(channel.clone()).stream_stdio(()).await.unwrap().into_inner();
    let hello = plugin::ConnInfo { service_id: 7, network: "unix".into(), ..Default::default() };
    let outgoing = futures::stream::iter([hello]).chain(futures::stream::pending());
    let mut broker =
        GrpcBrokerClient::new(channel.clone()).start_stream(outgoing).await.unwrap().into_inner();
    let pending = tokio::time::timeout(Duration::from_millis(300), stdio.message()).await;
    assert!(pending.is_err(), "the stdio stream must stay open: {pending:?}");
    let pending = tokio::time::timeout(Duration::from_millis(300), broker.message()).await;
    assert!(pending.is_err(), "the broker stream must stay open: {pending:?}");

    // Shutdown ends both streams cleanly, and the process exits.
    GrpcControllerClient::new(channel).shutdown(plugin::Empty {}).await.unwrap();
    let end = tokio::time::timeout(Duration::from_secs(10), stdio.message()).await.unwrap();
    assert!(matches!(end, Ok(None)), "stdio stream: {end:?}");
    let end = tokio::time::timeout(Duration::from_secs(10), broker.message()).await.unwrap();
    assert!(matches!(end, Ok(None)), "broker stream: {end:?}");
    let (_plugin, status, stdout) = plugin.wait_async().await;
    assert!(status.success(), "{status}");
    assert!(stdout.is_empty(), "{stdout:?}");
    assert!(!dir.exists(), "the socket directory must be removed on exit");
}

#[tokio::test]
async fn lists_every_plugin_and_ferry_kinds_only_to_hosts_that_ask() {
    let expect = |with_v2: bool| {
        let mut v = vec![
            ("BackupItemAction", "ferry.dev/echo-backup-v1"),
            ("BackupItemActionV2", "ferry.dev/echo-backup"),
            ("BackupItemActionV2", "ferry.dev/echo-backup-v1-adapted"),
            ("VolumeSnapshotter", SNAPSHOTTER),
            ("RestoreItemAction", "ferry.dev/echo-restore-v1"),
            ("RestoreItemActionV2", RESTORE),
            ("DeleteItemAction", "ferry.dev/echo-delete"),
        ];
        if with_v2 {
            v.insert(4, ("VolumeSnapshotterV2", SNAPSHOTTER));
        }
        v
    };
    for with_v2 in [false, true] {
        let mut env = velero_env();
        if with_v2 {
            env.push(("FERRY_PLUGIN_EXTRA_KINDS", "VolumeSnapshotterV2"));
        }
        let plugin = Plugin::launch_with(&env, &support::VELERO_FLAGS);
        let list = PluginListerClient::new(plugin.channel().await)
            .list_plugins(generated::Empty {})
            .await
            .unwrap()
            .into_inner()
            .plugins;
        let got: Vec<_> = list.iter().map(|p| (p.kind.as_str(), p.name.as_str())).collect();
        assert_eq!(got, expect(with_v2));
        assert!(list.iter().all(|p| p.command == support::PLUGIN), "{list:?}");
        shut_down(plugin).await;
    }
}

#[tokio::test]
async fn backup_item_action_v2() {
    let plugin = Plugin::launch();
    let mut bia = BackupItemActionClient::new(plugin.channel().await);
    let applies = bia
        .applies_to(v2::BackupItemActionAppliesToRequest { plugin: BACKUP.into() })
        .await
        .unwrap()
        .into_inner();
    let selector = applies.resource_selector.unwrap();
    assert_eq!(selector.included_resources, ["persistentvolumeclaims"]);
    assert_eq!(selector.selector, "ferry.dev/echo=true");

    let out = bia
        .execute(v2::ExecuteRequest {
            plugin: BACKUP.into(),
            item: json(&pvc("apps", "data", "pv-1")),
            backup: backup(),
        })
        .await
        .unwrap()
        .into_inner();
    let item: Value = serde_json::from_slice(&out.item).unwrap();
    assert_eq!(item["metadata"]["annotations"]["ferry.dev/echoed-by"], "nightly");
    assert_eq!(item["spec"]["volumeName"], "pv-1");
    assert_eq!(out.additional_items, [pv_id("pv-1")]);
    assert_eq!(out.operation_id, "echo/apps/data");
    assert_eq!(
        out.post_operation_items,
        [generated::ResourceIdentifier {
            group: "velero.io".into(),
            resource: "datauploads".into(),
            namespace: "velero".into(),
            name: "nightly-data".into(),
        }]
    );

    let progress = |id: &str| v2::BackupItemActionProgressRequest {
        plugin: BACKUP.into(),
        operation_id: id.into(),
        backup: backup(),
    };
    let p = bia.progress(progress("echo/apps/data")).await.unwrap().into_inner().progress.unwrap();
    assert!(p.completed && p.err.is_empty());
    assert_eq!((p.n_completed, p.n_total, p.operation_units.as_str()), (4096, 4096, "bytes"));
    assert_eq!(p.description, "echoed apps/data for backup nightly");
    assert_eq!(p.started.map(|t| t.seconds), Some(1_700_000_000));
    assert_eq!(p.updated.map(|t| t.seconds), Some(1_700_000_060));

    let unknown = bia.progress(progress("nope")).await.unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(unknown.message().contains("operation \"nope\" not found"), "{}", unknown.message());

    bia.cancel(v2::BackupItemActionCancelRequest {
        plugin: BACKUP.into(),
        operation_id: "echo/apps/data".into(),
        backup: backup(),
    })
    .await
    .unwrap();
    let p = bia.progress(progress("echo/apps/data")).await.unwrap().into_inner().progress.unwrap();
    assert!(p.completed);
    assert_eq!(p.err, "cancelled by the host");
    shut_down(plugin).await;
}

#[tokio::test]
async fn restore_item_action_v2() {
    let plugin = Plugin::launch();
    let mut ria = RestoreItemActionClient::new(plugin.channel().await);
    let out = ria
        .execute(v2::RestoreItemActionExecuteRequest {
            plugin: RESTORE.into(),
            item: json(&pvc("apps-copy", "data", "")),
            restore: restore(),
            item_from_backup: json(&pvc("apps", "data", "pv-1")),
        })
        .await
        .unwrap()
        .into_inner();
    let item: Value = serde_json::from_slice(&out.item).unwrap();
    assert_eq!(item["metadata"]["annotations"]["ferry.dev/restored-by"], "nightly-restore");
    assert_eq!(out.operation_id, "echo-restore/apps-copy/data");
    assert!(out.wait_for_additional_items && !out.skip_restore);
    assert_eq!(out.additional_items_ready_timeout.map(|d| (d.seconds, d.nanos)), Some((90, 0)));
    assert_eq!(out.additional_items, [pv_id("pv-1")]);

    let ready = |name: &str| v2::RestoreItemActionItemsReadyRequest {
        plugin: RESTORE.into(),
        restore: restore(),
        additional_items: vec![pv_id(name)],
    };
    assert!(ria.are_additional_items_ready(ready("pv-1")).await.unwrap().into_inner().ready);
    assert!(!ria.are_additional_items_ready(ready("pending-pv")).await.unwrap().into_inner().ready);

    let p = ria
        .progress(v2::RestoreItemActionProgressRequest {
            plugin: RESTORE.into(),
            operation_id: out.operation_id.clone(),
            restore: restore(),
        })
        .await
        .unwrap()
        .into_inner()
        .progress
        .unwrap();
    assert_eq!(p.description, "restored apps-copy/data for restore nightly-restore");
    ria.cancel(v2::RestoreItemActionCancelRequest {
        plugin: RESTORE.into(),
        operation_id: out.operation_id,
        restore: restore(),
    })
    .await
    .unwrap();
    let applies = ria
        .applies_to(v2::RestoreItemActionAppliesToRequest { plugin: RESTORE.into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(applies.resource_selector.unwrap().included_resources, ["persistentvolumeclaims"]);
    shut_down(plugin).await;
}

#[tokio::test]
async fn volume_snapshotter_v2_and_v1_share_one_instance() {
    let plugin = Plugin::launch();
    let channel = plugin.channel().await;
    let mut vs = VolumeSnapshotterClient::new(channel.clone());
    let mut vs1 = SnapshotterV1Client::new(channel);

    let early = vs
        .create_snapshot(v2::CreateSnapshotRequest {
            plugin: SNAPSHOTTER.into(),
            volume_id: "vol-1".into(),
            ..Default::default()
        })
        .await
        .unwrap_err();
    assert!(early.message().contains("Init has not been called"), "{}", early.message());
    let config = HashMap::from([("region".to_owned(), "eu-1".to_owned())]);
    vs1.init(generated::VolumeSnapshotterInitRequest { plugin: SNAPSHOTTER.into(), config })
        .await
        .unwrap();

    let snap = vs
        .create_snapshot(v2::CreateSnapshotRequest {
            plugin: SNAPSHOTTER.into(),
            volume_id: "vol-1".into(),
            volume_az: "eu-1a".into(),
            tags: HashMap::from([("velero.io/backup".to_owned(), "nightly".to_owned())]),
        })
        .await
        .unwrap()
        .into_inner()
        .snapshot_id;
    assert_eq!(snap, "snap-vol-1");
    let progress = |id: &str| v2::VolumeSnapshotterProgressRequest {
        plugin: SNAPSHOTTER.into(),
        snapshot_id: id.into(),
    };
    let p = vs.progress(progress(&snap)).await.unwrap().into_inner().progress.unwrap();
    assert!(p.completed && p.err.is_empty());
    assert_eq!((p.n_completed, p.n_total, p.operation_units.as_str()), (1, 1, "snapshots"));
    vs.cancel(v2::VolumeSnapshotterCancelRequest {
        plugin: SNAPSHOTTER.into(),
        operation_id: snap.clone(),
    })
    .await
    .unwrap();
    let p = vs.progress(progress(&snap)).await.unwrap().into_inner().progress.unwrap();
    assert_eq!(p.err, "cancelled by the host");
    assert_eq!(vs.progress(progress("other")).await.unwrap_err().code(), Code::NotFound);

    let info = vs1
        .get_volume_info(generated::GetVolumeInfoRequest {
            plugin: SNAPSHOTTER.into(),
            volume_id: "vol-1".into(),
            volume_az: "eu-1a".into(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!((info.volume_type.as_str(), info.iops), ("gp3", 3000));
    let created = vs
        .create_volume_from_snapshot(v2::CreateVolumeRequest {
            plugin: SNAPSHOTTER.into(),
            snapshot_id: snap.clone(),
            ..Default::default()
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(created.volume_id, "vol-from-snap-vol-1");

    let pv =
        json(&json!({"apiVersion": "v1", "kind": "PersistentVolume", "metadata": {"name": "pv-1"},
                          "spec": {"csi": {"driver": "ferry.dev", "volumeHandle": "vol-1"}}}));
    let id = vs
        .get_volume_id(v2::GetVolumeIdRequest {
            plugin: SNAPSHOTTER.into(),
            persistent_volume: pv.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(id.volume_id, "vol-1");
    let set = vs1
        .set_volume_id(generated::SetVolumeIdRequest {
            plugin: SNAPSHOTTER.into(),
            persistent_volume: pv,
            volume_id: "vol-2".into(),
        })
        .await
        .unwrap()
        .into_inner();
    let updated: Value = serde_json::from_slice(&set.persistent_volume).unwrap();
    assert_eq!(updated["spec"]["csi"]["volumeHandle"], "vol-2");
    assert_eq!(updated["metadata"]["name"], "pv-1");
    vs.delete_snapshot(v2::DeleteSnapshotRequest { plugin: SNAPSHOTTER.into(), snapshot_id: snap })
        .await
        .unwrap();
    shut_down(plugin).await;
}

#[tokio::test]
async fn version_1_actions_and_the_v2_adapter() {
    let plugin = Plugin::launch();
    let channel = plugin.channel().await;
    let cm = json(&json!({"apiVersion": "v1", "kind": "ConfigMap",
                          "metadata": {"namespace": "apps", "name": "settings", "labels": {"ferry.dev/skip": "true"}}}));

    let out = BackupV1Client::new(channel.clone())
        .execute(generated::ExecuteRequest {
            plugin: "ferry.dev/echo-backup-v1".into(),
            item: cm.clone(),
            backup: backup(),
        })
        .await
        .unwrap()
        .into_inner();
    let item: Value = serde_json::from_slice(&out.item).unwrap();
    assert_eq!(item["metadata"]["annotations"]["ferry.dev/echoed-by-v1"], "nightly");

    let mut adapted = BackupItemActionClient::new(channel.clone());
    let out = adapted
        .execute(v2::ExecuteRequest {
            plugin: "ferry.dev/echo-backup-v1-adapted".into(),
            item: cm.clone(),
            backup: backup(),
        })
        .await
        .unwrap()
        .into_inner();
    let item: Value = serde_json::from_slice(&out.item).unwrap();
    assert_eq!(item["metadata"]["annotations"]["ferry.dev/echoed-by-v1"], "nightly");
    assert!(out.operation_id.is_empty() && out.post_operation_items.is_empty());
    let p = adapted
        .progress(v2::BackupItemActionProgressRequest {
            plugin: "ferry.dev/echo-backup-v1-adapted".into(),
            operation_id: String::new(),
            backup: backup(),
        })
        .await
        .unwrap()
        .into_inner()
        .progress
        .unwrap();
    assert!(p.completed && p.err.is_empty());

    let out = RestoreV1Client::new(channel.clone())
        .execute(generated::RestoreItemActionExecuteRequest {
            plugin: "ferry.dev/echo-restore-v1".into(),
            item: cm.clone(),
            restore: restore(),
            item_from_backup: cm.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    assert!(out.skip_restore);

    let mut delete = DeleteItemActionClient::new(channel);
    let du = |fail: bool| {
        let annotations = if fail { json!({"ferry.dev/fail-delete": "yes"}) } else { json!({}) };
        json(&json!({"apiVersion": "velero.io/v2alpha1", "kind": "DataUpload",
                     "metadata": {"namespace": "velero", "name": "du-1", "annotations": annotations}}))
    };
    let request = |fail| generated::DeleteItemActionExecuteRequest {
        plugin: "ferry.dev/echo-delete".into(),
        item: du(fail),
        backup: backup(),
    };
    delete.execute(request(false)).await.unwrap();
    let failed = delete.execute(request(true)).await.unwrap_err();
    assert_eq!(failed.code(), Code::Unknown);
    assert_eq!(
        failed.message(),
        "DeleteItemAction plugin \"ferry.dev/echo-delete\": Execute: refusing to delete du-1 as its \
         ferry.dev/fail-delete annotation asks"
    );
    shut_down(plugin).await;
}

#[tokio::test]
async fn bad_requests_get_statuses_naming_the_plugin_and_the_problem() {
    let plugin = Plugin::launch();
    let channel = plugin.channel().await;
    let mut bia = BackupItemActionClient::new(channel.clone());

    let unknown = bia
        .applies_to(v2::BackupItemActionAppliesToRequest { plugin: "ferry.dev/nope".into() })
        .await
        .unwrap_err();
    assert_eq!(unknown.code(), Code::NotFound);
    assert!(
        unknown.message().contains("no BackupItemActionV2 plugin named \"ferry.dev/nope\"")
            && unknown
                .message()
                .contains("ferry.dev/echo-backup, ferry.dev/echo-backup-v1-adapted"),
        "{}",
        unknown.message()
    );
    // A name registered under another kind is unknown to this kind's service.
    let wrong_kind = RestoreItemActionClient::new(channel.clone())
        .applies_to(v2::RestoreItemActionAppliesToRequest { plugin: BACKUP.into() })
        .await
        .unwrap_err();
    assert_eq!(wrong_kind.code(), Code::NotFound);
    let no_v2 = VolumeSnapshotterClient::new(channel.clone())
        .progress(v2::VolumeSnapshotterProgressRequest {
            plugin: "ferry.dev/x".into(),
            snapshot_id: "s".into(),
        })
        .await
        .unwrap_err();
    assert!(
        no_v2.message().contains("VolumeSnapshotterV2 plugin \"ferry.dev/x\""),
        "{}",
        no_v2.message()
    );

    let bad_json = bia
        .execute(v2::ExecuteRequest {
            plugin: BACKUP.into(),
            item: b"{not json".to_vec(),
            backup: backup(),
        })
        .await
        .unwrap_err();
    assert_eq!(bad_json.code(), Code::InvalidArgument);
    assert!(
        bad_json.message().starts_with(
            "BackupItemActionV2 plugin \"ferry.dev/echo-backup\": Execute: field item: invalid JSON"
        ),
        "{}",
        bad_json.message()
    );
    let empty_backup = bia
        .progress(v2::BackupItemActionProgressRequest {
            plugin: BACKUP.into(),
            operation_id: "echo/a/b".into(),
            backup: Vec::new(),
        })
        .await
        .unwrap_err();
    assert_eq!(empty_backup.code(), Code::InvalidArgument);
    assert!(empty_backup.message().contains("field backup: empty"), "{}", empty_backup.message());

    let nameless = bia
        .execute(v2::ExecuteRequest {
            plugin: BACKUP.into(),
            item: json(&json!({"kind": "PersistentVolumeClaim", "metadata": {}})),
            backup: backup(),
        })
        .await
        .unwrap_err();
    assert_eq!(nameless.code(), Code::InvalidArgument);
    assert!(nameless.message().ends_with("Execute: invalid input: the item has no metadata.name"));

    // The process keeps serving after bad requests.
    let ok = bia.applies_to(v2::BackupItemActionAppliesToRequest { plugin: BACKUP.into() }).await;
    assert!(ok.is_ok(), "{ok:?}");
    shut_down(plugin).await;
}

#[test]
fn without_the_magic_cookie_it_explains_and_exits_non_zero() {
    let env = [("PLUGIN_PROTOCOL_VERSIONS", "2")];
    let (status, stdout, stderr) = run_to_exit(&env, &["--log-level", "info"]);
    assert!(!status.success(), "{status}");
    assert!(stdout.is_empty(), "no handshake line without the cookie: {stdout:?}");
    assert!(stderr.contains("this program is a Velero plugin"), "{stderr}");
    assert!(stderr.contains("meant to be launched by Velero"), "{stderr}");

    let (status, stdout, _) = run_to_exit(&[("VELERO_PLUGIN", "bye")], &[]);
    assert!(!status.success() && stdout.is_empty());
}

#[test]
fn hosts_without_protocol_version_2_are_refused() {
    let env = [("VELERO_PLUGIN", "hello"), ("PLUGIN_PROTOCOL_VERSIONS", "1,3")];
    let (status, stdout, stderr) = run_to_exit(&env, &[]);
    assert!(!status.success(), "{status}");
    assert!(stdout.is_empty(), "{stdout:?}");
    assert!(stderr.contains("protocol versions \"1,3\""), "{stderr}");
}

#[test]
fn sigterm_stops_it_cleanly_and_sigint_is_ignored() {
    let mut plugin = Plugin::launch();
    let socket_dir = plugin.socket().parent().unwrap().to_owned();
    kill(Pid::from_raw(plugin.pid()), Signal::SIGINT).unwrap();
    std::thread::sleep(Duration::from_millis(300));
    assert!(plugin.running(), "SIGINT must not stop the plugin; stderr:\n{}", plugin.stderr());
    assert!(socket_dir.exists());
    kill(Pid::from_raw(plugin.pid()), Signal::SIGTERM).unwrap();
    let (status, _) = plugin.wait();
    assert!(status.success(), "{status}");
    assert!(!socket_dir.exists());
}

// Multi-threaded: the stuck call runs on one worker while the test waits on another.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_stuck_call_cannot_keep_the_plugin_alive_after_shutdown() {
    let plugin = Plugin::launch();
    let socket_dir = plugin.socket().parent().unwrap().to_owned();
    let mut bia = BackupItemActionClient::new(plugin.channel().await);
    let stuck = tokio::spawn(async move {
        bia.progress(v2::BackupItemActionProgressRequest {
            plugin: BACKUP.into(),
            operation_id: "echo/stuck/forever".into(),
            backup: backup(),
        })
        .await
    });
    plugin.await_stderr(
        "plugin call kind=BackupItemActionV2 plugin=\"ferry.dev/echo-backup\" method=\"Progress\"",
    );
    GrpcControllerClient::new(plugin.channel().await).shutdown(plugin::Empty {}).await.unwrap();
    // The server waits for the call during its grace period (5 seconds), then drops it.
    let (plugin, status, _) = plugin.wait_async().await;
    let outcome = stuck.await.unwrap();
    assert!(status.success(), "{status}");
    assert!(plugin.stderr().contains("shutdown grace period"), "{}", plugin.stderr());
    assert!(!socket_dir.exists());
    assert!(outcome.is_err(), "the stuck call cannot have succeeded: {outcome:?}");
}

#[tokio::test]
async fn honours_the_hosts_socket_directory() {
    let sockets = tempfile::tempdir().unwrap();
    let dir = sockets.path().to_str().unwrap();
    let mut env = velero_env();
    env.push(("PLUGIN_UNIX_SOCKET_DIR", dir));
    let plugin = Plugin::launch_with(&env, &[]);
    assert!(plugin.socket().starts_with(sockets.path()), "{}", plugin.handshake);
    shut_down(plugin).await;
    assert_eq!(std::fs::read_dir(sockets.path()).unwrap().count(), 0);
}
