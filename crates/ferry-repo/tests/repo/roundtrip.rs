//! Backup and restore round trips over the tree of hard cases, on the in-memory and the
//! file-system store; incremental backups; progress; cancellation; unreadable files.

use crate::common;

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};

use common::{TestResult, assert_same_tree, hard_cases_round_trip, memory_repo, noise};
use ferry_repo::{
    BackupOptions, CheckOptions, Progress, RepoError, RestoreOptions, backup_tree, check, restore,
};
use tokio_util::sync::CancellationToken;

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_cases_round_trip_on_memory_store() -> TestResult {
    hard_cases_round_trip(&memory_repo().await.0).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn hard_cases_round_trip_on_file_system_store() -> TestResult {
    let dir = tempfile::tempdir()?;
    hard_cases_round_trip(&common::fs_repo(dir.path()).await).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn incremental_backup_reads_only_changes() -> TestResult {
    let cancel = CancellationToken::new();
    let (repo, _) = memory_repo().await;
    let src = tempfile::tempdir()?;
    std::fs::create_dir(src.path().join("d"))?;
    for i in 0..50 {
        std::fs::write(src.path().join(format!("d/f{i}")), noise(20_000, i))?;
    }
    let first = backup_tree(&repo, src.path(), &BackupOptions::default(), None, &cancel).await?;
    assert_eq!(first.bytes_new, 50 * 20_000);
    let opts = BackupOptions { parent: Some(first.snapshot_id), ..BackupOptions::default() };
    let unchanged = backup_tree(&repo, src.path(), &opts, None, &cancel).await?;
    assert_eq!(unchanged.bytes_new, 0);
    assert_eq!(unchanged.bytes_total, first.bytes_total);
    // Change one file's content (same size, new mtime) and add one.
    std::fs::write(src.path().join("d/f7"), noise(20_000, 200))?;
    std::fs::write(src.path().join("d/new"), noise(1000, 201))?;
    let opts = BackupOptions { parent: Some(unchanged.snapshot_id), ..BackupOptions::default() };
    let changed = backup_tree(&repo, src.path(), &opts, None, &cancel).await?;
    assert_eq!(changed.bytes_new, 21_000);
    let out = tempfile::tempdir()?;
    restore(&repo, &changed.snapshot_id, out.path(), &RestoreOptions::default(), None, &cancel)
        .await?;
    assert_same_tree(src.path(), out.path());
    let snaps = repo.snapshots(&cancel).await?;
    assert_eq!(snaps.len(), 3);
    assert_eq!(snaps[2].1.parent, Some(unchanged.snapshot_id));
    Ok(())
}

/// A file rewritten (same size) right after the parent backup read it, within the same
/// timestamp tick, keeps its mtime: a file whose mtime is that close to the parent backup's
/// start is read again, not trusted.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_rewritten_in_the_tick_the_parent_read_it_is_read_again() -> TestResult {
    let cancel = CancellationToken::new();
    let (repo, _) = memory_repo().await;
    let src = tempfile::tempdir()?;
    let db = src.path().join("db");
    std::fs::write(&db, noise(30_000, 1))?;
    let since_epoch = std::fs::metadata(&db)?.modified()?.duration_since(std::time::UNIX_EPOCH)?;
    let mtime = (i64::try_from(since_epoch.as_secs())?, i64::from(since_epoch.subsec_nanos()));
    let first = backup_tree(&repo, src.path(), &BackupOptions::default(), None, &cancel).await?;
    std::fs::write(&db, noise(30_000, 2))?;
    common::set_times(&db, mtime, mtime);
    let opts = BackupOptions { parent: Some(first.snapshot_id), ..BackupOptions::default() };
    let again = backup_tree(&repo, src.path(), &opts, None, &cancel).await?;
    assert_eq!(again.bytes_new, 30_000, "the rewritten file was read");
    let out = tempfile::tempdir()?;
    restore(&repo, &again.snapshot_id, out.path(), &RestoreOptions::default(), None, &cancel)
        .await?;
    assert_eq!(std::fs::read(out.path().join("db"))?, noise(30_000, 2));
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_file_changed_behind_an_unchanged_mtime_is_trusted_like_kopia_but_inode_changes_are_not_rereads()
-> TestResult {
    // Copying the tree (new inodes and ctimes, as a CSI clone does) must not force re-reads.
    let cancel = CancellationToken::new();
    let (repo, _) = memory_repo().await;
    let src = tempfile::tempdir()?;
    std::fs::write(src.path().join("a"), noise(50_000, 1))?;
    common::set_times(&src.path().join("a"), (1_000, 0), (2_000, 5));
    let first = backup_tree(&repo, src.path(), &BackupOptions::default(), None, &cancel).await?;
    let clone = tempfile::tempdir()?;
    std::fs::copy(src.path().join("a"), clone.path().join("a"))?;
    common::set_times(&clone.path().join("a"), (1_000, 0), (2_000, 5));
    let opts = BackupOptions { parent: Some(first.snapshot_id), ..BackupOptions::default() };
    let again = backup_tree(&repo, clone.path(), &opts, None, &cancel).await?;
    assert_eq!(again.bytes_new, 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn progress_is_reported_and_final() -> TestResult {
    let cancel = CancellationToken::new();
    let (repo, _) = memory_repo().await;
    let src = tempfile::tempdir()?;
    std::fs::write(src.path().join("f"), noise(2 << 20, 9))?;
    let seen: Arc<Mutex<Vec<Progress>>> = Arc::default();
    let sink = Arc::clone(&seen);
    let f: ferry_repo::ProgressFn =
        Arc::new(move |p: &Progress| sink.lock().unwrap_or_else(|e| e.into_inner()).push(*p));
    backup_tree(&repo, src.path(), &BackupOptions::default(), Some(f), &cancel).await?;
    let seen = seen.lock().unwrap_or_else(|e| e.into_inner());
    let last = seen.last().copied().unwrap_or_default();
    assert!(last.finished);
    assert_eq!(
        (last.bytes_done, last.files_done, last.bytes_total_estimate),
        (2 << 20, 1, 2 << 20)
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_stops_backup_and_restore() -> TestResult {
    let (repo, _) = memory_repo().await;
    let src = tempfile::tempdir()?;
    std::fs::write(src.path().join("big"), noise(256 << 20, 5))?;
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    let r = backup_tree(&repo, src.path(), &BackupOptions::default(), None, &cancelled).await;
    assert!(matches!(r, Err(RepoError::Cancelled)), "{r:?}");
    // Cancel mid-way, from the progress callback once some bytes are done.
    let cancel = CancellationToken::new();
    let trigger = cancel.clone();
    let calls = Arc::new(AtomicU64::new(0));
    let c2 = Arc::clone(&calls);
    let f: ferry_repo::ProgressFn = Arc::new(move |p: &Progress| {
        c2.fetch_add(1, Ordering::Relaxed);
        if p.bytes_done > 0 {
            trigger.cancel();
        }
    });
    let r = backup_tree(
        &repo,
        src.path(),
        &BackupOptions { compression_level: 19, ..BackupOptions::default() },
        Some(f),
        &cancel,
    )
    .await;
    assert!(matches!(r, Err(RepoError::Cancelled)), "{r:?}");
    assert!(calls.load(Ordering::Relaxed) >= 1);
    assert!(repo.snapshot_ids(&CancellationToken::new()).await?.is_empty());
    Ok(())
}

/// Bind-mounts a write-only proc file over a regular file: reading it fails even as root.
struct UnreadableMount(std::path::PathBuf);

impl UnreadableMount {
    fn new(at: std::path::PathBuf) -> std::io::Result<Self> {
        std::fs::write(&at, b"")?;
        nix::mount::mount(
            Some("/proc/self/clear_refs"),
            &at,
            None::<&str>,
            nix::mount::MsFlags::MS_BIND,
            None::<&str>,
        )?;
        Ok(Self(at))
    }
}

impl Drop for UnreadableMount {
    fn drop(&mut self) {
        let _ = nix::mount::umount(&self.0);
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn unreadable_file_is_recorded_not_skipped() -> TestResult {
    let cancel = CancellationToken::new();
    let (repo, _) = memory_repo().await;
    let src = tempfile::tempdir()?;
    std::fs::write(src.path().join("good"), b"fine")?;
    let _mount = UnreadableMount::new(src.path().join("bad"))?;
    let s = backup_tree(&repo, src.path(), &BackupOptions::default(), None, &cancel).await?;
    assert_eq!((s.errors, s.files), (1, 2));
    let snap = repo.load_snapshot(&s.snapshot_id, &cancel).await?;
    assert_eq!(snap.summary.errors, 1);
    let out = tempfile::tempdir()?;
    let r = restore(&repo, &s.snapshot_id, out.path(), &RestoreOptions::default(), None, &cancel)
        .await?;
    assert_eq!(r.entries_with_backup_errors, 1);
    let note = r.shortfall(3).unwrap_or_default();
    assert!(note.starts_with("1 entry was unreadable when backed up"), "{note}");
    assert_eq!(std::fs::read(out.path().join("good"))?, b"fine");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn an_interrupted_backup_leaves_indexed_data_the_next_one_reuses() -> TestResult {
    let src = tempfile::tempdir()?;
    std::fs::write(src.path().join("big"), noise(160 << 20, 11))?;
    // Interrupt after the 12th pack (about 48 MiB of 160) is stored, however fast the machine.
    let cancel = CancellationToken::new();
    let hook = common::CancelAfterPacks {
        after: 12,
        written: std::sync::atomic::AtomicUsize::new(0),
        cancel: cancel.clone(),
    };
    let store = Arc::new(ferry_store::Hooked::new(Arc::new(ferry_store::MemoryStore::new()), hook));
    let repo = ferry_repo::Repository::init(store, b"secret", &common::options(), &cancel).await?.0;
    let options = BackupOptions { compression_level: 1, ..BackupOptions::default() };
    let r = backup_tree(&repo, src.path(), &options, None, &cancel).await;
    assert!(matches!(r, Err(RepoError::Cancelled)), "{r:?}");
    // What was stored before the interruption is indexed, consistent, and reused.
    let fresh = CancellationToken::new();
    let report = check(&repo, CheckOptions { read_data: true, subset: None }, None, &fresh).await?;
    assert!(report.is_ok(), "{:?}", report.problems);
    assert!(report.packs > 0);
    let again = backup_tree(&repo, src.path(), &options, None, &fresh).await?;
    assert!(again.bytes_new + (32 << 20) <= again.bytes_total, "{again:?}");
    let out = tempfile::tempdir()?;
    restore(&repo, &again.snapshot_id, out.path(), &RestoreOptions::default(), None, &fresh)
        .await?;
    assert_same_tree(src.path(), out.path());
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_missing_or_non_directory_root_is_a_clear_error() -> TestResult {
    let cancel = CancellationToken::new();
    let (repo, _) = memory_repo().await;
    let dir = tempfile::tempdir()?;
    let missing =
        backup_tree(&repo, &dir.path().join("nope"), &BackupOptions::default(), None, &cancel)
            .await;
    assert!(
        matches!(&missing, Err(RepoError::Io { operation: "open backup root", .. })),
        "{missing:?}"
    );
    std::fs::write(dir.path().join("file"), b"x")?;
    let file =
        backup_tree(&repo, &dir.path().join("file"), &BackupOptions::default(), None, &cancel)
            .await;
    assert!(matches!(&file, Err(RepoError::Io { .. })), "{file:?}");
    assert!(repo.snapshot_ids(&cancel).await?.is_empty());
    Ok(())
}

/// Deletes the object whose key ends with `suffix` just before it is first read, as a `forget`
/// running on another node does between this node's listing and its read.
#[derive(Debug)]
struct ForgetBeforeRead {
    store: Arc<dyn ferry_store::ObjectStore>,
    suffix: String,
}

#[async_trait::async_trait]
impl ferry_store::Hook for ForgetBeforeRead {
    async fn before(&self, call: ferry_store::Call<'_>) {
        if let Some(key) = call.whole_read()
            && key.as_str().ends_with(&self.suffix)
        {
            let _ = self.store.delete(key, &CancellationToken::new()).await;
        }
    }
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_snapshot_forgotten_during_a_listing_or_check_is_simply_gone() -> TestResult {
    let cancel = CancellationToken::new();
    let (repo, store) = memory_repo().await;
    let src = tempfile::tempdir()?;
    let (options, mut ids) = (BackupOptions::default(), Vec::new());
    for n in 0..3u8 {
        std::fs::write(src.path().join(format!("f{n}")), noise(64 << 10, n))?;
        ids.push(backup_tree(&repo, src.path(), &options, None, &cancel).await?.snapshot_id);
    }
    // A fresh handle each time, so nothing of the snapshots is cached yet.
    let handle = |forgotten: ferry_repo::SnapshotId| {
        let inner: Arc<dyn ferry_store::ObjectStore> = store.clone();
        let hook = ForgetBeforeRead { store: inner.clone(), suffix: forgotten.to_hex() };
        ferry_repo::Repository::open(
            Arc::new(ferry_store::Hooked::new(inner, hook)),
            b"secret",
            &cancel,
        )
    };
    let listing = handle(ids[1]).await?;
    let (good, damaged) = listing.readable_snapshots(&cancel).await?;
    assert!(damaged.is_empty(), "{damaged:?}");
    assert_eq!(good.iter().map(|(id, _)| *id).collect::<Vec<_>>(), [ids[0], ids[2]]);
    let checking = handle(ids[2]).await?;
    let report =
        check(&checking, CheckOptions { read_data: true, subset: None }, None, &cancel).await?;
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.snapshots, 1, "only the one snapshot left is checked");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn excluded_entries_and_everything_below_them_are_left_out() -> TestResult {
    let cancel = CancellationToken::new();
    let (repo, _) = memory_repo().await;
    let src = tempfile::tempdir()?;
    let root = src.path();
    for dir in ["keep/logs", "cache/deep", "a/cache", "a/tmp"] {
        std::fs::create_dir_all(root.join(dir))?;
    }
    let files = ["keep/x.txt", "keep/logs/y.log", "top.log", "cache/deep/z", "a/cache/w"];
    for file in files.iter().chain(&["keep/tmp", "a/tmp/t"]) {
        std::fs::write(root.join(file), file.as_bytes())?;
    }
    let options = BackupOptions {
        exclude: vec!["*.log".into(), "/cache".into(), "tmp/".into()],
        ..BackupOptions::default()
    };
    let summary = backup_tree(&repo, root, &options, None, &cancel).await?;
    let out = tempfile::tempdir()?;
    restore(&repo, &summary.snapshot_id, out.path(), &RestoreOptions::default(), None, &cancel)
        .await?;
    let mut restored: Vec<String> = walk(out.path());
    restored.sort();
    // `/cache` is anchored at the root: `a/cache` stays; `tmp/` takes the directory a/tmp,
    // not the file keep/tmp.
    let expected = ["a", "a/cache", "a/cache/w", "keep", "keep/logs", "keep/tmp", "keep/x.txt"];
    assert_eq!(restored, expected);
    let bad = BackupOptions { exclude: vec!["[z-a]".into()], ..BackupOptions::default() };
    let refused = backup_tree(&repo, root, &bad, None, &cancel).await;
    assert!(matches!(&refused, Err(RepoError::InvalidInput { .. })), "{refused:?}");
    Ok(())
}

/// A tree deeper than restore allows backs up without exhausting the walker's stack: the
/// directories at the limit are recorded (with an error saying why they are empty) and the
/// snapshot restores.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_tree_deeper_than_restore_allows_is_cut_at_the_limit_and_restores() -> TestResult {
    use nix::fcntl::{OFlag, openat};
    use nix::sys::stat::{Mode, mkdirat};
    let cancel = CancellationToken::new();
    let (repo, _) = memory_repo().await;
    let src = tempfile::tempdir()?;
    let flags = OFlag::O_RDONLY | OFlag::O_DIRECTORY | OFlag::O_CLOEXEC;
    let mut dir = openat(nix::fcntl::AT_FDCWD, src.path(), flags, Mode::empty())?;
    for _ in 0..ferry_repo::MAX_DEPTH + 10 {
        mkdirat(&dir, "d", Mode::from_bits_truncate(0o755))?;
        dir = openat(&dir, "d", flags, Mode::empty())?;
    }
    drop(dir);
    let summary = backup_tree(&repo, src.path(), &BackupOptions::default(), None, &cancel).await?;
    assert_eq!(summary.errors, 1, "the one directory not entered is reported");
    let out = tempfile::tempdir()?;
    restore(&repo, &summary.snapshot_id, out.path(), &RestoreOptions::default(), None, &cancel)
        .await?;
    let mut levels = 0;
    let mut at = out.path().to_path_buf();
    let mut fd = openat(nix::fcntl::AT_FDCWD, &at, flags, Mode::empty())?;
    while let Ok(next) = openat(&fd, "d", flags, Mode::empty()) {
        fd = next;
        levels += 1;
        at.push("d");
        assert!(levels <= ferry_repo::MAX_DEPTH + 10, "restored deeper than backed up");
    }
    assert_eq!(levels, ferry_repo::MAX_DEPTH, "directories down to the limit");
    Ok(())
}

/// Every path below `root`, relative to it.
fn walk(root: &std::path::Path) -> Vec<String> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        for entry in std::fs::read_dir(&dir).expect("read dir") {
            let path = entry.expect("entry").path();
            out.push(path.strip_prefix(root).expect("below").display().to_string());
            if path.is_dir() {
                stack.push(path);
            }
        }
    }
    out
}

/// A directory whose entries encode to more than a page's byte limit (here by their xattrs;
/// in life by files of many chunks) is split into pages by size, not only by entry count,
/// and restores whole.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_directory_of_large_entries_is_paged_by_size() -> TestResult {
    let cancel = CancellationToken::new();
    let (repo, _) = memory_repo().await;
    let src = tempfile::tempdir()?;
    for i in 0..320 {
        let path = src.path().join(format!("f{i:03}"));
        std::fs::write(&path, format!("{i}"))?;
        common::set_xattr(&path, "user.big", &noise(3500, 7));
    }
    let s = backup_tree(&repo, src.path(), &BackupOptions::default(), None, &cancel).await?;
    let snap = repo.load_snapshot(&s.snapshot_id, &cancel).await?;
    let ferry_repo::format::NodeBody::Dir { pages } = &snap.root.body else {
        panic!("a tree snapshot's root is a directory");
    };
    assert_eq!(pages.len(), 2, "320 entries of ~3.5 KB exceed one page of 1 MiB");
    let out = tempfile::tempdir()?;
    restore(&repo, &s.snapshot_id, out.path(), &RestoreOptions::default(), None, &cancel).await?;
    assert_same_tree(src.path(), out.path());
    Ok(())
}

/// A handle whose index loaded before another handle stored a snapshot still reads that
/// snapshot's trees: a blob its loaded index lacks makes it reload the index once.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_long_lived_handle_reads_a_snapshot_stored_after_its_index_loaded() -> TestResult {
    let cancel = CancellationToken::new();
    let (early, store) = memory_repo().await;
    let first = tempfile::tempdir()?;
    std::fs::write(first.path().join("a"), noise(10_000, 1))?;
    backup_tree(&early, first.path(), &BackupOptions::default(), None, &cancel).await?;
    let dyn_store: Arc<dyn ferry_store::ObjectStore> = store;
    let other = ferry_repo::Repository::open(dyn_store, b"secret", &cancel).await?;
    let second = tempfile::tempdir()?;
    std::fs::create_dir_all(second.path().join("d/e"))?;
    std::fs::write(second.path().join("d/e/f"), noise(10_000, 2))?;
    let later =
        backup_tree(&other, second.path(), &BackupOptions::default(), None, &cancel).await?;
    let snapshot = early.load_snapshot(&later.snapshot_id, &cancel).await?;
    let node =
        ferry_repo::browse::find_node(&early, &snapshot, std::path::Path::new("d/e/f"), &cancel)
            .await?;
    assert!(matches!(node.body, ferry_repo::format::NodeBody::File(_)), "{:?}", node.body);
    Ok(())
}
