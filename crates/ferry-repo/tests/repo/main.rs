//! The repository's integration tests, one binary: each module was a test binary of its own,
//! and each compiled the repository's generic code again (at the repository's opt-level).

#[path = "../common/mod.rs"]
mod common;

mod cache;
mod frames;
mod hostile;
mod kms;
mod migrate;
mod placement;
mod roundtrip;
mod s3;
mod tamper;
mod volume;
