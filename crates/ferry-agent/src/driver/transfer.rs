//! Prepared → InProgress → Completed: find the exposed volume on this node, wait for a
//! data-movement slot, move the data while writing progress, finish.

use std::sync::Arc;
use std::time::{Duration, Instant};

use ferry_api::GoDuration;
use kube::ResourceExt;
use tokio::sync::OwnedSemaphorePermit;
use tokio_util::sync::CancellationToken;

use super::finish::{StepError, complete, fail, mine, write};
use super::holder::HolderWatch;
use super::until_canceled;
use crate::context::Ctx;
use crate::error::{WorkError, error_chain};
use crate::progress::next_progress;
use crate::report;
use crate::resource::{
    MoverCr, Phase, annotation, annotations, elapsed_since, now, parse_timestamp,
    remove_expose_label, stop_requested,
};
use crate::update::{Updated, update_status};
use crate::{ExposedVolume, ProgressSink};

/// The first pause between looks for the exposed volume.
const FIRST_LOCATE_PAUSE: Duration = Duration::from_millis(25);

/// How a wait inside the step ended when it did not produce its value.
enum Interrupted {
    /// The work token fired: re-evaluate.
    Stop,
    /// The CR failed (already written).
    Failed,
}

/// Moves the data of a CR Prepared for this node, or resumes one InProgress here.
pub(super) async fn move_data<C: MoverCr>(
    ctx: &Arc<Ctx<C>>,
    cr: C,
    resume: bool,
    work: &CancellationToken,
) -> Result<(), StepError> {
    let name = cr.name_any();
    let (cr, mut volume) = match locate(ctx, cr, resume, work).await? {
        Ok(found) => found,
        Err(Interrupted::Stop | Interrupted::Failed) => return Ok(()),
    };
    // From here on the holder of the volume is watched: losing it stops the slot wait or the
    // data path, and the CR fails.
    let holder = HolderWatch::start(ctx, &cr, &volume, work);
    let moving = holder.token().clone();
    let slot = take_slot(ctx, &moving).await;
    if let Some(reason) = holder.lost() {
        return fail(ctx, cr, lost_message(ctx, false, &reason)).await;
    }
    let Some(_slot) = slot else { return Ok(()) };
    let Some(cr) = start(ctx, cr, resume, &volume).await? else { return Ok(()) };

    let progress = ProgressSink::new();
    let _running = ctx.metrics.running(C::KIND);
    let started = std::time::Instant::now();
    let writer_stop = CancellationToken::new();
    let writer = tokio::spawn(write_progress(
        Arc::clone(ctx),
        cr.clone(),
        progress.clone(),
        work.clone(),
        writer_stop.clone(),
    ));
    let mover = &*ctx.backends.mover;
    let result = until_canceled(
        C::move_data(mover, &cr, &volume, progress.clone(), moving.clone()),
        &moving,
    )
    .await;
    writer_stop.cancel();
    if let Err(e) = writer.await {
        tracing::warn!(kind = C::KIND, %name, error = %e, "progress writer ended abnormally");
    }
    // Whatever the data path returned, a volume that was not held throughout is not trusted.
    let held = match &result {
        Err(_) if work.is_cancelled() => Ok(()),
        _ => holder.last_look(ctx, &cr, &volume).await,
    };
    // The data path is done with the volume: nothing of this agent may keep it mounted while
    // the exposer hands it over or removes its holder.
    volume.release();
    let outcome_kind = match (&result, &held) {
        (_, Err(_)) => crate::metrics::Outcome::Failure,
        (Ok(_), Ok(())) => crate::metrics::Outcome::Success,
        (Err(WorkError::Canceled), _) => crate::metrics::Outcome::Cancel,
        (Err(_), _) if work.is_cancelled() => crate::metrics::Outcome::Cancel,
        (Err(_), _) => crate::metrics::Outcome::Failure,
    };
    ctx.metrics.moved(C::KIND, progress.snapshot().bytes_done, started.elapsed(), outcome_kind);
    if let Err(reason) = held {
        return fail(ctx, cr, lost_message(ctx, true, &reason)).await;
    }
    match result {
        Ok(outcome) => {
            let exposer = C::exposer(&ctx.backends);
            let finished =
                until_canceled(exposer.finish(&cr, &volume, cr.operation_timeout()), work).await;
            match finished {
                Ok(()) => {
                    let stats = report::final_note(
                        report::Direction::of(C::KIND),
                        &progress.snapshot(),
                        started.elapsed(),
                    );
                    complete(ctx, &name, &outcome, &volume, &stats).await
                }
                Err(WorkError::Canceled) => Ok(()),
                Err(e) => {
                    let message =
                        format!("finishing after the data moved failed: {}", error_chain(&e));
                    fail(ctx, cr, message).await
                }
            }
        }
        Err(WorkError::Canceled) => Ok(()),
        Err(_) if work.is_cancelled() => Ok(()),
        Err(e) => {
            let message = format!("data movement failed on node {}: {}", ctx.me(), error_chain(&e));
            fail(ctx, cr, message).await
        }
    }
}

/// The failure message when the exposed volume stopped being held, before (`moving` false:
/// while waiting for a slot) or while the data moved.
fn lost_message<C: MoverCr>(ctx: &Ctx<C>, moving: bool, reason: &str) -> String {
    let (when, what) = match (moving, report::Direction::of(C::KIND)) {
        (false, _) => ("while it waited for a data-movement slot", "no data was moved"),
        (true, report::Direction::Upload) => {
            ("while the data moved", "nothing of this backup was recorded")
        }
        (true, report::Direction::Download) => {
            ("while the data moved", "the restored volume is incomplete and was not handed over")
        }
    };
    format!(
        "the exposed volume stopped being available on node {} {when}: {reason}; {what}. \
         Retry the operation; if holding pods are being evicted or preempted, give them a \
         priority class (priorityClassName in the node-agent configuration)",
        ctx.me()
    )
}

/// Waits for the exposed volume to be ready on this node. A Prepared CR waits at most the
/// prepare timeout from when it became Prepared; a resumed one from now.
async fn locate<C: MoverCr>(
    ctx: &Ctx<C>,
    cr: C,
    resume: bool,
    work: &CancellationToken,
) -> Result<Result<(C, ExposedVolume), Interrupted>, StepError> {
    let limit = ctx.config.prepare_timeout;
    let waited = if resume {
        Duration::ZERO
    } else {
        annotation(&cr, annotations::PREPARED_AT)
            .and_then(parse_timestamp)
            .map_or(Duration::ZERO, elapsed_since)
    };
    let deadline = Instant::now() + limit.saturating_sub(waited);
    let exposer = C::exposer(&ctx.backends);
    // A volume usually appears within a second of Prepared: look again soon at first, then
    // back off to the configured interval.
    let mut pause = FIRST_LOCATE_PAUSE.min(ctx.config.locate_interval);
    loop {
        let found = tokio::select! {
            found = exposer.locate(&cr, ctx.me()) => found,
            () = work.cancelled() => return Ok(Err(Interrupted::Stop)),
        };
        match found {
            Ok(Some(volume)) => return Ok(Ok((cr, volume))),
            Ok(None) => {}
            Err(WorkError::Canceled) => return Ok(Err(Interrupted::Stop)),
            Err(e) => {
                let message = format!(
                    "the volume exposed for node {} cannot be used there: {}",
                    ctx.me(),
                    error_chain(&e)
                );
                fail(ctx, cr, message).await?;
                return Ok(Err(Interrupted::Failed));
            }
        }
        if Instant::now() >= deadline {
            let state = if resume { "after the agent restarted" } else { "while Prepared" };
            let message = format!(
                "prepare timeout: the exposed volume did not become available on node {} \
                 within {} {state}",
                ctx.me(),
                GoDuration(limit)
            );
            fail(ctx, cr, message).await?;
            return Ok(Err(Interrupted::Failed));
        }
        tokio::select! {
            () = work.cancelled() => return Ok(Err(Interrupted::Stop)),
            () = tokio::time::sleep(pause) => {}
        }
        pause = (pause * 2).min(ctx.config.locate_interval);
    }
}

/// A data-movement slot on this node; waits first come first served. `None` if the work
/// token fired while waiting.
async fn take_slot<C: MoverCr>(
    ctx: &Ctx<C>,
    work: &CancellationToken,
) -> Option<OwnedSemaphorePermit> {
    tokio::select! {
        permit = Arc::clone(&ctx.slots).acquire_owned() => permit.ok(),
        () = work.cancelled() => None,
    }
}

/// Writes InProgress (or, when resuming, notes the resume). `None` if the CR changed hands
/// or a stop was requested meanwhile.
async fn start<C: MoverCr>(
    ctx: &Ctx<C>,
    cr: C,
    resume: bool,
    volume: &ExposedVolume,
) -> Result<Option<C>, StepError> {
    let name = cr.name_any();
    let me = ctx.me().to_owned();
    if resume {
        let message = format!("resumed on node {me} after the agent restarted");
        let written = write(ctx, &name, Some(cr), "InProgress", |c| {
            if c.phase() != Phase::InProgress || !mine(ctx, c) || stop_requested(c) {
                return false;
            }
            c.status_mut().message.clone_from(&message);
            true
        })
        .await?;
        if let Some(resumed) = &written {
            tracing::info!(kind = C::KIND, %name, node = %me, "resumed");
            ctx.events.normal(resumed, "Resumed", message).await;
        }
        return Ok(written);
    }
    let written = write(ctx, &name, Some(cr), "InProgress", |c| {
        if c.phase() != Phase::Prepared || !mine(ctx, c) || stop_requested(c) {
            return false;
        }
        c.set_phase(Phase::InProgress);
        c.record_start(volume);
        let status = c.status_mut();
        status.node.clone_from(&me);
        status.message.clear();
        if status.start_timestamp.is_none() {
            *status.start_timestamp = Some(now());
        }
        remove_expose_label(c);
        true
    })
    .await?;
    if let Some(started) = &written {
        let mut note = format!("moving data on node {me}");
        if let Some(prepared) =
            annotation(started, annotations::PREPARED_AT).and_then(parse_timestamp)
        {
            let waited = elapsed_since(prepared).as_secs_f64();
            note = format!("{note} ({waited:.1}s after Prepared: volume found, slot taken)");
        }
        tracing::info!(kind = C::KIND, %name, node = %me, "in progress");
        ctx.events.normal(started, "InProgress", note).await;
    }
    Ok(written)
}

/// Writes `status.progress` at the configured interval while data moves, never lowering
/// `bytesDone`. If the CR is no longer this node's, fires the work token.
async fn write_progress<C: MoverCr>(
    ctx: Arc<Ctx<C>>,
    mut latest: C,
    progress: ProgressSink,
    work: CancellationToken,
    stop: CancellationToken,
) {
    let name = latest.name_any();
    let started = Instant::now();
    let mut last_event = started;
    let mut tick = tokio::time::interval(ctx.config.progress_interval);
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    tick.tick().await;
    loop {
        tokio::select! {
            () = stop.cancelled() => return,
            _ = tick.tick() => {}
        }
        let reading = progress.snapshot();
        if reading.bytes_done > 0 && last_event.elapsed() >= ctx.config.progress_event_interval {
            last_event = Instant::now();
            let direction = report::Direction::of(C::KIND);
            let note = report::progress_note(direction, &reading, started.elapsed());
            ctx.events.normal(&latest, "Progress", note).await;
        }
        if next_progress(latest.status_view().progress, reading).is_none() {
            continue;
        }
        let result = update_status(&ctx.api, &name, Some(latest.clone()), |c| {
            if c.phase() != Phase::InProgress || !mine(&ctx, c) {
                return false;
            }
            match next_progress(c.status_view().progress, reading) {
                Some(next) => {
                    *c.status_mut().progress = next;
                    true
                }
                None => false,
            }
        })
        .await;
        match result {
            Ok(Updated::Written(cr)) => latest = cr,
            Ok(Updated::Declined(cr)) => {
                if cr.phase() != Phase::InProgress || !mine(&ctx, &cr) {
                    tracing::warn!(kind = C::KIND, %name, node = ctx.me(), "CR no longer ours; stopping");
                    work.cancel();
                    return;
                }
                latest = cr;
            }
            Ok(Updated::Missing) => {
                work.cancel();
                return;
            }
            Err(e) => {
                tracing::warn!(kind = C::KIND, %name, error = %error_chain(&e), "writing progress failed");
            }
        }
    }
}
