//! The walker: visits the tree depth first in name order, compares with the parent snapshot,
//! and emits tree events and file jobs.
//!
//! Every call is relative to an open directory descriptor (`fstatat`, `openat`,
//! `readlinkat`), so path lookups stay short in deep trees. A directory's names are listed and
//! sorted (the one per-directory cost in memory); entries are then stat'ed one by one and sent
//! on, never all held at once.

use std::collections::{HashMap, VecDeque};
use std::os::fd::{AsFd, OwnedFd};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::Ordering;

use nix::errno::Errno;
use nix::fcntl::{AtFlags, OFlag};
use nix::sys::stat::{FileStat, Mode};

use crate::backup::Shared;
use crate::backup::files::FileJob;
use crate::backup::meta::{file_type, may_be_sparse, metadata, xattrs_at};
use crate::backup::trees::Event;
use crate::dir_path::DirPath;
use crate::error::{RepoError, RepoResult};
use crate::format::{BlobId, FileContent, Node, NodeBody, Timestamp};
use crate::restore::MAX_DEPTH;

/// The parent snapshot's entries of one directory, read page by page as names advance.
pub(crate) struct ParentDir {
    pages: VecDeque<BlobId>,
    entries: VecDeque<Node>,
}

impl ParentDir {
    pub(crate) fn new(node: &Node) -> Option<Self> {
        match &node.body {
            NodeBody::Dir { pages } if node.error.is_none() => {
                Some(Self { pages: pages.iter().copied().collect(), entries: VecDeque::new() })
            }
            _ => None,
        }
    }

    /// The parent's entry named `name`. Names must be asked in ascending order.
    fn find(&mut self, shared: &Shared, name: &[u8]) -> Option<Node> {
        loop {
            while let Some(front) = self.entries.front() {
                if front.name.as_slice() < name {
                    self.entries.pop_front();
                } else if front.name.as_slice() == name {
                    return self.entries.pop_front();
                } else {
                    return None;
                }
            }
            let page = self.pages.pop_front()?;
            let cancel = shared.stop.clone();
            match shared.handle.block_on(shared.repo.read_tree_in(
                &shared.index,
                &page,
                "the parent snapshot",
                &cancel,
            )) {
                Ok(p) => self.entries = p.entries.into(),
                Err(e) => {
                    tracing::warn!(error = %e, "parent tree unreadable; reading this directory in full");
                    self.pages.clear();
                    return None;
                }
            }
        }
    }
}

/// Events per batch sent to the tree builder.
const EVENT_BATCH: usize = 256;

pub(crate) struct Walker<'a> {
    shared: &'a Shared,
    events: crossbeam_channel::Sender<Vec<Event>>,
    batch: Vec<Event>,
    jobs: crossbeam_channel::Sender<FileJob>,
    hardlinks: HashMap<(u64, u64), u64>,
    /// Directory levels below the root of the directory being walked.
    depth: usize,
}

fn io(e: Errno) -> std::io::Error {
    std::io::Error::from(e)
}

fn dir_flags() -> OFlag {
    OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_NOFOLLOW | OFlag::O_CLOEXEC
}

fn open_subdir(dir: &OwnedFd, name: &[u8]) -> std::io::Result<OwnedFd> {
    match nix::fcntl::openat(dir.as_fd(), name, dir_flags() | OFlag::O_NOATIME, Mode::empty()) {
        Err(Errno::EPERM) => nix::fcntl::openat(dir.as_fd(), name, dir_flags(), Mode::empty()),
        other => other,
    }
    .map_err(io)
}

/// Opens the backup root by path (not following a symbolic link at its end).
pub(crate) fn open_root(root: &Path) -> RepoResult<OwnedFd> {
    nix::fcntl::open(root, dir_flags(), Mode::empty())
        .map_err(|e| RepoError::io("open backup root", root, io(e)))
}

/// Sorted names in a directory, without `.` and `..`.
fn list(dir: &OwnedFd) -> std::io::Result<Vec<Vec<u8>>> {
    let mut d = nix::dir::Dir::from_fd(dir.try_clone()?).map_err(io)?;
    let mut names = Vec::new();
    for entry in d.iter() {
        let entry = entry.map_err(io)?;
        let name = entry.file_name().to_bytes();
        if name != b"." && name != b".." {
            names.push(name.to_vec());
        }
    }
    // Rewind is not needed: the clone shares the offset but later calls are all *at calls.
    names.sort_unstable();
    Ok(names)
}

impl<'a> Walker<'a> {
    pub(crate) fn new(
        shared: &'a Shared,
        events: crossbeam_channel::Sender<Vec<Event>>,
        jobs: crossbeam_channel::Sender<FileJob>,
    ) -> Self {
        Self {
            shared,
            events,
            batch: Vec::with_capacity(EVENT_BATCH),
            jobs,
            hardlinks: HashMap::new(),
            depth: 0,
        }
    }

    /// Queues an event; events travel in batches to keep channel traffic low.
    fn emit(&mut self, event: Event) -> RepoResult<()> {
        self.batch.push(event);
        if self.batch.len() >= EVENT_BATCH {
            self.flush()?;
        }
        Ok(())
    }

    fn flush(&mut self) -> RepoResult<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        let batch = std::mem::replace(&mut self.batch, Vec::with_capacity(EVENT_BATCH));
        self.events.send(batch).map_err(|_| RepoError::Cancelled)
    }

    /// Walks the directory `fd` (at `root`), emitting its `Enter`, entries, and `Leave`.
    pub(crate) fn walk_root(
        &mut self,
        fd: OwnedFd,
        root: &Path,
        parent: Option<&Node>,
    ) -> RepoResult<()> {
        let st = nix::sys::stat::fstat(fd.as_fd())
            .map_err(|e| RepoError::io("stat backup root", root, io(e)))?;
        let xattrs = crate::sys::list_xattrs(crate::sys::Target::Fd(fd.as_fd()))
            .map_err(|e| RepoError::io("read xattrs of", root, e))?;
        let node = Node {
            name: Vec::new(),
            body: NodeBody::Dir { pages: Vec::new() },
            meta: metadata(&st, xattrs),
            hardlink: None,
            error: None,
        };
        let names = list(&fd).map_err(|e| RepoError::io("list backup root", root, e))?;
        self.emit(Event::Enter(node))?;
        let parent = parent.and_then(ParentDir::new);
        self.walk_dir(Arc::new(fd), &DirPath::root(root), names, parent)?;
        self.emit(Event::Leave)?;
        self.flush()
    }

    fn walk_dir(
        &mut self,
        dir: Arc<OwnedFd>,
        loc: &Arc<DirPath>,
        names: Vec<Vec<u8>>,
        mut parent: Option<ParentDir>,
    ) -> RepoResult<()> {
        for name in names {
            if self.shared.stop.is_cancelled() {
                return Err(RepoError::Cancelled);
            }
            let excludes = &self.shared.excludes;
            let mut relative = (!excludes.is_empty()).then(|| loc.relative(&name));
            if relative.as_deref().is_some_and(|r| excludes.excludes(r)) {
                continue;
            }
            let st = match nix::sys::stat::fstatat(
                dir.as_fd(),
                name.as_slice(),
                AtFlags::AT_SYMLINK_NOFOLLOW,
            ) {
                Ok(st) => st,
                // Deleted since it was listed: not part of the tree any more.
                Err(Errno::ENOENT) => continue,
                Err(e) => {
                    let shown = loc.show(&name).to_string();
                    self.error_entry(name, format!("{shown}: stat: {}", io(e)))?;
                    continue;
                }
            };
            // Taken: not held while the entry's subtree is walked (see `DirPath`).
            let is_dir = file_type(&st) == libc::S_IFDIR;
            if relative.take().is_some_and(|r| is_dir && excludes.excludes_dir(&r)) {
                continue;
            }
            let previous = parent.as_mut().and_then(|p| p.find(self.shared, &name));
            self.entry(&dir, name, loc, &st, previous)?;
        }
        Ok(())
    }

    fn error_entry(&mut self, name: Vec<u8>, message: String) -> RepoResult<()> {
        self.shared.progress.errors.fetch_add(1, Ordering::Relaxed);
        let node = Node {
            name,
            body: NodeBody::File(FileContent::default()),
            meta: Default::default(),
            hardlink: None,
            error: Some(message),
        };
        self.emit(Event::Entry(node, None))
    }

    fn entry(
        &mut self,
        dir: &Arc<OwnedFd>,
        name: Vec<u8>,
        loc: &Arc<DirPath>,
        st: &FileStat,
        previous: Option<Node>,
    ) -> RepoResult<()> {
        let mut error = None;
        let xattrs = xattrs_at(dir.as_ref(), &name).unwrap_or_else(|e| {
            error = Some(format!("{}: read xattrs: {e}", loc.show(&name)));
            Vec::new()
        });
        let meta = metadata(st, xattrs);
        let kind = file_type(st);
        let hardlink = (kind != libc::S_IFDIR && st.st_nlink > 1).then(|| {
            let next = self.hardlinks.len() as u64 + 1;
            *self.hardlinks.entry((st.st_dev, st.st_ino)).or_insert(next)
        });
        let rdev = st.st_rdev;
        let mut node = Node { name, body: NodeBody::Fifo, meta, hardlink, error };
        match kind {
            libc::S_IFDIR => {
                node.body = NodeBody::Dir { pages: Vec::new() };
                // Restore refuses deeper trees: record the directory, not what is below it.
                let opened = if self.depth + 1 >= MAX_DEPTH {
                    Err(std::io::Error::other(format!(
                        "nested deeper than {MAX_DEPTH} levels; its entries are not backed up"
                    )))
                } else {
                    open_subdir(dir, &node.name).and_then(|fd| list(&fd).map(|names| (fd, names)))
                };
                match opened {
                    Ok((sub, names)) => {
                        let parent = previous.as_ref().and_then(ParentDir::new);
                        let here = loc.child(&node.name);
                        self.emit(Event::Enter(node))?;
                        self.depth += 1;
                        let walked = self.walk_dir(Arc::new(sub), &here, names, parent);
                        self.depth -= 1;
                        walked?;
                    }
                    Err(e) => {
                        self.shared.progress.errors.fetch_add(1, Ordering::Relaxed);
                        node.error = Some(format!("{}: read directory: {e}", loc.show(&node.name)));
                        self.emit(Event::Enter(node))?;
                    }
                }
                return self.emit(Event::Leave);
            }
            libc::S_IFREG => return self.file(dir, node, loc, st, previous),
            libc::S_IFLNK => match nix::fcntl::readlinkat(dir.as_fd(), node.name.as_slice()) {
                Ok(target) => node.body = NodeBody::Symlink { target: target.as_bytes().to_vec() },
                Err(e) => {
                    self.shared.progress.errors.fetch_add(1, Ordering::Relaxed);
                    node.body = NodeBody::Symlink { target: Vec::new() };
                    node.error = Some(format!("{}: read link: {}", loc.show(&node.name), io(e)));
                }
            },
            libc::S_IFIFO => node.body = NodeBody::Fifo,
            libc::S_IFSOCK => node.body = NodeBody::Socket,
            libc::S_IFCHR => node.body = NodeBody::CharDevice { rdev },
            libc::S_IFBLK => node.body = NodeBody::BlockDevice { rdev },
            other => {
                self.shared.progress.errors.fetch_add(1, Ordering::Relaxed);
                node.body = NodeBody::File(FileContent::default());
                node.error = Some(format!("{}: unknown file type {other:o}", loc.show(&node.name)));
            }
        }
        self.emit(Event::Entry(node, None))
    }

    fn file(
        &mut self,
        dir: &Arc<OwnedFd>,
        mut node: Node,
        loc: &Arc<DirPath>,
        st: &FileStat,
        previous: Option<Node>,
    ) -> RepoResult<()> {
        let size = u64::try_from(st.st_size).unwrap_or(0);
        let p = &self.shared.progress;
        p.files_total.fetch_add(1, Ordering::Relaxed);
        p.bytes_total.fetch_add(size, Ordering::Relaxed);
        // Reuse the parent's chunk list only if every chunk is still indexed (not condemned
        // by garbage collection since the parent was written).
        let reusable = unchanged(previous, &node, size, self.shared.racy_from)
            .filter(|c| c.chunks.iter().all(|ch| self.shared.index.contains(&ch.id)));
        if let Some(content) = reusable {
            p.files_done.fetch_add(1, Ordering::Relaxed);
            p.bytes_done.fetch_add(size, Ordering::Relaxed);
            p.bytes_skipped.fetch_add(size, Ordering::Relaxed);
            node.body = NodeBody::File(content);
            return self.emit(Event::Entry(node, None));
        }
        let (reply, pending) = crossbeam_channel::bounded(1);
        let job = FileJob {
            dir: Arc::clone(dir),
            name: node.name.clone(),
            loc: Arc::clone(loc),
            sparse: may_be_sparse(st),
            reply,
        };
        self.jobs.send(job).map_err(|_| RepoError::Cancelled)?;
        self.emit(Event::Entry(node, Some(pending)))
    }
}

/// The parent's content when the file looks unchanged: same size, mtime, mode and owner, and
/// an mtime clearly before the parent backup began (`racy_from`; see `Shared`). Inode and
/// ctime are deliberately ignored: they change on every CSI snapshot clone.
fn unchanged(
    previous: Option<Node>,
    node: &Node,
    size: u64,
    racy_from: Option<Timestamp>,
) -> Option<FileContent> {
    if racy_from.is_some_and(|t| node.meta.mtime >= t) {
        return None;
    }
    let prev = previous?;
    if prev.error.is_some() {
        return None;
    }
    let NodeBody::File(content) = prev.body else { return None };
    let same = content.size == size
        && prev.meta.mtime == node.meta.mtime
        && prev.meta.mode == node.meta.mode
        && prev.meta.uid == node.meta.uid
        && prev.meta.gid == node.meta.gid;
    same.then_some(content)
}
