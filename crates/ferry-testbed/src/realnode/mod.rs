//! A real Kubernetes cluster on one machine: the test bed's control plane, a real kubelet with
//! containerd and runc, the CSI hostpath driver with its sidecars, and the controllers a
//! cluster needs (kube-controller-manager, kube-scheduler, snapshot-controller).
//!
//! A cluster has one node or several ([`RealCluster::start_nodes`]). Each node runs in
//! namespaces of its own ([`crate::netns::NodeNamespaces`]): the kubelet root is
//! `/var/lib/kubelet` as on any node, but inside a private mount namespace where `/var/lib`,
//! `/var/log` and `/run` are the test bed's folders, so nothing the node writes or mounts
//! reaches the host's; its addresses (the node's [`NODE_IP`], the `kubernetes` Service
//! [`crate::control_plane::SERVICE_IP`], the pod network) exist only in its network namespace. The API server and S3
//! stay on the host's loopback and are relayed in ([`Forwarder`]). The kernel settings the
//! kubelet writes are shadowed inside the mount namespace, so the host's never change.
//!
//! What outlives the namespaces (loop devices the CSI driver attached, the kubelet's cgroups) is
//! removed by [`RealCluster`]'s drop, and by a janitor when the test binary is killed.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::Api;

use crate::control_plane::{ControlPlane, Options};
use crate::netns::Forwarder;
use crate::paths;
use crate::process::{self, Guarded};

mod node;
pub mod snapshot_metadata;

pub use node::{KubeNode, KubeletVolume, kubelet_root_of, kubelet_volumes};

/// The node's address inside its network namespace (the kubelet listens there).
pub const NODE_IP: &str = "10.1.0.1";
/// The CSI driver's name.
pub const DRIVER: &str = "hostpath.csi.k8s.io";
/// A StorageClass of the hostpath driver (immediate binding), also the default class.
pub const STORAGE_CLASS: &str = "ferry-hostpath";
/// A VolumeSnapshotClass of the hostpath driver (deletion policy Delete), labelled for Velero.
pub const SNAPSHOT_CLASS: &str = "ferry-hostpath";
/// The kubelet's root directory on the node, as on any node.
pub const KUBELET_ROOT: &str = "/var/lib/kubelet";
/// The first node's name; node `i` is `ferry-node-<i>` ([`node_name`]).
pub const NODE_NAME: &str = "ferry-node-0";
/// A StorageClass of the hostpath driver that binds when a pod is scheduled
/// (`WaitForFirstConsumer`): a pod's node chooses where its volume lives.
pub const WAIT_STORAGE_CLASS: &str = "ferry-hostpath-wffc";
/// The label every node carries with its name (the scheduler places by it).
pub const HOSTNAME_LABEL: &str = "kubernetes.io/hostname";
/// The busybox image every test pod can use (imported into the node, never pulled).
pub const BUSYBOX_IMAGE: &str = "ferry.local/busybox:1";

const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Kernel settings the kubelet writes at start; inside the node's mount namespace each
/// `/proc/sys` file is covered by a file already holding the value, so it writes nothing.
pub(crate) const SHADOWED_SYSCTLS: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// A running cluster of one or more nodes. Dropping it stops every process, detaches the
/// nodes' loop devices, removes their cgroups and their files.
#[derive(Debug)]
pub struct RealCluster {
    // Field order is drop order: the controllers, then the nodes, then the API server.
    controllers: Vec<Guarded>,
    nodes: Vec<KubeNode>,
    cp: ControlPlane,
    dir: tempfile::TempDir,
    bin: PathBuf,
}

impl RealCluster {
    /// Starts the control plane, one node and the controllers, and waits until the node is
    /// Ready with the CSI driver registered (about 20-40 s with cached binaries).
    ///
    /// # Errors
    /// A binary is missing and cannot be built, a component exits or the node is not Ready in
    /// time; the error names the step and carries the logs' tails.
    pub async fn start() -> anyhow::Result<Self> {
        Self::start_nodes(1).await
    }

    /// Starts the control plane, `count` nodes (`ferry-node-0` …) and the controllers, and
    /// waits until every node is Ready with the CSI driver registered. With several nodes each
    /// node provisions and snapshots its own volumes (the provisioner and snapshotter run per
    /// node with `--node-deployment`, the snapshot-controller with distributed snapshotting),
    /// as the hostpath driver's volumes live on one node's disk.
    ///
    /// # Errors
    /// As [`Self::start`].
    pub async fn start_nodes(count: usize) -> anyhow::Result<Self> {
        if count == 0 {
            bail!("a cluster needs at least one node");
        }
        node::enough_disk(&std::env::temp_dir(), count)?;
        let bin = paths::realnode_bin()?;
        let cp = ControlPlane::start_with(Options { for_nodes: true }).await?;
        process::remove_on_exit(cp.dir())?;
        let dir = tempfile::Builder::new().prefix("ferry-realnode-cluster-").tempdir()?;
        process::remove_on_exit(dir.path())?;
        let mut cluster = Self { controllers: Vec::new(), nodes: Vec::new(), cp, dir, bin };
        cluster.boot(count).await.map_err(|e| anyhow::anyhow!("{e:#}\n{}", cluster.log_tail()))?;
        Ok(cluster)
    }

    /// The cluster shared by every test in this test binary, started on first use. Its
    /// processes die with the binary and a janitor removes what they leave.
    ///
    /// # Panics
    /// If the cluster cannot start; the message says why.
    #[must_use]
    pub fn shared() -> &'static RealCluster {
        static SHARED: OnceLock<Result<RealCluster, String>> = OnceLock::new();
        let started = SHARED.get_or_init(|| process::run_on_own_thread(Self::start));
        match started {
            Ok(c) => c,
            Err(e) => panic!("real cluster unavailable: {e}"),
        }
    }

    async fn boot(&mut self, count: usize) -> anyhow::Result<()> {
        let tls = snapshot_metadata::Tls::generate(self.dir.path())?;
        for i in 0..count {
            let mut node = KubeNode::boot(&self.cp, &self.bin, &node_name(i)).await?;
            node.start_snapshot_metadata(&tls)?;
            self.nodes.push(node);
        }
        self.start_controllers(count > 1)?;
        self.install_cluster_objects(&tls).await?;
        for node in &mut self.nodes {
            node.start_kubelet()?;
        }
        self.wait_nodes_ready().await
    }

    fn spawn(&mut self, name: &str, program: &str, args: &[String]) -> anyhow::Result<()> {
        let cmd =
            node::logged_command(&self.bin, &self.dir.path().join("logs"), name, program, args)?;
        self.controllers.push(process::spawn(name, cmd)?);
        Ok(())
    }

    /// Controllers and (for one node) the CSI sidecars: host processes talking to the API
    /// server on loopback and to a driver through its socket.
    fn start_controllers(&mut self, several_nodes: bool) -> anyhow::Result<()> {
        let kubeconfig = self.cp.kubeconfig().display().to_string();
        let kcm_port = process::free_port()?;
        let scheduler_port = process::free_port()?;
        self.spawn(
            "kube-controller-manager",
            "kube-controller-manager",
            &[
                format!("--kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--leader-elect=false".into(),
                "--use-service-account-credentials=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={kcm_port}"),
                format!("--root-ca-file={}", self.cp.ca_file().display()),
                "--node-monitor-grace-period=20s".into(),
                "--controllers=serviceaccount-controller,root-ca-certificate-publisher-controller,\
                 node-lifecycle-controller,taint-eviction-controller,\
                 persistentvolume-binder-controller,persistentvolume-protection-controller,\
                 persistentvolumeclaim-protection-controller,persistentvolume-attach-detach-controller,\
                 garbage-collector-controller,namespace-controller,pod-garbage-collector-controller,\
                 daemonset-controller,replicaset-controller,deployment-controller,job-controller"
                    .into(),
                "--v=1".into(),
            ],
        )?;
        self.spawn(
            "kube-scheduler",
            "kube-scheduler",
            &[
                format!("--kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={scheduler_port}"),
                "--v=1".into(),
            ],
        )?;
        let mut snapshot_controller =
            vec![format!("--kubeconfig={kubeconfig}"), "--leader-election=false".into()];
        if several_nodes {
            snapshot_controller.push("--enable-distributed-snapshotting".into());
        }
        snapshot_controller.push("--v=2".into());
        self.spawn("snapshot-controller", "snapshot-controller", &snapshot_controller)?;
        if several_nodes {
            let kubeconfig = self.cp.kubeconfig().to_owned();
            for node in &mut self.nodes {
                node.start_node_sidecars(&kubeconfig)?;
            }
            return Ok(());
        }
        let sock = self.nodes[0].csi_socket().display().to_string();
        for name in ["csi-provisioner", "csi-snapshotter"] {
            let args = [
                format!("--csi-address={sock}"),
                format!("--kubeconfig={kubeconfig}"),
                "--leader-election=false".into(),
                "--extra-create-metadata".into(),
                "--timeout=60s".into(),
                "--v=2".into(),
            ];
            self.spawn(name, name, &args)?;
        }
        Ok(())
    }

    async fn install_cluster_objects(&self, tls: &snapshot_metadata::Tls) -> anyhow::Result<()> {
        let client = self.cp.client()?;
        crate::crds::install(&client, &[snapshot_metadata::crd()?]).await?;
        // Discovery may lag the CRD's Established condition a little.
        let service = serde_json::to_string(&tls.service_object())?;
        let mut tries = 0;
        while let Err(e) = crate::apply::apply_yaml(&client, &service).await {
            tries += 1;
            if tries >= 40 {
                return Err(e.context("creating the SnapshotMetadataService"));
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let objects = format!(
            "apiVersion: storage.k8s.io/v1
kind: CSIDriver
metadata: {{name: {DRIVER}}}
spec:
  attachRequired: false
  podInfoOnMount: true
  volumeLifecycleModes: [Persistent]
  fsGroupPolicy: File
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {STORAGE_CLASS}
  annotations: {{storageclass.kubernetes.io/is-default-class: \"true\"}}
provisioner: {DRIVER}
reclaimPolicy: Delete
volumeBindingMode: Immediate
---
apiVersion: storage.k8s.io/v1
kind: StorageClass
metadata:
  name: {WAIT_STORAGE_CLASS}
provisioner: {DRIVER}
reclaimPolicy: Delete
volumeBindingMode: WaitForFirstConsumer
---
apiVersion: snapshot.storage.k8s.io/v1
kind: VolumeSnapshotClass
metadata:
  name: {SNAPSHOT_CLASS}
  labels: {{velero.io/csi-volumesnapshot-class: \"true\"}}
driver: {DRIVER}
deletionPolicy: Delete
"
        );
        crate::apply::apply_yaml(&client, &objects).await
    }

    async fn wait_nodes_ready(&mut self) -> anyhow::Result<()> {
        let client = self.cp.client()?;
        let nodes: Api<Node> = Api::all(client.clone());
        let csinodes: Api<CSINode> = Api::all(client);
        let deadline = Instant::now() + READY_TIMEOUT;
        let names: Vec<String> = self.nodes.iter().map(|n| n.name().to_owned()).collect();
        for name in names {
            loop {
                for c in &mut self.controllers {
                    if !c.is_running() {
                        bail!("{} exited while the cluster started", c.name());
                    }
                }
                for n in &self.nodes {
                    if let Some(exited) = n.exited() {
                        bail!("{exited} of node {} exited while it started", n.name());
                    }
                }
                let ready = nodes.get_opt(&name).await?.is_some_and(|n| {
                    n.status
                        .and_then(|s| s.conditions)
                        .unwrap_or_default()
                        .iter()
                        .any(|c| c.type_ == "Ready" && c.status == "True")
                        && !n
                            .spec
                            .and_then(|s| s.taints)
                            .unwrap_or_default()
                            .iter()
                            .any(|t| t.effect == "NoSchedule")
                });
                let driver = csinodes
                    .get_opt(&name)
                    .await?
                    .is_some_and(|c| c.spec.drivers.iter().any(|d| d.name == DRIVER));
                if ready && driver {
                    break;
                }
                if Instant::now() > deadline {
                    bail!(
                        "node {name} not Ready with CSI driver {DRIVER} after {READY_TIMEOUT:?} (Ready: {ready}, driver registered: {driver})"
                    );
                }
                tokio::time::sleep(Duration::from_millis(500)).await;
            }
        }
        Ok(())
    }

    /// The control plane.
    #[must_use]
    pub fn control_plane(&self) -> &ControlPlane {
        &self.cp
    }

    /// A new admin client bound to the caller's runtime.
    ///
    /// # Errors
    /// As [`ControlPlane::client`].
    pub fn client(&self) -> anyhow::Result<kube::Client> {
        self.cp.client()
    }

    /// The nodes, in the order of their names.
    #[must_use]
    pub fn nodes(&self) -> &[KubeNode] {
        &self.nodes
    }

    /// Loses node `index` as a power cut does (see [`KubeNode::power_off`]); the cluster
    /// keeps its Node object, which the node-lifecycle controller marks NotReady. With one node
    /// the CSI provisioner and snapshotter run cluster-wide and stay (a node of several takes
    /// its own down with it). A powered-off node's paths, images and relays are gone.
    ///
    /// # Panics
    /// No node has that index.
    pub fn power_off(&self, index: usize) {
        self.nodes[index].power_off();
    }

    fn first(&self) -> &KubeNode {
        &self.nodes[0]
    }

    /// A path on the first node, as its processes (and pods' hostPath volumes) see it.
    #[must_use]
    pub fn node_path(&self, inside: &Path) -> PathBuf {
        self.first().node_path(inside)
    }

    /// Makes `host_port` on the host's loopback reachable from every node and its pods at
    /// `NODE_IP:host_port` (for an S3 server the tests started).
    ///
    /// # Errors
    /// The port cannot be bound in a node's network namespace.
    pub fn expose_host_port(&self, host_port: u16) -> anyhow::Result<Forwarder> {
        self.relay_host_port(host_port, host_port)
    }

    /// Makes `host_port` on the host's loopback reachable from every node and its pods at
    /// `NODE_IP:node_port`: a second way to the same server, with a [`Forwarder::gate`] of
    /// its own.
    ///
    /// # Errors
    /// The port cannot be bound in a node's network namespace.
    pub fn relay_host_port(&self, node_port: u16, host_port: u16) -> anyhow::Result<Forwarder> {
        let target = SocketAddr::new(Ipv4Addr::LOCALHOST.into(), host_port);
        let mut pairs = Vec::new();
        for node in &self.nodes {
            pairs.push((node.listen(SocketAddr::new(NODE_IP.parse()?, node_port))?, target));
        }
        Forwarder::start(pairs)
    }

    /// A TCP connection to an address inside the first node's network (a pod's IP).
    ///
    /// # Errors
    /// Nothing accepted the connection.
    pub fn connect(&self, addr: SocketAddr) -> anyhow::Result<std::net::TcpStream> {
        self.first().connect(addr)
    }

    /// Imports an OCI image archive into every node's containerd.
    ///
    /// # Errors
    /// As [`KubeNode::import_image`].
    pub fn import_image(&self, archive: &Path) -> anyhow::Result<()> {
        for node in &self.nodes {
            node.import_image(archive)?;
        }
        Ok(())
    }

    /// Installs Ferry as a user does: an image of `binary` (see [`crate::image`]) imported into
    /// every node's containerd, and the chart `deploy/helm/ferry` rendered by `helm template`
    /// (with `values`, `KEY=VALUE` as `--set` takes them) and applied. Waits until the agent's
    /// pod is Ready on every node. Returns the image's name.
    ///
    /// # Errors
    /// The image, helm, the chart or the apply failed, or the agents were not Ready within
    /// 120 s (the error carries the pods' state).
    pub async fn install_ferry(&self, binary: &Path, values: &[&str]) -> anyhow::Result<String> {
        let (archive, image) = crate::image::ferry_image(binary, self.dir.path())?;
        self.import_image(&archive)?;
        let (repository, tag) = image.rsplit_once(':').context("image name without a tag")?;
        let root = paths::workspace_root()?;
        let helm = paths::helm()?;
        let mut cmd = Command::new(helm);
        cmd.args(["template", "ferry"])
            .arg(root.join("deploy/helm/ferry"))
            .args(["--namespace", crate::VELERO_NAMESPACE])
            .args(["--set", &format!("image.repository={repository}")])
            .args(["--set", &format!("image.tag={tag}")])
            .args(["--set", "image.pullPolicy=Never"]);
        for v in values {
            cmd.args(["--set", v]);
        }
        let out =
            cmd.stdin(std::process::Stdio::null()).output().context("running helm template")?;
        if !out.status.success() {
            bail!("helm template failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let client = self.client()?;
        crate::apply::apply_yaml(&client, &String::from_utf8(out.stdout)?).await?;
        self.wait_agent_ready(&client).await?;
        Ok(image)
    }

    /// Waits (up to 120 s) until the agent's DaemonSet has rolled out its current pod template
    /// (as `kubectl rollout status` reads it) and an agent pod is Ready on every node.
    ///
    /// # Errors
    /// Not Ready in time; the error carries the pods' phases and container states.
    pub async fn wait_agent_ready(&self, client: &kube::Client) -> anyhow::Result<()> {
        use k8s_openapi::api::apps::v1::DaemonSet;
        use k8s_openapi::api::core::v1::Pod;
        let pods: Api<Pod> = Api::namespaced(client.clone(), crate::VELERO_NAMESPACE);
        let sets: Api<DaemonSet> = Api::namespaced(client.clone(), crate::VELERO_NAMESPACE);
        let params = kube::api::ListParams::default()
            .labels("app.kubernetes.io/name=ferry,app.kubernetes.io/component=agent");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            // First the rollout: after a re-apply that changed the pod template, the old pod
            // stays Ready until the DaemonSet controller replaces it.
            let set = sets.get_opt(AGENT_DAEMONSET).await?;
            let rolled_out = set.as_ref().is_some_and(rolled_out);
            let list = pods.list(&params).await?;
            let ready_on = |node: &str| {
                list.items.iter().any(|p| {
                    p.metadata.deletion_timestamp.is_none()
                        && p.spec.as_ref().and_then(|s| s.node_name.as_deref()) == Some(node)
                        && p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
                            cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                        })
                })
            };
            if rolled_out && self.nodes.iter().all(|n| ready_on(n.name())) {
                return Ok(());
            }
            if Instant::now() > deadline {
                let states: Vec<String> = list
                    .items
                    .iter()
                    .map(|p| {
                        format!(
                            "{}: {}",
                            p.metadata.name.clone().unwrap_or_default(),
                            serde_json::to_string(&p.status).unwrap_or_default()
                        )
                    })
                    .collect();
                let set = set.map(|s| (s.metadata.generation, s.status));
                bail!(
                    "Ferry's agent not rolled out and Ready on every node after \
                     {READY_TIMEOUT:?}: DaemonSet {AGENT_DAEMONSET} (generation, status) \
                     {set:?}; pods {}",
                    states.join("; ")
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// PIDs of the processes the cluster started (the controllers, each node's components
    /// and its namespaces' first process, and the control plane).
    #[must_use]
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.controllers.iter().map(Guarded::pid).collect();
        for node in &self.nodes {
            pids.extend(node.pids());
        }
        pids.extend(self.cp.pids());
        pids
    }

    /// The first node's kubelet cgroup root (a folder of that name in every hierarchy).
    #[must_use]
    pub fn cgroup(&self) -> &str {
        self.first().cgroup()
    }

    /// The folder holding the cluster's files and the controllers' logs (`logs/`).
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A kubeconfig for programs inside the first node: the API server at the `kubernetes`
    /// Service, verified with the cluster's CA, admin rights.
    #[must_use]
    pub fn node_kubeconfig(&self) -> &Path {
        self.first().kubeconfig()
    }

    /// Starts `cmd` inside the first node's namespaces (as a pod's process sees the network and
    /// the mounts); it dies with the test binary, and with the node.
    ///
    /// # Errors
    /// The spawn failed.
    pub fn spawn_inside(&self, name: &str, cmd: Command) -> anyhow::Result<Guarded> {
        self.first().spawn_inside(name, cmd)
    }

    /// Where the CSI hostpath driver keeps the file-system volume `handle` (a folder of the
    /// host on the node that has it), for reading a volume as it is without a pod.
    #[must_use]
    pub fn hostpath_volume(&self, handle: &str) -> PathBuf {
        self.nodes
            .iter()
            .map(|n| n.hostpath_volume(handle))
            .find(|p| p.exists())
            .unwrap_or_else(|| self.first().hostpath_volume(handle))
    }

    /// Whether the CSI hostpath driver of any node still keeps the physical snapshot `handle`.
    #[must_use]
    pub fn hostpath_snapshot_exists(&self, handle: &str) -> bool {
        self.nodes.iter().any(|n| n.hostpath_snapshot(handle).exists())
    }

    /// A kubeconfig for the cluster's API server on the host's loopback.
    #[must_use]
    pub fn kubeconfig(&self) -> &Path {
        self.cp.kubeconfig()
    }

    /// The last lines of every component's log: the controllers', then each node's.
    #[must_use]
    pub fn log_tail(&self) -> String {
        let mut out = log_tail(&self.dir.path().join("logs"), "");
        for node in &self.nodes {
            out.push_str(&node.log_tail());
        }
        out
    }

    /// The CSI driver's loop devices on every node as `(device, backing file)`.
    #[must_use]
    pub fn loop_devices(&self) -> Vec<(String, String)> {
        self.nodes.iter().flat_map(KubeNode::loop_devices).collect()
    }
}

/// The name of node `index`.
#[must_use]
pub fn node_name(index: usize) -> String {
    format!("ferry-node-{index}")
}

/// The last lines of each log in `logs`, each headed by `prefix` and the file's path.
pub(crate) fn log_tail(logs: &Path, prefix: &str) -> String {
    let mut out = String::new();
    let mut files: Vec<_> =
        std::fs::read_dir(logs).into_iter().flatten().flatten().map(|e| e.path()).collect();
    files.sort();
    for file in files {
        let text = std::fs::read_to_string(&file).unwrap_or_default();
        let lines: Vec<_> = text.lines().rev().take(12).collect();
        out.push_str(&format!("--- {prefix}{}\n", file.display()));
        for l in lines.into_iter().rev() {
            out.push_str(l);
            out.push('\n');
        }
    }
    out
}

/// Detaches the loop devices backed by files under `$1` (the CSI driver's block volumes) and
/// the loop devices the kubelet made to hold those open (their backing file is the device node
/// itself: same device number and inode as `/dev/loopN`), then removes the cgroup `$2`
/// (deepest first) in every hierarchy; bounded retries while killed processes finish exiting.
///
/// A backing file is matched by the folder's own name, not its whole path: once the node's
/// mounts are gone, the kernel names a file relative to the mount it is on (a tmpfs `/tmp`).
pub(crate) const CLEANUP: &str = r#"dir="$1"; cg="$2"
[ -n "$dir" ] && [ -n "$cg" ] || exit 2
mark="/$(basename "$dir")/hostpath/"
ours=""
for f in /sys/block/loop*/loop/backing_file; do
  [ -r "$f" ] || continue
  case "$(cat "$f" 2>/dev/null)" in *"$mark"*) ours="$ours $(basename "$(dirname "$(dirname "$f")")")" ;; esac
done
for n in $ours; do
  node="$(stat -c '%Hd:%Ld %i' "/dev/$n" 2>/dev/null)" || continue
  losetup -n -l -O NAME,BACK-MAJ:MIN,BACK-INO 2>/dev/null | while read -r dev majmin ino; do
    [ "$majmin $ino" = "$node" ] && losetup -d "$dev" 2>/dev/null
    true
  done
  losetup -d "/dev/$n" 2>/dev/null || true
done
i=0
while [ "$i" -lt 50 ]; do
  left=0
  for h in /sys/fs/cgroup/*/; do
    [ -d "$h$cg" ] || continue
    find "$h$cg" -depth -type d -exec rmdir {} \; 2>/dev/null || true
    [ -d "$h$cg" ] && left=1
  done
  [ "$left" -eq 0 ] && break
  i=$((i+1)); sleep 0.2
done
"#;

pub(crate) fn write_file(path: &Path, contents: impl AsRef<[u8]>) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

pub(crate) fn make_dir(path: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))
}

/// `path` quoted for `sh`.
pub(crate) fn quoted(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
}

pub(crate) async fn wait_for(
    what: &str,
    timeout: Duration,
    mut ready: impl FnMut() -> bool,
) -> anyhow::Result<()> {
    let deadline = Instant::now() + timeout;
    while !ready() {
        if Instant::now() > deadline {
            bail!("{what} not ready after {timeout:?}");
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
    Ok(())
}

/// The agent's DaemonSet in the chart.
const AGENT_DAEMONSET: &str = "ferry-agent";

/// Whether the DaemonSet's controller has seen its current spec and every node it schedules
/// on runs an available pod of the current template.
fn rolled_out(set: &k8s_openapi::api::apps::v1::DaemonSet) -> bool {
    let generation = set.metadata.generation.unwrap_or(0);
    set.status.as_ref().is_some_and(|s| {
        s.observed_generation.unwrap_or(0) >= generation
            && s.updated_number_scheduled.unwrap_or(0) >= s.desired_number_scheduled
            && s.number_available.unwrap_or(0) >= s.desired_number_scheduled
    })
}
