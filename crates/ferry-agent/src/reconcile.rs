//! The controllers' reconcile: the object lock on New CRs, takeovers from stopped nodes, and
//! making sure a driver runs for every CR this node is responsible for.
//!
//! Reconcile itself never waits for data: anything long runs in the CR's driver
//! ([`crate::driver`]). Every CR whose `spec.datamover` is not this agent's is left alone.

use std::sync::Arc;
use std::time::Duration;

use ferry_api::GoDuration;
use ferry_kube::ApiError;
use kube::ResourceExt;
use kube::runtime::controller::Action;

use crate::context::{Ctx, ensure_driver, job_key};
use crate::error::ReconcileError;
use crate::resource::{
    MoverCr, Phase, add_finalizer, annotation, annotations, has_expose_label, has_finalizer,
    is_deleting, now, remove_expose_label, responsible_node, stop_requested,
};

/// Reconciles one CR on this node.
///
/// # Errors
/// An API failure other than losing an optimistic-concurrency race.
pub(crate) async fn reconcile<C: MoverCr>(
    cr: Arc<C>,
    ctx: Arc<Ctx<C>>,
) -> Result<Action, ReconcileError> {
    if cr.data_mover() != ctx.config.data_mover {
        return Ok(Action::await_change());
    }
    let phase = cr.phase();
    if phase == Phase::New {
        return reconcile_new(&cr, &ctx).await;
    }
    let cleanup_pending = has_finalizer(&*cr) || has_expose_label(&*cr);
    if phase.is_terminal() && !cleanup_pending {
        return Ok(Action::await_change());
    }
    let responsible = responsible_node(&*cr);
    match responsible.as_deref() {
        Some(node) if node == ctx.me() => {
            if stop_requested(&*cr) {
                ctx.jobs.interrupt(&job_key(&*cr));
            }
            ensure_driver(&*cr, &ctx);
        }
        Some(node) if ctx.liveness.is_alive(node) => {}
        gone => {
            if phase.is_terminal() {
                // Only cleanup is left, and the node that should do it is gone: do it here.
                ensure_driver(&*cr, &ctx);
            } else {
                take_over(&cr, &ctx, gone.unwrap_or("")).await?;
            }
        }
    }
    Ok(Action::requeue(ctx.config.recheck_interval))
}

/// Logs a failed reconcile and retries it shortly.
pub(crate) fn error_policy<C: MoverCr>(
    cr: Arc<C>,
    err: &ReconcileError,
    ctx: Arc<Ctx<C>>,
) -> Action {
    tracing::warn!(
        kind = C::KIND,
        name = %cr.name_any(),
        node = ctx.me(),
        error = %crate::error::error_chain(err),
        "reconcile failed; retrying"
    );
    Action::requeue(ctx.config.recheck_interval.min(Duration::from_secs(2)))
}

async fn reconcile_new<C: MoverCr>(
    cr: &Arc<C>,
    ctx: &Arc<Ctx<C>>,
) -> Result<Action, ReconcileError> {
    if is_deleting(&**cr) {
        // No node took it, so nothing of Ferry's holds it: deletion proceeds on its own.
        return Ok(Action::await_change());
    }
    if cr.cancel_requested() {
        return cancel_new(cr, ctx).await;
    }
    let Some(queue) = &ctx.queue else { return accept(cr, ctx).await };
    let _turn = queue.turn().await;
    let (used, room) = queue.room().await.map_err(|source| ReconcileError::Queue {
        kind: C::KIND,
        name: cr.name_any(),
        source,
    })?;
    if !room {
        tracing::debug!(
            kind = C::KIND,
            name = %cr.name_any(),
            used,
            limit = queue.limit(),
            "prepare queue full; staying New"
        );
        return Ok(Action::requeue(ctx.config.recheck_interval));
    }
    accept(cr, ctx).await
}

/// The object lock: one full-object update of this node's cached copy. Conflict means another
/// node won (or the CR changed, in which case the watch brings it back here).
async fn accept<C: MoverCr>(cr: &Arc<C>, ctx: &Arc<Ctx<C>>) -> Result<Action, ReconcileError> {
    let mut next = (**cr).clone();
    next.set_phase(Phase::Accepted);
    {
        let status = next.status_mut();
        *status.accepted_by_node = ctx.me().to_owned();
        *status.accepted_timestamp = Some(now());
        status.message.clear();
    }
    next.labels_mut().insert(ferry_api::keys::EXPOSE_ON_GOING_LABEL.to_owned(), "true".to_owned());
    add_finalizer(&mut next);
    match ferry_kube::replace(&ctx.api, &next).await {
        Ok(accepted) => {
            if let Some(queue) = &ctx.queue {
                queue.accepted(&**cr);
            }
            tracing::info!(kind = C::KIND, name = %cr.name_any(), node = ctx.me(), "accepted");
            ctx.events
                .normal(&accepted, "Accepted", format!("accepted by node {}", ctx.me()))
                .await;
            ensure_driver(&accepted, ctx);
            Ok(Action::requeue(ctx.config.recheck_interval))
        }
        Err(e) if e.is_conflict() => Ok(Action::await_change()),
        Err(e) if e.is_not_found() => Ok(Action::await_change()),
        Err(source) => Err(ReconcileError::Accept {
            kind: C::KIND,
            name: cr.name_any(),
            source: Box::new(source),
        }),
    }
}

/// A CR canceled before any node accepted it goes straight to Canceled; nothing was exposed,
/// but the exposer is asked to clean up anyway (it is idempotent) so nothing can leak. The
/// clean-up comes first, so a CR that reads Canceled has had its clean-up tried (a failure is
/// a `CleanupFailed` Warning Event); it is safe before the phase write: no node accepts a CR
/// that asks to be canceled, and one that accepted before the cancel moved it out of New.
async fn cancel_new<C: MoverCr>(cr: &Arc<C>, ctx: &Arc<Ctx<C>>) -> Result<Action, ReconcileError> {
    let exposer = C::exposer(&ctx.backends);
    if let Err(e) = exposer.cleanup(cr, cr.operation_timeout()).await {
        let error = crate::error::error_chain(&e);
        tracing::warn!(
            kind = C::KIND,
            name = %cr.name_any(),
            error = %error,
            "cleanup after cancel of a new CR failed"
        );
        let note = format!("cleanup after the cancel failed: {error}");
        ctx.events.warning(&**cr, "CleanupFailed", note).await;
    }
    let mut next = (**cr).clone();
    next.set_phase(Phase::Canceled);
    {
        let status = next.status_mut();
        *status.completion_timestamp = Some(now());
        *status.message = "canceled (spec.cancel) before any node accepted it".to_owned();
    }
    match ferry_kube::replace(&ctx.api, &next).await {
        Ok(canceled) => {
            ctx.events.normal(&canceled, "Canceled", canceled.status_view().message).await;
            Ok(Action::await_change())
        }
        Err(e) if e.is_conflict() || e.is_not_found() => Ok(Action::await_change()),
        Err(source) => Err(ReconcileError::CancelNew {
            kind: C::KIND,
            name: cr.name_any(),
            source: Box::new(source),
        }),
    }
}

/// Takes over a CR whose responsible node stopped renewing its lease: like the object lock,
/// one full-object update from the cached copy, so among several live nodes exactly one
/// wins. The CR restarts from Accepted on this node (the exposer is idempotent and finds or
/// repairs what exists), goes to Canceling if a stop was requested, or fails after
/// `max_takeovers`.
async fn take_over<C: MoverCr>(
    cr: &Arc<C>,
    ctx: &Arc<Ctx<C>>,
    from: &str,
) -> Result<(), ReconcileError> {
    let takeovers = annotation(&**cr, annotations::TAKEOVERS)
        .and_then(|v| v.parse::<u32>().ok())
        .unwrap_or(0)
        .saturating_add(1);
    let from_text = if from.is_empty() { "no node".to_owned() } else { format!("node {from}") };
    let mut next = (**cr).clone();
    {
        let annotations = next.annotations_mut();
        annotations.remove(annotations::EXPOSED_NODE);
        annotations.remove(annotations::PREPARED_AT);
        annotations.insert(annotations::TAKEOVERS.to_owned(), takeovers.to_string());
        if !from.is_empty() {
            let lost = annotations.entry(annotations::LOST_NODES.to_owned()).or_default();
            if !lost.split(',').any(|n| n == from) {
                if !lost.is_empty() {
                    lost.push(',');
                }
                lost.push_str(from);
            }
        }
    }
    let (phase, message, reason) = if takeovers > ctx.config.max_takeovers {
        let message = format!(
            "failed: {from_text} stopped renewing its liveness lease (lease duration {}), and \
             this CR was already taken over {} times",
            GoDuration(ctx.config.lease_duration),
            takeovers - 1
        );
        (Phase::Failed, message, "Failed")
    } else if stop_requested(&**cr) {
        let message =
            format!("canceling: taken over by node {} from {from_text}, which stopped", ctx.me());
        (Phase::Canceling, message, "TakenOver")
    } else {
        let message = format!(
            "taken over by node {} from {from_text}, whose agent stopped renewing its liveness lease",
            ctx.me()
        );
        (Phase::Accepted, message, "TakenOver")
    };
    next.set_phase(phase);
    {
        let status = next.status_mut();
        *status.accepted_by_node = ctx.me().to_owned();
        *status.accepted_timestamp = Some(now());
        status.node.clear();
        status.message.clone_from(&message);
        if phase == Phase::Failed {
            *status.completion_timestamp = Some(now());
        }
    }
    if phase == Phase::Accepted {
        next.labels_mut()
            .insert(ferry_api::keys::EXPOSE_ON_GOING_LABEL.to_owned(), "true".to_owned());
    } else {
        remove_expose_label(&mut next);
    }
    add_finalizer(&mut next);
    match ferry_kube::replace(&ctx.api, &next).await {
        Ok(taken) => {
            tracing::warn!(kind = C::KIND, name = %cr.name_any(), node = ctx.me(), from, "took over");
            if phase == Phase::Failed {
                ctx.events.warning(&taken, reason, message).await;
            } else {
                ctx.events.normal(&taken, reason, message).await;
            }
            ensure_driver(&taken, ctx);
            Ok(())
        }
        Err(e) if lost_race(&e) => Ok(()),
        Err(source) => Err(ReconcileError::TakeOver {
            kind: C::KIND,
            name: cr.name_any(),
            from: from.to_owned(),
            source: Box::new(source),
        }),
    }
}

fn lost_race(e: &ApiError) -> bool {
    e.is_conflict() || e.is_not_found()
}
