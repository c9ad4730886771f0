//! Kept base snapshots: the physical snapshot of a completed block backup, kept after the
//! backup as the base of the next backup's changed-block delta
//! ([`crate::ExposerConfig::keep_base_snapshot`]).
//!
//! The backup's VolumeSnapshotContent itself is kept: set to `Retain` before its
//! VolumeSnapshot is deleted, and labelled [`KEPT_BASE_LABEL`] with the source PVC. It is
//! released (set back to `Delete`, then deleted) when a newer backup of the same PVC completes
//! or its backup is deleted; the CSI snapshotter sidecar then deletes the physical snapshot.
//! The object is kept, not just the handle, because the sidecar deletes a physical snapshot
//! only for a content that still carries its bound-protection finalizer and the
//! snapshot-controller's being-deleted annotation; a content made afresh for a handle has
//! neither and would be removed without the snapshot. Everything is visible with
//! `kubectl get volumesnapshotcontents -l ferry.io/kept-base=true`.

use std::time::Duration;

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
/// When the backup whose base this is completed (RFC 3339): the newest kept base of a PVC is
/// the one its newest backup read.
const COMPLETED_ANNOTATION: &str = "ferry.io/completed-at";

/// The label of a kept base snapshot's VolumeSnapshotContent (`true`).
pub const KEPT_BASE_LABEL: &str = "ferry.io/kept-base";
/// The source PVC's namespace and name, as label values (for selection).
const SOURCE_NAMESPACE_LABEL: &str = "ferry.io/source-namespace";
const SOURCE_PVC_LABEL: &str = "ferry.io/source-pvc";
/// The source PVC, `namespace/name` exactly (label values may be cut and hashed).
const SOURCE_ANNOTATION: &str = "ferry.io/source";
/// The DataUpload whose backup kept it, `namespace/name`: once that is gone (Velero deletes a
/// backup's DataUploads when it deletes the backup), so is the reason to keep it.
const DATA_UPLOAD_ANNOTATION: &str = "ferry.io/data-upload";

/// How long the snapshot-controller is given to see `Retain` before the VolumeSnapshot is
/// deleted: it decides from its cache whether deleting the snapshot deletes the content, and a
/// content deleted with `Retain` already on it would leave the physical snapshot with no
/// object at all.
pub(crate) const SETTLE: Duration = Duration::from_secs(2);

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

/// Whether `content` was made to be kept (see [`wanted`]) and is not being deleted (released
/// meanwhile: keeping it now would turn the release into an orphaned physical snapshot).
pub(crate) fn decided(content: &VolumeSnapshotContent) -> bool {
    content.annotations().get(KEEP_DECIDED_ANNOTATION).map(String::as_str) == Some("true")
        && content.spec.source_volume_mode.as_deref() == Some("Block")
        && content.metadata.deletion_timestamp.is_none()
}

/// The moment `du` completed, as recorded on its kept base.
fn completed_at(du: &DataUpload) -> String {
    du.status
        .as_ref()
        .and_then(|s| s.completion_timestamp.as_ref())
        .map(|t| t.0.to_string())
        .unwrap_or_default()
}

/// Sets the backup content of `du` to `Retain` and labels it as a kept base, if it was made to
/// be kept ([`decided`]). `false` when it was not, is gone, or is being deleted (nothing to
/// keep).
pub(crate) async fn keep(client: &Client, du: &DataUpload) -> Result<bool, ExposeError> {
    let name = du.name_any();
    let source = source_of(du);
    let data_upload = format!("{}/{name}", du.namespace().unwrap_or_default());
    let completed = completed_at(du);
    let mut wanted = false;
    let kept = update(&contents(client), &name, "keeping the backup's snapshot", |c| {
        // Not to be kept, or released already (a newer backup's cleanup got here first):
        // never back to Retain.
        wanted = decided(c);
        if !wanted {
            return false;
        }
        c.annotations_mut().insert(COMPLETED_ANNOTATION.to_owned(), completed.clone());
        let labels = c.labels_mut();
        let mut change = labels.get(KEPT_BASE_LABEL).map(String::as_str) != Some("true");
        labels.insert(KEPT_BASE_LABEL.to_owned(), "true".to_owned());
        labels.insert(
            SOURCE_NAMESPACE_LABEL.to_owned(),
            valid_label_value(&du.spec.source_namespace),
        );
        labels.insert(SOURCE_PVC_LABEL.to_owned(), valid_label_value(&du.spec.source_pvc));
        let annotations = c.annotations_mut();
        annotations.insert(SOURCE_ANNOTATION.to_owned(), source.clone());
        annotations.insert(DATA_UPLOAD_ANNOTATION.to_owned(), data_upload.clone());
        if c.spec.deletion_policy != "Retain" {
            c.spec.deletion_policy = "Retain".into();
            change = true;
        }
        change
    })
    .await?;
    Ok(kept.is_some() && wanted)
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
    let completed = |c: &VolumeSnapshotContent| {
        c.annotations().get(COMPLETED_ANNOTATION).cloned().unwrap_or_default()
    };
    // RFC 3339 in UTC sorts as text; the newest last, and it stays.
    bases.sort_by_key(|c| (completed(c), c.name_any()));
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

/// Releases the kept base snapshot whose VolumeSnapshotContent is `name`: set back to
/// `Delete`, then deleted, so the CSI snapshotter sidecar deletes the physical snapshot (it
/// finishes in the background; a content that stays `Terminating` means the sidecar could not).
/// `false` when `name` is not a kept base (absent, or not labelled so: nothing is touched).
///
/// # Errors
/// The API server refused a read or a write.
pub async fn release_kept_base(client: &Client, name: &str) -> Result<bool, ExposeError> {
    let api = contents(client);
    let is_kept = |c: &VolumeSnapshotContent| {
        c.labels().get(KEPT_BASE_LABEL).map(String::as_str) == Some("true")
    };
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

/// The kept bases matching `selector`.
async fn list(client: &Client, selector: &str) -> Result<Vec<VolumeSnapshotContent>, ExposeError> {
    let listed = contents(client).list(&ListParams::default().labels(selector)).await;
    listed.map(|l| l.items).map_err(|e| ExposeError::Api {
        step: "listing the kept base snapshots",
        source: Box::new(ferry_kube::ApiError::from_kube("VolumeSnapshotContent", selector, e)),
    })
}

/// Releases every kept base whose DataUpload, in `namespace`, is gone: its backup was deleted
/// (Velero deletes a backup's DataUploads with it). The number released.
///
/// # Errors
/// The API server refused a read or a write.
pub async fn release_orphaned_kept_bases(
    client: &Client,
    namespace: &str,
) -> Result<usize, ExposeError> {
    let uploads: Api<DataUpload> = Api::namespaced(client.clone(), namespace);
    let mut released = 0;
    for content in list(client, &format!("{KEPT_BASE_LABEL}=true")).await? {
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
