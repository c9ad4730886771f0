//! Ferry's data path as the node agent drives it.
//!
//! - [`RepositorySource`]: where a DataUpload's or DataDownload's repository is. Velero keeps
//!   one repository per BackupStorageLocation and source namespace; [`BslRepositories`] does
//!   the same: bucket and prefix from the BSL, the repository under
//!   `<prefix>/plugins/ferry/<namespace>` ([`repository_prefix`]; `plugins/` is the one folder
//!   beside its own that Velero's BSL validation accepts and Velero never writes or
//!   collects); `region`, `s3Url`, `s3ForcePathStyle` and `profile` from its config;
//!   credentials from the BSL's secret or Velero's `cloud-credentials`.
//!   A repository still at `<prefix>/ferry/<namespace>`, where earlier versions kept it, is
//!   not used and not replaced by a new one: opening fails with
//!   [`MoverError::RepositoryNotMoved`], which names `ferry repo move`.
//! - Passwords: new repositories are keyed by Ferry's own secret [`PASSWORD_SECRET`]
//!   (`ferry-repo-credentials`, 32 random bytes hex, created by the first node, safely when
//!   several race) and are never created with a weak password. Velero's
//!   [`VELERO_PASSWORD_SECRET`] (whose published default Velero's server writes) is only read,
//!   to recognize a repository an earlier version created with it: refused, unless
//!   [`BslRepositories::adopting_velero_keyed`], which adds a key for Ferry's password (never
//!   a weak one) and says in [`OpenedRepository::warning`] how to remove the old key (`ferry
//!   repo key remove`). [`FixedRepository`] serves one repository for everything.
//! - KMS: with [`KMS_KEY_ID_KEY`] (and optionally [`KMS_ENDPOINT_KEY`]) in Ferry's secret,
//!   repositories are opened through AWS KMS in the BSL's region with the BSL's credentials,
//!   and new ones (and key files added later) are wrapped by that key as well as the password;
//!   a refusal fails the CR with [`MoverError::Kms`], naming the key and what to do.
//! - [`RepoMover`]: the [`ferry_agent::DataMover`] that backs a volume up into that
//!   repository (incremental against the last snapshot of the same PVC, resuming from what an
//!   interrupted upload left) and restores a snapshot into a volume.
//! - [`ChangedBlocks`]: a block backup reads only the snapshot's allocated ranges when the CSI
//!   driver's SnapshotMetadata service says which they are (`ferry-cbt`), else the whole
//!   device; the outcome says which, and why it fell back.
//! - [`upload_finalizer`]: backup deletion without Ferry's plugin: each Completed DataUpload of
//!   this mover is held by a finalizer until Velero deleted its backup and the snapshot is forgotten.
//! - [`deletion`]: the snapshots recorded by Ferry's plugin for deleted backups forgotten and
//!   their space reclaimed.
//! - [`space`]: garbage collection after deletions; a collection that stops (it cannot prove
//!   a deletion safe) becomes a Warning Event on the BackupStorageLocation.

mod bsl;
mod changed_blocks;
pub mod deletion;
mod error;
mod kms;
mod mover;
mod secrets;
mod source;
pub mod space;
pub mod upload_finalizer;

pub use bsl::{BslLocation, aws_credentials, location_of};
pub use changed_blocks::ChangedBlocks;
pub use error::MoverError;
pub use mover::{
    CSI_SNAPSHOT_HANDLE_TAG, CSI_SNAPSHOT_KEPT_TAG, CSI_SOURCE_VOLUME_TAG, DATA_UPLOAD_TAG,
    RepoMover,
};
pub use secrets::{
    KMS_ENDPOINT_KEY, KMS_KEY_ID_KEY, PASSWORD_KEY, PASSWORD_SECRET, PREVIOUS_PASSWORD_KEY,
    VELERO_PASSWORD_SECRET,
};
pub use source::{
    BslRepositories, FixedRepository, InUse, OLD_REPOSITORY_FOLDER, OpenedRepository,
    REPOSITORY_FOLDER, RepositorySource, old_repository_prefix, repository_prefix,
};
