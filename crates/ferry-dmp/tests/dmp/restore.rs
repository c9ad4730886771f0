//! The PVC restore action: the DataDownload, the PVC it returns, Progress and Cancel.

use ferry_api::naming::valid_label_value;
use ferry_api::{DataDownload, DataDownloadPhase, DataDownloadStatus, DataMoveOperationProgress};
use ferry_dmp::PvcRestoreAction;
use ferry_plugin::{JsonObject, PluginError, RestoreItemActionV2, RestoreItemInput};
use ferry_testbed::{ControlPlane, VELERO_NAMESPACE};
use k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim};
use kube::ResourceExt;
use kube::api::{Api, ListParams};
use serde_json::{Value, json};

use crate::support::{Cluster, create, named};

const PVC_UID: &str = "0b7c2d1e-8f3a-4b5c-9d6e-7f8a9b0c1d2e";

fn pvc_from_backup(ns: &str) -> Value {
    json!({"apiVersion": "v1", "kind": "PersistentVolumeClaim",
           "metadata": {"name": "data", "namespace": ns, "uid": PVC_UID,
               "annotations": {"velero.io/data-upload-name": "velero/nightly-x1"}},
           "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": "fast",
               "volumeName": "pv-old", "resources": {"requests": {"storage": "1Gi"}}},
           "status": {"phase": "Bound"}})
}

/// The ConfigMap Velero's `velero.io/dataupload` restore action leaves for the PVC.
async fn upload_result(client: &kube::Client, restore_uid: &str, ns: &str) {
    let cm: ConfigMap = serde_json::from_value(json!({
        "metadata": {"generateName": "nightly-x1-", "namespace": VELERO_NAMESPACE,
            "labels": {"velero.io/restore-uid": restore_uid,
                "velero.io/pvc-namespace-name": valid_label_value(&format!("{ns}.data")),
                "velero.io/resource-usage": "DataUpload"}},
        "data": {restore_uid: r#"{"backupStorageLocation":"primary","datamover":"ferry","snapshotID":"snap-42","sourceNamespace":"SRC","dataMoverResult":{"k":"v"},"nodeOS":"linux","snapshotSize":1048576}"#.replace("SRC", ns)},
    }))
    .unwrap();
    create(&Api::namespaced(client.clone(), VELERO_NAMESPACE), &cm).await;
}

async fn downloads(client: &kube::Client, id: &str) -> Vec<DataDownload> {
    let api: Api<DataDownload> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    api.list(&ListParams::default().labels(&format!("velero.io/async-operation-id={id}")))
        .await
        .unwrap()
        .items
}

#[tokio::test]
async fn execute_creates_the_data_download_and_returns_the_reset_pvc() {
    let cluster = Cluster::new("dmp-ria").await;
    let target = ControlPlane::shared().unique_namespace("dmp-ria-target").await.unwrap();
    let backup_name = named(&cluster, "nightly");
    cluster
        .backup(
            &backup_name,
            json!({"snapshotMoveData": true, "datamover": "ferry", "csiSnapshotTimeout": "5m"}),
        )
        .await;
    let restore_name = named(&cluster, "restore");
    let restore = cluster
        .restore(
            &restore_name,
            json!({"backupName": backup_name, "namespaceMapping": {cluster.ns.clone(): target.clone()},
                   "uploaderConfig": {"writeSparseFiles": true}}),
        )
        .await;
    let ruid = restore.uid().unwrap();
    upload_result(&cluster.client, &ruid, &cluster.ns).await;

    let action = PvcRestoreAction::new(cluster.ctx());
    let item = JsonObject::from_value(pvc_from_backup(&cluster.ns)).unwrap();
    let restore_obj = crate::support::object(&restore);
    let out = action
        .execute(RestoreItemInput {
            item: item.clone(),
            item_from_backup: item.clone(),
            restore: restore_obj.clone(),
        })
        .await
        .unwrap();
    let id = out.operation_id.clone().unwrap();
    assert_eq!(id, valid_label_value(&format!("dd-{ruid}.{PVC_UID}")));
    assert_eq!(id.len(), 63);
    assert!(!out.skip_restore && !out.wait_for_additional_items && out.additional_items.is_empty());

    // The PVC: volumeName reset, the selector added, everything else kept.
    let pvc = out.item.unwrap();
    let selector =
        pvc["spec"]["selector"]["matchLabels"]["velero.io/dynamic-pv-restore"].as_str().unwrap();
    let prefix = format!("{target}.data.");
    assert!(selector.starts_with(&prefix) && selector.len() == prefix.len() + 5, "{selector}");
    let mut expected = pvc_from_backup(&cluster.ns);
    expected["spec"]["volumeName"] = json!("");
    expected["spec"]["selector"] =
        json!({"matchLabels": {"velero.io/dynamic-pv-restore": selector}});
    assert_eq!(pvc, expected);

    let dds = downloads(&cluster.client, &id).await;
    assert_eq!(dds.len(), 1);
    let dd = &dds[0];
    assert!(dd.name_any().starts_with(&format!("{restore_name}-")));
    assert_eq!(dd.metadata.generate_name.as_deref(), Some(format!("{restore_name}-").as_str()));
    assert_eq!(
        serde_json::to_value(&dd.metadata.owner_references).unwrap(),
        json!([{"apiVersion": "velero.io/v1", "kind": "Restore", "name": restore_name, "uid": ruid, "controller": true}])
    );
    assert_eq!(
        dd.labels().clone(),
        [
            ("velero.io/restore-name".to_owned(), restore_name.clone()),
            ("velero.io/restore-uid".to_owned(), ruid.clone()),
            ("velero.io/async-operation-id".to_owned(), id.clone()),
        ]
        .into()
    );
    assert_eq!(
        serde_json::to_value(&dd.spec).unwrap(),
        json!({"targetVolume": {"pvc": "data", "pv": "", "namespace": target},
               "backupStorageLocation": "primary", "datamover": "ferry", "snapshotID": "snap-42",
               "sourceNamespace": cluster.ns, "dataMoverConfig": {"WriteSparseFiles": "true"},
               "operationTimeout": "5m0s", "nodeOS": "linux", "snapshotSize": 1_048_576})
    );

    // Progress, from a fresh plugin too; Cancel; items are always ready.
    assert_eq!(
        action.progress(&id, &restore_obj).await.unwrap(),
        ferry_plugin::OperationProgress::default()
    );
    let api: Api<DataDownload> = Api::namespaced(cluster.client.clone(), VELERO_NAMESPACE);
    let mut current = api.get(&dd.name_any()).await.unwrap();
    current.status = Some(DataDownloadStatus {
        phase: Some(DataDownloadPhase::Failed),
        message: "target PVC never bound".into(),
        progress: DataMoveOperationProgress { total_bytes: 1_048_576, bytes_done: 10 },
        ..DataDownloadStatus::default()
    });
    ferry_kube::replace(&api, &current).await.unwrap();
    let p = PvcRestoreAction::new(cluster.ctx()).progress(&id, &restore_obj).await.unwrap();
    assert!(p.completed);
    assert_eq!(p.error.as_deref(), Some("target PVC never bound"));
    assert_eq!((p.n_completed, p.n_total, p.description.as_str()), (10, 1_048_576, "Failed"));
    action.cancel(&id, &restore_obj).await.unwrap();
    assert!(api.get(&dd.name_any()).await.unwrap().spec.cancel);
    assert!(action.are_additional_items_ready(&[], &restore_obj).await.unwrap());

    // Again: the DataDownload is adopted, not duplicated.
    let again = action
        .execute(RestoreItemInput {
            item: item.clone(),
            item_from_backup: item,
            restore: restore_obj,
        })
        .await
        .unwrap();
    assert_eq!(again.operation_id.as_deref(), Some(id.as_str()));
    assert_eq!(downloads(&cluster.client, &id).await.len(), 1);
}

#[tokio::test]
async fn pvcs_without_moved_data_or_already_present_are_left_alone() {
    let cluster = Cluster::new("dmp-ria-skip").await;
    let backup_name = named(&cluster, "b");
    cluster.backup(&backup_name, json!({"snapshotMoveData": true, "datamover": "ferry"})).await;
    let velero_backup = named(&cluster, "velero");
    cluster.backup(&velero_backup, json!({"snapshotMoveData": true})).await;
    let action = PvcRestoreAction::new(cluster.ctx());
    let with_upload = JsonObject::from_value(pvc_from_backup(&cluster.ns)).unwrap();
    let mut plain = pvc_from_backup(&cluster.ns);
    plain["metadata"]["annotations"] = json!({});
    let plain = JsonObject::from_value(plain).unwrap();

    let cases = [
        (velero_backup.as_str(), &with_upload, json!({})),
        (backup_name.as_str(), &plain, json!({})),
        (backup_name.as_str(), &with_upload, json!({"restorePVs": false})),
    ];
    for (i, (backup, item, extra)) in cases.into_iter().enumerate() {
        let mut spec = json!({"backupName": backup});
        spec.as_object_mut().unwrap().extend(extra.as_object().unwrap().clone());
        let restore = cluster.restore(&named(&cluster, &format!("r{i}")), spec).await;
        let out = action
            .execute(RestoreItemInput {
                item: item.clone(),
                item_from_backup: item.clone(),
                restore: crate::support::object(&restore),
            })
            .await
            .unwrap();
        assert_eq!(out, ferry_plugin::RestoreItemOutputV2::unchanged(), "case {i}");
    }

    // The PVC exists in the target namespace already.
    let existing: PersistentVolumeClaim = serde_json::from_value(json!({
        "metadata": {"name": "data", "namespace": cluster.ns},
        "spec": {"accessModes": ["ReadWriteOnce"], "resources": {"requests": {"storage": "1Gi"}}},
    }))
    .unwrap();
    create(&Api::namespaced(cluster.client.clone(), &cluster.ns), &existing).await;
    let restore =
        cluster.restore(&named(&cluster, "r-exists"), json!({"backupName": backup_name})).await;
    let out = action
        .execute(RestoreItemInput {
            item: with_upload.clone(),
            item_from_backup: with_upload.clone(),
            restore: crate::support::object(&restore),
        })
        .await
        .unwrap();
    assert_eq!(out, ferry_plugin::RestoreItemOutputV2::unchanged());

    // Moved data but no result ConfigMap: an error naming the labels looked for.
    let target = ControlPlane::shared().unique_namespace("dmp-ria-none").await.unwrap();
    let restore = cluster
        .restore(
            &named(&cluster, "r-nocm"),
            json!({"backupName": backup_name, "namespaceMapping": {cluster.ns.clone(): target}}),
        )
        .await;
    let err = action
        .execute(RestoreItemInput {
            item: with_upload.clone(),
            item_from_backup: with_upload,
            restore: crate::support::object(&restore),
        })
        .await
        .unwrap_err();
    assert!(matches!(err, PluginError::Failed { .. }), "{err}");
    assert!(
        err.to_string().contains("no ConfigMap labelled velero.io/pvc-namespace-name="),
        "{err}"
    );
}
