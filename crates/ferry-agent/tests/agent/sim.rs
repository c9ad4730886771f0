//! A simulated exposer and data path: exposes instantly (or hangs, or fails), "moves" a
//! configurable number of bytes in chunks with a delay, and records every call, so the tests
//! can check what the controllers asked for, where, and how often.

use std::collections::{BTreeMap, HashMap};
use std::path::PathBuf;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Duration;

use async_trait::async_trait;
use ferry_agent::{
    Backends, BackupOutcome, Breakdown, DataMover, ExposeParams, Exposed, ExposedVolume, Exposer,
    ProgressSink, RestoreOutcome, VolumeMode, WorkError,
};
use ferry_api::{DataDownload, DataUpload, NodeOs};
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;

/// Where the simulated cluster places an exposed volume.
#[derive(Debug, Clone)]
pub enum Placement {
    /// On the node whose agent asked.
    Accepting,
    /// Always on this node.
    Fixed(String),
    /// Spread over these nodes by the CR's name.
    Spread(Vec<String>),
}

/// What `expose` does.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ExposeMode {
    Instant,
    /// Never finishes; returns Canceled when the token fires.
    Hang,
    /// Fails with this message.
    Fail(String),
}

/// How the simulation treats one CR.
#[derive(Debug, Clone)]
pub struct Behaviour {
    pub bytes: u64,
    pub chunks: u64,
    pub chunk_delay: Duration,
    pub expose: ExposeMode,
    /// Whether the exposed volume ever shows up on its node.
    pub locatable: bool,
    /// The data path fails with this message after the first chunk.
    pub mover_error: Option<String>,
    /// Warnings a successful backup reports.
    pub warnings: Vec<String>,
}

impl Default for Behaviour {
    fn default() -> Self {
        Self {
            bytes: 4 << 20,
            chunks: 4,
            chunk_delay: Duration::from_millis(50),
            expose: ExposeMode::Instant,
            locatable: true,
            mover_error: None,
            warnings: Vec::new(),
        }
    }
}

/// One recorded call.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Call {
    Expose { cr: String, node: String, timeout: Duration },
    ExposeCanceled { cr: String },
    Cleanup { cr: String },
    MoveStart { cr: String, node: String },
    MoveCanceled { cr: String, node: String },
    MoveDone { cr: String, node: String },
    Finish { cr: String },
}

#[derive(Debug, Default)]
struct State {
    behaviours: HashMap<String, Behaviour>,
    exposed: HashMap<String, String>,
    calls: Vec<Call>,
    active_per_cr: HashMap<String, usize>,
    max_active_per_cr: usize,
    active_per_node: HashMap<String, usize>,
    max_active_per_node: usize,
    /// CRs whose holder went away, with the reason.
    lost: HashMap<String, String>,
}

/// The simulated cluster and data path shared by every agent of one test.
#[derive(Debug)]
pub struct Sim {
    placement: Placement,
    default: Behaviour,
    state: Mutex<State>,
}

impl Sim {
    pub fn new(placement: Placement, default: Behaviour) -> Arc<Self> {
        Arc::new(Self { placement, default, state: Mutex::default() })
    }

    fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    pub fn backends(self: &Arc<Self>) -> Backends {
        Backends {
            upload_exposer: self.clone(),
            download_exposer: self.clone(),
            mover: self.clone(),
        }
    }

    /// Sets how the CR named `cr` is treated.
    pub fn set(&self, cr: &str, behaviour: Behaviour) {
        self.state().behaviours.insert(cr.to_owned(), behaviour);
    }

    fn behaviour(&self, cr: &str) -> Behaviour {
        self.state().behaviours.get(cr).cloned().unwrap_or_else(|| self.default.clone())
    }

    pub fn calls(&self) -> Vec<Call> {
        self.state().calls.clone()
    }

    fn record(&self, call: Call) {
        self.state().calls.push(call);
    }

    /// How often `pred` matches a recorded call.
    pub fn count(&self, pred: impl Fn(&Call) -> bool) -> usize {
        self.state().calls.iter().filter(|c| pred(c)).count()
    }

    /// The most data movements that ran at once for one CR, and on one node.
    pub fn max_active(&self) -> (usize, usize) {
        let state = self.state();
        (state.max_active_per_cr, state.max_active_per_node)
    }

    /// Makes the CR's exposed volume lose its holder (a holding pod deleted or evicted).
    pub fn lose_holder(&self, cr: &str, reason: &str) {
        self.state().lost.insert(cr.to_owned(), reason.to_owned());
    }

    fn still_held_any(&self, cr: &str) -> Result<(), WorkError> {
        match self.state().lost.get(cr) {
            Some(reason) => Err(WorkError::failed(reason.clone())),
            None => Ok(()),
        }
    }

    pub fn path_of(cr: &str) -> PathBuf {
        PathBuf::from(format!(
            "/var/lib/kubelet/pods/sim-{cr}/volumes/kubernetes.io~csi/pv-{cr}/mount"
        ))
    }

    fn place(&self, cr: &str, asking: &str) -> String {
        match &self.placement {
            Placement::Accepting => asking.to_owned(),
            Placement::Fixed(node) => node.clone(),
            Placement::Spread(nodes) => {
                let sum: usize = cr.bytes().map(usize::from).sum();
                nodes[sum % nodes.len()].clone()
            }
        }
    }

    async fn expose_any(&self, cr: &str, params: &ExposeParams) -> Result<Exposed, WorkError> {
        self.record(Call::Expose {
            cr: cr.to_owned(),
            node: params.node.clone(),
            timeout: params.operation_timeout,
        });
        match self.behaviour(cr).expose {
            ExposeMode::Instant => {
                let node = self.place(cr, &params.node);
                self.state().exposed.insert(cr.to_owned(), node.clone());
                Ok(Exposed::on(node))
            }
            ExposeMode::Hang => {
                params.cancel.cancelled().await;
                self.record(Call::ExposeCanceled { cr: cr.to_owned() });
                Err(WorkError::Canceled)
            }
            ExposeMode::Fail(message) => Err(WorkError::failed(message)),
        }
    }

    fn locate_any(&self, cr: &str, node: &str) -> Option<ExposedVolume> {
        if !self.behaviour(cr).locatable {
            return None;
        }
        let on = self.state().exposed.get(cr).cloned()?;
        // The simulated data path never reads it; any open directory stands in.
        let root = std::fs::File::open("/").ok()?;
        (on == node).then(|| ExposedVolume {
            node: on,
            path: Self::path_of(cr),
            root: Some(Arc::new(root.into())),
            holder: format!("sim-{cr}"),
            mode: VolumeMode::Filesystem,
            node_os: NodeOs::Linux,
            snapshot: None,
        })
    }

    fn cleanup_any(&self, cr: &str) {
        let mut state = self.state();
        state.exposed.remove(cr);
        state.calls.push(Call::Cleanup { cr: cr.to_owned() });
    }

    fn enter(&self, cr: &str, node: &str) {
        let mut state = self.state();
        state.calls.push(Call::MoveStart { cr: cr.to_owned(), node: node.to_owned() });
        let per_cr = {
            let n = state.active_per_cr.entry(cr.to_owned()).or_default();
            *n += 1;
            *n
        };
        let per_node = {
            let n = state.active_per_node.entry(node.to_owned()).or_default();
            *n += 1;
            *n
        };
        state.max_active_per_cr = state.max_active_per_cr.max(per_cr);
        state.max_active_per_node = state.max_active_per_node.max(per_node);
    }

    fn leave(&self, call: Call, cr: &str, node: &str) {
        let mut state = self.state();
        state.calls.push(call);
        if let Some(n) = state.active_per_cr.get_mut(cr) {
            *n -= 1;
        }
        if let Some(n) = state.active_per_node.get_mut(node) {
            *n -= 1;
        }
    }

    /// Moves the CR's bytes chunk by chunk; returns the bytes moved.
    async fn move_bytes(
        &self,
        cr: &str,
        volume: &ExposedVolume,
        progress: &ProgressSink,
        cancel: &CancellationToken,
    ) -> Result<u64, WorkError> {
        let behaviour = self.behaviour(cr);
        let node = volume.node.clone();
        self.enter(cr, &node);
        progress.set_total(behaviour.bytes);
        let chunk = behaviour.bytes / behaviour.chunks.max(1);
        for i in 0..behaviour.chunks {
            tokio::select! {
                () = cancel.cancelled() => {
                    self.leave(Call::MoveCanceled { cr: cr.to_owned(), node: node.clone() }, cr, &node);
                    return Err(WorkError::Canceled);
                }
                () = tokio::time::sleep(behaviour.chunk_delay) => {}
            }
            if i + 1 == behaviour.chunks {
                progress.set_done(behaviour.bytes);
            } else {
                progress.add_done(chunk);
            }
            // Every byte read, a quarter of them new to the repository.
            let done = progress.snapshot().bytes_done;
            progress.set_breakdown(Breakdown { read: done, skipped: 0, new: done / 4 });
            if let Some(message) = &behaviour.mover_error {
                self.leave(Call::MoveDone { cr: cr.to_owned(), node: node.clone() }, cr, &node);
                return Err(WorkError::failed(message.clone()));
            }
        }
        self.leave(Call::MoveDone { cr: cr.to_owned(), node: node.clone() }, cr, &node);
        Ok(behaviour.bytes)
    }
}

#[async_trait]
impl Exposer<DataUpload> for Sim {
    async fn expose(&self, cr: &DataUpload, params: &ExposeParams) -> Result<Exposed, WorkError> {
        self.expose_any(&cr.name_any(), params).await
    }

    async fn locate(
        &self,
        cr: &DataUpload,
        node: &str,
    ) -> Result<Option<ExposedVolume>, WorkError> {
        Ok(self.locate_any(&cr.name_any(), node))
    }

    async fn still_held(&self, cr: &DataUpload, _volume: &ExposedVolume) -> Result<(), WorkError> {
        self.still_held_any(&cr.name_any())
    }

    async fn cleanup(&self, cr: &DataUpload, _timeout: Duration) -> Result<(), WorkError> {
        self.cleanup_any(&cr.name_any());
        Ok(())
    }
}

#[async_trait]
impl Exposer<DataDownload> for Sim {
    async fn expose(&self, cr: &DataDownload, params: &ExposeParams) -> Result<Exposed, WorkError> {
        self.expose_any(&cr.name_any(), params).await
    }

    async fn locate(
        &self,
        cr: &DataDownload,
        node: &str,
    ) -> Result<Option<ExposedVolume>, WorkError> {
        Ok(self.locate_any(&cr.name_any(), node))
    }

    async fn still_held(
        &self,
        cr: &DataDownload,
        _volume: &ExposedVolume,
    ) -> Result<(), WorkError> {
        self.still_held_any(&cr.name_any())
    }

    async fn finish(
        &self,
        cr: &DataDownload,
        _volume: &ExposedVolume,
        _timeout: Duration,
    ) -> Result<(), WorkError> {
        self.record(Call::Finish { cr: cr.name_any() });
        Ok(())
    }

    async fn cleanup(&self, cr: &DataDownload, _timeout: Duration) -> Result<(), WorkError> {
        self.cleanup_any(&cr.name_any());
        Ok(())
    }
}

#[async_trait]
impl DataMover for Sim {
    async fn backup(
        &self,
        du: &DataUpload,
        volume: &ExposedVolume,
        progress: ProgressSink,
        cancel: CancellationToken,
    ) -> Result<BackupOutcome, WorkError> {
        let name = du.name_any();
        let bytes = self.move_bytes(&name, volume, &progress, &cancel).await?;
        Ok(BackupOutcome {
            snapshot_id: format!("snap-{name}"),
            total_bytes: bytes,
            incremental_bytes: bytes / 2,
            data_mover_result: BTreeMap::from([(
                "ferry.io/moved-by".to_owned(),
                volume.node.clone(),
            )]),
            warnings: self.behaviour(&name).warnings,
            block_reads: None,
        })
    }

    async fn restore(
        &self,
        dd: &DataDownload,
        volume: &ExposedVolume,
        progress: ProgressSink,
        cancel: CancellationToken,
    ) -> Result<RestoreOutcome, WorkError> {
        let bytes = self.move_bytes(&dd.name_any(), volume, &progress, &cancel).await?;
        Ok(RestoreOutcome { total_bytes: bytes, ..RestoreOutcome::default() })
    }
}
