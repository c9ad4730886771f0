//! Volume snapshots on real loop devices holding ext4 file systems: bit-for-bit round trips
//! (device bytes, and the files seen through a read-only mount), incrementals, cross-volume
//! dedup, a too-small target, sparse images, kind mismatches, check, cancellation; backups
//! that read only the ranges changed-block tracking names.
//!
//! Needs root, `losetup`, `mkfs.ext4` and `mount`. Every loop device and mount is released by a
//! guard's `Drop`, so nothing is left behind when an assertion fails.

use crate::common;

use std::os::unix::fs::{FileExt, MetadataExt};
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};

use common::{TestResult, fs_repo, noise};
use ferry_repo::{
    BackupOptions, CheckOptions, Progress, ReadPlan, RepoError, Repository, RestoreOptions,
    SnapshotKind, VolumeBackupOptions, VolumeRestoreOptions, backup_tree, backup_volume, check,
    restore, restore_volume,
};
use tokio_util::sync::CancellationToken;

const MIB: u64 = 1 << 20;

fn run(cmd: &str, args: &[&str]) -> Result<String, String> {
    let out = Command::new(cmd).args(args).output().map_err(|e| format!("{cmd}: {e}"))?;
    if out.status.success() {
        Ok(String::from_utf8_lossy(&out.stdout).trim().to_owned())
    } else {
        Err(format!("{cmd} {args:?}: {}", String::from_utf8_lossy(&out.stderr)))
    }
}

/// A loop device over an image file, detached on drop.
struct Loop {
    dev: PathBuf,
}

impl Loop {
    fn attach(image: &Path) -> Result<Self, String> {
        let image = image.to_str().ok_or("non-UTF-8 path")?;
        let dev = run("losetup", &["--find", "--show", image])?;
        Ok(Self { dev: PathBuf::from(dev) })
    }

    fn path(&self) -> &str {
        self.dev.to_str().unwrap_or_default()
    }
}

impl Drop for Loop {
    fn drop(&mut self) {
        let _ = run("losetup", &["-d", self.path()]);
    }
}

/// A mount, unmounted on drop.
struct Mount {
    dir: PathBuf,
}

impl Mount {
    fn new(dev: &Loop, dir: &Path, read_only: bool) -> Result<Self, String> {
        std::fs::create_dir_all(dir).map_err(|e| e.to_string())?;
        let d = dir.to_str().ok_or("non-UTF-8 path")?;
        let opts = if read_only { "ro,noload" } else { "rw" };
        run("mount", &["-t", "ext4", "-o", opts, dev.path(), d])?;
        Ok(Self { dir: dir.to_path_buf() })
    }
}

impl Drop for Mount {
    fn drop(&mut self) {
        let _ = run("umount", &[self.dir.to_str().unwrap_or_default()]);
    }
}

/// An image file of `size` bytes attached to a loop device.
fn loop_image(dir: &Path, name: &str, size: u64) -> Result<Loop, String> {
    let image = dir.join(name);
    let f = std::fs::File::create(&image).map_err(|e| e.to_string())?;
    f.set_len(size).map_err(|e| e.to_string())?;
    Loop::attach(&image)
}

/// Writes real files into a fresh ext4 file system on `dev`.
fn populate(dev: &Loop, mnt: &Path) -> TestResult {
    run("mkfs.ext4", &["-q", "-F", "-b", "4096", dev.path()])?;
    let m = Mount::new(dev, mnt, false)?;
    std::fs::create_dir_all(m.dir.join("docs/deep"))?;
    for i in 0..40u8 {
        std::fs::write(
            m.dir.join(format!("docs/file-{i}.bin")),
            noise(100_000 + usize::from(i) * 3000, i),
        )?;
    }
    std::fs::write(m.dir.join("big.bin"), noise(12 << 20, 200))?;
    std::fs::write(m.dir.join("docs/deep/text"), b"ferry volume\n".repeat(20_000))?;
    std::os::unix::fs::symlink("../big.bin", m.dir.join("docs/link"))?;
    run("sync", &[])?;
    Ok(())
}

fn device_bytes(path: &str) -> std::io::Result<Vec<u8>> {
    std::fs::read(path)
}

fn files_of(root: &Path) -> Vec<(PathBuf, Vec<u8>)> {
    let mut out = Vec::new();
    let mut stack = vec![root.to_path_buf()];
    while let Some(dir) = stack.pop() {
        let Ok(entries) = std::fs::read_dir(&dir) else { continue };
        for e in entries.flatten() {
            let p = e.path();
            let Ok(ft) = e.file_type() else { continue };
            let rel = p.strip_prefix(root).map(Path::to_path_buf).unwrap_or_default();
            if ft.is_dir() {
                stack.push(p);
            } else if ft.is_symlink() {
                out.push((
                    rel,
                    std::fs::read_link(&p)
                        .map(|l| l.into_os_string().into_encoded_bytes())
                        .unwrap_or_default(),
                ));
            } else {
                out.push((rel, std::fs::read(&p).unwrap_or_default()));
            }
        }
    }
    out.sort();
    out
}

async fn repo_in(dir: &Path) -> Repository {
    let path = dir.join("repo");
    std::fs::create_dir_all(&path).unwrap_or_default();
    fs_repo(&path).await
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn ext4_volume_round_trip_incremental_and_cross_volume_dedup() -> TestResult {
    let cancel = CancellationToken::new();
    let tmp = tempfile::tempdir()?;
    let repo = repo_in(tmp.path()).await;
    let src = loop_image(tmp.path(), "src.img", 64 * MIB)?;
    populate(&src, &tmp.path().join("mnt-src"))?;
    let first =
        backup_volume(&repo, &src.dev, &VolumeBackupOptions::default(), None, &cancel).await?;
    assert_eq!(first.size, 64 * MIB);
    assert!(first.bytes_skipped > 30 * MIB, "{first:?}");
    assert!(first.bytes_data >= 16 * MIB && first.bytes_new <= first.bytes_data, "{first:?}");
    let snap = repo.load_snapshot(&first.snapshot_id, &cancel).await?;
    assert_eq!(snap.kind()?, SnapshotKind::Volume);

    // Restore onto a device full of garbage: gaps must be zeroed, data written bit for bit.
    let dst = loop_image(tmp.path(), "dst.img", 64 * MIB)?;
    std::fs::OpenOptions::new().write(true).open(&dst.dev)?.write_all_at(&noise(64 << 20, 9), 0)?;
    let r = restore_volume(
        &repo,
        &first.snapshot_id,
        &dst.dev,
        &VolumeRestoreOptions::default(),
        None,
        &cancel,
    )
    .await?;
    assert_eq!((r.size, r.created), (64 * MIB, false));
    // A loop device takes direct writes: every chunk went past the page cache (the chunks
    // are 4 KiB multiples at 4 KiB multiples).
    assert_eq!(r.bytes_direct, r.bytes_written, "{r:?}");
    assert!(r.bytes_written > 16 * MIB, "{r:?}");
    assert!(device_bytes(src.path())? == device_bytes(dst.path())?, "restored device differs");
    {
        let a = Mount::new(&src, &tmp.path().join("ro-src"), true)?;
        let b = Mount::new(&dst, &tmp.path().join("ro-dst"), true)?;
        let (fa, fb) = (files_of(&a.dir), files_of(&b.dir));
        assert!(fa.len() > 40);
        assert!(fa == fb, "files differ through the mounts");
    }

    // A small change: the incremental stores little more than it.
    {
        let m = Mount::new(&src, &tmp.path().join("mnt-src"), false)?;
        std::fs::OpenOptions::new()
            .write(true)
            .open(m.dir.join("big.bin"))?
            .write_all_at(b"changed", 5 << 20)?;
        std::fs::write(m.dir.join("new.txt"), b"a new small file\n")?;
    }
    let options =
        VolumeBackupOptions { parent: Some(first.snapshot_id), ..VolumeBackupOptions::default() };
    let second = backup_volume(&repo, &src.dev, &options, None, &cancel).await?;
    assert!(
        second.bytes_new > 0 && second.bytes_new <= 4 * MIB,
        "incremental stored too much: {second:?}"
    );
    assert_eq!(
        repo.load_snapshot(&second.snapshot_id, &cancel).await?.parent,
        Some(first.snapshot_id)
    );
    let r2 = restore_volume(
        &repo,
        &second.snapshot_id,
        &dst.dev,
        &VolumeRestoreOptions::default(),
        None,
        &cancel,
    )
    .await?;
    assert_eq!(r2.size, 64 * MIB);
    assert!(device_bytes(src.path())? == device_bytes(dst.path())?, "incremental restore differs");

    // Another volume with the same data (a copy) stores nothing new.
    let copy = tmp.path().join("copy.img");
    std::fs::write(&copy, device_bytes(src.path())?)?;
    let third = backup_volume(&repo, &copy, &VolumeBackupOptions::default(), None, &cancel).await?;
    assert_eq!(third.bytes_new, 0, "{third:?}");

    let report =
        check(&repo, CheckOptions { read_data: true, subset: None }, None, &cancel).await?;
    assert!(report.is_ok(), "{:?}", report.problems);
    assert_eq!(report.snapshots, 3);
    assert!(report.data_blobs > 0);
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_smaller_device_is_refused_and_left_untouched() -> TestResult {
    let cancel = CancellationToken::new();
    let tmp = tempfile::tempdir()?;
    let repo = repo_in(tmp.path()).await;
    let src = loop_image(tmp.path(), "src.img", 32 * MIB)?;
    populate(&src, &tmp.path().join("mnt"))?;
    let s = backup_volume(&repo, &src.dev, &VolumeBackupOptions::default(), None, &cancel).await?;
    let small = loop_image(tmp.path(), "small.img", 16 * MIB)?;
    let garbage = noise(16 << 20, 3);
    std::fs::OpenOptions::new().write(true).open(&small.dev)?.write_all_at(&garbage, 0)?;
    let e = restore_volume(
        &repo,
        &s.snapshot_id,
        &small.dev,
        &VolumeRestoreOptions::default(),
        None,
        &cancel,
    )
    .await
    .err()
    .ok_or("the restore succeeded")?;
    match &e {
        RepoError::TargetTooSmall { target_size, volume_size, .. } => {
            assert_eq!((*target_size, *volume_size), (16 * MIB, 32 * MIB));
        }
        other => panic!("unexpected error {other}"),
    }
    let msg = e.to_string();
    assert!(
        msg.contains(&(16 * MIB).to_string()) && msg.contains(&(32 * MIB).to_string()),
        "{msg}"
    );
    assert!(device_bytes(small.path())? == garbage, "the refused target was written");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn sparse_image_round_trip_keeps_holes() -> TestResult {
    let cancel = CancellationToken::new();
    let tmp = tempfile::tempdir()?;
    let repo = repo_in(tmp.path()).await;
    let image = tmp.path().join("sparse.img");
    let f = std::fs::File::create(&image)?;
    let size = 256 * MIB + 12_288; // not a multiple of the chunk size
    f.set_len(size)?;
    f.write_all_at(&noise(3 << 20, 1), 10 * MIB)?;
    f.write_all_at(&noise(5000, 2), 100 * MIB + 4096)?; // part of one chunk
    f.write_all_at(&vec![0u8; 2 << 20], 150 * MIB)?; // allocated zeros
    f.write_all_at(&noise(12_288, 3), 256 * MIB)?; // the short tail chunk
    f.sync_all()?;
    let b = backup_volume(&repo, &image, &VolumeBackupOptions::default(), None, &cancel).await?;
    assert!(b.bytes_read < 16 * MIB, "holes were read: {b:?}");
    assert!(b.bytes_data <= 4 * MIB, "{b:?}");
    let out = tmp.path().join("restored.img");
    let r = restore_volume(
        &repo,
        &b.snapshot_id,
        &out,
        &VolumeRestoreOptions::default(),
        None,
        &cancel,
    )
    .await?;
    assert!(r.created);
    assert_eq!(r.bytes_direct, 0, "an image file is written through the page cache");
    assert!(std::fs::read(&image)? == std::fs::read(&out)?, "restored image differs");
    let allocated = std::fs::metadata(&out)?.blocks() * 512;
    assert!(allocated <= 4 * MIB, "holes were filled: {allocated} bytes allocated");
    // Restoring over the existing (now dirty) image punches the gaps again.
    std::fs::OpenOptions::new()
        .write(true)
        .open(&out)?
        .write_all_at(&noise(1 << 20, 4), 200 * MIB)?;
    restore_volume(&repo, &b.snapshot_id, &out, &VolumeRestoreOptions::default(), None, &cancel)
        .await?;
    assert!(std::fs::read(&image)? == std::fs::read(&out)?, "re-restored image differs");
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn kinds_are_not_mixed_and_check_sees_missing_volume_data() -> TestResult {
    let cancel = CancellationToken::new();
    let tmp = tempfile::tempdir()?;
    let repo = repo_in(tmp.path()).await;
    let dir = tmp.path().join("tree");
    std::fs::create_dir_all(&dir)?;
    std::fs::write(dir.join("f"), b"file")?;
    let tree = backup_tree(&repo, &dir, &BackupOptions::default(), None, &cancel).await?;
    let image = tmp.path().join("v.img");
    std::fs::write(&image, noise(3 << 20, 5))?;
    let vol = backup_volume(&repo, &image, &VolumeBackupOptions::default(), None, &cancel).await?;
    let e = restore_volume(
        &repo,
        &tree.snapshot_id,
        &tmp.path().join("x.img"),
        &VolumeRestoreOptions::default(),
        None,
        &cancel,
    )
    .await
    .err()
    .ok_or("the restore succeeded")?;
    assert!(matches!(e, RepoError::WrongSnapshotKind { found: SnapshotKind::Tree, .. }), "{e}");
    assert!(!tmp.path().join("x.img").exists());
    assert!(
        restore(
            &repo,
            &vol.snapshot_id,
            &tmp.path().join("d"),
            &RestoreOptions::default(),
            None,
            &cancel
        )
        .await
        .is_err()
    );
    let options =
        VolumeBackupOptions { parent: Some(tree.snapshot_id), ..VolumeBackupOptions::default() };
    assert!(matches!(
        backup_volume(&repo, &image, &options, None, &cancel).await,
        Err(RepoError::InvalidInput { .. })
    ));
    // Remove the data packs: check names the volume snapshot's missing chunks.
    let data = tmp.path().join("repo/data");
    for e in walk_files(&data) {
        std::fs::remove_file(e)?;
    }
    let report = check(&repo, CheckOptions::default(), None, &cancel).await?;
    assert!(
        report.problems.iter().any(|p| p.contains("named by the index is missing")),
        "{:?}",
        report.problems
    );
    Ok(())
}

fn walk_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    for e in std::fs::read_dir(dir).into_iter().flatten().flatten() {
        let p = e.path();
        if p.is_dir() {
            out.extend(walk_files(&p));
        } else {
            out.push(p);
        }
    }
    out
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn cancellation_stops_backup_and_restore() -> TestResult {
    let tmp = tempfile::tempdir()?;
    let repo = repo_in(tmp.path()).await;
    let image = tmp.path().join("big.img");
    std::fs::write(&image, noise(96 << 20, 6))?;
    let cancel = CancellationToken::new();
    let fired = Arc::new(AtomicBool::new(false));
    let progress = {
        let (cancel, fired) = (cancel.clone(), Arc::clone(&fired));
        Arc::new(move |p: &Progress| {
            if p.bytes_done > 0 && !p.finished {
                fired.store(true, Ordering::Relaxed);
                cancel.cancel();
            }
        })
    };
    let options =
        VolumeBackupOptions { compression_level: 19, threads: 1, ..VolumeBackupOptions::default() };
    let r = backup_volume(&repo, &image, &options, Some(progress), &cancel).await;
    assert!(fired.load(Ordering::Relaxed), "no progress report before the end");
    assert!(matches!(r, Err(RepoError::Cancelled)), "{r:?}");
    assert!(repo.snapshots(&CancellationToken::new()).await?.is_empty());

    let ok = CancellationToken::new();
    let b = backup_volume(&repo, &image, &VolumeBackupOptions::default(), None, &ok).await?;
    let cancelled = CancellationToken::new();
    cancelled.cancel();
    let r = restore_volume(
        &repo,
        &b.snapshot_id,
        &tmp.path().join("out.img"),
        &VolumeRestoreOptions::default(),
        None,
        &cancelled,
    )
    .await;
    assert!(matches!(r, Err(RepoError::Cancelled)), "{r:?}");
    Ok(())
}

/// A backup told the allocated ranges reads only them; one told the ranges changed since its
/// parent reads only the chunks they touch and takes the rest from the parent unread; both
/// restore the whole volume bit for bit. A plan that does not fit its parent is refused.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn changed_ranges_are_all_a_backup_reads_and_the_restore_is_whole() -> TestResult {
    const CHUNK: u64 = 256 << 10;
    let cancel = CancellationToken::new();
    let tmp = tempfile::tempdir()?;
    let repo = repo_in(tmp.path()).await;
    let image = tmp.path().join("volume.img");
    let f = std::fs::File::create(&image)?;
    f.set_len(64 * MIB)?;
    f.write_all_at(&noise(8 << 20, 1), 4 * MIB)?;
    f.write_all_at(&noise(1 << 20, 2), 40 * MIB)?;
    f.sync_all()?;
    let allocated = vec![(4 * MIB, 8 * MIB), (40 * MIB, MIB)];
    let options = VolumeBackupOptions {
        read_plan: ReadPlan::Only(allocated),
        ..VolumeBackupOptions::default()
    };
    let first = backup_volume(&repo, &image, &options, None, &cancel).await?;
    assert_eq!((first.bytes_read, first.bytes_data), (9 * MIB, 9 * MIB), "{first:?}");

    // Inside the first write, in a gap, and zeros over part of the second write.
    f.write_all_at(&noise(4096, 3), 5 * MIB + 100)?;
    f.write_all_at(&noise(10_000, 4), 30 * MIB)?;
    f.write_all_at(&[0u8; 4096], 40 * MIB)?;
    f.sync_all()?;
    let changed = vec![(5 * MIB + 100, 4096), (30 * MIB, 10_000), (40 * MIB, 4096)];
    let options = VolumeBackupOptions {
        parent: Some(first.snapshot_id),
        read_plan: ReadPlan::ChangedSinceParent(changed.clone()),
        verify_unchanged: Some(0),
        ..VolumeBackupOptions::default()
    };
    let second = backup_volume(&repo, &image, &options, None, &cancel).await?;
    assert_eq!(second.bytes_read, 3 * CHUNK, "three chunks changed: {second:?}");
    assert_eq!(second.bytes_from_parent, 9 * MIB - 2 * CHUNK, "{second:?}");
    assert_eq!(second.bytes_data, 9 * MIB + CHUNK, "{second:?}");
    restores_bit_for_bit(&repo, &second, &image).await?;

    // A parent of another size cannot lend its chunks: refused, nothing saved.
    f.set_len(65 * MIB)?;
    let before = repo.snapshots(&cancel).await?.len();
    let err = backup_volume(&repo, &image, &options, None, &cancel)
        .await
        .expect_err("a resized volume took its parent's chunks");
    assert!(
        matches!(&err, RepoError::InvalidInput { reason, .. } if reason.contains("resized")),
        "{err}"
    );
    assert_eq!(repo.snapshots(&cancel).await?.len(), before);
    // Ranges the storage system gave for a volume of another size are about something else.
    let other = VolumeBackupOptions {
        read_plan: ReadPlan::Only(vec![(0, MIB)]),
        plan_size: Some(64 * MIB),
        ..VolumeBackupOptions::default()
    };
    let err = backup_volume(&repo, &image, &other, None, &cancel)
        .await
        .expect_err("ranges for a 64 MiB volume were used on a 65 MiB one");
    assert!(
        matches!(&err, RepoError::InvalidInput { what: "read plan", reason } if reason.contains("describe a volume of")),
        "{err}"
    );
    assert_eq!(repo.snapshots(&cancel).await?.len(), before);
    // Without a parent, changed ranges mean nothing.
    let orphan = VolumeBackupOptions { parent: None, ..options };
    let err = backup_volume(&repo, &image, &orphan, None, &cancel)
        .await
        .expect_err("changed ranges without a parent were taken");
    assert!(matches!(err, RepoError::InvalidInput { .. }), "{err}");
    Ok(())
}

/// A delta that leaves out a change: the unchanged chunks read to check it (all of them here)
/// catch the difference, and nothing is saved; by default a sample is read (8 chunks on a small
/// volume) and a complete delta passes.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_delta_that_leaves_out_a_change_is_refused() -> TestResult {
    const CHUNK: u64 = 256 << 10;
    let cancel = CancellationToken::new();
    let tmp = tempfile::tempdir()?;
    let repo = repo_in(tmp.path()).await;
    let image = tmp.path().join("volume.img");
    let f = std::fs::File::create(&image)?;
    f.set_len(64 * MIB)?;
    f.write_all_at(&noise(8 << 20, 1), 4 * MIB)?;
    f.sync_all()?;
    let first =
        backup_volume(&repo, &image, &VolumeBackupOptions::default(), None, &cancel).await?;

    f.write_all_at(&noise(4096, 2), 5 * MIB)?;
    f.write_all_at(&noise(4096, 3), 50 * MIB)?;
    f.sync_all()?;
    let before = repo.snapshots(&cancel).await?.len();
    // The change at 50 MiB left out.
    let partial = VolumeBackupOptions {
        parent: Some(first.snapshot_id),
        read_plan: ReadPlan::ChangedSinceParent(vec![(5 * MIB, 4096)]),
        verify_unchanged: Some(u64::MAX),
        ..VolumeBackupOptions::default()
    };
    let err = backup_volume(&repo, &image, &partial, None, &cancel)
        .await
        .expect_err("an incomplete delta was taken");
    assert!(
        matches!(&err, RepoError::InvalidInput { what: "read plan", reason }
            if reason.contains(&format!("offset {}", 50 * MIB)) && reason.contains("incomplete")),
        "{err}"
    );
    assert_eq!(repo.snapshots(&cancel).await?.len(), before, "nothing saved");

    // The complete delta, with the default check: 2 changed chunks and 8 sampled ones read.
    let complete = VolumeBackupOptions {
        read_plan: ReadPlan::ChangedSinceParent(vec![(5 * MIB, 4096), (50 * MIB, 4096)]),
        verify_unchanged: None,
        ..partial
    };
    let second = backup_volume(&repo, &image, &complete, None, &cancel).await?;
    assert_eq!(second.bytes_read, 10 * CHUNK, "{second:?}");
    restores_bit_for_bit(&repo, &second, &image).await?;
    Ok(())
}

/// Restores `backup` next to `image` and compares the two.
async fn restores_bit_for_bit(
    repo: &ferry_repo::Repository,
    backup: &ferry_repo::VolumeBackupSummary,
    image: &std::path::Path,
) -> TestResult {
    let out = image.with_extension("restored");
    let options = VolumeRestoreOptions::default();
    let cancel = CancellationToken::new();
    restore_volume(repo, &backup.snapshot_id, &out, &options, None, &cancel).await?;
    assert!(std::fs::read(image)? == std::fs::read(&out)?, "the restored volume differs");
    std::fs::remove_file(&out)?;
    Ok(())
}

/// A volume's default 256 KiB chunks are compressed together in frames of about 1 MiB (a
/// frame holds several chunks; each chunk is indexed as framed data), and the volume restores
/// bit for bit; chunks of 512 KiB and more are stored alone.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn default_volume_chunks_are_stored_in_frames_and_restore_whole() -> TestResult {
    use ferry_repo::format::ObjectKind;
    let cancel = CancellationToken::new();
    let tmp = tempfile::tempdir()?;
    let repo = repo_in(tmp.path()).await;
    let image = tmp.path().join("text.img");
    std::fs::write(&image, common::text_image((16 * MIB) as usize))?;
    for (chunk_size, framed) in [(256 << 10, true), (512 << 10, false)] {
        let options = VolumeBackupOptions { chunk_size, ..VolumeBackupOptions::default() };
        let b = backup_volume(&repo, &image, &options, None, &cancel).await?;
        let locations = common::volume_chunk_locations(&repo, &b.snapshot_id).await;
        let want = if framed { ObjectKind::FramedData } else { ObjectKind::DataBlob };
        assert!(locations.iter().all(|l| l.kind == want), "chunk size {chunk_size}");
        let places: std::collections::BTreeSet<_> =
            locations.iter().map(|l| (l.pack, l.offset)).collect();
        let chunks = locations.len();
        if framed {
            assert!(places.len() * 3 <= chunks, "{} frames for {chunks} chunks", places.len());
        } else {
            assert_eq!(places.len(), chunks);
        }
        restores_bit_for_bit(&repo, &b, &image).await?;
    }
    let report =
        check(&repo, CheckOptions { read_data: true, subset: None }, None, &cancel).await?;
    assert!(report.is_ok(), "{:?}", report.problems);
    Ok(())
}
