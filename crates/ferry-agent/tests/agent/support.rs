//! Test support: agents for one test (own data mover name, so tests sharing the control
//! plane never touch each other's CRs), Velero-shaped CRs, bounded waits.

use std::collections::BTreeMap;
use std::fmt::Debug;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use ferry_agent::{Agent, AgentConfig, REPORTING_CONTROLLER};
use ferry_api::k8s_openapi::api::events::v1::Event;
use ferry_api::{
    CsiSnapshotSpec, DataDownload, DataDownloadSpec, DataUpload, DataUploadPhase, DataUploadSpec,
    GoDuration, SnapshotType, TargetVolumeSpec, keys, naming,
};
use ferry_testbed::{ControlPlane, VELERO_NAMESPACE};
use futures::StreamExt;
use kube::api::{Api, DeleteParams, ListParams, Patch, PatchParams};
use kube::runtime::watcher;
use kube::{Resource, ResourceExt};
use serde::Serialize;
use serde::de::DeserializeOwned;

use crate::sim::Sim;

/// The bound on every wait in these tests.
pub const WAIT: Duration = Duration::from_secs(60);

pub fn init_tracing() {
    let _ = tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_default_env())
        .with_test_writer()
        .try_init();
}

/// A name no other test (or earlier run against the same server) uses.
pub fn unique(prefix: &str) -> String {
    static NEXT: AtomicU64 = AtomicU64::new(0);
    let n = NEXT.fetch_add(1, Ordering::Relaxed);
    let t = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_micros() % 0xffff_ffff);
    format!("{prefix}-{t:x}-{n}")
}

/// A Velero-shaped DataUpload named `name` for the data mover `data_mover`.
pub fn data_upload(name: &str, data_mover: &str) -> DataUpload {
    let mut du = DataUpload::new(
        name,
        DataUploadSpec {
            snapshot_type: SnapshotType::Csi,
            csi_snapshot: Some(CsiSnapshotSpec {
                volume_snapshot: format!("velero-{name}"),
                storage_class: "standard".into(),
                snapshot_class: "csi-snapclass".into(),
                driver: "hostpath.csi.k8s.io".into(),
            }),
            source_pvc: format!("pvc-{name}"),
            data_mover: data_mover.into(),
            backup_storage_location: "default".into(),
            source_namespace: "app".into(),
            data_mover_config: None,
            cancel: false,
            operation_timeout: GoDuration(Duration::from_secs(600)),
        },
    );
    du.metadata.namespace = Some(VELERO_NAMESPACE.into());
    du.metadata.labels = Some(BTreeMap::from([
        (keys::BACKUP_NAME_LABEL.to_owned(), "nightly".to_owned()),
        (
            keys::ASYNC_OPERATION_ID_LABEL.to_owned(),
            naming::data_upload_operation_id("b-uid", name),
        ),
    ]));
    du
}

/// A Velero-shaped DataDownload named `name`.
pub fn data_download(name: &str, data_mover: &str) -> DataDownload {
    let mut dd = DataDownload::new(
        name,
        DataDownloadSpec {
            target_volume: TargetVolumeSpec {
                pvc: format!("pvc-{name}"),
                pv: String::new(),
                namespace: "app".into(),
            },
            backup_storage_location: "default".into(),
            data_mover: data_mover.into(),
            snapshot_id: "snap-1".into(),
            source_namespace: "app".into(),
            data_mover_config: None,
            cancel: false,
            operation_timeout: GoDuration(Duration::from_secs(600)),
            node_os: None,
            snapshot_size: 4 << 20,
        },
    );
    dd.metadata.namespace = Some(VELERO_NAMESPACE.into());
    dd
}

/// Agents of one test, sharing one simulated cluster and one data mover name.
pub struct TestCluster {
    pub client: kube::Client,
    pub sim: Arc<Sim>,
    pub data_mover: String,
    pub uploads: Api<DataUpload>,
    pub downloads: Api<DataDownload>,
    agents: Vec<Agent>,
    /// What each node's agent asked of the API server, by node.
    pub requests: std::collections::HashMap<String, ferry_testbed::Requests>,
    tweak: fn(&mut AgentConfig),
}

/// Settings that make the tests quick: short intervals and lease.
pub fn fast(config: &mut AgentConfig) {
    config.progress_interval = Duration::from_millis(200);
    config.recheck_interval = Duration::from_millis(500);
    config.locate_interval = Duration::from_millis(100);
    config.holder_check_interval = Duration::from_millis(100);
    config.lease_duration = Duration::from_secs(3);
    config.prepare_timeout = Duration::from_secs(60);
    config.concurrency = 2;
}

impl TestCluster {
    /// No agents yet; `tweak` adjusts every agent's configuration (after [`fast`]).
    pub fn new(sim: Arc<Sim>, tweak: fn(&mut AgentConfig)) -> Self {
        init_tracing();
        let cp = ControlPlane::shared();
        let client = cp.client().expect("client");
        Self {
            uploads: Api::namespaced(client.clone(), VELERO_NAMESPACE),
            downloads: Api::namespaced(client.clone(), VELERO_NAMESPACE),
            client,
            sim,
            data_mover: unique("mover"),
            agents: Vec::new(),
            requests: std::collections::HashMap::new(),
            tweak,
        }
    }

    pub fn config_for(&self, node: &str) -> AgentConfig {
        let mut config = AgentConfig::new(node);
        config.data_mover.clone_from(&self.data_mover);
        fast(&mut config);
        (self.tweak)(&mut config);
        config
    }

    pub async fn start_agent(&mut self, node: &str) {
        let (client, requests) =
            ferry_testbed::recording_client(ControlPlane::shared().config()).expect("client");
        self.requests.insert(node.to_owned(), requests);
        let agent = Agent::start(client, self.config_for(node), self.sim.backends())
            .await
            .expect("agent starts");
        self.agents.push(agent);
    }

    pub async fn start_agents(&mut self, nodes: &[&str]) {
        for node in nodes {
            self.start_agent(node).await;
        }
    }

    /// Stops the agent of `node` the way a killed pod stops: no more writes, no lease renewal.
    pub async fn stop_agent(&mut self, node: &str) {
        let at = self.agents.iter().position(|a| a.node() == node).expect("agent runs");
        self.agents.remove(at).shutdown().await;
    }

    pub async fn shutdown(self) {
        for agent in self.agents {
            agent.shutdown().await;
        }
    }

    pub async fn create_upload(&self, name: &str) -> DataUpload {
        self.uploads
            .create(&Default::default(), &data_upload(name, &self.data_mover))
            .await
            .expect("create DataUpload")
    }

    pub async fn create_download(&self, name: &str) -> DataDownload {
        self.downloads
            .create(&Default::default(), &data_download(name, &self.data_mover))
            .await
            .expect("create DataDownload")
    }

    /// Creates `count` uploads named after `prefix` at once and waits until every one is
    /// Completed; returns their names.
    pub async fn uploads_all_completed(&self, prefix: &str, count: usize) -> Vec<String> {
        let names: Vec<String> = (0..count).map(|i| unique(&format!("{prefix}{i}"))).collect();
        for name in &names {
            self.create_upload(name).await;
        }
        for name in &names {
            wait_for(&self.uploads, name, "Completed", |du: &DataUpload| {
                du.phase() == DataUploadPhase::Completed
            })
            .await;
        }
        names
    }

    /// Events the agents published on the CR named `name`, as reasons, once the `last` one is
    /// among them (see [`Self::events_after`]).
    pub async fn event_reasons_after(&self, name: &str, last: &str) -> Vec<String> {
        self.events_after(name, last).await.into_iter().map(|(reason, _)| reason).collect()
    }

    /// [`Self::events`] once an Event with reason `last` is among them, waiting up to [`WAIT`]:
    /// the agent publishes each Event right after the status write it tells of, so a test that
    /// saw the phase must still wait for its Event. Returns what there is after the wait, for
    /// the caller's assertion to show.
    pub async fn events_after(&self, name: &str, last: &str) -> Vec<(String, String)> {
        let deadline = Instant::now() + WAIT;
        loop {
            let events = self.events(name).await;
            if events.iter().any(|(reason, _)| reason == last) || Instant::now() > deadline {
                return events;
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Events the agents published on the CR named `name`, as `(reason, note)` in time order.
    pub async fn events(&self, name: &str) -> Vec<(String, String)> {
        let api: Api<Event> = Api::namespaced(self.client.clone(), VELERO_NAMESPACE);
        let events = api.list(&ListParams::default()).await.expect("list events");
        let mut found: Vec<(String, String, String)> = events
            .items
            .into_iter()
            .filter(|e| {
                e.regarding.as_ref().and_then(|r| r.name.as_deref()) == Some(name)
                    && e.reporting_controller.as_deref() == Some(REPORTING_CONTROLLER)
            })
            .map(|e| {
                let at = e.event_time.map(|t| t.0.to_string()).unwrap_or_default();
                (at, e.reason.unwrap_or_default(), e.note.unwrap_or_default())
            })
            .collect();
        found.sort();
        found.into_iter().map(|(_, reason, note)| (reason, note)).collect()
    }
}

/// Polls `name` until `pred` holds; panics after [`WAIT`] showing the object as it is.
pub async fn wait_for<K>(
    api: &Api<K>,
    name: &str,
    what: &str,
    mut pred: impl FnMut(&K) -> bool,
) -> K
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let deadline = Instant::now() + WAIT;
    loop {
        let current = api.get_opt(name).await.expect("get");
        if let Some(obj) = &current
            && pred(obj)
        {
            return obj.clone();
        }
        assert!(
            Instant::now() < deadline,
            "{name} was not {what} after {WAIT:?}; now:\n{}",
            serde_json::to_string_pretty(&current).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Waits until `name` no longer exists.
pub async fn wait_gone<K>(api: &Api<K>, name: &str)
where
    K: Resource + Clone + DeserializeOwned + Serialize + Debug,
{
    let deadline = Instant::now() + WAIT;
    loop {
        let current = api.get_opt(name).await.expect("get");
        if current.is_none() {
            return;
        }
        assert!(
            Instant::now() < deadline,
            "{name} still exists after {WAIT:?}:\n{}",
            serde_json::to_string_pretty(&current).unwrap_or_default()
        );
        tokio::time::sleep(Duration::from_millis(100)).await;
    }
}

/// Sets `spec.cancel` the way Velero's plugin does: a JSON merge patch.
pub async fn request_cancel<K>(api: &Api<K>, name: &str)
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    let patch = serde_json::json!({ "spec": { "cancel": true } });
    api.patch(name, &PatchParams::default(), &Patch::Merge(&patch)).await.expect("patch cancel");
}

pub async fn delete<K>(api: &Api<K>, name: &str)
where
    K: Resource + Clone + DeserializeOwned + Debug,
{
    api.delete(name, &DeleteParams::default()).await.expect("delete");
}

/// Every version of one CR the watch delivered, as (phase, bytesDone). A watch error is not
/// a version: it is kept only to be shown when a check fails (the watch lists again after
/// one, so the versions in between may be missing, never reordered).
pub struct History {
    name: String,
    seen: Arc<Mutex<Vec<(String, i64)>>>,
    errors: Arc<Mutex<Vec<String>>>,
    task: tokio::task::JoinHandle<()>,
}

impl History {
    pub fn record<K>(api: &Api<K>, name: &str, read: fn(&K) -> (String, i64)) -> Self
    where
        K: Resource + Clone + DeserializeOwned + Debug + Send + Sync + 'static,
    {
        let seen = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let config = watcher::Config::default().fields(&format!("metadata.name={name}"));
        let stream = watcher(api.clone(), config);
        let (sink, error_sink) = (Arc::clone(&seen), Arc::clone(&errors));
        let task = tokio::spawn(async move {
            let mut stream = std::pin::pin!(stream);
            while let Some(event) = stream.next().await {
                match event {
                    Ok(watcher::Event::Apply(obj) | watcher::Event::InitApply(obj)) => {
                        sink.lock().expect("lock").push(read(&obj));
                    }
                    Ok(_) => {}
                    Err(e) => error_sink.lock().expect("lock").push(e.to_string()),
                }
            }
        });
        Self { name: name.to_owned(), seen, errors, task }
    }

    pub fn values(&self) -> Vec<(String, i64)> {
        self.seen.lock().expect("lock").clone()
    }

    fn errors(&self) -> Vec<String> {
        self.errors.lock().expect("lock").clone()
    }

    /// Every version recorded so far, once one in `phase` is among them, waiting up to
    /// [`WAIT`]: the watch may lag behind a read that already saw that phase.
    pub async fn wait_until_seen(&self, phase: &str) -> Vec<(String, i64)> {
        let deadline = Instant::now() + WAIT;
        loop {
            let values = self.values();
            if values.iter().any(|(p, _)| p == phase) {
                return values;
            }
            assert!(
                Instant::now() < deadline,
                "the watch of {} saw no {phase} in {WAIT:?}: {values:?}; watch errors: {:?}",
                self.name,
                self.errors()
            );
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Asserts `bytesDone` never decreased across the recorded versions, of which there must
    /// be at least two (with fewer there is nothing to compare). Call it once the watch has
    /// seen the final version ([`Self::wait_until_seen`]), or the check may end early.
    pub fn assert_monotonic(&self) {
        let values = self.values();
        assert!(
            values.len() >= 2,
            "the watch of {} recorded {} version(s), too few to tell whether bytesDone went \
             backwards: {values:?}; watch errors: {:?}",
            self.name,
            values.len(),
            self.errors()
        );
        for pair in values.windows(2) {
            assert!(pair[1].1 >= pair[0].1, "{}: bytesDone went backwards: {values:?}", self.name);
        }
    }
}

impl Drop for History {
    fn drop(&mut self) {
        self.task.abort();
    }
}

pub fn du_progress(du: &DataUpload) -> (String, i64) {
    (du.phase().to_string(), du.status.as_ref().map_or(0, |s| s.progress.bytes_done))
}

pub fn dd_progress(dd: &DataDownload) -> (String, i64) {
    (dd.phase().to_string(), dd.status.as_ref().map_or(0, |s| s.progress.bytes_done))
}

/// Whether Ferry's finalizer and the expose-on-going label are both gone.
pub fn released<K: Resource>(cr: &K) -> bool {
    !cr.finalizers().iter().any(|f| f == keys::DATA_UPLOAD_DOWNLOAD_FINALIZER)
        && !cr.labels().contains_key(keys::EXPOSE_ON_GOING_LABEL)
}
