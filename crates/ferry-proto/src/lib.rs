//! Velero's plugin gRPC protocol, and the hashicorp go-plugin services around it, as prost
//! messages and tonic clients and servers.
//!
//! Velero runs each plugin binary through go-plugin and speaks gRPC to it, so every package,
//! service, method, field number and type here must match what Velero ships. The `.proto`
//! files live in the repository's `proto/` directory; the Rust code generated from them is
//! committed under `src/gen/` so that a normal build needs no protobuf compiler. The test
//! `tests/drift.rs` fails when the two disagree; regenerate with
//! `FERRY_REGEN_PROTO=1 cargo test -p ferry-proto --test drift`.
//!
//! Modules are named after the protobuf packages:
//!
//! - [`generated`]: Velero's shared messages ([`generated::OperationProgress`],
//!   [`generated::ResourceIdentifier`], ...), `PluginLister`, `DeleteItemAction`, and the
//!   version 1 `BackupItemAction`, `RestoreItemAction` and `VolumeSnapshotter`.
//! - [`v2`]: the asynchronous version 2 `BackupItemAction` and `RestoreItemAction`, and
//!   Ferry's `VolumeSnapshotter` version 2 (the version 1 calls plus `Progress` and `Cancel`).
//! - [`plugin`]: go-plugin's `GRPCController`, `GRPCStdio` and `GRPCBroker`.
//! - [`snapshotmetadata`]: Kubernetes' `SnapshotMetadata` service (KEP-3314, changed-block
//!   tracking), as the csi-snapshot-metadata sidecar serves it.
//!
//! Each service `Foo` comes with a `foo_client::FooClient` and a `foo_server::FooServer`
//! wrapping an implementation of the `foo_server::Foo` trait. The gRPC health service that
//! go-plugin also expects is provided by the `tonic-health` crate.

/// Velero's package `generated`: shared messages and the version 1 plugin services.
#[allow(missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
pub mod generated {
    include!("gen/generated.rs");
}

/// Velero's package `v2`: the version 2 plugin services with asynchronous operations.
#[allow(missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
pub mod v2 {
    include!("gen/v2.rs");
}

/// go-plugin's package `plugin`: the services every go-plugin gRPC plugin serves.
#[allow(missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
pub mod plugin {
    include!("gen/plugin.rs");
}

/// Kubernetes' package `snapshotmetadata`: the CSI SnapshotMetadata service (changed blocks).
#[allow(missing_docs, clippy::all, clippy::pedantic, clippy::nursery)]
pub mod snapshotmetadata {
    include!("gen/snapshotmetadata.rs");
}
