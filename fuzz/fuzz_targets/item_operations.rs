//! Velero's `<name>-itemoperations.json.gz` records, as a host reads them back from storage.
#![no_main]
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let _ = ferry_host::records::decode::<ferry_host::BackupOperationSpec>(data);
    let _ = ferry_host::records::decode::<ferry_host::RestoreOperationSpec>(data);
});
