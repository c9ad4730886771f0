//! Restore of file-tree snapshots.
//!
//! A planner thread walks the snapshot's trees, creates directories, links and special nodes,
//! creates each regular file empty at its final size, and sends its content as batches of file
//! ranges to worker threads. Workers fetch the blobs of a batch with few merged ranged reads,
//! authenticate and verify each, and write it at its offset (holes are never written, so
//! sparse files stay sparse). The worker that finishes a file's last range sets its metadata;
//! directory metadata is set in a final pass, deepest first.
//!
//! Snapshot data is treated as hostile: names must be single components, strictly ascending
//! (so never duplicated) within and across a directory's pages; every file-system call is
//! relative to a directory descriptor and never follows a symbolic link (see [`fsops`]);
//! existing entries in the target are replaced, never written through; nesting is bounded.

mod data;
mod fsops;

use std::collections::HashMap;
use std::os::fd::{AsFd, OwnedFd};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use nix::fcntl::OFlag;
use nix::sys::stat::{Mode, SFlag};
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{BlobId, Node, NodeBody, SnapshotId};
use crate::progress::{Counters, ProgressFn, Ticker};
use crate::repo::{MemIndex, Repository};
use data::{Batch, Item, OpenFile};
use fsops::Warnings;

/// Deepest directory nesting accepted (deeper trees cannot come from a real file system and
/// would exhaust descriptors or stack).
pub const MAX_DEPTH: usize = 2048;
/// Content bytes per batch sent to a worker (and per range of a large file).
const BATCH_BYTES: u64 = 16 << 20;
/// Files per batch.
const BATCH_ITEMS: usize = 512;
/// Warnings kept in the summary.
const MAX_WARNINGS: usize = 100;

/// Options for [`restore`].
#[derive(Debug, Clone, Default)]
pub struct RestoreOptions {
    /// Also leave all-zero chunks unwritten (as holes), not only the recorded holes.
    pub sparse: bool,
    /// Worker threads; 0 picks one per core plus one.
    pub threads: usize,
    /// Set owners; `None` sets them when running as root.
    pub owners: Option<bool>,
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
    /// Metadata the target could not take (e.g. xattrs unsupported), at most 100.
    pub warnings: Vec<String>,
    /// Wall time.
    pub duration: Duration,
}

pub(crate) struct Shared {
    pub(crate) repo: Repository,
    pub(crate) index: Arc<MemIndex>,
    pub(crate) handle: tokio::runtime::Handle,
    pub(crate) stop: CancellationToken,
    pub(crate) sparse: bool,
    pub(crate) owners: bool,
    pub(crate) progress: Counters,
    warnings: Mutex<Vec<String>>,
    failure: Mutex<Option<RepoError>>,
}

impl Shared {
    pub(crate) fn warn(&self, w: Warnings) {
        if w.0.is_empty() {
            return;
        }
        for m in &w.0 {
            tracing::warn!(warning = %m, "restore");
        }
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
pub async fn restore(
    repo: &Repository,
    id: &SnapshotId,
    target: &Path,
    options: &RestoreOptions,
    progress: Option<ProgressFn>,
    cancel: &CancellationToken,
) -> RepoResult<RestoreSummary> {
    let started = Instant::now();
    crate::sys::raise_fd_limit();
    let snapshot = repo.load_snapshot(id, cancel).await?;
    let index = repo.index(cancel).await?;
    std::fs::create_dir_all(target)
        .map_err(|e| RepoError::io("create restore target", target, e))?;
    let root_fd: OwnedFd = nix::fcntl::open(
        target,
        OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC,
        Mode::empty(),
    )
    .map_err(|e| RepoError::io("open restore target", target, fsops::err(e)))?;
    let stop = cancel.child_token();
    let shared = Arc::new(Shared {
        repo: repo.clone(),
        index,
        handle: tokio::runtime::Handle::current(),
        stop,
        sparse: options.sparse,
        owners: options.owners.unwrap_or_else(|| nix::unistd::geteuid().is_root()),
        progress: Counters::default(),
        warnings: Mutex::new(Vec::new()),
        failure: Mutex::new(None),
    });
    shared.progress.bytes_total.store(snapshot.summary.bytes_total, Ordering::Relaxed);
    shared.progress.files_total.store(snapshot.summary.files, Ordering::Relaxed);
    let ticker = {
        let shared = Arc::clone(&shared);
        Ticker::start(progress.clone(), move || shared.progress.snapshot(0, false))
    };
    let threads = if options.threads == 0 {
        std::thread::available_parallelism().map_or(2, |n| n.get()) + 1
    } else {
        options.threads
    };
    let root = snapshot.root.clone();
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
        duration: started.elapsed(),
    })
}

#[derive(Debug, Default, Clone, Copy)]
struct Counts {
    files: u64,
    dirs: u64,
    errors: u64,
}

fn run(
    shared: &Shared,
    root_fd: Arc<OwnedFd>,
    root: &Node,
    target: &Path,
    threads: usize,
) -> RepoResult<Counts> {
    let NodeBody::Dir { pages } = &root.body else {
        return Err(RepoError::InvalidInput {
            what: "snapshot",
            reason: "only directory snapshots restore into a directory".into(),
        });
    };
    let (tx, rx) = crossbeam_channel::bounded::<Batch>(threads * 2);
    let counts = std::thread::scope(|scope| {
        for _ in 0..threads.max(1) {
            let rx = rx.clone();
            scope.spawn(move || {
                while let Ok(batch) = rx.recv() {
                    if let Err(e) = data::restore_batch(shared, batch) {
                        shared.fail(e);
                        return;
                    }
                }
            });
        }
        drop(rx);
        // The planner recurses once per directory level: give it a stack sized for MAX_DEPTH.
        let planner = std::thread::Builder::new().stack_size(256 << 20).spawn_scoped(scope, || {
            let mut p = Planner {
                shared,
                tx,
                batch: Vec::new(),
                batch_bytes: 0,
                hardlinks: HashMap::new(),
                counts: Counts::default(),
            };
            p.dir(&root_fd, pages, target, 0)?;
            p.flush()?;
            Ok::<_, RepoError>(p.counts)
        });
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
    // Directory metadata last, deepest first, once nothing more is written into them.
    let mut warnings = Warnings::default();
    dir_metadata(shared, &root_fd, pages, target, 0, &mut warnings)?;
    fsops::apply_fd(
        &root_fd.as_fd(),
        &root.meta,
        shared.owners,
        &target.display().to_string(),
        &mut warnings,
    )
    .map_err(|e| RepoError::io("set metadata of", target, e))?;
    shared.warn(warnings);
    counts.dirs += 1;
    Ok(counts)
}

/// Iterates a directory's entries page by page, checking order across pages.
fn for_each_entry(
    shared: &Shared,
    pages: &[BlobId],
    path: &Path,
    mut f: impl FnMut(Node) -> RepoResult<()>,
) -> RepoResult<()> {
    let mut last: Option<Vec<u8>> = None;
    for page in pages {
        if shared.stop.is_cancelled() {
            return Err(RepoError::Cancelled);
        }
        let referrer = format!("directory {}", path.display());
        let tree = shared.handle.block_on(shared.repo.read_tree(page, &referrer, &shared.stop))?;
        if let (Some(prev), Some(first)) = (&last, tree.entries.first())
            && first.name <= *prev
        {
            return Err(RepoError::UnsafeEntry {
                path: path.join(String::from_utf8_lossy(&first.name).as_ref()),
                reason: "duplicate or unordered name across tree pages".into(),
            });
        }
        last = tree.entries.last().map(|n| n.name.clone());
        for node in tree.entries {
            f(node)?;
        }
    }
    Ok(())
}

fn child_path(path: &Path, name: &[u8]) -> PathBuf {
    path.join(std::ffi::OsStr::new(&*String::from_utf8_lossy(name)))
}

struct Planner<'a> {
    shared: &'a Shared,
    tx: crossbeam_channel::Sender<Batch>,
    batch: Batch,
    batch_bytes: u64,
    hardlinks: HashMap<u64, (Arc<OwnedFd>, Vec<u8>)>,
    counts: Counts,
}

impl Planner<'_> {
    fn dir(
        &mut self,
        fd: &Arc<OwnedFd>,
        pages: &[BlobId],
        path: &Path,
        depth: usize,
    ) -> RepoResult<()> {
        if depth >= MAX_DEPTH {
            return Err(RepoError::UnsafeEntry {
                path: path.to_path_buf(),
                reason: format!("nesting deeper than {MAX_DEPTH}"),
            });
        }
        for_each_entry(self.shared, pages, path, |node| self.entry(fd, node, path, depth))
    }

    fn entry(
        &mut self,
        dir: &Arc<OwnedFd>,
        node: Node,
        parent: &Path,
        depth: usize,
    ) -> RepoResult<()> {
        let path = child_path(parent, &node.name);
        let io = |op: &'static str| {
            let p = path.clone();
            move |e| RepoError::io(op, p, e)
        };
        if node.error.is_some() {
            self.counts.errors += 1;
        }
        let what = path.display().to_string();
        if let (Some(group), false) = (node.hardlink, matches!(node.body, NodeBody::Dir { .. })) {
            if let Some((first_dir, first)) = self.hardlinks.get(&group) {
                if matches!(node.body, NodeBody::File(_)) {
                    self.counts.files += 1;
                }
                return fsops::hard_link(first_dir, first, dir, &node.name)
                    .map_err(io("hard link"));
            }
            self.hardlinks.insert(group, (Arc::clone(dir), node.name.clone()));
        }
        let mut warnings = Warnings::default();
        match &node.body {
            NodeBody::Dir { pages } => {
                let sub = fsops::ensure_dir(dir, &node.name).map_err(io("create directory"))?;
                self.counts.dirs += 1;
                self.dir(&Arc::new(sub), pages, &path, depth + 1)?;
            }
            NodeBody::File(content) | NodeBody::Volume { content, .. } => {
                let file = fsops::create_file(dir, &node.name).map_err(io("create file"))?;
                // Dense files reach their size as they are written; only files ending in a hole
                // (or empty ones being replaced) need the size set.
                if content.extents.is_some() || self.shared.sparse {
                    file.set_len(content.size).map_err(io("set size of"))?;
                }
                self.counts.files += 1;
                let placed = content.placed_chunks();
                let mut segments: Vec<Vec<(u64, crate::format::ChunkRef)>> = Vec::new();
                let mut bytes = 0u64;
                for pc in placed {
                    if segments.is_empty() || bytes >= BATCH_BYTES {
                        segments.push(Vec::new());
                        bytes = 0;
                    }
                    bytes += u64::from(pc.1.len);
                    if let Some(last) = segments.last_mut() {
                        last.push(pc);
                    }
                }
                if segments.is_empty() {
                    fsops::apply_fd(&file, &node.meta, self.shared.owners, &what, &mut warnings)
                        .map_err(io("set metadata of"))?;
                    self.shared.progress.files_done.fetch_add(1, Ordering::Relaxed);
                } else {
                    let open = Arc::new(OpenFile {
                        file,
                        path: path.clone(),
                        meta: node.meta.clone(),
                        pending: AtomicUsize::new(segments.len()),
                        _dir: Arc::clone(dir),
                    });
                    for chunks in segments {
                        let len: u64 = chunks.iter().map(|c| u64::from(c.1.len)).sum();
                        self.push(Item { file: Arc::clone(&open), chunks }, len)?;
                    }
                }
            }
            NodeBody::Symlink { target } => {
                fsops::create_symlink(dir, &node.name, target).map_err(io("create symlink"))?;
                fsops::apply_at(
                    dir,
                    &node.name,
                    &node.meta,
                    true,
                    self.shared.owners,
                    &what,
                    &mut warnings,
                )
                .map_err(io("set metadata of"))?;
            }
            NodeBody::Fifo
            | NodeBody::Socket
            | NodeBody::CharDevice { .. }
            | NodeBody::BlockDevice { .. } => {
                let (kind, rdev) = match node.body {
                    NodeBody::Fifo => (SFlag::S_IFIFO, 0),
                    NodeBody::Socket => (SFlag::S_IFSOCK, 0),
                    NodeBody::CharDevice { rdev } => (SFlag::S_IFCHR, rdev),
                    NodeBody::BlockDevice { rdev } => (SFlag::S_IFBLK, rdev),
                    _ => (SFlag::S_IFIFO, 0),
                };
                fsops::create_node(dir, &node.name, kind, rdev).map_err(io("create node"))?;
                fsops::apply_at(
                    dir,
                    &node.name,
                    &node.meta,
                    false,
                    self.shared.owners,
                    &what,
                    &mut warnings,
                )
                .map_err(io("set metadata of"))?;
            }
        }
        self.shared.warn(warnings);
        Ok(())
    }

    fn push(&mut self, item: Item, len: u64) -> RepoResult<()> {
        self.batch.push(item);
        self.batch_bytes += len;
        if self.batch_bytes >= BATCH_BYTES || self.batch.len() >= BATCH_ITEMS {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> RepoResult<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.batch_bytes = 0;
        let batch = std::mem::take(&mut self.batch);
        self.tx.send(batch).map_err(|_| RepoError::Cancelled)
    }
}

fn dir_metadata(
    shared: &Shared,
    fd: &OwnedFd,
    pages: &[BlobId],
    path: &Path,
    depth: usize,
    warnings: &mut Warnings,
) -> RepoResult<()> {
    if depth >= MAX_DEPTH {
        return Ok(());
    }
    for_each_entry(shared, pages, path, |node| {
        if let NodeBody::Dir { pages } = &node.body {
            let child = child_path(path, &node.name);
            let sub = fsops::open_dir(fd, &node.name)
                .map_err(|e| RepoError::io("open directory", &child, e))?;
            dir_metadata(shared, &sub, pages, &child, depth + 1, warnings)?;
            fsops::apply_fd(
                &sub,
                &node.meta,
                shared.owners,
                &child.display().to_string(),
                warnings,
            )
            .map_err(|e| RepoError::io("set metadata of", &child, e))?;
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests;
