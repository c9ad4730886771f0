//! Changed-block tracking for block backups: a client of Kubernetes' SnapshotMetadata service
//! (KEP-3314, `cbt.storage.k8s.io`).
//!
//! A CSI driver that tracks changed blocks publishes a [`ferry_api::SnapshotMetadataService`]
//! named after itself; the `csi-snapshot-metadata` sidecar beside the driver serves the gRPC
//! API at its address over TLS. This crate:
//!
//! - finds that object and connects to the service, trusting only the object's CA
//!   ([`Service::discover`], [`Service::connect`]);
//! - asks the TokenRequest API for a short-lived token of a service account, scoped to the
//!   service's audience ([`Tokens`]): the sidecar checks it with a TokenReview and asks a
//!   SubjectAccessReview whether that account may `get` the VolumeSnapshot;
//! - streams [`Connection::allocated`] (the ranges of a snapshot that hold data) and
//!   [`Connection::delta`] (the ranges changed since a base snapshot, named by its CSI handle),
//!   resuming at `starting_offset` after a broken stream, and checks every answer
//!   ([`BlockMap`]): ranges in order, not overlapping, inside the volume, one capacity and one
//!   block type throughout. An answer that breaks a rule is refused whole
//!   ([`CbtError::Untrusted`]), never used in part.
//!
//! Nothing here reads volume data: callers read the ranges themselves.

mod blocks;
mod client;
mod error;
mod service;
mod token;

pub use blocks::{BlockMap, BlockType, Collector, Range};
pub use client::{Connection, Query, Retry};
pub use error::{CbtError, FallbackReason};
pub use service::Service;
pub use token::{ServiceAccount, Tokens};
