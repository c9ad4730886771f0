//! One test's world: the shared control plane, a node simulator with three nodes, a moto
//! bucket behind a BackupStorageLocation, and `ferry agent` processes, one per node, each
//! handling a data mover name of its own so tests sharing the API server never see each
//! other's CRs.

use std::collections::BTreeMap;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::{ConfigMap, PersistentVolumeClaim, Pod, Secret};
use ferry_api::k8s_openapi::api::events::v1::Event;
use ferry_api::{DataDownload, DataUpload, VolumeSnapshot, VolumeSnapshotContent};
use ferry_sim::{Binding, NodeSim, SimConfig, VolumeMode};
use ferry_testbed::process::{self, Guarded};
use ferry_testbed::{ControlPlane, S3Server, VELERO_NAMESPACE};
use kube::api::{Api, ListParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;

use crate::velero_crs::{self, Classes, Mover};

pub type TestResult = Result<(), Box<dyn std::error::Error>>;

/// The bound on every wait in these tests: generous, since the machine may be loaded.
pub const WAIT: Duration = Duration::from_secs(180);

pub struct World {
    pub client: Client,
    pub ns: String,
    pub sim: Option<NodeSim>,
    pub mover: String,
    pub bsl: String,
    pub agents: BTreeMap<String, Guarded>,
    pub logs: tempfile::TempDir,
    /// Arguments every agent gets besides the harness's own.
    pub agent_args: Vec<String>,
    /// A second namespace the simulator serves (when [`Setup::second_namespace`]).
    pub ns2: Option<String>,
    /// The agents' `FERRY_LOG`.
    pub log_filter: String,
}

/// What a test changes in its world.
#[derive(Default)]
pub struct Setup {
    /// Extra labels of the first, second, third node.
    pub node_labels: Vec<BTreeMap<String, String>>,
    /// Velero's node-agent configuration (the JSON of the ConfigMap's one key); the agents
    /// are started with `--config-map` naming it.
    pub node_agent_config: Option<serde_json::Value>,
    /// Whether the simulator also serves a second namespace (a restore target).
    pub second_namespace: bool,
    /// The agents' log filter instead of the harness's (`info`, dependencies at `warn`).
    pub log_filter: Option<&'static str>,
}

fn suffix() -> String {
    let n = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
        ^ std::process::id().rotate_left(16);
    format!("{n:08x}")
}

impl World {
    fn mover(&self) -> Mover<'_> {
        Mover { datamover: &self.mover, bsl: &self.bsl }
    }

    /// Starts everything with one agent per simulated node.
    pub async fn start(prefix: &str) -> Result<Self, Box<dyn std::error::Error>> {
        Self::start_with(prefix, Setup::default()).await
    }

    /// As [`World::start`], changed as `setup` says.
    pub async fn start_with(
        prefix: &str,
        setup: Setup,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        ferry_testbed::install_crypto_provider();
        let cp = ControlPlane::shared();
        let client = cp.client()?;
        let ns = cp.unique_namespace(prefix).await?;
        let mut config = SimConfig { namespaces: vec![ns.clone()], ..SimConfig::default() };
        let ns2 = if setup.second_namespace {
            let ns2 = cp.unique_namespace(&format!("{prefix}-to")).await?;
            config.namespaces.push(ns2.clone());
            Some(ns2)
        } else {
            None
        };
        if !setup.node_labels.is_empty() {
            config.nodes = ["a", "b", "c"].map(|n| format!("{ns}-{n}")).to_vec();
            config.node_labels = config.nodes.iter().cloned().zip(setup.node_labels).collect();
        }
        let sim = NodeSim::start(client.clone(), config).await?;
        let id = suffix();
        let mut agent_args = Vec::new();
        if let Some(json) = &setup.node_agent_config {
            let name = format!("node-agent-{id}");
            let maps: Api<ConfigMap> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
            let map: ConfigMap = serde_json::from_value(json!({
                "metadata": { "name": name, "namespace": VELERO_NAMESPACE },
                "data": { "node-agent-config": json.to_string() },
            }))?;
            maps.create(&PostParams::default(), &map).await?;
            agent_args = vec!["--config-map".to_owned(), name];
        }
        let mover = format!("ferry-{id}");
        let bsl = format!("bsl-{id}");
        let bucket = format!("e2e-{id}");
        let s3 = S3Server::shared();
        s3.create_bucket(&bucket)?;
        velero_crs::create_bsl(
            &client,
            &bsl,
            &bucket,
            s3.endpoint(),
            ("ferry-e2e", "ferry-e2e-secret"),
            &format!("{bsl}-credentials"),
        )
        .await?;
        let mut world = Self {
            client,
            ns,
            sim: Some(sim),
            mover,
            bsl,
            agents: BTreeMap::new(),
            logs: tempfile::tempdir()?,
            agent_args,
            ns2,
            log_filter: setup
                .log_filter
                .unwrap_or("info,kube=warn,tower=warn,hyper=warn,aws=warn")
                .to_owned(),
        };
        for node in world.sim().nodes() {
            world.start_agent(&node)?;
        }
        Ok(world)
    }

    pub fn sim(&self) -> &NodeSim {
        self.sim.as_ref().expect("simulator running")
    }

    /// Starts (or restarts) the agent of `node`.
    pub fn start_agent(&mut self, node: &str) -> Result<(), Box<dyn std::error::Error>> {
        let root = self.sim().kubelet_root(node)?;
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(self.logs.path().join(format!("{node}.log")))?;
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
        cmd.args(["agent", "--node-name", node, "--namespace", VELERO_NAMESPACE])
            .args(["--data-mover", &self.mover, "--pod-image", "ferry:e2e"])
            .arg("--kubelet-root")
            .arg(&root)
            .args(["--progress-interval", "1s", "--lease-duration", "6s"])
            .args(["--unschedulable-grace", "20s", "--concurrency", "2"])
            .args(["--metrics-address", "127.0.0.1:0", "--deletion-interval", "2s"])
            // A repository cache per node, kept across the agent's restarts as on a node.
            .arg("--cache-dir")
            .arg(self.logs.path().join(format!("cache-{node}")))
            .args(["--cache-size-mib", "64"])
            .args(&self.agent_args)
            .env("KUBECONFIG", ControlPlane::shared().kubeconfig())
            .env("FERRY_LOG", &self.log_filter)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .stdout(log.try_clone()?)
            .stderr(log);
        let agent = process::spawn(&format!("ferry agent {node}"), cmd)?;
        self.agents.insert(node.to_owned(), agent);
        Ok(())
    }

    /// The files in the repository cache of `node`'s agent.
    pub fn cached_files(&self, node: &str) -> Vec<String> {
        fn walk(dir: &std::path::Path, out: &mut Vec<String>) {
            for entry in std::fs::read_dir(dir).into_iter().flatten().flatten() {
                let path = entry.path();
                if path.is_dir() {
                    walk(&path, out);
                } else {
                    out.push(path.display().to_string());
                }
            }
        }
        let mut out = Vec::new();
        walk(&self.logs.path().join(format!("cache-{node}")), &mut out);
        out
    }

    /// Kills the agent of `node` with SIGKILL (no chance to clean up) and reaps it.
    pub fn kill_agent(&mut self, node: &str) {
        if let Some(mut agent) = self.agents.remove(node) {
            agent.stop();
        }
    }

    /// Every agent's log, for failure messages.
    pub fn agent_logs(&self) -> String {
        let mut out = String::new();
        for node in self.agents.keys() {
            let text = std::fs::read_to_string(self.logs.path().join(format!("{node}.log")))
                .unwrap_or_default();
            let tail: Vec<&str> = text.lines().rev().take(40).collect();
            out.push_str(&format!("--- agent {node} (last 40 lines)\n"));
            for line in tail.into_iter().rev() {
                out.push_str(line);
                out.push('\n');
            }
        }
        out
    }

    /// A PVC of `size` in the test namespace holding `tree`, and a ready VolumeSnapshot of it.
    pub async fn volume_with_snapshot(
        &self,
        pvc: &str,
        size: &str,
        tree: &ferry_sim::FsTree,
    ) -> Result<VolumeSnapshot, Box<dyn std::error::Error>> {
        let sim = self.sim();
        sim.create_pvc(&self.ns, pvc, size, VolumeMode::Filesystem, Binding::Immediate).await?;
        sim.write_files(&self.ns, pvc, tree).await?;
        let vs_name = format!("{pvc}-snap");
        sim.snapshot_pvc(&self.ns, pvc, &vs_name).await?;
        Ok(sim.wait_snapshot_ready(&self.ns, &vs_name, WAIT).await?)
    }

    /// A block-mode PVC of `size` holding `data` at `offset`, and a ready snapshot of it.
    pub async fn block_volume_with_snapshot(
        &self,
        pvc: &str,
        size: &str,
        offset: u64,
        data: &[u8],
    ) -> Result<VolumeSnapshot, Box<dyn std::error::Error>> {
        let sim = self.sim();
        sim.create_pvc(&self.ns, pvc, size, VolumeMode::Block, Binding::Immediate).await?;
        sim.write_block(&self.ns, pvc, offset, data).await?;
        let vs_name = format!("{pvc}-snap");
        sim.snapshot_pvc(&self.ns, pvc, &vs_name).await?;
        Ok(sim.wait_snapshot_ready(&self.ns, &vs_name, WAIT).await?)
    }

    /// A DataUpload exactly as Velero's CSI plugin creates it for backup `backup`.
    pub async fn create_data_upload(
        &self,
        backup: &str,
        pvc: &str,
        snapshot: &str,
    ) -> Result<DataUpload, Box<dyn std::error::Error>> {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), &self.ns);
        let source = pvcs.get(pvc).await?;
        let backup_uid = format!("{}-0000-4000-8000-000000000001", suffix());
        let classes = Classes {
            storage_class: self.sim().storage_class(Binding::Immediate),
            snapshot_class: self.sim().snapshot_class(),
            driver: self.sim().driver(),
        };
        let du = velero_crs::data_upload(
            &self.mover(),
            &classes,
            backup,
            &backup_uid,
            &source,
            snapshot,
        )?;
        let api: Api<DataUpload> = Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        Ok(api.create(&PostParams::default(), &du).await?)
    }

    /// A target PVC as Velero's restore leaves it (no volumeName, the dynamic-pv-restore
    /// selector), and a DataDownload for it exactly as Velero's CSI plugin creates it.
    pub async fn create_data_download(
        &self,
        restore: &str,
        target_ns: &str,
        target: &str,
        size: &str,
        from: &DataUpload,
    ) -> Result<DataDownload, Box<dyn std::error::Error>> {
        self.create_data_download_in_mode(restore, target_ns, target, size, from, "Filesystem")
            .await
    }

    /// As [`World::create_data_download`], for a target PVC of `mode` (`Filesystem`/`Block`).
    pub async fn create_data_download_in_mode(
        &self,
        restore: &str,
        target_ns: &str,
        target: &str,
        size: &str,
        from: &DataUpload,
        mode: &str,
    ) -> Result<DataDownload, Box<dyn std::error::Error>> {
        self.create_target_pvc(target_ns, target, size, mode, Binding::Immediate).await?;
        self.create_data_download_for(restore, target_ns, target, from).await
    }

    /// A target PVC as Velero's restore leaves it (no volumeName, the dynamic-pv-restore
    /// selector) in the simulator's class for `binding`.
    pub async fn create_target_pvc(
        &self,
        target_ns: &str,
        target: &str,
        size: &str,
        mode: &str,
        binding: Binding,
    ) -> Result<PersistentVolumeClaim, Box<dyn std::error::Error>> {
        let selector = format!("{target_ns}.{target}.{}", &suffix()[..6]);
        let class = self.sim().storage_class(binding);
        let pvc = velero_crs::target_pvc(target_ns, target, size, mode, class, &selector)?;
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), target_ns);
        Ok(pvcs.create(&PostParams::default(), &pvc).await?)
    }

    /// A DataDownload restoring `from` into the existing PVC `target_ns/target`, exactly as
    /// Velero's CSI plugin creates it.
    pub async fn create_data_download_for(
        &self,
        restore: &str,
        target_ns: &str,
        target: &str,
        from: &DataUpload,
    ) -> Result<DataDownload, Box<dyn std::error::Error>> {
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), target_ns);
        let pvc = pvcs.get(target).await?;
        let restore_uid = format!("{}-0000-4000-8000-000000000002", suffix());
        let dd = velero_crs::data_download(&self.mover(), restore, &restore_uid, &pvc, from)?;
        let api: Api<DataDownload> = Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        Ok(api.create(&PostParams::default(), &dd).await?)
    }

    /// The Events Ferry's agents published on the CR `name` in Velero's namespace, as
    /// `(reason, note, count)` (a repeated Event counts each occurrence of its series).
    pub async fn ferry_events(
        &self,
        name: &str,
    ) -> Result<Vec<(String, String, i32)>, Box<dyn std::error::Error>> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        let list = api.list(&ListParams::default()).await?;
        Ok(list
            .items
            .into_iter()
            .filter(|e| e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name))
            .filter(|e| e.reporting_controller.as_deref() == Some("ferry-agent"))
            .map(|e| {
                let count = e.series.as_ref().map_or(1, |s| s.count);
                (e.reason.unwrap_or_default(), e.note.unwrap_or_default(), count)
            })
            .collect())
    }

    /// The note of the agents' first `reason` Event on CR `name`, waiting (bounded) for it.
    pub async fn event_note(
        &self,
        name: &str,
        reason: &str,
    ) -> Result<String, Box<dyn std::error::Error>> {
        let start = std::time::Instant::now();
        loop {
            let events = self.ferry_events(name).await?;
            if let Some((_, note, _)) = events.iter().find(|(r, _, _)| r == reason) {
                return Ok(note.clone());
            }
            if start.elapsed() > Duration::from_secs(30) {
                return Err(format!("no {reason} event on {name}: {events:?}").into());
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
    }

    /// Ferry's objects for CR `name` still present (pods, PVCs, VolumeSnapshots in Velero's
    /// namespace, VolumeSnapshotContents), after giving deletion up to 20 s to finish.
    pub async fn leftovers_of(&self, name: &str) -> Result<Vec<String>, kube::Error> {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        let pvcs: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        let snaps: Api<VolumeSnapshot> = Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        let contents: Api<VolumeSnapshotContent> = Api::all(self.client.clone());
        let mut left = Vec::new();
        for _ in 0..100 {
            left.clear();
            if pods.get_opt(name).await?.is_some() {
                left.push(format!("pod {name}"));
            }
            if pvcs.get_opt(name).await?.is_some() {
                left.push(format!("PVC {name}"));
            }
            if snaps.get_opt(name).await?.is_some() {
                left.push(format!("VolumeSnapshot {name}"));
            }
            if contents.get_opt(name).await?.is_some() {
                left.push(format!("VolumeSnapshotContent {name}"));
            }
            if left.is_empty() {
                break;
            }
            tokio::time::sleep(Duration::from_millis(200)).await;
        }
        Ok(left)
    }

    /// Runs `ferry ARGS` with this world's repository (`--repo` of the BSL's repository for
    /// the test namespace, its password, moto) and cluster (KUBECONFIG).
    pub async fn ferry_with_repo(
        &self,
        args: &[&str],
    ) -> Result<std::process::Output, Box<dyn std::error::Error>> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        let secret = secrets.get(ferry_mover::PASSWORD_SECRET).await?;
        let password = secret
            .data
            .and_then(|d| d.get(ferry_mover::PASSWORD_KEY).cloned())
            .ok_or("Ferry's password secret has no repository-password")?;
        let dir = tempfile::tempdir()?;
        let password_file = dir.path().join("password");
        std::fs::write(&password_file, &password.0)?;
        let bucket = self.mover.replacen("ferry-", "e2e-", 1);
        Ok(tokio::process::Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(args)
            .arg("--repo")
            .arg(format!("s3://{bucket}/{}", ferry_mover::repository_prefix("velero", &self.ns)))
            .arg("--password-file")
            .arg(&password_file)
            .args(["--s3-endpoint", S3Server::shared().endpoint(), "--s3-region", "us-east-1"])
            // What the bucket holds, not a copy in the user's cache folder.
            .arg("--no-cache")
            .env("AWS_ACCESS_KEY_ID", "ferry-e2e")
            .env("AWS_SECRET_ACCESS_KEY", "ferry-e2e-secret")
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .env("KUBECONFIG", ControlPlane::shared().kubeconfig())
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .output()
            .await?)
    }

    /// The snapshots in this world's repository for the source namespace, listed by
    /// `ferry snapshots --json` (each a JSON object with `id`, `tags`, ...).
    pub async fn repo_snapshots(
        &self,
    ) -> Result<Vec<serde_json::Value>, Box<dyn std::error::Error>> {
        let out = self.ferry_with_repo(&["snapshots", "--json"]).await?;
        if !out.status.success() {
            return Err(format!(
                "ferry snapshots failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// Polls CR `name` until `done` says so; fails with the agents' logs after [`WAIT`].
    pub async fn wait_for<K, F>(&self, name: &str, what: &str, done: F) -> Result<K, String>
    where
        K: kube::Resource<DynamicType = (), Scope = kube::core::NamespaceResourceScope>
            + Clone
            + std::fmt::Debug
            + serde::de::DeserializeOwned,
        F: Fn(&K) -> bool,
    {
        let api: Api<K> = Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        let start = Instant::now();
        let mut last = None;
        while start.elapsed() < WAIT {
            if let Ok(obj) = api.get(name).await {
                if done(&obj) {
                    return Ok(obj);
                }
                last = Some(obj);
            }
            tokio::time::sleep(Duration::from_millis(250)).await;
        }
        let last = last.map(|mut o| {
            o.meta_mut().managed_fields = None;
            o
        });
        Err(format!(
            "{name} never became {what}; last seen: {last:#?}\n{}\n{}",
            self.velero_namespace_state().await,
            self.agent_logs()
        ))
    }

    /// Pods and PVCs in Velero's namespace, a line each: what a stuck exposure waits on.
    pub async fn velero_namespace_state(&self) -> String {
        let pods: Api<Pod> = Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        let pvcs: Api<PersistentVolumeClaim> =
            Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        let mut out = String::from("--- Velero's namespace\n");
        match pods.list(&ListParams::default()).await {
            Ok(list) => {
                for pod in list.items {
                    let spec = pod.spec.clone().unwrap_or_default();
                    let status = pod.status.clone().unwrap_or_default();
                    let conditions: Vec<String> = status
                        .conditions
                        .unwrap_or_default()
                        .into_iter()
                        .map(|c| {
                            let why = c.message.unwrap_or_default();
                            format!("{}={} {why}", c.type_, c.status)
                        })
                        .collect();
                    out.push_str(&format!(
                        "pod {} node={:?} phase={:?} deleting={} conditions={conditions:?}\n",
                        pod.name_any(),
                        spec.node_name,
                        status.phase,
                        pod.metadata.deletion_timestamp.is_some()
                    ));
                }
            }
            Err(e) => out.push_str(&format!("listing pods: {e}\n")),
        }
        match pvcs.list(&ListParams::default()).await {
            Ok(list) => {
                for pvc in list.items {
                    out.push_str(&format!(
                        "pvc {} volume={:?} phase={:?} annotations={:?}\n",
                        pvc.name_any(),
                        pvc.spec.as_ref().and_then(|s| s.volume_name.clone()),
                        pvc.status.as_ref().and_then(|s| s.phase.clone()),
                        pvc.metadata.annotations.unwrap_or_default()
                    ));
                }
            }
            Err(e) => out.push_str(&format!("listing PVCs: {e}\n")),
        }
        out
    }

    /// Stops the agents and the simulator (removing every mount and loop device).
    pub async fn shutdown(mut self) -> TestResult {
        for agent in self.agents.values_mut() {
            agent.stop();
        }
        if let Some(sim) = self.sim.take() {
            sim.shutdown().await?;
        }
        Ok(())
    }
}

/// A tree of `files` pseudo-random files of `mib` MiB each (incompressible, unique per seed).
pub fn big_tree(files: usize, mib: usize, seed: u64) -> ferry_sim::FsTree {
    let mut tree = ferry_sim::FsTree::default();
    let mut x = seed | 1;
    for i in 0..files {
        let mut data = Vec::with_capacity(mib << 20);
        while data.len() < mib << 20 {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            data.extend_from_slice(&x.to_le_bytes());
        }
        tree.entries.insert(
            format!("blob-{i}").into(),
            ferry_sim::FsEntry {
                kind: ferry_sim::FsKind::File(data),
                mode: 0o644,
                uid: 0,
                gid: 0,
                mtime: 1_700_000_000,
            },
        );
    }
    tree
}

pub fn du_phase(du: &DataUpload) -> Option<ferry_api::DataUploadPhase> {
    du.status.as_ref().and_then(|s| s.phase)
}

pub fn dd_phase(dd: &DataDownload) -> Option<ferry_api::DataDownloadPhase> {
    dd.status.as_ref().and_then(|s| s.phase)
}

pub fn du_terminal(du: &DataUpload) -> bool {
    du_phase(du).is_some_and(ferry_api::DataUploadPhase::is_terminal)
}

pub fn dd_terminal(dd: &DataDownload) -> bool {
    dd_phase(dd).is_some_and(ferry_api::DataDownloadPhase::is_terminal)
}
