//! Status writes of the driver and the terminal phases: Failed, Completed, Canceling and
//! Canceled, and the cleanup that releases a finished CR.

use std::time::Duration;

use ferry_kube::ApiError;
use kube::ResourceExt;

use crate::ExposedVolume;
use crate::context::Ctx;
use crate::error::{WorkError, error_chain};
use crate::resource::{
    MoverCr, Phase, has_expose_label, has_finalizer, is_deleting, now, release,
    remove_expose_label, responsible_node,
};
use crate::update::{Updated, update_status};

/// How often cleanup is tried within one driver step before the step gives up (the next
/// recheck tries again; the finalizer stays on the CR meanwhile).
const CLEANUP_ATTEMPTS: u32 = 3;

/// A driver step could not finish; the controller's next recheck starts a new driver.
#[derive(Debug, thiserror::Error)]
pub(crate) enum StepError {
    /// A status write failed for a reason other than a lost precondition.
    #[error("writing {phase} to {kind} {name}: {}", error_chain(source))]
    Write { kind: &'static str, name: String, phase: &'static str, source: ApiError },
    /// The exposer could not remove what it created.
    #[error("cleaning up after {kind} {name}: {}", error_chain(source))]
    Cleanup { kind: &'static str, name: String, source: WorkError },
}

/// Writes a change if `change` accepts the fresh object; the written object, or `None` when
/// the change was declined or the CR is gone.
pub(super) async fn write<C, F>(
    ctx: &Ctx<C>,
    name: &str,
    start: Option<C>,
    phase: &'static str,
    change: F,
) -> Result<Option<C>, StepError>
where
    C: MoverCr,
    F: FnMut(&mut C) -> bool,
{
    match update_status(&ctx.api, name, start, change).await {
        Ok(Updated::Written(cr)) => Ok(Some(cr)),
        Ok(Updated::Declined(_) | Updated::Missing) => Ok(None),
        Err(source) => {
            Err(StepError::Write { kind: C::KIND, name: name.to_owned(), phase, source })
        }
    }
}

/// Whether this node is responsible for `cr`.
pub(super) fn mine<C: MoverCr>(ctx: &Ctx<C>, cr: &C) -> bool {
    ctx.is_me(responsible_node(cr).as_deref())
}

/// Fails the CR with `message`, unless it is finished, no longer this node's, or a stop was
/// requested (then the cancel path takes over).
pub(super) async fn fail<C: MoverCr>(
    ctx: &Ctx<C>,
    cr: C,
    message: String,
) -> Result<(), StepError> {
    let name = cr.name_any();
    let written = write(ctx, &name, Some(cr), "Failed", |c| {
        if c.phase().is_terminal() || !mine(ctx, c) || crate::resource::stop_requested(c) {
            return false;
        }
        c.set_phase(Phase::Failed);
        let status = c.status_mut();
        status.message.clone_from(&message);
        *status.completion_timestamp = Some(now());
        remove_expose_label(c);
        true
    })
    .await?;
    if let Some(failed) = written {
        tracing::warn!(kind = C::KIND, %name, node = ctx.me(), %message, "failed");
        ctx.metrics.outcome(C::KIND, crate::metrics::Outcome::Failure);
        ctx.events.warning(&failed, "Failed", message).await;
    }
    Ok(())
}

/// Completed: the outcome's fields, `bytesDone == totalBytes`, the completion time.
pub(super) async fn complete<C: MoverCr>(
    ctx: &Ctx<C>,
    name: &str,
    outcome: &C::Outcome,
    volume: &ExposedVolume,
    stats: &str,
) -> Result<(), StepError> {
    let written = write(ctx, name, None, "Completed", |c| {
        if c.phase() != Phase::InProgress || !mine(ctx, c) {
            return false;
        }
        c.set_phase(Phase::Completed);
        c.status_mut().message.clear();
        c.record_outcome(outcome, volume);
        if let Some(hold) =
            ctx.config.completed_upload_finalizer.as_deref().filter(|_| C::RECORDS_SNAPSHOT)
            && !is_deleting(c)
            && !c.finalizers().iter().any(|f| f == hold)
        {
            c.finalizers_mut().push(hold.to_owned());
        }
        *c.status_mut().completion_timestamp = Some(now());
        remove_expose_label(c);
        true
    })
    .await?;
    if let Some(done) = written {
        let summary = C::describe_outcome(outcome);
        tracing::info!(kind = C::KIND, %name, node = ctx.me(), %summary, "completed");
        ctx.metrics.outcome(C::KIND, crate::metrics::Outcome::Success);
        C::count_outcome(outcome, &ctx.metrics);
        let note = format!("{summary} on node {}: {stats}", ctx.me());
        ctx.events.normal(&done, "Completed", note).await;
        for (reason, note) in C::outcome_warnings(outcome) {
            ctx.events.warning(&done, reason, note).await;
        }
    }
    Ok(())
}

/// Canceling, with the cause: Velero's `spec.cancel`, or the CR's deletion.
pub(super) async fn start_cancel<C: MoverCr>(ctx: &Ctx<C>, cr: C) -> Result<(), StepError> {
    let name = cr.name_any();
    let cause = if is_deleting(&cr) {
        format!("the {} is being deleted", C::KIND)
    } else {
        "spec.cancel was set".to_owned()
    };
    let message = format!("canceling: {cause}");
    let written = write(ctx, &name, Some(cr), "Canceling", |c| {
        if c.phase().is_terminal() || c.phase() == Phase::Canceling || !mine(ctx, c) {
            return false;
        }
        c.set_phase(Phase::Canceling);
        c.status_mut().message.clone_from(&message);
        true
    })
    .await?;
    if let Some(canceling) = written {
        ctx.events.normal(&canceling, "Canceling", message).await;
    }
    Ok(())
}

/// Canceling → cleanup → Canceled, releasing the CR in the same write.
pub(super) async fn finish_cancel<C: MoverCr>(ctx: &Ctx<C>, cr: C) -> Result<(), StepError> {
    let name = cr.name_any();
    cleanup_exposed(ctx, &cr).await?;
    let mut message = String::new();
    let written = write(ctx, &name, Some(cr), "Canceled", |c| {
        if c.phase() != Phase::Canceling || !mine(ctx, c) {
            return false;
        }
        let status = c.status_mut();
        message = match status.message.strip_prefix("canceling: ") {
            Some(cause) => format!("canceled: {cause}"),
            None => "canceled".to_owned(),
        };
        status.message.clone_from(&message);
        *status.completion_timestamp = Some(now());
        c.set_phase(Phase::Canceled);
        release(c);
        true
    })
    .await?;
    if let Some(canceled) = written {
        tracing::info!(kind = C::KIND, %name, node = ctx.me(), "canceled");
        ctx.metrics.outcome(C::KIND, crate::metrics::Outcome::Cancel);
        ctx.events.normal(&canceled, "Canceled", message).await;
    }
    Ok(())
}

/// A finished CR still holding the finalizer: clean up, then release it.
pub(super) async fn cleanup<C: MoverCr>(ctx: &Ctx<C>, cr: C) -> Result<(), StepError> {
    let name = cr.name_any();
    cleanup_exposed(ctx, &cr).await?;
    write(ctx, &name, Some(cr), "release", |c| {
        if !c.phase().is_terminal() || !(has_finalizer(c) || has_expose_label(c)) {
            return false;
        }
        release(c);
        true
    })
    .await?;
    Ok(())
}

/// Asks the exposer to remove what it created, a few times, each bounded by the CR's
/// `operationTimeout`.
async fn cleanup_exposed<C: MoverCr>(ctx: &Ctx<C>, cr: &C) -> Result<(), StepError> {
    let exposer = C::exposer(&ctx.backends);
    let timeout = cr.operation_timeout();
    let bound = if timeout.is_zero() { Duration::from_secs(600) } else { timeout };
    let mut last = WorkError::failed("cleanup was not attempted");
    for attempt in 1..=CLEANUP_ATTEMPTS {
        let result = match tokio::time::timeout(bound, exposer.cleanup(cr, timeout)).await {
            Ok(result) => result,
            Err(_) => Err(WorkError::failed(format!(
                "cleanup did not finish within {}",
                ferry_api::GoDuration(bound)
            ))),
        };
        match result {
            Ok(()) => return Ok(()),
            Err(e) => last = e,
        }
        if attempt < CLEANUP_ATTEMPTS {
            tokio::select! {
                () = ctx.shutdown.cancelled() => break,
                () = tokio::time::sleep(Duration::from_secs(u64::from(attempt))) => {}
            }
        }
    }
    let note = format!("cleanup failed, will retry: {}", error_chain(&last));
    ctx.events.warning(cr, "CleanupFailed", note).await;
    Err(StepError::Cleanup { kind: C::KIND, name: cr.name_any(), source: last })
}
