//! Key files: which passwords open the repository, and adding, removing and changing them
//! without rewriting any data (each key file wraps the same master key). A handle given a KMS
//! ([`super::OpenOptions::key_wrapper`], [`super::InitOptions::key_wrapper`]) writes key files
//! wrapped by its KMS key as well as the password, so a repository opened through a KMS stays
//! protected by one.
//!
//! Key management is an administrator's operation. Removing a key is not atomic with the
//! check that another key remains: two people removing each other's keys at the same moment
//! could remove both. A password change never has that risk: it removes only the key its own
//! handle was opened with, after the new key is stored and proven to open the repository.

use bytes::Bytes;
use futures::{StreamExt, TryStreamExt};
use tokio_util::sync::CancellationToken;

use super::capped::{self, Limit};
use super::open::{Refusal, unwrap_key_file};
use super::{LOAD_CONCURRENCY, Repository, layout, wrap_key};
use crate::error::{RepoError, RepoResult};
use crate::format::{KdfParams, KeyFile, KeyId};

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
    /// The KMS key that wraps it as well as the password; `None` for a password-only key.
    pub kms_key_id: Option<String>,
}

impl From<&KeyFile> for KeyDetails {
    fn from(file: &KeyFile) -> Self {
        Self {
            created_unix: file.created_unix,
            hostname: file.hostname.clone(),
            kdf: *file.kdf(),
            kms_key_id: file.kms_layer().map(|(id, _)| id.to_owned()),
        }
    }
}

impl Repository {
    /// The key file this handle was opened (or the repository created) with.
    #[must_use]
    pub fn key_id(&self) -> KeyId {
        self.own_key().0
    }

    fn own_key(&self) -> (KeyId, Bytes) {
        self.inner.own_key.lock().unwrap_or_else(std::sync::PoisonError::into_inner).clone()
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
                let read =
                    capped::read(self.store().as_ref(), &key, Limit::KEY_FILE, "read", cancel);
                let file = match read.await {
                    Ok(bytes) => KeyFile::decode(&bytes)
                        .map(|f| KeyDetails::from(&f))
                        .map_err(|e| format!("damaged: {e}")),
                    Err(RepoError::Cancelled) => return Err(RepoError::Cancelled),
                    Err(RepoError::Store { source, .. }) => Err(format!("unreadable: {source}")),
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

    /// The KMS key new key files of this handle are wrapped by as well as the password
    /// (as configured: an alias stays an alias); `None` when it was given no KMS.
    #[must_use]
    pub fn kms_key_id(&self) -> Option<&str> {
        self.inner.key_wrapper.as_deref().map(|kms| kms.key_id())
    }

    /// Adds a key file so `password` also opens the repository. No data is rewritten. With a
    /// KMS ([`Repository::kms_key_id`]) the key file is wrapped by its key too.
    ///
    /// # Errors
    /// Invalid `kdf`; [`RepoError::Kms`] when the KMS refuses; store failures.
    pub async fn add_password(
        &self,
        password: &[u8],
        kdf: KdfParams,
        cancel: &CancellationToken,
    ) -> RepoResult<KeyId> {
        let wrapper = self.inner.key_wrapper.as_deref();
        let (id, bytes) = wrap_key(&self.inner.master, password, kdf, wrapper, cancel).await?;
        let key = layout::key_file(&id)?;
        self.store()
            .put_if_absent(&key, Bytes::from(bytes), cancel)
            .await
            .map_err(|e| RepoError::store("write key file", &key, e))?;
        Ok(id)
    }

    /// Removes a key file other than the one this handle was opened with (change that
    /// password with [`Repository::change_password`] instead), and only while that one is
    /// still there, so a key that opens the repository always remains.
    ///
    /// Two processes removing each other's keys at once would otherwise leave none: so after
    /// the delete the keys are listed again, and if this handle's own key has gone meanwhile
    /// it is put back (same bytes, same name) and the removal reported as contended. Of two
    /// such processes at least one sees the other's delete and puts its key back.
    ///
    /// # Errors
    /// [`RepoError::InvalidInput`] for a refused key or a contended removal; store failures.
    pub async fn remove_key(&self, id: &KeyId, cancel: &CancellationToken) -> RepoResult<()> {
        let refuse = |reason: &str| RepoError::InvalidInput { what: "key", reason: reason.into() };
        let (own, own_bytes) = self.own_key();
        if *id == own {
            return Err(refuse(
                "refusing to remove the key this password opens; change the password instead",
            ));
        }
        let listed = self.key_ids(cancel).await?;
        if !listed.contains(id) {
            return Err(refuse(&format!("there is no key {id}")));
        }
        if !listed.contains(&own) {
            return Err(refuse(&format!(
                "the key this password opens ({own}) is gone (removed by another process?); \
                 refusing to remove another, which could be the last"
            )));
        }
        let key = layout::key_file(id)?;
        self.store().delete(&key, cancel).await.map_err(|e| RepoError::store("delete", &key, e))?;
        if self.key_ids(cancel).await?.contains(&own) {
            return Ok(());
        }
        let own_file = layout::key_file(&own)?;
        self.store()
            .put_if_absent(&own_file, own_bytes, cancel)
            .await
            .map_err(|e| RepoError::store("put back key file", &own_file, e))?;
        Err(refuse(&format!(
            "another process removed this password's key {own} while {id} was being removed; \
             {own} is back, {id} is gone: see `ferry repo key list`"
        )))
    }

    /// Changes the password this handle was opened with: stores a key file for
    /// `new_password`, reads it back and proves it opens the repository, then removes the old
    /// key file. Other key files are untouched. Returns the new key's id; this handle then
    /// counts as opened with it. With a KMS ([`Repository::kms_key_id`]) the new key file is
    /// wrapped by its key too, and proving it includes a KMS `Decrypt`: so this also moves a
    /// key file to another KMS key, or puts a password-only one under a KMS key.
    ///
    /// # Errors
    /// Invalid `kdf`; [`RepoError::Kms`] or store failures before the new key is proven (the
    /// old password still works); [`RepoError::OldKeyKept`] when only removing the old key
    /// failed.
    pub async fn change_password(
        &self,
        new_password: &[u8],
        kdf: KdfParams,
        cancel: &CancellationToken,
    ) -> RepoResult<KeyId> {
        let old = self.key_id();
        let new = self.add_password(new_password, kdf, cancel).await?;
        let key = layout::key_file(&new)?;
        let stored = match self.prove_key(&key, new_password, cancel).await {
            Ok(stored) => stored,
            Err(cause) => {
                // Take the unproven key away again (even when cancelled: it is one delete), so
                // that "nothing changed" holds; say so when even that fails.
                let cleanup = CancellationToken::new();
                return Err(match self.store().delete(&key, &cleanup).await {
                    Ok(()) => cause,
                    Err(e) => RepoError::NewKeyLeft {
                        new: new.to_string(),
                        cause: Box::new(cause),
                        cleanup: Box::new(RepoError::store("delete", &key, e)),
                    },
                });
            }
        };
        *self.inner.own_key.lock().unwrap_or_else(std::sync::PoisonError::into_inner) =
            (new, stored);
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

    /// Reads the key file at `key` back and checks that `password` (and this handle's KMS,
    /// for a KMS-wrapped file) unwraps this repository's master key from it; returns its
    /// bytes.
    async fn prove_key(
        &self,
        key: &ferry_store::ObjectKey,
        password: &[u8],
        cancel: &CancellationToken,
    ) -> RepoResult<Bytes> {
        let read =
            capped::read(self.store().as_ref(), key, Limit::KEY_FILE, "read back key file", cancel);
        let stored = read.await?;
        let file = KeyFile::decode(&stored).map_err(|e| RepoError::corrupt(key, e))?;
        let wrapper = self.inner.key_wrapper.as_deref();
        let master = match unwrap_key_file(file, password, wrapper, cancel).await? {
            Ok(master) => master,
            Err(Refusal::Password(e)) => return Err(RepoError::corrupt(key, e)),
            Err(Refusal::Kms(e)) => {
                return Err(RepoError::kms("read back key file", Some(key.to_string()), e));
            }
            Err(Refusal::NoKms(kms_key_id)) => {
                return Err(RepoError::KmsKeyNeeded { key_ids: vec![kms_key_id] });
            }
        };
        if master != self.inner.master {
            return Err(RepoError::Internal {
                what: "password change",
                reason: format!("the stored key {key} does not hold this repository's key"),
            });
        }
        Ok(stored)
    }
}
