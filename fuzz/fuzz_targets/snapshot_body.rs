//! Snapshot manifest bodies (the plaintext after authentication).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ferry_repo::format::Snapshot::decode_body(data);
});
