//! Storage locations written as URLs: `file:///abs/path` and `s3://bucket/prefix`.
//!
//! Endpoint, region and credentials of S3 are not part of the URL; they come from
//! [`S3Options`](crate::S3Options).

use std::fmt;
use std::path::PathBuf;
use std::str::FromStr;

use crate::ObjectKey;

/// A parsed storage location.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreUrl {
    /// A directory: `file:///srv/ferry` (or `file://localhost/srv/ferry`).
    File {
        /// Absolute path of the root directory.
        root: PathBuf,
    },
    /// A bucket and key prefix: `s3://bucket` or `s3://bucket/some/prefix`.
    S3 {
        /// The bucket.
        bucket: String,
        /// The key prefix, without leading or trailing `/`; empty for the bucket's root.
        prefix: String,
    },
}

/// A string that is not a storage URL Ferry understands.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("invalid storage URL {url:?}: {reason}")]
pub struct InvalidStoreUrl {
    /// The rejected text.
    pub url: String,
    /// What is wrong with it.
    pub reason: &'static str,
}

impl StoreUrl {
    /// Parses `url`.
    ///
    /// # Errors
    /// [`InvalidStoreUrl`] naming what is wrong: unknown scheme, relative path, bad bucket
    /// name, query or fragment, percent-encoding (not supported).
    pub fn parse(url: &str) -> Result<Self, InvalidStoreUrl> {
        let fail = |reason| Err(InvalidStoreUrl { url: url.to_owned(), reason });
        let Some((scheme, rest)) = url.split_once("://") else {
            return fail("no scheme; expected file:///path or s3://bucket/prefix");
        };
        if rest.contains(['?', '#']) {
            return fail("queries and fragments are not supported");
        }
        if rest.contains('%') {
            return fail("percent-encoded characters are not supported");
        }
        match scheme {
            "file" => {
                let path = rest.strip_prefix("localhost").unwrap_or(rest);
                if !path.starts_with('/') {
                    return fail("file URLs need an absolute path and no host: file:///path");
                }
                let trimmed = path.trim_end_matches('/');
                Ok(Self::File {
                    root: PathBuf::from(if trimmed.is_empty() { "/" } else { trimmed }),
                })
            }
            "s3" => {
                let (bucket, prefix) = rest.split_once('/').unwrap_or((rest, ""));
                if let Err(reason) = check_bucket(bucket) {
                    return fail(reason);
                }
                let prefix = prefix.trim_end_matches('/');
                if !prefix.is_empty() && ObjectKey::new(prefix).is_err() {
                    return fail("the prefix must be `/`-separated segments of A-Z a-z 0-9 . _ -");
                }
                Ok(Self::S3 { bucket: bucket.to_owned(), prefix: prefix.to_owned() })
            }
            _ => fail("unsupported scheme; expected file or s3"),
        }
    }
}

/// S3's bucket naming rules (the part that can be checked offline).
fn check_bucket(bucket: &str) -> Result<(), &'static str> {
    if bucket.is_empty() {
        return Err("no bucket name: s3://bucket/prefix");
    }
    if !(3..=63).contains(&bucket.len()) {
        return Err("bucket names are 3 to 63 characters long");
    }
    if !bucket
        .bytes()
        .all(|b| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'.' || b == b'-')
    {
        return Err("bucket names hold only a-z 0-9 . - (no credentials, ports or upper case)");
    }
    let edge_ok = |b: Option<u8>| b.is_some_and(|b| b.is_ascii_lowercase() || b.is_ascii_digit());
    if !edge_ok(bucket.bytes().next()) || !edge_ok(bucket.bytes().last()) || bucket.contains("..") {
        return Err("bucket names start and end with a letter or digit and hold no `..`");
    }
    Ok(())
}

impl FromStr for StoreUrl {
    type Err = InvalidStoreUrl;
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Self::parse(s)
    }
}

impl fmt::Display for StoreUrl {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::File { root } => write!(f, "file://{}", root.display()),
            Self::S3 { bucket, prefix } if prefix.is_empty() => write!(f, "s3://{bucket}"),
            Self::S3 { bucket, prefix } => write!(f, "s3://{bucket}/{prefix}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn parse(url: &str) -> StoreUrl {
        StoreUrl::parse(url).unwrap_or_else(|e| panic!("{e}"))
    }

    #[test]
    fn file_urls() {
        assert_eq!(parse("file:///srv/ferry"), StoreUrl::File { root: "/srv/ferry".into() });
        assert_eq!(parse("file:///srv/ferry/"), StoreUrl::File { root: "/srv/ferry".into() });
        assert_eq!(parse("file://localhost/srv"), StoreUrl::File { root: "/srv".into() });
        assert_eq!(parse("file:///"), StoreUrl::File { root: "/".into() });
    }

    #[test]
    fn s3_urls() {
        let s3 = |bucket: &str, prefix: &str| StoreUrl::S3 {
            bucket: bucket.into(),
            prefix: prefix.into(),
        };
        assert_eq!(parse("s3://backups"), s3("backups", ""));
        assert_eq!(parse("s3://backups/"), s3("backups", ""));
        assert_eq!(
            parse("s3://my.backups-1/ferry/cluster-a/"),
            s3("my.backups-1", "ferry/cluster-a")
        );
    }

    #[test]
    fn display_round_trips() {
        for url in ["file:///srv/ferry", "s3://backups", "s3://backups/a/b"] {
            assert_eq!(parse(url).to_string(), url);
        }
    }

    #[test]
    fn bad_urls_say_why() {
        let reason = |url: &str| StoreUrl::parse(url).err().map(|e| e.reason).unwrap_or("accepted");
        assert!(reason("/srv/ferry").starts_with("no scheme"));
        assert!(reason("ftp://host/x").starts_with("unsupported scheme"));
        assert!(reason("file://host/srv").starts_with("file URLs need an absolute path"));
        assert!(reason("file://relative").starts_with("file URLs need an absolute path"));
        assert!(reason("s3://").starts_with("no bucket name"));
        assert!(reason("s3:///prefix").starts_with("no bucket name"));
        assert!(reason("s3://ab").starts_with("bucket names are 3 to 63"));
        assert!(reason("s3://Backups").starts_with("bucket names hold only"));
        assert!(reason("s3://key:secret@bucket/x").starts_with("bucket names hold only"));
        assert!(reason("s3://bucket:9000/x").starts_with("bucket names hold only"));
        assert!(reason("s3://-bucket").starts_with("bucket names start and end"));
        assert!(reason("s3://a..b").starts_with("bucket names start and end"));
        assert!(reason("s3://bucket/a//b").starts_with("the prefix must be"));
        assert!(reason("s3://bucket/../x").starts_with("the prefix must be"));
        assert!(reason("s3://bucket/x?versionId=1").starts_with("queries and fragments"));
        assert!(reason("file:///a%20b").starts_with("percent-encoded"));
    }

    proptest::proptest! {
        /// The parser never panics, and what it accepts prints back to a URL it accepts
        /// equally.
        #[test]
        fn parse_never_panics(text in "(file|s3|x)?(://)?[a-z0-9./:@%?~-]{0,40}") {
            if let Ok(url) = StoreUrl::parse(&text) {
                proptest::prop_assert_eq!(StoreUrl::parse(&url.to_string()), Ok(url));
            }
        }
    }
}
