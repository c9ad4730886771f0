//! Index compaction: rewrites the index without the packs about to be deleted.
//!
//! The old files are read one at a time; their surviving packs go into new files of at most
//! `per_file` entries. Every new file but the last is a plain index file (a harmless
//! duplicate if the collector stops here); the last one lists all old files in `supersedes`,
//! so readers switch from the old files to the new ones in one step, and only then may the
//! packs and the old files be deleted.

use std::collections::HashSet;

use bytes::Bytes;
use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{IndexFile, IndexId, IndexPack, PackId, content_address};
use crate::gc::lease::LeaseCheck;
use crate::repo::capped::Limit;
use crate::repo::{Repository, layout};

/// Writes the compacted index; returns how many files it wrote.
pub(crate) async fn run(
    repo: &Repository,
    old: &[IndexId],
    dropped: &HashSet<PackId>,
    per_file: usize,
    lock: &LeaseCheck,
    cancel: &CancellationToken,
) -> RepoResult<u64> {
    let per_file = per_file.max(1);
    let mut seen: HashSet<PackId> = HashSet::new();
    let mut out: Vec<IndexPack> = Vec::new();
    let mut entries = 0usize;
    let mut written = 0u64;
    for id in old {
        let file = repo.read_index_file(*id, cancel).await?;
        for pack in file.packs {
            if dropped.contains(&pack.id) || !seen.insert(pack.id) {
                continue;
            }
            entries += pack.entries.len();
            out.push(pack);
            if entries >= per_file {
                lock.check()?;
                put(
                    repo,
                    IndexFile { packs: std::mem::take(&mut out), supersedes: Vec::new() },
                    cancel,
                )
                .await?;
                written += 1;
                entries = 0;
            }
        }
    }
    lock.check()?;
    put(repo, IndexFile { packs: out, supersedes: old.to_vec() }, cancel).await?;
    Ok(written + 1)
}

async fn put(
    repo: &Repository,
    file: IndexFile,
    cancel: &CancellationToken,
) -> RepoResult<IndexId> {
    let bytes = file.encode(&repo.keys().cipher);
    let id = IndexId(content_address(&bytes));
    let key = layout::index(&id)?;
    Limit::INDEX.check_write(&key, bytes.len())?;
    repo.store()
        .put_if_absent(&key, Bytes::from(bytes), cancel)
        .await
        .map_err(|e| RepoError::store("write compacted index", &key, e))?;
    Ok(id)
}
