//! Ferry's Kubernetes client helpers.
//!
//! [`ApiError`] classifies what the API server answered, so callers can act on the kind of
//! failure rather than on HTTP codes: above all [`ApiError::Conflict`], "another writer won",
//! the answer to an update carrying a stale `resourceVersion`. Ferry's object lock on
//! DataUploads and DataDownloads is exactly that: one optimistic update per node, and the
//! nodes that get `Conflict` back step aside.

mod error;
mod write;

pub use error::ApiError;
pub use write::{create, replace};
