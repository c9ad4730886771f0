//! Ferry's backup repository: deduplicated, compressed, encrypted, verified.
//!
//! Storage is reached only through [`ferry_store::ObjectStore`]; nothing here knows about
//! Kubernetes or gRPC. The [`format`](mod@format) module is the pure, I/O-free encoding of every stored
//! object (documented in `FORMAT.md` beside this crate's `Cargo.toml`, with the concurrent
//! writer safety argument).
//!
//! The surface:
//! - [`Repository`]: [`init`](Repository::init) (safe when nodes race), [`open`](Repository::open),
//!   password changes, snapshot listing and lookup.
//! - [`backup_tree`] with [`BackupOptions`] → [`BackupSummary`]: parallel, incremental against a
//!   parent snapshot, sparse-aware, memory bounded.
//! - [`restore`] with [`RestoreOptions`] → [`RestoreSummary`]: parallel, sparse, full metadata,
//!   hardened against hostile snapshots.
//! - [`backup_volume`] / [`restore_volume`]: block devices and volume images as volume
//!   snapshots (parallel, hole- and zero-skipping, deduplicated across volumes).
//! - [`check`] with [`CheckOptions`] → [`CheckReport`].
//! - [`gc::forget`] and [`gc::gc`] with [`gc::GcOptions`] → [`gc::GcReport`]: garbage
//!   collection that runs while other nodes back up (protocol in `FORMAT.md`).
//! - Long operations take a [`CancellationToken`](tokio_util::sync::CancellationToken) and an
//!   optional [`ProgressFn`] called at least once a second with a [`Progress`].
//!
//! ```no_run
//! # async fn demo(store: std::sync::Arc<dyn ferry_store::ObjectStore>) -> Result<(), ferry_repo::RepoError> {
//! use ferry_repo::{BackupOptions, InitOptions, Repository, RestoreOptions, backup_tree, restore};
//! let cancel = tokio_util::sync::CancellationToken::new();
//! let (repo, _) = Repository::init(store, b"password", &InitOptions::default(), &cancel).await?;
//! let summary = backup_tree(&repo, "/data".as_ref(), &BackupOptions::default(), None, &cancel).await?;
//! restore(&repo, &summary.snapshot_id, "/restored".as_ref(), &RestoreOptions::default(), None, &cancel).await?;
//! # Ok(()) }
//! ```
//!
//! Code map: `format/` (encodings, keys, chunker, compression), `repo/` (repository, in-memory
//! index, pack writer and uploader, caches), `backup/` (walker, file workers, tree builder),
//! `restore/` (planner, workers, no-follow file-system operations), `volume/` (block volumes),
//! `check.rs`, `place.rs` (sources and targets given by path or by a descriptor the caller opened),
//! `sys.rs` (the one module with `unsafe`: xattr system calls).

mod backup;
pub mod browse;
mod check;
mod dir_path;
mod error;
mod flusher;
pub mod format;
pub mod gc;
mod migrate;
mod pack_reads;
mod place;
mod progress;
mod repo;
mod restore;
mod sys;
pub mod thread_budget;
mod volume;

pub use backup::{BackupOptions, BackupSummary, backup_tree, backup_tree_at};
pub use check::{CheckOptions, CheckReport, PackSubset, SubsetError, check};
pub use error::{RepoError, RepoResult};
pub use format::{
    BlobId, KdfParams, KeyId, RepoFormat, Snapshot, SnapshotId, SnapshotKind, Summary,
};
pub use migrate::{MigrateReport, migrate};
pub use place::Place;
pub use progress::{Progress, ProgressFn};
pub use repo::{
    BlobLocation, CacheOptions, InitOptions, InitOutcome, KeyDetails, KeyInfo, MIN_PASSWORD_LEN,
    OpenOptions, RepoStats, Repository, VELERO_DEFAULT_PASSWORD, WeakPassword, hostname,
    weak_password,
};
pub use restore::{
    Fidelity, MAX_DEPTH, RestoreOptions, RestoreSummary, Withheld, restore, restore_at,
};
pub use volume::{
    DEFAULT_VOLUME_CHUNK, DEFAULT_VOLUME_LEVEL, MAX_VOLUME_CHUNK, ReadPlan, VolumeBackupOptions,
    VolumeBackupSummary, VolumeMap, VolumeRestoreOptions, VolumeRestoreSummary, backup_volume,
    backup_volume_at, default_delta_check, restore_volume, restore_volume_at,
};
