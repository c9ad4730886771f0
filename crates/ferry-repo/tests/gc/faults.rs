//! A collection stopped at every store call (cancelled, or the call failing with or without
//! its effect) leaves a repository that checks clean, restores, accepts backups, and is
//! fully collected by the next run.

use std::path::PathBuf;
use std::sync::Arc;

use ferry_repo::SnapshotId;
use ferry_repo::gc::{GcOptions, gc};
use ferry_store::{FaultConfig, FaultyStore, MemoryStore, ObjectStore};
use tokio_util::sync::CancellationToken;

use crate::support::*;

struct Sources {
    _dir: tempfile::TempDir,
    b: PathBuf,
    c: PathBuf,
}

fn sources() -> Sources {
    let dir = tempfile::tempdir().unwrap();
    let b = dir.path().join("b");
    let c = tree(&dir.path().join("c"), &[1, 7, 11]);
    let _ = tree(&dir.path().join("a"), &[1, 2, 3, 4, 5, 6]);
    let _ = tree(&b, &[1, 2, 3, 7, 8, 9]);
    Sources { b, c, _dir: dir }
}

fn gc_opts() -> GcOptions {
    GcOptions { repack_dead_fraction: 0.2, ..gc_options() }
}

/// A repository holding snapshot B and forgotten snapshot A.
async fn scenario(src: &Sources) -> (Arc<MemoryStore>, SnapshotId) {
    let mem = Arc::new(MemoryStore::new());
    let repo = init(mem.clone()).await;
    let a = backup(&repo, &src.b.with_file_name("a")).await;
    let b = backup(&repo, &src.b).await;
    ferry_repo::gc::forget(&repo, &[a.snapshot_id], &CancellationToken::new()).await.unwrap();
    (mem, b.snapshot_id)
}

/// After an interrupted collection: a backup, two full collections, then everything checks.
async fn recover_and_verify(mem: Arc<MemoryStore>, sb: &SnapshotId, src: &Sources, what: &str) {
    let repo = open(mem.clone()).await;
    // Right after the interruption: sound and restorable.
    assert_clean(&repo).await;
    assert_restores(&repo, sb, &src.b).await;
    let sc = backup(&repo, &src.c).await;
    gc_until_done(&repo, &gc_opts()).await;
    let last = gc_until_done(&repo, &gc_opts()).await;
    assert!(!last.pending(), "{what}: {last:?}");
    assert_clean(&repo).await;
    assert_restores(&repo, sb, &src.b).await;
    assert_restores(&repo, &sc.snapshot_id, &src.c).await;
    // Distinct live files: 1, 2, 3, 7, 8, 9, 11.
    let live = 7 * FILE as u64;
    let data = data_bytes(mem.as_ref()).await;
    assert!(data < live + live / 3, "{what}: {data} bytes stored for {live} live");
    assert!(mem.list("gc/", &CancellationToken::new()).await.unwrap().is_empty(), "{what}");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_cancelled_at_every_store_call_leaves_a_sound_repository() {
    let src = sources();
    // How many store calls opening and a whole run make.
    let (mem, _) = scenario(&src).await;
    let probe = CancelAt::store(mem.clone(), u64::MAX);
    let repo = open(probe.clone()).await;
    let opened = probe.hook().calls();
    gc(&repo, &gc_opts(), &CancellationToken::new()).await.unwrap();
    let total = probe.hook().calls() - opened;
    assert!(total > 20, "a run makes {total} calls");
    let mut stopped = 0;
    for k in 1..=total {
        let (mem, sb) = scenario(&src).await;
        let cut = CancelAt::store(mem.clone(), opened + k);
        let repo = open(cut.clone()).await;
        if gc(&repo, &gc_opts(), &cut.hook().token).await.is_err() {
            stopped += 1;
        }
        recover_and_verify(mem, &sb, &src, &format!("cancelled at call {k}")).await;
    }
    assert!(stopped > total / 2, "only {stopped} of {total} runs were interrupted");
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn gc_failing_at_every_store_call_leaves_a_sound_repository() {
    let src = sources();
    let (mem, _) = scenario(&src).await;
    let probe = Arc::new(FaultyStore::new(mem.clone(), FaultConfig::new()));
    let repo = open(probe.clone()).await;
    let opened = probe.calls();
    gc(&repo, &gc_opts(), &CancellationToken::new()).await.unwrap();
    let total = probe.calls() - opened;
    let mut failed = 0;
    for k in 1..=total {
        let (mem, sb) = scenario(&src).await;
        let mut config = FaultConfig::new().fail_call(opened + k);
        if k % 2 == 0 {
            // The failing write or delete happens, only its answer is lost.
            config = config.lose_acknowledgements().fail_randomly(0.0, k);
        }
        let faulty = Arc::new(FaultyStore::new(mem.clone(), config));
        let repo = open(faulty.clone()).await;
        if gc(&repo, &gc_opts(), &CancellationToken::new()).await.is_err() {
            failed += 1;
        }
        recover_and_verify(mem, &sb, &src, &format!("failure at call {k}")).await;
    }
    assert!(failed > total / 2, "only {failed} of {total} runs failed");
}
