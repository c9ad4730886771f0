//! Every encrypted stored object as it comes from storage: envelope, pack trailer and header,
//! config, index, snapshot, blob and frame decoders under a fixed key.
#![no_main]
use std::sync::LazyLock;

use ferry_repo::format::{self, BlobId, MasterKey, ObjectKind, RepoKeys};
use libfuzzer_sys::fuzz_target;

static KEYS: LazyLock<RepoKeys> = LazyLock::new(|| MasterKey::from_secret([7; 32]).derive());

fuzz_target!(|data: &[u8]| {
    let keys = &*KEYS;
    let _ = format::header_length(data);
    let _ = format::read_pack_header(&keys.cipher, data);
    let _ = format::Config::decode(&keys.cipher, data);
    let _ = format::IndexFile::decode(&keys.cipher, data);
    let _ = format::Snapshot::decode(&keys.cipher, data);
    let _ = format::open_blob(keys, &BlobId([0; 32]), ObjectKind::DataBlob, data);
    let _ = format::Frame::open(keys, data);
});
