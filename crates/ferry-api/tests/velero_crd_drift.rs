//! Drift check between Velero's own DataUpload and DataDownload CRDs of the pinned version
//! (`ferry_testbed::velero::VELERO_VERSION`, as `velero install --crds-only` prints them), the
//! shared fixtures (Velero's main branch, after v1.18) and Ferry's types.
//!
//! Every field of a CRD's `openAPIV3Schema` is named by a dotted path
//! (`spec.csiSnapshot.volumeSnapshot`); a map is one path of type `map` whose values are
//! `path.*`, and array items are `path[]`. The checks:
//!
//! - the pinned CRDs and the fixtures' have the same paths, types, enums, nullability and
//!   required fields, except the differences listed in [`FIXTURE_DRIFT_ALLOWED`];
//! - fully populated Ferry objects write every path of the pinned CRDs (nothing Velero writes
//!   is dropped by a full-object update) and no other path (the API server would prune it),
//!   with compatible JSON types; Ferry writes `null` only where the CRD allows it and never
//!   omits a required field; Ferry's enums list exactly the CRDs' enum values. Deliberate
//!   exceptions are in [`FERRY_DRIFT_ALLOWED`].
//!
//! The pinned CRDs are read from the cached `velero` binary with `-o json`: the output is the
//! same object as `velero-crds.yaml` (checked: `-o yaml` prints that file byte for byte), and
//! JSON needs no YAML parser in this crate's dependencies.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt;
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::Duration;

use ferry_api::k8s_openapi::apiextensions_apiserver::pkg::apis::apiextensions::v1::{
    CustomResourceDefinition, JSONSchemaProps, JSONSchemaPropsOrArray, JSONSchemaPropsOrBool,
};
use ferry_api::k8s_openapi::jiff::Timestamp;
use ferry_api::{
    CsiSnapshotSpec, DataDownload, DataDownloadPhase, DataDownloadSpec, DataDownloadStatus,
    DataMoveOperationProgress, DataUpload, DataUploadPhase, DataUploadSpec, DataUploadStatus,
    GoDuration, NodeOs, SnapshotType, TargetVolumeSpec, Time,
};
use ferry_testbed::velero::{VELERO_VERSION, velero_dir};
use serde_json::{Value, json};

const DATA_UPLOADS: &str = "datauploads.velero.io";
const DATA_DOWNLOADS: &str = "datadownloads.velero.io";
const CRD_VERSION: &str = "v2alpha1";
const FIXTURES: &str = "the fixtures (Velero main d30d389b, after v1.18)";

/// A difference that is expected, and why.
#[derive(Debug)]
struct Allowed {
    crd: &'static str,
    path: &'static str,
    aspect: Aspect,
    why: &'static str,
}

/// Differences between the fixtures (Velero's main branch) and the pinned Velero that are
/// expected. Empty: for DataUpload and DataDownload, `config/crd/v2alpha1/bases/` of v1.18.3
/// and of the fixtures' commit are identical, and so is what `velero install` prints.
const FIXTURE_DRIFT_ALLOWED: &[Allowed] = &[];

/// Deliberate differences between Ferry's types and the pinned Velero's CRDs.
const FERRY_DRIFT_ALLOWED: &[Allowed] = &[Allowed {
    crd: DATA_UPLOADS,
    path: "spec.snapshotType",
    aspect: Aspect::Enum,
    why: "Velero's SnapshotType is an open string type without a kubebuilder enum; its only \
          value is SnapshotTypeCSI (\"CSI\"), the one value Ferry's closed enum accepts",
}];

// ---------------------------------------------------------------------------------------------
// Schema side

/// What a CRD schema says about one field.
#[derive(Debug, Clone, PartialEq, Eq)]
struct SchemaField {
    /// `string`, `string:date-time`, `integer:int64`, `boolean`, `object`, `map`, `array`, ...
    ty: String,
    /// The enum's values; empty when the field is not an enum.
    enum_values: BTreeSet<String>,
    nullable: bool,
    /// Listed in its parent object's `required`.
    required: bool,
}

type SchemaFields = BTreeMap<String, SchemaField>;

/// Every field path under `root` (an `openAPIV3Schema`).
fn schema_fields(root: &JSONSchemaProps) -> SchemaFields {
    let mut out = SchemaFields::new();
    collect_properties("", root, &mut out);
    out
}

fn collect_properties(prefix: &str, object: &JSONSchemaProps, out: &mut SchemaFields) {
    let required: BTreeSet<&str> = object.required.iter().flatten().map(String::as_str).collect();
    for (name, prop) in object.properties.iter().flatten() {
        collect_field(&join(prefix, name), prop, required.contains(name.as_str()), out);
    }
}

fn collect_field(path: &str, prop: &JSONSchemaProps, required: bool, out: &mut SchemaFields) {
    let enum_values = prop
        .enum_
        .iter()
        .flatten()
        .map(|v| v.0.as_str().map_or_else(|| v.0.to_string(), str::to_owned))
        .collect();
    let field = SchemaField {
        ty: schema_type(prop),
        enum_values,
        nullable: prop.nullable == Some(true),
        required,
    };
    out.insert(path.to_owned(), field);
    collect_properties(path, prop, out);
    if let Some(JSONSchemaPropsOrBool::Schema(values)) = &prop.additional_properties {
        collect_field(&format!("{path}.*"), values, false, out);
    }
    match &prop.items {
        Some(JSONSchemaPropsOrArray::Schema(item)) => {
            collect_field(&format!("{path}[]"), item, false, out);
        }
        Some(JSONSchemaPropsOrArray::Schemas(items)) => {
            for item in items {
                collect_field(&format!("{path}[]"), item, false, out);
            }
        }
        None => {}
    }
}

fn schema_type(prop: &JSONSchemaProps) -> String {
    if prop.x_kubernetes_int_or_string == Some(true) {
        return "int-or-string".into();
    }
    if prop.additional_properties.is_some() {
        return "map".into();
    }
    let base = prop.type_.as_deref().unwrap_or("any");
    let ty = match &prop.format {
        Some(format) => format!("{base}:{format}"),
        None => base.to_owned(),
    };
    if prop.x_kubernetes_preserve_unknown_fields == Some(true) {
        format!("{ty}+unknown")
    } else {
        ty
    }
}

fn join(prefix: &str, name: &str) -> String {
    if prefix.is_empty() { name.to_owned() } else { format!("{prefix}.{name}") }
}

/// The `v2alpha1` schema's fields of the CRD called `name`.
fn fields_of(crds: &[CustomResourceDefinition], name: &str, source: &str) -> SchemaFields {
    let crd = crds
        .iter()
        .find(|c| c.metadata.name.as_deref() == Some(name))
        .unwrap_or_else(|| panic!("{source} have no CRD {name}"));
    let schema = crd
        .spec
        .versions
        .iter()
        .find(|v| v.name == CRD_VERSION)
        .and_then(|v| v.schema.as_ref())
        .and_then(|s| s.open_api_v3_schema.as_ref())
        .unwrap_or_else(|| panic!("{source}: {name} has no {CRD_VERSION} openAPIV3Schema"));
    schema_fields(schema)
}

// ---------------------------------------------------------------------------------------------
// Ferry side

/// Every field path of a serialised object and the JSON type found there (`string`,
/// `string:date-time` for an RFC 3339 timestamp, `integer`, `boolean`, `object`, `map`,
/// `array`, `null`). `schema` says which objects are maps. `metadata` is the API server's, not
/// the CRD schema's, and is not entered.
fn json_fields(object: &Value, schema: &SchemaFields) -> BTreeMap<String, String> {
    let mut out = BTreeMap::new();
    if let Value::Object(members) = object {
        for (name, value) in members {
            walk_json(name, value, schema, &mut out);
        }
    }
    out
}

fn walk_json(path: &str, value: &Value, schema: &SchemaFields, out: &mut BTreeMap<String, String>) {
    let is_map = schema.get(path).is_some_and(|f| f.ty == "map");
    let kind = match value {
        Value::Null => "null",
        Value::Bool(_) => "boolean",
        Value::Number(n) if n.is_i64() || n.is_u64() => "integer",
        Value::Number(_) => "number",
        Value::String(s) if s.parse::<Timestamp>().is_ok() => "string:date-time",
        Value::String(_) => "string",
        Value::Array(_) => "array",
        Value::Object(_) if is_map => "map",
        Value::Object(_) => "object",
    };
    out.insert(path.to_owned(), kind.to_owned());
    match value {
        _ if path == "metadata" => {}
        Value::Object(members) if is_map => {
            let values = format!("{path}.*");
            for member in members.values() {
                walk_json(&values, member, schema, out);
            }
        }
        Value::Object(members) => {
            for (name, member) in members {
                walk_json(&join(path, name), member, schema, out);
            }
        }
        Value::Array(items) => {
            for item in items {
                walk_json(&format!("{path}[]"), item, schema, out);
            }
        }
        _ => {}
    }
}

/// Whether JSON of type `written` is valid for a field of schema type `ty`.
fn compatible(ty: &str, written: &str) -> bool {
    let base = ty.split(['+', ':']).next().unwrap_or(ty);
    match (base, written) {
        ("any", _) | ("int-or-string", "integer" | "string" | "string:date-time") => true,
        ("number", "integer" | "number") => true,
        ("string", "string" | "string:date-time") => ty != "string:date-time" || written == ty,
        _ => base == written,
    }
}

fn wire<T: serde::Serialize>(values: impl IntoIterator<Item = T>) -> BTreeSet<String> {
    values
        .into_iter()
        .map(|v| match serde_json::to_value(v).expect("enum serialises") {
            Value::String(s) => s,
            other => other.to_string(),
        })
        .collect()
}

fn upload_phases() -> BTreeSet<String> {
    // Exhaustive: a phase added to Ferry's enum stops this compiling until ALL is checked.
    for phase in DataUploadPhase::ALL {
        match phase {
            DataUploadPhase::New
            | DataUploadPhase::Accepted
            | DataUploadPhase::Prepared
            | DataUploadPhase::InProgress
            | DataUploadPhase::Canceling
            | DataUploadPhase::Canceled
            | DataUploadPhase::Completed
            | DataUploadPhase::Failed => {}
        }
    }
    wire(DataUploadPhase::ALL)
}

fn download_phases() -> BTreeSet<String> {
    for phase in DataDownloadPhase::ALL {
        match phase {
            DataDownloadPhase::New
            | DataDownloadPhase::Accepted
            | DataDownloadPhase::Prepared
            | DataDownloadPhase::InProgress
            | DataDownloadPhase::Canceling
            | DataDownloadPhase::Canceled
            | DataDownloadPhase::Completed
            | DataDownloadPhase::Failed => {}
        }
    }
    wire(DataDownloadPhase::ALL)
}

fn node_oses() -> BTreeSet<String> {
    let all = [NodeOs::Auto, NodeOs::Linux, NodeOs::Windows];
    for os in all {
        match os {
            NodeOs::Auto | NodeOs::Linux | NodeOs::Windows => {}
        }
    }
    wire(all)
}

fn snapshot_types() -> BTreeSet<String> {
    let all = [SnapshotType::Csi];
    for ty in &all {
        match ty {
            SnapshotType::Csi => {}
        }
    }
    wire(all)
}

/// Ferry's closed enums of a DataUpload, by field path.
fn data_upload_enums() -> BTreeMap<&'static str, BTreeSet<String>> {
    BTreeMap::from([
        ("spec.snapshotType", snapshot_types()),
        ("status.phase", upload_phases()),
        ("status.nodeOS", node_oses()),
    ])
}

/// Ferry's closed enums of a DataDownload, by field path.
fn data_download_enums() -> BTreeMap<&'static str, BTreeSet<String>> {
    BTreeMap::from([("spec.nodeOS", node_oses()), ("status.phase", download_phases())])
}

fn time(rfc3339: &str) -> Time {
    ferry_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
        rfc3339.parse::<Timestamp>().expect("timestamp"),
    )
}

fn config(pairs: &[(&str, &str)]) -> Option<BTreeMap<String, String>> {
    Some(pairs.iter().map(|(k, v)| ((*k).to_owned(), (*v).to_owned())).collect())
}

/// A DataUpload with every field Ferry's type has set: every Option, maps non-empty, numbers
/// non-zero, `cancel` true.
fn full_data_upload() -> DataUpload {
    let mut du = DataUpload::new(
        "nightly-7xk2q",
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
            data_mover_config: config(&[("ParallelFilesUpload", "4")]),
            cancel: true,
            operation_timeout: GoDuration(Duration::from_secs(600)),
        },
    );
    du.metadata.namespace = Some("velero".into());
    du.status = Some(DataUploadStatus {
        phase: Some(DataUploadPhase::Completed),
        path: "/host_pods/uid/volumes/kubernetes.io~csi/pvc-1/mount".into(),
        snapshot_id: "0123456789abcdef".into(),
        data_mover_result: config(&[("ferry.io/repository", "s3://b/p")]),
        message: "backed up 1 GiB".into(),
        start_timestamp: Some(time("2026-11-22T01:00:00Z")),
        completion_timestamp: Some(time("2026-11-22T01:05:00Z")),
        progress: DataMoveOperationProgress { total_bytes: 1 << 30, bytes_done: 1 << 30 },
        incremental_bytes: 1 << 20,
        node: "node-b".into(),
        node_os: Some(NodeOs::Linux),
        accepted_by_node: "node-b".into(),
        accepted_timestamp: Some(time("2026-11-22T00:59:00Z")),
    });
    du
}

/// A DataUpload with every field at its default: what Ferry writes when nothing is known.
fn minimal_data_upload() -> DataUpload {
    let mut du = DataUpload::new(
        "empty",
        DataUploadSpec {
            snapshot_type: SnapshotType::Csi,
            csi_snapshot: None,
            source_pvc: String::new(),
            data_mover: String::new(),
            backup_storage_location: String::new(),
            source_namespace: String::new(),
            data_mover_config: None,
            cancel: false,
            operation_timeout: GoDuration(Duration::ZERO),
        },
    );
    du.status = Some(DataUploadStatus::default());
    du
}

/// A DataDownload with every field Ferry's type has set.
fn full_data_download() -> DataDownload {
    let mut dd = DataDownload::new(
        "restore-1-q8w2v",
        DataDownloadSpec {
            target_volume: TargetVolumeSpec {
                pvc: "data-0".into(),
                pv: "pvc-0b7c2d1e".into(),
                namespace: "app-restored".into(),
            },
            backup_storage_location: "default".into(),
            data_mover: "ferry".into(),
            snapshot_id: "0123456789abcdef".into(),
            source_namespace: "app".into(),
            data_mover_config: config(&[
                ("WriteSparseFiles", "true"),
                ("ParallelFilesDownload", "8"),
            ]),
            cancel: true,
            operation_timeout: GoDuration(Duration::from_secs(5400)),
            node_os: Some(NodeOs::Linux),
            snapshot_size: 1 << 30,
        },
    );
    dd.metadata.namespace = Some("velero".into());
    dd.status = Some(DataDownloadStatus {
        phase: Some(DataDownloadPhase::Canceled),
        message: "canceled by request".into(),
        start_timestamp: Some(time("2026-11-22T03:00:00Z")),
        completion_timestamp: Some(time("2026-11-22T03:01:00Z")),
        progress: DataMoveOperationProgress { total_bytes: 1 << 30, bytes_done: 1 << 29 },
        node: "node-c".into(),
        accepted_by_node: "node-c".into(),
        accepted_timestamp: Some(time("2026-11-22T02:59:00Z")),
    });
    dd
}

/// A DataDownload with every field at its default.
fn minimal_data_download() -> DataDownload {
    let mut dd = DataDownload::new(
        "empty",
        DataDownloadSpec {
            target_volume: TargetVolumeSpec::default(),
            backup_storage_location: String::new(),
            data_mover: String::new(),
            snapshot_id: String::new(),
            source_namespace: String::new(),
            data_mover_config: None,
            cancel: false,
            operation_timeout: GoDuration(Duration::ZERO),
            node_os: None,
            snapshot_size: 0,
        },
    );
    dd.status = Some(DataDownloadStatus::default());
    dd
}

fn to_json<T: serde::Serialize>(object: &T) -> Value {
    serde_json::to_value(object).expect("serialises")
}

// ---------------------------------------------------------------------------------------------
// Differences

/// What kind of difference.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Aspect {
    /// In one CRD and not the other, or in the CRD and not in Ferry's JSON, or the reverse.
    Presence,
    Type,
    Enum,
    Nullable,
    Required,
}

/// One difference, named by CRD and field path.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
struct Difference {
    crd: String,
    path: String,
    aspect: Aspect,
    detail: String,
}

impl fmt::Display for Difference {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} {}: {}", self.crd, self.path, self.detail)
    }
}

impl Allowed {
    fn matches(&self, d: &Difference) -> bool {
        self.crd == d.crd && self.path == d.path && self.aspect == d.aspect
    }
}

fn diff(crd: &str, path: &str, aspect: Aspect, detail: String) -> Difference {
    Difference { crd: crd.to_owned(), path: path.to_owned(), aspect, detail }
}

fn list(values: &BTreeSet<String>) -> String {
    format!("[{}]", values.iter().map(String::as_str).collect::<Vec<_>>().join(", "))
}

fn enum_detail(a_name: &str, a: &BTreeSet<String>, b_name: &str, b: &BTreeSet<String>) -> String {
    let only_a: BTreeSet<_> = a.difference(b).cloned().collect();
    let only_b: BTreeSet<_> = b.difference(a).cloned().collect();
    let mut detail = format!("enum differs: {a_name} {}, {b_name} {}", list(a), list(b));
    if !only_a.is_empty() {
        detail += &format!("; only in {a_name}: {}", list(&only_a));
    }
    if !only_b.is_empty() {
        detail += &format!("; only in {b_name}: {}", list(&only_b));
    }
    detail
}

/// The differences between two versions of one CRD's schema.
fn diff_crds(
    crd: &str,
    a_name: &str,
    a: &SchemaFields,
    b_name: &str,
    b: &SchemaFields,
) -> Vec<Difference> {
    let mut out = Vec::new();
    let paths: BTreeSet<&String> = a.keys().chain(b.keys()).collect();
    for path in paths {
        let (fa, fb) = match (a.get(path), b.get(path)) {
            (Some(fa), Some(fb)) => (fa, fb),
            (Some(f), None) => {
                out.push(diff(crd, path, Aspect::Presence, format!("only in {a_name} ({})", f.ty)));
                continue;
            }
            (None, Some(f)) => {
                out.push(diff(crd, path, Aspect::Presence, format!("only in {b_name} ({})", f.ty)));
                continue;
            }
            (None, None) => continue,
        };
        if fa.ty != fb.ty {
            let detail = format!("type {} in {a_name}, {} in {b_name}", fa.ty, fb.ty);
            out.push(diff(crd, path, Aspect::Type, detail));
        }
        if fa.enum_values != fb.enum_values {
            let detail = enum_detail(a_name, &fa.enum_values, b_name, &fb.enum_values);
            out.push(diff(crd, path, Aspect::Enum, detail));
        }
        if fa.nullable != fb.nullable {
            let detail =
                format!("nullable {} in {a_name}, {} in {b_name}", fa.nullable, fb.nullable);
            out.push(diff(crd, path, Aspect::Nullable, detail));
        }
        if fa.required != fb.required {
            let detail =
                format!("required {} in {a_name}, {} in {b_name}", fa.required, fb.required);
            out.push(diff(crd, path, Aspect::Required, detail));
        }
    }
    out
}

/// Ferry's objects of one kind against one CRD: `full` has every field set, `minimal` none.
fn diff_ferry(
    crd: &str,
    schema: &SchemaFields,
    full: &Value,
    minimal: &Value,
    enums: &BTreeMap<&str, BTreeSet<String>>,
) -> Vec<Difference> {
    let mut out = Vec::new();
    let written = json_fields(full, schema);
    for (path, field) in schema {
        if !written.contains_key(path) {
            let detail = format!(
                "in Velero's CRD ({}), never written by Ferry: a full-object update drops it",
                field.ty
            );
            out.push(diff(crd, path, Aspect::Presence, detail));
        }
    }
    for (path, kind) in &written {
        match schema.get(path) {
            None => {
                let detail = format!(
                    "written by Ferry ({kind}), not in Velero's CRD: the API server prunes it"
                );
                out.push(diff(crd, path, Aspect::Presence, detail));
            }
            // A null is checked against `nullable` below.
            Some(field) if kind != "null" && !compatible(&field.ty, kind) => {
                let detail = format!("Velero's CRD says {}, Ferry writes {kind}", field.ty);
                out.push(diff(crd, path, Aspect::Type, detail));
            }
            Some(_) => {}
        }
    }
    for (which, object) in [("full", full), ("minimal", minimal)] {
        let fields = json_fields(object, schema);
        for (path, kind) in &fields {
            if kind == "null" && schema.get(path).is_some_and(|f| !f.nullable) {
                let detail = format!("Ferry's {which} object writes null; Velero's CRD forbids it");
                out.push(diff(crd, path, Aspect::Nullable, detail));
            }
        }
        for (path, field) in schema {
            let parent = path.rsplit_once('.').map(|(p, _)| p);
            let parent_written = parent.is_none_or(|p| fields.get(p).is_some_and(|k| k != "null"));
            if field.required && parent_written && !fields.contains_key(path) {
                let detail = format!("required by Velero's CRD, omitted by Ferry's {which} object");
                out.push(diff(crd, path, Aspect::Required, detail));
            }
        }
    }
    let enum_paths: BTreeSet<&str> = schema
        .iter()
        .filter(|(_, f)| !f.enum_values.is_empty())
        .map(|(p, _)| p.as_str())
        .chain(enums.keys().copied())
        .collect();
    let none = BTreeSet::new();
    for path in enum_paths {
        let crd_values = schema.get(path).map_or(&none, |f| &f.enum_values);
        let ferry_values = enums.get(path).unwrap_or(&none);
        if crd_values != ferry_values {
            let detail = enum_detail("Velero's CRD", crd_values, "Ferry", ferry_values);
            out.push(diff(crd, path, Aspect::Enum, detail));
        }
    }
    out.sort();
    out.dedup();
    out
}

/// Fails, naming every difference, unless each is allowed; also fails on an allow-list entry
/// that no longer matches anything (a stale exception hides the next real change).
fn assert_no_drift(title: &str, diffs: &[Difference], allowed: &[Allowed]) {
    let mut unexpected = Vec::new();
    for d in diffs {
        match allowed.iter().find(|a| a.matches(d)) {
            Some(a) => eprintln!("allowed: {d}\n    because {}", a.why),
            None => unexpected.push(format!("  {d}")),
        }
    }
    for a in allowed.iter().filter(|a| !diffs.iter().any(|d| a.matches(d))) {
        unexpected.push(format!(
            "  {} {}: allowed ({:?}) but no longer differs: remove it from the allow-list",
            a.crd, a.path, a.aspect
        ));
    }
    assert!(unexpected.is_empty(), "{title}:\n{}", unexpected.join("\n"));
}

// ---------------------------------------------------------------------------------------------
// The pinned Velero's CRDs

/// The pinned Velero's CRDs, read once per test binary (a cold Velero build takes minutes).
fn pinned_crds() -> &'static [CustomResourceDefinition] {
    static PINNED: OnceLock<Result<Vec<CustomResourceDefinition>, String>> = OnceLock::new();
    PINNED.get_or_init(load_pinned_crds).as_deref().unwrap_or_else(|e| {
        panic!("Velero {VELERO_VERSION}'s CRDs cannot be had, so the drift check cannot run: {e}")
    })
}

fn load_pinned_crds() -> Result<Vec<CustomResourceDefinition>, String> {
    let dir = velero_dir().map_err(|e| format!("{e:#}"))?;
    let print = |format: &str| -> Result<String, String> {
        let velero = dir.join("velero");
        let out = Command::new(&velero)
            .args(["install", "--crds-only", "--dry-run", "-o", format])
            .stdin(Stdio::null())
            .output()
            .map_err(|e| format!("running {}: {e}", velero.display()))?;
        if !out.status.success() {
            return Err(format!(
                "velero install --crds-only --dry-run -o {format} failed ({}): {}",
                out.status,
                String::from_utf8_lossy(&out.stderr).trim()
            ));
        }
        String::from_utf8(out.stdout).map_err(|e| format!("velero printed non-UTF-8: {e}"))
    };
    let cached = dir.join("velero-crds.yaml");
    let yaml = std::fs::read_to_string(&cached)
        .map_err(|e| format!("reading {}: {e}", cached.display()))?;
    if print("yaml")? != yaml {
        return Err(format!(
            "{} is not what {}/velero prints now: rebuild with scripts/build-velero.sh",
            cached.display(),
            dir.display()
        ));
    }
    crds_from_json(&print("json")?)
}

/// The CRDs in `velero install -o json` output: a `List` of them, or one alone.
fn crds_from_json(text: &str) -> Result<Vec<CustomResourceDefinition>, String> {
    let value: Value = serde_json::from_str(text).map_err(|e| format!("not JSON: {e}"))?;
    let items = match value.get("kind").and_then(Value::as_str) {
        Some("List") => value.get("items").and_then(Value::as_array).cloned().unwrap_or_default(),
        _ => vec![value],
    };
    items
        .into_iter()
        .filter(|item| item.get("kind").and_then(Value::as_str) == Some("CustomResourceDefinition"))
        .map(|item| serde_json::from_value(item).map_err(|e| format!("not a CRD: {e}")))
        .collect()
}

fn fixture_crds() -> Vec<CustomResourceDefinition> {
    ferry_testbed::crds::fixture_crds()
        .unwrap_or_else(|e| panic!("the shared fixtures' CRDs cannot be read: {e:#}"))
}

// ---------------------------------------------------------------------------------------------
// The drift checks

#[test]
fn pinned_velero_crds_match_the_fixtures() {
    let pinned = pinned_crds();
    let fixtures = fixture_crds();
    let pinned_name = format!("Velero {VELERO_VERSION}");
    let mut diffs = Vec::new();
    for crd in [DATA_UPLOADS, DATA_DOWNLOADS] {
        let a = fields_of(pinned, crd, &pinned_name);
        let b = fields_of(&fixtures, crd, FIXTURES);
        diffs.extend(diff_crds(crd, &pinned_name, &a, FIXTURES, &b));
    }
    assert_no_drift(
        &format!("Velero {VELERO_VERSION}'s CRDs differ from {FIXTURES}"),
        &diffs,
        FIXTURE_DRIFT_ALLOWED,
    );
}

#[test]
fn ferry_types_write_exactly_the_pinned_velero_crd_fields() {
    let pinned = pinned_crds();
    let source = format!("Velero {VELERO_VERSION}");
    let mut diffs = diff_ferry(
        DATA_UPLOADS,
        &fields_of(pinned, DATA_UPLOADS, &source),
        &to_json(&full_data_upload()),
        &to_json(&minimal_data_upload()),
        &data_upload_enums(),
    );
    diffs.extend(diff_ferry(
        DATA_DOWNLOADS,
        &fields_of(pinned, DATA_DOWNLOADS, &source),
        &to_json(&full_data_download()),
        &to_json(&minimal_data_download()),
        &data_download_enums(),
    ));
    assert_no_drift(
        &format!("Ferry's types differ from Velero {VELERO_VERSION}'s CRDs"),
        &diffs,
        FERRY_DRIFT_ALLOWED,
    );
}

// ---------------------------------------------------------------------------------------------
// The checker itself

fn hand_written_schema() -> JSONSchemaProps {
    serde_json::from_value(json!({
        "type": "object",
        "properties": {
            "metadata": { "type": "object" },
            "spec": {
                "type": "object",
                "required": ["name"],
                "properties": {
                    "name": { "type": "string" },
                    "size": { "type": "integer", "format": "int64" },
                    "config": {
                        "type": "object",
                        "nullable": true,
                        "additionalProperties": { "type": "string" }
                    },
                    "snapshot": {
                        "type": "object",
                        "nullable": true,
                        "required": ["volume"],
                        "properties": { "volume": { "type": "string" } }
                    },
                    "mode": { "type": "string", "enum": ["fast", "safe"] },
                    "targets": {
                        "type": "array",
                        "items": {
                            "type": "object",
                            "properties": { "id": { "type": "string" } }
                        }
                    }
                }
            },
            "status": {
                "type": "object",
                "properties": {
                    "done": { "type": "boolean" },
                    "when": { "type": "string", "format": "date-time", "nullable": true }
                }
            }
        }
    }))
    .expect("a JSONSchemaProps")
}

#[test]
fn schema_fields_of_a_hand_written_schema() {
    let fields = schema_fields(&hand_written_schema());
    let types: Vec<(&str, &str)> =
        fields.iter().map(|(p, f)| (p.as_str(), f.ty.as_str())).collect();
    assert_eq!(
        types,
        [
            ("metadata", "object"),
            ("spec", "object"),
            ("spec.config", "map"),
            ("spec.config.*", "string"),
            ("spec.mode", "string"),
            ("spec.name", "string"),
            ("spec.size", "integer:int64"),
            ("spec.snapshot", "object"),
            ("spec.snapshot.volume", "string"),
            ("spec.targets", "array"),
            ("spec.targets[]", "object"),
            ("spec.targets[].id", "string"),
            ("status", "object"),
            ("status.done", "boolean"),
            ("status.when", "string:date-time"),
        ]
    );
    let flagged = |pred: fn(&SchemaField) -> bool| -> Vec<&str> {
        fields.iter().filter(|(_, f)| pred(f)).map(|(p, _)| p.as_str()).collect()
    };
    assert_eq!(flagged(|f| f.required), ["spec.name", "spec.snapshot.volume"]);
    assert_eq!(flagged(|f| f.nullable), ["spec.config", "spec.snapshot", "status.when"]);
    assert_eq!(flagged(|f| !f.enum_values.is_empty()), ["spec.mode"]);
    assert_eq!(list(&fields["spec.mode"].enum_values), "[fast, safe]");
}

#[test]
fn json_fields_take_maps_from_the_schema_and_skip_metadata() {
    let schema = schema_fields(&hand_written_schema());
    let object = json!({
        "metadata": { "name": "x", "labels": { "a": "b" } },
        "spec": {
            "name": "n",
            "config": { "k1": "v1", "k2": "v2" },
            "snapshot": null,
            "targets": [{ "id": "t1" }],
            "extra": 1.5
        },
        "status": { "done": true, "when": "2026-11-22T01:00:00Z" }
    });
    let kinds: Vec<(String, String)> = json_fields(&object, &schema).into_iter().collect();
    let expected = [
        ("metadata", "object"),
        ("spec", "object"),
        ("spec.config", "map"),
        ("spec.config.*", "string"),
        ("spec.extra", "number"),
        ("spec.name", "string"),
        ("spec.snapshot", "null"),
        ("spec.targets", "array"),
        ("spec.targets[]", "object"),
        ("spec.targets[].id", "string"),
        ("status", "object"),
        ("status.done", "boolean"),
        ("status.when", "string:date-time"),
    ];
    let expected: Vec<(String, String)> =
        expected.iter().map(|(p, k)| ((*p).to_owned(), (*k).to_owned())).collect();
    assert_eq!(kinds, expected);
}

#[test]
fn crd_diff_names_added_removed_and_changed_fields() {
    let old = schema_fields(&hand_written_schema());
    let mut new = old.clone();
    new.remove("spec.size");
    let mut added = old["status.done"].clone();
    added.ty = "string".into();
    new.insert("status.message".into(), added);
    new.get_mut("spec.mode").expect("mode").enum_values.insert("paranoid".into());
    new.get_mut("status.when").expect("when").nullable = false;
    new.get_mut("status.done").expect("done").ty = "string".into();

    let lines: Vec<String> = diff_crds("things.example.io", "old", &old, "new", &new)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        lines,
        [
            "things.example.io spec.mode: enum differs: old [fast, safe], new [fast, paranoid, safe]; \
             only in new: [paranoid]",
            "things.example.io spec.size: only in old (integer:int64)",
            "things.example.io status.done: type boolean in old, string in new",
            "things.example.io status.message: only in new (string)",
            "things.example.io status.when: nullable true in old, false in new",
        ]
    );
}

#[test]
fn a_field_ferry_drops_or_invents_is_named_with_its_side() {
    // The fixtures' CRD, so this runs without a Velero build.
    let schema = fields_of(&fixture_crds(), DATA_UPLOADS, FIXTURES);
    let minimal = to_json(&minimal_data_upload());
    let enums = data_upload_enums();
    let mut full = to_json(&full_data_upload());
    let ferry_drift = |full: &Value| -> Vec<String> {
        diff_ferry(DATA_UPLOADS, &schema, full, &minimal, &enums)
            .iter()
            .filter(|d| !FERRY_DRIFT_ALLOWED.iter().any(|a| a.matches(d)))
            .map(ToString::to_string)
            .collect()
    };
    assert_eq!(ferry_drift(&full), Vec::<String>::new(), "Ferry matches the fixtures' CRD");

    let status = full["status"].as_object_mut().expect("status");
    let bytes = status.remove("incrementalBytes").expect("incrementalBytes");
    status.insert("incrementalByte".into(), bytes);
    full["spec"]["csiSnapshot"] = Value::Null;
    assert_eq!(
        ferry_drift(&full),
        [
            "datauploads.velero.io spec.csiSnapshot.driver: in Velero's CRD (string), never \
             written by Ferry: a full-object update drops it",
            "datauploads.velero.io spec.csiSnapshot.snapshotClass: in Velero's CRD (string), \
             never written by Ferry: a full-object update drops it",
            "datauploads.velero.io spec.csiSnapshot.storageClass: in Velero's CRD (string), \
             never written by Ferry: a full-object update drops it",
            "datauploads.velero.io spec.csiSnapshot.volumeSnapshot: in Velero's CRD (string), \
             never written by Ferry: a full-object update drops it",
            "datauploads.velero.io status.incrementalByte: written by Ferry (integer), not in \
             Velero's CRD: the API server prunes it",
            "datauploads.velero.io status.incrementalBytes: in Velero's CRD (integer:int64), \
             never written by Ferry: a full-object update drops it",
        ]
    );
}

#[test]
fn ferry_enums_are_compared_value_by_value() {
    let schema = fields_of(&fixture_crds(), DATA_DOWNLOADS, FIXTURES);
    let mut enums = data_download_enums();
    let phases = enums.get_mut("status.phase").expect("phase");
    phases.remove("Canceling");
    phases.insert("Paused".into());
    let full = to_json(&full_data_download());
    let lines: Vec<String> = diff_ferry(DATA_DOWNLOADS, &schema, &full, &full, &enums)
        .iter()
        .map(ToString::to_string)
        .collect();
    assert_eq!(
        lines,
        ["datadownloads.velero.io status.phase: enum differs: Velero's CRD [Accepted, Canceled, \
          Canceling, Completed, Failed, InProgress, New, Prepared], Ferry [Accepted, Canceled, \
          Completed, Failed, InProgress, New, Paused, Prepared]; only in Velero's CRD: \
          [Canceling]; only in Ferry: [Paused]"]
    );
}

#[test]
fn crds_are_read_from_a_list_as_velero_prints_it() {
    let crd = json!({
        "apiVersion": "apiextensions.k8s.io/v1",
        "kind": "CustomResourceDefinition",
        "metadata": { "name": "things.example.io" },
        "spec": {
            "group": "example.io",
            "names": { "kind": "Thing", "plural": "things" },
            "scope": "Namespaced",
            "versions": [{
                "name": CRD_VERSION, "served": true, "storage": true,
                "schema": { "openAPIV3Schema": hand_written_schema() }
            }]
        }
    });
    let listed = json!({ "apiVersion": "v1", "kind": "List", "items": [crd.clone()] });
    for text in [listed.to_string(), crd.to_string()] {
        let crds = crds_from_json(&text).expect("parses");
        let fields = fields_of(&crds, "things.example.io", "the list");
        assert_eq!(fields, schema_fields(&hand_written_schema()));
    }
    assert!(crds_from_json("kind: List").is_err());
}
