//! The mark phase: references, liveness per pack, repacking, the mark, the writers list.

use std::collections::HashSet;

use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{BlobId, HEADER_PADDING, PACK_ENTRY_BYTES, PackId, RepoFormat};
use crate::gc::lease::{self, LeaseCheck};
use crate::gc::state::{self, GcDir, GcMark, GcObject, GcWriters};
use crate::gc::{GcOptions, MarkReport, refs, repack};
use crate::repo::{BlobLocation, Repository, ShortId, SlotMarks, blocking, layout, unix_now};

/// What every pack holds besides its blobs and their entries: the two-byte prefix, the
/// sealed header's envelope (47 bytes) and the four-byte trailer.
const PACK_OVERHEAD: u64 = 2 + 47 + 4;

pub(crate) async fn run(
    repo: &Repository,
    options: &GcOptions,
    lock: &LeaseCheck,
    cancel: &CancellationToken,
) -> RepoResult<MarkReport> {
    let dir = GcDir::list(repo, cancel).await?;
    if dir.marks.iter().any(|m| dir.writers.contains(m)) {
        return Ok(MarkReport { pending: true, ..MarkReport::default() });
    }
    // A mark without its writers list was left by a collector that stopped: drop it (backups
    // that saw it only stored some blobs again).
    for id in &dir.marks {
        lock.check()?;
        let key = state::mark_key(id)?;
        repo.store().delete(&key, cancel).await.map_err(|e| RepoError::store("delete", &key, e))?;
    }
    let mut report = MarkReport::default();
    // The snapshots, then the index: a backup stores its index files before its snapshot, so
    // every snapshot listed finds its blobs indexed (listed the other way round, a backup that
    // committed between the two listings stopped the walk at a tree page the index lacked).
    let snapshots = repo.snapshot_ids(cancel).await?;
    let builder = repo.build_index(HashSet::new(), cancel).await?;
    let index = blocking(move || builder.finish()).await?;
    report.snapshots = snapshots.len() as u64;
    // What the snapshots reach, one bit per indexed blob (an unindexed chunk has no pack to
    // keep; an unindexed tree page stops the walk).
    let mut reached = SlotMarks::new(&index);
    let mut mark = |id: &BlobId| {
        reached.mark(&index, id);
        Ok(())
    };
    refs::collect(repo, &snapshots, &|id| index.lookup(id), &mut mark, cancel).await?;
    report.referenced_blobs = reached.count() as u64;

    // Live bytes per pack, counting each referenced blob once, in the pack the index chose.
    // Dead bytes: the rest of the pack (unreferenced blobs, and copies of blobs the index
    // resolves elsewhere, which it does not list) less what every pack carries besides its
    // blobs (prefix, header, padding, trailer), so a pack of live blobs is never repacked
    // for its header alone, again and again.
    let packs = index.packs();
    report.packs = packs.len() as u64;
    // A blob in a frame counts for its share of the frame by raw length.
    let mut live = vec![(0u64, 0u32, false); packs.len()];
    let frames = index.frame_totals();
    index.for_each(|slot, _, pack, loc| {
        live[pack].2 |= loc.kind.is_data();
        if reached.is_marked(slot) {
            live[pack].0 += frames.stored(pack, &loc);
            live[pack].1 += 1;
        }
    });
    drop(frames);
    // Format 2 pads data packs' headers (not tree packs').
    let padding = match repo.config().format {
        RepoFormat::V1 => 0,
        RepoFormat::V2 | RepoFormat::V3 => HEADER_PADDING as u64,
    };
    let mut condemned = Vec::new();
    let mut to_repack: HashSet<usize> = HashSet::new();
    for (n, info) in packs.iter().enumerate() {
        let (live_bytes, live_blobs, data) = live[n];
        let overhead = PACK_OVERHEAD
            + PACK_ENTRY_BYTES as u64 * u64::from(live_blobs)
            + if data { padding } else { 0 };
        let dead = info.size.saturating_sub(live_bytes + overhead);
        if live_blobs == 0 {
            condemned.push(info.id);
            report.condemned_bytes += info.size;
        } else if dead >= options.repack_min_dead_bytes
            && dead as f64 >= options.repack_dead_fraction * info.size as f64
        {
            to_repack.insert(n);
        }
    }
    drop(live);
    if !to_repack.is_empty() {
        let mut entries: Vec<(ShortId, BlobLocation)> = Vec::new();
        index.for_each(|slot, id, pack, loc| {
            if to_repack.contains(&pack) && reached.is_marked(slot) {
                entries.push((id, loc));
            }
        });
        entries.sort_by(|a, b| a.1.pack.cmp(&b.1.pack).then(a.1.offset.cmp(&b.1.offset)));
        let copied = repack::run(repo, entries, lock, cancel).await?;
        report.repacked_packs = to_repack.len() as u64;
        report.repacked_blobs = copied.blobs;
        report.repack_written_bytes = copied.bytes;
        report.repacked_whole_frames = copied.whole_frames;
        for n in &to_repack {
            condemned.push(packs[*n].id);
            report.condemned_bytes += packs[*n].size;
        }
    }
    report.condemned_packs = condemned.len() as u64;

    // Stored packs no index names (listed after the index was read).
    let listed = repo
        .store()
        .list(layout::DATA, cancel)
        .await
        .map_err(|e| RepoError::store("list", layout::DATA, e))?;
    let orphans: Vec<PackId> = listed
        .iter()
        .filter_map(|m| layout::id_of(&m.key).map(PackId))
        .filter(|id| index.pack_size(id).is_none())
        .collect();
    report.orphan_packs = orphans.len() as u64;
    drop(reached);
    drop(index);
    if condemned.is_empty() && orphans.is_empty() {
        return Ok(report);
    }
    condemned.sort_unstable();

    // The mark, then (after it is visible) the lease holders that may not have seen it.
    lock.check()?;
    let mark = GcObject::Mark(GcMark { created_unix: unix_now(), condemned, orphans });
    let mark_id = state::put(repo, state::MARK, None, &mark, cancel).await?;
    let listed = repo
        .store()
        .list(lease::WRITERS, cancel)
        .await
        .map_err(|e| RepoError::store("list", lease::WRITERS, e))?;
    let mut holders: Vec<_> =
        lease::live_holders(lease::WRITERS, &listed, unix_now(), options.max_clock_skew)
            .into_keys()
            .collect();
    holders.sort_unstable();
    report.writers = holders.len() as u64;
    let mut id = [0u8; 32];
    hex::decode_to_slice(&mark_id, &mut id)
        .map_err(|e| RepoError::Internal { what: "gc mark id", reason: e.to_string() })?;
    let writers = GcObject::Writers(GcWriters { mark: id, holders });
    lock.check()?;
    state::put(repo, state::WRITERS, Some(&mark_id), &writers, cancel).await?;
    Ok(report)
}
