//! Garbage-collection state objects under `gc/`: the mark and the writers it waits for.
//!
//! Both are sealed like every other metadata object (kind [`ObjectKind::GcState`]), so a
//! forged or damaged mark is rejected instead of steering what backups deduplicate against.

use std::collections::HashSet;

use bytes::Bytes;
use ferry_store::ObjectKey;
use serde::{Deserialize, Serialize};
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{
    Cipher, FormatError, ObjectKind, PackId, content_address, decode_body, encode_body,
    open_object, seal_object,
};
use crate::gc::lease::HolderId;
use crate::repo::Repository;
use crate::repo::capped::{self, Limit};

/// Prefix of marks.
pub(crate) const MARK: &str = "gc/mark-";
/// Prefix of writer lists.
pub(crate) const WRITERS: &str = "gc/writers-";

/// Packs chosen for deletion by the mark phase.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcMark {
    /// When the mark was made (Unix seconds, the collector's clock; informational).
    pub created_unix: i64,
    /// Indexed packs holding nothing a snapshot referenced (or whose live blobs were copied
    /// into new packs). Backups ignore their blobs from the moment the mark exists.
    pub condemned: Vec<PackId>,
    /// Stored packs that no index named.
    pub orphans: Vec<PackId>,
}

/// Backups and restores that were running when the mark was made.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct GcWriters {
    /// The mark (its content address).
    pub mark: [u8; 32],
    /// Lease holders alive just after the mark was stored.
    pub holders: Vec<HolderId>,
}

/// A garbage-collection state object.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum GcObject {
    /// `gc/mark-<id>`.
    Mark(GcMark),
    /// `gc/writers-<mark id>`.
    Writers(GcWriters),
}

impl GcObject {
    /// The stored (encrypted) form.
    #[must_use]
    pub fn encode(&self, cipher: &Cipher) -> Vec<u8> {
        seal_object(cipher, ObjectKind::GcState, &[], &encode_body(self))
    }

    /// Authenticates and decodes the stored form.
    ///
    /// # Errors
    /// Any [`FormatError`]; never panics.
    pub fn decode(cipher: &Cipher, bytes: &[u8]) -> Result<Self, FormatError> {
        let body = open_object(cipher, ObjectKind::GcState, &[], bytes)?;
        Self::decode_body(&body)
    }

    /// Decodes a decrypted body.
    ///
    /// # Errors
    /// Any [`FormatError`]; never panics.
    pub fn decode_body(body: &[u8]) -> Result<Self, FormatError> {
        decode_body("gc state", body)
    }
}

fn key(text: String) -> RepoResult<ObjectKey> {
    ObjectKey::new(text).map_err(|e| RepoError::Internal { what: "gc key", reason: e.to_string() })
}

/// What `gc/` holds.
#[derive(Debug, Default)]
pub(crate) struct GcDir {
    /// Mark ids (hex) in key order.
    pub(crate) marks: Vec<String>,
    /// Mark ids (hex) with a writers object.
    pub(crate) writers: HashSet<String>,
}

impl GcDir {
    pub(crate) async fn list(repo: &Repository, cancel: &CancellationToken) -> RepoResult<Self> {
        let listed = repo
            .store()
            .list("gc/", cancel)
            .await
            .map_err(|e| RepoError::store("list", "gc/", e))?;
        let mut dir = Self::default();
        for m in listed {
            if let Some(id) = m.key.as_str().strip_prefix(MARK) {
                dir.marks.push(id.to_owned());
            } else if let Some(id) = m.key.as_str().strip_prefix(WRITERS) {
                dir.writers.insert(id.to_owned());
            }
        }
        Ok(dir)
    }
}

pub(crate) fn mark_key(id: &str) -> RepoResult<ObjectKey> {
    key(format!("{MARK}{id}"))
}

pub(crate) fn writers_key(id: &str) -> RepoResult<ObjectKey> {
    key(format!("{WRITERS}{id}"))
}

/// Stores a state object; returns its content address in hex.
pub(crate) async fn put(
    repo: &Repository,
    prefix: &str,
    name: Option<&str>,
    object: &GcObject,
    cancel: &CancellationToken,
) -> RepoResult<String> {
    let bytes = object.encode(&repo.keys().cipher);
    let id = hex::encode(content_address(&bytes));
    let k = key(format!("{prefix}{}", name.unwrap_or(&id)))?;
    Limit::GC_STATE.check_write(&k, bytes.len())?;
    repo.store()
        .put_if_absent(&k, Bytes::from(bytes), cancel)
        .await
        .map_err(|e| RepoError::store("write gc state", &k, e))?;
    Ok(id)
}

/// Reads a state object; `None` when it no longer exists.
pub(crate) async fn get(
    repo: &Repository,
    key: &ObjectKey,
    cancel: &CancellationToken,
) -> RepoResult<Option<GcObject>> {
    let read = capped::read(repo.store().as_ref(), key, Limit::GC_STATE, "read gc state", cancel);
    let bytes = match read.await {
        Ok(b) => b,
        Err(e) if e.is_not_found() => return Ok(None),
        Err(e) => return Err(e),
    };
    GcObject::decode(&repo.keys().cipher, &bytes)
        .map(Some)
        .map_err(|e| RepoError::corrupt(format!("gc state {key}"), e))
}

/// Packs that pending marks condemned, and the mark ids: what backups and restores must not
/// use. A mark deleted between listing and reading was swept, and the index no longer names
/// its packs.
pub(crate) async fn exclusions(
    repo: &Repository,
    cancel: &CancellationToken,
) -> RepoResult<(Vec<String>, HashSet<PackId>)> {
    let dir = GcDir::list(repo, cancel).await?;
    let mut excluded = HashSet::new();
    for id in &dir.marks {
        if let Some(GcObject::Mark(mark)) = get(repo, &mark_key(id)?, cancel).await? {
            excluded.extend(mark.condemned);
        }
    }
    Ok((dir.marks, excluded))
}

/// Only the mark keys (cheap: one listing), to notice a new or finished mark.
pub(crate) async fn mark_ids(
    repo: &Repository,
    cancel: &CancellationToken,
) -> RepoResult<Vec<String>> {
    Ok(GcDir::list(repo, cancel).await?.marks)
}

#[cfg(test)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    proptest! {
        #[test]
        fn round_trip(condemned in proptest::collection::vec(any::<[u8; 32]>(), 0..20), holders in proptest::collection::vec(any::<[u8; 16]>(), 0..5), t in any::<i64>()) {
            let c = Cipher::new(&[3; 32]);
            let mark = GcObject::Mark(GcMark { created_unix: t, condemned: condemned.iter().copied().map(PackId).collect(), orphans: vec![PackId([1; 32])] });
            prop_assert_eq!(GcObject::decode(&c, &mark.encode(&c)).ok(), Some(mark));
            let w = GcObject::Writers(GcWriters { mark: [2; 32], holders });
            prop_assert_eq!(GcObject::decode(&c, &w.encode(&c)).ok(), Some(w));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..200)) {
            let _ = GcObject::decode(&Cipher::new(&[3; 32]), &bytes);
            let _ = GcObject::decode_body(&bytes);
        }
    }

    #[test]
    fn another_kind_is_refused() {
        let c = Cipher::new(&[3; 32]);
        let index = crate::format::IndexFile::default().encode(&c);
        assert!(GcObject::decode(&c, &index).is_err());
    }
}
