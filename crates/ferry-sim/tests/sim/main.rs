//! The node simulator against a real API server, with real loop devices and mounts.
#![allow(clippy::unwrap_used)] // Tests fail loudly by design.

mod affinity;
mod cleanup;
mod pods;
mod snapshots;
mod support;
mod uid_precondition;
mod volumes;
