//! Block volumes: backup of a block device or volume image as a volume snapshot, and restore
//! onto a device or image file.
//!
//! A volume snapshot's root node has the body `Volume { content, block_size }`: the content
//! is the device as one stream cut into fixed-size chunks aligned to its start (256 KiB by
//! default; see `VOLUMES.md` beside `Cargo.toml` for the measurements behind that choice),
//! with extents naming the chunks stored and gaps (unallocated or all-zero ranges) stored as
//! nothing. Equal data at equal alignment gives equal chunks, so a volume deduplicates against
//! its previous snapshots and against other volumes holding the same data.
//!
//! Code map: `device.rs` (opening devices and images, sizes, SEEK_DATA, zeroing),
//! `direct.rs` (a restore's direct writes to a block device),
//! `backup.rs` (parallel readers), `plan.rs` (which chunks a [`ReadPlan`] reads, and which
//! come from the parent), `ahead.rs` (the readers' segments and read-ahead along such a
//! plan), `restore.rs` (parallel writers), `map.rs` (the checked layout of a volume snapshot).

mod ahead;
mod backup;
mod device;
mod direct;
mod map;
mod plan;
mod restore;

use std::time::Duration;

pub use backup::{backup_volume, backup_volume_at};
pub use map::{MAX_VOLUME_CHUNK, VolumeMap};
pub use restore::{restore_volume, restore_volume_at};

use crate::format::SnapshotId;

/// Default volume chunk size: 256 KiB (see `VOLUMES.md`).
pub const DEFAULT_VOLUME_CHUNK: u32 = 256 << 10;

/// Volume chunks shorter than this (the default 256 KiB ones included) are compressed
/// together in frames of about 1 MiB (format 3; see `VOLUMES.md`).
pub(crate) const VOLUME_FRAMED_MAX: usize = 512 << 10;

/// Default zstd level for volume data: 3, as for file data. In 1 MiB frames it stores 8 % less
/// than level 1 for first backups about 18 % slower; an incremental compresses only its
/// changed chunks (see `VOLUMES.md`).
pub const DEFAULT_VOLUME_LEVEL: i32 = 3;

/// Options for [`backup_volume`].
#[derive(Debug, Clone)]
pub struct VolumeBackupOptions {
    /// The previous snapshot of this volume (recorded as the parent; its chunks, like every
    /// chunk in the repository, are not stored again). Must be a volume snapshot.
    pub parent: Option<SnapshotId>,
    /// `key=value` tags.
    pub tags: Vec<(String, String)>,
    /// What is being backed up, in the caller's words; the path when empty.
    pub source: String,
    /// Host name to record; the machine's when `None`.
    pub hostname: Option<String>,
    /// zstd level for volume data (0: no compression).
    pub compression_level: i32,
    /// Reader threads; 0 picks one per core plus one, fewer under a tight memory limit
    /// ([`default_threads`](crate::thread_budget::default_threads)).
    pub threads: usize,
    /// Chunk size: a power of two from 4 KiB to 16 MiB. Keep it equal across backups of a
    /// volume (and across volumes that should deduplicate).
    pub chunk_size: u32,
    /// Which parts of the volume to read (everything, unless the storage system said which
    /// ranges matter).
    pub read_plan: ReadPlan,
    /// The size of the volume the plan's ranges describe, when the storage system said it: a
    /// volume of another size refuses the plan (its ranges are then about something else).
    pub plan_size: Option<u64>,
    /// With [`ReadPlan::ChangedSinceParent`]: how many bytes of the chunks the ranges leave
    /// unchanged are read anyway (chosen evenly from a random start) and compared with the
    /// parent's, to catch a delta that left out a change; `None` takes
    /// [`default_delta_check`]. A difference fails the backup as an `InvalidInput` read plan
    /// before the snapshot is written.
    pub verify_unchanged: Option<u64>,
}

/// The bytes of unchanged chunks a changed-ranges backup of a `size`-byte volume reads to
/// check the ranges: 1/512 of the volume, at least 8 chunks' worth, at most 256 MiB. A
/// delta that left out `k` changed chunks of the `n` unchanged ones goes unnoticed with a
/// probability of about `(1 - s/n)^k`, for `s` sampled chunks.
#[must_use]
pub fn default_delta_check(size: u64, chunk_size: u32) -> u64 {
    (size / 512).max(8 * u64::from(chunk_size)).min(256 << 20)
}

/// Which parts of a volume a backup reads. The ranges, `(offset, len)` in bytes, must be
/// ascending, disjoint, non-empty and inside the volume; a chunk that any range touches is read
/// whole.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub enum ReadPlan {
    /// Read every allocated byte (holes an image file reports and all-zero chunks are still
    /// not stored).
    #[default]
    Everything,
    /// Read only these ranges: the rest of the volume holds no data (a snapshot's allocated
    /// ranges, from changed-block tracking).
    Only(Vec<(u64, u64)>),
    /// Read only these ranges and take every other chunk from the parent snapshot unread (the
    /// ranges changed since the parent's snapshot, from changed-block tracking). The parent
    /// must be a volume snapshot of the same size and chunk size whose chunks are all in the
    /// repository.
    ChangedSinceParent(Vec<(u64, u64)>),
}

impl Default for VolumeBackupOptions {
    fn default() -> Self {
        Self {
            parent: None,
            tags: Vec::new(),
            source: String::new(),
            hostname: None,
            compression_level: DEFAULT_VOLUME_LEVEL,
            threads: 0,
            chunk_size: DEFAULT_VOLUME_CHUNK,
            read_plan: ReadPlan::Everything,
            plan_size: None,
            verify_unchanged: None,
        }
    }
}

/// What a volume backup did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeBackupSummary {
    /// The new snapshot.
    pub snapshot_id: SnapshotId,
    /// Size of the volume.
    pub size: u64,
    /// Bytes held by chunks (allocated and not all zeros).
    pub bytes_data: u64,
    /// Bytes read from the volume (unallocated ranges of an image are not read).
    pub bytes_read: u64,
    /// Bytes of chunks taken from the parent snapshot without reading them
    /// ([`ReadPlan::ChangedSinceParent`]).
    pub bytes_from_parent: u64,
    /// Bytes skipped as unallocated or all zeros (`size - bytes_data`).
    pub bytes_skipped: u64,
    /// Bytes of chunks new to the repository.
    pub bytes_new: u64,
    /// Bytes added to storage.
    pub bytes_stored: u64,
    /// Chunks in the snapshot.
    pub chunks: u64,
    /// Wall time.
    pub duration: Duration,
}

/// Options for [`restore_volume`].
#[derive(Debug, Clone, Default)]
pub struct VolumeRestoreOptions {
    /// The existing target already reads as zeros (e.g. a freshly provisioned thin volume):
    /// gaps and all-zero blocks are then not written. Leave `false` unless that is certain;
    /// a new image file is always treated as zeroed.
    pub target_zeroed: bool,
    /// Writer threads; 0 picks one per core plus one, fewer under a tight memory limit
    /// ([`default_threads`](crate::thread_budget::default_threads)).
    pub threads: usize,
}

/// What a volume restore did.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeRestoreSummary {
    /// Size of the volume.
    pub size: u64,
    /// Size of the target after the restore (at least `size`).
    pub target_size: u64,
    /// Bytes of chunk data written.
    pub bytes_written: u64,
    /// Bytes zeroed, punched or left as zeros (the gaps).
    pub bytes_zero: u64,
    /// Of `bytes_written`, those written straight to a block device (`O_DIRECT`), past its
    /// page cache. Onto a target declared zeroed, `bytes_written` also counts the all-zero
    /// blocks left unwritten, so this is less than it even when every write went direct.
    pub bytes_direct: u64,
    /// Whether the target was created as a new image file.
    pub created: bool,
    /// Wall time.
    pub duration: Duration,
}

fn threads(requested: usize) -> usize {
    crate::thread_budget::threads_or_default(requested)
}

fn sorted_tags(tags: &[(String, String)]) -> Vec<(String, String)> {
    let mut t = tags.to_vec();
    t.sort();
    t.dedup();
    t
}
