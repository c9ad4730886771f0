//! Index file bodies (the plaintext after authentication).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ferry_repo::format::IndexFile::decode_body(data);
});
