//! Events on the CRs: one for every phase change and every failure.

use kube::Resource;
use kube::runtime::events::{Event, EventType, Reporter};

use crate::event_recorder::EventRecorder;

/// Publishes Events on DataUploads and DataDownloads as `ferry-agent` on this node.
#[derive(Clone)]
pub(crate) struct Events {
    recorder: EventRecorder,
}

impl std::fmt::Debug for Events {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Events").finish_non_exhaustive()
    }
}

/// The reporting controller's name on every Event.
pub const REPORTING_CONTROLLER: &str = "ferry-agent";
/// The reason of the Warning Event on a Completed CR for something found in its repository
/// that the operator should act on.
pub const REPOSITORY_WARNING: &str = "RepositoryWarning";
/// The reason of the Warning Event on a Completed DataDownload that withheld parts of the
/// snapshot (see `RestoreOutcome::withheld`).
pub const RESTORE_WITHHELD: &str = "RestoreWithheld";
/// The reason of the Warning Event on a Completed DataDownload whose volume lacks something
/// though the restore wrote all the snapshot holds (see `RestoreOutcome::shortfall`).
pub const RESTORE_SHORTFALL: &str = "RestoreShortfall";

impl Events {
    pub(crate) fn new(client: kube::Client, node: &str) -> Self {
        let reporter = Reporter {
            controller: REPORTING_CONTROLLER.to_owned(),
            instance: Some(node.to_owned()),
        };
        Self { recorder: EventRecorder::new(client, reporter) }
    }

    /// A normal Event; `reason` is the phase reached or the step done.
    pub(crate) async fn normal<K: Resource<DynamicType = ()>>(
        &self,
        cr: &K,
        reason: &str,
        note: String,
    ) {
        self.publish(cr, EventType::Normal, reason, note).await;
    }

    /// A warning Event (failures).
    pub(crate) async fn warning<K: Resource<DynamicType = ()>>(
        &self,
        cr: &K,
        reason: &str,
        note: String,
    ) {
        self.publish(cr, EventType::Warning, reason, note).await;
    }

    async fn publish<K: Resource<DynamicType = ()>>(
        &self,
        cr: &K,
        type_: EventType,
        reason: &str,
        note: String,
    ) {
        let event = Event {
            type_,
            reason: reason.to_owned(),
            note: Some(crate::event_recorder::note_within_limit(note)),
            action: reason.to_owned(),
            secondary: None,
        };
        if let Err(e) = self.recorder.publish(&event, &cr.object_ref(&())).await {
            tracing::warn!(reason, error = %e, "publishing an event failed");
        }
    }
}
