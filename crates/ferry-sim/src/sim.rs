//! The simulator handle: configuration, start, shutdown, paths.

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::Duration;

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::{CSI_PLUGIN_DIR, HOSTNAME_LABEL, SIM_NODE_LABEL, SimError, janitor, reconcile, setup};

/// How a StorageClass binds its PVCs.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Binding {
    /// Provision as soon as the PVC exists.
    Immediate,
    /// Provision once a pod using the PVC is scheduled (on that pod's node).
    WaitForFirstConsumer,
}

impl Binding {
    /// The `volumeBindingMode` value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Immediate => "Immediate",
            Self::WaitForFirstConsumer => "WaitForFirstConsumer",
        }
    }
}

/// A PVC's or PV's `volumeMode`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum VolumeMode {
    /// An ext4 file system, mounted into pods.
    Filesystem,
    /// A raw block device, mapped into pods.
    Block,
}

impl VolumeMode {
    /// The `volumeMode` value.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Filesystem => "Filesystem",
            Self::Block => "Block",
        }
    }

    /// Reads a `volumeMode` field (absent means `Filesystem`).
    #[must_use]
    pub fn from_field(field: Option<&str>) -> Self {
        if field == Some("Block") { Self::Block } else { Self::Filesystem }
    }
}

/// What to simulate.
#[derive(Debug, Clone)]
pub struct SimConfig {
    /// Node names. Empty: three nodes `<id>-node-a`, `-b`, `-c`. Names must not be used by
    /// another simulator on the same API server at the same time.
    pub nodes: Vec<String>,
    /// Where the simulator's folder is created (default: the temp dir, which is also where
    /// [`janitor::sweep_stale`] looks).
    pub parent_dir: PathBuf,
    /// Namespaces whose pods this simulator schedules even when they use none of its volumes
    /// or nodes (e.g. a test's own namespace, or Velero's for exposer pods without volumes).
    pub namespaces: Vec<String>,
    /// The simulator's id: prefix of its driver, class and default node names. Default: random.
    pub id: Option<String>,
    /// How often every controller re-checks everything even without a watch event.
    pub resync: Duration,
    /// Extra labels per node name, on the Node objects and seen by the scheduler (e.g. a
    /// zone or pool a test's node affinity selects). Every key must name a simulated node (so
    /// name the nodes in [`SimConfig::nodes`]); the labels cannot change
    /// `kubernetes.io/hostname` or `ferry.io/node-sim`, which the simulator relies on.
    pub node_labels: BTreeMap<String, BTreeMap<String, String>>,
}

impl Default for SimConfig {
    fn default() -> Self {
        Self {
            nodes: Vec::new(),
            parent_dir: std::env::temp_dir(),
            namespaces: Vec::new(),
            id: None,
            resync: Duration::from_millis(500),
            node_labels: BTreeMap::new(),
        }
    }
}

/// The names of the cluster objects of one simulator.
#[derive(Debug, Clone)]
pub(crate) struct Names {
    pub id: String,
    pub driver: String,
    pub immediate: String,
    pub wffc: String,
    pub snapshot_class: String,
}

/// One simulated node.
#[derive(Debug, Clone)]
pub(crate) struct SimNode {
    pub name: String,
    pub kubelet_root: PathBuf,
    /// The labels the test asked for, besides the built-in ones.
    pub extra_labels: BTreeMap<String, String>,
}

/// What the simulator's tasks share with its handle.
pub(crate) struct Ctx {
    pub client: kube::Client,
    pub names: Names,
    pub nodes: Vec<SimNode>,
    pub dir: PathBuf,
    pub namespaces: Vec<String>,
    pub resync: Duration,
}

impl std::fmt::Debug for Ctx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Ctx")
            .field("names", &self.names)
            .field("nodes", &self.nodes)
            .field("dir", &self.dir)
            .finish_non_exhaustive()
    }
}

impl Ctx {
    pub fn node(&self, name: &str) -> Option<&SimNode> {
        self.nodes.iter().find(|n| n.name == name)
    }
    pub fn volume_image(&self, pv: &str) -> PathBuf {
        self.dir.join("volumes").join(format!("{pv}.img"))
    }
    pub fn snapshot_image(&self, handle: &str) -> PathBuf {
        self.dir.join("snapshots").join(format!("{handle}.img"))
    }
}

/// A running simulator. Stop it with [`NodeSim::shutdown`]; dropping it stops the tasks and
/// removes every mount, loop device and image too, but leaves its API objects.
#[derive(Debug)]
pub struct NodeSim {
    pub(crate) ctx: Arc<Ctx>,
    cancel: CancellationToken,
    task: Option<JoinHandle<()>>,
}

impl NodeSim {
    /// Registers the nodes, driver and classes and starts the controllers. First cleans the
    /// folders of simulators whose process died.
    ///
    /// # Errors
    /// The folder cannot be made, the API server refuses an object, or a node name is invalid.
    pub async fn start(client: kube::Client, config: SimConfig) -> Result<Self, SimError> {
        for dir in janitor::sweep_stale(&std::env::temp_dir()) {
            tracing::info!(dir = %dir.display(), "cleaned a dead simulator's folder");
        }
        let id = config.id.clone().unwrap_or_else(|| format!("sim{}", random_hex(6)));
        let names = Names {
            driver: format!("{id}.csi.ferry.io"),
            immediate: format!("{id}-immediate"),
            wffc: format!("{id}-wffc"),
            snapshot_class: format!("{id}-snapshots"),
            id: id.clone(),
        };
        let node_names = if config.nodes.is_empty() {
            ["a", "b", "c"].iter().map(|s| format!("{id}-node-{s}")).collect()
        } else {
            config.nodes.clone()
        };
        check_node_labels(&config.node_labels, &node_names)?;
        let dir =
            config.parent_dir.join(format!("{}{}-{id}", janitor::DIR_PREFIX, std::process::id()));
        std::fs::create_dir_all(&dir).map_err(|e| SimError::io("creating", &dir, e))?;
        if let Err(e) = janitor::spawn_janitor(&dir) {
            tracing::warn!(error = %e, "no janitor for the simulator folder");
        }
        let mut nodes = Vec::new();
        for name in node_names {
            let kubelet_root = dir.join("nodes").join(&name).join("var/lib/kubelet");
            std::fs::create_dir_all(kubelet_root.join("pods"))
                .map_err(|e| SimError::io("creating", &kubelet_root, e))?;
            let extra_labels = config.node_labels.get(&name).cloned().unwrap_or_default();
            nodes.push(SimNode { name, kubelet_root, extra_labels });
        }
        let ctx = Arc::new(Ctx {
            client,
            names,
            nodes,
            dir,
            namespaces: config.namespaces,
            resync: config.resync,
        });
        let cancel = CancellationToken::new();
        let mut sim = Self { ctx: ctx.clone(), cancel: cancel.clone(), task: None };
        setup::register(&ctx).await?;
        sim.task = Some(tokio::spawn(reconcile::run(ctx, cancel)));
        Ok(sim)
    }

    /// Stops the controllers, removes every mount, loop device and image, and deletes the
    /// simulator's nodes, classes, driver and PVs from the API server.
    ///
    /// # Errors
    /// Deleting an API object failed (the host is cleaned regardless).
    pub async fn shutdown(mut self) -> Result<(), SimError> {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            let _ = tokio::time::timeout(Duration::from_secs(30), task).await;
        }
        let dir = self.ctx.dir.clone();
        tokio::task::spawn_blocking(move || janitor::cleanup_dir(&dir))
            .await
            .map_err(|source| SimError::Join { what: "cleanup".into(), source })?;
        setup::unregister(&self.ctx).await
    }

    /// The simulator's id (prefix of its object names).
    #[must_use]
    pub fn id(&self) -> &str {
        &self.ctx.names.id
    }

    /// The CSI driver name (`<id>.csi.ferry.io`).
    #[must_use]
    pub fn driver(&self) -> &str {
        &self.ctx.names.driver
    }

    /// The StorageClass with the given binding mode (reclaim policy `Delete`).
    #[must_use]
    pub fn storage_class(&self, binding: Binding) -> &str {
        match binding {
            Binding::Immediate => &self.ctx.names.immediate,
            Binding::WaitForFirstConsumer => &self.ctx.names.wffc,
        }
    }

    /// The VolumeSnapshotClass (`deletionPolicy: Delete`).
    #[must_use]
    pub fn snapshot_class(&self) -> &str {
        &self.ctx.names.snapshot_class
    }

    /// The simulated node names.
    #[must_use]
    pub fn nodes(&self) -> Vec<String> {
        self.ctx.nodes.iter().map(|n| n.name.clone()).collect()
    }

    /// The simulator's folder: everything it creates on the host is under it.
    #[must_use]
    pub fn dir(&self) -> &Path {
        &self.ctx.dir
    }

    /// A node's kubelet root (`<dir>/nodes/<node>/var/lib/kubelet`), the folder that stands for
    /// `/var/lib/kubelet` on that node.
    ///
    /// # Errors
    /// [`SimError::Invalid`] for a node this simulator does not run.
    pub fn kubelet_root(&self, node: &str) -> Result<PathBuf, SimError> {
        self.ctx.node(node).map(|n| n.kubelet_root.clone()).ok_or_else(|| SimError::Invalid {
            what: format!("node {node}"),
            reason: "not simulated here".into(),
        })
    }

    /// Where the kubelet of `node` exposes PV `pv` to pod `pod_uid`: the mount point
    /// (`Filesystem`) or the device symlink (`Block`).
    ///
    /// # Errors
    /// [`SimError::Invalid`] for a node this simulator does not run.
    pub fn pod_volume_path(
        &self,
        node: &str,
        pod_uid: &str,
        pv: &str,
        mode: VolumeMode,
    ) -> Result<PathBuf, SimError> {
        let pod = self.kubelet_root(node)?.join("pods").join(pod_uid);
        Ok(match mode {
            VolumeMode::Filesystem => {
                pod.join("volumes").join(CSI_PLUGIN_DIR).join(pv).join("mount")
            }
            VolumeMode::Block => pod.join("volumeDevices").join(CSI_PLUGIN_DIR).join(pv),
        })
    }

    /// The image file backing PV `pv` (exists while the volume does).
    #[must_use]
    pub fn volume_image(&self, pv: &str) -> PathBuf {
        self.ctx.volume_image(pv)
    }

    /// The image file holding the snapshot with CSI handle `handle`.
    #[must_use]
    pub fn snapshot_image(&self, handle: &str) -> PathBuf {
        self.ctx.snapshot_image(handle)
    }

    /// The loop devices and mounts of this simulator that exist right now.
    #[must_use]
    pub fn leftovers(&self) -> janitor::Leftovers {
        janitor::leftovers_under(&self.ctx.dir)
    }
}

impl Drop for NodeSim {
    fn drop(&mut self) {
        self.cancel.cancel();
        if let Some(task) = self.task.take() {
            task.abort();
        }
        janitor::cleanup_dir(&self.ctx.dir);
    }
}

/// Refuses extra node labels for nodes that are not simulated, or that would change the labels
/// the simulator relies on.
fn check_node_labels(
    labels: &BTreeMap<String, BTreeMap<String, String>>,
    nodes: &[String],
) -> Result<(), SimError> {
    for (node, pairs) in labels {
        if !nodes.contains(node) {
            return Err(SimError::Invalid {
                what: format!("labels of node {node}"),
                reason: format!("no such simulated node (nodes: {})", nodes.join(", ")),
            });
        }
        if let Some(key) =
            pairs.keys().find(|k| [HOSTNAME_LABEL, SIM_NODE_LABEL].contains(&k.as_str()))
        {
            return Err(SimError::Invalid {
                what: format!("labels of node {node}"),
                reason: format!("label {key} is set by the simulator"),
            });
        }
    }
    Ok(())
}

/// `n` random lowercase hex digits.
pub(crate) fn random_hex(n: usize) -> String {
    use std::hash::{BuildHasher, Hasher};
    let mut out = String::new();
    while out.len() < n {
        let mut h = std::collections::hash_map::RandomState::new().build_hasher();
        h.write_u128(
            std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map_or(0, |d| d.as_nanos()),
        );
        h.write_usize(out.len());
        out.push_str(&format!("{:016x}", h.finish()));
    }
    out.truncate(n);
    out
}
