//! Snapshot arguments on the command line: a full id, a unique prefix of at least 4 hex
//! digits, or `latest`.

use anyhow::Context;
use ferry_repo::{Repository, Snapshot, SnapshotId, SnapshotKind};
use tokio_util::sync::CancellationToken;

/// The word that stands for the newest snapshot.
pub(crate) const LATEST: &str = "latest";

/// Resolves a snapshot argument; `latest` is the newest snapshot in the repository.
pub(crate) async fn find(
    repo: &Repository,
    query: &str,
    cancel: &CancellationToken,
) -> anyhow::Result<SnapshotId> {
    let found = if query == LATEST {
        newest(repo, |_| true, cancel).await.and_then(|id| {
            id.context("the repository has no snapshots yet (or none that can be read)")
        })
    } else {
        repo.find_snapshot(query, cancel).await.map_err(anyhow::Error::from)
    };
    found.with_context(|| format!("finding snapshot {query}"))
}

/// Resolves `--parent` for a backup of `source` (canonical path): `latest` is the newest
/// snapshot of the same source and kind, and none at all (a full backup) when there is none.
pub(crate) async fn find_parent(
    repo: &Repository,
    query: Option<&str>,
    source: &str,
    kind: SnapshotKind,
    cancel: &CancellationToken,
) -> anyhow::Result<Option<SnapshotId>> {
    match query {
        None => Ok(None),
        Some(LATEST) => {
            let same = |s: &Snapshot| s.source == source && s.kind().ok() == Some(kind);
            let parent = newest(repo, same, cancel)
                .await
                .with_context(|| format!("finding the latest snapshot of {source}"))?;
            if parent.is_none() {
                eprintln!("ferry: no earlier snapshot of {source}: backing up everything");
            }
            Ok(parent)
        }
        Some(query) => {
            let id = find(repo, query, cancel).await.context("finding the parent snapshot")?;
            Ok(Some(id))
        }
    }
}

/// The newest readable snapshot that `keep` accepts (damaged manifests are passed over; the
/// `snapshots` command lists them).
async fn newest(
    repo: &Repository,
    keep: impl Fn(&Snapshot) -> bool,
    cancel: &CancellationToken,
) -> anyhow::Result<Option<SnapshotId>> {
    let (readable, _damaged) = repo.readable_snapshots(cancel).await?;
    Ok(readable.into_iter().rev().find(|(_, s)| keep(s)).map(|(id, _)| id))
}
