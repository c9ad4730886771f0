//! Starting and stopping one node's agent: the lease, the lease watch, and the DataUpload and
//! DataDownload controllers.

use std::sync::Arc;
use std::time::Duration;

use ferry_api::k8s_openapi::api::coordination::v1::Lease;
use ferry_api::{DataDownload, DataUpload};
use futures::StreamExt;
use kube::api::Api;
use kube::runtime::{Controller, watcher};
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::context::Ctx;
use crate::events::Events;
use crate::jobs::Jobs;
use crate::liveness::{self, Liveness};
use crate::queue::PrepareQueue;
use crate::reconcile::{error_policy, reconcile};
use crate::resource::MoverCr;
use crate::{AgentConfig, AgentError, Backends, Metrics};

/// How long the controllers get to finish running reconciles after shutdown starts.
const SHUTDOWN_GRACE: Duration = Duration::from_secs(2);

/// A node's agent. Start it with [`Agent::start`]; stop it with [`Agent::shutdown`].
///
/// Dropping it without calling `shutdown` stops its tasks too, without waiting for them.
#[derive(Debug)]
pub struct Agent {
    node: String,
    metrics: Arc<Metrics>,
    shutdown: CancellationToken,
    tracker: TaskTracker,
}

impl Agent {
    /// Renews this node's liveness lease once (so a broken setup fails here, loudly), then
    /// starts the lease renewal, the lease watch and both controllers on the current tokio
    /// runtime, and returns.
    ///
    /// # Errors
    /// [`AgentError::Config`] for unusable settings, [`AgentError::Lease`] when the lease
    /// cannot be written (no access to `coordination.k8s.io` leases in the namespace).
    pub async fn start(
        client: kube::Client,
        config: AgentConfig,
        backends: Backends,
    ) -> Result<Self, AgentError> {
        config.validate()?;
        let leases: Api<Lease> = Api::namespaced(client.clone(), &config.namespace);
        let lease = liveness::lease_name(&config.data_mover, &config.node_name);
        liveness::renew(
            &leases,
            &lease,
            &config.data_mover,
            &config.node_name,
            config.lease_duration,
        )
        .await
        .map_err(|source| AgentError::Lease {
            lease: lease.clone(),
            namespace: config.namespace.clone(),
            source: Box::new(source),
        })?;

        let shutdown = CancellationToken::new();
        let tracker = TaskTracker::new();
        tracker.spawn(liveness::keep_renewing(
            leases.clone(),
            lease,
            config.data_mover.clone(),
            config.node_name.clone(),
            config.lease_duration,
            shutdown.clone(),
        ));
        let live = Arc::new(Liveness::new(&config.node_name, config.lease_duration));
        {
            let live = Arc::clone(&live);
            let data_mover = config.data_mover.clone();
            let stop = shutdown.clone();
            tracker.spawn(async move { live.watch(leases, &data_mover, stop).await });
        }

        // Controllers first: the prepare queue counts in their caches.
        let uploads = controller::<DataUpload>(&client, &config.namespace);
        let downloads = controller::<DataDownload>(&client, &config.namespace);
        let queue = config.prepare_queue_length.map(|limit| {
            PrepareQueue::new(uploads.store(), downloads.store(), &config.data_mover, limit)
        });
        let shared = Shared {
            queue,
            client: client.clone(),
            config: config.clone(),
            backends,
            liveness: live,
            events: Events::new(client, &config.node_name),
            slots: Arc::new(Semaphore::new(config.concurrency)),
            tracker: tracker.clone(),
            shutdown: shutdown.clone(),
            metrics: Metrics::new(&config.node_name),
        };
        spawn_controller(&shared, uploads);
        spawn_controller(&shared, downloads);
        tracing::info!(node = %config.node_name, data_mover = %config.data_mover, "agent started");
        Ok(Self { node: config.node_name, metrics: Arc::clone(&shared.metrics), shutdown, tracker })
    }

    /// The agent's Prometheus metrics.
    #[must_use]
    pub fn metrics(&self) -> Arc<Metrics> {
        Arc::clone(&self.metrics)
    }

    /// Whether the agent's controllers are running (not stopping).
    #[must_use]
    pub fn is_running(&self) -> bool {
        !self.shutdown.is_cancelled()
    }

    /// The node this agent runs for.
    #[must_use]
    pub fn node(&self) -> &str {
        &self.node
    }

    /// Stops the controllers and every driver, and waits until all have ended. Work in
    /// flight is interrupted without any status write: the CRs stay as they are, for this
    /// node's next agent to resume or for another node to take over once the lease expires.
    /// The lease is not deleted, so a quick restart takes nothing away from this node.
    pub async fn shutdown(self) {
        self.shutdown.cancel();
        self.tracker.close();
        self.tracker.wait().await;
        tracing::info!(node = %self.node, "agent stopped");
    }
}

impl Drop for Agent {
    fn drop(&mut self) {
        self.shutdown.cancel();
    }
}

/// What both controllers of one agent share.
struct Shared {
    queue: Option<PrepareQueue>,
    client: kube::Client,
    config: AgentConfig,
    backends: Backends,
    liveness: Arc<Liveness>,
    events: Events,
    slots: Arc<Semaphore>,
    tracker: TaskTracker,
    shutdown: CancellationToken,
    metrics: Arc<Metrics>,
}

/// The controller of `C`s in `namespace` (its cache is filled once it runs).
fn controller<C: MoverCr>(client: &kube::Client, namespace: &str) -> Controller<C> {
    Controller::new(Api::namespaced(client.clone(), namespace), watcher::Config::default())
}

fn spawn_controller<C: MoverCr>(shared: &Shared, controller: Controller<C>) {
    let api: Api<C> = Api::namespaced(shared.client.clone(), &shared.config.namespace);
    let ctx = Arc::new(Ctx {
        api: api.clone(),
        config: shared.config.clone(),
        backends: shared.backends.clone(),
        liveness: Arc::clone(&shared.liveness),
        events: shared.events.clone(),
        slots: Arc::clone(&shared.slots),
        jobs: Jobs::default(),
        tracker: shared.tracker.clone(),
        shutdown: shared.shutdown.clone(),
        metrics: Arc::clone(&shared.metrics),
        queue: shared.queue.clone(),
    });
    let stop = shared.shutdown.clone();
    let node = shared.config.node_name.clone();
    shared.tracker.spawn(async move {
        let controller = controller
            .graceful_shutdown_on(stop.clone().cancelled_owned())
            .run(reconcile::<C>, error_policy::<C>, ctx)
            .for_each(|result| {
                if let Err(e) = result {
                    tracing::debug!(kind = C::KIND, %node, error = %e, "controller event");
                }
                futures::future::ready(())
            });
        // A graceful shutdown lets running reconciles finish, but never ends if it starts
        // before the controller's first listing is complete; bound it.
        tokio::select! {
            () = controller => {}
            () = async {
                stop.cancelled().await;
                tokio::time::sleep(SHUTDOWN_GRACE).await;
            } => {}
        }
    });
}
