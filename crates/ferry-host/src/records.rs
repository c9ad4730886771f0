//! Velero's records of asynchronous item operations, `<name>-itemoperations.json.gz`, byte for
//! byte as Velero writes them.
//!
//! Two quirks of the shipped Go types are part of the format: the struct tags of
//! `ResourceIdentifier`, `OperationID` and `PostOperationItems` are malformed in Velero, so Go
//! writes those fields under their Go names, and a `ResourceIdentifier` (an embedded
//! `schema.GroupResource` without tags) writes `Group`, `Resource`, `Namespace` and `Name`. Go's
//! encoder also escapes `<`, `>`, `&`, U+2028 and U+2029 inside strings and ends the document
//! with a newline; [`encode`] does the same. Times are `metav1.Time`: RFC 3339 in UTC, whole
//! seconds.

use std::io::{Read as _, Write as _};

use jiff::Timestamp;
use serde::de::DeserializeOwned;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

/// The most a decompressed record file may hold: far above any real backup's, and a bound on
/// what a hostile or damaged file can make the host allocate.
pub const MAX_DECODED_BYTES: u64 = 64 << 20;

/// Why a record file cannot be read or written.
#[derive(Debug, thiserror::Error)]
pub enum RecordError {
    /// The gzip stream is damaged or truncated.
    #[error("item operations record is not valid gzip: {0}")]
    Gzip(#[source] std::io::Error),
    /// The decompressed record is larger than [`MAX_DECODED_BYTES`].
    #[error("item operations record decompresses to more than {MAX_DECODED_BYTES} bytes")]
    TooLarge,
    /// The JSON does not match Velero's format.
    #[error("item operations record is not Velero's format: {0}")]
    Json(#[source] serde_json::Error),
}

/// An item by group, resource, namespace and name (Velero's `velero.ResourceIdentifier`).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct ResourceIdentifier {
    /// API group, empty for the core group.
    #[serde(rename = "Group", default)]
    pub group: String,
    /// Resource (plural), e.g. `persistentvolumeclaims`.
    #[serde(rename = "Resource", default)]
    pub resource: String,
    /// Namespace, empty for cluster-scoped items.
    #[serde(rename = "Namespace", default)]
    pub namespace: String,
    /// Name.
    #[serde(rename = "Name", default)]
    pub name: String,
}

impl From<&ferry_proto::generated::ResourceIdentifier> for ResourceIdentifier {
    fn from(r: &ferry_proto::generated::ResourceIdentifier) -> Self {
        Self {
            group: r.group.clone(),
            resource: r.resource.clone(),
            namespace: r.namespace.clone(),
            name: r.name.clone(),
        }
    }
}

/// An item operation's phase (Velero's `OperationPhase`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
pub enum OperationPhase {
    /// Created, not started by the plugin yet.
    New,
    /// Started by the plugin.
    InProgress,
    /// Finished successfully.
    Completed,
    /// Finished with an error (also timed out).
    Failed,
}

impl OperationPhase {
    /// Whether the host still polls an operation in this phase.
    #[must_use]
    pub fn is_pending(self) -> bool {
        matches!(self, Self::New | Self::InProgress)
    }
}

/// An operation's state (Velero's `OperationStatus`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct OperationStatus {
    /// The phase.
    pub phase: OperationPhase,
    /// Why the operation failed.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub error: String,
    /// Units done.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub n_completed: i64,
    /// Units in total.
    #[serde(default, skip_serializing_if = "is_zero")]
    pub n_total: i64,
    /// What the units are (Ferry: `Bytes`).
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub operation_units: String,
    /// The plugin's short description of the state.
    #[serde(default, skip_serializing_if = "String::is_empty")]
    pub description: String,
    /// When the host recorded the operation.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "meta_time")]
    pub created: Option<Timestamp>,
    /// When the plugin says it started.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "meta_time")]
    pub started: Option<Timestamp>,
    /// When the plugin last reported progress.
    #[serde(default, skip_serializing_if = "Option::is_none", with = "meta_time")]
    pub updated: Option<Timestamp>,
}

impl OperationStatus {
    /// A new operation, recorded at `created` (in whole seconds, as the record keeps it).
    #[must_use]
    pub fn new(created: Timestamp) -> Self {
        let created = Timestamp::from_second(created.as_second()).unwrap_or(created);
        Self {
            phase: OperationPhase::New,
            error: String::new(),
            n_completed: 0,
            n_total: 0,
            operation_units: String::new(),
            description: String::new(),
            created: Some(created),
            started: None,
            updated: None,
        }
    }
}

// serde's `skip_serializing_if` takes a reference.
#[allow(clippy::trivially_copy_pass_by_ref)]
fn is_zero(n: &i64) -> bool {
    *n == 0
}

/// What a backup's operation is about (Velero's `BackupOperationSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct BackupOperationSpec {
    /// The Backup's name.
    #[serde(rename = "backupName")]
    pub backup_name: String,
    /// The Backup's UID.
    #[serde(rename = "backupUID")]
    pub backup_uid: String,
    /// The BackupItemAction (plugin name) that started the operation.
    #[serde(rename = "backupItemAction")]
    pub backup_item_action: String,
    /// The item the action ran on.
    #[serde(rename = "ResourceIdentifier")]
    pub resource_identifier: ResourceIdentifier,
    /// The operation ID the action returned.
    #[serde(rename = "OperationID")]
    pub operation_id: String,
    /// Items to back up again once the operation is done (Go writes `null` for none).
    #[serde(rename = "PostOperationItems")]
    pub post_operation_items: Option<Vec<ResourceIdentifier>>,
}

/// What a restore's operation is about (Velero's `RestoreOperationSpec`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RestoreOperationSpec {
    /// The Restore's name.
    #[serde(rename = "restoreName")]
    pub restore_name: String,
    /// The Restore's UID.
    #[serde(rename = "restoreUID")]
    pub restore_uid: String,
    /// The RestoreItemAction (plugin name) that started the operation.
    #[serde(rename = "restoreItemAction")]
    pub restore_item_action: String,
    /// The item the action ran on.
    #[serde(rename = "ResourceIdentifier")]
    pub resource_identifier: ResourceIdentifier,
    /// The operation ID the action returned.
    #[serde(rename = "OperationID")]
    pub operation_id: String,
}

/// What the monitor needs of either spec.
pub trait OperationSpec {
    /// The plugin (action) name to ask.
    fn action(&self) -> &str;
    /// The operation ID to ask about.
    fn operation_id(&self) -> &str;
}

impl OperationSpec for BackupOperationSpec {
    fn action(&self) -> &str {
        &self.backup_item_action
    }
    fn operation_id(&self) -> &str {
        &self.operation_id
    }
}

impl OperationSpec for RestoreOperationSpec {
    fn action(&self) -> &str {
        &self.restore_item_action
    }
    fn operation_id(&self) -> &str {
        &self.operation_id
    }
}

/// One recorded operation: Velero's `BackupOperation` or `RestoreOperation`.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Operation<S> {
    /// What it is.
    pub spec: S,
    /// Where it stands.
    pub status: OperationStatus,
}

/// A backup's operation.
pub type BackupOperation = Operation<BackupOperationSpec>;
/// A restore's operation.
pub type RestoreOperation = Operation<RestoreOperationSpec>;

/// The record's file name for a backup or restore called `name`.
#[must_use]
pub fn file_name(name: &str) -> String {
    format!("{name}-itemoperations.json.gz")
}

/// The JSON Go's encoder writes for `ops` (HTML-safe escapes, trailing newline).
///
/// # Errors
/// [`RecordError::Json`] (not expected for these types).
pub fn to_go_json<S: Serialize>(ops: &[Operation<S>]) -> Result<Vec<u8>, RecordError> {
    let json = serde_json::to_string(ops).map_err(RecordError::Json)?;
    let mut out = String::with_capacity(json.len() + 1);
    // The characters Go escapes never appear in JSON outside strings, so a plain pass over
    // the text escapes exactly what Go escapes.
    for c in json.chars() {
        match c {
            '<' => out.push_str("\\u003c"),
            '>' => out.push_str("\\u003e"),
            '&' => out.push_str("\\u0026"),
            '\u{2028}' => out.push_str("\\u2028"),
            '\u{2029}' => out.push_str("\\u2029"),
            c => out.push(c),
        }
    }
    out.push('\n');
    Ok(out.into_bytes())
}

/// `ops` as the gzip file Velero stores.
///
/// # Errors
/// [`RecordError`] when compressing fails (not expected in memory).
pub fn encode<S: Serialize>(ops: &[Operation<S>]) -> Result<Vec<u8>, RecordError> {
    let json = to_go_json(ops)?;
    let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
    gz.write_all(&json).map_err(RecordError::Gzip)?;
    gz.finish().map_err(RecordError::Gzip)
}

/// Reads a record file (untrusted: bounded, never panics).
///
/// # Errors
/// [`RecordError`] naming what is wrong.
pub fn decode<S: DeserializeOwned>(bytes: &[u8]) -> Result<Vec<Operation<S>>, RecordError> {
    let mut json = Vec::new();
    flate2::read::GzDecoder::new(bytes)
        .take(MAX_DECODED_BYTES + 1)
        .read_to_end(&mut json)
        .map_err(RecordError::Gzip)?;
    if json.len() as u64 > MAX_DECODED_BYTES {
        return Err(RecordError::TooLarge);
    }
    serde_json::from_slice(&json).map_err(RecordError::Json)
}

/// `metav1.Time` in JSON: RFC 3339, UTC, whole seconds (fractions cut, as Go's format does).
mod meta_time {
    use super::{Deserialize, Deserializer, Serializer, Timestamp};

    // serde's `with` passes a reference.
    #[allow(clippy::ref_option)]
    pub(super) fn serialize<S: Serializer>(t: &Option<Timestamp>, s: S) -> Result<S::Ok, S::Error> {
        match t {
            Some(t) => {
                let whole =
                    Timestamp::from_second(t.as_second()).map_err(serde::ser::Error::custom)?;
                s.serialize_str(&whole.to_string())
            }
            None => s.serialize_none(),
        }
    }

    pub(super) fn deserialize<'de, D: Deserializer<'de>>(
        d: D,
    ) -> Result<Option<Timestamp>, D::Error> {
        let text: Option<String> = Option::deserialize(d)?;
        text.map(|t| t.parse::<Timestamp>().map_err(serde::de::Error::custom)).transpose()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;
    use proptest::prelude::*;

    fn at(secs: i64) -> Timestamp {
        Timestamp::from_second(secs).unwrap()
    }

    fn backup_op() -> BackupOperation {
        Operation {
            spec: BackupOperationSpec {
                backup_name: "nightly".into(),
                backup_uid: "4f6c-uid".into(),
                backup_item_action: "ferry.io/pvc-backupper".into(),
                resource_identifier: ResourceIdentifier {
                    group: String::new(),
                    resource: "persistentvolumeclaims".into(),
                    namespace: "apps".into(),
                    name: "data".into(),
                },
                operation_id: "du-nightly-1.abc".into(),
                post_operation_items: Some(vec![ResourceIdentifier {
                    group: "velero.io".into(),
                    resource: "datauploads".into(),
                    namespace: "velero".into(),
                    name: "nightly-x7".into(),
                }]),
            },
            status: OperationStatus {
                phase: OperationPhase::InProgress,
                n_completed: 400,
                n_total: 1000,
                operation_units: "Bytes".into(),
                description: "InProgress".into(),
                started: Some(at(1_800_000_010)),
                ..OperationStatus::new(Timestamp::from_second(1_800_000_000).unwrap())
            },
        }
    }

    #[test]
    fn backup_records_are_written_as_velero_writes_them() {
        // What Velero's Go types marshal to for the same operation.
        let go = concat!(
            r#"[{"spec":{"backupName":"nightly","backupUID":"4f6c-uid","#,
            r#""backupItemAction":"ferry.io/pvc-backupper","ResourceIdentifier":{"Group":"","#,
            r#""Resource":"persistentvolumeclaims","Namespace":"apps","Name":"data"},"#,
            r#""OperationID":"du-nightly-1.abc","PostOperationItems":[{"Group":"velero.io","#,
            r#""Resource":"datauploads","Namespace":"velero","Name":"nightly-x7"}]},"#,
            r#""status":{"phase":"InProgress","nCompleted":400,"nTotal":1000,"#,
            r#""operationUnits":"Bytes","description":"InProgress","#,
            r#""created":"2027-01-15T08:00:00Z","started":"2027-01-15T08:00:10Z"}}]"#,
            "\n"
        );
        assert_eq!(String::from_utf8(to_go_json(&[backup_op()]).unwrap()).unwrap(), go);
        let back: Vec<BackupOperation> = serde_json::from_str(go).unwrap();
        assert_eq!(back, [backup_op()]);
    }

    #[test]
    fn go_writes_null_for_no_post_operation_items_and_escapes_html() {
        let mut op = backup_op();
        op.spec.post_operation_items = None;
        op.status = OperationStatus {
            phase: OperationPhase::Failed,
            error: "DataUpload failed: <disk> full & \u{2028}".into(),
            ..OperationStatus::new(at(1_800_000_000))
        };
        let json = String::from_utf8(to_go_json(&[op.clone()]).unwrap()).unwrap();
        assert!(json.contains(r#""PostOperationItems":null}"#), "{json}");
        assert!(
            json.contains(r#""error":"DataUpload failed: \u003cdisk\u003e full \u0026 \u2028""#),
            "{json}"
        );
        assert_eq!(decode::<BackupOperationSpec>(&encode(&[op.clone()]).unwrap()).unwrap(), [op]);
    }

    #[test]
    fn restore_records_have_no_post_operation_items() {
        let op = RestoreOperation {
            spec: RestoreOperationSpec {
                restore_name: "r".into(),
                restore_uid: "u".into(),
                restore_item_action: "ferry.io/pvc-restorer".into(),
                resource_identifier: ResourceIdentifier::default(),
                operation_id: "dd-r-1".into(),
            },
            status: OperationStatus::new(at(1_800_000_000)),
        };
        let json = String::from_utf8(to_go_json(&[op]).unwrap()).unwrap();
        assert_eq!(
            json,
            concat!(
                r#"[{"spec":{"restoreName":"r","restoreUID":"u","#,
                r#""restoreItemAction":"ferry.io/pvc-restorer","ResourceIdentifier":{"Group":"","#,
                r#""Resource":"","Namespace":"","Name":""},"OperationID":"dd-r-1"},"#,
                r#""status":{"phase":"New","created":"2027-01-15T08:00:00Z"}}]"#,
                "\n"
            )
        );
    }

    #[test]
    fn fractions_of_a_second_are_cut_as_go_cuts_them() {
        let mut op = backup_op();
        op.status.updated = Some("2027-01-15T08:00:20.999Z".parse().unwrap());
        let json = String::from_utf8(to_go_json(&[op]).unwrap()).unwrap();
        assert!(json.contains(r#""updated":"2027-01-15T08:00:20Z""#), "{json}");
    }

    #[test]
    fn damaged_and_hostile_files_are_refused_with_the_reason() {
        let good = encode(&[backup_op()]).unwrap();
        let truncated = &good[..good.len() - 5];
        assert!(matches!(decode::<BackupOperationSpec>(truncated), Err(RecordError::Gzip(_))));
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::default());
        gz.write_all(br#"[{"spec":{},"status":{"phase":"Sleeping"}}]"#).unwrap();
        let err = decode::<BackupOperationSpec>(&gz.finish().unwrap()).unwrap_err();
        assert!(matches!(err, RecordError::Json(_)), "{err}");
        // A gzip bomb: zeros that decompress past the bound.
        let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::best());
        let zeros = vec![b' '; 1 << 20];
        for _ in 0..=(MAX_DECODED_BYTES >> 20) {
            gz.write_all(&zeros).unwrap();
        }
        let bomb = gz.finish().unwrap();
        assert!(bomb.len() < 2 << 20);
        assert!(matches!(decode::<BackupOperationSpec>(&bomb), Err(RecordError::TooLarge)));
    }

    proptest! {
        #[test]
        fn decoding_arbitrary_bytes_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..512)) {
            let _ = decode::<BackupOperationSpec>(&bytes);
            let mut gz = flate2::write::GzEncoder::new(Vec::new(), flate2::Compression::fast());
            gz.write_all(&bytes).unwrap();
            let _ = decode::<RestoreOperationSpec>(&gz.finish().unwrap());
        }

        #[test]
        fn any_text_survives_a_round_trip(error in "\\PC{0,40}", name in "[a-z0-9.-]{1,20}") {
            let mut op = backup_op();
            op.status.error = error;
            op.spec.resource_identifier.name = name;
            let back = decode::<BackupOperationSpec>(&encode(&[op.clone()]).unwrap()).unwrap();
            prop_assert_eq!(back, vec![op]);
        }
    }
}
