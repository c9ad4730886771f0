//! Telling a user something about a CR: an Event on it from this node's agent.

use ferry_agent::REPORTING_CONTROLLER;
use ferry_agent::event_recorder::{EventRecorder, note_within_limit};
use ferry_api::k8s_openapi::api::core::v1::ObjectReference;
use kube::Client;
use kube::runtime::events::{Event, EventType, Reporter};

/// Publishes an Event of `reason` with `note` on the CR `regarding`, reported by the agent on
/// `node`, with the same words in a log line (the Event's note cut to what the API server
/// takes). A failure to publish is logged, not returned: the Event only tells what the agent
/// is doing anyway.
pub(crate) async fn tell(
    client: &Client,
    node: &str,
    regarding: &ObjectReference,
    type_: EventType,
    reason: &str,
    note: String,
) {
    let kind = regarding.kind.as_deref().unwrap_or_default();
    let name = regarding.name.as_deref().unwrap_or_default();
    match type_ {
        EventType::Warning => tracing::warn!(%kind, %name, %node, "{note}"),
        EventType::Normal => tracing::info!(%kind, %name, %node, "{note}"),
    }
    let recorder = EventRecorder::new(
        client.clone(),
        Reporter { controller: REPORTING_CONTROLLER.to_owned(), instance: Some(node.to_owned()) },
    );
    let event = Event {
        type_,
        reason: reason.to_owned(),
        note: Some(note_within_limit(note)),
        action: reason.to_owned(),
        secondary: None,
    };
    if let Err(e) = recorder.publish(&event, regarding).await {
        tracing::warn!(%kind, %name, error = %e, "publishing the {reason} event failed");
    }
}
