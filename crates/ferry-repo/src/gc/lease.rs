//! Leases: small objects that announce a running backup, restore or garbage collection.
//!
//! A lease is the key `<prefix><holder>-<expires>` (holder: 32 hex digits drawn at random,
//! expires: Unix seconds, 20 digits). The store cannot overwrite, so a refresh creates the key
//! with a later expiry and then deletes the previous one; a holder is alive while its newest
//! key has not expired. Everything a reader needs is in the key, so one listing shows every
//! holder and its expiry. The content is informational only (host name and purpose).
//!
//! The holder also keeps a monotonic deadline: it may commit (write an index file or a
//! snapshot) only before `refresh start + ttl - ttl/5`; after that garbage collection may
//! already treat it as dead, and [`LeaseCheck::check`] fails with
//! [`RepoError::LeaseLapsed`].

use std::collections::HashMap;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use bytes::Bytes;
use ferry_store::{ObjectKey, ObjectMeta};
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::repo::{Repository, hostname, unix_now};

/// Prefix of backup and restore leases.
pub(crate) const WRITERS: &str = "locks/";
/// Prefix of the garbage collector's lock leases.
pub(crate) const GC_LOCK: &str = "gc/lock-";

/// A holder's identity.
pub(crate) type HolderId = [u8; 16];

/// A held lease, refreshed in the background until released.
#[derive(Debug)]
pub(crate) struct Lease {
    state: Arc<State>,
    stop: CancellationToken,
    refresher: Option<tokio::task::JoinHandle<()>>,
}

#[derive(Debug)]
struct State {
    repo: Repository,
    prefix: &'static str,
    holder: HolderId,
    ttl: Duration,
    what: &'static str,
    current: Mutex<Current>,
}

#[derive(Debug, Clone)]
struct Current {
    key: Option<ObjectKey>,
    valid_until: Instant,
}

/// A cheap handle that tells whether the lease still allows commits.
#[derive(Debug, Clone)]
pub(crate) struct LeaseCheck(Arc<State>);

impl LeaseCheck {
    /// Fails once the lease may have been given up by garbage collection.
    pub(crate) fn check(&self) -> RepoResult<()> {
        let current =
            self.0.current.lock().map(|c| c.clone()).map_err(|_| RepoError::Internal {
                what: "lease",
                reason: "lock poisoned".into(),
            })?;
        if Instant::now() < current.valid_until {
            return Ok(());
        }
        Err(RepoError::LeaseLapsed {
            what: self.0.what,
            key: current.key.map(|k| k.to_string()).unwrap_or_default(),
        })
    }
}

fn lease_key(prefix: &str, holder: &HolderId, expires: i64) -> RepoResult<ObjectKey> {
    ObjectKey::new(format!("{prefix}{}-{:020}", hex::encode(holder), expires.max(0)))
        .map_err(|e| RepoError::Internal { what: "lease key", reason: e.to_string() })
}

/// Parses a listed lease key: holder and expiry.
pub(crate) fn parse_lease(prefix: &str, key: &str) -> Option<(HolderId, i64)> {
    let rest = key.strip_prefix(prefix)?;
    let (holder, expires) = rest.split_once('-')?;
    let mut id = [0u8; 16];
    hex::decode_to_slice(holder, &mut id).ok()?;
    if expires.len() != 20 || !expires.bytes().all(|b| b.is_ascii_digit()) {
        return None;
    }
    Some((id, expires.parse().ok()?))
}

/// Holders whose newest lease has not expired, allowing `skew` for clock differences.
pub(crate) fn live_holders(
    prefix: &str,
    listed: &[ObjectMeta],
    now: i64,
    skew: Duration,
) -> HashMap<HolderId, i64> {
    let horizon = horizon(now, skew);
    let skew = i64::try_from(skew.as_secs()).unwrap_or(i64::MAX);
    let mut newest: HashMap<HolderId, i64> = HashMap::new();
    for meta in listed {
        if let Some((holder, expires)) = parse_lease(prefix, meta.key.as_str()) {
            if expires > horizon {
                tracing::warn!(lease = %meta.key, expires, "ignoring a lease that expires implausibly far ahead (not written by a running Ferry, or a clock far ahead)");
                continue;
            }
            let e = newest.entry(holder).or_insert(expires);
            *e = (*e).max(expires);
        }
    }
    newest.retain(|_, expires| expires.saturating_add(skew) >= now);
    newest
}

/// The latest expiry a lease written now may carry: now + [`crate::gc::MAX_LEASE_TTL`] + skew.
fn horizon(now: i64, skew: Duration) -> i64 {
    let ahead = crate::gc::MAX_LEASE_TTL.saturating_add(skew).as_secs();
    now.saturating_add(i64::try_from(ahead).unwrap_or(i64::MAX))
}

/// Lease keys whose expiry lies beyond what any holder writes (see [`live_holders`]).
pub(crate) fn implausible(
    prefix: &str,
    listed: &[ObjectMeta],
    now: i64,
    skew: Duration,
) -> Vec<ObjectKey> {
    let horizon = horizon(now, skew);
    listed
        .iter()
        .filter(|m| parse_lease(prefix, m.key.as_str()).is_some_and(|(_, e)| e > horizon))
        .map(|m| m.key.clone())
        .collect()
}

/// Lease keys that expired long ago (more than `skew` past their expiry).
pub(crate) fn expired_keys(
    prefix: &str,
    listed: &[ObjectMeta],
    now: i64,
    skew: Duration,
) -> Vec<ObjectKey> {
    let skew = i64::try_from(skew.as_secs()).unwrap_or(i64::MAX);
    listed
        .iter()
        .filter(|m| {
            parse_lease(prefix, m.key.as_str()).is_some_and(|(_, e)| e.saturating_add(skew) < now)
        })
        .map(|m| m.key.clone())
        .collect()
}

impl Lease {
    /// Creates a lease under `prefix` and starts refreshing it every `ttl / 3`.
    ///
    /// # Errors
    /// Store failures.
    pub(crate) async fn acquire(
        repo: &Repository,
        prefix: &'static str,
        what: &'static str,
        ttl: Duration,
        cancel: &CancellationToken,
    ) -> RepoResult<Self> {
        let ttl = ttl.clamp(Duration::from_secs(1), crate::gc::MAX_LEASE_TTL);
        let mut holder = [0u8; 16];
        rand::RngCore::fill_bytes(&mut rand::rng(), &mut holder);
        let state = Arc::new(State {
            repo: repo.clone(),
            prefix,
            holder,
            ttl,
            what,
            current: Mutex::new(Current { key: None, valid_until: Instant::now() }),
        });
        put(&state, cancel).await?;
        let stop = CancellationToken::new();
        let refresher = tokio::spawn(refresh_loop(Arc::clone(&state), stop.clone()));
        Ok(Self { state, stop, refresher: Some(refresher) })
    }

    /// [`Lease::acquire`] for a restore, with `preload` running meanwhile (over a network the
    /// lease's write costs a round trip, which then overlaps the preload's).
    ///
    /// `preload` must only read what garbage collection never deletes (a snapshot manifest:
    /// only `forget` removes one). The index must be loaded after this returns, under the
    /// lease, as `FORMAT.md` (*Garbage collection*) requires.
    ///
    /// Both run to their end, and the lease is released when `preload` fails. (As with
    /// [`Lease::acquire`], a write that lands after this future is dropped leaves a key that
    /// only expires.)
    ///
    /// # Errors
    /// The lease's failure first (as if it had been taken before anything was read), else
    /// `preload`'s.
    pub(crate) async fn acquire_while<T>(
        repo: &Repository,
        what: &'static str,
        preload: impl std::future::Future<Output = RepoResult<T>>,
        cancel: &CancellationToken,
    ) -> RepoResult<(Self, T)> {
        let acquire = Self::acquire(repo, WRITERS, what, repo.lease_ttl(), cancel);
        match tokio::join!(acquire, preload) {
            (Err(e), _) => Err(e),
            (Ok(lease), Err(e)) => {
                lease.release().await;
                Err(e)
            }
            (Ok(lease), Ok(loaded)) => Ok((lease, loaded)),
        }
    }

    pub(crate) fn holder(&self) -> HolderId {
        self.state.holder
    }

    pub(crate) fn checker(&self) -> LeaseCheck {
        LeaseCheck(Arc::clone(&self.state))
    }

    /// Stops refreshing and deletes the lease (best effort: a leftover key just expires).
    pub(crate) async fn release(mut self) {
        self.stop.cancel();
        if let Some(task) = self.refresher.take() {
            let _ = task.await;
        }
        let key = self.state.current.lock().ok().and_then(|mut c| c.key.take());
        if let Some(key) = key {
            let _ = self.state.repo.store().delete(&key, &CancellationToken::new()).await;
        }
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.stop.cancel();
        let key = self.state.current.lock().ok().and_then(|mut c| c.key.take());
        if let (Some(key), Ok(handle)) = (key, tokio::runtime::Handle::try_current()) {
            let store = std::sync::Arc::clone(self.state.repo.store());
            handle.spawn(async move {
                let _ = store.delete(&key, &CancellationToken::new()).await;
            });
        }
    }
}

/// Creates the next lease key, then deletes the previous one.
async fn put(state: &State, cancel: &CancellationToken) -> RepoResult<()> {
    let started = Instant::now();
    let ttl_secs = i64::try_from(state.ttl.as_secs()).unwrap_or(i64::MAX);
    let key = lease_key(state.prefix, &state.holder, unix_now().saturating_add(ttl_secs))?;
    let body = format!("ferry {} lease, host {}\n", state.what, hostname());
    state
        .repo
        .store()
        .put_if_absent(&key, Bytes::from(body), cancel)
        .await
        .map_err(|e| RepoError::store("write lease", &key, e))?;
    let previous = {
        let mut c = state
            .current
            .lock()
            .map_err(|_| RepoError::Internal { what: "lease", reason: "lock poisoned".into() })?;
        c.valid_until = started + state.ttl - state.ttl / 5;
        c.key.replace(key.clone()).filter(|old| *old != key)
    };
    if let Some(old) = previous {
        let _ = state.repo.store().delete(&old, cancel).await;
    }
    Ok(())
}

async fn refresh_loop(state: Arc<State>, stop: CancellationToken) {
    let mut wait = state.ttl / 3;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            () = tokio::time::sleep(wait) => {}
        }
        // Store calls are not cancelled by `stop`, so a refresh never leaves an unknown key.
        match put(&state, &CancellationToken::new()).await {
            Ok(()) => wait = state.ttl / 3,
            Err(e) => {
                tracing::warn!(error = %e, what = state.what, "lease refresh failed; retrying");
                wait = (state.ttl / 20).max(Duration::from_millis(200));
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn meta(key: &str) -> ObjectMeta {
        ObjectMeta { key: ObjectKey::new(key).unwrap(), size: 1 }
    }

    #[test]
    fn keys_round_trip_and_liveness_honours_skew() {
        let key = lease_key(WRITERS, &[7; 16], 1000).unwrap();
        assert_eq!(parse_lease(WRITERS, key.as_str()), Some(([7; 16], 1000)));
        assert_eq!(parse_lease(WRITERS, "locks/zz-00000000000000001000"), None);
        assert_eq!(parse_lease(WRITERS, "locks/07070707070707070707070707070707-1000"), None);
        let listed = vec![
            meta(key.as_str()),
            meta(lease_key(WRITERS, &[7; 16], 500).unwrap().as_str()),
            meta(lease_key(WRITERS, &[8; 16], 500).unwrap().as_str()),
        ];
        let skew = Duration::from_secs(100);
        let live = live_holders(WRITERS, &listed, 1050, skew);
        assert_eq!(live.get(&[7; 16]), Some(&1000), "newest key counts");
        assert!(!live.contains_key(&[8; 16]));
        assert!(live_holders(WRITERS, &listed, 599, skew).contains_key(&[8; 16]), "skew allowance");
        assert_eq!(expired_keys(WRITERS, &listed, 1050, skew).len(), 2);
    }

    #[test]
    fn a_lease_expiring_implausibly_far_ahead_holds_nothing_and_is_reported() {
        let skew = Duration::from_secs(120);
        let now = 1_000_000;
        let longest = now + (crate::gc::MAX_LEASE_TTL + skew).as_secs() as i64;
        let listed = vec![
            meta(lease_key(WRITERS, &[1; 16], longest).unwrap().as_str()),
            // Forged to expire in the year 33658: it would block every sweep for ever.
            meta(lease_key(WRITERS, &[2; 16], 999_999_999_999).unwrap().as_str()),
            // A holder whose newest key is forged keeps only its plausible one.
            meta(lease_key(WRITERS, &[3; 16], now - 1000).unwrap().as_str()),
            meta(lease_key(WRITERS, &[3; 16], longest + 1).unwrap().as_str()),
        ];
        let live = live_holders(WRITERS, &listed, now, skew);
        assert!(live.contains_key(&[1; 16]), "the longest lease a holder writes counts");
        assert!(!live.contains_key(&[2; 16]) && !live.contains_key(&[3; 16]), "{live:?}");
        let reported = implausible(WRITERS, &listed, now, skew);
        assert_eq!(reported, vec![listed[1].key.clone(), listed[3].key.clone()]);
    }
}
