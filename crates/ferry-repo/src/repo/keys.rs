//! Key files: which passwords open the repository, and adding, removing and changing them
//! without rewriting any data (each key file wraps the same master key).
//!
//! Key management is an administrator's operation. Removing a key is not atomic with the
//! check that another key remains: two people removing each other's keys at the same moment
//! could remove both. A password change never has that risk: it removes only the key its own
//! handle was opened with, after the new key is stored and proven to open the repository.

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tokio_util::sync::CancellationToken;

use super::{LOAD_CONCURRENCY, Repository, blocking, layout, wrap_key};
use crate::error::{RepoError, RepoResult};
use crate::format::{KdfParams, KeyFile, KeyId, KeyWrap};

/// One key file, as [`Repository::key_files`] lists it.
#[derive(Debug, Clone)]
pub struct KeyInfo {
    /// Its id (the name of the object under `keys/`).
    pub id: KeyId,
    /// Whether this handle was opened (or the repository created) with it.
    pub current: bool,
    /// What the file says, or why it could not be read.
    pub file: Result<KeyDetails, String>,
}

/// The readable part of a key file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct KeyDetails {
    /// When it was written, seconds since the Unix epoch.
    pub created_unix: i64,
    /// The host that wrote it.
    pub hostname: String,
    /// The argon2id costs of its password.
    pub kdf: KdfParams,
}

impl From<&KeyFile> for KeyDetails {
    fn from(file: &KeyFile) -> Self {
        let KeyWrap::Password { kdf, .. } = &file.wrap;
        Self { created_unix: file.created_unix, hostname: file.hostname.clone(), kdf: *kdf }
    }
}

impl Repository {
    /// The key file this handle was opened (or the repository created) with.
    #[must_use]
    pub fn key_id(&self) -> KeyId {
        *self.inner.key_id.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// Lists the key files, oldest first. A key file that cannot be read or decoded is listed
    /// with the reason instead of failing the whole list.
    ///
    /// # Errors
    /// Listing the store fails.
    pub async fn key_files(&self, cancel: &CancellationToken) -> RepoResult<Vec<KeyInfo>> {
        let current = self.key_id();
        let mut keys: Vec<KeyInfo> = futures::stream::iter(self.key_ids(cancel).await?)
            .map(|id| async move {
                let key = layout::key_file(&id)?;
                let file = match self.store().get(&key, cancel).await {
                    Ok(bytes) => KeyFile::decode(&bytes)
                        .map(|f| KeyDetails::from(&f))
                        .map_err(|e| format!("damaged: {e}")),
                    Err(ferry_store::StoreError::Cancelled) => return Err(RepoError::Cancelled),
                    Err(e) => Err(format!("unreadable: {e}")),
                };
                Ok(KeyInfo { id, current: id == current, file })
            })
            .buffered(LOAD_CONCURRENCY)
            .try_collect()
            .await?;
        keys.sort_by_key(|k| (k.file.as_ref().map_or(i64::MAX, |d| d.created_unix), k.id));
        Ok(keys)
    }

    /// The ids of the key files (objects under `keys/` with another name are not keys).
    async fn key_ids(&self, cancel: &CancellationToken) -> RepoResult<Vec<KeyId>> {
        let listed = self
            .store()
            .list(layout::KEYS, cancel)
            .await
            .map_err(|e| RepoError::store("list", layout::KEYS, e))?;
        Ok(listed.iter().filter_map(|meta| layout::id_of(&meta.key).map(KeyId)).collect())
    }

    /// Resolves a full key id or a unique prefix of at least 4 hex digits.
    ///
    /// # Errors
    /// [`RepoError::InvalidInput`] when nothing or more than one key matches; store failures.
    pub async fn find_key(&self, query: &str, cancel: &CancellationToken) -> RepoResult<KeyId> {
        let invalid = |reason: &str| RepoError::InvalidInput {
            what: "key id",
            reason: format!("{query:?}: {reason}"),
        };
        let q = query.to_ascii_lowercase();
        if q.len() < 4 || !q.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(invalid("not a key id (at least 4 hex digits)"));
        }
        let matches: Vec<KeyId> = (self.key_ids(cancel).await?.into_iter())
            .filter(|id| id.to_hex().starts_with(&q))
            .collect();
        match matches.as_slice() {
            [one] => Ok(*one),
            [] => Err(invalid("no such key")),
            _ => Err(invalid("ambiguous prefix")),
        }
    }

    /// Adds a key file so `password` also opens the repository. No data is rewritten.
    ///
    /// # Errors
    /// Invalid `kdf`; store failures.
    pub async fn add_password(
        &self,
        password: &[u8],
        kdf: KdfParams,
        cancel: &CancellationToken,
    ) -> RepoResult<KeyId> {
        let (id, bytes) = wrap_key(&self.inner.master, password, kdf).await?;
        let key = layout::key_file(&id)?;
        self.store()
            .put_if_absent(&key, Bytes::from(bytes), cancel)
            .await
            .map_err(|e| RepoError::store("write key file", &key, e))?;
        Ok(id)
    }

    /// Removes a key file. Refuses the last one, and the one this handle was opened with
    /// (change that password with [`Repository::change_password`] instead).
    ///
    /// # Errors
    /// [`RepoError::InvalidInput`] for a refused key; store failures.
    pub async fn remove_key(&self, id: &KeyId, cancel: &CancellationToken) -> RepoResult<()> {
        let refuse = |reason: &str| RepoError::InvalidInput { what: "key", reason: reason.into() };
        if *id == self.key_id() {
            return Err(refuse(
                "refusing to remove the key this password opens; change the password instead",
            ));
        }
        let listed = self.key_ids(cancel).await?;
        if !listed.contains(id) {
            return Err(refuse(&format!("there is no key {id}")));
        }
        if listed.len() <= 1 {
            return Err(refuse("refusing to remove the last key file"));
        }
        let key = layout::key_file(id)?;
        self.store().delete(&key, cancel).await.map_err(|e| RepoError::store("delete", &key, e))
    }

    /// Changes the password this handle was opened with: stores a key file for
    /// `new_password`, reads it back and proves it opens the repository, then removes the old
    /// key file. Other key files are untouched. Returns the new key's id; this handle then
    /// counts as opened with it.
    ///
    /// # Errors
    /// Invalid `kdf`; store failures before the new key is proven (the old password still
    /// works); [`RepoError::OldKeyKept`] when only removing the old key failed.
    pub async fn change_password(
        &self,
        new_password: &[u8],
        kdf: KdfParams,
        cancel: &CancellationToken,
    ) -> RepoResult<KeyId> {
        let old = self.key_id();
        let new = self.add_password(new_password, kdf, cancel).await?;
        let key = layout::key_file(&new)?;
        let stored = self
            .store()
            .get(&key, cancel)
            .await
            .map_err(|e| RepoError::store("read back key file", &key, e))?;
        let file = KeyFile::decode(&stored).map_err(|e| RepoError::corrupt(&key, e))?;
        let password = new_password.to_vec();
        let master = blocking(move || file.unwrap_with_password(&password))
            .await?
            .map_err(|e| RepoError::corrupt(&key, e))?;
        if master != self.inner.master {
            return Err(RepoError::Internal {
                what: "password change",
                reason: format!("the stored key {new} does not hold this repository's key"),
            });
        }
        *self.inner.key_id.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = new;
        let old_key = layout::key_file(&old)?;
        if let Err(e) = self.store().delete(&old_key, cancel).await {
            return Err(RepoError::OldKeyKept {
                new: new.to_string(),
                old: old.to_string(),
                source: Box::new(RepoError::store("delete", &old_key, e)),
            });
        }
        Ok(new)
    }
}
