//! Restore of file-tree snapshots.
//!
//! A planner thread walks the snapshot's trees, creates directories, links and special nodes,
//! creates each regular file empty at its final size, and sends its content as batches of file
//! ranges to worker threads, each with its blobs looked up in the index and its frames counted
//! as needed (see [`frames`]). Workers fetch the blobs of a batch with few merged ranged reads,
//! authenticate and verify each, and write it at its offset (holes are never written, so
//! sparse files stay sparse); a worker starts the reads of its next batch while it writes the
//! end of the current one. The worker that finishes a file's last range sets its metadata;
//! directory metadata is set in a final pass, deepest first. A flusher thread syncs the target's
//! file system as the data comes in, and the restore ends with a last sync (see [`flush`]).
//!
//! Snapshot data is treated as hostile: names must be single components, strictly ascending
//! (so never duplicated) within and across a directory's pages; every file-system call is
//! relative to a directory descriptor and never follows a symbolic link (see [`fsops`]);
//! existing entries in the target are replaced, never written through; nesting is bounded.

mod data;
mod fidelity;
mod flush;
mod frames;
mod fsops;
mod plan;

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::Path;
use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::sys::stat::Mode;
use tokio_util::sync::CancellationToken;

use crate::dir_path::DirPath;
use crate::error::{RepoError, RepoResult};
use crate::format::{BlobId, Node, NodeBody, Snapshot, SnapshotId};
use crate::place::Place;
use crate::progress::{Counters, ProgressFn, Ticker};
use crate::repo::{MemIndex, Repository};
pub use fidelity::{Fidelity, Withheld};
use fsops::Warnings;

/// Deepest directory nesting accepted (deeper trees cannot come from a real file system and
/// would exhaust descriptors or stack).
pub const MAX_DEPTH: usize = 2048;
/// Content bytes per batch sent to a worker (and per range of a large file).
pub(crate) const BATCH_BYTES: u64 = 16 << 20;
/// Files per batch, at most (fewer when open files are scarce: see `batch_items`).
pub(crate) const BATCH_ITEMS: usize = 512;
/// Descriptors kept back from batches: directories down the tree (and the last one reopened to
/// make a hard link), the store, the runtime. Removing a deep tree in an entry's way deep in
/// the target (`fsops::remove_any`, a descriptor per level) can take up to [`MAX_DEPTH`] more;
/// where that exhausts the limit, the restore fails saying so, having written nothing wrong.
const FDS_RESERVED: u64 = MAX_DEPTH as u64 + 1024;
/// Warnings kept in the summary.
const MAX_WARNINGS: usize = 100;

/// Options for [`restore`].
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// Also leave all-zero chunks unwritten (as holes), not only the recorded holes.
    pub sparse: bool,
    /// Worker threads; 0 picks one per core plus one, fewer under a tight memory limit
    /// ([`crate::thread_budget::default_threads`]).
    pub threads: usize,
    /// Set owners; `None` sets them when running as root.
    pub owners: Option<bool>,
    /// Restore only this path of the snapshot: a directory's content goes into the target
    /// (and its metadata onto the target); anything else goes into the target under its own
    /// name, leaving the target directory's metadata alone.
    pub subtree: Option<std::path::PathBuf>,
    /// Which privilege-bearing parts of the snapshot are recreated (see [`Fidelity`]):
    /// all of them by default.
    pub fidelity: Fidelity,
}

/// What a restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RestoreSummary {
    /// Regular files written.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Content bytes written.
    pub bytes: u64,
    /// Entries the snapshot recorded as unreadable at backup time (restored empty).
    pub entries_with_backup_errors: u64,
    /// Metadata the target could not take (e.g. xattrs unsupported), the first 100.
    pub warnings: Vec<String>,
    /// How many such warnings there were in all (more than `warnings` holds past 100).
    pub warnings_total: u64,
    /// What the restore's [`Fidelity`] left out.
    pub withheld: Withheld,
    /// Wall time.
    pub duration: Duration,
}

impl RestoreSummary {
    /// What the user should read when the restore could not bring everything back as it was:
    /// how many entries the backup could not read (restored as the snapshot recorded them,
    /// their content missing) and how many warnings there were, with the first `shown` of
    /// them. `None` when there was neither.
    #[must_use]
    pub fn shortfall(&self, shown: usize) -> Option<String> {
        let mut parts = Vec::new();
        match self.entries_with_backup_errors {
            0 => {}
            1 => parts.push(
                "1 entry was unreadable when backed up and is restored as recorded (its content \
                 missing)"
                    .to_owned(),
            ),
            n => parts.push(format!(
                "{n} entries were unreadable when backed up and are restored as recorded (their \
                 content missing)"
            )),
        }
        let total = self.warnings_total.max(self.warnings.len() as u64);
        if total > 0 {
            let noun = if total == 1 { "warning" } else { "warnings" };
            let listed: Vec<&str> = self.warnings.iter().take(shown).map(String::as_str).collect();
            let mut part = format!("{total} {noun}");
            if !listed.is_empty() {
                part.push_str(": ");
                part.push_str(&listed.join("; "));
                let more = total - listed.len() as u64;
                if more > 0 {
                    part.push_str(&format!("; and {more} more"));
                }
            }
            parts.push(part);
        }
        (!parts.is_empty()).then(|| parts.join("; "))
    }
}

pub(crate) struct Shared {
    pub(crate) repo: Repository,
    pub(crate) index: Arc<MemIndex>,
    pub(crate) handle: tokio::runtime::Handle,
    pub(crate) stop: CancellationToken,
    pub(crate) sparse: bool,
    pub(crate) owners: bool,
    pub(crate) policy: fidelity::Policy,
    pub(crate) progress: Counters,
    /// Files per batch: every queued file is an open descriptor.
    pub(crate) batch_items: usize,
    /// Frames fetched by one batch for the others too.
    pub(crate) frames: frames::SharedFrames,
    warnings: Mutex<Vec<String>>,
    warnings_total: std::sync::atomic::AtomicU64,
    failure: Mutex<Option<RepoError>>,
}

/// Files per batch so that every batch in flight (`threads` being written, as many taken
/// ahead, `2 × threads` queued in the channel, one being planned) fits in `fd_limit` open
/// files beside [`FDS_RESERVED`].
fn batch_items(fd_limit: u64, threads: usize) -> usize {
    let batches = 4 * threads.max(1) as u64 + 1;
    let per_batch = fd_limit.saturating_sub(FDS_RESERVED) / batches;
    usize::try_from(per_batch).unwrap_or(usize::MAX).clamp(1, BATCH_ITEMS)
}

/// Files per batch in this crate's unit tests, when not 0 (smaller batches make more of them,
/// and change nothing of what is written).
#[cfg(test)]
pub(crate) static BATCH_ITEMS_FOR_TESTS: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(0);

fn batch_items_for_tests() -> Option<usize> {
    #[cfg(test)]
    return Some(BATCH_ITEMS_FOR_TESTS.load(Ordering::Relaxed)).filter(|n| *n > 0);
    #[cfg(not(test))]
    None
}

impl Shared {
    pub(crate) fn warn(&self, w: Warnings) {
        if w.0.is_empty() {
            return;
        }
        for m in &w.0 {
            tracing::warn!(warning = %m, "restore");
        }
        self.warnings_total.fetch_add(w.0.len() as u64, Ordering::Relaxed);
        if let Ok(mut all) = self.warnings.lock() {
            let room = MAX_WARNINGS.saturating_sub(all.len());
            all.extend(w.0.into_iter().take(room));
        }
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

/// Restores snapshot `id` into the directory `target` (created if missing).
///
/// # Errors
/// [`RepoError::Corrupt`] naming a damaged object (no wrong data is ever written as if it
/// were right); [`RepoError::UnsafeEntry`] for hostile snapshot metadata;
/// [`RepoError::MissingBlob`]; local I/O errors with the path; [`RepoError::Cancelled`].
///
/// The restore holds a lease (see [`crate::gc`]) so garbage collection does not delete packs
/// it may read, and reloads the index if garbage collection changed it.
pub async fn restore(
    repo: &Repository,
    id: &SnapshotId,
    target: &Path,
    options: &RestoreOptions,
    progress: Option<ProgressFn>,
    cancel: &CancellationToken,
) -> RepoResult<RestoreSummary> {
    restore_at(repo, id, Place::Path(target), options, progress, cancel).await
}

/// [`restore`] into a directory given by path or already opened (see [`Place`]). An opened
/// target is written through its descriptor only, and nothing is created for it.
///
/// # Errors
/// As [`restore`].
pub async fn restore_at(
    repo: &Repository,
    id: &SnapshotId,
    target: Place<'_>,
    options: &RestoreOptions,
    progress: Option<ProgressFn>,
    cancel: &CancellationToken,
) -> RepoResult<RestoreSummary> {
    // The snapshot manifest is read while the lease is written (collection deletes no
    // manifest); the index is loaded under the lease.
    let (lease, snapshot) =
        crate::gc::Lease::acquire_while(repo, "restore", repo.load_snapshot(id, cancel), cancel)
            .await?;
    let result = restore_leased(repo, snapshot, target, options, progress, cancel).await;
    lease.release().await;
    result
}

/// The target's directory descriptor: opened from the caller's, or created and opened by path.
fn open_target(target: Place<'_>) -> RepoResult<OwnedFd> {
    match target {
        Place::Opened { fd, shown_as } => crate::place::reopen_dir(fd, shown_as, false),
        Place::Path(path) => {
            std::fs::create_dir_all(path)
                .map_err(|e| RepoError::io("create restore target", path, e))?;
            nix::fcntl::open(
                path,
                OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
                Mode::empty(),
            )
            .map_err(|e| RepoError::io("open restore target", path, fsops::err(e)))
        }
    }
}

async fn restore_leased(
    repo: &Repository,
    snapshot: Snapshot,
    place: Place<'_>,
    options: &RestoreOptions,
    progress: Option<ProgressFn>,
    cancel: &CancellationToken,
) -> RepoResult<RestoreSummary> {
    let started = Instant::now();
    let fd_limit = crate::sys::raise_fd_limit();
    let threads = crate::thread_budget::threads_or_default(options.threads);
    let index = repo.refresh_index(cancel).await?;
    let root = match &options.subtree {
        Some(path) if matches!(snapshot.root.body, NodeBody::Dir { .. }) => {
            crate::browse::find_node_in(repo, Some(&index), &snapshot, path, cancel).await?
        }
        Some(_) => {
            return Err(RepoError::InvalidInput {
                what: "snapshot",
                reason: "only a tree snapshot has paths to restore on their own".into(),
            });
        }
        None => snapshot.root.clone(),
    };
    let root_fd = open_target(place)?;
    let target = place.path();
    let stop = cancel.child_token();
    let shared = Arc::new(Shared {
        repo: repo.clone(),
        index,
        handle: tokio::runtime::Handle::current(),
        stop,
        sparse: options.sparse,
        owners: options.owners.unwrap_or_else(|| nix::unistd::geteuid().is_root()),
        policy: fidelity::Policy::new(options.fidelity),
        progress: Counters::default(),
        batch_items: batch_items_for_tests().unwrap_or_else(|| batch_items(fd_limit, threads)),
        frames: frames::SharedFrames::default(),
        warnings: Mutex::new(Vec::new()),
        warnings_total: std::sync::atomic::AtomicU64::new(0),
        failure: Mutex::new(None),
    });
    let (bytes_total, files_total) = match (&options.subtree, &root.body) {
        (None, _) => (snapshot.summary.bytes_total, snapshot.summary.files),
        (Some(_), NodeBody::File(content)) => (content.size, 1),
        (Some(_), _) => (0, 0), // unknown without walking the subtree first
    };
    shared.progress.bytes_total.store(bytes_total, Ordering::Relaxed);
    shared.progress.files_total.store(files_total, Ordering::Relaxed);
    let ticker = {
        let shared = Arc::clone(&shared);
        Ticker::start(progress.clone(), move || shared.progress.snapshot(0, false))
    };
    let run = {
        let shared = Arc::clone(&shared);
        let target = target.to_path_buf();
        tokio::task::spawn_blocking(move || {
            run(&shared, Arc::new(root_fd), &root, &target, threads)
        })
    };
    let counts =
        run.await.map_err(|e| RepoError::Internal { what: "restore", reason: e.to_string() });
    drop(ticker);
    if cancel.is_cancelled() {
        return Err(RepoError::Cancelled);
    }
    if let Some(e) = shared.failure.lock().ok().and_then(|mut f| f.take()) {
        return Err(e);
    }
    let counts = counts??;
    if let Some(f) = &progress {
        f(&shared.progress.snapshot(0, true));
    }
    Ok(RestoreSummary {
        files: counts.files,
        dirs: counts.dirs,
        bytes: shared.progress.bytes_done.load(Ordering::Relaxed),
        entries_with_backup_errors: counts.errors,
        warnings: shared.warnings.lock().map(|w| w.clone()).unwrap_or_default(),
        warnings_total: shared.warnings_total.load(Ordering::Relaxed),
        withheld: shared.policy.withheld(),
        duration: started.elapsed(),
    })
}

#[derive(Debug, Default, Clone, Copy)]
pub(crate) struct Counts {
    files: u64,
    dirs: u64,
    errors: u64,
}

fn not_a_directory() -> RepoError {
    RepoError::InvalidInput {
        what: "snapshot",
        reason: "only directory snapshots restore into a directory".into(),
    }
}

fn run(
    shared: &Shared,
    root_fd: Arc<OwnedFd>,
    root: &Node,
    target: &Path,
    threads: usize,
) -> RepoResult<Counts> {
    let pages = match &root.body {
        NodeBody::Dir { pages } => Some(pages),
        // One entry restored on its own (`subtree`) has a name; a snapshot's root has none.
        NodeBody::Volume { .. } => return Err(not_a_directory()),
        _ if root.name.is_empty() => return Err(not_a_directory()),
        _ => None,
    };
    let (tx, rx) = crossbeam_channel::bounded::<data::Located<'_>>(threads * 2);
    // Each worker and the planner hold a sender: the flusher ends when they all have.
    let (running, flush_rx) = crossbeam_channel::bounded::<()>(0);
    let fail = |e| shared.fail(e);
    let counts = std::thread::scope(|scope| {
        crate::flusher::start(scope, target, &fail, || {
            flush::flusher(shared, &root_fd, target, &flush_rx)
        });
        for _ in 0..threads.max(1) {
            let (rx, running) = (rx.clone(), running.clone());
            scope.spawn(move || {
                if let Err(e) = data::work(shared, &rx) {
                    shared.fail(e);
                }
                drop(running);
            });
        }
        drop(rx);
        // The planner recurses once per directory level: give it a stack sized for MAX_DEPTH.
        let planner = std::thread::Builder::new().stack_size(crate::sys::DEEP_STACK).spawn_scoped(
            scope,
            || {
                let _running = running;
                let mut p = plan::Planner {
                    shared,
                    tx,
                    batch: Vec::new(),
                    batch_bytes: 0,
                    reopen: plan::Reopener::new(Arc::clone(&root_fd)),
                    hardlinks: HashMap::new(),
                    counts: Counts::default(),
                };
                let loc = DirPath::root(target);
                let planned = match pages {
                    Some(pages) => p.dir(&root_fd, &loc, pages, 0),
                    // One entry of a snapshot restored on its own, into the target directory.
                    None => p.entry(&root_fd, &loc, root.clone(), 0),
                };
                if let Err(e) = planned.and_then(|()| p.flush()) {
                    // The workers stop at once, leaving the batches queued.
                    shared.fail(e);
                    return Err(RepoError::Cancelled);
                }
                Ok::<_, RepoError>(p.counts)
            },
        );
        match planner {
            Ok(h) => h.join().unwrap_or_else(|_| {
                Err(RepoError::Internal { what: "restore planner", reason: "panicked".into() })
            }),
            Err(e) => Err(RepoError::io("start restore planner", target, e)),
        }
    });
    let mut counts = match counts {
        Ok(c) => c,
        Err(e) => {
            shared.fail(e);
            return Err(RepoError::Cancelled);
        }
    };
    if shared.stop.is_cancelled() {
        return Err(RepoError::Cancelled);
    }
    let Some(pages) = pages else {
        // One entry restored (`--path` of a file): flushed all the same.
        flush::flush(&root_fd, target)?;
        return Ok(counts);
    };
    // Directory metadata last, deepest first, once nothing more is written into them.
    let mut warnings = Warnings::default();
    std::thread::scope(|scope| {
        crate::sys::on_deep_stack(scope, "restore directory metadata", || {
            dir_metadata(shared, &root_fd, pages, &DirPath::root(target), 0, &mut warnings)
        })
    })?;
    fsops::apply_fd(&root_fd.as_fd(), &root.meta, shared, &target.display(), &mut warnings)
        .map_err(|e| RepoError::io("set metadata of", target, e))?;
    shared.warn(warnings);
    flush::flush(&root_fd, target)?;
    counts.dirs += 1;
    Ok(counts)
}

/// Iterates a directory's entries page by page, checking order across pages.
pub(crate) fn for_each_entry(
    shared: &Shared,
    pages: &[BlobId],
    dir: &DirPath,
    mut f: impl FnMut(Node) -> RepoResult<()>,
) -> RepoResult<()> {
    let mut last: Option<Vec<u8>> = None;
    for page in pages {
        if shared.stop.is_cancelled() {
            return Err(RepoError::Cancelled);
        }
        // Dropped before the entries are walked: not held by every level of a deep tree.
        let tree = {
            let referrer = format!("directory {}", dir.path().display());
            shared.handle.block_on(shared.repo.read_tree_in(
                &shared.index,
                page,
                &referrer,
                &shared.stop,
            ))?
        };
        if let (Some(prev), Some(first)) = (&last, tree.entries.first())
            && first.name <= *prev
        {
            return Err(RepoError::UnsafeEntry {
                path: dir.child_path(&first.name),
                reason: "duplicate or unordered name across tree pages".into(),
            });
        }
        // An empty page between two others must not reset the order check.
        if let Some(n) = tree.entries.last() {
            last = Some(n.name.clone());
        }
        for node in tree.entries {
            f(node)?;
        }
    }
    Ok(())
}

fn dir_metadata(
    shared: &Shared,
    fd: &OwnedFd,
    pages: &[BlobId],
    loc: &Arc<DirPath>,
    depth: usize,
    warnings: &mut Warnings,
) -> RepoResult<()> {
    if depth >= MAX_DEPTH {
        return Ok(());
    }
    for_each_entry(shared, pages, loc, |node| {
        if let NodeBody::Dir { pages } = &node.body {
            let child = loc.child(&node.name);
            let sub = fsops::open_dir(fd, &node.name)
                .map_err(|e| RepoError::io("open directory", child.path(), e))?;
            dir_metadata(shared, &sub, pages, &child, depth + 1, warnings)?;
            let what = child.show_self();
            fsops::apply_fd(&sub, &node.meta, shared, &what, warnings)
                .map_err(|e| RepoError::io("set metadata of", child.path(), e))?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests;
