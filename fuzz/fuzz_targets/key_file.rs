//! Key files are read before any key is known: their decoder sees raw, unauthenticated bytes.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = ferry_repo::format::KeyFile::decode(data) {
        // Whatever decodes must encode again without panicking.
        let _ = file.encode();
    }
});
