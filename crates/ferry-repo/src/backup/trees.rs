//! The tree builder: turns the walker's ordered events into tree pages, bottom-up.
//!
//! Events arrive in walk order (a directory's entries sorted by name, each subdirectory's
//! events nested where its name sorts). File entries carry a reply channel that the file
//! worker answers; the builder waits for replies in order while the walker and the workers
//! run ahead, bounded by the channel capacities. A directory's pages are written as soon as
//! they fill, so memory holds at most one page per open directory level.

use std::sync::atomic::Ordering;

use crate::backup::Shared;
use crate::backup::files::FileOutcome;
use crate::error::{RepoError, RepoResult};
use crate::format::{
    BlobId, FileContent, MAX_PLAINTEXT, Node, NodeBody, ObjectKind, Summary, TreePage,
};
use crate::repo::writer::LocalPacker;

/// One step of the walk.
#[derive(Debug)]
pub(crate) enum Event {
    /// A directory starts; its entries follow until the matching [`Event::Leave`].
    Enter(Node),
    /// A non-directory entry, with the pending file read if its content is being read.
    Entry(Node, Option<crossbeam_channel::Receiver<FileOutcome>>),
    /// The current directory ends.
    Leave,
}

struct OpenDir {
    node: Node,
    page: Vec<Node>,
    /// Encoded size of `page`'s entries.
    page_bytes: usize,
    pages: Vec<BlobId>,
}

pub(crate) struct TreeBuilder<'a> {
    shared: &'a Shared,
    packer: LocalPacker,
    stack: Vec<OpenDir>,
    pub(crate) summary: Summary,
    /// Hard-link groups whose size is in `summary.bytes_total` already: a file with several
    /// names holds its data once.
    counted_links: std::collections::HashSet<u64>,
}

impl<'a> TreeBuilder<'a> {
    pub(crate) fn new(shared: &'a Shared, packer: LocalPacker) -> Self {
        Self {
            shared,
            packer,
            stack: Vec::new(),
            summary: Summary::default(),
            counted_links: std::collections::HashSet::new(),
        }
    }

    /// Consumes events until the root directory ends; returns the root node.
    pub(crate) fn run(
        mut self,
        events: crossbeam_channel::Receiver<Vec<Event>>,
    ) -> RepoResult<(Node, Summary)> {
        while let Ok(batch) = events.recv() {
            for event in batch {
                if let Some(done) = self.event(event)? {
                    return Ok(done);
                }
            }
        }
        Err(RepoError::Cancelled)
    }

    /// Handles one event; returns the root once it is finished.
    fn event(&mut self, event: Event) -> RepoResult<Option<(Node, Summary)>> {
        if self.shared.stop.is_cancelled() {
            return Err(RepoError::Cancelled);
        }
        match event {
            Event::Enter(node) => self.stack.push(OpenDir {
                node,
                page: Vec::new(),
                page_bytes: 0,
                pages: Vec::new(),
            }),
            Event::Entry(mut node, pending) => {
                if let Some(rx) = pending {
                    let outcome = rx.recv().map_err(|_| RepoError::Cancelled)?;
                    match outcome {
                        FileOutcome::Read(content) => node.body = NodeBody::File(content),
                        FileOutcome::Failed(message) => {
                            node.body = NodeBody::File(FileContent::default());
                            node.error = Some(message);
                        }
                    }
                }
                self.push(node)?;
            }
            Event::Leave => {
                let Some(mut dir) = self.stack.pop() else {
                    return Err(RepoError::Internal {
                        what: "tree builder",
                        reason: "unbalanced walk".into(),
                    });
                };
                if !dir.page.is_empty() {
                    let page = std::mem::take(&mut dir.page);
                    dir.pages.push(self.write_page(page)?);
                }
                dir.node.body = NodeBody::Dir { pages: dir.pages };
                if self.stack.is_empty() {
                    self.count(&dir.node);
                    return Ok(Some((dir.node, self.summary)));
                }
                self.push(dir.node)?;
            }
        }
        Ok(None)
    }

    fn count(&mut self, node: &Node) {
        match &node.body {
            NodeBody::File(c) => {
                self.summary.files += 1;
                if node.hardlink.is_none_or(|group| self.counted_links.insert(group)) {
                    self.summary.bytes_total += c.size;
                }
            }
            NodeBody::Dir { .. } => self.summary.dirs += 1,
            _ => {}
        }
        if node.error.is_some() {
            self.summary.errors += 1;
        }
    }

    fn push(&mut self, node: Node) -> RepoResult<()> {
        self.count(&node);
        let len = node.encoded_len();
        let Some(top) = self.stack.last_mut() else {
            return Err(RepoError::Internal {
                what: "tree builder",
                reason: "entry outside a directory".into(),
            });
        };
        let full = !top.page.is_empty()
            && (top.page.len() >= TreePage::MAX_ENTRIES
                || top.page_bytes.saturating_add(len) > TreePage::MAX_BYTES);
        if full {
            let page = std::mem::take(&mut top.page);
            top.page_bytes = 0;
            let id = self.write_page(page)?;
            if let Some(top) = self.stack.last_mut() {
                top.pages.push(id);
            }
        }
        if let Some(top) = self.stack.last_mut() {
            top.page.push(node);
            top.page_bytes = top.page_bytes.saturating_add(len);
        }
        Ok(())
    }

    fn write_page(&mut self, entries: Vec<Node>) -> RepoResult<BlobId> {
        let page = TreePage { entries };
        let raw = page.encode();
        // Only a single entry can get here (pages close at MAX_BYTES): a file listing some
        // 14 million chunks. A snapshot holding it could never be read back: refuse it.
        if raw.len() > MAX_PLAINTEXT {
            return Err(RepoError::InvalidInput {
                what: "backup source",
                reason: format!(
                    "{:?}: its chunk list takes {} MiB, over the {} MiB a tree page may hold \
                     (a file of about 14 TB or more): this format cannot hold it",
                    page.entries
                        .first()
                        .map(|n| String::from_utf8_lossy(&n.name))
                        .unwrap_or_default(),
                    raw.len() >> 20,
                    MAX_PLAINTEXT >> 20
                ),
            });
        }
        let id = self.shared.repo.keys().blob_id(&raw);
        if self.shared.claim(id) {
            self.packer.add(ObjectKind::TreeBlob, id, &raw)?;
            self.shared.progress.tree_bytes_new.fetch_add(raw.len() as u64, Ordering::Relaxed);
        }
        Ok(id)
    }
}
