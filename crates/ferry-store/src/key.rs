//! Typed object keys.

use std::borrow::Borrow;
use std::fmt;
use std::str::FromStr;

/// A validated object key: `/`-separated segments of `[A-Za-z0-9._-]`, none empty, none `.`
/// or `..`, at most 512 bytes. The same key means the same object on every backend, and no
/// key can name a path outside a file-system backend's root.
#[derive(Debug, Clone, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct ObjectKey(String);

/// A string that is not a valid [`ObjectKey`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid object key {key:?}: {reason}")]
pub struct InvalidKey {
    /// The rejected text.
    pub key: String,
    /// Why it was rejected.
    pub reason: &'static str,
}

impl ObjectKey {
    /// Longest key accepted, in bytes.
    pub const MAX_LEN: usize = 512;

    /// Validates `key`.
    ///
    /// # Errors
    /// [`InvalidKey`] naming the rule the text breaks.
    pub fn new(key: impl Into<String>) -> Result<Self, InvalidKey> {
        let key = key.into();
        let reject = |reason| Err(InvalidKey { key: key.clone(), reason });
        if key.is_empty() {
            return reject("empty");
        }
        if key.len() > Self::MAX_LEN {
            return reject("longer than 512 bytes");
        }
        for segment in key.split('/') {
            if Self::is_valid_segment(segment) {
                continue;
            }
            if segment.is_empty() {
                return reject("empty segment");
            }
            if segment == "." || segment == ".." {
                return reject("`.` or `..` segment");
            }
            return reject("characters other than A-Z a-z 0-9 . _ -");
        }
        Ok(Self(key))
    }

    /// The key text.
    #[must_use]
    pub fn as_str(&self) -> &str {
        &self.0
    }

    /// The key's `/`-separated segments, first to last.
    pub fn segments(&self) -> impl Iterator<Item = &str> {
        self.0.split('/')
    }

    /// Whether `segment` could be one segment of a key. Backends use it to tell their own
    /// files (temporary files, foreign entries) from objects.
    #[must_use]
    pub fn is_valid_segment(segment: &str) -> bool {
        !segment.is_empty()
            && segment != "."
            && segment != ".."
            && segment.bytes().all(|b| b.is_ascii_alphanumeric() || matches!(b, b'.' | b'_' | b'-'))
    }
}

impl AsRef<str> for ObjectKey {
    fn as_ref(&self) -> &str {
        &self.0
    }
}

/// Keys order exactly as their text does, so maps keyed by [`ObjectKey`] can be searched
/// by `&str` (prefix ranges).
impl Borrow<str> for ObjectKey {
    fn borrow(&self) -> &str {
        &self.0
    }
}

impl From<ObjectKey> for String {
    fn from(key: ObjectKey) -> Self {
        key.0
    }
}

impl FromStr for ObjectKey {
    type Err = InvalidKey;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::new(s)
    }
}

impl fmt::Display for ObjectKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

impl TryFrom<&str> for ObjectKey {
    type Error = InvalidKey;
    fn try_from(value: &str) -> Result<Self, Self::Error> {
        Self::new(value)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn accepts_plain_keys() {
        for k in ["config", "data/ab/abcdef.pack", "keys/0-1_a.key"] {
            assert_eq!(ObjectKey::new(k).map(|k| k.to_string()), Ok(k.to_string()));
        }
    }

    #[test]
    fn rejects_escapes_and_odd_characters() {
        for k in ["", "/abs", "a//b", "a/../b", ".", "a/./b", "a b", "a\\b", "é", "a/"] {
            assert!(ObjectKey::new(k).is_err(), "{k:?} accepted");
        }
        assert!(ObjectKey::new("a".repeat(513)).is_err());
        assert!(ObjectKey::new("a".repeat(512)).is_ok());
    }

    #[test]
    fn error_names_the_rule() {
        let reason = |k: &str| ObjectKey::new(k).err().map(|e| e.reason);
        assert_eq!(reason(""), Some("empty"));
        assert_eq!(reason("a//b"), Some("empty segment"));
        assert_eq!(reason("a/.."), Some("`.` or `..` segment"));
        assert_eq!(reason("tmp~/x"), Some("characters other than A-Z a-z 0-9 . _ -"));
    }

    #[test]
    fn segment_check_matches_key_check() {
        for s in ["a", ".tmp", "a.b", "..", ".", "", "a~", "a/b", "A-9_z"] {
            assert_eq!(
                ObjectKey::is_valid_segment(s),
                !s.contains('/') && ObjectKey::new(s).is_ok(),
                "{s:?}"
            );
        }
    }

    proptest::proptest! {
        /// Any text either fails validation or round-trips unchanged, and an accepted key
        /// never holds an escaping or empty segment.
        #[test]
        fn accepted_keys_are_clean(text in "[a-z./~_-]{0,24}") {
            match ObjectKey::new(text.clone()) {
                Ok(key) => {
                    proptest::prop_assert_eq!(key.as_str(), text.as_str());
                    for seg in key.segments() {
                        proptest::prop_assert!(!seg.is_empty() && seg != "." && seg != ".." && !seg.contains('~'));
                    }
                    proptest::prop_assert_eq!(key.as_str().parse::<ObjectKey>().ok(), Some(key.clone()));
                }
                Err(e) => proptest::prop_assert_eq!(e.key, text),
            }
        }
    }
}
