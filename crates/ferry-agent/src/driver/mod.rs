//! The driver: one task per CR on the node responsible for it, walking the CR through its
//! phases.
//!
//! Each round reads the CR fresh from the API server, decides the next step from what it
//! sees ([`next_step`]), and runs that step. Steps that wait (exposing, locating, waiting for
//! a slot, moving data) stop when the driver's work token fires: the controller fires it
//! when a cancel or deletion is requested, the progress writer when the CR is no longer
//! this node's, and the agent's shutdown fires it on every driver. After the token fires
//! the driver only finishes a cancel or a cleanup; any other work is left to a fresh driver.
//!
//! Every status write is a full-object update whose change function first checks that this
//! node is still responsible and the phase is the expected one, so a node that lost a CR
//! (taken over while it was cut off) cannot overwrite the new owner's state.

mod finish;
mod holder;
mod prepare;
mod transfer;

use std::sync::Arc;

use tokio_util::sync::CancellationToken;

use crate::context::Ctx;
use crate::error::error_chain;
use crate::jobs::JobGuard;
use crate::resource::{
    MoverCr, Phase, has_expose_label, has_finalizer, responsible_node, stop_requested,
};
use crate::update::get_opt;

/// A driver never takes more steps than this; a healthy CR needs about five.
const MAX_STEPS: usize = 16;

/// What the driver does next for a CR.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Step {
    /// Nothing for this node (another node's CR, finished, or not this data mover's).
    Exit,
    /// Accepted here: expose the volume.
    Expose,
    /// Prepared for this node (`resume: false`) or InProgress here after a restart
    /// (`resume: true`): locate the volume, take a slot, move the data.
    Move { resume: bool },
    /// Stop requested: write Canceling.
    StartCancel,
    /// Canceling: clean up, then Canceled.
    FinishCancel,
    /// Terminal with the finalizer still on: clean up, then release the CR.
    Cleanup,
}

impl Step {
    /// Whether the step waits on the work token (and so is pointless once it fired).
    fn is_work(self) -> bool {
        matches!(self, Self::Expose | Self::Move { .. })
    }
}

fn next_step<C: MoverCr>(cr: &C, ctx: &Ctx<C>) -> Step {
    if cr.data_mover() != ctx.config.data_mover {
        return Step::Exit;
    }
    let phase = cr.phase();
    let responsible = responsible_node(cr);
    if phase.is_terminal() {
        let pending = has_finalizer(cr) || has_expose_label(cr);
        let ours = match responsible.as_deref() {
            Some(node) => node == ctx.me() || !ctx.liveness.is_alive(node),
            None => true,
        };
        return if pending && ours { Step::Cleanup } else { Step::Exit };
    }
    if !ctx.is_me(responsible.as_deref()) {
        return Step::Exit;
    }
    if stop_requested(cr) {
        return if phase == Phase::Canceling { Step::FinishCancel } else { Step::StartCancel };
    }
    match phase {
        Phase::Accepted => Step::Expose,
        Phase::Prepared => Step::Move { resume: false },
        Phase::InProgress => Step::Move { resume: true },
        Phase::Canceling => Step::FinishCancel,
        Phase::New | Phase::Canceled | Phase::Completed | Phase::Failed => Step::Exit,
    }
}

/// Runs the driver for CR `name` until nothing is left for this node to do.
pub(crate) async fn run<C: MoverCr>(
    ctx: Arc<Ctx<C>>,
    name: String,
    work: CancellationToken,
    _guard: JobGuard,
) {
    for _ in 0..MAX_STEPS {
        if ctx.shutdown.is_cancelled() {
            return;
        }
        let cr = match get_opt(&ctx.api, &name).await {
            Ok(Some(cr)) => cr,
            Ok(None) => return,
            Err(e) => {
                tracing::warn!(kind = C::KIND, %name, error = %error_chain(&e), "reading the CR failed");
                return;
            }
        };
        let step = next_step(&cr, &ctx);
        tracing::debug!(kind = C::KIND, %name, node = ctx.me(), ?step, "driver step");
        if step == Step::Exit {
            return;
        }
        if step.is_work() && work.is_cancelled() {
            // The token fired after this read: read again, the reason (a cancel, a lost
            // CR) is in the API server by now. A spurious fire ends after MAX_STEPS rounds.
            tokio::time::sleep(std::time::Duration::from_millis(100)).await;
            continue;
        }
        let result = match step {
            Step::Exit => return,
            Step::Expose => prepare::expose(&ctx, cr, &work).await,
            Step::Move { resume } => transfer::move_data(&ctx, cr, resume, &work).await,
            Step::StartCancel => finish::start_cancel(&ctx, cr).await,
            Step::FinishCancel => finish::finish_cancel(&ctx, cr).await,
            Step::Cleanup => finish::cleanup(&ctx, cr).await,
        };
        if let Err(e) = result {
            // The controller's recheck starts a new driver later.
            tracing::warn!(kind = C::KIND, %name, node = ctx.me(), ?step, error = %e, "driver step failed");
            return;
        }
    }
    tracing::warn!(kind = C::KIND, %name, "driver took {MAX_STEPS} steps; leaving the CR to the next recheck");
}

/// How long a backend call gets to return on its own after its cancellation token fired
/// (to stop cleanly, e.g. to save what a later resume needs) before it is dropped.
const CANCEL_GRACE: std::time::Duration = std::time::Duration::from_secs(10);

/// Awaits a backend call that watches `token` itself. Once the token fires the call gets
/// [`CANCEL_GRACE`] to return; after that it is dropped and the result is `Canceled`.
async fn until_canceled<T>(
    call: impl Future<Output = Result<T, crate::WorkError>>,
    token: &CancellationToken,
) -> Result<T, crate::WorkError> {
    let mut call = std::pin::pin!(call);
    tokio::select! {
        biased;
        result = &mut call => return result,
        () = token.cancelled() => {}
    }
    tokio::time::timeout(CANCEL_GRACE, call).await.unwrap_or(Err(crate::WorkError::Canceled))
}
