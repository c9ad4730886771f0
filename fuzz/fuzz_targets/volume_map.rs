//! Volume snapshot bodies through the layout check a volume restore relies on.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ferry_repo::VolumeMap::decode(data);
});
