//! A fault-injecting wrapper for reliability tests.
//!
//! Injected failures are [`StoreError::Unavailable`] errors raised around a call to the
//! wrapped store, never inside it, so they cannot leave a partial object: a failure either
//! happens before the wrapped call (nothing was done) or — when acknowledgement loss is
//! enabled — after a write or delete completed (the effect happened, the caller is told it
//! failed, as when a response is lost on the network).

use std::collections::BTreeSet;
use std::sync::{Mutex, PoisonError};
use std::time::Duration;

use async_trait::async_trait;
use bytes::Bytes;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use tokio_util::sync::CancellationToken;

use crate::cancel::until_cancelled;
use crate::{ObjectKey, ObjectMeta, ObjectStore, PutOutcome, StoreError, StoreResult};

/// Which calls fail, and how slowly calls answer.
#[derive(Debug, Clone, Default)]
pub struct FaultConfig {
    fail_calls: BTreeSet<u64>,
    probability: f64,
    seed: u64,
    latency: Duration,
    lose_acknowledgements: bool,
}

impl FaultConfig {
    /// No faults, no latency.
    #[must_use]
    pub fn new() -> Self {
        Self::default()
    }

    /// Fails the `n`th call (counting from 1, over all operations).
    #[must_use]
    pub fn fail_call(mut self, n: u64) -> Self {
        self.fail_calls.insert(n);
        self
    }

    /// Fails each call with probability `p` (clamped to 0..=1), drawn from an RNG seeded with
    /// `seed` so a run can be repeated exactly.
    #[must_use]
    pub fn fail_randomly(mut self, p: f64, seed: u64) -> Self {
        self.probability = if p.is_nan() { 0.0 } else { p.clamp(0.0, 1.0) };
        self.seed = seed;
        self
    }

    /// Delays every call by `latency` (cancellable).
    #[must_use]
    pub fn latency(mut self, latency: Duration) -> Self {
        self.latency = latency;
        self
    }

    /// Lets a failing write or delete go through before reporting the failure, half of the
    /// time (by the same RNG): the effect happened, the answer was lost.
    #[must_use]
    pub fn lose_acknowledgements(mut self) -> Self {
        self.lose_acknowledgements = true;
        self
    }
}

/// Wraps a store and makes chosen calls fail. See the module docs.
#[derive(Debug)]
pub struct FaultyStore<S> {
    inner: S,
    config: FaultConfig,
    state: Mutex<State>,
}

#[derive(Debug)]
struct State {
    calls: u64,
    injected: u64,
    rng: StdRng,
}

/// What to do with one call.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Fault {
    None,
    Before,
    After,
}

impl<S: ObjectStore> FaultyStore<S> {
    /// Wraps `inner`.
    pub fn new(inner: S, config: FaultConfig) -> Self {
        let rng = StdRng::seed_from_u64(config.seed);
        Self { inner, config, state: Mutex::new(State { calls: 0, injected: 0, rng }) }
    }

    /// The wrapped store, for checking what really happened.
    pub fn inner(&self) -> &S {
        &self.inner
    }

    /// Calls made so far.
    pub fn calls(&self) -> u64 {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).calls
    }

    /// Failures injected so far.
    pub fn injected_failures(&self) -> u64 {
        self.state.lock().unwrap_or_else(PoisonError::into_inner).injected
    }

    fn decide(&self, mutates: bool) -> (u64, Fault) {
        let mut state = self.state.lock().unwrap_or_else(PoisonError::into_inner);
        state.calls += 1;
        let n = state.calls;
        let chosen = self.config.fail_calls.contains(&n)
            || (self.config.probability > 0.0
                && state.rng.random::<f64>() < self.config.probability);
        if !chosen {
            return (n, Fault::None);
        }
        state.injected += 1;
        let after = mutates && self.config.lose_acknowledgements && state.rng.random::<bool>();
        (n, if after { Fault::After } else { Fault::Before })
    }

    /// Runs `call` under the fault plan.
    async fn run<T>(
        &self,
        operation: String,
        mutates: bool,
        cancel: &CancellationToken,
        call: impl Future<Output = StoreResult<T>>,
    ) -> StoreResult<T> {
        let (n, fault) = self.decide(mutates);
        if !self.config.latency.is_zero() {
            until_cancelled(cancel, async {
                tokio::time::sleep(self.config.latency).await;
                Ok(())
            })
            .await?;
        }
        let injected = |when: &str| StoreError::Unavailable {
            location: "fault injector".into(),
            operation: operation.clone(),
            message: format!("injected failure {when} call {n}"),
        };
        match fault {
            Fault::None => call.await,
            Fault::Before => Err(injected("before")),
            Fault::After => {
                call.await?;
                Err(injected("after"))
            }
        }
    }
}

#[async_trait]
impl<S: ObjectStore> ObjectStore for FaultyStore<S> {
    fn location(&self) -> String {
        self.inner.location()
    }

    async fn put_if_absent(
        &self,
        key: &ObjectKey,
        data: Bytes,
        cancel: &CancellationToken,
    ) -> StoreResult<PutOutcome> {
        self.run(format!("put {key}"), true, cancel, self.inner.put_if_absent(key, data, cancel))
            .await
    }

    async fn prepare_creates(&self, cancel: &CancellationToken) -> StoreResult<()> {
        // Outside the fault plan: the plan numbers the caller's own calls, which an open
        // that prepares or not makes alike.
        self.inner.prepare_creates(cancel).await
    }

    async fn get(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<Bytes> {
        self.run(format!("get {key}"), false, cancel, self.inner.get(key, cancel)).await
    }

    async fn get_at_most(
        &self,
        key: &ObjectKey,
        max_bytes: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        let call = self.inner.get_at_most(key, max_bytes, cancel);
        self.run(format!("get {key}"), false, cancel, call).await
    }

    async fn get_range(
        &self,
        key: &ObjectKey,
        offset: u64,
        len: u64,
        cancel: &CancellationToken,
    ) -> StoreResult<Bytes> {
        let call = self.inner.get_range(key, offset, len, cancel);
        self.run(format!("get {key}"), false, cancel, call).await
    }

    async fn head(
        &self,
        key: &ObjectKey,
        cancel: &CancellationToken,
    ) -> StoreResult<Option<ObjectMeta>> {
        self.run(format!("head {key}"), false, cancel, self.inner.head(key, cancel)).await
    }

    async fn list(&self, prefix: &str, cancel: &CancellationToken) -> StoreResult<Vec<ObjectMeta>> {
        self.run(format!("list {prefix}*"), false, cancel, self.inner.list(prefix, cancel)).await
    }

    async fn delete(&self, key: &ObjectKey, cancel: &CancellationToken) -> StoreResult<()> {
        self.run(format!("delete {key}"), true, cancel, self.inner.delete(key, cancel)).await
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::MemoryStore;

    fn key(text: &str) -> ObjectKey {
        ObjectKey::new(text).unwrap_or_else(|e| panic!("{e}"))
    }

    #[tokio::test]
    async fn fails_exactly_the_chosen_call_before_touching_the_store() {
        let store = FaultyStore::new(MemoryStore::new(), FaultConfig::new().fail_call(2));
        let cancel = CancellationToken::new();
        assert!(store.put_if_absent(&key("a"), "1".into(), &cancel).await.is_ok());
        let second = store.put_if_absent(&key("b"), "2".into(), &cancel).await;
        assert!(matches!(second, Err(ref e) if e.is_retryable()), "{second:?}");
        assert_eq!(
            store.inner().head(&key("b"), &cancel).await.unwrap_or_else(|e| panic!("head: {e}")),
            None,
            "the failed put wrote nothing"
        );
        assert!(store.put_if_absent(&key("b"), "2".into(), &cancel).await.is_ok());
        assert_eq!((store.calls(), store.injected_failures()), (3, 1));
    }

    #[tokio::test]
    async fn same_seed_same_failures() {
        let cancel = CancellationToken::new();
        let mut runs = Vec::new();
        for _ in 0..2 {
            let store =
                FaultyStore::new(MemoryStore::new(), FaultConfig::new().fail_randomly(0.5, 7));
            let mut pattern = Vec::new();
            for _ in 0..64 {
                pattern.push(store.list("", &cancel).await.is_err());
            }
            runs.push(pattern);
        }
        assert_eq!(runs[0], runs[1]);
        let failures = runs[0].iter().filter(|f| **f).count();
        assert!((10..54).contains(&failures), "{failures} of 64 failed at p=0.5");
    }

    #[tokio::test]
    async fn latency_is_cancellable() {
        let store = FaultyStore::new(
            MemoryStore::new(),
            FaultConfig::new().latency(Duration::from_secs(3600)),
        );
        let cancel = CancellationToken::new();
        let trigger = cancel.clone();
        tokio::spawn(async move {
            tokio::time::sleep(Duration::from_millis(20)).await;
            trigger.cancel();
        });
        let result = store.get(&key("a"), &cancel).await;
        assert!(matches!(result, Err(StoreError::Cancelled)), "{result:?}");
    }
}
