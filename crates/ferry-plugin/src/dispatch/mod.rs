//! The gRPC services of Velero's plugin kinds: each request is dispatched, by its `plugin`
//! field, to the action registered under that name, its JSON decoded on the way in and the
//! action's answer encoded on the way out.

mod backup;
mod delete;
mod lister;
mod restore;
mod snapshot;

pub(crate) use backup::{BackupV1, BackupV2};
pub(crate) use delete::Delete;
pub(crate) use lister::Lister;
pub(crate) use restore::{RestoreV1, RestoreV2};
pub(crate) use snapshot::{SnapshotterV1, SnapshotterV2};
