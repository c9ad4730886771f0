//! Changed-block tracking on a large block volume: what an incremental costs when Ferry reads
//! only the ranges changed since the parent (`ReadPlan::ChangedSinceParent`, what the agent
//! does with a CSI driver's `GetMetadataDelta` answer), against Ferry's full-read incremental
//! of the same change (`ReadPlan::Everything`: every byte of the device read, zeros and known
//! chunks skipped, what the agent does without changed-block tracking).
//!
//! The volume is a loop device over a sparse image file, as the CSI hostpath driver makes its
//! block volumes: `--size` GiB with `--data` GiB written in 4 MiB extents spread evenly. The
//! first backup reads only those extents (`ReadPlan::Only`, the driver's allocated ranges).
//! Then `--change` percent of the volume is rewritten in 1 MiB extents at random places (half
//! inside the data, half in free space), through the device, and two incrementals of that one
//! state run, each with the first backup as parent and each in the repository as the first
//! backup left it (the full read in a copy of it), so both read and store the same change.
//! Both incrementals are restored and compared with the device byte for byte (`--no-verify`
//! skips that).
//!
//! The CSI driver's own cost of computing the delta is not in these figures: it depends on the
//! storage system (the hostpath driver compares its two snapshot files; a real array reads its
//! metadata).
//!
//! ```text
//! cargo build --release -p ferry-benches --bin cbt-volume
//! target/release/cbt-volume [--size 50] [--data 5] [--change 1] [--work /var/tmp]
//!                            [--repo-dir /dev/shm] [--drop-caches]
//! ```
//!
//! Needs root and `losetup`. The loop device and the work folder are released on exit, also
//! after an error or Ctrl-C (which stops the backup or restore under way).

use std::fs::{File, OpenOptions};
use std::io::Read;
use std::os::unix::fs::FileExt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::time::Instant;

use clap::Parser;
use ferry_benches::SeededRng;
use ferry_repo::{
    InitOptions, ReadPlan, Repository, SnapshotId, VolumeBackupOptions, VolumeBackupSummary,
    VolumeRestoreOptions, backup_volume, restore_volume,
};
use ferry_store::{FsStore, ObjectStore};
use tokio_util::sync::CancellationToken;

type Result<T> = std::result::Result<T, Box<dyn std::error::Error>>;

const MIB: u64 = 1 << 20;
const GIB: u64 = 1 << 30;
const DATA_EXTENT: u64 = 4 * MIB;
const CHANGE_EXTENT: u64 = MIB;

#[derive(Debug, Parser)]
#[command(about = "Incremental block backups by changed ranges against a full read")]
struct Args {
    /// Volume size in GiB.
    #[arg(long, default_value_t = 50)]
    size: u64,
    /// GiB of data on the volume before the first backup.
    #[arg(long, default_value_t = 5)]
    data: u64,
    /// Percent of the volume rewritten before the incrementals.
    #[arg(long, default_value_t = 1.0)]
    change: f64,
    /// Where the image, the repositories and the restores go (a folder is made inside).
    #[arg(long, default_value = "/var/tmp")]
    work: PathBuf,
    /// Where the two repositories go instead (a folder is made inside), e.g. `/dev/shm` to take
    /// the storage's write speed out of the comparison: both incrementals store the same change.
    #[arg(long)]
    repo_dir: Option<PathBuf>,
    /// Seed of the data and of the changed places.
    #[arg(long, default_value_t = 1)]
    seed: u64,
    /// Skip restoring the incrementals and comparing them with the device.
    #[arg(long)]
    no_verify: bool,
    /// Empty the page cache before each backup (`sync`, then 3 into
    /// `/proc/sys/vm/drop_caches`, as `volume.sh` does), so every backup reads from the disk.
    #[arg(long)]
    drop_caches: bool,
}

/// Writes dirty pages out and empties the page cache, when asked to.
fn drop_caches(asked: bool) -> Result<()> {
    if asked {
        Command::new("sync").status()?;
        std::fs::write("/proc/sys/vm/drop_caches", "3")?;
    }
    Ok(())
}

/// A loop device over an image file, detached on drop.
struct Loop(PathBuf);

impl Loop {
    fn attach(image: &Path) -> Result<Self> {
        let out = Command::new("losetup").arg("--find").arg("--show").arg(image).output()?;
        if !out.status.success() {
            return Err(format!("losetup: {}", String::from_utf8_lossy(&out.stderr)).into());
        }
        Ok(Self(PathBuf::from(String::from_utf8_lossy(&out.stdout).trim())))
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = Command::new("losetup").arg("-d").arg(&self.0).status();
    }
}

/// Ascending, disjoint ranges: sorted, overlapping and touching ones merged.
fn merged(mut ranges: Vec<(u64, u64)>) -> Vec<(u64, u64)> {
    ranges.sort_unstable();
    let mut out: Vec<(u64, u64)> = Vec::with_capacity(ranges.len());
    for (offset, len) in ranges {
        match out.last_mut() {
            Some((o, l)) if *o + *l >= offset => *l = (*l).max(offset + len - *o),
            _ => out.push((offset, len)),
        }
    }
    out
}

/// Writes `len` seeded random bytes at `offset` of `file`, 1 MiB at a time.
fn write_random(file: &File, rng: &mut SeededRng, offset: u64, len: u64) -> Result<()> {
    let mut buf = vec![0u8; MIB as usize];
    let mut done = 0;
    while done < len {
        let n = (len - done).min(MIB) as usize;
        rng.fill(&mut buf[..n]);
        file.write_all_at(&buf[..n], offset + done)?;
        done += n as u64;
    }
    Ok(())
}

/// Copies the folder tree `from` to `to` (regular files and folders: a file-system repository).
fn copy_tree(from: &Path, to: &Path) -> Result<()> {
    std::fs::create_dir(to)?;
    for entry in std::fs::read_dir(from)? {
        let entry = entry?;
        let target = to.join(entry.file_name());
        if entry.file_type()?.is_dir() {
            copy_tree(&entry.path(), &target)?;
        } else {
            std::fs::copy(entry.path(), &target)?;
        }
    }
    Ok(())
}

/// Whether two files of `size` bytes hold the same bytes (read 8 MiB at a time).
fn same_bytes(a: &Path, b: &Path, size: u64) -> Result<bool> {
    let (mut a, mut b) = (File::open(a)?, File::open(b)?);
    let (mut x, mut y) = (vec![0u8; 8 * MIB as usize], vec![0u8; 8 * MIB as usize]);
    let mut done = 0;
    while done < size {
        let n = (size - done).min(8 * MIB) as usize;
        a.read_exact(&mut x[..n])?;
        b.read_exact(&mut y[..n])?;
        if x[..n] != y[..n] {
            return Ok(false);
        }
        done += n as u64;
    }
    Ok(true)
}

/// CPU seconds (user and system, all threads) this process has used so far, from
/// `/proc/self/stat`, whose times are in USER_HZ ticks (100 a second on Linux).
fn cpu_seconds() -> Result<f64> {
    let stat = std::fs::read_to_string("/proc/self/stat")?;
    // The fields after the command name (which may hold spaces) start at field 3, the state:
    // utime and stime are fields 14 and 15.
    let rest = stat.rsplit_once(')').ok_or("no command name in /proc/self/stat")?.1;
    let field = |n: usize| -> Result<f64> {
        let value = rest.split_whitespace().nth(n - 3).ok_or("/proc/self/stat is short")?;
        Ok(value.parse::<f64>()? / 100.0)
    };
    Ok(field(14)? + field(15)?)
}

fn gbps(bytes: u64, secs: f64) -> f64 {
    bytes as f64 / secs / 1e9
}

/// A table row; `changed` is the change an incremental reads for (none for the first backup).
fn row(label: &str, (s, cpu): &(VolumeBackupSummary, f64), changed: Option<u64>) {
    let secs = s.duration.as_secs_f64();
    let ratio =
        changed.map_or("-".to_owned(), |c| format!("{:.2}", s.bytes_read as f64 / c.max(1) as f64));
    println!(
        "| {label} | {secs:.2} | {cpu:.2} | {:.1} | {ratio} | {:.1} | {:.1} |",
        s.bytes_read as f64 / MIB as f64,
        s.bytes_from_parent as f64 / MIB as f64,
        gbps(s.size, secs),
    );
}

async fn backup(
    repo: &Repository,
    device: &Path,
    parent: Option<SnapshotId>,
    plan: ReadPlan,
    size: u64,
    cancel: &CancellationToken,
) -> Result<(VolumeBackupSummary, f64)> {
    let options = VolumeBackupOptions {
        parent,
        source: "cbt-volume benchmark".into(),
        read_plan: plan,
        plan_size: Some(size),
        ..VolumeBackupOptions::default()
    };
    let cpu = cpu_seconds()?;
    let summary = backup_volume(repo, device, &options, None, cancel).await?;
    Ok((summary, cpu_seconds()? - cpu))
}

async fn verify(
    repo: &Repository,
    id: &SnapshotId,
    device: &Path,
    dir: &Path,
    size: u64,
    cancel: &CancellationToken,
) -> Result<()> {
    let target = dir.join(format!("restore-{id}"));
    let started = Instant::now();
    restore_volume(repo, id, &target, &VolumeRestoreOptions::default(), None, cancel).await?;
    let restored = started.elapsed().as_secs_f64();
    let same = same_bytes(&target, device, size)?;
    std::fs::remove_file(&target)?;
    if !same {
        return Err(format!("snapshot {id} does not restore the device's bytes").into());
    }
    eprintln!("cbt-volume: snapshot {id} restored in {restored:.1} s and equal to the device");
    Ok(())
}

#[tokio::main]
async fn main() -> Result<()> {
    let args = Args::parse();
    if args.size == 0
        || args.data == 0
        || args.data > args.size
        || !(0.0..=100.0).contains(&args.change)
    {
        return Err("need 0 < --data <= --size and 0 <= --change <= 100".into());
    }
    let size = args.size * GIB;
    let work = tempfile::Builder::new().prefix("ferry-cbt-bench.").tempdir_in(&args.work)?;
    let cancel = CancellationToken::new();
    // Ctrl-C stops the backup or restore under way; the guards then release the loop device
    // and the work folder.
    let interrupt = cancel.clone();
    tokio::spawn(async move {
        if tokio::signal::ctrl_c().await.is_ok() {
            interrupt.cancel();
        }
    });
    let mut rng = SeededRng::new(args.seed);

    // The volume: a sparse image with data extents spread evenly, seen through a loop device.
    let image = work.path().join("volume.img");
    let file = OpenOptions::new().create_new(true).read(true).write(true).open(&image)?;
    file.set_len(size)?;
    let extents = args.data * GIB / DATA_EXTENT;
    let stride = size.checked_div(extents).map_or(size, |s| s / DATA_EXTENT * DATA_EXTENT);
    let mut allocated = Vec::new();
    for i in 0..extents {
        write_random(&file, &mut rng, i * stride, DATA_EXTENT)?;
        allocated.push((i * stride, DATA_EXTENT));
    }
    file.sync_all()?;
    drop(file);
    let device = Loop::attach(&image)?;

    // Removed on drop, like the work folder.
    let own_repos = args
        .repo_dir
        .as_ref()
        .map(|dir| tempfile::Builder::new().prefix("ferry-cbt-bench-repos.").tempdir_in(dir))
        .transpose()?;
    let repos =
        own_repos.as_ref().map_or_else(|| work.path().join("repos"), |d| d.path().to_owned());
    std::fs::create_dir_all(repos.join("repo"))?;
    let store: Arc<dyn ObjectStore> = Arc::new(FsStore::open(repos.join("repo"))?);
    let password = format!("cbt-volume-benchmark-{}", rng.next_u64());
    let (repo, _) =
        Repository::init(store, password.as_bytes(), &InitOptions::default(), &cancel).await?;

    drop_caches(args.drop_caches)?;
    let first =
        backup(&repo, &device.0, None, ReadPlan::Only(merged(allocated)), size, &cancel).await?;

    // The change: 1 MiB extents at random MiB-aligned places, half of them in the data.
    let count = ((size as f64 * args.change / 100.0) / CHANGE_EXTENT as f64).round() as u64;
    let mut changed = Vec::new();
    let dev = OpenOptions::new().write(true).open(&device.0)?;
    for i in 0..count {
        let offset = if i % 2 == 0 && extents > 0 {
            rng.below(extents) * stride + rng.below(DATA_EXTENT / CHANGE_EXTENT) * CHANGE_EXTENT
        } else {
            rng.below(size / CHANGE_EXTENT) * CHANGE_EXTENT
        };
        write_random(&dev, &mut rng, offset, CHANGE_EXTENT)?;
        changed.push((offset, CHANGE_EXTENT));
    }
    dev.sync_all()?;
    drop(dev);
    let changed = merged(changed);
    let changed_bytes: u64 = changed.iter().map(|(_, l)| l).sum();

    // Each incremental starts from the same repository: the full read gets a copy of it as it
    // was after the first backup, so both store the changed chunks.
    let copy = repos.join("repo-copy");
    copy_tree(&repos.join("repo"), &copy)?;
    let copied: Arc<dyn ObjectStore> = Arc::new(FsStore::open(&copy)?);
    let repo_copy = Repository::open(copied, password.as_bytes(), &cancel).await?;

    let parent = Some(first.0.snapshot_id);
    drop_caches(args.drop_caches)?;
    let delta =
        backup(&repo, &device.0, parent, ReadPlan::ChangedSinceParent(changed), size, &cancel)
            .await?;
    drop_caches(args.drop_caches)?;
    let full = backup(&repo_copy, &device.0, parent, ReadPlan::Everything, size, &cancel).await?;

    println!(
        "Volume {} GiB, {} GiB of data in {} extents of 4 MiB; changed {:.1} MiB ({} % of the volume) in 1 MiB extents.\n",
        args.size,
        args.data,
        extents,
        changed_bytes as f64 / MIB as f64,
        args.change
    );
    println!(
        "| backup | seconds | CPU seconds | MiB read | read / changed | MiB from parent | GB/s of volume |"
    );
    println!("|---|---:|---:|---:|---:|---:|---:|");
    row("first (allocated ranges)", &first, None);
    row("incremental, changed ranges", &delta, Some(changed_bytes));
    row("incremental, full read", &full, Some(changed_bytes));
    println!(
        "\nChanged ranges vs full read: {:.1}x faster, {:.2}x the changed bytes read.",
        full.0.duration.as_secs_f64() / delta.0.duration.as_secs_f64(),
        delta.0.bytes_read as f64 / changed_bytes.max(1) as f64
    );

    if !args.no_verify {
        verify(&repo, &delta.0.snapshot_id, &device.0, work.path(), size, &cancel).await?;
        verify(&repo_copy, &full.0.snapshot_id, &device.0, work.path(), size, &cancel).await?;
    }
    drop(device);
    Ok(())
}
