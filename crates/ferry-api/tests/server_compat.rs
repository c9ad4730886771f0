//! Ferry's API types against a real kube-apiserver with Velero's and the CSI snapshotter's
//! real CRDs. The CRDs are structural and prune unknown fields, so a field Ferry names
//! differently from Velero would silently vanish on the way through the server: every test
//! here fills every field and checks it comes back.

use std::collections::BTreeMap;
use std::time::Duration;

use ferry_api::k8s_openapi::api::core::v1::ObjectReference;
use ferry_api::k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use ferry_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::OwnerReference;
use ferry_api::k8s_openapi::jiff::Timestamp;
use ferry_api::{
    CsiSnapshotSpec, DataDownload, DataDownloadPhase, DataDownloadSpec, DataDownloadStatus,
    DataMoveOperationProgress, DataUpload, DataUploadPhase, DataUploadSpec, DataUploadStatus,
    GoDuration, NodeOs, SnapshotType, TargetVolumeSpec, Time, VolumeSnapshot,
    VolumeSnapshotContent, VolumeSnapshotContentSource, VolumeSnapshotContentSpec,
    VolumeSnapshotContentStatus, VolumeSnapshotSource, VolumeSnapshotSpec, VolumeSnapshotStatus,
    keys, naming,
};
use ferry_kube::ApiError;
use ferry_testbed::{ControlPlane, VELERO_NAMESPACE};
use kube::api::{Api, DynamicObject, Patch, PatchParams, PostParams};
use kube::core::{ApiResource, GroupVersionKind};
use serde_json::json;

fn time(rfc3339: &str) -> Time {
    ferry_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        rfc3339.parse::<Timestamp>().expect("timestamp"),
    )
}

fn velero_style_data_upload(backup: &str, backup_uid: &str, pvc_uid: &str) -> DataUpload {
    let operation_id = naming::data_upload_operation_id(backup_uid, pvc_uid);
    let mut du = DataUpload::new(
        "",
        DataUploadSpec {
            snapshot_type: SnapshotType::Csi,
            csi_snapshot: Some(CsiSnapshotSpec {
                volume_snapshot: "velero-data-0-abcde".into(),
                storage_class: "fast-ssd".into(),
                snapshot_class: "csi-snapclass".into(),
                driver: "hostpath.csi.k8s.io".into(),
            }),
            source_pvc: "data-0".into(),
            data_mover: "ferry".into(),
            backup_storage_location: "default".into(),
            source_namespace: "app".into(),
            data_mover_config: Some(BTreeMap::from([(
                keys::PARALLEL_FILES_UPLOAD.to_owned(),
                "4".to_owned(),
            )])),
            cancel: false,
            operation_timeout: GoDuration(Duration::from_secs(600)),
        },
    );
    du.metadata.name = None;
    du.metadata.generate_name = Some(format!("{backup}-"));
    du.metadata.namespace = Some(VELERO_NAMESPACE.into());
    du.metadata.labels = Some(BTreeMap::from([
        (keys::BACKUP_NAME_LABEL.to_owned(), naming::valid_label_value(backup)),
        (keys::BACKUP_UID_LABEL.to_owned(), backup_uid.to_owned()),
        (keys::PVC_UID_LABEL.to_owned(), pvc_uid.to_owned()),
        (keys::ASYNC_OPERATION_ID_LABEL.to_owned(), operation_id),
    ]));
    du.metadata.owner_references = Some(vec![OwnerReference {
        api_version: "velero.io/v1".into(),
        kind: "Backup".into(),
        name: backup.into(),
        uid: backup_uid.into(),
        controller: Some(true),
        ..OwnerReference::default()
    }]);
    du
}

fn full_upload_status() -> DataUploadStatus {
    DataUploadStatus {
        phase: Some(DataUploadPhase::Completed),
        path: "/host_pods/uid/volumes/kubernetes.io~csi/pvc-1/mount".into(),
        snapshot_id: "0123456789abcdef".into(),
        data_mover_result: Some(BTreeMap::from([(
            "ferry.io/repository".into(),
            "s3://b/p".into(),
        )])),
        message: "backed up 1 GiB".into(),
        start_timestamp: Some(time("2026-11-22T01:00:00Z")),
        completion_timestamp: Some(time("2026-11-22T01:05:00Z")),
        progress: DataMoveOperationProgress { total_bytes: 1 << 30, bytes_done: 1 << 30 },
        incremental_bytes: 1 << 20,
        node: "node-b".into(),
        node_os: Some(NodeOs::Linux),
        accepted_by_node: "node-b".into(),
        accepted_timestamp: Some(time("2026-11-22T00:59:00Z")),
    }
}

#[tokio::test]
async fn data_upload_survives_create_update_get_with_every_field() {
    let cp = ControlPlane::shared();
    let api: Api<DataUpload> = Api::namespaced(cp.client().expect("client"), VELERO_NAMESPACE);
    let sent = velero_style_data_upload(
        "nightly-with-a-rather-long-backup-name-that-needs-cutting-2026",
        "6a0d4e5c-1c39-4a7c-9f4e-1d2f0b8c7a11",
        "0b7c2d1e-8f3a-4b5c-9d6e-7f8a9b0c1d2e",
    );
    let created = ferry_kube::create(&api, &sent).await.expect("create");
    assert_eq!(created.spec, sent.spec, "spec changed on create");
    assert_eq!(created.metadata.labels, sent.metadata.labels);
    assert_eq!(created.metadata.owner_references, sent.metadata.owner_references);
    assert!(created.metadata.name.as_deref().is_some_and(|n| n.starts_with("nightly-")));

    // Status goes in with a full-object update: there is no status subresource.
    let mut with_status = created.clone();
    with_status.status = Some(full_upload_status());
    let updated = ferry_kube::replace(&api, &with_status).await.expect("update");
    let fetched = api.get(&created.metadata.name.clone().expect("name")).await.expect("get");
    for got in [&updated, &fetched] {
        assert_eq!(got.spec, sent.spec);
        assert_eq!(got.status, Some(full_upload_status()), "a status field was pruned or altered");
    }
    // Every field of the JSON we sent is in the JSON we got back.
    let sent_json = serde_json::to_value(&with_status).expect("json");
    let got_json = serde_json::to_value(&fetched).expect("json");
    assert_eq!(sent_json["spec"], got_json["spec"]);
    assert_eq!(sent_json["status"], got_json["status"]);
}

#[tokio::test]
async fn status_subresource_does_not_exist_on_data_uploads() {
    let cp = ControlPlane::shared();
    let api: Api<DataUpload> = Api::namespaced(cp.client().expect("client"), VELERO_NAMESPACE);
    let created = ferry_kube::create(&api, &velero_style_data_upload("b-status", "u1", "p1"))
        .await
        .expect("create");
    let name = created.metadata.name.clone().expect("name");
    let mut changed = created.clone();
    changed.status = Some(full_upload_status());
    let err = api
        .replace_status(&name, &PostParams::default(), &changed)
        .await
        .map_err(|e| ApiError::from_kube("DataUpload", &name, e))
        .expect_err("the /status endpoint must not exist");
    assert!(err.is_not_found(), "expected NotFound, got {err}");
}

#[tokio::test]
async fn stale_resource_version_is_another_writer_winning() {
    let cp = ControlPlane::shared();
    let api: Api<DataUpload> = Api::namespaced(cp.client().expect("client"), VELERO_NAMESPACE);
    let created = ferry_kube::create(&api, &velero_style_data_upload("b-lock", "u2", "p2"))
        .await
        .expect("create");

    // Two nodes read the same New object; both try to accept it.
    let accept = |node: &str| {
        let mut du = created.clone();
        du.status = Some(DataUploadStatus {
            phase: Some(DataUploadPhase::Accepted),
            accepted_by_node: node.into(),
            accepted_timestamp: Some(time("2026-11-22T02:00:00Z")),
            ..DataUploadStatus::default()
        });
        du
    };
    let first = ferry_kube::replace(&api, &accept("node-a")).await.expect("first writer wins");
    let second = ferry_kube::replace(&api, &accept("node-b")).await;
    let err = second.expect_err("second writer must lose");
    assert!(err.is_conflict(), "expected Conflict, got {err}");
    assert!(err.to_string().contains("another writer won"), "{err}");

    let current = api.get(&first.metadata.name.clone().expect("name")).await.expect("get");
    assert_eq!(current.status.expect("status").accepted_by_node, "node-a");
}

#[tokio::test]
async fn a_phase_outside_the_enum_is_rejected_by_the_server() {
    let cp = ControlPlane::shared();
    let client = cp.client().expect("client");
    let api: Api<DataUpload> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let created = ferry_kube::create(&api, &velero_style_data_upload("b-enum", "u3", "p3"))
        .await
        .expect("create");
    let name = created.metadata.name.clone().expect("name");
    // Ferry's types cannot express a bad phase, so send raw JSON.
    let gvk = GroupVersionKind::gvk("velero.io", "v2alpha1", "DataUpload");
    let raw: Api<DynamicObject> =
        Api::namespaced_with(client, VELERO_NAMESPACE, &ApiResource::from_gvk(&gvk));
    let err = raw
        .patch(&name, &PatchParams::default(), &Patch::Merge(json!({"status": {"phase": "Done"}})))
        .await
        .map_err(|e| ApiError::from_kube("DataUpload", &name, e))
        .expect_err("bad phase accepted");
    match &err {
        ApiError::Invalid { message, .. } => {
            assert!(message.contains("status.phase"), "message does not name the field: {message}");
            assert!(message.contains("Done"), "message does not name the value: {message}");
        }
        other => panic!("expected Invalid, got {other}"),
    }
}

#[tokio::test]
async fn data_download_survives_create_update_get_with_every_field() {
    let cp = ControlPlane::shared();
    let api: Api<DataDownload> = Api::namespaced(cp.client().expect("client"), VELERO_NAMESPACE);
    let mut sent = DataDownload::new(
        "",
        DataDownloadSpec {
            target_volume: TargetVolumeSpec {
                pvc: "data-0".into(),
                pv: String::new(),
                namespace: "app-restored".into(),
            },
            backup_storage_location: "default".into(),
            data_mover: "ferry".into(),
            snapshot_id: "0123456789abcdef".into(),
            source_namespace: "app".into(),
            data_mover_config: Some(BTreeMap::from([
                (keys::WRITE_SPARSE_FILES.to_owned(), "true".to_owned()),
                (keys::PARALLEL_FILES_DOWNLOAD.to_owned(), "8".to_owned()),
            ])),
            cancel: true,
            operation_timeout: GoDuration(Duration::from_secs(5400)),
            node_os: Some(NodeOs::Linux),
            snapshot_size: 1 << 30,
        },
    );
    sent.metadata.name = None;
    sent.metadata.generate_name = Some("restore-1-".into());
    sent.metadata.labels = Some(BTreeMap::from([
        (keys::RESTORE_NAME_LABEL.to_owned(), "restore-1".to_owned()),
        (keys::RESTORE_UID_LABEL.to_owned(), "r-uid".to_owned()),
        (
            keys::ASYNC_OPERATION_ID_LABEL.to_owned(),
            naming::data_download_operation_id("r-uid", "p-uid"),
        ),
    ]));
    let created = ferry_kube::create(&api, &sent).await.expect("create");
    assert_eq!(created.spec, sent.spec);
    assert_eq!(serde_json::to_value(&created.spec).expect("json")["operationTimeout"], "1h30m0s");

    let status = DataDownloadStatus {
        phase: Some(DataDownloadPhase::Canceled),
        message: "canceled by request".into(),
        start_timestamp: Some(time("2026-11-22T03:00:00Z")),
        completion_timestamp: Some(time("2026-11-22T03:01:00Z")),
        progress: DataMoveOperationProgress { total_bytes: 1 << 30, bytes_done: 1 << 29 },
        node: "node-c".into(),
        accepted_by_node: "node-c".into(),
        accepted_timestamp: Some(time("2026-11-22T02:59:00Z")),
    };
    let mut with_status = created.clone();
    with_status.status = Some(status.clone());
    ferry_kube::replace(&api, &with_status).await.expect("update");
    let fetched = api.get(&created.metadata.name.clone().expect("name")).await.expect("get");
    assert_eq!(fetched.spec, sent.spec);
    assert_eq!(fetched.status, Some(status));
}

#[tokio::test]
async fn volume_snapshot_and_content_survive_with_every_field() {
    let cp = ControlPlane::shared();
    let client = cp.client().expect("client");
    let ns = cp.unique_namespace("vs").await.expect("namespace");
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), &ns);
    let contents: Api<VolumeSnapshotContent> = Api::all(client);

    let vs = VolumeSnapshot::new(
        "snap-1",
        VolumeSnapshotSpec {
            source: VolumeSnapshotSource {
                persistent_volume_claim_name: Some("data-0".into()),
                volume_snapshot_content_name: None,
            },
            volume_snapshot_class_name: Some("csi-snapclass".into()),
        },
    );
    let created = ferry_kube::create(&snapshots, &vs).await.expect("create vs");
    assert_eq!(created.spec, vs.spec);

    // VolumeSnapshots do have a status subresource; the snapshot controller writes it there.
    let vs_status = VolumeSnapshotStatus {
        bound_volume_snapshot_content_name: Some("snapcontent-1".into()),
        creation_time: Some(time("2026-11-22T04:00:00Z")),
        ready_to_use: Some(true),
        restore_size: Some(Quantity("1Gi".into())),
        error: Some(ferry_api::VolumeSnapshotError {
            message: Some("transient".into()),
            time: Some(time("2026-11-22T03:59:00Z")),
        }),
        volume_group_snapshot_name: Some("group-1".into()),
    };
    let mut with_status = created.clone();
    with_status.status = Some(vs_status.clone());
    snapshots
        .replace_status("snap-1", &PostParams::default(), &with_status)
        .await
        .expect("status update");
    let fetched = snapshots.get("snap-1").await.expect("get vs");
    assert_eq!(fetched.spec, vs.spec);
    assert_eq!(fetched.status, Some(vs_status));

    let content_name = format!("snapcontent-{ns}");
    let vsc = VolumeSnapshotContent::new(
        &content_name,
        VolumeSnapshotContentSpec {
            volume_snapshot_ref: ObjectReference {
                api_version: Some("snapshot.storage.k8s.io/v1".into()),
                kind: Some("VolumeSnapshot".into()),
                name: Some("snap-1".into()),
                namespace: Some(ns.clone()),
                uid: Some("vs-uid".into()),
                resource_version: Some("1".into()),
                field_path: None,
            },
            deletion_policy: "Retain".into(),
            driver: "hostpath.csi.k8s.io".into(),
            volume_snapshot_class_name: Some("csi-snapclass".into()),
            source: VolumeSnapshotContentSource {
                volume_handle: None,
                snapshot_handle: Some("snap-handle-1".into()),
            },
            source_volume_mode: Some("Block".into()),
        },
    );
    let created = ferry_kube::create(&contents, &vsc).await.expect("create vsc");
    assert_eq!(created.spec, vsc.spec);
    let vsc_status = VolumeSnapshotContentStatus {
        snapshot_handle: Some("snap-handle-1".into()),
        creation_time: Some(1_795_000_000_000_000_000),
        ready_to_use: Some(true),
        restore_size: Some(1 << 30),
        error: None,
        volume_group_snapshot_handle: Some("group-handle".into()),
    };
    let mut with_status = created.clone();
    with_status.status = Some(vsc_status.clone());
    contents
        .replace_status(&content_name, &PostParams::default(), &with_status)
        .await
        .expect("status update");
    let fetched = contents.get(&content_name).await.expect("get vsc");
    assert_eq!(fetched.spec, vsc.spec);
    assert_eq!(fetched.status, Some(vsc_status));
}
