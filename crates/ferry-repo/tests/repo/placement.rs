//! Where blobs go: data blobs spread at random over two open packs, a small backup's leftovers
//! merged into one pack, and the format a repository is created with (its config's version
//! byte, its pack headers).

use crate::common;

use std::collections::BTreeSet;
use std::path::Path;
use std::sync::Arc;

use common::{TestResult, noise};
use ferry_repo::browse::find_node;
use ferry_repo::format::{ChunkerParams, HEADER_PADDING, NodeBody, PackParams, header_length};
use ferry_repo::{BackupOptions, InitOptions, RepoFormat, Repository, backup_tree};
use ferry_store::{MemoryStore, ObjectKey, ObjectStore};
use tokio_util::sync::CancellationToken;

/// A repository with small chunks (16/64/256 KiB) and 1 MiB packs, so a few MiB make many of
/// both.
async fn small_repo(
    format: RepoFormat,
) -> Result<(Repository, Arc<MemoryStore>), ferry_repo::RepoError> {
    let store = Arc::new(MemoryStore::new());
    let options = InitOptions {
        chunker: ChunkerParams { min_size: 16 << 10, avg_size: 64 << 10, max_size: 256 << 10 },
        packs: PackParams { target_size: 1 << 20 },
        format,
        ..common::options()
    };
    let dyn_store: Arc<dyn ObjectStore> = store.clone();
    let (repo, _) =
        Repository::init(dyn_store, b"secret", &options, &CancellationToken::new()).await?;
    Ok((repo, store))
}

/// The packs stored under `data/`.
async fn packs(store: &MemoryStore) -> Result<Vec<ObjectKey>, Box<dyn std::error::Error>> {
    let listed = store.list("data/", &CancellationToken::new()).await?;
    Ok(listed.into_iter().map(|o| o.key).collect())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_files_chunks_are_spread_over_packs_not_stored_in_order() -> TestResult {
    let cancel = CancellationToken::new();
    let (repo, _) = small_repo(RepoFormat::V2).await?;
    let dir = tempfile::tempdir()?;
    std::fs::write(dir.path().join("large"), noise(8 << 20, 7))?;
    let summary = backup_tree(&repo, dir.path(), &BackupOptions::default(), None, &cancel).await?;
    let snapshot = repo.load_snapshot(&summary.snapshot_id, &cancel).await?;
    let node = find_node(&repo, &snapshot, Path::new("large"), &cancel).await?;
    let NodeBody::File(content) = &node.body else {
        panic!("a file's node: {:?}", node.body);
    };
    let mut in_pack = Vec::new();
    for chunk in &content.chunks {
        in_pack.push(repo.locate(&chunk.id, &cancel).await?.ok_or("chunk not indexed")?.pack);
    }
    let distinct: BTreeSet<_> = in_pack.iter().collect();
    let switches = in_pack.windows(2).filter(|w| w[0] != w[1]).count();
    // Stored in order, the chunks would change pack once per pack (about 8 times); placed at
    // random between two open packs, about every other pair of neighbours is split.
    assert!(in_pack.len() > 60, "{} chunks", in_pack.len());
    assert!(
        switches > 3 * distinct.len(),
        "{} chunks in {} packs changed pack only {switches} times",
        in_pack.len(),
        distinct.len()
    );
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_small_backup_writes_one_data_pack() -> TestResult {
    let cancel = CancellationToken::new();
    for format in [RepoFormat::V1, RepoFormat::V2, RepoFormat::V3] {
        let (repo, store) = small_repo(format).await?;
        let dir = tempfile::tempdir()?;
        for n in 0..8u8 {
            std::fs::write(dir.path().join(format!("f{n}")), noise(3000, n))?;
        }
        backup_tree(&repo, dir.path(), &BackupOptions::default(), None, &cancel).await?;
        // Eight one-chunk files placed at random between two open packs (both used, but for a
        // chance of 1 in 128), then merged: one data pack and one tree pack.
        let stored = packs(&store).await?;
        assert_eq!(stored.len(), 2, "format {format}: {stored:?}");
    }
    Ok(())
}

#[tokio::test(flavor = "multi_thread", worker_threads = 2)]
async fn a_repository_keeps_its_format_in_its_config_and_pack_headers() -> TestResult {
    let cancel = CancellationToken::new();
    for (format, padded) in
        [(RepoFormat::V1, false), (RepoFormat::V2, true), (RepoFormat::V3, true)]
    {
        let (repo, store) = small_repo(format).await?;
        let config = store.get(&ObjectKey::new("config")?, &cancel).await?;
        assert_eq!(config[0], format.byte());
        let dir = tempfile::tempdir()?;
        std::fs::write(dir.path().join("f"), noise(3000, 1))?;
        backup_tree(&repo, dir.path(), &BackupOptions::default(), None, &cancel).await?;
        let mut headers = Vec::new();
        for key in packs(&store).await? {
            let bytes = store.get(&key, &cancel).await?;
            headers.push(header_length(&bytes[bytes.len() - 4..])? as usize);
        }
        // One data pack, one tree pack. A sealed header: version, kind, nonce, compression
        // mode and length, tag (47 bytes) around the body; formats 2 and 3 pad data packs'
        // bodies.
        let padded_ones = headers.iter().filter(|h| (*h - 47) % HEADER_PADDING == 0).count();
        assert_eq!((headers.len(), padded_ones), (2, usize::from(padded)), "format {format}");
        // Opened again, it is still of its format.
        let dyn_store: Arc<dyn ObjectStore> = store.clone();
        let reopened = Repository::open(dyn_store, b"secret", &cancel).await?;
        assert_eq!(reopened.config().format, format);
    }
    assert_eq!(InitOptions::default().format, RepoFormat::V3, "new repositories are format 3");
    Ok(())
}
