//! Forget and garbage collection: space comes back, and nothing a live or in-progress
//! snapshot needs is ever deleted, whatever the interleaving or the point where gc stops.
#![allow(clippy::unwrap_used)]

#[path = "../common/mod.rs"]
mod common;
mod faults;
mod interleave;
mod s3;
mod support;

use std::sync::Arc;

use ferry_repo::gc::{SweepReport, forget, gc};
use ferry_store::{FsStore, ObjectStore};
use support::*;
use tokio_util::sync::CancellationToken;

/// Three snapshots: `a` (files 1 and 4), `x` (files 5 and 6), then `b` (files 1 and 7); `a`
/// and `x` are forgotten. Returns `b`'s snapshot and source.
///
/// Two files of 400 KiB fit one 1 MiB pack, and a backup merges its partly filled data packs
/// at its end, so `a` is one pack mixing a file `b` keeps with one only `a` had (rewritten by
/// a collection), and `x` one pack nothing needs (deleted): whatever the random placement of
/// blobs between open packs. Three files come back: 4, 5 and 6.
pub async fn two_snapshots_forget_first(
    repo: &Repository,
    dir: &std::path::Path,
) -> (ferry_repo::SnapshotId, std::path::PathBuf) {
    let a = tree(&dir.join("a"), &[1, 4]);
    let x = tree(&dir.join("x"), &[5, 6]);
    let b = tree(&dir.join("b"), &[1, 7]);
    let cancel = CancellationToken::new();
    let options = ferry_repo::BackupOptions::default();
    let sa = ferry_repo::backup_tree(repo, &a, &options, None, &cancel).await.unwrap();
    let sx = ferry_repo::backup_tree(repo, &x, &options, None, &cancel).await.unwrap();
    let sb = ferry_repo::backup_tree(repo, &b, &options, None, &cancel).await.unwrap();
    assert!(sb.bytes_new < sb.bytes_total, "b shares data with a");
    forget(repo, &[sa.snapshot_id, sx.snapshot_id], &CancellationToken::new()).await.unwrap();
    (sb.snapshot_id, b)
}

use ferry_repo::Repository;

/// Space held only by a forgotten snapshot comes back at once when no backup runs, mostly
/// dead packs are rewritten, and the other snapshot stays whole.
pub async fn reclaim(store: Arc<dyn ObjectStore>) {
    let dir = tempfile::tempdir().unwrap();
    let repo = init(Arc::clone(&store)).await;
    let (sb, b) = two_snapshots_forget_first(&repo, dir.path()).await;
    let before = data_bytes(store.as_ref()).await;
    let mut options = gc_options();
    options.repack_dead_fraction = 0.2;
    let report = gc(&repo, &options, &CancellationToken::new()).await.unwrap();
    let SweepReport::Swept(stats) = &report.sweep else { panic!("not swept: {report:?}") };
    let mark = report.mark.clone().unwrap();
    assert!(mark.condemned_packs >= 1 && stats.deleted_packs >= 1, "{report:?}");
    assert!(mark.repacked_packs >= 1, "a pack shared by both snapshots is rewritten: {report:?}");
    let after = data_bytes(store.as_ref()).await;
    // Files 4, 5 and 6 were only in the forgotten snapshots.
    assert!(before - after >= 3 * FILE as u64, "before {before}, after {after}");
    assert_eq!(report.deleted().1, stats.deleted_bytes);
    // The rest: clean and restorable, also through a fresh handle.
    assert_clean(&repo).await;
    assert_restores(&repo, &sb, &b).await;
    assert_restores(&open(Arc::clone(&store)).await, &sb, &b).await;
    // Nothing more to collect; the index was compacted into one superseding set.
    let again = gc(&repo, &gc_options(), &CancellationToken::new()).await.unwrap();
    assert_eq!(again.sweep, SweepReport::NothingMarked, "{again:?}");
    assert_eq!(again.deleted(), (0, 0));
    assert!(store.list("gc/", &CancellationToken::new()).await.unwrap().is_empty());
    assert!(store.list("locks/", &CancellationToken::new()).await.unwrap().is_empty());
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forget_and_gc_reclaim_space_on_the_file_system_store() {
    let dir = tempfile::tempdir().unwrap();
    reclaim(Arc::new(FsStore::open(dir.path()).unwrap())).await;
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn forgetting_everything_leaves_an_empty_but_valid_repository() {
    let dir = tempfile::tempdir().unwrap();
    std::fs::create_dir_all(dir.path().join("repo")).unwrap();
    let store: Arc<dyn ObjectStore> = Arc::new(FsStore::open(dir.path().join("repo")).unwrap());
    let repo = init(Arc::clone(&store)).await;
    let s = backup(&repo, &tree(&dir.path().join("a"), &[1, 2])).await;
    forget(&repo, &[s.snapshot_id], &CancellationToken::new()).await.unwrap();
    gc(&repo, &gc_options(), &CancellationToken::new()).await.unwrap();
    assert_eq!(data_bytes(store.as_ref()).await, 0);
    assert_clean(&repo).await;
    // A new backup of the same data stores it again and restores.
    let again = backup(&repo, &dir.path().join("a")).await;
    assert!(again.bytes_new >= 2 * FILE as u64);
    assert_restores(&repo, &again.snapshot_id, &dir.path().join("a")).await;
}

/// Small files share frames (format 3). A collection after a snapshot is forgotten rewrites
/// the frames that hold blobs of both snapshots: only the live blobs go into new frames, the
/// dead ones are dropped, and the kept snapshot still restores and checks clean. A second
/// collection finds nothing left to repack (the new frames hold live blobs only).
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repack_keeps_a_frames_live_blobs_and_drops_its_dead_ones() {
    let store: Arc<dyn ObjectStore> = Arc::new(ferry_store::MemoryStore::new());
    let repo = init(Arc::clone(&store)).await;
    assert_eq!(repo.config().format, ferry_repo::RepoFormat::V3);
    let dir = tempfile::tempdir().unwrap();
    // 300 files of 6 KiB of noise, about two frames; the second snapshot keeps every other one.
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    std::fs::create_dir_all(&a).unwrap();
    std::fs::create_dir_all(&b).unwrap();
    for n in 0..300u16 {
        let bytes = noise(6 << 10, (n % 251) as u8);
        let bytes: Vec<u8> = bytes.iter().map(|x| x ^ (n >> 8) as u8 ^ (n as u8)).collect();
        std::fs::write(a.join(format!("f{n}")), &bytes).unwrap();
        if n % 2 == 0 {
            std::fs::write(b.join(format!("f{n}")), &bytes).unwrap();
        }
    }
    let sa = backup(&repo, &a).await;
    let sb = backup(&repo, &b).await;
    assert_eq!(sb.bytes_new, 0, "b's files are all in a's frames");
    let before = data_bytes(store.as_ref()).await;
    forget(&repo, &[sa.snapshot_id], &CancellationToken::new()).await.unwrap();
    let mut options = gc_options();
    options.repack_dead_fraction = 0.2;
    let report = gc(&repo, &options, &CancellationToken::new()).await.unwrap();
    let mark = report.mark.clone().unwrap();
    assert!(mark.repacked_packs >= 1, "frames with dead blobs are rewritten: {report:?}");
    assert_eq!(mark.repacked_blobs, 150, "b's blobs, and only those: {report:?}");
    let after = data_bytes(store.as_ref()).await;
    assert!(
        before - after >= 140 * (6 << 10),
        "half the blobs' bytes come back: before {before}, after {after}"
    );
    assert_clean(&repo).await;
    assert_restores(&repo, &sb.snapshot_id, &b).await;
    assert_restores(&open(Arc::clone(&store)).await, &sb.snapshot_id, &b).await;
    let again = gc(&repo, &options, &CancellationToken::new()).await.unwrap();
    assert_eq!(again.mark.map(|m| m.repacked_packs), Some(0), "nothing left to repack");
}

/// A volume's chunks lie four to a frame: once a snapshot whose changed chunks left a dead one
/// in each frame is forgotten, a collection rewrites those frames with their three live chunks,
/// and the other snapshot restores bit for bit and checks clean.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repack_rewrites_a_volumes_frames_without_their_dead_chunks() {
    use ferry_repo::{VolumeBackupOptions, VolumeRestoreOptions, backup_volume, restore_volume};
    let store: Arc<dyn ObjectStore> = Arc::new(ferry_store::MemoryStore::new());
    let repo = init(Arc::clone(&store)).await;
    let dir = tempfile::tempdir().unwrap();
    let (chunk, chunks) = (256usize << 10, 32usize);
    let mut image = common::text_image(chunk * chunks);
    let path = dir.path().join("volume.img");
    let cancel = CancellationToken::new();
    std::fs::write(&path, &image).unwrap();
    let options = VolumeBackupOptions::default();
    let first = backup_volume(&repo, &path, &options, None, &cancel).await.unwrap();
    let locations = common::volume_chunk_locations(&repo, &first.snapshot_id).await;
    let framed = ferry_repo::format::ObjectKind::FramedData;
    assert!(locations.iter().all(|l| l.kind == framed), "{locations:?}");
    // The first chunk of every four changes: each of the first snapshot's frames keeps three
    // chunks the second one shares.
    for n in (0..chunks).step_by(4) {
        image[n * chunk..n * chunk + 64].copy_from_slice(&noise(64, n as u8));
    }
    std::fs::write(&path, &image).unwrap();
    let options = VolumeBackupOptions { parent: Some(first.snapshot_id), ..options };
    let second = backup_volume(&repo, &path, &options, None, &cancel).await.unwrap();
    assert_eq!(second.bytes_new, (chunks / 4 * chunk) as u64, "{second:?}");
    forget(&repo, &[first.snapshot_id], &cancel).await.unwrap();
    let mut gc_opts = gc_options();
    gc_opts.repack_dead_fraction = 0.2;
    let report = gc(&repo, &gc_opts, &cancel).await.unwrap();
    let mark = report.mark.clone().unwrap();
    assert_eq!(mark.repacked_blobs, (chunks / 4 * 3) as u64, "the live chunks: {report:?}");
    assert_clean(&repo).await;
    let out = dir.path().join("restored.img");
    restore_volume(
        &repo,
        &second.snapshot_id,
        &out,
        &VolumeRestoreOptions::default(),
        None,
        &cancel,
    )
    .await
    .unwrap();
    assert!(std::fs::read(&out).unwrap() == image, "the restored volume differs");
}
