//! The agent's settings.

use std::time::Duration;

use ferry_api::{DEFAULT_DATA_MOVER, DEFAULT_VELERO_NAMESPACE};

use crate::AgentError;

/// What one node's agent needs to know to run its controllers.
///
/// [`AgentConfig::new`] gives the defaults; adjust fields before [`crate::Agent::start`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AgentConfig {
    /// The name of the node this agent runs on (from the downward API in a DaemonSet).
    pub node_name: String,
    /// Velero's namespace, where every DataUpload and DataDownload lives.
    pub namespace: String,
    /// The `spec.datamover` value this agent handles; every other CR is left untouched.
    pub data_mover: String,
    /// How often `status.progress.bytesDone` is written while data moves.
    pub progress_interval: Duration,
    /// How often a `Progress` Event on the CR tells throughput, time left and what became
    /// of the bytes (read, skipped, deduplicated, uploaded).
    pub progress_event_interval: Duration,
    /// How long a CR may wait in Accepted (for the volume to be exposed) or in Prepared (for
    /// the exposed volume to appear on its node) before it fails.
    pub prepare_timeout: Duration,
    /// How many data movements (uploads and downloads together) run at once on this node.
    /// Work beyond the limit waits in Prepared, first come first served.
    pub concurrency: usize,
    /// Velero's `prepareQueueLength`: at most this many DataUploads and DataDownloads of this
    /// data mover in Accepted or Prepared at once, cluster-wide; New ones wait until room
    /// frees up. `None`: no limit.
    pub prepare_queue_length: Option<usize>,
    /// How long this agent's liveness lease stays valid without renewal. Other agents take
    /// over the CRs of a node whose lease has not been renewed for this long.
    pub lease_duration: Duration,
    /// How often the controllers look again at CRs that are not finished, to notice expired
    /// leases and timeouts even when nothing on the CR changes.
    pub recheck_interval: Duration,
    /// The longest pause between looks for an exposed volume on this node while it is not
    /// there yet (the first look again comes after 25 ms, pauses doubling up to this).
    pub locate_interval: Duration,
    /// How often the exposer is asked whether a located volume is still held (its holding
    /// pod not deleted, evicted or replaced) while the CR waits for a slot and while its data
    /// moves. The data path holds the volume open meanwhile, so this bounds how soon a lost
    /// holder fails the CR, not whether data can go astray.
    pub holder_check_interval: Duration,
    /// How many times a node may take over a CR from nodes that stopped; one more lost node
    /// fails the CR instead, so a CR cannot bounce between dying nodes forever.
    pub max_takeovers: u32,
    /// A finalizer put on each DataUpload in the very write that marks it Completed (unless
    /// it is already being deleted), so that the repository snapshot it records is held from
    /// its first moment: whoever releases snapshots of deleted backups (the binary's reclaim
    /// loop) then sees every deletion, even one right after completion. `None`: no hold.
    pub completed_upload_finalizer: Option<String>,
}

impl AgentConfig {
    /// The defaults for an agent on `node_name`: Velero's namespace `velero`, data mover
    /// `ferry`, progress every 3 s and a Progress event every 30 s, a 30-minute prepare
    /// timeout, one data movement at a time, no prepare queue limit, a 15 s lease, a recheck
    /// every 5 s.
    #[must_use]
    pub fn new(node_name: impl Into<String>) -> Self {
        Self {
            node_name: node_name.into(),
            namespace: DEFAULT_VELERO_NAMESPACE.to_owned(),
            data_mover: DEFAULT_DATA_MOVER.to_owned(),
            progress_interval: Duration::from_secs(3),
            progress_event_interval: Duration::from_secs(30),
            prepare_timeout: Duration::from_secs(30 * 60),
            concurrency: 1,
            prepare_queue_length: None,
            lease_duration: Duration::from_secs(15),
            recheck_interval: Duration::from_secs(5),
            locate_interval: Duration::from_secs(1),
            holder_check_interval: Duration::from_secs(5),
            max_takeovers: 3,
            completed_upload_finalizer: None,
        }
    }

    /// How often the lease is renewed: a third of its duration, so two renewals may fail
    /// before other nodes consider this one gone.
    #[must_use]
    pub fn lease_renew_interval(&self) -> Duration {
        self.lease_duration / 3
    }

    /// Checks that the settings can work together.
    ///
    /// # Errors
    /// [`AgentError::Config`] naming the offending setting.
    pub fn validate(&self) -> Result<(), AgentError> {
        let bad = |reason: String| Err(AgentError::Config { reason });
        if self.node_name.is_empty() {
            return bad("the node name is empty".into());
        }
        if self.namespace.is_empty() {
            return bad("the namespace is empty".into());
        }
        if self.data_mover.is_empty() || self.data_mover == "velero" {
            return bad(format!(
                "data mover name {:?} belongs to Velero's own mover; choose another",
                self.data_mover
            ));
        }
        if self.concurrency == 0 {
            return bad("concurrency must be at least 1".into());
        }
        if self.prepare_queue_length == Some(0) {
            return bad("the prepare queue length must be at least 1 (or no limit)".into());
        }
        if self.lease_duration < Duration::from_secs(1) {
            return bad(format!("lease duration {:?} is shorter than 1s", self.lease_duration));
        }
        for (name, value) in [
            ("progress interval", self.progress_interval),
            ("progress event interval", self.progress_event_interval),
            ("prepare timeout", self.prepare_timeout),
            ("recheck interval", self.recheck_interval),
            ("locate interval", self.locate_interval),
            ("holder check interval", self.holder_check_interval),
        ] {
            if value.is_zero() {
                return bad(format!("{name} must not be zero"));
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn defaults_are_valid() {
        let config = AgentConfig::new("node-a");
        assert_eq!(config.data_mover, "ferry");
        assert_eq!(config.namespace, "velero");
        assert_eq!(config.lease_renew_interval(), Duration::from_secs(5));
        config.validate().expect("defaults valid");
    }

    #[test]
    fn velero_names_and_zero_values_are_rejected() {
        for name in ["", "velero"] {
            let mut c = AgentConfig::new("n");
            c.data_mover = name.into();
            let err = c.validate().expect_err("Velero's name accepted").to_string();
            assert!(err.contains("Velero"), "{err}");
        }
        let mut c = AgentConfig::new("n");
        c.concurrency = 0;
        assert!(c.validate().is_err());
        let mut c = AgentConfig::new("n");
        c.progress_interval = Duration::ZERO;
        assert!(c.validate().expect_err("zero").to_string().contains("progress interval"));
        assert!(AgentConfig::new("").validate().is_err());
    }
}
