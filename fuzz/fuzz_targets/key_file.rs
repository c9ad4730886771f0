//! Key files are read before any key is known: their decoder sees raw, unauthenticated bytes
//! (a password-only key file, or one wrapped by a KMS key as well, whose key id a reader
//! prints).
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(file) = ferry_repo::format::KeyFile::decode(data) {
        // Whatever decodes must encode again without panicking, to something that decodes to
        // the same key file.
        let again = ferry_repo::format::KeyFile::decode(&file.encode());
        assert_eq!(again.ok().as_ref(), Some(&file));
        if let Some((key_id, _)) = file.kms_layer() {
            assert!(key_id.bytes().all(|b| b.is_ascii_graphic()));
        }
    }
});
