//! What a controller's reconcile and drivers share.

use std::sync::Arc;

use kube::ResourceExt;
use kube::api::Api;
use tokio::sync::Semaphore;
use tokio_util::sync::CancellationToken;
use tokio_util::task::TaskTracker;

use crate::events::Events;
use crate::jobs::Jobs;
use crate::liveness::Liveness;
use crate::resource::MoverCr;
use crate::{AgentConfig, Backends};

/// One controller's context: for DataUploads or for DataDownloads on one node.
#[derive(Debug)]
pub(crate) struct Ctx<C: MoverCr> {
    pub api: Api<C>,
    pub config: AgentConfig,
    pub backends: Backends,
    pub liveness: Arc<Liveness>,
    pub events: Events,
    /// Data-movement slots on this node, shared by both controllers.
    pub slots: Arc<Semaphore>,
    pub jobs: Jobs,
    pub tracker: TaskTracker,
    pub shutdown: CancellationToken,
    pub metrics: Arc<crate::Metrics>,
    /// The prepare queue's limit, if one is set.
    pub queue: Option<crate::queue::PrepareQueue>,
}

impl<C: MoverCr> Ctx<C> {
    pub(crate) fn me(&self) -> &str {
        &self.config.node_name
    }

    /// Whether `node` is this node.
    pub(crate) fn is_me(&self, node: Option<&str>) -> bool {
        node == Some(self.me())
    }
}

/// The registry key of a CR: its UID (a CR deleted and re-created under the same name is
/// another CR), or its name when it has none.
pub(crate) fn job_key<C: MoverCr>(cr: &C) -> String {
    cr.uid().unwrap_or_else(|| cr.name_any())
}

/// Starts a driver for `cr` on this node unless one runs already or the agent is stopping.
pub(crate) fn ensure_driver<C: MoverCr>(cr: &C, ctx: &Arc<Ctx<C>>) {
    if ctx.shutdown.is_cancelled() {
        return;
    }
    if let Some((work, guard)) = ctx.jobs.start(&job_key(cr), &ctx.shutdown) {
        let name = cr.name_any();
        tracing::debug!(kind = C::KIND, %name, node = ctx.me(), "starting driver");
        ctx.tracker.spawn(crate::driver::run(Arc::clone(ctx), name, work, guard));
    }
}
