//! Following an operation: the progress bar and the Backup's or Restore's status.

use std::io::IsTerminal as _;

use anyhow::{Context, bail};
use ferry_host::{Monitor, MonitorError, Operation, OperationActions, Phase, Recorder, Tally};
use indicatif::{ProgressBar, ProgressStyle};
use kube::Resource;
use kube::api::{Api, Patch, PatchParams};
use serde::de::DeserializeOwned;
use tokio_util::sync::CancellationToken;

use crate::progress::human;

use super::ClusterArgs;

/// Shows the operation's progress and keeps the Backup's or Restore's status as Velero would.
pub(crate) struct ProgressRecorder<K> {
    api: Api<K>,
    name: String,
    phase: Phase,
    kind: &'static str,
    bar: ProgressBar,
    last_note: String,
}

impl<K> ProgressRecorder<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug,
{
    pub(crate) fn new(api: Api<K>, name: String, kind: &'static str, verb: &str) -> Self {
        let bar = if std::io::stderr().is_terminal() {
            let bar = ProgressBar::new(0);
            bar.set_style(
                ProgressStyle::with_template(
                    "{msg:>12} [{bar:30}] {bytes}/{total_bytes} {bytes_per_sec} eta {eta}",
                )
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
            );
            bar.set_message(verb.to_owned());
            bar
        } else {
            ProgressBar::hidden()
        };
        Self { api, name, phase: Phase::New, kind, bar, last_note: String::new() }
    }

    pub(crate) async fn set_phase(&mut self, phase: Phase, tally: Tally) -> anyhow::Result<()> {
        self.phase = phase;
        let patch = ferry_host::status_patch(self.kind, phase, tally);
        self.api
            .patch(&self.name, &PatchParams::default(), &Patch::Merge(&patch))
            .await
            .with_context(|| format!("updating the status of {} {}", self.kind, self.name))?;
        Ok(())
    }
}

#[ferry_plugin::async_trait]
impl<K, S> Recorder<S> for ProgressRecorder<K>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync,
    S: Send + Sync,
{
    async fn record(&mut self, ops: &[Operation<S>], tally: Tally) -> Result<(), String> {
        if let Some(op) = ops.first() {
            let status = &op.status;
            let (done, total) = (status.n_completed.max(0), status.n_total.max(0));
            self.bar.set_length(total.unsigned_abs());
            self.bar.set_position(done.unsigned_abs());
            if !status.description.is_empty() {
                self.bar.set_message(status.description.clone());
            }
            let note = format!(
                "{}: {} of {}",
                status.description,
                human(done.unsigned_abs()),
                human(total.unsigned_abs())
            );
            if self.bar.is_hidden() && note != self.last_note && !status.description.is_empty() {
                eprintln!("ferry volume: {note}");
                self.last_note = note;
            }
        }
        let phase = if tally.failed > 0 { self.phase.with_failure() } else { self.phase };
        self.set_phase(phase, tally).await.map_err(|e| format!("{e:#}"))
    }
}

/// Follows `ops` to their end; on Ctrl-C cancels them and says so.
pub(crate) async fn follow<K, S>(
    ops: &mut [Operation<S>],
    actions: &dyn OperationActions,
    recorder: &mut ProgressRecorder<K>,
    args: &ClusterArgs,
    cancel: &CancellationToken,
) -> anyhow::Result<Tally>
where
    K: Resource + Clone + DeserializeOwned + std::fmt::Debug + Send + Sync,
    S: ferry_host::OperationSpec + Send + Sync,
{
    recorder.phase = Phase::after_items(false, true);
    let tally = Tally::of(ops);
    recorder.record(ops, tally).await.map_err(anyhow::Error::msg)?;
    let monitor = Monitor { interval: args.poll_interval, timeout: args.timeout };
    match monitor.wait(ops, actions, recorder, cancel).await {
        Ok(tally) => {
            recorder.bar.finish_and_clear();
            let phase = recorder.phase.after_operations();
            recorder.set_phase(phase, tally).await?;
            recorder.set_phase(phase.after_finalizing(), tally).await?;
            Ok(tally)
        }
        Err(MonitorError::Canceled) => {
            recorder.bar.abandon();
            for op in ops.iter() {
                if let Err(e) = actions.cancel(op.spec.action(), op.spec.operation_id()).await {
                    eprintln!("ferry volume: canceling {}: {e}", op.spec.operation_id());
                }
            }
            recorder.set_phase(Phase::Failed, Tally::of(ops)).await?;
            bail!("interrupted: the data movement was canceled")
        }
        Err(e) => Err(e.into()),
    }
}
