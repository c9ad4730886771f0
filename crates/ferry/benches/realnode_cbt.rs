//! Changed-block tracking through Ferry's agent on the real node (issue #22, item 6): a block
//! PVC of the CSI hostpath driver, backed up by DataUploads as Velero's CSI plugin creates them,
//! read by Ferry's agent (installed from its chart) through the driver's SnapshotMetadata
//! service behind the real csi-snapshot-metadata sidecar, into MinIO.
//!
//! ```text
//! cargo bench -p ferry --bench realnode_cbt -- --minio PATH [--size-gib 16] [--seed 1]
//! ```
//!
//! 1. The volume gets `--data-percent` of random data in 4 MiB extents spread evenly; the first
//!    backup reads the snapshot's allocated ranges (the PVC keeps its base snapshot).
//! 2. `--change-permille` of the volume is rewritten in distinct 1 MiB extents at random
//!    places; the incremental reads the ranges changed since the kept base.
//! 3. The agent is re-installed with `--changed-blocks off` and a fresh snapshot of the same
//!    data is backed up again: a full-read incremental (every byte of the device read, hashed
//!    and compared with the parent). Its parent already holds the change, so it uploads nothing:
//!    a lower bound on a full-read incremental of the change, which would also upload it.
//! 4. The delta incremental is restored into a new PVC and compared with the source (MD5 of the
//!    whole device); `ferry check --read-data` reads the repository.
//!
//! Each backup's timeline is taken from the agent's Events (`Accepted`, `Prepared`,
//! `InProgress`, `Completed`; microsecond times): the backup volume provisioned from the
//! snapshot (the driver's copy) and its pod placed, the volume published on the node, and the
//! data path (`InProgress` to `Completed`: opening the repository, asking the service, which
//! the report times, reading, storing). Both incrementals run on a freshly started agent at the
//! chart's log level. The bytes read are the agent's own count in the DataUpload's message.
//! Prints a Markdown table.
//!
//! Without `--bench` (as `cargo test --all-targets` runs bench targets) it only says how to run
//! it: it needs MinIO and tens of GiB of disk, and takes minutes.

use std::path::PathBuf;
use std::time::Instant;

use clap::Parser;
use ferry_api::DataUpload;
use ferry_testbed::S3Server;
use ferry_testbed::realnode::RealCluster;
use kube::api::Api;

#[allow(dead_code)] // The real-node suite's support; the benchmark uses part of it.
#[path = "../tests/realnode/node.rs"]
mod node;
#[allow(dead_code)]
#[path = "../tests/support/velero_crs.rs"]
mod velero_crs;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
/// The data written before the first backup comes in extents of this size.
const DATA_EXTENT: u64 = 4 * MIB;
/// The change comes in extents of this size.
const CHANGE_EXTENT: u64 = MIB;

type Error = Box<dyn std::error::Error>;

/// Changed-block tracking through Ferry's agent on the real node.
#[derive(Debug, Parser)]
struct Args {
    /// The `minio` binary (the S3 server; moto cannot keep up with a data mover).
    #[arg(long)]
    minio: Option<PathBuf>,
    /// Where MinIO keeps its data folder.
    #[arg(long, default_value = "/var/tmp")]
    minio_dir: PathBuf,
    /// The block volume's size, in GiB. The hostpath driver allocates every volume in full
    /// (`fallocate`), copies it whole for a snapshot (`cp`) and fills a volume made from a
    /// snapshot by copying all of it (`dd`): the source, the kept base snapshot, the new
    /// snapshot and the backup's volume each take this much disk at once.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=32))]
    size_gib: u64,
    /// Percent of the volume written with random data before the first backup.
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=50))]
    data_percent: u64,
    /// Per mille of the volume rewritten before the incrementals (10: 1 %).
    #[arg(long, default_value_t = 10, value_parser = clap::value_parser!(u64).range(1..=200))]
    change_permille: u64,
    /// Seed of the change's places.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Passed by `cargo bench`; without it nothing is measured.
    #[arg(long, hide = true)]
    bench: bool,
}

fn main() -> std::process::ExitCode {
    const HOW: &str = "realnode_cbt: a benchmark of minutes on the real node; run it with \
                       `cargo bench -p ferry --bench realnode_cbt -- --minio PATH`";
    // `cargo test` runs bench targets without `--bench` (and with its own arguments), `cargo
    // bench` of the whole workspace without `--minio`: neither measures anything.
    if !std::env::args().any(|a| a == "--bench") {
        println!("{HOW}");
        return std::process::ExitCode::SUCCESS;
    }
    // Without `--minio` (a `cargo bench` of everything, with its own flags) it says how.
    let given = std::env::args().any(|a| a == "--minio" || a.starts_with("--minio="));
    let args = match Args::try_parse() {
        Ok(args) if args.minio.is_some() => args,
        Err(e) if given => e.exit(),
        _ => {
            println!("{HOW} (no --minio given: nothing measured)");
            return std::process::ExitCode::SUCCESS;
        }
    };
    ferry_testbed::install_crypto_provider();
    let runtime = match tokio::runtime::Builder::new_multi_thread().enable_all().build() {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("realnode_cbt: starting the runtime: {e}");
            return std::process::ExitCode::FAILURE;
        }
    };
    match runtime.block_on(run(&args)) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("realnode_cbt failed: {e} ({e:?})");
            std::process::ExitCode::FAILURE
        }
    }
}

/// One backup's figures.
#[derive(Debug)]
struct Measured {
    what: &'static str,
    /// The DataUpload's name.
    name: String,
    /// From the VolumeSnapshot's creation until the DataUpload was seen Completed.
    wall: f64,
    /// `Accepted` → `Prepared`: the snapshot taken over, the backup's volume provisioned from
    /// it (the driver's copy), its holding pod placed.
    exposure: f64,
    /// `Prepared` → `InProgress`: the volume published on the node and found by the agent.
    publish: f64,
    /// `InProgress` → `Completed`: Ferry's data path.
    data_path: f64,
    /// How long the driver's service took to give all its ranges (part of the data path).
    answered: Option<f64>,
    /// Bytes the agent read from the device.
    read: u64,
    /// The DataUpload's message: which path, and why.
    message: String,
    /// The `Completed` Event's note (sizes, rate, what was new).
    note: String,
}

async fn run(args: &Args) -> Result<(), Error> {
    let minio = args.minio.as_deref().ok_or("--minio PATH is needed (the S3 server)")?;
    eprintln!("realnode_cbt: starting the real node and MinIO");
    let cluster = RealCluster::start().await?;
    let s3 =
        S3Server::start_minio(minio, &args.minio_dir, node::CREDENTIALS.0, node::CREDENTIALS.1)?;
    let measured = measure(args, &cluster, &s3).await;
    if measured.is_err() {
        eprintln!("{}", cluster.log_tail());
    }
    measured
}

/// Re-installs Ferry's chart with `--changed-blocks MODE` (the base snapshot kept, the chart's
/// log level); the install waits until the DaemonSet has rolled the agent over. From the
/// first install's `auto` to `auto`, the argument order changes, so the agent restarts either
/// way.
async fn restart_agent(cluster: &RealCluster, mode: &str) -> Result<(), Error> {
    let args = if mode == "auto" {
        format!("agent.extraArgs={{--changed-blocks,{mode},--progress-interval,1s}}")
    } else {
        format!("agent.extraArgs={{--progress-interval,1s,--changed-blocks,{mode}}}")
    };
    node::install_ferry(cluster, &["agent.keepBaseSnapshot=true", "agent.logLevel=info", &args])
        .await?;
    Ok(())
}

async fn measure(args: &Args, cluster: &RealCluster, s3: &S3Server) -> Result<(), Error> {
    let size = args.size_gib * GIB;
    // Four copies of the volume at once (see `--size-gib`), the repository, and room to spare.
    let needed = 4 * size + size / 5 + 4 * GIB;
    let free = free_bytes(cluster.nodes()[0].dir())?;
    if free < needed {
        return Err(format!(
            "{} GiB free where the node keeps its volumes; a {} GiB volume needs about {} GiB",
            free / GIB,
            args.size_gib,
            needed / GIB
        )
        .into());
    }
    let auto = [
        "agent.keepBaseSnapshot=true",
        "agent.logLevel=info",
        "agent.extraArgs={--progress-interval,1s,--changed-blocks,auto}",
    ];
    let _relay = node::install_on(cluster, s3, &auto).await?;
    let client = cluster.client()?;
    let ns = cluster.control_plane().unique_namespace("cbt-bench").await?;
    node::create_pvc(&client, &ns, "disk", &format!("{}Gi", args.size_gib), "Block").await?;

    // The data: extents spread evenly, each of fresh random bytes.
    let extents = size * args.data_percent / 100 / DATA_EXTENT;
    let stride = size / DATA_EXTENT / extents.max(1);
    eprintln!(
        "realnode_cbt: writing {extents} extents of 4 MiB into a {} GiB volume",
        args.size_gib
    );
    node::run_pod(
        &client,
        &ns,
        "disk",
        true,
        &format!(
            "set -e; i=0; while [ $i -lt {extents} ]; do \
             dd if=/dev/urandom of=/dev/volume bs=4M count=1 seek=$((i*{stride})) conv=notrunc \
             2>/dev/null; i=$((i+1)); done; sync"
        ),
    )
    .await?;
    let first = back_up(cluster, &ns, "allocated ranges (first backup)", "cbt-bench-1").await?;

    // The change: distinct 1 MiB extents at random places.
    let changes = change_places(size, args.change_permille, args.seed);
    let changed = changes.len() as u64 * CHANGE_EXTENT;
    eprintln!("realnode_cbt: rewriting {} MiB in 1 MiB extents", changed / MIB);
    let seeks: Vec<String> = changes.iter().map(u64::to_string).collect();
    let source_md5 = node::run_pod(
        &cluster.client()?,
        &ns,
        "disk",
        true,
        &format!(
            "set -e; for s in {}; do dd if=/dev/urandom of=/dev/volume bs=1M count=1 seek=$s \
             conv=notrunc 2>/dev/null; done; sync; \
             md5sum < /dev/volume | cut -d' ' -f1 > /dev/termination-log",
            seeks.join(" ")
        ),
    )
    .await?;
    // Each incremental on a freshly started agent (its repository cache is an emptyDir).
    restart_agent(cluster, "auto").await?;
    let delta = back_up(cluster, &ns, "changed ranges (delta)", "cbt-bench-2").await?;
    if !delta.message.contains("changed since the parent's snapshot") {
        return Err(format!("the incremental did not read by the delta: {}", delta.message).into());
    }

    eprintln!("realnode_cbt: re-installing the agent with --changed-blocks off");
    restart_agent(cluster, "off").await?;
    let full = back_up(cluster, &ns, "whole device (full read)", "cbt-bench-3").await?;
    if !full.message.contains("the whole device") {
        return Err(format!("the full read did not read the whole device: {}", full.message).into());
    }

    // The delta incremental restored and compared; the repository read whole.
    eprintln!("realnode_cbt: restoring the delta incremental");
    let client = cluster.client()?;
    let uploads: Api<DataUpload> = Api::namespaced(client.clone(), ferry_testbed::VELERO_NAMESPACE);
    let delta_du = uploads.get(&delta.name).await?;
    node::delete_pvc(&client, &ns, "disk").await?;
    let target_ns = cluster.control_plane().unique_namespace("cbt-bench-restored").await?;
    let size_text = format!("{}Gi", args.size_gib);
    let dd = node::data_download(
        &client,
        &target_ns,
        "disk",
        &size_text,
        "Block",
        &delta_du,
        "cbt-bench-restore",
    )
    .await?;
    let started = Instant::now();
    node::wait_download(&client, &node::name_of(&dd)).await?;
    let restore_wall = started.elapsed().as_secs_f64();
    let restored_md5 = node::device_md5(&client, &target_ns, "disk").await?;
    if restored_md5 != source_md5 {
        return Err(format!(
            "the restored device differs from the source: MD5 {restored_md5} against {source_md5}"
        )
        .into());
    }
    node::ferry_cli(cluster, s3.endpoint(), &ns, &["check", "--read-data"]).await?;
    node::delete_pvc(&client, &target_ns, "disk").await?;

    print_table(args, changed, &[&first, &delta, &full], restore_wall);
    Ok(())
}

/// A backup of `ns/disk` as Velero's CSI plugin makes it: a VolumeSnapshot, then a DataUpload.
async fn back_up(
    cluster: &RealCluster,
    ns: &str,
    what: &'static str,
    backup: &str,
) -> Result<Measured, Error> {
    eprintln!("realnode_cbt: {what}");
    // A client of its own: the previous steps' pooled connections may have been closed by the
    // API server meanwhile.
    let client = &cluster.client()?;
    let started = Instant::now();
    let snapshot =
        node::snapshot(client, ns, "disk").await.map_err(|e| format!("snapshot: {e:?}"))?;
    let du = node::data_upload(client, ns, "disk", &snapshot, backup)
        .await
        .map_err(|e| format!("creating the DataUpload: {e:?}"))?;
    let name = node::name_of(&du);
    let du = node::wait_upload(client, &name)
        .await
        .map_err(|e| format!("waiting for DataUpload {name}: {e:?}"))?;
    let wall = started.elapsed().as_secs_f64();
    node::agent_event_note(client, &name, "Completed").await?;
    let events = node::agent_event_list(client, &name).await?;
    let at = |reason: &str| {
        events
            .iter()
            .find(|e| e.reason.as_deref() == Some(reason))
            .and_then(|e| e.event_time.as_ref())
            .map(|t| t.0)
            .ok_or_else(|| format!("no {reason} Event with a time on DataUpload {name}"))
    };
    let exposure = at("Prepared")?.duration_since(at("Accepted")?).as_secs_f64();
    let publish = at("InProgress")?.duration_since(at("Prepared")?).as_secs_f64();
    let data_path = at("Completed")?.duration_since(at("InProgress")?).as_secs_f64();
    let note = events
        .iter()
        .find(|e| e.reason.as_deref() == Some("Completed"))
        .and_then(|e| e.note.clone())
        .unwrap_or_default();
    let message = du.status.clone().unwrap_or_default().message;
    let read = node::number_after(&message, "read ")
        .ok_or_else(|| format!("no count of bytes read in {message:?}"))?;
    // `answered in 850 ms` or `answered in 11.0 s`.
    let answered = message.split_once("answered in ").and_then(|(_, rest)| {
        let end = rest.find(|c: char| !(c.is_ascii_digit() || c == '.')).unwrap_or(rest.len());
        let value = rest[..end].parse::<f64>().ok()?;
        Some(if rest[end..].starts_with(" ms") { value / 1000.0 } else { value })
    });
    eprintln!("realnode_cbt:   {data_path:.2} s of data path, {read} bytes read: {note}");
    Ok(Measured { what, name, wall, exposure, publish, data_path, answered, read, message, note })
}

/// `permille`/1000 of a `size`-byte volume in distinct 1 MiB extents, as 1 MiB seek offsets,
/// at places drawn with `seed`.
fn change_places(size: u64, permille: u64, seed: u64) -> Vec<u64> {
    use rand::{Rng, SeedableRng};
    let slots = size / CHANGE_EXTENT;
    let wanted = (size * permille / 1000 / CHANGE_EXTENT).clamp(1, slots);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut chosen = std::collections::BTreeSet::new();
    while (chosen.len() as u64) < wanted {
        chosen.insert(rng.random_range(0..slots));
    }
    chosen.into_iter().collect()
}

fn print_table(args: &Args, changed: u64, steps: &[&Measured], restore_wall: f64) {
    println!(
        "\nA {} GiB block volume, {} % of it data in 4 MiB extents; {:.1} MiB changed in 1 MiB \
         extents (seed {}).\n",
        args.size_gib,
        args.data_percent,
        changed as f64 / MIB as f64,
        args.seed
    );
    println!(
        "| backup | snapshot to Completed | Accepted → Prepared (volume provisioned from the \
         snapshot) | Prepared → InProgress (published) | data path (InProgress → Completed) | \
         of which asking the driver | the rest: Ferry | MiB read | read / changed |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|---:|---:|");
    for (i, m) in steps.iter().enumerate() {
        let answered = m.answered.map_or_else(|| "-".to_owned(), |a| format!("{a:.2} s"));
        let ratio =
            if i == 0 { "-".to_owned() } else { format!("{:.2}", m.read as f64 / changed as f64) };
        println!(
            "| {} | {:.1} s | {:.1} s | {:.1} s | {:.2} s | {answered} | {:.2} s | {:.1} | {ratio} |",
            m.what,
            m.wall,
            m.exposure,
            m.publish,
            m.data_path,
            m.data_path - m.answered.unwrap_or(0.0),
            m.read as f64 / MIB as f64,
        );
    }
    if let [_, delta, full] = steps {
        let ferry_delta = delta.data_path - delta.answered.unwrap_or(0.0);
        println!(
            "\nData path: the full read takes {:.1}× the delta's; snapshot to Completed: {:.1}×.",
            full.data_path / delta.data_path,
            full.wall / delta.wall
        );
        if ferry_delta > 0.0 {
            println!(
                "Without asking the driver (its time is the storage system's): {:.1}×.",
                full.data_path / ferry_delta
            );
        }
    }
    println!(
        "\nRestore of the delta incremental (DataDownload to Completed): {restore_wall:.1} s; MD5 \
         equal; `ferry check --read-data` passed.\n"
    );
    for m in steps {
        println!("- {}: {}\n  Completed: {}", m.what, m.message, m.note);
    }
}

/// Bytes free to an unprivileged writer on the file system of `dir`.
fn free_bytes(dir: &std::path::Path) -> Result<u64, Error> {
    let st = nix::sys::statvfs::statvfs(dir)?;
    Ok(st.blocks_available().saturating_mul(st.fragment_size()))
}
