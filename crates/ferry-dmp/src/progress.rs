//! How a DataUpload's or DataDownload's status reads as Velero's `OperationProgress`.
//!
//! The mapping is Velero's CSI plugin's: a CR still New (or with no phase) reports an empty
//! progress; otherwise the description is the phase, the counts are `bytesDone` of
//! `totalBytes` in `Bytes`, `started`/`updated` are the start and completion timestamps, and
//! the three terminal phases complete the operation, Failed with the CR's message as the error
//! and Canceled with "`<Kind>` is canceled".

use std::time::SystemTime;

use ferry_api::{DataDownload, DataMoveOperationProgress, DataUpload, Time};
use ferry_plugin::OperationProgress;

/// The unit Velero's plugin reports data movement in.
pub const OPERATION_UNITS: &str = "Bytes";

/// The progress of the backup operation a DataUpload stands for.
#[must_use]
pub fn data_upload_progress(du: &DataUpload) -> OperationProgress {
    let status = du.status.clone().unwrap_or_default();
    to_progress(
        "DataUpload",
        du.phase().as_str(),
        status.progress,
        status.start_timestamp.as_ref(),
        status.completion_timestamp.as_ref(),
        &status.message,
    )
}

/// The progress of the restore operation a DataDownload stands for.
#[must_use]
pub fn data_download_progress(dd: &DataDownload) -> OperationProgress {
    let status = dd.status.clone().unwrap_or_default();
    to_progress(
        "DataDownload",
        dd.phase().as_str(),
        status.progress,
        status.start_timestamp.as_ref(),
        status.completion_timestamp.as_ref(),
        &status.message,
    )
}

fn to_progress(
    kind: &str,
    phase: &str,
    bytes: DataMoveOperationProgress,
    started: Option<&Time>,
    completed_at: Option<&Time>,
    message: &str,
) -> OperationProgress {
    if phase == "New" {
        return OperationProgress::default();
    }
    let mut progress = OperationProgress {
        description: phase.to_owned(),
        operation_units: OPERATION_UNITS.to_owned(),
        n_completed: bytes.bytes_done,
        n_total: bytes.total_bytes,
        started: started.map(system_time),
        updated: completed_at.map(system_time),
        ..OperationProgress::default()
    };
    match phase {
        "Completed" => progress.completed = true,
        "Failed" => {
            progress.completed = true;
            // Velero reports the message verbatim; an empty one reads as success on the wire,
            // so a Failed CR without a message still reports that it failed.
            progress.error = Some(if message.is_empty() {
                format!("{kind} failed")
            } else {
                message.to_owned()
            });
        }
        "Canceled" => {
            progress.completed = true;
            progress.error = Some(format!("{kind} is canceled"));
        }
        _ => {}
    }
    progress
}

fn system_time(t: &Time) -> SystemTime {
    SystemTime::from(t.0)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::time::{Duration, UNIX_EPOCH};

    use ferry_api::{
        DataDownloadPhase, DataDownloadSpec, DataDownloadStatus, DataUploadPhase, DataUploadSpec,
        DataUploadStatus, GoDuration, SnapshotType, TargetVolumeSpec,
    };

    use super::*;

    fn at(secs: i64) -> Time {
        Time::from(k8s_openapi::jiff::Timestamp::from_second(secs).unwrap())
    }

    fn upload(phase: Option<DataUploadPhase>, message: &str) -> DataUpload {
        let mut du = DataUpload::new(
            "b-1",
            DataUploadSpec {
                snapshot_type: SnapshotType::Csi,
                csi_snapshot: None,
                source_pvc: "data".into(),
                data_mover: "ferry".into(),
                backup_storage_location: "default".into(),
                source_namespace: "apps".into(),
                data_mover_config: None,
                cancel: false,
                operation_timeout: GoDuration(Duration::from_secs(600)),
            },
        );
        du.status = Some(DataUploadStatus {
            phase,
            message: message.into(),
            start_timestamp: Some(at(1_700_000_000)),
            completion_timestamp: Some(at(1_700_000_100)),
            progress: DataMoveOperationProgress { total_bytes: 1000, bytes_done: 400 },
            ..DataUploadStatus::default()
        });
        du
    }

    #[test]
    fn new_and_missing_phases_report_nothing_yet() {
        assert_eq!(data_upload_progress(&upload(None, "")), OperationProgress::default());
        assert_eq!(
            data_upload_progress(&upload(Some(DataUploadPhase::New), "")),
            OperationProgress::default()
        );
        let mut bare = upload(None, "");
        bare.status = None;
        assert_eq!(data_upload_progress(&bare), OperationProgress::default());
    }

    #[test]
    fn running_phases_report_bytes_and_times_without_completing() {
        for phase in [
            DataUploadPhase::Accepted,
            DataUploadPhase::Prepared,
            DataUploadPhase::InProgress,
            DataUploadPhase::Canceling,
        ] {
            let p = data_upload_progress(&upload(Some(phase), "ignored"));
            assert!(!p.completed, "{phase}");
            assert_eq!(p.error, None, "{phase}");
            assert_eq!(p.description, phase.as_str());
            assert_eq!((p.n_completed, p.n_total), (400, 1000));
            assert_eq!(p.operation_units, "Bytes");
            assert_eq!(p.started, Some(UNIX_EPOCH + Duration::from_secs(1_700_000_000)));
            assert_eq!(p.updated, Some(UNIX_EPOCH + Duration::from_secs(1_700_000_100)));
        }
    }

    #[test]
    fn terminal_phases_complete_with_velero_errors() {
        let done = data_upload_progress(&upload(Some(DataUploadPhase::Completed), "x"));
        assert!(done.completed && done.error.is_none());
        let failed = data_upload_progress(&upload(Some(DataUploadPhase::Failed), "disk full"));
        assert!(failed.completed);
        assert_eq!(failed.error.as_deref(), Some("disk full"));
        let silent = data_upload_progress(&upload(Some(DataUploadPhase::Failed), ""));
        assert_eq!(silent.error.as_deref(), Some("DataUpload failed"));
        let canceled = data_upload_progress(&upload(Some(DataUploadPhase::Canceled), "x"));
        assert!(canceled.completed);
        assert_eq!(canceled.error.as_deref(), Some("DataUpload is canceled"));
    }

    #[test]
    fn downloads_map_the_same_way() {
        let mut dd = DataDownload::new(
            "r-1",
            DataDownloadSpec {
                target_volume: TargetVolumeSpec {
                    pvc: "data".into(),
                    pv: String::new(),
                    namespace: "apps".into(),
                },
                backup_storage_location: "default".into(),
                data_mover: "ferry".into(),
                snapshot_id: "s".into(),
                source_namespace: "apps".into(),
                data_mover_config: None,
                cancel: false,
                operation_timeout: GoDuration(Duration::from_secs(600)),
                node_os: None,
                snapshot_size: 0,
            },
        );
        dd.status = Some(DataDownloadStatus {
            phase: Some(DataDownloadPhase::Canceled),
            progress: DataMoveOperationProgress { total_bytes: 10, bytes_done: 3 },
            ..DataDownloadStatus::default()
        });
        let p = data_download_progress(&dd);
        assert!(p.completed);
        assert_eq!(p.error.as_deref(), Some("DataDownload is canceled"));
        assert_eq!((p.n_completed, p.n_total, p.started), (3, 10, None));
    }
}
