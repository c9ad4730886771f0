//! What the controllers need from a DataUpload or DataDownload, as one trait, so a single
//! phase machine drives both; and the rule that says which node is responsible for a CR.

use std::fmt::Debug;
use std::sync::Arc;
use std::time::Duration;

use ferry_api::k8s_openapi::jiff::Timestamp;
use ferry_api::{
    DataDownload, DataDownloadPhase, DataMoveOperationProgress, DataUpload, DataUploadPhase, Time,
    keys,
};
use futures::future::BoxFuture;
use kube::core::NamespaceResourceScope;
use kube::{Resource, ResourceExt};
use serde::Serialize;

use crate::events::{REPOSITORY_WARNING, RESTORE_SHORTFALL, RESTORE_WITHHELD};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::backend::{Backends, DataMover, ExposedVolume, Exposer};
use crate::{BackupOutcome, ProgressSink, RestoreOutcome, WorkError};

/// Ferry's own annotations on the CRs it handles (Velero ignores them).
pub mod annotations {
    /// The node the exposer placed the volume on; that node's agent moves the data.
    pub const EXPOSED_NODE: &str = "ferry.io/exposed-node";
    /// When the CR became Prepared (RFC 3339); the prepare timeout for Prepared counts from it.
    pub const PREPARED_AT: &str = "ferry.io/prepared-at";
    /// How many times the CR was taken over from a node that stopped.
    pub const TAKEOVERS: &str = "ferry.io/takeovers";
    /// The nodes (comma-separated) the CR was taken over from: the exposer keeps its volume
    /// off them.
    pub const LOST_NODES: &str = "ferry.io/lost-nodes";
}

/// The phases of both CRs, as one type.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Phase {
    New,
    Accepted,
    Prepared,
    InProgress,
    Canceling,
    Canceled,
    Completed,
    Failed,
}

impl Phase {
    pub(crate) fn is_terminal(self) -> bool {
        matches!(self, Self::Completed | Self::Failed | Self::Canceled)
    }

    #[cfg(test)]
    pub(crate) fn as_str(self) -> &'static str {
        match self {
            Self::New => "New",
            Self::Accepted => "Accepted",
            Self::Prepared => "Prepared",
            Self::InProgress => "InProgress",
            Self::Canceling => "Canceling",
            Self::Canceled => "Canceled",
            Self::Completed => "Completed",
            Self::Failed => "Failed",
        }
    }
}

macro_rules! phase_conversions {
    ($api:ident) => {
        impl From<$api> for Phase {
            fn from(p: $api) -> Self {
                match p {
                    $api::New => Self::New,
                    $api::Accepted => Self::Accepted,
                    $api::Prepared => Self::Prepared,
                    $api::InProgress => Self::InProgress,
                    $api::Canceling => Self::Canceling,
                    $api::Canceled => Self::Canceled,
                    $api::Completed => Self::Completed,
                    $api::Failed => Self::Failed,
                }
            }
        }

        impl From<Phase> for $api {
            fn from(p: Phase) -> Self {
                match p {
                    Phase::New => Self::New,
                    Phase::Accepted => Self::Accepted,
                    Phase::Prepared => Self::Prepared,
                    Phase::InProgress => Self::InProgress,
                    Phase::Canceling => Self::Canceling,
                    Phase::Canceled => Self::Canceled,
                    Phase::Completed => Self::Completed,
                    Phase::Failed => Self::Failed,
                }
            }
        }
    };
}
phase_conversions!(DataUploadPhase);
phase_conversions!(DataDownloadPhase);

/// The status fields both CRs share, by mutable reference.
pub(crate) struct StatusMut<'a> {
    pub message: &'a mut String,
    pub start_timestamp: &'a mut Option<Time>,
    pub completion_timestamp: &'a mut Option<Time>,
    pub progress: &'a mut DataMoveOperationProgress,
    pub node: &'a mut String,
    pub accepted_by_node: &'a mut String,
    pub accepted_timestamp: &'a mut Option<Time>,
}

/// A copy of the status fields both CRs share.
#[derive(Debug, Clone, Default)]
pub(crate) struct StatusView {
    pub message: String,
    pub progress: DataMoveOperationProgress,
    pub node: String,
    pub accepted_by_node: String,
    pub accepted_timestamp: Option<Timestamp>,
}

/// A DataUpload or a DataDownload, as the phase machine sees it.
pub(crate) trait MoverCr:
    Resource<DynamicType = (), Scope = NamespaceResourceScope>
    + Clone
    + Debug
    + Serialize
    + DeserializeOwned
    + Send
    + Sync
    + 'static
{
    /// What a successful data movement produces.
    type Outcome: Send + Sync + 'static;
    /// The kind, for messages.
    const KIND: &'static str;
    /// Whether Completed records a repository snapshot (DataUpload) that a finalizer may
    /// hold ([`crate::AgentConfig::completed_upload_finalizer`]).
    const RECORDS_SNAPSHOT: bool;

    fn data_mover(&self) -> &str;
    fn cancel_requested(&self) -> bool;
    fn operation_timeout(&self) -> Duration;
    fn phase(&self) -> Phase;
    fn set_phase(&mut self, phase: Phase);
    fn status_view(&self) -> StatusView;
    fn status_mut(&mut self) -> StatusMut<'_>;
    fn exposer(backends: &Backends) -> &Arc<dyn Exposer<Self>>;
    fn move_data<'a>(
        mover: &'a dyn DataMover,
        cr: &'a Self,
        volume: &'a ExposedVolume,
        progress: ProgressSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<Self::Outcome, WorkError>>;
    /// Records what InProgress records besides the shared fields.
    fn record_start(&mut self, volume: &ExposedVolume);
    /// Records a successful outcome (Completed's fields besides phase and timestamps).
    fn record_outcome(&mut self, outcome: &Self::Outcome, volume: &ExposedVolume);
    /// A one-line summary of the outcome for the Completed event.
    fn describe_outcome(outcome: &Self::Outcome) -> String;
    /// The outcome's warnings, each published as a Warning Event: `(reason, note)`.
    fn outcome_warnings(outcome: &Self::Outcome) -> Vec<(&'static str, String)>;
    /// Counts what the outcome says beyond success in the agent's metrics.
    fn count_outcome(_outcome: &Self::Outcome, _metrics: &crate::metrics::Metrics) {}
}

macro_rules! shared_status {
    () => {
        fn data_mover(&self) -> &str {
            &self.spec.data_mover
        }

        fn cancel_requested(&self) -> bool {
            self.spec.cancel
        }

        fn operation_timeout(&self) -> Duration {
            self.spec.operation_timeout.0
        }

        fn phase(&self) -> Phase {
            self.status.as_ref().and_then(|s| s.phase).map_or(Phase::New, Phase::from)
        }

        fn set_phase(&mut self, phase: Phase) {
            self.status.get_or_insert_default().phase = Some(phase.into());
        }

        fn status_view(&self) -> StatusView {
            self.status.as_ref().map_or_else(StatusView::default, |s| StatusView {
                message: s.message.clone(),
                progress: s.progress,
                node: s.node.clone(),
                accepted_by_node: s.accepted_by_node.clone(),
                accepted_timestamp: s.accepted_timestamp.as_ref().map(|t| t.0),
            })
        }

        fn status_mut(&mut self) -> StatusMut<'_> {
            let s = self.status.get_or_insert_default();
            StatusMut {
                message: &mut s.message,
                start_timestamp: &mut s.start_timestamp,
                completion_timestamp: &mut s.completion_timestamp,
                progress: &mut s.progress,
                node: &mut s.node,
                accepted_by_node: &mut s.accepted_by_node,
                accepted_timestamp: &mut s.accepted_timestamp,
            }
        }
    };
}

fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

impl MoverCr for DataUpload {
    type Outcome = BackupOutcome;
    const KIND: &'static str = "DataUpload";
    const RECORDS_SNAPSHOT: bool = true;

    shared_status!();

    fn exposer(backends: &Backends) -> &Arc<dyn Exposer<Self>> {
        &backends.upload_exposer
    }

    fn move_data<'a>(
        mover: &'a dyn DataMover,
        cr: &'a Self,
        volume: &'a ExposedVolume,
        progress: ProgressSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<BackupOutcome, WorkError>> {
        mover.backup(cr, volume, progress, cancel)
    }

    fn record_start(&mut self, volume: &ExposedVolume) {
        self.status.get_or_insert_default().node_os = Some(volume.node_os);
    }

    fn record_outcome(&mut self, outcome: &BackupOutcome, volume: &ExposedVolume) {
        let s = self.status.get_or_insert_default();
        s.snapshot_id.clone_from(&outcome.snapshot_id);
        s.path = volume.path.to_string_lossy().into_owned();
        s.incremental_bytes = to_i64(outcome.incremental_bytes);
        s.data_mover_result =
            (!outcome.data_mover_result.is_empty()).then(|| outcome.data_mover_result.clone());
        let total = to_i64(outcome.total_bytes);
        s.progress = DataMoveOperationProgress { total_bytes: total, bytes_done: total };
        // A Completed DataUpload's message says how a block volume was read (Velero shows
        // the message; it acts on it only for failures).
        if let Some(reads) = &outcome.block_reads {
            s.message.clone_from(&reads.note);
        }
    }

    fn outcome_warnings(outcome: &BackupOutcome) -> Vec<(&'static str, String)> {
        outcome.warnings.iter().map(|w| (REPOSITORY_WARNING, w.clone())).collect()
    }

    fn describe_outcome(outcome: &BackupOutcome) -> String {
        let reads = outcome.block_reads.as_ref().map(|r| format!("; {}", r.note));
        format!(
            "backed up {} bytes ({} new) as snapshot {}{}",
            outcome.total_bytes,
            outcome.incremental_bytes,
            outcome.snapshot_id,
            reads.unwrap_or_default()
        )
    }

    fn count_outcome(outcome: &BackupOutcome, metrics: &crate::metrics::Metrics) {
        if let Some(reads) = &outcome.block_reads {
            metrics.block_reads(reads.path, reads.fallback);
        }
    }
}

impl MoverCr for DataDownload {
    type Outcome = RestoreOutcome;
    const KIND: &'static str = "DataDownload";
    const RECORDS_SNAPSHOT: bool = false;

    shared_status!();

    fn exposer(backends: &Backends) -> &Arc<dyn Exposer<Self>> {
        &backends.download_exposer
    }

    fn move_data<'a>(
        mover: &'a dyn DataMover,
        cr: &'a Self,
        volume: &'a ExposedVolume,
        progress: ProgressSink,
        cancel: CancellationToken,
    ) -> BoxFuture<'a, Result<RestoreOutcome, WorkError>> {
        mover.restore(cr, volume, progress, cancel)
    }

    fn record_start(&mut self, _volume: &ExposedVolume) {}

    fn record_outcome(&mut self, outcome: &RestoreOutcome, _volume: &ExposedVolume) {
        let total = to_i64(outcome.total_bytes);
        self.status.get_or_insert_default().progress =
            DataMoveOperationProgress { total_bytes: total, bytes_done: total };
    }

    fn outcome_warnings(outcome: &RestoreOutcome) -> Vec<(&'static str, String)> {
        let warnings = outcome.warnings.iter().map(|w| (REPOSITORY_WARNING, w.clone()));
        warnings
            .chain(outcome.withheld.iter().map(|w| (RESTORE_WITHHELD, w.clone())))
            .chain(outcome.shortfall.iter().map(|w| (RESTORE_SHORTFALL, w.clone())))
            .collect()
    }

    fn describe_outcome(outcome: &RestoreOutcome) -> String {
        format!("restored {} bytes", outcome.total_bytes)
    }
}

/// The node whose agent acts on the CR now: the accepting node while Accepted, the node the
/// volume was exposed on while Prepared, the moving node from InProgress on. `None` for New
/// CRs (every node races for them) and for CRs no node ever took.
pub(crate) fn responsible_node<C: MoverCr>(cr: &C) -> Option<String> {
    let status = cr.status_view();
    let exposed = annotation(cr, annotations::EXPOSED_NODE).unwrap_or_default().to_owned();
    let pick =
        |candidates: [&str; 3]| candidates.into_iter().find(|n| !n.is_empty()).map(str::to_owned);
    match cr.phase() {
        Phase::New => None,
        Phase::Accepted => pick([&status.accepted_by_node, "", ""]),
        Phase::Prepared => pick([&exposed, &status.accepted_by_node, ""]),
        _ => pick([&status.node, &exposed, &status.accepted_by_node]),
    }
}

pub(crate) fn annotation<'a, C: Resource>(cr: &'a C, key: &str) -> Option<&'a str> {
    cr.meta().annotations.as_ref()?.get(key).map(String::as_str)
}

pub(crate) fn has_finalizer<C: Resource>(cr: &C) -> bool {
    cr.finalizers().iter().any(|f| f == keys::DATA_UPLOAD_DOWNLOAD_FINALIZER)
}

pub(crate) fn has_expose_label<C: Resource>(cr: &C) -> bool {
    cr.labels().contains_key(keys::EXPOSE_ON_GOING_LABEL)
}

pub(crate) fn add_finalizer<C: Resource>(cr: &mut C) {
    if !has_finalizer(cr) {
        cr.finalizers_mut().push(keys::DATA_UPLOAD_DOWNLOAD_FINALIZER.to_owned());
    }
}

/// Removes the finalizer and the expose-on-going label: nothing of Ferry's is left to clean.
pub(crate) fn release<C: Resource>(cr: &mut C) {
    cr.finalizers_mut().retain(|f| f != keys::DATA_UPLOAD_DOWNLOAD_FINALIZER);
    remove_expose_label(cr);
}

pub(crate) fn remove_expose_label<C: Resource>(cr: &mut C) {
    if has_expose_label(cr) {
        cr.labels_mut().remove(keys::EXPOSE_ON_GOING_LABEL);
    }
}

pub(crate) fn is_deleting<C: Resource>(cr: &C) -> bool {
    cr.meta().deletion_timestamp.is_some()
}

/// Cancel was asked for, or the CR is being deleted: either way the work stops.
pub(crate) fn stop_requested<C: MoverCr>(cr: &C) -> bool {
    cr.cancel_requested() || is_deleting(cr)
}

pub(crate) fn now() -> Time {
    ferry_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(Timestamp::now())
}

/// How long ago `t` was (zero if in the future).
pub(crate) fn elapsed_since(t: Timestamp) -> Duration {
    let d = Timestamp::now().duration_since(t);
    Duration::try_from(d).unwrap_or(Duration::ZERO)
}

pub(crate) fn parse_timestamp(text: &str) -> Option<Timestamp> {
    text.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use ferry_api::{DataUploadSpec, DataUploadStatus, GoDuration, SnapshotType};

    fn du(phase: DataUploadPhase, accepted: &str, exposed: &str, node: &str) -> DataUpload {
        let mut du = DataUpload::new(
            "du",
            DataUploadSpec {
                snapshot_type: SnapshotType::Csi,
                csi_snapshot: None,
                source_pvc: "p".into(),
                data_mover: "ferry".into(),
                backup_storage_location: "default".into(),
                source_namespace: "app".into(),
                data_mover_config: None,
                cancel: false,
                operation_timeout: GoDuration(Duration::from_secs(600)),
            },
        );
        du.status = Some(DataUploadStatus {
            phase: Some(phase),
            accepted_by_node: accepted.into(),
            node: node.into(),
            ..DataUploadStatus::default()
        });
        if !exposed.is_empty() {
            du.annotations_mut().insert(annotations::EXPOSED_NODE.into(), exposed.into());
        }
        du
    }

    #[test]
    fn responsibility_follows_the_phase() {
        use DataUploadPhase as P;
        assert_eq!(responsible_node(&du(P::New, "", "", "")), None);
        assert_eq!(responsible_node(&du(P::Accepted, "a", "", "")).as_deref(), Some("a"));
        assert_eq!(responsible_node(&du(P::Prepared, "a", "b", "")).as_deref(), Some("b"));
        assert_eq!(responsible_node(&du(P::Prepared, "a", "", "")).as_deref(), Some("a"));
        assert_eq!(responsible_node(&du(P::InProgress, "a", "b", "c")).as_deref(), Some("c"));
        assert_eq!(responsible_node(&du(P::Canceling, "a", "b", "")).as_deref(), Some("b"));
        assert_eq!(responsible_node(&du(P::Failed, "a", "", "")).as_deref(), Some("a"));
        assert_eq!(responsible_node(&du(P::Accepted, "", "", "")), None);
    }

    #[test]
    fn phases_convert_both_ways() {
        for p in DataUploadPhase::ALL {
            let ours = Phase::from(p);
            assert_eq!(ours.as_str(), p.as_str());
            assert_eq!(DataUploadPhase::from(ours), p);
            assert_eq!(ours.is_terminal(), p.is_terminal());
        }
        for p in DataDownloadPhase::ALL {
            assert_eq!(DataDownloadPhase::from(Phase::from(p)), p);
        }
    }

    #[test]
    fn each_kind_of_restore_note_becomes_its_own_warning_event() {
        let outcome = RestoreOutcome {
            total_bytes: 1,
            warnings: vec!["w".into()],
            withheld: Some("held".into()),
            shortfall: Some("short".into()),
        };
        assert_eq!(
            DataDownload::outcome_warnings(&outcome),
            [
                (REPOSITORY_WARNING, "w".to_owned()),
                (RESTORE_WITHHELD, "held".to_owned()),
                (RESTORE_SHORTFALL, "short".to_owned())
            ]
        );
        assert!(DataDownload::outcome_warnings(&RestoreOutcome::default()).is_empty());
    }

    #[test]
    fn release_removes_finalizer_and_label_only() {
        let mut cr = du(DataUploadPhase::Completed, "a", "", "a");
        add_finalizer(&mut cr);
        add_finalizer(&mut cr);
        cr.finalizers_mut().push("other/finalizer".into());
        cr.labels_mut().insert(keys::EXPOSE_ON_GOING_LABEL.into(), "true".into());
        cr.labels_mut().insert("keep".into(), "me".into());
        assert_eq!(cr.finalizers().len(), 2);
        release(&mut cr);
        assert_eq!(cr.finalizers(), ["other/finalizer".to_owned()]);
        assert!(!has_expose_label(&cr));
        assert!(cr.labels().contains_key("keep"));
    }
}
