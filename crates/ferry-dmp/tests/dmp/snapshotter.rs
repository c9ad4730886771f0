//! The VolumeSnapshotter v2: a snapshot is a DataUpload, a volume from it a DataDownload.

use std::collections::BTreeMap;

use ferry_api::{
    DataDownload, DataMoveOperationProgress, DataUpload, DataUploadPhase, DataUploadStatus,
};
use ferry_dmp::DataMoverSnapshotter;
use ferry_plugin::{NewVolume, PluginError, VolumeSnapshotter, VolumeSnapshotterV2};
use ferry_testbed::VELERO_NAMESPACE;
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::json;

use crate::support::{Cluster, named, object, uploads};

#[tokio::test]
async fn snapshots_are_uploads_and_volumes_are_downloads() {
    let cluster = Cluster::new("dmp-vs").await;
    let _controller = cluster.snapshot_controller();
    let pvc = cluster.bound_pvc("data", true).await;
    let backup_name = named(&cluster, "b");
    let backup = cluster
        .backup(
            &backup_name,
            json!({"snapshotMoveData": true, "datamover": "ferry", "storageLocation": "primary"}),
        )
        .await;
    let vs = DataMoverSnapshotter::new(cluster.ctx());
    vs.init(BTreeMap::new()).await.unwrap();

    let pv = object(
        &kube::api::Api::<k8s_openapi::api::core::v1::PersistentVolume>::all(
            cluster.client.clone(),
        )
        .get(&format!("{}-data", cluster.ns))
        .await
        .unwrap(),
    );
    let volume_id = vs.get_volume_id(&pv).await.unwrap();
    assert_eq!(volume_id, format!("{}-data", cluster.ns));

    let no_tag = vs.create_snapshot(&volume_id, "", BTreeMap::new()).await.unwrap_err();
    assert!(matches!(no_tag, PluginError::InvalidInput { .. }), "{no_tag}");
    let tags = BTreeMap::from([("velero.io/backup".to_owned(), backup_name.clone())]);
    let snapshot_id = vs.create_snapshot(&volume_id, "", tags.clone()).await.unwrap();
    assert_eq!(
        snapshot_id,
        ferry_api::naming::data_upload_operation_id(&backup.uid().unwrap(), &pvc.uid().unwrap())
    );
    let du = uploads(&cluster.client, &snapshot_id).await.remove(0);
    assert_eq!(du.spec.source_pvc, "data");
    assert_eq!(vs.create_snapshot(&volume_id, "", tags).await.unwrap(), snapshot_id);
    assert_eq!(uploads(&cluster.client, &snapshot_id).await.len(), 1);

    // Not finished yet: no volume from it.
    assert!(vs.progress(&snapshot_id).await.unwrap() == ferry_plugin::OperationProgress::default());
    let early = vs
        .create_volume_from_snapshot(NewVolume {
            snapshot_id: snapshot_id.clone(),
            ..NewVolume::default()
        })
        .await
        .unwrap_err();
    assert!(early.to_string().contains("not Completed"), "{early}");

    let api: Api<DataUpload> = Api::namespaced(cluster.client.clone(), VELERO_NAMESPACE);
    let mut done = api.get(&du.name_any()).await.unwrap();
    done.status = Some(DataUploadStatus {
        phase: Some(DataUploadPhase::Completed),
        snapshot_id: "repo-snap-1".into(),
        progress: DataMoveOperationProgress { total_bytes: 2048, bytes_done: 2048 },
        ..DataUploadStatus::default()
    });
    ferry_kube::replace(&api, &done).await.unwrap();
    let p = DataMoverSnapshotter::new(cluster.ctx()).progress(&snapshot_id).await.unwrap();
    assert!(p.completed && p.error.is_none());
    assert_eq!((p.n_completed, p.n_total), (2048, 2048));

    let volume = vs
        .create_volume_from_snapshot(NewVolume {
            snapshot_id: snapshot_id.clone(),
            ..NewVolume::default()
        })
        .await
        .unwrap();
    assert!(volume.starts_with("dd-"), "{volume}");
    let dds: Vec<DataDownload> = Api::namespaced(cluster.client.clone(), VELERO_NAMESPACE)
        .list(&ListParams::default().labels(&format!("velero.io/async-operation-id={volume}")))
        .await
        .unwrap()
        .items;
    assert_eq!(dds.len(), 1);
    let spec = serde_json::to_value(&dds[0].spec).unwrap();
    assert_eq!(
        spec,
        json!({"targetVolume": {"pvc": "data", "pv": "", "namespace": cluster.ns},
               "backupStorageLocation": "primary", "datamover": "ferry", "snapshotID": "repo-snap-1",
               "sourceNamespace": cluster.ns, "operationTimeout": "10m0s", "snapshotSize": 2048})
    );
    assert_eq!(vs.progress(&volume).await.unwrap(), ferry_plugin::OperationProgress::default());
    vs.cancel(&volume).await.unwrap();
    let api: Api<DataDownload> = Api::namespaced(cluster.client.clone(), VELERO_NAMESPACE);
    assert!(api.get(&dds[0].name_any()).await.unwrap().spec.cancel);
    vs.cancel(&snapshot_id).await.unwrap();
    assert!(uploads(&cluster.client, &snapshot_id).await[0].spec.cancel);

    let unsupported = vs.delete_snapshot(&snapshot_id).await.unwrap_err();
    assert!(matches!(unsupported, PluginError::Unsupported { .. }));
}
