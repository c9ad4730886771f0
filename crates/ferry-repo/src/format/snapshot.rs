//! Snapshot manifests (`snapshots/<id>`): the commit point of a backup.
//!
//! A snapshot is written last, after every pack and index file its trees need are stored, so
//! a snapshot that exists is always complete. Its name is the BLAKE3 hash of its stored bytes.

use serde::{Deserialize, Serialize};

use crate::format::{
    Cipher, FormatError, Node, NodeBody, ObjectKind, SnapshotId, Timestamp, decode_body,
    encode_body, open_object, seal_object,
};

/// Counters recorded with a snapshot.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Summary {
    /// Bytes of file content in the snapshot (a file with several hard links counted once).
    pub bytes_total: u64,
    /// Bytes of content that were new to the repository (before compression).
    pub bytes_new: u64,
    /// Bytes added to storage (packs, compressed and encrypted).
    pub bytes_stored: u64,
    /// Regular files.
    pub files: u64,
    /// Directories.
    pub dirs: u64,
    /// Entries that could not be read completely (recorded with their error).
    pub errors: u64,
    /// Wall time of the backup, milliseconds.
    pub duration_ms: u64,
}

/// A snapshot manifest.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Snapshot {
    /// When the backup started.
    pub time: Timestamp,
    /// Host that made it.
    pub hostname: String,
    /// What was backed up, in the caller's words (e.g. `namespace/pvc`).
    pub source: String,
    /// Paths read.
    pub paths: Vec<String>,
    /// `key=value` tags, sorted by key.
    pub tags: Vec<(String, String)>,
    /// The snapshot this one was made incrementally against.
    pub parent: Option<SnapshotId>,
    /// The backed-up root (its name is empty).
    pub root: Node,
    /// Counters.
    pub summary: Summary,
    /// Writer program and version.
    pub program: String,
}

impl Snapshot {
    /// The stored (encrypted) form.
    #[must_use]
    pub fn encode(&self, cipher: &Cipher) -> Vec<u8> {
        seal_object(cipher, ObjectKind::Snapshot, &[], &encode_body(self))
    }

    /// Authenticates and decodes the stored form.
    ///
    /// # Errors
    /// Any [`FormatError`]; never panics.
    pub fn decode(cipher: &Cipher, bytes: &[u8]) -> Result<Self, FormatError> {
        let body = open_object(cipher, ObjectKind::Snapshot, &[], bytes)?;
        Self::decode_body(&body)
    }

    /// Decodes and checks a decrypted body.
    ///
    /// # Errors
    /// Any [`FormatError`]; never panics.
    pub fn decode_body(body: &[u8]) -> Result<Self, FormatError> {
        // A root of a kind this build does not know (a newer writer) fails here, naming it.
        let snap: Self =
            decode_body("snapshot (or a snapshot kind this build does not know)", body)?;
        snap.kind()?;
        match &snap.root.body {
            NodeBody::File(c) | NodeBody::Volume { content: c, .. } => {
                c.validate().map_err(|reason| FormatError::Invalid { what: "snapshot", reason })?;
            }
            _ => {}
        }
        Ok(snap)
    }

    /// What the snapshot holds, from its root node.
    ///
    /// # Errors
    /// [`FormatError::Invalid`] for a root that is no snapshot kind.
    pub fn kind(&self) -> Result<SnapshotKind, FormatError> {
        match self.root.body {
            NodeBody::Dir { .. } => Ok(SnapshotKind::Tree),
            NodeBody::File(_) => Ok(SnapshotKind::File),
            NodeBody::Volume { .. } => Ok(SnapshotKind::Volume),
            _ => Err(FormatError::Invalid {
                what: "snapshot",
                reason: "root is not a directory, file or volume".into(),
            }),
        }
    }
}

/// What a snapshot holds, told by the body of its root node.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum SnapshotKind {
    /// A directory tree (root body `Dir`).
    Tree,
    /// A single regular file (root body `File`).
    File,
    /// A block volume or volume image (root body `Volume`).
    Volume,
}

impl SnapshotKind {
    /// `tree`, `file` or `volume`.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Tree => "tree",
            Self::File => "file",
            Self::Volume => "volume",
        }
    }
}

impl std::fmt::Display for SnapshotKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{BlobId, Metadata};
    use proptest::prelude::*;

    fn sample(tags: Vec<(String, String)>, bytes: u64) -> Snapshot {
        Snapshot {
            time: Timestamp { sec: 1_700_000_000, nsec: 5 },
            hostname: "node-1".into(),
            source: "ns/pvc".into(),
            paths: vec!["/data".into()],
            tags,
            parent: Some(SnapshotId([3; 32])),
            root: Node {
                name: Vec::new(),
                body: NodeBody::Dir { pages: vec![BlobId([1; 32])] },
                meta: Metadata::default(),
                hardlink: None,
                error: None,
            },
            summary: Summary { bytes_total: bytes, files: 3, ..Summary::default() },
            program: "ferry 0.1.0".into(),
        }
    }

    proptest! {
        #[test]
        fn round_trip(tags in proptest::collection::vec(("[a-z]{1,5}", ".{0,8}"), 0..4), bytes in any::<u64>()) {
            let c = Cipher::new(&[6; 32]);
            let s = sample(tags, bytes);
            prop_assert_eq!(Snapshot::decode(&c, &s.encode(&c)).ok(), Some(s));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = Snapshot::decode(&Cipher::new(&[6; 32]), &bytes);
            let _ = Snapshot::decode_body(&bytes);
        }
    }

    #[test]
    fn snapshot_cannot_pass_as_index() {
        let c = Cipher::new(&[6; 32]);
        let bytes = sample(vec![], 1).encode(&c);
        assert!(crate::format::IndexFile::decode(&c, &bytes).is_err());
    }
}
