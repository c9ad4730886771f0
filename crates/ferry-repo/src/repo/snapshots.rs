//! Snapshot manifests: listing, lookup, the commit write, forget.

use bytes::Bytes;
use futures::StreamExt;
use tokio_util::sync::CancellationToken;

use super::capped::Limit;
use super::disk_cache::Cached;
use crate::error::{RepoError, RepoResult};
use crate::format::{Snapshot, SnapshotId, content_address};
use crate::repo::{LOAD_CONCURRENCY, Repository, layout};

impl Repository {
    /// Every snapshot, oldest first.
    ///
    /// # Errors
    /// Store failures; [`RepoError::Corrupt`] or [`RepoError::TooLarge`] naming a damaged
    /// snapshot.
    pub async fn snapshots(
        &self,
        cancel: &CancellationToken,
    ) -> RepoResult<Vec<(SnapshotId, Snapshot)>> {
        let (good, damaged) = self.readable_snapshots(cancel).await?;
        match damaged.into_iter().next() {
            Some(e) => Err(e),
            None => Ok(good),
        }
    }

    /// Every snapshot that can be read, oldest first, and the errors of those that cannot
    /// (damaged bytes, or larger than any snapshot): one damaged manifest must not hide the
    /// others.
    ///
    /// # Errors
    /// Store failures and cancellation (nothing can be listed then).
    pub async fn readable_snapshots(
        &self,
        cancel: &CancellationToken,
    ) -> RepoResult<(Vec<(SnapshotId, Snapshot)>, Vec<RepoError>)> {
        let ids = self.snapshot_ids(cancel).await?;
        let loaded: Vec<_> = futures::stream::iter(ids)
            .map(|id| async move { self.load_snapshot(&id, cancel).await.map(|s| (id, s)) })
            .buffer_unordered(LOAD_CONCURRENCY)
            .collect()
            .await;
        let (mut good, mut damaged) = (Vec::new(), Vec::new());
        for result in loaded {
            match result {
                Ok(pair) => good.push(pair),
                Err(e) if e.is_damaged_object() => damaged.push(e),
                // Forgotten since the listing: no longer a snapshot of this repository.
                Err(e) if e.is_not_found() => {}
                Err(e) => return Err(e),
            }
        }
        good.sort_by(|a, b| a.1.time.cmp(&b.1.time).then(a.0.cmp(&b.0)));
        damaged.sort_by_key(ToString::to_string);
        Ok((good, damaged))
    }

    /// Ids of every snapshot.
    ///
    /// # Errors
    /// Store failures.
    pub async fn snapshot_ids(&self, cancel: &CancellationToken) -> RepoResult<Vec<SnapshotId>> {
        let listed = self
            .store()
            .list(layout::SNAPSHOTS, cancel)
            .await
            .map_err(|e| RepoError::store("list", layout::SNAPSHOTS, e))?;
        Ok(listed.iter().filter_map(|m| layout::id_of(&m.key)).map(SnapshotId).collect())
    }

    /// Reads one snapshot, checking that its bytes hash to its id.
    ///
    /// # Errors
    /// Store failures; [`RepoError::Corrupt`] for damaged bytes, [`RepoError::TooLarge`] for
    /// an object larger than any snapshot (not downloaded).
    pub async fn load_snapshot(
        &self,
        id: &SnapshotId,
        cancel: &CancellationToken,
    ) -> RepoResult<Snapshot> {
        let key = layout::snapshot(id)?;
        let read = (Limit::SNAPSHOT, "read snapshot");
        let bytes = self.get_cached(Cached::Snapshot, id.0, &key, read, cancel).await?;
        let object = format!("snapshot {key}");
        if content_address(&bytes) != id.0 {
            return Err(RepoError::corrupt(
                object,
                crate::format::FormatError::HashMismatch { what: key.to_string() },
            ));
        }
        Snapshot::decode(&self.keys().cipher, &bytes).map_err(|e| RepoError::corrupt(object, e))
    }

    /// Resolves a full id or a unique prefix of at least 4 hex digits.
    ///
    /// # Errors
    /// [`RepoError::SnapshotLookup`] when nothing or more than one snapshot matches.
    pub async fn find_snapshot(
        &self,
        query: &str,
        cancel: &CancellationToken,
    ) -> RepoResult<SnapshotId> {
        let lookup = |reason: &str| RepoError::SnapshotLookup {
            query: query.to_owned(),
            reason: reason.to_owned(),
        };
        let q = query.to_ascii_lowercase();
        if q.len() < 4 || !q.bytes().all(|b| b.is_ascii_hexdigit()) {
            return Err(lookup("not a snapshot id (at least 4 hex digits)"));
        }
        let matches: Vec<SnapshotId> = self
            .snapshot_ids(cancel)
            .await?
            .into_iter()
            .filter(|id| id.to_hex().starts_with(&q))
            .collect();
        match matches.as_slice() {
            [one] => Ok(*one),
            [] => Err(lookup("not found")),
            _ => Err(lookup("ambiguous prefix")),
        }
    }

    /// Stores a snapshot manifest: the commit point. Call only once everything it references
    /// is stored and indexed.
    pub(crate) async fn save_snapshot(
        &self,
        snapshot: &Snapshot,
        cancel: &CancellationToken,
    ) -> RepoResult<SnapshotId> {
        let bytes = snapshot.encode(&self.keys().cipher);
        let id = SnapshotId(content_address(&bytes));
        let key = layout::snapshot(&id)?;
        Limit::SNAPSHOT.check_write(&key, bytes.len())?;
        let bytes = Bytes::from(bytes);
        self.store()
            .put_if_absent(&key, bytes.clone(), cancel)
            .await
            .map_err(|e| RepoError::store("write snapshot", &key, e))?;
        self.keep_copy(Cached::Snapshot, id.0, bytes).await;
        Ok(id)
    }

    /// Deletes a snapshot manifest (the data it alone references is reclaimed by garbage
    /// collection).
    ///
    /// # Errors
    /// Store failures.
    pub async fn forget(&self, id: &SnapshotId, cancel: &CancellationToken) -> RepoResult<()> {
        let key = layout::snapshot(id)?;
        self.store()
            .delete(&key, cancel)
            .await
            .map_err(|e| RepoError::store("delete snapshot", &key, e))
    }
}
