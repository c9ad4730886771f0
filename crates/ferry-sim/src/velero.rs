//! Velero's side of data movement, played against the real API server: the objects Velero and
//! its CSI plugin create for a mover (a BackupStorageLocation with its credentials secret,
//! DataUploads, restore target PVCs and DataDownloads), shaped exactly as Velero shapes them.
//!
//! A [`Velero`] names the namespace Velero runs in, the data mover its CRs ask for and the
//! BackupStorageLocation they use; its methods create the objects and return them as stored.

use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use ferry_api::keys::{
    ASYNC_OPERATION_ID_LABEL, BACKUP_NAME_LABEL, BACKUP_UID_LABEL, DYNAMIC_PV_RESTORE_LABEL,
    PVC_UID_LABEL, RESTORE_NAME_LABEL, RESTORE_UID_LABEL,
};
use ferry_api::naming::valid_label_value;
use ferry_api::{BackupStorageLocation, DataDownload, DataUpload};
use kube::api::{Api, PostParams};
use kube::{Client, ResourceExt};
use serde::de::DeserializeOwned;
use serde_json::json;

use crate::sim::random_hex;
use crate::{Binding, NodeSim, SimError, VolumeMode};

/// How long Velero gives each internal wait of the mover (`spec.operationTimeout`).
pub const OPERATION_TIMEOUT: &str = "10m0s";

/// S3 access for a BackupStorageLocation: bucket, prefix, endpoint and static credentials.
#[derive(Debug, Clone)]
pub struct S3Location {
    /// The bucket (must exist).
    pub bucket: String,
    /// The prefix inside the bucket (Velero's `objectStorage.prefix`).
    pub prefix: String,
    /// The endpoint URL (`s3Url`), addressed path-style.
    pub endpoint: String,
    /// The region.
    pub region: String,
    /// The access key written into the credentials secret.
    pub access_key: String,
    /// The secret key written into the credentials secret.
    pub secret_key: String,
}

/// Velero as the mover sees it: its namespace, the `spec.datamover` of its CRs and the
/// BackupStorageLocation they name.
#[derive(Clone)]
pub struct Velero {
    client: Client,
    /// Velero's namespace (where DataUploads, DataDownloads and the BSL live).
    pub namespace: String,
    /// The data mover name the CRs ask for (`spec.datamover`).
    pub data_mover: String,
    /// The BackupStorageLocation's name.
    pub bsl: String,
}

impl std::fmt::Debug for Velero {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Velero")
            .field("namespace", &self.namespace)
            .field("data_mover", &self.data_mover)
            .field("bsl", &self.bsl)
            .finish_non_exhaustive()
    }
}

fn object<T: DeserializeOwned>(what: String, value: serde_json::Value) -> Result<T, SimError> {
    serde_json::from_value(value).map_err(|e| SimError::Invalid { what, reason: e.to_string() })
}

/// A UID-shaped string, as Velero puts backup and restore UIDs into labels.
fn uid() -> String {
    let h = random_hex(32);
    format!("{}-{}-4{}-8{}-{}", &h[..8], &h[8..12], &h[13..16], &h[17..20], &h[20..])
}

impl Velero {
    /// Velero in `namespace`, creating CRs for `data_mover` that use BSL `bsl`.
    #[must_use]
    pub fn new(client: Client, namespace: &str, data_mover: &str, bsl: &str) -> Self {
        Self {
            client,
            namespace: namespace.to_owned(),
            data_mover: data_mover.to_owned(),
            bsl: bsl.to_owned(),
        }
    }

    /// Creates the BackupStorageLocation for `location` (provider `aws`, path-style) and
    /// Velero's credentials secret, as `velero install --secret-file` makes them: the secret
    /// `cloud-credentials` (key `cloud`, an AWS profile file) and a location without
    /// `spec.credential`, which Velero serves with the secret mounted as its own credentials
    /// file and Ferry with the secret. One location per namespace (the secret is Velero's).
    ///
    /// # Errors
    /// The API server refused either object.
    pub async fn create_bsl(
        &self,
        location: &S3Location,
    ) -> Result<BackupStorageLocation, SimError> {
        let secret_name = "cloud-credentials";
        let secret: Secret = object(
            format!("secret {secret_name}"),
            json!({
                "apiVersion": "v1", "kind": "Secret",
                "metadata": { "name": secret_name, "namespace": self.namespace },
                "stringData": { "cloud": format!(
                    "[default]\naws_access_key_id = {}\naws_secret_access_key = {}\n",
                    location.access_key, location.secret_key,
                ) },
            }),
        )?;
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), &self.namespace);
        secrets.create(&PostParams::default(), &secret).await.map_err(|e| {
            SimError::api("creating", "Secret", format!("{}/{secret_name}", self.namespace), e)
        })?;
        let bsl: BackupStorageLocation = object(
            format!("BackupStorageLocation {}", self.bsl),
            json!({
                "apiVersion": "velero.io/v1", "kind": "BackupStorageLocation",
                "metadata": { "name": self.bsl, "namespace": self.namespace },
                "spec": {
                    "provider": "aws",
                    "objectStorage": { "bucket": location.bucket, "prefix": location.prefix },
                    "config": { "region": location.region, "s3Url": location.endpoint,
                                "s3ForcePathStyle": "true" },
                },
            }),
        )?;
        let api: Api<BackupStorageLocation> = Api::namespaced(self.client.clone(), &self.namespace);
        api.create(&PostParams::default(), &bsl).await.map_err(|e| {
            SimError::api(
                "creating",
                "BackupStorageLocation",
                format!("{}/{}", self.namespace, self.bsl),
                e,
            )
        })
    }

    /// Creates a DataUpload exactly as Velero's CSI plugin does for backup `backup`: PVC
    /// `namespace/pvc` (which must exist), snapshotted by VolumeSnapshot `snapshot` of `sim`'s
    /// class; Immediate storage class.
    ///
    /// # Errors
    /// The PVC cannot be read, or the API server refused the DataUpload.
    pub async fn create_data_upload(
        &self,
        sim: &NodeSim,
        backup: &str,
        namespace: &str,
        pvc: &str,
        snapshot: &str,
    ) -> Result<DataUpload, SimError> {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        let source = pvcs.get(pvc).await.map_err(|e| {
            SimError::api("reading", "PersistentVolumeClaim", format!("{namespace}/{pvc}"), e)
        })?;
        let pvc_uid = source.uid().unwrap_or_default();
        let storage_class = source
            .spec
            .as_ref()
            .and_then(|s| s.storage_class_name.clone())
            .unwrap_or_else(|| sim.storage_class(Binding::Immediate).to_owned());
        let backup_uid = uid();
        let du: DataUpload = object(
            format!("DataUpload for {namespace}/{pvc}"),
            json!({
                "apiVersion": "velero.io/v2alpha1", "kind": "DataUpload",
                "metadata": {
                    "generateName": format!("{backup}-"),
                    "namespace": self.namespace,
                    "labels": {
                        BACKUP_NAME_LABEL: valid_label_value(backup),
                        BACKUP_UID_LABEL: backup_uid,
                        PVC_UID_LABEL: pvc_uid,
                        ASYNC_OPERATION_ID_LABEL:
                            valid_label_value(&format!("du-{backup_uid}.{pvc_uid}")),
                    },
                },
                "spec": {
                    "snapshotType": "CSI",
                    "csiSnapshot": {
                        "volumeSnapshot": snapshot,
                        "storageClass": storage_class,
                        "snapshotClass": sim.snapshot_class(),
                        "driver": sim.driver(),
                    },
                    "sourcePVC": pvc,
                    "datamover": self.data_mover,
                    "backupStorageLocation": self.bsl,
                    "sourceNamespace": namespace,
                    "operationTimeout": OPERATION_TIMEOUT,
                },
            }),
        )?;
        let api: Api<DataUpload> = Api::namespaced(self.client.clone(), &self.namespace);
        api.create(&PostParams::default(), &du).await.map_err(|e| {
            SimError::api("creating", "DataUpload", format!("{}/{backup}-*", self.namespace), e)
        })
    }

    /// Creates a restore target PVC as Velero's restore leaves it: no `volumeName`, a
    /// `velero.io/dynamic-pv-restore` selector, in `sim`'s class for `binding`.
    ///
    /// # Errors
    /// The API server refused the PVC.
    pub async fn create_restore_pvc(
        &self,
        sim: &NodeSim,
        namespace: &str,
        name: &str,
        size: &str,
        mode: VolumeMode,
        binding: Binding,
    ) -> Result<PersistentVolumeClaim, SimError> {
        let selector = format!("{namespace}.{name}.{}", random_hex(6));
        let pvc: PersistentVolumeClaim = object(
            format!("PVC {namespace}/{name}"),
            json!({
                "apiVersion": "v1", "kind": "PersistentVolumeClaim",
                "metadata": { "name": name, "namespace": namespace },
                "spec": {
                    "accessModes": ["ReadWriteOnce"],
                    "storageClassName": sim.storage_class(binding),
                    "volumeMode": mode.as_str(),
                    "resources": { "requests": { "storage": size } },
                    "selector": { "matchLabels": {
                        DYNAMIC_PV_RESTORE_LABEL: valid_label_value(&selector),
                    } },
                },
            }),
        )?;
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        api.create(&PostParams::default(), &pvc).await.map_err(|e| {
            SimError::api("creating", "PersistentVolumeClaim", format!("{namespace}/{name}"), e)
        })
    }

    /// Creates a DataDownload restoring the snapshot of the completed DataUpload `from` into
    /// the existing PVC `namespace/target`, exactly as Velero's CSI plugin does for restore
    /// `restore`.
    ///
    /// # Errors
    /// The PVC cannot be read, or the API server refused the DataDownload.
    pub async fn create_data_download(
        &self,
        restore: &str,
        namespace: &str,
        target: &str,
        from: &DataUpload,
    ) -> Result<DataDownload, SimError> {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), namespace);
        let pvc = pvcs.get(target).await.map_err(|e| {
            SimError::api("reading", "PersistentVolumeClaim", format!("{namespace}/{target}"), e)
        })?;
        let status = from.status.clone().unwrap_or_default();
        let restore_uid = uid();
        let pvc_uid = pvc.uid().unwrap_or_default();
        let dd: DataDownload = object(
            format!("DataDownload into {namespace}/{target}"),
            json!({
                "apiVersion": "velero.io/v2alpha1", "kind": "DataDownload",
                "metadata": {
                    "generateName": format!("{restore}-"),
                    "namespace": self.namespace,
                    "labels": {
                        RESTORE_NAME_LABEL: valid_label_value(restore),
                        RESTORE_UID_LABEL: restore_uid,
                        ASYNC_OPERATION_ID_LABEL:
                            valid_label_value(&format!("dd-{restore_uid}.{pvc_uid}")),
                    },
                },
                "spec": {
                    "targetVolume": { "pvc": target, "pv": "", "namespace": namespace },
                    "backupStorageLocation": self.bsl,
                    "datamover": self.data_mover,
                    "snapshotID": status.snapshot_id,
                    "sourceNamespace": from.spec.source_namespace,
                    "operationTimeout": OPERATION_TIMEOUT,
                    "nodeOS": "linux",
                    "snapshotSize": status.progress.total_bytes,
                },
            }),
        )?;
        let api: Api<DataDownload> = Api::namespaced(self.client.clone(), &self.namespace);
        api.create(&PostParams::default(), &dd).await.map_err(|e| {
            SimError::api("creating", "DataDownload", format!("{}/{restore}-*", self.namespace), e)
        })
    }
}

#[cfg(test)]
mod tests {
    use super::uid;

    #[test]
    fn uids_have_the_uuid_shape_and_differ() {
        let a = uid();
        let parts: Vec<usize> = a.split('-').map(str::len).collect();
        assert_eq!(parts, [8, 4, 4, 4, 12], "{a}");
        assert!(a.chars().all(|c| c == '-' || c.is_ascii_hexdigit()), "{a}");
        assert_ne!(a, uid());
    }
}
