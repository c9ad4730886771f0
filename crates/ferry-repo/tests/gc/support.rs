//! Helpers for the garbage-collection tests: trees, stores that pause or cancel, checks.
#![allow(dead_code, clippy::unwrap_used)]

use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::sync::atomic::{AtomicU64, Ordering};
use std::time::Duration;

use async_trait::async_trait;
use ferry_repo::gc::{GcOptions, GcReport};
use ferry_repo::{
    BackupOptions, CheckOptions, InitOptions, KdfParams, RepoError, Repository, RestoreOptions,
    SnapshotId, backup_tree, check, restore,
};
use ferry_store::{Call, Hook, Hooked, ObjectStore};
use tokio::sync::watch;
use tokio_util::sync::CancellationToken;

pub const FILE: usize = 400 << 10;

pub fn options() -> InitOptions {
    let mut o = InitOptions { kdf: KdfParams::insecure_for_tests(), ..InitOptions::default() };
    o.packs.target_size = 1 << 20;
    o
}

pub fn gc_options() -> GcOptions {
    GcOptions {
        wait: Duration::from_secs(20),
        poll: Duration::from_millis(100),
        max_clock_skew: Duration::ZERO,
        lock_ttl: Duration::from_secs(1),
        repack_min_dead_bytes: 0,
        index_entries_per_file: 5,
        ..GcOptions::default()
    }
}

pub fn noise(len: usize, seed: u8) -> Vec<u8> {
    let mut v = vec![0u8; len];
    blake3::Hasher::new_keyed(&[seed; 32]).finalize_xof().fill(&mut v);
    v
}

/// Writes files `f<seed>` with `FILE` bytes of noise each under `root`.
pub fn tree(root: &Path, seeds: &[u8]) -> PathBuf {
    std::fs::create_dir_all(root.join("sub")).unwrap();
    for s in seeds {
        let dir = if s % 2 == 0 { root.join("sub") } else { root.to_path_buf() };
        std::fs::write(dir.join(format!("f{s}")), noise(FILE, *s)).unwrap();
    }
    root.to_path_buf()
}

pub async fn init(store: Arc<dyn ObjectStore>) -> Repository {
    Repository::init(store, b"secret", &options(), &CancellationToken::new()).await.unwrap().0
}

pub async fn open(store: Arc<dyn ObjectStore>) -> Repository {
    Repository::open(store, b"secret", &CancellationToken::new()).await.unwrap()
}

pub async fn backup(repo: &Repository, path: &Path) -> ferry_repo::BackupSummary {
    let o = BackupOptions { threads: 2, ..BackupOptions::default() };
    backup_tree(repo, path, &o, None, &CancellationToken::new()).await.unwrap()
}

/// Sum of the sizes of every stored object.
pub async fn stored_bytes(store: &dyn ObjectStore) -> u64 {
    store.list("", &CancellationToken::new()).await.unwrap().iter().map(|m| m.size).sum()
}

pub async fn data_bytes(store: &dyn ObjectStore) -> u64 {
    store.list("data/", &CancellationToken::new()).await.unwrap().iter().map(|m| m.size).sum()
}

/// `check --read-data` finds nothing wrong.
pub async fn assert_clean(repo: &Repository) {
    let report = check(
        repo,
        CheckOptions { read_data: true, subset: None },
        None,
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(report.is_ok(), "check found problems: {:#?}", report.problems);
}

/// Restores `id` and compares every regular file with `source`, byte for byte.
pub async fn assert_restores(repo: &Repository, id: &SnapshotId, source: &Path) {
    let target = tempfile::tempdir().unwrap();
    restore(repo, id, target.path(), &RestoreOptions::default(), None, &CancellationToken::new())
        .await
        .unwrap();
    compare(source, target.path());
}

pub fn compare(a: &Path, b: &Path) {
    let mut names: Vec<_> = std::fs::read_dir(a).unwrap().map(|e| e.unwrap().file_name()).collect();
    names.sort();
    let mut other: Vec<_> = std::fs::read_dir(b).unwrap().map(|e| e.unwrap().file_name()).collect();
    other.sort();
    assert_eq!(names, other, "entries of {}", a.display());
    for n in names {
        let (x, y) = (a.join(&n), b.join(&n));
        if x.is_dir() {
            compare(&x, &y);
        } else {
            assert!(std::fs::read(&x).unwrap() == std::fs::read(&y).unwrap(), "{}", x.display());
        }
    }
}

/// Runs `gc` until it is not refused by a lock left behind by an interrupted run.
pub async fn gc_until_done(repo: &Repository, options: &GcOptions) -> GcReport {
    for _ in 0..100 {
        match ferry_repo::gc::gc(repo, options, &CancellationToken::new()).await {
            Ok(r) => return r,
            Err(RepoError::Gc { step: "lock", .. }) => {
                tokio::time::sleep(Duration::from_millis(250)).await;
            }
            Err(e) => panic!("gc failed: {e}"),
        }
    }
    panic!("gc lock never freed");
}

/// Holds writes (or reads) of keys under a prefix until the gate opens (a [`Hook`]).
#[derive(Debug)]
pub struct Gate {
    prefix: String,
    reads: bool,
    open: watch::Sender<bool>,
    pub arrived: watch::Sender<u64>,
}

impl Gate {
    /// `inner` with a closed gate in front of writes under `prefix`.
    pub fn store(inner: Arc<dyn ObjectStore>, prefix: &str) -> Arc<Hooked<Self>> {
        Self::new(inner, prefix, false)
    }

    /// `inner` with a closed gate in front of reads (whole or ranged) under `prefix`.
    pub fn reads(inner: Arc<dyn ObjectStore>, prefix: &str) -> Arc<Hooked<Self>> {
        Self::new(inner, prefix, true)
    }

    fn new(inner: Arc<dyn ObjectStore>, prefix: &str, reads: bool) -> Arc<Hooked<Self>> {
        let gate = Self {
            prefix: prefix.to_owned(),
            reads,
            open: watch::Sender::new(false),
            arrived: watch::Sender::new(0),
        };
        Arc::new(Hooked::new(inner, gate))
    }

    pub fn open(&self) {
        self.open.send_replace(true);
    }

    /// Waits (bounded) until `n` calls are held at the gate.
    pub async fn wait_arrivals(&self, n: u64) {
        let mut rx = self.arrived.subscribe();
        tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|v| *v >= n))
            .await
            .expect("writer reached the gate in time")
            .unwrap();
    }
}

#[async_trait]
impl Hook for Gate {
    async fn before(&self, call: Call<'_>) {
        let held = if self.reads {
            matches!(call, Call::Get(_) | Call::GetAtMost(..) | Call::GetRange(..))
        } else {
            matches!(call, Call::Put(_))
        };
        if held && call.key().starts_with(&self.prefix) {
            self.arrived.send_modify(|v| *v += 1);
            let mut rx = self.open.subscribe();
            let _ = tokio::time::timeout(Duration::from_secs(120), rx.wait_for(|o| *o)).await;
        }
    }
}

/// Cancels a token when the store's `n`th call starts (the call then sees it); a [`Hook`].
#[derive(Debug)]
pub struct CancelAt {
    calls: AtomicU64,
    at: u64,
    pub token: CancellationToken,
}

impl CancelAt {
    /// `inner`, counting its calls and cancelling at call `at`.
    pub fn store(inner: Arc<dyn ObjectStore>, at: u64) -> Arc<Hooked<Self>> {
        let hook = Self { calls: AtomicU64::new(0), at, token: CancellationToken::new() };
        Arc::new(Hooked::new(inner, hook))
    }

    pub fn calls(&self) -> u64 {
        self.calls.load(Ordering::SeqCst)
    }
}

#[async_trait]
impl Hook for CancelAt {
    async fn before(&self, _call: Call<'_>) {
        if self.calls.fetch_add(1, Ordering::SeqCst) + 1 == self.at {
            self.token.cancel();
        }
    }
}
