//! `ferry-demo`: Ferry's main job end to end on one machine, with visible progress.
//!
//! It starts a real node (control plane, kubelet with containerd, the CSI hostpath driver; see
//! `ferry_testbed::realnode`), an S3 server (moto or MinIO), installs Ferry from its Helm chart
//! and runs the real `velero server` on the node; an application pod fills a PVC; `velero
//! backup create --snapshot-move-data --data-mover ferry` backs it up through Ferry, again
//! incrementally after a change; `velero restore create` restores it into another namespace,
//! and the restored volume is compared with the source file by file. Where the real node cannot
//! start, it says why and runs on the node simulator (three simulated nodes, one `ferry agent`
//! each). Everything is torn down at the end, also on failure and on Ctrl-C. Exit status: 0
//! when the restore is identical, 1 otherwise, 130 when interrupted.

mod act;
mod bench;
mod dataset;
mod volumes;
mod watch;
mod world;

use std::path::PathBuf;
use std::process::ExitCode;
use std::time::Instant;

use clap::Parser;
use tokio::signal::unix::{SignalKind, signal};

use crate::act::{Options, Report, mb, rate};
use crate::world::World;

/// Ferry end to end: Velero backs up and restores a PVC through Ferry, installed from its chart
/// on a real node (or the node simulator).
#[derive(Debug, Parser)]
#[command(version)]
struct Args {
    /// The `ferry` binary the agents and the repository commands run.
    #[arg(long)]
    ferry: PathBuf,
    /// Size of the application's data, in MiB.
    #[arg(long, default_value_t = 160, value_parser = clap::value_parser!(u64).range(8..=4096))]
    size: u64,
    /// About how many files hold it.
    #[arg(long, default_value_t = 300, value_parser = clap::value_parser!(u64).range(40..=100_000))]
    files: u64,
    /// Also measure the node agent's targets: idle memory, DataUpload time against a bare
    /// `ferry backup` of the same data, how soon progress shows.
    #[arg(long)]
    bench: bool,
    /// Use MinIO (this `minio` binary) as the S3 server instead of moto, whose single Python
    /// thread otherwise limits how fast any upload can go.
    #[arg(long, value_name = "BIN")]
    minio: Option<PathBuf>,
    /// Keep the simulated nodes' volumes, snapshots and mounts in this folder (default: the
    /// temp folder). On a file system with reflinks (XFS, btrfs) the simulated CSI driver
    /// clones a snapshot into a new volume copy-on-write, as real CSI drivers do, instead of
    /// copying it.
    #[arg(long, value_name = "DIR")]
    sim_dir: Option<PathBuf>,
    /// Run on the node simulator (three simulated nodes, one `ferry agent` process each)
    /// instead of a real node; `--bench` and `--sim-dir` imply it. Without it the demo falls
    /// back to the simulator only when the real node cannot start here, and says why.
    #[arg(long)]
    sim: bool,
}

fn main() -> ExitCode {
    let args = Args::parse();
    ferry_testbed::install_crypto_provider();
    let ferry = match std::fs::canonicalize(&args.ferry) {
        Ok(path) => path,
        Err(e) => {
            eprintln!("ferry-demo: --ferry {}: {e}", args.ferry.display());
            return ExitCode::from(2);
        }
    };
    let opts = Options {
        ferry,
        size_mib: args.size,
        files: usize::try_from(args.files).unwrap_or(usize::MAX),
        bench: args.bench,
        minio: args.minio,
        sim: args.sim || args.bench || args.sim_dir.is_some(),
        sim_dir: args.sim_dir,
    };
    let runtime =
        match tokio::runtime::Builder::new_multi_thread().worker_threads(4).enable_all().build() {
            Ok(rt) => rt,
            Err(e) => {
                eprintln!("ferry-demo: starting the runtime: {e}");
                return ExitCode::FAILURE;
            }
        };
    runtime.block_on(demo(opts))
}

enum Outcome {
    Done,
    Failed(anyhow::Error),
    Interrupted(&'static str),
}

async fn demo(opts: Options) -> ExitCode {
    let start = Instant::now();
    let mut world = World::default();
    let mut report = Report::default();
    let (mut int, mut term) =
        match (signal(SignalKind::interrupt()), signal(SignalKind::terminate())) {
            (Ok(i), Ok(t)) => (i, t),
            (Err(e), _) | (_, Err(e)) => {
                eprintln!("ferry-demo: installing signal handlers: {e}");
                return ExitCode::FAILURE;
            }
        };
    let outcome = tokio::select! {
        r = act::run(&mut world, &opts, &mut report) => match r {
            Ok(()) => Outcome::Done,
            Err(e) => Outcome::Failed(e),
        },
        _ = int.recv() => Outcome::Interrupted("SIGINT"),
        _ = term.recv() => Outcome::Interrupted("SIGTERM"),
    };
    if let Outcome::Failed(e) = &outcome {
        eprintln!("\n\x1b[1;31mferry-demo failed:\x1b[0m {e:#}");
        let logs = world.agent_logs(30);
        if !logs.is_empty() {
            eprintln!("{logs}");
        }
        if let Some(velero) = &world.velero_server {
            eprintln!(
                "--- velero server (last 40 lines above debug level)\n{}",
                velero.log_tail(40)
            );
        }
    }
    if let Outcome::Interrupted(signal) = &outcome {
        eprintln!("\nferry-demo: {signal} received, tearing down");
    }
    println!(
        "\n\x1b[1mTearing down: Velero, Ferry, the nodes (mounts, loop devices, cgroups), S3, control plane\x1b[0m"
    );
    let problems = world.teardown().await;
    for p in &problems {
        eprintln!("  teardown: {p}");
    }
    if problems.is_empty() {
        println!("  everything stopped and removed");
    }
    let code = match outcome {
        Outcome::Done if act::verdict(&report) && problems.is_empty() => ExitCode::SUCCESS,
        Outcome::Interrupted(_) => ExitCode::from(130),
        _ => ExitCode::FAILURE,
    };
    summary(&report, start, code == ExitCode::SUCCESS);
    code
}

fn summary(report: &Report, start: Instant, ok: bool) {
    if report.transfers.is_empty() {
        return;
    }
    println!("\n\x1b[1mSummary\x1b[0m");
    for t in &report.transfers {
        let new = t.incremental.map(|b| format!("  new {:>10}", mb(b))).unwrap_or_default();
        println!(
            "  {:<8} {:<26} node {:<7} {:>10} in {:>5.1}s ({:>10}){new}",
            t.what,
            t.name,
            t.node,
            mb(t.bytes),
            t.elapsed.as_secs_f64(),
            rate(t),
        );
    }
    if let Some(t) = report.transfers.last() {
        println!("  snapshot restored: {}", t.snapshot);
    }
    let mut nodes: Vec<&str> = report.transfers.iter().map(|t| t.node.as_str()).collect();
    nodes.sort_unstable();
    nodes.dedup();
    println!("  nodes used: {}", nodes.join(", "));
    if report.files > 0 {
        let same = if report.differences.is_empty() {
            "identical to the source"
        } else {
            "DIFFERENT from the source"
        };
        println!("  restored volume: {} files, {}: {same}", report.files, mb(report.bytes));
    }
    println!("  total time: {:.1}s", start.elapsed().as_secs_f64());
    if let Some(bench) = &report.bench {
        crate::bench::print(bench);
    }
    println!("  {}", if ok { "\x1b[1;32mOK\x1b[0m" } else { "\x1b[1;31mFAILED\x1b[0m" });
}
