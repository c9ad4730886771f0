//! Accepted → Prepared: expose the volume, bounded by the prepare timeout.

use ferry_api::GoDuration;
use ferry_api::k8s_openapi::jiff::Timestamp;
use kube::ResourceExt;
use tokio_util::sync::CancellationToken;

use super::finish::{StepError, fail, mine, write};
use super::until_canceled;
use crate::ExposeParams;
use crate::context::Ctx;
use crate::error::{WorkError, error_chain};
use crate::resource::{MoverCr, Phase, annotations, elapsed_since, stop_requested};

/// Exposes the CR's volume and records where it landed (Prepared). The prepare timeout
/// counts from `acceptedTimestamp`, so time spent before an agent restart counts too.
pub(super) async fn expose<C: MoverCr>(
    ctx: &Ctx<C>,
    cr: C,
    work: &CancellationToken,
) -> Result<(), StepError> {
    let name = cr.name_any();
    let limit = ctx.config.prepare_timeout;
    let accepted_at = cr.status_view().accepted_timestamp.unwrap_or_else(Timestamp::now);
    let waited = elapsed_since(accepted_at);
    let timeout_message = || {
        format!(
            "prepare timeout: the volume was not exposed within {} of the {} being accepted \
             by node {} (waiting in Accepted since {accepted_at})",
            GoDuration(limit),
            C::KIND,
            ctx.me()
        )
    };
    let Some(remaining) = limit.checked_sub(waited).filter(|r| !r.is_zero()) else {
        return fail(ctx, cr, timeout_message()).await;
    };
    let params = ExposeParams {
        node: ctx.me().to_owned(),
        operation_timeout: cr.operation_timeout(),
        cancel: work.clone(),
        avoid_nodes: cr
            .meta()
            .annotations
            .as_ref()
            .and_then(|a| a.get(annotations::LOST_NODES))
            .map(|v| v.split(',').filter(|n| !n.is_empty()).map(str::to_owned).collect())
            .unwrap_or_default(),
    };
    let exposer = C::exposer(&ctx.backends);
    let started = std::time::Instant::now();
    let result = tokio::select! {
        result = until_canceled(exposer.expose(&cr, &params), work) => result,
        () = tokio::time::sleep(remaining) => return fail(ctx, cr, timeout_message()).await,
    };
    let exposed = match result {
        Ok(exposed) => exposed,
        Err(WorkError::Canceled) => return Ok(()),
        Err(_) if work.is_cancelled() => return Ok(()),
        Err(e) => {
            let message = format!("exposing the volume failed: {}", error_chain(&e));
            return fail(ctx, cr, message).await;
        }
    };
    let prepared_at = Timestamp::now().to_string();
    let written = write(ctx, &name, Some(cr), "Prepared", |c| {
        if c.phase() != Phase::Accepted || !mine(ctx, c) || stop_requested(c) {
            return false;
        }
        c.set_phase(Phase::Prepared);
        let annotations = c.annotations_mut();
        annotations.insert(annotations::EXPOSED_NODE.to_owned(), exposed.node.clone());
        annotations.insert(annotations::PREPARED_AT.to_owned(), prepared_at.clone());
        true
    })
    .await?;
    if let Some(prepared) = written {
        let took = started.elapsed().as_secs_f64();
        let steps = exposed.steps_line();
        tracing::info!(kind = C::KIND, %name, node = %exposed.node, took_s = took, %steps, "prepared");
        let mut note = format!("volume exposed on node {} in {took:.1}s", exposed.node);
        if !steps.is_empty() {
            note = format!("{note} ({steps})");
        }
        ctx.events.normal(&prepared, "Prepared", note).await;
    }
    Ok(())
}
