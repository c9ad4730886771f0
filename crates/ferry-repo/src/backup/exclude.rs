//! `--exclude` patterns: entries a backup leaves out, with everything below them.
//!
//! A pattern without `/` matches an entry's name at any depth (`*.log`, `node_modules`); one
//! with `/` matches the path from the backup root (`/tmp`, `cache/**/*.bin`; a leading `/` is
//! optional). A trailing `/` matches directories only (`logs/`). `*` and `?` never match
//! `/`, `**` matches any number of directories, `[abc]` and `{a,b}` work as in shells. A
//! leading `!` (re-including, in some tools) is refused rather than taken as a name.

use std::ffi::OsStr;
use std::os::unix::ffi::OsStrExt;
use std::path::Path;

use globset::{GlobBuilder, GlobSet, GlobSetBuilder};

use crate::error::{RepoError, RepoResult};

/// Compiled exclude patterns.
#[derive(Debug, Clone, Default)]
pub(crate) struct Excludes {
    /// Patterns for any entry.
    any: Option<GlobSet>,
    /// Patterns written with a trailing `/`: directories only.
    dirs: Option<GlobSet>,
}

impl Excludes {
    /// Compiles `patterns`.
    ///
    /// # Errors
    /// [`RepoError::InvalidInput`] naming the first pattern that is not a valid glob.
    pub(crate) fn new(patterns: &[String]) -> RepoResult<Self> {
        if patterns.is_empty() {
            return Ok(Self::default());
        }
        let (mut any, mut dirs) = (GlobSetBuilder::new(), GlobSetBuilder::new());
        let (mut any_count, mut dirs_count) = (0, 0);
        for pattern in patterns {
            let invalid = |reason: String| RepoError::InvalidInput {
                what: "exclude pattern",
                reason: format!("{pattern:?}: {reason}"),
            };
            if pattern.starts_with('!') {
                return Err(invalid(
                    "re-including with `!` is not supported; write patterns that exclude only \
                     what should be left out (`\\!` for a name starting with `!`)"
                        .into(),
                ));
            }
            let trimmed = pattern.trim_end_matches('/');
            if trimmed.is_empty() {
                return Err(invalid("excludes everything; back up nothing instead".into()));
            }
            let anchored = match trimmed.strip_prefix('/') {
                Some(rest) => rest.to_owned(),
                None if trimmed.contains('/') => trimmed.to_owned(),
                None => format!("**/{trimmed}"),
            };
            let glob = GlobBuilder::new(&anchored)
                .literal_separator(true)
                .backslash_escape(true)
                .build()
                .map_err(|e| invalid(e.kind().to_string()))?;
            if trimmed.len() < pattern.len() {
                dirs.add(glob);
                dirs_count += 1;
            } else {
                any.add(glob);
                any_count += 1;
            }
        }
        let build = |set: GlobSetBuilder, count: usize| -> RepoResult<Option<GlobSet>> {
            if count == 0 {
                return Ok(None);
            }
            let set = set.build().map_err(|e| RepoError::InvalidInput {
                what: "exclude pattern",
                reason: e.to_string(),
            })?;
            Ok(Some(set))
        };
        Ok(Self { any: build(any, any_count)?, dirs: build(dirs, dirs_count)? })
    }

    /// Whether the entry at `relative` (from the backup root, no leading `/`) is left out
    /// whatever it is.
    pub(crate) fn excludes(&self, relative: &[u8]) -> bool {
        matches(self.any.as_ref(), relative)
    }

    /// Whether the directory at `relative` is left out (by a pattern ending in `/`).
    pub(crate) fn excludes_dir(&self, relative: &[u8]) -> bool {
        matches(self.dirs.as_ref(), relative)
    }

    /// Whether there are any patterns.
    pub(crate) fn is_empty(&self) -> bool {
        self.any.is_none() && self.dirs.is_none()
    }
}

fn matches(set: Option<&GlobSet>, relative: &[u8]) -> bool {
    set.is_some_and(|s| s.is_match(Path::new(OsStr::from_bytes(relative))))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn excludes(patterns: &[&str]) -> Excludes {
        Excludes::new(&patterns.iter().map(|p| (*p).to_owned()).collect::<Vec<_>>())
            .expect("valid patterns")
    }

    #[test]
    fn names_match_at_any_depth_and_paths_from_the_root() {
        let e = excludes(&["*.log", "node_modules", "/tmp", "cache/**/*.bin", "data/raw/"]);
        for hit in [
            "a.log",
            "x/y/b.log",
            "node_modules",
            "src/node_modules",
            "tmp",
            "cache/a.bin",
            "cache/d/e/f.bin",
        ] {
            assert!(e.excludes(hit.as_bytes()), "{hit}");
        }
        assert!(
            e.excludes_dir(b"data/raw") && !e.excludes(b"data/raw"),
            "a trailing / is dirs only"
        );
        for miss in
            ["a.logs", "x/tmp", "tmpfile", "cache/a.txt", "other/cache/a.bin", "data/raw2", "log"]
        {
            assert!(!e.excludes(miss.as_bytes()), "{miss}");
        }
        assert!(Excludes::default().is_empty() && !e.is_empty());
        assert!(!Excludes::default().excludes(b"anything"));
    }

    #[test]
    fn star_does_not_cross_directories_and_bad_patterns_are_named() {
        let e = excludes(&["/a/*"]);
        assert!(e.excludes(b"a/b") && !e.excludes(b"a/b/c"));
        for bad in ["[z-a]", "{a,b", "/", "", "!keep", "!/data/keep"] {
            let err = Excludes::new(&[bad.to_owned()]).expect_err(bad).to_string();
            assert!(err.contains("exclude pattern"), "{err}");
        }
    }

    #[test]
    fn a_literal_bang_is_escaped_and_dir_patterns_leave_files_alone() {
        let e = excludes(&["\\!important", "logs/"]);
        assert!(e.excludes(b"x/!important"));
        assert!(e.excludes_dir(b"a/logs") && !e.excludes(b"a/logs"));
        assert!(!e.is_empty() && !excludes(&["logs/"]).is_empty());
    }

    #[test]
    fn non_utf8_names_are_matched_bytewise() {
        let e = excludes(&["*.tmp"]);
        assert!(e.excludes(b"dir/\xff\xfe.tmp"));
        assert!(!e.excludes(b"dir/\xff\xfe.txt"));
    }
}
