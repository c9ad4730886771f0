//! The sweep phase: wait for the mark's writers, re-verify, compact the index, delete.

use std::collections::{HashMap, HashSet};

use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{BlobId, IndexFile, IndexId, PackEntry, PackId};
use crate::gc::lease::{self, LeaseCheck};
use crate::gc::state::{self, GcDir, GcObject};
use crate::gc::{GcOptions, SweepReport, SweepStats, compact, refs};
use crate::repo::{BlobLocation, Repository, blocking, layout, unix_now};

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
    let condemned: HashSet<PackId> = mark.condemned.iter().copied().collect();
    let mut indexed: HashSet<PackId> = HashSet::new();
    // The condemned packs' blobs, each with its pack's place in `condemned_packs` (a pack id
    // beside every entry took 32 bytes more a blob).
    let mut condemned_packs: Vec<PackId> = Vec::new();
    let mut condemned_entries: Vec<(u32, PackEntry)> = Vec::new();
    let inspect = |_: IndexId, f: &IndexFile| {
        for p in &f.packs {
            indexed.insert(p.id);
            if condemned.contains(&p.id) {
                let number = u32::try_from(condemned_packs.len()).unwrap_or(u32::MAX);
                condemned_packs.push(p.id);
                condemned_entries.extend(p.entries.iter().map(|e| (number, *e)));
            }
        }
    };
    let builder =
        repo.build_index_from(index_ids.clone(), condemned.clone(), inspect, cancel).await?;
    let view = blocking(move || builder.finish()).await?;
    condemned_entries.sort_unstable_by_key(|(_, e)| e.id);
    let in_condemned = |id: &BlobId| -> Option<BlobLocation> {
        let pos = condemned_entries.binary_search_by(|(_, e)| e.id.cmp(id)).ok()?;
        let (number, e) = condemned_entries[pos];
        Some(BlobLocation {
            pack: *condemned_packs.get(number as usize)?,
            offset: e.offset,
            length: e.length,
            raw_length: e.raw_length,
            kind: e.kind,
        })
    };
    let snapshots = repo.snapshot_ids(cancel).await?;
    let locate = |id: &BlobId| view.lookup(id).or_else(|| in_condemned(id));
    let mut revived: HashSet<PackId> = HashSet::new();
    let mut revive = |id: &BlobId| {
        if view.contains(id) {
            return Ok(());
        }
        match in_condemned(id) {
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
    drop(condemned_entries);
    drop(condemned_packs);

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
