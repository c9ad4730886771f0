//! Opening a repository: read `config`, then find the key file the password unwraps.
//!
//! Each key file tried costs an argon2 derivation (a third of a second at the default costs),
//! so a repository with many key files, or with junk planted under `keys/`, opens slowly when
//! every file is tried in listing order. A caller that remembers which key opened the
//! repository last time ([`Repository::key_id`]) passes it as a hint: that file is read and
//! tried first, without even listing `keys/`, and only if it no longer opens the repository
//! are the others tried.
//!
//! A key file wrapped by a KMS key as well ([`crate::format::KeyWrap::PasswordAndKms`]) costs
//! a KMS `Decrypt` before its derivation, and opens only when the open was given a KMS
//! ([`OpenOptions::key_wrapper`]); without one it is skipped, and if nothing else opens, the
//! error names the KMS key it needs rather than calling the password wrong.

use std::collections::BTreeSet;
use std::sync::Arc;

use bytes::Bytes;
use ferry_store::{KeyWrapper, KmsError, ObjectKey, ObjectMeta, ObjectStore, StoreError};
use tokio_util::sync::CancellationToken;

use super::capped::{self, Limit};
use super::{Repository, blocking, layout};
use crate::error::{RepoError, RepoResult};
use crate::format::limits::MAX_KEY_FILE_BYTES;
use crate::format::{Config, FormatError, KMS_CONTEXT, KeyFile, KeyId, MasterKey};

/// Options for [`Repository::open_with`].
#[derive(Debug, Clone, Default)]
pub struct OpenOptions {
    /// The key file to try first, typically the [`Repository::key_id`] of an earlier open
    /// with the same password (see [`Repository::open_with_hint`]).
    pub hint: Option<KeyId>,
    /// The KMS that unwraps key files wrapped by a KMS key. Without one such key files are
    /// skipped. The handle keeps it: key files it writes later ([`Repository::add_password`],
    /// [`Repository::change_password`]) are wrapped by its key
    /// ([`KeyWrapper::key_id`]) too.
    pub key_wrapper: Option<Arc<dyn KeyWrapper>>,
    /// The caller will create objects (a backup or a restore writes a lease, for one), so
    /// the store's one-time check before its first create ([`ObjectStore::prepare_creates`],
    /// a few round trips on S3) runs while the repository opens: once `config` is found,
    /// hidden behind the key file's read and its derivation. A failed check is not an
    /// open's failure: the first create checks again and reports it.
    pub prepare_creates: bool,
}

/// What a key file that opens the repository gave.
struct Unlocked {
    master: MasterKey,
    config: Config,
    bytes: Bytes,
}

impl Repository {
    /// Opens the repository in `store` with `password`, trying the key files in listing
    /// order. Objects under `keys/` larger than [`MAX_KEY_FILE_BYTES`] are skipped without
    /// being downloaded. Key files wrapped by a KMS key are skipped too: open those with
    /// [`Repository::open_with`].
    ///
    /// # Errors
    /// [`RepoError::NotFound`] when there is no repository, [`RepoError::WrongPassword`] when no
    /// key file opens with `password`, [`RepoError::KmsKeyNeeded`] when none does but some
    /// need a KMS, [`RepoError::TooLarge`] for a `config` larger than any config,
    /// [`RepoError::Corrupt`] for a damaged config, store failures.
    pub async fn open(
        store: Arc<dyn ObjectStore>,
        password: &[u8],
        cancel: &CancellationToken,
    ) -> RepoResult<Self> {
        Self::open_with(store, password, &OpenOptions::default(), cancel).await
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
        let options = OpenOptions { hint, ..OpenOptions::default() };
        Self::open_with(store, password, &options, cancel).await
    }

    /// Opens the repository with `password` and `options`: the hint first, as
    /// [`Repository::open_with_hint`] does, and key files wrapped by a KMS key through
    /// [`OpenOptions::key_wrapper`].
    ///
    /// A KMS that refuses one key file (access denied, a disabled key, a damaged blob) does
    /// not stop the others being tried; one that cannot be reached does (that is worth
    /// retrying, not reporting as a wrong password).
    ///
    /// # Errors
    /// As [`Repository::open`]; [`RepoError::Kms`] when no key file opens and the KMS
    /// refused one (a refusal says more than "wrong password"), or at once when the KMS is
    /// unreachable.
    pub async fn open_with(
        store: Arc<dyn ObjectStore>,
        password: &[u8],
        options: &OpenOptions,
        cancel: &CancellationToken,
    ) -> RepoResult<Self> {
        // Without a hint `keys/` is listed while `config` is read (one round trip less); a
        // missing `config` still says "no repository" whatever the listing says.
        let (config_bytes, listed) = if options.hint.is_some() {
            (read_config(store.as_ref(), cancel).await?, None)
        } else {
            let (config, listed) = tokio::join!(
                read_config(store.as_ref(), cancel),
                list_keys(store.as_ref(), cancel)
            );
            (config?, Some(listed))
        };
        let unlock = Self::unlock(&store, password, options, &config_bytes, listed, cancel);
        if !options.prepare_creates {
            return unlock.await;
        }
        // Only now that `config` says this is a repository: the probe's writes go into no
        // other location, and hide behind the key file's read and its derivation.
        let (opened, prepared) = tokio::join!(unlock, store.prepare_creates(cancel));
        if let Err(e) = prepared {
            tracing::debug!(error = %e, "the store's check before creates failed; the first create checks again");
        }
        opened
    }

    /// Finds the key file that opens the repository whose `config` is `config_bytes`: the
    /// hint first, then the key files of `listed` (listed now when it is `None`).
    async fn unlock(
        store: &Arc<dyn ObjectStore>,
        password: &[u8],
        options: &OpenOptions,
        config_bytes: &Bytes,
        listed: Option<RepoResult<Vec<ObjectMeta>>>,
        cancel: &CancellationToken,
    ) -> RepoResult<Self> {
        let hint = options.hint;
        let mut search = Search {
            store: store.as_ref(),
            password,
            config_bytes,
            wrapper: options.key_wrapper.as_deref(),
            cancel,
            tried: 0,
            kms_needed: BTreeSet::new(),
            kms_refused: None,
        };
        let assemble = |found: Unlocked, id: KeyId, tried: usize| {
            let wrapper = options.key_wrapper.clone();
            Self::assemble(
                Arc::clone(store),
                found.master,
                (id, found.bytes),
                found.config,
                tried,
                wrapper,
            )
        };
        let mut seen = BTreeSet::new();
        if let Some(id) = hint {
            seen.insert(id);
            let key = layout::key_file(&id)?;
            if let Some(found) = search.try_key(&key).await? {
                return assemble(found, id, search.tried);
            }
        }
        // A listing made alongside the `config` read may have been answered before a racing
        // `init` wrote its key file (it writes the key file, then `config`): when it opens
        // nothing, `keys/` is listed once more, now that `config` exists, and the key files
        // not yet seen are tried.
        let (first, again) = match listed {
            Some(listed) => (listed?, true),
            None => (list_keys(store.as_ref(), cancel).await?, false),
        };
        if let Some((id, found)) = search.try_listed(&first, &mut seen).await? {
            return assemble(found, id, search.tried);
        }
        if again {
            // This listing only looks for a late key file: if it fails, the first listing's
            // answer (a wrong password, a KMS needed) is the one to give.
            match list_keys(store.as_ref(), cancel).await {
                Ok(listed) => {
                    if let Some((id, found)) = search.try_listed(&listed, &mut seen).await? {
                        return assemble(found, id, search.tried);
                    }
                }
                Err(RepoError::Cancelled) => return Err(RepoError::Cancelled),
                Err(e) => tracing::debug!(error = %e, "listing keys/ again failed"),
            }
        }
        Err(search.failure())
    }
}

/// Why a key file gave no master key.
pub(super) enum Refusal {
    /// The password does not open it (or it is damaged).
    Password(FormatError),
    /// It is wrapped by this KMS key, and no KMS was given.
    NoKms(String),
    /// The KMS refused or failed to unwrap it.
    Kms(KmsError),
}

/// Unwraps the master key from `file` with `password`, through `wrapper` when the file is
/// wrapped by a KMS key. The outer error is only for cancellation and internal failures.
pub(super) async fn unwrap_key_file(
    file: KeyFile,
    password: &[u8],
    wrapper: Option<&dyn KeyWrapper>,
    cancel: &CancellationToken,
) -> RepoResult<Result<MasterKey, Refusal>> {
    let password = password.to_vec();
    let Some((key_id, blob)) = file.kms_layer() else {
        return Ok(blocking(move || file.unwrap_with_password(&password))
            .await?
            .map_err(Refusal::Password));
    };
    let Some(kms) = wrapper else { return Ok(Err(Refusal::NoKms(key_id.to_owned()))) };
    let sealed = match kms.unwrap(key_id, blob, KMS_CONTEXT, cancel).await {
        Ok(sealed) => sealed,
        Err(KmsError::Cancelled) => return Err(RepoError::Cancelled),
        Err(e) => return Ok(Err(Refusal::Kms(e))),
    };
    Ok(blocking(move || file.unwrap_after_kms(&sealed, &password))
        .await?
        .map_err(Refusal::Password))
}

/// The state of one open's search for a key file that opens the repository.
struct Search<'a> {
    store: &'a dyn ObjectStore,
    password: &'a [u8],
    config_bytes: &'a Bytes,
    wrapper: Option<&'a dyn KeyWrapper>,
    cancel: &'a CancellationToken,
    /// Key derivations made.
    tried: usize,
    /// KMS keys of key files skipped for want of a KMS.
    kms_needed: BTreeSet<String>,
    /// The first refusal of the KMS.
    kms_refused: Option<RepoError>,
}

impl Search<'_> {
    /// Tries the key file at `key`. `None` when it does not open the repository: gone,
    /// larger than a key file, not a key file, a wrong password, a KMS that is not given or
    /// refuses, or a key that does not authenticate the config (a leftover of a lost `init`
    /// race).
    async fn try_key(&mut self, key: &ObjectKey) -> RepoResult<Option<Unlocked>> {
        let read = capped::read(self.store, key, Limit::KEY_FILE, "read key file", self.cancel);
        let bytes = match read.await {
            Ok(bytes) => bytes,
            // Removed since the listing (or, for a hint, since the open that gave it): a node
            // that lost an init race, or `repo key remove`. Either way it does not open this
            // repository; nor does an object that is no key file.
            Err(e) if e.is_not_found() => return Ok(None),
            Err(RepoError::TooLarge { .. }) => return Ok(None),
            Err(e) => return Err(e),
        };
        let Ok(file) = KeyFile::decode(&bytes) else { return Ok(None) };
        let master = match unwrap_key_file(file, self.password, self.wrapper, self.cancel).await? {
            Ok(master) => master,
            Err(Refusal::Password(_)) => {
                self.tried += 1;
                return Ok(None);
            }
            Err(Refusal::NoKms(kms_key_id)) => {
                self.kms_needed.insert(kms_key_id);
                return Ok(None);
            }
            Err(Refusal::Kms(e)) => {
                let e = RepoError::kms("unwrap key file", Some(key.to_string()), e);
                if e.is_retryable() {
                    return Err(e);
                }
                self.kms_refused.get_or_insert(e);
                return Ok(None);
            }
        };
        self.tried += 1;
        match Config::decode(&master.derive().cipher, self.config_bytes) {
            Ok(config) => Ok(Some(Unlocked { master, config, bytes })),
            Err(FormatError::Authentication) => Ok(None),
            Err(e) => Err(RepoError::corrupt("config", e)),
        }
    }

    /// Tries the key files of `listed` not in `seen` (adding them), in listing order: the
    /// first that opens the repository, with its id.
    async fn try_listed(
        &mut self,
        listed: &[ObjectMeta],
        seen: &mut BTreeSet<KeyId>,
    ) -> RepoResult<Option<(KeyId, Unlocked)>> {
        for meta in listed {
            // Only content-addressed names are key files (`key list` and `key remove` see no
            // others, so a key under another name could not be told apart or protected).
            let Some(id) = layout::id_of(&meta.key).map(KeyId) else { continue };
            // A key file is a few hundred bytes: a larger object is not one (and is not
            // downloaded).
            if meta.size > MAX_KEY_FILE_BYTES || !seen.insert(id) {
                continue;
            }
            if let Some(found) = self.try_key(&meta.key).await? {
                return Ok(Some((id, found)));
            }
        }
        Ok(None)
    }

    /// Why no key file opened: the KMS keys needed, when key files were skipped for want of a
    /// KMS; else the password, when it was tried and failed (with the KMS's refusal of another
    /// key file, which might have opened, said alongside); else the KMS's refusal.
    fn failure(self) -> RepoError {
        if !self.kms_needed.is_empty() {
            return RepoError::KmsKeyNeeded { key_ids: self.kms_needed.into_iter().collect() };
        }
        match self.kms_refused {
            Some(refused) if self.tried == 0 => refused,
            untried => {
                RepoError::WrongPassword { tried: self.tried, untried: untried.map(Box::new) }
            }
        }
    }
}

/// Lists `keys/`.
async fn list_keys(
    store: &dyn ObjectStore,
    cancel: &CancellationToken,
) -> RepoResult<Vec<ObjectMeta>> {
    store.list(layout::KEYS, cancel).await.map_err(|e| RepoError::store("list", layout::KEYS, e))
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
