//! The contract every `ObjectStore` must meet, as generic async test cases.
//!
//! Each case takes a fresh, empty store; `contract.rs` runs every case against every backend.

mod list;
mod read;
mod write;

pub use list::*;
pub use read::*;
pub use write::*;

use ferry_store::{ObjectKey, ObjectStore, PutOutcome, StoreError};
use tokio_util::sync::CancellationToken;

/// What the cases need of a store: shareable across tasks.
pub trait Store: ObjectStore + Clone + 'static {}
impl<T: ObjectStore + Clone + 'static> Store for T {}

fn live() -> CancellationToken {
    CancellationToken::new()
}

async fn put(store: &impl ObjectStore, key: &ObjectKey, data: bytes::Bytes) -> PutOutcome {
    store.put_if_absent(key, data, &live()).await.unwrap_or_else(|e| panic!("put {key}: {e}"))
}

async fn get(store: &impl ObjectStore, key: &ObjectKey) -> bytes::Bytes {
    store.get(key, &live()).await.unwrap_or_else(|e| panic!("get {key}: {e}"))
}

fn assert_not_found<T: std::fmt::Debug>(result: Result<T, StoreError>, key: &ObjectKey) {
    match result {
        Err(StoreError::NotFound { key: missing }) => assert_eq!(&missing, key),
        other => panic!("expected NotFound for {key}, got {other:?}"),
    }
}
