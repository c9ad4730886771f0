//! A directory's place under the root of a backup's or a restore's walk: a chain of names that
//! its descendants share, so a path is built only when it is shown (an error, a warning, an
//! exclude rule). Held whole for every directory level and every queued file, the paths of a
//! tree nesting [`crate::MAX_DEPTH`] levels of 255-byte names would take hundreds of MiB
//! (each level's path about as long as the depth times the name); the chain takes each name
//! once.

use std::ffi::OsStr;
use std::fmt;
use std::os::unix::ffi::OsStrExt as _;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// A directory's place: its name in its parent and its parent's place.
#[derive(Debug)]
pub(crate) struct DirPath {
    up: Option<Arc<DirPath>>,
    /// The name in its parent; the walk root's own path at the root.
    name: Vec<u8>,
}

impl DirPath {
    /// The walk's root, at `path`.
    pub(crate) fn root(path: &Path) -> Arc<Self> {
        Arc::new(Self { up: None, name: path.as_os_str().as_bytes().to_vec() })
    }

    /// Its subdirectory `name`.
    pub(crate) fn child(self: &Arc<Self>, name: &[u8]) -> Arc<Self> {
        Arc::new(Self { up: Some(Arc::clone(self)), name: name.to_vec() })
    }

    /// The names from the root down to it, the root's own path left out.
    pub(crate) fn names_below_root(&self) -> Vec<&[u8]> {
        let mut names = vec![self.name.as_slice()];
        let mut at = self.up.as_deref();
        while let Some(dir) = at {
            names.push(dir.name.as_slice());
            at = dir.up.as_deref();
        }
        names.pop();
        names.reverse();
        names
    }

    /// The root's path, joined with each name down to it. Names that are not UTF-8 are shown
    /// with replacement characters, as in every message of a restore.
    pub(crate) fn path(&self) -> PathBuf {
        let mut root = self;
        while let Some(up) = root.up.as_deref() {
            root = up;
        }
        let mut path = PathBuf::from(OsStr::from_bytes(&root.name));
        for name in self.names_below_root() {
            path.push(OsStr::new(&*String::from_utf8_lossy(name)));
        }
        path
    }

    /// The path of its entry `name`.
    pub(crate) fn child_path(&self, name: &[u8]) -> PathBuf {
        self.path().join(OsStr::new(&*String::from_utf8_lossy(name)))
    }

    /// Its entry `name`, for a message: the path is built only if the message is.
    pub(crate) fn show<'a>(&'a self, name: &'a [u8]) -> Shown<'a> {
        Shown { dir: self, name: Some(name) }
    }

    /// Itself, for a message.
    pub(crate) fn show_self(&self) -> Shown<'_> {
        Shown { dir: self, name: None }
    }

    /// The bytes of its entry `name`'s path below the root (`a/b/name`), as exclude rules
    /// match them.
    pub(crate) fn relative(&self, name: &[u8]) -> Vec<u8> {
        let mut relative = Vec::new();
        for part in self.names_below_root().into_iter().chain([name]) {
            if !relative.is_empty() {
                relative.push(b'/');
            }
            relative.extend_from_slice(part);
        }
        relative
    }
}

/// An entry's or a directory's path for a message, built only if the message is
/// ([`DirPath::show`], [`DirPath::show_self`]).
pub(crate) struct Shown<'a> {
    dir: &'a DirPath,
    /// `None`: the directory itself.
    name: Option<&'a [u8]>,
}

impl fmt::Display for Shown<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let path = match self.name {
            Some(name) => self.dir.child_path(name),
            None => self.dir.path(),
        };
        fmt::Display::fmt(&path.display(), f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn paths_are_built_from_the_chain() {
        let root = DirPath::root(Path::new("/target"));
        let b = root.child(b"a").child(b"b");
        assert_eq!(root.path(), Path::new("/target"));
        assert_eq!(b.path(), Path::new("/target/a/b"));
        assert_eq!(b.child_path(b"c"), Path::new("/target/a/b/c"));
        assert_eq!(b.relative(b"c"), b"a/b/c");
        assert_eq!(root.relative(b"c"), b"c");
        assert_eq!(b.names_below_root(), [b"a".as_slice(), b"b"]);
        assert_eq!(b.show(b"c").to_string(), "/target/a/b/c");
        assert_eq!(b.show_self().to_string(), "/target/a/b");
    }
}
