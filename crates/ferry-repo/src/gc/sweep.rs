//! The sweep phase: wait for the mark's writers, re-verify, compact the index, delete.

use std::collections::{HashMap, HashSet};

use futures::{StreamExt, TryStreamExt};
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{BlobId, IndexFile, IndexId, PackEntry, PackId};
use crate::gc::lease::{self, LeaseCheck};
use crate::gc::state::{self, GcDir, GcObject};
use crate::gc::{GcOptions, SweepReport, SweepStats, compact, refs};
use crate::repo::{BlobLocation, MemIndex, Repository, blocking, layout, unix_now};

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
    // now is all that can ever reference a condemned pack.
    let index_ids = repo.index_ids(cancel).await?;
    let files = load(repo, &index_ids, cancel).await?;
    let condemned: HashSet<PackId> = mark.condemned.iter().copied().collect();
    let mut indexed: HashSet<PackId> = HashSet::new();
    let mut condemned_entries: Vec<(PackId, PackEntry)> = Vec::new();
    for (_, f) in &files {
        for p in &f.packs {
            indexed.insert(p.id);
            if condemned.contains(&p.id) {
                condemned_entries.extend(p.entries.iter().map(|e| (p.id, *e)));
            }
        }
    }
    condemned_entries.sort_unstable_by_key(|(_, e)| e.id);
    let view = {
        let condemned = condemned.clone();
        blocking(move || MemIndex::build_excluding(files, &condemned)).await?
    };
    let in_condemned = |id: &BlobId| -> Option<BlobLocation> {
        let pos = condemned_entries.binary_search_by(|(_, e)| e.id.cmp(id)).ok()?;
        let (pack, e) = condemned_entries[pos];
        Some(BlobLocation {
            pack,
            offset: e.offset,
            length: e.length,
            raw_length: e.raw_length,
            kind: e.kind,
        })
    };
    let snapshots = repo.snapshot_ids(cancel).await?;
    let locate = |id: &BlobId| view.lookup(id).or_else(|| in_condemned(id));
    let refs = refs::collect(repo, &snapshots, &locate, cancel).await?;
    let mut revived: HashSet<PackId> = HashSet::new();
    for id in refs.iter() {
        if view.contains(id) {
            continue;
        }
        match in_condemned(id) {
            Some(loc) => {
                revived.insert(loc.pack);
            }
            None => {
                return Err(RepoError::Gc {
                    step: "sweep",
                    reason: format!(
                        "blob {id}, referenced by a snapshot, is in no index; nothing was \
                         deleted (run check)"
                    ),
                });
            }
        }
    }
    drop(refs);
    drop(view);
    drop(condemned_entries);

    let mut doomed: HashSet<PackId> = condemned.difference(&revived).copied().collect();
    doomed.extend(mark.orphans.iter().filter(|p| !indexed.contains(*p)));
    let sizes: HashMap<PackId, u64> = repo
        .store()
        .list(layout::DATA, cancel)
        .await
        .map_err(|e| RepoError::store("list", layout::DATA, e))?
        .iter()
        .filter_map(|m| layout::id_of(&m.key).map(|id| (PackId(id), m.size)))
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

async fn load(
    repo: &Repository,
    ids: &[IndexId],
    cancel: &CancellationToken,
) -> RepoResult<Vec<(IndexId, IndexFile)>> {
    futures::stream::iter(ids.iter().copied())
        .map(|id| async move { repo.read_index_file(id, cancel).await.map(|f| (id, f)) })
        .buffer_unordered(8)
        .try_collect()
        .await
}
