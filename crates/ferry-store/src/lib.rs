//! Object storage for Ferry's backup repository.
//!
//! The repository talks to storage only through [`ObjectStore`]: a narrow, async,
//! cancellable trait over immutable objects addressed by [`ObjectKey`]. Objects are created
//! once ([`ObjectStore::put_if_absent`]) and never rewritten in place, which is what lets many
//! writers share one repository without a lock and keeps the layout usable under S3 Object Lock.
//!
//! Backends:
//! - [`FsStore`]: a directory tree, one file per object, written atomically.
//! - [`S3Store`]: an S3 bucket (AWS or compatible), conditional writes for create-if-absent.
//! - [`MemoryStore`]: in memory, for unit tests of the crates above this one.
//!
//! [`FaultyStore`] wraps any store and injects failures and latency for reliability tests.
//! [`Hooked`] forwards to any store and lets a test watch or hold its calls.
//! [`AnyStore`] holds any of them (backends are chosen by an enum, not `dyn`), and
//! [`StoreUrl`] parses `file:///path` and `s3://bucket/prefix` locations.
//!
//! Beside storage, [`KeyWrapper`] wraps small secrets with a key management service
//! ([`AwsKms`], [`MemoryKms`] for tests): the repository's key files can need a KMS key as well
//! as a password.
//!
//! Retries live inside the backend that needs them ([`S3Store`], bounded by
//! [`S3Options::max_attempts`]), so an error a caller sees has already been retried where
//! retrying could help; there is no retrying wrapper on top.
//!
//! This crate knows nothing of Kubernetes, gRPC or the repository format.
//!
//! ```
//! # fn main() -> Result<(), Box<dyn std::error::Error>> {
//! # tokio::runtime::Builder::new_current_thread().build()?.block_on(demo())
//! # }
//! # async fn demo() -> Result<(), Box<dyn std::error::Error>> {
//! use ferry_store::{MemoryStore, ObjectKey, ObjectStore, PutOutcome};
//! use tokio_util::sync::CancellationToken;
//!
//! let store = MemoryStore::new();
//! let cancel = CancellationToken::new();
//! let key = ObjectKey::new("snapshots/0001")?;
//! assert_eq!(store.put_if_absent(&key, "one".into(), &cancel).await?, PutOutcome::Created);
//! assert_eq!(store.put_if_absent(&key, "two".into(), &cancel).await?, PutOutcome::AlreadyExists);
//! assert_eq!(store.get(&key, &cancel).await?, "one");
//! // Whole reads of objects nobody vouches for are capped: nothing larger is downloaded.
//! assert_eq!(store.get_at_most(&key, 3, &cancel).await?, "one");
//! assert!(store.get_at_most(&key, 2, &cancel).await.is_err());
//! # Ok(())
//! # }
//! ```

mod any;
mod cancel;
mod error;
mod faulty;
mod fs;
mod hooked;
#[cfg(feature = "s3")]
mod https;
mod key;
mod kms;
mod memory;
#[cfg(feature = "s3")]
mod s3;
mod url;

pub use any::AnyStore;
pub use error::{StoreError, StoreResult};
pub use faulty::{FaultConfig, FaultyStore};
pub use fs::FsStore;
pub use hooked::{Call, Hook, Hooked};
#[cfg(feature = "s3")]
pub use https::aws_http_client;
pub use key::{InvalidKey, ObjectKey};
#[cfg(feature = "s3")]
pub use kms::{AwsKms, KmsOptions};
pub use kms::{KeyWrapper, KmsError, MemoryKms, WrapContext, Wrapped};
pub use memory::MemoryStore;
#[cfg(feature = "s3")]
pub use s3::{S3Config, S3Options, S3Store, ServerSideEncryption, StaticCredentials};
pub use url::{InvalidStoreUrl, StoreUrl};

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

/// What [`ObjectStore::head`] and [`ObjectStore::list`] know about one stored object.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ObjectMeta {
    /// The object's key.
    pub key: ObjectKey,
    /// Size in bytes.
    pub size: u64,
}

/// The outcome of a create-if-absent write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PutOutcome {
    /// This call created the object.
    Created,
    /// An object with that key already existed; nothing was written.
    AlreadyExists,
}

/// Immutable object storage: the only way Ferry's repository reaches its bytes.
///
/// Every call takes a [`CancellationToken`]; a cancelled call returns
/// [`StoreError::Cancelled`] promptly and leaves no partial object visible.
#[async_trait]
pub trait ObjectStore: Send + Sync + std::fmt::Debug {
    /// Writes `data` under `key` unless an object with that key exists (atomic
    /// create-if-absent: of two racing writers exactly one sees [`PutOutcome::Created`]).
    /// A reader never observes a partially written object.
    ///
    /// # Errors
    /// Storage failures, cancellation.
    async fn put_if_absent(
        &self,
        key: &ObjectKey,
        data: Bytes,
        cancel: &CancellationToken,
    ) -> StoreResult<PutOutcome>;

    /// Does now what the first [`ObjectStore::put_if_absent`] would do before its write (the
    /// S3 store checks, once, that the server refuses a second conditional write), so a
    /// caller about to create objects can overlap that with other work. Stores with nothing
    /// to check do nothing. What the check writes it deletes (unless it is cancelled, its
    /// second write fails, or the delete fails: then one small object under `probe/` stays).
    ///
    /// # Errors
    /// As [`ObjectStore::put_if_absent`]. A failure is not remembered: the next create checks
    /// again.
    async fn prepare_creates(&self, _cancel: &CancellationToken) -> StoreResult<()> {
        Ok(())
    }

    /// Reads a whole object, whatever its size. For objects whose size is not known to be
    /// sane (anything in a bucket others can write to), use [`ObjectStore::get_at_most`].
    ///
    /// # Errors
    /// [`StoreError::NotFound`] when the key does not exist; storage failures, cancellation.
    async fn get(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<Bytes>;

    /// Reads a whole object of at most `max_bytes` bytes. A larger object is refused with
    /// [`StoreError::TooLarge`] by the size the backend reports for it, before its body is
    /// read; a body that runs past the cap anyway (a backend that announced no size) stops
    /// being read there, and one that runs past the size announced is an error. So a read
    /// never holds more than about `max_bytes`, whatever the object is.
    ///
    /// # Errors
    /// As [`ObjectStore::get`], plus [`StoreError::TooLarge`].
    async fn get_at_most(
        &self,
        key: &ObjectKey,
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes>;

    /// Reads `len` bytes starting at `offset`. A range reaching past the end is an error
    /// ([`StoreError::RangeOutOfBounds`]), never a short read.
    ///
    /// # Errors
    /// As [`ObjectStore::get`], plus a range outside the object.
    async fn get_range(
        &self,
        key: &ObjectKey,
        offset: u64,
        len: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes>;

    /// Size of an object, or `None` when it does not exist.
    ///
    /// # Errors
    /// Storage failures, cancellation.
    async fn head(
        &self,
        key: &ObjectKey,
        cancel: &CancellationToken,
    ) -> StoreResult<Option<ObjectMeta>>;

    /// Every object whose key starts with `prefix` (a plain string prefix of the key text),
    /// in lexicographic key order.
    ///
    /// # Errors
    /// Storage failures, cancellation.
    async fn list(&self, prefix: &str, cancel: &CancellationToken) -> StoreResult<Vec<ObjectMeta>>;

    /// Deletes an object. Deleting a key that does not exist succeeds.
    ///
    /// # Errors
    /// Storage failures, cancellation.
    async fn delete(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<()>;

    /// Where the store keeps its objects, in a user's words (a directory, `s3://bucket/prefix`
    /// at an endpoint), for messages.
    fn location(&self) -> String {
        "the object store".to_owned()
    }
}

/// A shared store is a store: lets callers hold `Arc<S>` (or `Arc<dyn ObjectStore>`).
#[async_trait]
impl<T: ObjectStore + ?Sized> ObjectStore for Arc<T> {
    fn location(&self) -> String {
        (**self).location()
    }

    async fn put_if_absent(
        &self,
        key: &ObjectKey,
        data: Bytes,
        cancel: &CancellationToken,
    ) -> StoreResult<PutOutcome> {
        (**self).put_if_absent(key, data, cancel).await
    }

    async fn prepare_creates(&self, cancel: &CancellationToken) -> StoreResult<()> {
        (**self).prepare_creates(cancel).await
    }

    async fn get(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<Bytes> {
        (**self).get(key, cancel).await
    }

    async fn get_at_most(
        &self,
        key: &ObjectKey,
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        (**self).get_at_most(key, max_bytes, cancel).await
    }

    async fn get_range(
        &self,
        key: &ObjectKey,
        offset: u64,
        len: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        (**self).get_range(key, offset, len, cancel).await
    }

    async fn head(
        &self,
        key: &ObjectKey,
        cancel: &CancellationToken,
    ) -> StoreResult<Option<ObjectMeta>> {
        (**self).head(key, cancel).await
    }

    async fn list(&self, prefix: &str, cancel: &CancellationToken) -> StoreResult<Vec<ObjectMeta>> {
        (**self).list(prefix, cancel).await
    }

    async fn delete(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<()> {
        (**self).delete(key, cancel).await
    }
}
