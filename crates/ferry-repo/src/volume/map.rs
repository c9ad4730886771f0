//! The layout of a volume snapshot, checked before anything is written: where each chunk goes
//! and which ranges are unallocated or zero.

use crate::format::{ChunkRef, FileContent, FormatError, NodeBody, Snapshot, SnapshotKind};

/// Largest chunk a volume snapshot may reference (bounds a restore worker's buffer).
pub const MAX_VOLUME_CHUNK: u32 = 16 << 20;

/// A checked volume layout: chunks at their device offsets, and the gaps between them (ranges
/// that read as zeros: unallocated or all-zero at backup time).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeMap {
    /// Size of the volume in bytes.
    pub size: u64,
    /// Logical block size of the source device.
    pub block_size: u32,
    /// Chunks with their device offsets, ascending and non-overlapping, all inside `size`.
    pub chunks: Vec<(u64, ChunkRef)>,
    /// Zero ranges `(offset, len)`, ascending, covering exactly what the chunks do not.
    pub gaps: Vec<(u64, u64)>,
}

fn invalid(reason: impl Into<String>) -> FormatError {
    FormatError::Invalid { what: "volume snapshot", reason: reason.into() }
}

impl VolumeMap {
    /// Decodes a snapshot body and extracts its volume layout (for fuzzing the whole path a
    /// volume restore takes through untrusted bytes).
    ///
    /// # Errors
    /// Any [`FormatError`]; never panics.
    pub fn decode(body: &[u8]) -> Result<Self, FormatError> {
        Self::from_snapshot(&Snapshot::decode_body(body)?)
    }

    /// The layout of a volume snapshot.
    ///
    /// # Errors
    /// [`FormatError::Invalid`] when the snapshot is not a volume snapshot, or its chunks do
    /// not tile its extents, lie outside its size or exceed [`MAX_VOLUME_CHUNK`].
    pub fn from_snapshot(snapshot: &Snapshot) -> Result<Self, FormatError> {
        let (content, block_size) = volume_of(snapshot)?;
        let gaps = checked_gaps(content, block_size)?;
        let chunks = content.placed_chunks();
        Ok(Self { size: content.size, block_size, chunks, gaps })
    }

    /// Bytes held by chunks (the rest of the volume reads as zeros).
    #[must_use]
    pub fn data_bytes(&self) -> u64 {
        self.chunks.iter().map(|(_, c)| u64::from(c.len)).sum()
    }
}

/// A checked volume snapshot's content, its chunks not yet placed: what a restore walks a
/// part at a time ([`FileContent::placed_next`]), holding each chunk once (36 bytes) where a
/// [`VolumeMap`] holds it with its offset (48).
#[derive(Debug)]
pub(crate) struct VolumeContent {
    /// The volume's size, extents and chunks.
    pub content: FileContent,
    /// As [`VolumeMap::gaps`].
    pub gaps: Vec<(u64, u64)>,
}

impl VolumeContent {
    /// The content of a volume snapshot, checked as [`VolumeMap::from_snapshot`] checks it;
    /// the rest of the snapshot is dropped.
    ///
    /// # Errors
    /// As [`VolumeMap::from_snapshot`].
    pub(crate) fn from_snapshot(snapshot: Snapshot) -> Result<Self, FormatError> {
        let kind = snapshot.kind()?;
        let NodeBody::Volume { content, block_size } = snapshot.root.body else {
            return Err(not_a_volume(kind));
        };
        let gaps = checked_gaps(&content, block_size)?;
        Ok(Self { content, gaps })
    }
}

/// A volume snapshot's content and block size.
fn volume_of(snapshot: &Snapshot) -> Result<(&FileContent, u32), FormatError> {
    let kind = snapshot.kind()?;
    let NodeBody::Volume { content, block_size } = &snapshot.root.body else {
        return Err(not_a_volume(kind));
    };
    debug_assert_eq!(kind, SnapshotKind::Volume);
    Ok((content, *block_size))
}

fn not_a_volume(kind: SnapshotKind) -> FormatError {
    invalid(format!("this is a {kind} snapshot, not a volume snapshot"))
}

/// Checks a volume's block size and content; returns the ranges its extents leave out.
fn checked_gaps(content: &FileContent, block_size: u32) -> Result<Vec<(u64, u64)>, FormatError> {
    if !block_size.is_power_of_two() || !(512..=65536).contains(&block_size) {
        return Err(invalid(format!(
            "block size {block_size} is not a power of two in 512..=64Ki"
        )));
    }
    content.validate().map_err(invalid)?;
    if let Some(c) = content.chunks.iter().find(|c| c.len > MAX_VOLUME_CHUNK) {
        return Err(invalid(format!("chunk of {} bytes exceeds {MAX_VOLUME_CHUNK}", c.len)));
    }
    let mut gaps = Vec::new();
    let mut pos = 0u64;
    for extent in content.data_extents() {
        if extent.offset > pos {
            gaps.push((pos, extent.offset - pos));
        }
        pos = extent.offset + extent.len;
    }
    if content.size > pos {
        gaps.push((pos, content.size - pos));
    }
    Ok(gaps)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{
        BlobId, Extent, FileContent, Metadata, Node, SnapshotId, Summary, Timestamp,
    };
    use proptest::prelude::*;

    fn snapshot(body: NodeBody) -> Snapshot {
        Snapshot {
            time: Timestamp::default(),
            hostname: "h".into(),
            source: "/dev/x".into(),
            paths: vec![],
            tags: vec![],
            parent: Some(SnapshotId([1; 32])),
            root: Node {
                name: vec![],
                body,
                meta: Metadata::default(),
                hardlink: None,
                error: None,
            },
            summary: Summary::default(),
            program: "ferry".into(),
        }
    }

    fn volume(size: u64, runs: &[(u64, &[u32])]) -> NodeBody {
        let mut extents = Vec::new();
        let mut chunks = Vec::new();
        for (offset, lens) in runs {
            let len: u64 = lens.iter().map(|l| u64::from(*l)).sum();
            extents.push(Extent { offset: *offset, len });
            chunks.extend(lens.iter().map(|l| ChunkRef { id: BlobId([*l as u8; 32]), len: *l }));
        }
        NodeBody::Volume {
            content: FileContent { size, extents: Some(extents), chunks },
            block_size: 512,
        }
    }

    #[test]
    fn gaps_complement_the_chunks() -> Result<(), FormatError> {
        let s = snapshot(volume(100, &[(10, &[5, 5]), (40, &[20])]));
        let map = VolumeMap::from_snapshot(&s)?;
        assert_eq!(map.gaps, vec![(0, 10), (20, 20), (60, 40)]);
        assert_eq!(map.chunks.iter().map(|(o, _)| *o).collect::<Vec<_>>(), vec![10, 15, 40]);
        assert_eq!(map.data_bytes(), 30);
        // The restore's form: the same gaps, and the same chunks a window at a time.
        let kept = VolumeContent::from_snapshot(s)?;
        assert_eq!(kept.gaps, map.gaps);
        let mut cursor = crate::format::PlacedCursor::default();
        let mut placed = Vec::new();
        for _ in 0..4 {
            placed.extend(kept.content.placed_next(&mut cursor, 2));
        }
        assert_eq!(placed, map.chunks);
        Ok(())
    }

    #[test]
    fn tree_snapshots_and_bad_layouts_are_refused() {
        let tree = snapshot(NodeBody::Dir { pages: vec![] });
        let e = VolumeMap::from_snapshot(&tree).err().map(|e| e.to_string()).unwrap_or_default();
        assert!(e.contains("tree snapshot"), "{e}");
        let e = VolumeContent::from_snapshot(tree).err().map(|e| e.to_string());
        assert!(e.is_some_and(|e| e.contains("tree snapshot")));
        // An extent past the size, a chunk longer than its extent, a huge chunk.
        for body in [volume(10, &[(5, &[10])]), volume(1 << 40, &[(0, &[(16 << 20) + 2])])] {
            assert!(VolumeMap::from_snapshot(&snapshot(body.clone())).is_err());
            assert!(VolumeContent::from_snapshot(snapshot(body)).is_err());
        }
        let NodeBody::Volume { content, .. } = volume(100, &[(0, &[10])]) else { return };
        let odd = NodeBody::Volume { content, block_size: 1000 };
        assert!(VolumeMap::from_snapshot(&snapshot(odd.clone())).is_err());
        assert!(VolumeContent::from_snapshot(snapshot(odd)).is_err());
    }

    proptest! {
        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = VolumeMap::decode(&bytes);
        }

        #[test]
        fn encoded_volume_snapshots_decode_to_their_map(
            runs in proptest::collection::vec((0u64..5000, proptest::collection::vec(1u32..3000, 1..4)), 0..5),
            tail in 0u64..5000,
        ) {
            let mut placed = Vec::new();
            let mut pos = 0;
            for (gap, lens) in &runs {
                pos += gap;
                placed.push((pos, lens.as_slice()));
                pos += lens.iter().map(|l| u64::from(*l)).sum::<u64>();
            }
            let s = snapshot(volume(pos + tail, &placed));
            let map = VolumeMap::decode(&crate::format::encode_body(&s)).map_err(|e| TestCaseError::fail(e.to_string()))?;
            let covered: u64 = map.data_bytes() + map.gaps.iter().map(|g| g.1).sum::<u64>();
            prop_assert_eq!(covered, map.size);
            prop_assert!(map.chunks.iter().all(|(o, c)| o + u64::from(c.len) <= map.size));
        }
    }
}
