//! The walk over what snapshots reference.
//!
//! Every blob reached is handed to the caller as it is found (garbage collection marks it in a
//! bit per index slot, so memory does not grow with the references); tree pages are visited
//! once each however many snapshots share them.

use std::collections::HashSet;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{BlobId, NodeBody, SnapshotId, TreePage};
use crate::repo::{BlobLocation, Repository};

/// Tree pages read at once.
const TREE_CONCURRENCY: usize = 16;

/// Calls `reached` with every blob (data and tree) referenced by `snapshots`, resolving tree
/// pages with `locate`: each tree page once, each data blob once per reference.
///
/// # Errors
/// A snapshot or tree page that cannot be read or is not indexed: garbage collection must
/// then stop, since it cannot know what that tree references. An error from `reached` stops
/// the walk.
pub(crate) async fn collect(
    repo: &Repository,
    snapshots: &[SnapshotId],
    locate: &(dyn Fn(&BlobId) -> Option<BlobLocation> + Sync),
    reached: &mut (dyn FnMut(&BlobId) -> RepoResult<()> + Send),
    cancel: &CancellationToken,
) -> RepoResult<()> {
    let mut seen_trees: HashSet<BlobId> = HashSet::new();
    let mut stack: Vec<BlobId> = Vec::new();
    for id in snapshots {
        // A snapshot forgotten since the listing references nothing that must be kept.
        let snapshot = match repo.load_snapshot(id, cancel).await {
            Err(e) if e.is_not_found() => continue,
            other => other?,
        };
        visit(&snapshot.root.body, reached, &mut stack)?;
        while !stack.is_empty() {
            if cancel.is_cancelled() {
                return Err(RepoError::Cancelled);
            }
            let mut batch = Vec::with_capacity(TREE_CONCURRENCY);
            while batch.len() < TREE_CONCURRENCY {
                let Some(tree) = stack.pop() else { break };
                if seen_trees.insert(tree) {
                    reached(&tree)?;
                    batch.push(tree);
                }
            }
            let mut pages = futures::stream::iter(batch)
                .map(|tree| async move { read_tree(repo, locate, &tree, id, cancel).await })
                .buffer_unordered(TREE_CONCURRENCY);
            while let Some(page) = pages.next().await {
                for node in &page?.entries {
                    visit(&node.body, reached, &mut stack)?;
                }
            }
        }
    }
    Ok(())
}

fn visit(
    body: &NodeBody,
    reached: &mut (dyn FnMut(&BlobId) -> RepoResult<()> + Send),
    stack: &mut Vec<BlobId>,
) -> RepoResult<()> {
    match body {
        NodeBody::Dir { pages } => stack.extend(pages.iter().copied()),
        NodeBody::File(c) | NodeBody::Volume { content: c, .. } => {
            for chunk in &c.chunks {
                reached(&chunk.id)?;
            }
        }
        _ => {}
    }
    Ok(())
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
