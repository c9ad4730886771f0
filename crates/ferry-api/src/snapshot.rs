//! The CSI snapshotter's objects (`snapshot.storage.k8s.io/v1`).
//!
//! Unlike Velero's CRDs, VolumeSnapshot and VolumeSnapshotContent have a status subresource:
//! their status is written through `/status` (by the snapshot controller).

use std::collections::BTreeMap;

use k8s_openapi::api::core::v1::ObjectReference;
use k8s_openapi::apimachinery::pkg::api::resource::Quantity;
use k8s_openapi::apimachinery::pkg::apis::meta::v1::ObjectMeta;
use kube::CustomResource;
use serde::{Deserialize, Serialize};

use crate::Time;

/// A request for a snapshot of a PVC, or a handle on a pre-provisioned snapshot content.
#[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[kube(
    group = "snapshot.storage.k8s.io",
    version = "v1",
    kind = "VolumeSnapshot",
    plural = "volumesnapshots",
    namespaced,
    status = "VolumeSnapshotStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSpec {
    /// Where the snapshot comes from: exactly one of the two fields is set.
    pub source: VolumeSnapshotSource,
    /// The VolumeSnapshotClass to use.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
}

/// The source of a VolumeSnapshot.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotSource {
    /// Take a new snapshot of this PVC (same namespace).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub persistent_volume_claim_name: Option<String>,
    /// Bind to this existing VolumeSnapshotContent.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_content_name: Option<String>,
}

/// The observed state of a VolumeSnapshot.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotStatus {
    /// The content this snapshot is bound to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub bound_volume_snapshot_content_name: Option<String>,
    /// When the storage system cut the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<Time>,
    /// Whether the snapshot can be used to provision a volume.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// The minimum size of a volume restored from this snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<Quantity>,
    /// The last error while taking the snapshot.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<VolumeSnapshotError>,
    /// The group snapshot this snapshot belongs to.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_group_snapshot_name: Option<String>,
}

/// An error reported by the snapshot controller or the CSI driver.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
pub struct VolumeSnapshotError {
    /// What went wrong.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub message: Option<String>,
    /// When.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub time: Option<Time>,
}

/// The physical snapshot on the storage system (cluster-scoped).
#[derive(CustomResource, Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[kube(
    group = "snapshot.storage.k8s.io",
    version = "v1",
    kind = "VolumeSnapshotContent",
    plural = "volumesnapshotcontents",
    status = "VolumeSnapshotContentStatus",
    schema = "disabled",
    derive = "PartialEq"
)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSpec {
    /// The VolumeSnapshot this content is bound to.
    pub volume_snapshot_ref: VolumeSnapshotRef,
    /// `Delete` removes the physical snapshot with this object; `Retain` keeps it.
    pub deletion_policy: String,
    /// The CSI driver that owns the snapshot.
    pub driver: String,
    /// The VolumeSnapshotClass used.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_snapshot_class_name: Option<String>,
    /// The volume to snapshot, or the existing snapshot's handle.
    pub source: VolumeSnapshotContentSource,
    /// The volume mode of the snapshotted volume (`Filesystem` or `Block`).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source_volume_mode: Option<String>,
}

/// The object reference a VolumeSnapshotContent holds to its VolumeSnapshot.
pub type VolumeSnapshotRef = ObjectReference;

/// The source of a VolumeSnapshotContent: exactly one field is set.
#[derive(Debug, Clone, PartialEq, Eq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentSource {
    /// Dynamic provisioning: the volume's CSI handle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_handle: Option<String>,
    /// Pre-provisioned: the snapshot's CSI handle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
}

/// The observed state of a VolumeSnapshotContent.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotContentStatus {
    /// The snapshot's CSI handle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub snapshot_handle: Option<String>,
    /// When the snapshot was cut, in nanoseconds since the Unix epoch.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub creation_time: Option<i64>,
    /// Whether the snapshot is ready.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub ready_to_use: Option<bool>,
    /// The size in bytes of a volume restored from it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub restore_size: Option<i64>,
    /// The last error.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub error: Option<VolumeSnapshotError>,
    /// The group snapshot's handle.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub volume_group_snapshot_handle: Option<String>,
}

/// Parameters for taking snapshots with one CSI driver (cluster-scoped). This CRD has no
/// `spec`: its fields sit at the top level.
#[derive(Debug, Clone, PartialEq, Default, Serialize, Deserialize)]
#[serde(rename_all = "camelCase")]
pub struct VolumeSnapshotClass {
    /// Always `snapshot.storage.k8s.io/v1`.
    pub api_version: String,
    /// Always `VolumeSnapshotClass`.
    pub kind: String,
    /// Standard object metadata.
    pub metadata: ObjectMeta,
    /// The CSI driver.
    pub driver: String,
    /// `Delete` or `Retain` for contents created with this class.
    pub deletion_policy: String,
    /// Driver-specific parameters.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub parameters: Option<BTreeMap<String, String>>,
}

impl VolumeSnapshotClass {
    /// A class named `name` for `driver` with the given deletion policy.
    #[must_use]
    pub fn new(name: &str, driver: &str, deletion_policy: &str) -> Self {
        Self {
            api_version: <Self as k8s_openapi::Resource>::API_VERSION.to_owned(),
            kind: <Self as k8s_openapi::Resource>::KIND.to_owned(),
            metadata: ObjectMeta { name: Some(name.to_owned()), ..ObjectMeta::default() },
            driver: driver.to_owned(),
            deletion_policy: deletion_policy.to_owned(),
            parameters: None,
        }
    }
}

impl k8s_openapi::Resource for VolumeSnapshotClass {
    const API_VERSION: &'static str = "snapshot.storage.k8s.io/v1";
    const GROUP: &'static str = "snapshot.storage.k8s.io";
    const KIND: &'static str = "VolumeSnapshotClass";
    const VERSION: &'static str = "v1";
    const URL_PATH_SEGMENT: &'static str = "volumesnapshotclasses";
    type Scope = k8s_openapi::ClusterResourceScope;
}

impl k8s_openapi::Metadata for VolumeSnapshotClass {
    type Ty = ObjectMeta;
    fn metadata(&self) -> &ObjectMeta {
        &self.metadata
    }
    fn metadata_mut(&mut self) -> &mut ObjectMeta {
        &mut self.metadata
    }
}
