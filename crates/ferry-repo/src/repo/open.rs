//! Opening a repository: read `config`, then find the key file the password unwraps.
//!
//! Each key file tried costs an argon2 derivation (a third of a second at the default costs),
//! so a repository with many key files, or with junk planted under `keys/`, opens slowly when
//! every file is tried in listing order. A caller that remembers which key opened the
//! repository last time ([`Repository::key_id`]) passes it as a hint: that file is read and
//! tried first, without even listing `keys/`, and only if it no longer opens the repository
//! are the others tried.

use std::sync::Arc;

use bytes::Bytes;
use ferry_store::{ObjectKey, ObjectStore, StoreError};
use tokio_util::sync::CancellationToken;

use super::capped::{self, Limit};
use super::{Repository, blocking, layout};
use crate::error::{RepoError, RepoResult};
use crate::format::limits::MAX_KEY_FILE_BYTES;
use crate::format::{Config, FormatError, KeyFile, KeyId, MasterKey};

/// What a key file that opens the repository gave.
struct Unlocked {
    master: MasterKey,
    config: Config,
    bytes: Bytes,
}

impl Repository {
    /// Opens the repository in `store` with `password`, trying the key files in listing
    /// order. Objects under `keys/` larger than [`MAX_KEY_FILE_BYTES`] are skipped without
    /// being downloaded.
    ///
    /// # Errors
    /// [`RepoError::NotFound`] when there is no repository, [`RepoError::WrongPassword`] when no
    /// key file opens with `password`, [`RepoError::TooLarge`] for a `config` larger than any
    /// config, [`RepoError::Corrupt`] for a damaged config, store failures.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        password: &[u8],
        cancel: &CancellationToken,
    ) -> RepoResult<Self> {
        Self::open_with_hint(store, password, None, cancel).await
    }

    /// As [`Repository::open`], trying the key file `hint` first (typically the
    /// [`Repository::key_id`] of an earlier open with the same password). With the right
    /// hint, the open reads that one key file and derives one key however many key files
    /// there are; a hint that is gone, is not a key file or does not open with `password`
    /// costs that one try, then the other key files are tried as [`Repository::open`] does.
    ///
    /// # Errors
    /// As [`Repository::open`].
    pub async fn open_with_hint(
        store: Arc<dyn ObjectStore>,
        password: &[u8],
        hint: Option<KeyId>,
        cancel: &CancellationToken,
    ) -> RepoResult<Self> {
        let config_bytes = read_config(store.as_ref(), cancel).await?;
        let mut tried = 0;
        if let Some(id) = hint {
            let key = layout::key_file(&id)?;
            if let Some(found) =
                try_key(store.as_ref(), &key, password, &config_bytes, &mut tried, cancel).await?
            {
                return Self::assemble(store, found.master, (id, found.bytes), found.config, tried);
            }
        }
        let listed = store
            .list(layout::KEYS, cancel)
            .await
            .map_err(|e| RepoError::store("list", layout::KEYS, e))?;
        for meta in listed {
            // Only content-addressed names are key files (`key list` and `key remove` see no
            // others, so a key under another name could not be told apart or protected).
            let Some(id) = layout::id_of(&meta.key).map(KeyId) else { continue };
            // A key file is a few hundred bytes: a larger object is not one (and is not
            // downloaded). The hint was tried already.
            if meta.size > MAX_KEY_FILE_BYTES || hint == Some(id) {
                continue;
            }
            if let Some(found) =
                try_key(store.as_ref(), &meta.key, password, &config_bytes, &mut tried, cancel)
                    .await?
            {
                return Self::assemble(store, found.master, (id, found.bytes), found.config, tried);
            }
        }
        Err(RepoError::WrongPassword { tried })
    }
}

/// Reads `config`, capped: missing (or the whole location missing) means no repository.
async fn read_config(store: &dyn ObjectStore, cancel: &CancellationToken) -> RepoResult<Bytes> {
    let key = layout::config()?;
    match capped::read(store, &key, Limit::CONFIG, "read", cancel).await {
        Err(RepoError::Store {
            source: StoreError::NotFound { .. } | StoreError::LocationMissing { .. },
            ..
        }) => Err(RepoError::NotFound { location: store.location() }),
        other => other,
    }
}

/// Tries the key file at `key` with `password` against `config_bytes`. `None` when it does
/// not open the repository: gone, larger than a key file, not a key file, a wrong password,
/// or a key that does not authenticate the config (a leftover of a lost `init` race).
/// `tried` counts the key derivations.
async fn try_key(
    store: &dyn ObjectStore,
    key: &ObjectKey,
    password: &[u8],
    config_bytes: &Bytes,
    tried: &mut usize,
    cancel: &CancellationToken,
) -> RepoResult<Option<Unlocked>> {
    let bytes = match capped::read(store, key, Limit::KEY_FILE, "read key file", cancel).await {
        Ok(bytes) => bytes,
        // Removed since the listing (or, for a hint, since the open that gave it): a node
        // that lost an init race, or `repo key remove`. Either way it does not open this
        // repository; nor does an object that is no key file.
        Err(e) if e.is_not_found() => return Ok(None),
        Err(RepoError::TooLarge { .. }) => return Ok(None),
        Err(e) => return Err(e),
    };
    let Ok(file) = KeyFile::decode(&bytes) else { return Ok(None) };
    *tried += 1;
    let pw = password.to_vec();
    let Ok(master) = blocking(move || file.unwrap_with_password(&pw)).await? else {
        return Ok(None);
    };
    match Config::decode(&master.derive().cipher, config_bytes) {
        Ok(config) => Ok(Some(Unlocked { master, config, bytes })),
        Err(FormatError::Authentication) => Ok(None),
        Err(e) => Err(RepoError::corrupt("config", e)),
    }
}
