//! Frame plaintexts (after authentication and decompression): the table of blobs at the end.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(frame) = ferry_repo::format::Frame::decode(data.to_vec()) {
        let total: usize = frame.blobs().map(|(_, bytes)| bytes.len()).sum();
        assert!(total + frame.len() * 12 + 4 == data.len(), "the table covers the frame exactly");
    }
});
