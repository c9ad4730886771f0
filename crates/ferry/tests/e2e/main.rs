//! End to end: `ferry agent` processes on three simulated nodes against a real API server,
//! real loop-device volumes and a real S3 server, driven by DataUploads and DataDownloads
//! created exactly as Velero creates them.

mod backup_restore;
mod cancel;
mod deletion;
mod harness;
mod long_names;
mod placement;
mod plugin_host;
mod pvc_cli;
mod recovery;
mod restore_targets;
mod secrets;
mod upload_edges;
#[path = "../support/velero_crs.rs"]
mod velero_crs;
mod velero_interop;
