//! Workload helpers: volumes with real data in them, read back through a pod's mount, and
//! snapshots taken the way Velero's CSI plugin takes them.

use std::io::{Read, Seek, SeekFrom, Write};
use std::path::PathBuf;
use std::time::Duration;

use ferry_api::VolumeSnapshot;
use k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, DeleteParams, PostParams};
use serde_json::json;

use crate::sim::random_hex;
use crate::{Binding, FsTree, NodeSim, SimError, VolumeMode, setup, wait_for, wait_gone};

/// How long helpers wait for a pod to run or go, a PVC to bind, a snapshot to be ready.
pub const HELPER_TIMEOUT: Duration = Duration::from_secs(60);

/// A PVC of `class` asking for `size` (e.g. `64Mi`), `ReadWriteOnce`.
///
/// # Errors
/// Never in practice; the object is built from JSON.
pub fn pvc_object(
    name: &str,
    size: &str,
    mode: VolumeMode,
    class: &str,
) -> Result<PersistentVolumeClaim, SimError> {
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "accessModes": ["ReadWriteOnce"], "volumeMode": mode.as_str(),
                  "storageClassName": class, "resources": { "requests": { "storage": size } } }
    }))
    .map_err(|e| SimError::Invalid { what: format!("PVC {name}"), reason: e.to_string() })
}

/// A pod that mounts (`Filesystem`) or maps (`Block`) claim `pvc` as volume `data`.
///
/// # Errors
/// Never in practice; the object is built from JSON.
pub fn pod_object(name: &str, pvc: &str, mode: VolumeMode) -> Result<Pod, SimError> {
    let mut container =
        json!({ "name": "main", "image": "ferry-sim/idle", "command": ["sleep", "infinity"] });
    match mode {
        VolumeMode::Filesystem => {
            container["volumeMounts"] = json!([{ "name": "data", "mountPath": "/data" }])
        }
        VolumeMode::Block => {
            container["volumeDevices"] = json!([{ "name": "data", "devicePath": "/dev/data" }])
        }
    }
    serde_json::from_value(json!({
        "metadata": { "name": name },
        "spec": { "containers": [container],
                  "volumes": [ { "name": "data", "persistentVolumeClaim": { "claimName": pvc } } ] }
    }))
    .map_err(|e| SimError::Invalid { what: format!("pod {name}"), reason: e.to_string() })
}

impl NodeSim {
    /// Creates a StorageClass of this simulator's driver (e.g. with reclaim policy `Retain`).
    ///
    /// # Errors
    /// The API server refused.
    pub async fn create_storage_class(
        &self,
        name: &str,
        binding: Binding,
        reclaim_policy: &str,
    ) -> Result<(), SimError> {
        let class = setup::storage_class(name, &self.ctx.names.driver, binding, reclaim_policy)?;
        setup::create_or_keep(
            &Api::<StorageClass>::all(self.ctx.client.clone()),
            &class,
            "StorageClass",
        )
        .await
    }

    /// Creates an empty PVC of this simulator's class for `binding`.
    ///
    /// # Errors
    /// The API server refused.
    pub async fn create_pvc(
        &self,
        namespace: &str,
        name: &str,
        size: &str,
        mode: VolumeMode,
        binding: Binding,
    ) -> Result<PersistentVolumeClaim, SimError> {
        let pvc = pvc_object(name, size, mode, self.storage_class(binding))?;
        self.create(namespace, &pvc).await
    }

    /// Creates a PVC whose data source is VolumeSnapshot `snapshot` (same namespace).
    ///
    /// # Errors
    /// The API server refused.
    pub async fn create_pvc_from_snapshot(
        &self,
        namespace: &str,
        name: &str,
        snapshot: &str,
        size: &str,
        mode: VolumeMode,
        binding: Binding,
    ) -> Result<PersistentVolumeClaim, SimError> {
        let mut pvc = pvc_object(name, size, mode, self.storage_class(binding))?;
        if let Some(spec) = pvc.spec.as_mut() {
            spec.data_source = Some(k8s_openapi::api::core::v1::TypedLocalObjectReference {
                api_group: Some("snapshot.storage.k8s.io".into()),
                kind: "VolumeSnapshot".into(),
                name: snapshot.into(),
            });
        }
        self.create(namespace, &pvc).await
    }

    async fn create(
        &self,
        namespace: &str,
        pvc: &PersistentVolumeClaim,
    ) -> Result<PersistentVolumeClaim, SimError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), namespace);
        let name = pvc.metadata.name.clone().unwrap_or_default();
        api.create(&PostParams::default(), pvc).await.map_err(|e| {
            SimError::api("creating", "PersistentVolumeClaim", format!("{namespace}/{name}"), e)
        })
    }

    /// Waits until the PVC is `Bound`.
    ///
    /// # Errors
    /// [`SimError::Timeout`].
    pub async fn wait_pvc_bound(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<PersistentVolumeClaim, SimError> {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), namespace);
        wait_for(&api, name, timeout, |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound")
        })
        .await
    }

    /// Waits until the pod is `Running`.
    ///
    /// # Errors
    /// [`SimError::Timeout`].
    pub async fn wait_pod_running(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<Pod, SimError> {
        let api: Api<Pod> = Api::namespaced(self.ctx.client.clone(), namespace);
        wait_for(&api, name, timeout, |p| {
            p.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Running")
        })
        .await
    }

    /// Waits until the VolumeSnapshot is `readyToUse`.
    ///
    /// # Errors
    /// [`SimError::Timeout`].
    pub async fn wait_snapshot_ready(
        &self,
        namespace: &str,
        name: &str,
        timeout: Duration,
    ) -> Result<VolumeSnapshot, SimError> {
        let api: Api<VolumeSnapshot> = Api::namespaced(self.ctx.client.clone(), namespace);
        wait_for(&api, name, timeout, |s| {
            s.status.as_ref().and_then(|s| s.ready_to_use) == Some(true)
        })
        .await
    }

    /// Takes a VolumeSnapshot of `pvc` as Velero's CSI plugin does: in the PVC's namespace,
    /// with this simulator's VolumeSnapshotClass. Does not wait for readiness.
    ///
    /// # Errors
    /// The API server refused.
    pub async fn snapshot_pvc(
        &self,
        namespace: &str,
        pvc: &str,
        name: &str,
    ) -> Result<VolumeSnapshot, SimError> {
        let vs: VolumeSnapshot = serde_json::from_value(json!({
            "apiVersion": "snapshot.storage.k8s.io/v1", "kind": "VolumeSnapshot",
            "metadata": { "name": name, "namespace": namespace },
            "spec": { "source": { "persistentVolumeClaimName": pvc },
                      "volumeSnapshotClassName": self.snapshot_class() }
        }))
        .map_err(|e| SimError::Invalid {
            what: format!("snapshot {name}"),
            reason: e.to_string(),
        })?;
        let api: Api<VolumeSnapshot> = Api::namespaced(self.ctx.client.clone(), namespace);
        api.create(&PostParams::default(), &vs).await.map_err(|e| {
            SimError::api("creating", "VolumeSnapshot", format!("{namespace}/{name}"), e)
        })
    }

    /// Where the running pod `pod` sees claim `pvc` on its node's kubelet root.
    ///
    /// # Errors
    /// The pod is not on a simulated node, or the claim is not bound.
    pub async fn pod_claim_path(&self, pod: &Pod, pvc: &str) -> Result<PathBuf, SimError> {
        let ns = pod.metadata.namespace.clone().unwrap_or_default();
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.ctx.client.clone(), &ns);
        let claim = api.get(pvc).await.map_err(|e| {
            SimError::api("reading", "PersistentVolumeClaim", format!("{ns}/{pvc}"), e)
        })?;
        let spec = claim.spec.unwrap_or_default();
        let pv = spec.volume_name.filter(|v| !v.is_empty()).ok_or_else(|| SimError::Invalid {
            what: format!("claim {ns}/{pvc}"),
            reason: "not bound".into(),
        })?;
        let node = pod.spec.as_ref().and_then(|s| s.node_name.clone()).unwrap_or_default();
        let uid = pod.metadata.uid.clone().unwrap_or_default();
        self.pod_volume_path(&node, &uid, &pv, VolumeMode::from_field(spec.volume_mode.as_deref()))
    }

    /// Writes `tree` into the file-system claim `pvc`, through a pod that mounts it.
    ///
    /// # Errors
    /// The pod did not run, or writing failed.
    pub async fn write_files(
        &self,
        namespace: &str,
        pvc: &str,
        tree: &FsTree,
    ) -> Result<(), SimError> {
        let tree = tree.clone();
        self.with_claim(namespace, pvc, VolumeMode::Filesystem, move |path| tree.write_to(&path))
            .await
    }

    /// Reads the file tree of claim `pvc` through a pod that mounts it.
    ///
    /// # Errors
    /// The pod did not run, or reading failed.
    pub async fn read_files(&self, namespace: &str, pvc: &str) -> Result<FsTree, SimError> {
        self.with_claim(namespace, pvc, VolumeMode::Filesystem, |path| FsTree::read_from(&path))
            .await
    }

    /// Writes `data` at `offset` of the block claim `pvc`, through a pod that maps it.
    ///
    /// # Errors
    /// The pod did not run, or writing failed.
    pub async fn write_block(
        &self,
        namespace: &str,
        pvc: &str,
        offset: u64,
        data: &[u8],
    ) -> Result<(), SimError> {
        let data = data.to_vec();
        self.with_claim(namespace, pvc, VolumeMode::Block, move |path| {
            let mut dev = std::fs::OpenOptions::new().write(true).open(&path)?;
            dev.seek(SeekFrom::Start(offset))?;
            dev.write_all(&data)?;
            dev.sync_all()
        })
        .await
    }

    /// Reads `len` bytes at `offset` of the block claim `pvc`, through a pod that maps it.
    ///
    /// # Errors
    /// The pod did not run, or reading failed.
    pub async fn read_block(
        &self,
        namespace: &str,
        pvc: &str,
        offset: u64,
        len: usize,
    ) -> Result<Vec<u8>, SimError> {
        self.with_claim(namespace, pvc, VolumeMode::Block, move |path| {
            let mut dev = std::fs::File::open(&path)?;
            dev.seek(SeekFrom::Start(offset))?;
            let mut buf = vec![0; len];
            dev.read_exact(&mut buf)?;
            Ok(buf)
        })
        .await
    }

    /// Runs `work` on the host path where a short-lived pod sees `pvc`, then deletes the pod
    /// (even when `work` fails) and waits until it is gone.
    async fn with_claim<T, F>(
        &self,
        namespace: &str,
        pvc: &str,
        mode: VolumeMode,
        work: F,
    ) -> Result<T, SimError>
    where
        T: Send + 'static,
        F: FnOnce(PathBuf) -> std::io::Result<T> + Send + 'static,
    {
        let pods: Api<Pod> = Api::namespaced(self.ctx.client.clone(), namespace);
        let pod_name = format!("ferry-sim-io-{}", random_hex(8));
        let pod = pod_object(&pod_name, pvc, mode)?;
        pods.create(&PostParams::default(), &pod)
            .await
            .map_err(|e| SimError::api("creating", "Pod", format!("{namespace}/{pod_name}"), e))?;
        let result = async {
            let pod = self.wait_pod_running(namespace, &pod_name, HELPER_TIMEOUT).await?;
            let path = self.pod_claim_path(&pod, pvc).await?;
            let shown = path.clone();
            tokio::task::spawn_blocking(move || work(path))
                .await
                .map_err(|source| SimError::Join { what: format!("I/O on {pvc}"), source })?
                .map_err(|e| SimError::io("accessing the volume at", shown, e))
        }
        .await;
        let deleted = match pods.delete(&pod_name, &DeleteParams::default()).await {
            Ok(_) => wait_gone(&pods, &pod_name, HELPER_TIMEOUT).await,
            Err(e) => Err(SimError::api("deleting", "Pod", format!("{namespace}/{pod_name}"), e)),
        };
        let value = result?;
        deleted.map(|()| value)
    }
}
