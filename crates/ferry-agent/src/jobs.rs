//! The per-node registry of running drivers: at most one per CR on a node.

use std::collections::HashMap;
use std::sync::{Arc, Mutex, MutexGuard, PoisonError};

use tokio_util::sync::CancellationToken;

/// Which CRs have a driver running on this node, with the token that interrupts its work.
#[derive(Debug, Clone, Default)]
pub(crate) struct Jobs {
    running: Arc<Mutex<HashMap<String, CancellationToken>>>,
}

/// Removes its CR from the registry when the driver ends, however it ends.
#[derive(Debug)]
pub(crate) struct JobGuard {
    jobs: Jobs,
    key: String,
}

impl Drop for JobGuard {
    fn drop(&mut self) {
        self.jobs.lock().remove(&self.key);
    }
}

impl Jobs {
    fn lock(&self) -> MutexGuard<'_, HashMap<String, CancellationToken>> {
        self.running.lock().unwrap_or_else(PoisonError::into_inner)
    }

    /// Registers a driver for `key` unless one runs already. The token is a child of
    /// `parent` (the agent's shutdown token).
    pub(crate) fn start(
        &self,
        key: &str,
        parent: &CancellationToken,
    ) -> Option<(CancellationToken, JobGuard)> {
        let mut running = self.lock();
        if running.contains_key(key) {
            return None;
        }
        let token = parent.child_token();
        running.insert(key.to_owned(), token.clone());
        Some((token, JobGuard { jobs: self.clone(), key: key.to_owned() }))
    }

    /// Interrupts the work of the driver for `key`, if one runs.
    pub(crate) fn interrupt(&self, key: &str) {
        if let Some(token) = self.lock().get(key) {
            token.cancel();
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_driver_per_key_until_its_guard_drops() {
        let jobs = Jobs::default();
        let shutdown = CancellationToken::new();
        let (token, guard) = jobs.start("uid-1", &shutdown).expect("first");
        assert!(jobs.start("uid-1", &shutdown).is_none());
        assert!(jobs.start("uid-2", &shutdown).is_some(), "other keys are independent");
        jobs.interrupt("uid-1");
        assert!(token.is_cancelled());
        drop(guard);
        let (again, _guard) = jobs.start("uid-1", &shutdown).expect("free again");
        assert!(!again.is_cancelled());
        shutdown.cancel();
        assert!(again.is_cancelled(), "shutdown reaches every driver");
    }
}
