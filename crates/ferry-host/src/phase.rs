//! The lifecycle of a Velero Backup or Restore around asynchronous plugin operations, as
//! shipped Velero runs it (restores go through `Finalizing` too since Velero 1.12):
//!
//! ```text
//! New → InProgress → WaitingForPluginOperations[PartiallyFailed] → Finalizing[PartiallyFailed]
//!                                                                → Completed | PartiallyFailed
//!                  ↘ Failed                        (InProgress when the host restarts, too)
//! ```

use std::fmt;

/// A Backup's or Restore's phase (`status.phase`), with Velero's spelling.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Phase {
    /// Not started.
    New,
    /// Refused before it started.
    FailedValidation,
    /// Items are being backed up or restored.
    InProgress,
    /// Items are done; asynchronous operations are still running.
    WaitingForPluginOperations,
    /// As above, and something has failed already.
    WaitingForPluginOperationsPartiallyFailed,
    /// Every operation has ended; the host finishes up.
    Finalizing,
    /// As above, and something failed.
    FinalizingPartiallyFailed,
    /// Done, everything succeeded.
    Completed,
    /// Done, with errors.
    PartiallyFailed,
    /// Failed as a whole.
    Failed,
}

impl Phase {
    const ALL: [Self; 10] = [
        Self::New,
        Self::FailedValidation,
        Self::InProgress,
        Self::WaitingForPluginOperations,
        Self::WaitingForPluginOperationsPartiallyFailed,
        Self::Finalizing,
        Self::FinalizingPartiallyFailed,
        Self::Completed,
        Self::PartiallyFailed,
        Self::Failed,
    ];

    /// Velero's name of the phase.
    #[must_use]
    pub fn as_str(self) -> &'static str {
        match self {
            Self::New => "New",
            Self::FailedValidation => "FailedValidation",
            Self::InProgress => "InProgress",
            Self::WaitingForPluginOperations => "WaitingForPluginOperations",
            Self::WaitingForPluginOperationsPartiallyFailed => {
                "WaitingForPluginOperationsPartiallyFailed"
            }
            Self::Finalizing => "Finalizing",
            Self::FinalizingPartiallyFailed => "FinalizingPartiallyFailed",
            Self::Completed => "Completed",
            Self::PartiallyFailed => "PartiallyFailed",
            Self::Failed => "Failed",
        }
    }

    /// The phase named `text` (an empty phase is `New`, as Velero reads it).
    #[must_use]
    pub fn parse(text: &str) -> Option<Self> {
        if text.is_empty() {
            return Some(Self::New);
        }
        Self::ALL.into_iter().find(|p| p.as_str() == text)
    }

    /// Whether nothing more happens in this phase.
    #[must_use]
    pub fn is_terminal(self) -> bool {
        matches!(
            self,
            Self::FailedValidation | Self::Completed | Self::PartiallyFailed | Self::Failed
        )
    }

    /// Whether the phase carries an earlier failure along.
    #[must_use]
    pub fn is_partially_failed(self) -> bool {
        matches!(
            self,
            Self::WaitingForPluginOperationsPartiallyFailed
                | Self::FinalizingPartiallyFailed
                | Self::PartiallyFailed
        )
    }

    /// Where the item pass leads: waiting while operations run, else straight to finalizing.
    #[must_use]
    pub fn after_items(item_errors: bool, operations_pending: bool) -> Self {
        match (operations_pending, item_errors) {
            (true, false) => Self::WaitingForPluginOperations,
            (true, true) => Self::WaitingForPluginOperationsPartiallyFailed,
            (false, false) => Self::Finalizing,
            (false, true) => Self::FinalizingPartiallyFailed,
        }
    }

    /// The phase once an operation has failed (waiting turns partially failed).
    #[must_use]
    pub fn with_failure(self) -> Self {
        match self {
            Self::WaitingForPluginOperations => Self::WaitingForPluginOperationsPartiallyFailed,
            Self::Finalizing => Self::FinalizingPartiallyFailed,
            Self::Completed => Self::PartiallyFailed,
            other => other,
        }
    }

    /// The phase once no operation is pending any more.
    #[must_use]
    pub fn after_operations(self) -> Self {
        match self {
            Self::WaitingForPluginOperations => Self::Finalizing,
            Self::WaitingForPluginOperationsPartiallyFailed => Self::FinalizingPartiallyFailed,
            other => other,
        }
    }

    /// The phase once finalizing is done.
    #[must_use]
    pub fn after_finalizing(self) -> Self {
        match self {
            Self::Finalizing => Self::Completed,
            Self::FinalizingPartiallyFailed => Self::PartiallyFailed,
            other => other,
        }
    }

    /// What a host that (re)starts does with a Backup or Restore found in this phase.
    #[must_use]
    pub fn on_host_start(self, what: &str) -> Restart {
        match self {
            Self::New => Restart::Start,
            // The item pass lived in the old process's memory: it cannot be continued.
            Self::InProgress => Restart::Fail(format!(
                "found a {what} with status \"InProgress\" during the server starting, mark it \
                 as \"Failed\""
            )),
            Self::WaitingForPluginOperations | Self::WaitingForPluginOperationsPartiallyFailed => {
                Restart::ResumePolling
            }
            Self::Finalizing | Self::FinalizingPartiallyFailed => Restart::ResumeFinalizing,
            Self::FailedValidation | Self::Completed | Self::PartiallyFailed | Self::Failed => {
                Restart::Nothing
            }
        }
    }
}

impl fmt::Display for Phase {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.as_str())
    }
}

/// The merge patch that puts a Backup (`kind` `backup`) or Restore (`restore`) in `phase` with
/// the operation counters of `tally` (`backupItemOperationsAttempted`, …), as Velero writes them.
#[must_use]
pub fn status_patch(kind: &str, phase: Phase, tally: crate::monitor::Tally) -> serde_json::Value {
    serde_json::json!({ "status": {
        "phase": phase.as_str(),
        format!("{kind}ItemOperationsAttempted"): tally.attempted,
        format!("{kind}ItemOperationsCompleted"): tally.completed,
        format!("{kind}ItemOperationsFailed"): tally.failed,
    }})
}

/// What to do with a Backup or Restore when the host starts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Restart {
    /// Not started yet: start it.
    Start,
    /// Mark it `Failed` with this `failureReason`.
    Fail(String),
    /// Poll its recorded operations again (their state lives with the plugins).
    ResumePolling,
    /// Finish it.
    ResumeFinalizing,
    /// Already ended.
    Nothing,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_round_trip_and_unknown_names_are_refused() {
        for phase in Phase::ALL {
            assert_eq!(Phase::parse(phase.as_str()), Some(phase));
        }
        assert_eq!(Phase::parse(""), Some(Phase::New));
        assert_eq!(Phase::parse("Deleting"), None);
        assert_eq!(Phase::parse("completed"), None);
    }

    #[test]
    fn the_happy_path_and_the_partially_failed_path() {
        let mut phase = Phase::after_items(false, true);
        assert_eq!(phase, Phase::WaitingForPluginOperations);
        phase = phase.after_operations();
        assert_eq!(phase, Phase::Finalizing);
        assert_eq!(phase.after_finalizing(), Phase::Completed);

        let failed = Phase::after_items(false, true).with_failure();
        assert_eq!(failed, Phase::WaitingForPluginOperationsPartiallyFailed);
        assert_eq!(failed.with_failure(), failed, "failing twice changes nothing more");
        assert_eq!(failed.after_operations(), Phase::FinalizingPartiallyFailed);
        assert_eq!(failed.after_operations().after_finalizing(), Phase::PartiallyFailed);
        assert_eq!(Phase::after_items(true, false), Phase::FinalizingPartiallyFailed);
        assert_eq!(Phase::after_items(false, false), Phase::Finalizing);
    }

    #[test]
    fn a_restarted_host_fails_the_item_pass_and_resumes_the_rest() {
        assert!(matches!(Phase::InProgress.on_host_start("backup"), Restart::Fail(m)
            if m.contains("backup with status \"InProgress\"")));
        assert_eq!(
            Phase::WaitingForPluginOperations.on_host_start("backup"),
            Restart::ResumePolling
        );
        assert_eq!(
            Phase::WaitingForPluginOperationsPartiallyFailed.on_host_start("restore"),
            Restart::ResumePolling
        );
        assert_eq!(Phase::FinalizingPartiallyFailed.on_host_start("x"), Restart::ResumeFinalizing);
        assert_eq!(Phase::Completed.on_host_start("x"), Restart::Nothing);
        assert_eq!(Phase::New.on_host_start("x"), Restart::Start);
    }
}
