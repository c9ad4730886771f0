//! Tree objects: one page of a directory's entries with full metadata.
//!
//! A directory's entries, sorted by name bytes, are split into pages of at most
//! [`TreePage::MAX_ENTRIES`] entries and [`TreePage::MAX_BYTES`] encoded bytes; each page is a tree blob and the directory's node lists the
//! page ids. A directory of a million files therefore never has to sit in memory whole.
//! Decoding checks what restore relies on: single-component names, strictly ascending (so no
//! duplicates), consistent file extents and chunk lists.

use serde::{Deserialize, Serialize};

use crate::format::{BlobId, FormatError, decode_body, encode_body};

/// Seconds and nanoseconds since the Unix epoch.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
pub struct Timestamp {
    /// Seconds (negative before 1970).
    pub sec: i64,
    /// Nanoseconds, below 1e9.
    pub nsec: u32,
}

/// One extended attribute.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Xattr {
    /// Name, e.g. `user.comment`.
    pub name: Vec<u8>,
    /// Value.
    pub value: Vec<u8>,
}

/// Ownership, permissions, times and extended attributes.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Metadata {
    /// Permission bits including setuid, setgid and sticky (`mode & 0o7777`).
    pub mode: u32,
    /// Owner.
    pub uid: u32,
    /// Group.
    pub gid: u32,
    /// Modification time.
    pub mtime: Timestamp,
    /// Access time.
    pub atime: Timestamp,
    /// Status change time (recorded, not restorable).
    pub ctime: Timestamp,
    /// Extended attributes, sorted by name.
    pub xattrs: Vec<Xattr>,
}

/// A reference to one chunk of content.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct ChunkRef {
    /// The data blob.
    pub id: BlobId,
    /// Its plaintext length.
    pub len: u32,
}

/// A range of a file that holds data (everything outside the extents is a hole).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Extent {
    /// Start offset.
    pub offset: u64,
    /// Length in bytes.
    pub len: u64,
}

/// Where a walk of a content's placed chunks stands ([`FileContent::placed_next`]).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct PlacedCursor {
    /// The extent the next chunk lies in.
    extent: usize,
    /// The next chunk's offset (`None`: the extent's start).
    pos: Option<u64>,
    /// The next chunk's place in the content's list.
    chunk: usize,
}

/// The content of a regular file or a volume.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct FileContent {
    /// Logical size.
    pub size: u64,
    /// Data ranges of a sparse file, ascending and disjoint; `None` for a dense file (one
    /// range covering everything).
    pub extents: Option<Vec<Extent>>,
    /// Chunks covering the data ranges in order; chunk boundaries restart at each extent.
    pub chunks: Vec<ChunkRef>,
}

impl FileContent {
    /// The data ranges (one covering the file when dense).
    #[must_use]
    pub fn data_extents(&self) -> Vec<Extent> {
        match &self.extents {
            Some(e) => e.clone(),
            None if self.size > 0 => vec![Extent { offset: 0, len: self.size }],
            None => Vec::new(),
        }
    }

    /// Each chunk with its file offset, in order.
    #[must_use]
    pub fn placed_chunks(&self) -> Vec<(u64, ChunkRef)> {
        self.placed_next(&mut PlacedCursor::default(), usize::MAX)
    }

    /// The next chunks (at most `max`) with their file offsets, in order, from where `cursor`
    /// stands; moves it past them. Successive calls give [`FileContent::placed_chunks`] a part
    /// at a time.
    #[must_use]
    pub(crate) fn placed_next(
        &self,
        cursor: &mut PlacedCursor,
        max: usize,
    ) -> Vec<(u64, ChunkRef)> {
        let dense = [Extent { offset: 0, len: self.size }];
        let extents: &[Extent] = match &self.extents {
            Some(e) => e,
            None if self.size > 0 => &dense,
            None => &[],
        };
        let left = self.chunks.len().saturating_sub(cursor.chunk);
        let mut out = Vec::with_capacity(max.min(left));
        while out.len() < max {
            let Some(extent) = extents.get(cursor.extent) else { break };
            let pos = cursor.pos.unwrap_or(extent.offset);
            if pos >= extent.offset.saturating_add(extent.len) {
                (cursor.extent, cursor.pos) = (cursor.extent + 1, None);
                continue;
            }
            let Some(c) = self.chunks.get(cursor.chunk) else { break };
            out.push((pos, *c));
            cursor.chunk += 1;
            cursor.pos = Some(pos.saturating_add(u64::from(c.len)));
        }
        out
    }

    pub(crate) fn validate(&self) -> Result<(), String> {
        let mut data = 0u64;
        let mut next = 0u64;
        for e in self.data_extents() {
            let end = e.offset.checked_add(e.len).ok_or("extent overflows")?;
            if e.offset < next || end > self.size || e.len == 0 {
                return Err(format!(
                    "extent {}+{} out of order or past size {}",
                    e.offset, e.len, self.size
                ));
            }
            next = end;
            data += e.len;
        }
        // Chunks must tile each extent exactly.
        let mut chunks = self.chunks.iter();
        for e in self.data_extents() {
            let mut left = e.len;
            while left > 0 {
                let c = chunks.next().ok_or("chunks cover less than the data extents")?;
                if c.len == 0 || u64::from(c.len) > left {
                    return Err("a chunk crosses an extent boundary".into());
                }
                left -= u64::from(c.len);
            }
        }
        if chunks.next().is_some() {
            return Err(format!("chunks cover more than the {data} data bytes"));
        }
        Ok(())
    }
}

/// What a node is, with the fields only that type has.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub enum NodeBody {
    /// A regular file.
    File(FileContent),
    /// A directory: the tree pages holding its entries.
    Dir {
        /// Tree blob ids, in name order.
        pages: Vec<BlobId>,
    },
    /// A symbolic link.
    Symlink {
        /// The link text, never followed by backup or restore.
        target: Vec<u8>,
    },
    /// A named pipe.
    Fifo,
    /// A Unix socket (restored as a socket node).
    Socket,
    /// A character device.
    CharDevice {
        /// Device number (`st_rdev`).
        rdev: u64,
    },
    /// A block device.
    BlockDevice {
        /// Device number (`st_rdev`).
        rdev: u64,
    },
    /// A block volume's content stored as a stream (block-volume snapshots).
    Volume {
        /// The content; extents mark allocated, non-zero ranges.
        content: FileContent,
        /// Logical block size of the source device.
        block_size: u32,
    },
}

/// One directory entry.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Node {
    /// A single path component (no `/`, no NUL, not `.` or `..`, not empty).
    pub name: Vec<u8>,
    /// Type-specific content.
    pub body: NodeBody,
    /// Ownership, permissions, times, xattrs.
    pub meta: Metadata,
    /// Entries sharing a number are hard links to one inode (numbers are per snapshot).
    pub hardlink: Option<u64>,
    /// Why this entry could not be read completely; its content may be empty.
    pub error: Option<String>,
}

impl Node {
    /// Bytes this entry takes in an encoded [`TreePage`].
    #[must_use]
    pub fn encoded_len(&self) -> usize {
        // Postcard's size flavor counts without writing; it fails only where encoding would.
        postcard::experimental::serialized_size(self).unwrap_or(usize::MAX)
    }
}

/// Checks that `name` is one safe path component.
///
/// # Errors
/// [`FormatError::Invalid`] naming the problem.
pub fn validate_name(name: &[u8]) -> Result<(), FormatError> {
    let reason = if name.is_empty() {
        "empty name"
    } else if name == b"." || name == b".." {
        "`.` or `..`"
    } else if name.contains(&b'/') {
        "name contains `/`"
    } else if name.contains(&0) {
        "name contains NUL"
    } else if name.len() > 255 {
        "name longer than 255 bytes"
    } else {
        return Ok(());
    };
    Err(FormatError::Invalid {
        what: "entry name",
        reason: format!("{reason}: {:?}", String::from_utf8_lossy(name)),
    })
}

/// One page of a directory.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TreePage {
    /// Entries, strictly ascending by name bytes.
    pub entries: Vec<Node>,
}

impl TreePage {
    /// Most entries in one page.
    pub const MAX_ENTRIES: usize = 4096;
    /// A page is closed before an entry would take its entries' encoding past this size (an
    /// entry larger on its own, such as a file of terabytes in chunks, gets a page to itself).
    /// 4,096 typical entries take a few hundred KiB.
    pub const MAX_BYTES: usize = 1 << 20;

    /// The blob plaintext of this page.
    #[must_use]
    pub fn encode(&self) -> Vec<u8> {
        encode_body(self)
    }

    /// Decodes a page and checks it (names, order, content consistency).
    ///
    /// # Errors
    /// Any [`FormatError`]; never panics.
    pub fn decode(bytes: &[u8]) -> Result<Self, FormatError> {
        let page: Self = decode_body("tree page", bytes)?;
        page.validate()?;
        Ok(page)
    }

    /// The checks [`TreePage::decode`] applies.
    ///
    /// # Errors
    /// [`FormatError::Invalid`].
    pub fn validate(&self) -> Result<(), FormatError> {
        for pair in self.entries.windows(2) {
            if pair[0].name >= pair[1].name {
                return Err(FormatError::Invalid {
                    what: "tree page",
                    reason: format!(
                        "entries not strictly ascending at {:?}",
                        String::from_utf8_lossy(&pair[1].name)
                    ),
                });
            }
        }
        for node in &self.entries {
            validate_name(&node.name)?;
            if node.meta.mtime.nsec >= 1_000_000_000 || node.meta.atime.nsec >= 1_000_000_000 {
                return Err(FormatError::Invalid {
                    what: "tree page",
                    reason: "nanoseconds out of range".into(),
                });
            }
            let content = match &node.body {
                NodeBody::File(c) | NodeBody::Volume { content: c, .. } => Some(c),
                _ => None,
            };
            if let Some(c) = content {
                c.validate().map_err(|reason| FormatError::Invalid {
                    what: "tree page",
                    reason: format!("{}: {reason}", String::from_utf8_lossy(&node.name)),
                })?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use proptest::prelude::*;

    fn ts() -> impl Strategy<Value = Timestamp> {
        (any::<i64>(), 0u32..1_000_000_000).prop_map(|(sec, nsec)| Timestamp { sec, nsec })
    }

    fn meta() -> impl Strategy<Value = Metadata> {
        (
            any::<u32>(),
            any::<u32>(),
            any::<u32>(),
            ts(),
            ts(),
            ts(),
            proptest::collection::vec(
                (
                    proptest::collection::vec(any::<u8>(), 1..10),
                    proptest::collection::vec(any::<u8>(), 0..10),
                ),
                0..3,
            ),
        )
            .prop_map(|(mode, uid, gid, mtime, atime, ctime, x)| Metadata {
                mode,
                uid,
                gid,
                mtime,
                atime,
                ctime,
                xattrs: x.into_iter().map(|(name, value)| Xattr { name, value }).collect(),
            })
    }

    fn content() -> impl Strategy<Value = FileContent> {
        (proptest::collection::vec((1u32..5000, any::<[u8; 32]>()), 0..6), any::<bool>()).prop_map(
            |(chunks, sparse)| {
                let total: u64 = chunks.iter().map(|(l, _)| u64::from(*l)).sum();
                let chunks: Vec<ChunkRef> =
                    chunks.into_iter().map(|(len, id)| ChunkRef { id: BlobId(id), len }).collect();
                if sparse && total > 0 {
                    FileContent {
                        size: total + 8192,
                        extents: Some(vec![Extent { offset: 4096, len: total }]),
                        chunks,
                    }
                } else {
                    FileContent { size: total, extents: None, chunks }
                }
            },
        )
    }

    /// Contents of several extents whose chunks (some empty) tile them, or cover less or
    /// more than they hold.
    fn extents_content() -> impl Strategy<Value = FileContent> {
        let extent = (0u64..3000, proptest::collection::vec(0u32..3000, 0..4));
        (proptest::collection::vec(extent, 0..5), 0usize..3, any::<bool>()).prop_map(
            |(extents, extra, fewer)| {
                let (mut pos, mut out, mut chunks) = (0u64, Vec::new(), Vec::new());
                for (n, (gap, lens)) in extents.into_iter().enumerate() {
                    let len: u64 = lens.iter().map(|l| u64::from(*l)).sum();
                    out.push(Extent { offset: pos + gap, len });
                    pos += gap + len;
                    let id = |i: usize| BlobId([(n * 16 + i) as u8; 32]);
                    chunks.extend(
                        lens.iter().enumerate().map(|(i, &len)| ChunkRef { id: id(i), len }),
                    );
                }
                chunks.extend(
                    (0..extra).map(|i| ChunkRef { id: BlobId([200 + i as u8; 32]), len: 7 }),
                );
                if fewer {
                    chunks.truncate(chunks.len() / 2);
                }
                FileContent { size: pos + 100, extents: Some(out), chunks }
            },
        )
    }

    /// The chunks with their offsets, as the walk before the cursor placed them.
    fn placed_reference(c: &FileContent) -> Vec<(u64, ChunkRef)> {
        let mut out = Vec::new();
        let mut chunks = c.chunks.iter();
        for extent in c.data_extents() {
            let mut pos = extent.offset;
            while pos < extent.offset + extent.len {
                let Some(chunk) = chunks.next() else { return out };
                out.push((pos, *chunk));
                pos += u64::from(chunk.len);
            }
        }
        out
    }

    pub(crate) fn body() -> impl Strategy<Value = NodeBody> {
        prop_oneof![
            content().prop_map(NodeBody::File),
            proptest::collection::vec(any::<[u8; 32]>(), 0..3)
                .prop_map(|p| NodeBody::Dir { pages: p.into_iter().map(BlobId).collect() }),
            proptest::collection::vec(any::<u8>(), 0..30)
                .prop_map(|target| NodeBody::Symlink { target }),
            Just(NodeBody::Fifo),
            Just(NodeBody::Socket),
            any::<u64>().prop_map(|rdev| NodeBody::CharDevice { rdev }),
            any::<u64>().prop_map(|rdev| NodeBody::BlockDevice { rdev }),
            (content(), any::<u32>())
                .prop_map(|(content, block_size)| NodeBody::Volume { content, block_size }),
        ]
    }

    pub(crate) fn page() -> impl Strategy<Value = TreePage> {
        proptest::collection::btree_map(
            "[a-zA-Z0-9 ._\u{e9}\n-]{1,20}",
            (body(), meta(), proptest::option::of(any::<u64>()), proptest::option::of(".{0,10}")),
            0..6,
        )
        .prop_filter("valid names", |m| m.keys().all(|k| k != "." && k != ".."))
        .prop_map(|m| TreePage {
            entries: m
                .into_iter()
                .map(|(name, (body, meta, hardlink, error))| Node {
                    name: name.into_bytes(),
                    body,
                    meta,
                    hardlink,
                    error,
                })
                .collect(),
        })
    }

    proptest! {
        #[test]
        fn round_trip(p in page()) {
            prop_assert_eq!(TreePage::decode(&p.encode()).ok(), Some(p));
        }

        #[test]
        fn a_page_is_its_count_and_its_entries(p in page()) {
            // One-byte varint count for these small pages.
            let entries: usize = p.entries.iter().map(Node::encoded_len).sum();
            prop_assert_eq!(p.encode().len(), 1 + entries);
        }

        #[test]
        fn decode_never_panics(bytes in proptest::collection::vec(any::<u8>(), 0..400)) {
            let _ = TreePage::decode(&bytes);
        }

        #[test]
        fn placed_chunks_come_the_same_a_part_at_a_time(
            c in prop_oneof![content(), extents_content()],
            part in 1usize..5,
        ) {
            let mut cursor = PlacedCursor::default();
            let mut parts = Vec::new();
            for _ in 0..=c.chunks.len() {
                let next = c.placed_next(&mut cursor, part);
                prop_assert!(next.len() <= part);
                parts.extend(next);
            }
            prop_assert_eq!(&parts, &placed_reference(&c));
            prop_assert_eq!(parts, c.placed_chunks());
            prop_assert!(c.placed_next(&mut cursor, part).is_empty());
        }

        #[test]
        fn placed_chunks_cover_the_extents(c in content()) {
            let placed = c.placed_chunks();
            prop_assert_eq!(placed.len(), c.chunks.len());
            let data: u64 = c.data_extents().iter().map(|e| e.len).sum();
            prop_assert_eq!(placed.iter().map(|(_, c)| u64::from(c.len)).sum::<u64>(), data);
        }
    }

    fn node(name: &[u8]) -> Node {
        Node {
            name: name.to_vec(),
            body: NodeBody::Fifo,
            meta: Metadata::default(),
            hardlink: None,
            error: None,
        }
    }

    #[test]
    fn hostile_names_and_duplicates_are_rejected() {
        for bad in [&b"../x"[..], b"a/b", b"..", b".", b"", b"a\0b"] {
            let page = TreePage { entries: vec![node(bad)] };
            assert!(TreePage::decode(&page.encode()).is_err(), "{bad:?} accepted");
        }
        let dup = TreePage { entries: vec![node(b"a"), node(b"a")] };
        assert!(TreePage::decode(&dup.encode()).is_err());
        let unsorted = TreePage { entries: vec![node(b"b"), node(b"a")] };
        assert!(TreePage::decode(&unsorted.encode()).is_err());
    }

    #[test]
    fn inconsistent_chunks_are_rejected() {
        let mut n = node(b"f");
        n.body = NodeBody::File(FileContent {
            size: 10,
            extents: None,
            chunks: vec![ChunkRef { id: BlobId([0; 32]), len: 11 }],
        });
        assert!(TreePage::decode(&TreePage { entries: vec![n] }.encode()).is_err());
    }
}
