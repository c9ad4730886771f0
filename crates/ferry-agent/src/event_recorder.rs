//! Events under names the API server accepts, however long the object's name.
//!
//! kube's [`Recorder`] names an Event `<object name>.<hex nanoseconds>`. An object may have a
//! name of 253 characters, and so may an Event: for an object named with more than about 236
//! characters the Event's name is too long and the API server refuses it. [`EventRecorder`]
//! leaves every other object to kube's Recorder and publishes the Events of these itself, the
//! way kube's Recorder does (a repeat within six minutes becomes a series on the first Event),
//! under [`event_name`]: the object's name cut short, a hash of the whole name, the timestamp.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, PoisonError};

use ferry_api::naming::valid_label_value;
use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::api::events::v1::{Event as K8sEvent, EventSeries};
use k8s_openapi::apimachinery::pkg::apis::meta::v1::{MicroTime, ObjectMeta};
use k8s_openapi::jiff::{SignedDuration, Timestamp};
use kube::api::{Api, Patch, PatchParams, PostParams};
use kube::runtime::events::{Event, EventType, Recorder, Reporter};

/// Longest note the API server accepts on an Event, in bytes.
pub const MAX_NOTE_LEN: usize = 1000;

/// `note` cut to [`MAX_NOTE_LEN`] bytes (at a character boundary).
#[must_use]
pub fn note_within_limit(mut note: String) -> String {
    if note.len() > MAX_NOTE_LEN {
        let mut cut = MAX_NOTE_LEN;
        while !note.is_char_boundary(cut) {
            cut -= 1;
        }
        note.truncate(cut);
    }
    note
}

/// Longest name of an object (a DNS subdomain), Events included.
pub const MAX_NAME_LEN: usize = 253;

/// Hex digits of the hash that keeps shortened names apart.
const HASH_LEN: usize = 6;

/// How long a published Event can still become a series (kube's Recorder keeps its Events
/// as long).
const SERIES_WINDOW: SignedDuration = SignedDuration::from_mins(6);

/// The name of the Event on the object named `object` that happened `nanos` nanoseconds
/// after the epoch: `<object>.<nanos in hex>` as kube's Recorder names it when that fits in
/// [`MAX_NAME_LEN`]; otherwise the object's name cut short (and off any `.` or `-` it would
/// end in), `-`, the first six hex digits of the SHA-256 of the whole name, `.<nanos in hex>`.
///
/// For a valid object name the result is a valid DNS subdomain, and the same object and
/// time always give the same name.
#[must_use]
pub fn event_name(object: &str, nanos: i128) -> String {
    let stamp = format!("{nanos:x}");
    if fits(object, &stamp) {
        return format!("{object}.{stamp}");
    }
    let hash = name_hash(object);
    let room = MAX_NAME_LEN.saturating_sub(stamp.len() + HASH_LEN + 2);
    let mut cut = room.min(object.len());
    while !object.is_char_boundary(cut) {
        cut -= 1;
    }
    // A label of a DNS subdomain ends in a letter or digit.
    let kept = object[..cut].trim_end_matches(|c: char| !c.is_ascii_alphanumeric());
    if kept.is_empty() { format!("{hash}.{stamp}") } else { format!("{kept}-{hash}.{stamp}") }
}

/// Whether kube's `<object>.<stamp>` is short enough to be a name.
fn fits(object: &str, stamp: &str) -> bool {
    object.len() + 1 + stamp.len() <= MAX_NAME_LEN
}

/// The first six hex digits of the SHA-256 of `name`: Velero's label-value rule appends
/// exactly these to a value longer than a label, and only names far longer than a label are
/// hashed here.
fn name_hash(name: &str) -> String {
    debug_assert!(name.len() > ferry_api::naming::MAX_LABEL_VALUE_LEN);
    let label = valid_label_value(name);
    label[label.len().saturating_sub(HASH_LEN)..].to_owned()
}

/// Publishes Events like kube's [`Recorder`], under a name the API server accepts whatever
/// the name of the object they are about ([`event_name`]); `regarding` is always the object
/// itself.
#[derive(Clone)]
pub struct EventRecorder {
    kube: Recorder,
    client: kube::Client,
    reporter: Reporter,
    /// The Events published for long-named objects, by what makes a repeat.
    long: Arc<Mutex<HashMap<SeriesKey, K8sEvent>>>,
}

impl std::fmt::Debug for EventRecorder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("EventRecorder").field("reporter", &self.reporter).finish_non_exhaustive()
    }
}

impl EventRecorder {
    /// A recorder publishing as `reporter`.
    #[must_use]
    pub fn new(client: kube::Client, reporter: Reporter) -> Self {
        Self {
            kube: Recorder::new(client.clone(), reporter.clone()),
            client,
            reporter,
            long: Arc::default(),
        }
    }

    /// Publishes `event` about `regarding`: a new Event, or the next occurrence of the same
    /// Event (type, action, reason, object, related object) published in the last six
    /// minutes, as kube's [`Recorder::publish`] does.
    ///
    /// # Errors
    /// The API server refused to create or patch the Event.
    pub async fn publish(
        &self,
        event: &Event,
        regarding: &ObjectReference,
    ) -> Result<(), kube::Error> {
        let now = Timestamp::now();
        match regarding.name.as_deref() {
            Some(name) if !fits(name, &format!("{:x}", now.as_nanosecond())) => {
                self.publish_long(event, regarding, now).await
            }
            _ => self.kube.publish(event, regarding).await,
        }
    }

    async fn publish_long(
        &self,
        event: &Event,
        regarding: &ObjectReference,
        now: Timestamp,
    ) -> Result<(), kube::Error> {
        let key = SeriesKey::new(event, regarding);
        let earlier = {
            let mut long = self.long.lock().unwrap_or_else(PoisonError::into_inner);
            long.retain(|_, e| last_seen(e).is_none_or(|at| at + SERIES_WINDOW > now));
            long.get(&key).cloned()
        };
        let api: Api<K8sEvent> = Api::namespaced(
            self.client.clone(),
            regarding.namespace.as_deref().unwrap_or("default"),
        );
        let published = match earlier {
            Some(mut repeat) => {
                let count = repeat.series.as_ref().map_or(2, |s| s.count + 1);
                repeat.series = Some(EventSeries { count, last_observed_time: MicroTime(now) });
                let name = repeat.metadata.name.clone().unwrap_or_default();
                api.patch(&name, &PatchParams::default(), &Patch::Merge(&repeat)).await?;
                repeat
            }
            None => {
                let first = new_event(&self.reporter, event, regarding, now);
                api.create(&PostParams::default(), &first).await?;
                first
            }
        };
        self.long.lock().unwrap_or_else(PoisonError::into_inner).insert(key, published);
        Ok(())
    }
}

/// When `event` was last seen.
fn last_seen(event: &K8sEvent) -> Option<Timestamp> {
    match &event.series {
        Some(series) => Some(series.last_observed_time.0),
        None => event.event_time.as_ref().map(|t| t.0),
    }
}

/// The first occurrence of `event` about `regarding` at `now`, as kube's Recorder builds it
/// but named by [`event_name`].
fn new_event(
    reporter: &Reporter,
    event: &Event,
    regarding: &ObjectReference,
    now: Timestamp,
) -> K8sEvent {
    let object = regarding.name.as_deref().unwrap_or(&reporter.controller);
    K8sEvent {
        metadata: ObjectMeta {
            name: Some(event_name(object, now.as_nanosecond())),
            namespace: regarding.namespace.clone(),
            ..ObjectMeta::default()
        },
        action: Some(event.action.clone()),
        reason: Some(event.reason.clone()),
        note: event.note.clone(),
        type_: Some(
            match event.type_ {
                EventType::Normal => "Normal",
                EventType::Warning => "Warning",
            }
            .to_owned(),
        ),
        event_time: Some(MicroTime(now)),
        regarding: Some(regarding.clone()),
        related: event.secondary.clone(),
        reporting_controller: Some(reporter.controller.clone()),
        reporting_instance: Some(
            reporter.instance.clone().unwrap_or_else(|| reporter.controller.clone()),
        ),
        series: None,
        deprecated_count: None,
        deprecated_first_timestamp: None,
        deprecated_last_timestamp: None,
        deprecated_source: None,
    }
}

/// What makes two publications the same Event (the reporter is the recorder's own).
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct SeriesKey {
    type_: EventType,
    action: String,
    reason: String,
    regarding: ReferenceKey,
    related: Option<ReferenceKey>,
}

impl SeriesKey {
    fn new(event: &Event, regarding: &ObjectReference) -> Self {
        Self {
            type_: event.type_,
            action: event.action.clone(),
            reason: event.reason.clone(),
            regarding: ReferenceKey::new(regarding),
            related: event.secondary.as_ref().map(ReferenceKey::new),
        }
    }
}

/// The fields of an object reference that tell objects apart.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
struct ReferenceKey {
    api_version: Option<String>,
    kind: Option<String>,
    namespace: Option<String>,
    name: Option<String>,
    uid: Option<String>,
}

impl ReferenceKey {
    fn new(r: &ObjectReference) -> Self {
        Self {
            api_version: r.api_version.clone(),
            kind: r.kind.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
            uid: r.uid.clone(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A time as the agent sees it today: 16 hex digits of nanoseconds.
    const NANOS: i128 = 0x1867_5a2b_3c4d_5e6f;

    /// Kubernetes' DNS-1123 subdomain rule.
    fn is_dns_subdomain(name: &str) -> bool {
        name.len() <= MAX_NAME_LEN
            && name.split('.').all(|label| {
                let bytes = label.as_bytes();
                !bytes.is_empty()
                    && bytes
                        .iter()
                        .all(|&b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-')
                    && bytes[0] != b'-'
                    && bytes[bytes.len() - 1] != b'-'
            })
    }

    /// A valid name of `len` characters with `sep` at every `every`th place.
    fn name_of(len: usize, sep: char, every: usize) -> String {
        (0..len).map(|i| if i % every == every - 1 && i + 1 < len { sep } else { 'a' }).collect()
    }

    #[test]
    fn short_names_are_kube_recorders() {
        assert_eq!(event_name("du-1", NANOS), "du-1.18675a2b3c4d5e6f");
        // The longest name that still fits beside the timestamp stays whole.
        let longest = "d".repeat(MAX_NAME_LEN - 17);
        assert_eq!(event_name(&longest, NANOS), format!("{longest}.18675a2b3c4d5e6f"));
        assert_eq!(event_name(&longest, NANOS).len(), MAX_NAME_LEN);
    }

    #[test]
    fn long_names_are_cut_and_hashed() {
        let long = "d".repeat(MAX_NAME_LEN - 16);
        let got = event_name(&long, NANOS);
        assert_eq!(got.len(), MAX_NAME_LEN);
        assert!(is_dns_subdomain(&got), "{got}");
        let hash = name_hash(&long);
        assert_eq!(hash.len(), HASH_LEN);
        assert!(got.ends_with(&format!("-{hash}.18675a2b3c4d5e6f")), "{got}");
        assert!(got.starts_with(&"d".repeat(200)), "{got}");
    }

    #[test]
    fn every_long_name_gives_a_valid_name() {
        for len in (MAX_NAME_LEN - 20)..=MAX_NAME_LEN {
            for (sep, every) in [('-', 2), ('.', 2), ('-', 7), ('.', 3), ('a', 1)] {
                let object = name_of(len, sep, every);
                assert!(is_dns_subdomain(&object), "{object}");
                for nanos in [NANOS, 1, i128::from(u64::MAX)] {
                    let got = event_name(&object, nanos);
                    assert!(is_dns_subdomain(&got), "{object} at {nanos}: {got}");
                }
            }
        }
    }

    #[test]
    fn names_are_deterministic_and_apart() {
        let a = format!("{}-a", "n".repeat(250));
        let b = format!("{}-b", "n".repeat(250));
        assert_eq!(event_name(&a, NANOS), event_name(&a, NANOS));
        // Cut to the same characters, told apart by the hash.
        assert_ne!(event_name(&a, NANOS), event_name(&b, NANOS));
        assert_ne!(event_name(&a, NANOS), event_name(&a, NANOS + 1));
    }

    #[test]
    fn a_long_named_event_still_regards_its_object() {
        let object = ObjectReference {
            api_version: Some("velero.io/v2alpha1".into()),
            kind: Some("DataUpload".into()),
            name: Some("u".repeat(MAX_NAME_LEN)),
            namespace: Some("velero".into()),
            uid: Some("0b3a63a4".into()),
            ..ObjectReference::default()
        };
        let reporter = Reporter { controller: "ferry-agent".into(), instance: Some("n1".into()) };
        let event = Event {
            type_: EventType::Warning,
            reason: "Failed".into(),
            note: Some("why".into()),
            action: "Failed".into(),
            secondary: None,
        };
        let now = Timestamp::from_nanosecond(NANOS).expect("a valid time");
        let built = new_event(&reporter, &event, &object, now);
        let name = built.metadata.name.as_deref().unwrap_or_default();
        assert!(is_dns_subdomain(name), "{name}");
        assert_eq!(built.metadata.namespace.as_deref(), Some("velero"));
        assert_eq!(built.regarding.as_ref(), Some(&object));
        assert_eq!(built.type_.as_deref(), Some("Warning"));
        assert_eq!(built.reporting_instance.as_deref(), Some("n1"));
        assert_eq!(built.event_time, Some(MicroTime(now)));
        assert!(built.series.is_none());
    }
}
