//! `--bench`: the node agent's targets, measured on the demo's own run. The agents' memory while
//! idle, the time from a DataUpload's creation to Completed against a bare `ferry backup` of the
//! same data into the same S3 server, and how soon progress shows on the CR.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context, bail};
use ferry_api::k8s_openapi::api::core::v1::{PersistentVolumeClaim, Pod};
use ferry_sim::VolumeMode;
use kube::api::{Api, DeleteParams, PostParams};

use crate::act::{Transfer, mb};
use crate::world::{ACCESS_KEY, BUCKET, SECRET_KEY, World};
use ferry_testbed::VELERO_NAMESPACE;

/// What `--bench` measured.
#[derive(Debug, Clone, Default)]
pub struct Bench {
    /// Resident memory of each agent after it sat idle, in bytes: `(node, bytes)`.
    pub idle_rss: Vec<(String, u64)>,
    /// The bare `ferry backup` of the first backup's data.
    pub bare: Option<Duration>,
    /// The same, of a fresh snapshot copy of the volume (as a DataUpload reads it).
    pub bare_fresh: Option<Duration>,
    /// The first backup through its DataUpload.
    pub upload: Option<Transfer>,
    /// The agents' Events on that DataUpload: seconds after the first one, reason, note.
    pub timeline: Vec<(f64, String, String)>,
}

/// The Events the agents published on DataUpload `name`, oldest first, timed from the first.
///
/// # Errors
/// The API server refused the list.
pub async fn timeline(world: &World, name: &str) -> anyhow::Result<Vec<(f64, String, String)>> {
    use ferry_api::k8s_openapi::api::events::v1::Event;
    let events: Api<Event> = Api::namespaced(world.client()?, VELERO_NAMESPACE);
    let selector = format!("regarding.name={name}");
    let list = events
        .list(&kube::api::ListParams::default().fields(&selector))
        .await
        .with_context(|| format!("listing the Events of DataUpload {name}"))?;
    let mut seen: Vec<_> = list
        .items
        .into_iter()
        .filter_map(|e| {
            let at = e.event_time.as_ref()?.0;
            Some((at, e.reason.unwrap_or_default(), e.note.unwrap_or_default()))
        })
        .collect();
    seen.sort_by_key(|(at, _, _)| *at);
    let Some(first) = seen.first().map(|(at, _, _)| *at) else { return Ok(Vec::new()) };
    Ok(seen
        .into_iter()
        .map(|(at, reason, note)| {
            let after = at.duration_since(first).as_secs_f64();
            (after, reason, note)
        })
        .collect())
}

/// Resident memory of process `pid` (`VmRSS` in `/proc/<pid>/status`), in bytes.
fn rss(pid: u32) -> anyhow::Result<u64> {
    let status = std::fs::read_to_string(format!("/proc/{pid}/status"))
        .with_context(|| format!("reading /proc/{pid}/status"))?;
    let kib = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        .with_context(|| format!("no VmRSS in /proc/{pid}/status"))?;
    Ok(kib * 1024)
}

/// Every agent's memory after `idle` with nothing to do.
///
/// # Errors
/// An agent's `/proc` entry could not be read (it exited).
pub async fn idle_memory(world: &World, idle: Duration) -> anyhow::Result<Vec<(String, u64)>> {
    tokio::time::sleep(idle).await;
    world.agents.iter().map(|(node, agent)| Ok((node.clone(), rss(agent.pid())?))).collect()
}

/// The same volume the DataUpload backed up: claim `pvc` of `namespace`, mounted by a reader
/// pod on a simulated node, with its files and its loop device's backing image dropped from
/// the page cache (the DataUpload read a freshly exposed snapshot, cold). Returns the mount
/// path and the reader pod's name (delete it after).
///
/// # Errors
/// The pod did not run, or the cache could not be dropped.
pub async fn volume_for_bare_backup(
    world: &World,
    namespace: &str,
    pvc: &str,
) -> anyhow::Result<(PathBuf, String)> {
    let sim = world.sim()?;
    let name = "bench-bare-reader".to_owned();
    let path = mount_in_reader(world, namespace, &name, pvc).await?;
    evict_from_page_cache(&path).context("dropping the volume's files from the page cache")?;
    let claims: Api<PersistentVolumeClaim> = Api::namespaced(world.client()?, namespace);
    let pv = claims.get(pvc).await?.spec.and_then(|s| s.volume_name).unwrap_or_default();
    evict_file(&sim.volume_image(&pv))
        .context("dropping the volume's image from the page cache")?;
    Ok((path, name))
}

/// A fresh copy of claim `pvc` of `namespace`, the way a DataUpload sees its volume: a
/// VolumeSnapshot of it, a new claim from that snapshot (the simulated driver copies the image
/// just before), mounted by a reader pod and left in the page cache as the copy left it.
/// Returns the mount path and the names to delete after ([`remove_fresh_copy`]).
///
/// # Errors
/// The snapshot, claim or pod did not become ready.
pub async fn fresh_copy_for_bare_backup(
    world: &World,
    namespace: &str,
    pvc: &str,
    size: &str,
) -> anyhow::Result<(PathBuf, [String; 3])> {
    let sim = world.sim()?;
    let names = ["bench-snap", "bench-copy", "bench-copy-reader"].map(String::from);
    let [snap, copy, reader] = &names;
    sim.snapshot_pvc(namespace, pvc, snap).await?;
    sim.wait_snapshot_ready(namespace, snap, Duration::from_secs(120)).await?;
    let binding = ferry_sim::Binding::Immediate;
    sim.create_pvc_from_snapshot(namespace, copy, snap, size, VolumeMode::Filesystem, binding)
        .await?;
    sim.wait_pvc_bound(namespace, copy, Duration::from_secs(120)).await?;
    let path = mount_in_reader(world, namespace, reader, copy).await?;
    Ok((path, names))
}

/// Starts pod `reader` mounting claim `pvc` and returns where the claim's files are.
async fn mount_in_reader(
    world: &World,
    namespace: &str,
    reader: &str,
    pvc: &str,
) -> anyhow::Result<PathBuf> {
    let sim = world.sim()?;
    let pod = ferry_sim::pod_object(reader, pvc, VolumeMode::Filesystem)?;
    let pods: Api<Pod> = Api::namespaced(world.client()?, namespace);
    pods.create(&PostParams::default(), &pod).await.context("creating the reader pod")?;
    let pod = sim.wait_pod_running(namespace, reader, Duration::from_secs(120)).await?;
    Ok(sim.pod_claim_path(&pod, pvc).await?)
}

/// Deletes what [`fresh_copy_for_bare_backup`] made.
///
/// # Errors
/// The API server refused.
pub async fn remove_fresh_copy(
    world: &World,
    namespace: &str,
    names: &[String; 3],
) -> anyhow::Result<()> {
    use ferry_api::VolumeSnapshot;
    let [snap, copy, reader] = names;
    remove_reader(world, namespace, reader).await?;
    let client = world.client()?;
    let dp = DeleteParams::default();
    Api::<PersistentVolumeClaim>::namespaced(client.clone(), namespace).delete(copy, &dp).await?;
    Api::<VolumeSnapshot>::namespaced(client, namespace).delete(snap, &dp).await?;
    Ok(())
}

/// `ferry repo init` and `ferry backup` of the files at `data` into a new repository (named
/// with `label`) on the demo's S3 server; returns the backup's wall time.
///
/// # Errors
/// Either command failed.
pub async fn bare_backup(
    world: &World,
    ferry: &Path,
    data: &Path,
    label: &str,
) -> anyhow::Result<Duration> {
    let dir = tempfile::Builder::new().prefix("ferry-demo-bare-").tempdir()?;
    let password = dir.path().join("password");
    std::fs::write(&password, "ferry-demo-bench")?;
    let repo = format!("s3://{BUCKET}/bench/bare-{}-{label}", std::process::id());
    let endpoint = world.s3()?.endpoint().to_owned();
    let run = |args: Vec<std::ffi::OsString>| {
        let mut cmd = tokio::process::Command::new(ferry);
        cmd.args(args)
            .arg("--repo")
            .arg(&repo)
            .arg("--password-file")
            .arg(&password)
            .args(["--s3-endpoint", &endpoint, "--s3-region", "us-east-1"])
            // The demo's repository lives and dies with the demo: nothing kept in ~/.cache.
            .arg("--no-cache")
            .env("AWS_ACCESS_KEY_ID", ACCESS_KEY)
            .env("AWS_SECRET_ACCESS_KEY", SECRET_KEY)
            .env("AWS_EC2_METADATA_DISABLED", "true")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .kill_on_drop(true);
        cmd
    };
    let status = run(vec!["repo".into(), "init".into()]).status().await?;
    if !status.success() {
        bail!("ferry repo init --repo {repo} failed: {status}");
    }
    let start = Instant::now();
    let status = run(vec!["backup".into(), data.as_os_str().to_owned()]).status().await?;
    let took = start.elapsed();
    if !status.success() {
        bail!("ferry backup --repo {repo} failed: {status}");
    }
    Ok(took)
}

/// Writes back and drops every file under `root` from the page cache (`POSIX_FADV_DONTNEED`),
/// so that reading it again goes to the disk, as reading a snapshot just exposed does.
fn evict_from_page_cache(root: &Path) -> std::io::Result<()> {
    let mut dirs = vec![root.to_owned()];
    while let Some(dir) = dirs.pop() {
        for entry in std::fs::read_dir(&dir)? {
            let entry = entry?;
            let kind = entry.file_type()?;
            if kind.is_dir() {
                dirs.push(entry.path());
            } else if kind.is_file() {
                evict_file(&entry.path())?;
            }
        }
    }
    Ok(())
}

/// Writes back and drops one file from the page cache.
fn evict_file(path: &Path) -> std::io::Result<()> {
    use nix::fcntl::{PosixFadviseAdvice, posix_fadvise};
    let file = std::fs::File::open(path)?;
    file.sync_all()?;
    posix_fadvise(&file, 0, 0, PosixFadviseAdvice::POSIX_FADV_DONTNEED)
        .map_err(std::io::Error::from)
}

/// Deletes the reader pod of [`volume_for_bare_backup`].
///
/// # Errors
/// The API server refused.
pub async fn remove_reader(world: &World, namespace: &str, name: &str) -> anyhow::Result<()> {
    let pods: Api<Pod> = Api::namespaced(world.client()?, namespace);
    pods.delete(name, &DeleteParams::default()).await.context("deleting the reader pod")?;
    Ok(())
}

/// The bench's report, with the targets next to the readings.
pub fn print(bench: &Bench) {
    println!("\n\x1b[1mNode agent targets\x1b[0m");
    for (node, bytes) in &bench.idle_rss {
        let verdict = if *bytes < 50 << 20 { "met" } else { "NOT met" };
        println!(
            "  agent on {node}: {} resident when idle (target < 50 MiB: {verdict})",
            mb(*bytes)
        );
    }
    if let (Some(upload), Some(bare)) = (&bench.upload, bench.bare) {
        let ratio = upload.elapsed.as_secs_f64() / bare.as_secs_f64().max(0.001);
        let verdict = if ratio <= 1.5 { "met" } else { "NOT met" };
        println!(
            "  first backup of {}: DataUpload created -> Completed {:.1}s (exposing {:.1}s, \
             moving {:.1}s), bare `ferry backup` from a cold page cache {:.1}s: {ratio:.2}x \
             (target <= 1.5x: {verdict})",
            mb(upload.bytes),
            upload.elapsed.as_secs_f64(),
            upload.elapsed.saturating_sub(upload.moving).as_secs_f64(),
            upload.moving.as_secs_f64(),
            bare.as_secs_f64()
        );
        if !bench.timeline.is_empty() {
            println!("  its Events, from the first:");
        }
        for (after, reason, note) in &bench.timeline {
            println!("    +{after:>5.1}s {reason:<11} {note}");
        }
        if let Some(fresh) = bench.bare_fresh {
            let ratio = upload.elapsed.as_secs_f64() / fresh.as_secs_f64().max(0.001);
            println!(
                "  bare `ferry backup` of a fresh snapshot copy of the volume {:.1}s: {ratio:.2}x; \
                 moving alone {:.2}x",
                fresh.as_secs_f64(),
                upload.moving.as_secs_f64() / fresh.as_secs_f64().max(0.001)
            );
        }
        match upload.first_progress {
            Some(p) => {
                let verdict = if p <= Duration::from_secs(5) { "met" } else { "NOT met" };
                println!(
                    "  progress on the CR {:.1}s after InProgress (target <= 5s: {verdict})",
                    p.as_secs_f64()
                );
            }
            None => println!("  progress on the CR: the upload finished before any was seen"),
        }
    }
}
