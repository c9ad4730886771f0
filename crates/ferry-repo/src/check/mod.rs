//! Repository verification.
//!
//! Structure: every index file authenticates; every pack an index names exists with the
//! recorded size; every snapshot authenticates; every tree page of every snapshot is indexed,
//! authenticates and decodes; every chunk a file references is indexed. With `read_data`,
//! every pack is read whole: its bytes must hash to its name, its header must authenticate and
//! agree with the index, and every blob in it must authenticate and hash to its id; a
//! [`PackSubset`] limits that to part of the packs (a large repository checked in turns).
//! Problems are collected (each naming the object) rather than stopping at the first.
//!
//! Memory: the index (built file by file as the index files are read), two bits per indexed
//! blob for the data and tree pages the snapshots reach, and the listing of the packs; a pack
//! read whole is compared with the index through lookups, not with a second copy of its
//! entries.

use std::collections::HashSet;
use std::sync::Arc;

use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{
    BlobId, BlobOpener, NodeBody, PackEntry, PackId, content_address, read_pack_header,
};
use crate::progress::{Counters, ProgressFn, Ticker};
use crate::repo::capped::{self, Limit};
use crate::repo::{
    BlobLocation, IndexBuilder, LOAD_CONCURRENCY, MemIndex, Repository, SlotMarks, blocking, layout,
};

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
    // The snapshots are listed before the index is read: a backup stores its index files
    // before its snapshot, so every snapshot listed finds its blobs in the index read after
    // (the other way round, a backup committing in between had its blobs reported as in no
    // index).
    let ids = repo.snapshot_ids(cancel).await?;
    // Index files, each taken into the index as it is read (an unreadable one is a problem
    // like any other).
    let mut builder = IndexBuilder::new(HashSet::new());
    let mut reads = futures::stream::iter(repo.index_ids(cancel).await?)
        .map(|id| async move { (id, repo.read_index_file(id, cancel).await) })
        .buffer_unordered(LOAD_CONCURRENCY);
    while let Some((id, read)) = reads.next().await {
        match read {
            Ok(file) => builder.add(id, file),
            Err(RepoError::Cancelled) => return Err(RepoError::Cancelled),
            Err(e) => report.problems.push(e.to_string()),
        }
    }
    drop(reads);
    // Files superseded by a compacted index are left out, as every reader does.
    let index = blocking(move || builder.finish()).await?;
    // Packs.
    let listed = repo
        .store()
        .list(layout::DATA, cancel)
        .await
        .map_err(|e| RepoError::store("list", layout::DATA, e))?;
    // Each listed pack is compared with the index as it comes; only `--read-data` keeps the
    // listing, sorted by id (a map of 600 k packs took 40 MB more).
    let mut seen = vec![false; index.packs().len()];
    let mut wrong_size: Vec<(usize, u64)> = Vec::new();
    let mut stored: Vec<(PackId, u64)> = Vec::new();
    for (id, size) in
        listed.iter().filter_map(|m| layout::id_of(&m.key).map(|id| (PackId(id), m.size)))
    {
        report.packs += 1;
        match index.pack_number(&id) {
            Some(n) => {
                seen[n] = true;
                if index.packs()[n].size != size {
                    wrong_size.push((n, size));
                }
            }
            None => report.unindexed_packs += u64::from(index.pack_size(&id).is_none()),
        }
        if options.read_data {
            stored.push((id, size));
        }
    }
    drop(listed);
    stored.sort_unstable();
    wrong_size.sort_unstable();
    let mut wrong_size = wrong_size.into_iter().peekable();
    for (n, info) in index.packs().iter().enumerate() {
        if !seen[n] {
            report.problems.push(format!("pack {} named by the index is missing", info.id));
        }
        while let Some((_, s)) = wrong_size.next_if(|(w, _)| *w == n) {
            report
                .problems
                .push(format!("pack {} is {s} bytes, the index says {}", info.id, info.size));
        }
    }
    drop(seen);
    // Snapshots and trees.
    // What the snapshots reach: a bit per indexed blob, and the few ids no index holds (each
    // reported once).
    let mut reach = Reach {
        data: SlotMarks::new(&index),
        trees: SlotMarks::new(&index),
        unindexed_data: HashSet::new(),
        unindexed_trees: HashSet::new(),
    };
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
        let visit = |body: &NodeBody,
                     path: &str,
                     stack: &mut Vec<(BlobId, String)>,
                     reach: &mut Reach,
                     report: &mut CheckReport| match body {
            NodeBody::Dir { pages } => stack.extend(pages.iter().map(|p| (*p, path.to_owned()))),
            NodeBody::File(c) | NodeBody::Volume { content: c, .. } => {
                for chunk in &c.chunks {
                    if reach.data.mark(&index, &chunk.id).is_none()
                        && reach.unindexed_data.insert(chunk.id)
                    {
                        report.problems.push(format!(
                            "data blob {} of {path} (snapshot {id}) is in no index",
                            chunk.id
                        ));
                    }
                }
            }
            _ => {}
        };
        visit(&snap.root.body, "/", &mut stack, &mut reach, &mut report);
        while let Some((tree, path)) = stack.pop() {
            if cancel.is_cancelled() {
                return Err(RepoError::Cancelled);
            }
            match reach.trees.mark(&index, &tree) {
                Some(false) => continue,
                Some(true) => {}
                None => {
                    if reach.unindexed_trees.insert(tree) {
                        report.problems.push(format!(
                            "tree blob {tree} of {path} (snapshot {id}) is in no index"
                        ));
                    }
                    continue;
                }
            }
            match read_tree_with(repo, &index, &tree, cancel).await {
                Ok(page) => {
                    for node in &page.entries {
                        let child = format!(
                            "{}/{}",
                            path.trim_end_matches('/'),
                            String::from_utf8_lossy(&node.name)
                        );
                        visit(&node.body, &child, &mut stack, &mut reach, &mut report);
                    }
                }
                Err(RepoError::Cancelled) => return Err(RepoError::Cancelled),
                Err(e) => report.problems.push(format!("{e} (directory {path} of snapshot {id})")),
            }
        }
    }
    report.trees = (reach.trees.count() + reach.unindexed_trees.len()) as u64;
    report.data_blobs = (reach.data.count() + reach.unindexed_data.len()) as u64;
    drop(reach);
    if options.read_data {
        let chosen: Vec<(PackId, u64)> = match options.subset {
            None => stored,
            Some(subset) => {
                let all: Vec<PackId> = stored.iter().map(|(id, _)| *id).collect();
                let picked = subset.pick(&all).map_err(|e| RepoError::InvalidInput {
                    what: "read-data subset",
                    reason: e.to_string(),
                })?;
                let size_of = |id: &PackId| {
                    stored.binary_search_by(|(p, _)| p.cmp(id)).ok().map(|n| stored[n].1)
                };
                let sized = picked.into_iter().map(|id| (id, size_of(&id).unwrap_or(0)));
                sized.collect()
            }
        };
        read_data(repo, &chosen, &index, &mut report, &counters, cancel).await?;
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

/// What a walk over the snapshots has reached: data blobs and tree pages apart (a chunk and
/// a page with the same bytes have the same id; the page must still be read).
struct Reach {
    /// Indexed data blobs, a bit each.
    data: SlotMarks,
    /// Indexed tree pages, a bit each.
    trees: SlotMarks,
    /// Blobs no index holds (each reported once).
    unindexed_data: HashSet<BlobId>,
    unindexed_trees: HashSet<BlobId>,
}

async fn read_data(
    repo: &Repository,
    packs: &[(PackId, u64)],
    index: &MemIndex,
    report: &mut CheckReport,
    counters: &Counters,
    cancel: &CancellationToken,
) -> RepoResult<()> {
    let total: u64 = packs.iter().map(|(_, size)| size).sum();
    counters.bytes_total.store(total, std::sync::atomic::Ordering::Relaxed);
    // How many blobs the index files list in each pack, by pack number.
    let mut placed = vec![0u32; index.packs().len()];
    index.for_each(|_, _, pack, _| placed[pack] += 1);
    index.for_each_copy(|pack| placed[pack] += 1);
    let mut results = futures::stream::iter(packs.iter().map(|(id, _)| *id))
        .map(|id| async move { (id, verify_pack(repo, id, cancel).await) })
        .buffer_unordered(3);
    while let Some((id, result)) = results.next().await {
        let (bytes, mut problems, header) = result?;
        if let (Some(entries), Some(number)) = (header, index.pack_number(&id)) {
            let expected = placed.get(number).copied().unwrap_or(0);
            if !header_agrees(index, id, &entries, expected) {
                problems.push(format!("pack {id}: header and index disagree"));
            }
        }
        report.packs_read += 1;
        report.bytes_read += bytes;
        counters.bytes_done.fetch_add(bytes, std::sync::atomic::Ordering::Relaxed);
        report.problems.extend(problems);
    }
    Ok(())
}

/// Whether a pack's header and the index agree: the header holds exactly the blobs the index
/// files list in this pack (`expected` places), each where they list it. (A blob stored
/// twice is listed in both packs; which of them lookups use is the index's choice.)
fn header_agrees(index: &MemIndex, pack: PackId, entries: &[PackEntry], expected: u32) -> bool {
    let Some(number) = index.pack_number(&pack) else { return false };
    let mut listed = 0u32;
    for e in entries {
        let loc = BlobLocation::listed(pack, e);
        if !index.lists(&e.id, number, &loc) {
            return false;
        }
        listed += 1;
    }
    listed == expected
}

/// Reads a pack whole and checks its name, header and blobs: the bytes read, the problems
/// found, and the header's entries if it could be read.
async fn verify_pack(
    repo: &Repository,
    id: PackId,
    cancel: &CancellationToken,
) -> RepoResult<(u64, Vec<String>, Option<Vec<PackEntry>>)> {
    let key = layout::pack(&id)?;
    let read = capped::read(repo.store().as_ref(), &key, Limit::PACK, "read pack", cancel);
    let bytes = match read.await {
        Ok(bytes) => bytes,
        // Refused by its size, unread: a damaged object like any other.
        Err(e @ RepoError::TooLarge { .. }) => return Ok((0, vec![e.to_string()], None)),
        Err(e) => return Err(e),
    };
    let keys = repo.keys().clone();
    let len = bytes.len() as u64;
    let (problems, entries) = tokio::task::spawn_blocking(move || {
        let mut problems = Vec::new();
        if content_address(&bytes) != id.0 {
            problems.push(format!("pack {key}: content does not hash to its name"));
        }
        let header = match read_pack_header(&keys.cipher, &bytes) {
            Ok(h) => h,
            Err(e) => {
                problems.push(format!("pack {key}: header unreadable: {e}"));
                return (problems, None);
            }
        };
        let mut opener = BlobOpener::default();
        for e in &header.entries {
            let sealed = &bytes[e.offset as usize..(e.offset + e.length) as usize];
            let kind = (e.kind, e.raw_length);
            if let Err(err) = opener.open(&keys, &e.id, kind, (id, e.offset), sealed) {
                problems.push(format!("{} {} in pack {key}: {err}", e.kind, e.id));
            }
        }
        (problems, Some(header.entries))
    })
    .await
    .map_err(|e| RepoError::Internal { what: "check", reason: e.to_string() })?;
    Ok((len, problems, entries))
}

#[cfg(test)]
mod tests;
