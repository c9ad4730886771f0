//! The sweep phase: wait for the mark's writers, re-verify, compact the index, delete.

use std::collections::{HashMap, HashSet};

use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{BlobId, IndexFile, IndexId, PackId};
use crate::gc::lease::{self, LeaseCheck};
use crate::gc::state::{self, GcDir, GcObject};
use crate::gc::{GcOptions, SweepReport, SweepStats, compact, refs};
use crate::repo::{IndexBuilder, Repository, blocking, layout, unix_now};

pub(crate) async fn run(
    repo: &Repository,
    options: &GcOptions,
    lock: &LeaseCheck,
    cancel: &CancellationToken,
) -> RepoResult<SweepReport> {
    let dir = GcDir::list(repo, cancel).await?;
    let Some(mark_id) = dir.marks.iter().find(|m| dir.writers.contains(*m)).cloned() else {
        if dir.marks.is_empty() {
            return Ok(SweepReport::NothingMarked);
        }
        // Marks whose collector stopped before listing the writers: never swept.
        for id in &dir.marks {
            lock.check()?;
            delete(repo, &state::mark_key(id)?, cancel).await?;
        }
        return Ok(SweepReport::AbandonedMark);
    };
    let mark_key = state::mark_key(&mark_id)?;
    let writers_key = state::writers_key(&mark_id)?;
    let Some(GcObject::Mark(mark)) = state::get(repo, &mark_key, cancel).await? else {
        return Err(RepoError::Gc { step: "sweep", reason: format!("{mark_key} is not a mark") });
    };
    let Some(GcObject::Writers(writers)) = state::get(repo, &writers_key, cancel).await? else {
        return Err(RepoError::Gc {
            step: "sweep",
            reason: format!("{writers_key} is not a writers list"),
        });
    };
    let listed = repo
        .store()
        .list(lease::WRITERS, cancel)
        .await
        .map_err(|e| RepoError::store("list", lease::WRITERS, e))?;
    let live = lease::live_holders(lease::WRITERS, &listed, unix_now(), options.max_clock_skew);
    let waiting = writers.holders.iter().filter(|h| live.contains_key(*h)).count() as u64;
    if waiting > 0 {
        return Ok(SweepReport::Waiting { writers: waiting });
    }

    // Everything that may have missed the mark has finished: what the snapshots reference
    // now is all that can ever reference a condemned pack. The snapshots are listed before
    // the index, as in the mark: each one listed finds its blobs indexed.
    let snapshots = repo.snapshot_ids(cancel).await?;
    let index_ids = repo.index_ids(cancel).await?;
    let condemned: HashSet<PackId> = mark.condemned.iter().copied().collect();
    let orphans: HashSet<PackId> = mark.orphans.iter().copied().collect();
    // Which of the condemned and orphaned packs an index file lists (any file, superseded or
    // not: such a pack is kept in the index or deleted with a compaction).
    let mut indexed: HashSet<PackId> = HashSet::new();
    // The condemned packs' blobs, from every file that lists them (none superseded here: a
    // blob a snapshot still reaches revives its pack wherever it is listed), in an index of
    // their own beside the view that leaves them out.
    let mut in_condemned = IndexBuilder::new(HashSet::new());
    let inspect = |id: IndexId, f: &IndexFile| {
        let mut listed = Vec::new();
        for p in &f.packs {
            if condemned.contains(&p.id) || orphans.contains(&p.id) {
                indexed.insert(p.id);
            }
            if condemned.contains(&p.id) {
                listed.push(p.clone());
            }
        }
        if !listed.is_empty() {
            in_condemned.add(id, IndexFile { packs: listed, supersedes: Vec::new() });
        }
    };
    let builder =
        repo.build_index_from(index_ids.clone(), condemned.clone(), inspect, cancel).await?;
    let view = blocking(move || builder.finish()).await?;
    let in_condemned = blocking(move || in_condemned.finish()).await?;
    let locate = |id: &BlobId| view.lookup(id).or_else(|| in_condemned.lookup(id));
    let mut revived: HashSet<PackId> = HashSet::new();
    let mut revive = |id: &BlobId| {
        if view.contains(id) {
            return Ok(());
        }
        match in_condemned.lookup(id) {
            Some(loc) => {
                revived.insert(loc.pack);
                Ok(())
            }
            None => Err(RepoError::Gc {
                step: "sweep",
                reason: format!(
                    "blob {id}, referenced by a snapshot, is in no index; nothing was deleted \
                     (run check)"
                ),
            }),
        }
    };
    refs::collect(repo, &snapshots, &locate, &mut revive, cancel).await?;
    drop(view);
    drop(in_condemned);

    let mut doomed: HashSet<PackId> = condemned.difference(&revived).copied().collect();
    doomed.extend(orphans.iter().filter(|p| !indexed.contains(*p)));
    let sizes: HashMap<PackId, u64> = repo
        .store()
        .list(layout::DATA, cancel)
        .await
        .map_err(|e| RepoError::store("list", layout::DATA, e))?
        .iter()
        .filter_map(|m| layout::id_of(&m.key).map(|id| (PackId(id), m.size)))
        .filter(|(id, _)| doomed.contains(id))
        .collect();
    let mut stats = SweepStats { revived_packs: revived.len() as u64, ..SweepStats::default() };

    // Index first: once the compacted index is stored, no reader looks for the doomed packs.
    let must_compact = doomed.iter().any(|p| indexed.contains(p)) || index_ids.len() > 1;
    if must_compact {
        lock.check()?;
        stats.index_files_written =
            compact::run(repo, &index_ids, &doomed, options.index_entries_per_file, lock, cancel)
                .await?;
    }
    let mut doomed: Vec<PackId> = doomed.into_iter().collect();
    doomed.sort_unstable();
    for pack in &doomed {
        lock.check()?;
        delete(repo, &layout::pack(pack)?, cancel).await?;
        if let Some(size) = sizes.get(pack) {
            stats.deleted_packs += 1;
            stats.deleted_bytes += size;
        }
    }
    if must_compact {
        for id in &index_ids {
            delete(repo, &layout::index(id)?, cancel).await?;
            stats.index_files_replaced += 1;
        }
    }
    delete(repo, &writers_key, cancel).await?;
    delete(repo, &mark_key, cancel).await?;
    for stale in lease::expired_keys(lease::WRITERS, &listed, unix_now(), options.max_clock_skew) {
        let _ = repo.store().delete(&stale, cancel).await;
    }
    Ok(SweepReport::Swept(stats))
}

async fn delete(
    repo: &Repository,
    key: &ferry_store::ObjectKey,
    cancel: &CancellationToken,
) -> RepoResult<()> {
    repo.store().delete(key, cancel).await.map_err(|e| RepoError::store("delete", key, e))
}
