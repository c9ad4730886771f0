//! A wrapper that lets a test watch or pace the calls made to a store.
//!
//! [`Hooked`] forwards every call to the wrapped store unchanged; its [`Hook`] is told of the
//! call before it is made (and may hold it there, e.g. at a gate) and after it returned.

use std::sync::Arc;

use async_trait::async_trait;
use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::{ObjectKey, ObjectMeta, ObjectStore, PutOutcome, StoreResult};

/// One call to a store, as a [`Hook`] sees it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Call<'a> {
    /// `put_if_absent`.
    Put(&'a ObjectKey),
    /// `get`: a whole read, uncapped.
    Get(&'a ObjectKey),
    /// `get_at_most`: a whole read capped at the given number of bytes.
    GetAtMost(&'a ObjectKey, u64),
    /// `get_range`: the offset and length asked for.
    GetRange(&'a ObjectKey, u64, u64),
    /// `head`.
    Head(&'a ObjectKey),
    /// `list`, with its prefix.
    List(&'a str),
    /// `delete`.
    Delete(&'a ObjectKey),
}

impl<'a> Call<'a> {
    /// The object's key, or the prefix listed.
    #[must_use]
    pub fn key(&self) -> &str {
        match self {
            Self::Put(k)
            | Self::Get(k)
            | Self::GetAtMost(k, _)
            | Self::GetRange(k, _, _)
            | Self::Head(k)
            | Self::Delete(k) => k.as_str(),
            Self::List(prefix) => prefix,
        }
    }

    /// The object's key when this is a whole read, capped or not.
    #[must_use]
    pub fn whole_read(&self) -> Option<&'a ObjectKey> {
        match *self {
            Self::Get(k) | Self::GetAtMost(k, _) => Some(k),
            _ => None,
        }
    }
}

/// What a [`Hooked`] store tells of its calls. Both methods do nothing by default.
#[async_trait]
pub trait Hook: Send + Sync + std::fmt::Debug {
    /// Before the call is forwarded; the call waits until this returns.
    async fn before(&self, _call: Call<'_>) {}
    /// After the wrapped store answered, whether it succeeded or not.
    fn after(&self, _call: Call<'_>, _ok: bool) {}
}

/// Forwards every call to `inner`, telling `hook` before and after.
#[derive(Debug)]
pub struct Hooked<H> {
    inner: Arc<dyn ObjectStore>,
    hook: H,
}

impl<H: Hook> Hooked<H> {
    /// Wraps `inner`.
    pub fn new(inner: Arc<dyn ObjectStore>, hook: H) -> Self {
        Self { inner, hook }
    }

    /// The hook, to read what it recorded.
    pub fn hook(&self) -> &H {
        &self.hook
    }

    /// Runs `forward` (the call to the wrapped store) only once the hook let it through.
    async fn around<T, F>(&self, call: Call<'_>, forward: impl FnOnce() -> F) -> StoreResult<T>
    where
        F: std::future::Future<Output = StoreResult<T>>,
    {
        self.hook.before(call).await;
        let out = forward().await;
        self.hook.after(call, out.is_ok());
        out
    }
}

#[async_trait]
impl<H: Hook> ObjectStore for Hooked<H> {
    fn location(&self) -> String {
        self.inner.location()
    }

    async fn put_if_absent(
        &self,
        key: &ObjectKey,
        data: Bytes,
        cancel: &CancellationToken,
    ) -> StoreResult<PutOutcome> {
        self.around(Call::Put(key), || self.inner.put_if_absent(key, data, cancel)).await
    }

    async fn prepare_creates(&self, cancel: &CancellationToken) -> StoreResult<()> {
        // Not a call of its own to the hook: what it sends (if anything) is the wrapped
        // store's business, and the calls a hook counts stay the caller's.
        self.inner.prepare_creates(cancel).await
    }

    async fn get(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<Bytes> {
        self.around(Call::Get(key), || self.inner.get(key, cancel)).await
    }

    async fn get_at_most(
        &self,
        key: &ObjectKey,
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        let call = Call::GetAtMost(key, max_bytes);
        self.around(call, || self.inner.get_at_most(key, max_bytes, cancel)).await
    }

    async fn get_range(
        &self,
        key: &ObjectKey,
        offset: u64,
        len: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        let call = Call::GetRange(key, offset, len);
        self.around(call, || self.inner.get_range(key, offset, len, cancel)).await
    }

    async fn head(
        &self,
        key: &ObjectKey,
        cancel: &CancellationToken,
    ) -> StoreResult<Option<ObjectMeta>> {
        self.around(Call::Head(key), || self.inner.head(key, cancel)).await
    }

    async fn list(&self, prefix: &str, cancel: &CancellationToken) -> StoreResult<Vec<ObjectMeta>> {
        self.around(Call::List(prefix), || self.inner.list(prefix, cancel)).await
    }

    async fn delete(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<()> {
        self.around(Call::Delete(key), || self.inner.delete(key, cancel)).await
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use std::sync::Mutex;

    use super::*;
    use crate::MemoryStore;

    #[derive(Debug, Default)]
    struct Log(Mutex<Vec<String>>);

    #[async_trait]
    impl Hook for Log {
        async fn before(&self, call: Call<'_>) {
            self.0.lock().unwrap().push(format!("before {call:?}"));
        }
        fn after(&self, call: Call<'_>, ok: bool) {
            self.0.lock().unwrap().push(format!("after {} {ok}", call.key()));
        }
    }

    #[test]
    fn whole_reads_capped_or_not_are_told_apart() {
        let k = ObjectKey::new("a").unwrap();
        assert_eq!(Call::Get(&k).whole_read(), Some(&k));
        assert_eq!(Call::GetAtMost(&k, 5).whole_read(), Some(&k));
        assert_eq!(Call::GetAtMost(&k, 5).key(), "a");
        assert_eq!(Call::GetRange(&k, 0, 1).whole_read(), None);
        assert_eq!(Call::Head(&k).whole_read(), None);
        assert_eq!(Call::List("a").whole_read(), None);
    }

    #[tokio::test]
    async fn calls_are_forwarded_and_reported_in_order() {
        let dir = tempfile::tempdir().unwrap();
        let fs: Arc<dyn ObjectStore> = Arc::new(crate::FsStore::open(dir.path()).unwrap());
        let hooked_fs = Hooked::new(Arc::clone(&fs), Log::default());
        assert_eq!(hooked_fs.location(), fs.location(), "errors name the wrapped store");
        assert!(hooked_fs.location().contains(&dir.path().display().to_string()));
        let store = Hooked::new(Arc::new(MemoryStore::new()), Log::default());
        let cancel = CancellationToken::new();
        let key = ObjectKey::new("data/ab/cd").unwrap();
        store.put_if_absent(&key, Bytes::from_static(b"xyz"), &cancel).await.unwrap();
        assert_eq!(store.get(&key, &cancel).await.unwrap(), Bytes::from_static(b"xyz"));
        assert!(store.get_at_most(&key, 2, &cancel).await.is_err());
        assert_eq!(store.get_range(&key, 1, 1, &cancel).await.unwrap(), Bytes::from_static(b"y"));
        assert_eq!(store.list("data/", &cancel).await.unwrap().len(), 1);
        store.delete(&key, &cancel).await.unwrap();
        assert!(store.head(&key, &cancel).await.unwrap().is_none());
        assert!(store.get(&key, &cancel).await.is_err());
        let log = store.hook().0.lock().unwrap().clone();
        assert_eq!(
            log,
            [
                "before Put(ObjectKey(\"data/ab/cd\"))",
                "after data/ab/cd true",
                "before Get(ObjectKey(\"data/ab/cd\"))",
                "after data/ab/cd true",
                "before GetAtMost(ObjectKey(\"data/ab/cd\"), 2)",
                "after data/ab/cd false",
                "before GetRange(ObjectKey(\"data/ab/cd\"), 1, 1)",
                "after data/ab/cd true",
                "before List(\"data/\")",
                "after data/ true",
                "before Delete(ObjectKey(\"data/ab/cd\"))",
                "after data/ab/cd true",
                "before Head(ObjectKey(\"data/ab/cd\"))",
                "after data/ab/cd true",
                "before Get(ObjectKey(\"data/ab/cd\"))",
                "after data/ab/cd false",
            ]
        );
    }
}
