//! A node simulator for Ferry's tests: the cluster parts a bare kube-apiserver lacks, played
//! against the real API server with real storage.
//!
//! The proof that Ferry works on a node is the real one (`ferry_testbed::realnode`: real
//! kubelets, containerd and the CSI hostpath driver; `crates/ferry/tests/realnode/` on one
//! node, `crates/ferry/tests/nodes/` on three: the object lock across nodes, thirty uploads
//! spread over them, lost-node takeover). The simulator stays for what real nodes on one
//! machine cannot show cheaply: node labels and placement rules over many nodes (every real
//! node here reports the same host), an agent process SIGKILLed and restarted outside a pod
//! (`tests/e2e/recovery.rs`, whose second half, a node that never comes back, the real nodes
//! show too), and the single-node end-to-end scenarios, which run on the real node as well.
//! The thirty uploads over three nodes run on the real nodes only.
//!
//! [`NodeSim::start`] registers simulated [`Node`](k8s_openapi::api::core::v1::Node)s (with the
//! labels a test adds in [`SimConfig::node_labels`]), a CSI driver with two StorageClasses
//! (Immediate and WaitForFirstConsumer binding) and a VolumeSnapshotClass, then runs, in tokio
//! tasks owned by the handle:
//!
//! - a **provisioner** (external-provisioner + CSI controller): PVCs of its classes get a PV
//!   backed by a loop device over a sparse image, ext4 for `Filesystem`, raw for `Block`;
//!   a `dataSource` VolumeSnapshot (or PVC) makes the image a sparse copy of that snapshot's;
//! - a **PV controller**: binds PVCs and PVs both ways, honours pre-bound `claimRef`s,
//!   `spec.volumeName` and selectors, releases PVs whose claim is gone and reclaims them
//!   (`Delete` removes PV, loop device and image; `Retain` keeps them);
//! - a **snapshot controller** (snapshot-controller + csi-snapshotter): dynamic VolumeSnapshots
//!   copy the PVC's image into a new VolumeSnapshotContent; pre-provisioned contents
//!   (`source.snapshotHandle`) become ready and bind their VolumeSnapshot; deleting a content
//!   with `deletionPolicy: Delete` removes the snapshot image;
//! - a **scheduler**: binds Pending pods through `pods/binding`, honouring `nodeName`,
//!   `nodeSelector`, required node affinity, the PVs' node affinity and WaitForFirstConsumer
//!   (`volume.kubernetes.io/selected-node`), spreading by pod count; pods that cannot be placed
//!   stay Pending with `PodScheduled=False`, reason `Unschedulable` and a message (for an
//!   unbound Immediate claim kube-scheduler's own words, whatever the provisioner's trouble;
//!   the provisioner tells that in a `ProvisioningFailed` Warning Event on the claim);
//! - a **kubelet** per node: a pod's CSI volumes appear under the node's kubelet root at the
//!   kubelet's own relative paths (`pods/<uid>/volumes/kubernetes.io~csi/<pv>/mount`, a real
//!   ext4 mount; `pods/<uid>/volumeDevices/kubernetes.io~csi/<pv>`, a symlink to the publish
//!   file `plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<uid>` on which the loop device
//!   is bind-mounted), then the pod runs (`Running`, `Ready`); a deleted pod is unmounted,
//!   its folder removed, and the pod deleted with grace period 0.
//!
//! Everything the simulator creates on the host lives under one folder,
//! `<tmp>/ferry-sim-<pid>-<id>/`; [`NodeSim::shutdown`] (or `Drop`) unmounts, detaches and
//! removes all of it, a detached janitor does the same if the test process is killed, and
//! [`janitor::sweep_stale`] (run by every start) cleans folders of dead processes.
//! [`janitor::leftovers_all`] lists what remains, for leak checks.
//!
//! Several simulators can share one API server: each has its own driver, classes and node
//! names (derived from a random id) and only touches objects of its driver, pods that use its
//! volumes or nodes, and pods in the namespaces its [`SimConfig`] names.
//!
//! The workload helpers ([`NodeSim::create_pvc`], [`NodeSim::write_files`],
//! [`NodeSim::read_files`], [`NodeSim::write_block`], [`NodeSim::read_block`],
//! [`NodeSim::snapshot_pvc`] and the `wait_*` functions) create and check volumes the way a
//! user's workload and Velero's CSI plugin would.

mod error;
mod fstree;
mod host;
pub mod janitor;
pub mod quantity;
mod reconcile;
mod select;
mod setup;
mod sim;
pub mod velero;
mod wait;
mod workload;

pub use error::SimError;
pub use fstree::{FsEntry, FsKind, FsTree};
pub use sim::{Binding, NodeSim, SimConfig, VolumeMode};
pub use wait::{wait_for, wait_gone};
pub use workload::{HELPER_TIMEOUT, pod_object, pvc_object};

/// The annotation the scheduler puts on a WaitForFirstConsumer PVC to ask for provisioning.
pub const SELECTED_NODE_ANNOTATION: &str = "volume.kubernetes.io/selected-node";
/// The node label the simulator's PVs' node affinity uses.
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The label every simulated node carries, with the simulator's id as value.
pub const SIM_NODE_LABEL: &str = "ferry.io/node-sim";
/// The CSI plugin's folder name in the kubelet's pod folders.
pub const CSI_PLUGIN_DIR: &str = "kubernetes.io~csi";
