//! Ferry's agent against a real kube-apiserver with Velero's CRDs: three agents in one
//! process, each with its own node name, racing on the same CRs, with a simulated exposer and
//! data path. The controllers, the object lock and the phases are what is under test.
//!
//! Every test uses its own data mover name, so tests sharing the control plane (and its
//! `velero` namespace) never see each other's CRs.

mod cancel;
mod download;
mod queue;
mod recovery;
mod sim;
mod support;
mod upload;
