//! Pack files: many encrypted blobs, then an encrypted header listing them, then a 4-byte
//! trailer giving the header's length.
//!
//! ```text
//! [version][kind = Pack]
//! blob*        each: nonce(24) || XChaCha20-Poly1305(plaintext) || tag(16),
//!              AD = [version][blob kind] || blob id; plaintext = [compression][raw len][payload]
//! header       a sealed object of kind PackHeader listing (id, kind, offset, length, raw length)
//! trailer      u32 LE: length of header
//! ```
//!
//! In format 2 a data pack's header plaintext is stored uncompressed and padded with zeros to
//! a multiple of [`HEADER_PADDING`], so its length (in clear in the trailer) tells only how
//! many 4 KiB steps the list takes, not how many blobs the pack holds.
//!
//! A pack's name is the BLAKE3 hash of all its bytes, so its integrity can be checked without
//! keys, and no two writers can ever produce the same name for different packs.

use serde::{Deserialize, Serialize};

use crate::format::{
    BlobId, Cipher, FORMAT_VERSION, FormatError, FrameBuilder, MAX_PLAINTEXT, NONCE_LEN,
    ObjectKind, PackId, RepoFormat, RepoKeys, TAG_LEN, associated_data, compress, content_address,
    decode_padded, encode_body, open_object, seal_object, seal_object_as,
};

/// Format 2 pads a data pack's header plaintext to a multiple of this many bytes (about 93
/// entries of about 44 bytes; a full pack of 1 MiB chunks has 16): 0.025 % of a 16 MiB pack.
pub const HEADER_PADDING: usize = 4 << 10;

/// A header entry's largest encoding: a 32-byte id, a kind, three varint u32s (5 bytes each).
pub const ENTRY_BYTES: usize = 32 + 1 + 3 * 5;

/// Where one blob sits in its pack.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackEntry {
    /// The blob.
    pub id: BlobId,
    /// [`ObjectKind::DataBlob`], [`ObjectKind::TreeBlob`] or (format 3) [`ObjectKind::FramedData`]
    /// for a data blob in a frame, whose offset and length are then the frame's.
    pub kind: ObjectKind,
    /// Byte offset of the sealed blob in the pack.
    pub offset: u32,
    /// Length of the sealed blob (nonce, ciphertext, tag).
    pub length: u32,
    /// Length of the blob's plaintext.
    pub raw_length: u32,
}

/// The list of blobs at the end of a pack.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct PackHeader {
    /// Blobs in the order they were written.
    pub entries: Vec<PackEntry>,
}

/// A finished pack, ready to upload.
#[derive(Debug, Clone)]
pub struct SealedPack {
    /// The pack's name.
    pub id: PackId,
    /// The pack's bytes.
    pub bytes: Vec<u8>,
    /// Its blobs.
    pub entries: Vec<PackEntry>,
}

/// Fills one pack with blobs of one kind.
#[derive(Debug)]
pub struct PackBuilder {
    buf: Vec<u8>,
    entries: Vec<PackEntry>,
    raw_bytes: u64,
}

impl Default for PackBuilder {
    fn default() -> Self {
        Self::new()
    }
}

impl PackBuilder {
    /// An empty pack.
    #[must_use]
    pub fn new() -> Self {
        Self::in_buffer(Vec::new())
    }

    /// An empty pack written into `buf` (cleared first), so a writer can reuse the buffers of
    /// packs it stored.
    #[must_use]
    pub fn in_buffer(mut buf: Vec<u8>) -> Self {
        buf.clear();
        buf.extend_from_slice(&[FORMAT_VERSION, ObjectKind::Pack as u8]);
        Self { buf, entries: Vec::new(), raw_bytes: 0 }
    }

    /// Compresses (at `level`, 0 for none), encrypts and appends one blob; returns the bytes
    /// it takes in the pack.
    pub fn add(
        &mut self,
        keys: &RepoKeys,
        id: BlobId,
        kind: ObjectKind,
        level: i32,
        raw: &[u8],
    ) -> u32 {
        let mut plain = Vec::with_capacity(raw.len() / 2 + 16);
        compress::encode_into(level, raw, &mut plain);
        self.add_encoded(&keys.cipher, id, kind, &plain, raw.len())
    }

    /// Appends a blob sealed elsewhere with [`SealScratch::seal`] (so encryption can happen
    /// outside a lock around a shared pack).
    pub fn push_sealed(
        &mut self,
        id: BlobId,
        kind: ObjectKind,
        sealed: &[u8],
        raw_len: usize,
    ) -> u32 {
        let offset = self.buf.len();
        self.buf.extend_from_slice(sealed);
        self.entries.push(PackEntry {
            id,
            kind,
            offset: u32::try_from(offset).unwrap_or(u32::MAX),
            length: u32::try_from(sealed.len()).unwrap_or(u32::MAX),
            raw_length: u32::try_from(raw_len).unwrap_or(u32::MAX),
        });
        self.raw_bytes += raw_len as u64;
        u32::try_from(sealed.len()).unwrap_or(u32::MAX)
    }

    /// Appends a blob whose plaintext is already in stored form (`[compression][len][payload]`).
    pub fn add_encoded(
        &mut self,
        cipher: &Cipher,
        id: BlobId,
        kind: ObjectKind,
        plain: &[u8],
        raw_len: usize,
    ) -> u32 {
        let offset = self.buf.len();
        cipher.seal_append(&mut self.buf, &associated_data(kind, &id.0), plain);
        let length = self.buf.len() - offset;
        self.entries.push(PackEntry {
            id,
            kind,
            offset: u32::try_from(offset).unwrap_or(u32::MAX),
            length: u32::try_from(length).unwrap_or(u32::MAX),
            raw_length: u32::try_from(raw_len).unwrap_or(u32::MAX),
        });
        self.raw_bytes += raw_len as u64;
        u32::try_from(length).unwrap_or(u32::MAX)
    }

    /// Compresses (at `level`) and encrypts the blobs of `frame` as one frame and appends it,
    /// an entry per blob (kind [`ObjectKind::FramedData`], the frame's place); leaves `frame`
    /// empty. `plain` is scratch space.
    pub fn seal_frame(
        &mut self,
        keys: &RepoKeys,
        level: i32,
        frame: &mut FrameBuilder,
        plain: &mut Vec<u8>,
    ) {
        if frame.is_empty() {
            return;
        }
        let offset = self.buf.len();
        let blobs = frame.seal_into(keys, level, plain, &mut self.buf);
        self.push_frame_entries(offset, &blobs);
    }

    /// Appends a frame sealed elsewhere ([`FrameBuilder::seal_into`]) holding `blobs`.
    pub fn push_frame(&mut self, sealed: &[u8], blobs: &[(BlobId, u32)]) {
        let offset = self.buf.len();
        self.buf.extend_from_slice(sealed);
        self.push_frame_entries(offset, blobs);
    }

    fn push_frame_entries(&mut self, offset: usize, blobs: &[(BlobId, u32)]) {
        let length = u32::try_from(self.buf.len() - offset).unwrap_or(u32::MAX);
        let offset = u32::try_from(offset).unwrap_or(u32::MAX);
        for (id, raw_length) in blobs {
            let kind = ObjectKind::FramedData;
            self.entries.push(PackEntry { id: *id, kind, offset, length, raw_length: *raw_length });
            self.raw_bytes += u64::from(*raw_length);
        }
    }

    /// Bytes written so far.
    #[must_use]
    pub fn size(&self) -> usize {
        self.buf.len()
    }

    /// What the pack will take once sealed, about: its bytes so far and a header entry per
    /// blob (which matters for packs of frames of tiny blobs). A writer seals a pack once this
    /// reaches its target.
    #[must_use]
    pub fn filled(&self) -> usize {
        self.buf.len() + self.entries.len() * ENTRY_BYTES
    }

    /// Whether no blob was added.
    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.entries.is_empty()
    }

    /// Blobs added so far.
    #[must_use]
    pub fn entries(&self) -> &[PackEntry] {
        &self.entries
    }

    /// Appends the blobs of `other` (same kind) after this pack's.
    pub fn append(&mut self, other: PackBuilder) {
        let shift = self.buf.len() - 2;
        self.buf.extend_from_slice(&other.buf[2..]);
        self.entries.extend(other.entries.into_iter().map(|mut e| {
            e.offset = u32::try_from(e.offset as usize + shift).unwrap_or(u32::MAX);
            e
        }));
        self.raw_bytes += other.raw_bytes;
    }

    /// Seals the pack for a repository of `format`: appends the encrypted header (a data
    /// pack's padded in format 2) and the trailer, names it.
    #[must_use]
    pub fn finish(mut self, cipher: &Cipher, format: RepoFormat) -> SealedPack {
        let data = self.entries.first().is_some_and(|e| e.kind.is_data());
        let header = PackHeader { entries: self.entries };
        let mut body = encode_body(&header);
        let sealed = match format {
            RepoFormat::V2 | RepoFormat::V3 if data => {
                body.resize(body.len().next_multiple_of(HEADER_PADDING).max(HEADER_PADDING), 0);
                seal_object_as(cipher, FORMAT_VERSION, 0, ObjectKind::PackHeader, &[], &body)
            }
            _ => seal_object(cipher, ObjectKind::PackHeader, &[], &body),
        };
        let len = u32::try_from(sealed.len()).unwrap_or(u32::MAX);
        self.buf.extend_from_slice(&sealed);
        self.buf.extend_from_slice(&len.to_le_bytes());
        let id = PackId(content_address(&self.buf));
        SealedPack { id, bytes: self.buf, entries: header.entries }
    }
}

/// Compresses and encrypts blobs into their sealed form, in buffers kept from one blob to the
/// next (a writer seals millions of blobs; each allocating and freeing its own two buffers
/// churns the allocator). A buffer that grew past the largest volume chunk's room (a huge tree
/// page) is freed instead of kept.
#[derive(Debug, Default)]
pub struct SealScratch {
    plain: Vec<u8>,
    sealed: Vec<u8>,
}

impl SealScratch {
    /// Compresses (at `level`, 0 for none) and encrypts one blob; returns its sealed form,
    /// valid until the next call.
    pub fn seal(
        &mut self,
        keys: &RepoKeys,
        id: BlobId,
        kind: ObjectKind,
        level: i32,
        raw: &[u8],
    ) -> &[u8] {
        if self.sealed.capacity() > compress::SCRATCH_KEEP {
            self.sealed = Vec::new();
        }
        self.plain.clear();
        compress::encode_into(level, raw, &mut self.plain);
        self.sealed.clear();
        keys.cipher.seal_append(&mut self.sealed, &associated_data(kind, &id.0), &self.plain);
        if self.plain.capacity() > compress::SCRATCH_KEEP {
            self.plain = Vec::new();
        }
        &self.sealed
    }
}

/// Reads the header length from a pack's last four bytes.
///
/// # Errors
/// [`FormatError::Truncated`] when `trailer` is not four bytes.
pub fn header_length(trailer: &[u8]) -> Result<u32, FormatError> {
    let bytes: [u8; 4] = trailer
        .try_into()
        .map_err(|_| FormatError::Truncated { what: "pack trailer", len: trailer.len() })?;
    Ok(u32::from_le_bytes(bytes))
}

/// Decodes and checks the header of a whole pack (`pack` holds every byte of it).
///
/// # Errors
/// Truncation, authentication failure, malformed header, or entries that point outside the
/// blob area or overlap.
pub fn read_pack_header(cipher: &Cipher, pack: &[u8]) -> Result<PackHeader, FormatError> {
    let prefix_ok =
        pack.len() >= 6 && pack[0] == FORMAT_VERSION && pack[1] == ObjectKind::Pack as u8;
    if !prefix_ok {
        return match pack {
            [v, ..] if *v != FORMAT_VERSION => Err(FormatError::Version { found: *v }),
            [_, k, ..] => match ObjectKind::from_byte(*k)? {
                ObjectKind::Pack => Err(FormatError::Truncated { what: "pack", len: pack.len() }),
                found => Err(FormatError::WrongKind { expected: ObjectKind::Pack, found }),
            },
            _ => Err(FormatError::Truncated { what: "pack", len: pack.len() }),
        };
    }
    let header_len = header_length(&pack[pack.len() - 4..])? as usize;
    let Some(header_start) = (pack.len() - 4).checked_sub(header_len).filter(|s| *s >= 2) else {
        return Err(FormatError::Invalid {
            what: "pack trailer",
            reason: format!("header length {header_len} exceeds pack"),
        });
    };
    let body =
        open_object(cipher, ObjectKind::PackHeader, &[], &pack[header_start..pack.len() - 4])?;
    // Format 2's padding; format 1 headers have none (a zero byte after a complete header
    // could only have been put there with the key, which authenticates the whole plaintext).
    let header: PackHeader = decode_padded("pack header", &body, HEADER_PADDING)?;
    header.validate(header_start)?;
    Ok(header)
}

impl PackHeader {
    /// Checks that entries are blobs, in order, inside `2..blob_end` and do not overlap
    /// (the blobs of one frame, one after another, all give the frame's place).
    ///
    /// # Errors
    /// [`FormatError::Invalid`].
    pub fn validate(&self, blob_end: usize) -> Result<(), FormatError> {
        let mut next = 2usize;
        let mut frame = None;
        for e in &self.entries {
            let start = e.offset as usize;
            let end = start + e.length as usize;
            let framed = e.kind == ObjectKind::FramedData;
            let same_frame = framed && frame == Some((e.offset, e.length));
            frame = framed.then_some((e.offset, e.length));
            let bad = !e.kind.is_blob()
                || (start < next && !same_frame)
                || end > blob_end
                || (e.length as usize) < NONCE_LEN + TAG_LEN
                || e.raw_length as usize > MAX_PLAINTEXT;
            if bad {
                return Err(FormatError::Invalid {
                    what: "pack header",
                    reason: format!("entry {} at {}+{} is out of place", e.id, e.offset, e.length),
                });
            }
            next = end;
        }
        Ok(())
    }
}

/// Authenticates, decompresses and verifies one sealed blob.
///
/// # Errors
/// [`FormatError::Authentication`] if the bytes were altered or belong to another blob or kind;
/// [`FormatError::HashMismatch`] if the plaintext does not hash to `id`.
pub fn open_blob(
    keys: &RepoKeys,
    id: &BlobId,
    kind: ObjectKind,
    sealed: &[u8],
) -> Result<Vec<u8>, FormatError> {
    let plain = keys.cipher.open(&associated_data(kind, &id.0), sealed)?;
    let raw = compress::decode(&plain)?;
    if keys.blob_id(&raw) != *id {
        return Err(FormatError::HashMismatch { what: format!("{kind} {id}") });
    }
    Ok(raw)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::MasterKey;
    use proptest::prelude::*;

    fn keys() -> RepoKeys {
        MasterKey::from_secret([5; 32]).derive()
    }

    proptest! {
        #[test]
        fn pack_round_trip(blobs in proptest::collection::vec(proptest::collection::vec(0u8..3, 0..3000), 0..8)) {
            let k = keys();
            let mut b = PackBuilder::new();
            for (i, blob) in blobs.iter().enumerate() {
                let kind = if i % 2 == 0 { ObjectKind::DataBlob } else { ObjectKind::TreeBlob };
                b.add(&k, k.blob_id(blob), kind, 3, blob);
            }
            let format = if blobs.len() % 2 == 0 { RepoFormat::V1 } else { RepoFormat::V2 };
            let sealed = b.finish(&k.cipher, format);
            prop_assert_eq!(sealed.id.0, content_address(&sealed.bytes));
            let header = read_pack_header(&k.cipher, &sealed.bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
            prop_assert_eq!(&header.entries, &sealed.entries);
            for (e, blob) in header.entries.iter().zip(&blobs) {
                let bytes = &sealed.bytes[e.offset as usize..(e.offset + e.length) as usize];
                let raw = open_blob(&k, &e.id, e.kind, bytes).map_err(|e| TestCaseError::fail(e.to_string()))?;
                prop_assert_eq!(&raw, blob);
                prop_assert_eq!(e.raw_length as usize, blob.len());
            }
        }

        #[test]
        fn read_header_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = read_pack_header(&keys().cipher, &bytes);
        }

        #[test]
        fn header_body_decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            if let Ok(h) = decode_padded::<PackHeader>("pack header", &bytes, HEADER_PADDING) {
                let _ = h.validate(1000);
            }
        }

        #[test]
        fn open_blob_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..300)) {
            let _ = open_blob(&keys(), &BlobId([0; 32]), ObjectKind::DataBlob, &bytes);
        }
    }

    #[test]
    fn a_reused_scratch_seals_each_blob_on_its_own() {
        let k = keys();
        let mut scratch = SealScratch::default();
        let big: Vec<u8> = (0..100_000u32).map(|i| (i * 7 % 251) as u8).collect();
        for (raw, level) in [(&big[..], 3), (&b"short"[..], 3), (&big[..1000], 0), (&[][..], 3)] {
            let id = k.blob_id(raw);
            let sealed = scratch.seal(&k, id, ObjectKind::DataBlob, level, raw).to_vec();
            let opened = open_blob(&k, &id, ObjectKind::DataBlob, &sealed).expect("opens");
            assert_eq!(opened, raw);
        }
    }

    #[test]
    fn blob_of_other_kind_or_id_is_rejected() {
        let k = keys();
        let mut b = PackBuilder::new();
        let data = b"some data".to_vec();
        let id = k.blob_id(&data);
        b.add(&k, id, ObjectKind::DataBlob, 3, &data);
        let sealed = b.finish(&k.cipher, RepoFormat::V2);
        let e = sealed.entries[0];
        let bytes = &sealed.bytes[e.offset as usize..(e.offset + e.length) as usize];
        assert!(open_blob(&k, &id, ObjectKind::TreeBlob, bytes).is_err());
        assert!(open_blob(&k, &k.blob_id(b"other"), ObjectKind::DataBlob, bytes).is_err());
        assert!(open_blob(&k, &id, ObjectKind::DataBlob, bytes).is_ok());
    }

    #[test]
    fn flipped_header_byte_is_detected() {
        let k = keys();
        let mut b = PackBuilder::new();
        b.add(&k, k.blob_id(b"x"), ObjectKind::DataBlob, 3, b"x");
        for format in [RepoFormat::V1, RepoFormat::V2] {
            let mut bytes = PackBuilder::finish(clone(&b), &k.cipher, format).bytes;
            let n = bytes.len();
            bytes[n - 10] ^= 0x40;
            assert!(read_pack_header(&k.cipher, &bytes).is_err(), "{format}");
        }
    }

    fn clone(b: &PackBuilder) -> PackBuilder {
        PackBuilder { buf: b.buf.clone(), entries: b.entries.clone(), raw_bytes: b.raw_bytes }
    }

    /// A pack of `count` small blobs, sealed for `format`.
    fn pack_of(k: &RepoKeys, count: usize, format: RepoFormat) -> SealedPack {
        let mut b = PackBuilder::new();
        for i in 0..count {
            let blob = format!("blob {i}").into_bytes();
            b.add(k, k.blob_id(&blob), ObjectKind::DataBlob, 0, &blob);
        }
        b.finish(&k.cipher, format)
    }

    fn header_len(pack: &SealedPack) -> u32 {
        header_length(&pack.bytes[pack.bytes.len() - 4..]).unwrap_or_default()
    }

    #[test]
    fn a_format_2_header_does_not_tell_the_blob_count() {
        let k = keys();
        let one = pack_of(&k, 1, RepoFormat::V2);
        let many = pack_of(&k, 80, RepoFormat::V2);
        assert_eq!(header_len(&one), header_len(&many), "both within the first padding step");
        assert_eq!(header_len(&one) as usize, HEADER_PADDING + 47);
        assert_ne!(
            header_len(&pack_of(&k, 1, RepoFormat::V1)),
            header_len(&pack_of(&k, 80, RepoFormat::V1)),
            "format 1 headers have their exact length"
        );
        for pack in [one, many] {
            let header = read_pack_header(&k.cipher, &pack.bytes).map_err(|e| e.to_string());
            assert_eq!(header.map(|h| h.entries), Ok(pack.entries));
        }
    }

    /// The entries of one frame may share its place; nothing else may overlap.
    #[test]
    fn only_a_frames_own_entries_share_a_place() {
        let entry = |n: u8, kind, offset, length| PackEntry {
            id: BlobId([n; 32]),
            kind,
            offset,
            length,
            raw_length: 10,
        };
        let (frame, data) = (ObjectKind::FramedData, ObjectKind::DataBlob);
        let valid = |entries: Vec<PackEntry>| PackHeader { entries }.validate(1000).is_ok();
        // A frame of three blobs, then a blob alone, then another frame.
        assert!(valid(vec![
            entry(1, frame, 2, 100),
            entry(2, frame, 2, 100),
            entry(3, frame, 2, 100),
            entry(4, data, 102, 50),
            entry(5, frame, 152, 60),
            entry(6, frame, 152, 60),
        ]));
        // A blob alone at a frame's place; a frame's entries of two lengths; a frame listed
        // again after another entry; two blobs alone at one place.
        assert!(!valid(vec![entry(1, frame, 2, 100), entry(2, data, 2, 100)]));
        assert!(!valid(vec![entry(1, data, 2, 100), entry(2, frame, 2, 100)]));
        assert!(!valid(vec![entry(1, frame, 2, 100), entry(2, frame, 2, 90)]));
        assert!(!valid(vec![
            entry(1, frame, 2, 100),
            entry(2, data, 102, 50),
            entry(3, frame, 2, 100),
        ]));
        assert!(!valid(vec![entry(1, data, 2, 100), entry(2, data, 2, 100)]));
    }

    #[test]
    fn a_sealed_frame_reads_back_from_its_pack() {
        let k = keys();
        let mut frame = FrameBuilder::default();
        let blobs: Vec<Vec<u8>> = (0..5u8).map(|i| vec![i; 300 + usize::from(i)]).collect();
        for blob in &blobs {
            frame.push(k.blob_id(blob), blob);
        }
        let mut b = PackBuilder::new();
        b.add(&k, k.blob_id(b"alone"), ObjectKind::DataBlob, 3, b"alone");
        b.seal_frame(&k, 3, &mut frame, &mut Vec::new());
        b.seal_frame(&k, 3, &mut frame, &mut Vec::new());
        assert_eq!(b.entries().len(), 6, "an empty frame adds nothing");
        let sealed = b.finish(&k.cipher, RepoFormat::V3);
        let header = read_pack_header(&k.cipher, &sealed.bytes).map_err(|e| e.to_string());
        assert_eq!(header.as_ref().map(|h| h.entries.len()), Ok(6));
        let mut opener = crate::format::BlobOpener::default();
        for (e, blob) in sealed.entries[1..].iter().zip(&blobs) {
            assert_eq!(e.kind, ObjectKind::FramedData);
            let bytes = &sealed.bytes[e.offset as usize..(e.offset + e.length) as usize];
            let raw = opener.open(&k, &e.id, (e.kind, e.raw_length), (sealed.id, e.offset), bytes);
            assert_eq!(raw.map(|r| r.into_owned()).ok().as_ref(), Some(blob));
        }
    }

    #[test]
    fn appended_packs_keep_every_blob_readable() {
        let k = keys();
        let (mut a, mut b) = (PackBuilder::new(), PackBuilder::new());
        let blobs: Vec<Vec<u8>> = (0..6).map(|i| vec![i; 100 + usize::from(i)]).collect();
        for (i, blob) in blobs.iter().enumerate() {
            let into = if i % 2 == 0 { &mut a } else { &mut b };
            into.add(&k, k.blob_id(blob), ObjectKind::DataBlob, 3, blob);
        }
        a.append(b);
        let sealed = a.finish(&k.cipher, RepoFormat::V2);
        let header = read_pack_header(&k.cipher, &sealed.bytes).map_err(|e| e.to_string());
        assert_eq!(header.as_ref().map(|h| h.entries.len()), Ok(6));
        for e in &sealed.entries {
            let bytes = &sealed.bytes[e.offset as usize..(e.offset + e.length) as usize];
            let raw = open_blob(&k, &e.id, e.kind, bytes).map_err(|e| e.to_string());
            assert!(raw.is_ok_and(|raw| blobs.contains(&raw)));
        }
    }
}
