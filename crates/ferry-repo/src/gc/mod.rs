//! Forget and garbage collection, safe while other nodes keep backing up.
//!
//! Two phases, each run under the collector's lock (a lease under `gc/lock-`):
//!
//! - [`gc_mark`]: computes what every snapshot references, copies the live blobs of mostly
//!   dead packs into new packs (indexed before anything else happens), and stores a *mark*
//!   naming the packs to delete (`condemned`) and the stored packs no index names
//!   (`orphans`). Right after the mark is stored it records which backups and restores hold a
//!   lease (`gc/writers-<mark>`): those may have loaded the index before the mark existed.
//!   Every backup or restore that starts later reads the mark and ignores condemned packs.
//! - [`gc_sweep`]: once none of the recorded holders is alive, recomputes the references
//!   from the snapshots that exist *now*, revives any condemned pack still needed, writes a
//!   compacted index superseding the old index files, deletes the packs, then the old index
//!   files, then the mark.
//!
//! [`gc`] runs both, waiting up to [`GcOptions::wait`] for running backups. The protocol and
//! its safety argument are in `FORMAT.md` (section *Garbage collection*).

mod compact;
mod lease;
mod mark;
pub(crate) mod refs;
mod repack;
mod state;
mod sweep;
#[doc(hidden)]
pub mod synthetic;

use std::time::{Duration, Instant};

use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::SnapshotId;
use crate::repo::Repository;

pub(crate) use lease::{Lease, LeaseCheck, WRITERS as WRITER_LEASES};
pub use state::{GcMark, GcObject, GcWriters};
pub(crate) use state::{exclusions, mark_ids};

/// Default lease of backups and restores (refreshed every third of it).
pub const DEFAULT_LEASE_TTL: Duration = Duration::from_secs(10 * 60);

/// The longest lease any holder takes ([`Repository::set_lease_ttl`] and
/// [`GcOptions::lock_ttl`] are capped to it). A lease whose expiry lies further ahead than this
/// plus the allowed clock skew was not written by a running Ferry (a forged key, or a clock far
/// ahead): it is ignored, so it cannot hold garbage collection off forever, and reported
/// ([`GcReport::ignored_leases`]).
pub const MAX_LEASE_TTL: Duration = Duration::from_secs(60 * 60);

/// Options for garbage collection.
#[derive(Debug, Clone)]
pub struct GcOptions {
    /// A pack some snapshot still uses is rewritten (its live blobs copied to a new pack,
    /// the old one deleted) when at least this fraction of its bytes is garbage (its
    /// header, padding and trailer not counted as garbage).
    pub repack_dead_fraction: f64,
    /// ...and when at least this many of its bytes are garbage.
    pub repack_min_dead_bytes: u64,
    /// How long [`gc`] waits for backups that were running when it marked.
    pub wait: Duration,
    /// How often [`gc`] looks again while waiting.
    pub poll: Duration,
    /// Largest difference between any two clocks of nodes using the repository: a lease
    /// counts as expired only this long after the expiry written by its holder.
    pub max_clock_skew: Duration,
    /// Lease of the collector's lock.
    pub lock_ttl: Duration,
    /// Most blob entries per compacted index file.
    pub index_entries_per_file: usize,
}

impl Default for GcOptions {
    fn default() -> Self {
        Self {
            repack_dead_fraction: 0.5,
            repack_min_dead_bytes: 1 << 20,
            wait: Duration::from_secs(5 * 60),
            poll: Duration::from_secs(2),
            max_clock_skew: Duration::from_secs(2 * 60),
            lock_ttl: DEFAULT_LEASE_TTL,
            index_entries_per_file: 200_000,
        }
    }
}

/// What a mark phase did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MarkReport {
    /// A mark from an earlier run is still waiting for its sweep; nothing new was marked.
    pub pending: bool,
    /// Snapshots whose references were followed.
    pub snapshots: u64,
    /// Distinct indexed blobs they reference.
    pub referenced_blobs: u64,
    /// Packs in the index.
    pub packs: u64,
    /// Packs condemned (unreferenced, or repacked).
    pub condemned_packs: u64,
    /// Their bytes.
    pub condemned_bytes: u64,
    /// Stored packs no index names.
    pub orphan_packs: u64,
    /// Packs whose live blobs were copied into new packs.
    pub repacked_packs: u64,
    /// Blobs copied.
    pub repacked_blobs: u64,
    /// Frames copied as they were stored, every blob of them live (not compressed again).
    pub repacked_whole_frames: u64,
    /// Bytes of the new packs.
    pub repack_written_bytes: u64,
    /// Backups and restores the sweep must wait for.
    pub writers: u64,
}

/// What a sweep phase did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SweepReport {
    /// No mark to sweep.
    NothingMarked,
    /// The mark was left by a collector that stopped before recording the writers; it was
    /// removed (nothing was deleted).
    AbandonedMark,
    /// Backups or restores that may have loaded the index before the mark are still running.
    Waiting {
        /// How many.
        writers: u64,
    },
    /// Packs were deleted.
    Swept(SweepStats),
}

/// What a completed sweep deleted and kept.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SweepStats {
    /// Packs deleted.
    pub deleted_packs: u64,
    /// Bytes deleted with them.
    pub deleted_bytes: u64,
    /// Condemned packs kept because a snapshot made after the mark uses them.
    pub revived_packs: u64,
    /// Index files replaced by the compacted ones.
    pub index_files_replaced: u64,
    /// Compacted index files written.
    pub index_files_written: u64,
}

/// What [`gc`] did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GcReport {
    /// The sweep of a mark left by an earlier run, if there was one.
    pub earlier: Option<SweepReport>,
    /// This run's mark, if it made one.
    pub mark: Option<MarkReport>,
    /// This run's sweep (or why it could not happen yet).
    pub sweep: SweepReport,
    /// Lease keys ignored because their expiry lies implausibly far ahead (see
    /// [`MAX_LEASE_TTL`]).
    pub ignored_leases: Vec<String>,
}

impl GcReport {
    /// Packs and bytes deleted by this run.
    #[must_use]
    pub fn deleted(&self) -> (u64, u64) {
        [self.earlier.as_ref(), Some(&self.sweep)]
            .into_iter()
            .flatten()
            .filter_map(|s| match s {
                SweepReport::Swept(s) => Some((s.deleted_packs, s.deleted_bytes)),
                _ => None,
            })
            .fold((0, 0), |a, b| (a.0 + b.0, a.1 + b.1))
    }

    /// Whether a mark is left waiting for running backups (run gc again later).
    #[must_use]
    pub fn pending(&self) -> bool {
        matches!(self.sweep, SweepReport::Waiting { .. })
    }
}

/// Forgets snapshots: deletes their manifests. Their data is reclaimed by [`gc`].
///
/// # Errors
/// Store failures.
pub async fn forget(
    repo: &Repository,
    ids: &[SnapshotId],
    cancel: &CancellationToken,
) -> RepoResult<()> {
    for id in ids {
        repo.forget(id, cancel).await?;
    }
    Ok(())
}

/// Runs garbage collection: sweeps a pending mark if its writers are done, marks, waits up
/// to [`GcOptions::wait`] for the backups running at the mark, and sweeps.
///
/// # Errors
/// Another collector holds the lock ([`RepoError::Gc`]); a snapshot or tree that cannot be
/// read (nothing is deleted then); store failures; cancellation. A run stopped at any point
/// leaves the repository consistent (see `FORMAT.md`).
pub async fn gc(
    repo: &Repository,
    options: &GcOptions,
    cancel: &CancellationToken,
) -> RepoResult<GcReport> {
    let started = Instant::now();
    let mut ignored_leases = Vec::new();
    for prefix in [lease::WRITERS, lease::GC_LOCK] {
        let listed = repo
            .store()
            .list(prefix, cancel)
            .await
            .map_err(|e| RepoError::store("list", prefix, e))?;
        ignored_leases.extend(
            lease::implausible(prefix, &listed, crate::repo::unix_now(), options.max_clock_skew)
                .into_iter()
                .map(|k| k.as_str().to_owned()),
        );
    }
    let earlier = match gc_sweep(repo, options, cancel).await? {
        SweepReport::NothingMarked => None,
        SweepReport::Waiting { .. } => {
            let sweep = wait_and_sweep(repo, options, started, cancel).await?;
            if matches!(sweep, SweepReport::Waiting { .. }) {
                return Ok(GcReport { earlier: None, mark: None, sweep, ignored_leases });
            }
            Some(sweep)
        }
        other => Some(other),
    };
    let mark = gc_mark(repo, options, cancel).await?;
    let sweep = wait_and_sweep(repo, options, started, cancel).await?;
    Ok(GcReport { earlier, mark: Some(mark), sweep, ignored_leases })
}

async fn wait_and_sweep(
    repo: &Repository,
    options: &GcOptions,
    started: Instant,
    cancel: &CancellationToken,
) -> RepoResult<SweepReport> {
    loop {
        let report = gc_sweep(repo, options, cancel).await?;
        if !matches!(report, SweepReport::Waiting { .. }) || started.elapsed() >= options.wait {
            return Ok(report);
        }
        let pause = options.poll.min(options.wait.saturating_sub(started.elapsed()));
        tokio::select! {
            () = cancel.cancelled() => return Err(RepoError::Cancelled),
            () = tokio::time::sleep(pause) => {}
        }
    }
}

/// The mark phase alone. See the module docs.
///
/// # Errors
/// As [`gc`].
pub async fn gc_mark(
    repo: &Repository,
    options: &GcOptions,
    cancel: &CancellationToken,
) -> RepoResult<MarkReport> {
    let lock = GcLock::acquire(repo, options, cancel).await?;
    let result = mark::run(repo, options, &lock.0.checker(), cancel).await;
    lock.0.release().await;
    result
}

/// The sweep phase alone. See the module docs.
///
/// # Errors
/// As [`gc`].
pub async fn gc_sweep(
    repo: &Repository,
    options: &GcOptions,
    cancel: &CancellationToken,
) -> RepoResult<SweepReport> {
    let lock = GcLock::acquire(repo, options, cancel).await?;
    let result = sweep::run(repo, options, &lock.0.checker(), cancel).await;
    lock.0.release().await;
    result
}

/// The collector's lock: a lease under `gc/lock-`. Taking it: create our lease, then list;
/// if any other live lock lease exists, give ours up. Two collectors racing both see the
/// other (each created before listing), so at most one proceeds.
struct GcLock(Lease);

impl GcLock {
    async fn acquire(
        repo: &Repository,
        options: &GcOptions,
        cancel: &CancellationToken,
    ) -> RepoResult<Self> {
        let lease =
            Lease::acquire(repo, lease::GC_LOCK, "garbage collection", options.lock_ttl, cancel)
                .await?;
        let listed = match repo.store().list(lease::GC_LOCK, cancel).await {
            Ok(l) => l,
            Err(e) => {
                lease.release().await;
                return Err(RepoError::store("list", lease::GC_LOCK, e));
            }
        };
        let now = crate::repo::unix_now();
        let others = lease::live_holders(lease::GC_LOCK, &listed, now, options.max_clock_skew)
            .into_keys()
            .filter(|h| *h != lease.holder())
            .count();
        if others > 0 {
            lease.release().await;
            return Err(RepoError::Gc {
                step: "lock",
                reason: "another garbage collection is running (or stopped less than a lease ago)"
                    .into(),
            });
        }
        for stale in lease::expired_keys(lease::GC_LOCK, &listed, now, options.max_clock_skew) {
            let _ = repo.store().delete(&stale, cancel).await;
        }
        Ok(Self(lease))
    }
}
