//! The repository format: pure encoding and decoding of every stored object, no I/O.
//!
//! Every stored object starts with a version byte ([`FORMAT_VERSION`]; for the config, the
//! repository's format, [`RepoFormat`]) and an [`ObjectKind`] byte. Encrypted objects continue with a 24-byte nonce and an
//! XChaCha20-Poly1305 ciphertext whose associated data binds the version, the kind and,
//! where the object has one, its identity. See `FORMAT.md` beside `Cargo.toml`.

mod chunker;
mod compress;
mod config;
mod crypto;
pub mod frame;
mod ids;
mod index_file;
mod keys;
pub mod limits;
mod pack;
mod prf_cut;
mod snapshot;
mod tree;

pub use chunker::{Chunker, ChunkerParams};
pub use compress::{Compression, DEFAULT_DATA_LEVEL};
pub use config::{Config, PackParams, RepoFormat};
pub use crypto::{Cipher, NONCE_LEN, TAG_LEN};
pub use frame::{BlobOpener, FRAMED_MAX, Frame, FrameBuilder};
pub(crate) use ids::content_address;
pub use ids::{BlobId, IndexId, KeyId, PackId, SnapshotId};
pub use index_file::{IndexEntry, IndexFile, IndexPack};
pub use keys::{
    KMS_CONTEXT, KdfParams, KeyFile, KeyWrap, MAX_KMS_BLOB_BYTES, MAX_KMS_KEY_ID_BYTES, MasterKey,
    PasswordSeal, RepoKeys,
};
pub use pack::{
    ENTRY_BYTES as PACK_ENTRY_BYTES, HEADER_PADDING, PackBuilder, PackEntry, PackHeader,
    SealScratch, SealedPack, header_length, open_blob, read_pack_header,
};
pub use prf_cut::{PrfCut, WINDOW as PRF_CUT_WINDOW};
pub use snapshot::{Snapshot, SnapshotKind, Summary};
pub(crate) use tree::PlacedCursor;
pub use tree::{
    ChunkRef, Extent, FileContent, Metadata, Node, NodeBody, Timestamp, TreePage, Xattr,
    validate_name,
};

/// The encoding version written as the first byte of every stored object but the config.
/// The config's first byte is the repository's format version ([`RepoFormat`]): 1 or 2.
pub const FORMAT_VERSION: u8 = 1;

/// Largest plaintext any stored object may declare (bounds allocations on hostile input).
pub const MAX_PLAINTEXT: usize = 512 << 20;

/// What a stored object (or a blob inside a pack) is. Bound into the associated data of its
/// encryption so one kind can never be passed off as another.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, serde::Serialize, serde::Deserialize)]
#[repr(u8)]
pub enum ObjectKind {
    /// `config`: repository parameters, encrypted with the master key.
    Config = 1,
    /// `keys/<id>`: the master key wrapped by a key-encryption key.
    KeyFile = 2,
    /// `data/<xx>/<id>`: a pack file (the leading bytes of the file).
    Pack = 3,
    /// The encrypted header at the end of a pack.
    PackHeader = 4,
    /// A blob of file or volume data inside a pack.
    DataBlob = 5,
    /// A blob holding one page of a directory tree inside a pack.
    TreeBlob = 6,
    /// `index/<id>`: where blobs live.
    Index = 7,
    /// `snapshots/<id>`: a snapshot manifest, the commit point of a backup.
    Snapshot = 8,
    /// `gc/mark-<id>`, `gc/writers-<id>`: garbage-collection state.
    GcState = 9,
    /// A data blob stored in a frame with other small data blobs (format 3): its pack entry
    /// gives the frame's place, and the frame is sealed as one object of this kind
    /// ([`frame`]).
    FramedData = 10,
}

impl ObjectKind {
    /// Parses the kind byte.
    ///
    /// # Errors
    /// [`FormatError::UnknownKind`] for bytes that name no kind.
    pub fn from_byte(byte: u8) -> Result<Self, FormatError> {
        Ok(match byte {
            1 => Self::Config,
            2 => Self::KeyFile,
            3 => Self::Pack,
            4 => Self::PackHeader,
            5 => Self::DataBlob,
            6 => Self::TreeBlob,
            7 => Self::Index,
            8 => Self::Snapshot,
            9 => Self::GcState,
            10 => Self::FramedData,
            other => return Err(FormatError::UnknownKind { found: other }),
        })
    }

    /// Whether this is a kind of blob stored inside packs.
    #[must_use]
    pub fn is_blob(self) -> bool {
        matches!(self, Self::DataBlob | Self::TreeBlob | Self::FramedData)
    }

    /// Whether this is a kind of data blob (alone or in a frame).
    #[must_use]
    pub fn is_data(self) -> bool {
        matches!(self, Self::DataBlob | Self::FramedData)
    }
}

impl std::fmt::Display for ObjectKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let name = match self {
            Self::Config => "config",
            Self::KeyFile => "key file",
            Self::Pack => "pack",
            Self::PackHeader => "pack header",
            Self::DataBlob => "data blob",
            Self::TreeBlob => "tree blob",
            Self::Index => "index",
            Self::Snapshot => "snapshot",
            Self::GcState => "gc state",
            Self::FramedData => "framed data blob",
        };
        f.write_str(name)
    }
}

/// Why stored bytes could not be decoded. Decoders return this for any input, never panic.
#[derive(Debug, thiserror::Error)]
#[non_exhaustive]
pub enum FormatError {
    /// Fewer bytes than the structure needs.
    #[error("truncated {what}: {len} bytes")]
    Truncated {
        /// The structure being read.
        what: &'static str,
        /// Bytes available.
        len: usize,
    },
    /// A version byte this build does not know for the object.
    #[error(
        "unsupported version {found} (this build reads repositories of format 1 and 2, whose \
         objects other than the config are all of version 1)"
    )]
    Version {
        /// The version byte found.
        found: u8,
    },
    /// A kind byte that names no kind.
    #[error("unknown object kind byte {found}")]
    UnknownKind {
        /// The byte found.
        found: u8,
    },
    /// An object of another kind than expected.
    #[error("expected a {expected}, found a {found}")]
    WrongKind {
        /// The kind asked for.
        expected: ObjectKind,
        /// The kind stored.
        found: ObjectKind,
    },
    /// Authenticated decryption failed: the bytes were altered, or the key is wrong.
    #[error("authentication failed (damaged bytes or wrong key)")]
    Authentication,
    /// The decrypted body did not decode.
    #[error("malformed {what}: {source}")]
    Decode {
        /// The structure being decoded.
        what: &'static str,
        /// The decoder's error.
        #[source]
        source: postcard::Error,
    },
    /// A compression mode byte this build does not know.
    #[error("unknown compression mode {found}")]
    Compression {
        /// The byte found.
        found: u8,
    },
    /// zstd rejected the compressed bytes, or they expanded to the wrong length.
    #[error("decompression failed: {reason}")]
    Decompress {
        /// What went wrong.
        reason: String,
    },
    /// The plaintext does not hash to the identifier it is stored under.
    #[error("content of {what} does not match its id")]
    HashMismatch {
        /// The object or blob (kind and id).
        what: String,
    },
    /// A structurally valid value that breaks a rule of the format.
    #[error("invalid {what}: {reason}")]
    Invalid {
        /// The structure being checked.
        what: &'static str,
        /// The rule broken.
        reason: String,
    },
}

/// Associated data for an object or blob: version, kind, then the identity bytes.
pub(crate) fn associated_data(kind: ObjectKind, identity: &[u8]) -> Vec<u8> {
    associated_data_of(FORMAT_VERSION, kind, identity)
}

/// Associated data for an object of encoding `version`.
fn associated_data_of(version: u8, kind: ObjectKind, identity: &[u8]) -> Vec<u8> {
    let mut ad = Vec::with_capacity(2 + identity.len());
    ad.push(version);
    ad.push(kind as u8);
    ad.extend_from_slice(identity);
    ad
}

/// Checks the two-byte prefix of a stored object and returns the rest.
///
/// # Errors
/// Truncated input, an unknown version or an unexpected kind.
pub fn split_prefix(bytes: &[u8], expected: ObjectKind) -> Result<&[u8], FormatError> {
    split_versioned(bytes, expected, &[FORMAT_VERSION]).map(|(_, rest)| rest)
}

/// Checks the two-byte prefix of a stored object whose version may be any of `versions`;
/// returns the version and the rest.
fn split_versioned<'a>(
    bytes: &'a [u8],
    expected: ObjectKind,
    versions: &[u8],
) -> Result<(u8, &'a [u8]), FormatError> {
    let [version, kind, rest @ ..] = bytes else {
        return Err(FormatError::Truncated { what: "object prefix", len: bytes.len() });
    };
    if !versions.contains(version) {
        return Err(FormatError::Version { found: *version });
    }
    let found = ObjectKind::from_byte(*kind)?;
    if found != expected {
        return Err(FormatError::WrongKind { expected, found });
    }
    Ok((*version, rest))
}

/// Encrypts a whole stored object: prefix, nonce, ciphertext of `[compression][len][body]`.
pub(crate) fn seal_object(
    cipher: &Cipher,
    kind: ObjectKind,
    identity: &[u8],
    body: &[u8],
) -> Vec<u8> {
    seal_object_as(cipher, FORMAT_VERSION, compress::OBJECT_LEVEL, kind, identity, body)
}

/// [`seal_object`] with the prefix's `version` and the zstd `level` (0: stored raw, so the
/// sealed length follows the body's exactly, padding included).
pub(crate) fn seal_object_as(
    cipher: &Cipher,
    version: u8,
    level: i32,
    kind: ObjectKind,
    identity: &[u8],
    body: &[u8],
) -> Vec<u8> {
    let plain = compress::encode(level, body);
    let mut out = Vec::with_capacity(2 + NONCE_LEN + plain.len() + TAG_LEN);
    out.push(version);
    out.push(kind as u8);
    cipher.seal_append(&mut out, &associated_data_of(version, kind, identity), &plain);
    out
}

/// Opens an encrypted object: checks the prefix, authenticates, decompresses.
///
/// # Errors
/// Any [`FormatError`]; never panics on hostile input.
pub fn open_object(
    cipher: &Cipher,
    kind: ObjectKind,
    identity: &[u8],
    bytes: &[u8],
) -> Result<Vec<u8>, FormatError> {
    open_object_of(cipher, kind, identity, bytes, &[FORMAT_VERSION]).map(|(_, body)| body)
}

/// [`open_object`] of an object whose version may be any of `versions` (the version is
/// authenticated with the rest); returns the version and the body.
pub(crate) fn open_object_of(
    cipher: &Cipher,
    kind: ObjectKind,
    identity: &[u8],
    bytes: &[u8],
    versions: &[u8],
) -> Result<(u8, Vec<u8>), FormatError> {
    let (version, sealed) = split_versioned(bytes, kind, versions)?;
    let plain = cipher.open(&associated_data_of(version, kind, identity), sealed)?;
    Ok((version, compress::decode(&plain)?))
}

/// Decodes a postcard body, requiring that every byte is used.
pub(crate) fn decode_body<'de, T: serde::Deserialize<'de>>(
    what: &'static str,
    bytes: &'de [u8],
) -> Result<T, FormatError> {
    let (value, rest) =
        postcard::take_from_bytes(bytes).map_err(|source| FormatError::Decode { what, source })?;
    if !rest.is_empty() {
        return Err(FormatError::Invalid {
            what,
            reason: format!("{} trailing bytes", rest.len()),
        });
    }
    Ok(value)
}

/// Decodes a postcard body followed by zero padding (none, or up to `max_padding` zero bytes).
pub(crate) fn decode_padded<'de, T: serde::Deserialize<'de>>(
    what: &'static str,
    bytes: &'de [u8],
    max_padding: usize,
) -> Result<T, FormatError> {
    let (value, rest) =
        postcard::take_from_bytes(bytes).map_err(|source| FormatError::Decode { what, source })?;
    if rest.len() > max_padding || rest.iter().any(|b| *b != 0) {
        return Err(FormatError::Invalid {
            what,
            reason: format!("{} trailing bytes that are not its padding", rest.len()),
        });
    }
    Ok(value)
}

/// Encodes a postcard body.
pub(crate) fn encode_body<T: serde::Serialize>(value: &T) -> Vec<u8> {
    // Our types have only sized sequences and no custom serialisers, so writing them into a
    // growable Vec has no failure path in postcard.
    #[allow(clippy::expect_used)]
    postcard::to_allocvec(value).expect("postcard encoding into a Vec cannot fail")
}

#[cfg(test)]
mod tests {
    use super::*;

    /// In postcard bodies (pack headers, index files) a kind is its variant's index, not its
    /// byte: a variant inserted before another would change every stored entry's meaning.
    #[test]
    fn kinds_keep_their_place_in_bodies_and_their_byte() {
        let kinds = [
            ObjectKind::Config,
            ObjectKind::KeyFile,
            ObjectKind::Pack,
            ObjectKind::PackHeader,
            ObjectKind::DataBlob,
            ObjectKind::TreeBlob,
            ObjectKind::Index,
            ObjectKind::Snapshot,
            ObjectKind::GcState,
            ObjectKind::FramedData,
        ];
        for (index, kind) in kinds.iter().enumerate() {
            assert_eq!(encode_body(kind), vec![index as u8], "{kind}");
            assert_eq!(ObjectKind::from_byte(*kind as u8).ok(), Some(*kind));
            assert_eq!(*kind as usize, index + 1, "{kind}");
        }
    }
}
