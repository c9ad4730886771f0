//! Ferry's data path as the node agent drives it.
//!
//! - [`RepositorySource`]: where a DataUpload's or DataDownload's repository is. Velero keeps
//!   one repository per BackupStorageLocation and source namespace; [`BslRepositories`] does
//!   the same (bucket and prefix from the BSL, under `<prefix>/ferry/<namespace>`; `region`,
//!   `s3Url`, `s3ForcePathStyle` and `profile` from its config; credentials from the BSL's
//!   secret or Velero's `cloud-credentials`; the repository password from Velero's
//!   `velero-repo-credentials` secret, created with a random password if missing, safely
//!   when several nodes race). [`FixedRepository`] serves one repository for everything.
//! - [`RepoMover`]: the [`ferry_agent::DataMover`] that backs a volume up into that
//!   repository (incremental against the last snapshot of the same PVC, resuming from what an
//!   interrupted upload left) and restores a snapshot into a volume.
//! - [`deletion`]: the snapshots of deleted backups forgotten and their space reclaimed.

mod bsl;
pub mod deletion;
mod error;
mod mover;
mod source;

pub use bsl::{BslLocation, aws_credentials, location_of};
pub use error::MoverError;
pub use mover::{DATA_UPLOAD_TAG, RepoMover};
pub use source::{
    BslRepositories, FixedRepository, PASSWORD_KEY, PASSWORD_SECRET, RepositorySource,
};
