//! The demo's story, step by step, as a user runs it: a cluster comes up with the real
//! `velero server` and Ferry's agents; an application's volume is backed up with `velero
//! backup create --snapshot-move-data --data-mover ferry` (Velero's CSI support makes the
//! DataUpload, Ferry moves the data), changed and backed up again incrementally, restored with
//! `velero restore create` into another namespace (a DataDownload) and compared with what it
//! held.

use std::path::Path;
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Secret};
use ferry_api::{DataDownload, DataUpload};
use ferry_sim::Binding;
use ferry_testbed::VELERO_NAMESPACE;
use kube::ResourceExt;
use kube::api::{Api, ListParams};

use crate::watch::{self, Finished, Watched};
use crate::world::{ACCESS_KEY, SECRET_KEY, World};
use crate::{dataset, volumes};

/// How long the simulator gets for a snapshot or a volume to be ready.
const READY: Duration = Duration::from_secs(120);
/// The application volume's PVC.
const PVC: &str = "orders-data";
/// The bound on a Velero backup or restore to end after its data moved.
const VELERO_WAIT: Duration = Duration::from_secs(300);

/// What the user asked for.
#[derive(Debug, Clone)]
pub struct Options {
    pub ferry: std::path::PathBuf,
    pub size_mib: u64,
    pub files: usize,
    /// Also measure the node agent's targets ([`crate::bench`]).
    pub bench: bool,
    /// A MinIO binary to use as the S3 server instead of moto.
    pub minio: Option<std::path::PathBuf>,
    /// Where the simulated nodes keep their volumes, snapshots and mounts (default: the temp
    /// folder).
    pub sim_dir: Option<std::path::PathBuf>,
    /// Run on the node simulator instead of a real node.
    pub sim: bool,
}

/// One finished transfer, for the summary.
#[derive(Debug, Clone)]
pub struct Transfer {
    pub what: &'static str,
    pub name: String,
    pub node: String,
    pub bytes: u64,
    pub incremental: Option<u64>,
    pub snapshot: String,
    pub elapsed: Duration,
    pub moving: Duration,
    pub first_progress: Option<Duration>,
}

/// The demo's result.
#[derive(Debug, Clone, Default)]
pub struct Report {
    pub transfers: Vec<Transfer>,
    pub files: usize,
    pub bytes: u64,
    pub differences: Vec<String>,
    pub bench: Option<crate::bench::Bench>,
}

struct Steps {
    n: usize,
    start: Instant,
}

impl Steps {
    fn say(&mut self, what: &str) {
        self.n += 1;
        println!(
            "\n\x1b[1m[{:>5.1}s] {}. {what}\x1b[0m",
            self.start.elapsed().as_secs_f64(),
            self.n
        );
    }
}

pub fn mb(bytes: u64) -> String {
    format!("{:.1} MiB", bytes as f64 / f64::from(1 << 20))
}

/// Runs the whole story in `world` (which the caller tears down, whatever happens).
///
/// # Errors
/// Any step failed; the message names it.
pub async fn run(world: &mut World, opts: &Options, report: &mut Report) -> anyhow::Result<()> {
    let mut steps = Steps { n: 0, start: Instant::now() };

    let real = if opts.sim {
        None
    } else {
        steps.say("A real Kubernetes node on this machine: kube-apiserver, kubelet with containerd and runc, the CSI hostpath driver with its provisioner and snapshotter, scheduler and controllers");
        match world.start_real_node().await {
            Ok(node) => Some(node.control_plane().url().to_owned()),
            Err(e) => {
                println!("  \x1b[1;33mthe real node cannot start here: {e:#}\x1b[0m");
                println!("  falling back to the node simulator");
                None
            }
        }
    };
    if let Some(url) = &real {
        println!("  API server at {url}, node {} Ready", ferry_testbed::realnode::NODE_NAME);
    } else {
        steps.say("A local Kubernetes control plane: kube-apiserver + etcd, Velero's and the CSI snapshot CRDs");
        let cp = world.start_control_plane().await?;
        println!("  API server at {}", cp.url());
    }

    let server = if opts.minio.is_some() { "MinIO" } else { "moto" };
    steps.say(&format!("An S3 server ({server}) with a bucket for backups"));
    let s3 = world.start_s3(opts.minio.as_deref())?;
    println!("  S3 at {}, bucket {}", s3.endpoint(), crate::world::BUCKET);

    if real.is_some() {
        steps.say("Ferry installed as users install it: an image of the ferry binary, `helm template deploy/helm/ferry | kubectl apply`");
        let image = world.install_ferry(&opts.ferry).await?;
        println!("  image {image}; the agent DaemonSet's pod is Ready on the node");
        steps.say(&format!(
            "Velero {} (`velero server`, built from source, running on the node) with its default BackupStorageLocation",
            ferry_testbed::velero::VELERO_VERSION
        ));
        world.create_bsl().await?;
    } else {
        steps.say(
            "Three simulated nodes: kubelet, scheduler, CSI driver with loop devices and ext4",
        );
        let sim = world.start_sim(opts.sim_dir.as_deref()).await?;
        println!(
            "  nodes {}, storage class {}",
            sim.nodes().join(", "),
            sim.storage_class(Binding::Immediate)
        );
        steps.say(&format!(
            "Velero {} (`velero server`, built from source) with its default BackupStorageLocation, and a `ferry agent` on every node",
            ferry_testbed::velero::VELERO_VERSION
        ));
        world.create_bsl().await?;
        world.start_agents(&opts.ferry)?;
        for (node, agent) in &world.agents {
            println!("  ferry agent on {node}: pid {}", agent.pid());
        }
    }
    let velero = world.start_velero().await?;
    println!("  velero server running; its log: {}", velero.log_path().display());
    wait_location_available(world).await?;
    let locations = world.velero_server()?.cli(&["backup-location", "get"], VELERO_WAIT)?;
    for line in locations.lines() {
        println!("  {line}");
    }
    if opts.bench {
        println!("  (bench) letting the agents idle for 10s, then reading their memory");
        let idle_rss = crate::bench::idle_memory(world, Duration::from_secs(10)).await?;
        report.bench = Some(crate::bench::Bench { idle_rss, ..Default::default() });
    }

    steps.say(&format!(
        "An application volume: PVC {PVC} with {} MiB in about {} files",
        opts.size_mib, opts.files
    ));
    let tree = dataset::generate(opts.size_mib, opts.files, 2025);
    let size = format!("{}Mi", opts.size_mib * 3 / 2 + 64);
    let ns = world.namespace.clone();
    volumes::create(world, &ns, PVC, &size).await?;
    volumes::write(world, &ns, PVC, &tree).await.context("writing the data set")?;
    let (files, bytes) = dataset::count(&tree);
    let by = if world.real().is_some() { " by an application pod" } else { "" };
    println!("  namespace {ns}: {files} files, {} written{by} ({size} volume)", mb(bytes));
    if opts.bench {
        // The data set was written moments ago: its write-back to disk would compete with the
        // first backup's reads (the bare backup's turn comes on a quiet disk).
        println!("  (bench) writing the data set back to disk before the backup");
        tokio::task::spawn_blocking(nix::unistd::sync).await?;
    }

    steps.say("Backup: velero backup create nightly-1 --snapshot-move-data --data-mover ferry");
    let first = backup(world, "nightly-1").await?;
    print_transfer(&first);
    report.transfers.push(first.clone());
    if let Some(bench) = report.bench.as_mut() {
        println!("  (bench) the same volume with a bare `ferry backup` into a new repository");
        let (path, reader) = crate::bench::volume_for_bare_backup(world, &ns, PVC).await?;
        let bare = crate::bench::bare_backup(world, &opts.ferry, &path, "source").await;
        crate::bench::remove_reader(world, &ns, &reader).await?;
        let bare = bare?;
        println!("  bare backup: {:.1}s", bare.as_secs_f64());
        bench.bare = Some(bare);
        println!("  (bench) and of a fresh snapshot copy of it, as a DataUpload sees its volume");
        let (path, made) = crate::bench::fresh_copy_for_bare_backup(world, &ns, PVC, &size).await?;
        let fresh = crate::bench::bare_backup(world, &opts.ferry, &path, "copy").await;
        crate::bench::remove_fresh_copy(world, &ns, &made).await?;
        let fresh = fresh?;
        println!("  bare backup of the copy: {:.1}s", fresh.as_secs_f64());
        bench.bare_fresh = Some(fresh);
        bench.timeline = crate::bench::timeline(world, &first.name).await?;
        bench.upload = Some(first.clone());
    }

    steps.say(
        "A day of changes: three logs grow, 1 MiB of the database is rewritten, a new document",
    );
    let (changed, after) = dataset::change(&tree, 7);
    volumes::write(world, &ns, PVC, &changed).await.context("changing the data")?;
    println!("  {} entries changed", changed.entries.len());

    steps.say("Second backup, incremental against the first: velero backup create nightly-2 ...");
    let second = backup(world, "nightly-2").await?;
    print_transfer(&second);
    report.transfers.push(second.clone());

    let target = world.restore_namespace.clone();
    steps.say(&format!(
        "Restore: velero restore create --from-backup nightly-2 --namespace-mappings {ns}:{target}"
    ));
    let restore = restore(world, "nightly-2-restore", "nightly-2", &ns, &target).await?;
    print_transfer(&restore);
    report.transfers.push(restore);

    steps.say("Comparison of the restored volume with the source, file by file");
    let pvcs: Api<PersistentVolumeClaim> = Api::namespaced(world.client()?, &target);
    let bound = pvcs.get(PVC).await?;
    let pv = bound.spec.and_then(|s| s.volume_name).unwrap_or_default();
    println!("  {target}/{PVC} is bound to {pv}");
    let got = volumes::read(world, &target, PVC).await.context("reading the restored volume")?;
    // What the application's volume holds now (on the real node the application pod wrote
    // it; on the simulator exactly the data set).
    let source = match world.real() {
        Some(_) => volumes::read(world, &ns, PVC).await.context("reading the source volume")?,
        None => after,
    };
    (report.files, report.bytes) = dataset::count(&got);
    report.differences = dataset::differences(&source, &got, 20);
    if report.differences.is_empty() {
        println!(
            "  identical: {} files, {}, modes, owners and times",
            report.files,
            mb(report.bytes)
        );
    } else {
        for d in &report.differences {
            println!("  DIFFERENT: {d}");
        }
    }

    steps.say("The repository, read with the ferry CLI: snapshots, and every stored byte verified");
    repository(world, &opts.ferry).await?;
    Ok(())
}

/// Waits (bounded) until Velero has validated its default location, as a user checks with
/// `velero backup-location get` before a first backup.
async fn wait_location_available(world: &World) -> anyhow::Result<()> {
    let api: Api<ferry_api::BackupStorageLocation> =
        Api::namespaced(world.client()?, VELERO_NAMESPACE);
    let start = Instant::now();
    loop {
        let bsl = api.get(crate::world::BSL).await?;
        let phase = serde_json::to_value(&bsl)?["status"]["phase"].as_str().map(str::to_owned);
        match phase.as_deref() {
            Some("Available") => return Ok(()),
            Some("Unavailable") => bail!("Velero finds its backup location Unavailable"),
            _ if start.elapsed() > READY => {
                bail!("Velero did not validate its backup location within {READY:?}")
            }
            _ => tokio::time::sleep(Duration::from_millis(250)).await,
        }
    }
}

/// `velero backup create NAME --include-namespaces NS --snapshot-move-data --data-mover
/// ferry`, then the DataUpload Velero's CSI support creates for the PVC, followed live, and
/// the Backup until Velero says Completed.
async fn backup(world: &mut World, name: &str) -> anyhow::Result<Transfer> {
    let ns = world.namespace.clone();
    let args = [
        "backup",
        "create",
        name,
        "--include-namespaces",
        &ns,
        "--snapshot-move-data",
        "--data-mover",
        crate::world::DATA_MOVER,
    ];
    println!("  $ velero {}", args.join(" "));
    let said = world.velero_server()?.cli(&args, VELERO_WAIT)?;
    if let Some(line) = said.lines().next() {
        println!("  {line}");
    }
    let du: DataUpload = created_for(world, "velero.io/backup-name", name, "backups").await?;
    println!("  Velero made VolumeSnapshot and DataUpload {}; Ferry moves it:", du.name_any());
    let done = follow::<DataUpload>(world, &du.name_any()).await?;
    let status = done.object.status.clone().unwrap_or_default();
    let incremental = u64::try_from(status.incremental_bytes).unwrap_or(0);
    let phase = velero_phase(world, "backups", name).await?;
    println!("  velero backup {name}: {phase}");
    if phase != "Completed" {
        bail!(
            "Velero's backup {name} ended {phase}{}",
            failure_reason(world, "backups", name).await
        );
    }
    Ok(transfer("backup", &done, Some(incremental), status.snapshot_id))
}

/// `velero restore create NAME --from-backup BACKUP --namespace-mappings FROM:TO`, then the
/// DataDownload Velero creates, followed live, and the Restore until Velero says Completed.
async fn restore(
    world: &mut World,
    name: &str,
    backup: &str,
    from: &str,
    to: &str,
) -> anyhow::Result<Transfer> {
    let mapping = format!("{from}:{to}");
    let args =
        ["restore", "create", name, "--from-backup", backup, "--namespace-mappings", &mapping];
    println!("  $ velero {}", args.join(" "));
    world.velero_server()?.cli(&args, VELERO_WAIT)?;
    let dd: DataDownload = created_for(world, "velero.io/restore-name", name, "restores").await?;
    println!("  Velero made DataDownload {}; Ferry moves it:", dd.name_any());
    let done = follow::<DataDownload>(world, &dd.name_any()).await?;
    let phase = velero_phase(world, "restores", name).await?;
    println!("  velero restore {name}: {phase}");
    if phase != "Completed" {
        bail!(
            "Velero's restore {name} ended {phase}{}",
            failure_reason(world, "restores", name).await
        );
    }
    let snapshot = done.object.spec.snapshot_id.clone();
    Ok(transfer("restore", &done, None, snapshot))
}

/// The CR Velero creates for backup or restore `owner` (found by `label`), waiting for it;
/// fails early when Velero ends the backup or restore without one.
async fn created_for<K: Watched>(
    world: &World,
    label: &str,
    owner: &str,
    plural: &str,
) -> anyhow::Result<K> {
    let api: Api<K> = Api::namespaced(world.client()?, VELERO_NAMESPACE);
    let start = Instant::now();
    loop {
        let list = api.list(&ListParams::default().labels(&format!("{label}={owner}"))).await?;
        if let Some(found) = list.items.into_iter().next() {
            return Ok(found);
        }
        let phase = velero_phase_now(world, plural, owner).await?;
        if ["Completed", "PartiallyFailed", "Failed", "FailedValidation"].contains(&phase.as_str())
        {
            bail!("Velero's {owner} ended {phase} without handing a volume to Ferry");
        }
        if start.elapsed() > READY {
            bail!("Velero made no {} for {owner} within {READY:?} (phase {phase:?})", K::kind(&()));
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// The phase of Velero's Backup or Restore `name`, waiting (bounded) while Velero is still
/// finishing it after the data moved.
async fn velero_phase(world: &World, plural: &str, name: &str) -> anyhow::Result<String> {
    let start = Instant::now();
    loop {
        let phase = velero_phase_now(world, plural, name).await?;
        let settling = ["New", "InProgress", "WaitingForPluginOperations", "Finalizing"]
            .iter()
            .any(|p| phase.starts_with(p));
        if !settling || start.elapsed() > VELERO_WAIT {
            return Ok(phase);
        }
        tokio::time::sleep(Duration::from_millis(250)).await;
    }
}

/// `: <status.failureReason>` of Velero's Backup or Restore `name`, when Velero gave one.
async fn failure_reason(world: &World, plural: &str, name: &str) -> String {
    let kind = if plural == "backups" { "Backup" } else { "Restore" };
    let Ok(client) = world.client() else { return String::new() };
    let api = ferry_testbed::velero::velero_v1(&client, kind, plural);
    match api.get_opt(name).await {
        Ok(Some(object)) => object.data["status"]["failureReason"]
            .as_str()
            .filter(|r| !r.is_empty())
            .map(|r| format!(": {r}"))
            .unwrap_or_default(),
        _ => String::new(),
    }
}

/// The phase of Velero's Backup or Restore `name` now (`New` before Velero has set one).
async fn velero_phase_now(world: &World, plural: &str, name: &str) -> anyhow::Result<String> {
    let kind = if plural == "backups" { "Backup" } else { "Restore" };
    let api = ferry_testbed::velero::velero_v1(&world.client()?, kind, plural);
    Ok(match api.get_opt(name).await? {
        Some(object) => object.data["status"]["phase"].as_str().unwrap_or("New").to_owned(),
        None => "New".to_owned(),
    })
}

async fn follow<K: Watched>(world: &mut World, name: &str) -> anyhow::Result<Finished<K>> {
    let client = world.client()?;
    let result = watch::follow::<K>(client, name, || {
        let dead = world.dead_agents();
        if dead.is_empty() { Ok(()) } else { bail!("ferry agent exited on {}", dead.join(", ")) }
    })
    .await;
    result.with_context(|| format!("following {} {name}", K::kind(&())))
}

fn transfer<K: Watched>(
    what: &'static str,
    done: &Finished<K>,
    incremental: Option<u64>,
    snapshot: String,
) -> Transfer {
    Transfer {
        what,
        name: done.object.name_any(),
        node: done.status.node.clone(),
        bytes: done.status.total,
        incremental,
        snapshot,
        elapsed: done.elapsed,
        moving: done.moving,
        first_progress: done.first_progress,
    }
}

pub fn rate(t: &Transfer) -> String {
    let secs = t.moving.as_secs_f64().max(0.001);
    format!("{:.1} MB/s", t.bytes as f64 / secs / 1e6)
}

fn print_transfer(t: &Transfer) {
    let new =
        t.incremental.map(|b| format!(", {} new to the repository", mb(b))).unwrap_or_default();
    println!(
        "  {} Completed on {} in {:.1}s: {}{new}, {} while moving; snapshot {}",
        t.name,
        t.node,
        t.elapsed.as_secs_f64(),
        mb(t.bytes),
        rate(t),
        t.snapshot
    );
}

/// `ferry snapshots` and `ferry check --read-data` on the namespace's repository, with the
/// password the agents keep in Ferry's own secret in Velero's namespace.
async fn repository(world: &World, ferry: &Path) -> anyhow::Result<()> {
    let secrets: Api<Secret> = Api::namespaced(world.client()?, VELERO_NAMESPACE);
    let secret = secrets.get(ferry_mover::PASSWORD_SECRET).await?;
    let password =
        secret.data.and_then(|d| d.get(ferry_mover::PASSWORD_KEY).cloned()).with_context(|| {
            format!("{} has no {}", ferry_mover::PASSWORD_SECRET, ferry_mover::PASSWORD_KEY)
        })?;
    let dir = tempfile::Builder::new().prefix("ferry-demo-").tempdir()?;
    let password_file = dir.path().join("password");
    std::fs::write(&password_file, &password.0)?;
    let repo = world.repository();
    println!("  repository {repo}");
    for args in [&["snapshots"][..], &["check", "--read-data"][..]] {
        println!("  $ ferry {} --repo {repo}", args.join(" "));
        let status = tokio::process::Command::new(ferry)
            .args(args)
            .arg("--repo")
            .arg(&repo)
            .arg("--password-file")
            .arg(&password_file)
            .args(["--s3-endpoint", world.s3()?.endpoint(), "--s3-region", "us-east-1"])
            // The demo's repository lives and dies with the demo: nothing kept in ~/.cache.
            .arg("--no-cache")
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .kill_on_drop(true)
            .status()
            .await
            .with_context(|| format!("running {}", ferry.display()))?;
        if !status.success() {
            bail!("ferry {} failed: {status}", args.join(" "));
        }
    }
    Ok(())
}

/// Whether every transfer completed and the restored tree is the source's.
#[must_use]
pub fn verdict(report: &Report) -> bool {
    report.differences.is_empty() && report.transfers.len() == 3
}
