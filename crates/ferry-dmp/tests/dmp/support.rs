//! A real API server with the objects Velero and a CSI cluster would hold, and a stand-in for the
//! snapshot controller (the test control plane runs none).

use std::time::Duration;

use ferry_api::{
    Backup, DataUpload, Restore, VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent,
    VolumeSnapshotContentSource, VolumeSnapshotContentSpec, VolumeSnapshotContentStatus,
    VolumeSnapshotStatus,
};
use ferry_dmp::PluginContext;
use ferry_testbed::{ControlPlane, VELERO_NAMESPACE};
use k8s_openapi::api::core::v1::{ObjectReference, PersistentVolume, PersistentVolumeClaim};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::{Value, json};
use tokio::task::JoinHandle;

/// One test's corner of the shared control plane: a workload namespace, and a CSI driver,
/// StorageClass and labelled VolumeSnapshotClass named after it.
pub struct Cluster {
    pub client: Client,
    pub ns: String,
    pub driver: String,
    pub storage_class: String,
    pub snapshot_class: String,
}

impl Cluster {
    pub async fn new(prefix: &str) -> Self {
        let cp = ControlPlane::shared();
        let client = cp.client().unwrap();
        let ns = cp.unique_namespace(prefix).await.unwrap();
        let driver = format!("{ns}.csi.ferry.io");
        let storage_class = format!("{ns}-fast");
        let snapshot_class = format!("{ns}-snap");
        let sc: StorageClass = serde_json::from_value(json!({
            "metadata": {"name": storage_class}, "provisioner": driver,
        }))
        .unwrap();
        create(&Api::all(client.clone()), &sc).await;
        // Two classes for the driver: only the labelled one may be chosen.
        let mut labelled = VolumeSnapshotClass::new(&snapshot_class, &driver, "Delete");
        labelled.metadata.labels =
            Some([("velero.io/csi-volumesnapshot-class".to_owned(), "true".to_owned())].into());
        let other = VolumeSnapshotClass::new(&format!("{ns}-other"), &driver, "Delete");
        let classes: Api<VolumeSnapshotClass> = Api::all(client.clone());
        create(&classes, &other).await;
        create(&classes, &labelled).await;
        Self { client, ns, driver, storage_class, snapshot_class }
    }

    /// A plugin context on a fresh client, polling snapshots quickly.
    pub fn ctx(&self) -> PluginContext {
        let client = ControlPlane::shared().client().unwrap();
        PluginContext::new(client).with_snapshot_poll_interval(Duration::from_millis(100))
    }

    /// A PVC named `name` in the test namespace bound (status written as the PV controller
    /// would) to a PV; `csi` makes the PV a CSI volume of the test's driver.
    pub async fn bound_pvc(&self, name: &str, csi: bool) -> PersistentVolumeClaim {
        let pv_name = format!("{}-{name}", self.ns);
        let source = if csi {
            json!({"csi": {"driver": self.driver, "volumeHandle": format!("vol-{pv_name}")}})
        } else {
            json!({"hostPath": {"path": "/tmp/x"}})
        };
        let mut pv_json = json!({
            "metadata": {"name": pv_name},
            "spec": {"capacity": {"storage": "1Gi"}, "accessModes": ["ReadWriteOnce"],
                     "storageClassName": self.storage_class,
                     "claimRef": {"namespace": self.ns, "name": name}},
        });
        pv_json["spec"].as_object_mut().unwrap().extend(source.as_object().unwrap().clone());
        let pv: PersistentVolume = serde_json::from_value(pv_json).unwrap();
        create(&Api::all(self.client.clone()), &pv).await;
        let pvc: PersistentVolumeClaim = serde_json::from_value(json!({
            "metadata": {"name": name, "namespace": self.ns, "labels": {"app": "db"}},
            "spec": {"accessModes": ["ReadWriteOnce"], "storageClassName": self.storage_class,
                     "volumeName": pv_name, "resources": {"requests": {"storage": "1Gi"}}},
        }))
        .unwrap();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &self.ns);
        let mut created = create(&api, &pvc).await;
        created.status = Some(serde_json::from_value(json!({"phase": "Bound"})).unwrap());
        api.replace_status(name, &PostParams::default(), &created).await.unwrap()
    }

    /// A Backup CR in Velero's namespace.
    pub async fn backup(&self, name: &str, spec: Value) -> Backup {
        let b: Backup = serde_json::from_value(json!({
            "apiVersion": "velero.io/v1", "kind": "Backup",
            "metadata": {"name": name, "namespace": VELERO_NAMESPACE}, "spec": spec,
        }))
        .unwrap();
        create(&Api::namespaced(self.client.clone(), VELERO_NAMESPACE), &b).await
    }

    /// A Restore CR in Velero's namespace.
    pub async fn restore(&self, name: &str, spec: Value) -> Restore {
        let r: Restore = serde_json::from_value(json!({
            "apiVersion": "velero.io/v1", "kind": "Restore",
            "metadata": {"name": name, "namespace": VELERO_NAMESPACE}, "spec": spec,
        }))
        .unwrap();
        create(&Api::namespaced(self.client.clone(), VELERO_NAMESPACE), &r).await
    }

    /// The VolumeSnapshots in the test namespace.
    pub async fn snapshots(&self) -> Vec<VolumeSnapshot> {
        let api: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), &self.ns);
        api.list(&ListParams::default()).await.unwrap().items
    }

    /// Plays the snapshot controller for the test namespace until dropped: binds every new
    /// VolumeSnapshot to a VolumeSnapshotContent of the test driver with a snapshot handle.
    pub fn snapshot_controller(&self) -> AbortOnDrop {
        let (client, ns, driver) = (self.client.clone(), self.ns.clone(), self.driver.clone());
        AbortOnDrop(tokio::spawn(async move {
            // Bounded: a test never runs this long.
            for _ in 0..3000 {
                bind_new_snapshots(&client, &ns, &driver).await;
                tokio::time::sleep(Duration::from_millis(50)).await;
            }
        }))
    }
}

/// Aborts the task when dropped, even when the test fails.
pub struct AbortOnDrop(JoinHandle<()>);

impl Drop for AbortOnDrop {
    fn drop(&mut self) {
        self.0.abort();
    }
}

async fn bind_new_snapshots(client: &Client, ns: &str, driver: &str) {
    let snapshots: Api<VolumeSnapshot> = Api::namespaced(client.clone(), ns);
    let contents: Api<VolumeSnapshotContent> = Api::all(client.clone());
    let Ok(list) = snapshots.list(&ListParams::default()).await else { return };
    for vs in list.items {
        if vs.status.as_ref().is_some_and(|s| s.bound_volume_snapshot_content_name.is_some()) {
            continue;
        }
        let name = format!("snapcontent-{}", vs.uid().unwrap());
        let mut content = VolumeSnapshotContent::new(
            &name,
            VolumeSnapshotContentSpec {
                volume_snapshot_ref: ObjectReference {
                    name: Some(vs.name_any()),
                    namespace: Some(ns.to_owned()),
                    uid: vs.uid(),
                    ..ObjectReference::default()
                },
                deletion_policy: "Delete".into(),
                driver: driver.to_owned(),
                volume_snapshot_class_name: vs.spec.volume_snapshot_class_name.clone(),
                source: VolumeSnapshotContentSource {
                    volume_handle: Some("vol".into()),
                    snapshot_handle: None,
                },
                source_volume_mode: None,
            },
        );
        let created = contents.create(&PostParams::default(), &content).await.unwrap();
        content = created;
        content.status = Some(VolumeSnapshotContentStatus {
            snapshot_handle: Some(format!("handle-{}", vs.name_any())),
            ready_to_use: Some(true),
            restore_size: Some(1 << 30),
            ..VolumeSnapshotContentStatus::default()
        });
        contents.replace_status(&name, &PostParams::default(), &content).await.unwrap();
        let mut bound = vs.clone();
        bound.status = Some(VolumeSnapshotStatus {
            bound_volume_snapshot_content_name: Some(name),
            ready_to_use: Some(true),
            ..VolumeSnapshotStatus::default()
        });
        snapshots.replace_status(&vs.name_any(), &PostParams::default(), &bound).await.unwrap();
    }
}

pub async fn create<K>(api: &Api<K>, obj: &K) -> K
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + serde::Serialize
        + serde::de::DeserializeOwned,
{
    ferry_kube::create(api, obj).await.unwrap()
}

/// The JSON of an object as Velero would send it to a plugin.
pub fn object<K: serde::Serialize>(obj: &K) -> ferry_plugin::JsonObject {
    ferry_plugin::JsonObject::from_value(serde_json::to_value(obj).unwrap()).unwrap()
}

/// The DataUploads in Velero's namespace carrying `operation_id`.
pub async fn uploads(client: &Client, operation_id: &str) -> Vec<DataUpload> {
    let api: Api<DataUpload> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let lp = ListParams::default().labels(&format!("velero.io/async-operation-id={operation_id}"));
    api.list(&lp).await.unwrap().items
}

/// A unique object name from the test namespace.
pub fn named(cluster: &Cluster, what: &str) -> String {
    format!("{}-{what}", cluster.ns)
}
