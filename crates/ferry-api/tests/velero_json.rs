//! Objects as Velero writes them deserialise into Ferry's types and serialise back to the
//! same JSON, field for field.

use ferry_api::{DataDownload, DataDownloadPhase, DataUpload, DataUploadPhase, NodeOs};
use serde_json::Value;

fn round_trip<T: serde::de::DeserializeOwned + serde::Serialize>(text: &str) -> (T, Value, Value) {
    let original: Value = serde_json::from_str(text).expect("fixture is JSON");
    let typed: T = serde_json::from_value(original.clone()).expect("fixture deserialises");
    let back = serde_json::to_value(&typed).expect("serialises");
    (typed, original, back)
}

#[test]
fn completed_data_upload_loses_nothing() {
    let (du, original, back) =
        round_trip::<DataUpload>(include_str!("fixtures/dataupload-completed.json"));
    assert_eq!(back, original);
    let status = du.status.as_ref().expect("status");
    assert_eq!(du.phase(), DataUploadPhase::Completed);
    assert_eq!(status.progress.bytes_done, 10_737_418_240);
    assert_eq!(status.incremental_bytes, 104_857_600);
    assert_eq!(status.node_os, Some(NodeOs::Linux));
    assert_eq!(du.spec.operation_timeout.0.as_secs(), 600);
    assert_eq!(
        du.spec.csi_snapshot.as_ref().map(|c| c.volume_snapshot.as_str()),
        Some("velero-data-postgres-0-q8w2v")
    );
}

#[test]
fn in_progress_data_download_loses_nothing() {
    let (dd, original, back) =
        round_trip::<DataDownload>(include_str!("fixtures/datadownload-inprogress.json"));
    assert_eq!(back, original);
    assert_eq!(dd.phase(), DataDownloadPhase::InProgress);
    assert_eq!(dd.spec.snapshot_size, 10_737_418_240);
    assert_eq!(dd.spec.target_volume.pv, "");
}

#[test]
fn a_new_data_upload_without_status_is_new() {
    let mut value: Value =
        serde_json::from_str(include_str!("fixtures/dataupload-completed.json")).expect("json");
    value.as_object_mut().expect("object").remove("status");
    let du: DataUpload = serde_json::from_value(value).expect("deserialises");
    assert_eq!(du.phase(), DataUploadPhase::New);
}

#[test]
fn empty_progress_is_written_as_velero_writes_it() {
    // Velero's Go struct always emits `progress: {}` and omits zero counters.
    let status = ferry_api::DataUploadStatus::default();
    let json = serde_json::to_value(&status).expect("serialises");
    assert_eq!(json, serde_json::json!({ "progress": {} }));
}
