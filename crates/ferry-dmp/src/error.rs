//! What can go wrong in the data mover plugin, and how each failure reaches Velero.
//!
//! Every variant names the step that failed and the object involved. [`DmpError`] converts
//! into the SDK's [`PluginError`] in one place ([`From<DmpError> for PluginError`]), which picks
//! the gRPC code Velero sees: API server trouble that may pass is `Unavailable`, a request that
//! can never work is `InvalidInput`, a missing operation is `NotFound`.

use std::time::Duration;

use ferry_kube::ApiError;
use ferry_plugin::{ObjectError, PluginError};

/// A failure of one of the data mover plugin's steps.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum DmpError {
    /// An object Velero sent could not be decoded.
    #[error("decoding the {what} Velero sent")]
    Decode {
        /// Which object: `item`, `backup`, `restore`, `item from backup`.
        what: &'static str,
        /// Why.
        #[source]
        source: ObjectError,
    },
    /// An object Velero sent lacks a field the plugin needs.
    #[error("the {what} has no {field}")]
    MissingField {
        /// Which object.
        what: String,
        /// The missing field, as a JSON path.
        field: &'static str,
    },
    /// The PVC names no storage class, so no VolumeSnapshotClass can be chosen for it.
    #[error("cannot snapshot PVC {namespace}/{name}: it has no storage class")]
    NoStorageClass {
        /// The PVC's namespace.
        namespace: String,
        /// The PVC's name.
        name: String,
    },
    /// The PVC is not bound to a volume.
    #[error("PVC {namespace}/{name} is not bound to a volume ({reason})")]
    PvcNotBound {
        /// The PVC's namespace.
        namespace: String,
        /// The PVC's name.
        name: String,
        /// What is missing: no `spec.volumeName`, or the phase it is in.
        reason: String,
    },
    /// No VolumeSnapshotClass fits the PVC's CSI driver.
    #[error("choosing a VolumeSnapshotClass for CSI driver {driver:?}: {reason}")]
    SnapshotClass {
        /// The StorageClass provisioner (the CSI driver).
        driver: String,
        /// Why none fits.
        reason: String,
    },
    /// The VolumeSnapshot did not get a snapshot handle in time.
    #[error(
        "VolumeSnapshot {namespace}/{name} has no snapshot handle after {timeout:?}{}",
        last_error.as_deref().map(|e| format!(": the CSI driver reported: {e}")).unwrap_or_default()
    )]
    SnapshotTimeout {
        /// The VolumeSnapshot's namespace.
        namespace: String,
        /// The VolumeSnapshot's name.
        name: String,
        /// How long the plugin waited (the backup's `csiSnapshotTimeout`).
        timeout: Duration,
        /// The error the VolumeSnapshotContent carried, if any.
        last_error: Option<String>,
    },
    /// A timeout in the Backup is not a Go duration.
    #[error("the backup's csiSnapshotTimeout")]
    InvalidTimeout {
        /// Why it does not parse.
        #[source]
        source: ferry_api::InvalidDuration,
    },
    /// The DataUpload could not be created (the VolumeSnapshot taken for it was deleted again).
    #[error("creating the DataUpload for PVC {pvc}")]
    CreateDataUpload {
        /// `namespace/name` of the PVC.
        pvc: String,
        /// The API server's classified answer (boxed: it is large).
        #[source]
        source: Box<ApiError>,
    },
    /// Reading, listing, creating or patching an object failed.
    #[error("{step}")]
    Api {
        /// The step, naming the object: `reading PersistentVolume pv-1`.
        step: String,
        /// The API server's classified answer (boxed: it is large).
        #[source]
        source: Box<ApiError>,
    },
    /// Velero asked about an empty operation ID.
    #[error("invalid operation ID {id:?}")]
    InvalidOperationId {
        /// The ID.
        id: String,
    },
    /// No DataUpload or DataDownload carries the operation ID.
    #[error("no {kind} in namespace {namespace} has operation ID {id:?}")]
    OperationNotFound {
        /// `DataUpload` or `DataDownload`.
        kind: &'static str,
        /// Velero's namespace.
        namespace: String,
        /// The operation ID.
        id: String,
    },
    /// Several objects carry the operation ID.
    #[error("{count} objects of kind {kind} in namespace {namespace} have operation ID {id:?}")]
    AmbiguousOperation {
        /// `DataUpload` or `DataDownload`.
        kind: &'static str,
        /// Velero's namespace.
        namespace: String,
        /// The operation ID.
        id: String,
        /// How many.
        count: usize,
    },
    /// The DataUpload result Velero prepares for a restore is missing or unreadable.
    #[error("DataUpload result for PVC {pvc} of restore {restore}: {reason}")]
    DataUploadResult {
        /// `namespace/name` of the PVC in the backup.
        pvc: String,
        /// The restore's name.
        restore: String,
        /// What is wrong.
        reason: String,
    },
    /// A snapshot ID handed to the volume snapshotter does not name a finished upload.
    #[error("snapshot {id:?}: {reason}")]
    Snapshot {
        /// The snapshot (operation) ID.
        id: String,
        /// What is wrong.
        reason: String,
    },
}

impl DmpError {
    /// An API failure during `step`.
    pub(crate) fn api(step: impl Into<String>, source: ApiError) -> Self {
        Self::Api { step: step.into(), source: Box::new(source) }
    }

    /// An API failure during `step`, from the client's error.
    pub(crate) fn kube(step: impl Into<String>, kind: &str, name: &str, err: kube::Error) -> Self {
        Self::api(step, ApiError::from_kube(kind, name, err))
    }

    /// Whether the same call may succeed later.
    #[must_use]
    pub fn is_retryable(&self) -> bool {
        match self {
            Self::Api { source, .. } | Self::CreateDataUpload { source, .. } => {
                source.is_retryable()
            }
            Self::SnapshotTimeout { .. } => true,
            _ => false,
        }
    }
}

impl From<DmpError> for PluginError {
    fn from(err: DmpError) -> Self {
        let message = err.to_string();
        match &err {
            DmpError::Decode { .. }
            | DmpError::MissingField { .. }
            | DmpError::InvalidTimeout { .. }
            | DmpError::InvalidOperationId { .. } => PluginError::invalid_input_with(message, err),
            DmpError::OperationNotFound { .. } => PluginError::not_found(message),
            DmpError::Api { source, .. } if source.is_not_found() => {
                PluginError::failed_with(message, err)
            }
            _ if err.is_retryable() => PluginError::unavailable(message, err),
            _ => PluginError::failed_with(message, err),
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn errors_map_to_the_codes_velero_sees() {
        let not_found = DmpError::OperationNotFound {
            kind: "DataUpload",
            namespace: "velero".into(),
            id: "du-1".into(),
        };
        assert_eq!(PluginError::from(not_found).code(), tonic::Code::NotFound);
        let bad = DmpError::InvalidOperationId { id: String::new() };
        assert_eq!(PluginError::from(bad).code(), tonic::Code::InvalidArgument);
        let timeout = DmpError::SnapshotTimeout {
            namespace: "apps".into(),
            name: "velero-data-x".into(),
            timeout: Duration::from_secs(600),
            last_error: Some("quota exceeded".into()),
        };
        let msg = timeout.to_string();
        assert!(msg.contains("apps/velero-data-x") && msg.contains("quota exceeded"), "{msg}");
        assert_eq!(PluginError::from(timeout).code(), tonic::Code::Unavailable);
    }
}
