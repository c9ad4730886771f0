//! The controllers. One task runs them all, in passes: each pass lists what it needs (fresh,
//! consistent reads) and lets every controller act on that view, in dependency order
//! (snapshots, volumes, scheduler, kubelets). A pass runs on every watch event (debounced) and
//! at least every `resync`. Every action is idempotent (deterministic names, "write only what
//! differs"), so a pass that finds nothing to do writes nothing and the loop settles.

mod kubelet;
mod provision;
mod scheduler;
mod snapshots;
mod volumes;

pub(crate) use scheduler::node_labels;

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use ferry_api::{VolumeSnapshot, VolumeSnapshotClass, VolumeSnapshotContent};
use futures::{Stream, StreamExt};
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use k8s_openapi::api::storage::v1::StorageClass;
use kube::api::{Api, ListParams, ObjectMeta};
use kube::runtime::{WatchStreamExt, watcher};
use serde::de::DeserializeOwned;
use tokio::sync::Notify;
use tokio_util::sync::CancellationToken;

use crate::SimError;
use crate::sim::{Ctx, VolumeMode};

const DEBOUNCE: Duration = Duration::from_millis(25);

/// A volume the simulator provisioned and still holds on the host.
#[derive(Debug, Clone)]
pub(crate) struct Volume {
    pub image: PathBuf,
    pub device: PathBuf,
    pub mode: VolumeMode,
}

/// What a kubelet set up for one pod.
#[derive(Debug, Clone, Default)]
pub(crate) struct PodSetup {
    pub node: String,
    /// Mount points, in the order they were made.
    pub mounts: Vec<PathBuf>,
    /// The PVs the pod uses.
    pub pvs: Vec<String>,
    /// Whether every volume is in place.
    pub complete: bool,
}

/// The controllers' memory between passes (owned by the loop task).
#[derive(Debug, Default)]
pub(crate) struct State {
    pub volumes: HashMap<String, Volume>,
    pub pods: HashMap<String, PodSetup>,
    /// Provisioning failures by PVC uid, for the scheduler's messages.
    pub provision_errors: HashMap<String, String>,
    /// Snapshot contents seen: name → (snapshot handle, deletion policy).
    pub contents: HashMap<String, (String, String)>,
}

impl State {
    pub fn pv_in_use(&self, pv: &str) -> bool {
        self.pods.values().any(|p| p.pvs.iter().any(|v| v == pv))
    }
}

/// One consistent view of the cluster.
#[derive(Debug)]
pub(crate) struct World {
    pub pods: Vec<Pod>,
    pub pvcs: Vec<PersistentVolumeClaim>,
    pub pvs: Vec<PersistentVolume>,
    pub snapshots: Vec<VolumeSnapshot>,
    pub contents: Vec<VolumeSnapshotContent>,
    pub classes: Vec<StorageClass>,
    pub snapshot_classes: Vec<VolumeSnapshotClass>,
}

impl World {
    async fn load(ctx: &Ctx) -> Result<Self, SimError> {
        let c = &ctx.client;
        Ok(Self {
            pods: list(c, "Pod").await?,
            pvcs: list(c, "PersistentVolumeClaim").await?,
            pvs: list(c, "PersistentVolume").await?,
            snapshots: list(c, "VolumeSnapshot").await?,
            contents: list(c, "VolumeSnapshotContent").await?,
            classes: list(c, "StorageClass").await?,
            snapshot_classes: list(c, "VolumeSnapshotClass").await?,
        })
    }

    pub fn pvc(&self, namespace: &str, name: &str) -> Option<&PersistentVolumeClaim> {
        self.pvcs.iter().find(|p| {
            p.metadata.namespace.as_deref() == Some(namespace)
                && p.metadata.name.as_deref() == Some(name)
        })
    }

    pub fn pv(&self, name: &str) -> Option<&PersistentVolume> {
        self.pvs.iter().find(|p| p.metadata.name.as_deref() == Some(name))
    }

    pub fn class(&self, name: &str) -> Option<&StorageClass> {
        self.classes.iter().find(|c| c.metadata.name.as_deref() == Some(name))
    }

    pub fn snapshot(&self, namespace: &str, name: &str) -> Option<&VolumeSnapshot> {
        self.snapshots.iter().find(|s| {
            s.metadata.namespace.as_deref() == Some(namespace)
                && s.metadata.name.as_deref() == Some(name)
        })
    }

    pub fn content(&self, name: &str) -> Option<&VolumeSnapshotContent> {
        self.contents.iter().find(|c| c.metadata.name.as_deref() == Some(name))
    }

    /// The class of a PVC if it is one of `driver`'s.
    pub fn our_class(&self, ctx: &Ctx, pvc: &PersistentVolumeClaim) -> Option<&StorageClass> {
        let name = pvc.spec.as_ref()?.storage_class_name.as_deref()?;
        self.class(name).filter(|c| c.provisioner == ctx.names.driver)
    }

    /// Whether a PVC is this simulator's business: its class, or bound to (or claimed by) one
    /// of its PVs.
    pub fn pvc_is_ours(&self, ctx: &Ctx, pvc: &PersistentVolumeClaim) -> bool {
        if self.our_class(ctx, pvc).is_some() {
            return true;
        }
        let volume = pvc.spec.as_ref().and_then(|s| s.volume_name.as_deref()).unwrap_or_default();
        if !volume.is_empty() && self.pv(volume).is_some_and(|pv| is_ours(ctx, pv)) {
            return true;
        }
        self.pvs.iter().filter(|pv| is_ours(ctx, pv)).any(|pv| {
            pv.spec.as_ref().and_then(|s| s.claim_ref.as_ref()).is_some_and(|r| {
                r.namespace == pvc.metadata.namespace && r.name == pvc.metadata.name
            })
        })
    }
}

async fn list<K>(client: &kube::Client, kind: &'static str) -> Result<Vec<K>, SimError>
where
    K: kube::Resource<DynamicType = ()> + Clone + std::fmt::Debug + DeserializeOwned,
{
    Api::<K>::all(client.clone())
        .list(&ListParams::default())
        .await
        .map(|l| l.items)
        .map_err(|e| SimError::api("listing", kind, "*", e))
}

/// The CSI driver of a PV, if it is a CSI PV.
pub(crate) fn pv_driver(pv: &PersistentVolume) -> Option<&String> {
    pv.spec.as_ref()?.csi.as_ref().map(|c| &c.driver)
}

pub(crate) fn is_ours(ctx: &Ctx, pv: &PersistentVolume) -> bool {
    pv_driver(pv) == Some(&ctx.names.driver)
}

pub(crate) fn name(meta: &ObjectMeta) -> &str {
    meta.name.as_deref().unwrap_or_default()
}

pub(crate) fn namespace(meta: &ObjectMeta) -> &str {
    meta.namespace.as_deref().unwrap_or_default()
}

pub(crate) fn uid(meta: &ObjectMeta) -> &str {
    meta.uid.as_deref().unwrap_or_default()
}

pub(crate) fn now() -> String {
    k8s_openapi::jiff::Timestamp::now().to_string()
}

/// Runs passes until `cancel` fires.
pub(crate) async fn run(ctx: Arc<Ctx>, cancel: CancellationToken) {
    let notify = Arc::new(Notify::new());
    let watches = tokio::spawn(watch_all(ctx.client.clone(), notify.clone(), cancel.clone()));
    let mut state = State::default();
    loop {
        tokio::select! {
            () = cancel.cancelled() => break,
            () = notify.notified() => tokio::time::sleep(DEBOUNCE).await,
            () = tokio::time::sleep(ctx.resync) => {}
        }
        if cancel.is_cancelled() {
            break;
        }
        if let Err(e) = pass(&ctx, &mut state).await {
            tracing::warn!(error = %e, "simulator pass failed; retrying");
        }
    }
    watches.abort();
}

async fn pass(ctx: &Ctx, state: &mut State) -> Result<(), SimError> {
    let world = World::load(ctx).await?;
    snapshots::reconcile(ctx, state, &world).await;
    volumes::reconcile(ctx, state, &world).await;
    scheduler::reconcile(ctx, state, &world).await;
    kubelet::reconcile(ctx, state, &world).await;
    Ok(())
}

/// Watches every kind the controllers read and pokes `notify` on each change. The watchers
/// retry with kube-runtime's default backoff.
async fn watch_all(client: kube::Client, notify: Arc<Notify>, cancel: CancellationToken) {
    let streams = vec![
        events::<Pod>(&client),
        events::<PersistentVolumeClaim>(&client),
        events::<PersistentVolume>(&client),
        events::<VolumeSnapshot>(&client),
        events::<VolumeSnapshotContent>(&client),
    ];
    let mut all = futures::stream::select_all(streams);
    loop {
        tokio::select! {
            () = cancel.cancelled() => return,
            next = all.next() => match next {
                Some(()) => notify.notify_one(),
                None => return,
            },
        }
    }
}

fn events<K>(client: &kube::Client) -> std::pin::Pin<Box<dyn Stream<Item = ()> + Send>>
where
    K: kube::Resource<DynamicType = ()>
        + Clone
        + std::fmt::Debug
        + DeserializeOwned
        + Send
        + 'static,
{
    let api = Api::<K>::all(client.clone());
    Box::pin(watcher(api, watcher::Config::default()).default_backoff().map(|_| ()))
}
