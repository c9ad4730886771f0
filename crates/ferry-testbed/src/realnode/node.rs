//! One real node of a [`super::RealCluster`]: its namespaces, containerd, the CSI hostpath
//! driver and its node-side sidecars, and the kubelet.
//!
//! Each node has a folder of its own (`ferry-realnode-*`, removed with the node and by a
//! janitor when the test binary is killed), a cgroup root of its own, and namespaces of its own,
//! so several nodes on one host share nothing but the kernel: every node's addresses are the
//! same ([`super::NODE_IP`], the pod network), each in its own network namespace.

use std::net::{Ipv4Addr, SocketAddr};
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::{Context, bail};

use super::{
    CLEANUP, DRIVER, KUBELET_ROOT, NODE_IP, SHADOWED_SYSCTLS, make_dir, quoted, wait_for,
    write_file,
};
use crate::control_plane::{ControlPlane, SERVICE_IP};
use crate::netns::{Forwarder, NodeNamespaces};
use crate::paths;
use crate::process::{self, Guarded};

/// A running node. Dropping it stops its processes, detaches its loop devices, removes its
/// cgroups and its files.
#[derive(Debug)]
pub struct KubeNode {
    // Field order is drop order.
    forwarder: Option<Forwarder>,
    /// Behind a lock so that a node shared by tests can be powered off.
    components: std::sync::Mutex<Vec<Guarded>>,
    namespaces: Option<NodeNamespaces>,
    dir: tempfile::TempDir,
    name: String,
    bin: PathBuf,
    cgroup: String,
    kubeconfig: PathBuf,
}

impl KubeNode {
    /// Creates the node's folder, cgroups and namespaces and starts containerd (with the pause
    /// and busybox images) and the CSI driver with its registrar. The kubelet starts later
    /// ([`Self::start_kubelet`]), once the cluster's controllers run.
    pub(super) async fn boot(cp: &ControlPlane, bin: &Path, name: &str) -> anyhow::Result<Self> {
        let dir = tempfile::Builder::new().prefix("ferry-realnode-").tempdir()?;
        let cgroup = format!(
            "ferry-testbed-{}",
            dir.path()
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("node")
                .trim_start_matches("ferry-realnode-")
        );
        let mut node = Self {
            forwarder: None,
            components: std::sync::Mutex::new(Vec::new()),
            namespaces: None,
            kubeconfig: dir.path().join("kubelet.kubeconfig"),
            dir,
            name: name.to_owned(),
            bin: bin.to_owned(),
            cgroup,
        };
        janitor(node.dir.path(), &node.cgroup)?;
        node.prepare(cp)
            .await
            .map_err(|e| anyhow::anyhow!("node {name}: {e:#}\n{}", node.log_tail()))?;
        Ok(node)
    }

    async fn prepare(&mut self, cp: &ControlPlane) -> anyhow::Result<()> {
        let root = self.dir.path().to_path_buf();
        for d in [
            "var-lib",
            "var-log",
            "sysctl",
            "csi",
            "containerd",
            "cni",
            "hostpath",
            "volume-plugins",
            "logs",
        ] {
            make_dir(&root.join(d))?;
        }
        if Path::new("/sys/fs/cgroup/cgroup.controllers").exists() {
            bail!(
                "this host has only cgroup v2 (/sys/fs/cgroup is cgroup2): the test bed's kubelet \
                 runs with the cgroupfs driver on cgroup v1 or hybrid hierarchies, one folder \
                 per hierarchy; a unified-only host is not supported yet"
            );
        }
        for h in cgroup_hierarchies() {
            std::fs::create_dir_all(h.join(&self.cgroup))
                .with_context(|| format!("creating cgroup {}", h.join(&self.cgroup).display()))?;
        }
        let ns = NodeNamespaces::create()?;
        ns.run(&self.mount_script())?;
        // The API server and S3 are on the host's loopback; the node reaches the API server at
        // the `kubernetes` Service address, as pods do.
        let api = ns.listen(SocketAddr::new(SERVICE_IP.parse()?, 443))?;
        self.forwarder = Some(Forwarder::start(vec![(
            api,
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), cp.port()),
        )])?);
        self.write_kubeconfig(cp)?;
        register_kubelet_root(&self.name, ns.path(Path::new(KUBELET_ROOT)));
        self.namespaces = Some(ns);

        self.start_containerd().await?;
        self.import_image(&paths::realnode_images()?.join("pause.tar"))?;
        self.import_image(&paths::realnode_images()?.join("busybox.tar"))?;
        self.start_csi_driver().await
    }

    fn mount_script(&self) -> String {
        let root = quoted(self.dir.path());
        // Private first: nothing mounted here may ever propagate to the host's mounts.
        let mut s = format!(
            "mount --make-rprivate /
mount -t proc -o nosuid,nodev,noexec proc /proc
mount -t tmpfs -o size=256m,mode=755 ferry-node-run /run
mount --bind {root}/var-lib /var/lib
mount --bind {root}/var-log /var/log
mkdir -p {KUBELET_ROOT}/plugins_registry {KUBELET_ROOT}/plugins
mount --bind {KUBELET_ROOT} {KUBELET_ROOT}
mount --make-rshared {KUBELET_ROOT}
ip link set lo up
ip addr add {SERVICE_IP}/32 dev lo
ip addr add {NODE_IP}/32 dev lo
"
        );
        for (name, value) in SHADOWED_SYSCTLS {
            let file = format!("{root}/sysctl/{}", name.replace('/', "."));
            s.push_str(&format!("echo {value} > {file}\nmount --bind {file} /proc/sys/{name}\n"));
        }
        s
    }

    fn write_kubeconfig(&self, cp: &ControlPlane) -> anyhow::Result<()> {
        write_file(
            &self.kubeconfig,
            format!(
                "apiVersion: v1
kind: Config
clusters:
- name: ferry
  cluster: {{server: \"https://{SERVICE_IP}:443\", certificate-authority: \"{}\"}}
users:
- name: admin
  user: {{token: {}}}
contexts:
- name: ferry
  context: {{cluster: ferry, user: admin}}
current-context: ferry
",
                cp.ca_file().display(),
                cp.admin_token()
            ),
        )?;
        Ok(())
    }

    fn ns(&self) -> &NodeNamespaces {
        self.namespaces.as_ref().expect("namespaces exist after boot")
    }

    /// Starts `program` with `args` and `env`, inside the node's namespaces when `inside`,
    /// logging to the node's `logs/<name>.log`.
    pub(super) fn spawn(
        &mut self,
        name: &str,
        program: &str,
        args: &[String],
        env: &[(&str, &str)],
        inside: bool,
    ) -> anyhow::Result<()> {
        let logs = self.dir.path().join("logs");
        let mut cmd = logged_command(&self.bin, &logs, name, program, args)?;
        cmd.envs(env.iter().copied());
        let child = if inside { self.ns().spawn(name, cmd)? } else { process::spawn(name, cmd)? };
        self.components().push(child);
        Ok(())
    }

    fn containerd_socket(&self) -> PathBuf {
        self.dir.path().join("containerd/containerd.sock")
    }

    /// The CSI driver's socket (a host path: the cluster's sidecars use it too).
    pub(super) fn csi_socket(&self) -> PathBuf {
        self.dir.path().join("csi/csi.sock")
    }

    async fn start_containerd(&mut self) -> anyhow::Result<()> {
        let root = self.dir.path();
        let sock = self.containerd_socket();
        let cni = root.join("cni");
        write_file(
            &cni.join("10-ferry.conflist"),
            format!(
                r#"{{"cniVersion": "1.0.0", "name": "ferry-node", "plugins": [
  {{"type": "bridge", "bridge": "ferry0", "isGateway": true, "isDefaultGateway": true,
    "ipMasq": false, "hairpinMode": true,
    "ipam": {{"type": "host-local", "ranges": [[{{"subnet": "10.244.0.0/24"}}]],
             "dataDir": "{}"}}}},
  {{"type": "loopback"}}]}}"#,
                root.join("cni-ipam").display()
            ),
        )?;
        let config = root.join("containerd/config.toml");
        write_file(
            &config,
            format!(
                r#"version = 3
root = "{root}/containerd/root"
state = "{root}/containerd/state"
[grpc]
  address = "{sock}"
[ttrpc]
  address = "{sock}.ttrpc"
[debug]
  address = "{sock}.debug"
[plugins.'io.containerd.cri.v1.images']
  snapshotter = "overlayfs"
  [plugins.'io.containerd.cri.v1.images'.pinned_images]
    sandbox = "ferry.local/pause:1"
[plugins.'io.containerd.cri.v1.runtime']
  netns_mounts_under_state_dir = true
  # Root here may lack CAP_SYS_RESOURCE: a sandbox cannot lower its oom_score_adj below
  # containerd's own, and fails unless it is told not to try.
  restrict_oom_score_adj = true
  [plugins.'io.containerd.cri.v1.runtime'.containerd]
    default_runtime_name = "runc"
    [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins.'io.containerd.cri.v1.runtime'.containerd.runtimes.runc.options]
        BinaryName = "{bin}/runc"
        SystemdCgroup = false
  [plugins.'io.containerd.cri.v1.runtime'.cni]
    bin_dirs = ["{bin}"]
    conf_dir = "{cni}"
[plugins.'io.containerd.grpc.v1.cri']
  disable_tcp_service = true
"#,
                root = root.display(),
                sock = sock.display(),
                bin = self.bin.display(),
                cni = cni.display(),
            ),
        )?;
        self.spawn(
            "containerd",
            "containerd",
            &["--config".into(), config.display().to_string()],
            &[],
            true,
        )?;
        let ctr = self.bin.join("ctr");
        wait_for("containerd", Duration::from_secs(60), || {
            Command::new(&ctr)
                .args(["--address"])
                .arg(&sock)
                .arg("version")
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        })
        .await
    }

    /// Imports an OCI image archive into the node's containerd (as `ctr images import`).
    ///
    /// # Errors
    /// `ctr` failed; the error carries its output.
    pub fn import_image(&self, archive: &Path) -> anyhow::Result<()> {
        let out = Command::new(self.bin.join("ctr"))
            .arg("--address")
            .arg(self.containerd_socket())
            .args(["-n", "k8s.io", "images", "import"])
            .arg(archive)
            .stdin(Stdio::null())
            .output()
            .context("running ctr")?;
        if !out.status.success() {
            bail!("importing {}: {}", archive.display(), String::from_utf8_lossy(&out.stderr));
        }
        Ok(())
    }

    async fn start_csi_driver(&mut self) -> anyhow::Result<()> {
        let sock = self.csi_socket();
        let state = self.dir.path().join("hostpath");
        let name = self.name.clone();
        self.spawn(
            "hostpathplugin",
            "hostpathplugin",
            &[
                format!("--endpoint=unix://{}", sock.display()),
                format!("--drivername={DRIVER}"),
                format!("--nodeid={name}"),
                format!("--statedir={}", state.display()),
                // Changed-block tracking: the driver's SnapshotMetadata service, which the
                // csi-snapshot-metadata sidecar serves to clients.
                "--enable-snapshot-metadata".into(),
                "--v=3".into(),
            ],
            &[],
            true,
        )?;
        wait_for("the CSI driver's socket", Duration::from_secs(30), || sock.exists()).await?;
        self.spawn(
            "node-driver-registrar",
            "csi-node-driver-registrar",
            &[
                format!("--csi-address={}", sock.display()),
                format!("--kubelet-registration-path={}", sock.display()),
                format!("--plugin-registration-path={KUBELET_ROOT}/plugins_registry"),
            ],
            &[],
            true,
        )
    }

    /// The `csi-snapshot-metadata` sidecar beside this node's driver, listening at
    /// [`super::NODE_IP`]`:`[`super::snapshot_metadata::PORT`] in the node's network namespace.
    pub(super) fn start_snapshot_metadata(
        &mut self,
        tls: &super::snapshot_metadata::Tls,
    ) -> anyhow::Result<()> {
        let args = tls.sidecar_args(&self.csi_socket(), &self.kubeconfig);
        self.spawn("csi-snapshot-metadata", "csi-snapshot-metadata", &args, &[], true)
    }

    /// The provisioner and snapshotter of a node of several (`--node-deployment`): each node
    /// provisions and snapshots its own volumes, as the hostpath driver's volumes are local.
    pub(super) fn start_node_sidecars(&mut self, kubeconfig: &Path) -> anyhow::Result<()> {
        let sock = self.csi_socket().display().to_string();
        let kubeconfig = kubeconfig.display().to_string();
        let name = self.name.clone();
        self.spawn(
            "csi-provisioner",
            "csi-provisioner",
            &[
                format!("--csi-address={sock}"),
                format!("--kubeconfig={kubeconfig}"),
                "--leader-election=false".into(),
                "--extra-create-metadata".into(),
                "--feature-gates=Topology=true".into(),
                "--node-deployment".into(),
                "--node-deployment-base-delay=1s".into(),
                "--node-deployment-max-delay=3s".into(),
                "--timeout=60s".into(),
                "--v=2".into(),
            ],
            &[("NODE_NAME", &name)],
            false,
        )?;
        self.spawn(
            "csi-snapshotter",
            "csi-snapshotter",
            &[
                format!("--csi-address={sock}"),
                format!("--kubeconfig={kubeconfig}"),
                "--leader-election=false".into(),
                "--extra-create-metadata".into(),
                "--node-deployment".into(),
                "--timeout=60s".into(),
                "--v=2".into(),
            ],
            &[("NODE_NAME", &name)],
            false,
        )
    }

    pub(super) fn start_kubelet(&mut self) -> anyhow::Result<()> {
        let root = self.dir.path();
        let config = root.join("kubelet-config.yaml");
        write_file(
            &config,
            format!(
                "apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
failCgroupV1: false
cgroupDriver: cgroupfs
cgroupRoot: /{cgroup}
containerRuntimeEndpoint: unix://{sock}
authentication: {{anonymous: {{enabled: false}}, webhook: {{enabled: false}}}}
authorization: {{mode: AlwaysAllow}}
address: {NODE_IP}
port: 10250
healthzBindAddress: 127.0.0.1
healthzPort: 10248
readOnlyPort: 0
failSwapOn: false
registerNode: true
serializeImagePulls: false
evictionHard: {{memory.available: \"100Mi\", nodefs.available: \"1%\", imagefs.available: \"1%\"}}
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
volumePluginDir: {plugins}
resolvConf: \"\"
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
fileCheckFrequency: 10s
",
                cgroup = self.cgroup,
                sock = self.containerd_socket().display(),
                plugins = root.join("volume-plugins").display(),
            ),
        )?;
        let args = [
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", self.kubeconfig.display()),
            format!("--root-dir={KUBELET_ROOT}"),
            format!("--hostname-override={}", self.name),
            format!("--node-ip={NODE_IP}"),
            "--v=2".into(),
        ];
        self.spawn("kubelet", "kubelet", &args, &[], true)
    }

    /// Names the first of the node's processes that is no longer running.
    pub(super) fn exited(&self) -> Option<String> {
        for c in self.components().iter_mut() {
            if !c.is_running() {
                return Some(c.name().to_owned());
            }
        }
        None
    }

    /// The node's name.
    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    /// A path on the node, as its processes (and pods' hostPath volumes) see it.
    #[must_use]
    pub fn node_path(&self, inside: &Path) -> PathBuf {
        self.ns().path(inside)
    }

    /// A listener bound inside the node's network namespace.
    pub(super) fn listen(&self, addr: SocketAddr) -> anyhow::Result<std::net::TcpListener> {
        self.ns().listen(addr)
    }

    /// A TCP connection to an address inside the node's network (a pod's IP).
    ///
    /// # Errors
    /// Nothing accepted the connection.
    pub fn connect(&self, addr: SocketAddr) -> anyhow::Result<std::net::TcpStream> {
        self.ns().connect(addr)
    }

    /// Starts `cmd` inside the node's namespaces (as a pod's process sees the network and the
    /// mounts); it dies with the test binary, and with the node.
    ///
    /// # Errors
    /// The spawn failed.
    pub fn spawn_inside(&self, name: &str, cmd: Command) -> anyhow::Result<Guarded> {
        self.ns().spawn(name, cmd)
    }

    /// Runs `cmd` to its end inside the node's namespaces (as [`Self::spawn_inside`]) and
    /// returns its status and output.
    ///
    /// # Errors
    /// The program could not be started.
    pub fn output_inside(&self, cmd: Command) -> anyhow::Result<std::process::Output> {
        self.ns().output(cmd)
    }

    /// A kubeconfig for programs inside the node: the API server at the `kubernetes` Service,
    /// verified with the cluster's CA, admin rights.
    #[must_use]
    pub fn kubeconfig(&self) -> &Path {
        &self.kubeconfig
    }

    /// The kubelet's cgroup root (a folder of that name in every cgroup hierarchy).
    #[must_use]
    pub fn cgroup(&self) -> &str {
        &self.cgroup
    }

    /// The folder holding the node's files and its components' logs (`logs/`).
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// Where the CSI hostpath driver keeps the file-system volume `handle` on this node.
    #[must_use]
    pub fn hostpath_volume(&self, handle: &str) -> PathBuf {
        self.dir.path().join("hostpath").join(handle)
    }

    /// Where the CSI hostpath driver keeps the physical snapshot `handle` on this node (a
    /// file its DeleteSnapshot removes).
    #[must_use]
    pub fn hostpath_snapshot(&self, handle: &str) -> PathBuf {
        self.dir.path().join("hostpath").join(format!("{handle}.snap"))
    }

    /// PIDs of the node's processes and of its namespaces' first process.
    #[must_use]
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.components().iter().map(Guarded::pid).collect();
        pids.extend(self.namespaces.as_ref().map(NodeNamespaces::init_pid));
        pids
    }

    /// The last lines of each of the node's component logs.
    #[must_use]
    pub fn log_tail(&self) -> String {
        super::log_tail(&self.dir.path().join("logs"), &format!("{}: ", self.name))
    }

    /// The CSI driver's loop devices (its block volumes, backed by files in the node's folder)
    /// as `(device, backing file)`; the kubelet's references to them keep them attached.
    #[must_use]
    pub fn loop_devices(&self) -> Vec<(String, String)> {
        let mark = format!(
            "/{}/hostpath/",
            self.dir.path().file_name().unwrap_or_default().to_string_lossy()
        );
        std::fs::read_dir("/sys/block")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let name = e.file_name().to_string_lossy().into_owned();
                let file = std::fs::read_to_string(e.path().join("loop/backing_file")).ok()?;
                file.contains(&mark).then(|| (format!("/dev/{name}"), file.trim().to_owned()))
            })
            .collect()
    }

    /// Loses the node as a power cut does: every process of it (kubelet, containerd, the CSI
    /// driver, every pod) is killed at once; its files stay until the node is dropped. The API
    /// server keeps its Node object, which the node-lifecycle controller marks NotReady.
    pub fn power_off(&self) {
        // Its kubelet's folder is no longer there to look at.
        forget_kubelet_root(&self.name);
        // Everything in the node's namespaces (kubelet, containerd, the driver, every pod)
        // first and at once; then its processes on the host (its CSI sidecars).
        if let Some(ns) = &self.namespaces {
            ns.kill();
        }
        let mut components = self.components();
        while let Some(mut c) = components.pop() {
            c.stop();
        }
    }

    fn components(&self) -> std::sync::MutexGuard<'_, Vec<Guarded>> {
        self.components.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Stops everything and removes what outlives the node's processes: loop devices backed
    /// by its files and the kubelet's cgroups.
    fn release(&mut self) {
        self.power_off();
        self.forwarder = None;
        if let Some(mut ns) = self.namespaces.take() {
            ns.stop();
        }
        let _ = Command::new("sh")
            .args(["-c", CLEANUP, "ferry-cleanup"])
            .arg(self.dir.path())
            .arg(&self.cgroup)
            .stdin(Stdio::null())
            .status();
    }
}

/// The kubelet roots of the nodes running in this process, as the host sees them (through
/// the node's mount namespace), by node name.
static KUBELET_ROOTS: std::sync::Mutex<Vec<(String, PathBuf)>> = std::sync::Mutex::new(Vec::new());

fn kubelet_roots() -> std::sync::MutexGuard<'static, Vec<(String, PathBuf)>> {
    KUBELET_ROOTS.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn register_kubelet_root(name: &str, root: PathBuf) {
    let mut roots = kubelet_roots();
    roots.retain(|(n, _)| n != name);
    roots.push((name.to_owned(), root));
}

fn forget_kubelet_root(name: &str) {
    kubelet_roots().retain(|(n, _)| n != name);
}

/// The kubelet's root directory (`--root-dir`), as the host sees it, of the node `name`
/// running in this process; `None` for any other node, and for one powered off.
#[must_use]
pub fn kubelet_root_of(name: &str) -> Option<PathBuf> {
    kubelet_roots().iter().find(|(n, _)| n == name).map(|(_, root)| root.clone())
}

/// One CSI volume the kubelet (or the driver, for a block volume's publish path) still has
/// on a node: the PV's name, the pod's UID and the path.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KubeletVolume {
    /// The PersistentVolume's name.
    pub pv: String,
    /// The UID of the pod it is (or was) published for.
    pub pod_uid: String,
    /// The entry, under the kubelet's root as the host sees it.
    pub path: PathBuf,
}

/// Every CSI volume entry under kubelet root `root` (as the host sees it): each pod's
/// `volumes/kubernetes.io~csi/<pv>` (a file-system volume's folder, removed once the driver
/// unpublished it) and `volumeDevices/kubernetes.io~csi/<pv>` (a block volume's device entry,
/// removed before the driver unpublishes), and the driver's block publish paths
/// `plugins/kubernetes.io/csi/volumeDevices/publish/<pv>/<pod uid>` (removed by the driver
/// when it unpublishes).
///
/// # Errors
/// A folder that exists could not be read.
pub fn kubelet_volumes(root: &Path) -> anyhow::Result<Vec<KubeletVolume>> {
    let mut found = Vec::new();
    for uid in names_in(&root.join("pods"))? {
        for kind in ["volumes", "volumeDevices"] {
            let dir = root.join("pods").join(&uid).join(kind).join("kubernetes.io~csi");
            for pv in names_in(&dir)? {
                let path = dir.join(&pv);
                found.push(KubeletVolume { pv, pod_uid: uid.clone(), path });
            }
        }
    }
    let publish = root.join("plugins/kubernetes.io/csi/volumeDevices/publish");
    for pv in names_in(&publish)? {
        for uid in names_in(&publish.join(&pv))? {
            let path = publish.join(&pv).join(&uid);
            found.push(KubeletVolume { pv: pv.clone(), pod_uid: uid, path });
        }
    }
    Ok(found)
}

/// The names in folder `dir`; none when it does not exist.
fn names_in(dir: &Path) -> anyhow::Result<Vec<String>> {
    let entries = match std::fs::read_dir(dir) {
        Ok(entries) => entries,
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => return Ok(Vec::new()),
        Err(e) => return Err(e).with_context(|| format!("listing {}", dir.display())),
    };
    let mut names = Vec::new();
    for entry in entries {
        let entry = entry.with_context(|| format!("listing {}", dir.display()))?;
        names.push(entry.file_name().to_string_lossy().into_owned());
    }
    Ok(names)
}

impl Drop for KubeNode {
    fn drop(&mut self) {
        self.release();
    }
}

/// The free space each node needs on the file system of its folder: the kubelet evicts pods
/// when less than 1 % is free (`evictionHard`), and the tests' volumes, images and
/// repositories take a few GiB.
const MIN_FREE_BYTES: u64 = 3 << 30;
const MIN_FREE_PERCENT: u64 = 3;

/// Refuses to start `nodes` nodes with folders in `dir` where their kubelets would soon evict
/// pods for lack of disk (a `DiskPressure` eviction mid-test reads as a flaky agent), saying
/// how much is free.
pub(super) fn enough_disk(dir: &Path, nodes: usize) -> anyhow::Result<()> {
    let needed = MIN_FREE_BYTES.saturating_mul(u64::try_from(nodes).unwrap_or(u64::MAX));
    let st =
        nix::sys::statvfs::statvfs(dir).with_context(|| format!("statvfs of {}", dir.display()))?;
    let fragment = st.fragment_size();
    let free = st.blocks_available().saturating_mul(fragment);
    let total = st.blocks().saturating_mul(fragment);
    if free < needed || free.saturating_mul(100) < total.saturating_mul(MIN_FREE_PERCENT) {
        bail!(
            "only {} MiB of {} MiB free on the file system of {}: {nodes} real node(s) need at \
             least {} MiB and {MIN_FREE_PERCENT} % free (the kubelet evicts pods under disk \
             pressure); free some space (build caches such as target/debug/incremental are large)",
            free >> 20,
            total >> 20,
            dir.display(),
            needed >> 20
        );
    }
    Ok(())
}

/// A command for `program` (in `bin`) with `args`, its output appended to `logs/<name>.log`
/// and the test bed's binaries first on its `PATH`.
pub(super) fn logged_command(
    bin: &Path,
    logs: &Path,
    name: &str,
    program: &str,
    args: &[String],
) -> anyhow::Result<Command> {
    make_dir(logs)?;
    let log = std::fs::OpenOptions::new()
        .create(true)
        .append(true)
        .open(logs.join(format!("{name}.log")))?;
    let mut cmd = Command::new(bin.join(program));
    cmd.args(args)
        .env("PATH", format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", bin.display()))
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    Ok(cmd)
}

fn cgroup_hierarchies() -> Vec<PathBuf> {
    std::fs::read_dir("/sys/fs/cgroup")
        .into_iter()
        .flatten()
        .flatten()
        .map(|e| e.path())
        .filter(|p| p.join("cgroup.procs").exists())
        .collect()
}

/// A detached janitor that, once this process has exited, runs [`CLEANUP`] and removes `dir`
/// (checked once a second, for at most a day).
fn janitor(dir: &Path, cgroup: &str) -> anyhow::Result<()> {
    use std::os::unix::process::CommandExt;
    let script = format!(
        r#"i=0; while [ "$i" -lt 86400 ] && kill -0 "$3" 2>/dev/null; do sleep 1; i=$((i+1)); done; sleep 2
{CLEANUP}
rm -rf -- "$1""#
    );
    Command::new("sh")
        .args(["-c", &script, "ferry-janitor"])
        .arg(dir)
        .arg(cgroup)
        .arg(std::process::id().to_string())
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .process_group(0)
        .spawn()
        .context("starting the node's janitor")?;
    Ok(())
}
