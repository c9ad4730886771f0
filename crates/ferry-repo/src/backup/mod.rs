//! File-tree backup.
//!
//! ```text
//! walker (1 thread) --file jobs (bounded)--> file workers (N threads: read, chunk, hash,
//!        |                                    compress, encrypt, pack) --packs--> uploader
//!        +--tree events (bounded)--> tree builder (1 thread) --tree packs--> uploader
//! ```
//! Memory is bounded by the channel capacities, one read buffer and two open packs per
//! worker, the packs being uploaded, and the names of the directories on the current path.
//! The snapshot is written last, after the uploader has stored and indexed every pack.

mod exclude;
mod files;
mod meta;
mod trees;
mod walk;

use std::os::fd::OwnedFd;
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{BlobId, DEFAULT_DATA_LEVEL, Node, Snapshot, SnapshotId, Summary, Timestamp};
use crate::gc::{Lease, LeaseCheck, WRITER_LEASES};
use crate::place::Place;
use crate::progress::Counters;
use crate::progress::ProgressFn;
use crate::repo::claims::Claims;
use crate::repo::writer::{LocalPacker, Uploader, upload_cause};
use crate::repo::{MemIndex, Repository, hostname};
use files::FileWorker;
use trees::TreeBuilder;
use walk::Walker;

/// Options for [`backup_tree`].
#[derive(Debug, Clone)]
pub struct BackupOptions {
    /// Snapshot to compare with: unchanged files (same size, mtime, mode, owner) are not read.
    pub parent: Option<SnapshotId>,
    /// `key=value` tags.
    pub tags: Vec<(String, String)>,
    /// What is being backed up, in the caller's words; the path when empty.
    pub source: String,
    /// Host name to record; the machine's when `None`.
    pub hostname: Option<String>,
    /// zstd level for file data (0: no compression).
    pub compression_level: i32,
    /// File reader threads; 0 picks one per core plus one, fewer under a tight memory limit
    /// ([`crate::thread_budget::default_threads`]).
    pub threads: usize,
    /// Glob patterns of entries to leave out (see `exclude.rs`): a name at any depth
    /// (`*.log`), or a path from the root (`/tmp`, `cache/**`).
    pub exclude: Vec<String>,
}

impl Default for BackupOptions {
    fn default() -> Self {
        Self {
            parent: None,
            tags: Vec::new(),
            source: String::new(),
            hostname: None,
            compression_level: DEFAULT_DATA_LEVEL,
            threads: 0,
            exclude: Vec::new(),
        }
    }
}

/// What a backup did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BackupSummary {
    /// The new snapshot.
    pub snapshot_id: SnapshotId,
    /// Content bytes in the snapshot (a file with several hard links counted once).
    pub bytes_total: u64,
    /// Content bytes new to the repository.
    pub bytes_new: u64,
    /// Bytes added to storage.
    pub bytes_stored: u64,
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Entries recorded with an error.
    pub errors: u64,
    /// Wall time.
    pub duration: Duration,
}

/// State shared by the backup's threads.
pub(crate) struct Shared {
    pub(crate) repo: Repository,
    pub(crate) index: Arc<MemIndex>,
    claims: Claims,
    pub(crate) progress: Counters,
    /// Cancelled by the caller or by the first fatal error.
    pub(crate) stop: CancellationToken,
    pub(crate) handle: tokio::runtime::Handle,
    failure: Mutex<Option<RepoError>>,
    /// Entries left out.
    pub(crate) excludes: exclude::Excludes,
    /// Files whose mtime is this late or later are read even if they look unchanged: the
    /// parent backup began less than [`RACY_MARGIN`] after it, so a write in the same clock
    /// tick after the parent read the file would not have moved the mtime.
    pub(crate) racy_from: Option<Timestamp>,
}

/// How close to the parent backup's start an mtime must be to count as racy: above the
/// coarsest timestamp granularity of common file systems (1 s on ext3 and some NFS).
const RACY_MARGIN: i64 = 2;

impl Shared {
    /// Whether this process should store blob `id` (true exactly once per new blob).
    pub(crate) fn claim(&self, id: BlobId) -> bool {
        self.claims.claim(id)
    }

    fn fail(&self, e: RepoError) {
        if !matches!(e, RepoError::Cancelled)
            && let Ok(mut f) = self.failure.lock()
        {
            f.get_or_insert(e);
        }
        self.stop.cancel();
    }
}

fn now() -> Timestamp {
    let d = SystemTime::now().duration_since(UNIX_EPOCH).unwrap_or_default();
    Timestamp { sec: i64::try_from(d.as_secs()).unwrap_or(i64::MAX), nsec: d.subsec_nanos() }
}

/// Backs up the directory `path` into `repo` and writes a snapshot.
///
/// Unreadable entries do not fail the backup: each is recorded in the snapshot with its error
/// and counted in [`BackupSummary::errors`]. The backup holds a lease (see [`crate::gc`]) from
/// before it reads the index until its snapshot is stored.
///
/// # Errors
/// [`RepoError::InvalidInput`] for an invalid exclude pattern (before anything is read);
/// the root cannot be opened; storage failures; a damaged parent snapshot manifest;
/// [`RepoError::Cancelled`] when `cancel` fires (within about a second);
/// [`RepoError::LeaseLapsed`] when the lease could not be kept.
pub async fn backup_tree(
    repo: &Repository,
    path: &Path,
    options: &BackupOptions,
    progress: Option<ProgressFn>,
    cancel: &CancellationToken,
) -> RepoResult<BackupSummary> {
    backup_tree_at(repo, Place::Path(path), options, progress, cancel).await
}

/// [`backup_tree`] of a directory given by path or already opened (see [`Place`]).
///
/// # Errors
/// As [`backup_tree`].
pub async fn backup_tree_at(
    repo: &Repository,
    root: Place<'_>,
    options: &BackupOptions,
    progress: Option<ProgressFn>,
    cancel: &CancellationToken,
) -> RepoResult<BackupSummary> {
    let excludes = exclude::Excludes::new(&options.exclude)?;
    let root_fd = match root {
        Place::Path(path) => walk::open_root(path)?,
        Place::Opened { fd, shown_as } => crate::place::reopen_dir(fd, shown_as, true)?,
    };
    let lease = Lease::acquire(repo, WRITER_LEASES, "backup", repo.lease_ttl(), cancel).await?;
    let result = backup_leased(
        repo,
        (root_fd, root.path()),
        options,
        excludes,
        progress,
        &lease.checker(),
        cancel,
    )
    .await;
    lease.release().await;
    result
}

async fn backup_leased(
    repo: &Repository,
    (root_fd, path): (OwnedFd, &Path),
    options: &BackupOptions,
    excludes: exclude::Excludes,
    progress: Option<ProgressFn>,
    lease: &LeaseCheck,
    cancel: &CancellationToken,
) -> RepoResult<BackupSummary> {
    let started = Instant::now();
    let time = now();
    crate::sys::raise_fd_limit();
    let index = repo.refresh_index(cancel).await?;
    let parent = match &options.parent {
        Some(id) => Some(repo.load_snapshot(id, cancel).await?),
        None => None,
    };
    let stop = cancel.child_token();
    let (sink, uploader) =
        Uploader::start_leased(repo, Arc::clone(&index), Some(lease.clone()), &stop);
    let shared = Arc::new(Shared {
        repo: repo.clone(),
        claims: Claims::new(Arc::clone(&index)),
        index,
        progress: Counters::default(),
        stop: stop.clone(),
        handle: tokio::runtime::Handle::current(),
        failure: Mutex::new(None),
        excludes,
        racy_from: parent
            .as_ref()
            .map(|p| Timestamp { sec: p.time.sec.saturating_sub(RACY_MARGIN), nsec: p.time.nsec }),
    });
    let floor = parent.as_ref().map_or(0, |p| p.summary.bytes_total);
    let threads = crate::thread_budget::threads_or_default(options.threads);
    let ticker = {
        let shared = Arc::clone(&shared);
        crate::progress::Ticker::start(progress.clone(), move || {
            shared.progress.snapshot(floor, false)
        })
    };
    let root_path = path.to_path_buf();
    let parent_root = parent.as_ref().map(|p| p.root.clone());
    let level = options.compression_level;
    let walked = {
        let shared = Arc::clone(&shared);
        tokio::task::spawn_blocking(move || {
            run_pipeline(&shared, root_fd, &root_path, parent_root.as_ref(), sink, threads, level)
        })
        .await
        .map_err(|e| RepoError::Internal { what: "backup pipeline", reason: e.to_string() })
    };
    let stored = Arc::clone(&uploader.stats);
    let uploaded = uploader.finish().await;
    drop(ticker);
    if cancel.is_cancelled() {
        return Err(RepoError::Cancelled);
    }
    let walked = match shared.failure.lock().ok().and_then(|mut f| f.take()) {
        Some(e) => Err(e),
        None => walked.and_then(|w| w),
    };
    let (root, mut summary) = match (walked, uploaded) {
        (Ok(walked), Ok(_)) => walked,
        (Err(e), uploaded) => return Err(upload_cause(e, uploaded)),
        (Ok(_), Err(e)) => return Err(e),
    };
    summary.bytes_new = shared.progress.bytes_new.load(Ordering::Relaxed);
    summary.bytes_stored = stored.stored_bytes.load(Ordering::Relaxed);
    summary.duration_ms = u64::try_from(started.elapsed().as_millis()).unwrap_or(u64::MAX);
    let snapshot = Snapshot {
        time,
        hostname: options.hostname.clone().unwrap_or_else(hostname),
        source: if options.source.is_empty() {
            path.display().to_string()
        } else {
            options.source.clone()
        },
        paths: vec![path.display().to_string()],
        tags: sorted_tags(&options.tags),
        parent: options.parent,
        root,
        summary,
        program: concat!("ferry ", env!("CARGO_PKG_VERSION")).to_owned(),
    };
    lease.check()?;
    let snapshot_id = repo.save_snapshot(&snapshot, cancel).await?;
    if let Some(f) = &progress {
        f(&shared.progress.snapshot(floor, true));
    }
    Ok(BackupSummary {
        snapshot_id,
        bytes_total: summary.bytes_total,
        bytes_new: summary.bytes_new,
        bytes_stored: summary.bytes_stored,
        files: summary.files,
        dirs: summary.dirs,
        errors: summary.errors,
        duration: started.elapsed(),
    })
}

fn sorted_tags(tags: &[(String, String)]) -> Vec<(String, String)> {
    let mut t = tags.to_vec();
    t.sort();
    t.dedup();
    t
}

/// Runs walker, workers and tree builder on threads; returns the root node and counts.
fn run_pipeline(
    shared: &Shared,
    root_fd: OwnedFd,
    root: &Path,
    parent: Option<&Node>,
    sink: crate::repo::writer::PackSink,
    threads: usize,
    level: i32,
) -> RepoResult<(Node, Summary)> {
    let stats = Arc::new(crate::repo::writer::WriteStats::default());
    let (job_tx, job_rx) = crossbeam_channel::bounded(64);
    let (event_tx, event_rx) = crossbeam_channel::bounded(16);
    std::thread::scope(|scope| {
        let mut workers = Vec::new();
        for _ in 0..threads.max(1) {
            let packer = LocalPacker::new(&shared.repo, &sink, &stats, level);
            let jobs = job_rx.clone();
            workers.push(scope.spawn(move || {
                if let Err(e) = FileWorker::new(shared, packer).run(&jobs) {
                    shared.fail(e);
                }
            }));
        }
        drop(job_rx);
        let tree_packer = LocalPacker::new(&shared.repo, &sink, &stats, level);
        let builder = scope.spawn(move || {
            TreeBuilder::new(shared, tree_packer).run(event_rx).map_err(|e| {
                shared.fail(e);
                RepoError::Cancelled
            })
        });
        // The walker recurses once per directory level.
        let walked = crate::sys::on_deep_stack(scope, "backup walker", move || {
            Walker::new(shared, event_tx, job_tx).walk_root(root_fd, root, parent)
        });
        if let Err(e) = walked {
            shared.fail(e);
        }
        for w in workers {
            if w.join().is_err() {
                shared.fail(RepoError::Internal { what: "file worker", reason: "panicked".into() });
            }
        }
        let root = match builder.join() {
            Ok(r) => r?,
            Err(_) => {
                return Err(RepoError::Internal {
                    what: "tree builder",
                    reason: "panicked".into(),
                });
            }
        };
        sink.flush(&shared.repo)?;
        Ok(root)
    })
}
