//! A file tree with content and metadata, written into and read back from a volume, so tests
//! can compare what they put in with what came out.

use std::collections::BTreeMap;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::{Path, PathBuf};
use std::time::{Duration, UNIX_EPOCH};

/// What an entry is.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum FsKind {
    /// A regular file and its bytes.
    File(Vec<u8>),
    /// A folder.
    Dir,
    /// A symbolic link and its target.
    Symlink(PathBuf),
}

/// One entry: kind, permission bits, owner and modification time (seconds; not kept for
/// symlinks).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FsEntry {
    /// What it is.
    pub kind: FsKind,
    /// Permission bits (`0o7777` mask); ignored for symlinks.
    pub mode: u32,
    /// Owner user id.
    pub uid: u32,
    /// Owner group id.
    pub gid: u32,
    /// Modification time in seconds since the epoch (0 for symlinks).
    pub mtime: i64,
}

/// A file tree by relative path. `lost+found` at the top is ignored when reading.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct FsTree {
    /// Entries by path relative to the tree's root.
    pub entries: BTreeMap<PathBuf, FsEntry>,
}

impl FsTree {
    /// A varied sample tree derived from `seed`: nested folders, an empty file, small text
    /// files, a 1 MiB file of pseudo-random bytes with a hole-sized run of zeros, a symlink,
    /// several modes, owners and times.
    #[must_use]
    pub fn sample(seed: u64) -> Self {
        let mut rng = seed ^ 0x9e37_79b9_7f4a_7c15;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let t0 = 1_600_000_000 + i64::try_from(seed % 1_000_000).unwrap_or(0);
        let mut tree = Self::default();
        let dir = |mode, mtime| FsEntry { kind: FsKind::Dir, mode, uid: 0, gid: 0, mtime };
        let file = |bytes: Vec<u8>, mode, uid, mtime| FsEntry {
            kind: FsKind::File(bytes),
            mode,
            uid,
            gid: uid,
            mtime,
        };
        tree.entries.insert("docs".into(), dir(0o755, t0));
        tree.entries.insert("docs/deep".into(), dir(0o700, t0 + 1));
        tree.entries.insert("docs/deep/er".into(), dir(0o750, t0 + 2));
        tree.entries.insert("empty".into(), file(Vec::new(), 0o644, 0, t0 + 3));
        tree.entries.insert(
            "docs/readme.txt".into(),
            file(format!("Ferry sample tree {seed}\n").into_bytes(), 0o644, 1000, t0 + 4),
        );
        tree.entries
            .insert("docs/deep/er/secret".into(), file(b"s3cr3t".to_vec(), 0o600, 1001, t0 + 5));
        // A user's set-user-ID program: restored in agent mode too (root's would be withheld
        // unless the DataDownload asks; see ferry_repo::Fidelity).
        tree.entries
            .insert("run.sh".into(), file(b"#!/bin/sh\necho hi\n".to_vec(), 0o4755, 1000, t0 + 6));
        let mut big = Vec::with_capacity(1 << 20);
        while big.len() < (1 << 20) {
            big.extend_from_slice(&next().to_le_bytes());
        }
        big[256 << 10..512 << 10].fill(0);
        tree.entries.insert("docs/big.bin".into(), file(big, 0o640, 0, t0 + 7));
        tree.entries.insert(
            "link".into(),
            FsEntry {
                kind: FsKind::Symlink("docs/readme.txt".into()),
                mode: 0,
                uid: 0,
                gid: 0,
                mtime: 0,
            },
        );
        tree
    }

    /// Writes the tree under `root` (which must exist), setting modes, owners and times.
    ///
    /// # Errors
    /// Any file-system error, with the path.
    pub fn write_to(&self, root: &Path) -> std::io::Result<()> {
        for (rel, entry) in &self.entries {
            let path = root.join(rel);
            match &entry.kind {
                FsKind::Dir => std::fs::create_dir_all(&path)?,
                FsKind::File(bytes) => {
                    if let Some(parent) = path.parent() {
                        std::fs::create_dir_all(parent)?;
                    }
                    std::fs::write(&path, bytes)?;
                }
                FsKind::Symlink(target) => {
                    if std::fs::symlink_metadata(&path).is_ok() {
                        std::fs::remove_file(&path)?;
                    }
                    std::os::unix::fs::symlink(target, &path)?;
                }
            }
        }
        // Metadata last, deepest first, so writing children does not change a folder's time.
        for (rel, entry) in self.entries.iter().rev() {
            let path = root.join(rel);
            if matches!(entry.kind, FsKind::Symlink(_)) {
                std::os::unix::fs::lchown(&path, Some(entry.uid), Some(entry.gid))?;
                continue;
            }
            std::os::unix::fs::lchown(&path, Some(entry.uid), Some(entry.gid))?;
            std::fs::set_permissions(&path, std::fs::Permissions::from_mode(entry.mode))?;
            let secs = u64::try_from(entry.mtime).unwrap_or(0);
            std::fs::File::open(&path)?.set_modified(UNIX_EPOCH + Duration::from_secs(secs))?;
        }
        Ok(())
    }

    /// Reads the tree under `root`.
    ///
    /// # Errors
    /// Any file-system error.
    pub fn read_from(root: &Path) -> std::io::Result<Self> {
        let mut tree = Self::default();
        let mut stack = vec![PathBuf::new()];
        while let Some(rel) = stack.pop() {
            for item in std::fs::read_dir(root.join(&rel))? {
                let item = item?;
                let rel = rel.join(item.file_name());
                if rel == Path::new("lost+found") {
                    continue;
                }
                let path = root.join(&rel);
                let meta = std::fs::symlink_metadata(&path)?;
                let kind = if meta.file_type().is_symlink() {
                    FsKind::Symlink(std::fs::read_link(&path)?)
                } else if meta.is_dir() {
                    stack.push(rel.clone());
                    FsKind::Dir
                } else {
                    FsKind::File(std::fs::read(&path)?)
                };
                let symlink = matches!(kind, FsKind::Symlink(_));
                tree.entries.insert(
                    rel,
                    FsEntry {
                        kind,
                        mode: if symlink { 0 } else { meta.permissions().mode() & 0o7777 },
                        uid: meta.uid(),
                        gid: meta.gid(),
                        mtime: if symlink { 0 } else { meta.mtime() },
                    },
                );
            }
        }
        Ok(tree)
    }

    /// Total bytes of file content.
    #[must_use]
    pub fn content_bytes(&self) -> u64 {
        self.entries
            .values()
            .map(|e| match &e.kind {
                FsKind::File(b) => b.len() as u64,
                _ => 0,
            })
            .sum()
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use super::*;

    #[test]
    fn sample_round_trips_through_a_folder() {
        let dir = std::env::temp_dir().join(format!("fstree-test-ferry-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        let tree = FsTree::sample(7);
        tree.write_to(&dir).unwrap();
        let back = FsTree::read_from(&dir).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(back, tree);
        assert_ne!(FsTree::sample(8), tree, "different seeds give different trees");
    }
}
