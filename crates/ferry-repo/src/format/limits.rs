//! The largest object of each kind a reader downloads whole (`FORMAT.md`, "Size limits
//! readers enforce").
//!
//! A reader asks the store for at most this many bytes
//! ([`ObjectStore::get_at_most`](ferry_store::ObjectStore::get_at_most)), so an object larger
//! than any valid one of its kind, left by a broken writer or planted in a shared bucket, is
//! refused by its size before it is downloaded instead of filling memory. Each limit is what
//! the format lets the kind hold, with a margin; writers refuse to store anything larger, so
//! no repository holds an object its own readers refuse.

use crate::format::{MAX_PLAINTEXT, NONCE_LEN, TAG_LEN};

/// Bytes sealing adds around an object's body: version and kind (2), nonce, compression
/// header (mode and raw length, 5), tag.
const SEALING_OVERHEAD: u64 = 2 + NONCE_LEN as u64 + 5 + TAG_LEN as u64;

/// The largest sealed object a reader can decode: its body is at most [`MAX_PLAINTEXT`]
/// (a longer compressed body is refused when decoded, and writers refuse a longer raw one).
pub const MAX_SEALED_OBJECT_BYTES: u64 = MAX_PLAINTEXT as u64 + SEALING_OVERHEAD;

/// `config`: a 32-byte id, a time, chunk and pack sizes, about 130 bytes sealed. The limit
/// only has to tell a config from something plainly not one.
pub const MAX_CONFIG_BYTES: u64 = 64 << 10;

/// `keys/<id>`: a key file is about 200 bytes (costs, salt, the sealed 32-byte secret, a host
/// name of at most 64 bytes). An open does not even download a larger object listed there.
pub const MAX_KEY_FILE_BYTES: u64 = 4 << 10;

/// `index/<id>`: an index file names its packs' blobs (about 42 bytes each). A backup writes
/// one every 8 packs, repacking every 64 and compaction every 200,000 entries by default,
/// but packs of up to 1 GiB of small blobs make any number below the format's own bound
/// reachable: so the largest sealed object.
pub const MAX_INDEX_FILE_BYTES: u64 = MAX_SEALED_OBJECT_BYTES;

/// `snapshots/<id>`: a tree snapshot is small (its root's page ids and a summary, a few KiB),
/// but a file or volume snapshot lists its chunks inline, about 35 bytes each (14 MB for a
/// full 100 GiB volume at 256 KiB chunks): so the largest sealed object.
pub const MAX_SNAPSHOT_BYTES: u64 = MAX_SEALED_OBJECT_BYTES;

/// `gc/mark-<id>`, `gc/writers-<id>`: a mark lists 32 bytes per condemned or orphaned pack
/// (16 million packs fit), a writers list 16 bytes per running backup or restore.
pub const MAX_GC_STATE_BYTES: u64 = MAX_SEALED_OBJECT_BYTES;

/// `data/<xx>/<id>`, read whole by `check --read-data`, repacking and the tree-pack cache
/// (which also refuses anything larger than the index records): the pack target (at most
/// 1 GiB) plus the blob that crossed it (at most [`MAX_PLAINTEXT`] sealed), a header (at
/// most the largest sealed object) and a 4-byte trailer, rounded up to 2 GiB + 1 MiB.
pub const MAX_PACK_BYTES: u64 = (2 << 30) + (1 << 20);

// A pack holds a full target, the largest blob and the largest header; and blob offsets are
// 32-bit, so no valid pack places a blob past 4 GiB anyway.
const _: () = {
    let largest_blob = MAX_PLAINTEXT as u64 + 5 + NONCE_LEN as u64 + TAG_LEN as u64;
    assert!(2 + (1 << 30) + largest_blob + MAX_SEALED_OBJECT_BYTES + 4 <= MAX_PACK_BYTES);
    assert!(MAX_PACK_BYTES < 1 << 32);
};

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::{Config, IndexFile, KdfParams, KeyFile, MasterKey, PackParams};

    #[test]
    fn real_objects_are_far_below_their_limits() {
        let master = MasterKey::generate();
        let cipher = master.derive().cipher;
        let config = Config {
            repo_id: [7; 32],
            created_unix: i64::MAX,
            chunker: crate::format::ChunkerParams::default(),
            volume_chunker: Some(crate::format::ChunkerParams::default()),
            packs: PackParams { target_size: 1 << 30 },
            format: crate::format::RepoFormat::V2,
        };
        let sealed = config.encode(&cipher).len() as u64;
        assert!(sealed * 100 < MAX_CONFIG_BYTES, "config of {sealed} bytes");
        let file = KeyFile::wrap_with_password(
            &master,
            b"pw",
            KdfParams::insecure_for_tests(),
            "h".repeat(64),
            i64::MAX,
        )
        .unwrap_or_else(|e| panic!("{e}"));
        let sealed = file.encode().len() as u64;
        assert!(sealed * 10 < MAX_KEY_FILE_BYTES, "key file of {sealed} bytes");
        let index = IndexFile::default().encode(&cipher).len() as u64;
        assert_eq!(index, SEALING_OVERHEAD + 2, "an empty index: two empty sequences");
    }
}
