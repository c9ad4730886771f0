//! The restore exposer: a volume provisioned like the target PVC, written, then handed over.

use std::collections::BTreeMap;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferry_agent::{
    ExposeParams, Exposed, ExposedVolume, Exposer, StepTimer, VolumeMode, WorkError,
};
use ferry_api::k8s_openapi::api::core::v1::{
    ObjectReference, PersistentVolume, PersistentVolumeClaim, Pod,
};
use ferry_api::keys::{DATA_DOWNLOAD_LABEL, DYNAMIC_PV_RESTORE_LABEL, SELECTED_NODE_ANNOTATION};
use ferry_api::naming::valid_label_value;
use ferry_api::{DataDownload, DataDownloadPhase};
use kube::api::{Api, ListParams};
use kube::{Client, Resource, ResourceExt};

use crate::backup::{parse_mode, parse_quantity};
use crate::objects::{self, ClaimSpec, HolderSpec};
use crate::ops::{create_or_get, delete_if_present, get_opt, owner_of, update};
use crate::pod;
use crate::provisioning::SlowClaim;
use crate::volume_wait::{VolumeWaits, locate_telling};
use crate::wait::{Look, until};
use crate::{ExposeError, ExposerConfig, labels, release};

/// Exposes DataDownloads' target volumes. See the crate docs.
#[derive(Clone)]
pub struct CsiRestoreExposer {
    client: Client,
    config: ExposerConfig,
    waits: Arc<VolumeWaits>,
    taints: crate::tolerations::NodeTaints,
}

impl std::fmt::Debug for CsiRestoreExposer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CsiRestoreExposer").field("config", &self.config).finish_non_exhaustive()
    }
}

impl CsiRestoreExposer {
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

    /// Deletes the holding pod of restore `name`, then, once its node let go of the volume
    /// (see `release`), the restore PVC.
    async fn let_go(&self, name: &str, timeout: Duration) -> Result<(), ExposeError> {
        let holder = objects::holder_name(name);
        let step = "deleting the restore pod";
        release::delete_holder(&self.client, &self.config, &holder, name, timeout, step).await?;
        delete_if_present(&self.claims(), name, "deleting the restore PVC").await
    }

    fn volumes(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    fn targets(&self, dd: &DataDownload) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &dd.spec.target_volume.namespace)
    }

    fn labels(dd: &DataDownload) -> BTreeMap<String, String> {
        BTreeMap::from([
            (DATA_DOWNLOAD_LABEL.to_owned(), valid_label_value(&dd.name_any())),
            (labels::CREATED_BY.to_owned(), "ferry".to_owned()),
        ])
    }

    /// The value of [`labels::RESTORE_FOR`] on the volume held for `dd`.
    fn restore_for(dd: &DataDownload) -> String {
        valid_label_value(&dd.name_any())
    }

    /// The selector that finds the volume held for `dd`.
    fn held_selector(dd: &DataDownload) -> String {
        format!("{}={}", labels::RESTORE_FOR, Self::restore_for(dd))
    }

    fn target_name(dd: &DataDownload) -> String {
        format!("{}/{}", dd.spec.target_volume.namespace, dd.spec.target_volume.pvc)
    }

    /// The restore PV held for `dd`, if Ferry labelled one.
    async fn held_volume(
        &self,
        dd: &DataDownload,
    ) -> Result<Option<PersistentVolume>, ExposeError> {
        let selector = Self::held_selector(dd);
        let list =
            self.volumes().list(&ListParams::default().labels(&selector)).await.map_err(|e| {
                ExposeError::Api {
                    step: "listing restore volumes",
                    source: Box::new(ferry_kube::ApiError::from_kube(
                        "PersistentVolume",
                        &selector,
                        e,
                    )),
                }
            })?;
        Ok(list.items.into_iter().next())
    }
}

#[async_trait]
impl Exposer<DataDownload> for CsiRestoreExposer {
    async fn expose(&self, dd: &DataDownload, params: &ExposeParams) -> Result<Exposed, WorkError> {
        let timeout = params.operation_timeout;
        let cancel = &params.cancel;
        let name = dd.name_any();
        let ns = &self.config.namespace;
        let target_name = Self::target_name(dd);
        let targets = self.targets(dd);
        let mut timer = StepTimer::new();
        let target = until(&format!("target PVC {target_name}"), timeout, cancel, || async {
            Ok(
                match get_opt(&targets, &dd.spec.target_volume.pvc, "reading the target PVC")
                    .await?
                {
                    Some(pvc) => Look::Ready(pvc),
                    None => Look::NotYet("not created yet".into()),
                },
            )
        })
        .await?;
        let spec = target.spec.clone().unwrap_or_default();
        if let Some(bound) = spec.volume_name.as_deref().filter(|v| !v.is_empty()) {
            return Err(ExposeError::Unusable(format!(
                "target PVC {target_name} is already bound to PV {bound}: a restore needs an \
                 unbound PVC (Velero's plugin clears spec.volumeName before creating the \
                 DataDownload)"
            ))
            .into());
        }
        let class = spec.storage_class_name.clone();
        let node = if !self.config.ignore_delay_binding
            && crate::topology::waits_for_consumer(
                &self.client,
                class.as_deref(),
                ": the target PVC names a storage class that does not exist",
            )
            .await?
        {
            let what = format!("a node to be selected for target PVC {target_name}");
            Some(
                until(&what, timeout, cancel, || async {
                    let pvc = get_opt(&targets, &dd.spec.target_volume.pvc, "reading the target")
                        .await?
                        .ok_or_else(|| ExposeError::Missing {
                            what: format!("target PVC {target_name}"),
                            hint: ": it was deleted during the restore".into(),
                        })?;
                    Ok(match pvc.annotations().get(SELECTED_NODE_ANNOTATION) {
                        Some(node) => Look::Ready(node.clone()),
                        None => Look::NotYet("no pod using it has been scheduled".into()),
                    })
                })
                .await?,
            )
        } else {
            None
        };
        timer.mark("target PVC found");
        let requested = spec
            .resources
            .as_ref()
            .and_then(|r| r.requests.as_ref())
            .and_then(|r| r.get("storage"))
            .and_then(|q| parse_quantity(&q.0))
            .unwrap_or(0);
        let size = requested.max(dd.spec.snapshot_size);
        if size <= 0 {
            return Err(ExposeError::Invalid(format!(
                "neither target PVC {target_name} nor DataDownload {name} gives a volume size"
            ))
            .into());
        }
        let mode = spec.volume_mode.as_deref().map_or(VolumeMode::Filesystem, parse_mode);
        let owner = owner_of(dd)?;
        let labels = Self::labels(dd);
        let access_modes = spec
            .access_modes
            .clone()
            .filter(|m| !m.is_empty())
            .unwrap_or_else(|| vec!["ReadWriteOnce".to_owned()]);
        let claim = objects::claim(&ClaimSpec {
            namespace: ns,
            name: &name,
            storage_class: class.as_deref(),
            access_modes,
            mode,
            size: size.to_string(),
            snapshot: None,
            labels: &labels,
            owner: &owner,
        })?;
        create_or_get(&self.claims(), &claim, "creating the restore PVC").await?;
        let tolerations = crate::tolerations::for_holders(
            &self.client,
            &self.config.agent_tolerations,
            &self.taints,
        )
        .await?;
        let holder = objects::holder_pod(
            &self.config,
            &HolderSpec {
                namespace: ns,
                name: &objects::holder_name(&name),
                claim: &name,
                mode,
                read_only: false,
                node: node.as_deref(),
                labels: &labels,
                owner: &owner,
                avoid: &params.avoid_nodes,
                tolerations: &tolerations,
                topology: &[],
                storage_class: class.as_deref().unwrap_or_default(),
            },
        )?;
        pod::ensure_holder(&self.pods(), &holder, &params.avoid_nodes, timeout, cancel).await?;
        timer.mark("restore PVC and pod created");
        let placed = pod::wait_placed(
            &self.pods(),
            &holder.name_any(),
            &SlowClaim::new(&self.client, ns, &name, &params.node, dd.object_ref(&())),
            timeout,
            self.config.unschedulable_grace,
            cancel,
        )
        .await?;
        timer.mark("pod placed");
        Ok(timer.exposed(placed))
    }

    async fn locate(
        &self,
        dd: &DataDownload,
        node: &str,
    ) -> Result<Option<ExposedVolume>, WorkError> {
        locate_telling(&self.client, &self.config, &self.waits, dd, node).await.map_err(Into::into)
    }

    async fn still_held(&self, dd: &DataDownload, volume: &ExposedVolume) -> Result<(), WorkError> {
        crate::backup::still_held(&self.client, &self.config, &dd.name_any(), volume)
            .await
            .map_err(Into::into)
    }

    async fn finish(
        &self,
        dd: &DataDownload,
        _volume: &ExposedVolume,
        timeout: Duration,
    ) -> Result<(), WorkError> {
        let cancel = tokio_util::sync::CancellationToken::new();
        let name = dd.name_any();
        let target_name = Self::target_name(dd);
        // 1. Hold the restored PV: Retain, so deleting the restore PVC keeps it.
        let pv_name = match get_opt(&self.claims(), &name, "reading the restore PVC").await? {
            Some(pvc) => pvc.spec.and_then(|s| s.volume_name).unwrap_or_default(),
            None => self.held_volume(dd).await?.map(|pv| pv.name_any()).unwrap_or_default(),
        };
        if pv_name.is_empty() {
            return Err(ExposeError::Unusable(format!(
                "the restore PVC of DataDownload {name} has no volume to hand over"
            ))
            .into());
        }
        let volumes = self.volumes();
        update(&volumes, &pv_name, "retaining the restored volume", |pv| {
            let spec = pv.spec.get_or_insert_with(Default::default);
            if pv.metadata.labels.as_ref().is_some_and(|l| l.contains_key(labels::RESTORE_FOR)) {
                return false;
            }
            let original = spec.persistent_volume_reclaim_policy.clone().unwrap_or_default();
            spec.persistent_volume_reclaim_policy = Some("Retain".into());
            pv.annotations_mut().insert(labels::ORIGINAL_RECLAIM_POLICY.into(), original);
            pv.labels_mut().insert(labels::RESTORE_FOR.into(), Self::restore_for(dd));
            true
        })
        .await?;
        // 2. Let go of it: pod and restore PVC gone.
        self.let_go(&name, timeout).await?;
        until(&format!("restore PVC {name} to be deleted"), timeout, &cancel, || async {
            Ok(match get_opt(&self.claims(), &name, "reading the restore PVC").await? {
                None => Look::Ready(()),
                Some(_) => Look::NotYet("still there".into()),
            })
        })
        .await?;
        // 3. Point it at the target PVC, with the label its selector asks for.
        let targets = self.targets(dd);
        let target = get_opt(&targets, &dd.spec.target_volume.pvc, "reading the target PVC")
            .await?
            .ok_or_else(|| ExposeError::Missing {
                what: format!("target PVC {target_name}"),
                hint: ": it was deleted before the restored volume could be bound to it".into(),
            })?;
        let selector_value = target
            .spec
            .as_ref()
            .and_then(|s| s.selector.as_ref())
            .and_then(|s| s.match_labels.as_ref())
            .and_then(|l| l.get(DYNAMIC_PV_RESTORE_LABEL))
            .cloned();
        let claim_ref = ObjectReference {
            api_version: Some("v1".into()),
            kind: Some("PersistentVolumeClaim".into()),
            namespace: Some(dd.spec.target_volume.namespace.clone()),
            name: Some(dd.spec.target_volume.pvc.clone()),
            uid: target.uid(),
            ..ObjectReference::default()
        };
        update(&volumes, &pv_name, "binding the restored volume to the target", |pv| {
            let spec = pv.spec.get_or_insert_with(Default::default);
            if spec.claim_ref.as_ref() == Some(&claim_ref) {
                return false;
            }
            spec.claim_ref = Some(claim_ref.clone());
            if let Some(value) = &selector_value {
                pv.labels_mut().insert(DYNAMIC_PV_RESTORE_LABEL.into(), value.clone());
            }
            true
        })
        .await?;
        // 4. Wait for Kubernetes to bind them.
        until(&format!("target PVC {target_name} to bind to {pv_name}"), timeout, &cancel, || {
            let targets = targets.clone();
            let pv_name = pv_name.clone();
            async move {
                let pvc =
                    get_opt(&targets, &dd.spec.target_volume.pvc, "reading the target").await?;
                let bound = pvc.as_ref().is_some_and(|p| {
                    p.spec.as_ref().and_then(|s| s.volume_name.as_deref()) == Some(&pv_name)
                        && p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
                });
                Ok(if bound { Look::Ready(()) } else { Look::NotYet("not bound".into()) })
            }
        })
        .await?;
        // 5. Put the reclaim policy back; the volume is the user's now.
        update(&volumes, &pv_name, "restoring the reclaim policy", |pv| {
            let Some(original) = pv.annotations_mut().remove(labels::ORIGINAL_RECLAIM_POLICY)
            else {
                return false;
            };
            pv.labels_mut().remove(labels::RESTORE_FOR);
            if !original.is_empty() {
                pv.spec.get_or_insert_with(Default::default).persistent_volume_reclaim_policy =
                    Some(original);
            }
            true
        })
        .await?;
        Ok(())
    }

    async fn cleanup(&self, dd: &DataDownload, timeout: Duration) -> Result<(), WorkError> {
        let name = dd.name_any();
        self.waits.done(&name);
        self.let_go(&name, timeout).await?;
        // A volume Ferry held but never handed over (the restore failed or was canceled
        // between steps) is deleted; one bound to the target is the user's.
        let completed =
            dd.status.as_ref().and_then(|s| s.phase) == Some(DataDownloadPhase::Completed);
        if let Some(pv) = self.held_volume(dd).await?
            && !completed
        {
            delete_if_present(&self.volumes(), &pv.name_any(), "deleting the unused volume")
                .await?;
        }
        Ok(())
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use serde_json::json;

    use super::*;
    use crate::backup::tests::{is_label_value, longest_name};

    fn download(name: &str) -> DataDownload {
        serde_json::from_value(json!({
            "apiVersion": "velero.io/v2alpha1", "kind": "DataDownload",
            "metadata": { "name": name, "namespace": "velero" },
            "spec": { "targetVolume": { "pvc": "data", "pv": "", "namespace": "app" },
                      "backupStorageLocation": "default", "snapshotID": "s",
                      "sourceNamespace": "app", "operationTimeout": "10m0s" },
        }))
        .unwrap()
    }

    #[test]
    fn a_long_name_becomes_valid_label_values_and_the_selector_finds_them() {
        let long = longest_name('a');
        let dd = download(&long);
        let value = CsiRestoreExposer::labels(&dd)[DATA_DOWNLOAD_LABEL].clone();
        assert!(is_label_value(&value), "{value}");
        assert_eq!(value, valid_label_value(&long));
        let held = CsiRestoreExposer::restore_for(&dd);
        assert!(is_label_value(&held), "{held}");
        assert_eq!(
            CsiRestoreExposer::held_selector(&dd),
            format!("{}={held}", labels::RESTORE_FOR)
        );
        let other = download(&longest_name('b'));
        assert_ne!(CsiRestoreExposer::restore_for(&other), held);
        assert_eq!(CsiRestoreExposer::restore_for(&download("r-1")), "r-1");
    }
}
