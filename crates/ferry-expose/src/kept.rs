//! Kept base snapshots: the physical snapshot of a completed block backup, kept after the
//! backup as the base of the next backup's changed-block delta
//! ([`crate::ExposerConfig::keep_base_snapshot`]).
//!
//! The backup's VolumeSnapshotContent itself is kept. When keeping is decided (as the content
//! is made, before the backup moves anything), the content is made `Retain`, labelled
//! [`KEPT_BASE_LABEL`]` = pending` and annotated with its DataUpload. Once the backup
//! completes, its cleanup labels it `true` with the source PVC and deletes the VolumeSnapshot;
//! a backup that does not complete sets it back to `Delete` before deleting the VolumeSnapshot,
//! so the physical snapshot goes with it. The snapshot-controller decides from its cache
//! whether deleting the VolumeSnapshot deletes the content: since the content was `Retain` from
//! the moment it was made, that cache cannot hold an older `Delete`, and a kept content is
//! never deleted under a `Retain` that would leave its physical snapshot with no object.
//!
//! A kept base is released (set back to `Delete`, then deleted) when a newer backup of the same
//! PVC completes or its DataUpload is gone (its backup deleted, or a pending one's DataUpload
//! deleted, its finalizer removed by hand, while no agent ran: no cleanup runs for it); the CSI
//! snapshotter sidecar then deletes the physical snapshot. The
//! object is kept, not just the handle, because the sidecar deletes a physical snapshot only for
//! a content that still carries its bound-protection finalizer and the snapshot-controller's
//! being-deleted annotation; a content made afresh for a handle has neither and would be
//! removed without the snapshot. Everything is visible with
//! `kubectl get volumesnapshotcontents -l ferry.io/kept-base`.

use ferry_agent::VolumeMode;
use ferry_api::k8s_openapi::api::core::v1::PersistentVolumeClaim;
use ferry_api::naming::valid_label_value;
use ferry_api::{DataUpload, VolumeSnapshotContent};
use kube::api::{Api, ListParams};
use kube::{Client, ResourceExt};

use crate::ExposeError;
use crate::ops::{delete_if_present, get_opt, update};

/// A source PVC's annotation, `"true"` or `"false"`: whether its block backups keep their
/// physical snapshot, over the agent's `--keep-base-snapshot`.
pub const KEEP_BASE_ANNOTATION: &str = "ferry.io/keep-base-snapshot";
/// The backup content's annotation recording, when it is made, that it is to be kept once the
/// backup completes (`true`): one decision for the backup's tag and the cleanup.
pub(crate) const KEEP_DECIDED_ANNOTATION: &str = "ferry.io/keep-base";

/// The backup content's annotation naming the CSI handle of the volume its snapshot was taken
/// of (from the source content's `spec.source.volumeHandle`).
pub(crate) const SOURCE_VOLUME_ANNOTATION: &str = "ferry.io/source-volume-handle";
/// When the backup whose base this is completed, in seconds since the Unix epoch: the newest
/// kept base of a PVC is the one its newest backup read. A label, not an annotation: the
/// snapshot-controller, as the VolumeSnapshot is deleted, writes back the content's annotations
/// from its cache (a JSON patch replacing all of them, without a precondition), which may not
/// hold one written just before. Bases kept by an earlier Ferry carry it as an RFC 3339
/// annotation of the same name.
const COMPLETED_LABEL: &str = "ferry.io/completed-at";

/// The label of a kept base snapshot's VolumeSnapshotContent: `true` once its backup
/// completed, `pending` while the backup that is to keep it runs.
pub const KEPT_BASE_LABEL: &str = "ferry.io/kept-base";
/// [`KEPT_BASE_LABEL`]'s value while the backup runs.
const PENDING: &str = "pending";
/// The source PVC's namespace and name, as label values (for selection).
const SOURCE_NAMESPACE_LABEL: &str = "ferry.io/source-namespace";
const SOURCE_PVC_LABEL: &str = "ferry.io/source-pvc";
/// The source PVC, `namespace/name` exactly (label values may be cut and hashed).
const SOURCE_ANNOTATION: &str = "ferry.io/source";
/// The DataUpload whose backup kept it, `namespace/name`: once that is gone (Velero deletes a
/// backup's DataUploads when it deletes the backup), so is the reason to keep it.
const DATA_UPLOAD_ANNOTATION: &str = "ferry.io/data-upload";

fn source_of(du: &DataUpload) -> String {
    format!("{}/{}", du.spec.source_namespace, du.spec.source_pvc)
}

fn contents(client: &Client) -> Api<VolumeSnapshotContent> {
    Api::all(client.clone())
}

/// Whether the backup of `du`, of a volume in `mode`, keeps its physical snapshot: the source
/// PVC's [`KEEP_BASE_ANNOTATION`], else `default` (`None`: never).
///
/// # Errors
/// The PVC cannot be read, or its annotation is neither `true` nor `false` (a typo must not
/// silently keep, or silently not keep, a snapshot).
pub(crate) async fn wanted(
    client: &Client,
    default: Option<bool>,
    du: &DataUpload,
    mode: VolumeMode,
) -> Result<bool, ExposeError> {
    let Some(default) = default else { return Ok(false) };
    if mode != VolumeMode::Block {
        return Ok(false);
    }
    let claims: Api<PersistentVolumeClaim> =
        Api::namespaced(client.clone(), &du.spec.source_namespace);
    let pvc = get_opt(&claims, &du.spec.source_pvc, "reading the source PVC").await?;
    match pvc.as_ref().and_then(|p| p.annotations().get(KEEP_BASE_ANNOTATION)).map(String::as_str) {
        None => Ok(default),
        Some("true") => Ok(true),
        Some("false") => Ok(false),
        Some(other) => Err(ExposeError::Invalid(format!(
            "PVC {}/{} has annotation {KEEP_BASE_ANNOTATION}: {other:?}; it takes \"true\" or \"false\"",
            du.spec.source_namespace, du.spec.source_pvc
        ))),
    }
}

/// Marks the backup content of `du`, not yet made, to be kept once the backup completes (see
/// [`wanted`]): `Retain` from the start, labelled [`KEPT_BASE_LABEL`]` = pending`, annotated
/// with the DataUpload (so an agent gone before the cleanup leaves nothing the sweep cannot
/// find) and the source PVC. Every annotation is written here, long before the VolumeSnapshot
/// is deleted (see [`COMPLETED_LABEL`]).
pub(crate) fn mark_to_keep(content: &mut VolumeSnapshotContent, du: &DataUpload) {
    content.spec.deletion_policy = "Retain".into();
    content.labels_mut().insert(KEPT_BASE_LABEL.to_owned(), PENDING.to_owned());
    let annotations = content.annotations_mut();
    annotations.insert(KEEP_DECIDED_ANNOTATION.to_owned(), "true".to_owned());
    annotations.insert(DATA_UPLOAD_ANNOTATION.to_owned(), data_upload_of(du));
    annotations.insert(SOURCE_ANNOTATION.to_owned(), source_of(du));
}

fn data_upload_of(du: &DataUpload) -> String {
    format!("{}/{}", du.namespace().unwrap_or_default(), du.name_any())
}

/// Whether `content` was made to be kept (see [`mark_to_keep`]) and is not being deleted
/// (released meanwhile: keeping it now would turn the release into an orphaned physical
/// snapshot). One made by an earlier Ferry, which set `Retain` only after the backup, is not:
/// the snapshot-controller may still hold its `Delete`.
pub(crate) fn decided(content: &VolumeSnapshotContent) -> bool {
    content.annotations().get(KEEP_DECIDED_ANNOTATION).map(String::as_str) == Some("true")
        && content.spec.source_volume_mode.as_deref() == Some("Block")
        && content.spec.deletion_policy == "Retain"
        && content.metadata.deletion_timestamp.is_none()
}

/// The moment `du` completed, as recorded on its kept base ([`COMPLETED_LABEL`]).
fn completed_at(du: &DataUpload) -> String {
    du.status
        .as_ref()
        .and_then(|s| s.completion_timestamp.as_ref())
        .map(|t| t.0.as_second().to_string())
        .unwrap_or_default()
}

/// When the backup of kept base `c` completed (seconds since the Unix epoch; 0 unknown).
fn completed_of(c: &VolumeSnapshotContent) -> i64 {
    if let Some(seconds) = c.labels().get(COMPLETED_LABEL).and_then(|s| s.parse().ok()) {
        return seconds;
    }
    c.annotations()
        .get(COMPLETED_LABEL)
        .and_then(|s| s.parse::<ferry_api::k8s_openapi::jiff::Timestamp>().ok())
        .map_or(0, |t| t.as_second())
}

/// Labels the backup content of `du`, completed, as a kept base, if it was made to be kept
/// ([`decided`]: already `Retain`). `false` when it was not, is gone, or is being deleted
/// (nothing to keep).
pub(crate) async fn keep(client: &Client, du: &DataUpload) -> Result<bool, ExposeError> {
    let name = du.name_any();
    let completed = completed_at(du);
    let mut wanted = false;
    let kept = update(&contents(client), &name, "keeping the backup's snapshot", |c| {
        // Not to be kept, or released already (a newer backup's cleanup got here first):
        // nothing to label.
        wanted = decided(c);
        if !wanted {
            return false;
        }
        let before = c.labels().clone();
        let labels = c.labels_mut();
        labels.insert(KEPT_BASE_LABEL.to_owned(), "true".to_owned());
        labels.insert(COMPLETED_LABEL.to_owned(), completed.clone());
        labels.insert(
            SOURCE_NAMESPACE_LABEL.to_owned(),
            valid_label_value(&du.spec.source_namespace),
        );
        labels.insert(SOURCE_PVC_LABEL.to_owned(), valid_label_value(&du.spec.source_pvc));
        // Its annotations were all written when it was made (`mark_to_keep`).
        *c.labels() != before
    })
    .await?;
    Ok(kept.is_some() && wanted)
}

/// Sets the backup content of `du`, made to be kept but not kept (its backup did not complete),
/// back to `Delete` and drops its label, so deleting it deletes the physical snapshot. Must
/// come before the VolumeSnapshot's deletion: the snapshot-controller then deletes the content
/// itself, or leaves it to the cleanup; either way the sidecar sees `Delete`, written first.
pub(crate) async fn let_go(client: &Client, du: &DataUpload) -> Result<(), ExposeError> {
    update(&contents(client), &du.name_any(), "letting go of the backup's snapshot", |c| {
        if c.annotations().get(KEEP_DECIDED_ANNOTATION).map(String::as_str) != Some("true") {
            return false;
        }
        let labelled = c.labels_mut().remove(KEPT_BASE_LABEL).is_some();
        let retained = c.spec.deletion_policy != "Delete";
        c.spec.deletion_policy = "Delete".into();
        labelled || retained
    })
    .await?;
    Ok(())
}

/// Releases every kept base of `du`'s source PVC but the newest (by the completion of its
/// backup): a newer backup completed, or an older one's cleanup came late.
pub(crate) async fn release_superseded(
    client: &Client,
    du: &DataUpload,
) -> Result<usize, ExposeError> {
    let selector = format!(
        "{KEPT_BASE_LABEL}=true,{SOURCE_NAMESPACE_LABEL}={},{SOURCE_PVC_LABEL}={}",
        valid_label_value(&du.spec.source_namespace),
        valid_label_value(&du.spec.source_pvc)
    );
    let source = source_of(du);
    let mut bases: Vec<VolumeSnapshotContent> = list(client, &selector)
        .await?
        .into_iter()
        .filter(|c| {
            c.annotations().get(SOURCE_ANNOTATION) == Some(&source)
                && c.metadata.deletion_timestamp.is_none()
        })
        .collect();
    // The newest last, and it stays.
    bases.sort_by_key(|c| (completed_of(c), c.name_any()));
    bases.pop();
    let mut released = 0;
    for content in bases {
        let name = content.name_any();
        if release_kept_base(client, &name).await? {
            tracing::info!(content = %name, %source, "released the kept base snapshot of an older backup");
            released += 1;
        }
    }
    Ok(released)
}

/// Releases the kept (or pending) base snapshot whose VolumeSnapshotContent is `name`: set back to
/// `Delete`, then deleted, so the CSI snapshotter sidecar deletes the physical snapshot (it
/// finishes in the background; a content that stays `Terminating` means the sidecar could not).
/// `false` when `name` is not a kept base (absent, or not labelled so: nothing is touched).
///
/// # Errors
/// The API server refused a read or a write.
pub async fn release_kept_base(client: &Client, name: &str) -> Result<bool, ExposeError> {
    let api = contents(client);
    let is_kept = |c: &VolumeSnapshotContent| kept_completed(c).is_some();
    match get_opt(&api, name, "reading a kept base snapshot").await? {
        Some(c) if is_kept(&c) => {}
        _ => return Ok(false),
    }
    let mut kept = true;
    let written = update(&api, name, "releasing a kept base snapshot", |c| {
        kept = is_kept(c);
        if !kept || c.spec.deletion_policy == "Delete" {
            return false;
        }
        c.spec.deletion_policy = "Delete".into();
        true
    })
    .await?;
    // The deletion must reach the sidecar with `Delete` on the object: it was written above
    // (or found so), and the deletion comes after it.
    if written.is_none() || !kept {
        return Ok(false);
    }
    delete_if_present(&api, name, "deleting a kept base snapshot").await?;
    Ok(true)
}

/// A kept (or pending) base snapshot, as an operator sees it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeptBase {
    /// Its VolumeSnapshotContent (cluster-wide).
    pub content: String,
    /// `false` while the backup that is to keep it runs (labelled `pending`).
    pub completed: bool,
    /// The source PVC, `namespace/name` (empty if a hand-made label carries none).
    pub source: String,
    /// The DataUpload whose backup kept it, `namespace/name` (empty if none).
    pub data_upload: String,
    /// When that backup completed, in seconds since the Unix epoch (`None`: pending, unknown).
    pub completed_at: Option<i64>,
    /// The CSI driver and the physical snapshot's handle (empty until the driver reports it).
    pub driver: String,
    pub snapshot_handle: String,
    /// Released already: deleted, waiting for the driver's snapshotter to delete the snapshot.
    pub releasing: bool,
}

impl KeptBase {
    /// `content` as a kept base; `None` when it is not labelled one.
    #[must_use]
    pub fn of(content: &VolumeSnapshotContent) -> Option<Self> {
        let completed = kept_completed(content)?;
        let annotation = |key| content.annotations().get(key).cloned().unwrap_or_default();
        let at = completed_of(content);
        Some(Self {
            content: content.name_any(),
            completed,
            source: annotation(SOURCE_ANNOTATION),
            data_upload: annotation(DATA_UPLOAD_ANNOTATION),
            completed_at: (completed && at > 0).then_some(at),
            driver: content.spec.driver.clone(),
            snapshot_handle: content
                .status
                .as_ref()
                .and_then(|s| s.snapshot_handle.clone())
                .unwrap_or_default(),
            releasing: content.metadata.deletion_timestamp.is_some(),
        })
    }

    /// The source PVC's namespace.
    #[must_use]
    pub fn source_namespace(&self) -> &str {
        self.source.split_once('/').map_or("", |(ns, _)| ns)
    }
}

/// Whether `content`, labelled a kept base, is one a completed backup kept (`false`: pending);
/// `None` when it is not labelled one.
fn kept_completed(content: &VolumeSnapshotContent) -> Option<bool> {
    match content.labels().get(KEPT_BASE_LABEL).map(String::as_str) {
        Some("true") => Some(true),
        Some(PENDING) => Some(false),
        _ => None,
    }
}

/// Every kept and pending base snapshot, of PVCs in `source_namespace` if given, ordered by
/// source PVC, then the completed ones by completion (the newest is the next delta's base),
/// then the pending ones.
///
/// # Errors
/// The API server refused the list.
pub async fn kept_bases(
    client: &Client,
    source_namespace: Option<&str>,
) -> Result<Vec<KeptBase>, ExposeError> {
    let mut bases: Vec<KeptBase> = list(client, KEPT_BASE_LABEL)
        .await?
        .iter()
        .filter_map(KeptBase::of)
        .filter(|b| source_namespace.is_none_or(|ns| b.source_namespace() == ns))
        .collect();
    bases.sort_by(|a, b| {
        (&a.source, !a.completed, a.completed_at, &a.content).cmp(&(
            &b.source,
            !b.completed,
            b.completed_at,
            &b.content,
        ))
    });
    Ok(bases)
}

/// The kept bases matching `selector`.
async fn list(client: &Client, selector: &str) -> Result<Vec<VolumeSnapshotContent>, ExposeError> {
    let listed = contents(client).list(&ListParams::default().labels(selector)).await;
    listed.map(|l| l.items).map_err(|e| ExposeError::Api {
        step: "listing the kept base snapshots",
        source: Box::new(ferry_kube::ApiError::from_kube("VolumeSnapshotContent", selector, e)),
    })
}

/// Releases every kept or pending base whose DataUpload, in `namespace`, is gone: its backup
/// was deleted (Velero deletes a backup's DataUploads with it), or a pending one's cleanup
/// never ran. The number released.
///
/// # Errors
/// The API server refused a read or a write.
pub async fn release_orphaned_kept_bases(
    client: &Client,
    namespace: &str,
) -> Result<usize, ExposeError> {
    let uploads: Api<DataUpload> = Api::namespaced(client.clone(), namespace);
    let mut released = 0;
    for content in list(client, KEPT_BASE_LABEL).await? {
        let Some((ns, upload)) =
            content.annotations().get(DATA_UPLOAD_ANNOTATION).and_then(|d| d.split_once('/'))
        else {
            continue;
        };
        if ns != namespace {
            continue;
        }
        let name = content.name_any();
        // One that cannot be handled now does not hold up the others.
        let gone = match get_opt(&uploads, upload, "reading the DataUpload of a kept base").await {
            Ok(found) => found.is_none(),
            Err(e) => {
                tracing::warn!(content = %name, error = %e, "kept base not checked; will retry");
                continue;
            }
        };
        if !gone {
            continue;
        }
        match release_kept_base(client, &name).await {
            Ok(true) => {
                tracing::info!(content = %name, data_upload = upload, "released the kept base snapshot of a deleted backup");
                released += 1;
            }
            Ok(false) => {}
            Err(e) => {
                tracing::warn!(content = %name, error = %e, "kept base not released; will retry")
            }
        }
    }
    Ok(released)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn content(mode: &str) -> VolumeSnapshotContent {
        crate::objects::backup_content(
            "b-1",
            "snap-1",
            "hostpath.csi.k8s.io",
            None,
            Some(mode),
            "velero",
            None,
        )
        .expect("a valid content")
    }

    #[test]
    fn a_content_to_be_kept_is_retained_from_the_start_and_found_by_the_sweep() {
        let du = crate::backup::tests::upload("b-1");
        let mut c = content("Block");
        assert!(!decided(&c), "not marked");
        mark_to_keep(&mut c, &du);
        assert_eq!(c.spec.deletion_policy, "Retain");
        assert_eq!(c.labels()[KEPT_BASE_LABEL], PENDING);
        assert_eq!(c.annotations()[DATA_UPLOAD_ANNOTATION], "velero/b-1");
        assert_eq!(c.annotations()[SOURCE_ANNOTATION], "app/data");
        assert!(decided(&c));
        // Not a kept base yet: a newer backup's cleanup leaves it alone.
        assert_ne!(c.labels()[KEPT_BASE_LABEL], "true");

        // As an earlier Ferry made it: decided, but `Delete` until the end.
        let mut legacy = c.clone();
        legacy.spec.deletion_policy = "Delete".into();
        assert!(!decided(&legacy), "the snapshot-controller may still hold Delete");
        // Released meanwhile.
        let mut released = c.clone();
        released.metadata.deletion_timestamp =
            Some(ferry_api::k8s_openapi::apimachinery::pkg::apis::meta::v1::Time(
                ferry_api::k8s_openapi::jiff::Timestamp::UNIX_EPOCH,
            ));
        assert!(!decided(&released));
        // A file-system volume's snapshot is never a delta base.
        let mut files = content("Filesystem");
        mark_to_keep(&mut files, &du);
        assert!(!decided(&files));
    }

    #[test]
    fn an_operator_sees_a_base_as_pending_then_kept_with_its_source_and_backup() {
        let du = crate::backup::tests::upload("b-1");
        let mut c = content("Block");
        assert_eq!(KeptBase::of(&c), None, "not a kept base");
        mark_to_keep(&mut c, &du);
        let pending = KeptBase::of(&c).expect("a pending base");
        assert!(!pending.completed && !pending.releasing);
        assert_eq!(pending.completed_at, None);
        assert_eq!((pending.source.as_str(), pending.source_namespace()), ("app/data", "app"));
        assert_eq!(pending.data_upload, "velero/b-1");
        assert_eq!(pending.content, c.name_any());
        assert_eq!(pending.driver, "hostpath.csi.k8s.io");

        c.labels_mut().insert(KEPT_BASE_LABEL.into(), "true".into());
        c.labels_mut().insert(COMPLETED_LABEL.into(), "1796017600".into());
        c.status = Some(ferry_api::VolumeSnapshotContentStatus {
            snapshot_handle: Some("snap-handle".into()),
            ..Default::default()
        });
        let kept = KeptBase::of(&c).expect("a kept base");
        assert!(kept.completed);
        assert_eq!(kept.completed_at, Some(1_796_017_600));
        assert_eq!(kept.snapshot_handle, "snap-handle");

        c.labels_mut().insert(KEPT_BASE_LABEL.into(), "maybe".into());
        assert_eq!(KeptBase::of(&c), None, "an unknown label value is not Ferry's");
    }

    #[test]
    fn the_completion_is_read_from_the_label_else_from_an_earlier_ferrys_annotation() {
        let mut c = content("Block");
        assert_eq!(completed_of(&c), 0);
        c.annotations_mut().insert(COMPLETED_LABEL.into(), "2026-11-29T17:45:12Z".into());
        assert_eq!(completed_of(&c), 1_795_974_312);
        c.labels_mut().insert(COMPLETED_LABEL.into(), "1796017600".into());
        assert_eq!(completed_of(&c), 1_796_017_600);
    }
}
