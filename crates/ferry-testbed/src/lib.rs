//! Test support for Ferry: real services on loopback, always cleaned up.
//!
//! - [`ControlPlane`]: etcd + kube-apiserver built from the Go module proxy (cached under
//!   `~/.cache/ferry`), with Velero's and the CSI snapshotter's real CRDs from the shared
//!   fixtures installed and the `velero` namespace created. [`ControlPlane::shared`] starts one
//!   per test binary; tests isolate themselves with [`ControlPlane::unique_namespace`].
//! - [`S3Server`]: moto's S3 server (or MinIO, for benchmarks) on a free port.
//! - [`TlsFront`]: a TLS-terminating proxy in front of it, its certificate signed by a private
//!   CA made for it (an S3 endpoint that needs a CA bundle).
//! - [`kms`]: moto's KMS driven directly, and an endpoint answering as AWS KMS does where
//!   moto does not.
//! - [`velero::VeleroServer`]: the real `velero server` and CLI of the pinned version with
//!   Velero's AWS plugin, built by `scripts/build-velero.sh` (cached), and Velero's own CRDs.
//! - [`realnode::RealCluster`]: that control plane with a real node: kubelet, containerd and
//!   runc, the CSI hostpath driver and its sidecars, in namespaces of its own; Ferry's image
//!   ([`image`]) and chart installed on it.
//! - [`recording_client`]: a kube client that records the requests it sends ([`Requests`]),
//!   for tests that count what a component asks of the API server.
//!
//! Every process is started through [`process::spawn`], so it dies with the test binary even
//! when a test panics or the binary is killed.

pub mod apply;
mod control_plane;
pub mod crds;
pub mod goplugin_host;
pub mod image;
pub mod kms;
mod moto;
pub mod netns;
pub mod paths;
pub mod process;
pub mod realnode;
mod requests;
mod tls_front;
pub mod velero;
pub mod workload;

pub use control_plane::{
    ControlPlane, Options, SERVICE_IP, VELERO_NAMESPACE, install_crypto_provider,
};
pub use moto::S3Server;
pub use requests::{Requests, Sent, recording_client};
pub use tls_front::TlsFront;
