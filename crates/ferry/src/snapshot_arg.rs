//! Snapshot arguments on the command line: a full id, a unique prefix of at least 4 hex
//! digits, or `latest`.

use anyhow::Context;
use ferry_repo::{Repository, Snapshot, SnapshotId, SnapshotKind};
use tokio_util::sync::CancellationToken;

/// The word that stands for the newest snapshot.
pub(crate) const LATEST: &str = "latest";

/// Resolves a snapshot argument; `latest` is the newest snapshot in the repository (of
/// `kind`, when given), named on stderr with its source and host so a shared repository
/// holds no surprise. A full id is taken as it is, without listing the snapshots (a round
/// trip to the store): the callers (`restore`, `ls`) load the snapshot next, and that load
/// says when it does not exist.
pub(crate) async fn find(
    repo: &Repository,
    query: &str,
    kind: Option<SnapshotKind>,
    cancel: &CancellationToken,
) -> anyhow::Result<SnapshotId> {
    let found = if query == LATEST {
        let of_kind = |s: &Snapshot| kind.is_none_or(|k| s.kind().ok() == Some(k));
        newest(repo, of_kind, cancel).await.and_then(|found| {
            let what = kind.map_or_else(|| "snapshots".to_owned(), |k| format!("{k} snapshots"));
            let (id, s) = found.with_context(|| {
                format!("the repository has no {what} yet (or none that can be read)")
            })?;
            eprintln!("ferry: latest is {}", describe(&id, &s));
            Ok(id)
        })
    } else if let Ok(id) = SnapshotId::from_hex(query) {
        Ok(id)
    } else {
        repo.find_snapshot(query, cancel).await.map_err(anyhow::Error::from)
    };
    found.with_context(|| format!("finding snapshot {query}"))
}

/// Resolves `--parent` for a backup of `source` (canonical path) on `host`: `latest` is the
/// newest snapshot of the same source, host and kind (restic's choice too: a file of the same
/// path, size and mtime on another host is another file), and none at all (a full backup)
/// when there is none.
pub(crate) async fn find_parent(
    repo: &Repository,
    query: Option<&str>,
    source: &str,
    host: &str,
    kind: SnapshotKind,
    cancel: &CancellationToken,
) -> anyhow::Result<Option<SnapshotId>> {
    match query {
        None => Ok(None),
        Some(LATEST) => {
            let same = |s: &Snapshot| {
                s.source == source && s.hostname == host && s.kind().ok() == Some(kind)
            };
            let parent = newest(repo, same, cancel)
                .await
                .with_context(|| format!("finding the latest snapshot of {source} on {host}"))?;
            match &parent {
                Some((id, s)) => eprintln!("ferry: parent is {}", describe(id, s)),
                None => eprintln!(
                    "ferry: no earlier snapshot of {source} on {host}: backing up everything"
                ),
            }
            Ok(parent.map(|(id, _)| id))
        }
        Some(query) => {
            // Listed even when the id is whole: a parent that is not there is named as such.
            let id = repo
                .find_snapshot(query, cancel)
                .await
                .with_context(|| format!("finding snapshot {query}"))
                .context("finding the parent snapshot")?;
            Ok(Some(id))
        }
    }
}

/// `<short id> (<source> on <host>, <time>)`.
fn describe(id: &SnapshotId, s: &Snapshot) -> String {
    let short = &id.to_hex()[..16];
    let time = crate::repo_cmds::time_text(&s.time);
    format!("{short} ({} on {}, {time})", s.source, s.hostname)
}

/// The newest readable snapshot that `keep` accepts (damaged manifests are passed over; the
/// `snapshots` command lists them).
async fn newest(
    repo: &Repository,
    keep: impl Fn(&Snapshot) -> bool,
    cancel: &CancellationToken,
) -> anyhow::Result<Option<(SnapshotId, Snapshot)>> {
    let (readable, _damaged) = repo.readable_snapshots(cancel).await?;
    Ok(readable.into_iter().rev().find(|(_, s)| keep(s)))
}
