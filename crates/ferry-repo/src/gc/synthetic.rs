//! A synthetic repository of many tiny chunks, for measuring garbage collection at scale
//! (the `gc_memory` example). Not for production use.

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{
    BlobId, ChunkRef, FileContent, IndexPack, Metadata, Node, NodeBody, ObjectKind, PackBuilder,
    Snapshot, SnapshotId, Summary, Timestamp, TreePage,
};
use crate::repo::writer::write_index;
use crate::repo::{Repository, layout};

/// Blobs per synthetic pack (as many 1 MiB chunks as a 16 MiB pack holds).
const BLOBS_PER_PACK: u32 = 16;
/// Packs per index file.
const PACKS_PER_INDEX: usize = 1000;

/// Stores `files * chunks_per_file` distinct 16-byte data blobs in packs of 16, indexed, and
/// one snapshot per `(first, last)` file range in `snapshots`, each a directory of those files.
///
/// # Errors
/// Store failures.
#[doc(hidden)]
pub async fn populate(
    repo: &Repository,
    files: u32,
    chunks_per_file: u32,
    snapshots: &[(u32, u32)],
    cancel: &CancellationToken,
) -> RepoResult<Vec<SnapshotId>> {
    let keys = repo.keys().clone();
    let chunk = |n: u64| -> (BlobId, [u8; 16]) {
        let mut raw = [0u8; 16];
        raw[..8].copy_from_slice(&n.to_le_bytes());
        (keys.blob_id(&raw), raw)
    };
    let total = u64::from(files) * u64::from(chunks_per_file);
    let mut indexed: Vec<IndexPack> = Vec::new();
    let mut builder = PackBuilder::new();
    for n in 0..total {
        let (id, raw) = chunk(n);
        builder.add(&keys, id, ObjectKind::DataBlob, 0, &raw);
        if builder.entries().len() as u32 == BLOBS_PER_PACK || n + 1 == total {
            let sealed = std::mem::take(&mut builder).finish(&keys.cipher, repo.config().format);
            let key = layout::pack(&sealed.id)?;
            let size = sealed.bytes.len() as u64;
            repo.store()
                .put_if_absent(&key, Bytes::from(sealed.bytes), cancel)
                .await
                .map_err(|e| RepoError::store("upload pack", &key, e))?;
            indexed.push(IndexPack { id: sealed.id, size, entries: sealed.entries });
            if indexed.len() == PACKS_PER_INDEX {
                write_index(repo, std::mem::take(&mut indexed), cancel).await?;
            }
        }
    }
    let mut out = Vec::new();
    for (first, last) in snapshots {
        let mut tree = PackBuilder::new();
        let mut pages = Vec::new();
        let mut entries = Vec::new();
        for f in *first..(*last).min(files) {
            let chunks: Vec<ChunkRef> = (0..chunks_per_file)
                .map(|c| ChunkRef {
                    id: chunk(u64::from(f) * u64::from(chunks_per_file) + u64::from(c)).0,
                    len: 16,
                })
                .collect();
            let content =
                FileContent { size: 16 * u64::from(chunks_per_file), extents: None, chunks };
            entries.push(Node {
                name: format!("f{f:09}").into_bytes(),
                body: NodeBody::File(content),
                meta: Metadata::default(),
                hardlink: None,
                error: None,
            });
            if entries.len() == TreePage::MAX_ENTRIES || f + 1 == (*last).min(files) {
                let raw = TreePage { entries: std::mem::take(&mut entries) }.encode();
                let id = keys.blob_id(&raw);
                tree.add(&keys, id, ObjectKind::TreeBlob, 3, &raw);
                pages.push(id);
            }
        }
        if !tree.is_empty() {
            let sealed = tree.finish(&keys.cipher, repo.config().format);
            let key = layout::pack(&sealed.id)?;
            let size = sealed.bytes.len() as u64;
            repo.store()
                .put_if_absent(&key, Bytes::from(sealed.bytes), cancel)
                .await
                .map_err(|e| RepoError::store("upload pack", &key, e))?;
            indexed.push(IndexPack { id: sealed.id, size, entries: sealed.entries });
        }
        write_index(repo, std::mem::take(&mut indexed), cancel).await?;
        let snapshot = Snapshot {
            time: Timestamp::default(),
            hostname: "synthetic".into(),
            source: format!("files {first}..{last}"),
            paths: Vec::new(),
            tags: Vec::new(),
            parent: None,
            root: Node {
                name: Vec::new(),
                body: NodeBody::Dir { pages },
                meta: Metadata::default(),
                hardlink: None,
                error: None,
            },
            summary: Summary::default(),
            program: "ferry synthetic".into(),
        };
        out.push(repo.save_snapshot(&snapshot, cancel).await?);
    }
    Ok(out)
}
