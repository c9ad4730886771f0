//! The demo's cluster: a real node (kubelet, containerd, the CSI hostpath driver; see
//! `ferry_testbed::realnode`) with Ferry installed from its chart, or, where that node cannot
//! start, a control plane with the node simulator and one `ferry agent` per simulated node;
//! moto or MinIO; the real `velero server`. Every part is owned here and torn down by
//! [`World::teardown`] (or by the parts' own `Drop` guards when the process unwinds); children
//! spawned through `ferry_testbed::process` also die with the demo when it is killed.

use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::Duration;

use anyhow::Context;
use ferry_api::VolumeSnapshotClass;
use ferry_sim::velero::{S3Location, Velero};
use ferry_sim::{NodeSim, SimConfig};
use ferry_testbed::netns::Forwarder;
use ferry_testbed::process::{self, Guarded};
use ferry_testbed::realnode::{self, RealCluster};
use ferry_testbed::velero::{VeleroOptions, VeleroServer};
use ferry_testbed::{ControlPlane, S3Server, VELERO_NAMESPACE};
use kube::api::{Api, Patch, PatchParams};

/// The data mover name, as in `velero install --use-node-agent` with Ferry.
pub const DATA_MOVER: &str = "ferry";
/// The BackupStorageLocation (Velero's default one).
pub const BSL: &str = "default";
/// The BSL's prefix in the bucket.
pub const PREFIX: &str = "velero";
/// The bucket in moto.
pub const BUCKET: &str = "velero-backups";
/// The static S3 credentials (moto accepts any).
pub const ACCESS_KEY: &str = "ferry-demo";
/// The secret key.
pub const SECRET_KEY: &str = "ferry-demo-secret";

/// Everything running; parts are `None` until started and after teardown.
#[derive(Debug, Default)]
pub struct World {
    /// The real node with its control plane (the default).
    pub node: Option<RealCluster>,
    /// S3 as the node reaches it.
    relay: Option<Forwarder>,
    /// The control plane of the simulator's world.
    pub cp: Option<ControlPlane>,
    pub s3: Option<S3Server>,
    pub sim: Option<NodeSim>,
    pub agents: Vec<(String, Guarded)>,
    pub namespace: String,
    /// Where the restore puts the application (`--namespace-mappings`).
    pub restore_namespace: String,
    pub logs: Option<tempfile::TempDir>,
    pub velero_server: Option<VeleroServer>,
}

impl World {
    pub fn cp(&self) -> anyhow::Result<&ControlPlane> {
        match &self.node {
            Some(node) => Ok(node.control_plane()),
            None => self.cp.as_ref().context("the control plane is not running"),
        }
    }

    /// The real node, when the demo runs on one.
    pub fn real(&self) -> Option<&RealCluster> {
        self.node.as_ref()
    }

    /// Starts the real node with its control plane and Velero's CRDs.
    pub async fn start_real_node(&mut self) -> anyhow::Result<&RealCluster> {
        let node = RealCluster::start().await?;
        ferry_testbed::velero::install_crds(node.control_plane())
            .context("installing Velero's CRDs")?;
        let namespace = node.control_plane().unique_namespace("shop").await?;
        self.restore_namespace = format!("{namespace}-restored");
        self.namespace = namespace;
        Ok(self.node.insert(node))
    }

    /// Installs Ferry from its chart on the real node, as an image of `ferry`.
    pub async fn install_ferry(&mut self, ferry: &Path) -> anyhow::Result<String> {
        let node = self.node.as_ref().context("no real node")?;
        node.install_ferry(ferry, &["agent.extraArgs={--progress-interval,1s}"]).await
    }

    pub fn s3(&self) -> anyhow::Result<&S3Server> {
        self.s3.as_ref().context("the S3 server is not running")
    }

    pub fn sim(&self) -> anyhow::Result<&NodeSim> {
        self.sim.as_ref().context("the node simulator is not running")
    }

    pub fn client(&self) -> anyhow::Result<kube::Client> {
        self.cp()?.client()
    }

    /// Velero's side of things for this world.
    pub fn velero(&self) -> anyhow::Result<Velero> {
        Ok(Velero::new(self.client()?, VELERO_NAMESPACE, DATA_MOVER, BSL))
    }

    /// The repository the agents use for the demo namespace (under the BSL's `plugins/`).
    pub fn repository(&self) -> String {
        format!("s3://{BUCKET}/{}", ferry_mover::repository_prefix(PREFIX, &self.namespace))
    }

    /// The running Velero server.
    pub fn velero_server(&self) -> anyhow::Result<&VeleroServer> {
        self.velero_server.as_ref().context("the Velero server is not running")
    }

    /// A control plane with Velero's own CRDs of the pinned version.
    pub async fn start_control_plane(&mut self) -> anyhow::Result<&ControlPlane> {
        let cp = ControlPlane::start().await.context("starting the control plane")?;
        // If the demo is killed outright, its files still go once it is gone.
        process::remove_on_exit(cp.dir())?;
        ferry_testbed::velero::install_crds(&cp).context("installing Velero's CRDs")?;
        Ok(self.cp.insert(cp))
    }

    /// Starts the real `velero server` (with its AWS plugin) once the location exists, and
    /// labels the simulator's VolumeSnapshotClass for Velero's CSI support.
    pub async fn start_velero(&mut self) -> anyhow::Result<&VeleroServer> {
        let classes: Api<VolumeSnapshotClass> = Api::all(self.client()?);
        let class = match &self.node {
            Some(_) => realnode::SNAPSHOT_CLASS.to_owned(),
            None => self.sim()?.snapshot_class().to_owned(),
        };
        let label = serde_json::json!({"metadata": {"labels": {
            "velero.io/csi-volumesnapshot-class": "true"
        }}});
        classes.patch(&class, &PatchParams::default(), &Patch::Merge(&label)).await?;
        // Velero's own credentials, as `velero install --secret-file` mounts them.
        let options = VeleroOptions::with_credentials(ACCESS_KEY, SECRET_KEY);
        let server = match &self.node {
            Some(node) => VeleroServer::start_on_node(node, &options),
            None => VeleroServer::start(self.cp()?, &options),
        }
        .context("starting velero server")?;
        process::remove_on_exit(server.dir())?;
        Ok(self.velero_server.insert(server))
    }

    /// Starts moto, or MinIO from binary `minio`, with the demo's bucket.
    pub fn start_s3(&mut self, minio: Option<&Path>) -> anyhow::Result<&S3Server> {
        let s3 = match minio {
            Some(bin) => {
                // The S3 server stands for a remote object store: its objects go to memory
                // where there is a tmpfs, not to the disk the simulated volumes are on.
                let shm = Path::new("/dev/shm");
                let parent = if shm.is_dir() { shm.to_owned() } else { std::env::temp_dir() };
                S3Server::start_minio(bin, &parent, ACCESS_KEY, SECRET_KEY)
                    .with_context(|| format!("starting MinIO ({})", bin.display()))?
            }
            None => S3Server::start().context("starting moto")?,
        };
        if let Some(dir) = s3.data_dir() {
            // If the demo is killed outright, MinIO's files still go once it is gone.
            process::remove_on_exit(dir)?;
        }
        s3.create_bucket(BUCKET)?;
        if let Some(node) = &self.node {
            let port: u16 = s3.endpoint().rsplit(':').next().unwrap_or_default().parse()?;
            self.relay = Some(node.expose_host_port(port)?);
        }
        Ok(self.s3.insert(s3))
    }

    /// Starts the node simulator, keeping its files in `dir` (default: the temp folder).
    pub async fn start_sim(&mut self, dir: Option<&Path>) -> anyhow::Result<&NodeSim> {
        let namespace = self.cp()?.unique_namespace("shop").await?;
        self.namespace = namespace;
        self.restore_namespace = format!("{}-restored", self.namespace);
        let cp = self.cp()?;
        let mut config = SimConfig {
            namespaces: vec![self.namespace.clone(), self.restore_namespace.clone()],
            nodes: ["node-a", "node-b", "node-c"].map(String::from).to_vec(),
            ..SimConfig::default()
        };
        if let Some(dir) = dir {
            config.parent_dir = dir.to_path_buf();
        }
        let sim = NodeSim::start(cp.client()?, config).await.context("starting the simulator")?;
        Ok(self.sim.insert(sim))
    }

    pub async fn create_bsl(&self) -> anyhow::Result<()> {
        let endpoint = self.s3()?.endpoint();
        let endpoint = match &self.node {
            // Velero and the agents run on the node: they reach S3 through its relay.
            Some(_) => {
                let port = endpoint.rsplit(':').next().unwrap_or_default();
                format!("http://{}:{port}", realnode::NODE_IP)
            }
            None => endpoint.to_owned(),
        };
        let location = S3Location {
            bucket: BUCKET.into(),
            prefix: PREFIX.into(),
            endpoint,
            region: "us-east-1".into(),
            access_key: ACCESS_KEY.into(),
            secret_key: SECRET_KEY.into(),
        };
        self.velero()?.create_bsl(&location).await?;
        Ok(())
    }

    /// Starts `ferry agent` for every simulated node, logging to a file per node.
    pub fn start_agents(&mut self, ferry: &Path) -> anyhow::Result<()> {
        let logs = tempfile::Builder::new().prefix("ferry-demo-logs-").tempdir()?;
        let kubeconfig = self.cp()?.kubeconfig().to_owned();
        let sim = self.sim()?;
        let mut agents = Vec::new();
        for node in sim.nodes() {
            let log = std::fs::File::create(logs.path().join(format!("{node}.log")))?;
            let mut cmd = Command::new(ferry);
            cmd.args(["agent", "--node-name", &node, "--namespace", VELERO_NAMESPACE])
                .args(["--data-mover", DATA_MOVER, "--pod-image", "ferry:demo"])
                .arg("--kubelet-root")
                .arg(sim.kubelet_root(&node)?)
                .args(["--progress-interval", "1s", "--concurrency", "2"])
                .args(["--metrics-address", "127.0.0.1:0"])
                .env("KUBECONFIG", &kubeconfig)
                .env("FERRY_LOG", "info,kube=warn,tower=warn,hyper=warn,aws=warn")
                .env("AWS_EC2_METADATA_DISABLED", "true")
                .stdin(Stdio::null())
                .stdout(log.try_clone()?)
                .stderr(log);
            let agent = process::spawn(&format!("ferry agent {node}"), cmd)?;
            agents.push((node, agent));
        }
        self.agents = agents;
        self.logs = Some(logs);
        Ok(())
    }

    /// Agents that exited (they must run for the whole demo).
    pub fn dead_agents(&mut self) -> Vec<String> {
        let mut dead = Vec::new();
        for (node, agent) in &mut self.agents {
            if !agent.is_running() {
                dead.push(node.clone());
            }
        }
        dead
    }

    /// The last `lines` lines of every agent's log (on the real node: of its components).
    pub fn agent_logs(&self, lines: usize) -> String {
        if let Some(node) = &self.node {
            return node.log_tail();
        }
        let Some(dir) = &self.logs else { return String::new() };
        let mut out = String::new();
        for (node, _) in &self.agents {
            let text = std::fs::read_to_string(log_path(dir.path(), node)).unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(lines).collect();
            out.push_str(&format!("--- ferry agent on {node} (last {lines} lines)\n"));
            for line in tail.into_iter().rev() {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// Stops everything, in order: agents, simulator (unmounts, detaches loop devices, removes
    /// its objects), S3, control plane. Returns what could not be cleaned, if anything.
    pub async fn teardown(&mut self) -> Vec<String> {
        let mut problems = Vec::new();
        if let Some(mut velero) = self.velero_server.take() {
            velero.kill();
        }
        for (_, agent) in &mut self.agents {
            agent.stop();
        }
        self.agents.clear();
        self.relay = None;
        // Its drop stops every process and removes its mounts, loop devices and cgroups.
        self.node = None;
        if let Some(sim) = self.sim.take() {
            let dir = sim.dir().to_owned();
            match tokio::time::timeout(Duration::from_secs(90), sim.shutdown()).await {
                Ok(Ok(())) => {}
                Ok(Err(e)) => problems.push(format!("simulator shutdown: {e}")),
                // Dropping the shutdown future dropped the simulator: its Drop cleaned the host.
                Err(_) => problems.push("simulator shutdown timed out".into()),
            }
            let left = ferry_sim::janitor::leftovers_under(&dir);
            if !left.is_empty() {
                problems.push(format!("left on the host: {left:?}"));
            }
        }
        self.s3 = None;
        self.cp = None;
        self.logs = None;
        problems
    }
}

fn log_path(dir: &Path, node: &str) -> PathBuf {
    dir.join(format!("{node}.log"))
}
