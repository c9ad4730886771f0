//! The restore planner: walks the snapshot's trees, creates every entry, and hands file
//! content to the workers in batches, their blobs looked up (see [`super::data::locate`]).

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Weak};

use nix::sys::stat::SFlag;

use crate::dir_path::DirPath;
use crate::error::{RepoError, RepoResult};
use crate::format::{BlobId, Node, NodeBody};
use crate::restore::data::{self, Batch, Item, Located, OpenFile};
use crate::restore::fsops::{self, Warnings};
use crate::restore::{BATCH_BYTES, Counts, MAX_DEPTH, Shared, for_each_entry};

/// Reopening a directory by its place under the restore target, one component at a time,
/// never following a link, after its descriptor is closed.
impl DirPath {
    /// Opens this directory again, starting from the target's descriptor.
    pub(crate) fn open(&self, root: &Arc<OwnedFd>) -> std::io::Result<Arc<OwnedFd>> {
        let mut fd = Arc::clone(root);
        for name in self.names_below_root() {
            fd = Arc::new(fsops::open_dir(&fd, name)?);
        }
        Ok(fd)
    }
}

/// A member of a hardlink group already in the target. Its directory's descriptor is not
/// kept open (a tree with many groups would run out of descriptors): it is reused while
/// still open for other reasons and opened again by location otherwise.
#[derive(Debug, Clone)]
struct Placed {
    dir: Weak<OwnedFd>,
    loc: Arc<DirPath>,
    name: Vec<u8>,
}

/// Opens the directories of placed members again, keeping the last one reopened: links to
/// one closed directory tend to come together (a snapshot tree linking to the one before).
pub(crate) struct Reopener {
    root: Arc<OwnedFd>,
    last: Option<(Arc<DirPath>, Arc<OwnedFd>)>,
}

impl Reopener {
    /// Reopens below `root`, the target's descriptor.
    pub(crate) fn new(root: Arc<OwnedFd>) -> Self {
        Self { root, last: None }
    }

    fn dir(&mut self, placed: &Placed) -> std::io::Result<Arc<OwnedFd>> {
        if let Some(fd) = placed.dir.upgrade() {
            return Ok(fd);
        }
        if let Some((loc, fd)) = &self.last
            && Arc::ptr_eq(loc, &placed.loc)
        {
            return Ok(Arc::clone(fd));
        }
        let fd = placed.loc.open(&self.root)?;
        self.last = Some((Arc::clone(&placed.loc), Arc::clone(&fd)));
        Ok(fd)
    }
}

/// A hardlink group in the target. Its members are linked to the first one; if that one had
/// an error at backup time (its content may be missing), the first member without one takes
/// over and every member so far is linked to it, so one unreadable name does not leave every
/// link empty (and a group whose members all had errors stays one inode).
#[derive(Debug)]
pub(crate) struct Group {
    /// The member the others are linked to.
    anchor: Placed,
    /// While the anchor is a member with an error: all members so far, anchor included.
    provisional: Option<Vec<Placed>>,
}

pub(crate) struct Planner<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) tx: crossbeam_channel::Sender<Located<'a>>,
    pub(crate) batch: Batch,
    pub(crate) batch_bytes: u64,
    /// Opens directories of earlier hardlink members again by their [`DirPath`].
    pub(crate) reopen: Reopener,
    pub(crate) hardlinks: HashMap<u64, Group>,
    pub(crate) counts: Counts,
}

impl Planner<'_> {
    pub(crate) fn dir(
        &mut self,
        fd: &Arc<OwnedFd>,
        loc: &Arc<DirPath>,
        pages: &[BlobId],
        depth: usize,
    ) -> RepoResult<()> {
        // An empty directory at the limit is fine (backup records the deepest directories it
        // does not enter that way); anything in it would be one level too deep.
        if depth >= MAX_DEPTH && !pages.is_empty() {
            return Err(RepoError::UnsafeEntry {
                path: loc.path(),
                reason: format!("nesting deeper than {MAX_DEPTH}"),
            });
        }
        for_each_entry(self.shared, pages, loc, |node| self.entry(fd, loc, node, depth))
    }

    pub(crate) fn entry(
        &mut self,
        dir: &Arc<OwnedFd>,
        loc: &Arc<DirPath>,
        node: Node,
        depth: usize,
    ) -> RepoResult<()> {
        let name = node.name.as_slice();
        let io = |op: &'static str| move |e| RepoError::io(op, loc.child_path(name), e);
        // Creating what may replace an existing entry: a refusal names what was in the way.
        let replacing =
            |op: &'static str| move |e: fsops::ReplaceError| e.into_repo(op, &loc.child_path(name));
        if node.error.is_some() {
            self.counts.errors += 1;
        }
        // A device node withheld is not created at all, nor linked to.
        if matches!(node.body, NodeBody::CharDevice { .. } | NodeBody::BlockDevice { .. })
            && !self.shared.policy.creates_device()
        {
            return Ok(());
        }
        let what = loc.show(name);
        let mut earlier_members = Vec::new();
        if let (Some(id), false) = (node.hardlink, matches!(node.body, NodeBody::Dir { .. })) {
            let here =
                Placed { dir: Arc::downgrade(dir), loc: Arc::clone(loc), name: node.name.clone() };
            match self.hardlinks.get_mut(&id) {
                Some(group) if group.provisional.is_none() || node.error.is_some() => {
                    if matches!(node.body, NodeBody::File(_)) {
                        self.counts.files += 1;
                    }
                    let anchor = &group.anchor;
                    let first_dir =
                        self.reopen.dir(anchor).map_err(io("open directory to link"))?;
                    fsops::hard_link(&first_dir, &anchor.name, dir, &node.name)
                        .map_err(replacing("hard link"))?;
                    if let Some(members) = &mut group.provisional {
                        members.push(here);
                    }
                    return Ok(());
                }
                // The members so far had errors; this one is read: it takes over below.
                Some(group) => {
                    earlier_members = group.provisional.take().unwrap_or_default();
                    group.anchor = here;
                }
                None => {
                    let provisional = node.error.is_some().then(|| vec![here.clone()]);
                    self.hardlinks.insert(id, Group { anchor: here, provisional });
                }
            }
        }
        let mut warnings = Warnings::default();
        match &node.body {
            NodeBody::Dir { pages } => {
                let sub =
                    fsops::ensure_dir(dir, &node.name).map_err(replacing("create directory"))?;
                self.counts.dirs += 1;
                self.dir(&Arc::new(sub), &loc.child(&node.name), pages, depth + 1)?;
            }
            NodeBody::File(content) | NodeBody::Volume { content, .. } => {
                let file = fsops::create_file(dir, &node.name, &node.meta)
                    .map_err(replacing("create file"))?;
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
                    fsops::apply_fd(&file, &node.meta, self.shared, &what, &mut warnings)
                        .map_err(io("set metadata of"))?;
                    self.shared.progress.files_done.fetch_add(1, Ordering::Relaxed);
                } else {
                    let open = Arc::new(OpenFile {
                        file,
                        loc: Arc::clone(loc),
                        name: node.name.clone(),
                        meta: node.meta.clone(),
                        pending: AtomicUsize::new(segments.len()),
                        write_back: content.size >= super::data::WRITE_BACK_BYTES,
                        _dir: Arc::clone(dir),
                    });
                    for chunks in segments {
                        let len: u64 = chunks.iter().map(|c| u64::from(c.1.len)).sum();
                        self.push(Item { file: Arc::clone(&open), chunks }, len)?;
                    }
                }
            }
            // A link whose target could not be read at backup: there is nothing to create.
            NodeBody::Symlink { target } if target.is_empty() => {
                warnings.0.push(format!("{what}: symlink not restored: its target is unknown"));
            }
            NodeBody::Symlink { target } => {
                fsops::create_symlink(dir, &node.name, target)
                    .map_err(replacing("create symlink"))?;
                fsops::apply_at(
                    dir,
                    &node.name,
                    &node.meta,
                    true,
                    self.shared,
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
                fsops::create_node(dir, &node.name, kind, rdev)
                    .map_err(replacing("create node"))?;
                fsops::apply_at(
                    dir,
                    &node.name,
                    &node.meta,
                    false,
                    self.shared,
                    &what,
                    &mut warnings,
                )
                .map_err(io("set metadata of"))?;
            }
        }
        self.shared.warn(warnings);
        // Members before this one had errors: they become links to this one.
        for earlier in earlier_members {
            let earlier_dir = self.reopen.dir(&earlier).map_err(io("open directory to link"))?;
            fsops::hard_link(dir, &node.name, &earlier_dir, &earlier.name)
                .map_err(replacing("hard link"))?;
        }
        Ok(())
    }

    fn push(&mut self, item: Item, len: u64) -> RepoResult<()> {
        self.batch.push(item);
        self.batch_bytes += len;
        if self.batch_bytes >= BATCH_BYTES || self.batch.len() >= self.shared.batch_items {
            self.flush()?;
        }
        Ok(())
    }

    pub(crate) fn flush(&mut self) -> RepoResult<()> {
        if self.batch.is_empty() {
            return Ok(());
        }
        self.batch_bytes = 0;
        let batch = data::locate(self.shared, std::mem::take(&mut self.batch))?;
        self.tx.send(batch).map_err(|_| RepoError::Cancelled)
    }
}
