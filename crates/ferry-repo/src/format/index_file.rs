//! Index files (`index/<id>`): which pack holds each blob, and where.
//!
//! Written only after every pack they name is stored, so a blob the index names is always
//! readable. Never rewritten: a later index may list earlier ones in `supersedes` (for
//! compaction by garbage collection), and readers then ignore the superseded files.

use serde::{Deserialize, Serialize};

use crate::format::{
    Cipher, FormatError, IndexId, ObjectKind, PackEntry, PackId, decode_body, encode_body,
    open_object, seal_object,
};

/// One blob's location (the same record as in the pack header).
pub type IndexEntry = PackEntry;

/// The blobs of one pack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexPack {
    /// The pack.
    pub id: PackId,
    /// The pack's size in bytes.
    pub size: u64,
    /// Its blobs.
    pub entries: Vec<IndexEntry>,
}

/// The body of an index file.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct IndexFile {
    /// Packs described.
    pub packs: Vec<IndexPack>,
    /// Index files this one replaces (written by compaction; empty for backups).
    pub supersedes: Vec<IndexId>,
}

impl IndexFile {
    /// The stored (encrypted) form.
    #[must_use]
    pub fn encode(&self, cipher: &Cipher) -> Vec<u8> {
        seal_object(cipher, ObjectKind::Index, &[], &encode_body(self))
    }

    /// Authenticates and decodes the stored form, checking every entry is a blob inside its
    /// pack.
    ///
    /// # Errors
    /// Any [`FormatError`]; never panics.
    pub fn decode(cipher: &Cipher, bytes: &[u8]) -> Result<Self, FormatError> {
        let body = open_object(cipher, ObjectKind::Index, &[], bytes)?;
        Self::decode_body(&body)
    }

    /// Decodes and checks a decrypted body.
    ///
    /// # Errors
    /// Any [`FormatError`]; never panics.
    pub fn decode_body(body: &[u8]) -> Result<Self, FormatError> {
        let file: Self = decode_body("index", body)?;
        for pack in &file.packs {
            let end = usize::try_from(pack.size).unwrap_or(usize::MAX);
            for e in &pack.entries {
                let inside = (e.offset as u64 + e.length as u64) <= pack.size && e.offset >= 2;
                let raw_ok = e.raw_length as usize <= crate::format::MAX_PLAINTEXT;
                if !e.kind.is_blob() || !inside || !raw_ok {
                    return Err(FormatError::Invalid {
                        what: "index",
                        reason: format!(
                            "entry {} of pack {} out of place (pack size {end})",
                            e.id, pack.id
                        ),
                    });
                }
            }
        }
        Ok(file)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::BlobId;
    use proptest::prelude::*;

    fn entry() -> impl Strategy<Value = IndexEntry> {
        let kinds = [ObjectKind::DataBlob, ObjectKind::TreeBlob, ObjectKind::FramedData];
        let raw = 0..=crate::format::MAX_PLAINTEXT as u32;
        (any::<[u8; 32]>(), 0usize..3, 2u32..1000, 40u32..1000, raw).prop_map(
            move |(id, kind, offset, length, raw)| IndexEntry {
                id: BlobId(id),
                kind: kinds[kind],
                offset,
                length,
                raw_length: raw,
            },
        )
    }

    proptest! {
        #[test]
        fn round_trip(packs in proptest::collection::vec((any::<[u8; 32]>(), proptest::collection::vec(entry(), 0..5)), 0..4)) {
            let file = IndexFile {
                packs: packs.into_iter().map(|(id, entries)| IndexPack { id: PackId(id), size: 5000, entries }).collect(),
                supersedes: vec![IndexId([1; 32])],
            };
            let c = Cipher::new(&[2; 32]);
            prop_assert_eq!(IndexFile::decode(&c, &file.encode(&c)).ok(), Some(file));
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = IndexFile::decode(&Cipher::new(&[2; 32]), &bytes);
            let _ = IndexFile::decode_body(&bytes);
        }
    }

    #[test]
    fn entry_past_pack_end_is_rejected() {
        let file = IndexFile {
            packs: vec![IndexPack {
                id: PackId([0; 32]),
                size: 100,
                entries: vec![IndexEntry {
                    id: BlobId([0; 32]),
                    kind: ObjectKind::DataBlob,
                    offset: 90,
                    length: 50,
                    raw_length: 1,
                }],
            }],
            supersedes: vec![],
        };
        let c = Cipher::new(&[2; 32]);
        assert!(IndexFile::decode(&c, &file.encode(&c)).is_err());
        // A raw length no blob may have (it would also reach the in-memory kind bits).
        let mut huge = file.clone();
        huge.packs[0].entries[0].offset = 2;
        assert!(IndexFile::decode(&c, &huge.encode(&c)).is_ok());
        huge.packs[0].entries[0].raw_length = crate::format::MAX_PLAINTEXT as u32 + 1;
        assert!(IndexFile::decode(&c, &huge.encode(&c)).is_err());
    }
}
