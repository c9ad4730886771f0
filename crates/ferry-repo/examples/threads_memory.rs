//! Peak resident memory of the data path by worker-thread count: a first backup and a restore
//! of a generated file tree and of a generated volume image, into a file-system repository,
//! each in a process of its own (so each peak is that operation's alone), at several thread
//! counts. Prints a Markdown table of the peaks (`VmHWM`) and wall times, and the least-squares
//! line through each column: the memory per thread (slope) and the base (intercept) that
//! `ferry_repo::thread_budget` plans with.
//!
//! `cargo run --release -p ferry-repo --example threads_memory -- [--tree-mib 300]
//! [--big-files] [--volume-mib 512] [--volume-chunk-kib 256] [--threads 1,2,4,8] [--runs 3]
//! [--put-delay-ms 0] [--work DIR]`
//!
//! `--volume-chunk-kib` sets the volume's chunk size (a power of two from 4 to 16384): small
//! chunks make many of them, which shows what a volume restore keeps per chunk.
//!
//! The data is generated from fixed seeds in a temporary directory (under `--work` if given)
//! that is deleted at the end. The tree is mixed: many small and medium source-like text files,
//! incompressible files up to 4 MiB, and a few files of 16–32 MiB; with `--big-files` only
//! files of 16–32 MiB (every worker then holds full buffers: the worst case per thread). The
//! image is sparse: per MiB, text, random data or a hole. A size of 0 leaves that data set out. Each cell is the median of `--runs` runs. Key derivation
//! uses test-grade costs so that its transient buffer does not hide the data path.
//!
//! `--put-delay-ms` holds every store write that long first, standing for an object store slower
//! than the workers: a worker that fills the shared open pack then waits, holding the sealed
//! pack, until the uploader takes it, the worst case of backup memory per thread.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use ferry_repo::{
    BackupOptions, InitOptions, KdfParams, Repository, RestoreOptions, SnapshotId,
    VolumeBackupOptions, VolumeRestoreOptions, backup_tree, backup_volume, restore, restore_volume,
};
use ferry_store::{Call, FsStore, Hook, Hooked, ObjectStore};
use rand::rngs::StdRng;
use rand::{Rng, RngCore, SeedableRng};
use tokio_util::sync::CancellationToken;

type Res<T> = Result<T, Box<dyn std::error::Error>>;

const MIB: u64 = 1 << 20;
const PASSWORD: &[u8] = b"threads-memory-benchmark";

/// The four operations measured, in table order.
const OPS: [&str; 4] = ["backup-tree", "restore-tree", "backup-volume", "restore-volume"];

fn main() -> Res<()> {
    let args: Vec<String> = std::env::args().skip(1).collect();
    if args.first().map(String::as_str) == Some("--child") {
        return child(&args[1..]);
    }
    driver(&args)
}

fn flag<'a>(args: &'a [String], name: &str) -> Option<&'a str> {
    args.iter().position(|a| a == name).and_then(|i| args.get(i + 1)).map(String::as_str)
}

// ---- driver ------------------------------------------------------------------------------

struct Sample {
    hwm_kib: u64,
    secs: f64,
}

fn driver(args: &[String]) -> Res<()> {
    let tree_mib: u64 = flag(args, "--tree-mib").unwrap_or("300").parse()?;
    let volume_mib: u64 = flag(args, "--volume-mib").unwrap_or("512").parse()?;
    let runs: usize = flag(args, "--runs").unwrap_or("3").parse()?;
    let delay: u64 = flag(args, "--put-delay-ms").unwrap_or("0").parse()?;
    let chunk_kib: u32 = flag(args, "--volume-chunk-kib").unwrap_or("256").parse()?;
    let threads: Vec<usize> = flag(args, "--threads")
        .unwrap_or("1,2,4,8")
        .split(',')
        .map(str::parse)
        .collect::<Result<_, _>>()?;
    let temp = match flag(args, "--work") {
        Some(dir) => tempfile::tempdir_in(dir)?,
        None => tempfile::tempdir()?,
    };
    let work = temp.path();
    let t = Instant::now();
    let big = args.iter().any(|a| a == "--big-files");
    let (files, tree_bytes) = generate_tree(&work.join("tree"), tree_mib * MIB, big)?;
    let volume_data = generate_volume(&work.join("volume.img"), volume_mib * MIB)?;
    println!(
        "generated: tree {files} files, {:.1} MiB; volume {volume_mib} MiB with {:.1} MiB of \
         data ({:.1} s)",
        tree_bytes as f64 / MIB as f64,
        volume_data as f64 / MIB as f64,
        t.elapsed().as_secs_f64()
    );
    sync();
    // samples[threads index][op index] = one sample per run
    let mut samples: Vec<Vec<Vec<Sample>>> =
        threads.iter().map(|_| OPS.iter().map(|_| Vec::new()).collect()).collect();
    for run in 0..runs {
        for (ti, &n) in threads.iter().enumerate() {
            for (pair, source, mib) in [(0, "tree", tree_mib), (2, "volume.img", volume_mib)] {
                if mib == 0 {
                    continue;
                }
                let repo = work.join("repo");
                let target = work.join("target");
                let how = How { threads: n, put_delay_ms: delay, chunk_kib };
                let backup = spawn(OPS[pair], work, &work.join(source), &repo, &how, None)?;
                let snapshot = backup.1.ok_or("the backup printed no snapshot id")?;
                samples[ti][pair].push(backup.0);
                let restored = spawn(OPS[pair + 1], work, &target, &repo, &how, Some(&snapshot))?;
                samples[ti][pair + 1].push(restored.0);
                remove(&repo)?;
                remove(&target)?;
                sync();
            }
            eprintln!("run {}/{runs}: {n} threads done", run + 1);
        }
    }
    print_table(&threads, &samples);
    Ok(())
}

fn remove(path: &Path) -> Res<()> {
    if path.is_dir() {
        std::fs::remove_dir_all(path)?;
    } else if path.exists() {
        std::fs::remove_file(path)?;
    }
    Ok(())
}

/// Writes dirty pages back, so one run's write-back does not land in the next run's time.
fn sync() {
    let _ = Command::new("sync").status();
}

/// How a child runs its operation.
struct How {
    threads: usize,
    put_delay_ms: u64,
    chunk_kib: u32,
}

/// Runs one operation in a child process; returns its sample and the snapshot id it printed.
fn spawn(
    op: &str,
    work: &Path,
    place: &Path,
    repo: &Path,
    how: &How,
    snapshot: Option<&str>,
) -> Res<(Sample, Option<String>)> {
    let threads = how.threads;
    let mut cmd = Command::new(std::env::current_exe()?);
    cmd.args(["--child", op, "--threads", &threads.to_string()])
        .args(["--put-delay-ms", &how.put_delay_ms.to_string()])
        .args(["--volume-chunk-kib", &how.chunk_kib.to_string()])
        .arg("--place")
        .arg(place)
        .arg("--repo")
        .arg(repo)
        .current_dir(work);
    if let Some(id) = snapshot {
        cmd.args(["--snapshot", id]);
    }
    let out = cmd.output()?;
    if !out.status.success() {
        return Err(format!(
            "{op} with {threads} threads failed: {}",
            String::from_utf8_lossy(&out.stderr)
        )
        .into());
    }
    let text = String::from_utf8(out.stdout)?;
    let field =
        |name: &str| text.split_whitespace().find_map(|w| w.strip_prefix(name)).map(str::to_owned);
    let sample = Sample {
        hwm_kib: field("hwm_kib=").ok_or("no hwm_kib")?.parse()?,
        secs: field("secs=").ok_or("no secs")?.parse()?,
    };
    Ok((sample, field("snapshot=")))
}

fn median(mut v: Vec<f64>) -> f64 {
    v.sort_by(f64::total_cmp);
    let n = v.len();
    if n == 0 {
        0.0
    } else if n % 2 == 1 {
        v[n / 2]
    } else {
        (v[n / 2 - 1] + v[n / 2]) / 2.0
    }
}

/// Least-squares line `y = base + slope * x`.
fn fit(points: &[(f64, f64)]) -> (f64, f64) {
    let n = points.len() as f64;
    let mx = points.iter().map(|p| p.0).sum::<f64>() / n;
    let my = points.iter().map(|p| p.1).sum::<f64>() / n;
    let sxx: f64 = points.iter().map(|p| (p.0 - mx).powi(2)).sum();
    let sxy: f64 = points.iter().map(|p| (p.0 - mx) * (p.1 - my)).sum();
    let slope = if sxx > 0.0 { sxy / sxx } else { 0.0 };
    (my - slope * mx, slope)
}

fn print_table(threads: &[usize], samples: &[Vec<Vec<Sample>>]) {
    // Operations that ran (a data set of size 0 is left out).
    let ops: Vec<usize> = (0..OPS.len()).filter(|&oi| !samples[0][oi].is_empty()).collect();
    let names: Vec<&str> = ops.iter().map(|&oi| OPS[oi]).collect();
    println!();
    println!("peak RSS (VmHWM, MiB) and wall time, median of each cell's runs [min–max MiB]:");
    println!();
    println!("| threads | {} |", names.join(" | "));
    println!("|---:|{}", "---:|".repeat(ops.len()));
    // Per operation: (threads, median) and (threads, largest) points.
    let mut medians: Vec<Vec<(f64, f64)>> = vec![Vec::new(); ops.len()];
    let mut maxima: Vec<Vec<(f64, f64)>> = vec![Vec::new(); ops.len()];
    for (ti, &n) in threads.iter().enumerate() {
        let mut row = format!("| {n} |");
        for (col, &oi) in ops.iter().enumerate() {
            let cell = &samples[ti][oi];
            let mib: Vec<f64> = cell.iter().map(|s| s.hwm_kib as f64 / 1024.0).collect();
            let lo = mib.iter().copied().fold(f64::INFINITY, f64::min);
            let hi = mib.iter().copied().fold(0.0, f64::max);
            let m = median(mib);
            let secs = median(cell.iter().map(|s| s.secs).collect());
            medians[col].push((n as f64, m));
            maxima[col].push((n as f64, hi));
            row.push_str(&format!(" {m:.1} [{lo:.1}–{hi:.1}], {secs:.2} s |"));
        }
        println!("{row}");
    }
    println!();
    println!("| least squares, MiB | {} |", names.join(" | "));
    println!("|---|{}", "---:|".repeat(ops.len()));
    for (name, points) in [("medians", &medians), ("largest", &maxima)] {
        let fits: Vec<(f64, f64)> = points.iter().map(|l| fit(l)).collect();
        let slopes: Vec<String> = fits.iter().map(|f| format!("{:.1}", f.1)).collect();
        let bases: Vec<String> = fits.iter().map(|f| format!("{:.1}", f.0)).collect();
        println!("| per thread (slope), {name} | {} |", slopes.join(" | "));
        println!("| base (intercept), {name} | {} |", bases.join(" | "));
    }
}

// ---- data --------------------------------------------------------------------------------

/// Source-like text: lines of words from a fixed vocabulary (zstd level 3 shrinks it ~3–4×).
struct Text {
    words: Vec<Vec<u8>>,
}

impl Text {
    fn new(rng: &mut StdRng) -> Self {
        let words = (0..4096)
            .map(|_| {
                let len = rng.random_range(2..12);
                (0..len).map(|_| b"etaoinshrdlucmfwypvbgkjqxz_"[rng.random_range(0..27)]).collect()
            })
            .collect();
        Self { words }
    }

    fn fill(&self, rng: &mut StdRng, out: &mut Vec<u8>, len: usize) {
        out.clear();
        while out.len() < len {
            let indent = rng.random_range(0..4) * 4;
            out.extend(std::iter::repeat_n(b' ', indent));
            for _ in 0..rng.random_range(3..12) {
                // Zipf-like: low indices far more often.
                let i = (rng.random_range(0.0f64..1.0).powi(3) * self.words.len() as f64) as usize;
                out.extend_from_slice(&self.words[i.min(self.words.len() - 1)]);
                out.push(b' ');
            }
            out.push(b'\n');
        }
        out.truncate(len);
    }
}

fn write_file(path: &Path, data: &[u8]) -> Res<()> {
    let mut f = BufWriter::new(File::create(path)?);
    f.write_all(data)?;
    f.flush()?;
    Ok(())
}

/// A mixed tree of about `total` bytes: 60 % in text files of 1–256 KiB, 25 % in random files
/// of 64 KiB–4 MiB, 15 % in files of 16–32 MiB (alternately text and random), 40 files a
/// directory; with `big`, all in files of 16–32 MiB. Returns the file count and bytes written.
fn generate_tree(root: &Path, total: u64, big: bool) -> Res<(u64, u64)> {
    let mut rng = StdRng::seed_from_u64(20);
    let text = Text::new(&mut rng);
    let mut buf = Vec::new();
    let (mut files, mut written) = (0u64, 0u64);
    let next = |rng: &mut StdRng, files: &mut u64| -> Res<PathBuf> {
        let dir =
            root.join(format!("d{:02}", *files / 400)).join(format!("s{:02}", *files / 40 % 10));
        std::fs::create_dir_all(&dir)?;
        *files += 1;
        Ok(dir.join(format!(
            "f{:05}.{}",
            *files,
            ["rs", "txt", "bin", "dat"][rng.random_range(0..4)]
        )))
    };
    let shares: &[(f64, u8)] = if big { &[(1.0, 2)] } else { &[(0.60, 0), (0.25, 1), (0.15, 2)] };
    for &(share, kind) in shares {
        let budget = (total as f64 * share) as u64;
        let mut used = 0u64;
        let mut big = 0u32;
        while used < budget {
            let len = match kind {
                0 => 1024u64 << rng.random_range(0..9), // 1 KiB .. 256 KiB
                1 => (64u64 << 10) << rng.random_range(0..7), // 64 KiB .. 4 MiB
                _ => rng.random_range(16 * MIB..=32 * MIB),
            }
            .min(budget - used)
            .max(1);
            let random = kind == 1 || (kind == 2 && big % 2 == 1);
            big += u32::from(kind == 2);
            if random {
                buf.resize(len as usize, 0);
                rng.fill_bytes(&mut buf);
            } else {
                text.fill(&mut rng, &mut buf, len as usize);
            }
            write_file(&next(&mut rng, &mut files)?, &buf)?;
            used += len;
        }
        written += used;
    }
    Ok((files, written))
}

/// A sparse image of `size` bytes: each MiB is text (40 %), random (30 %) or a hole (30 %).
/// Returns the bytes of data written.
fn generate_volume(path: &Path, size: u64) -> Res<u64> {
    use std::os::unix::fs::FileExt;
    let mut rng = StdRng::seed_from_u64(5);
    let text = Text::new(&mut rng);
    let file = File::create(path)?;
    file.set_len(size)?;
    let mut buf = Vec::new();
    let mut data = 0u64;
    for block in 0..size / MIB {
        match rng.random_range(0..10) {
            0..4 => text.fill(&mut rng, &mut buf, MIB as usize),
            4..7 => {
                buf.resize(MIB as usize, 0);
                rng.fill_bytes(&mut buf);
            }
            _ => continue,
        }
        file.write_all_at(&buf, block * MIB)?;
        data += MIB;
    }
    file.sync_all()?;
    Ok(data)
}

// ---- child -------------------------------------------------------------------------------

/// Holds every write for a fixed time before it is made.
#[derive(Debug)]
struct PutDelay(std::time::Duration);

#[async_trait::async_trait]
impl Hook for PutDelay {
    async fn before(&self, call: Call<'_>) {
        if matches!(call, Call::Put(_)) {
            tokio::time::sleep(self.0).await;
        }
    }
}

/// `VmHWM` and `VmRSS` of this process, in KiB.
fn memory_kib() -> (u64, u64) {
    let status = std::fs::read_to_string("/proc/self/status").unwrap_or_default();
    let get = |key: &str| {
        status
            .lines()
            .find_map(|l| l.strip_prefix(key))
            .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
            .unwrap_or(0)
    };
    (get("VmHWM:"), get("VmRSS:"))
}

fn child(args: &[String]) -> Res<()> {
    let op = args.first().ok_or("--child needs an operation")?.clone();
    let threads: usize = flag(args, "--threads").ok_or("--threads")?.parse()?;
    let place = PathBuf::from(flag(args, "--place").ok_or("--place")?);
    let repo_dir = PathBuf::from(flag(args, "--repo").ok_or("--repo")?);
    std::fs::create_dir_all(&repo_dir)?;
    let snapshot = flag(args, "--snapshot").map(str::to_owned);
    // The agent's runtime: tokio's multi-threaded default, one worker per core.
    let runtime = tokio::runtime::Builder::new_multi_thread().enable_all().build()?;
    let delay: u64 = flag(args, "--put-delay-ms").unwrap_or("0").parse()?;
    let mut store: Arc<dyn ObjectStore> = Arc::new(FsStore::open(&repo_dir)?);
    if delay > 0 {
        let hook = PutDelay(std::time::Duration::from_millis(delay));
        store = Arc::new(Hooked::new(store, hook));
    }
    let chunk_kib: u32 = flag(args, "--volume-chunk-kib").unwrap_or("256").parse()?;
    let chunk_size = chunk_kib.checked_mul(1024).ok_or("--volume-chunk-kib is too large")?;
    runtime.block_on(run_child(&op, threads, chunk_size, &place, store, snapshot.as_deref()))
}

async fn run_child(
    op: &str,
    threads: usize,
    chunk_size: u32,
    place: &Path,
    store: Arc<dyn ObjectStore>,
    snapshot: Option<&str>,
) -> Res<()> {
    let cancel = CancellationToken::new();
    let repo = if op.starts_with("backup") {
        let options =
            InitOptions { kdf: KdfParams::insecure_for_tests(), ..InitOptions::default() };
        Repository::init(store, PASSWORD, &options, &cancel).await?.0
    } else {
        Repository::open(store, PASSWORD, &cancel).await?
    };
    let before = memory_kib().1;
    let id = || -> Res<SnapshotId> { Ok(snapshot.ok_or("--snapshot")?.parse()?) };
    let started = Instant::now();
    let made = match op {
        "backup-tree" => {
            let options = BackupOptions { threads, ..BackupOptions::default() };
            Some(backup_tree(&repo, place, &options, None, &cancel).await?.snapshot_id)
        }
        "backup-volume" => {
            let options =
                VolumeBackupOptions { threads, chunk_size, ..VolumeBackupOptions::default() };
            Some(backup_volume(&repo, place, &options, None, &cancel).await?.snapshot_id)
        }
        "restore-tree" => {
            let options = RestoreOptions { threads, ..RestoreOptions::default() };
            restore(&repo, &id()?, place, &options, None, &cancel).await?;
            None
        }
        "restore-volume" => {
            let options = VolumeRestoreOptions { threads, ..VolumeRestoreOptions::default() };
            restore_volume(&repo, &id()?, place, &options, None, &cancel).await?;
            None
        }
        other => return Err(format!("unknown operation {other}").into()),
    };
    let secs = started.elapsed().as_secs_f64();
    let (hwm, _) = memory_kib();
    let mut line =
        format!("{op} threads={threads} secs={secs:.3} hwm_kib={hwm} rss_before_kib={before}");
    if let Some(id) = made {
        line.push_str(&format!(" snapshot={}", id.to_hex()));
    }
    println!("{line}");
    Ok(())
}
