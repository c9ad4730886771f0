//! The restore planner: walks the snapshot's trees, creates every entry, and hands file
//! content to the workers in batches.

use std::collections::HashMap;
use std::os::fd::OwnedFd;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use nix::sys::stat::SFlag;

use crate::error::{RepoError, RepoResult};
use crate::format::{BlobId, Node, NodeBody};
use crate::restore::data::{Batch, Item, OpenFile};
use crate::restore::fsops::{self, Warnings};
use crate::restore::{BATCH_BYTES, Counts, MAX_DEPTH, Shared, for_each_entry};

pub(crate) fn child_path(path: &Path, name: &[u8]) -> PathBuf {
    path.join(std::ffi::OsStr::new(&*String::from_utf8_lossy(name)))
}

pub(crate) struct Planner<'a> {
    pub(crate) shared: &'a Shared,
    pub(crate) tx: crossbeam_channel::Sender<Batch>,
    pub(crate) batch: Batch,
    pub(crate) batch_bytes: u64,
    pub(crate) hardlinks: HashMap<u64, (Arc<OwnedFd>, Vec<u8>)>,
    pub(crate) counts: Counts,
}

impl Planner<'_> {
    pub(crate) fn dir(
        &mut self,
        fd: &Arc<OwnedFd>,
        pages: &[BlobId],
        path: &Path,
        depth: usize,
    ) -> RepoResult<()> {
        // An empty directory at the limit is fine (backup records the deepest directories it
        // does not enter that way); anything in it would be one level too deep.
        if depth >= MAX_DEPTH && !pages.is_empty() {
            return Err(RepoError::UnsafeEntry {
                path: path.to_path_buf(),
                reason: format!("nesting deeper than {MAX_DEPTH}"),
            });
        }
        for_each_entry(self.shared, pages, path, |node| self.entry(fd, node, path, depth))
    }

    pub(crate) fn entry(
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
        let batch = std::mem::take(&mut self.batch);
        self.tx.send(batch).map_err(|_| RepoError::Cancelled)
    }
}
