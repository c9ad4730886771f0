//! Telling why a holding pod's claim is not bound yet.
//!
//! kube-scheduler holds a pod back while its claim of an Immediate class is unbound, and a
//! volume made from a snapshot may take minutes to provision, so that wait is bounded only by
//! the operation timeout ([`crate::pod`]). A claim that can never be provisioned (a class
//! whose provisioner is not running, a secret it needs missing, a driver refusing the size)
//! would then fail only at the timeout, saying no more than the scheduler does. The cluster
//! says why on the claim, in Events: the external-provisioner's `ProvisioningFailed` (a
//! Warning, each failed attempt) and `Provisioning` (each attempt), the PV controller's
//! `ExternalProvisioning` (waiting for a provisioner, repeated).
//!
//! Once a claim has been unbound longer than the grace, [`SlowClaim`] reads its Events (at
//! most every [`LOOK_EVERY`]), puts what they say in the wait's text (so the timeout's message
//! carries it) and tells it once: a log line and a [`WAITING_FOR_PROVISIONING`] Event on the
//! CR, a Warning unless the cluster's own word is a Normal Event of a provisioner at work.

use std::sync::{Mutex, PoisonError};
use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::{ObjectReference, PersistentVolumeClaim};
use ferry_api::k8s_openapi::api::events::v1::Event;
use ferry_api::k8s_openapi::jiff::Timestamp;
use kube::api::{Api, ListParams};
use kube::runtime::events::EventType;
use kube::{Client, ResourceExt};

use crate::ops::get_opt;
use crate::tell::tell;

/// The Event's reason.
pub const WAITING_FOR_PROVISIONING: &str = "WaitingForProvisioning";

/// How often a slow claim's Events are read again: each read lists Events, which the API
/// server does not cache by default.
const LOOK_EVERY: Duration = Duration::from_secs(15);

/// The PV controller's Event while a claim waits for an external provisioner.
const EXTERNAL_PROVISIONING: &str = "ExternalProvisioning";
/// The external-provisioner's Event at each attempt: a provisioner is at work.
const PROVISIONING: &str = "Provisioning";

/// What the cluster last said of a claim.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct News {
    /// Worth a Warning: a Warning Event, or no provisioner at work on the claim.
    pub warning: bool,
    /// `Reason, N times, last T ago: note`.
    pub text: String,
}

/// The news in a claim's Events at `now`: the latest Warning, else the latest Event. A
/// Warning is preferred because the PV controller repeats its Normal `ExternalProvisioning`
/// while a provisioner's `ProvisioningFailed` says what goes wrong; its count and age tell
/// whether it is still going wrong. Only `ExternalProvisioning`, never a `Provisioning`,
/// means no provisioner has taken the claim up: worth a Warning too.
pub(crate) fn latest(events: &[Event], now: Timestamp) -> Option<News> {
    let is_warning = |e: &&Event| e.type_.as_deref() == Some("Warning");
    let event = events
        .iter()
        .filter(is_warning)
        .max_by_key(|e| when(e))
        .or_else(|| events.iter().max_by_key(|e| when(e)))?;
    let reason = event.reason.as_deref().unwrap_or("Event");
    let unattended = reason == EXTERNAL_PROVISIONING
        && !events.iter().any(|e| e.reason.as_deref() == Some(PROVISIONING));
    let mut text = reason.to_owned();
    let count = event.series.as_ref().map(|s| s.count).or(event.deprecated_count).unwrap_or(1);
    if count > 1 {
        text.push_str(&format!(", {count} times"));
    }
    if let Some(at) = when(event) {
        let ago = now.duration_since(at).as_secs().max(0);
        text.push_str(&format!(", last {} ago", seconds_or_minutes(ago.unsigned_abs())));
    }
    // Provisioners' messages may run over lines (a wrapped gRPC error): one line here.
    let note = event.note.as_deref().unwrap_or_default().split_whitespace().collect::<Vec<_>>();
    if !note.is_empty() {
        text.push_str(": ");
        text.push_str(&note.join(" "));
    }
    if unattended {
        text.push_str(" (no provisioner has taken the claim up: is the provisioner of its StorageClass running?)");
    }
    Some(News { warning: unattended || is_warning(&event), text })
}

fn seconds_or_minutes(secs: u64) -> String {
    if secs < 120 { format!("{secs}s") } else { format!("{}m", secs / 60) }
}

/// When an Event was last seen: a series' last occurrence, else its time, else (an Event
/// written through the core API, as client-go's recorder does) its last timestamp, else its
/// creation.
fn when(event: &Event) -> Option<Timestamp> {
    event
        .series
        .as_ref()
        .map(|s| s.last_observed_time.0)
        .or_else(|| event.event_time.as_ref().map(|t| t.0))
        .or_else(|| event.deprecated_last_timestamp.as_ref().map(|t| t.0))
        .or_else(|| event.metadata.creation_timestamp.as_ref().map(|t| t.0))
}

/// What one reading of a claim found.
#[derive(Debug)]
pub(crate) enum Reading {
    /// The claim and what its Events say, if any.
    Claim {
        /// How long ago the claim was created, if it says.
        age: Option<Duration>,
        news: Option<News>,
    },
    /// No claim of that name.
    NoClaim,
    /// The claim or its Events could not be read.
    Failed(String),
}

/// The wait's text for `reading` of claim `claim` (`namespace/name`), unbound for at least
/// `waited`, and the Event to tell, if it is worth one. A reading that failed is not told: a
/// later one may succeed.
pub(crate) fn describe(
    reading: &Reading,
    claim: &str,
    waited: Duration,
) -> (String, Option<(EventType, String)>) {
    match reading {
        Reading::Claim { age, news } => {
            let unbound = age.unwrap_or(waited).max(waited).as_secs();
            let head = format!("claim {claim} not bound after {}", seconds_or_minutes(unbound));
            let (text, warning) = match news {
                Some(news) => (format!("{head}; its latest Event: {}", news.text), news.warning),
                None => (
                    format!(
                        "{head}, and it has no Events (they expired, or nothing has acted on \
                         it: is the provisioner of its StorageClass running?)"
                    ),
                    true,
                ),
            };
            let type_ = if warning { EventType::Warning } else { EventType::Normal };
            (text.clone(), Some((type_, text)))
        }
        Reading::NoClaim => (format!("claim {claim} not found"), None),
        Reading::Failed(e) => (format!("the Events of claim {claim} could not be read: {e}"), None),
    }
}

/// A holding pod's claim, and whom to tell when it is slow to be bound.
pub(crate) struct SlowClaim<'a> {
    client: &'a Client,
    namespace: &'a str,
    claim: &'a str,
    /// The agent's node, the Event's reporting instance.
    node: &'a str,
    /// The CR the Event is about.
    regarding: ObjectReference,
    seen: Mutex<Seen>,
}

#[derive(Default)]
struct Seen {
    looked: Option<Instant>,
    text: String,
    told: bool,
}

impl<'a> SlowClaim<'a> {
    /// Claim `namespace/claim` of the CR `regarding`, exposed by the agent on `node`.
    pub(crate) fn new(
        client: &'a Client,
        namespace: &'a str,
        claim: &'a str,
        node: &'a str,
        regarding: ObjectReference,
    ) -> Self {
        Self { client, namespace, claim, node, regarding, seen: Mutex::default() }
    }

    /// What the cluster says of the claim, unbound for `waited` (longer than the grace): read
    /// again at most every [`LOOK_EVERY`], told once.
    pub(crate) async fn news(&self, waited: Duration) -> String {
        let due = {
            let seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            seen.looked.is_none_or(|at| at.elapsed() >= LOOK_EVERY)
        };
        if !due {
            return self.seen.lock().unwrap_or_else(PoisonError::into_inner).text.clone();
        }
        let reading = self.read().await;
        let (text, event) =
            describe(&reading, &format!("{}/{}", self.namespace, self.claim), waited);
        let tell_now = {
            let mut seen = self.seen.lock().unwrap_or_else(PoisonError::into_inner);
            seen.looked = Some(Instant::now());
            seen.text.clone_from(&text);
            event.filter(|_| !std::mem::replace(&mut seen.told, true))
        };
        if let Some((type_, note)) = tell_now {
            tell(self.client, self.node, &self.regarding, type_, WAITING_FOR_PROVISIONING, note)
                .await;
        }
        text
    }

    /// The claim's age and the news in its Events (those of this claim, not of an earlier one
    /// of the same name).
    async fn read(&self) -> Reading {
        let claims: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), self.namespace);
        let claim = match get_opt(&claims, self.claim, "reading the holding pod's claim").await {
            Ok(Some(claim)) => claim,
            Ok(None) => return Reading::NoClaim,
            Err(e) => return Reading::Failed(e.to_string()),
        };
        let mut fields =
            format!("regarding.kind=PersistentVolumeClaim,regarding.name={}", self.claim);
        if let Some(uid) = claim.uid() {
            fields.push_str(&format!(",regarding.uid={uid}"));
        }
        let events: Api<Event> = Api::namespaced(self.client.clone(), self.namespace);
        let listed = match events.list(&ListParams::default().fields(&fields)).await {
            Ok(listed) => listed,
            Err(e) => {
                tracing::warn!(claim = %self.claim, error = %e, "reading the claim's Events");
                let e = ferry_kube::ApiError::from_kube("Event", &fields, e);
                return Reading::Failed(e.to_string());
            }
        };
        let now = Timestamp::now();
        let age =
            claim.metadata.creation_timestamp.as_ref().map(|t| {
                Duration::from_secs(now.duration_since(t.0).as_secs().max(0).unsigned_abs())
            });
        Reading::Claim { age, news: latest(&listed.items, now) }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use serde_json::json;

    use super::*;

    fn event(type_: &str, reason: &str, note: &str, time: serde_json::Value) -> Event {
        let mut value = json!({
            "metadata": { "name": format!("{reason}.1"), "namespace": "velero" },
            "eventTime": null, "type": type_, "reason": reason, "note": note,
        });
        value.as_object_mut().unwrap().extend(time.as_object().unwrap().clone());
        serde_json::from_value(value).unwrap()
    }

    fn at(text: &str) -> Timestamp {
        text.parse().unwrap()
    }

    #[test]
    fn the_latest_warning_is_the_news_before_any_later_normal_event_with_its_count_and_age() {
        let failed = |at: &str, count: i32, note: &str| {
            event(
                "Warning",
                "ProvisioningFailed",
                note,
                json!({ "deprecatedLastTimestamp": at, "deprecatedCount": count }),
            )
        };
        let events = [
            failed("2026-11-29T10:00:00Z", 1, "old attempt"),
            // The PV controller's series, seen after every failure.
            event(
                "Normal",
                EXTERNAL_PROVISIONING,
                "Waiting for a volume to be created",
                json!({ "series": { "count": 9, "lastObservedTime": "2026-11-29T10:05:00.000000Z" } }),
            ),
            failed("2026-11-29T10:04:00Z", 3, " rpc error:\n  secret \"absent\"\tnot found\n"),
            event(
                "Normal",
                PROVISIONING,
                "External provisioner is provisioning",
                json!({ "eventTime": "2026-11-29T10:04:30.000000Z" }),
            ),
        ];
        assert_eq!(
            latest(&events, at("2026-11-29T10:04:05Z")),
            Some(News {
                warning: true,
                text: "ProvisioningFailed, 3 times, last 5s ago: rpc error: secret \"absent\" \
                       not found"
                    .into()
            })
        );
        // Long ago is told in minutes: a failure that is not repeating is visibly old.
        let old = latest(&events, at("2026-11-29T10:14:00Z")).unwrap();
        assert!(old.text.contains("last 10m ago"), "{}", old.text);
    }

    #[test]
    fn a_provisioner_at_work_is_normal_news_and_none_at_all_is_a_warning() {
        let waiting = event(
            "Normal",
            EXTERNAL_PROVISIONING,
            "Waiting for a volume to be created either by the external provisioner 'x'",
            json!({ "metadata": { "name": "e", "creationTimestamp": "2026-11-29T10:01:00Z" } }),
        );
        let working = event(
            "Normal",
            PROVISIONING,
            "External provisioner is provisioning volume for claim",
            json!({ "eventTime": "2026-11-29T10:00:00.000000Z" }),
        );
        let now = at("2026-11-29T10:01:30Z");
        let news = latest(&[working, waiting.clone()], now).unwrap();
        assert!(!news.warning, "{news:?}");
        assert!(news.text.starts_with("ExternalProvisioning, last 30s ago: Waiting"), "{news:?}");
        // No provisioner has ever taken the claim up: a class whose provisioner is not running.
        let news = latest(&[waiting], now).unwrap();
        assert!(
            news.warning && news.text.contains("no provisioner has taken the claim up"),
            "{news:?}"
        );
        assert_eq!(latest(&[], now), None);
    }

    #[test]
    fn a_reading_is_told_by_what_it_found_and_a_failed_one_is_not_told() {
        let waited = Duration::from_secs(20);
        let news = News { warning: true, text: "ProvisioningFailed: no".into() };
        let claim = Reading::Claim { age: Some(Duration::from_secs(200)), news: Some(news) };
        let (text, event) = describe(&claim, "velero/x", waited);
        // The claim's own age, not this wait's (an agent restarted meanwhile).
        assert_eq!(
            text,
            "claim velero/x not bound after 3m; its latest Event: ProvisioningFailed: no"
        );
        assert!(matches!(event, Some((EventType::Warning, note)) if note == text));

        let quiet = Reading::Claim { age: None, news: None };
        let (text, event) = describe(&quiet, "velero/x", waited);
        assert!(text.starts_with("claim velero/x not bound after 20s, and it has no Events"));
        assert!(matches!(event, Some((EventType::Warning, _))));

        let working = News { warning: false, text: "Provisioning: at work".into() };
        let claim = Reading::Claim { age: Some(Duration::from_secs(30)), news: Some(working) };
        assert!(matches!(describe(&claim, "velero/x", waited).1, Some((EventType::Normal, _))));

        let (text, event) = describe(&Reading::Failed("forbidden".into()), "velero/x", waited);
        assert_eq!(
            (text.as_str(), event),
            ("the Events of claim velero/x could not be read: forbidden", None)
        );
        assert_eq!(describe(&Reading::NoClaim, "velero/x", waited).1, None);
    }
}
