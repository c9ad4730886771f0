//! Ferry's backup repository: deduplicated, compressed, encrypted, verified.
//!
//! Storage is reached only through [`ferry_store::ObjectStore`]. The [`format`] module is the
//! pure, I/O-free encoding of every stored object (see `FORMAT.md` beside `Cargo.toml`).
//!
//! The main types: [`Repository`] (init, open, keys, snapshots).

mod backup;
mod check;
mod error;
pub mod format;
mod progress;
mod repo;
mod restore;
mod sys;

pub use backup::{BackupOptions, BackupSummary, backup_tree};
pub use check::{CheckOptions, CheckReport, check};
pub use error::{RepoError, RepoResult};
pub use format::{KdfParams, Snapshot, SnapshotId, Summary};
pub use progress::{Progress, ProgressFn};
pub use repo::{BlobLocation, InitOptions, InitOutcome, Repository};
pub use restore::{MAX_DEPTH, RestoreOptions, RestoreSummary, restore};
