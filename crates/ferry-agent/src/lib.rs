//! Ferry's node agent: the DataUpload and DataDownload controllers.
//!
//! One [`Agent`] runs per node. It handles the DataUploads and DataDownloads in Velero's
//! namespace whose `spec.datamover` names it (default `ferry`) and leaves every other CR
//! untouched. For each such CR:
//!
//! 1. **Object lock.** Every node tries one full-object update of the New CR to Accepted
//!    (with `acceptedByNode`, `acceptedTimestamp`, the finalizer and the
//!    `velero.io/expose-on-going` label). The API server accepts exactly one; the others get
//!    Conflict and step aside.
//! 2. **Prepared.** The accepting node asks the [`Exposer`] to expose the volume; the node it
//!    lands on is recorded (annotation `ferry.io/exposed-node`).
//! 3. **InProgress.** That node finds the volume ([`Exposer::locate`]), waits for one of its
//!    [`AgentConfig::concurrency`] slots, writes InProgress (`startTimestamp`, `node`) and runs
//!    the [`DataMover`], writing `progress.bytesDone` every [`AgentConfig::progress_interval`].
//! 4. **Completed / Failed / Canceled**, each with its fields and a message naming the
//!    cause; then the exposer cleans up and the finalizer and label are removed.
//!
//! `spec.cancel` or deletion in any phase ends in Canceled within seconds. Accepted and
//! Prepared are bounded by [`AgentConfig::prepare_timeout`]. An agent that restarts resumes
//! its CRs; each agent renews a Lease, and the CRs of a node whose lease expired are taken
//! over by a live node. Every phase change and failure is an Event on the CR.
//!
//! The exposers and the data path plug in through [`Exposer`] and [`DataMover`]
//! ([`Backends`]).

mod agent;
mod backend;
mod config;
mod context;
mod driver;
mod error;
pub mod event_recorder;
mod events;
mod jobs;
mod liveness;
mod metrics;
mod progress;
mod queue;
mod reconcile;
mod report;
mod resource;
mod update;

pub use agent::Agent;
pub use backend::{
    Backends, BackupOutcome, BlockReads, CsiSnapshot, DataMover, ExposeParams, ExposeStep, Exposed,
    ExposedVolume, Exposer, RestoreOutcome, StepTimer, VolumeMode,
};
pub use config::AgentConfig;
pub use error::{AgentError, BoxError, ReconcileError, WorkError, error_chain};
pub use events::{REPORTING_CONTROLLER, REPOSITORY_WARNING, RESTORE_SHORTFALL, RESTORE_WITHHELD};
pub use liveness::{LEASE_LABEL, lease_name};
pub use metrics::Metrics;
pub use progress::{Breakdown, ProgressSink, ProgressSnapshot};
pub use resource::annotations;
