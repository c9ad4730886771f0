//! The data mover plugin against a real API server with Velero's and the snapshot CRDs.
#![allow(clippy::unwrap_used)]

mod backup;
mod grpc;
mod restore;
mod snapshotter;
mod support;
