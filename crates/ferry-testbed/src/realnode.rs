//! A real Kubernetes cluster on one machine: the test bed's control plane, a real kubelet with
//! containerd and runc, the CSI hostpath driver with its sidecars, and the controllers a
//! cluster needs (kube-controller-manager, kube-scheduler, snapshot-controller).
//!
//! The node runs in namespaces of its own ([`NodeNamespaces`]): the kubelet root is
//! `/var/lib/kubelet` as on any node, but inside a private mount namespace where `/var/lib`,
//! `/var/log` and `/run` are the test bed's folders, so nothing the node writes or mounts
//! reaches the host's; its addresses (the node's [`NODE_IP`], the `kubernetes` Service
//! [`SERVICE_IP`], the pod network) exist only in its network namespace. The API server and S3
//! stay on the host's loopback and are relayed in ([`Forwarder`]). The kernel settings the
//! kubelet writes are shadowed inside the mount namespace, so the host's never change.
//!
//! What outlives the namespaces (loop devices the CSI driver attached, the kubelet's cgroups) is
//! removed by [`RealCluster`]'s drop, and by a janitor when the test binary is killed.

use std::net::{Ipv4Addr, SocketAddr};
use std::os::unix::process::CommandExt;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use k8s_openapi::api::core::v1::Node;
use k8s_openapi::api::storage::v1::CSINode;
use kube::Api;

use crate::control_plane::{ControlPlane, Options, SERVICE_IP};
use crate::netns::{Forwarder, NodeNamespaces};
use crate::paths;
use crate::process::{self, Guarded};

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
/// The node's name.
pub const NODE_NAME: &str = "ferry-node-0";
/// The busybox image every test pod can use (imported into the node, never pulled).
pub const BUSYBOX_IMAGE: &str = "ferry.local/busybox:1";

const READY_TIMEOUT: Duration = Duration::from_secs(120);

/// Kernel settings the kubelet writes at start; inside the node's mount namespace each
/// `/proc/sys` file is covered by a file already holding the value, so it writes nothing.
const SHADOWED_SYSCTLS: [(&str, &str); 6] = [
    ("vm/overcommit_memory", "1"),
    ("vm/panic_on_oom", "0"),
    ("kernel/panic", "10"),
    ("kernel/panic_on_oops", "1"),
    ("kernel/keys/root_maxkeys", "1000000"),
    ("kernel/keys/root_maxbytes", "25000000"),
];

/// A running one-node cluster. Dropping it stops every process, detaches the node's loop
/// devices, removes its cgroups and its files.
#[derive(Debug)]
pub struct RealCluster {
    // Field order is drop order.
    forwarder: Option<Forwarder>,
    components: Vec<Guarded>,
    namespaces: Option<NodeNamespaces>,
    cp: ControlPlane,
    dir: tempfile::TempDir,
    bin: PathBuf,
    cgroup: String,
    kubelet_kubeconfig: PathBuf,
}

impl RealCluster {
    /// Starts the control plane, the node and the controllers, and waits until the node is
    /// Ready with the CSI driver registered (about 20-40 s with cached binaries).
    ///
    /// # Errors
    /// A binary is missing and cannot be built, a component exits or the node is not Ready in
    /// time; the error names the step and carries the logs' tails.
    pub async fn start() -> anyhow::Result<Self> {
        let bin = paths::realnode_bin()?;
        let cp = ControlPlane::start_with(Options { for_nodes: true }).await?;
        process::remove_on_exit(cp.dir())?;
        let dir = tempfile::Builder::new().prefix("ferry-realnode-").tempdir()?;
        let cgroup = format!(
            "ferry-testbed-{}",
            dir.path()
                .file_name()
                .and_then(|n| n.to_str())
                .unwrap_or("node")
                .trim_start_matches("ferry-realnode-")
        );
        let mut cluster = Self {
            forwarder: None,
            components: Vec::new(),
            namespaces: None,
            kubelet_kubeconfig: dir.path().join("kubelet.kubeconfig"),
            cp,
            dir,
            bin,
            cgroup,
        };
        janitor(cluster.dir.path(), &cluster.cgroup)?;
        cluster.boot().await.map_err(|e| anyhow::anyhow!("{e:#}\n{}", cluster.log_tail()))?;
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

    async fn boot(&mut self) -> anyhow::Result<()> {
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
            SocketAddr::new(Ipv4Addr::LOCALHOST.into(), self.cp.port()),
        )])?);
        self.write_kubeconfig()?;
        self.namespaces = Some(ns);

        self.start_containerd().await?;
        self.import_image(&paths::realnode_images()?.join("pause.tar"))?;
        self.import_image(&paths::realnode_images()?.join("busybox.tar"))?;
        self.start_csi_driver().await?;
        self.start_controllers()?;
        self.install_cluster_objects().await?;
        self.start_kubelet()?;
        self.wait_node_ready().await
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

    fn write_kubeconfig(&self) -> anyhow::Result<()> {
        let ca = self.cp.ca_file();
        write_file(
            &self.kubelet_kubeconfig,
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
                ca.display(),
                self.cp.admin_token()
            ),
        )?;
        Ok(())
    }

    fn ns(&self) -> &NodeNamespaces {
        self.namespaces.as_ref().expect("namespaces exist after boot")
    }

    /// Starts `program` with `args`, inside the node's namespaces when `inside`, logging to
    /// `<dir>/logs/<name>.log`.
    fn spawn(
        &mut self,
        name: &str,
        program: &Path,
        args: &[String],
        inside: bool,
    ) -> anyhow::Result<()> {
        let logs = self.dir.path().join("logs");
        make_dir(&logs)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(logs.join(format!("{name}.log")))?;
        let mut cmd = Command::new(program);
        cmd.args(args)
            .env("PATH", format!("{}:/usr/sbin:/usr/bin:/sbin:/bin", self.bin.display()))
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let child = if inside { self.ns().spawn(name, cmd)? } else { process::spawn(name, cmd)? };
        self.components.push(child);
        Ok(())
    }

    fn containerd_socket(&self) -> PathBuf {
        self.dir.path().join("containerd/containerd.sock")
    }

    fn csi_socket(&self) -> PathBuf {
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
        let program = self.bin.join("containerd");
        self.spawn(
            "containerd",
            &program,
            &["--config".into(), config.display().to_string()],
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
        let program = self.bin.join("hostpathplugin");
        self.spawn(
            "hostpathplugin",
            &program,
            &[
                format!("--endpoint=unix://{}", sock.display()),
                format!("--drivername={DRIVER}"),
                format!("--nodeid={NODE_NAME}"),
                format!("--statedir={}", state.display()),
                "--v=3".into(),
            ],
            true,
        )?;
        wait_for("the CSI driver's socket", Duration::from_secs(30), || sock.exists()).await?;
        let program = self.bin.join("csi-node-driver-registrar");
        self.spawn(
            "node-driver-registrar",
            &program,
            &[
                format!("--csi-address={}", sock.display()),
                format!("--kubelet-registration-path={}", sock.display()),
                format!("--plugin-registration-path={KUBELET_ROOT}/plugins_registry"),
            ],
            true,
        )?;
        Ok(())
    }

    /// Controllers and CSI sidecars: host processes talking to the API server on loopback and
    /// to the driver through its socket.
    fn start_controllers(&mut self) -> anyhow::Result<()> {
        let kubeconfig = self.cp.kubeconfig().display().to_string();
        let sock = self.csi_socket().display().to_string();
        let kcm_port = process::free_port()?;
        let scheduler_port = process::free_port()?;
        let program = self.bin.join("kube-controller-manager");
        self.spawn(
            "kube-controller-manager",
            &program,
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
            false,
        )?;
        let program = self.bin.join("kube-scheduler");
        self.spawn(
            "kube-scheduler",
            &program,
            &[
                format!("--kubeconfig={kubeconfig}"),
                format!("--authentication-kubeconfig={kubeconfig}"),
                format!("--authorization-kubeconfig={kubeconfig}"),
                "--leader-elect=false".into(),
                "--bind-address=127.0.0.1".into(),
                format!("--secure-port={scheduler_port}"),
                "--v=1".into(),
            ],
            false,
        )?;
        let program = self.bin.join("snapshot-controller");
        self.spawn(
            "snapshot-controller",
            &program,
            &[
                format!("--kubeconfig={kubeconfig}"),
                "--leader-election=false".into(),
                "--v=2".into(),
            ],
            false,
        )?;
        let program = self.bin.join("csi-provisioner");
        self.spawn(
            "csi-provisioner",
            &program,
            &[
                format!("--csi-address={sock}"),
                format!("--kubeconfig={kubeconfig}"),
                "--leader-election=false".into(),
                "--extra-create-metadata".into(),
                "--timeout=60s".into(),
                "--v=2".into(),
            ],
            false,
        )?;
        let program = self.bin.join("csi-snapshotter");
        self.spawn(
            "csi-snapshotter",
            &program,
            &[
                format!("--csi-address={sock}"),
                format!("--kubeconfig={kubeconfig}"),
                "--leader-election=false".into(),
                "--extra-create-metadata".into(),
                "--timeout=60s".into(),
                "--v=2".into(),
            ],
            false,
        )?;
        Ok(())
    }

    async fn install_cluster_objects(&self) -> anyhow::Result<()> {
        let client = self.cp.client()?;
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

    fn start_kubelet(&mut self) -> anyhow::Result<()> {
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
        let program = self.bin.join("kubelet");
        let args = [
            format!("--config={}", config.display()),
            format!("--kubeconfig={}", self.kubelet_kubeconfig.display()),
            format!("--root-dir={KUBELET_ROOT}"),
            format!("--hostname-override={NODE_NAME}"),
            format!("--node-ip={NODE_IP}"),
            "--v=2".into(),
        ];
        self.spawn("kubelet", &program, &args, true)
    }

    async fn wait_node_ready(&mut self) -> anyhow::Result<()> {
        let client = self.cp.client()?;
        let nodes: Api<Node> = Api::all(client.clone());
        let csinodes: Api<CSINode> = Api::all(client);
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            for c in &mut self.components {
                if !c.is_running() {
                    bail!("{} exited while the node started", c.name());
                }
            }
            let ready = nodes.get_opt(NODE_NAME).await?.is_some_and(|n| {
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
                .get_opt(NODE_NAME)
                .await?
                .is_some_and(|c| c.spec.drivers.iter().any(|d| d.name == DRIVER));
            if ready && driver {
                return Ok(());
            }
            if Instant::now() > deadline {
                bail!(
                    "node {NODE_NAME} not Ready with CSI driver {DRIVER} after {READY_TIMEOUT:?} (Ready: {ready}, driver registered: {driver})"
                );
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
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

    /// A path on the node, as its processes (and pods' hostPath volumes) see it.
    #[must_use]
    pub fn node_path(&self, inside: &Path) -> PathBuf {
        self.ns().path(inside)
    }

    /// Makes `host_port` on the host's loopback reachable from the node and its pods at
    /// `NODE_IP:host_port` (for an S3 server the tests started).
    ///
    /// # Errors
    /// The port cannot be bound in the node's network namespace.
    pub fn expose_host_port(&self, host_port: u16) -> anyhow::Result<Forwarder> {
        self.relay_host_port(host_port, host_port)
    }

    /// Makes `host_port` on the host's loopback reachable from the node and its pods at
    /// `NODE_IP:node_port`: a second way to the same server, with a [`Forwarder::gate`] of
    /// its own.
    ///
    /// # Errors
    /// The port cannot be bound in the node's network namespace.
    pub fn relay_host_port(&self, node_port: u16, host_port: u16) -> anyhow::Result<Forwarder> {
        let listener = self.ns().listen(SocketAddr::new(NODE_IP.parse()?, node_port))?;
        Forwarder::start(vec![(listener, SocketAddr::new(Ipv4Addr::LOCALHOST.into(), host_port))])
    }

    /// A TCP connection to an address inside the node's network (a pod's IP).
    ///
    /// # Errors
    /// Nothing accepted the connection.
    pub fn connect(&self, addr: SocketAddr) -> anyhow::Result<std::net::TcpStream> {
        self.ns().connect(addr)
    }

    /// Installs Ferry as a user does: an image of `binary` (see [`crate::image`]) imported into
    /// the node's containerd, and the chart `deploy/helm/ferry` rendered by `helm template`
    /// (with `values`, `KEY=VALUE` as `--set` takes them) and applied. Waits until the agent's
    /// pod is Ready on the node. Returns the image's name.
    ///
    /// # Errors
    /// The image, helm, the chart or the apply failed, or the agent was not Ready within 120 s
    /// (the error carries the pod's state).
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
        let out = cmd.stdin(Stdio::null()).output().context("running helm template")?;
        if !out.status.success() {
            bail!("helm template failed: {}", String::from_utf8_lossy(&out.stderr));
        }
        let client = self.client()?;
        crate::apply::apply_yaml(&client, &String::from_utf8(out.stdout)?).await?;
        self.wait_agent_ready(&client).await?;
        Ok(image)
    }

    /// Waits (up to 120 s) until the agent DaemonSet's pod on the node is Ready.
    ///
    /// # Errors
    /// Not Ready in time; the error carries the pod's phase and container states.
    pub async fn wait_agent_ready(&self, client: &kube::Client) -> anyhow::Result<()> {
        use k8s_openapi::api::core::v1::Pod;
        let pods: Api<Pod> = Api::namespaced(client.clone(), crate::VELERO_NAMESPACE);
        let params = kube::api::ListParams::default()
            .labels("app.kubernetes.io/name=ferry,app.kubernetes.io/component=agent");
        let deadline = Instant::now() + READY_TIMEOUT;
        loop {
            let list = pods.list(&params).await?;
            let ready = list.items.iter().any(|p| {
                p.metadata.deletion_timestamp.is_none()
                    && p.status.as_ref().and_then(|s| s.conditions.as_ref()).is_some_and(|cs| {
                        cs.iter().any(|c| c.type_ == "Ready" && c.status == "True")
                    })
            });
            if ready {
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
                bail!("Ferry's agent not Ready after {READY_TIMEOUT:?}: {}", states.join("; "));
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// PIDs of the processes the cluster started (the node's components, the namespaces'
    /// first process and the control plane).
    #[must_use]
    pub fn pids(&self) -> Vec<u32> {
        let mut pids: Vec<u32> = self.components.iter().map(Guarded::pid).collect();
        pids.extend(self.namespaces.as_ref().map(NodeNamespaces::init_pid));
        pids.extend(self.cp.pids());
        pids
    }

    /// The kubelet's cgroup root (a folder of that name in every cgroup hierarchy).
    #[must_use]
    pub fn cgroup(&self) -> &str {
        &self.cgroup
    }

    /// The folder holding the node's files and the components' logs (`logs/`).
    #[must_use]
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// A kubeconfig for programs inside the node: the API server at the `kubernetes` Service,
    /// verified with the cluster's CA, admin rights.
    #[must_use]
    pub fn node_kubeconfig(&self) -> &Path {
        &self.kubelet_kubeconfig
    }

    /// Starts `cmd` inside the node's namespaces (as a pod's process sees the network and the
    /// mounts); it dies with the test binary, and with the node.
    ///
    /// # Errors
    /// The spawn failed.
    pub fn spawn_inside(&self, name: &str, cmd: Command) -> anyhow::Result<Guarded> {
        self.ns().spawn(name, cmd)
    }

    /// Where the CSI hostpath driver keeps the file-system volume `handle` (a folder of the
    /// host), for reading a volume as it is without a pod.
    #[must_use]
    pub fn hostpath_volume(&self, handle: &str) -> PathBuf {
        self.dir.path().join("hostpath").join(handle)
    }

    /// A kubeconfig for the cluster's API server on the host's loopback.
    #[must_use]
    pub fn kubeconfig(&self) -> &Path {
        self.cp.kubeconfig()
    }

    /// The last lines of every component's log.
    #[must_use]
    pub fn log_tail(&self) -> String {
        let logs = self.dir.path().join("logs");
        let mut out = String::new();
        let mut files: Vec<_> =
            std::fs::read_dir(&logs).into_iter().flatten().flatten().map(|e| e.path()).collect();
        files.sort();
        for file in files {
            let text = std::fs::read_to_string(&file).unwrap_or_default();
            let lines: Vec<_> = text.lines().rev().take(12).collect();
            out.push_str(&format!("--- {}\n", file.display()));
            for l in lines.into_iter().rev() {
                out.push_str(l);
                out.push('\n');
            }
        }
        out
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

    /// Removes what outlives the node's processes: loop devices backed by its files and the
    /// kubelet's cgroups.
    fn release(&mut self) {
        self.forwarder = None;
        while let Some(mut c) = self.components.pop() {
            c.stop();
        }
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

impl Drop for RealCluster {
    fn drop(&mut self) {
        self.release();
    }
}

/// Detaches the loop devices backed by files under `$1` (the CSI driver's block volumes) and
/// the loop devices the kubelet made to hold those open (their backing file is the device node
/// itself: same device number and inode as `/dev/loopN`), then removes the cgroup `$2`
/// (deepest first) in every hierarchy; bounded retries while killed processes finish exiting.
///
/// A backing file is matched by the folder's own name, not its whole path: once the node's
/// mounts are gone, the kernel names a file relative to the mount it is on (a tmpfs `/tmp`).
const CLEANUP: &str = r#"dir="$1"; cg="$2"
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

/// A detached janitor that, once this process has exited, runs [`CLEANUP`] and removes `dir`
/// (checked once a second, for at most a day).
fn janitor(dir: &Path, cgroup: &str) -> anyhow::Result<()> {
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

fn write_file(path: &Path, contents: impl AsRef<[u8]>) -> anyhow::Result<()> {
    std::fs::write(path, contents).with_context(|| format!("writing {}", path.display()))
}

fn make_dir(path: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(path).with_context(|| format!("creating {}", path.display()))
}

/// `path` quoted for `sh`.
fn quoted(path: &Path) -> String {
    format!("'{}'", path.display().to_string().replace('\'', r"'\''"))
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

async fn wait_for(
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
