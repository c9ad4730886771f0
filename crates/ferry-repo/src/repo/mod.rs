//! A repository over an [`ObjectStore`]: init, open, keys, snapshots, blobs.

mod buffers;
mod cache;
pub(crate) mod capped;
pub(crate) mod claims;
mod disk_cache;
pub(crate) mod index;
mod keys;
pub(crate) mod layout;
mod open;
mod password_policy;
mod slot_marks;
mod snapshots;
mod stats;
pub(crate) mod writer;

use std::collections::HashSet;
use std::sync::Arc;

use bytes::Bytes;
use ferry_store::{KeyWrapper, ObjectStore, PutOutcome, StoreError};
use futures::{StreamExt, TryStreamExt};
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{
    BlobId, BlobOpener, Chunker, ChunkerParams, Config, IndexFile, IndexId, KMS_CONTEXT, KdfParams,
    KeyFile, KeyId, MasterKey, ObjectKind, PackId, PackParams, RepoFormat, RepoKeys, TreePage,
    content_address,
};
use cache::PackCache;
use capped::Limit;
pub use disk_cache::CacheOptions;
use disk_cache::{Cached, DiskCache};
pub use index::BlobLocation;
pub(crate) use index::{IndexBuilder, MemIndex, ShortId};
pub use keys::{KeyDetails, KeyInfo};
pub use open::OpenOptions;
pub use password_policy::{MIN_PASSWORD_LEN, VELERO_DEFAULT_PASSWORD, WeakPassword, weak_password};
pub(crate) use slot_marks::SlotMarks;
pub use stats::RepoStats;

/// How many objects are fetched at once when loading many (index files, snapshots).
pub(crate) const LOAD_CONCURRENCY: usize = 16;

/// Options for [`Repository::init`].
#[derive(Debug, Clone, Default)]
pub struct InitOptions {
    /// argon2id costs for the first key file.
    pub kdf: KdfParams,
    /// Chunk sizes.
    pub chunker: ChunkerParams,
    /// Pack sizes.
    pub packs: PackParams,
    /// Refuse to create the repository with a weak password (see [`weak_password`]);
    /// opening an existing one is unaffected. Off by default for library use and tests;
    /// `ferry repo init` and the agent set it.
    pub refuse_weak_password: bool,
    /// A KMS whose key ([`KeyWrapper::key_id`]) wraps the first key file as well as the
    /// password, so that opening the repository needs both. Also used to open the repository
    /// when it exists already (see [`OpenOptions::key_wrapper`]).
    pub key_wrapper: Option<Arc<dyn KeyWrapper>>,
    /// The repository's format: the latest ([`RepoFormat::V3`]) by default; formats 1 and 2
    /// only to write a repository older builds can read.
    pub format: RepoFormat,
}

/// Whether [`Repository::init`] created the repository.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum InitOutcome {
    /// This call created it.
    Created,
    /// It existed already (possibly created by a racing node) and was opened.
    AlreadyExisted,
}

/// An open repository. Cheap to clone; safe to share between tasks and threads.
#[derive(Debug, Clone)]
pub struct Repository {
    inner: Arc<Inner>,
}

#[derive(Debug)]
struct Inner {
    store: Arc<dyn ObjectStore>,
    keys: RepoKeys,
    master: MasterKey,
    /// The key file this handle was opened (or created) with, and its bytes (to put it back
    /// if another process removes it while this one removes a key: see `remove_key`).
    own_key: std::sync::Mutex<(KeyId, Bytes)>,
    /// Key files the open that made this handle tried (each an argon2 derivation).
    key_files_tried: usize,
    /// The KMS this handle was opened or created with; key files it writes are wrapped by it.
    key_wrapper: Option<Arc<dyn KeyWrapper>>,
    config: Config,
    chunker: Chunker,
    index: tokio::sync::Mutex<Option<Arc<MemIndex>>>,
    tree_packs: PackCache,
    /// The local cache of index files, snapshots and tree packs, once set.
    disk_cache: std::sync::OnceLock<Arc<DiskCache>>,
    /// Lease time of this process's backups and restores, in milliseconds (see `crate::gc`).
    lease_ttl_ms: std::sync::atomic::AtomicU64,
    /// Ranged pack reads of restores in flight through this handle, at most
    /// [`crate::pack_reads::MAX_REPOSITORY_READS`] (see there).
    pack_reads: Arc<tokio::sync::Semaphore>,
}

/// This machine's host name (empty when the kernel does not say), recorded in snapshots and
/// key files.
#[must_use]
pub fn hostname() -> String {
    std::fs::read_to_string("/proc/sys/kernel/hostname")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

pub(crate) fn unix_now() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_secs()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

pub(crate) async fn blocking<T: Send + 'static>(
    f: impl FnOnce() -> T + Send + 'static,
) -> RepoResult<T> {
    tokio::task::spawn_blocking(f)
        .await
        .map_err(|e| RepoError::Internal { what: "blocking task", reason: e.to_string() })
}

impl Repository {
    /// Creates a repository in `store`, or opens the existing one.
    ///
    /// Safe when several nodes race: each writes its own key file, then tries to create
    /// `config` with create-if-absent. Exactly one wins; the others delete their key file and
    /// open the winner's repository with `password`.
    ///
    /// # Errors
    /// Store failures; [`RepoError::WrongPassword`] when the repository exists (or a racing
    /// node created it) under another password; [`RepoError::InvalidInput`] when it would be
    /// created with a weak password and [`InitOptions::refuse_weak_password`] is set;
    /// [`RepoError::Kms`] when the KMS of [`InitOptions::key_wrapper`] refuses.
    pub async fn init(
        store: Arc<dyn ObjectStore>,
        password: &[u8],
        options: &InitOptions,
        cancel: &CancellationToken,
    ) -> RepoResult<(Self, InitOutcome)> {
        let config_key = layout::config()?;
        let open =
            OpenOptions { key_wrapper: options.key_wrapper.clone(), ..OpenOptions::default() };
        if store
            .head(&config_key, cancel)
            .await
            .map_err(|e| RepoError::store("look for", &config_key, e))?
            .is_some()
        {
            let repo = Self::open_with(store, password, &open, cancel).await?;
            return Ok((repo, InitOutcome::AlreadyExisted));
        }
        if options.refuse_weak_password
            && let Some(weak) = weak_password(password)
        {
            return Err(RepoError::InvalidInput {
                what: "password for a new repository",
                reason: format!(
                    "refusing to create a repository with {weak}; {}",
                    WeakPassword::ADVICE
                ),
            });
        }
        let mut repo_id = [0u8; 32];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut repo_id);
        let config = Config {
            repo_id,
            created_unix: unix_now(),
            chunker: options.chunker,
            volume_chunker: None,
            packs: options.packs,
            format: options.format,
        };
        config
            .validate()
            .map_err(|e| RepoError::InvalidInput { what: "init options", reason: e.to_string() })?;
        let master = MasterKey::generate();
        let wrapper = options.key_wrapper.as_deref();
        let (key_id, key_bytes) = wrap_key(&master, password, options.kdf, wrapper, cancel).await?;
        let key_key = layout::key_file(&key_id)?;
        store
            .put_if_absent(&key_key, Bytes::from(key_bytes.clone()), cancel)
            .await
            .map_err(|e| RepoError::store("write key file", &key_key, e))?;
        let keys = master.derive();
        let outcome = store
            .put_if_absent(&config_key, Bytes::from(config.encode(&keys.cipher)), cancel)
            .await
            .map_err(|e| RepoError::store("write", &config_key, e))?;
        match outcome {
            PutOutcome::Created => {
                let own_key = (key_id, Bytes::from(key_bytes));
                let wrapper = options.key_wrapper.clone();
                let repo = Self::assemble(store, master, own_key, config, 0, wrapper)?;
                Ok((repo, InitOutcome::Created))
            }
            PutOutcome::AlreadyExists => {
                // Lost the race: our key file wraps a key no config uses. Remove it (a leftover
                // would be harmless: open skips keys that do not decrypt the config).
                let _ = store.delete(&key_key, cancel).await;
                let repo = Self::open_with(store, password, &open, cancel).await?;
                Ok((repo, InitOutcome::AlreadyExisted))
            }
        }
    }

    /// The same keys over `store`, which holds a repository of `config` made with them (by a
    /// migration, [`crate::migrate()`]).
    pub(crate) fn with_store(
        &self,
        store: Arc<dyn ObjectStore>,
        config: Config,
    ) -> RepoResult<Self> {
        let own_key = self
            .inner
            .own_key
            .lock()
            .map_err(|_| RepoError::Internal { what: "key", reason: "lock poisoned".into() })?
            .clone();
        let wrapper = self.inner.key_wrapper.clone();
        Self::assemble(store, self.inner.master.clone(), own_key, config, 0, wrapper)
    }

    /// A handle on an opened or created repository; `key_files_tried` is the number of key
    /// derivations the open needed, `key_wrapper` the KMS it was given.
    fn assemble(
        store: Arc<dyn ObjectStore>,
        master: MasterKey,
        own_key: (KeyId, Bytes),
        config: Config,
        key_files_tried: usize,
        key_wrapper: Option<Arc<dyn KeyWrapper>>,
    ) -> RepoResult<Self> {
        let keys = master.derive();
        let chunker = Chunker::for_format(config.format, config.chunker, &keys)
            .map_err(|e| RepoError::corrupt("config", e))?;
        Ok(Self {
            inner: Arc::new(Inner {
                store,
                keys,
                master,
                own_key: std::sync::Mutex::new(own_key),
                key_files_tried,
                key_wrapper,
                config,
                chunker,
                index: tokio::sync::Mutex::new(None),
                tree_packs: PackCache::new(64 << 20),
                disk_cache: std::sync::OnceLock::new(),
                lease_ttl_ms: std::sync::atomic::AtomicU64::new(
                    crate::gc::DEFAULT_LEASE_TTL.as_millis() as u64,
                ),
                pack_reads: Arc::new(tokio::sync::Semaphore::new(
                    crate::pack_reads::MAX_REPOSITORY_READS,
                )),
            }),
        })
    }

    /// Sets how long the leases of this handle's backups and restores last without a refresh
    /// (they are refreshed every third of it). A process that crashes blocks garbage
    /// collection's sweep for this long plus the allowed clock skew. Default
    /// [`crate::gc::DEFAULT_LEASE_TTL`].
    pub fn set_lease_ttl(&self, ttl: std::time::Duration) {
        let ttl = ttl.min(crate::gc::MAX_LEASE_TTL);
        let ms = u64::try_from(ttl.as_millis()).unwrap_or(u64::MAX).max(1000);
        self.inner.lease_ttl_ms.store(ms, std::sync::atomic::Ordering::Relaxed);
    }

    /// Keeps index files, snapshot manifests and tree packs in a local cache (see
    /// [`CacheOptions`]), so later operations of this and other processes read them from disk
    /// instead of the store. Cached copies are verified by their hash on every read. The
    /// budget covers the whole directory: every repository of this process given the same
    /// directory and budget shares one running total, and eviction takes the least recently
    /// used files of all folders in it. The first call wins; later calls do nothing. `check`
    /// should not use a cache: it is meant to read the store.
    pub fn set_cache(&self, options: &CacheOptions) {
        let _ =
            self.inner.disk_cache.set(Arc::new(DiskCache::new(options, &self.config().repo_id)));
    }

    /// Reads the object `key`, named `id`, through the local cache when there is one, from
    /// the store only up to `limit`. The caller still verifies what it gets (a cached copy is
    /// verified already).
    pub(crate) async fn get_cached(
        &self,
        kind: Cached,
        id: [u8; 32],
        key: &ferry_store::ObjectKey,
        (limit, what): (Limit, &'static str),
        cancel: &CancellationToken,
    ) -> RepoResult<Bytes> {
        let Some(cache) = self.inner.disk_cache.get().cloned() else {
            return capped::read(self.store().as_ref(), key, limit, what, cancel).await;
        };
        let hit = {
            let cache = Arc::clone(&cache);
            blocking(move || cache.get(kind, &id)).await?
        };
        if let Some(bytes) = hit {
            return Ok(bytes);
        }
        let bytes = capped::read(self.store().as_ref(), key, limit, what, cancel).await?;
        self.keep_copy(kind, id, bytes.clone()).await;
        Ok(bytes)
    }

    /// Puts a copy of an object this process stored or read into the local cache (best
    /// effort: a failed write is logged by the cache). Awaited, not left in the background:
    /// a process that ends right after would drop a write still queued.
    pub(crate) async fn keep_copy(&self, kind: Cached, id: [u8; 32], bytes: Bytes) {
        if let Some(cache) = self.inner.disk_cache.get().cloned() {
            let _ = blocking(move || cache.put(kind, &id, &bytes)).await;
        }
    }

    /// How many key files the open that made this handle tried, each an argon2 derivation:
    /// 1 when the first one opened it (as a right hint to [`Repository::open_with_hint`]
    /// does), 0 for a handle that created the repository.
    #[must_use]
    pub fn key_files_tried(&self) -> usize {
        self.inner.key_files_tried
    }

    pub(crate) fn lease_ttl(&self) -> std::time::Duration {
        std::time::Duration::from_millis(
            self.inner.lease_ttl_ms.load(std::sync::atomic::Ordering::Relaxed),
        )
    }

    /// Repository parameters.
    #[must_use]
    pub fn config(&self) -> &Config {
        &self.inner.config
    }

    pub(crate) fn store(&self) -> &Arc<dyn ObjectStore> {
        &self.inner.store
    }

    /// A worker's [`crate::pack_reads::Fetcher`] through this handle's store, within its
    /// repository-wide bound on reads in flight.
    pub(crate) fn fetcher<'a>(
        &'a self,
        handle: &'a tokio::runtime::Handle,
        stop: &'a tokio_util::sync::CancellationToken,
    ) -> crate::pack_reads::Fetcher<'a> {
        crate::pack_reads::Fetcher::new(handle, &self.inner.store, &self.inner.pack_reads, stop)
    }

    pub(crate) fn keys(&self) -> &RepoKeys {
        &self.inner.keys
    }

    pub(crate) fn chunker(&self) -> &Chunker {
        &self.inner.chunker
    }

    /// The index, loading it on first use.
    pub(crate) async fn index(&self, cancel: &CancellationToken) -> RepoResult<Arc<MemIndex>> {
        let mut slot = self.inner.index.lock().await;
        if let Some(index) = slot.as_ref() {
            return Ok(Arc::clone(index));
        }
        let index = Arc::new(self.load_index(cancel).await?);
        *slot = Some(Arc::clone(&index));
        Ok(index)
    }

    /// Reloads the index if other writers added index files, or garbage collection changed
    /// them or its marks, since it was loaded.
    ///
    /// The marks are listed first, then `index/`: the loaded index is kept only if both
    /// show what it was loaded from. In that order no sweep that deletes an indexed pack
    /// slips between the two listings unseen: a mark still there at the first is seen; one
    /// gone by then was dropped unswept (a collector that stopped before its writers list) or
    /// swept, and such a sweep stores its compacted index file before it deletes any pack,
    /// so the second listing shows that file. (The other order, or both at once, could miss
    /// a whole sweep run between them, of a mark made after the index was loaded but before
    /// the caller's lease, and so not waiting for it.)
    pub(crate) async fn refresh_index(
        &self,
        cancel: &CancellationToken,
    ) -> RepoResult<Arc<MemIndex>> {
        let mut slot = self.inner.index.lock().await;
        if let Some(index) = slot.as_ref() {
            let marks = crate::gc::mark_ids(self, cancel).await?;
            let ids = self.index_ids(cancel).await?;
            if ids.iter().all(|id| index.files().contains(id))
                && index.files().len() == ids.len()
                && index.gc_marks == marks
            {
                return Ok(Arc::clone(index));
            }
        }
        let index = Arc::new(self.load_index(cancel).await?);
        *slot = Some(Arc::clone(&index));
        Ok(index)
    }

    pub(crate) async fn index_ids(&self, cancel: &CancellationToken) -> RepoResult<Vec<IndexId>> {
        let listed = self
            .store()
            .list(layout::INDEX, cancel)
            .await
            .map_err(|e| RepoError::store("list", layout::INDEX, e))?;
        Ok(listed.iter().filter_map(|m| layout::id_of(&m.key)).map(IndexId).collect())
    }

    /// Reads and authenticates one index file.
    pub(crate) async fn read_index_file(
        &self,
        id: IndexId,
        cancel: &CancellationToken,
    ) -> RepoResult<IndexFile> {
        let key = layout::index(&id)?;
        let read = (Limit::INDEX, "read index");
        let bytes = self.get_cached(Cached::Index, id.0, &key, read, cancel).await?;
        let cipher = self.keys().cipher.clone();
        blocking(move || {
            let object = format!("index {key}");
            if content_address(&bytes) != id.0 {
                return Err(RepoError::corrupt(
                    object,
                    crate::format::FormatError::HashMismatch { what: key.to_string() },
                ));
            }
            IndexFile::decode(&cipher, &bytes).map_err(|e| RepoError::corrupt(object, e))
        })
        .await?
    }

    /// Loads the index, leaving out packs that a pending garbage-collection mark condemned
    /// (read first: see `crate::gc`). Retries when garbage collection removes an index file
    /// between listing and reading (it wrote the file superseding it before).
    pub(crate) async fn load_index(&self, cancel: &CancellationToken) -> RepoResult<MemIndex> {
        let (marks, excluded) = crate::gc::exclusions(self, cancel).await?;
        let mut attempt = 0;
        let builder = loop {
            attempt += 1;
            match self.build_index(excluded.clone(), cancel).await {
                Err(RepoError::Store { source: StoreError::NotFound { .. }, .. })
                    if attempt < 4 => {}
                other => break other?,
            }
        };
        let mut index = blocking(move || builder.finish()).await?;
        index.gc_marks = marks;
        Ok(index)
    }

    /// Reads every index file into an [`IndexBuilder`], each file's entries taken in as it
    /// arrives (the decoded files are not all held at once).
    pub(crate) async fn build_index(
        &self,
        excluded: HashSet<PackId>,
        cancel: &CancellationToken,
    ) -> RepoResult<IndexBuilder> {
        let ids = self.index_ids(cancel).await?;
        self.build_index_from(ids, excluded, |_, _| {}, cancel).await
    }

    /// As [`Repository::build_index`], from the index files `ids`, showing each decoded file
    /// to `inspect` before the builder takes it in.
    pub(crate) async fn build_index_from(
        &self,
        ids: Vec<IndexId>,
        excluded: HashSet<PackId>,
        mut inspect: impl FnMut(IndexId, &IndexFile),
        cancel: &CancellationToken,
    ) -> RepoResult<IndexBuilder> {
        futures::stream::iter(ids)
            .map(|id| async move { self.read_index_file(id, cancel).await.map(|f| (id, f)) })
            .buffer_unordered(LOAD_CONCURRENCY)
            .try_fold(IndexBuilder::new(excluded), |mut builder, (id, file)| {
                inspect(id, &file);
                builder.add(id, file);
                futures::future::ready(Ok(builder))
            })
            .await
    }

    /// Where `id` is stored, by the loaded index; when that lacks it, by the index reloaded if
    /// it changed since it was loaded (a long-lived handle reading a snapshot stored after
    /// its index loaded finds its blobs so).
    async fn lookup_fresh(
        &self,
        id: &BlobId,
        referrer: &str,
        cancel: &CancellationToken,
    ) -> RepoResult<(Arc<MemIndex>, BlobLocation)> {
        let index = self.index(cancel).await?;
        if let Some(loc) = index.lookup(id) {
            return Ok((index, loc));
        }
        let index = self.refresh_index(cancel).await?;
        match index.lookup(id) {
            Some(loc) => Ok((index, loc)),
            None => Err(RepoError::MissingBlob { id: *id, referrer: referrer.to_owned() }),
        }
    }

    /// Reads, authenticates and verifies one blob (the library reads tree pages by
    /// [`Self::read_tree`], [`Self::read_tree_in`] or [`Self::read_tree_at`], and data through
    /// `pack_reads`).
    #[cfg(test)]
    pub(crate) async fn read_blob(
        &self,
        id: &BlobId,
        referrer: &str,
        cancel: &CancellationToken,
    ) -> RepoResult<Vec<u8>> {
        let (index, loc) = self.lookup_fresh(id, referrer, cancel).await?;
        self.read_located(&index, id, loc, cancel).await
    }

    /// Reads, authenticates and verifies blob `id`, stored at `loc` by `index`.
    async fn read_located(
        &self,
        index: &MemIndex,
        id: &BlobId,
        loc: BlobLocation,
        cancel: &CancellationToken,
    ) -> RepoResult<Vec<u8>> {
        let key = layout::pack(&loc.pack)?;
        let sealed = if loc.kind == ObjectKind::TreeBlob {
            self.tree_pack_bytes(index, &loc, cancel).await?
        } else {
            None
        };
        let sealed = match sealed {
            Some(bytes) => bytes,
            None => self
                .store()
                .get_range(&key, u64::from(loc.offset), u64::from(loc.length), cancel)
                .await
                .map_err(|e| RepoError::store("read blob from pack", &key, e))?,
        };
        let open = move |keys: &RepoKeys, id: &BlobId| {
            let at = (loc.pack, loc.offset);
            BlobOpener::default()
                .open(keys, id, (loc.kind, loc.raw_length), at, &sealed)
                .map(std::borrow::Cow::into_owned)
                .map_err(|e| RepoError::corrupt(format!("{} {id} in pack {key}", loc.kind), e))
        };
        // Tree blobs are small: authenticate inline. Large data blobs and frames go to a
        // blocking thread.
        if loc.kind == ObjectKind::TreeBlob || loc.length < (256 << 10) {
            return open(self.keys(), id);
        }
        let keys = self.keys().clone();
        let id = *id;
        blocking(move || open(&keys, &id)).await?
    }

    /// The sealed bytes of a tree blob from a cached whole-pack read; `None` to read the
    /// blob's range instead (the pack is too large to cache, or larger than the index says:
    /// it is not read whole then, but its blobs may still be intact).
    async fn tree_pack_bytes(
        &self,
        index: &MemIndex,
        loc: &BlobLocation,
        cancel: &CancellationToken,
    ) -> RepoResult<Option<Bytes>> {
        let cache = &self.inner.tree_packs;
        let pack = match cache.get(&loc.pack) {
            Some(pack) => pack,
            None => {
                let Some(size) = index.pack_size(&loc.pack) else { return Ok(None) };
                if !cache.fits(size) {
                    return Ok(None);
                }
                let key = layout::pack(&loc.pack)?;
                let read = (Limit::indexed_pack(size), "read tree pack");
                let bytes =
                    match self.get_cached(Cached::TreePack, loc.pack.0, &key, read, cancel).await {
                        Ok(bytes) => bytes,
                        Err(RepoError::TooLarge { .. }) => return Ok(None),
                        Err(e) => return Err(e),
                    };
                cache.insert(loc.pack, bytes.clone());
                bytes
            }
        };
        let (start, end) = (loc.offset as usize, loc.offset as usize + loc.length as usize);
        Ok((end <= pack.len()).then(|| pack.slice(start..end)))
    }

    /// Reads and decodes one tree page, found by the handle's index (reloaded if it lacks the
    /// page and changed since it loaded): for looking into a snapshot with no index of one's
    /// own.
    pub(crate) async fn read_tree(
        &self,
        id: &BlobId,
        referrer: &str,
        cancel: &CancellationToken,
    ) -> RepoResult<TreePage> {
        let (index, loc) = self.lookup_fresh(id, referrer, cancel).await?;
        self.read_tree_located(&index, id, loc, referrer, cancel).await
    }

    /// Reads and decodes one tree page, found by `index` only: for a restore (its snapshot is
    /// loaded before its index, so that holds every page it reads) or a backup's walk of its
    /// parent (chosen by the caller before the backup loads its index; a page missing there is
    /// read around), neither of which may see the handle's index swapped under it: another
    /// operation on the same handle may reload that without the packs a pending collection
    /// condemned, which the running one may still read (`FORMAT.md`).
    pub(crate) async fn read_tree_in(
        &self,
        index: &MemIndex,
        id: &BlobId,
        referrer: &str,
        cancel: &CancellationToken,
    ) -> RepoResult<TreePage> {
        let loc = index
            .lookup(id)
            .ok_or_else(|| RepoError::MissingBlob { id: *id, referrer: referrer.to_owned() })?;
        self.read_tree_located(index, id, loc, referrer, cancel).await
    }

    /// Reads and decodes tree page `id`, stored at `loc` by `index`.
    async fn read_tree_located(
        &self,
        index: &MemIndex,
        id: &BlobId,
        loc: BlobLocation,
        referrer: &str,
        cancel: &CancellationToken,
    ) -> RepoResult<TreePage> {
        if loc.kind != ObjectKind::TreeBlob {
            return Err(RepoError::corrupt(
                format!("{} {id} referenced as a tree by {referrer}", loc.kind),
                crate::format::FormatError::WrongKind {
                    expected: ObjectKind::TreeBlob,
                    found: loc.kind,
                },
            ));
        }
        let raw = self.read_located(index, id, loc, cancel).await?;
        TreePage::decode(&raw).map_err(|e| RepoError::corrupt(format!("tree blob {id}"), e))
    }

    /// Reads, authenticates and decodes the tree page `id` stored at `loc`, straight from the
    /// store (no index lookup, no cache): for `check` and garbage collection's marking.
    pub(crate) async fn read_tree_at(
        &self,
        id: &BlobId,
        loc: &BlobLocation,
        cancel: &CancellationToken,
    ) -> RepoResult<TreePage> {
        let key = layout::pack(&loc.pack)?;
        let sealed = self
            .store()
            .get_range(&key, u64::from(loc.offset), u64::from(loc.length), cancel)
            .await
            .map_err(|e| RepoError::store("read tree blob from pack", &key, e))?;
        let object = format!("tree blob {id} in pack {key}");
        let raw = crate::format::open_blob(self.keys(), id, ObjectKind::TreeBlob, &sealed)
            .map_err(|e| RepoError::corrupt(&object, e))?;
        TreePage::decode(&raw).map_err(|e| RepoError::corrupt(&object, e))
    }

    /// Where a blob is stored, by the handle's index, loading it if needed (and reloading it,
    /// if it changed, for a blob it lacks); `None` for a blob that index does not hold (an
    /// index loaded after a collection's mark leaves out the packs it condemned).
    ///
    /// # Errors
    /// As loading the index; listing `index/` and the collection's marks.
    pub async fn locate(
        &self,
        id: &BlobId,
        cancel: &CancellationToken,
    ) -> RepoResult<Option<BlobLocation>> {
        match self.lookup_fresh(id, "", cancel).await {
            Ok((_, loc)) => Ok(Some(loc)),
            Err(RepoError::MissingBlob { .. }) => Ok(None),
            Err(e) => Err(e),
        }
    }
}

/// A new key file wrapping `master` under `password`, and under `wrapper`'s KMS key as well
/// when there is one: its id and bytes.
async fn wrap_key(
    master: &MasterKey,
    password: &[u8],
    kdf: KdfParams,
    wrapper: Option<&dyn KeyWrapper>,
    cancel: &CancellationToken,
) -> RepoResult<(KeyId, Vec<u8>)> {
    let invalid = |what, e: crate::format::FormatError| RepoError::InvalidInput {
        what,
        reason: e.to_string(),
    };
    let (master, password) = (master.clone(), password.to_vec());
    let file = match wrapper {
        None => blocking(move || {
            KeyFile::wrap_with_password(&master, &password, kdf, hostname(), unix_now())
        })
        .await?
        .map_err(|e| invalid("key derivation parameters", e))?,
        Some(kms) => {
            let seal = blocking(move || KeyFile::seal_for_kms(&master, &password, kdf))
                .await?
                .map_err(|e| invalid("key derivation parameters", e))?;
            let wrapped = (kms.wrap(&seal.sealed, KMS_CONTEXT, cancel).await)
                .map_err(|e| RepoError::kms("wrap a new key file", None, e))?;
            seal.into_key_file(wrapped.key_id, wrapped.blob, hostname(), unix_now())
                .map_err(|e| invalid("KMS answer", e))?
        }
    };
    let bytes = file.encode();
    // Writers refuse what readers would.
    if bytes.len() as u64 > crate::format::limits::MAX_KEY_FILE_BYTES {
        return Err(RepoError::InvalidInput {
            what: "key file",
            reason: format!(
                "{} bytes, more than the {} bytes readers accept (a very long KMS key id?)",
                bytes.len(),
                crate::format::limits::MAX_KEY_FILE_BYTES
            ),
        });
    }
    Ok((KeyId(content_address(&bytes)), bytes))
}

#[cfg(test)]
mod hostile_tests;
#[cfg(test)]
pub(crate) mod tests;
