//! The application's volume, in either world. On the real node an application pod writes the
//! data into its PVC (copying it, modes, owners and times kept, from a folder of the node) and
//! a volume is read where the CSI hostpath driver keeps it; on the simulator its own workload
//! helpers do both.

use std::time::Duration;

use anyhow::Context;
use ferry_api::k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use ferry_sim::{Binding, FsTree, VolumeMode};
use ferry_testbed::realnode;
use kube::api::{Api, PostParams};

use crate::world::World;

/// How long a volume gets to be bound, and an application pod to finish.
const READY: Duration = Duration::from_secs(300);

/// Creates the file-system PVC `ns/pvc` of `size` and waits until it is bound.
pub async fn create(world: &World, ns: &str, pvc: &str, size: &str) -> anyhow::Result<()> {
    if world.real().is_none() {
        let sim = world.sim()?;
        sim.create_pvc(ns, pvc, size, VolumeMode::Filesystem, Binding::Immediate).await?;
        sim.wait_pvc_bound(ns, pvc, READY).await?;
        return Ok(());
    }
    let claim: PersistentVolumeClaim = serde_json::from_value(serde_json::json!({
        "apiVersion": "v1", "kind": "PersistentVolumeClaim",
        "metadata": { "name": pvc, "namespace": ns },
        "spec": {
            "accessModes": ["ReadWriteOnce"],
            "storageClassName": realnode::STORAGE_CLASS,
            "resources": { "requests": { "storage": size } },
        },
    }))?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(world.client()?, ns);
    claims.create(&PostParams::default(), &claim).await?;
    let deadline = std::time::Instant::now() + READY;
    while volume_of(world, ns, pvc).await?.is_none() {
        anyhow::ensure!(
            std::time::Instant::now() < deadline,
            "PVC {ns}/{pvc} not bound in {READY:?}"
        );
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
    Ok(())
}

/// Writes `tree` into the PVC `ns/pvc`: on the real node an application pod copies it in.
pub async fn write(world: &World, ns: &str, pvc: &str, tree: &FsTree) -> anyhow::Result<()> {
    let Some(node) = world.real() else {
        return Ok(world.sim()?.write_files(ns, pvc, tree).await?);
    };
    let inside =
        std::path::PathBuf::from(format!("/var/lib/ferry-demo/{pvc}-{}", std::process::id()));
    let stage = node.node_path(&inside);
    std::fs::create_dir_all(&stage).with_context(|| format!("creating {}", stage.display()))?;
    let written = async {
        let tree = tree.clone();
        let at = stage.clone();
        tokio::task::spawn_blocking(move || tree.write_to(&at)).await??;
        let pod: Pod = serde_json::from_value(serde_json::json!({
            "apiVersion": "v1", "kind": "Pod",
            "metadata": { "generateName": "orders-app-", "namespace": ns },
            "spec": {
                "restartPolicy": "Never",
                "containers": [{
                    "name": "app",
                    "image": realnode::BUSYBOX_IMAGE,
                    "imagePullPolicy": "Never",
                    "command": ["sh", "-c", "cp -a /incoming/. /data/ && sync"],
                    "volumeMounts": [
                        { "name": "data", "mountPath": "/data" },
                        { "name": "incoming", "mountPath": "/incoming", "readOnly": true },
                    ],
                }],
                "volumes": [
                    { "name": "data", "persistentVolumeClaim": { "claimName": pvc } },
                    { "name": "incoming", "hostPath": { "path": inside, "type": "Directory" } },
                ],
            },
        }))?;
        ferry_testbed::workload::run_to_completion(&world.client()?, &pod, READY).await?;
        anyhow::Ok(())
    }
    .await;
    let removed = std::fs::remove_dir_all(&stage);
    written?;
    removed.with_context(|| format!("removing {}", stage.display()))
}

/// What the PVC `ns/pvc` holds: on the real node, read where the CSI driver keeps the volume.
pub async fn read(world: &World, ns: &str, pvc: &str) -> anyhow::Result<FsTree> {
    let Some(node) = world.real() else {
        return Ok(world.sim()?.read_files(ns, pvc).await?);
    };
    let handle =
        volume_of(world, ns, pvc).await?.with_context(|| format!("PVC {ns}/{pvc} is not bound"))?;
    let dir = node.hostpath_volume(&handle);
    tokio::task::spawn_blocking(move || FsTree::read_from(&dir))
        .await?
        .with_context(|| format!("reading volume {handle}"))
}

/// The CSI volume handle of the PV bound to `ns/pvc`, once it is bound.
async fn volume_of(world: &World, ns: &str, pvc: &str) -> anyhow::Result<Option<String>> {
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(world.client()?, ns);
    let claim = claims.get(pvc).await?;
    let bound = claim.status.as_ref().and_then(|s| s.phase.as_deref()) == Some("Bound");
    let Some(pv) = claim.spec.and_then(|s| s.volume_name).filter(|_| bound) else {
        return Ok(None);
    };
    let pv = Api::<PersistentVolume>::all(world.client()?).get(&pv).await?;
    Ok(pv.spec.and_then(|s| s.csi).map(|c| c.volume_handle))
}
