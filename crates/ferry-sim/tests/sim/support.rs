//! Shared helpers: a simulator per test, in a namespace of its own.

use std::time::Duration;

use ferry_sim::{NodeSim, SimConfig};
use ferry_testbed::ControlPlane;
use k8s_openapi::api::core::v1::{PersistentVolume, PersistentVolumeClaim, Pod};
use kube::Api;

pub const T: Duration = Duration::from_secs(60);

pub struct Env {
    pub client: kube::Client,
    pub ns: String,
    pub sim: NodeSim,
}

impl Env {
    pub async fn new(prefix: &str) -> Self {
        Self::with(prefix, |_, _| {}).await
    }

    /// As [`Env::new`], with `adjust` changing the simulator's configuration (it gets the
    /// test's namespace, a unique name to derive node names from).
    pub async fn with(prefix: &str, adjust: impl FnOnce(&str, &mut SimConfig)) -> Self {
        let _ = tracing_subscriber::fmt()
            .with_env_filter("ferry_sim=debug")
            .with_test_writer()
            .try_init();
        let cp = ControlPlane::shared();
        let client = cp.client().expect("client");
        let ns = cp.unique_namespace(prefix).await.expect("namespace");
        let mut config = SimConfig { namespaces: vec![ns.clone()], ..SimConfig::default() };
        adjust(&ns, &mut config);
        let sim = NodeSim::start(client.clone(), config).await.expect("simulator starts");
        Self { client, ns, sim }
    }

    pub fn pvcs(&self) -> Api<PersistentVolumeClaim> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn pods(&self) -> Api<Pod> {
        Api::namespaced(self.client.clone(), &self.ns)
    }

    pub fn pvs(&self) -> Api<PersistentVolume> {
        Api::all(self.client.clone())
    }

    /// Shuts the simulator down and checks that it left nothing on the host.
    pub async fn finish(self) {
        let dir = self.sim.dir().to_path_buf();
        self.sim.shutdown().await.expect("shutdown");
        let left = ferry_sim::janitor::leftovers_under(&dir);
        assert!(left.is_empty(), "left behind: {left:?}");
        assert!(!dir.exists(), "{} still exists", dir.display());
    }
}

pub fn mount_points() -> Vec<String> {
    std::fs::read_to_string("/proc/self/mountinfo")
        .expect("mountinfo")
        .lines()
        .filter_map(|l| l.split(' ').nth(4).map(str::to_owned))
        .collect()
}

pub fn phase(pvc: &PersistentVolumeClaim) -> Option<&str> {
    pvc.status.as_ref()?.phase.as_deref()
}
