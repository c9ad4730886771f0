//! One type for "some store", chosen at run time by an enum rather than `dyn`.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::{
    FaultyStore, FsStore, MemoryStore, ObjectKey, ObjectMeta, ObjectStore, PutOutcome, StoreResult,
};
#[cfg(feature = "s3")]
use crate::{S3Config, S3Options, S3Store, StoreUrl};

/// Any of the stores this crate provides. Cheap to clone.
#[derive(Debug, Clone)]
#[non_exhaustive]
pub enum AnyStore {
    /// A directory.
    Fs(FsStore),
    /// An S3 bucket.
    #[cfg(feature = "s3")]
    S3(S3Store),
    /// In memory (tests).
    Memory(MemoryStore),
    /// Another store with injected faults (tests).
    Faulty(Arc<FaultyStore<AnyStore>>),
}

impl AnyStore {
    /// Opens the store `url` names; `s3` supplies endpoint, credentials and tuning for
    /// `s3://` URLs and is ignored otherwise.
    ///
    /// # Errors
    /// As [`FsStore::open`] and [`S3Store::new`].
    #[cfg(feature = "s3")]
    pub async fn open(url: &StoreUrl, s3: &S3Options) -> StoreResult<Self> {
        match url {
            StoreUrl::File { root } => FsStore::open(root).map(Self::Fs),
            StoreUrl::S3 { bucket, prefix } => {
                let config = S3Config {
                    bucket: bucket.clone(),
                    prefix: prefix.clone(),
                    options: s3.clone(),
                };
                S3Store::new(config).await.map(Self::S3)
            }
        }
    }
}

/// Forwards a call to whichever store `self` holds.
macro_rules! dispatch {
    ($self:ident, $store:ident => $call:expr) => {
        match $self {
            AnyStore::Fs($store) => $call,
            #[cfg(feature = "s3")]
            AnyStore::S3($store) => $call,
            AnyStore::Memory($store) => $call,
            AnyStore::Faulty($store) => $call,
        }
    };
}

#[async_trait]
impl ObjectStore for AnyStore {
    fn location(&self) -> String {
        dispatch!(self, s => s.location())
    }

    async fn put_if_absent(
        &self,
        key: &ObjectKey,
        data: Bytes,
        cancel: &CancellationToken,
    ) -> StoreResult<PutOutcome> {
        dispatch!(self, s => s.put_if_absent(key, data, cancel).await)
    }

    async fn prepare_creates(&self, cancel: &CancellationToken) -> StoreResult<()> {
        dispatch!(self, s => s.prepare_creates(cancel).await)
    }

    async fn get(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<Bytes> {
        dispatch!(self, s => s.get(key, cancel).await)
    }

    async fn get_at_most(
        &self,
        key: &ObjectKey,
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        dispatch!(self, s => s.get_at_most(key, max_bytes, cancel).await)
    }

    async fn get_range(
        &self,
        key: &ObjectKey,
        offset: u64,
        len: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        dispatch!(self, s => s.get_range(key, offset, len, cancel).await)
    }

    async fn head(
        &self,
        key: &ObjectKey,
        cancel: &CancellationToken,
    ) -> StoreResult<Option<ObjectMeta>> {
        dispatch!(self, s => s.head(key, cancel).await)
    }

    async fn list(&self, prefix: &str, cancel: &CancellationToken) -> StoreResult<Vec<ObjectMeta>> {
        dispatch!(self, s => s.list(prefix, cancel).await)
    }

    async fn delete(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<()> {
        dispatch!(self, s => s.delete(key, cancel).await)
    }
}

impl From<FsStore> for AnyStore {
    fn from(store: FsStore) -> Self {
        Self::Fs(store)
    }
}

#[cfg(feature = "s3")]
impl From<S3Store> for AnyStore {
    fn from(store: S3Store) -> Self {
        Self::S3(store)
    }
}

impl From<MemoryStore> for AnyStore {
    fn from(store: MemoryStore) -> Self {
        Self::Memory(store)
    }
}

impl From<FaultyStore<AnyStore>> for AnyStore {
    fn from(store: FaultyStore<AnyStore>) -> Self {
        Self::Faulty(Arc::new(store))
    }
}

#[cfg(all(test, feature = "s3"))]
mod tests {
    use super::*;

    #[tokio::test]
    async fn opens_file_urls_and_reports_missing_roots() {
        let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("{e}"));
        let url = StoreUrl::File { root: dir.path().to_path_buf() };
        let store = AnyStore::open(&url, &S3Options::default()).await;
        assert!(matches!(store, Ok(AnyStore::Fs(ref fs)) if fs.root() == dir.path()));
        let gone = StoreUrl::File { root: dir.path().join("gone") };
        let missing = AnyStore::open(&gone, &S3Options::default()).await;
        assert!(matches!(missing, Err(crate::StoreError::LocationMissing { .. })));
    }

    #[tokio::test]
    async fn opens_s3_urls_without_contacting_the_endpoint() {
        let url = StoreUrl::parse("s3://backups/ferry").unwrap_or_else(|e| panic!("{e}"));
        let options =
            S3Options { endpoint: Some("http://127.0.0.1:9".into()), ..S3Options::default() };
        let store = AnyStore::open(&url, &options).await;
        assert!(matches!(store, Ok(AnyStore::S3(ref s3)) if s3.bucket() == "backups"));
    }
}
