//! The plugin served by the go-plugin server and driven over gRPC, as Velero drives it.

use ferry_api::{DataUpload, DataUploadPhase, DataUploadStatus};
use ferry_plugin::{HostEnv, PluginServer};
use ferry_proto::generated::plugin_lister_client::PluginListerClient;
use ferry_proto::v2::backup_item_action_client::BackupItemActionClient;
use ferry_proto::{generated, v2};
use ferry_testbed::VELERO_NAMESPACE;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::json;
use tokio_util::sync::CancellationToken;

use crate::support::{Cluster, named, uploads};

/// Serves the plugin in this process on a Unix socket under a temporary directory; stops it and
/// waits for it on drop of the returned token's guard.
struct Served {
    shutdown: CancellationToken,
    task: Option<tokio::task::JoinHandle<()>>,
    socket: std::path::PathBuf,
    _dir: tempfile::TempDir,
}

impl Served {
    async fn start(server: PluginServer) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let env = HostEnv { socket_parent: Some(dir.path().to_owned()), ..HostEnv::default() };
        let shutdown = CancellationToken::new();
        let token = shutdown.clone();
        let task = tokio::spawn(async move {
            server.serve_with_shutdown(&env, token).await.unwrap();
        });
        // The socket appears in a fresh directory under the parent.
        let mut socket = None;
        for _ in 0..500 {
            socket = std::fs::read_dir(dir.path())
                .unwrap()
                .filter_map(Result::ok)
                .flat_map(|d| {
                    std::fs::read_dir(d.path()).into_iter().flatten().filter_map(Result::ok)
                })
                .map(|e| e.path())
                .next();
            if socket.is_some() {
                break;
            }
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
        Self { shutdown, task: Some(task), socket: socket.expect("no plugin socket"), _dir: dir }
    }

    async fn channel(&self) -> tonic::transport::Channel {
        let endpoint = format!("unix:{}", self.socket.display());
        tonic::transport::Endpoint::from_shared(endpoint).unwrap().connect().await.unwrap()
    }

    async fn stop(mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.await.unwrap();
        }
    }
}

impl Drop for Served {
    fn drop(&mut self) {
        self.shutdown.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
    }
}

#[tokio::test]
async fn velero_drives_the_backup_action_over_grpc() {
    let cluster = Cluster::new("dmp-grpc").await;
    let _controller = cluster.snapshot_controller();
    let pvc = cluster.bound_pvc("data", true).await;
    let backup = cluster
        .backup(&named(&cluster, "b"), json!({"snapshotMoveData": true, "datamover": "ferry"}))
        .await;
    let mut server = PluginServer::new();
    ferry_dmp::register(&mut server, &cluster.ctx(), ferry_dmp::Actions::All).unwrap();
    let served = Served::start(server).await;
    let channel = served.channel().await;

    let listed = PluginListerClient::new(channel.clone())
        .list_plugins(generated::Empty {})
        .await
        .unwrap()
        .into_inner()
        .plugins;
    let kinds: Vec<_> = listed.iter().map(|p| (p.kind.as_str(), p.name.as_str())).collect();
    assert_eq!(
        kinds,
        [
            ("BackupItemActionV2", "ferry.io/pvc-backup"),
            ("RestoreItemActionV2", "ferry.io/pvc-restore"),
            ("DeleteItemAction", "ferry.io/dataupload-delete"),
        ],
        "Velero's kinds only; VolumeSnapshotterV2 is served but not listed to Velero"
    );

    let mut bia = BackupItemActionClient::new(channel);
    let backup_json = serde_json::to_vec(&backup).unwrap();
    let out = bia
        .execute(v2::ExecuteRequest {
            plugin: ferry_dmp::PVC_BACKUP_PLUGIN.into(),
            item: serde_json::to_vec(&pvc).unwrap(),
            backup: backup_json.clone(),
        })
        .await
        .unwrap()
        .into_inner();
    let du = uploads(&cluster.client, &out.operation_id).await.remove(0);
    assert_eq!(out.post_operation_items.len(), 1);
    assert_eq!(out.post_operation_items[0].name, du.name_any());
    assert_eq!(out.post_operation_items[0].resource, "datauploads");
    let item: serde_json::Value = serde_json::from_slice(&out.item).unwrap();
    assert_eq!(
        item["metadata"]["annotations"]["velero.io/data-upload-name"],
        json!(format!("{VELERO_NAMESPACE}/{}", du.name_any()))
    );

    let api: Api<DataUpload> = Api::namespaced(cluster.client.clone(), VELERO_NAMESPACE);
    let mut current = api.get(&du.name_any()).await.unwrap();
    current.status = Some(DataUploadStatus {
        phase: Some(DataUploadPhase::Failed),
        message: "node lost".into(),
        ..DataUploadStatus::default()
    });
    ferry_kube::replace(&api, &current).await.unwrap();
    let progress = bia
        .progress(v2::BackupItemActionProgressRequest {
            plugin: ferry_dmp::PVC_BACKUP_PLUGIN.into(),
            operation_id: out.operation_id.clone(),
            backup: backup_json.clone(),
        })
        .await
        .unwrap()
        .into_inner()
        .progress
        .unwrap();
    assert!(progress.completed);
    assert_eq!((progress.err.as_str(), progress.description.as_str()), ("node lost", "Failed"));

    bia.cancel(v2::BackupItemActionCancelRequest {
        plugin: ferry_dmp::PVC_BACKUP_PLUGIN.into(),
        operation_id: out.operation_id.clone(),
        backup: backup_json.clone(),
    })
    .await
    .unwrap();
    assert!(api.get(&du.name_any()).await.unwrap().spec.cancel);

    let missing = bia
        .progress(v2::BackupItemActionProgressRequest {
            plugin: ferry_dmp::PVC_BACKUP_PLUGIN.into(),
            operation_id: "du-nothing".into(),
            backup: backup_json,
        })
        .await
        .unwrap_err();
    assert_eq!(missing.code(), tonic::Code::NotFound);
    served.stop().await;
}

/// Beside a Velero server, whose own CSI support runs its PVC actions for every volume, the
/// plugin lists no PVC action of its own (each volume would get two item operations).
#[tokio::test]
async fn beside_velero_only_the_data_upload_delete_action_is_listed() {
    let cluster = Cluster::new("dmp-beside").await;
    let mut server = PluginServer::new();
    ferry_dmp::register(&mut server, &cluster.ctx(), ferry_dmp::Actions::BesideVelero).unwrap();
    let served = Served::start(server).await;
    let listed = PluginListerClient::new(served.channel().await)
        .list_plugins(generated::Empty {})
        .await
        .unwrap()
        .into_inner()
        .plugins;
    let kinds: Vec<_> = listed.iter().map(|p| (p.kind.as_str(), p.name.as_str())).collect();
    assert_eq!(kinds, [("DeleteItemAction", ferry_dmp::DATA_UPLOAD_DELETE_PLUGIN)]);
}
