//! Where a CR's repository is, and opening it (created on first use).

use std::collections::HashMap;
use std::sync::Arc;
use std::time::{Duration, Instant};

use async_trait::async_trait;
use ferry_api::BackupStorageLocation;
use ferry_repo::{
    CacheOptions, InitOptions, InitOutcome, KeyId, RepoError, Repository, VELERO_DEFAULT_PASSWORD,
};
use ferry_store::{ObjectKey, ObjectStore, S3Config, S3Options, S3Store};
use kube::api::Api;
use tokio::sync::Mutex;
use tokio_util::sync::CancellationToken;

use crate::kms::Envelope;
use crate::secrets::{KmsSettings, PASSWORD_SECRET, Secrets, VELERO_PASSWORD_SECRET};
use crate::{BslLocation, MoverError, aws_credentials, location_of};

/// The folder under a BSL's prefix that holds Ferry's repositories, one per namespace. Velero
/// accepts `plugins/` beside its own folders and never writes or collects in it.
pub const REPOSITORY_FOLDER: &str = "plugins/ferry";
/// Where earlier Ferry versions kept them: a folder that makes Velero mark the BSL
/// Unavailable. Repositories found there are not used until moved (`ferry repo move`).
pub const OLD_REPOSITORY_FOLDER: &str = "ferry";

/// The key prefix, inside the bucket, of the repository for `namespace` in a BSL whose prefix
/// is `bsl_prefix`: `<bsl_prefix>/plugins/ferry/<namespace>`.
#[must_use]
pub fn repository_prefix(bsl_prefix: &str, namespace: &str) -> String {
    join_prefix(bsl_prefix, REPOSITORY_FOLDER, namespace)
}

/// Where earlier Ferry versions kept that repository: `<bsl_prefix>/ferry/<namespace>`.
#[must_use]
pub fn old_repository_prefix(bsl_prefix: &str, namespace: &str) -> String {
    join_prefix(bsl_prefix, OLD_REPOSITORY_FOLDER, namespace)
}

fn join_prefix(bsl_prefix: &str, folder: &str, namespace: &str) -> String {
    [bsl_prefix.trim_matches('/'), folder, namespace]
        .iter()
        .filter(|p| !p.is_empty())
        .copied()
        .collect::<Vec<_>>()
        .join("/")
}

/// An opened repository, as [`RepositorySource::open`] returns it.
#[derive(Debug, Clone)]
pub struct OpenedRepository {
    /// The repository.
    pub repo: Repository,
    /// Where it is, for messages (`s3://bucket/prefix`).
    pub location: String,
    /// Something the operator should act on, found while opening (the repository opened
    /// only with Velero's password); the caller logs it or raises it as a Warning Event.
    pub warning: Option<String>,
    /// Keeps a kept repository from being closed as idle while the caller uses it; the idle
    /// time counts from its drop. `None` where nothing is closed.
    pub in_use: Option<InUse>,
}

/// Marks a repository kept by [`BslRepositories`] as in use while alive: it is never closed
/// as idle then, and its idle time starts again when the last user drops this. A clone is
/// one more user.
#[derive(Debug, Clone)]
pub struct InUse(Arc<std::sync::Mutex<Instant>>);

impl InUse {
    fn new(last_used: &Arc<std::sync::Mutex<Instant>>) -> Self {
        Self(Arc::clone(last_used))
    }

    /// Whether `self` and `other` mark the same kept repository (the same open, not one
    /// opened again).
    #[must_use]
    pub fn same_repository(&self, other: &InUse) -> bool {
        Arc::ptr_eq(&self.0, &other.0)
    }
}

impl Drop for InUse {
    fn drop(&mut self) {
        *self.0.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
    }
}

/// Finds and opens the repository for a BackupStorageLocation and source namespace.
#[async_trait]
pub trait RepositorySource: Send + Sync + 'static {
    /// The repository (created if it does not exist yet), where it is, and any warning.
    ///
    /// # Errors
    /// [`MoverError`] naming the unusable location, secret or storage, or
    /// [`MoverError::RepositoryNotMoved`] when the repository is still where earlier
    /// versions kept it.
    async fn open(
        &self,
        location: &str,
        namespace: &str,
        cancel: &CancellationToken,
    ) -> Result<OpenedRepository, MoverError>;
}

/// One repository for every location and namespace (a single-repository setup, the demo).
#[derive(Debug, Clone)]
pub struct FixedRepository {
    repo: Repository,
    location: String,
}

impl FixedRepository {
    /// Serves `repo`, described as `location` in messages.
    #[must_use]
    pub fn new(repo: Repository, location: impl Into<String>) -> Self {
        Self { repo, location: location.into() }
    }
}

#[async_trait]
impl RepositorySource for FixedRepository {
    async fn open(
        &self,
        _location: &str,
        _namespace: &str,
        _cancel: &CancellationToken,
    ) -> Result<OpenedRepository, MoverError> {
        Ok(OpenedRepository {
            repo: self.repo.clone(),
            location: self.location.clone(),
            warning: None,
            in_use: None,
        })
    }
}

/// How long an opened repository stays open unused: then it is closed (its index and caches
/// freed) and the next CR of its namespace opens it again.
pub const IDLE_CLOSE: Duration = Duration::from_secs(10 * 60);

/// Repositories per BackupStorageLocation and namespace, as Velero keeps them. See the crate
/// docs.
///
/// Opened repositories are kept for reuse until [`IDLE_CLOSE`] unused, or until their BSL or
/// its credential secret changes (read at every open: the BSL's spec and the secrets'
/// `resourceVersion`s; a new endpoint or rotated S3 keys are picked up without a restart, a
/// status update by Velero's validation opens nothing again). Each repository is opened under its own
/// lock: a slow or hostile one (network, key derivation) delays only CRs of that repository.
pub struct BslRepositories {
    client: kube::Client,
    namespace: String,
    init: InitOptions,
    cache: Option<CacheOptions>,
    idle_close: Duration,
    open: std::sync::Mutex<HashMap<(String, String), Slot>>,
    /// The key that last opened each repository (kept when it is closed): tried first, so
    /// opening again costs one key derivation however many keys the repository has.
    hints: std::sync::Mutex<HashMap<String, KeyId>>,
    /// Whether a repository that only Velero's password opens gets a key for Ferry's (see
    /// [`Self::adopting_velero_keyed`]).
    adopt_velero_keyed: bool,
}

/// One repository's place in [`BslRepositories`]: empty until opened, and again once closed.
type Slot = Arc<Mutex<Option<Kept>>>;

/// An open repository kept for reuse.
struct Kept {
    repo: Repository,
    described: String,
    /// The BSL and credential versions it was opened with.
    versions: String,
    /// When it was last opened or last let go of; shared with every [`InUse`] handed out,
    /// so more than one holder means in use.
    last_used: Arc<std::sync::Mutex<Instant>>,
}

impl Kept {
    /// Unused (no [`InUse`] alive) for at least `idle`.
    fn idle_for(&self, idle: Duration) -> bool {
        Arc::strong_count(&self.last_used) == 1
            && self.last_used.lock().unwrap_or_else(std::sync::PoisonError::into_inner).elapsed()
                >= idle
    }

    fn in_use(&self) -> InUse {
        *self.last_used.lock().unwrap_or_else(std::sync::PoisonError::into_inner) = Instant::now();
        InUse::new(&self.last_used)
    }
}

/// A BSL read as an S3 location.
struct Site {
    bucket: String,
    prefix: String,
    options: S3Options,
    /// The KMS envelope Ferry's secret asks for.
    kms: Option<KmsSettings>,
    /// The `resourceVersion` of Ferry's secret; empty while it does not exist.
    own_version: String,
    /// The BSL's spec and the `resourceVersion`s of its credential and CA secrets and Ferry's
    /// secret (and its KMS settings): when they change, open repositories are opened again
    /// with what changed.
    versions: String,
}

impl std::fmt::Debug for BslRepositories {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("BslRepositories")
            .field("namespace", &self.namespace)
            .finish_non_exhaustive()
    }
}

/// A repository's store and how it is described in messages.
struct Located {
    store: Arc<dyn ObjectStore>,
    described: String,
}

impl BslRepositories {
    /// Reads BSLs and secrets in Velero's namespace `namespace`; new repositories get `init`
    /// (and are never created with a weak password).
    #[must_use]
    pub fn new(client: kube::Client, namespace: impl Into<String>, init: InitOptions) -> Self {
        let init = InitOptions { refuse_weak_password: true, ..init };
        Self {
            client,
            namespace: namespace.into(),
            init,
            cache: None,
            idle_close: IDLE_CLOSE,
            open: std::sync::Mutex::default(),
            hints: std::sync::Mutex::default(),
            adopt_velero_keyed: false,
        }
    }

    /// Adds a key for Ferry's own password to a repository that only the password of Velero's
    /// `velero-repo-credentials` opens, as earlier versions of Ferry created them. Off by
    /// default: anyone who can write to the bucket can put a repository keyed with Velero's
    /// published default password where the next namespace's repository will be, and every
    /// backup written into it would be readable with that password. Off, such a repository
    /// is refused with a message that says how to adopt it.
    #[must_use]
    pub fn adopting_velero_keyed(mut self, adopt: bool) -> Self {
        self.adopt_velero_keyed = adopt;
        self
    }

    /// Closes repositories unused for `idle` instead of [`IDLE_CLOSE`].
    #[must_use]
    pub fn with_idle_close(mut self, idle: Duration) -> Self {
        self.idle_close = idle;
        self
    }

    /// How many repositories are open now.
    #[must_use]
    pub fn open_count(&self) -> usize {
        self.slots()
            .values()
            .filter(|slot| slot.try_lock().is_ok_and(|kept| kept.is_some()))
            .count()
    }

    fn hints(&self) -> std::sync::MutexGuard<'_, HashMap<String, KeyId>> {
        self.hints.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    fn slots(&self) -> std::sync::MutexGuard<'_, HashMap<(String, String), Slot>> {
        // Poisoned only by a panic while inserting a slot: the map itself stays whole.
        self.open.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    /// The slot of one repository (made empty on first use).
    fn slot(&self, key: &(String, String)) -> Slot {
        Arc::clone(self.slots().entry(key.clone()).or_default())
    }

    /// Closes every repository unused for the idle time (none that is being opened, whose
    /// slot is locked, or used: an [`InUse`] of it is alive).
    pub fn close_idle(&self) {
        for slot in self.slots().values() {
            if let Ok(mut kept) = slot.try_lock()
                && kept.as_ref().is_some_and(|k| k.idle_for(self.idle_close))
                && let Some(closed) = kept.take()
            {
                tracing::info!(repository = %closed.described, "closed an idle repository");
            }
        }
    }

    /// Closes idle repositories as they become idle (checked every quarter of the idle time,
    /// at least every minute), not only when the next CR opens one, until `cancel` fires or
    /// `self` is dropped.
    pub fn spawn_idle_closer(
        self: &Arc<Self>,
        cancel: CancellationToken,
    ) -> tokio::task::JoinHandle<()> {
        let every = (self.idle_close / 4).clamp(Duration::from_millis(50), Duration::from_secs(60));
        let repos = Arc::downgrade(self);
        tokio::spawn(async move {
            loop {
                tokio::select! {
                    () = cancel.cancelled() => return,
                    () = tokio::time::sleep(every) => {}
                }
                let Some(repos) = repos.upgrade() else { return };
                repos.close_idle();
            }
        })
    }

    /// Gives every repository opened a local cache in `cache` (see [`CacheOptions`]).
    #[must_use]
    pub fn with_cache(mut self, cache: Option<CacheOptions>) -> Self {
        self.cache = cache;
        self
    }

    fn secrets(&self) -> Secrets<'_> {
        Secrets { client: &self.client, namespace: &self.namespace }
    }

    /// The BSL `location`: its bucket, prefix and S3 options (credentials from its secret).
    async fn location(&self, location: &str) -> Result<Site, MoverError> {
        let bsls: Api<BackupStorageLocation> =
            Api::namespaced(self.client.clone(), &self.namespace);
        let bsl = bsls
            .get_opt(location)
            .await
            .map_err(|e| MoverError::Api {
                step: "reading the BackupStorageLocation",
                source: Box::new(ferry_kube::ApiError::from_kube(
                    "BackupStorageLocation",
                    location,
                    e,
                )),
            })?
            .ok_or_else(|| MoverError::Location {
                name: location.into(),
                reason: format!("not found in namespace {}", self.namespace),
            })?;
        let loc = location_of(&bsl)?;
        let (secret, key) = &loc.credential;
        let found = self.secrets().versioned_value(secret, key).await?;
        let (ca_bundle, ca_version) = self.ca_bundle(location, &loc).await?;
        // Ferry's own secret too: a rotation (previous-repository-password) and a changed
        // kms-key-id or kms-endpoint reach repositories kept open.
        let own = self.secrets().own_settings().await?;
        let kms_version = own.kms.as_ref().map_or_else(String::new, |k| {
            format!("{}@{}", k.key_id, k.endpoint.as_deref().unwrap_or_default())
        });
        // The BSL's spec, not its resourceVersion: Velero's BSL has no status subresource, so
        // every validation (each minute by default) changes the resourceVersion, and a kept
        // repository would be opened again for each CR.
        let spec = serde_json::to_string(&bsl.spec).map_err(|e| MoverError::Location {
            name: location.into(),
            reason: format!("its spec cannot be serialized: {e}"),
        })?;
        let versions = format!(
            "{spec}/{}/{ca_version}/{}/{kms_version}",
            found.as_ref().map_or("", |(_, version)| version.as_str()),
            own.version,
        );
        let credentials = match found.map(|(text, _)| text) {
            Some(text) => {
                Some(aws_credentials(&String::from_utf8_lossy(&text), &loc.profile).map_err(
                    |reason| MoverError::Secret {
                        namespace: self.namespace.clone(),
                        name: secret.clone(),
                        key: key.clone(),
                        reason,
                    },
                )?)
            }
            // The location names a secret that is not there: never another identity instead.
            None if loc.credential_named => {
                return Err(MoverError::Secret {
                    namespace: self.namespace.clone(),
                    name: secret.clone(),
                    key: key.clone(),
                    reason: format!(
                        "the secret does not exist, and BackupStorageLocation {location} names \
                         it in spec.credential: create it, or remove spec.credential to use \
                         Velero's cloud-credentials or the node's own cloud identity"
                    ),
                });
            }
            // No default secret: the standard AWS chain (IRSA, instance roles, environment).
            None => None,
        };
        let options = S3Options {
            endpoint: loc.endpoint.clone(),
            region: loc.region,
            force_path_style: loc.force_path_style || loc.endpoint.is_some(),
            credentials,
            ca_bundle,
            server_side_encryption: loc.server_side_encryption,
            ..S3Options::default()
        };
        Ok(Site {
            bucket: loc.bucket,
            prefix: loc.prefix,
            options,
            kms: own.kms,
            own_version: own.version,
            versions,
        })
    }

    /// A password rotation of Ferry's secret: a repository that only the previous password
    /// ([`crate::PREVIOUS_PASSWORD_KEY`]) opens gets a key for the current one, read back and
    /// proven, and then loses the previous one. `None` when there is no previous password or
    /// it does not open the repository either.
    async fn rotate(
        &self,
        at: &Located,
        envelope: &Envelope,
        own: &[u8],
        cancel: &CancellationToken,
    ) -> Result<Option<(Repository, Option<String>)>, MoverError> {
        let Some(previous) = self.secrets().previous_password().await? else { return Ok(None) };
        let options = envelope.open_options(None);
        let repo =
            match Repository::open_with(Arc::clone(&at.store), &previous, &options, cancel).await {
                Ok(repo) => repo,
                Err(RepoError::WrongPassword { untried: None, .. }) => return Ok(None),
                Err(e) => {
                    let step = "opening the repository with the previous password";
                    return Err(envelope.error(step, &at.described, refusal_first(e)));
                }
            };
        refuse_weak(at, own)?;
        let old = repo.key_id();
        let warning = match repo.change_password(own, self.init.kdf, cancel).await {
            Ok(new) => {
                tracing::info!(repository = %at.described, old = %old, new = %new, "rotated the repository's key to the current password of Ferry's secret");
                None
            }
            // The new key works; only the old one could not be removed.
            Err(e @ RepoError::OldKeyKept { .. }) => Some(format!(
                "repository {}: rotated to the current password, but {e}; remove it with \
                 `ferry repo key remove`",
                at.described
            )),
            Err(e) => {
                let step = "rotating the repository's key to the current password";
                return Err(envelope.error(step, &at.described, e));
            }
        };
        self.hints().insert(at.described.clone(), repo.key_id());
        Ok(Some((repo, warning)))
    }

    /// The CA bundle of `loc` (its `caCertRef` secret, else its `caCert`) and the secret's
    /// `resourceVersion` (empty without one).
    async fn ca_bundle(
        &self,
        location: &str,
        loc: &BslLocation,
    ) -> Result<(Option<Vec<u8>>, String), MoverError> {
        let Some((name, key)) = &loc.ca_cert_ref else {
            return Ok((loc.ca_cert.clone(), String::new()));
        };
        match self.secrets().versioned_value(name, key).await? {
            Some((pem, version)) => Ok((Some(pem), version)),
            None => Err(MoverError::Secret {
                namespace: self.namespace.clone(),
                name: name.clone(),
                key: key.clone(),
                reason: format!(
                    "the secret does not exist, and BackupStorageLocation {location} names it \
                     in objectStorage.caCertRef: create it with the endpoint's PEM CA \
                     certificates"
                ),
            }),
        }
    }

    /// The repository's store and the one where earlier versions kept it.
    async fn stores_for(
        &self,
        site: &Site,
        namespace: &str,
    ) -> Result<(Located, Located), MoverError> {
        let Site { bucket, prefix, options, .. } = site;
        let new = located(bucket, repository_prefix(prefix, namespace), options).await?;
        let old = located(bucket, old_repository_prefix(prefix, namespace), options).await?;
        Ok((new, old))
    }

    /// Opens (or creates) the repository at `at` with Ferry's own password, else, for a
    /// repository created with Velero's password, refuses it, or with
    /// [`Self::adopting_velero_keyed`] opens it with that one (adding a key for Ferry's); every
    /// open and the creation through `envelope`'s KMS, if any.
    async fn open_at(
        &self,
        at: &Located,
        envelope: &Envelope,
        cancel: &CancellationToken,
    ) -> Result<(Repository, Option<String>), MoverError> {
        let own = self.secrets().own_password().await?;
        let repo_error = |step, source| envelope.error(step, &at.described, source);
        let hint = self.hints().get(&at.described).copied();
        let store = || Arc::clone(&at.store);
        let options = envelope.open_options(hint);
        let opened = match Repository::open_with(store(), &own, &options, cancel).await {
            Err(RepoError::NotFound { .. }) => {
                let init = envelope.init_options(&self.init);
                match Repository::init(store(), &own, &init, cancel).await {
                    Ok((repo, InitOutcome::Created)) => {
                        if let Some(key) = envelope.key_id() {
                            tracing::info!(repository = %at.described, kms_key = %key, "created the repository under the KMS key of Ferry's secret");
                        }
                        Ok(repo)
                    }
                    other => other.map(|(repo, _)| repo),
                }
            }
            other => other,
        };
        match opened {
            Ok(repo) => {
                self.hints().insert(at.described.clone(), repo.key_id());
                return Ok((repo, None));
            }
            Err(RepoError::WrongPassword { untried: None, .. }) => {}
            Err(e) => {
                return Err(repo_error("opening or creating the repository", refusal_first(e)));
            }
        }
        if let Some(rotated) = self.rotate(at, envelope, &own, cancel).await? {
            return Ok(rotated);
        }
        // Another agent may have rotated it between the two tries (the previous key gone, the
        // new one added): look again with the current password.
        match Repository::open_with(store(), &own, &envelope.open_options(None), cancel).await {
            Ok(repo) => {
                self.hints().insert(at.described.clone(), repo.key_id());
                return Ok((repo, None));
            }
            Err(RepoError::WrongPassword { untried: None, .. }) => {}
            Err(e) => return Err(repo_error("opening the repository", refusal_first(e))),
        }
        let wrong_passwords = |velero: &str| MoverError::Password {
            location: at.described.clone(),
            reason: format!(
                "neither the password in {ns}/{PASSWORD_SECRET} nor {velero} opens it",
                ns = self.namespace
            ),
        };
        let Some(velero) = self.secrets().velero_password().await? else {
            let absent = format!("Velero's {VELERO_PASSWORD_SECRET} (absent)");
            return Err(wrong_passwords(&absent));
        };
        let old =
            match Repository::open_with(store(), &velero, &envelope.open_options(None), cancel)
                .await
            {
                Ok(repo) => repo,
                Err(RepoError::WrongPassword { untried: None, .. }) => {
                    let name = format!("the one in {}/{VELERO_PASSWORD_SECRET}", self.namespace);
                    return Err(wrong_passwords(&name));
                }
                Err(e) => return Err(repo_error("opening the repository", refusal_first(e))),
            };
        let which = if velero == VELERO_DEFAULT_PASSWORD {
            "Velero's published default password (anyone who can read the bucket can decrypt \
             it while that key remains)"
        } else {
            "the password of Velero's secret"
        };
        if !self.adopt_velero_keyed {
            return Err(MoverError::Password {
                location: at.described.clone(),
                reason: format!(
                    "it opens only with {which} from {ns}/{VELERO_PASSWORD_SECRET}: an earlier \
                     Ferry created it so, or someone who can write to the bucket put it there. \
                     Ferry adds its own key to such a repository only when its agents run with \
                     --adopt-velero-keyed-repositories (chart: \
                     agent.adoptVeleroKeyedRepositories=true); turn that on to take over the \
                     repositories an earlier Ferry made, then off again",
                    ns = self.namespace
                ),
            });
        }
        refuse_weak(at, &own)?;
        // Created by an earlier version with Velero's password: from now on Ferry's own opens
        // it too. The old key stays (something else may use it) until the operator removes it.
        let added = old
            .add_password(&own, self.init.kdf, cancel)
            .await
            .map_err(|e| repo_error("adding a key for Ferry's password", e))?;
        let repo =
            Repository::open_with(store(), &own, &envelope.open_options(Some(added)), cancel)
                .await
                .map_err(|e| repo_error("opening the repository with the key just added", e))?;
        self.hints().insert(at.described.clone(), repo.key_id());
        let warning = format!(
            "repository {} opened only with {which} from {}/{VELERO_PASSWORD_SECRET}; added \
             key {added} for Ferry's own {}/{PASSWORD_SECRET}, which opens it from now on. \
             Remove the old key {} with `ferry repo key remove --repo {} {}` (password: \
             Ferry's secret) once nothing else uses it",
            at.described,
            self.namespace,
            self.namespace,
            old.key_id(),
            at.described,
            old.key_id(),
        );
        Ok((repo, Some(warning)))
    }
}

/// Refuses to give the repository at `at` a key for a weak `password` (see
/// [`ferry_repo::weak_password`]): a rotation or an adoption must not weaken it.
fn refuse_weak(at: &Located, password: &[u8]) -> Result<(), MoverError> {
    match ferry_repo::weak_password(password) {
        None => Ok(()),
        Some(weak) => Err(MoverError::Password {
            location: at.described.clone(),
            reason: format!(
                "the password in {PASSWORD_SECRET} is too weak to be given a key ({weak}); {}",
                ferry_repo::WeakPassword::ADVICE
            ),
        }),
    }
}

async fn located(bucket: &str, prefix: String, options: &S3Options) -> Result<Located, MoverError> {
    let described = format!("s3://{bucket}/{prefix}");
    let config = S3Config { bucket: bucket.to_owned(), prefix, options: options.clone() };
    let store = S3Store::new(config).await.map_err(|source| MoverError::Store {
        location: described.clone(),
        source: Box::new(source),
    })?;
    Ok(Located { store: Arc::new(store), described })
}

/// Whether a repository is at `store` (its `config` object exists; see FORMAT.md).
async fn holds_repository(at: &Located, cancel: &CancellationToken) -> Result<bool, MoverError> {
    let store_error =
        |source| MoverError::Store { location: at.described.clone(), source: Box::new(source) };
    let config = ObjectKey::new("config")
        .map_err(|e| MoverError::Location { name: at.described.clone(), reason: e.to_string() })?;
    let found = at.store.head(&config, cancel).await.map_err(store_error)?;
    Ok(found.is_some())
}

#[async_trait]
impl RepositorySource for BslRepositories {
    async fn open(
        &self,
        location: &str,
        namespace: &str,
        cancel: &CancellationToken,
    ) -> Result<OpenedRepository, MoverError> {
        self.close_idle();
        // Read at every open (two GETs), so a changed BSL or credential is seen at once.
        let mut site = self.location(location).await?;
        if site.own_version.is_empty() {
            // Ferry's password secret is made (race-safely) before the repository is opened,
            // not by the open: the versions it is kept with then include the secret's, and the
            // next CR does not open it again.
            self.secrets().own_password().await?;
            site = self.location(location).await?;
        }
        let slot = self.slot(&(location.to_owned(), namespace.to_owned()));
        // Only CRs of this repository wait here while it is opened.
        let mut kept = slot.lock().await;
        if let Some(k) = kept.as_ref().filter(|k| k.versions == site.versions) {
            return Ok(OpenedRepository {
                repo: k.repo.clone(),
                location: k.described.clone(),
                warning: None,
                in_use: Some(k.in_use()),
            });
        }
        if let Some(stale) = kept.take() {
            tracing::info!(repository = %stale.described, location, "the BackupStorageLocation or its credential changed: opening the repository again");
        }
        let (new, old) = self.stores_for(&site, namespace).await?;
        // A repository left where earlier versions kept it is not replaced by a new empty
        // one (its snapshots would be "not found"): it must be moved first.
        if !holds_repository(&new, cancel).await? && holds_repository(&old, cancel).await? {
            return Err(MoverError::RepositoryNotMoved { old: old.described, new: new.described });
        }
        if let Some(endpoint) = site.options.plain_http_endpoint() {
            tracing::warn!(repository = %new.described, location, endpoint, "the BackupStorageLocation's s3Url is plain HTTP: object names, sizes and request signatures cross the network readable, and anyone on the path can withhold or delete backups (their contents stay encrypted and authenticated); use https, with objectStorage.caCert for a private CA");
        }
        let envelope = Envelope::new(&self.namespace, site.kms.as_ref(), &site.options).await?;
        let (repo, warning) = self.open_at(&new, &envelope, cancel).await?;
        if let Some(cache) = &self.cache {
            repo.set_cache(cache);
        }
        let fresh = Kept {
            repo: repo.clone(),
            described: new.described.clone(),
            versions: site.versions,
            last_used: Arc::new(std::sync::Mutex::new(Instant::now())),
        };
        let in_use = Some(fresh.in_use());
        *kept = Some(fresh);
        Ok(OpenedRepository { repo, location: new.described, warning, in_use })
    }
}

#[async_trait]
impl crate::upload_finalizer::BackupMetadata for BslRepositories {
    async fn backup_exists(
        &self,
        location: &str,
        backup: &str,
        cancel: &CancellationToken,
    ) -> Result<bool, MoverError> {
        let site = self.location(location).await?;
        let root =
            located(&site.bucket, site.prefix.trim_matches('/').to_owned(), &site.options).await?;
        // Velero's layout: `<prefix>/backups/<name>/velero-backup.json`.
        let key = ObjectKey::new(format!("backups/{backup}/velero-backup.json"))
            .map_err(|e| MoverError::Location { name: location.into(), reason: e.to_string() })?;
        let found = root.store.head(&key, cancel).await.map_err(|source| MoverError::Store {
            location: root.described.clone(),
            source: Box::new(source),
        })?;
        Ok(found.is_some())
    }
}

/// A wrong password said alongside a KMS refusal of another key file becomes that refusal:
/// the key file the KMS refused may be the one the password opens, so the password fallbacks
/// (the previous password, Velero's) are not tried; they could only add key files.
fn refusal_first(e: RepoError) -> RepoError {
    match e {
        RepoError::WrongPassword { untried: Some(refused), .. } => *refused,
        e => e,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_refusal_beside_a_wrong_password_is_the_error_the_fallbacks_never_see() {
        let refused = RepoError::NotFound { location: "stands for a KMS refusal".into() };
        let wrong = RepoError::WrongPassword { tried: 1, untried: Some(Box::new(refused)) };
        assert!(matches!(refusal_first(wrong), RepoError::NotFound { .. }));
        let plain = RepoError::WrongPassword { tried: 2, untried: None };
        assert!(matches!(refusal_first(plain), RepoError::WrongPassword { tried: 2, .. }));
    }
}
