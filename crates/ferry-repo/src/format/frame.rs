//! Frames (format 3): small data blobs compressed and sealed together.
//!
//! Most files are far smaller than a chunk, and zstd compresses a run of small inputs much
//! better together than one by one (FORMAT.md, "Frames"). A frame holds data blobs smaller
//! than [`FRAMED_MAX`] (a volume backup's, smaller than 512 KiB) until their bytes reach
//! [`FRAME_TARGET`]; its plaintext is
//!
//! ```text
//! blob bytes, one after another
//! table        per blob: id[0..8] || raw length u32 LE      (in the blobs' order)
//! count        u32 LE
//! ```
//!
//! stored as any blob's (`[compression][raw len][payload]`, compressed when that pays) and
//! sealed as one object of kind [`ObjectKind::FramedData`] with no identity. Each blob of the
//! frame has its own pack-header and index entry, of kind `FramedData`, giving the frame's
//! place and the blob's own raw length. A read of one blob reads and opens the whole frame,
//! finds the blob by the leading bytes of its id and its length, and checks that those bytes
//! hash to the full id: the frame's encryption authenticates the frame, the hash each blob.

use std::borrow::Cow;
use std::sync::Arc;

use crate::format::{
    BlobId, FormatError, ObjectKind, PackId, RepoKeys, associated_data, compress, open_blob,
};

/// A file backup's data blobs shorter than this are stored in frames (format 3); longer ones
/// alone. (A volume backup frames its chunks under 512 KiB; readers take frames of any
/// blobs' sizes.)
pub const FRAMED_MAX: usize = 128 << 10;
/// A frame is sealed once its blobs' bytes and its table reach this (so a frame of tiny
/// blobs holds at most about 87,000 of them).
pub const FRAME_TARGET: usize = 1 << 20;
/// Bytes of a table entry: the id's leading eight bytes and the blob's length.
const ENTRY: usize = 8 + 4;

/// The leading bytes of a blob id a frame's table keeps.
pub(crate) fn prefix(id: &BlobId) -> [u8; 8] {
    let mut p = [0u8; 8];
    p.copy_from_slice(&id.0[..8]);
    p
}

/// Small data blobs gathered for one frame.
#[derive(Debug, Default)]
pub struct FrameBuilder {
    data: Vec<u8>,
    blobs: Vec<(BlobId, u32)>,
}

impl FrameBuilder {
    /// Adds one blob.
    pub fn push(&mut self, id: BlobId, raw: &[u8]) {
        self.data.extend_from_slice(raw);
        self.blobs.push((id, u32::try_from(raw.len()).unwrap_or(u32::MAX)));
    }

    /// Whether the frame holds enough to be sealed: its blobs' bytes and its table.
    #[must_use]
    pub fn is_full(&self) -> bool {
        self.data.len() + self.blobs.len() * ENTRY >= FRAME_TARGET
    }

    /// Whether no blob was added.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.blobs.is_empty()
    }

    /// Compresses (at `level`, 0 for none) and encrypts the frame, appending its sealed form
    /// to `out`; returns its blobs (ids and raw lengths) in order and leaves the builder empty
    /// (its buffers kept for the next frame). `plain` is scratch space.
    pub fn seal_into(
        &mut self,
        keys: &RepoKeys,
        level: i32,
        plain: &mut Vec<u8>,
        out: &mut Vec<u8>,
    ) -> Vec<(BlobId, u32)> {
        for (id, len) in &self.blobs {
            self.data.extend_from_slice(&prefix(id));
            self.data.extend_from_slice(&len.to_le_bytes());
        }
        let count = u32::try_from(self.blobs.len()).unwrap_or(u32::MAX);
        self.data.extend_from_slice(&count.to_le_bytes());
        plain.clear();
        compress::encode_into(level, &self.data, plain);
        keys.cipher.seal_append(out, &associated_data(ObjectKind::FramedData, &[]), plain);
        self.data.clear();
        std::mem::take(&mut self.blobs)
    }
}

/// An opened frame: its plaintext and where each blob lies in it.
#[derive(Debug)]
pub struct Frame {
    plain: Vec<u8>,
    /// Per blob: the id's leading bytes, start and length in `plain`.
    blobs: Vec<([u8; 8], usize, usize)>,
}

impl Frame {
    /// Authenticates, decompresses and parses a sealed frame.
    ///
    /// # Errors
    /// [`FormatError::Authentication`] for altered bytes or another kind of object;
    /// [`FormatError::Invalid`] or [`FormatError::Truncated`] for a table that does not
    /// describe the plaintext exactly.
    pub fn open(keys: &RepoKeys, sealed: &[u8]) -> Result<Self, FormatError> {
        let stored = keys.cipher.open(&associated_data(ObjectKind::FramedData, &[]), sealed)?;
        Self::decode(compress::decode(&stored)?)
    }

    /// Parses a frame's plaintext (decrypted and decompressed).
    ///
    /// # Errors
    /// As [`Frame::open`], for the table.
    pub fn decode(plain: Vec<u8>) -> Result<Self, FormatError> {
        let blobs = parse_table(&plain)?;
        Ok(Self { plain, blobs })
    }

    /// The bytes of blob `id` of `raw_length` bytes, checked against the id.
    ///
    /// # Errors
    /// [`FormatError::Invalid`] when the frame lists no such blob;
    /// [`FormatError::HashMismatch`] when the bytes it lists do not hash to `id`.
    pub fn blob(
        &self,
        keys: &RepoKeys,
        id: &BlobId,
        raw_length: u32,
    ) -> Result<&[u8], FormatError> {
        let want = prefix(id);
        let mut listed = false;
        for (p, start, len) in &self.blobs {
            if *p != want || *len != raw_length as usize {
                continue;
            }
            listed = true;
            let bytes = &self.plain[*start..*start + *len];
            if keys.blob_id(bytes) == *id {
                return Ok(bytes);
            }
        }
        if listed {
            return Err(FormatError::HashMismatch { what: format!("framed data blob {id}") });
        }
        Err(FormatError::Invalid {
            what: "frame",
            reason: format!("data blob {id} of {raw_length} bytes is not in the frame"),
        })
    }

    /// Every blob of the frame, in order: the id's leading bytes and the bytes.
    pub fn blobs(&self) -> impl Iterator<Item = ([u8; 8], &[u8])> {
        self.blobs.iter().map(|(p, start, len)| (*p, &self.plain[*start..*start + *len]))
    }

    /// Bytes the opened frame holds: its plaintext and its parsed table (a frame of tiny
    /// blobs holds more in its table than in its plaintext).
    #[must_use]
    pub fn memory(&self) -> usize {
        self.plain.capacity()
            + self.blobs.capacity() * std::mem::size_of::<([u8; 8], usize, usize)>()
    }

    /// How many blobs the frame holds.
    #[must_use]
    pub fn len(&self) -> usize {
        self.blobs.len()
    }

    /// Whether the frame holds no blob (never true of a frame that opened).
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.blobs.is_empty()
    }
}

/// Opens blobs from their sealed bytes, alone or in frames, keeping the frame it opened last:
/// a reader going through a pack in order opens each frame once for all its blobs.
#[derive(Debug, Default)]
pub struct BlobOpener {
    last: Option<((PackId, u32), Arc<Frame>)>,
}

impl BlobOpener {
    /// The plaintext of blob `id` of `kind` and `raw_length` whose sealed bytes (the frame's,
    /// for [`ObjectKind::FramedData`]) are `sealed`, at `offset` in pack `pack`.
    ///
    /// # Errors
    /// As [`open_blob`] and [`Frame::open`], [`Frame::blob`].
    pub fn open<'a>(
        &'a mut self,
        keys: &RepoKeys,
        id: &BlobId,
        (kind, raw_length): (ObjectKind, u32),
        at: (PackId, u32),
        sealed: &[u8],
    ) -> Result<Cow<'a, [u8]>, FormatError> {
        if kind != ObjectKind::FramedData {
            return open_blob(keys, id, kind, sealed).map(Cow::Owned);
        }
        let (frame, _) = self.frame(keys, at, sealed)?;
        frame.blob(keys, id, raw_length).map(Cow::Borrowed)
    }

    /// The frame whose sealed bytes are `sealed`, at `offset` in pack `pack`, and whether it
    /// was opened by this call (not kept from the last one).
    ///
    /// # Errors
    /// As [`Frame::open`].
    pub fn frame(
        &mut self,
        keys: &RepoKeys,
        (pack, offset): (PackId, u32),
        sealed: &[u8],
    ) -> Result<(&Arc<Frame>, bool), FormatError> {
        let fresh = !matches!(&self.last, Some((at, _)) if *at == (pack, offset));
        if fresh {
            self.last = None;
        }
        let (_, frame) = match self.last.take() {
            Some(last) => self.last.insert(last),
            None => self.last.insert(((pack, offset), Arc::new(Frame::open(keys, sealed)?))),
        };
        Ok((frame, fresh))
    }
}

/// Reads the table at the end of a frame's plaintext: at least one blob, and the blobs'
/// lengths add up to exactly the bytes before the table.
fn parse_table(plain: &[u8]) -> Result<Vec<([u8; 8], usize, usize)>, FormatError> {
    let invalid = |reason: String| FormatError::Invalid { what: "frame", reason };
    let Some(count_at) = plain.len().checked_sub(4) else {
        return Err(FormatError::Truncated { what: "frame", len: plain.len() });
    };
    let mut count_bytes = [0u8; 4];
    count_bytes.copy_from_slice(&plain[count_at..]);
    let count = u32::from_le_bytes(count_bytes) as usize;
    let table_len = count.checked_mul(ENTRY).filter(|t| *t <= count_at);
    let Some(table_len) = table_len.filter(|_| count > 0) else {
        return Err(invalid(format!("a table of {count} blobs in {} bytes", plain.len())));
    };
    let data_len = count_at - table_len;
    let mut blobs = Vec::with_capacity(count);
    let mut start = 0usize;
    for entry in plain[data_len..count_at].chunks_exact(ENTRY) {
        let mut p = [0u8; 8];
        p.copy_from_slice(&entry[..8]);
        let mut len_bytes = [0u8; 4];
        len_bytes.copy_from_slice(&entry[8..]);
        let len = u32::from_le_bytes(len_bytes) as usize;
        if len > data_len - start {
            return Err(invalid(format!("blobs past the frame's {data_len} bytes")));
        }
        blobs.push((p, start, len));
        start += len;
    }
    if start != data_len {
        return Err(invalid(format!("blobs of {start} bytes in {data_len}")));
    }
    Ok(blobs)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::MasterKey;
    use proptest::prelude::*;

    fn keys() -> RepoKeys {
        MasterKey::from_secret([9; 32]).derive()
    }

    fn sealed(k: &RepoKeys, blobs: &[Vec<u8>], level: i32) -> (Vec<u8>, Vec<(BlobId, u32)>) {
        let mut f = FrameBuilder::default();
        for b in blobs {
            f.push(k.blob_id(b), b);
        }
        let (mut plain, mut out) = (Vec::new(), Vec::new());
        let listed = f.seal_into(k, level, &mut plain, &mut out);
        assert!(f.is_empty(), "sealing empties the builder");
        (out, listed)
    }

    proptest! {
        #[test]
        fn every_blob_of_a_frame_reads_back(
            blobs in proptest::collection::vec(proptest::collection::vec(0u8..4, 0..2000), 1..20),
            level in 0i32..4,
        ) {
            let k = keys();
            let (out, listed) = sealed(&k, &blobs, level);
            prop_assert_eq!(listed.len(), blobs.len());
            let frame = Frame::open(&k, &out).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(frame.len(), blobs.len());
            for ((id, len), blob) in listed.iter().zip(&blobs) {
                let got = frame.blob(&k, id, *len).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(got, &blob[..]);
            }
        }

        #[test]
        fn a_table_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            if let Ok(blobs) = parse_table(&bytes) {
                let total: usize = blobs.iter().map(|b| b.2).sum();
                prop_assert_eq!(total + blobs.len() * ENTRY + 4, bytes.len());
            }
        }

        #[test]
        fn opening_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = Frame::open(&keys(), &bytes);
        }
    }

    #[test]
    fn a_frame_compresses_its_blobs_together() {
        let k = keys();
        // 64 small blobs that share most of their text, as source files do.
        let blobs: Vec<Vec<u8>> = (0..64)
            .map(|i| {
                format!("// file {i}\nfn main() {{ println!(\"hello, world\"); }}\n").repeat(20)
            })
            .map(String::into_bytes)
            .collect();
        let (framed, _) = sealed(&k, &blobs, 1);
        let alone: usize = blobs
            .iter()
            .map(|b| {
                let mut p = Vec::new();
                compress::encode_into(1, b, &mut p);
                p.len()
            })
            .sum();
        assert!(framed.len() * 4 < alone, "frame {} bytes, blobs alone {alone}", framed.len());
    }

    #[test]
    fn a_blob_not_in_the_frame_or_of_another_length_is_refused() {
        let k = keys();
        let blobs = vec![b"one".to_vec(), b"two".to_vec()];
        let (out, listed) = sealed(&k, &blobs, 3);
        let frame = Frame::open(&k, &out).map_err(|e| e.to_string());
        let frame = frame.as_ref().expect("opens");
        assert!(matches!(
            frame.blob(&k, &k.blob_id(b"three"), 5),
            Err(FormatError::Invalid { what: "frame", .. })
        ));
        assert!(frame.blob(&k, &listed[0].0, 4).is_err(), "another length");
        // An id alike in its leading eight bytes but not the blob's: the hash says so.
        let mut alike = listed[1].0;
        alike.0[31] ^= 1;
        assert!(matches!(frame.blob(&k, &alike, 3), Err(FormatError::HashMismatch { .. })));
    }

    #[test]
    fn the_opener_reads_blobs_alone_and_framed() {
        let k = keys();
        let blobs = vec![b"first".to_vec(), b"second".to_vec()];
        let (frame, listed) = sealed(&k, &blobs, 3);
        let lone = b"alone".to_vec();
        let mut scratch = crate::format::SealScratch::default();
        let lone_id = k.blob_id(&lone);
        let lone_sealed = scratch.seal(&k, lone_id, ObjectKind::DataBlob, 3, &lone).to_vec();
        let mut opener = BlobOpener::default();
        let at = (PackId([1; 32]), 100);
        for ((id, len), blob) in listed.iter().zip(&blobs) {
            let got = opener.open(&k, id, (ObjectKind::FramedData, *len), at, &frame);
            assert_eq!(got.map(|b| b.into_owned()).ok().as_ref(), Some(blob));
        }
        let got = opener.open(&k, &lone_id, (ObjectKind::DataBlob, 5), (at.0, 7), &lone_sealed);
        assert_eq!(got.map(|b| b.into_owned()).ok(), Some(lone));
        // The frame kept is the one at that place: other bytes at another place are opened.
        let other = sealed(&k, &[b"third".to_vec()], 3);
        let got =
            opener.open(&k, &other.1[0].0, (ObjectKind::FramedData, 5), (at.0, 900), &other.0);
        assert_eq!(got.map(|b| b.into_owned()).ok(), Some(b"third".to_vec()));
    }

    #[test]
    fn the_opener_opens_a_frame_once_for_its_blobs() {
        let k = keys();
        let blobs = vec![b"first".to_vec(), b"second".to_vec()];
        let (frame, listed) = sealed(&k, &blobs, 3);
        let mut opener = BlobOpener::default();
        let at = (PackId([1; 32]), 100);
        let first = opener.open(&k, &listed[0].0, (ObjectKind::FramedData, 5), at, &frame);
        assert!(first.is_ok());
        // The same place again: the frame kept is used, the bytes passed are not opened.
        let second = opener.open(&k, &listed[1].0, (ObjectKind::FramedData, 6), at, b"garbage");
        assert_eq!(second.map(|b| b.into_owned()).ok(), Some(b"second".to_vec()));
        // Another place: opened, and garbage fails.
        let elsewhere = opener.open(&k, &listed[1].0, (ObjectKind::FramedData, 6), (at.0, 1), b"x");
        assert!(elsewhere.is_err());
    }

    #[test]
    fn a_frame_of_tiny_blobs_is_full_by_its_table() {
        let k = keys();
        let mut f = FrameBuilder::default();
        let mut n = 0u32;
        while !f.is_full() {
            let blob = n.to_le_bytes();
            f.push(k.blob_id(&blob), &blob);
            n += 1;
        }
        assert_eq!(n as usize, FRAME_TARGET.div_ceil(4 + ENTRY), "4-byte blobs");
    }

    #[test]
    fn a_frame_is_not_a_blob_and_altered_bytes_do_not_open() {
        let k = keys();
        let (mut out, listed) = sealed(&k, &[b"data".to_vec()], 3);
        let as_blob = crate::format::open_blob(&k, &listed[0].0, ObjectKind::DataBlob, &out);
        assert!(as_blob.is_err(), "sealed under another kind");
        out[30] ^= 1;
        assert!(matches!(Frame::open(&k, &out), Err(FormatError::Authentication)));
    }
}
