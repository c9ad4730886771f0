//! The in-memory store, reached through `AnyStore` as other crates' tests will hold it.

use ferry_store::{AnyStore, MemoryStore};

async fn fixture() -> (AnyStore, ()) {
    (AnyStore::from(MemoryStore::new()), ())
}

mod contract {
    crate::contract_tests!(super::fixture);
}
