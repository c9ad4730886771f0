//! Repository verification.
//!
//! Structure: every index file authenticates; every pack an index names exists with the
//! recorded size; every snapshot authenticates; every tree page of every snapshot is indexed,
//! authenticates and decodes; every chunk a file references is indexed. With `read_data`,
//! every pack is read whole: its bytes must hash to its name, its header must authenticate and
//! agree with the index, and every blob in it must authenticate and hash to its id; a
//! [`PackSubset`] limits that to part of the packs (a large repository checked in turns).
//! Problems are collected (each naming the object) rather than stopping at the first.

use std::collections::{HashMap, HashSet};
use std::sync::Arc;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{
    BlobId, IndexFile, IndexId, NodeBody, ObjectKind, PackEntry, PackId, content_address,
    open_blob, read_pack_header,
};
use crate::progress::{Counters, ProgressFn, Ticker};
use crate::repo::capped::{self, Limit};
use crate::repo::{MemIndex, Repository, layout};

mod subset;
pub use subset::{PackSubset, SubsetError};

/// Options for [`check`].
#[derive(Debug, Clone, Copy, Default)]
pub struct CheckOptions {
    /// Read and authenticate every byte of every pack.
    pub read_data: bool,
    /// With `read_data`, only the packs of this subset.
    pub subset: Option<PackSubset>,
}

/// What [`check`] found.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CheckReport {
    /// Snapshots checked.
    pub snapshots: u64,
    /// Distinct tree pages checked.
    pub trees: u64,
    /// Distinct data blobs referenced.
    pub data_blobs: u64,
    /// Packs in storage.
    pub packs: u64,
    /// Packs read whole (with `read_data`).
    pub packs_read: u64,
    /// Bytes read and authenticated (with `read_data`).
    pub bytes_read: u64,
    /// Packs in storage that no index names (left by an interrupted backup, or a backup still
    /// running); not an error.
    pub unindexed_packs: u64,
    /// Every problem found, each naming the object concerned.
    pub problems: Vec<String>,
}

impl CheckReport {
    /// Whether no problem was found.
    #[must_use]
    pub fn is_ok(&self) -> bool {
        self.problems.is_empty()
    }
}

/// Verifies the repository.
///
/// # Errors
/// Only failures that prevent checking at all (listing storage, cancellation); damaged
/// objects are reported in [`CheckReport::problems`].
pub async fn check(
    repo: &Repository,
    options: CheckOptions,
    progress: Option<ProgressFn>,
    cancel: &CancellationToken,
) -> RepoResult<CheckReport> {
    let mut report = CheckReport::default();
    let counters = Arc::new(Counters::default());
    let _ticker = {
        let c = Arc::clone(&counters);
        Ticker::start(progress, move || c.snapshot(0, false))
    };
    // Index files.
    let mut files: Vec<(IndexId, IndexFile)> = Vec::new();
    for id in repo.index_ids(cancel).await? {
        match repo.read_index_file(id, cancel).await {
            Ok(f) => files.push((id, f)),
            Err(RepoError::Cancelled) => return Err(RepoError::Cancelled),
            Err(e) => report.problems.push(e.to_string()),
        }
    }
    let mut indexed: HashMap<PackId, (u64, Vec<PackEntry>)> = HashMap::new();
    // Files superseded by a compacted index are ignored, as every reader does.
    let superseded: HashSet<IndexId> =
        files.iter().flat_map(|(_, f)| f.supersedes.iter().copied()).collect();
    for (_, f) in files.iter().filter(|(id, _)| !superseded.contains(id)) {
        for p in &f.packs {
            let slot = indexed.entry(p.id).or_insert_with(|| (p.size, Vec::new()));
            slot.1.extend(p.entries.iter().copied());
        }
    }
    let index = MemIndex::build(files);
    // Packs.
    let listed = repo
        .store()
        .list(layout::DATA, cancel)
        .await
        .map_err(|e| RepoError::store("list", layout::DATA, e))?;
    let stored: HashMap<PackId, u64> = listed
        .iter()
        .filter_map(|m| layout::id_of(&m.key).map(|id| (PackId(id), m.size)))
        .collect();
    report.packs = stored.len() as u64;
    for (id, (size, _)) in &indexed {
        match stored.get(id) {
            None => report.problems.push(format!("pack {id} named by the index is missing")),
            Some(s) if s != size => {
                report.problems.push(format!("pack {id} is {s} bytes, the index says {size}"))
            }
            Some(_) => {}
        }
    }
    report.unindexed_packs = stored.keys().filter(|id| !indexed.contains_key(id)).count() as u64;
    // Snapshots and trees.
    let ids = repo.snapshot_ids(cancel).await?;
    let mut seen_trees: HashSet<BlobId> = HashSet::new();
    let mut seen_data: HashSet<BlobId> = HashSet::new();
    for id in ids {
        let loaded = repo.load_snapshot(&id, cancel).await;
        if matches!(&loaded, Err(e) if e.is_not_found()) {
            continue; // forgotten since the listing: nothing left to check
        }
        report.snapshots += 1;
        let snap = match loaded {
            Ok(s) => s,
            Err(RepoError::Cancelled) => return Err(RepoError::Cancelled),
            Err(e) => {
                report.problems.push(e.to_string());
                continue;
            }
        };
        let mut stack: Vec<(BlobId, String)> = Vec::new();
        let mut visit = |body: &NodeBody,
                         path: &str,
                         stack: &mut Vec<(BlobId, String)>,
                         report: &mut CheckReport| match body {
            NodeBody::Dir { pages } => stack.extend(pages.iter().map(|p| (*p, path.to_owned()))),
            NodeBody::File(c) | NodeBody::Volume { content: c, .. } => {
                for chunk in &c.chunks {
                    if seen_data.insert(chunk.id) && !index.contains(&chunk.id) {
                        report.problems.push(format!(
                            "data blob {} of {path} (snapshot {id}) is in no index",
                            chunk.id
                        ));
                    }
                }
            }
            _ => {}
        };
        visit(&snap.root.body, "/", &mut stack, &mut report);
        while let Some((tree, path)) = stack.pop() {
            if cancel.is_cancelled() {
                return Err(RepoError::Cancelled);
            }
            if !seen_trees.insert(tree) {
                continue;
            }
            report.trees += 1;
            if !index.contains(&tree) {
                report
                    .problems
                    .push(format!("tree blob {tree} of {path} (snapshot {id}) is in no index"));
                continue;
            }
            match read_tree_with(repo, &index, &tree, cancel).await {
                Ok(page) => {
                    for node in &page.entries {
                        let child = format!(
                            "{}/{}",
                            path.trim_end_matches('/'),
                            String::from_utf8_lossy(&node.name)
                        );
                        visit(&node.body, &child, &mut stack, &mut report);
                    }
                }
                Err(RepoError::Cancelled) => return Err(RepoError::Cancelled),
                Err(e) => report.problems.push(format!("{e} (directory {path} of snapshot {id})")),
            }
        }
    }
    report.data_blobs = seen_data.len() as u64;
    if options.read_data {
        let chosen: HashMap<PackId, u64> = match options.subset {
            None => stored.clone(),
            Some(subset) => {
                let all: Vec<PackId> = stored.keys().copied().collect();
                let picked = subset.pick(&all).map_err(|e| RepoError::InvalidInput {
                    what: "read-data subset",
                    reason: e.to_string(),
                })?;
                picked.into_iter().map(|id| (id, stored[&id])).collect()
            }
        };
        read_data(repo, &chosen, &indexed, &mut report, &counters, cancel).await?;
    }
    Ok(report)
}

async fn read_tree_with(
    repo: &Repository,
    index: &MemIndex,
    id: &BlobId,
    cancel: &CancellationToken,
) -> RepoResult<crate::format::TreePage> {
    let loc = index
        .lookup(id)
        .ok_or_else(|| RepoError::MissingBlob { id: *id, referrer: "check".into() })?;
    repo.read_tree_at(id, &loc, cancel).await
}

async fn read_data(
    repo: &Repository,
    stored: &HashMap<PackId, u64>,
    indexed: &HashMap<PackId, (u64, Vec<PackEntry>)>,
    report: &mut CheckReport,
    counters: &Counters,
    cancel: &CancellationToken,
) -> RepoResult<()> {
    let total: u64 = stored.values().sum();
    counters.bytes_total.store(total, std::sync::atomic::Ordering::Relaxed);
    let mut results = futures::stream::iter(stored.keys().copied())
        .map(|id| {
            let entries = indexed.get(&id).map(|(_, e)| e.clone());
            async move { verify_pack(repo, id, entries, cancel).await }
        })
        .buffer_unordered(3);
    while let Some(result) = results.next().await {
        let (bytes, problems) = result?;
        report.packs_read += 1;
        report.bytes_read += bytes;
        counters.bytes_done.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        report.problems.extend(problems);
    }
    Ok(())
}

async fn verify_pack(
    repo: &Repository,
    id: PackId,
    indexed: Option<Vec<PackEntry>>,
    cancel: &CancellationToken,
) -> RepoResult<(u64, Vec<String>)> {
    let key = layout::pack(&id)?;
    let read = capped::read(repo.store().as_ref(), &key, Limit::PACK, "read pack", cancel);
    let bytes = match read.await {
        Ok(bytes) => bytes,
        // Refused by its size, unread: a damaged object like any other.
        Err(e @ RepoError::TooLarge { .. }) => return Ok((0, vec![e.to_string()])),
        Err(e) => return Err(e),
    };
    let keys = repo.keys().clone();
    let len = bytes.len() as u64;
    let problems = tokio::task::spawn_blocking(move || {
        let mut problems = Vec::new();
        if content_address(&bytes) != id.0 {
            problems.push(format!("pack {key}: content does not hash to its name"));
        }
        let header = match read_pack_header(&keys.cipher, &bytes) {
            Ok(h) => h,
            Err(e) => {
                problems.push(format!("pack {key}: header unreadable: {e}"));
                return problems;
            }
        };
        if let Some(mut expected) = indexed {
            let mut got = header.entries.clone();
            expected.sort_by_key(|e| e.offset);
            expected.dedup();
            got.sort_by_key(|e| e.offset);
            if expected != got {
                problems.push(format!("pack {key}: header and index disagree"));
            }
        }
        for e in &header.entries {
            let sealed = &bytes[e.offset as usize..(e.offset + e.length) as usize];
            if let Err(err) = open_blob(&keys, &e.id, e.kind, sealed) {
                let kind = if e.kind == ObjectKind::TreeBlob { "tree blob" } else { "data blob" };
                problems.push(format!("{kind} {} in pack {key}: {err}", e.id));
            }
        }
        problems
    })
    .await
    .map_err(|e| RepoError::Internal { what: "check", reason: e.to_string() })?;
    Ok((len, problems))
}
