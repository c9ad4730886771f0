//! Moving a repository to a newer format: a copy into another store, under the same keys.
//!
//! A repository's config is written once, so a repository cannot change format in place
//! (FORMAT.md, "Formats over time"). [`migrate`] makes a new repository of the target format
//! in another store (an empty bucket prefix or directory) that opens with the same passwords
//! and KMS keys (its key files are copies) and holds the same snapshots under the same ids:
//! every blob a snapshot reaches is read, authenticated and written again by the target
//! format's writer (in format 3, small data blobs into frames); once every one of them is
//! indexed in the target, the snapshot manifests are copied as they are (checked against
//! their names; they name blobs by id, and the ids, keyed by the same key, do not change).
//! The source is only read (but for the lease it holds meanwhile).
//!
//! An interrupted migration is resumed by running it again: a target whose config the source's
//! key opens is taken for an earlier run's (and one holding only copies of the source's key
//! files, for a run stopped before its config), the blobs it has indexed are not copied
//! again, and the snapshots are copied last, so the target never lists a snapshot it cannot
//! restore. Every run copies the key files the target lacks (a password added to the source
//! since opens the target too) and reports those only the target has (a password removed from
//! the source since still opens the target: remove it there too). Both
//! repositories are leased for the time of the copy (garbage collection of the source waits
//! for it; a collection of the target meanwhile would not delete unindexed packs too early).

use std::sync::Arc;

use bytes::Bytes;
use ferry_store::{ObjectStore, PutOutcome, StoreError};
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{BlobOpener, Config, ObjectKind, RepoFormat, SnapshotId, read_pack_header};
use crate::gc::{Lease, WRITER_LEASES, refs};
use crate::repo::capped::{self, Limit};
use crate::repo::writer::{LocalPacker, Uploader, upload_cause};
use crate::repo::{MemIndex, Repository, SlotMarks, layout, unix_now};

/// What [`migrate`] did.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct MigrateReport {
    /// The target's format.
    pub format: u8,
    /// Whether the target was made by an earlier, interrupted run.
    pub resumed: bool,
    /// Snapshots of the source copied (or found copied by an earlier run).
    pub snapshots: u64,
    /// Key files of the target the source no longer has: passwords removed from the source
    /// since an earlier run, which still open the target.
    pub keys_only_in_target: u64,
    /// Blobs the snapshots reach.
    pub blobs: u64,
    /// Of those, copied by this run (the others the target had).
    pub blobs_copied: u64,
    /// Packs of the source read.
    pub packs_read: u64,
    /// Bytes of packs the target stored.
    pub bytes_written: u64,
}

/// Copies every snapshot of `source` into a new repository of `format` in `target` (empty, or
/// left by an interrupted run of this), under the same keys, with `threads` copying threads
/// (0: as many as a backup would use). See the module documentation.
///
/// # Errors
/// [`RepoError::InvalidInput`] when `target` holds anything but an earlier run's repository
/// or `format` is older than the source's; [`RepoError::MissingBlob`] when a snapshot
/// references a blob the source does not have (nothing is migrated then); store and
/// corruption errors of either side; [`RepoError::Cancelled`].
pub async fn migrate(
    source: &Repository,
    target: Arc<dyn ObjectStore>,
    format: RepoFormat,
    threads: usize,
    cancel: &CancellationToken,
) -> RepoResult<(Repository, MigrateReport)> {
    if format < source.config().format {
        return Err(RepoError::InvalidInput {
            what: "format",
            reason: format!(
                "the repository is format {}; it can only be copied into that format or a \
                 newer one",
                source.config().format
            ),
        });
    }
    // Each copying thread holds a whole pack of the source: fewer threads for larger packs
    // than a backup's (a thread's budget is 32 MiB, about a 16 MiB pack and its blobs).
    let per_thread = u64::from(source.config().packs.target_size) + (16 << 20);
    let fit = usize::try_from((32u64 << 20) * 2 / per_thread).unwrap_or(1).max(1);
    let threads = crate::thread_budget::threads_or_default(threads).min(fit.max(1)).max(1);
    let (dest, resumed, keys_only_in_target) = make_target(source, target, format, cancel).await?;
    let read_lease =
        Lease::acquire(source, WRITER_LEASES, "migrate", source.lease_ttl(), cancel).await?;
    let write_lease =
        Lease::acquire(&dest, WRITER_LEASES, "migrate", dest.lease_ttl(), cancel).await?;
    let result = copy(source, &dest, threads, &write_lease, cancel).await;
    read_lease.release().await;
    write_lease.release().await;
    let mut report = result?;
    report.format = format.byte();
    report.resumed = resumed;
    report.keys_only_in_target = keys_only_in_target;
    Ok((dest, report))
}

/// The target repository: made now (key files copied, a config of `format`), or the one an
/// earlier run made (its missing key files copied); and how many key files only the target
/// has.
async fn make_target(
    source: &Repository,
    target: Arc<dyn ObjectStore>,
    format: RepoFormat,
    cancel: &CancellationToken,
) -> RepoResult<(Repository, bool, u64)> {
    let config_key = layout::config()?;
    let listed = match target.list("", cancel).await {
        Err(StoreError::LocationMissing { .. }) => Vec::new(),
        other => other.map_err(|e| RepoError::store("list", "", e))?,
    };
    let has_config = listed.iter().any(|m| m.key == config_key);
    let source_keys = source_key_files(source, cancel).await?;
    if !has_config {
        // Empty, or only copies of the source's key files (a run stopped before its config).
        for meta in &listed {
            let same = source_keys.iter().any(|(k, _)| *k == meta.key)
                && target_bytes_equal(&*target, &meta.key, &source_keys, cancel).await?;
            if !same {
                return Err(RepoError::InvalidInput {
                    what: "migration target",
                    reason: format!(
                        "it is not empty ({} is there); migrate into an empty place",
                        meta.key
                    ),
                });
            }
        }
    }
    // The key files first: a config without them would be a repository nobody can open.
    for (key, bytes) in &source_keys {
        target
            .put_if_absent(key, bytes.clone(), cancel)
            .await
            .map_err(|e| RepoError::store("write key file", key, e))?;
    }
    let only_target = listed
        .iter()
        .filter(|m| m.key.as_str().starts_with(layout::KEYS) && layout::id_of(&m.key).is_some())
        .filter(|m| !source_keys.iter().any(|(k, _)| *k == m.key))
        .count() as u64;
    if !has_config {
        let config = Config {
            repo_id: rand::random(),
            created_unix: unix_now(),
            format,
            ..*source.config()
        };
        let sealed = Bytes::from(config.encode(&source.keys().cipher));
        let put = target.put_if_absent(&config_key, sealed, cancel).await;
        match put.map_err(|e| RepoError::store("write", &config_key, e))? {
            PutOutcome::Created => return Ok((source.with_store(target, config)?, false, 0)),
            // Another run of this migration made it at the same moment: go on with it below.
            PutOutcome::AlreadyExists => {}
        }
    }
    let bytes = capped::read(&*target, &config_key, Limit::CONFIG, "read", cancel).await?;
    let config = Config::decode(&source.keys().cipher, &bytes).map_err(|e| match e {
        crate::format::FormatError::Authentication => RepoError::InvalidInput {
            what: "migration target",
            reason: "it holds a repository of other keys; migrate into an empty place".into(),
        },
        other => RepoError::corrupt(format!("config of the migration target {config_key}"), other),
    })?;
    if config.format != format {
        return Err(RepoError::InvalidInput {
            what: "migration target",
            reason: format!(
                "an earlier migration left a format {} repository there, not {format}",
                config.format
            ),
        });
    }
    Ok((source.with_store(target, config)?, true, only_target))
}

/// The source's key files and their bytes.
async fn source_key_files(
    source: &Repository,
    cancel: &CancellationToken,
) -> RepoResult<Vec<(ferry_store::ObjectKey, Bytes)>> {
    let listed = source.store().list(layout::KEYS, cancel).await;
    let mut keys = Vec::new();
    for meta in listed.map_err(|e| RepoError::store("list", layout::KEYS, e))? {
        if layout::id_of(&meta.key).is_some() {
            let read =
                capped::read(source.store().as_ref(), &meta.key, Limit::KEY_FILE, "read", cancel);
            let bytes = read.await?;
            keys.push((meta.key, bytes));
        }
    }
    Ok(keys)
}

/// Whether the target's object `key` holds the same bytes as the source's key file of that name.
async fn target_bytes_equal(
    target: &dyn ObjectStore,
    key: &ferry_store::ObjectKey,
    source_keys: &[(ferry_store::ObjectKey, Bytes)],
    cancel: &CancellationToken,
) -> RepoResult<bool> {
    let there = capped::read(target, key, Limit::KEY_FILE, "read", cancel).await?;
    Ok(source_keys.iter().any(|(k, bytes)| k == key && *bytes == there))
}

async fn copy(
    source: &Repository,
    dest: &Repository,
    threads: usize,
    lease: &Lease,
    cancel: &CancellationToken,
) -> RepoResult<MigrateReport> {
    let mut report = MigrateReport::default();
    // The snapshots first, then the index (read afresh, not this handle's, which may hold
    // blobs added since it was loaded): a snapshot is stored only after the index files of
    // its blobs, so the index read next has them all.
    let snapshots = source.snapshot_ids(cancel).await?;
    let index = Arc::new(source.load_index(cancel).await?);
    // Every blob a snapshot reaches, one bit per indexed blob; a blob the index lacks stops
    // the migration (the copy would not restore).
    let mut reached = SlotMarks::new(&index);
    let mut missing = None;
    let mut mark = |id: &crate::format::BlobId| {
        if reached.mark(&index, id).is_none() {
            missing.get_or_insert(*id);
        }
        Ok(())
    };
    refs::collect(source, &snapshots, &|id| index.lookup(id), &mut mark, cancel).await?;
    if let Some(id) = missing {
        return Err(RepoError::MissingBlob { id, referrer: "a snapshot of the source".into() });
    }
    report.blobs = reached.count() as u64;
    let have = dest.index(cancel).await?;
    // The packs holding a reached blob the target lacks, at the place the index resolves it
    // to.
    let mut wanted = vec![false; index.packs().len()];
    index.for_each(|slot, short, pack, _| {
        if reached.is_marked(slot) && !have.contains_short(short) {
            wanted[pack] = true;
        }
    });
    let packs: Vec<_> =
        index.packs().iter().zip(&wanted).filter(|(_, w)| **w).map(|(p, _)| p.id).collect();
    let (sink, uploader) =
        Uploader::start_leased(dest, Arc::clone(&have), Some(lease.checker()), cancel);
    let stats = Arc::clone(&uploader.stats);
    // A copying thread that fails stops the others.
    let (from, to, stop) = (source.clone(), dest.clone(), cancel.child_token());
    let handle = tokio::runtime::Handle::current();
    let shared = Arc::new(Copying { index, reached, have, packs, next: Default::default() });
    let copying = Arc::clone(&shared);
    let copied = tokio::task::spawn_blocking(move || -> RepoResult<(u64, u64)> {
        let shared = copying;
        let mut totals = (0, 0);
        std::thread::scope(|scope| -> RepoResult<()> {
            let workers: Vec<_> = (0..threads.max(1))
                .map(|_| {
                    let packer =
                        LocalPacker::new(&to, &sink, &stats, crate::format::DEFAULT_DATA_LEVEL);
                    let (from, shared, stop, handle) = (&from, &shared, &stop, &handle);
                    scope.spawn(move || {
                        let copied = copy_packs(from, shared, packer, handle, stop);
                        if copied.is_err() {
                            stop.cancel();
                        }
                        copied
                    })
                })
                .collect();
            // The first failure that is not another thread's stopping for it.
            let mut failure = None;
            for w in workers {
                match w.join() {
                    Ok(Ok((packs, blobs))) => {
                        totals.0 += packs;
                        totals.1 += blobs;
                    }
                    Ok(Err(RepoError::Cancelled)) => {
                        failure.get_or_insert(RepoError::Cancelled);
                    }
                    Ok(Err(e)) => {
                        if matches!(failure, None | Some(RepoError::Cancelled)) {
                            failure = Some(e);
                        }
                    }
                    Err(_) => {
                        stop.cancel();
                        failure = Some(RepoError::Internal {
                            what: "migrate",
                            reason: "a copying thread panicked".into(),
                        });
                    }
                }
            }
            failure.map_or(Ok(()), Err)
        })?;
        sink.flush(&to)?;
        Ok(totals)
    })
    .await
    .map_err(|e| RepoError::Internal { what: "migrate", reason: e.to_string() })?;
    let written = Arc::clone(&uploader.stats);
    let uploaded = uploader.finish().await;
    let (packs_read, blobs_copied) = match copied {
        Ok(counts) => counts,
        Err(e) => return Err(upload_cause(e, uploaded)),
    };
    uploaded?;
    // Every reached blob is in the target now, or no snapshot is copied (a blob the index
    // places where its pack's header does not list it would otherwise be left out).
    let mut left_out = None;
    shared.index.for_each(|slot, short, _, loc| {
        if left_out.is_none()
            && shared.reached.is_marked(slot)
            && !shared.have.contains_short(short)
        {
            left_out = Some(loc);
        }
    });
    if let Some(loc) = left_out {
        return Err(RepoError::corrupt(
            format!("pack {} of the source", loc.pack),
            crate::format::FormatError::Invalid {
                what: "pack",
                reason: format!(
                    "the index places a {} at offset {} that the pack's header does not list \
                     there; nothing was migrated (run `ferry check`)",
                    loc.kind, loc.offset
                ),
            },
        ));
    }
    report.packs_read = packs_read;
    report.blobs_copied = blobs_copied;
    report.bytes_written = written.stored_bytes.load(std::sync::atomic::Ordering::Relaxed);
    // Last, the snapshots, as they are: each names only blobs the target has indexed now.
    for id in &snapshots {
        copy_snapshot(source, dest, id, lease, cancel).await?;
        report.snapshots += 1;
    }
    Ok(report)
}

/// What the copying threads share.
struct Copying {
    index: Arc<MemIndex>,
    reached: SlotMarks,
    have: Arc<MemIndex>,
    packs: Vec<crate::format::PackId>,
    next: std::sync::atomic::AtomicUsize,
}

/// Takes packs of the source until none is left: reads each whole, and writes again every
/// reached blob it holds at the place the index gives (once per blob) that the target lacks.
fn copy_packs(
    source: &Repository,
    shared: &Copying,
    mut packer: LocalPacker,
    handle: &tokio::runtime::Handle,
    cancel: &CancellationToken,
) -> RepoResult<(u64, u64)> {
    let (mut packs, mut blobs) = (0u64, 0u64);
    loop {
        let n = shared.next.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let Some(pack) = shared.packs.get(n) else { break };
        if cancel.is_cancelled() {
            return Err(RepoError::Cancelled);
        }
        let key = layout::pack(pack)?;
        let size = shared.index.pack_size(pack).unwrap_or(u64::MAX);
        let limit = Limit::indexed_pack(size);
        let read = capped::read(source.store().as_ref(), &key, limit, "read pack", cancel);
        let bytes = handle.block_on(read)?;
        packs += 1;
        let corrupt = |what: String, e| RepoError::corrupt(what, e);
        let header = read_pack_header(&source.keys().cipher, &bytes)
            .map_err(|e| corrupt(format!("pack {key}"), e))?;
        let mut opener = BlobOpener::default();
        for e in &header.entries {
            let Some(slot) = shared.index.slot_of(&e.id) else { continue };
            let here =
                shared.index.lookup(&e.id).is_some_and(|l| l.pack == *pack && l.offset == e.offset);
            if !here || !shared.reached.is_marked(slot) || shared.have.contains(&e.id) {
                continue;
            }
            let Some(sealed) = bytes.get(e.offset as usize..(e.offset + e.length) as usize) else {
                continue;
            };
            let raw = opener
                .open(source.keys(), &e.id, (e.kind, e.raw_length), (*pack, e.offset), sealed)
                .map_err(|err| corrupt(format!("{} {} in pack {key}", e.kind, e.id), err))?;
            // A blob its source framed (a volume's chunks, too large for a file's frame) is
            // framed again.
            match e.kind {
                ObjectKind::TreeBlob => packer.add(ObjectKind::TreeBlob, e.id, &raw)?,
                ObjectKind::FramedData => packer.add_framed(e.id, &raw)?,
                _ => packer.add(ObjectKind::DataBlob, e.id, &raw)?,
            }
            blobs += 1;
        }
    }
    packer.finish()?;
    Ok((packs, blobs))
}

async fn copy_snapshot(
    source: &Repository,
    dest: &Repository,
    id: &SnapshotId,
    lease: &Lease,
    cancel: &CancellationToken,
) -> RepoResult<()> {
    let key = layout::snapshot(id)?;
    let bytes =
        match capped::read(source.store().as_ref(), &key, Limit::SNAPSHOT, "read", cancel).await {
            // Forgotten since it was listed: nothing to copy.
            Err(e) if e.is_not_found() => return Ok(()),
            other => other?,
        };
    if crate::format::content_address(&bytes) != id.0 {
        return Err(RepoError::corrupt(
            format!("snapshot {id}"),
            crate::format::FormatError::HashMismatch { what: format!("snapshot {id}") },
        ));
    }
    lease.checker().check()?;
    dest.store()
        .put_if_absent(&key, bytes, cancel)
        .await
        .map_err(|e| RepoError::store("write snapshot", &key, e))?;
    Ok(())
}
