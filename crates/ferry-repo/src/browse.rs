//! Looking inside a tree snapshot without restoring it: finding the entry at a path, and
//! walking a directory's entries (optionally the whole subtree) in name order.
//!
//! Memory: one tree page per directory level being walked, never a whole directory.

use std::path::{Component, Path, PathBuf};

use tokio_util::sync::CancellationToken;

use crate::error::{RepoError, RepoResult};
use crate::format::{BlobId, Node, NodeBody, Snapshot};
use crate::repo::{MemIndex, Repository};
use crate::restore::MAX_DEPTH;

/// The components of `path` inside a snapshot: relative or absolute, `.` ignored; `..` and
/// non-UTF-8-safe oddities are refused rather than interpreted.
///
/// # Errors
/// [`RepoError::InvalidInput`] for a `..` component.
pub fn snapshot_path(path: &Path) -> RepoResult<Vec<Vec<u8>>> {
    use std::os::unix::ffi::OsStrExt;
    let mut out = Vec::new();
    for c in path.components() {
        match c {
            Component::RootDir | Component::CurDir => {}
            Component::Normal(name) => out.push(name.as_bytes().to_vec()),
            Component::ParentDir | Component::Prefix(_) => {
                return Err(RepoError::InvalidInput {
                    what: "path in snapshot",
                    reason: format!("{}: `..` is not allowed", path.display()),
                });
            }
        }
    }
    Ok(out)
}

/// The entry at `path` in `snapshot` (the root for an empty path).
///
/// # Errors
/// [`RepoError::InvalidInput`] when the path does not exist in the snapshot or passes
/// through something that is not a directory; read failures.
pub async fn find_node(
    repo: &Repository,
    snapshot: &Snapshot,
    path: &Path,
    cancel: &CancellationToken,
) -> RepoResult<Node> {
    find_node_in(repo, None, snapshot, path, cancel).await
}

/// As [`find_node`], with the tree pages found by `index` when given (see
/// [`Repository::read_tree_in`]), else by the handle's.
pub(crate) async fn find_node_in(
    repo: &Repository,
    index: Option<&MemIndex>,
    snapshot: &Snapshot,
    path: &Path,
    cancel: &CancellationToken,
) -> RepoResult<Node> {
    let mut node = snapshot.root.clone();
    let mut walked = PathBuf::from("/");
    for name in snapshot_path(path)? {
        let NodeBody::Dir { pages } = &node.body else {
            return Err(RepoError::InvalidInput {
                what: "path in snapshot",
                reason: format!("{} is not a directory", walked.display()),
            });
        };
        walked.push(std::ffi::OsStr::new(&*String::from_utf8_lossy(&name)));
        node = find_in_dir(repo, index, pages, &name, &walked, cancel).await?.ok_or_else(|| {
            RepoError::InvalidInput {
                what: "path in snapshot",
                reason: format!("{} is not in the snapshot", walked.display()),
            }
        })?;
    }
    Ok(node)
}

/// Finds `name` among a directory's pages (each page's entries are in name order, and the
/// pages follow each other in name order, so the search stops at the first larger name).
async fn find_in_dir(
    repo: &Repository,
    index: Option<&MemIndex>,
    pages: &[BlobId],
    name: &[u8],
    path: &Path,
    cancel: &CancellationToken,
) -> RepoResult<Option<Node>> {
    let referrer = format!("directory {}", path.parent().unwrap_or(path).display());
    for page in pages {
        let tree = match index {
            Some(index) => repo.read_tree_in(index, page, &referrer, cancel).await?,
            None => repo.read_tree(page, &referrer, cancel).await?,
        };
        match tree.entries.binary_search_by(|n| n.name.as_slice().cmp(name)) {
            Ok(i) => return Ok(tree.entries.into_iter().nth(i)),
            Err(i) if i < tree.entries.len() => return Ok(None),
            Err(_) => {}
        }
    }
    Ok(None)
}

/// Calls `f` with the path (relative to `dir_path`'s snapshot root) and entry of every entry
/// of the directory `dir`, in name order; with `recursive`, each subdirectory's entries follow
/// the subdirectory itself.
///
/// # Errors
/// `dir` is not a directory; read failures; nesting deeper than [`MAX_DEPTH`]; whatever `f`
/// returns.
pub async fn walk_dir(
    repo: &Repository,
    dir: &Node,
    dir_path: &Path,
    recursive: bool,
    cancel: &CancellationToken,
    f: &mut (dyn FnMut(&Path, &Node) -> RepoResult<()> + Send),
) -> RepoResult<()> {
    let NodeBody::Dir { pages } = &dir.body else {
        return Err(RepoError::InvalidInput {
            what: "path in snapshot",
            reason: format!("{} is not a directory", dir_path.display()),
        });
    };
    walk_pages(repo, pages, dir_path, recursive, 0, cancel, f).await
}

fn walk_pages<'a>(
    repo: &'a Repository,
    pages: &'a [BlobId],
    path: &'a Path,
    recursive: bool,
    depth: usize,
    cancel: &'a CancellationToken,
    f: &'a mut (dyn FnMut(&Path, &Node) -> RepoResult<()> + Send),
) -> futures::future::BoxFuture<'a, RepoResult<()>> {
    Box::pin(async move {
        if depth >= MAX_DEPTH {
            return Err(RepoError::UnsafeEntry {
                path: path.to_path_buf(),
                reason: format!("nesting deeper than {MAX_DEPTH}"),
            });
        }
        let referrer = format!("directory {}", path.display());
        for page in pages {
            if cancel.is_cancelled() {
                return Err(RepoError::Cancelled);
            }
            let tree = repo.read_tree(page, &referrer, cancel).await?;
            for node in &tree.entries {
                let child = path.join(std::ffi::OsStr::new(&*String::from_utf8_lossy(&node.name)));
                f(&child, node)?;
                if recursive && let NodeBody::Dir { pages } = &node.body {
                    walk_pages(repo, pages, &child, true, depth + 1, cancel, &mut *f).await?;
                }
            }
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use ferry_store::{MemoryStore, ObjectStore};

    use super::*;
    use crate::repo::tests::fast_options;
    use crate::{BackupOptions, RestoreOptions, SnapshotId, backup_tree, restore};

    fn io(e: std::io::Error) -> RepoError {
        RepoError::io("test", "/tmp", e)
    }

    /// A repository holding one snapshot of `src/{top.txt, a/{one.txt, b/two.txt, b/link}}`.
    async fn fixture() -> RepoResult<(Repository, SnapshotId, tempfile::TempDir)> {
        let dir = tempfile::tempdir().map_err(io)?;
        let src = dir.path().join("src");
        std::fs::create_dir_all(src.join("a/b")).map_err(io)?;
        std::fs::write(src.join("top.txt"), b"top").map_err(io)?;
        std::fs::write(src.join("a/one.txt"), b"one").map_err(io)?;
        std::fs::write(src.join("a/b/two.txt"), vec![2u8; 300_000]).map_err(io)?;
        std::os::unix::fs::symlink("../../top.txt", src.join("a/b/link")).map_err(io)?;
        let store: Arc<dyn ObjectStore> = Arc::new(MemoryStore::new());
        let cancel = CancellationToken::new();
        let (repo, _) = Repository::init(store, b"pw", &fast_options(), &cancel).await?;
        let summary = backup_tree(&repo, &src, &BackupOptions::default(), None, &cancel).await?;
        Ok((repo, summary.snapshot_id, dir))
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn entries_are_found_and_walked_in_name_order() -> RepoResult<()> {
        let (repo, id, _dir) = fixture().await?;
        let cancel = CancellationToken::new();
        let snapshot = repo.load_snapshot(&id, &cancel).await?;
        let two = find_node(&repo, &snapshot, Path::new("/a/b/two.txt"), &cancel).await?;
        assert!(matches!(&two.body, NodeBody::File(c) if c.size == 300_000), "{two:?}");
        for (path, expected) in [
            ("a/missing", "not in the snapshot"),
            ("top.txt/x", "/top.txt is not a directory"),
            ("a/../top.txt", "`..`"),
        ] {
            let found = find_node(&repo, &snapshot, Path::new(path), &cancel).await;
            let err = found.err().map(|e| e.to_string()).unwrap_or_default();
            assert!(err.contains(expected), "{path}: {err}");
        }

        let mut seen = Vec::new();
        walk_dir(&repo, &snapshot.root, Path::new("/"), true, &cancel, &mut |p, _| {
            seen.push(p.display().to_string());
            Ok(())
        })
        .await?;
        assert_eq!(seen, ["/a", "/a/b", "/a/b/link", "/a/b/two.txt", "/a/one.txt", "/top.txt"]);
        let a = find_node(&repo, &snapshot, Path::new("a"), &cancel).await?;
        let mut shallow = Vec::new();
        walk_dir(&repo, &a, Path::new("/a"), false, &cancel, &mut |p, _| {
            shallow.push(p.display().to_string());
            Ok(())
        })
        .await?;
        assert_eq!(shallow, ["/a/b", "/a/one.txt"]);
        Ok(())
    }

    #[tokio::test(flavor = "multi_thread", worker_threads = 2)]
    async fn a_subtree_or_one_file_restores_on_its_own() -> RepoResult<()> {
        let (repo, id, dir) = fixture().await?;
        let cancel = CancellationToken::new();
        let only =
            |p: &str| RestoreOptions { subtree: Some(p.into()), ..RestoreOptions::default() };

        let sub = dir.path().join("sub");
        let summary = restore(&repo, &id, &sub, &only("a/b"), None, &cancel).await?;
        assert_eq!(summary.files, 1);
        let mut names: Vec<_> = std::fs::read_dir(&sub)
            .map_err(io)?
            .filter_map(|e| e.ok().map(|e| e.file_name().to_string_lossy().into_owned()))
            .collect();
        names.sort();
        assert_eq!(names, ["link", "two.txt"]);
        assert_eq!(std::fs::read(sub.join("two.txt")).map_err(io)?, vec![2u8; 300_000]);
        assert_eq!(
            std::fs::read_link(sub.join("link")).map_err(io)?,
            Path::new("../../top.txt"),
            "a symlink is restored as a link, never followed"
        );

        let one = dir.path().join("one");
        std::fs::create_dir(&one).map_err(io)?;
        std::fs::write(one.join("keep"), b"untouched").map_err(io)?;
        restore(&repo, &id, &one, &only("/a/one.txt"), None, &cancel).await?;
        assert_eq!(std::fs::read(one.join("one.txt")).map_err(io)?, b"one");
        assert_eq!(std::fs::read(one.join("keep")).map_err(io)?, b"untouched");

        let missing = dir.path().join("missing");
        let r = restore(&repo, &id, &missing, &only("a/nope"), None, &cancel).await;
        assert!(matches!(r, Err(RepoError::InvalidInput { .. })), "{r:?}");
        assert!(!missing.exists(), "a failed lookup must not create the target");
        Ok(())
    }

    #[test]
    fn paths_in_a_snapshot_are_plain_components() -> RepoResult<()> {
        assert_eq!(snapshot_path(Path::new("/a/./b/"))?, vec![b"a".to_vec(), b"b".to_vec()]);
        assert_eq!(snapshot_path(Path::new("a/b"))?, vec![b"a".to_vec(), b"b".to_vec()]);
        assert!(snapshot_path(Path::new("/"))?.is_empty());
        assert!(snapshot_path(Path::new("a/../b")).is_err());
        Ok(())
    }
}
