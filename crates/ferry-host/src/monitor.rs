//! Polling asynchronous item operations until each has ended, as Velero's backup and restore
//! operations controllers do: `Progress` for every pending operation, `Cancel` and `Failed`
//! ("Asynchronous action timed out") once an operation is older than the item operation
//! timeout, the plugin's error kept on the record.

use std::time::Duration;

use async_trait::async_trait;
use ferry_plugin::OperationProgress;
use jiff::Timestamp;
use tokio_util::sync::CancellationToken;

use crate::records::{Operation, OperationPhase, OperationSpec};

/// The error Velero records on an operation that outlived the item operation timeout.
pub const TIMED_OUT: &str = "Asynchronous action timed out";

/// The plugin side of the operations: `Progress` and `Cancel` of an action by operation ID.
#[async_trait]
pub trait OperationActions: Send + Sync {
    /// The operation's progress, or why it cannot be had.
    async fn progress(&self, action: &str, operation_id: &str)
    -> Result<OperationProgress, String>;
    /// Asks the action to stop the operation.
    async fn cancel(&self, action: &str, operation_id: &str) -> Result<(), String>;
}

/// Where a set of operations stands.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Tally {
    /// Operations recorded (Velero's `...ItemOperationsAttempted`).
    pub attempted: usize,
    /// Operations that completed (`...ItemOperationsCompleted`).
    pub completed: usize,
    /// Operations that failed (`...ItemOperationsFailed`).
    pub failed: usize,
    /// Operations still running.
    pub pending: usize,
}

impl Tally {
    /// Counts `ops`.
    #[must_use]
    pub fn of<S>(ops: &[Operation<S>]) -> Self {
        let mut tally = Self { attempted: ops.len(), ..Self::default() };
        for op in ops {
            match op.status.phase {
                OperationPhase::Completed => tally.completed += 1,
                OperationPhase::Failed => tally.failed += 1,
                OperationPhase::New | OperationPhase::InProgress => tally.pending += 1,
            }
        }
        tally
    }
}

/// Asks about every pending operation once; returns whether any record changed.
pub async fn poll_once<S: OperationSpec + Send>(
    ops: &mut [Operation<S>],
    actions: &dyn OperationActions,
    timeout: Duration,
    now: Timestamp,
) -> bool {
    let mut changed = false;
    for op in ops.iter_mut().filter(|op| op.status.phase.is_pending()) {
        let (action, id) = (op.spec.action().to_owned(), op.spec.operation_id().to_owned());
        let created = op.status.created.unwrap_or(now);
        let timed_out = jiff::SignedDuration::try_from(timeout)
            .ok()
            .and_then(|t| created.checked_add(t).ok())
            .is_some_and(|deadline| deadline < now);
        if timed_out {
            if let Err(e) = actions.cancel(&action, &id).await {
                tracing::warn!(%action, operation = %id, error = %e, "cancel after timeout failed");
            }
            op.status.phase = OperationPhase::Failed;
            op.status.error = TIMED_OUT.to_owned();
            changed = true;
            continue;
        }
        let before = op.status.clone();
        match actions.progress(&action, &id).await {
            Err(e) => {
                op.status.phase = OperationPhase::Failed;
                op.status.error = e;
            }
            Ok(p) => apply(op, p),
        }
        changed |= op.status != before;
    }
    changed
}

fn apply<S>(op: &mut Operation<S>, p: OperationProgress) {
    let status = &mut op.status;
    status.n_completed = p.n_completed;
    status.n_total = p.n_total;
    status.operation_units = p.operation_units;
    status.description = p.description;
    if let Some(t) = p.started.and_then(|t| Timestamp::try_from(t).ok()) {
        status.started = Some(t);
    }
    if let Some(t) = p.updated.and_then(|t| Timestamp::try_from(t).ok()) {
        status.updated = Some(t);
    }
    if p.completed {
        match p.error {
            Some(e) => {
                status.phase = OperationPhase::Failed;
                status.error = e;
            }
            None => status.phase = OperationPhase::Completed,
        }
    } else if status.started.is_some() || status.n_completed > 0 {
        status.phase = OperationPhase::InProgress;
    }
}

/// Receives the operations whenever they change (to store the record, update the CR).
#[async_trait]
pub trait Recorder<S>: Send {
    /// Stores `ops`; an error stops the monitor.
    async fn record(&mut self, ops: &[Operation<S>], tally: Tally) -> Result<(), String>;
}

/// Why [`Monitor::wait`] stopped before every operation ended.
#[derive(Debug, thiserror::Error, PartialEq, Eq)]
pub enum MonitorError {
    /// The host is shutting down; the operations stay pending and are resumed on restart.
    #[error("stopped by the host; pending operations are resumed when it starts again")]
    Canceled,
    /// The recorder failed.
    #[error("recording item operations: {0}")]
    Record(String),
}

/// Polls operations at an interval until none is pending.
#[derive(Debug, Clone, Copy)]
pub struct Monitor {
    /// Time between polls (Velero: 10 s).
    pub interval: Duration,
    /// How long an operation may run (the Backup's or Restore's `itemOperationTimeout`,
    /// Velero's default 4 h).
    pub timeout: Duration,
}

impl Monitor {
    /// Polls `ops` until none is pending (bounded: every operation fails at its timeout),
    /// calling `recorder` after every change.
    ///
    /// # Errors
    /// [`MonitorError`] when canceled or when the recorder fails.
    pub async fn wait<S: OperationSpec + Send + Sync>(
        &self,
        ops: &mut [Operation<S>],
        actions: &dyn OperationActions,
        recorder: &mut dyn Recorder<S>,
        cancel: &CancellationToken,
    ) -> Result<Tally, MonitorError> {
        loop {
            let changed = poll_once(ops, actions, self.timeout, Timestamp::now()).await;
            let tally = Tally::of(ops);
            if changed {
                recorder.record(ops, tally).await.map_err(MonitorError::Record)?;
            }
            if tally.pending == 0 {
                return Ok(tally);
            }
            tokio::select! {
                () = cancel.cancelled() => return Err(MonitorError::Canceled),
                () = tokio::time::sleep(self.interval) => {}
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)] // Tests fail loudly by design.
mod tests {
    use std::collections::HashMap;
    use std::sync::Mutex;

    use super::*;
    use crate::records::{OperationStatus, ResourceIdentifier, RestoreOperationSpec};

    /// Plugin answers scripted per operation ID: a list consumed one per poll.
    #[derive(Default)]
    struct Script {
        answers: Mutex<HashMap<String, Vec<Result<OperationProgress, String>>>>,
        canceled: Mutex<Vec<String>>,
    }

    #[async_trait]
    impl OperationActions for Script {
        async fn progress(&self, _: &str, id: &str) -> Result<OperationProgress, String> {
            let mut answers = self.answers.lock().unwrap();
            let list = answers.get_mut(id).unwrap();
            if list.len() > 1 { list.remove(0) } else { list[0].clone() }
        }
        async fn cancel(&self, _: &str, id: &str) -> Result<(), String> {
            self.canceled.lock().unwrap().push(id.to_owned());
            Ok(())
        }
    }

    struct Kept(Vec<Tally>);

    #[async_trait]
    impl<S: Send + Sync> Recorder<S> for Kept {
        async fn record(&mut self, _: &[Operation<S>], tally: Tally) -> Result<(), String> {
            self.0.push(tally);
            Ok(())
        }
    }

    fn op(id: &str, created: Timestamp) -> Operation<RestoreOperationSpec> {
        Operation {
            spec: RestoreOperationSpec {
                restore_name: "r".into(),
                restore_uid: "u".into(),
                restore_item_action: "a".into(),
                resource_identifier: ResourceIdentifier::default(),
                operation_id: id.into(),
            },
            status: OperationStatus::new(created),
        }
    }

    fn running(done: i64) -> OperationProgress {
        OperationProgress {
            n_completed: done,
            n_total: 100,
            operation_units: "Bytes".into(),
            description: "InProgress".into(),
            started: Some(std::time::SystemTime::UNIX_EPOCH + Duration::from_secs(1_800_000_000)),
            ..OperationProgress::default()
        }
    }

    #[tokio::test]
    async fn operations_run_to_completed_failed_and_timed_out() {
        let script = Script::default();
        let done = OperationProgress { completed: true, n_completed: 100, ..running(100) };
        let failed = OperationProgress {
            completed: true,
            error: Some("DataUpload failed: disk full".into()),
            ..running(30)
        };
        script.answers.lock().unwrap().extend([
            ("ok".to_owned(), vec![Ok(running(0)), Ok(running(50)), Ok(done)]),
            ("bad".to_owned(), vec![Ok(running(10)), Ok(failed)]),
            ("gone".to_owned(), vec![Err("plugin: no DataUpload for operation gone".into())]),
            ("slow".to_owned(), vec![Ok(running(1))]),
        ]);
        let now = Timestamp::now();
        let old = now.checked_sub(jiff::SignedDuration::from_secs(3600)).unwrap();
        let mut ops = vec![op("ok", now), op("bad", now), op("gone", now), op("slow", old)];
        let monitor =
            Monitor { interval: Duration::from_millis(10), timeout: Duration::from_secs(600) };
        let mut kept = Kept(Vec::new());
        let tally =
            monitor.wait(&mut ops, &script, &mut kept, &CancellationToken::new()).await.unwrap();
        assert_eq!(tally, Tally { attempted: 4, completed: 1, failed: 3, pending: 0 });
        assert_eq!(ops[0].status.phase, OperationPhase::Completed);
        assert_eq!(ops[0].status.n_completed, 100);
        assert!(ops[0].status.started.is_some());
        assert_eq!(ops[1].status.error, "DataUpload failed: disk full");
        assert_eq!(ops[2].status.error, "plugin: no DataUpload for operation gone");
        assert_eq!(ops[3].status.error, TIMED_OUT);
        assert_eq!(*script.canceled.lock().unwrap(), ["slow"]);
        assert_eq!(kept.0.last(), Some(&tally));
        assert!(kept.0.first().unwrap().pending > 0, "progress recorded while running");
    }

    #[tokio::test]
    async fn a_canceled_monitor_leaves_operations_pending() {
        let script = Script::default();
        script.answers.lock().unwrap().insert("slow".into(), vec![Ok(running(1))]);
        let mut ops = vec![op("slow", Timestamp::now())];
        let monitor =
            Monitor { interval: Duration::from_secs(60), timeout: Duration::from_secs(600) };
        let cancel = CancellationToken::new();
        cancel.cancel();
        let err =
            monitor.wait(&mut ops, &script, &mut Kept(Vec::new()), &cancel).await.unwrap_err();
        assert_eq!(err, MonitorError::Canceled);
        assert_eq!(ops[0].status.phase, OperationPhase::InProgress);
    }
}
