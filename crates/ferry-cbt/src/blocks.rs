//! Ranges of a volume as the SnapshotMetadata service reports them, checked as they arrive.

use ferry_proto::snapshotmetadata::{BlockMetadata, BlockMetadataType};

/// A byte range of a volume: `offset .. offset + len`, `len > 0`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    /// The first byte.
    pub offset: u64,
    /// The number of bytes.
    pub len: u64,
}

impl Range {
    /// The byte after the last one.
    #[must_use]
    pub const fn end(&self) -> u64 {
        self.offset + self.len
    }
}

/// How the service cut its ranges.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlockType {
    /// Every range was one block of the same size.
    FixedLength,
    /// Ranges were extents of any size.
    VariableLength,
}

impl BlockType {
    /// The name the API uses.
    #[must_use]
    pub const fn as_str(self) -> &'static str {
        match self {
            Self::FixedLength => "FIXED_LENGTH",
            Self::VariableLength => "VARIABLE_LENGTH",
        }
    }
}

/// A complete, checked answer: the volume's size and its ranges in order, adjacent ranges
/// merged.
///
/// A service may answer "nothing" (no block allocated, nothing changed) by ending the stream
/// without a single response, as the CSI hostpath driver does: then the map is empty and the
/// service said neither the volume's size nor its block type.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockMap {
    /// The volume's size in bytes, as the service reported it; `None` when no response came.
    pub capacity: Option<u64>,
    /// How the service cut its ranges (before merging); `None` when no response came.
    pub block_type: Option<BlockType>,
    /// The ranges, ascending, disjoint, not adjacent.
    pub ranges: Vec<Range>,
}

impl BlockMap {
    /// The bytes the ranges cover.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.ranges.iter().map(|r| r.len).sum()
    }
}

/// Collects the responses of one query, across resumed streams, refusing anything the API's
/// rules forbid. The text of an error says which rule and where.
#[derive(Debug, Default)]
pub struct Collector {
    capacity: Option<u64>,
    block_type: Option<BlockType>,
    fixed_len: Option<u64>,
    ranges: Vec<Range>,
    /// The end of the last range received: where a resumed stream starts.
    next: u64,
    /// The `starting_offset` of the stream now being read, until its first range arrives.
    resumed_at: Option<u64>,
}

impl Collector {
    /// An empty collection, before the first stream.
    #[must_use]
    pub fn new() -> Self {
        Self { resumed_at: Some(0), ..Self::default() }
    }

    /// The offset a (resumed) stream asks to start at: the end of the last range received.
    #[must_use]
    pub const fn next_offset(&self) -> u64 {
        self.next
    }

    /// Marks the start of a new stream at [`Self::next_offset`].
    pub fn restart(&mut self) {
        self.resumed_at = Some(self.next);
    }

    /// The separate ranges collected so far (after merging adjacent ones).
    #[must_use]
    pub fn range_count(&self) -> usize {
        self.ranges.len()
    }

    /// Adds one response's fields.
    ///
    /// # Errors
    /// The response breaks a rule of the API: an unknown block type or one that changed, a
    /// capacity of zero or one that changed, an empty, negative, overlapping, out-of-order or
    /// out-of-volume range, or fixed-length blocks of different sizes.
    pub fn push(
        &mut self,
        block_type: i32,
        capacity: i64,
        blocks: &[BlockMetadata],
    ) -> Result<(), String> {
        let kind = match BlockMetadataType::try_from(block_type) {
            Ok(BlockMetadataType::FixedLength) => BlockType::FixedLength,
            Ok(BlockMetadataType::VariableLength) => BlockType::VariableLength,
            Ok(BlockMetadataType::Unknown) | Err(_) => {
                return Err(format!("block metadata type {block_type} is not a known type"));
            }
        };
        if *self.block_type.get_or_insert(kind) != kind {
            return Err(format!(
                "block metadata type changed from {} to {} within one answer",
                self.block_type.map_or("?", BlockType::as_str),
                kind.as_str()
            ));
        }
        let capacity = u64::try_from(capacity)
            .ok()
            .filter(|c| *c > 0)
            .ok_or_else(|| format!("volume capacity {capacity} is not a size"))?;
        if *self.capacity.get_or_insert(capacity) != capacity {
            return Err(format!(
                "volume capacity changed from {} to {capacity} bytes within one answer",
                self.capacity.unwrap_or_default()
            ));
        }
        for block in blocks {
            self.add(kind, capacity, block)?;
        }
        Ok(())
    }

    fn add(&mut self, kind: BlockType, capacity: u64, block: &BlockMetadata) -> Result<(), String> {
        let (Ok(offset), Ok(len)) =
            (u64::try_from(block.byte_offset), u64::try_from(block.size_bytes))
        else {
            return Err(format!(
                "range at {} of {} bytes is negative",
                block.byte_offset, block.size_bytes
            ));
        };
        if len == 0 {
            return Err(format!("range at {offset} is empty"));
        }
        let end = offset.checked_add(len).filter(|end| *end <= capacity).ok_or_else(|| {
            format!("range at {offset} of {len} bytes ends past the volume's {capacity} bytes")
        })?;
        if kind == BlockType::FixedLength && *self.fixed_len.get_or_insert(len) != len {
            return Err(format!(
                "fixed-length blocks of {} and {len} bytes in one answer",
                self.fixed_len.unwrap_or_default()
            ));
        }
        // The first range of a resumed stream may start before the resumption point (a block
        // straddling it), as long as it ends after it and its earlier part is what the last
        // stream already said: inside the last range received. Anything else contradicts the
        // earlier answer, which is then no more trustworthy than this one.
        let start = match self.resumed_at.take() {
            Some(at) if end <= at => {
                return Err(format!(
                    "range at {offset} of {len} bytes ends at or before the requested start {at}"
                ));
            }
            Some(at) if offset < at => {
                let received = self.ranges.last().filter(|last| last.end() == at);
                if received.is_none_or(|last| offset < last.offset) {
                    return Err(format!(
                        "range at {offset} of {len} bytes, the first after resuming at {at}, \
                         claims bytes the earlier stream did not report"
                    ));
                }
                at
            }
            Some(_) | None => offset,
        };
        if start < self.next {
            return Err(format!(
                "range at {offset} of {len} bytes overlaps or precedes the previous range, which ended at {}",
                self.next
            ));
        }
        match self.ranges.last_mut() {
            Some(last) if last.end() == start => last.len += end - start,
            _ => self.ranges.push(Range { offset: start, len: end - start }),
        }
        self.next = end;
        Ok(())
    }

    /// The complete answer (empty, without a capacity, when no response came).
    #[must_use]
    pub fn finish(self) -> BlockMap {
        BlockMap { capacity: self.capacity, block_type: self.block_type, ranges: self.ranges }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use proptest::prelude::*;

    const FIXED: i32 = BlockMetadataType::FixedLength as i32;
    const VARIABLE: i32 = BlockMetadataType::VariableLength as i32;

    fn block(offset: i64, size: i64) -> BlockMetadata {
        BlockMetadata { byte_offset: offset, size_bytes: size }
    }

    #[test]
    fn adjacent_blocks_merge_and_gaps_stay() {
        let mut c = Collector::new();
        c.push(FIXED, 1 << 20, &[block(0, 4096), block(4096, 4096)]).unwrap();
        c.push(FIXED, 1 << 20, &[block(8192, 4096), block(65536, 4096)]).unwrap();
        assert_eq!(c.range_count(), 2);
        let map = c.finish();
        assert_eq!(
            map.ranges,
            [Range { offset: 0, len: 12288 }, Range { offset: 65536, len: 4096 }]
        );
        assert_eq!(map.bytes(), 16384);
        assert_eq!(map.block_type, Some(BlockType::FixedLength));
        assert_eq!(map.capacity, Some(1 << 20));
    }

    #[test]
    fn every_broken_rule_is_refused_with_its_reason() {
        let cases: [(&str, i32, i64, Vec<BlockMetadata>); 9] = [
            ("not a known type", 0, 1 << 20, vec![]),
            ("not a size", VARIABLE, 0, vec![]),
            ("negative", VARIABLE, 1 << 20, vec![block(-1, 10)]),
            ("empty", VARIABLE, 1 << 20, vec![block(0, 0)]),
            ("ends past", VARIABLE, 1 << 20, vec![block((1 << 20) - 10, 11)]),
            ("ends past", VARIABLE, i64::MAX, vec![block(i64::MAX, i64::MAX)]),
            ("overlaps or precedes", VARIABLE, 1 << 20, vec![block(0, 100), block(50, 100)]),
            ("overlaps or precedes", VARIABLE, 1 << 20, vec![block(500, 10), block(0, 10)]),
            ("fixed-length blocks of", FIXED, 1 << 20, vec![block(0, 4096), block(8192, 512)]),
        ];
        for (want, kind, capacity, blocks) in cases {
            let err = Collector::new().push(kind, capacity, &blocks).unwrap_err();
            assert!(err.contains(want), "{want:?} not in {err:?}");
        }
        let mut c = Collector::new();
        c.push(VARIABLE, 1 << 20, &[]).unwrap();
        assert!(c.push(VARIABLE, 2 << 20, &[]).unwrap_err().contains("capacity changed"));
        assert!(c.push(FIXED, 1 << 20, &[]).unwrap_err().contains("type changed"));
    }

    #[test]
    fn no_response_at_all_is_an_empty_answer_without_a_size() {
        let map = Collector::new().finish();
        assert_eq!(map, BlockMap { capacity: None, block_type: None, ranges: Vec::new() });
        assert_eq!(map.bytes(), 0);
    }

    #[test]
    fn a_resumed_stream_may_straddle_the_resumption_point_but_not_end_before_it() {
        let mut c = Collector::new();
        c.push(VARIABLE, 1 << 20, &[block(0, 1000)]).unwrap();
        c.restart();
        assert_eq!(c.next_offset(), 1000);
        c.push(VARIABLE, 1 << 20, &[block(500, 1000), block(4000, 10)]).unwrap();
        let map = c.finish();
        assert_eq!(map.ranges, [Range { offset: 0, len: 1500 }, Range { offset: 4000, len: 10 }]);

        let mut c = Collector::new();
        c.push(VARIABLE, 1 << 20, &[block(0, 1000)]).unwrap();
        c.restart();
        let err = c.push(VARIABLE, 1 << 20, &[block(0, 1000)]).unwrap_err();
        assert!(err.contains("before the requested start 1000"), "{err}");

        // A straddling block that reaches back past the last range received contradicts the
        // earlier stream: refused, not trimmed.
        let mut c = Collector::new();
        c.push(VARIABLE, 1 << 20, &[block(900, 100)]).unwrap();
        c.restart();
        let err = c.push(VARIABLE, 1 << 20, &[block(0, 2000)]).unwrap_err();
        assert!(err.contains("did not report"), "{err}");
    }

    proptest! {
        /// Any ascending, disjoint list of ranges split across responses and resumptions in any
        /// way is collected as the same merged map.
        #[test]
        fn splitting_an_answer_never_changes_it(
            gaps in proptest::collection::vec((0u64..3, 1u64..4), 0..40),
            cuts in proptest::collection::vec(any::<bool>(), 40),
        ) {
            let mut blocks = Vec::new();
            let mut at = 0u64;
            for (gap, len) in &gaps {
                at += gap * 4096;
                blocks.push(block(i64::try_from(at).unwrap(), i64::try_from(len * 4096).unwrap()));
                at += len * 4096;
            }
            let capacity = i64::try_from(at + 4096).unwrap();
            let mut whole = Collector::new();
            whole.push(VARIABLE, capacity, &blocks).unwrap();
            let whole = whole.finish();

            let mut split = Collector::new();
            let mut batch = Vec::new();
            for (b, cut) in blocks.iter().zip(cuts.iter().cycle()) {
                batch.push(*b);
                if *cut {
                    split.push(VARIABLE, capacity, &batch).unwrap();
                    batch.clear();
                    split.restart();
                }
            }
            split.push(VARIABLE, capacity, &batch).unwrap();
            let split = split.finish();
            prop_assert_eq!(&split, &whole);
            let total: u64 = gaps.iter().map(|(_, len)| len * 4096).sum();
            prop_assert_eq!(whole.bytes(), total);
            for pair in whole.ranges.windows(2) {
                prop_assert!(pair[0].end() < pair[1].offset);
            }
        }
    }
}
