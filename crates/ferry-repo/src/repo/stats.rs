//! What the repository holds, from its index: packs, unique blobs, and their sizes before and
//! after compression and encryption.

use tokio_util::sync::CancellationToken;

use crate::error::RepoResult;
use crate::format::ObjectKind;
use crate::repo::Repository;

/// Totals over the index (the packs and blobs every snapshot shares).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RepoStats {
    /// Indexed packs.
    pub packs: u64,
    /// Their size in storage.
    pub pack_bytes: u64,
    /// Unique data chunks.
    pub data_blobs: u64,
    /// Their plaintext size.
    pub data_raw_bytes: u64,
    /// Their stored (compressed, encrypted) size.
    pub data_stored_bytes: u64,
    /// Unique tree pages.
    pub tree_blobs: u64,
    /// Their stored size.
    pub tree_stored_bytes: u64,
}

impl Repository {
    /// Totals over the index.
    ///
    /// # Errors
    /// As loading the index.
    pub async fn stats(&self, cancel: &CancellationToken) -> RepoResult<RepoStats> {
        let index = self.index(cancel).await?;
        let mut stats = RepoStats {
            packs: index.packs().len() as u64,
            pack_bytes: index.packs().iter().map(|p| p.size).sum(),
            ..RepoStats::default()
        };
        let frames = index.frame_totals();
        index.for_each(|_, _, pack, loc| {
            if loc.kind == ObjectKind::TreeBlob {
                stats.tree_blobs += 1;
                stats.tree_stored_bytes += u64::from(loc.length);
            } else {
                stats.data_blobs += 1;
                stats.data_raw_bytes += u64::from(loc.raw_length);
                stats.data_stored_bytes += frames.stored(pack, &loc);
            }
        });
        Ok(stats)
    }
}
