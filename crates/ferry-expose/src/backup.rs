//! The backup exposer: a DataUpload's CSI snapshot as a backup PVC held by a pod.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferry_agent::{
    CsiSnapshot, ExposeParams, Exposed, ExposedVolume, Exposer, StepTimer, VolumeMode, WorkError,
};
use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use ferry_api::keys::DATA_UPLOAD_LABEL;
use ferry_api::naming::valid_label_value;
use ferry_api::{DataUpload, DataUploadPhase, NodeOs, VolumeSnapshot, VolumeSnapshotContent};
use kube::api::Api;
use kube::{Client, Resource, ResourceExt};
use tokio_util::sync::CancellationToken;

use crate::objects::{self, ClaimSpec, HolderSpec, mode_text};
use crate::ops::{create_or_get, delete_if_present, get_opt, owner_of, update};
use crate::pod;
use crate::provisioning::SlowClaim;
use crate::volume_wait::{VolumeWaits, locate_telling};
use crate::wait::{Look, until};
use crate::{ExposeError, ExposerConfig, kept, labels, release};

/// Exposes DataUploads' CSI snapshots. See the crate docs.
#[derive(Clone)]
pub struct CsiBackupExposer {
    client: Client,
    config: ExposerConfig,
    waits: Arc<VolumeWaits>,
    taints: crate::tolerations::NodeTaints,
}

impl std::fmt::Debug for CsiBackupExposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsiBackupExposer").field("config", &self.config).finish_non_exhaustive()
    }
}

/// The physical snapshot as found on the source or the backup objects.
struct Snapshot {
    handle: String,
    driver: String,
    class: Option<String>,
    mode: VolumeMode,
    size_bytes: Option<i64>,
}

impl CsiBackupExposer {
    /// An exposer working in `config.namespace`.
    #[must_use]
    pub fn new(client: Client, config: ExposerConfig) -> Self {
        Self { client, config, waits: Arc::default(), taints: Default::default() }
    }

    fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn claims(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn snapshots(&self) -> Api<VolumeSnapshot> {
        Api::namespaced(self.client.clone(), &self.config.namespace)
    }

    fn contents(&self) -> Api<VolumeSnapshotContent> {
        Api::all(self.client.clone())
    }

    fn labels(du: &DataUpload) -> BTreeMap<String, String> {
        BTreeMap::from([
            (DATA_UPLOAD_LABEL.to_owned(), valid_label_value(&du.name_any())),
            (labels::CREATED_BY.to_owned(), "ferry".to_owned()),
        ])
    }

    /// Moves the physical snapshot from the source VolumeSnapshot to the backup pair, or
    /// finds it there from an earlier attempt.
    async fn take_over_snapshot(
        &self,
        du: &DataUpload,
        timeout: Duration,
        cancel: &CancellationToken,
    ) -> Result<Snapshot, ExposeError> {
        let name = du.name_any();
        if let Some(content) =
            get_opt(&self.contents(), &name, "reading the backup content").await?
        {
            return Ok(snapshot_of(&content, None));
        }
        let csi = du.spec.csi_snapshot.as_ref().ok_or_else(|| {
            ExposeError::Invalid(format!("DataUpload {name} has no spec.csiSnapshot"))
        })?;
        let source_ns = &du.spec.source_namespace;
        let sources: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), source_ns);
        let what = format!("VolumeSnapshot {source_ns}/{}", csi.volume_snapshot);
        let source = until(&format!("{what} to be ready"), timeout, cancel, || async {
            let vs = get_opt(&sources, &csi.volume_snapshot, "reading the source snapshot")
                .await?
                .ok_or_else(|| ExposeError::Missing {
                    what: what.clone(),
                    hint: ": the snapshot the DataUpload names was deleted or never created".into(),
                })?;
            let status = vs.status.clone().unwrap_or_default();
            if let Some(message) = status.error.as_ref().and_then(|e| e.message.clone()) {
                return Err(ExposeError::Unusable(format!("{what} failed: {message}")));
            }
            match (status.ready_to_use, &status.bound_volume_snapshot_content_name) {
                (Some(true), Some(content)) => Ok(Look::Ready((vs, content.clone()))),
                _ => Ok(Look::NotYet(format!("{what} readyToUse={:?}", status.ready_to_use))),
            }
        })
        .await?;
        let (source_vs, source_content_name) = source;
        let source_content = get_opt(&self.contents(), &source_content_name, "reading the content")
            .await?
            .ok_or_else(|| ExposeError::Missing {
                what: format!("VolumeSnapshotContent {source_content_name}"),
                hint: String::new(),
            })?;
        let size = source_vs
            .status
            .as_ref()
            .and_then(|s| s.restore_size.as_ref())
            .and_then(|q| parse_quantity(&q.0));
        let mode = match source_content.spec.source_volume_mode.as_deref() {
            Some(m) => parse_mode(m),
            None => self.source_pvc_mode(du).await?,
        };
        let mut found = snapshot_of(&source_content, Some(mode));
        if found.size_bytes.is_none() {
            found.size_bytes = size;
        }
        if found.handle.is_empty() {
            return Err(ExposeError::Unusable(format!(
                "VolumeSnapshotContent {source_content_name} has no snapshot handle"
            )));
        }
        let class = (!csi.snapshot_class.is_empty()).then_some(csi.snapshot_class.as_str());
        let keep = kept::wanted(&self.client, self.config.keep_base_snapshot, du, mode).await?;
        let mut content = objects::backup_content(
            &name,
            &found.handle,
            &found.driver,
            class.or(found.class.as_deref()),
            Some(mode_text(mode)),
            &self.config.namespace,
            source_content.labels().get(objects::MANAGED_BY_LABEL).map(String::as_str),
        )?;
        if keep {
            kept::mark_to_keep(&mut content, du);
        }
        if let Some(volume) =
            source_content.spec.source.volume_handle.as_ref().filter(|v| !v.is_empty())
        {
            content
                .annotations_mut()
                .insert(kept::SOURCE_VOLUME_ANNOTATION.to_owned(), volume.clone());
        }
        let made = create_or_get(&self.contents(), &content, "creating the backup content").await?;
        // One made by an earlier Ferry, without the label, would never be readied by a
        // distributed snapshotter: label it now.
        if let Some(node) =
            source_content.labels().get(objects::MANAGED_BY_LABEL).filter(|n| !n.is_empty())
            && made.labels().get(objects::MANAGED_BY_LABEL) != Some(node)
        {
            update(&self.contents(), &name, "labelling the backup content with its node", |c| {
                let labels = c.labels_mut();
                let change = labels.get(objects::MANAGED_BY_LABEL) != Some(node);
                labels.insert(objects::MANAGED_BY_LABEL.to_owned(), node.clone());
                change
            })
            .await?;
        }
        // The physical snapshot now has two owners; let go of the source's claim on it.
        update(&self.contents(), &source_content_name, "retaining the source content", |c| {
            let change = c.spec.deletion_policy != "Retain";
            c.spec.deletion_policy = "Retain".into();
            change
        })
        .await?;
        delete_if_present(&sources, &csi.volume_snapshot, "deleting the source snapshot").await?;
        delete_if_present(&self.contents(), &source_content_name, "deleting the source content")
            .await?;
        Ok(found)
    }

    /// The backup VolumeSnapshot of `du` and its physical snapshot, once its content has a
    /// handle.
    async fn backup_snapshot(&self, du: &DataUpload) -> Result<Option<CsiSnapshot>, ExposeError> {
        let name = du.name_any();
        let content = get_opt(&self.contents(), &name, "reading the backup content").await?;
        let Some(content) = content else { return Ok(None) };
        let kept = kept::decided(&content);
        let source_volume = content.annotations().get(kept::SOURCE_VOLUME_ANNOTATION).cloned();
        let s = snapshot_of(&content, None);
        Ok((!s.handle.is_empty()).then(|| CsiSnapshot {
            namespace: self.config.namespace.clone(),
            name,
            driver: s.driver,
            handle: s.handle,
            kept,
            source_volume,
        }))
    }

    async fn source_pvc_mode(&self, du: &DataUpload) -> Result<VolumeMode, ExposeError> {
        let pvcs: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), &du.spec.source_namespace);
        let pvc = get_opt(&pvcs, &du.spec.source_pvc, "reading the source PVC").await?;
        Ok(pvc
            .and_then(|p| p.spec)
            .and_then(|s| s.volume_mode)
            .map_or(VolumeMode::Filesystem, |m| parse_mode(&m)))
    }
}

#[async_trait]
impl Exposer<DataUpload> for CsiBackupExposer {
    async fn expose(&self, du: &DataUpload, params: &ExposeParams) -> Result<Exposed, WorkError> {
        let timeout = params.operation_timeout;
        let cancel = &params.cancel;
        let name = du.name_any();
        let ns = &self.config.namespace;
        let owner = owner_of(du)?;
        let labels = Self::labels(du);
        let mut timer = StepTimer::new();
        let snapshot = self.take_over_snapshot(du, timeout, cancel).await?;
        timer.mark("snapshot handed over");
        let class = du.spec.csi_snapshot.as_ref().map(|c| c.snapshot_class.clone());
        let vs = objects::backup_snapshot(
            ns,
            &name,
            &name,
            class.as_deref().or(snapshot.class.as_deref()),
            &owner,
            &labels,
        )?;
        create_or_get(&self.snapshots(), &vs, "creating the backup snapshot").await?;
        let what = format!("backup VolumeSnapshot {ns}/{name} to be ready");
        let ready_size = until(&what, timeout, cancel, || async {
            let vs = get_opt(&self.snapshots(), &name, "reading the backup snapshot").await?;
            let status = vs.and_then(|v| v.status).unwrap_or_default();
            if let Some(message) = status.error.as_ref().and_then(|e| e.message.clone()) {
                return Err(ExposeError::Unusable(format!("backup snapshot failed: {message}")));
            }
            Ok(match status.ready_to_use {
                Some(true) => {
                    Look::Ready(status.restore_size.as_ref().and_then(|q| parse_quantity(&q.0)))
                }
                _ => Look::NotYet(format!("readyToUse={:?}", status.ready_to_use)),
            })
        })
        .await?;
        timer.mark("backup snapshot ready");
        let size = snapshot.size_bytes.or(ready_size).ok_or_else(|| {
            ExposeError::Unusable(format!(
                "the snapshot of DataUpload {name} reports no restoreSize: cannot size the backup PVC"
            ))
        })?;
        let source_class = du.spec.csi_snapshot.as_ref().map(|c| c.storage_class.clone());
        let source_class = source_class.unwrap_or_default();
        let storage_class = self.config.backup_pvc_class(&source_class);
        let read_only = self.config.backup_pvc_read_only(&source_class);
        let claim = objects::claim(&ClaimSpec {
            namespace: ns,
            name: &name,
            storage_class: (!storage_class.is_empty()).then_some(storage_class.as_str()),
            access_modes: vec![if read_only { "ReadOnlyMany" } else { "ReadWriteOnce" }.into()],
            mode: snapshot.mode,
            size: size.to_string(),
            snapshot: Some(&name),
            labels: &labels,
            owner: &owner,
        })?;
        create_or_get(&self.claims(), &claim, "creating the backup PVC").await?;
        let tolerations = crate::tolerations::for_holders(
            &self.client,
            &self.config.agent_tolerations,
            &self.taints,
        )
        .await?;
        let topology = if crate::topology::waits_for_consumer(
            &self.client,
            Some(storage_class.as_str()),
            ": the backup PVC's storage class (the source's, or the one backupPVC maps it to) \
             does not exist",
        )
        .await?
        {
            crate::topology::source_terms(
                &self.client,
                &du.spec.source_namespace,
                &du.spec.source_pvc,
            )
            .await?
        } else {
            Vec::new()
        };
        let holder = objects::holder_pod(
            &self.config,
            &HolderSpec {
                namespace: ns,
                name: &objects::holder_name(&name),
                claim: &name,
                mode: snapshot.mode,
                read_only,
                node: None,
                labels: &labels,
                owner: &owner,
                avoid: &params.avoid_nodes,
                tolerations: &tolerations,
                topology: &topology,
                // Velero picks the rule by the backup PVC's class.
                storage_class: &storage_class,
            },
        )?;
        pod::ensure_holder(&self.pods(), &holder, &params.avoid_nodes, timeout, cancel).await?;
        timer.mark("backup PVC and pod created");
        let node = pod::wait_placed(
            &self.pods(),
            &holder.name_any(),
            &SlowClaim::new(&self.client, ns, &name, &params.node, du.object_ref(&())),
            timeout,
            self.config.unschedulable_grace,
            cancel,
        )
        .await?;
        timer.mark("pod placed");
        Ok(timer.exposed(node))
    }

    async fn locate(
        &self,
        du: &DataUpload,
        node: &str,
    ) -> Result<Option<ExposedVolume>, WorkError> {
        let found = locate_telling(&self.client, &self.config, &self.waits, du, node).await?;
        match found {
            // Changed-block tracking asks about the backup VolumeSnapshot and its handle.
            Some(mut volume) if volume.mode == VolumeMode::Block => {
                volume.snapshot = self.backup_snapshot(du).await?;
                Ok(Some(volume))
            }
            other => Ok(other),
        }
    }

    async fn still_held(&self, du: &DataUpload, volume: &ExposedVolume) -> Result<(), WorkError> {
        still_held(&self.client, &self.config, &du.name_any(), volume).await.map_err(Into::into)
    }

    async fn cleanup(&self, du: &DataUpload, timeout: Duration) -> Result<(), WorkError> {
        let name = du.name_any();
        self.waits.done(&name);
        let completed =
            du.status.as_ref().and_then(|s| s.phase) == Some(DataUploadPhase::Completed);
        // A completed block backup's physical snapshot stays, as the next delta's base; one
        // made to be kept whose backup did not complete goes, `Delete` written first.
        let kept = completed && kept::keep(&self.client, du).await?;
        if !kept {
            kept::let_go(&self.client, du).await?;
        }
        // The PVC only once the node has let go of its volume (see `release`).
        let holder = objects::holder_name(&name);
        let step = "deleting the backup pod";
        release::delete_holder(&self.client, &self.config, &holder, &name, timeout, step).await?;
        delete_if_present(&self.claims(), &name, "deleting the backup PVC").await?;
        delete_if_present(&self.snapshots(), &name, "deleting the backup snapshot").await?;
        if !kept {
            // deletionPolicy Delete: this removes the physical snapshot too.
            delete_if_present(&self.contents(), &name, "deleting the backup content").await?;
        }
        // This backup is now the newest of its PVC: older kept bases are of no more use.
        if completed {
            kept::release_superseded(&self.client, du).await?;
        }
        Ok(())
    }
}

/// What [`locate`] found.
pub(crate) enum Located {
    /// The volume is usable on the node.
    Ready(ExposedVolume),
    /// Not yet: what is still missing, for the user.
    Waiting(String),
}

/// Finds the volume of holding pod `name` (in Velero's namespace) on `node`.
pub(crate) async fn locate(
    client: &Client,
    config: &ExposerConfig,
    name: &str,
    node: &str,
) -> Result<Located, ExposeError> {
    let ns = &config.namespace;
    let (claim_name, name) = (name, &objects::holder_name(name));
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let Some(pod) = get_opt(&pods, name, "reading the holding pod").await? else {
        return Err(ExposeError::Unusable(format!(
            "pod {ns}/{name} holding the volume was deleted"
        )));
    };
    pod::failed(&pod)?;
    pod::not_deleted(&pod)?;
    match pod.spec.as_ref().and_then(|s| s.node_name.as_deref()) {
        Some(n) if n == node => {}
        Some(other) => {
            return Ok(Located::Waiting(format!(
                "pod {ns}/{name} holding the volume was placed on node {other}, not on this one"
            )));
        }
        None => {
            return Ok(Located::Waiting(format!("pod {ns}/{name} is not scheduled yet")));
        }
    }
    if !pod::running(&pod) {
        return Ok(Located::Waiting(format!(
            "pod {ns}/{name} holding the volume is not running yet: {}",
            pod::not_running_because(&pod)
        )));
    }
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(client.clone(), ns);
    let Some(claim) = get_opt(&claims, claim_name, "reading the exposed PVC").await? else {
        return Err(ExposeError::Unusable(format!("PVC {ns}/{claim_name} was deleted")));
    };
    let spec = claim.spec.unwrap_or_default();
    let Some(pv) = spec.volume_name.filter(|v| !v.is_empty()) else {
        return Ok(Located::Waiting(format!("PVC {ns}/{claim_name} is not bound to a volume yet")));
    };
    let mode = spec.volume_mode.as_deref().map_or(VolumeMode::Filesystem, parse_mode);
    let uid = pod.uid().unwrap_or_default();
    let root = &config.kubelet_root;
    let found = crate::find_volume(root, &uid, &pv, mode).map_err(|e| {
        ExposeError::Unusable(format!(
            "looking for volume {pv} of pod {name} under {}: {e}",
            root.display()
        ))
    })?;
    Ok(match found {
        Some((path, root)) => Located::Ready(ExposedVolume {
            node: node.to_owned(),
            path,
            root: Some(Arc::new(root)),
            holder: uid,
            mode,
            node_os: NodeOs::Linux,
            snapshot: None,
        }),
        None => {
            let expected = crate::pod_volume_path(root, &uid, "kubernetes.io~csi", &pv, mode);
            Located::Waiting(format!(
                "the kubelet has not exposed volume {pv} of pod {ns}/{name} (uid {uid}) yet: {} \
                 (the agent reads the kubelet's directory at {}: is that the kubelet's \
                 --root-dir as this agent sees it?)",
                crate::kubelet::what_is_at(&expected, mode),
                root.display()
            ))
        }
    })
}

/// Whether holding pod `name` (in Velero's namespace) still holds `volume`: the same pod (by
/// UID), not being deleted, not failed or evicted. A failed read of the pod is logged and
/// counts as held (the descriptor the data path uses keeps naming the volume either way).
pub(crate) async fn still_held(
    client: &Client,
    config: &ExposerConfig,
    name: &str,
    volume: &ExposedVolume,
) -> Result<(), ExposeError> {
    let ns = &config.namespace;
    let name = &objects::holder_name(name);
    let pods: Api<Pod> = Api::namespaced(client.clone(), ns);
    let pod = match get_opt(&pods, name, "reading the holding pod").await {
        Ok(pod) => pod,
        Err(e) => {
            tracing::warn!(pod = %name, error = %e, "cannot check the holding pod; checking again later");
            return Ok(());
        }
    };
    let Some(pod) = pod else {
        return Err(ExposeError::Unusable(format!(
            "pod {ns}/{name} holding the volume was deleted"
        )));
    };
    if pod.uid().as_deref() != Some(volume.holder.as_str()) {
        return Err(ExposeError::Unusable(format!(
            "pod {ns}/{name} holding the volume was deleted and another made in its place"
        )));
    }
    pod::not_deleted(&pod)?;
    pod::failed(&pod)
}

fn snapshot_of(content: &VolumeSnapshotContent, mode: Option<VolumeMode>) -> Snapshot {
    let status = content.status.clone().unwrap_or_default();
    Snapshot {
        handle: status
            .snapshot_handle
            .or_else(|| content.spec.source.snapshot_handle.clone())
            .unwrap_or_default(),
        driver: content.spec.driver.clone(),
        class: content.spec.volume_snapshot_class_name.clone(),
        mode: mode.unwrap_or_else(|| {
            content.spec.source_volume_mode.as_deref().map_or(VolumeMode::Filesystem, parse_mode)
        }),
        size_bytes: status.restore_size,
    }
}

pub(crate) fn parse_mode(text: &str) -> VolumeMode {
    if text == "Block" { VolumeMode::Block } else { VolumeMode::Filesystem }
}

/// Bytes of a Kubernetes quantity in the forms storage uses (`1Gi`, `500M`, `1073741824`).
pub(crate) fn parse_quantity(text: &str) -> Option<i64> {
    let digits = text.find(|c: char| !c.is_ascii_digit()).unwrap_or(text.len());
    let (number, suffix) = text.split_at(digits);
    let number: i64 = number.parse().ok()?;
    let factor: i64 = match suffix {
        "" => 1,
        "k" => 1000,
        "M" => 1000_i64.pow(2),
        "G" => 1000_i64.pow(3),
        "T" => 1000_i64.pow(4),
        "Ki" => 1 << 10,
        "Mi" => 1 << 20,
        "Gi" => 1 << 30,
        "Ti" => 1 << 40,
        _ => return None,
    };
    number.checked_mul(factor)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
pub(crate) mod tests {
    use serde_json::json;

    use super::*;

    /// A name as long as Kubernetes allows (253), from a long Backup name as Velero makes it.
    pub(crate) fn longest_name(last: char) -> String {
        format!("nightly-{}{last}-x7k2q", "v".repeat(253 - 15))
    }

    /// Whether Kubernetes accepts `value` as a label value.
    pub(crate) fn is_label_value(value: &str) -> bool {
        let alnum = |c: Option<char>| c.is_some_and(|c| c.is_ascii_alphanumeric());
        value.is_empty()
            || (value.len() <= 63
                && alnum(value.chars().next())
                && alnum(value.chars().last())
                && value.chars().all(|c| c.is_ascii_alphanumeric() || "-_.".contains(c)))
    }

    pub(crate) fn upload(name: &str) -> DataUpload {
        serde_json::from_value(json!({
            "apiVersion": "velero.io/v2alpha1", "kind": "DataUpload",
            "metadata": { "name": name, "namespace": "velero" },
            "spec": { "snapshotType": "CSI", "sourcePVC": "data", "sourceNamespace": "app",
                      "backupStorageLocation": "default", "operationTimeout": "10m0s" },
        }))
        .unwrap()
    }

    #[test]
    fn a_holding_pod_of_the_longest_name_fits_the_kubelets_log_directory() {
        let long = longest_name('x');
        let pod = crate::objects::holder_name(&long);
        // The kubelet's `/var/log/pods/<namespace>_<pod>_<uid>`, with the longest namespace.
        let dir = format!("{}_{pod}_0aca3f63-90ad-4e5e-b417-87f3c084af29", "n".repeat(63));
        assert!(dir.len() <= 255, "{} bytes: {dir}", dir.len());
        assert!(is_label_value(&pod), "{pod}");
        assert_eq!(crate::objects::holder_name("nightly-1-x7k2q"), "nightly-1-x7k2q");
    }

    #[test]
    fn a_long_name_becomes_a_valid_label_value() {
        let long = longest_name('a');
        assert_eq!(long.len(), 253);
        let value = CsiBackupExposer::labels(&upload(&long))[DATA_UPLOAD_LABEL].clone();
        assert!(is_label_value(&value), "{value}");
        assert_eq!(value, valid_label_value(&long));
        // Names alike in their first 57 characters still get values of their own.
        let other = CsiBackupExposer::labels(&upload(&longest_name('b')));
        assert_ne!(other[DATA_UPLOAD_LABEL], value);
        // A name that is a valid value already is kept, so objects labelled by earlier
        // versions are still found.
        let short = CsiBackupExposer::labels(&upload("nightly-x7k2q"));
        assert_eq!(short[DATA_UPLOAD_LABEL], "nightly-x7k2q");
    }

    #[test]
    fn quantities() {
        assert_eq!(parse_quantity("1Gi"), Some(1 << 30));
        assert_eq!(parse_quantity("500M"), Some(500_000_000));
        assert_eq!(parse_quantity("4096"), Some(4096));
        assert_eq!(parse_quantity("1.5Gi"), None);
        assert_eq!(parse_quantity("x"), None);
    }
}
