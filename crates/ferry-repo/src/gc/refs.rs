//! The reference set: every blob some snapshot reaches, in compact sorted form.
//!
//! Data blob ids are appended to one flat vector and periodically sorted and deduplicated, so
//! memory is 32 bytes per distinct referenced blob plus a bounded unsorted tail (never one
//! heap object per chunk). Tree pages are visited once each however many snapshots share
//! them.

use std::collections::HashSet;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{BlobId, NodeBody, SnapshotId, TreePage};
use crate::repo::{BlobLocation, Repository};

/// Tree pages read at once.
const TREE_CONCURRENCY: usize = 16;

/// A growing set of blob ids: a sorted, deduplicated prefix and an unsorted tail.
#[derive(Debug, Default)]
pub(crate) struct RefSet {
    ids: Vec<BlobId>,
    sorted: usize,
}

impl RefSet {
    pub(crate) fn insert(&mut self, id: BlobId) {
        if self.ids.len() == self.ids.capacity() {
            let tail = self.ids.len() - self.sorted;
            if tail >= (self.sorted / 2).max(1 << 16) {
                self.compact();
            }
            if self.ids.len() == self.ids.capacity() {
                // Grow by half the sorted part at most, not by doubling.
                let extra = (self.sorted / 2).max(1 << 16);
                self.ids.reserve_exact(extra);
            }
        }
        self.ids.push(id);
    }

    fn compact(&mut self) {
        self.ids.sort_unstable();
        self.ids.dedup();
        self.sorted = self.ids.len();
    }

    /// The finished set.
    pub(crate) fn finish(mut self) -> SortedIds {
        self.compact();
        self.ids.shrink_to_fit();
        SortedIds(self.ids)
    }
}

/// A sorted, deduplicated set of blob ids.
#[derive(Debug, Default)]
pub(crate) struct SortedIds(Vec<BlobId>);

impl SortedIds {
    pub(crate) fn contains(&self, id: &BlobId) -> bool {
        self.0.binary_search(id).is_ok()
    }

    pub(crate) fn len(&self) -> usize {
        self.0.len()
    }

    pub(crate) fn iter(&self) -> impl Iterator<Item = &BlobId> {
        self.0.iter()
    }
}

/// Every blob (data and tree) referenced by `snapshots`, resolving tree pages with `locate`.
///
/// # Errors
/// A snapshot or tree page that cannot be read or is not indexed: garbage collection must
/// then stop, since it cannot know what that tree references.
pub(crate) async fn collect(
    repo: &Repository,
    snapshots: &[SnapshotId],
    locate: &(dyn Fn(&BlobId) -> Option<BlobLocation> + Sync),
    cancel: &CancellationToken,
) -> RepoResult<SortedIds> {
    let mut refs = RefSet::default();
    let mut seen_trees: HashSet<BlobId> = HashSet::new();
    let mut stack: Vec<BlobId> = Vec::new();
    for id in snapshots {
        // A snapshot forgotten since the listing references nothing that must be kept.
        let snapshot = match repo.load_snapshot(id, cancel).await {
            Err(e) if e.is_not_found() => continue,
            other => other?,
        };
        visit(&snapshot.root.body, &mut refs, &mut stack);
        while !stack.is_empty() {
            if cancel.is_cancelled() {
                return Err(RepoError::Cancelled);
            }
            let mut batch = Vec::with_capacity(TREE_CONCURRENCY);
            while batch.len() < TREE_CONCURRENCY {
                let Some(tree) = stack.pop() else { break };
                if seen_trees.insert(tree) {
                    refs.insert(tree);
                    batch.push(tree);
                }
            }
            let mut pages = futures::stream::iter(batch)
                .map(|tree| async move { read_tree(repo, locate, &tree, id, cancel).await })
                .buffer_unordered(TREE_CONCURRENCY);
            while let Some(page) = pages.next().await {
                for node in &page?.entries {
                    visit(&node.body, &mut refs, &mut stack);
                }
            }
        }
    }
    Ok(refs.finish())
}

fn visit(body: &NodeBody, refs: &mut RefSet, stack: &mut Vec<BlobId>) {
    match body {
        NodeBody::Dir { pages } => stack.extend(pages.iter().copied()),
        NodeBody::File(c) | NodeBody::Volume { content: c, .. } => {
            for chunk in &c.chunks {
                refs.insert(chunk.id);
            }
        }
        _ => {}
    }
}

async fn read_tree(
    repo: &Repository,
    locate: &(dyn Fn(&BlobId) -> Option<BlobLocation> + Sync),
    id: &BlobId,
    snapshot: &SnapshotId,
    cancel: &CancellationToken,
) -> RepoResult<TreePage> {
    let referrer = format!("snapshot {snapshot}");
    let loc = locate(id).ok_or(RepoError::MissingBlob { id: *id, referrer })?;
    repo.read_tree_at(id, &loc, cancel).await
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ref_set_deduplicates_and_stays_compact() {
        let mut set = RefSet::default();
        for round in 0..5u32 {
            for i in 0..100_000u32 {
                let mut id = [0u8; 32];
                id[..4].copy_from_slice(&i.to_le_bytes());
                set.insert(BlobId(id));
            }
            assert!(set.ids.capacity() <= 100_000 * 3 / 2 + (1 << 17), "round {round}");
        }
        let ids = set.finish();
        assert_eq!(ids.len(), 100_000);
        let mut probe = [0u8; 32];
        probe[..4].copy_from_slice(&99_999u32.to_le_bytes());
        assert!(ids.contains(&BlobId(probe)));
        probe[..4].copy_from_slice(&100_000u32.to_le_bytes());
        assert!(!ids.contains(&BlobId(probe)));
    }
}
