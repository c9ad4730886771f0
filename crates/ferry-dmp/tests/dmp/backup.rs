//! The PVC backup action: what it creates, what it skips, Progress, Cancel, restarts.

use ferry_api::naming::valid_label_value;
use ferry_api::{DataMoveOperationProgress, DataUpload, DataUploadPhase, DataUploadStatus, Time};
use ferry_dmp::PvcBackupAction;
use ferry_plugin::{BackupItemActionV2, BackupItemInput, PluginError, ResourceIdentifier};
use ferry_testbed::VELERO_NAMESPACE;
use k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use kube::api::Api;
use serde_json::{Value, json};

use crate::support::{Cluster, named, object, uploads};

fn ours() -> Value {
    json!({"snapshotMoveData": true, "datamover": "ferry", "storageLocation": "primary",
           "csiSnapshotTimeout": "2m0s", "uploaderConfig": {"parallelFilesUpload": 3}})
}

/// Backs up PVC `data` of a fresh cluster corner; returns the cluster, action, backup JSON and
/// the operation ID.
async fn started(prefix: &str) -> (Cluster, PvcBackupAction, Value, String, BackupItemInput) {
    let cluster = Cluster::new(prefix).await;
    let _controller = cluster.snapshot_controller();
    let pvc = cluster.bound_pvc("data", true).await;
    let backup = cluster.backup(&named(&cluster, "nightly"), ours()).await;
    let action = PvcBackupAction::new(cluster.ctx());
    let input = BackupItemInput { item: object(&pvc), backup: object(&backup) };
    let out = action.execute(input.clone()).await.unwrap();
    let id = out.operation_id.unwrap();
    (cluster, action, serde_json::to_value(&backup).unwrap(), id, input)
}

#[tokio::test]
async fn execute_creates_exactly_the_snapshot_and_upload_velero_would() {
    let cluster = Cluster::new("dmp-bia").await;
    let _controller = cluster.snapshot_controller();
    let pvc = cluster.bound_pvc("data", true).await;
    let backup_name = named(&cluster, "nightly");
    let backup = cluster.backup(&backup_name, ours()).await;
    let (buid, puid) = (backup.uid().unwrap(), pvc.uid().unwrap());
    let action = PvcBackupAction::new(cluster.ctx());
    let out = action
        .execute(BackupItemInput { item: object(&pvc), backup: object(&backup) })
        .await
        .unwrap();

    // The operation ID: "du-<uid>.<uid>" is 76 bytes, so it is cut to 57 plus 6 hex digits.
    let id = out.operation_id.clone().unwrap();
    let full = format!("du-{buid}.{puid}");
    assert_eq!(id.len(), 63);
    assert_eq!(&id[..57], &full[..57]);
    assert_eq!(id, valid_label_value(&full));

    // Exactly one VolumeSnapshot, in the PVC's namespace.
    let snapshots = cluster.snapshots().await;
    assert_eq!(snapshots.len(), 1);
    let vs = &snapshots[0];
    assert!(vs.name_any().starts_with("velero-data-"), "{}", vs.name_any());
    assert_eq!(vs.metadata.generate_name.as_deref(), Some("velero-data-"));
    assert_eq!(
        vs.labels().clone(),
        [
            ("app".to_owned(), "db".to_owned()),
            ("velero.io/backup-name".to_owned(), backup_name.clone())
        ]
        .into()
    );
    assert_eq!(vs.spec.source.persistent_volume_claim_name.as_deref(), Some("data"));
    assert_eq!(
        vs.spec.volume_snapshot_class_name.as_deref(),
        Some(cluster.snapshot_class.as_str())
    );

    // Exactly one DataUpload, found by the operation ID, with every field Velero writes.
    let dus = uploads(&cluster.client, &id).await;
    assert_eq!(dus.len(), 1);
    let du = &dus[0];
    assert!(du.name_any().starts_with(&format!("{backup_name}-")));
    let mut meta = serde_json::to_value(&du.metadata).unwrap();
    for volatile in
        ["name", "uid", "resourceVersion", "creationTimestamp", "managedFields", "generation"]
    {
        meta.as_object_mut().unwrap().remove(volatile);
    }
    assert_eq!(
        meta,
        json!({"namespace": VELERO_NAMESPACE, "generateName": format!("{backup_name}-"),
               "ownerReferences": [{"apiVersion": "velero.io/v1", "kind": "Backup",
                   "name": backup_name, "uid": buid, "controller": true}],
               "labels": {"velero.io/backup-name": backup_name, "velero.io/backup-uid": buid,
                   "velero.io/pvc-uid": puid, "velero.io/async-operation-id": id}})
    );
    assert_eq!(
        serde_json::to_value(&du.spec).unwrap(),
        json!({"snapshotType": "CSI",
               "csiSnapshot": {"volumeSnapshot": vs.name_any(), "storageClass": cluster.storage_class,
                   "snapshotClass": cluster.snapshot_class, "driver": cluster.driver},
               "sourcePVC": "data", "datamover": "ferry", "backupStorageLocation": "primary",
               "sourceNamespace": cluster.ns, "dataMoverConfig": {"ParallelFilesUpload": "3"},
               "operationTimeout": "2m0s"})
    );
    assert_eq!(du.status, None);

    // The PVC returned, and the DataUpload as post-operation item.
    let item = out.item.unwrap();
    assert_eq!(item["metadata"]["labels"]["velero.io/volume-snapshot-name"], json!(vs.name_any()));
    assert_eq!(item["metadata"]["labels"]["velero.io/backup-name"], json!(backup_name));
    assert_eq!(item["metadata"]["labels"]["app"], "db");
    assert_eq!(
        item["metadata"]["annotations"],
        json!({"velero.io/volume-snapshot-name": vs.name_any(),
               "backup.velero.io/must-include-additional-items": "true",
               "velero.io/data-upload-name": format!("{VELERO_NAMESPACE}/{}", du.name_any())})
    );
    assert_eq!(item["spec"]["volumeName"], json!(format!("{}-data", cluster.ns)));
    assert!(out.additional_items.is_empty());
    assert_eq!(
        out.post_operation_items,
        [ResourceIdentifier::namespaced(
            "velero.io",
            "datauploads",
            VELERO_NAMESPACE,
            du.name_any()
        )]
    );

    // Executing again adopts the upload: no second snapshot or DataUpload.
    let again = action
        .execute(BackupItemInput { item: object(&pvc), backup: object(&backup) })
        .await
        .unwrap();
    assert_eq!(again.operation_id.as_deref(), Some(id.as_str()));
    assert_eq!(cluster.snapshots().await.len(), 1);
    assert_eq!(uploads(&cluster.client, &id).await.len(), 1);
}

#[tokio::test]
async fn leaves_pvcs_to_others_when_the_backup_is_not_ours() {
    let cluster = Cluster::new("dmp-skip").await;
    let _controller = cluster.snapshot_controller();
    let pvc = cluster.bound_pvc("data", true).await;
    let action = PvcBackupAction::new(cluster.ctx());
    for (i, spec) in [
        json!({"datamover": "ferry"}),
        json!({"snapshotMoveData": false, "datamover": "ferry"}),
        json!({"snapshotMoveData": true}),
        json!({"snapshotMoveData": true, "datamover": "velero"}),
        json!({"snapshotMoveData": true, "datamover": "ferry", "snapshotVolumes": false}),
    ]
    .into_iter()
    .enumerate()
    {
        let backup = cluster.backup(&named(&cluster, &format!("b{i}")), spec.clone()).await;
        let out = action
            .execute(BackupItemInput { item: object(&pvc), backup: object(&backup) })
            .await
            .unwrap();
        assert_eq!(out, ferry_plugin::BackupItemOutputV2::unchanged(), "{spec}");
    }
    assert!(cluster.snapshots().await.is_empty());

    // A PV that is not CSI: the PVC is annotated and nothing is started.
    let hostpath = cluster.bound_pvc("local", false).await;
    let backup = cluster.backup(&named(&cluster, "ours"), ours()).await;
    let out = action
        .execute(BackupItemInput { item: object(&hostpath), backup: object(&backup) })
        .await
        .unwrap();
    assert_eq!(out.operation_id, None);
    assert_eq!(
        out.item.unwrap()["metadata"]["annotations"]["backup.velero.io/skipped-no-csi-pv"],
        "true"
    );

    // An unbound PVC is an error naming it.
    let mut pending = hostpath.clone();
    pending.status = None;
    let err = action
        .execute(BackupItemInput { item: object(&pending), backup: object(&backup) })
        .await
        .unwrap_err();
    assert!(err.to_string().contains(&format!("PVC {}/local is not bound", cluster.ns)), "{err}");
    assert!(cluster.snapshots().await.is_empty());
}

fn time(secs: i64) -> Time {
    Time::from(Timestamp::from_second(secs).unwrap())
}

async fn set_status(
    client: &kube::Client,
    du: &DataUpload,
    status: DataUploadStatus,
) -> DataUpload {
    let api: Api<DataUpload> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let mut current = api.get(&du.name_any()).await.unwrap();
    current.status = Some(status);
    ferry_kube::replace(&api, &current).await.unwrap()
}

#[tokio::test]
async fn progress_follows_every_phase_and_survives_a_restart() {
    let (cluster, action, backup, id, _) = started("dmp-progress").await;
    let backup = ferry_plugin::JsonObject::from_value(backup).unwrap();
    let du = uploads(&cluster.client, &id).await.remove(0);

    let p = action.progress(&id, &backup).await.unwrap();
    assert_eq!(p, ferry_plugin::OperationProgress::default(), "a New DataUpload reports nothing");

    let start = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_000);
    let end = std::time::UNIX_EPOCH + std::time::Duration::from_secs(1_700_000_300);
    for phase in DataUploadPhase::ALL {
        let terminal = phase.is_terminal();
        set_status(
            &cluster.client,
            &du,
            DataUploadStatus {
                phase: Some(phase),
                message: if phase == DataUploadPhase::Failed {
                    "repository unreachable".into()
                } else {
                    String::new()
                },
                start_timestamp: Some(time(1_700_000_000)),
                completion_timestamp: terminal.then(|| time(1_700_000_300)),
                progress: DataMoveOperationProgress { total_bytes: 1 << 20, bytes_done: 1 << 19 },
                ..DataUploadStatus::default()
            },
        )
        .await;
        let p = action.progress(&id, &backup).await.unwrap();
        if phase == DataUploadPhase::New {
            assert_eq!(p, ferry_plugin::OperationProgress::default());
            continue;
        }
        assert_eq!(p.description, phase.as_str());
        assert_eq!(
            (p.n_completed, p.n_total, p.operation_units.as_str()),
            (1 << 19, 1 << 20, "Bytes")
        );
        assert_eq!(p.started, Some(start), "{phase}");
        assert_eq!(p.updated, terminal.then_some(end), "{phase}");
        assert_eq!(p.completed, terminal, "{phase}");
        let expected_error = match phase {
            DataUploadPhase::Failed => Some("repository unreachable"),
            DataUploadPhase::Canceled => Some("DataUpload is canceled"),
            _ => None,
        };
        assert_eq!(p.error.as_deref(), expected_error, "{phase}");

        // A fresh plugin (a restarted process, its own client) answers the same.
        let restarted = PvcBackupAction::new(cluster.ctx());
        assert_eq!(restarted.progress(&id, &backup).await.unwrap(), p, "{phase}");
    }

    let unknown = action.progress("du-nope", &backup).await.unwrap_err();
    assert!(matches!(unknown, PluginError::NotFound { .. }), "{unknown}");
    let empty = action.progress("", &backup).await.unwrap_err();
    assert!(matches!(empty, PluginError::InvalidInput { .. }), "{empty}");
}

#[tokio::test]
async fn cancel_sets_spec_cancel_and_nothing_else() {
    let (cluster, action, backup, id, _) = started("dmp-cancel").await;
    let backup = ferry_plugin::JsonObject::from_value(backup).unwrap();
    let before = uploads(&cluster.client, &id).await.remove(0);
    assert!(!before.spec.cancel);
    PvcBackupAction::new(cluster.ctx()).cancel(&id, &backup).await.unwrap();
    let after = uploads(&cluster.client, &id).await.remove(0);
    assert!(after.spec.cancel);
    let mut expected = before.spec.clone();
    expected.cancel = true;
    assert_eq!(after.spec, expected);
    assert_eq!(after.metadata.labels, before.metadata.labels);
    let missing = action.cancel("du-missing", &backup).await.unwrap_err();
    assert!(matches!(missing, PluginError::NotFound { .. }), "{missing}");
}
