//! Frames (format 3): small files compressed together, read back one by one, checked, and
//! damage in a frame found and named.

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use bytes::Bytes;
use common::{TestResult, assert_same_tree, memory_repo_of, noise};
use ferry_repo::browse::find_node;
use ferry_repo::format::{FRAMED_MAX, NodeBody, ObjectKind};
use ferry_repo::{
    BackupOptions, CheckOptions, RepoError, RepoFormat, Repository, RestoreOptions, backup_tree,
    check, restore,
};
use ferry_store::{MemoryStore, ObjectKey, ObjectStore};
use tokio_util::sync::CancellationToken;

/// 400 source-like files of a few hundred bytes to 2 KiB, alike in their words as a source
/// tree's files are (each alone too short for zstd to learn them), and, with `large`, a
/// large file of noise.
fn source_tree(root: &Path, large: bool) -> std::io::Result<()> {
    std::fs::create_dir_all(root.join("src"))?;
    for n in 0..400u32 {
        let text: String = (0..4 + n % 24)
            .map(|i| {
                let v = n.wrapping_mul(2_654_435_761).wrapping_add(i * 40_503);
                format!(
                    "pub fn item_{v:x}(value: u32) -> Option<u32> {{ value.checked_mul({i}) }}\n"
                )
            })
            .collect();
        std::fs::write(root.join("src").join(format!("f{n}.rs")), text)?;
    }
    if large {
        std::fs::write(root.join("large"), noise(3 << 20, 9))?;
    }
    Ok(())
}

async fn data_bytes(store: &MemoryStore) -> Result<u64, Box<dyn std::error::Error>> {
    let listed = store.list("data/", &CancellationToken::new()).await?;
    Ok(listed.iter().map(|m| m.size).sum())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn small_files_share_frames_read_back_and_store_less_than_alone() -> TestResult {
    let cancel = CancellationToken::new();
    let src = tempfile::tempdir()?;
    source_tree(src.path(), true)?;
    let (repo, store) = memory_repo_of(RepoFormat::V3).await?;
    let options = BackupOptions { threads: 2, ..BackupOptions::default() };
    let summary = backup_tree(&repo, src.path(), &options, None, &cancel).await?;

    // Every small file's blob is in a frame, the large file's chunks are not; a frame holds
    // many blobs.
    let snapshot = repo.load_snapshot(&summary.snapshot_id, &cancel).await?;
    let mut frames = BTreeSet::new();
    for n in 0..400u32 {
        let node = find_node(&repo, &snapshot, Path::new(&format!("src/f{n}.rs")), &cancel).await?;
        let NodeBody::File(content) = &node.body else { panic!("a file: {:?}", node.body) };
        for chunk in &content.chunks {
            let loc = repo.locate(&chunk.id, &cancel).await?.ok_or("chunk not indexed")?;
            assert_eq!(loc.kind, ObjectKind::FramedData, "f{n}.rs");
            frames.insert((loc.pack, loc.offset));
        }
    }
    assert!(frames.len() <= 10, "400 files in {} frames", frames.len());
    let large = find_node(&repo, &snapshot, Path::new("large"), &cancel).await?;
    let NodeBody::File(content) = &large.body else { panic!("a file") };
    for chunk in &content.chunks {
        let loc = repo.locate(&chunk.id, &cancel).await?.ok_or("chunk not indexed")?;
        let expected = if chunk.len as usize >= FRAMED_MAX {
            ObjectKind::DataBlob
        } else {
            ObjectKind::FramedData
        };
        assert_eq!(loc.kind, expected, "a chunk of {} bytes", chunk.len);
    }

    // Restored whole, through a fresh handle too; checked clean reading every byte.
    for reader in [repo.clone(), reopen(&store).await?] {
        let out = tempfile::tempdir()?;
        restore(
            &reader,
            &summary.snapshot_id,
            out.path(),
            &RestoreOptions::default(),
            None,
            &cancel,
        )
        .await?;
        assert_same_tree(src.path(), out.path());
    }
    let report =
        check(&repo, CheckOptions { read_data: true, subset: None }, None, &cancel).await?;
    assert!(report.is_ok(), "{:?}", report.problems);
    // Every blob counted once, and the index's shares of each frame add up to the frames'
    // sealed bytes (to within a byte a blob, rounding), so the data counted is what the data
    // packs hold less their headers and prefixes.
    let stats = repo.stats(&cancel).await?;
    let blobs = 400 + content.chunks.len() as u64;
    assert_eq!(stats.data_blobs, blobs);
    let mut sealed = 0u64;
    let mut seen = BTreeSet::new();
    for n in 0..400u32 {
        let node = find_node(&repo, &snapshot, Path::new(&format!("src/f{n}.rs")), &cancel).await?;
        let NodeBody::File(small) = &node.body else { panic!("a file") };
        for chunk in &small.chunks {
            let loc = repo.locate(&chunk.id, &cancel).await?.ok_or("chunk not indexed")?;
            if seen.insert((loc.pack, loc.offset)) {
                sealed += u64::from(loc.length);
            }
        }
    }
    for chunk in &content.chunks {
        let loc = repo.locate(&chunk.id, &cancel).await?.ok_or("chunk not indexed")?;
        if seen.insert((loc.pack, loc.offset)) {
            sealed += u64::from(loc.length);
        }
    }
    assert!(
        stats.data_stored_bytes <= sealed && sealed - stats.data_stored_bytes <= blobs,
        "shares {} of frames and blobs of {sealed} bytes",
        stats.data_stored_bytes
    );

    // The small files alone: format 2 (every blob compressed alone) stores at least half as
    // much again as format 3 (79 and 132 KB when written; tree packs included in both).
    let small = tempfile::tempdir()?;
    source_tree(small.path(), false)?;
    let (framed, framed_store) = memory_repo_of(RepoFormat::V3).await?;
    let (alone, alone_store) = memory_repo_of(RepoFormat::V2).await?;
    backup_tree(&framed, small.path(), &options, None, &cancel).await?;
    backup_tree(&alone, small.path(), &options, None, &cancel).await?;
    let framed_bytes = data_bytes(&framed_store).await?;
    let alone_bytes = data_bytes(&alone_store).await?;
    assert!(
        3 * framed_bytes < 2 * alone_bytes,
        "format 3 {framed_bytes} bytes, format 2 {alone_bytes}"
    );
    // A second backup of the same tree stores nothing new.
    let again = backup_tree(&repo, src.path(), &options, None, &cancel).await?;
    assert_eq!(again.bytes_new, 0);
    Ok(())
}

async fn reopen(store: &Arc<MemoryStore>) -> Result<Repository, RepoError> {
    let s: Arc<dyn ObjectStore> = store.clone();
    Repository::open(s, b"secret", &CancellationToken::new()).await
}

/// A byte flipped inside a frame: restore fails as corrupt naming the pack (it writes no
/// file's data from the frame), and `check --read-data` names every blob of the frame.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_damaged_frame_fails_restore_and_check_names_its_blobs() -> TestResult {
    let cancel = CancellationToken::new();
    let src = tempfile::tempdir()?;
    for n in 0..20u8 {
        std::fs::write(src.path().join(format!("f{n}")), noise(2000, n))?;
    }
    let (repo, store) = memory_repo_of(RepoFormat::V3).await?;
    // One worker: one frame holds all twenty files.
    let options = BackupOptions { threads: 1, ..BackupOptions::default() };
    let summary = backup_tree(&repo, src.path(), &options, None, &cancel).await?;
    let packs = store.list("data/", &cancel).await?;
    let data_pack = packs.iter().max_by_key(|m| m.size).ok_or("no pack")?;
    // The frame starts after the pack's two-byte prefix; its middle is well inside.
    let key: &ObjectKey = &data_pack.key;
    let mut bytes = store.get(key, &cancel).await?.to_vec();
    bytes[2 + 24 + 1000] ^= 0x20;
    store.delete(key, &cancel).await?;
    store.put_if_absent(key, Bytes::from(bytes), &cancel).await?;
    let repo = reopen(&store).await?;
    let out = tempfile::tempdir()?;
    let restored =
        restore(&repo, &summary.snapshot_id, out.path(), &RestoreOptions::default(), None, &cancel)
            .await;
    match restored {
        Err(RepoError::Corrupt { object, .. }) => {
            assert!(object.contains(key.as_str()), "{object}")
        }
        other => panic!("expected a corruption error, got {other:?}"),
    }
    let report =
        check(&repo, CheckOptions { read_data: true, subset: None }, None, &cancel).await?;
    let framed = report.problems.iter().filter(|p| p.starts_with("framed data blob")).count();
    assert_eq!(framed, 20, "{:?}", report.problems);
    Ok(())
}

/// 3,000 tiny files in the frames of two backup workers, restored by four threads in batches
/// of at most 512 files: every batch needs the same few frames, fetched by one and waited for
/// by the others; the tree comes back exactly, and again from a fresh handle.
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn batches_that_share_frames_restore_every_file() -> TestResult {
    let cancel = CancellationToken::new();
    let src = tempfile::tempdir()?;
    for d in 0..6 {
        let dir = src.path().join(format!("d{d}"));
        std::fs::create_dir_all(&dir)?;
        for n in 0..500u32 {
            std::fs::write(
                dir.join(format!("f{n}")),
                format!("file {d}/{n}\n").repeat(1 + n as usize % 9),
            )?;
        }
    }
    let (repo, store) = memory_repo_of(RepoFormat::V3).await?;
    let options = BackupOptions { threads: 2, ..BackupOptions::default() };
    let summary = backup_tree(&repo, src.path(), &options, None, &cancel).await?;
    for reader in [repo.clone(), reopen(&store).await?] {
        let out = tempfile::tempdir()?;
        let options = RestoreOptions { threads: 4, ..RestoreOptions::default() };
        restore(&reader, &summary.snapshot_id, out.path(), &options, None, &cancel).await?;
        assert_same_tree(src.path(), out.path());
    }
    Ok(())
}

/// Sums the bytes of ranged reads of data packs, each read held back a little so that
/// restore batches overlap (a hook for [`ferry_store::Hooked`]).
#[derive(Debug, Default)]
struct RangedBytes(
    std::sync::atomic::AtomicU64,
    std::sync::atomic::AtomicU64,
    /// The longest range read.
    std::sync::atomic::AtomicU64,
);

#[async_trait::async_trait]
impl ferry_store::Hook for RangedBytes {
    async fn before(&self, call: ferry_store::Call<'_>) {
        if let ferry_store::Call::GetRange(key, _, len) = call
            && key.as_str().starts_with("data/")
        {
            self.0.fetch_add(len, std::sync::atomic::Ordering::Relaxed);
            self.1.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
            self.2.fetch_max(len, std::sync::atomic::Ordering::Relaxed);
            tokio::time::sleep(std::time::Duration::from_millis(20)).await;
        }
    }
}

/// Each frame is downloaded once, however many restore batches need its files: 3,000 small
/// files of noise (frames of 1 MiB, larger than a merge gap, so a read seldom takes in a frame
/// it does not want), restored by four threads in batches that overlap over a slowed store,
/// download no more than the data packs hold, give or take a fifth. (Fetched per batch, frames
/// a batch shares with the next were downloaded 2.3 to 2.6 times.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_restore_downloads_each_frame_once() -> TestResult {
    let cancel = CancellationToken::new();
    let src = tempfile::tempdir()?;
    for d in 0..6u32 {
        let dir = src.path().join(format!("d{d}"));
        std::fs::create_dir_all(&dir)?;
        for n in 0..500u32 {
            let mut body = vec![0; 1000 + (n as usize * 7) % 2000];
            blake3::Hasher::new()
                .update(&[d as u8, (n >> 8) as u8, n as u8])
                .finalize_xof()
                .fill(&mut body);
            std::fs::write(dir.join(format!("f{n}")), body)?;
        }
    }
    let (repo, store) = memory_repo_of(RepoFormat::V3).await?;
    let options = BackupOptions { threads: 2, ..BackupOptions::default() };
    let summary = backup_tree(&repo, src.path(), &options, None, &cancel).await?;
    let packs = data_bytes(&store).await?;
    assert!(packs > 5 << 20, "about 6 MiB of frames: {packs}");

    let inner: Arc<dyn ObjectStore> = store.clone();
    let hooked = Arc::new(ferry_store::Hooked::new(inner, RangedBytes::default()));
    let reader = Repository::open(hooked.clone(), b"secret", &cancel).await?;
    let out = tempfile::tempdir()?;
    let options = RestoreOptions { threads: 4, ..RestoreOptions::default() };
    restore(&reader, &summary.snapshot_id, out.path(), &options, None, &cancel).await?;
    assert_same_tree(src.path(), out.path());
    let down = hooked.hook().0.load(std::sync::atomic::Ordering::Relaxed);
    // A small last frame of a worker can lie in a merge gap of another batch's read: a few
    // hundred KiB of slack, where frames fetched per batch came to over twice the packs.
    assert!(down > packs / 2, "the data came by ranged reads: {down} of {packs} bytes");
    assert!(down <= packs + packs / 5, "{down} bytes downloaded of {packs} bytes of data packs");
    Ok(())
}

/// A volume restore reads each stored byte at most once, by pack in reads of at most 4 MiB,
/// wherever on the volume its chunks go: an image of 64 KiB chunks (so every chunk is framed)
/// with 300 islands of 8 KiB between holes, one island written twice (the same chunk at two
/// offsets), and 12 MiB of noise in three places, restored through a slowed, counting store.
/// (Read by device range, frames and packs were fetched again by each range that had a chunk
/// in them.)
#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_volume_restore_reads_each_stored_byte_once() -> TestResult {
    use std::os::unix::fs::FileExt;
    let cancel = CancellationToken::new();
    let tmp = tempfile::tempdir()?;
    let image = tmp.path().join("volume.img");
    let f = std::fs::File::create(&image)?;
    f.set_len(96 << 20)?;
    let island = |n: u64| {
        let mut island = vec![0; 8192];
        blake3::Hasher::new().update(&n.to_le_bytes()).finalize_xof().fill(&mut island);
        island
    };
    for n in 0..300u64 {
        f.write_all_at(&island(n), n * (256 << 10) + 65_536)?;
    }
    f.write_all_at(&island(7), 300 * (256 << 10) + 65_536)?;
    for (i, at) in [10u64, 40, 70].into_iter().enumerate() {
        f.write_all_at(&noise(4 << 20, i as u8), (at << 20) + 128 * 1024)?;
    }
    f.sync_all()?;
    let (repo, store) = memory_repo_of(RepoFormat::V3).await?;
    let options =
        ferry_repo::VolumeBackupOptions { threads: 2, chunk_size: 64 << 10, ..Default::default() };
    let b = ferry_repo::backup_volume(&repo, &image, &options, None, &cancel).await?;
    let map =
        ferry_repo::VolumeMap::from_snapshot(&repo.load_snapshot(&b.snapshot_id, &cancel).await?)?;
    let mut ids = std::collections::HashMap::new();
    for (offset, chunk) in &map.chunks {
        let loc = repo.locate(&chunk.id, &cancel).await?.ok_or("chunk not indexed")?;
        assert_eq!(loc.kind, ObjectKind::FramedData, "the chunk at {offset}");
        *ids.entry(chunk.id).or_insert(0) += 1;
    }
    assert!(ids.values().any(|n| *n == 2), "one chunk at two offsets");
    let listed = store.list("data/", &cancel).await?;
    let packs: u64 = listed.iter().map(|m| m.size).sum();

    let inner: Arc<dyn ObjectStore> = store.clone();
    let hooked = Arc::new(ferry_store::Hooked::new(inner, RangedBytes::default()));
    let reader = Repository::open(hooked.clone(), b"secret", &cancel).await?;
    let out = tmp.path().join("restored.img");
    let restore_options = ferry_repo::VolumeRestoreOptions { threads: 4, ..Default::default() };
    ferry_repo::restore_volume(&reader, &b.snapshot_id, &out, &restore_options, None, &cancel)
        .await?;
    let (a, b) = (std::fs::File::open(&image)?, std::fs::File::open(&out)?);
    assert_eq!(a.metadata()?.len(), b.metadata()?.len());
    let (mut x, mut y) = (vec![0; 1 << 20], vec![0; 1 << 20]);
    for block in 0..96u64 {
        a.read_exact_at(&mut x, block << 20)?;
        b.read_exact_at(&mut y, block << 20)?;
        assert!(x == y, "MiB {block} of the restored image differs");
    }
    let down = hooked.hook().0.load(std::sync::atomic::Ordering::Relaxed);
    let reads = hooked.hook().1.load(std::sync::atomic::Ordering::Relaxed);
    assert!(down > packs / 2, "the data came by ranged reads: {down} of {packs} bytes");
    assert!(down <= packs, "{down} bytes downloaded of {packs} bytes of data packs");
    // By pack, in reads of at most 4 MiB (each ends within a frame's length of the cap; a
    // frame is under 2 MiB), not once for each device range a pack has chunks in.
    let most: u64 = listed.iter().map(|m| m.size.div_ceil(2 << 20)).sum();
    assert!(reads <= most, "{reads} reads of {} packs ({packs} bytes)", listed.len());
    let longest = hooked.hook().2.load(std::sync::atomic::Ordering::Relaxed);
    assert!(longest <= 4 << 20, "a read of {longest} bytes");
    assert!(listed.iter().any(|m| m.size > 4 << 20), "a pack larger than a read");
    Ok(())
}
