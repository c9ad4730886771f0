//! A synthetic repository of many tiny chunks, for measuring garbage collection at scale
//! (the `gc_memory` example). Not for production use.

use futures::{StreamExt, TryStreamExt};
use tokio_util::sync::CancellationToken;

use crate::error::RepoResult;
use crate::format::{
    BlobId, ChunkRef, FileContent, IndexPack, Metadata, Node, NodeBody, ObjectKind, PackBuilder,
    Snapshot, SnapshotId, Summary, Timestamp, TreePage,
};
use crate::gc::repack::put_pack;
use crate::repo::Repository;
use crate::repo::writer::write_index;

/// Blobs per synthetic pack (as many 1 MiB chunks as a 16 MiB pack holds).
const BLOBS_PER_PACK: u32 = 16;
/// Packs per index file.
const PACKS_PER_INDEX: usize = 1000;
/// Packs stored at once.
const PUTS_AT_ONCE: usize = 32;

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
    let mut sealed_packs = Vec::new();
    for n in 0..total {
        let (id, raw) = chunk(n);
        builder.add(&keys, id, ObjectKind::DataBlob, 0, &raw);
        if builder.entries().len() as u32 == BLOBS_PER_PACK || n + 1 == total {
            sealed_packs
                .push(std::mem::take(&mut builder).finish(&keys.cipher, repo.config().format));
        }
        if sealed_packs.len() == PACKS_PER_INDEX || (n + 1 == total && !sealed_packs.is_empty()) {
            // Stored several at once: a file store syncs each object.
            let stored: Vec<IndexPack> = futures::stream::iter(std::mem::take(&mut sealed_packs))
                .map(|sealed| put_pack(repo, sealed, "upload pack", cancel))
                .buffer_unordered(PUTS_AT_ONCE)
                .try_collect()
                .await?;
            indexed.extend(stored);
            write_index(repo, std::mem::take(&mut indexed), cancel).await?;
        }
    }
    let target = repo.config().packs.target_size as usize;
    let add_page = |tree: &mut PackBuilder, pages: &mut Vec<BlobId>, entries: Vec<Node>| {
        let raw = TreePage { entries }.encode();
        let id = keys.blob_id(&raw);
        tree.add(&keys, id, ObjectKind::TreeBlob, 3, &raw);
        pages.push(id);
    };
    let mut out = Vec::new();
    for (first, last) in snapshots {
        let mut tree = PackBuilder::new();
        let mut pages = Vec::new();
        let mut entries = Vec::new();
        let mut page_bytes = 0;
        let last = (*last).min(files);
        for f in *first..last {
            let chunks: Vec<ChunkRef> = (0..chunks_per_file)
                .map(|c| ChunkRef {
                    id: chunk(u64::from(f) * u64::from(chunks_per_file) + u64::from(c)).0,
                    len: 16,
                })
                .collect();
            let content =
                FileContent { size: 16 * u64::from(chunks_per_file), extents: None, chunks };
            let node = Node {
                name: format!("f{f:09}").into_bytes(),
                body: NodeBody::File(content),
                meta: Metadata::default(),
                hardlink: None,
                error: None,
            };
            // Pages close as a backup's do: at MAX_ENTRIES, or before MAX_BYTES.
            let len = TreePage { entries: vec![node.clone()] }.encode().len();
            if !entries.is_empty()
                && (entries.len() == TreePage::MAX_ENTRIES
                    || page_bytes + len > TreePage::MAX_BYTES)
            {
                add_page(&mut tree, &mut pages, std::mem::take(&mut entries));
                page_bytes = 0;
            }
            entries.push(node);
            page_bytes += len;
            if f + 1 == last {
                add_page(&mut tree, &mut pages, std::mem::take(&mut entries));
            }
            // Tree packs are sealed at the target size, as a backup's are.
            if tree.size() >= target || (f + 1 == last && !tree.is_empty()) {
                let sealed = std::mem::take(&mut tree).finish(&keys.cipher, repo.config().format);
                indexed.push(put_pack(repo, sealed, "upload pack", cancel).await?);
            }
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
