//! The real Velero drives Ferry: `velero server` of the pinned version (built from the Go module
//! proxy by `scripts/build-velero.sh`), with Velero's own CRDs of that version and its AWS
//! plugin, a BackupStorageLocation on a real S3 server (moto), three `ferry agent`s on the node
//! simulator, and the `velero` CLI run as a user runs it:
//! `velero backup create --snapshot-move-data --data-mover ferry` and `velero restore create`.
//!
//! Every scenario checks that the storage location stays `Available` after Ferry has stored
//! into it (Velero validates the top-level folders under a location's prefix), and compares
//! what was restored with what was backed up. Velero here runs without Ferry's plugin: its own
//! CSI support creates the DataUploads and DataDownloads for the `ferry` mover.

use std::collections::BTreeSet;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use ferry_api::{
    BackupStorageLocation, DataDownload, DataUpload, DataUploadPhase, VolumeSnapshotClass,
};
use ferry_sim::{Binding, FsEntry, FsKind, FsTree, NodeSim, SimConfig, VolumeMode};
use ferry_store::{ObjectStore as _, S3Config, S3Options, S3Store, StaticCredentials};
use ferry_testbed::process::{self, Guarded};
use ferry_testbed::velero::{self, VeleroOptions, VeleroServer};
use ferry_testbed::{ControlPlane, S3Server, VELERO_NAMESPACE};
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams, PostParams};
use kube::{Client, ResourceExt};
use serde_json::json;
use tokio_util::sync::CancellationToken;

type TestResult = Result<(), Box<dyn std::error::Error>>;

/// Bound on every wait: generous, the machine may be loaded.
const WAIT: Duration = Duration::from_secs(300);
const BSL: &str = "default";
const ACCESS_KEY: &str = "ferry-velero";
const SECRET_KEY: &str = "ferry-velero-secret";

/// The folders Velero accepts at the top of a location's prefix.
const VELERO_TOP_LEVEL: [&str; 6] =
    ["backups", "restores", "restic", "metadata", "plugins", "kopia"];

/// One scenario's cluster: its own control plane (Velero's namespace is fixed, so one Velero
/// per API server), Velero's CRDs, a bucket, the simulator, one agent per node and Velero.
struct Cluster {
    // Field order is drop order: Velero and the agents stop before the simulator's volumes go
    // and before the control plane; the turn is given up last.
    velero: VeleroServer,
    agents: Vec<Guarded>,
    sim: Option<NodeSim>,
    client: Client,
    bucket: String,
    prefix: String,
    logs: tempfile::TempDir,
    namespaces: Vec<String>,
    cp: ControlPlane,
    _turn: tokio::sync::OwnedMutexGuard<()>,
}

/// One Velero server at a time: its controller manager always listens on port 8080 (Velero
/// v1.18 has no flag for it), so two would collide.
fn turn() -> std::sync::Arc<tokio::sync::Mutex<()>> {
    static TURN: std::sync::OnceLock<std::sync::Arc<tokio::sync::Mutex<()>>> =
        std::sync::OnceLock::new();
    TURN.get_or_init(Default::default).clone()
}

impl Cluster {
    /// Starts everything without Ferry's plugin; the simulator serves `namespaces`.
    async fn start(namespaces: &[&str]) -> Result<Self, Box<dyn std::error::Error>> {
        Self::start_with(namespaces, false).await
    }

    /// Starts everything; the simulator serves `namespaces` (created here). With
    /// `ferry_plugin`, Ferry's binary is in Velero's plugin folder as `velero-plugin-ferry`,
    /// as the chart's init container installs it.
    async fn start_with(
        namespaces: &[&str],
        ferry_plugin: bool,
    ) -> Result<Self, Box<dyn std::error::Error>> {
        ferry_testbed::install_crypto_provider();
        let turn = turn().lock_owned().await;
        let cp = ControlPlane::start().await?;
        // Its files go when the test binary does, however it ends.
        process::remove_on_exit(cp.dir())?;
        velero::install_crds(&cp)?;
        let client = cp.client()?;
        let mut created = Vec::new();
        for ns in namespaces {
            created.push(cp.unique_namespace(ns).await?);
        }
        let id = format!("{:08x}", std::process::id() ^ rand_u32());
        let bucket = format!("velero-{id}");
        let prefix = "cluster-a".to_owned();
        S3Server::shared().create_bucket(&bucket)?;
        create_location(&client, &bucket, &prefix).await?;
        let sim = NodeSim::start(
            client.clone(),
            SimConfig { namespaces: created.clone(), ..SimConfig::default() },
        )
        .await?;
        // Velero picks the VolumeSnapshotClass of a driver by this label.
        let classes: Api<VolumeSnapshotClass> = Api::all(client.clone());
        classes
            .patch(
                sim.snapshot_class(),
                &PatchParams::default(),
                &Patch::Merge(json!({"metadata": {"labels": {
                    "velero.io/csi-volumesnapshot-class": "true"
                }}})),
            )
            .await?;
        let logs = tempfile::tempdir()?;
        let mut agents = Vec::new();
        for node in sim.nodes() {
            agents.push(start_agent(&cp, &sim, &node, logs.path())?);
        }
        let mut options = VeleroOptions::with_credentials(ACCESS_KEY, SECRET_KEY);
        if ferry_plugin {
            options.plugins.push((
                "velero-plugin-ferry".to_owned(),
                std::path::PathBuf::from(env!("CARGO_BIN_EXE_ferry")),
            ));
        }
        let velero = VeleroServer::start(&cp, &options)?;
        let cluster = Self {
            velero,
            agents,
            sim: Some(sim),
            client,
            bucket,
            prefix,
            logs,
            namespaces: created,
            cp,
            _turn: turn,
        };
        cluster.wait_location_available(None).await?;
        Ok(cluster)
    }

    fn sim(&self) -> &NodeSim {
        self.sim.as_ref().expect("simulator running")
    }

    /// Waits until Velero has validated the location after `after` (any validation when
    /// `None`), then requires it `Available`.
    async fn wait_location_available(
        &self,
        after: Option<jiff::Timestamp>,
    ) -> Result<(), Box<dyn std::error::Error>> {
        let api: Api<BackupStorageLocation> =
            Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        let start = Instant::now();
        loop {
            let bsl = api.get(BSL).await?;
            let status = serde_json::to_value(&bsl)?["status"].clone();
            let validated = status["lastValidationTime"]
                .as_str()
                .and_then(|t| t.parse::<jiff::Timestamp>().ok());
            let fresh = match (validated, after) {
                (Some(v), Some(a)) => v > a,
                (Some(_), None) => true,
                (None, _) => false,
            };
            if fresh {
                let phase = status["phase"].as_str().unwrap_or_default().to_owned();
                if phase != "Available" {
                    return Err(format!(
                        "location {BSL} is {phase:?} after Ferry stored into it: {status}\n{}",
                        self.diagnostics()
                    )
                    .into());
                }
                return Ok(());
            }
            if start.elapsed() > WAIT {
                return Err(format!(
                    "Velero did not validate location {BSL} in time: {status}\n{}",
                    self.diagnostics()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// The top-level folders under the location's prefix.
    async fn top_level_folders(&self) -> Result<BTreeSet<String>, Box<dyn std::error::Error>> {
        let store = self.bucket_store().await?;
        let objects = store.list(&format!("{}/", self.prefix), &CancellationToken::new()).await?;
        Ok(objects
            .iter()
            .filter_map(|o| {
                let rest = o.key.as_str().strip_prefix(&format!("{}/", self.prefix))?;
                rest.split('/').next().map(str::to_owned)
            })
            .collect())
    }

    /// The whole bucket, as a store.
    async fn bucket_store(&self) -> Result<S3Store, Box<dyn std::error::Error>> {
        Ok(S3Store::new(S3Config {
            bucket: self.bucket.clone(),
            prefix: String::new(),
            options: S3Options {
                endpoint: Some(S3Server::shared().endpoint().to_owned()),
                region: Some("us-east-1".into()),
                force_path_style: true,
                credentials: Some(StaticCredentials {
                    access_key_id: ACCESS_KEY.into(),
                    secret_access_key: SECRET_KEY.into(),
                    session_token: None,
                }),
                ..S3Options::default()
            },
        })
        .await?)
    }

    /// `velero backup create NAME ARGS… --wait`, then the Backup's phase.
    async fn backup(
        &self,
        name: &str,
        args: &[&str],
    ) -> Result<String, Box<dyn std::error::Error>> {
        let mut all = vec!["backup", "create", name];
        all.extend_from_slice(args);
        all.push("--wait");
        self.velero.cli(&all, WAIT)?;
        self.phase("backups", name).await
    }

    /// `velero restore create NAME ARGS… --wait`, then the Restore's phase.
    async fn restore(
        &self,
        name: &str,
        args: &[&str],
    ) -> Result<String, Box<dyn std::error::Error>> {
        let mut all = vec!["restore", "create", name];
        all.extend_from_slice(args);
        all.push("--wait");
        self.velero.cli(&all, WAIT)?;
        self.phase("restores", name).await
    }

    async fn phase(&self, plural: &str, name: &str) -> Result<String, Box<dyn std::error::Error>> {
        Ok(self.status(plural, name).await?["phase"].as_str().unwrap_or_default().to_owned())
    }

    /// The status of Velero's Backup or Restore `name`.
    async fn status(
        &self,
        plural: &str,
        name: &str,
    ) -> Result<serde_json::Value, Box<dyn std::error::Error>> {
        let object = velero_api(&self.client, plural).get(name).await?;
        Ok(object.data["status"].clone())
    }

    /// `velero backup delete NAME --confirm`, then waits until the Backup object is gone
    /// (Velero deleted it and Ferry's agents released it); see [`VeleroServer::delete_backup`].
    async fn delete_backup(&self, name: &str) -> TestResult {
        if let Err(e) = self.velero.delete_backup(&self.client, name, WAIT).await {
            return Err(format!("{e:#}\n{}", self.diagnostics()).into());
        }
        Ok(())
    }

    /// `ferry snapshots --json` of namespace `ns`'s repository, read with Ferry's password
    /// from its secret, as an operator would.
    async fn repository_snapshots(
        &self,
        ns: &str,
    ) -> Result<Vec<serde_json::Value>, Box<dyn std::error::Error>> {
        let secrets: Api<Secret> = Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        let secret = secrets.get(ferry_mover::PASSWORD_SECRET).await?;
        let password = secret
            .data
            .and_then(|d| d.get(ferry_mover::PASSWORD_KEY).cloned())
            .ok_or("Ferry's password secret has no password")?;
        let file = self.logs.path().join("password");
        std::fs::write(&file, &password.0)?;
        let repo =
            format!("s3://{}/{}", self.bucket, ferry_mover::repository_prefix(&self.prefix, ns));
        let out = Command::new(env!("CARGO_BIN_EXE_ferry"))
            .args(["snapshots", "--json", "--no-cache", "--repo", &repo])
            .arg("--password-file")
            .arg(&file)
            .args(["--s3-endpoint", S3Server::shared().endpoint(), "--s3-region", "us-east-1"])
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .output()?;
        if !out.status.success() {
            return Err(format!(
                "ferry snapshots --repo {repo} failed: {}",
                String::from_utf8_lossy(&out.stderr)
            )
            .into());
        }
        Ok(serde_json::from_slice(&out.stdout)?)
    }

    /// Waits (bounded) until `count` Backups of Schedule `schedule` are Completed; returns
    /// their names, oldest first.
    async fn wait_schedule_backups(
        &self,
        schedule: &str,
        count: usize,
    ) -> Result<Vec<String>, Box<dyn std::error::Error>> {
        let api = velero_api(&self.client, "backups");
        let label =
            format!("velero.io/schedule-name={}", ferry_api::naming::valid_label_value(schedule));
        let start = Instant::now();
        loop {
            let mut done: Vec<(String, String)> = api
                .list(&ListParams::default().labels(&label))
                .await?
                .items
                .into_iter()
                .filter(|b| b.data["status"]["phase"] == "Completed")
                .map(|b| {
                    (
                        b.metadata
                            .creation_timestamp
                            .as_ref()
                            .map(|t| t.0.to_string())
                            .unwrap_or_default(),
                        b.name_any(),
                    )
                })
                .collect();
            if done.len() >= count {
                done.sort();
                return Ok(done.into_iter().map(|(_, name)| name).collect());
            }
            if start.elapsed() > WAIT {
                return Err(format!(
                    "{} of {count} backups of schedule {schedule} Completed\n{}",
                    done.len(),
                    self.diagnostics()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Waits (bounded) until namespace `ns`'s repository holds `count` snapshots; returns them.
    async fn wait_snapshots(
        &self,
        ns: &str,
        count: usize,
    ) -> Result<Vec<serde_json::Value>, Box<dyn std::error::Error>> {
        let start = Instant::now();
        loop {
            let snapshots = self.repository_snapshots(ns).await?;
            if snapshots.len() == count {
                return Ok(snapshots);
            }
            if start.elapsed() > WAIT {
                let ids: Vec<&str> = snapshots.iter().filter_map(|s| s["id"].as_str()).collect();
                return Err(format!(
                    "{} snapshots in {ns}'s repository, not {count}: {ids:?}\n{}",
                    snapshots.len(),
                    self.diagnostics()
                )
                .into());
            }
            tokio::time::sleep(Duration::from_millis(500)).await;
        }
    }

    /// Whether namespace `ns`'s repository exists: its `config`, written last by its creation.
    async fn repository_exists(&self, ns: &str) -> Result<bool, Box<dyn std::error::Error>> {
        let store = self.bucket_store().await?;
        let config = format!("{}/config", ferry_mover::repository_prefix(&self.prefix, ns));
        let key = ferry_store::ObjectKey::new(config)?;
        Ok(store.head(&key, &CancellationToken::new()).await?.is_some())
    }

    /// Bytes stored under namespace `ns`'s repository.
    async fn repository_bytes(&self, ns: &str) -> Result<u64, Box<dyn std::error::Error>> {
        let store = self.bucket_store().await?;
        let prefix = format!("{}/", ferry_mover::repository_prefix(&self.prefix, ns));
        let objects = store.list(&prefix, &CancellationToken::new()).await?;
        Ok(objects.iter().map(|o| o.size).sum())
    }

    /// Velero's, the agents' and the simulator's state, for failure messages.
    fn diagnostics(&self) -> String {
        let mut out = format!(
            "--- velero server (tail)\n{}\n{}\n",
            self.velero.log_tail(60),
            self.velero.error_lines(30)
        );
        // What the agents did with the repositories, whenever it was.
        for entry in std::fs::read_dir(self.logs.path()).into_iter().flatten().flatten() {
            let text = std::fs::read_to_string(entry.path()).unwrap_or_default();
            for line in text.lines().filter(|l| l.contains("ferry_mover")) {
                out.push_str(line);
                out.push('\n');
            }
        }
        for entry in std::fs::read_dir(self.logs.path()).into_iter().flatten().flatten() {
            let path = entry.path();
            if path.extension().is_some_and(|e| e == "log") {
                let text = std::fs::read_to_string(&path).unwrap_or_default();
                let tail: Vec<&str> = text.lines().rev().take(30).collect();
                out.push_str(&format!("--- {} (tail)\n", path.display()));
                for line in tail.into_iter().rev() {
                    out.push_str(line);
                    out.push('\n');
                }
            }
        }
        out
    }

    async fn data_uploads(&self) -> Result<Vec<DataUpload>, Box<dyn std::error::Error>> {
        let api: Api<DataUpload> = Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        Ok(api.list(&ListParams::default()).await?.items)
    }

    async fn data_downloads(&self) -> Result<Vec<DataDownload>, Box<dyn std::error::Error>> {
        let api: Api<DataDownload> = Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        Ok(api.list(&ListParams::default()).await?.items)
    }

    /// Deletes PVC `ns/name` and waits until it is gone.
    async fn delete_pvc(&self, ns: &str, name: &str) -> TestResult {
        let api: Api<PersistentVolumeClaim> = Api::namespaced(self.client.clone(), ns);
        api.delete(name, &DeleteParams::default()).await?;
        ferry_sim::wait_gone(&api, name, WAIT).await?;
        Ok(())
    }

    async fn shutdown(mut self) -> TestResult {
        self.velero.kill();
        for agent in &mut self.agents {
            agent.stop();
        }
        if let Some(sim) = self.sim.take() {
            sim.shutdown().await?;
        }
        let _ = &self.cp;
        Ok(())
    }
}

/// Velero's Backups or Restores, untyped.
fn velero_api(client: &Client, plural: &str) -> Api<kube::api::DynamicObject> {
    velero::velero_v1(client, if plural == "backups" { "Backup" } else { "Restore" }, plural)
}

fn rand_u32() -> u32 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.subsec_nanos())
}

/// Velero's default location on the moto bucket, with its credentials secret, as
/// `velero install --provider aws --bucket B --prefix P --secret-file F
/// --backup-location-config …` makes it: no `spec.credential`; Velero has the secret as its
/// own credentials file ([`VeleroOptions::with_credentials`]), Ferry reads the secret.
async fn create_location(client: &Client, bucket: &str, prefix: &str) -> TestResult {
    let secrets: Api<Secret> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let secret: Secret = serde_json::from_value(json!({
        "apiVersion": "v1", "kind": "Secret",
        "metadata": { "name": "cloud-credentials", "namespace": VELERO_NAMESPACE },
        "stringData": { "cloud": velero::aws_credentials_file(ACCESS_KEY, SECRET_KEY) },
    }))?;
    secrets.create(&PostParams::default(), &secret).await?;
    let bsls: Api<BackupStorageLocation> = Api::namespaced(client.clone(), VELERO_NAMESPACE);
    let bsl: BackupStorageLocation = serde_json::from_value(json!({
        "apiVersion": "velero.io/v1", "kind": "BackupStorageLocation",
        "metadata": { "name": BSL, "namespace": VELERO_NAMESPACE },
        "spec": {
            "provider": "aws",
            "default": true,
            "objectStorage": { "bucket": bucket, "prefix": prefix },
            "config": {
                "region": "us-east-1",
                "s3Url": S3Server::shared().endpoint(),
                "s3ForcePathStyle": "true",
            },
        },
    }))?;
    bsls.create(&PostParams::default(), &bsl).await?;
    Ok(())
}

/// `ferry agent` for simulated node `node`, handling the `ferry` mover as installed.
fn start_agent(
    cp: &ControlPlane,
    sim: &NodeSim,
    node: &str,
    logs: &std::path::Path,
) -> Result<Guarded, Box<dyn std::error::Error>> {
    let log = std::fs::File::create(logs.join(format!("{node}.log")))?;
    let mut cmd = Command::new(env!("CARGO_BIN_EXE_ferry"));
    cmd.args(["agent", "--node-name", node, "--namespace", VELERO_NAMESPACE])
        .args(["--data-mover", "ferry", "--pod-image", "ferry:e2e"])
        .arg("--kubelet-root")
        .arg(sim.kubelet_root(node)?)
        .args(["--progress-interval", "1s", "--lease-duration", "6s"])
        .args(["--metrics-address", "127.0.0.1:0", "--deletion-interval", "2s"])
        .arg("--cache-dir")
        .arg(logs.join(format!("cache-{node}")))
        .env("KUBECONFIG", cp.kubeconfig())
        .env("FERRY_LOG", "info,kube=warn,tower=warn,hyper=warn,aws=warn")
        .env("AWS_EC2_METADATA_DISABLED", "true")
        .stdin(Stdio::null())
        .stdout(log.try_clone()?)
        .stderr(log);
    Ok(process::spawn(&format!("ferry agent {node}"), cmd)?)
}

/// The workload: a file-system PVC holding a sample tree and a block PVC holding a pattern.
async fn workload(c: &Cluster, ns: &str) -> Result<(FsTree, Vec<u8>), Box<dyn std::error::Error>> {
    let sim = c.sim();
    sim.create_pvc(ns, "files", "64Mi", VolumeMode::Filesystem, Binding::Immediate).await?;
    let tree = FsTree::sample(18);
    sim.write_files(ns, "files", &tree).await?;
    sim.create_pvc(ns, "disk", "32Mi", VolumeMode::Block, Binding::Immediate).await?;
    let pattern: Vec<u8> =
        (0..3 * 1024 * 1024u32).map(|i| (i.wrapping_mul(2_654_435_761) >> 13) as u8).collect();
    sim.write_block(ns, "disk", 4 * 1024 * 1024, &pattern).await?;
    for pvc in ["files", "disk"] {
        sim.wait_pvc_bound(ns, pvc, WAIT).await?;
    }
    Ok((tree, pattern))
}

/// Requires `ns` to hold the workload's data again.
async fn check_restored(c: &Cluster, ns: &str, tree: &FsTree, pattern: &[u8]) -> TestResult {
    let sim = c.sim();
    let restored = sim.read_files(ns, "files").await?;
    assert_eq!(&restored, tree, "restored tree in {ns} differs\n{}", c.diagnostics());
    let block = sim.read_block(ns, "disk", 4 * 1024 * 1024, pattern.len()).await?;
    assert!(block == pattern, "restored block volume in {ns} differs\n{}", c.diagnostics());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn velero_backs_up_and_restores_through_ferry_and_the_location_stays_available() -> TestResult
{
    let c = Cluster::start(&["shop", "shop-copy"]).await?;
    let (ns, copy) = (c.namespaces[0].clone(), c.namespaces[1].clone());
    let (tree, pattern) = workload(&c, &ns).await?;

    // The backup, as a user runs it.
    let phase = c
        .backup(
            "b1",
            &["--include-namespaces", &ns, "--snapshot-move-data", "--data-mover", "ferry"],
        )
        .await?;
    assert_eq!(phase, "Completed", "backup b1\n{}", c.diagnostics());
    let uploads = c.data_uploads().await?;
    if uploads.len() != 2 {
        let logs = c.velero.cli(&["backup", "logs", "b1"], WAIT).unwrap_or_default();
        panic!(
            "one DataUpload per PVC expected: {uploads:#?}\n--- backup logs\n{logs}\n{}",
            c.diagnostics()
        );
    }
    for du in &uploads {
        assert_eq!(du.spec.data_mover, "ferry");
        let status = du.status.clone().unwrap_or_default();
        assert_eq!(
            status.phase,
            Some(DataUploadPhase::Completed),
            "{}: {status:#?}",
            du.name_any()
        );
        assert!(!status.snapshot_id.is_empty());
        assert_eq!(status.progress.bytes_done, status.progress.total_bytes);
    }
    // Ferry's repositories live where Velero accepts them, and Velero says so.
    let folders = c.top_level_folders().await?;
    assert!(folders.contains("plugins"), "no Ferry repository under plugins/: {folders:?}");
    for folder in &folders {
        assert!(
            VELERO_TOP_LEVEL.contains(&folder.as_str()),
            "Velero refuses top-level folder {folder:?} (all: {folders:?})"
        );
    }
    c.wait_location_available(Some(jiff::Timestamp::now())).await?;

    // Velero shows Ferry's work.
    let details = c.velero.cli(&["backup", "describe", "b1", "--details"], WAIT)?;
    assert!(details.contains("Completed"), "{details}");
    assert!(
        details.contains("ferry"),
        "describe --details does not name the data mover:\n{details}"
    );
    let logs = c.velero.cli(&["backup", "logs", "b1"], WAIT)?;
    assert!(
        logs.contains("DataUpload") || logs.contains("dataupload"),
        "backup logs without the DataUploads:\n{logs}"
    );

    // Restore into another namespace.
    let phase = c
        .restore("r1", &["--from-backup", "b1", "--namespace-mappings", &format!("{ns}:{copy}")])
        .await?;
    assert_eq!(phase, "Completed", "restore r1\n{}", c.diagnostics());
    check_restored(&c, &copy, &tree, &pattern).await?;

    // The volumes lost, then restored in place.
    c.delete_pvc(&ns, "files").await?;
    c.delete_pvc(&ns, "disk").await?;
    let phase = c.restore("r2", &["--from-backup", "b1"]).await?;
    assert_eq!(phase, "Completed", "restore r2\n{}", c.diagnostics());
    check_restored(&c, &ns, &tree, &pattern).await?;
    let downloads = c.data_downloads().await?;
    assert_eq!(downloads.len(), 4, "one DataDownload per PVC and restore: {downloads:#?}");
    assert!(downloads.iter().all(|d| d.spec.data_mover == "ferry"));

    c.wait_location_available(Some(jiff::Timestamp::now())).await?;
    c.shutdown().await
}

/// `velero backup delete` reclaims Ferry's data without Ferry's plugin: the agents hold each
/// Completed DataUpload with their finalizer, forget its snapshot once Velero has deleted the
/// backup, and collect the space; the other backup's volumes stay restorable.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn deleting_a_velero_backup_forgets_its_snapshots_and_collects_their_space() -> TestResult {
    let c = Cluster::start(&["orders"]).await?;
    let ns = c.namespaces[0].clone();
    let (tree, pattern) = workload(&c, &ns).await?;
    let move_data =
        ["--include-namespaces", ns.as_str(), "--snapshot-move-data", "--data-mover", "ferry"];
    assert_eq!(c.backup("b1", &move_data).await?, "Completed", "{}", c.diagnostics());
    let mut changed = FsTree::default();
    changed.entries.insert(
        "new-order.txt".into(),
        FsEntry {
            kind: FsKind::File(b"order 42: two ferries\n".to_vec()),
            mode: 0o640,
            uid: 1000,
            gid: 1000,
            mtime: 1_700_000_000,
        },
    );
    c.sim().write_files(&ns, "files", &changed).await?;
    assert_eq!(c.backup("b2", &move_data).await?, "Completed", "{}", c.diagnostics());
    let before = c.repository_snapshots(&ns).await?;
    assert_eq!(before.len(), 4, "two volumes, two backups: {before:#?}");
    let bytes_two = c.repository_bytes(&ns).await?;

    c.delete_backup("b1").await?;
    let left = c.wait_snapshots(&ns, 2).await?;
    let b2_uploads: BTreeSet<String> = c
        .data_uploads()
        .await?
        .iter()
        .filter(|du| du.labels().get("velero.io/backup-name").map(String::as_str) == Some("b2"))
        .filter_map(|du| du.status.as_ref().map(|s| s.snapshot_id.clone()))
        .collect();
    let kept: BTreeSet<String> =
        left.iter().filter_map(|s| s["id"].as_str().map(str::to_owned)).collect();
    assert!(
        b2_uploads.iter().all(|id| kept
            .iter()
            .any(|k| k.starts_with(id.as_str()) || id.starts_with(k.as_str()))),
        "b2's snapshots {b2_uploads:?} must stay, kept {kept:?}"
    );
    // b2 still restores.
    c.delete_pvc(&ns, "files").await?;
    c.delete_pvc(&ns, "disk").await?;
    assert_eq!(
        c.restore("r2", &["--from-backup", "b2"]).await?,
        "Completed",
        "{}",
        c.diagnostics()
    );
    let restored = c.sim().read_files(&ns, "files").await?;
    let mut expected = tree.clone();
    expected.entries.extend(changed.entries.clone());
    assert_eq!(restored, expected, "b2 restored\n{}", c.diagnostics());
    let block = c.sim().read_block(&ns, "disk", 4 * 1024 * 1024, pattern.len()).await?;
    assert!(block == pattern);

    c.delete_backup("b2").await?;
    c.wait_snapshots(&ns, 0).await?;
    // The agents collect right after forgetting (or at a later round when another held the
    // collector's lock): wait, boundedly, for the space to come back.
    let start = Instant::now();
    loop {
        let bytes_none = c.repository_bytes(&ns).await?;
        if bytes_none * 10 < bytes_two {
            break;
        }
        if start.elapsed() > WAIT {
            return Err(format!(
                "space not collected: {bytes_none} bytes left of {bytes_two}\n{}",
                c.diagnostics()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
    c.wait_location_available(Some(jiff::Timestamp::now())).await?;
    c.shutdown().await
}

/// With Ferry's plugin installed beside Velero's CSI support, each volume is still one item
/// operation (the plugin registers no PVC action of its own), and deletion still works.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn with_ferrys_plugin_each_volume_is_one_operation() -> TestResult {
    let c = Cluster::start_with(&["plugin"], true).await?;
    let ns = c.namespaces[0].clone();
    workload(&c, &ns).await?;
    let phase = c
        .backup(
            "b1",
            &["--include-namespaces", &ns, "--snapshot-move-data", "--data-mover", "ferry"],
        )
        .await?;
    assert_eq!(phase, "Completed", "{}", c.diagnostics());
    let status = c.status("backups", "b1").await?;
    assert_eq!(status["backupItemOperationsAttempted"], 2, "{status}\n{}", c.diagnostics());
    assert_eq!(status["backupItemOperationsCompleted"], 2, "{status}");
    assert_eq!(c.data_uploads().await?.len(), 2);
    assert!(c.velero.log().contains("velero-plugin-ferry"), "Velero did not load Ferry's plugin");
    c.delete_backup("b1").await?;
    c.wait_snapshots(&ns, 0).await?;
    c.shutdown().await
}

/// A Schedule with a 63-character name, run twice (the second backup incremental), restored;
/// then its first backup deleted: the backups' names exceed 63 characters, so their
/// `velero.io/backup-name` labels are cut and hashed, and only the first backup's snapshots
/// are forgotten.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn a_schedule_with_a_63_character_name_runs_twice_and_restores() -> TestResult {
    let c = Cluster::start(&["sched"]).await?;
    let ns = c.namespaces[0].clone();
    let (tree, pattern) = workload(&c, &ns).await?;
    let schedule = format!("nightly-{}", "s".repeat(63 - "nightly-".len()));
    assert_eq!(schedule.len(), 63);
    c.velero.cli(
        &[
            "schedule",
            "create",
            &schedule,
            "--schedule",
            "@every 24h",
            "--include-namespaces",
            &ns,
            "--snapshot-move-data",
            "--data-mover",
            "ferry",
        ],
        WAIT,
    )?;
    // Velero v1.18 runs a new schedule first at its next time, not at once: both runs are
    // asked for, as `velero backup create --from-schedule` does.
    c.velero.cli(&["backup", "create", "--from-schedule", &schedule, "--wait"], WAIT)?;
    let first = c.wait_schedule_backups(&schedule, 1).await?.remove(0);
    // The second run, a second later (Velero names scheduled backups by the second).
    tokio::time::sleep(Duration::from_millis(1100)).await;
    let mut changed = FsTree::default();
    changed.entries.insert(
        "second-run.txt".into(),
        FsEntry {
            kind: FsKind::File(vec![7u8; 4096]),
            mode: 0o600,
            uid: 0,
            gid: 0,
            mtime: 1_700_000_100,
        },
    );
    c.sim().write_files(&ns, "files", &changed).await?;
    c.velero.cli(&["backup", "create", "--from-schedule", &schedule, "--wait"], WAIT)?;
    let backups = c.wait_schedule_backups(&schedule, 2).await?;
    let second = backups.into_iter().find(|b| *b != first).ok_or("no second backup")?;
    assert!(second.len() > 63, "{second}");
    let uploads = c.data_uploads().await?;
    let of = |backup: &str| -> Vec<&DataUpload> {
        let label = ferry_api::naming::valid_label_value(backup);
        uploads
            .iter()
            .filter(|du| du.labels().get("velero.io/backup-name") == Some(&label))
            .collect()
    };
    assert_eq!((of(&first).len(), of(&second).len()), (2, 2), "{uploads:#?}");
    // The second run stored only what changed.
    let new_bytes = |dus: &[&DataUpload]| -> i64 {
        dus.iter().map(|d| d.status.as_ref().map_or(0, |s| s.incremental_bytes)).sum()
    };
    assert!(
        new_bytes(&of(&second)) * 4 < new_bytes(&of(&first)),
        "second run not incremental: {} new bytes after {}",
        new_bytes(&of(&second)),
        new_bytes(&of(&first))
    );
    c.delete_pvc(&ns, "files").await?;
    c.delete_pvc(&ns, "disk").await?;
    let phase = c.restore("from-schedule", &["--from-backup", &second]).await?;
    assert_eq!(phase, "Completed", "{}", c.diagnostics());
    let mut expected = tree.clone();
    expected.entries.extend(changed.entries.clone());
    assert_eq!(c.sim().read_files(&ns, "files").await?, expected, "{}", c.diagnostics());
    let block = c.sim().read_block(&ns, "disk", 4 * 1024 * 1024, pattern.len()).await?;
    assert!(block == pattern);

    // Deleting the first run forgets its snapshots only (the labels name no backup: the
    // agents go by the DataUploads' owner).
    c.delete_backup(&first).await?;
    let left = c.wait_snapshots(&ns, 2).await?;
    let kept: BTreeSet<&str> = left.iter().filter_map(|s| s["id"].as_str()).collect();
    for du in of(&second) {
        let id = du.status.as_ref().map(|s| s.snapshot_id.as_str()).unwrap_or_default();
        assert!(kept.contains(id), "the second run's snapshot {id} was forgotten: {kept:?}");
    }
    c.wait_location_available(Some(jiff::Timestamp::now())).await?;
    c.shutdown().await
}

/// The Velero server killed while Ferry's agents move a backup's data, then started again:
/// the backup ends as Velero's restart rules say (a backup still `InProgress` is marked
/// `Failed`; one `WaitingForPluginOperations` is polled again and completes), Ferry ends
/// every DataUpload and leaves no holding pod or volume behind, and deleting the backup
/// reclaims its snapshots either way.
#[tokio::test(flavor = "multi_thread", worker_threads = 4)]
async fn velero_restarted_while_ferry_moves_the_data() -> TestResult {
    let mut c = Cluster::start(&["restart"]).await?;
    let ns = c.namespaces[0].clone();
    workload(&c, &ns).await?;
    c.velero.cli(
        &[
            "backup",
            "create",
            "b1",
            "--include-namespaces",
            &ns,
            "--snapshot-move-data",
            "--data-mover",
            "ferry",
        ],
        WAIT,
    )?;
    // Kill Velero as soon as it has handed a volume to Ferry.
    let start = Instant::now();
    while c.data_uploads().await?.is_empty() {
        if start.elapsed() > WAIT {
            return Err(format!("no DataUpload\n{}", c.diagnostics()).into());
        }
        tokio::time::sleep(Duration::from_millis(50)).await;
    }
    c.velero.kill();
    let at_kill = c.phase("backups", "b1").await?;
    c.velero =
        VeleroServer::start(&c.cp, &VeleroOptions::with_credentials(ACCESS_KEY, SECRET_KEY))?;
    let expected = match at_kill.as_str() {
        "InProgress" => "Failed",
        _ => "Completed",
    };
    let start = Instant::now();
    let ended = loop {
        let phase = c.phase("backups", "b1").await?;
        if ["Completed", "Failed", "PartiallyFailed"].contains(&phase.as_str()) {
            break phase;
        }
        if start.elapsed() > WAIT {
            return Err(format!("b1 still {phase}\n{}", c.diagnostics()).into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    assert_eq!(ended, expected, "killed while {at_kill}\n{}", c.diagnostics());
    // Ferry finished every DataUpload it had and holds nothing.
    let start = Instant::now();
    let completed = loop {
        let uploads = c.data_uploads().await?;
        // Completed, or Canceled if Velero cancelled the operations of a failed backup.
        let done = uploads.iter().all(|du| {
            matches!(
                du.status.as_ref().and_then(|s| s.phase),
                Some(DataUploadPhase::Completed | DataUploadPhase::Canceled)
            )
        });
        let pods: Api<ferry_api::k8s_openapi::api::core::v1::Pod> =
            Api::namespaced(c.client.clone(), VELERO_NAMESPACE);
        let held = pods.list(&ListParams::default()).await?.items.len();
        let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(c.client.clone(), VELERO_NAMESPACE);
        let claims = pvcs.list(&ListParams::default()).await?.items.len();
        if done && held == 0 && claims == 0 {
            break uploads
                .iter()
                .filter(|du| {
                    du.status.as_ref().and_then(|s| s.phase) == Some(DataUploadPhase::Completed)
                })
                .count();
        }
        if start.elapsed() > WAIT {
            return Err(format!(
                "after the restart: {} DataUploads, {held} pods, {claims} PVCs left\n{uploads:#?}\n{}",
                uploads.len(),
                c.diagnostics()
            )
            .into());
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    };
    eprintln!(
        "Velero killed while b1 was {at_kill}; b1 ended {ended}; {completed} DataUploads Completed"
    );
    c.wait_location_available(Some(jiff::Timestamp::now())).await?;
    c.delete_backup("b1").await?;
    if completed > 0 {
        c.wait_snapshots(&ns, 0).await?;
    } else {
        // Stopped before any upload completed: the namespace's repository may not exist yet
        // (the password secret, shared by every namespace, says nothing about that), or its
        // creation may have been cancelled between the key file and the config (a stray key
        // file, which the next creation ignores); if it exists, it holds no snapshot.
        if c.repository_exists(&ns).await? {
            c.wait_snapshots(&ns, 0).await?;
        }
    }
    c.shutdown().await
}
