//! Tree pages carry names and metadata that restore acts on: hostile input must be refused.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    if let Ok(page) = ferry_repo::format::TreePage::decode(data) {
        let again = ferry_repo::format::TreePage::decode(&page.encode());
        assert!(again.is_ok(), "a decoded page must re-encode to a valid page");
    }
});
