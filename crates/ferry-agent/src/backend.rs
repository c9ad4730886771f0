//! The two seams the controllers drive: exposing a volume on some node, and moving its data.
//!
//! The controllers own the phases, the object lock, cancellation, timeouts and recovery; an
//! [`Exposer`] makes a volume reachable on a node (for backups: the CSI snapshot handed to a
//! backup PVC mounted by a pod; for restores: a restore PVC and pod, then the rebind), and a
//! [`DataMover`] moves the bytes between that volume and the repository.

use std::collections::BTreeMap;
use std::os::fd::OwnedFd;
use std::path::PathBuf;
use std::sync::Arc;
use std::time::Duration;

use async_trait::async_trait;
use ferry_api::{DataDownload, DataUpload, NodeOs};
use tokio_util::sync::CancellationToken;

use crate::{ProgressSink, WorkError};

/// What an exposer is told when asked to expose a volume.
#[derive(Debug, Clone)]
pub struct ExposeParams {
    /// The node whose agent asks (the one that accepted the CR).
    pub node: String,
    /// The CR's `operationTimeout`: the bound on each of the exposer's own waits (snapshot
    /// ready, PVC bound, pod running, deletions).
    pub operation_timeout: Duration,
    /// Fires when the CR is canceled or the agent stops; the exposer returns
    /// [`WorkError::Canceled`] promptly.
    pub cancel: CancellationToken,
    /// Nodes whose agents stopped while they held this CR: a volume exposed there earlier
    /// must be moved off them, and new placements must avoid them.
    pub avoid_nodes: Vec<String>,
}

/// Where an exposed volume ended up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exposed {
    /// The node the cluster placed the volume on; that node's agent moves the data.
    pub node: String,
    /// What exposing took, step by step (shown in the Prepared Event and the log).
    pub steps: Vec<ExposeStep>,
}

impl Exposed {
    /// Exposed on `node`, with no step timings.
    #[must_use]
    pub fn on(node: String) -> Self {
        Self { node, steps: Vec::new() }
    }

    /// The steps as `what 0.3s, what 1.2s`; empty without steps.
    #[must_use]
    pub fn steps_line(&self) -> String {
        let parts: Vec<String> =
            self.steps.iter().map(|s| format!("{} {:.1}s", s.what, s.took.as_secs_f64())).collect();
        parts.join(", ")
    }
}

/// One step of exposing a volume and how long it took.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ExposeStep {
    /// What was done or waited for, e.g. "backup snapshot ready".
    pub what: &'static str,
    /// Its wall time.
    pub took: Duration,
}

/// Times consecutive steps: each [`StepTimer::mark`] records the time since the previous one.
#[derive(Debug)]
pub struct StepTimer {
    last: std::time::Instant,
    steps: Vec<ExposeStep>,
}

impl Default for StepTimer {
    fn default() -> Self {
        Self::new()
    }
}

impl StepTimer {
    /// Starts timing now.
    #[must_use]
    pub fn new() -> Self {
        Self { last: std::time::Instant::now(), steps: Vec::new() }
    }

    /// Records step `what` as ending now.
    pub fn mark(&mut self, what: &'static str) {
        let now = std::time::Instant::now();
        self.steps.push(ExposeStep { what, took: now - self.last });
        self.last = now;
    }

    /// The result: exposed on `node` with the recorded steps.
    #[must_use]
    pub fn exposed(self, node: String) -> Exposed {
        Exposed { node, steps: self.steps }
    }
}

/// Whether a volume is a file system or a raw block device.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum VolumeMode {
    /// A mounted file system.
    #[default]
    Filesystem,
    /// A block device.
    Block,
}

/// An exposed volume as the data path sees it on this node.
#[derive(Debug, Clone)]
pub struct ExposedVolume {
    /// The node it is on.
    pub node: String,
    /// The mount directory (file system) or device node (block) on this node.
    pub path: PathBuf,
    /// What was found and checked at `path` when the volume was located (the mount root, the
    /// device node), held open (`O_PATH` is enough). The data path reaches the volume only
    /// through it, never by `path` again: if the volume is unmounted after it was located,
    /// nothing is read from or written to whatever is at `path` then (the node's own disk).
    /// `None` once [released](Self::release); the data path refuses a volume without it.
    pub root: Option<Arc<OwnedFd>>,
    /// What holds the volume exposed, in the exposer's terms (the holding pod's UID):
    /// [`Exposer::still_held`] checks that this very holder still does.
    pub holder: String,
    /// File system or block.
    pub mode: VolumeMode,
    /// The node's operating system, reported in a DataUpload's `status.nodeOS`.
    pub node_os: NodeOs,
    /// The CSI snapshot the exposed volume was made from (backups only; `None` when the
    /// exposer does not know it): what changed-block tracking is asked about.
    pub snapshot: Option<CsiSnapshot>,
}

/// A CSI snapshot as the exposer made it readable: the VolumeSnapshot in the exposer's
/// namespace and the storage system's handle of the physical snapshot.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CsiSnapshot {
    /// The VolumeSnapshot's namespace.
    pub namespace: String,
    /// The VolumeSnapshot.
    pub name: String,
    /// The CSI driver.
    pub driver: String,
    /// The physical snapshot's handle (`status.snapshotHandle` of its content).
    pub handle: String,
    /// Whether the exposer keeps the physical snapshot after a completed backup, as the base
    /// of the next backup's changed-block delta.
    pub kept: bool,
    /// The CSI handle of the volume the snapshot was taken of, when known: a delta is asked
    /// only from a base snapshot of the same volume.
    pub source_volume: Option<String>,
}

impl ExposedVolume {
    /// Lets go of [`Self::root`] once the data has moved, so that this agent no longer keeps
    /// the volume mounted (unmounting a volume someone holds open fails until it is closed).
    pub fn release(&mut self) {
        self.root = None;
    }
}

/// Makes the volume of one kind of CR (`C` is [`DataUpload`] or [`DataDownload`]) reachable
/// on a node, and removes what it created afterwards.
///
/// Every method must be idempotent: after an agent restart or a takeover by another node the
/// controllers call them again for the same CR, and the exposer reuses what exists, repairs
/// what is broken and reports where the volume is now.
#[async_trait]
pub trait Exposer<C: Send + Sync + 'static>: Send + Sync + 'static {
    /// Exposes the volume the CR names and returns the node it landed on. Waits (bounded by
    /// `params.operation_timeout`) until it is placed, not until it is usable on the node.
    ///
    /// # Errors
    /// [`WorkError::Canceled`] when `params.cancel` fired; [`WorkError::Failed`] with the
    /// cluster's reason otherwise (missing snapshot, unusable storage class, failed pod).
    async fn expose(&self, cr: &C, params: &ExposeParams) -> Result<Exposed, WorkError>;

    /// The exposed volume if it is ready on `node`, `None` if it is not there (yet).
    ///
    /// # Errors
    /// [`WorkError::Failed`] when the volume can never become ready (the pod failed).
    async fn locate(&self, cr: &C, node: &str) -> Result<Option<ExposedVolume>, WorkError>;

    /// Whether the volume [`Exposer::locate`] found is still held exposed by the same holder.
    /// Asked periodically from when the volume was located until the data has moved, and once
    /// more before the CR completes.
    ///
    /// # Errors
    /// [`WorkError::Failed`] with the reason when the holder went away or is going (deleted,
    /// evicted, replaced, failed): the data path is stopped and the CR fails, never completes
    /// with data missing.
    async fn still_held(&self, cr: &C, volume: &ExposedVolume) -> Result<(), WorkError>;

    /// Runs after the data moved successfully and before the CR is Completed (restores
    /// rebind the restored volume to the target PVC here). The default does nothing.
    ///
    /// # Errors
    /// [`WorkError::Failed`] fails the CR with the reason.
    async fn finish(
        &self,
        cr: &C,
        volume: &ExposedVolume,
        operation_timeout: Duration,
    ) -> Result<(), WorkError> {
        let _ = (cr, volume, operation_timeout);
        Ok(())
    }

    /// Removes everything `expose` created. Called after every terminal phase, also for CRs
    /// that were never exposed; must succeed when there is nothing to remove.
    ///
    /// # Errors
    /// [`WorkError::Failed`]; the agent retries later and keeps the CR's finalizer meanwhile.
    async fn cleanup(&self, cr: &C, operation_timeout: Duration) -> Result<(), WorkError>;
}

/// What a backup produced, written to the DataUpload's status.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct BackupOutcome {
    /// The snapshot's ID in the repository (`status.snapshotID`).
    pub snapshot_id: String,
    /// The volume's size in bytes (`status.progress.totalBytes`).
    pub total_bytes: u64,
    /// Bytes new to the repository (`status.incrementalBytes`).
    pub incremental_bytes: u64,
    /// Mover-specific results (`status.dataMoverResult`), handed to the restore.
    pub data_mover_result: BTreeMap<String, String>,
    /// What the user should act on although the backup succeeded (a repository opened only
    /// with Velero's password, say): each becomes a Warning Event on the DataUpload.
    pub warnings: Vec<String>,
    /// How a block backup chose what to read (`None` for file systems): in the Completed
    /// Event, the DataUpload's message and a metric.
    pub block_reads: Option<BlockReads>,
}

/// Which ranges of a block volume a backup read, and why not fewer.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BlockReads {
    /// The path taken: `allocated` (the snapshot's allocated ranges from changed-block
    /// tracking), `delta` (the ranges changed since the parent's snapshot) or `full` (the
    /// whole device, skipping holes and zeros itself).
    pub path: &'static str,
    /// Why changed-block tracking was not used, short (`no-service`, `unauthorized`,
    /// `stream-failed`, `off`...): the metric's label. `None` when nothing fell back.
    pub fallback: Option<&'static str>,
    /// One sentence for the user: the path, what it read, and the fallback's full reason.
    pub note: String,
}

/// What a restore produced.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct RestoreOutcome {
    /// Bytes restored (`status.progress.totalBytes`).
    pub total_bytes: u64,
    /// As [`BackupOutcome::warnings`], on the DataDownload.
    pub warnings: Vec<String>,
    /// What the restore withheld of the snapshot (device nodes, set-ID bits, privileged
    /// xattrs) and how to ask for it: a Warning Event `RestoreWithheld` on the DataDownload.
    pub withheld: Option<String>,
    /// What the restored volume lacks though the restore wrote all the snapshot holds: entries
    /// unreadable when backed up (restored as recorded, their content missing), metadata the
    /// volume did not take. A Warning Event `RestoreShortfall` on the DataDownload.
    pub shortfall: Option<String>,
}

/// Moves data between an exposed volume and the repository.
///
/// Both calls report progress through the [`ProgressSink`] and return
/// [`WorkError::Canceled`] promptly once `cancel` fires. A call for a CR whose earlier call
/// was interrupted (agent restart, takeover) should resume from what the repository holds.
#[async_trait]
pub trait DataMover: Send + Sync + 'static {
    /// Backs up `volume` for the DataUpload `du`.
    ///
    /// # Errors
    /// [`WorkError::Canceled`] or [`WorkError::Failed`] with the cause.
    async fn backup(
        &self,
        du: &DataUpload,
        volume: &ExposedVolume,
        progress: ProgressSink,
        cancel: CancellationToken,
    ) -> Result<BackupOutcome, WorkError>;

    /// Restores the DataDownload's snapshot into `volume`.
    ///
    /// # Errors
    /// [`WorkError::Canceled`] or [`WorkError::Failed`] with the cause.
    async fn restore(
        &self,
        dd: &DataDownload,
        volume: &ExposedVolume,
        progress: ProgressSink,
        cancel: CancellationToken,
    ) -> Result<RestoreOutcome, WorkError>;
}

/// The backends one agent drives.
#[derive(Clone)]
pub struct Backends {
    /// Exposes DataUploads' snapshots.
    pub upload_exposer: Arc<dyn Exposer<DataUpload>>,
    /// Exposes DataDownloads' target volumes.
    pub download_exposer: Arc<dyn Exposer<DataDownload>>,
    /// Moves the data both ways.
    pub mover: Arc<dyn DataMover>,
}

impl std::fmt::Debug for Backends {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Backends").finish_non_exhaustive()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_timer_records_each_step_since_the_previous_one() {
        let mut timer = StepTimer::new();
        std::thread::sleep(Duration::from_millis(20));
        timer.mark("first");
        timer.mark("second");
        let exposed = timer.exposed("node-a".into());
        assert_eq!(exposed.node, "node-a");
        let what: Vec<_> = exposed.steps.iter().map(|s| s.what).collect();
        assert_eq!(what, ["first", "second"]);
        assert!(exposed.steps[0].took >= Duration::from_millis(20), "{:?}", exposed.steps);
        assert!(exposed.steps[1].took < exposed.steps[0].took, "{:?}", exposed.steps);
        let line = Exposed {
            node: "n".into(),
            steps: vec![
                ExposeStep { what: "snapshot ready", took: Duration::from_millis(240) },
                ExposeStep { what: "pod placed", took: Duration::from_millis(1_960) },
            ],
        }
        .steps_line();
        assert_eq!(line, "snapshot ready 0.2s, pod placed 2.0s");
        assert_eq!(Exposed::on("n".into()).steps_line(), "");
    }
}
