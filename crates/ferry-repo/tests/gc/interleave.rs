//! Backups, forgets, collections and checks interleaved step by step, and all at once.

use std::sync::Arc;
use std::time::Duration;

use ferry_repo::gc::{SweepReport, forget, gc, gc_mark, gc_sweep};
use ferry_repo::{RestoreOptions, restore};
use ferry_store::{Call, FsStore, Hook, Hooked, ObjectKey, ObjectStore};
use tokio_util::sync::CancellationToken;

use crate::support::*;

fn fs_store(dir: &std::path::Path) -> Arc<dyn ObjectStore> {
    std::fs::create_dir_all(dir).unwrap();
    Arc::new(FsStore::open(dir).unwrap())
}

/// A backup that loaded the index before the mark and deduplicated against a forgotten
/// snapshot's chunks holds the sweep back, and its chunks are revived, not deleted. A backup
/// that starts after the mark stores condemned chunks again instead of relying on them.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_running_across_gc_keeps_every_chunk_it_needs() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(&dir.path().join("repo"));
    let repo = init(Arc::clone(&store)).await;
    let a = tree(&dir.path().join("a"), &[1, 2, 3, 4]);
    let c = tree(&dir.path().join("c"), &[1, 10]);
    let sa = backup(&repo, &a).await;
    forget(&repo, &[sa.snapshot_id], &CancellationToken::new()).await.unwrap();

    // W1: backs up the same data, dedups everything, and stops at its snapshot write.
    let gate = Gate::store(Arc::clone(&store), "snapshots/");
    let gated = open(gate.clone()).await;
    let w1 = {
        let (gated, a) = (gated.clone(), a.clone());
        tokio::spawn(async move { backup(&gated, &a).await })
    };
    gate.hook().wait_arrivals(1).await;

    let options = gc_options();
    let cancel = CancellationToken::new();
    let mark = gc_mark(&repo, &options, &cancel).await.unwrap();
    assert!(mark.condemned_packs >= 1 && mark.writers == 1, "{mark:?}");
    assert_eq!(
        gc_sweep(&repo, &options, &cancel).await.unwrap(),
        SweepReport::Waiting { writers: 1 }
    );
    // A second mark is refused while this one is pending.
    assert!(gc_mark(&repo, &options, &cancel).await.unwrap().pending);

    // W2 starts after the mark: file 1 is only in condemned packs, so it is stored again.
    let w2 = backup(&open(Arc::clone(&store)).await, &c).await;
    assert_eq!(w2.bytes_new, w2.bytes_total, "nothing deduplicated against condemned packs");
    assert_eq!(
        gc_sweep(&repo, &options, &cancel).await.unwrap(),
        SweepReport::Waiting { writers: 1 }
    );

    gate.hook().open();
    let w1 = w1.await.unwrap();
    assert_eq!(w1.bytes_new, 0, "W1 loaded the index before the mark and reused everything");
    let swept = gc_sweep(&repo, &options, &cancel).await.unwrap();
    let SweepReport::Swept(stats) = swept else { panic!("{swept:?}") };
    assert!(stats.revived_packs >= 1, "W1's snapshot needs the condemned packs: {stats:?}");
    assert_clean(&repo).await;
    assert_restores(&repo, &w1.snapshot_id, &a).await;
    assert_restores(&repo, &w2.snapshot_id, &c).await;
    // Once W1's snapshot is forgotten as well, its data goes: files 2, 3 and 4, also from a
    // pack that holds them beside the copy of file 1 the index resolves to (how blobs happened to
    // be placed decides how dead such a pack is: at least a quarter, rewritten at this fraction).
    let before = data_bytes(store.as_ref()).await;
    forget(&repo, &[w1.snapshot_id], &cancel).await.unwrap();
    let options = ferry_repo::gc::GcOptions { repack_dead_fraction: 0.2, ..options };
    let report = gc(&repo, &options, &cancel).await.unwrap();
    assert!(matches!(report.sweep, SweepReport::Swept(_)), "{report:?}");
    assert!(before - data_bytes(store.as_ref()).await >= 3 * FILE as u64);
    assert_clean(&repo).await;
    assert_restores(&repo, &w2.snapshot_id, &c).await;
}

/// A backup that died holding a lease blocks the sweep until the lease expires, no longer.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_crashed_writer_blocks_the_sweep_only_until_its_lease_expires() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(&dir.path().join("repo"));
    let repo = init(Arc::clone(&store)).await;
    let s = backup(&repo, &tree(&dir.path().join("a"), &[1, 2])).await;
    forget(&repo, &[s.snapshot_id], &CancellationToken::new()).await.unwrap();
    // What a killed backup leaves: a lease that nobody refreshes.
    let now = std::time::SystemTime::now().duration_since(std::time::UNIX_EPOCH).unwrap();
    let expires = now.as_secs() + 3;
    let key = ObjectKey::new(format!("locks/{}-{expires:020}", "ab".repeat(16))).unwrap();
    store.put_if_absent(&key, "crashed".into(), &CancellationToken::new()).await.unwrap();

    let mut options = gc_options();
    options.wait = Duration::ZERO;
    let first = gc(&repo, &options, &CancellationToken::new()).await.unwrap();
    assert!(first.pending(), "{first:?}");
    assert!(data_bytes(store.as_ref()).await > 0);
    options.wait = Duration::from_secs(30);
    let second = gc(&repo, &options, &CancellationToken::new()).await.unwrap();
    assert!(matches!(second.earlier, Some(SweepReport::Swept(_))), "{second:?}");
    assert_eq!(data_bytes(store.as_ref()).await, 0);
    assert!(
        store.head(&key, &CancellationToken::new()).await.unwrap().is_none(),
        "stale lease removed"
    );
    assert_clean(&repo).await;
}

/// A lease forged (or written by a clock far ahead) to expire years from now holds nothing:
/// garbage collection sweeps at once and reports the lease instead of waiting for ever.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_lease_expiring_implausibly_far_ahead_is_ignored_and_reported() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(&dir.path().join("repo"));
    let repo = init(Arc::clone(&store)).await;
    let s = backup(&repo, &tree(&dir.path().join("a"), &[1, 2])).await;
    forget(&repo, &[s.snapshot_id], &CancellationToken::new()).await.unwrap();
    let forged =
        ObjectKey::new(format!("locks/{}-{:020}", "cd".repeat(16), 99_999_999_999u64)).unwrap();
    store.put_if_absent(&forged, "forged".into(), &CancellationToken::new()).await.unwrap();
    let mut options = gc_options();
    options.wait = Duration::ZERO;
    let report = gc(&repo, &options, &CancellationToken::new()).await.unwrap();
    assert!(!report.pending(), "the forged lease held the sweep: {report:?}");
    assert_eq!(report.ignored_leases, vec![forged.as_str().to_owned()]);
    assert_eq!(data_bytes(store.as_ref()).await, 0);
    assert_clean(&repo).await;
}

/// Several backups, forgets and collections at the same time on one repository; afterwards
/// every remaining snapshot is intact and everything forgotten is gone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn concurrent_backups_forgets_and_collections() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(&dir.path().join("repo"));
    let repo = init(Arc::clone(&store)).await;
    let trees: Vec<_> =
        (0..4u8).map(|i| tree(&dir.path().join(format!("t{i}")), &[1, 20 + i, 40 + i])).collect();
    let mut keep = Vec::new();
    let mut tasks = tokio::task::JoinSet::new();
    for (i, t) in trees.iter().enumerate() {
        let (store, t) = (Arc::clone(&store), t.clone());
        tasks.spawn(async move {
            let repo = open(store).await;
            let mut kept = Vec::new();
            for round in 0..3 {
                let s = backup(&repo, &t).await;
                if round == 2 {
                    kept.push((s.snapshot_id, t.clone()));
                } else {
                    forget(&repo, &[s.snapshot_id], &CancellationToken::new()).await.unwrap();
                }
            }
            (i, kept)
        });
    }
    let collector = {
        let store = Arc::clone(&store);
        tokio::spawn(async move {
            let repo = open(store).await;
            let mut options = gc_options();
            options.wait = Duration::from_millis(300);
            let mut swept = 0;
            for _ in 0..6 {
                match gc(&repo, &options, &CancellationToken::new()).await {
                    Ok(r) => swept += u32::from(matches!(r.sweep, SweepReport::Swept(_))),
                    Err(ferry_repo::RepoError::Gc { step: "lock", .. }) => {}
                    Err(e) => panic!("gc: {e}"),
                }
            }
            swept
        })
    };
    while let Some(done) = tasks.join_next().await {
        keep.extend(done.unwrap().1);
    }
    collector.await.unwrap();
    // A last collection with nothing running reclaims whatever is left, rewriting packs
    // that hold duplicates stored by racing backups.
    let options = ferry_repo::gc::GcOptions { repack_dead_fraction: 0.2, ..gc_options() };
    let report = gc_until_done(&repo, &options).await;
    assert!(!report.pending(), "{report:?}");
    assert_clean(&repo).await;
    for (id, source) in &keep {
        assert_restores(&repo, id, source).await;
    }
    assert_eq!(repo.snapshot_ids(&CancellationToken::new()).await.unwrap().len(), keep.len());
    // What is stored is no more than the kept data once (plus pack overhead).
    let distinct = (1 + 2 * trees.len()) as u64 * FILE as u64;
    let data = data_bytes(store.as_ref()).await;
    assert!(data < distinct + distinct / 3, "{data} bytes stored for {distinct} distinct");
}

/// Holds lease writes (`locks/`) while `held`, and counts the index files read: a restore's
/// start-up with its lease write stopped where a collection can run in between.
#[derive(Debug)]
struct LeaseHold {
    held: tokio::sync::watch::Sender<bool>,
    arrived: tokio::sync::watch::Sender<u64>,
    index_reads: tokio::sync::watch::Sender<u64>,
}

#[async_trait::async_trait]
impl Hook for LeaseHold {
    async fn before(&self, call: Call<'_>) {
        if matches!(call, Call::Put(key) if key.as_str().starts_with("locks/")) {
            self.arrived.send_modify(|n| *n += 1);
            let mut rx = self.held.subscribe();
            let _ = tokio::time::timeout(Duration::from_secs(120), rx.wait_for(|h| !*h)).await;
        }
    }

    fn after(&self, call: Call<'_>, ok: bool) {
        let index = |key: &ObjectKey| key.as_str().starts_with("index/");
        if ok && matches!(call, Call::Get(key) | Call::GetAtMost(key, _) if index(key)) {
            self.index_reads.send_modify(|n| *n += 1);
        }
    }
}

/// Waits (bounded) until `rx` reaches `n`.
async fn reach(rx: &tokio::sync::watch::Sender<u64>, n: u64) {
    let mut rx = rx.subscribe();
    tokio::time::timeout(Duration::from_secs(60), rx.wait_for(|v| *v >= n))
        .await
        .expect("the restore got there in time")
        .unwrap();
}

/// A restore whose lease write is held while a collection marks and sweeps: the collection
/// does not wait for it (its lease is not there yet) and deletes a pack of the restored
/// snapshot after copying its live blobs to a new one. The restore reads no index file before
/// its lease exists, then restores everything from the copies; so does a handle that loaded
/// the index long before (a long-lived agent's), which finds under its lease that the marks
/// and index files changed and reloads.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_whose_lease_a_collection_overtakes_reads_only_what_is_kept() {
    for preloaded in [false, true] {
        let dir = tempfile::tempdir().unwrap();
        let store = fs_store(&dir.path().join("repo"));
        let repo = init(Arc::clone(&store)).await;
        // Small files, so the packs each hold dozens at random and every pack of `a` holds
        // files of `c` beside files no other snapshot has.
        let small = |name: &str, seeds: &mut dyn Iterator<Item = u8>| {
            let root = dir.path().join(name);
            std::fs::create_dir_all(&root).unwrap();
            for seed in seeds {
                std::fs::write(root.join(format!("f{seed}")), noise(8 << 10, seed)).unwrap();
            }
            root
        };
        let a = small("a", &mut (0..64));
        let c = small("c", &mut (0..64).step_by(2));
        let sa = backup(&repo, &a).await;
        let sc = backup(&repo, &c).await;
        assert_eq!(sc.bytes_new, 0, "every file of `c` is stored beside files of `a`");
        forget(&repo, &[sa.snapshot_id], &CancellationToken::new()).await.unwrap();
        let cancel = CancellationToken::new();

        let hold = Arc::new(Hooked::new(
            Arc::clone(&store),
            LeaseHold {
                held: tokio::sync::watch::Sender::new(false),
                arrived: tokio::sync::watch::Sender::new(0),
                index_reads: tokio::sync::watch::Sender::new(0),
            },
        ));
        let held = open(Arc::clone(&hold) as Arc<dyn ObjectStore>).await;
        if preloaded {
            // The handle loads the index in a restore of its own, before anything changes.
            assert_restores(&held, &sc.snapshot_id, &c).await;
        }
        let reads_before = *hold.hook().index_reads.borrow();
        let leases_before = *hold.hook().arrived.borrow();
        hold.hook().held.send_replace(true);
        let target = dir.path().join("restored");
        let restoring = {
            let (held, id, target) = (held.clone(), sc.snapshot_id, target.clone());
            tokio::spawn(async move {
                let options = RestoreOptions::default();
                restore(&held, &id, &target, &options, None, &CancellationToken::new()).await
            })
        };
        reach(&hold.hook().arrived, leases_before + 1).await;

        let options = ferry_repo::gc::GcOptions { repack_dead_fraction: 0.2, ..gc_options() };
        let mark = gc_mark(&repo, &options, &cancel).await.unwrap();
        assert!(mark.repacked_packs >= 1 && mark.writers == 0, "{mark:?}");
        let swept = gc_sweep(&repo, &options, &cancel).await.unwrap();
        assert!(matches!(swept, SweepReport::Swept(_)), "{swept:?}");

        let before_lease = *hold.hook().index_reads.borrow() - reads_before;
        assert_eq!(before_lease, 0, "index files read before the lease existed");
        hold.hook().held.send_replace(false);
        let summary = restoring.await.unwrap().unwrap_or_else(|e| {
            panic!(
                "restore (index loaded {}): {e}",
                if preloaded { "earlier" } else { "under its lease" }
            )
        });
        assert_eq!(summary.files, 32);
        assert!(*hold.hook().index_reads.borrow() > reads_before, "the index was (re)loaded");
        compare(&c, &target);
        assert_clean(&repo).await;
    }
}

/// A restore of a forgotten snapshot (its manifest read while the lease is written) fails
/// with the manifest's error and leaves no lease behind to hold garbage collection back.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_that_cannot_load_its_snapshot_leaves_no_lease() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(&dir.path().join("repo"));
    let repo = init(Arc::clone(&store)).await;
    let s = backup(&repo, &tree(&dir.path().join("a"), &[1])).await;
    let cancel = CancellationToken::new();
    forget(&repo, &[s.snapshot_id], &cancel).await.unwrap();
    let target = dir.path().join("restored");
    let err = restore(&repo, &s.snapshot_id, &target, &RestoreOptions::default(), None, &cancel)
        .await
        .unwrap_err();
    assert!(err.is_not_found(), "{err}");
    assert_eq!(store.list("locks/", &cancel).await.unwrap(), vec![], "lease left behind");
}

/// Once armed, holds the second of a writer's listings of `gc/` and `index/` (the two a
/// long-lived handle makes under its lease to decide whether its index still holds) until
/// released.
#[derive(Debug, Default)]
struct SecondListingHold {
    armed: std::sync::atomic::AtomicBool,
    listings: std::sync::atomic::AtomicU64,
    waiting: tokio::sync::watch::Sender<u64>,
    released: tokio::sync::watch::Sender<bool>,
    held: std::sync::Mutex<Option<String>>,
}

#[async_trait::async_trait]
impl Hook for SecondListingHold {
    async fn before(&self, call: Call<'_>) {
        use std::sync::atomic::Ordering::SeqCst;
        let watched = matches!(call, Call::List("gc/" | "index/"));
        if watched && self.armed.load(SeqCst) && self.listings.fetch_add(1, SeqCst) == 1 {
            *self.held.lock().unwrap() = Some(call.key().to_owned());
            self.waiting.send_replace(1);
            let mut rx = self.released.subscribe();
            let _ = tokio::time::timeout(Duration::from_secs(120), rx.wait_for(|r| *r)).await;
        }
    }
}

/// A long-lived handle's index predates a mark made before its next backup's lease, so the
/// mark does not wait for that backup. A whole sweep then runs between the two listings with
/// which the backup checks its index under its lease. The marks are listed first, so the
/// backup sees the mark and reloads: it stores the swept chunks again rather than refer to
/// deleted packs. (Listing `index/` first, the sweep would go unseen: the mark is gone by the
/// second listing, and the first showed no new index file.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn no_whole_sweep_fits_unseen_between_a_writers_two_listings() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(&dir.path().join("repo"));
    let repo = init(Arc::clone(&store)).await;
    let hold = Arc::new(Hooked::new(Arc::clone(&store), SecondListingHold::default()));
    let long_lived = open(Arc::clone(&hold) as Arc<dyn ObjectStore>).await;
    let a = tree(&dir.path().join("a"), &[1, 2]);
    let first = backup(&long_lived, &a).await;
    // The handle's index is current: it names the first backup's index file.
    assert_restores(&long_lived, &first.snapshot_id, &a).await;
    let cancel = CancellationToken::new();
    forget(&repo, &[first.snapshot_id], &cancel).await.unwrap();
    let options = gc_options();
    let mark = gc_mark(&repo, &options, &cancel).await.unwrap();
    assert!(mark.condemned_packs >= 1 && mark.writers == 0, "{mark:?}");

    hold.hook().armed.store(true, std::sync::atomic::Ordering::SeqCst);
    let second = {
        let (long_lived, a) = (long_lived.clone(), a.clone());
        tokio::spawn(async move { backup(&long_lived, &a).await })
    };
    let mut waiting = hold.hook().waiting.subscribe();
    tokio::time::timeout(Duration::from_secs(60), waiting.wait_for(|w| *w == 1))
        .await
        .expect("the backup listed twice in time")
        .unwrap();
    // The listing held is the second of the backup's check of its index, not another.
    assert_eq!(hold.hook().held.lock().unwrap().as_deref(), Some("index/"));
    let swept = gc_sweep(&repo, &options, &cancel).await.unwrap();
    assert!(matches!(swept, SweepReport::Swept(_)), "{swept:?}");
    hold.hook().released.send_replace(true);

    let second = second.await.unwrap();
    assert_eq!(second.bytes_new, second.bytes_total, "the swept chunks are stored again");
    assert_clean(&repo).await;
    assert_restores(&repo, &second.snapshot_id, &a).await;
}

/// Stores one backup (of `tree`, through `repo`) the first time the snapshots are listed
/// through it, before that listing is answered.
#[derive(Debug)]
struct BackupOnSnapshotListing {
    repo: ferry_repo::Repository,
    tree: std::path::PathBuf,
    stored: tokio::sync::Mutex<Option<ferry_repo::SnapshotId>>,
}

#[async_trait::async_trait]
impl Hook for BackupOnSnapshotListing {
    async fn before(&self, call: Call<'_>) {
        if let Call::List(prefix) = call
            && prefix.starts_with("snapshots")
        {
            let mut stored = self.stored.lock().await;
            if stored.is_none() {
                *stored = Some(backup(&self.repo, &self.tree).await.snapshot_id);
            }
        }
    }
}

/// `store`, storing one backup of `tree` the first time the snapshots are listed through it.
async fn backup_on_snapshot_listing(
    store: &Arc<dyn ObjectStore>,
    tree: std::path::PathBuf,
) -> Arc<Hooked<BackupOnSnapshotListing>> {
    let hook = BackupOnSnapshotListing {
        repo: open(Arc::clone(store)).await,
        tree,
        stored: tokio::sync::Mutex::new(None),
    };
    Arc::new(Hooked::new(Arc::clone(store), hook))
}

/// A backup that commits (packs, index, snapshot) while a collection marks, as the mark lists
/// the snapshots: the collection walks every snapshot it lists, each finding its blobs
/// indexed, and keeps the new one's data. (With the index read before the snapshots were
/// listed, the walk stopped at the new snapshot's tree page, missing from the index.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_committed_as_the_mark_lists_the_snapshots_is_walked_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(&dir.path().join("repo"));
    let repo = init(Arc::clone(&store)).await;
    let first = tree(&dir.path().join("a"), &[1, 2]);
    let kept = backup(&repo, &first).await.snapshot_id;
    let second = tree(&dir.path().join("b"), &[3, 4]);
    let hooked = backup_on_snapshot_listing(&store, second.clone()).await;
    let collector = open(hooked.clone()).await;
    let report = gc(&collector, &gc_options(), &CancellationToken::new()).await.unwrap();
    let racing = hooked.hook().stored.lock().await.expect("the backup ran during the mark");
    // The listing was answered after the backup committed: both snapshots were walked, and
    // nothing they reference was condemned.
    let mark = report.mark.as_ref().expect("a mark ran");
    assert_eq!(mark.snapshots, 2, "{mark:?}");
    assert_eq!(mark.condemned_packs, 0, "{mark:?}");
    assert_clean(&repo).await;
    assert_restores(&repo, &kept, &first).await;
    assert_restores(&repo, &racing, &second).await;
}

/// A backup that commits while `check` lists the snapshots: the check reports the snapshots
/// it listed and nothing wrong. (With the index read before the snapshots were listed, the new
/// snapshot's blobs were reported as in no index.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_committed_as_check_lists_the_snapshots_is_no_problem() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(&dir.path().join("repo"));
    let repo = init(Arc::clone(&store)).await;
    let first = tree(&dir.path().join("a"), &[1, 2]);
    backup(&repo, &first).await;
    let hooked = backup_on_snapshot_listing(&store, tree(&dir.path().join("b"), &[3, 4])).await;
    let checker = open(hooked.clone()).await;
    let report = ferry_repo::check(
        &checker,
        ferry_repo::CheckOptions { read_data: true, subset: None },
        None,
        &CancellationToken::new(),
    )
    .await
    .unwrap();
    assert!(hooked.hook().stored.lock().await.is_some(), "the backup ran during the check");
    assert!(report.is_ok(), "check found problems: {:#?}", report.problems);
    // The listing was answered after the backup committed: both snapshots were checked.
    assert_eq!(report.snapshots, 2, "{report:?}");
}

/// A backup that commits while a sweep lists the snapshots: the sweep walks it (its blobs
/// found in the index read after) and deletes only what the mark condemned. (With the index
/// read before the snapshots were listed, the sweep stopped at the new snapshot's blobs,
/// missing from its index.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_committed_as_the_sweep_lists_the_snapshots_is_walked_and_kept() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(&dir.path().join("repo"));
    let repo = init(Arc::clone(&store)).await;
    let (options, cancel) = (gc_options(), CancellationToken::new());
    let first = tree(&dir.path().join("a"), &[1, 2]);
    let kept = backup(&repo, &first).await.snapshot_id;
    let gone = backup(&repo, &tree(&dir.path().join("x"), &[5, 6])).await.snapshot_id;
    forget(&repo, &[gone], &cancel).await.unwrap();
    let mark = gc_mark(&repo, &options, &cancel).await.unwrap();
    assert!(mark.condemned_packs >= 1 && mark.writers == 0, "{mark:?}");
    let second = tree(&dir.path().join("b"), &[3, 4]);
    let hooked = backup_on_snapshot_listing(&store, second.clone()).await;
    let swept = gc_sweep(&open(hooked.clone()).await, &options, &cancel).await.unwrap();
    let racing = hooked.hook().stored.lock().await.expect("the backup ran during the sweep");
    let SweepReport::Swept(stats) = swept else { panic!("{swept:?}") };
    assert_eq!(stats.revived_packs, 0, "{stats:?}");
    assert_clean(&repo).await;
    assert_restores(&repo, &kept, &first).await;
    assert_restores(&repo, &racing, &second).await;
}

/// Forgets `id` and marks, while one operation on `shared` is held with its lease (the mark's
/// one writer); then another operation on `shared` misses a blob, so the handle reloads its
/// index, which no longer holds `id`'s (condemned) tree pages.
async fn forget_mark_and_reload(
    repo: &ferry_repo::Repository,
    shared: &ferry_repo::Repository,
    id: ferry_repo::SnapshotId,
) {
    let cancel = CancellationToken::new();
    let ferry_repo::format::NodeBody::Dir { pages } =
        repo.load_snapshot(&id, &cancel).await.unwrap().root.body
    else {
        panic!("a directory snapshot")
    };
    forget(repo, &[id], &cancel).await.unwrap();
    let mark = gc_mark(repo, &gc_options(), &cancel).await.unwrap();
    assert!(mark.condemned_packs >= 1 && mark.writers == 1, "{mark:?}");
    let nothing = ferry_repo::format::BlobId([0; 32]);
    assert!(shared.locate(&nothing, &cancel).await.unwrap().is_none());
    assert!(shared.locate(&pages[0], &cancel).await.unwrap().is_none(), "index reloaded");
}

/// A restore reads its snapshot's tree pages by the index it loaded under its lease, even once
/// another operation on the same handle has reloaded the handle's index without the packs a
/// newer mark condemned (the restore is among that mark's writers, so those packs outlive it).
/// Looked up in the handle's index, its next tree page went missing.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_reads_its_trees_by_its_own_index_when_the_handles_is_reloaded() {
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(&dir.path().join("repo"));
    let repo = init(Arc::clone(&store)).await;
    let cancel = CancellationToken::new();
    let source = tree(&dir.path().join("a"), &[1, 2, 3, 4]);
    let id = backup(&repo, &source).await.snapshot_id;
    // The restore stops at its first pack read: its lease is held and its index loaded.
    let gate = Gate::reads(Arc::clone(&store), "data/");
    let shared = open(gate.clone()).await;
    let target = dir.path().join("out");
    let restoring = {
        let (shared, target) = (shared.clone(), target.clone());
        tokio::spawn(async move {
            let options = RestoreOptions::default();
            restore(&shared, &id, &target, &options, None, &CancellationToken::new()).await
        })
    };
    gate.hook().wait_arrivals(1).await;
    forget_mark_and_reload(&repo, &shared, id).await;
    gate.hook().open();
    restoring.await.unwrap().expect("the restore reads by its own index");
    compare(&source, &target);
    // Once the restore is gone, the sweep takes the condemned packs.
    let swept = gc_sweep(&repo, &gc_options(), &cancel).await.unwrap();
    assert!(matches!(swept, SweepReport::Swept(_)), "{swept:?}");
    assert_clean(&repo).await;
}

/// A backup walks its parent's tree pages by the index it loaded under its lease, even once
/// another operation on the same handle has reloaded the handle's index without the packs a
/// newer mark condemned (the forgotten parent's): every unchanged file is taken from the
/// parent, none read again. Looked up in the handle's index, the parent's subdirectory page
/// went missing and that directory was read in full.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_backup_walks_its_parent_by_its_own_index_when_the_handles_is_reloaded() {
    use ferry_repo::{BackupOptions, Progress, backup_tree};
    let dir = tempfile::tempdir().unwrap();
    let store = fs_store(&dir.path().join("repo"));
    let repo = init(Arc::clone(&store)).await;
    let cancel = CancellationToken::new();
    let source = tree(&dir.path().join("a"), &[1, 2, 3, 4]);
    // Old enough to be trusted unchanged against the parent's time.
    let old = (1_600_000_000, 0);
    for file in ["f1", "f3", "sub/f2", "sub/f4"] {
        crate::common::set_times(&source.join(file), old, old);
    }
    let parent = backup(&repo, &source).await.snapshot_id;
    // The backup stops at its first pack read, the parent's root page: its lease is held and
    // its index loaded.
    let gate = Gate::reads(Arc::clone(&store), "data/");
    let shared = open(gate.clone()).await;
    let last = Arc::new(std::sync::Mutex::new(None::<Progress>));
    let backing_up = {
        let (shared, source, last) = (shared.clone(), source.clone(), Arc::clone(&last));
        let progress: ferry_repo::ProgressFn =
            Arc::new(move |p: &Progress| *last.lock().unwrap() = Some(*p));
        tokio::spawn(async move {
            let options = BackupOptions { parent: Some(parent), threads: 2, ..Default::default() };
            backup_tree(&shared, &source, &options, Some(progress), &CancellationToken::new()).await
        })
    };
    gate.hook().wait_arrivals(1).await;
    forget_mark_and_reload(&repo, &shared, parent).await;
    gate.hook().open();
    let summary = backing_up.await.unwrap().expect("the backup completes");
    let progress = (*last.lock().unwrap()).expect("a final progress report");
    assert!(progress.finished, "{progress:?}");
    assert_eq!(progress.bytes_read, 0, "no unchanged file is read again: {progress:?}");
    assert_eq!(progress.bytes_skipped, 4 * FILE as u64, "{progress:?}");
    assert_eq!(summary.bytes_total, 4 * FILE as u64);
    // The sweep keeps what the new snapshot took from its parent.
    let swept = gc_sweep(&repo, &gc_options(), &cancel).await.unwrap();
    assert!(matches!(swept, SweepReport::Swept(_)), "{swept:?}");
    assert_clean(&repo).await;
    assert_restores(&repo, &summary.snapshot_id, &source).await;
}
