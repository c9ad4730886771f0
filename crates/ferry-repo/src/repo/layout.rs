//! Object keys of the repository layout.

use ferry_store::ObjectKey;

use crate::error::{RepoError, RepoResult};
use crate::format::{IndexId, KeyId, PackId, SnapshotId};

/// The config object.
pub(crate) const CONFIG: &str = "config";
/// Prefix of key files.
pub(crate) const KEYS: &str = "keys/";
/// Prefix of pack files.
pub(crate) const DATA: &str = "data/";
/// Prefix of index files.
pub(crate) const INDEX: &str = "index/";
/// Prefix of snapshot manifests.
pub(crate) const SNAPSHOTS: &str = "snapshots/";

fn key(text: String) -> RepoResult<ObjectKey> {
    ObjectKey::new(text)
        .map_err(|e| RepoError::Internal { what: "object key", reason: e.to_string() })
}

pub(crate) fn config() -> RepoResult<ObjectKey> {
    key(CONFIG.to_owned())
}

pub(crate) fn key_file(id: &KeyId) -> RepoResult<ObjectKey> {
    key(format!("{KEYS}{id}"))
}

pub(crate) fn pack(id: &PackId) -> RepoResult<ObjectKey> {
    let hex = id.to_hex();
    key(format!("{DATA}{}/{hex}", &hex[..2]))
}

pub(crate) fn index(id: &IndexId) -> RepoResult<ObjectKey> {
    key(format!("{INDEX}{id}"))
}

pub(crate) fn snapshot(id: &SnapshotId) -> RepoResult<ObjectKey> {
    key(format!("{SNAPSHOTS}{id}"))
}

/// The id in the last segment of a listed key, if it is 64 hex digits.
pub(crate) fn id_of(key: &ObjectKey) -> Option<[u8; 32]> {
    let name = key.as_str().rsplit('/').next()?;
    let mut out = [0u8; 32];
    hex::decode_to_slice(name, &mut out).ok()?;
    Some(out)
}
